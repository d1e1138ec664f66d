//! Memory syscalls (`mem.*`): conversation threads and long-term records, scoped by the
//! run's tenant. Params are checked here before anything is journaled; the same checks
//! serve the HTTP API (`Kernel::memory`), so both answer the same errors.
//!
//! Writes are idempotent under the crash-window policy "retry": a thread append and a
//! delete carry the idempotency key `run_id:seq` of their journal entry, so a retried
//! append answers the first index and a retried delete the first `deleted`; a put writes
//! the same record again.

use keel_protocol::rpc::{
    ErrorKind, MemGetResult, MemKeyParams, MemPutParams, MemSearchHit, MemSearchParams,
    MemThreadAppendParams, MemThreadReadParams, RpcError, ThreadEntry,
};
use keel_store::Store;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Kernel;
use crate::runtime::now_ms;

const MAX_NAME_BYTES: usize = 256;
const MAX_KEY_BYTES: usize = 512;
const MAX_SEARCH_LIMIT: u64 = 100;
const DEFAULT_SEARCH_LIMIT: u64 = 10;
const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// A memory call whose params were checked.
#[derive(Debug, Clone, PartialEq)]
pub enum MemCall {
    ThreadAppend { thread: String, role: String, content: String },
    ThreadRead { thread: String, last: Option<u64>, max_tokens: Option<u64> },
    Put { namespace: String, key: String, value: Value, text: String },
    Get { namespace: String, key: String },
    Delete { namespace: String, key: String },
    Search { namespace: String, query: String, limit: u64 },
}

impl MemCall {
    /// Whether the call changes memory (journaled as intent, then result) or only reads
    /// it (journaled complete at once, so replay answers what was read).
    pub fn is_write(&self) -> bool {
        matches!(self, MemCall::ThreadAppend { .. } | MemCall::Put { .. } | MemCall::Delete { .. })
    }
}

fn bad(message: String) -> RpcError {
    ErrorKind::InvalidParams.error(message)
}

fn parse<T: DeserializeOwned>(method: &str, params: &Value, shape: &str) -> Result<T, RpcError> {
    serde_json::from_value(params.clone()).map_err(|e| bad(format!("{method}: {e}; expected params {shape}")))
}

fn name(method: &str, field: &str, value: String, max: usize) -> Result<String, RpcError> {
    if value.is_empty() || value.len() > max {
        return Err(bad(format!("{method}: `{field}` must be 1 to {max} bytes long")));
    }
    if value.chars().any(char::is_control) {
        return Err(bad(format!("{method}: `{field}` must not contain control characters")));
    }
    Ok(value)
}

/// Whether `method` is a memory syscall.
pub fn is_memory_method(method: &str) -> bool {
    method.starts_with("mem.")
}

/// Checks a memory call's params. `method` must be one of the `mem.*` methods.
pub fn check(method: &str, params: &Value) -> Result<MemCall, RpcError> {
    Ok(match method {
        "mem.thread.append" => {
            let p: MemThreadAppendParams = parse(
                method,
                params,
                "{\"thread\":\"...\",\"message\":{\"role\":\"user\",\"content\":\"...\"}}",
            )?;
            if !ROLES.contains(&p.message.role.as_str()) {
                return Err(bad(format!(
                    "{method}: role {:?} is not one of {}",
                    p.message.role,
                    ROLES.join(", ")
                )));
            }
            MemCall::ThreadAppend {
                thread: name(method, "thread", p.thread, MAX_NAME_BYTES)?,
                role: p.message.role,
                content: p.message.content,
            }
        }
        "mem.thread.read" => {
            let p: MemThreadReadParams =
                parse(method, params, "{\"thread\":\"...\",\"last\":20,\"max_tokens\":4000}")?;
            MemCall::ThreadRead {
                thread: name(method, "thread", p.thread, MAX_NAME_BYTES)?,
                last: p.last,
                max_tokens: p.max_tokens,
            }
        }
        "mem.put" => {
            let p: MemPutParams = parse(
                method,
                params,
                "{\"namespace\":\"...\",\"key\":\"...\",\"value\":<any JSON>,\"text\":\"optional\"}",
            )?;
            let text = match p.text {
                Some(text) => text,
                None => match &p.value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                },
            };
            MemCall::Put {
                namespace: name(method, "namespace", p.namespace, MAX_NAME_BYTES)?,
                key: name(method, "key", p.key, MAX_KEY_BYTES)?,
                value: p.value,
                text,
            }
        }
        "mem.get" | "mem.delete" => {
            let p: MemKeyParams = parse(method, params, "{\"namespace\":\"...\",\"key\":\"...\"}")?;
            let namespace = name(method, "namespace", p.namespace, MAX_NAME_BYTES)?;
            let key = name(method, "key", p.key, MAX_KEY_BYTES)?;
            if method == "mem.get" {
                MemCall::Get { namespace, key }
            } else {
                MemCall::Delete { namespace, key }
            }
        }
        "mem.search" => {
            let p: MemSearchParams =
                parse(method, params, "{\"namespace\":\"...\",\"query\":\"words\",\"limit\":10}")?;
            let limit = p.limit.unwrap_or(DEFAULT_SEARCH_LIMIT);
            if limit == 0 || limit > MAX_SEARCH_LIMIT {
                return Err(bad(format!("{method}: `limit` must be 1 to {MAX_SEARCH_LIMIT}")));
            }
            MemCall::Search {
                namespace: name(method, "namespace", p.namespace, MAX_NAME_BYTES)?,
                query: p.query,
                limit,
            }
        }
        other => {
            return Err(ErrorKind::UnknownMethod.error(format!("unknown memory method {other:?}")));
        }
    })
}

/// The estimated token count of a message: about four bytes a token, plus a few for the
/// role and framing (the same rough rule the gateway's budget estimate uses).
pub fn estimate_tokens(content: &str) -> u64 {
    (content.len() as u64).div_ceil(4) + 4
}

fn internal(err: impl std::fmt::Display) -> RpcError {
    ErrorKind::Internal.error(format!("the kernel failed: {err}"))
}

/// Performs a checked call for `tenant`. `idempotency_key` makes a thread append or a
/// delete safe to retry (the kernel passes `run_id:seq`).
pub async fn perform(
    store: &dyn Store,
    tenant: &str,
    call: MemCall,
    idempotency_key: Option<&str>,
) -> Result<Value, RpcError> {
    match call {
        MemCall::ThreadAppend { thread, role, content } => {
            let message = json!({ "role": role, "content": content });
            let index = store
                .thread_append(tenant, &thread, message, idempotency_key, now_ms())
                .await
                .map_err(internal)?;
            Ok(json!({ "index": index }))
        }
        MemCall::ThreadRead { thread, last, max_tokens } => {
            let last = last.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let stored = store.thread_read(tenant, &thread, last).await.map_err(internal)?;
            let mut messages = Vec::with_capacity(stored.len());
            for message in stored {
                let entry = ThreadEntry {
                    index: message.index,
                    role: message.message.get("role").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    content: message
                        .message
                        .get("content")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                };
                messages.push(entry);
            }
            if let Some(max_tokens) = max_tokens {
                // Keep the newest messages that fit; never split a message.
                let mut used = 0u64;
                let mut keep = 0;
                for message in messages.iter().rev() {
                    let cost = estimate_tokens(&message.content);
                    if used + cost > max_tokens {
                        break;
                    }
                    used += cost;
                    keep += 1;
                }
                messages.drain(..messages.len() - keep);
            }
            Ok(json!({ "messages": messages }))
        }
        MemCall::Put { namespace, key, value, text } => {
            store.mem_put(tenant, &namespace, &key, value, text, now_ms()).await.map_err(internal)?;
            Ok(json!({}))
        }
        MemCall::Get { namespace, key } => {
            let record = store.mem_get(tenant, &namespace, &key).await.map_err(internal)?;
            let value = record.map_or(Value::Null, |record| record.value);
            serde_json::to_value(MemGetResult { value }).map_err(internal)
        }
        MemCall::Delete { namespace, key } => {
            let deleted =
                store.mem_delete(tenant, &namespace, &key, idempotency_key).await.map_err(internal)?;
            Ok(json!({ "deleted": deleted }))
        }
        MemCall::Search { namespace, query, limit } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let hits = store.mem_search(tenant, &namespace, &query, limit).await.map_err(internal)?;
            let hits: Vec<MemSearchHit> = hits
                .into_iter()
                .map(|hit| MemSearchHit { key: hit.key, score: hit.score, snippet: hit.snippet })
                .collect();
            Ok(json!({ "hits": hits }))
        }
    }
}

impl Kernel {
    /// A memory call from outside any run (the HTTP API and `keel mem`): the same params,
    /// checks and answers as the `mem.*` syscall `method`, for `tenant`. Not journaled:
    /// there is no run to replay.
    pub async fn memory(&self, tenant: &str, method: &str, params: Value) -> Result<Value, RpcError> {
        if !is_memory_method(method) {
            return Err(ErrorKind::UnknownMethod.error(format!("{method:?} is not a memory method")));
        }
        let call = check(method, &params)?;
        perform(self.store().as_ref(), tenant, call, None).await
    }

    /// A whole record (value, indexed text, time) for the HTTP API, with the checks of
    /// `mem.get`; `None` when there is none.
    pub async fn memory_record(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
    ) -> Result<Option<keel_store::MemoryRecord>, RpcError> {
        let MemCall::Get { namespace, key } =
            check("mem.get", &json!({ "namespace": namespace, "key": key }))?
        else {
            return Err(internal("mem.get checked into another call"));
        };
        self.store().mem_get(tenant, &namespace, &key).await.map_err(internal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_what_is_wrong() {
        let err = check("mem.put", &json!({"namespace": "", "key": "k", "value": 1})).unwrap_err();
        assert!(err.message.contains("`namespace` must be 1 to"), "{}", err.message);
        let err =
            check("mem.thread.append", &json!({"thread": "t", "message": {"role": "robot", "content": "x"}}))
                .unwrap_err();
        assert!(err.message.contains("role \"robot\""), "{}", err.message);
        let err = check("mem.search", &json!({"namespace": "n", "query": "q", "limit": 0})).unwrap_err();
        assert!(err.message.contains("`limit`"), "{}", err.message);
        let err = check("mem.get", &json!({"namespace": "n"})).unwrap_err();
        assert!(err.message.contains("missing field `key`"), "{}", err.message);
        let err = check("mem.get", &json!({"namespace": "n", "key": "k", "extra": 1})).unwrap_err();
        assert!(err.message.contains("unknown field"), "{}", err.message);
    }

    #[test]
    fn put_indexes_the_value_when_no_text_is_given() {
        let call = check("mem.put", &json!({"namespace": "n", "key": "k", "value": "plain words"})).unwrap();
        assert!(matches!(call, MemCall::Put { ref text, .. } if text == "plain words"));
        let call = check("mem.put", &json!({"namespace": "n", "key": "k", "value": {"a": 1}})).unwrap();
        assert!(matches!(call, MemCall::Put { ref text, .. } if text == "{\"a\":1}"));
        let call = check("mem.put", &json!({"namespace": "n", "key": "k", "value": 1, "text": "t"})).unwrap();
        assert!(call.is_write());
        assert!(matches!(call, MemCall::Put { ref text, .. } if text == "t"));
    }
}
