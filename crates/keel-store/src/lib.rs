//! The Store API: the durable state of the kernel (runs, their journals, content-addressed
//! payload blobs, run events and a key-value space), with one contract every backend
//! meets.
//!
//! Here: the `Store` trait and its `Error`. Beside it, `records` (the plain data the
//! trait reads and writes, re-exported here), and the pure parts every backend shares:
//! `chain` (content-addressed payloads and the message chain), `search` (fusion,
//! cosine similarity, embedding encoding), `audit` (verifying the audit chain) and
//! `mailbox` (who may reach a run, room, delivery markers), `dump` (a backend-neutral copy
//! of a whole store, for `keel migrate`) and `cluster` (the `Cluster` trait of nodes
//! sharing a store). `conformance` holds the suite that proves a
//! backend (with the `conformance` feature); `sqlite` is the embedded backend, `postgres`
//! the server one (several kernels sharing a database).
//!
//! Durability contract, for every backend: a write method that returns `Ok` has made its
//! effect durable (it survives a process kill and a power cut the backend can survive).
//! Writes issued concurrently may be committed together (group commit); each caller still
//! sees `Ok` only after its own write is durable.

pub mod audit;
pub mod chain;
pub mod cluster;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod dump;
pub mod mailbox;
pub mod postgres;
mod records;
pub mod search;
pub mod sqlite;
mod triggers;

use async_trait::async_trait;
use keel_types::{RunId, RunState};
use serde_json::Value;

pub use dump::DumpItem;

pub use postgres::{PgNode, PgStore};
pub use records::{
    ApiTokenRecord, AuditBreak, AuditEntry, AuditFilter, AuditRecord, AuditVerify, Completion, CostBucket,
    CostFilter, EventRecord, JournalEntry, MailboxDone, MailboxMessage, MailboxOp, MailboxResult,
    MemoryEmbedding, MemoryHit, MemoryRecord, MemorySearch, NewEntry, NewEvent, NewMessage, NewRun,
    RECEIVE_BATCH_BYTES, RunCount, RunFilter, RunOrder, RunPatch, RunRecord, SearchMode, SpecJson,
    StoreStats, TenantRecord, ThreadMessage, WaitingReceive,
};
pub use sqlite::SqliteStore;
pub use triggers::{FireRecord, TriggerRecord};

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
    /// The backend could not be reached (a database restarting, a network cut) at the
    /// named step; nothing was written, and the same call may succeed later.
    #[error("the store is unreachable while {step}: {source}")]
    Unavailable {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The connection was lost while the write committed (a database restarting under
    /// it): it may or may not have taken effect. Not `Unavailable`, whose retry is always
    /// safe: the caller must find out (read back) before writing again.
    #[error(
        "the store connection was lost while {step}, so whether the write took effect is unknown: {source}"
    )]
    OutcomeUnknown {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A write for a run whose lease this node no longer holds: another node took the run
    /// (its epoch is past `epoch`, the one this node held). Nothing was written; the caller
    /// must stop acting for the run at once.
    #[error(
        "run {run} is no longer leased to this node (it held epoch {epoch}, another node took it over); nothing was written"
    )]
    Fenced { run: RunId, epoch: u64 },
    /// The store refused the request for the reason given (a node id in use, a clock too
    /// far off the database's); nothing was written.
    #[error("{0}")]
    Refused(String),
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
    #[error("a {kind} named {name} already exists")]
    TriggerExists { kind: String, name: String },
}

/// Errors every backend words alike, so callers and tests see one message whatever the
/// backend.
impl Error {
    /// A database whose schema a newer build wrote: refused, naming both versions.
    pub(crate) fn schema_too_new(found: usize, known: usize) -> Error {
        Error::Backend {
            step: "checking the schema version",
            source: format!(
                "the database has schema version {found}, newer than the {known} \
                 this build of keel knows; run a newer keel against it"
            )
            .into(),
        }
    }

    /// A completion whose status is not `Ok` or `Error`.
    pub(crate) fn completion_not_final(run: &RunId, seq: Seq, status: keel_types::EntryStatus) -> Error {
        Error::Corrupt(format!(
            "journal entry {seq} of run {run} cannot be completed as {status}: a completion is ok or error"
        ))
    }

    /// A completion of an entry that is no longer pending.
    pub(crate) fn entry_not_pending(run: &RunId, seq: Seq, status: &str) -> Error {
        Error::Corrupt(format!(
            "journal entry {seq} of run {run} is not pending (its status is {status}), \
             so it cannot be completed"
        ))
    }
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
///
/// A read sees every write that returned before the read began. A write whose caller
/// stops waiting (its future dropped) may still take effect, wholly or not at all, never
/// in part: a caller that must know retries it, safely where the method takes an
/// idempotency key or a compare-and-set expectation.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Writes a new run. Fails with `RunExists` if the id is taken. Durable on return.
    /// The run starts with `attempt` 1, `updated_at_ms` equal to `created_at_ms`, no wait
    /// reason, pid, exit code, output or error, and zero usage.
    async fn create_run(&self, run: NewRun) -> Result<RunRecord>;

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>>;

    /// Runs of `tenant` that ended after a point of (`ended_at_ms`, id) order: those that
    /// ended after `after_ms`, or at `after_ms` with an id greater than `after_id` (when
    /// given), oldest end first (ties by id), at most `limit`. A page ends at the last
    /// run's (`ended_at_ms`, id), which the next page starts after. Served by an index, so
    /// it costs what the runs read cost, not the tenant's whole history.
    async fn runs_ended_after(
        &self,
        tenant: &str,
        after_ms: u64,
        after_id: Option<&RunId>,
        limit: usize,
    ) -> Result<Vec<RunRecord>>;

    /// Runs matching `filter`, in its order (newest first by default), from its offset.
    /// Filtering, ordering and paging happen in the store's query, so a page of a large
    /// store costs what its rows cost.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>>;

    /// The usage of completed `llm.chat` entries summed per (time bucket, tenant, model),
    /// ordered by bucket, tenant and model. Aggregated in the store's query.
    async fn cost_summary(&self, filter: &CostFilter) -> Result<Vec<CostBucket>>;

    /// How many runs there are of each tenant, state, wait reason and presence of a
    /// process, in one grouped read (no run is loaded): every combination that has at
    /// least one run, in no particular order. For metrics scrapes, so it must stay cheap
    /// with many runs.
    async fn count_runs(&self) -> Result<Vec<RunCount>>;

    /// Applies `patch` to the run. When `expected` is given, the update happens only if
    /// the run is currently in that state, else `StateConflict` and nothing changes.
    /// Returns the run as updated. Durable on return.
    async fn update_run(&self, id: &RunId, expected: Option<RunState>, patch: RunPatch) -> Result<RunRecord>;

    /// Appends an entry to the run's journal and returns its seq (previous last + 1).
    /// The usage of an entry appended complete is added to the run's totals in the same
    /// transaction. Durable on return: the caller may perform the effect afterwards.
    /// Borrowed, like every payload of a journal write: a backend encodes it to bytes
    /// before anything else, and a caller that must write it again after an outage
    /// keeps it without a copy (params may hold a whole conversation).
    async fn append_entry(&self, run: &RunId, entry: &NewEntry) -> Result<Seq>;

    /// Records the outcome of a pending entry (and its usage, in the same transaction).
    /// Completing an entry that is not pending is an error (`Corrupt`), as is a completion
    /// whose status is not `Ok` or `Error`; an unknown seq is `EntryNotFound`. Durable on
    /// return. (`complete_entry_with` and nothing to append: a backend has one way to
    /// complete an entry.)
    async fn complete_entry(&self, run: &RunId, seq: Seq, completion: &Completion) -> Result<()> {
        self.complete_entry_with(run, seq, completion, &[]).await.map(drop)
    }

    /// Completes the pending entry `seq` as `complete_entry` does and appends `entries`
    /// after it as `append_entry` does, all in one transaction: durable on return, all or
    /// nothing. Returns the appended entries' seqs, in order. For a call whose reads are
    /// journaled with its result (the tool calls of a `code.exec` that have no effect of
    /// their own): one commit instead of one per entry.
    async fn complete_entry_with(
        &self,
        run: &RunId,
        seq: Seq,
        completion: &Completion,
        entries: &[NewEntry],
    ) -> Result<Vec<Seq>>;

    /// Marks entries `abandoned` (a replay tail the restarted agent never asked for).
    /// All or nothing: an unknown seq fails with `EntryNotFound` and marks none. Usage
    /// totals keep what the entries added. Durable on return.
    async fn abandon_entries(&self, run: &RunId, seqs: &[Seq]) -> Result<()>;

    /// Entries with seq greater than `after`, in seq order.
    async fn journal(&self, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>>;

    /// The newest entry of `method` in the run's journal whose status is `Ok`.
    async fn latest_entry(&self, run: &RunId, method: &str) -> Result<Option<JournalEntry>>;

    /// Appends events to the run's log in order; returns the seq of the last one (with
    /// no events, the current last seq: 0 for an empty log). A run's seqs are dense from
    /// 1, so the events take the seqs that end at the one returned (the kernel hands them
    /// to the run's followers with those seqs, unread). Committed on return, and
    /// kept if the process is killed, but not flushed on their own: events are a record
    /// of what the journal and the run already hold durably, so a store may let the next
    /// durable write (which makes everything committed before it durable too) or its next
    /// checkpoint flush them. A power cut before then can lose the newest events only.
    async fn append_events(&self, run: &RunId, events: &[NewEvent]) -> Result<Seq>;

    /// Up to `limit` events with seq greater than `after`, in order.
    async fn events(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>>;

    async fn kv_get(&self, scope: &str, key: &str) -> Result<Option<Value>>;

    /// The values of several `(scope, key)` pairs in one read, one answer per pair in
    /// the order asked (`None` for a missing key). A listing of runs, or a launch that
    /// needs two of a run's values, reads them this way rather than a read apiece.
    async fn kv_get_many(&self, keys: &[(String, String)]) -> Result<Vec<Option<Value>>>;

    /// The values of a chain in `scope`: the value of `key`, then of the key its `link` (a
    /// path of object keys ending at a string) names, and so on, in that order, at most
    /// `limit` of them. The chain ends at a value without a link, or before a key that is
    /// missing: the caller tells the two apart by the last value's link. No value at
    /// `key`, none. One read, where a walk of `kv_get`s is a read (on SQLite, a hop to a
    /// blocking thread and back) per value: a Responses API conversation continued with
    /// `previous_response_id` is such a chain, one value per turn.
    async fn kv_chain(&self, scope: &str, key: &str, link: &[&str], limit: usize) -> Result<Vec<Value>>;

    /// Durable on return.
    async fn kv_put(&self, scope: &str, key: &str, value: Value) -> Result<()>;

    /// [`Store::kv_put`] for a value the kernel writes again whenever it is lost: committed
    /// (and seen by every reader) on return, kept if the process is killed, but not
    /// flushed on its own, like [`Store::append_events`]. The next durable write, which
    /// makes everything committed before it durable too, or the store's next checkpoint
    /// flushes it; a power cut before then can lose it. A Responses API response the
    /// gateway keeps is one: the journal holds the call durably, and its replay keeps
    /// the response again.
    async fn kv_put_unflushed(&self, scope: &str, key: &str, value: Value) -> Result<()>;

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

    /// Performs `op` and appends `entry` to `run`'s journal recording it, in one
    /// transaction: the mailbox write and its journal entry are durable together or not at
    /// all. The entry is appended complete, its `result` replaced by `result_of` what the op
    /// came to (the caller's wire shape; the store does not know it), and its usage added to
    /// the run's totals as `append_entry` adds it. Returns the entry's seq and the outcome.
    ///
    /// A send fails as `mailbox_send` fails (`RunNotFound`, `MailboxFull`) and writes
    /// nothing, journal included. A receive from an empty mailbox writes nothing and
    /// returns `None`. The message a receive takes is never taken again. Durable on return.
    async fn journal_mailbox(
        &self,
        run: &RunId,
        entry: NewEntry,
        op: MailboxOp,
        result_of: MailboxResult,
    ) -> Result<Option<(Seq, MailboxDone)>>;

    /// Whether `journal_mailbox` completes a `MailboxOp::Send`'s `receive` in the
    /// send's transaction, rather than make the send alone: the kernel offers receives
    /// waiting on an empty mailbox to senders only then.
    fn completes_waiting_receives(&self) -> bool {
        false
    }

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
    /// in the same transaction. Committed on return and kept if the process is killed, but,
    /// like events, not flushed on their own: the next durable write flushes them. A power
    /// cut before then can lose the newest records only, never a link in the middle of the
    /// chain (a store's commits become durable in order).
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

    /// Creates a trigger. Fails with `TriggerExists` when its (kind, name) is taken.
    /// Durable on return.
    async fn trigger_create(&self, trigger: TriggerRecord) -> Result<()>;

    async fn trigger_get(&self, kind: &str, name: &str) -> Result<Option<TriggerRecord>>;

    /// The triggers of a kind (of one tenant, or all), by name.
    async fn trigger_list(&self, kind: &str, tenant: Option<&str>) -> Result<Vec<TriggerRecord>>;

    /// Pauses or resumes a trigger, setting `since_ms`; whether it exists. Durable on
    /// return.
    async fn trigger_set_paused(&self, kind: &str, name: &str, paused: bool, since_ms: u64) -> Result<bool>;

    /// Replaces a trigger's tenant and spec, keeping its fires, `paused` and `since_ms`;
    /// whether it exists. Durable on return.
    async fn trigger_update(&self, kind: &str, name: &str, tenant: &str, spec: &Value) -> Result<bool>;

    /// Deletes a trigger and its fires; whether it existed. Durable on return.
    async fn trigger_delete(&self, kind: &str, name: &str) -> Result<bool>;

    /// Records a fire unless its (kind, trigger, occasion) is already recorded: returns
    /// the stored fire (the earlier one when there was one, with its run id) and whether
    /// this call wrote it. Durable on return.
    async fn trigger_fire(&self, fire: FireRecord) -> Result<(FireRecord, bool)>;

    /// Sets a recorded fire's outcome (`failed` with why, when its run could not be
    /// created). Durable on return.
    async fn trigger_fire_settle(
        &self,
        kind: &str,
        trigger: &str,
        occasion: &str,
        outcome: &str,
        detail: Option<&str>,
    ) -> Result<()>;

    /// A trigger's newest fires (by `at_ms`, newest first), at most `limit`.
    async fn trigger_fires(&self, kind: &str, trigger: &str, limit: usize) -> Result<Vec<FireRecord>>;

    /// Fires of a kind recorded as `fired` whose run does not exist (the kernel died
    /// between recording the fire and creating its run), oldest first.
    async fn trigger_fires_unstarted(&self, kind: &str) -> Result<Vec<FireRecord>>;

    async fn stats(&self) -> Result<StoreStats>;

    /// Sends every record of the store as `DumpItem`s, in the order `dump` documents and
    /// in batches of at most `dump::DUMP_BATCH`, to `sink`; returns when all are sent (or,
    /// early and `Ok`, when the receiver is gone). Reads are not one snapshot: dump a store
    /// no kernel is writing to.
    async fn dump(&self, sink: tokio::sync::mpsc::Sender<Vec<DumpItem>>) -> Result<()>;

    /// Writes `items` (a batch of a dump, in dump order) verbatim, in one transaction:
    /// seqs, usage totals, audit hashes and delivery marks are kept as given, and the
    /// audit head follows the last audit entry. For an empty store (`is_empty`): an item
    /// that is already there is a `Backend` error, not merged. Durable on return.
    async fn restore(&self, items: Vec<DumpItem>) -> Result<()>;

    /// Whether the store holds nothing: no tenant, run, kv value, thread, memory record or
    /// audit entry.
    async fn is_empty(&self) -> Result<bool>;
}
