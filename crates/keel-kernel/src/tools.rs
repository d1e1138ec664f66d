//! The built-in tools: `echo` and a key-value space scoped to the run (`kv.put`,
//! `kv.get`). Each validates its arguments before the call is journaled.

use keel_protocol::rpc::ToolSpec;
use keel_store::Store;
use serde_json::{Value, json};

/// A built-in tool call whose arguments were checked.
#[derive(Debug, Clone, PartialEq)]
pub enum BuiltinCall {
    Echo(Value),
    KvPut { key: String, value: Value },
    KvGet { key: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolLookupError {
    Unknown(String),
    BadArgs(String),
}

pub fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "echo".into(),
            description: "Returns its arguments unchanged.".into(),
            input_schema: json!({"type": "object"}),
        },
        ToolSpec {
            name: "kv.put".into(),
            description: "Stores a JSON value under a key in the run's key-value space.".into(),
            input_schema: json!({"type": "object", "required": ["key", "value"],
                "properties": {"key": {"type": "string"}, "value": {}}}),
        },
        ToolSpec {
            name: "kv.get".into(),
            description: "Returns the value stored under a key in the run's key-value space, or null.".into(),
            input_schema: json!({"type": "object", "required": ["key"],
                "properties": {"key": {"type": "string"}}}),
        },
    ]
}

const MAX_KEY_BYTES: usize = 512;

fn key_arg(tool: &str, args: &Value) -> Result<String, ToolLookupError> {
    match args.get("key") {
        Some(Value::String(key)) if !key.is_empty() && key.len() <= MAX_KEY_BYTES => Ok(key.clone()),
        Some(Value::String(_)) => {
            Err(ToolLookupError::BadArgs(format!("{tool}: `key` must be 1 to {MAX_KEY_BYTES} bytes long")))
        }
        _ => Err(ToolLookupError::BadArgs(format!("{tool}: `key` (a string) is required"))),
    }
}

pub fn lookup(name: &str, args: &Value) -> Result<BuiltinCall, ToolLookupError> {
    if !args.is_object() {
        return Err(ToolLookupError::BadArgs(format!("{name}: `args` must be a JSON object")));
    }
    match name {
        "echo" => Ok(BuiltinCall::Echo(args.clone())),
        "kv.put" => {
            let key = key_arg(name, args)?;
            let value = args
                .get("value")
                .cloned()
                .ok_or_else(|| ToolLookupError::BadArgs("kv.put: `value` is required".into()))?;
            Ok(BuiltinCall::KvPut { key, value })
        }
        "kv.get" => Ok(BuiltinCall::KvGet { key: key_arg(name, args)? }),
        other => Err(ToolLookupError::Unknown(other.to_owned())),
    }
}

/// Performs the call. kv writes are idempotent, so a retry after a crash is harmless.
pub async fn run(call: BuiltinCall, scope: &str, store: &dyn Store) -> Result<Value, keel_store::Error> {
    match call {
        BuiltinCall::Echo(args) => Ok(args),
        BuiltinCall::KvPut { key, value } => {
            store.kv_put(scope, &key, value).await?;
            Ok(Value::Bool(true))
        }
        BuiltinCall::KvGet { key } => Ok(store.kv_get(scope, &key).await?.unwrap_or(Value::Null)),
    }
}
