//! `ui.show`: typed blocks an agent shows on its run's console page (tables, charts,
//! markdown, progress, forms), and the form schemas `human.ask` takes. Checked strictly
//! here before anything is journaled (a bad block leaves no trace); the dispatcher
//! journals a good one complete and emits it as a `ui` event. The shapes are the wire
//! contract the console renders (`docs/protocol.md`, "Agents that render UI").

use keel_protocol::rpc::{ErrorKind, MAX_UI_BLOCK_BYTES};
use serde_json::{Map, Value};

use super::SyscallError;

/// The block types, in the order the error messages list them.
const TYPES: &[&str] = &["table", "chart", "markdown", "progress", "form"];

/// Checks a `ui.show` block: its size, its `type`, and every field of that type.
pub(crate) fn check_block(block: &Value) -> Result<(), SyscallError> {
    let size = serde_json::to_vec(block).map(|b| b.len()).unwrap_or(usize::MAX);
    if size > MAX_UI_BLOCK_BYTES {
        return Err(SyscallError::new(
            ErrorKind::TooLarge,
            format!(
                "ui.show: the block is {size} bytes of JSON, over the limit of {MAX_UI_BLOCK_BYTES}; show less (page a table, summarise a text)"
            ),
        ));
    }
    check_shape(block).map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("ui.show: {e}")))
}

/// Checks a form's schema (a `form` block's `schema`, `human.ask`'s `form`) at `path`: a
/// JSON schema of an object, within the subset `keel_tools::schema` enforces, so an
/// answer can be validated against all of it.
pub(crate) fn check_form_schema(schema: &Value, path: &str) -> Result<(), String> {
    if !schema.is_object() {
        return Err(format!(
            "{path}: expected a JSON schema object such as {{\"type\":\"object\",\"properties\":{{...}}}}, got {}",
            kind(schema)
        ));
    }
    if schema.get("type") != Some(&Value::String("object".to_owned())) {
        return Err(format!(
            "{path}.type: a form's schema must have \"type\": \"object\" (a form's answer is an object of fields), got {}",
            schema.get("type").map_or_else(|| "none".to_owned(), Value::to_string)
        ));
    }
    keel_tools::schema::check_schema_at(schema, path)
}

fn check_shape(block: &Value) -> Result<(), String> {
    let Some(fields) = block.as_object() else {
        return Err(format!(
            "block: expected an object with a \"type\" ({}), got {}",
            TYPES.join(", "),
            kind(block)
        ));
    };
    let block_type = match fields.get("type") {
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => t.as_str(),
        Some(other) => {
            return Err(format!("block.type: expected one of {}, got {other}", TYPES.join(", ")));
        }
        None => return Err(format!("block.type: missing; expected one of {}", TYPES.join(", "))),
    };
    let allowed: &[&str] = match block_type {
        "table" => &["type", "title", "columns", "rows"],
        "chart" => &["type", "title", "kind", "labels", "series"],
        "markdown" => &["type", "text"],
        "progress" => &["type", "value", "label"],
        _ => &["type", "id", "title", "schema"],
    };
    known_fields(fields, allowed, "block", &format!("a {block_type} block"))?;
    optional_string(fields, "title", "block")?;
    match block_type {
        "table" => {
            let columns = strings(required(fields, "columns", "block")?, "block.columns")?;
            let rows = array(required(fields, "rows", "block")?, "block.rows", "an array of rows")?;
            for (index, row) in rows.iter().enumerate() {
                let path = format!("block.rows[{index}]");
                let cells = array(row, &path, "an array of cells")?;
                if cells.len() != columns {
                    return Err(format!(
                        "{path}: has {} cells but block.columns has {columns}; each row needs one cell per column",
                        cells.len()
                    ));
                }
                for (column, cell) in cells.iter().enumerate() {
                    if cell.is_array() || cell.is_object() {
                        return Err(format!(
                            "{path}[{column}]: expected a string, number, boolean or null, got {}",
                            kind(cell)
                        ));
                    }
                }
            }
        }
        "chart" => {
            match required(fields, "kind", "block")? {
                Value::String(k) if k == "line" || k == "bar" => {}
                other => return Err(format!("block.kind: expected one of line, bar, got {other}")),
            }
            let labels = strings(required(fields, "labels", "block")?, "block.labels")?;
            let series = array(required(fields, "series", "block")?, "block.series", "an array of series")?;
            for (index, one) in series.iter().enumerate() {
                let path = format!("block.series[{index}]");
                let Some(one) = one.as_object() else {
                    return Err(format!(
                        "{path}: expected an object {{\"name\": str, \"values\": [number]}}, got {}",
                        kind(one)
                    ));
                };
                known_fields(one, &["name", "values"], &path, "a series")?;
                string(required(one, "name", &path)?, &format!("{path}.name"))?;
                let values_path = format!("{path}.values");
                let values = array(required(one, "values", &path)?, &values_path, "an array of numbers")?;
                if values.len() != labels {
                    return Err(format!(
                        "{values_path}: has {} values but block.labels has {labels}; each series needs one value per label",
                        values.len()
                    ));
                }
                if let Some((at, bad)) = values.iter().enumerate().find(|(_, v)| !v.is_number()) {
                    return Err(format!("{values_path}[{at}]: expected a number, got {}", kind(bad)));
                }
            }
        }
        "markdown" => string(required(fields, "text", "block")?, "block.text")?,
        "progress" => {
            let value = required(fields, "value", "block")?;
            match value.as_f64() {
                Some(v) if (0.0..=1.0).contains(&v) => {}
                Some(_) => return Err(format!("block.value: expected a number from 0 to 1, got {value}")),
                None => {
                    return Err(format!("block.value: expected a number from 0 to 1, got {}", kind(value)));
                }
            }
            optional_string(fields, "label", "block")?;
        }
        _ => {
            let id = required(fields, "id", "block")?;
            string(id, "block.id")?;
            if id.as_str().is_some_and(str::is_empty) {
                return Err(
                    "block.id: must not be empty; the submitted value names the form by it".to_owned()
                );
            }
            check_form_schema(required(fields, "schema", "block")?, "block.schema")?;
        }
    }
    Ok(())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn known_fields(fields: &Map<String, Value>, allowed: &[&str], path: &str, what: &str) -> Result<(), String> {
    match fields.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(unknown) => Err(format!("{path}.{unknown}: unknown field; {what} has: {}", allowed.join(", "))),
        None => Ok(()),
    }
}

fn required<'a>(fields: &'a Map<String, Value>, name: &str, path: &str) -> Result<&'a Value, String> {
    fields.get(name).ok_or_else(|| format!("{path}.{name}: missing (required)"))
}

fn string(value: &Value, path: &str) -> Result<(), String> {
    match value {
        Value::String(_) => Ok(()),
        other => Err(format!("{path}: expected a string, got {}", kind(other))),
    }
}

fn optional_string(fields: &Map<String, Value>, name: &str, path: &str) -> Result<(), String> {
    fields.get(name).map_or(Ok(()), |value| string(value, &format!("{path}.{name}")))
}

fn array<'a>(value: &'a Value, path: &str, what: &str) -> Result<&'a Vec<Value>, String> {
    value.as_array().ok_or_else(|| format!("{path}: expected {what}, got {}", kind(value)))
}

/// An array of strings; returns its length.
fn strings(value: &Value, path: &str) -> Result<usize, String> {
    let items = array(value, path, "an array of strings")?;
    if let Some((at, bad)) = items.iter().enumerate().find(|(_, v)| !v.is_string()) {
        return Err(format!("{path}[{at}]: expected a string, got {}", kind(bad)));
    }
    Ok(items.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(block: Value) -> String {
        check_block(&block).expect_err("refused").message
    }

    #[test]
    fn each_block_type_is_accepted() {
        for block in [
            json!({"type": "table", "title": "t", "columns": ["a", "b"], "rows": [["x", 1], [true, null]]}),
            json!({"type": "table", "columns": [], "rows": []}),
            json!({"type": "chart", "kind": "bar", "labels": ["q1", "q2"], "series": [{"name": "s", "values": [1, 2.5]}]}),
            json!({"type": "markdown", "text": "# hi"}),
            json!({"type": "progress", "value": 0, "label": "start"}),
            json!({"type": "progress", "value": 1}),
            json!({"type": "form", "id": "f", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}),
        ] {
            check_block(&block).unwrap_or_else(|e| panic!("{block}: {}", e.message));
        }
    }

    #[test]
    fn a_bad_block_is_refused_naming_the_field_and_what_is_allowed() {
        for (block, expected) in [
            (
                json!("hi"),
                "block: expected an object with a \"type\" (table, chart, markdown, progress, form), got a string",
            ),
            (
                json!({"type": "video"}),
                "block.type: expected one of table, chart, markdown, progress, form, got \"video\"",
            ),
            (json!({"text": "x"}), "block.type: missing; expected one of table"),
            (
                json!({"type": "markdown", "text": "x", "color": "red"}),
                "block.color: unknown field; a markdown block has: type, text",
            ),
            (
                json!({"type": "table", "columns": ["a"], "rows": [["x", "y"]]}),
                "block.rows[0]: has 2 cells but block.columns has 1",
            ),
            (
                json!({"type": "table", "columns": ["a"], "rows": [[{"x": 1}]]}),
                "block.rows[0][0]: expected a string, number, boolean or null, got an object",
            ),
            (
                json!({"type": "table", "columns": [1], "rows": []}),
                "block.columns[0]: expected a string, got a number",
            ),
            (
                json!({"type": "chart", "kind": "pie", "labels": [], "series": []}),
                "block.kind: expected one of line, bar, got \"pie\"",
            ),
            (
                json!({"type": "chart", "kind": "line", "labels": ["a"], "series": [{"name": "s", "values": [1, 2]}]}),
                "block.series[0].values: has 2 values but block.labels has 1",
            ),
            (
                json!({"type": "chart", "kind": "line", "labels": ["a"], "series": [{"name": "s", "values": ["1"]}]}),
                "block.series[0].values[0]: expected a number, got a string",
            ),
            (
                json!({"type": "progress", "value": 1.5}),
                "block.value: expected a number from 0 to 1, got 1.5",
            ),
            (json!({"type": "progress"}), "block.value: missing (required)"),
            (
                json!({"type": "table", "columns": [], "rows": [], "title": 3}),
                "block.title: expected a string, got a number",
            ),
            (
                json!({"type": "markdown", "text": "x", "title": "t"}),
                "block.title: unknown field; a markdown block has: type, text",
            ),
            (
                json!({"type": "form", "id": "f", "schema": {"type": "string"}}),
                "block.schema.type: a form's schema must have \"type\": \"object\"",
            ),
            (
                json!({"type": "form", "id": "f", "schema": {"type": "object", "oneOf": []}}),
                "block.schema: `oneOf` is not supported",
            ),
            (json!({"type": "form", "id": "", "schema": {"type": "object"}}), "block.id: must not be empty"),
        ] {
            let message = refused(block.clone());
            assert!(message.starts_with("ui.show: "), "{message}");
            assert!(message.contains(expected), "{block}: {message}");
        }
    }

    #[test]
    fn a_block_over_the_limit_is_too_large() {
        let block = json!({"type": "markdown", "text": "x".repeat(MAX_UI_BLOCK_BYTES)});
        let err = check_block(&block).expect_err("refused");
        assert!(err.is(ErrorKind::TooLarge), "{}", err.message);
    }
}
