//! Memory syscalls (`mem.*`): conversation threads and long-term records, scoped by the
//! run's tenant. Params are checked here before anything is journaled; the same checks
//! serve the HTTP API (`Kernel::memory`), so both answer the same errors.
//!
//! Writes are idempotent under the crash-window policy "retry": a thread append and a
//! delete carry the idempotency key `run_id:seq` of their journal entry, so a retried
//! append answers the first index and a retried delete the first `deleted`; a put writes
//! the same record again.
//!
//! Embeddings: a put embeds its text with the kernel's embedder (`[llm.embeddings]`, the
//! offline hash embedder by default) and stores the vector with the record in one
//! transaction; a semantic or hybrid search embeds its query. The embedding call is part
//! of the syscall's effect, so it is journaled with it: a replayed put or search answers
//! from the journal and never calls the embedder again; a put retried after a crash
//! embeds again (harmless: it only costs the provider's tokens). Tokens the provider
//! reports count into the run's usage as input tokens.

use keel_llm::Embedder;
use keel_protocol::rpc::{
    ErrorKind, LlmEmbedParams, LlmEmbedResult, MemGetResult, MemKeyParams, MemPutParams, MemSearchHit,
    MemSearchMode, MemSearchParams, MemThreadAppendParams, MemThreadReadParams, ThreadEntry,
};
use keel_store::{MemoryEmbedding, MemorySearch, SearchMode, Store};
use keel_types::Usage;
use serde_json::{Value, json};

use crate::Kernel;
use crate::now_ms;
use crate::syscall::SyscallError;
use crate::syscall::{internal, parse};

const MAX_NAME_BYTES: usize = 256;
const MAX_KEY_BYTES: usize = 512;
const MAX_SEARCH_LIMIT: u64 = 100;
const DEFAULT_SEARCH_LIMIT: u64 = 10;
const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// A memory call whose params were checked.
#[derive(Debug, Clone, PartialEq)]
pub enum MemCall {
    ThreadAppend {
        thread: String,
        role: String,
        content: String,
    },
    ThreadRead {
        thread: String,
        last: Option<u64>,
        max_tokens: Option<u64>,
    },
    Put {
        namespace: String,
        key: String,
        value: Value,
        text: String,
    },
    Get {
        namespace: String,
        key: String,
    },
    Delete {
        namespace: String,
        key: String,
    },
    Search {
        namespace: String,
        query: String,
        limit: u64,
        mode: SearchMode,
    },
    /// `llm.embed` (the gateway's `/v1/embeddings`): the embedder's vectors, journaled
    /// like a memory read so a replay answers the same.
    Embed {
        input: Vec<String>,
    },
}

/// What a performed call answers, and what its embedding calls used.
#[derive(Debug, Clone, PartialEq)]
pub struct Performed {
    pub result: Value,
    pub usage: Usage,
    /// How many times the embedder was asked (for the metrics).
    pub embed_calls: u32,
}

/// The embedder, counting the calls made through it.
struct Counting<'a> {
    inner: &'a dyn Embedder,
    calls: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl Embedder for Counting<'_> {
    async fn embed(&self, texts: &[String]) -> keel_llm::Result<keel_llm::Embedded> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.embed(texts).await
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn dimensions(&self) -> Option<usize> {
        self.inner.dimensions()
    }
}

impl MemCall {
    /// Whether the call changes memory (journaled as intent, then result) or only reads
    /// it (journaled complete at once, so replay answers what was read).
    pub fn is_write(&self) -> bool {
        matches!(self, MemCall::ThreadAppend { .. } | MemCall::Put { .. } | MemCall::Delete { .. })
    }
}

fn bad(message: String) -> SyscallError {
    SyscallError::new(ErrorKind::InvalidParams, message)
}

fn name(method: &str, field: &str, value: String, max: usize) -> Result<String, SyscallError> {
    if value.is_empty() || value.len() > max {
        return Err(bad(format!("{method}: `{field}` must be 1 to {max} bytes long")));
    }
    if value.chars().any(char::is_control) {
        return Err(bad(format!("{method}: `{field}` must not contain control characters")));
    }
    Ok(value)
}

/// Whether `method` is a memory syscall (`mem.*`, and `llm.embed`, which uses the same
/// embedder and is journaled the same way).
pub fn is_memory_method(method: &str) -> bool {
    method.starts_with("mem.") || method == "llm.embed"
}

const MAX_EMBED_INPUTS: usize = 2048;
const MAX_EMBED_INPUT_BYTES: usize = 64 * 1024;

/// Checks a memory call's params. `method` must be one of the `mem.*` methods.
pub fn check(method: &str, params: &Value) -> Result<MemCall, SyscallError> {
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
            let p: MemSearchParams = parse(
                method,
                params,
                "{\"namespace\":\"...\",\"query\":\"words\",\"limit\":10,\"mode\":\"text|semantic|hybrid\"}",
            )?;
            let limit = p.limit.unwrap_or(DEFAULT_SEARCH_LIMIT);
            if limit == 0 || limit > MAX_SEARCH_LIMIT {
                return Err(bad(format!("{method}: `limit` must be 1 to {MAX_SEARCH_LIMIT}")));
            }
            MemCall::Search {
                namespace: name(method, "namespace", p.namespace, MAX_NAME_BYTES)?,
                query: p.query,
                limit,
                mode: match p.mode {
                    None | Some(MemSearchMode::Text) => SearchMode::Text,
                    Some(MemSearchMode::Semantic) => SearchMode::Semantic,
                    Some(MemSearchMode::Hybrid) => SearchMode::Hybrid,
                },
            }
        }
        "llm.embed" => {
            let p: LlmEmbedParams =
                parse(method, params, "{\"input\":[\"text\", ...],\"model\":\"optional\"}")?;
            if p.input.is_empty() || p.input.len() > MAX_EMBED_INPUTS {
                return Err(bad(format!("{method}: `input` must hold 1 to {MAX_EMBED_INPUTS} texts")));
            }
            if p.input.iter().any(|text| text.len() > MAX_EMBED_INPUT_BYTES) {
                return Err(bad(format!(
                    "{method}: each input must be at most {MAX_EMBED_INPUT_BYTES} bytes"
                )));
            }
            MemCall::Embed { input: p.input }
        }
        other => {
            return Err(SyscallError::new(
                ErrorKind::UnknownMethod,
                format!("unknown memory method {other:?}"),
            ));
        }
    })
}

/// The estimated token count of a message: about four bytes a token, plus a few for the
/// role and framing (the same rough rule the gateway's budget estimate uses).
pub fn estimate_tokens(content: &str) -> u64 {
    (content.len() as u64).div_ceil(4) + 4
}

/// Embeds one text, for a put or a query; `None` for a text without words (nothing to
/// compare). A failed call names the embedder and what to do.
async fn embed_one(
    embedder: &dyn Embedder,
    text: &str,
    usage: &mut Usage,
) -> Result<Option<MemoryEmbedding>, SyscallError> {
    if !text.chars().any(char::is_alphanumeric) {
        return Ok(None);
    }
    let mut vectors = embed(embedder, &[text.to_owned()], usage).await?;
    let vector = vectors.pop().ok_or_else(|| internal("the embedder returned no vector"))?;
    Ok(Some(MemoryEmbedding { model: embedder.model().to_owned(), vector }))
}

/// Embeds texts, adding the provider's token count to `usage`.
async fn embed(
    embedder: &dyn Embedder,
    texts: &[String],
    usage: &mut Usage,
) -> Result<Vec<Vec<f32>>, SyscallError> {
    let embedded = embedder.embed(texts).await.map_err(|err| {
        let mut error = SyscallError::new(
            ErrorKind::ProviderError,
            format!("embedding with model {:?} failed: {err}", embedder.model()),
        );
        if let Some(class) = err.class() {
            error = error.with("class", class.as_str()).with("status", class.http_status());
        }
        error
    })?;
    usage.input_tokens += embedded.input_tokens.unwrap_or(0);
    if embedded.vectors.len() != texts.len() {
        return Err(internal(format!(
            "the embedder returned {} vectors for {} texts",
            embedded.vectors.len(),
            texts.len()
        )));
    }
    Ok(embedded.vectors)
}

/// Performs a checked call for `tenant`. `idempotency_key` makes a thread append or a
/// delete safe to retry (the kernel passes `run_id:seq`). `embedder` embeds a put's text
/// and a semantic or hybrid query.
pub async fn perform(
    store: &dyn Store,
    embedder: &dyn Embedder,
    tenant: &str,
    call: MemCall,
    idempotency_key: Option<&str>,
) -> Result<Performed, SyscallError> {
    let mut usage = Usage::default();
    let counting = Counting { inner: embedder, calls: Default::default() };
    let result = perform_call(store, &counting, tenant, call, idempotency_key, &mut usage).await?;
    Ok(Performed { result, usage, embed_calls: counting.calls.into_inner() })
}

async fn perform_call(
    store: &dyn Store,
    embedder: &dyn Embedder,
    tenant: &str,
    call: MemCall,
    idempotency_key: Option<&str>,
    usage: &mut Usage,
) -> Result<Value, SyscallError> {
    match call {
        MemCall::Embed { input } => {
            let embeddings = embed(embedder, &input, usage).await?;
            let result = LlmEmbedResult {
                model: embedder.model().to_owned(),
                embeddings,
                input_tokens: usage.input_tokens,
            };
            serde_json::to_value(result).map_err(internal)
        }
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
            let embedding = embed_one(embedder, &text, usage).await?;
            store
                .mem_put(tenant, &namespace, &key, value, text, embedding, now_ms())
                .await
                .map_err(internal)?;
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
        MemCall::Search { namespace, query, limit, mode } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let embedding = match mode {
                SearchMode::Text => None,
                SearchMode::Semantic | SearchMode::Hybrid => embed_one(embedder, &query, usage).await?,
            };
            let search = MemorySearch { query, mode, embedding };
            let hits = store.mem_search(tenant, &namespace, &search, limit).await.map_err(internal)?;
            let hits: Vec<MemSearchHit> = hits
                .into_iter()
                .map(|hit| MemSearchHit { key: hit.key, score: hit.score, snippet: hit.snippet })
                .collect();
            Ok(json!({ "hits": hits }))
        }
    }
}

impl Kernel {
    /// [`Kernel::memory`], failing as a syscall does.
    pub(crate) async fn memory_syscall(
        &self,
        tenant: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, SyscallError> {
        if !method.starts_with("mem.") {
            return Err(SyscallError::new(
                ErrorKind::UnknownMethod,
                format!("{method:?} is not a memory method"),
            ));
        }
        let call = check(method, &params)?;
        let embedder = self.embedder();
        let performed = perform(self.store().as_ref(), embedder.as_ref(), tenant, call, None).await?;
        self.inner.metrics.embedded(tenant, embedder.model(), performed.embed_calls, &performed.usage);
        Ok(performed.result)
    }

    /// The embedder of `[llm.embeddings]` (the offline hash embedder by default).
    pub(crate) fn embedder(&self) -> std::sync::Arc<dyn Embedder> {
        self.inner.llm.embedder()
    }

    /// [`Kernel::memory_record`], failing as a syscall does.
    pub(crate) async fn memory_record_syscall(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
    ) -> Result<Option<keel_store::MemoryRecord>, SyscallError> {
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
        let err = check("mem.search", &json!({"namespace": "n", "query": "q", "mode": "fuzzy"})).unwrap_err();
        assert!(err.message.contains("unknown variant `fuzzy`"), "{}", err.message);
    }

    #[test]
    fn search_mode_defaults_to_text() {
        let call = check("mem.search", &json!({"namespace": "n", "query": "q"})).unwrap();
        assert!(matches!(call, MemCall::Search { mode: SearchMode::Text, .. }));
        let call = check("mem.search", &json!({"namespace": "n", "query": "q", "mode": "hybrid"})).unwrap();
        assert!(matches!(call, MemCall::Search { mode: SearchMode::Hybrid, .. }));
    }

    #[tokio::test]
    async fn a_semantic_search_finds_a_paraphrase_the_text_search_misses() {
        let dir = tempfile::tempdir().unwrap();
        let store = keel_store::SqliteStore::open(&dir.path().join("keel.db")).unwrap();
        let embedder = keel_llm::HashEmbedder;
        for (key, text) in [
            ("cat", "The kitten naps on the windowsill every afternoon"),
            ("tax", "Quarterly tax filing is due at the end of the month"),
        ] {
            let call = check("mem.put", &json!({"namespace": "n", "key": key, "value": text})).unwrap();
            perform(&store, &embedder, "t", call, None).await.unwrap();
        }
        let search = |mode: &str| {
            check(
                "mem.search",
                &json!({"namespace": "n", "query": "kittens napping by windows", "mode": mode}),
            )
            .unwrap()
        };
        let text = perform(&store, &embedder, "t", search("text"), None).await.unwrap();
        assert_eq!(text.result["hits"], json!([]), "no word of the query is in either record");
        let semantic = perform(&store, &embedder, "t", search("semantic"), None).await.unwrap();
        assert_eq!(semantic.result["hits"][0]["key"], "cat", "{}", semantic.result);
        assert_eq!(semantic.usage, Usage::default(), "the offline embedder reports no tokens");
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
