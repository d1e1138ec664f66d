//! The records the Store API reads and writes: plain data, no IO. Re-exported at the
//! crate root; every backend stores and returns exactly these.

use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use serde_json::Value;

use crate::Seq;

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

impl NewRun {
    /// The run as `create_run` first stores it: `attempt` 1, `updated_at_ms` equal to
    /// `created_at_ms`, no wait reason, pid, exit code, output or error, zero usage.
    pub fn into_record(self) -> RunRecord {
        RunRecord {
            id: self.id,
            tenant: self.tenant,
            spec: SpecJson::from(&self.spec),
            state: self.state,
            wait_reason: None,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.created_at_ms,
            ended_at_ms: None,
            attempt: 1,
            pid: None,
            exit_code: None,
            output: None,
            error: None,
            usage: Usage::default(),
            provider_calls: 0,
        }
    }
}

/// A run's spec as the JSON text it is stored as (always valid JSON: checked when made).
/// Whoever reads it decodes it into its own type straight from the text (the kernel's
/// `RunSpec`): a listing of many runs copies text instead of building a `Value` tree per
/// run, which was most of a listing's CPU.
#[derive(Clone, PartialEq, Eq)]
pub struct SpecJson(String);

impl SpecJson {
    /// `text` if it is JSON; the parser's error otherwise.
    pub fn parse(text: String) -> Result<SpecJson, serde_json::Error> {
        // Checked without building anything.
        serde_json::from_str::<serde::de::IgnoredAny>(&text)?;
        Ok(SpecJson(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The spec as a `Value` (for what reads a field or two, and tests).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).expect("a SpecJson is valid JSON")
    }
}

impl From<&Value> for SpecJson {
    fn from(value: &Value) -> SpecJson {
        SpecJson(value.to_string())
    }
}

impl std::fmt::Debug for SpecJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The JSON text.
impl std::fmt::Display for SpecJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub tenant: String,
    pub spec: SpecJson,
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

impl RunPatch {
    /// Applies the patch to a run: `None` keeps a field, `Some(value)` sets it
    /// (`Some(None)` clears an optional one).
    pub fn apply_to(self, run: &mut RunRecord) {
        let RunPatch {
            state,
            wait_reason,
            updated_at_ms,
            ended_at_ms,
            attempt,
            pid,
            exit_code,
            output,
            error,
        } = self;
        /// A field the patch names takes the patch's value.
        fn set<T>(field: &mut T, value: Option<T>) {
            if let Some(value) = value {
                *field = value;
            }
        }
        set(&mut run.state, state);
        set(&mut run.wait_reason, wait_reason);
        set(&mut run.updated_at_ms, updated_at_ms);
        set(&mut run.ended_at_ms, ended_at_ms);
        set(&mut run.attempt, attempt);
        set(&mut run.pid, pid);
        set(&mut run.exit_code, exit_code);
        set(&mut run.output, output);
        set(&mut run.error, error);
    }
}

/// Which runs `list_runs` returns, and in which order (newest first by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only runs in one of these states (all runs when empty).
    pub states: Vec<RunState>,
    /// At most this many (no limit when `None`).
    pub limit: Option<usize>,
    /// Only runs of this tenant (every tenant's when `None`).
    pub tenant: Option<String>,
    /// Only runs whose id, tenant or command (the `command` member of the spec, the one
    /// member of the opaque spec a store reads) contains this text, ASCII letters matched
    /// without regard to case. Matched as typed: `%` and `_` are not wildcards.
    pub text: Option<String>,
    /// The order of the listing; ties are broken by id, in the same direction.
    pub order: RunOrder,
    /// Skip this many matching runs first (a page further down the same order).
    pub offset: usize,
}

/// The order `list_runs` returns runs in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunOrder {
    /// By creation time, newest first.
    #[default]
    NewestFirst,
    /// By creation time, oldest first.
    OldestFirst,
    /// By cost (`usage.cost_micro_usd`), costliest first; equal costs newest first.
    CostliestFirst,
    /// By cost, cheapest first; equal costs oldest first.
    CheapestFirst,
}

impl RunOrder {
    /// The SQL `ORDER BY` list for this order (the same text serves SQLite and Postgres;
    /// `runs_by_creation` serves the orders by age, and the cost indexes those by cost: of
    /// ended runs only, merged with the live runs).
    pub(crate) fn order_by(self) -> &'static str {
        match self {
            RunOrder::NewestFirst => "created_at_ms DESC, id DESC",
            RunOrder::OldestFirst => "created_at_ms ASC, id ASC",
            RunOrder::CostliestFirst => "cost_micro_usd DESC, created_at_ms DESC, id DESC",
            RunOrder::CheapestFirst => "cost_micro_usd ASC, created_at_ms ASC, id ASC",
        }
    }
}

/// What `cost_summary` sums: the usage of completed `llm.chat` journal entries started at
/// or after `since_ms`, in buckets of `bucket_ms` (bucket `k` holds entries started in
/// `[k * bucket_ms, (k + 1) * bucket_ms)`, Unix milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct CostFilter {
    pub since_ms: u64,
    /// At least 1.
    pub bucket_ms: u64,
    /// Only this tenant's runs (every tenant's when `None`).
    pub tenant: Option<String>,
}

/// One bucket of `cost_summary`: the sums for one (time bucket, tenant, model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostBucket {
    /// The bucket's start, Unix milliseconds (a multiple of the filter's `bucket_ms`).
    pub bucket_start_ms: u64,
    pub tenant: String,
    /// The model that answered (the result's `response.model`, as the kernel journals an
    /// `llm.chat`, or its top-level `model`), else the one asked for (params), else
    /// `unknown`.
    pub model: String,
    /// How many entries were summed (replayed calls are one entry, never two).
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micro_usd: u64,
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
    /// Payloads stored apart, once each (SQLite keeps small ones in the row that names
    /// them instead; those are not counted here).
    pub blobs: u64,
    /// Bytes of stored payloads, inline ones included, and whatever links a backend keeps
    /// to share parts of payloads (SQLite: 128 per message-chain node).
    pub blob_bytes: u64,
}

/// How many runs share one tenant, state, wait reason and whether they have a process
/// (`Store::count_runs`): what a metrics scrape shows without reading every run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCount {
    pub tenant: String,
    pub state: RunState,
    /// Set only for `waiting` runs (why they wait).
    pub wait_reason: Option<WaitReason>,
    /// Whether the run has a recorded process (a `waiting` run without one is swapped out).
    pub has_pid: bool,
    pub count: u64,
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
    /// Full-text over the records' text (SQLite: FTS5 and BM25; Postgres: a `simple`
    /// tsvector and `ts_rank_cd`).
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

/// A mailbox write made in the same transaction as the journal entry that records it
/// (`Store::journal_mailbox`): the write and its entry are durable together or not at all,
/// so neither needs an intent of its own.
#[derive(Debug, Clone)]
pub enum MailboxOp {
    /// Puts `message` in run `to`'s mailbox, checked as `Store::mailbox_send` checks it.
    ///
    /// With `receive`, run `to`'s agent is waiting in a receive: in the same transaction
    /// `to` takes its oldest undelivered message (the one sent, when its mailbox was empty)
    /// and the receive's entry is appended to `to`'s journal, complete, to record it (its
    /// result made by the receive's own `result_of` from `MailboxDone::Received`). Both
    /// runs' steps in one commit (`MailboxDone::SentAndTaken`). A backend may make the send
    /// alone (`MailboxDone::Sent`): the receiver then takes the message itself.
    Send { to: RunId, message: NewMessage, receive: Option<Box<WaitingReceive>> },
    /// Takes the oldest undelivered messages of the journaling run's own mailbox: up to
    /// `max` of them (at least one), and past the first only while their bodies come to
    /// at most [`RECEIVE_BATCH_BYTES`] in all (see `mailbox::batch_len`).
    Receive { max: usize },
}

/// The most bytes of message bodies (as JSON text) one receive of many messages takes
/// past its first message: a batch stays within one request line's worth.
pub const RECEIVE_BATCH_BYTES: usize = 1024 * 1024;

/// A receive waiting on an empty mailbox that a send completes in its own commit
/// (`MailboxOp::Send`'s `receive`): its journal entry, complete but for its result, and
/// how its result is made from what it took (a receive of one message and one of many
/// answer in different shapes).
#[derive(Debug, Clone)]
pub struct WaitingReceive {
    pub entry: NewEntry,
    pub result_of: MailboxResult,
}

/// Makes the result a journaled mailbox write records from what it came to (the
/// caller's wire shape, which the store does not know).
pub type MailboxResult = for<'a> fn(&'a MailboxDone) -> serde_json::Value;

/// What a journaled mailbox write came to.
#[derive(Debug, Clone, PartialEq)]
pub enum MailboxDone {
    /// The message's seq in the receiving run's mailbox.
    Sent(Seq),
    /// A `Send` with a `receive` made whole: the message's seq in the receiving run's mailbox,
    /// and the receive completed with it: its entry's seq in the receiver's journal and
    /// the message it took.
    SentAndTaken { seq: Seq, receive_seq: Seq, message: MailboxMessage },
    /// The messages taken, oldest first: one at least.
    Received(Vec<MailboxMessage>),
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

#[cfg(test)]
mod tests {
    use keel_types::{RunId, RunState, Usage, WaitReason};
    use serde_json::json;

    use super::*;

    fn sample_run() -> RunRecord {
        RunRecord {
            id: RunId::parse("run_00000000000000000000000001").unwrap(),
            tenant: "t".to_owned(),
            spec: SpecJson::from(&json!({"cmd": "x"})),
            state: RunState::Waiting,
            wait_reason: Some(WaitReason::Human),
            created_at_ms: 1,
            updated_at_ms: 2,
            ended_at_ms: Some(3),
            attempt: 1,
            pid: Some(42),
            exit_code: Some(0),
            output: Some(json!("done")),
            error: Some("boom".to_owned()),
            usage: Usage::default(),
            provider_calls: 0,
        }
    }

    #[test]
    fn a_spec_keeps_its_text_and_must_be_json() {
        // Kept as written: the key order and the numbers' spelling are the writer's.
        let text = r#"{"z":1,"a":[1.50,"x"],"version":1}"#;
        let spec = SpecJson::parse(text.to_owned()).unwrap();
        assert_eq!(spec.as_str(), text);
        assert_eq!(spec.to_string(), text);
        assert_eq!(spec.to_value(), json!({"z": 1, "a": [1.5, "x"], "version": 1}));
        for bad in ["{not json", "", r#"{"a":1} trailing"#, r#"{"a":}"#] {
            assert!(SpecJson::parse(bad.to_owned()).is_err(), "{bad:?} was taken as JSON");
        }
        let value = json!({"command": ["sleep", "1"]});
        assert_eq!(SpecJson::from(&value).to_value(), value);
    }

    #[test]
    fn empty_patch_changes_nothing() {
        let mut run = sample_run();
        RunPatch::default().apply_to(&mut run);
        assert_eq!(run, sample_run());
    }

    #[test]
    fn patch_sets_and_clears_each_field() {
        let mut run = sample_run();
        RunPatch {
            state: Some(RunState::Running),
            wait_reason: Some(None),
            updated_at_ms: Some(9),
            ended_at_ms: Some(None),
            attempt: Some(2),
            pid: Some(None),
            exit_code: Some(None),
            output: Some(None),
            error: Some(None),
        }
        .apply_to(&mut run);
        let expected = RunRecord {
            state: RunState::Running,
            wait_reason: None,
            updated_at_ms: 9,
            ended_at_ms: None,
            attempt: 2,
            pid: None,
            exit_code: None,
            output: None,
            error: None,
            ..sample_run()
        };
        assert_eq!(run, expected);
    }
}
