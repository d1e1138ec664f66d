//! The SQLite schema, its migrations (tracked by `PRAGMA user_version`) and the settings
//! every connection is opened with.
//!
//! # Schema history
//!
//! Each version is one append-only migration (`V1`..`V10` below, with notes on each
//! table); what each one added, and the behaviour built on it:
//!
//! - **1**: `runs` (with usage totals as columns, updated in the same transaction as the
//!   entry that adds to them), content-addressed `blobs`, `journal` (hashes and numbers,
//!   clustered by run and seq), `events` and `kv`.
//! - **2**: memory. `thread_messages`: message blobs by tenant, thread and index, with an
//!   optional unique idempotency key. `memory`, with an external-content FTS5 index kept
//!   in step by triggers, and `memory_deletes` (what a keyed delete answered). And
//!   `message_chain`: the `messages` array of journal params is stored one message blob
//!   per node of a hash chain (node i = sha256(node i-1, message i); see `crate::chain`),
//!   so a conversation re-sent on every call stores each message once; reads reassemble
//!   it.
//! - **3**: `mailbox`: a run's messages by (run, seq), with the sender, the JSON text, the
//!   correlation id, an optional unique send idempotency key and a receive key set on
//!   delivery (rows stay; a partial index serves the undelivered ones). A send checks the
//!   target's tenant (another tenant's run is `RunNotFound`, like a missing one) and the
//!   capacity in the same transaction, so a full mailbox refuses (`MailboxFull`) and
//!   writes nothing; a receive with a key answers what that key took before (see
//!   `crate::mailbox`). `subscriptions` (tenant, topic, run) serves pub/sub: a publish
//!   delivers to every subscriber that has not ended in one transaction, all or nothing
//!   (`MailboxFull` names the full one), with a message's `topic` column set.
//! - **4**: the audit log. `audit` rows form one hash chain over all tenants
//!   (`keel_core::audit::entry_hash(prev_hash, seq, canonical JSON of the record)`, from
//!   `GENESIS`), chained by the writer thread so it is linear; triggers refuse UPDATE and
//!   DELETE; `audit_head` (last seq and hash) is written in the same transaction as each
//!   append, so `audit_verify` (a streaming walk in seq order, `crate::audit::AuditWalk`)
//!   catches a modified record or hash, a removed, inserted or reordered entry, and
//!   trailing entries cut off. Rewriting the whole log and head consistently is out of
//!   scope unless the head hash it prints is kept elsewhere.
//! - **5**: `tenants` (name, creation time, quota JSON) and `api_tokens` (the sha256 of a
//!   token, never the token; its public prefix, tenant, label and a `revoked` flag that
//!   is never cleared), and `runs_by_tenant` for `RunFilter::tenant`.
//! - **6**: `memory_embeddings`: at most one vector per memory record (keyed by its rowid;
//!   model name, dims, f32 little-endian blob), written or removed in the same
//!   transaction as the record's `mem_put`, deleted with it by trigger. `mem_search` takes
//!   a `MemorySearch` with a `SearchMode`: `Text` (FTS5/BM25), `Semantic` (brute-force
//!   cosine over the namespace's vectors of the query's model and length: linear, fine up
//!   to about 100k records a namespace; there is no ANN index) or `Hybrid` (reciprocal
//!   rank fusion, k = 60, of both rankings, each at least 50 deep; see `crate::search`).
//! - **7**: indexes for the console: `runs_by_cost` and `runs_by_tenant_cost` (listing by
//!   cost, `RunOrder`), `journal_by_time` (`cost_summary`: `llm.chat` entries since a time).
//! - **8**: triggers (`crate::triggers`). `triggers` keyed by (kind, name) with the tenant,
//!   the spec JSON, `paused` and `since_ms`; `trigger_fires` keyed by (kind, trigger,
//!   occasion), so an occasion (a scheduled time, a delivery id) is recorded once, with
//!   the run id chosen before the run is created; `fires_by_time` serves the newest fires.
//! - **9**: `runs_by_end`, a partial index of ended runs by (tenant, end time, id):
//!   `runs_ended_after`, which event triggers' catch-up reads (the runs that ended since
//!   the last pass), costs the runs it reads.
//! - **10**: fewer pages per journaled step. Payloads of at most `writer::INLINE_MAX` (256) bytes (a
//!   journal entry's params, result or error; a message of the message chain) are stored
//!   in the row that names them (`*_inline`) instead of as a content-addressed blob, which
//!   cost a page at a random place of `blobs` for every append and completion; larger ones
//!   stay blobs, stored once. `journal` and `message_chain` are rebuilt for the new
//!   columns (their blob columns become nullable: a payload is in exactly one of the two).
//!   `journal_by_method` is gone (`latest_entry` reads the run's journal backwards from its
//!   end, which the run's recovery reads whole anyway), and `journal_by_time` became
//!   `llm_calls_by_time`, holding only completed `llm.chat` entries (all `cost_summary`
//!   reads). Each had cost every append a page. `runs_by_cost` and `runs_by_tenant_cost`
//!   became `ended_runs_by_cost` and `ended_runs_by_tenant_cost`, partial indexes of
//!   ended runs: a live run's cost changes with every paid call, which rewrote an entry
//!   of each (two pages a commit). Listing by cost merges the ended runs, in index order,
//!   with the live ones (`live_runs`), sorted as read.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::writer::sql_error;
use crate::{Error, Result};

/// How long a connection waits for a lock held by another connection (for example a
/// second process opening the same file) before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Migration `i` brings a database from version `i` to version `i + 1`. Append only:
/// a released migration never changes.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10];

/// The schema this build writes and reads.
pub(super) const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// Version 1. Notes on the choices:
/// - Journal payloads live in `blobs`, keyed by the hex sha256 of their bytes, so a
///   conversation re-sent on every call is stored once; `size` makes `stats` cheap.
/// - `journal` rows are small (hashes and numbers), so it is a WITHOUT ROWID table
///   clustered by (run_id, seq): reading a run's journal is one range scan.
/// - `journal_by_method` serves `latest_entry` (newest entry of a method).
/// - Run usage totals are columns of `runs`, updated in the same transaction as the
///   entry that adds to them, so they are exact across crashes.
const V1: &str = "
CREATE TABLE runs (
    id             TEXT PRIMARY KEY NOT NULL,
    tenant         TEXT NOT NULL,
    spec           TEXT NOT NULL,
    state          TEXT NOT NULL,
    wait_reason    TEXT,
    created_at_ms  INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    ended_at_ms    INTEGER,
    attempt        INTEGER NOT NULL,
    pid            INTEGER,
    exit_code      INTEGER,
    output         TEXT,
    error          TEXT,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    llm_calls      INTEGER NOT NULL DEFAULT 0,
    tool_calls     INTEGER NOT NULL DEFAULT 0,
    cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    provider_calls INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_creation ON runs (created_at_ms, id);
CREATE INDEX runs_by_state ON runs (state, created_at_ms, id);

CREATE TABLE blobs (
    hash  TEXT PRIMARY KEY NOT NULL,
    size  INTEGER NOT NULL,
    bytes BLOB NOT NULL
);

CREATE TABLE journal (
    run_id         TEXT NOT NULL REFERENCES runs (id),
    seq            INTEGER NOT NULL,
    method         TEXT NOT NULL,
    params_hash    TEXT NOT NULL,
    params_blob    TEXT NOT NULL REFERENCES blobs (hash),
    status         TEXT NOT NULL,
    result_blob    TEXT REFERENCES blobs (hash),
    error_blob     TEXT REFERENCES blobs (hash),
    attempt        INTEGER NOT NULL,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    llm_calls      INTEGER NOT NULL DEFAULT 0,
    tool_calls     INTEGER NOT NULL DEFAULT 0,
    cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE INDEX journal_by_method ON journal (run_id, method, seq);

CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq    INTEGER NOT NULL,
    ts_ms  INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE kv (
    scope TEXT NOT NULL,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
";

/// Version 2: memory.
/// - Thread messages are content-addressed blobs (like journal payloads); a thread row is
///   (tenant, thread, idx) -> blob, clustered for a range scan of the last N. The optional
///   idempotency key makes a retried append (after a crash) write nothing.
/// - `message_chain` stores the `messages` of journal params (an LLM conversation re-sent
///   on every call) one message at a time: node `hash` is message `message_blob` after
///   the prefix `prev`, and a params blob names its last node. A call that re-sends a
///   history stores only the messages that are new (see `crate::chain`).
/// - Long-term records live in `memory`, with an external-content FTS5 index over their
///   `text` kept in step by triggers (so a put, overwrite or delete updates the index in
///   the same transaction). `memory_deletes` remembers what a delete with an idempotency
///   key answered, so its retry answers the same.
const V2: &str = "
CREATE TABLE thread_messages (
    tenant          TEXT NOT NULL,
    thread          TEXT NOT NULL,
    idx             INTEGER NOT NULL,
    message_blob    TEXT NOT NULL REFERENCES blobs (hash),
    idempotency_key TEXT,
    appended_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, thread, idx)
) WITHOUT ROWID;
CREATE UNIQUE INDEX thread_messages_by_key ON thread_messages (tenant, thread, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE memory_deletes (
    tenant          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    deleted         INTEGER NOT NULL,
    PRIMARY KEY (tenant, idempotency_key)
) WITHOUT ROWID;

CREATE TABLE message_chain (
    hash         TEXT PRIMARY KEY NOT NULL,
    prev         TEXT,
    message_blob TEXT NOT NULL REFERENCES blobs (hash)
) WITHOUT ROWID;

CREATE TABLE memory (
    id            INTEGER PRIMARY KEY,
    tenant        TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    value         TEXT NOT NULL,
    text          TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    UNIQUE (tenant, namespace, key)
);
CREATE VIRTUAL TABLE memory_fts USING fts5 (text, content = 'memory', content_rowid = 'id');
CREATE TRIGGER memory_inserted AFTER INSERT ON memory BEGIN
    INSERT INTO memory_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER memory_deleted AFTER DELETE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER memory_updated AFTER UPDATE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO memory_fts (rowid, text) VALUES (new.id, new.text);
END;
";

/// Version 3: mailboxes (IPC).
/// - A run's mailbox is `mailbox` rows (run_id, seq), seq dense from 1. A row stays after
///   delivery, with `receive_key` set (a marker when the receiver gave no key), so a
///   retried receive finds what it took; `mailbox_undelivered` serves the length and the
///   oldest undelivered message.
/// - `send_key` makes a retried send (after a crash) write nothing.
/// - `topic` is set on a message published to a topic; `subscriptions` lists each
///   topic's subscribers (by tenant), clustered for one range scan per publish.
const V3: &str = "
CREATE TABLE mailbox (
    run_id         TEXT NOT NULL REFERENCES runs (id),
    seq            INTEGER NOT NULL,
    from_run       TEXT,
    message        TEXT NOT NULL,
    correlation_id TEXT,
    topic          TEXT,
    send_key       TEXT,
    receive_key    TEXT,
    sent_at_ms     INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX mailbox_by_send_key ON mailbox (run_id, send_key) WHERE send_key IS NOT NULL;
CREATE UNIQUE INDEX mailbox_by_receive_key ON mailbox (run_id, receive_key) WHERE receive_key IS NOT NULL;
CREATE INDEX mailbox_undelivered ON mailbox (run_id, seq) WHERE receive_key IS NULL;

CREATE TABLE subscriptions (
    tenant TEXT NOT NULL,
    topic  TEXT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs (id),
    PRIMARY KEY (tenant, topic, run_id)
) WITHOUT ROWID;
";

/// Version 4: the audit log.
/// - `audit` rows are the hash chain (see `keel_core::audit`), seq dense from 1 over all
///   tenants; `detail` is JSON text. Triggers refuse UPDATE and DELETE, so the log is
///   append-only for anything using SQL short of dropping them (verify still catches that).
/// - `audit_head` (one row, id 0) holds the last seq and hash, written in the same
///   transaction as each append, so verify notices trailing entries removed.
/// - `audit_by_run` serves a run's entries; `audit_by_tenant` a tenant's.
const V4: &str = "
CREATE TABLE audit (
    seq       INTEGER PRIMARY KEY,
    tenant    TEXT NOT NULL,
    run_id    TEXT,
    at_ms     INTEGER NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    subject   TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    detail    TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE INDEX audit_by_run ON audit (run_id, seq) WHERE run_id IS NOT NULL;
CREATE INDEX audit_by_tenant ON audit (tenant, seq);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only: entries cannot be changed');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only: entries cannot be deleted');
END;

CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 0),
    seq  INTEGER NOT NULL,
    hash TEXT NOT NULL
);
";

/// Version 5: tenants and their API tokens.
/// - `tenants.quota` is the kernel's JSON (`max_runs`, `max_usd_per_run`).
/// - `api_tokens` never holds a token: `hash` is the hex sha256 of it (the lookup key on
///   every request), `prefix` its public first characters (what listing and revoking
///   name). A revoked row stays, so the token never resolves again.
/// - `runs_by_tenant` serves a tenant's `keel ps` and the `max_runs` quota check.
const V5: &str = "
CREATE TABLE tenants (
    name          TEXT PRIMARY KEY NOT NULL,
    created_at_ms INTEGER NOT NULL,
    quota         TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE api_tokens (
    hash          TEXT PRIMARY KEY NOT NULL,
    prefix        TEXT NOT NULL,
    tenant        TEXT NOT NULL REFERENCES tenants (name),
    created_at_ms INTEGER NOT NULL,
    label         TEXT,
    revoked       INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX api_tokens_by_tenant ON api_tokens (tenant, prefix);

CREATE INDEX runs_by_tenant ON runs (tenant, created_at_ms, id);
";

/// Version 6: embeddings of memory records, for semantic search.
/// - One row per record at most, keyed by the record's rowid (an overwrite keeps the
///   rowid, and `mem_put` replaces or removes the row in the same transaction); a delete
///   of the record deletes it by trigger.
/// - `vector` is the f32 values little-endian, `dims` of them; `model` names what made
///   them, so a search compares only vectors of the query's model.
const V6: &str = "
CREATE TABLE memory_embeddings (
    memory_id INTEGER PRIMARY KEY NOT NULL,
    model     TEXT NOT NULL,
    dims      INTEGER NOT NULL,
    vector    BLOB NOT NULL
);
CREATE TRIGGER memory_embedding_deleted AFTER DELETE ON memory BEGIN
    DELETE FROM memory_embeddings WHERE memory_id = old.id;
END;
";

/// Version 7: indexes for the console's listings: runs by cost (all, and per tenant) for
/// `RunOrder::CostliestFirst`/`CheapestFirst`, and journal entries by method and start
/// time for `cost_summary`.
const V7: &str = "
CREATE INDEX runs_by_cost ON runs (cost_micro_usd, created_at_ms, id);
CREATE INDEX runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id);
CREATE INDEX journal_by_time ON journal (method, started_at_ms);
";

/// Version 8: triggers and their fires. A fire names its run without a foreign key: the
/// fire is written first and the run after it (see `crate::triggers`).
const V8: &str = "
CREATE TABLE triggers (
    kind          TEXT NOT NULL,
    name          TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    spec          TEXT NOT NULL,
    paused        INTEGER NOT NULL,
    since_ms      INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);
CREATE TABLE trigger_fires (
    kind        TEXT NOT NULL,
    trigger     TEXT NOT NULL,
    occasion    TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    run_id      TEXT,
    outcome     TEXT NOT NULL,
    detail      TEXT,
    fired_at_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, trigger, occasion)
);
CREATE INDEX fires_by_time ON trigger_fires (kind, trigger, at_ms);
";

/// Version 9: ended runs by tenant and end time (`Store::runs_ended_after`). Partial:
/// live runs, which change state often, are not in it.
const V9: &str = "
CREATE INDEX runs_by_end ON runs (tenant, ended_at_ms, id) WHERE ended_at_ms IS NOT NULL;
";

/// Version 10: small payloads inline, two journal indexes fewer, and cost indexes of ended
/// runs only (see the module doc).
/// SQLite cannot make a column nullable in place, so `journal` and `message_chain` are
/// rebuilt: a new table, the rows copied, the old one dropped (with its indexes) and the
/// new one renamed. Existing payloads stay blobs; only new writes go inline.
/// - A payload is in exactly one of `*_blob` (the hash of a `blobs` row) and `*_inline`
///   (its bytes); the CHECKs refuse a row naming both, or params naming neither.
/// - Inline payloads are small enough that a whole row stays within a leaf page's local
///   payload (about 1,000 bytes for a WITHOUT ROWID table), so it needs no overflow page.
const V10: &str = "
CREATE TABLE journal_v10 (
    run_id         TEXT NOT NULL REFERENCES runs (id),
    seq            INTEGER NOT NULL,
    method         TEXT NOT NULL,
    params_hash    TEXT NOT NULL,
    params_blob    TEXT REFERENCES blobs (hash),
    status         TEXT NOT NULL,
    result_blob    TEXT REFERENCES blobs (hash),
    error_blob     TEXT REFERENCES blobs (hash),
    attempt        INTEGER NOT NULL,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    llm_calls      INTEGER NOT NULL DEFAULT 0,
    tool_calls     INTEGER NOT NULL DEFAULT 0,
    cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    params_inline  BLOB,
    result_inline  BLOB,
    error_inline   BLOB,
    PRIMARY KEY (run_id, seq),
    CHECK ((params_blob IS NULL) <> (params_inline IS NULL)),
    CHECK (result_blob IS NULL OR result_inline IS NULL),
    CHECK (error_blob IS NULL OR error_inline IS NULL)
) WITHOUT ROWID;
INSERT INTO journal_v10 (run_id, seq, method, params_hash, params_blob, status, result_blob,
    error_blob, attempt, started_at_ms, finished_at_ms, input_tokens, output_tokens, llm_calls,
    tool_calls, cost_micro_usd)
    SELECT run_id, seq, method, params_hash, params_blob, status, result_blob, error_blob,
        attempt, started_at_ms, finished_at_ms, input_tokens, output_tokens, llm_calls,
        tool_calls, cost_micro_usd
    FROM journal;
DROP TABLE journal;
ALTER TABLE journal_v10 RENAME TO journal;
CREATE INDEX llm_calls_by_time ON journal (started_at_ms) WHERE method = 'llm.chat' AND status = 'ok';

CREATE TABLE message_chain_v10 (
    hash           TEXT PRIMARY KEY NOT NULL,
    prev           TEXT,
    message_blob   TEXT REFERENCES blobs (hash),
    message_inline BLOB,
    CHECK ((message_blob IS NULL) <> (message_inline IS NULL))
) WITHOUT ROWID;
INSERT INTO message_chain_v10 (hash, prev, message_blob)
    SELECT hash, prev, message_blob FROM message_chain;
DROP TABLE message_chain;
ALTER TABLE message_chain_v10 RENAME TO message_chain;

DROP INDEX runs_by_cost;
DROP INDEX runs_by_tenant_cost;
CREATE INDEX ended_runs_by_cost ON runs (cost_micro_usd, created_at_ms, id)
    WHERE ended_at_ms IS NOT NULL;
CREATE INDEX ended_runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id)
    WHERE ended_at_ms IS NOT NULL;
CREATE INDEX live_runs ON runs (tenant, created_at_ms, id) WHERE ended_at_ms IS NULL;
";

/// Settings of the one read-write connection. WAL lets readers run beside the writer;
/// `synchronous=FULL` makes every commit fsync the WAL, which is what "durable on return"
/// needs (NORMAL would survive a process kill but not a power cut). The writer thread's
/// batches commit with NORMAL and are answered only after the WAL is flushed
/// (`writer::Flush::AfterCommit`), which keeps the same promise. SQLite's automatic
/// checkpoint stays on, bounding the WAL (with it off, the WAL grew between background
/// checkpoints and every commit got slower: 711 vs 480 µs a journaled step), every 4,000
/// pages (`writer::AUTOCHECKPOINT_PAGES`); a separate
/// thread checkpoints every second, so the automatic one rarely has much to copy.
pub(super) fn configure_writer(connection: &Connection) -> Result<()> {
    connection.busy_timeout(BUSY_TIMEOUT).map_err(sql_error("setting the busy timeout"))?;
    let mode: String = connection
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(sql_error("switching the database to WAL mode"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Backend {
            step: "switching the database to WAL mode",
            source: format!("SQLite kept journal mode {mode:?}; is the file on a filesystem without shared memory support?").into(),
        });
    }
    connection
        .execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(sql_error("setting synchronous=FULL and foreign_keys=ON"))?;
    keep_statements_prepared(connection)
}

/// Plans every statement without looking at its bound values (SQLite's query planner
/// stability guarantee), so that a cached statement stays prepared. Otherwise SQLite
/// marks a parameter the planner read (a `LIMIT ?`, a `?` compared against a partial
/// index's condition) and re-parses and re-plans the statement each time that parameter
/// is bound again: 16% of the daemon's CPU on `GET /v1/runs/{id}`, whose journal read
/// ends in `LIMIT ?3`. No query here needs the values: the partial indexes are chosen by
/// literal conditions (`INDEXED BY` where it matters), and no pattern is bound to `LIKE`.
fn keep_statements_prepared(connection: &Connection) -> Result<()> {
    connection
        .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(sql_error("turning on the query planner stability guarantee"))?;
    connection.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Settings of a read-only connection. Its page cache is 1 MiB, not SQLite's 2 MB: up to
/// eight readers are kept open, the file's pages are in the OS cache anyway, and a kernel
/// holding thousands of parked runs should not spend 16 MB on copies of them.
pub(super) fn configure_reader(connection: &Connection) -> Result<()> {
    connection
        .busy_timeout(BUSY_TIMEOUT)
        .map_err(sql_error("setting the busy timeout of a read connection"))?;
    connection
        .execute_batch("PRAGMA cache_size = -1024;")
        .map_err(sql_error("setting the page cache size of a read connection"))?;
    keep_statements_prepared(connection)
}

/// Brings the schema to `SCHEMA_VERSION`, one migration per transaction. The version is
/// read inside the write transaction, so two processes opening a new file at once do not
/// both migrate it.
pub(super) fn migrate(connection: &mut Connection) -> Result<()> {
    let mut migrated = false;
    loop {
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("beginning a schema migration"))?;
        let version: i64 = transaction
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(sql_error("reading the schema version"))?;
        let version = usize::try_from(version)
            .map_err(|_| Error::Corrupt(format!("the database has a negative schema version ({version})")))?;
        if version == SCHEMA_VERSION {
            drop(transaction);
            if migrated {
                shrink_wal(connection);
            }
            return Ok(());
        }
        let Some(migration) = MIGRATIONS.get(version) else {
            return Err(Error::schema_too_new(version, SCHEMA_VERSION));
        };
        transaction.execute_batch(migration).map_err(sql_error("applying a schema migration"))?;
        transaction
            .pragma_update(None, "user_version", version + 1)
            .map_err(sql_error("recording the schema version"))?;
        transaction.commit().map_err(sql_error("committing a schema migration"))?;
        migrated = true;
    }
}

/// Copies the WAL into the database file and truncates it. A migration that rebuilds a
/// table (version 10 rebuilds the journal) writes the whole table into the WAL, which
/// would otherwise keep that size on disk for as long as the store is open. Best effort:
/// the data is safe in the WAL either way.
fn shrink_wal(connection: &Connection) {
    let result = connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get::<_, i64>(0));
    match result {
        Ok(0) => {}
        Ok(_) => {
            tracing::warn!("keel-store: another connection kept the WAL from shrinking after a migration")
        }
        Err(error) => tracing::warn!(%error, "keel-store could not shrink the WAL after a migration"),
    }
}
