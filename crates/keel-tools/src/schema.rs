//! Checks a tool call's arguments against the tool's JSON Schema, naming the path and
//! the problem ("args.path: expected a string, got 3").
//!
//! A validator for the subset tool schemas use, written here rather than taken from the
//! `jsonschema` crate: its releases pull in a regex engine, a URL resolver and a few
//! dozen crates for keywords tool schemas do not use. Enforced: `type` (a name or a list
//! of names), `required`, `properties`, `additionalProperties` (false or a schema),
//! `enum`, `const`, `items` (one schema), `minItems`/`maxItems`, `minLength`/`maxLength`
//! (in characters), `minimum`/`maximum`, `exclusiveMinimum`/`exclusiveMaximum`,
//! `anyOf`. Annotations (`description`, `title`, `default`, `examples`, `format`,
//! `$schema`...) and `pattern` are accepted and not enforced. [`check_schema`] refuses
//! keywords that would constrain arguments in ways this validator cannot check
//! (`$ref`, `allOf`, `oneOf`, `not`, `if`...), so a configured tool never silently
//! loses a constraint; [`validate`] ignores them (schemas of MCP servers).

use serde_json::{Map, Value};

const TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "string", "integer"];

/// Keywords that constrain values but are not checked here.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "allOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "prefixItems",
    "contains",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// Checks `args` against `schema`; the error names the first failing path, rooted at
/// `args`.
pub fn validate(schema: &Value, args: &Value) -> Result<(), String> {
    check(schema, args, "args")
}

/// [`validate`] with the failing path rooted at `root` (a form's answer: `value`).
pub fn validate_at(schema: &Value, value: &Value, root: &str) -> Result<(), String> {
    check(schema, value, root)
}

/// Refuses a malformed schema, or one using keywords [`validate`] does not enforce,
/// naming where (rooted at `input_schema`).
pub fn check_schema(schema: &Value) -> Result<(), String> {
    check_node(schema, "input_schema")
}

/// [`check_schema`] with the path rooted at `root` (a form's schema: `form`).
pub fn check_schema_at(schema: &Value, root: &str) -> Result<(), String> {
    check_node(schema, root)
}

fn show(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 { format!("{}...", text.chars().take(57).collect::<String>()) } else { text }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(value: &Value, name: &str) -> bool {
    match name {
        "integer" => match value {
            Value::Number(n) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
            _ => false,
        },
        other => type_name(value) == other,
    }
}

fn article(name: &str) -> String {
    match name {
        "array" | "object" | "integer" => format!("an {name}"),
        "null" => "null".to_owned(),
        other => format!("a {other}"),
    }
}

/// `path` plus a property name: `args.path`, or `args["odd key"]`.
fn child(path: &str, key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        format!("{path}.{key}")
    } else {
        format!("{path}[{}]", Value::String(key.to_owned()))
    }
}

fn number(schema: &Map<String, Value>, keyword: &str) -> Option<f64> {
    schema.get(keyword).and_then(Value::as_f64)
}

fn count(schema: &Map<String, Value>, keyword: &str) -> Option<u64> {
    schema.get(keyword).and_then(Value::as_u64)
}

fn check(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let schema = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{path}: no value is allowed here")),
        Value::Object(schema) => schema,
        _ => return Ok(()),
    };
    match schema.get("type") {
        Some(Value::String(name)) if !is_type(value, name) => {
            return Err(format!("{path}: expected {}, got {}", article(name), show(value)));
        }
        Some(Value::Array(names)) => {
            let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
            if !names.iter().any(|name| is_type(value, name)) {
                return Err(format!("{path}: expected one of {}, got {}", names.join(", "), show(value)));
            }
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(show).collect();
        return Err(format!("{path}: expected one of {}, got {}", list.join(", "), show(value)));
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        return Err(format!("{path}: expected {}, got {}", show(expected), show(value)));
    }
    if let Some(Value::Array(options)) = schema.get("anyOf")
        && !options.iter().any(|option| check(option, value, path).is_ok())
    {
        let first = options.iter().find_map(|o| check(o, value, path).err());
        return Err(first.unwrap_or_else(|| format!("{path}: matches none of the allowed forms")));
    }
    match value {
        Value::String(text) => {
            let length = text.chars().count() as u64;
            if let Some(min) = count(schema, "minLength")
                && length < min
            {
                return Err(format!("{path}: must be at least {min} characters long, got {length}"));
            }
            if let Some(max) = count(schema, "maxLength")
                && length > max
            {
                return Err(format!("{path}: must be at most {max} characters long, got {length}"));
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(f64::NAN);
            let shown = show(value);
            if let Some(min) = number(schema, "minimum")
                && n < min
            {
                return Err(format!("{path}: must be at least {min}, got {shown}"));
            }
            if let Some(max) = number(schema, "maximum")
                && n > max
            {
                return Err(format!("{path}: must be at most {max}, got {shown}"));
            }
            if let Some(min) = number(schema, "exclusiveMinimum")
                && n <= min
            {
                return Err(format!("{path}: must be greater than {min}, got {shown}"));
            }
            if let Some(max) = number(schema, "exclusiveMaximum")
                && n >= max
            {
                return Err(format!("{path}: must be less than {max}, got {shown}"));
            }
        }
        Value::Array(items) => {
            let length = items.len() as u64;
            if let Some(min) = count(schema, "minItems")
                && length < min
            {
                return Err(format!("{path}: must have at least {min} items, got {length}"));
            }
            if let Some(max) = count(schema, "maxItems")
                && length > max
            {
                return Err(format!("{path}: must have at most {max} items, got {length}"));
            }
            if let Some(item_schema) = schema.get("items").filter(|s| s.is_object() || s.is_boolean()) {
                for (index, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{index}]"))?;
                }
            }
        }
        Value::Object(fields) => {
            if let Some(Value::Array(required)) = schema.get("required") {
                for name in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(name) {
                        return Err(format!("{}: is required", child(path, name)));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (key, field) in fields {
                match properties.and_then(|p| p.get(key)) {
                    Some(field_schema) => check(field_schema, field, &child(path, key))?,
                    None => match additional {
                        Some(Value::Bool(false)) => {
                            let known: Vec<&str> = properties
                                .map(|p| p.keys().map(String::as_str).collect())
                                .unwrap_or_default();
                            let allowed = if known.is_empty() {
                                "no properties are allowed".to_owned()
                            } else {
                                format!("allowed: {}", known.join(", "))
                            };
                            return Err(format!("{}: unknown property ({allowed})", child(path, key)));
                        }
                        Some(extra @ Value::Object(_)) => check(extra, field, &child(path, key))?,
                        _ => {}
                    },
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
    Ok(())
}

fn check_node(schema: &Value, path: &str) -> Result<(), String> {
    let schema = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(schema) => schema,
        other => {
            return Err(format!("{path}: a schema must be an object (or true/false), got {}", show(other)));
        }
    };
    for keyword in UNSUPPORTED {
        if schema.contains_key(*keyword) {
            return Err(format!(
                "{path}: `{keyword}` is not supported in tool schemas; express the constraint with type, properties, required, additionalProperties, enum, const, items, anyOf, min/max keywords, or check it in the tool"
            ));
        }
    }
    if let Some(ty) = schema.get("type") {
        let names: Vec<&Value> = match ty {
            Value::Array(names) if !names.is_empty() => names.iter().collect(),
            Value::String(_) => vec![ty],
            other => {
                return Err(format!(
                    "{path}.type: expected a type name or a list of them, got {}",
                    show(other)
                ));
            }
        };
        for name in names {
            if !name.as_str().is_some_and(|n| TYPES.contains(&n)) {
                return Err(format!(
                    "{path}.type: {} is not a type (use one of {})",
                    show(name),
                    TYPES.join(", ")
                ));
            }
        }
    }
    if let Some(required) = schema.get("required")
        && !required.as_array().is_some_and(|r| r.iter().all(Value::is_string))
    {
        return Err(format!("{path}.required: expected a list of property names, got {}", show(required)));
    }
    if let Some(properties) = schema.get("properties") {
        let Some(properties) = properties.as_object() else {
            return Err(format!("{path}.properties: expected a table of schemas, got {}", show(properties)));
        };
        for (name, property) in properties {
            check_node(property, &child(&format!("{path}.properties"), name))?;
        }
    }
    if let Some(additional) = schema.get("additionalProperties") {
        check_node(additional, &format!("{path}.additionalProperties"))?;
    }
    if let Some(items) = schema.get("items") {
        if items.is_array() {
            return Err(format!(
                "{path}.items: give one schema for every item (tuple forms are not supported)"
            ));
        }
        check_node(items, &format!("{path}.items"))?;
    }
    if let Some(options) = schema.get("anyOf") {
        let Some(options) = options.as_array().filter(|o| !o.is_empty()) else {
            return Err(format!("{path}.anyOf: expected a non-empty list of schemas"));
        };
        for (index, option) in options.iter().enumerate() {
            check_node(option, &format!("{path}.anyOf[{index}]"))?;
        }
    }
    if let Some(allowed) = schema.get("enum")
        && allowed.as_array().is_none_or(|a| a.is_empty())
    {
        return Err(format!("{path}.enum: expected a non-empty list of values, got {}", show(allowed)));
    }
    for keyword in ["minItems", "maxItems", "minLength", "maxLength"] {
        if let Some(value) = schema.get(keyword)
            && !value.is_u64()
        {
            return Err(format!("{path}.{keyword}: expected a whole number >= 0, got {}", show(value)));
        }
    }
    for keyword in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if let Some(value) = schema.get(keyword)
            && !value.is_number()
        {
            return Err(format!("{path}.{keyword}: expected a number, got {}", show(value)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err(schema: Value, args: Value) -> String {
        validate(&schema, &args).unwrap_err()
    }

    #[test]
    fn types_are_checked_with_the_path_and_the_value() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        assert_eq!(err(schema.clone(), json!({"path": 3})), "args.path: expected a string, got 3");
        assert_eq!(err(schema, json!([1])), "args: expected an object, got [1]");
        let ok = |ty: &str, v: Value| validate(&json!({"type": ty}), &v).is_ok();
        assert!(ok("integer", json!(3)));
        assert!(ok("integer", json!(3.0)));
        assert!(!ok("integer", json!(3.5)));
        assert!(ok("number", json!(3)));
        assert!(ok("null", json!(null)));
        assert!(!ok("boolean", json!("true")));
        assert!(ok("array", json!([])));
        let nullable = json!({"type": ["string", "null"]});
        assert!(validate(&nullable, &json!(null)).is_ok());
        assert!(validate(&nullable, &json!("x")).is_ok());
        assert_eq!(err(nullable, json!(1)), "args: expected one of string, null, got 1");
    }

    #[test]
    fn required_and_additional_properties() {
        let schema = json!({"type": "object", "required": ["key"], "additionalProperties": false,
            "properties": {"key": {"type": "string"}, "value": {}}});
        assert_eq!(err(schema.clone(), json!({})), "args.key: is required");
        assert_eq!(
            err(schema.clone(), json!({"key": "k", "extra": 1})),
            "args.extra: unknown property (allowed: key, value)"
        );
        assert!(validate(&schema, &json!({"key": "k", "value": [1, {"a": null}]})).is_ok());
        let typed_extra = json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert!(validate(&typed_extra, &json!({"a": "x"})).is_ok());
        assert_eq!(err(typed_extra, json!({"a b": 1})), "args[\"a b\"]: expected a string, got 1");
        assert_eq!(
            err(json!({"additionalProperties": false}), json!({"x": 1})),
            "args.x: unknown property (no properties are allowed)"
        );
    }

    #[test]
    fn enum_const_and_any_of() {
        let method = json!({"enum": ["GET", "POST"]});
        assert!(validate(&method, &json!("GET")).is_ok());
        assert_eq!(err(method, json!("get")), "args: expected one of \"GET\", \"POST\", got \"get\"");
        assert_eq!(err(json!({"const": 1}), json!(2)), "args: expected 1, got 2");
        let any = json!({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]});
        assert!(validate(&any, &json!("x")).is_ok());
        assert!(validate(&any, &json!(3)).is_ok());
        assert_eq!(err(any, json!(-1)), "args: expected a string, got -1");
    }

    #[test]
    fn sizes_and_ranges() {
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
        assert_eq!(err(s.clone(), json!("a")), "args: must be at least 2 characters long, got 1");
        assert_eq!(err(s.clone(), json!("abcd")), "args: must be at most 3 characters long, got 4");
        assert!(validate(&s, &json!("\u{e9}\u{e9}\u{e9}")).is_ok(), "characters, not bytes");
        let n = json!({"minimum": 1, "maximum": 10});
        assert_eq!(err(n.clone(), json!(0)), "args: must be at least 1, got 0");
        assert_eq!(err(n.clone(), json!(10.5)), "args: must be at most 10, got 10.5");
        assert!(validate(&n, &json!(10)).is_ok());
        assert_eq!(err(json!({"exclusiveMinimum": 0}), json!(0)), "args: must be greater than 0, got 0");
        assert_eq!(err(json!({"exclusiveMaximum": 1}), json!(1)), "args: must be less than 1, got 1");
        let list = json!({"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer"}});
        assert_eq!(err(list.clone(), json!([])), "args: must have at least 1 items, got 0");
        assert_eq!(err(list.clone(), json!([1, 2, 3])), "args: must have at most 2 items, got 3");
        assert_eq!(err(list.clone(), json!([1, "x"])), "args[1]: expected an integer, got \"x\"");
        assert!(validate(&list, &json!([1, 2])).is_ok());
    }

    #[test]
    fn nested_paths_and_long_values() {
        let schema = json!({"type": "object", "properties": {"items": {"type": "array",
            "items": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}}}});
        assert_eq!(err(schema.clone(), json!({"items": [{"id": 1}, {}]})), "args.items[1].id: is required");
        let long = "x".repeat(100);
        let message = err(json!({"type": "integer"}), json!(long));
        assert!(message.ends_with("...") && message.len() < 100, "{message}");
        assert!(validate(&json!(true), &json!(1)).is_ok());
        assert_eq!(err(json!(false), json!(1)), "args: no value is allowed here");
    }

    #[test]
    fn malformed_or_unsupported_schemas_are_refused_at_load() {
        assert!(
            check_schema(&json!({"type": "object", "required": ["text"],
            "properties": {"text": {"type": "string", "description": "d", "pattern": "^a"}},
            "additionalProperties": false}))
            .is_ok()
        );
        for (schema, says) in [
            (json!("object"), "input_schema: a schema must be an object"),
            (json!({"type": "text"}), "input_schema.type: \"text\" is not a type"),
            (json!({"type": []}), "input_schema.type: expected a type name"),
            (json!({"required": "text"}), "input_schema.required: expected a list"),
            (json!({"properties": []}), "input_schema.properties: expected a table"),
            (json!({"properties": {"a": {"type": 1}}}), "input_schema.properties.a.type"),
            (json!({"items": [{}]}), "tuple forms are not supported"),
            (json!({"enum": []}), "input_schema.enum"),
            (json!({"minLength": -1}), "input_schema.minLength: expected a whole number"),
            (json!({"maximum": "1"}), "input_schema.maximum: expected a number"),
            (
                json!({"properties": {"a": {"$ref": "#/x"}}}),
                "input_schema.properties.a: `$ref` is not supported",
            ),
            (json!({"oneOf": [{}]}), "`oneOf` is not supported"),
            (json!({"anyOf": []}), "input_schema.anyOf"),
        ] {
            let message = check_schema(&schema).unwrap_err();
            assert!(message.contains(says), "{schema}: {message}");
        }
    }
}
