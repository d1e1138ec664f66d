//! Readers for the request fields both compatibility dialects share (`max_tokens`,
//! sampling numbers, stop sequences, the model), with errors a client can act on. The
//! OpenAI and Anthropic parsers differ in field names and shapes, not in these rules.

use serde_json::{Map, Value};

use crate::{Error, Result};

pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidRequest(message.into())
}

/// The first of `keys` present and not null, as a positive `u32` (`max_tokens`).
pub(crate) fn max_tokens(object: &Map<String, Value>, keys: &[&str]) -> Result<Option<u32>> {
    match keys.iter().find_map(|key| object.get(*key).filter(|v| !v.is_null())) {
        None => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid("`max_tokens` must be a positive integer")),
    }
}

/// An optional number field (`temperature`, `top_p`).
pub(crate) fn number(object: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_f64().map(Some).ok_or_else(|| invalid(format!("`{key}` must be a number"))),
    }
}

/// Stop sequences: an array of strings, or (where the dialect allows it, `single`) one
/// string.
pub(crate) fn stop_sequences(
    object: &Map<String, Value>,
    key: &str,
    single: bool,
) -> Result<Option<Vec<String>>> {
    let shape = if single { "a string or an array of strings" } else { "an array of strings" };
    let wrong = || invalid(format!("`{key}` must be {shape}"));
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(one)) if single => Ok(Some(vec![one.clone()])),
        Some(Value::Array(many)) => many
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(wrong),
        Some(_) => Err(wrong()),
    }
}

/// The requested model, if named.
pub(crate) fn model(object: &Map<String, Value>) -> Option<String> {
    object.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).map(str::to_owned)
}
