//! The one check serde does not make on a request body: that a JSON object is where the
//! documented schema says an object goes. serde reads a struct from an array as well
//! (`"sandbox": [null, null]` for `{"tier": null, "memory_bytes": null}`), so without
//! this the server would accept bodies its own OpenAPI document calls invalid.

use std::sync::OnceLock;

use serde_json::Value;

/// The served document, built once: its component schemas are what bodies are held to.
fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(crate::openapi_doc)
}

/// Checks `body` against the component schema `name` (a body type's `ToSchema` name):
/// wherever the schema describes an object, the body must have one. Returns the JSON
/// path of the first place that does not, for the error message.
pub(crate) fn objects_where_documented(body: &Value, name: &str) -> Result<(), String> {
    let doc = document();
    match doc.pointer(&format!("/components/schemas/{name}")) {
        Some(schema) => check(body, schema, doc, "$"),
        // A type missing from the document is a bug of ours, not the client's: let serde judge.
        None => Ok(()),
    }
}

fn resolve<'a>(schema: &'a Value, doc: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => doc.pointer(pointer).unwrap_or(&Value::Null),
        None => schema,
    }
}

fn allows(schema: &Value, kind: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == kind,
        Some(Value::Array(types)) => types.iter().any(|t| t == kind),
        None => kind == "object" && schema.get("properties").is_some(),
        _ => false,
    }
}

/// Whether a schema (already resolved) can describe `value`'s kind of JSON: it names
/// that type, or says nothing about types (free-form JSON, a union of its own).
fn admits(schema: &Value, value: &Value) -> bool {
    if schema.get("type").is_none() {
        return schema.get("properties").is_none() || value.is_object();
    }
    match value {
        Value::Null => allows(schema, "null"),
        Value::Bool(_) => allows(schema, "boolean"),
        Value::Number(n) => {
            allows(schema, "number") || (n.is_u64() || n.is_i64()) && allows(schema, "integer")
        }
        Value::String(_) => allows(schema, "string"),
        Value::Array(_) => allows(schema, "array"),
        Value::Object(_) => allows(schema, "object"),
    }
}

fn check(value: &Value, schema: &Value, doc: &Value, path: &str) -> Result<(), String> {
    let schema = resolve(schema, doc);
    for keyword in ["oneOf", "anyOf"] {
        if let Some(Value::Array(branches)) = schema.get(keyword) {
            // A value is held to the branches of its own kind (`[null, null]` is not the
            // `null` of `Option<Struct>`, and an object is the struct); with none, an
            // array is refused and anything else is serde's to judge.
            let candidates: Vec<&Value> = branches
                .iter()
                .map(|branch| resolve(branch, doc))
                .filter(|branch| admits(branch, value))
                .collect();
            if candidates.is_empty() {
                return if value.is_array() { Err(path.to_owned()) } else { Ok(()) };
            }
            let mut first_error = None;
            for branch in candidates {
                match check(value, branch, doc, path) {
                    Ok(()) => return Ok(()),
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                }
            }
            return first_error.map_or(Ok(()), Err);
        }
    }
    if let Some(Value::Array(parts)) = schema.get("allOf") {
        for part in parts {
            check(value, part, doc, path)?;
        }
    }
    match value {
        Value::Object(fields) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (name, field_schema) in properties {
                    if let Some(field) = fields.get(name) {
                        check(field, field_schema, doc, &format!("{path}.{name}"))?;
                    }
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            if allows(schema, "object") && !allows(schema, "array") {
                return Err(path.to_owned());
            }
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check(item, item_schema, doc, &format!("{path}[{index}]"))?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_array_in_place_of_a_documented_object_is_named() {
        let ok =
            json!({"command": ["python3", "a.py"], "sandbox": {"volumes": [{"name": "w", "path": "/w"}]}});
        assert_eq!(objects_where_documented(&ok, "CreateRunParams"), Ok(()));
        let nested = json!({"command": ["x"], "sandbox": [null, null]});
        assert_eq!(objects_where_documented(&nested, "CreateRunParams"), Err("$.sandbox".into()));
        let in_list = json!({"command": ["x"], "sandbox": {"volumes": [["w", "/w"]]}});
        assert_eq!(objects_where_documented(&in_list, "CreateRunParams"), Err("$.sandbox.volumes[0]".into()));
        assert_eq!(objects_where_documented(&json!([null, null]), "MemoryPutBody"), Err("$".into()));
        let optional = json!({"name": "acme", "quota": [null, null]});
        assert_eq!(objects_where_documented(&optional, "CreateTenantParams"), Err("$.quota".into()));
        assert_eq!(
            objects_where_documented(&json!({"name": "acme", "quota": null}), "CreateTenantParams"),
            Ok(())
        );
        // Free-form JSON stays free.
        assert_eq!(objects_where_documented(&json!({"value": [1, 2]}), "MemoryPutBody"), Ok(()));
        assert_eq!(
            objects_where_documented(&json!({"command": ["x"], "input": [1]}), "CreateRunParams"),
            Ok(())
        );
    }
}
