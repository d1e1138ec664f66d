//! The Store API: the durable state of the kernel (runs, their journals, content-addressed
//! payload blobs, run events and a key-value space), with one contract every backend
//! meets. `conformance` holds the suite that proves it (with the `conformance` feature);
//! `sqlite` is the embedded backend.
//!
//! Durability contract, for every backend: a write method that returns `Ok` has made its
//! effect durable (it survives a process kill and a power cut the backend can survive).
//! Writes issued concurrently may be committed together (group commit); each caller still
//! sees `Ok` only after its own write is durable.

pub mod chain;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod search;
pub mod sqlite;

use async_trait::async_trait;
use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use serde_json::Value;

pub use sqlite::SqliteStore;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The position of an entry in a run's journal, or of an event in its event log. Starts
/// at 1; 0 means "before the first".
pub type Seq = u64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run {0} does not exist")]
    RunNotFound(RunId),
    #[error("run {0} already exists")]
    RunExists(RunId),
    #[error("journal entry {seq} of run {run} does not exist")]
    EntryNotFound { run: RunId, seq: Seq },
    /// A conditional update found the run in another state than the caller expected;
    /// nothing was written.
    #[error("run {run} is {actual}, not {expected} as the update assumed")]
    StateConflict { run: RunId, expected: RunState, actual: RunState },
    /// Stored data could not be read back (a value that does not parse, a missing blob).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The backend failed at the named step.
    #[error("store backend failed while {step}: {source}")]
    Backend {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store was shut down (or its writer died) before the request was served.
    #[error("the store is closed")]
    Closed,
    /// A mailbox send found the target's mailbox holding `capacity` undelivered messages;
    /// nothing was written (flow control: the sender waits or gives up, nothing is lost).
    #[error("the mailbox of run {run} is full ({capacity} undelivered messages)")]
    MailboxFull { run: RunId, capacity: u64 },
    #[error("tenant {0} already exists")]
    TenantExists(String),
    #[error("tenant {0} does not exist")]
    TenantNotFound(String),
}

/// A run as first written.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub id: RunId,
    pub tenant: String,
    /// What to run, as the kernel describes it (command, env, script...). Opaque here.
    pub spec: Value,
    pub state: RunState,
    pub created_at_ms: u64,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub tenant: String,
    pub spec: Value,
    pub state: RunState,
    /// Set exactly while `state` is `waiting` (and kept while a waiting run is paused).
    pub wait_reason: Option<WaitReason>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    /// How many times the agent process has been launched (1 for a run never recovered).
    pub attempt: u32,
    /// Process id (and process group id) of the current attempt's agent, if one runs.
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    /// What the agent passed to `run.exit`.
    pub output: Option<Value>,
    /// Why the run failed, in words a person can act on.
    pub error: Option<String>,
    /// Sum of the usage of every completed journal entry.
    pub usage: Usage,
    /// How many calls a provider actually served for this run (replays do not count).
    pub provider_calls: u64,
}

/// A partial update of a run. `None` leaves a field as it is; `Some(None)` clears it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPatch {
    pub state: Option<RunState>,
    pub wait_reason: Option<Option<WaitReason>>,
    pub updated_at_ms: Option<u64>,
    pub ended_at_ms: Option<Option<u64>>,
    pub attempt: Option<u32>,
    pub pid: Option<Option<u32>>,
    pub exit_code: Option<Option<i32>>,
    pub output: Option<Option<Value>>,
    pub error: Option<Option<String>>,
}

/// Which runs `list_runs` returns, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only runs in one of these states (all runs when empty).
    pub states: Vec<RunState>,
    /// At most this many (no limit when `None`).
    pub limit: Option<usize>,
    /// Only runs of this tenant (every tenant's when `None`).
    pub tenant: Option<String>,
}

/// A journal entry as first appended: an intent (`Pending`) or, for a syscall that has
/// no external effect, an entry that is complete at once (`Ok`/`Error`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    pub method: String,
    pub params: Value,
    /// Canonical hash of `params` (see `keel_core::replay::params_hash`), the replay key.
    pub params_hash: String,
    pub status: EntryStatus,
    /// For entries complete at once.
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub attempt: u32,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    /// Added to the run's usage with the entry (only for entries complete at once).
    pub usage: Usage,
}

/// The outcome that completes a pending entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// `Ok` or `Error`.
    pub status: EntryStatus,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub finished_at_ms: u64,
    /// Added to the run's usage in the same transaction.
    pub usage: Usage,
    /// Whether a provider served this call (adds one to the run's `provider_calls` in the
    /// same transaction, so the count is exact across crashes).
    pub provider_served: bool,
}

/// A journal entry as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    pub seq: Seq,
    pub method: String,
    pub params: Value,
    pub params_hash: String,
    pub status: EntryStatus,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub attempt: u32,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub usage: Usage,
}

/// One record of a run's event log (agent output lines, lifecycle changes, emitted events).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub ts_ms: u64,
    /// e.g. `stdout`, `stderr`, `state`, `syscall`, `emit`.
    pub kind: String,
    pub data: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub seq: Seq,
    pub ts_ms: u64,
    pub kind: String,
    pub data: Value,
}

/// Sizes, for tests and benchmarks (e.g. proving payloads are stored once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub runs: u64,
    pub journal_entries: u64,
    pub blobs: u64,
    /// Bytes of stored payloads, including whatever links a backend keeps to share parts
    /// of payloads (SQLite: 128 per message-chain node).
    pub blob_bytes: u64,
}

/// A message of a conversation thread as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadMessage {
    /// Position in the thread: 0 for the first message, dense.
    pub index: u64,
    /// The message as appended (for the kernel, `{"role": ..., "content": ...}`).
    pub message: Value,
    pub appended_at_ms: u64,
}

/// A long-term memory record as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRecord {
    pub namespace: String,
    pub key: String,
    pub value: Value,
    /// The text that full-text search indexes.
    pub text: String,
    pub updated_at_ms: u64,
}

/// A record's embedding: the model that made it and its vector.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryEmbedding {
    pub model: String,
    pub vector: Vec<f32>,
}

/// How `mem_search` ranks records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SearchMode {
    /// Full-text (FTS5, BM25) over the records' text.
    #[default]
    Text,
    /// Cosine similarity of the records' embeddings (of the query embedding's model) to
    /// the query embedding. Brute force over the namespace: fine up to ~100k records.
    Semantic,
    /// Reciprocal rank fusion (k = 60) of the text and semantic rankings.
    Hybrid,
}

impl SearchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Text => "text",
            SearchMode::Semantic => "semantic",
            SearchMode::Hybrid => "hybrid",
        }
    }

    pub fn parse(text: &str) -> Option<SearchMode> {
        [SearchMode::Text, SearchMode::Semantic, SearchMode::Hybrid].into_iter().find(|m| m.as_str() == text)
    }
}

/// What `mem_search` looks for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemorySearch {
    /// Plain words, for the text ranking.
    pub query: String,
    pub mode: SearchMode,
    /// The query's embedding, for the semantic ranking: without it, a semantic search
    /// has no hits and a hybrid one is the text ranking.
    pub embedding: Option<MemoryEmbedding>,
}

/// A search hit: the best first.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryHit {
    pub key: String,
    /// Relevance; higher is better. Only comparable within one search.
    pub score: f64,
    /// A short excerpt of the record's text around the matched terms (matches in `[...]`).
    pub snippet: String,
}

/// A message as sent to a run's mailbox.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// The sender's tenant: the target run must belong to it (else `RunNotFound`, so a
    /// tenant cannot learn that another tenant's run exists).
    pub tenant: String,
    /// The sending run; `None` for an operator (HTTP, `keel send`).
    pub from: Option<RunId>,
    pub message: Value,
    pub correlation_id: Option<String>,
    /// The topic a published message was published on (`None` for a direct send).
    pub topic: Option<String>,
    /// The most undelivered messages the mailbox may hold, this one included.
    pub capacity: u64,
    /// With a key, sending again with the same key to the same run writes nothing and
    /// returns the seq of the first send (even if the mailbox has since filled up).
    pub idempotency_key: Option<String>,
    pub sent_at_ms: u64,
}

/// A message of a run's mailbox as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MailboxMessage {
    /// Position in the mailbox: 1 for the first message sent to the run, dense.
    pub seq: Seq,
    pub from: Option<RunId>,
    pub message: Value,
    pub correlation_id: Option<String>,
    pub topic: Option<String>,
    pub sent_at_ms: u64,
}

/// One audited decision or action, as the kernel records it. Plain data: the hash chain
/// covers `canonical_json()` of it, so every field is tamper-evident.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub tenant: String,
    /// The run it concerns; `None` for a kernel-wide record.
    pub run_id: Option<RunId>,
    pub at_ms: u64,
    /// Who acted: `agent`, `operator` or `kernel`.
    pub actor: String,
    /// What happened, e.g. `tool.call`, `tool.denied`, `approval.requested`,
    /// `approval.granted`, `approval.denied`, `code.exec`, `egress`.
    pub action: String,
    /// What it was done to: a tool name, a host.
    pub subject: String,
    /// `allowed`, `denied`, `ok`, `error` or `pending`.
    pub outcome: String,
    pub detail: Value,
}

impl AuditRecord {
    /// The record as a JSON object with fixed field names (`run_id` null when absent).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "tenant": self.tenant,
            "run_id": self.run_id.as_ref().map(RunId::as_str),
            "at_ms": self.at_ms,
            "actor": self.actor,
            "action": self.action,
            "subject": self.subject,
            "outcome": self.outcome,
            "detail": self.detail,
        })
    }

    /// What an entry's hash covers: `keel_core::replay::canonical_json` of `to_json()`.
    pub fn canonical_json(&self) -> String {
        keel_core::replay::canonical_json(&self.to_json())
    }
}

/// An audit record in the log: its position and its link in the hash chain
/// (`hash = keel_core::audit::entry_hash(prev_hash, seq, record.canonical_json())`).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Position in the log: 1 for the first entry, dense, over all tenants.
    pub seq: Seq,
    pub record: AuditRecord,
    /// The hash of entry `seq - 1` (`keel_core::audit::GENESIS` for the first).
    pub prev_hash: String,
    pub hash: String,
}

/// Which audit entries `audit_list` returns, in seq order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditFilter {
    /// Only this tenant's entries (every tenant's when `None`).
    pub tenant: Option<String>,
    /// Only this run's entries.
    pub run_id: Option<RunId>,
    /// Only entries with a greater seq (0: from the first).
    pub after_seq: Seq,
    /// At most this many (no limit when `None`).
    pub limit: Option<u32>,
}

/// What `audit_verify` found.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditVerify {
    /// How many entries were checked (up to the break, when there is one).
    pub entries: u64,
    /// The hash of the last entry checked (`GENESIS` for an empty log). Operators who
    /// keep it elsewhere can later prove that the log was not rewritten from the start.
    pub head_hash: String,
    /// The first place the chain does not hold; `None` when the log is intact.
    pub broken: Option<AuditBreak>,
}

/// Where and why an audit chain is broken.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditBreak {
    /// The first entry that does not verify (for removed trailing entries: the seq the
    /// first missing one had).
    pub seq: Seq,
    /// What does not hold, in words.
    pub reason: String,
}

/// A tenant as stored. `quota` is the kernel's JSON (opaque here).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRecord {
    pub name: String,
    pub created_at_ms: u64,
    pub quota: Value,
}

/// An API token as stored: never the token itself, only its hash and a short public
/// prefix that names it (for listing and revoking).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiTokenRecord {
    /// Hex sha256 of the whole token; the lookup key.
    pub hash: String,
    /// The token's first characters, which carry no secret (e.g. `kt_3f9a1c0d`).
    pub prefix: String,
    pub tenant: String,
    pub created_at_ms: u64,
    pub label: Option<String>,
    pub revoked: bool,
}

/// The kernel's durable state. All methods are safe to call concurrently.
///
/// Payloads (`params`, `result`, `error`, `spec`, event `data`, kv values) are JSON;
/// journal payloads are stored content-addressed, so the same payload written many times
/// occupies space once, and so is each message of a `messages` array in params: a
/// conversation re-sent whole on every LLM call stores each message once.
///
/// Every method that names a run, other than `get_run`, fails with `RunNotFound` when the
/// run does not exist (reads included), and a write that fails writes nothing.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Writes a new run. Fails with `RunExists` if the id is taken. Durable on return.
    /// The run starts with `attempt` 1, `updated_at_ms` equal to `created_at_ms`, no wait
    /// reason, pid, exit code, output or error, and zero usage.
    async fn create_run(&self, run: NewRun) -> Result<RunRecord>;

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>>;

    /// Runs matching `filter`, newest (by creation) first.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>>;

    /// Applies `patch` to the run. When `expected` is given, the update happens only if
    /// the run is currently in that state, else `StateConflict` and nothing changes.
    /// Returns the run as updated. Durable on return.
    async fn update_run(&self, id: &RunId, expected: Option<RunState>, patch: RunPatch) -> Result<RunRecord>;

    /// Appends an entry to the run's journal and returns its seq (previous last + 1).
    /// The usage of an entry appended complete is added to the run's totals in the same
    /// transaction. Durable on return: the caller may perform the effect afterwards.
    async fn append_entry(&self, run: &RunId, entry: NewEntry) -> Result<Seq>;

    /// Records the outcome of a pending entry (and its usage, in the same transaction).
    /// Completing an entry that is not pending is an error (`Corrupt`), as is a completion
    /// whose status is not `Ok` or `Error`; an unknown seq is `EntryNotFound`. Durable on
    /// return.
    async fn complete_entry(&self, run: &RunId, seq: Seq, completion: Completion) -> Result<()>;

    /// Marks entries `abandoned` (a replay tail the restarted agent never asked for).
    /// All or nothing: an unknown seq fails with `EntryNotFound` and marks none. Usage
    /// totals keep what the entries added. Durable on return.
    async fn abandon_entries(&self, run: &RunId, seqs: &[Seq]) -> Result<()>;

    /// Entries with seq greater than `after`, in seq order.
    async fn journal(&self, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>>;

    /// The newest entry of `method` in the run's journal whose status is `Ok`.
    async fn latest_entry(&self, run: &RunId, method: &str) -> Result<Option<JournalEntry>>;

    /// Appends events to the run's log in order; returns the seq of the last one (with
    /// no events, the current last seq: 0 for an empty log). Durable on return.
    async fn append_events(&self, run: &RunId, events: Vec<NewEvent>) -> Result<Seq>;

    /// Up to `limit` events with seq greater than `after`, in order.
    async fn events(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>>;

    async fn kv_get(&self, scope: &str, key: &str) -> Result<Option<Value>>;

    /// Durable on return.
    async fn kv_put(&self, scope: &str, key: &str, value: Value) -> Result<()>;

    /// Appends a message to a tenant's thread (created on first append) and returns its
    /// index (0 for the first). The message is stored as a content-addressed blob, like a
    /// journal payload. With an `idempotency_key`, appending again with the same key to the
    /// same thread writes nothing and returns the index of the first append (a retry after
    /// a crash does not duplicate). Durable on return.
    async fn thread_append(
        &self,
        tenant: &str,
        thread: &str,
        message: Value,
        idempotency_key: Option<&str>,
        appended_at_ms: u64,
    ) -> Result<u64>;

    /// The last `last` messages of a thread (all when `None`), oldest first. An unknown
    /// thread reads as empty.
    async fn thread_read(
        &self,
        tenant: &str,
        thread: &str,
        last: Option<usize>,
    ) -> Result<Vec<ThreadMessage>>;

    /// Writes (or overwrites) a record; `text` is what full-text search indexes and
    /// `embedding` what semantic search compares (an overwrite without one removes the
    /// old one). Record and embedding are written in one transaction. Durable on return.
    #[allow(clippy::too_many_arguments, reason = "the fields of one record")]
    async fn mem_put(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
        value: Value,
        text: String,
        embedding: Option<MemoryEmbedding>,
        updated_at_ms: u64,
    ) -> Result<()>;

    async fn mem_get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryRecord>>;

    /// Deletes a record; whether there was one. With an `idempotency_key`, deleting again
    /// with the same key answers what the first delete answered (a retry after a crash
    /// says `true` if the first attempt deleted the record). Durable on return.
    async fn mem_delete(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
        idempotency_key: Option<&str>,
    ) -> Result<bool>;

    /// Searches a namespace's records: up to `limit` hits, most relevant first, ties by
    /// key. Text mode: `query` is plain words (any punctuation is ignored, never a syntax
    /// error); a record matches when it contains any of them; a query without words has
    /// no hits. Semantic mode: every record with an embedding of the same model and
    /// length as `search.embedding`, by cosine similarity (the score). Hybrid: the
    /// reciprocal rank fusion of both rankings (score = sum of 1 / (60 + rank)).
    async fn mem_search(
        &self,
        tenant: &str,
        namespace: &str,
        search: &MemorySearch,
        limit: usize,
    ) -> Result<Vec<MemoryHit>>;

    /// Puts a message in run `to`'s mailbox and returns its seq (previous last + 1).
    /// Fails with `RunNotFound` when the run does not exist or belongs to another tenant
    /// than `message.tenant`, and with `MailboxFull` (writing nothing) when the mailbox
    /// already holds `message.capacity` undelivered messages. Durable on return.
    async fn mailbox_send(&self, to: &RunId, message: NewMessage) -> Result<Seq>;

    /// Takes the oldest undelivered message of the run's mailbox, marking it delivered
    /// (it is never taken again); `None` when there is none. With an `idempotency_key`,
    /// receiving again with the same key returns the message the first receive took (a
    /// retry after a crash neither loses nor duplicates it), or takes one if the first
    /// found none. Durable on return.
    async fn mailbox_receive(
        &self,
        run: &RunId,
        idempotency_key: Option<&str>,
    ) -> Result<Option<MailboxMessage>>;

    /// How many undelivered messages the run's mailbox holds.
    async fn mailbox_len(&self, run: &RunId) -> Result<u64>;

    /// Subscribes run `run` of `tenant` to the tenant's topic `topic` (or, with
    /// `subscribe` false, unsubscribes it); doing it twice is doing it once. Fails with
    /// `RunNotFound` when the run does not exist or belongs to another tenant. Durable on
    /// return.
    async fn topic_subscribe(&self, tenant: &str, topic: &str, run: &RunId, subscribe: bool) -> Result<()>;

    /// Puts `message` (whose `topic` is set to `topic`) in the mailbox of every subscriber
    /// of the tenant's topic that has not ended, all or nothing: when one mailbox is full
    /// the publish fails with `MailboxFull` naming it and writes nothing. Returns each
    /// recipient with the message's seq in its mailbox, by run id. With an idempotency
    /// key, a mailbox that already got the key's message is not written again (a retried
    /// publish delivers only what the first did not). Durable on return.
    async fn topic_publish(&self, topic: &str, message: NewMessage) -> Result<Vec<(RunId, Seq)>>;

    /// Appends records to the audit log, in order, in one transaction, and returns their
    /// seqs. The chain continues from the current head: entries are linear even when
    /// appends race (a backend serializes them). The head (last seq and hash) is updated
    /// in the same transaction. Durable on return.
    async fn audit_append(&self, records: Vec<AuditRecord>) -> Result<Vec<Seq>>;

    /// Audit entries matching `filter`, in seq order.
    async fn audit_list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>>;

    /// Recomputes every hash of the audit log in seq order (streaming, not loading the
    /// log at once) and compares the end with the stored head. Detects a modified record
    /// or hash, a removed, inserted or reordered entry, and removed trailing entries.
    /// Out of scope: someone who can rewrite the whole store consistently (entries and
    /// head) is caught only by comparing `head_hash` with a copy kept elsewhere.
    /// A broken chain is a result (`broken`), not an error.
    async fn audit_verify(&self) -> Result<AuditVerify>;

    /// Creates a tenant. Fails with `TenantExists` when the name is taken. Durable on return.
    async fn tenant_create(&self, tenant: TenantRecord) -> Result<()>;

    async fn tenant_get(&self, name: &str) -> Result<Option<TenantRecord>>;

    /// Every tenant, by name.
    async fn tenant_list(&self) -> Result<Vec<TenantRecord>>;

    /// Stores a token (its hash) for an existing tenant; `TenantNotFound` otherwise. A
    /// hash already stored is a `Backend` error (tokens are random). Durable on return.
    async fn token_create(&self, token: ApiTokenRecord) -> Result<()>;

    /// The token with this hash, revoked or not.
    async fn token_lookup(&self, hash: &str) -> Result<Option<ApiTokenRecord>>;

    /// A tenant's tokens, oldest first.
    async fn token_list(&self, tenant: &str) -> Result<Vec<ApiTokenRecord>>;

    /// Marks the tenant's tokens whose prefix is `prefix` revoked; how many were not
    /// revoked before (0 when none matched). A revoked token stays revoked. Durable on
    /// return.
    async fn token_revoke(&self, tenant: &str, prefix: &str) -> Result<u64>;

    async fn stats(&self) -> Result<StoreStats>;
}
