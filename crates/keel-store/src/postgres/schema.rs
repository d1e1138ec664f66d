//! The Postgres schema, its migrations and the checks `connect` makes first (a durable
//! server, an existing schema to create tables in).
//!
//! Schema history (each version is one entry of `MIGRATIONS`, append-only; the version a
//! database is at is the highest row of `keel_schema_version`):
//!
//! - **1**: everything SQLite reached in its six versions (see `sqlite/schema.rs` for why
//!   each table has its shape), in one step, with these differences:
//!   - Every text that is a key or is ordered by is `COLLATE "C"`: byte order, as SQLite
//!     compares, whatever the database's default collation; so listings, ties by key and
//!     dump order match SQLite's exactly, and B-tree comparisons stay cheap.
//!   - `runs.journal_last` and (since version 7) `event_heads.events_last` hold the last
//!     seq of the run's journal and event log. An append bumps one with an `UPDATE` of its
//!     row, which both takes the row lock that orders concurrent appends to one run and
//!     hands out the seq, in the same statement as the insert: seqs are dense without a
//!     writer thread.
//!     A mailbox's seq is `MAX(seq) + 1` read while holding the run's row lock
//!     (`SELECT ... FOR NO KEY UPDATE`), since the same lock guards its capacity check.
//!   - Memory text is indexed by a generated `tsvector` column (text search config
//!     `simple`: no stemming, no stop words, so every word of the text is findable, as with
//!     FTS5's default tokenizer) with a GIN index; ranking is `ts_rank_cd`. Embeddings
//!     reference their record with `ON DELETE CASCADE` instead of SQLite's trigger.
//!   - No foreign keys point at `blobs`: a foreign-key check locks the referenced row
//!     (`FOR KEY SHARE`), so every entry would write to the tuple of every blob it names,
//!     the system prompt shared by all of a run's calls above all (on a shared 2-core
//!     machine the pipelined writes of an append took roughly 0.1 ms more with them).
//!     Blobs are never deleted, and
//!     a reference without its blob reads back as `Corrupt`, as on SQLite.
//!   - Booleans are `BOOLEAN`, integers `BIGINT`, payload blobs `BYTEA`; JSON is kept as
//!     text, verbatim (not `jsonb`, which would reorder keys and reformat numbers).
//!   - The audit log refuses `UPDATE`, `DELETE` and `TRUNCATE` through a trigger function
//!     that raises an exception (short of dropping the triggers, which verify exposes).
//!     `audit_head` gets its one row at the first append.
//!
//! - **2**: many nodes (see `crate::cluster`). `keel_nodes`: each node's id, advertised
//!   address, version, heartbeat with its expiry (`expires_at`, from the database's
//!   clock: the only clock leases use), and the sha256 of the key it keeps in its data
//!   directory (a restart proves it is the same node). `run_leases`: the node holding each run and the
//!   epoch it took it at; a lease is live while its node's heartbeat is, so one heartbeat
//!   write renews all of a node's leases. `keel_cluster`: the one row holding the secret
//!   nodes authenticate forwarded requests with.
//! - **3**: `run_slots`, the cluster's admission ledger.
//! - **4**: the console's indexes, as SQLite's 7: `runs_by_cost`, `runs_by_tenant_cost`,
//!   `journal_by_time`.
//! - **5**: triggers and their fires, as SQLite's 8 (`crate::triggers`).
//! - **6**: `runs_by_end`, ended runs by (tenant, end time, id), as SQLite's 9
//!   (`runs_ended_after`).
//! - **7**: `event_heads`, each run's last event seq, out of the run's row (where version
//!   1 kept it as `events_last`): an event append locks this row, not the run's, which a
//!   journal write holds until its commit is flushed.
//! - **8**: fewer index entries per journaled step, as SQLite's 10 did for its pages.
//!   Postgres writes a new version of a row at every `UPDATE`; the update is "HOT" (heap
//!   only: no index entry) only when no indexed column changes and the row's page has
//!   room. A run's row changes at every journal write (the next seq, the usage totals),
//!   and its cost was a key of `runs_by_cost` and `runs_by_tenant_cost`, so every paid
//!   call wrote a new entry into each of the run's seven indexes, and looking the run up
//!   walked past its dead versions (measured: half of the run row's updates in the
//!   gateway benchmark were not HOT). Now only ended runs are indexed by cost
//!   (`ended_runs_by_cost`, `ended_runs_by_tenant_cost`, over the generated
//!   `ended_cost_micro_usd`), live ones by `live_runs`, and listing by cost merges the
//!   two, as on SQLite. `journal_by_method` is gone (`latest_entry` reads the run's
//!   journal backwards on its key) and `journal_by_time` became `llm_calls_by_time`, of
//!   `llm.chat` entries only (what `cost_summary` reads): an append wrote three index
//!   entries, now one or two. `runs` and `journal` get a fill factor of 80, so an entry's
//!   completion and a run's update find room on their page.
//!
//! Where the tables live: the first schema of the connection's `search_path` (`public`
//! unless the URL says otherwise, e.g. `?options=-csearch_path%3Dkeel`), so several
//! installations can share a database, one schema each.

use deadpool_postgres::Object;

use super::pg_error;
use crate::{Error, Result};

/// Migration `i` brings a database from version `i` to version `i + 1`. Append only:
/// a released migration never changes.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// The key of the transaction advisory lock that migrations hold, so that several nodes
/// starting at once migrate one after the other (the second finds nothing left to do).
/// Any fixed number works; this one is "keel" in ASCII.
const MIGRATION_LOCK: i64 = 0x6b65_656c;

/// Version 8: a journaled step writes fewer index entries, and a live run's row is updated
/// in place (see the module doc).
/// - `ended_cost_micro_usd` is a stored generated column: a run's cost once it has ended,
///   NULL while it is live, so no index holds a live run's cost, yet every way of writing
///   a run (a journal write, the run's end, a restore) keeps the column right. Adding a
///   stored column rewrites `runs` once, at the migration.
/// - Fill factors leave a page room for the new version of a row updated after its insert
///   (a journal entry's completion; a run's row, at every journal write).
const V8: &str = r#"
ALTER TABLE runs ADD COLUMN ended_cost_micro_usd BIGINT
    GENERATED ALWAYS AS (CASE WHEN ended_at_ms IS NOT NULL THEN cost_micro_usd END) STORED;
DROP INDEX runs_by_cost;
DROP INDEX runs_by_tenant_cost;
CREATE INDEX ended_runs_by_cost ON runs (ended_cost_micro_usd, created_at_ms, id)
    WHERE ended_at_ms IS NOT NULL;
CREATE INDEX ended_runs_by_tenant_cost ON runs (tenant, ended_cost_micro_usd, created_at_ms, id)
    WHERE ended_at_ms IS NOT NULL;
CREATE INDEX live_runs ON runs (tenant, created_at_ms, id) WHERE ended_at_ms IS NULL;
DROP INDEX journal_by_method;
DROP INDEX journal_by_time;
CREATE INDEX llm_calls_by_time ON journal (started_at_ms) WHERE method = 'llm.chat';
ALTER TABLE runs SET (fillfactor = 80);
ALTER TABLE journal SET (fillfactor = 80);
"#;

/// Version 7: a run's event counter moves from its row to `event_heads`, so appending
/// events no longer locks the run's row, which every journal write holds until its commit
/// is flushed (a run's events waited behind its journal).
const V7: &str = r#"
CREATE TABLE event_heads (
    run_id      TEXT COLLATE "C" PRIMARY KEY REFERENCES runs (id),
    events_last BIGINT NOT NULL
);
INSERT INTO event_heads (run_id, events_last) SELECT id, events_last FROM runs WHERE events_last > 0;
ALTER TABLE runs DROP COLUMN events_last;
"#;

/// Version 6: ended runs by tenant and end time, as SQLite's version 9.
const V6: &str = r#"
CREATE INDEX runs_by_end ON runs (tenant, ended_at_ms, id) WHERE ended_at_ms IS NOT NULL;
"#;

/// Version 5: triggers and their fires, as SQLite's version 8.
const V5: &str = r#"
CREATE TABLE triggers (
    kind          TEXT COLLATE "C" NOT NULL,
    name          TEXT COLLATE "C" NOT NULL,
    tenant        TEXT COLLATE "C" NOT NULL,
    spec          TEXT NOT NULL,
    paused        BOOLEAN NOT NULL,
    since_ms      BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (kind, name)
);
CREATE TABLE trigger_fires (
    kind        TEXT COLLATE "C" NOT NULL,
    trigger     TEXT COLLATE "C" NOT NULL,
    occasion    TEXT COLLATE "C" NOT NULL,
    tenant      TEXT COLLATE "C" NOT NULL,
    at_ms       BIGINT NOT NULL,
    run_id      TEXT COLLATE "C",
    outcome     TEXT NOT NULL,
    detail      TEXT,
    fired_at_ms BIGINT NOT NULL,
    PRIMARY KEY (kind, trigger, occasion)
);
CREATE INDEX fires_by_time ON trigger_fires (kind, trigger, at_ms);
"#;

/// Version 4: indexes for the console's listings, as SQLite's version 7: runs by cost
/// (all, and per tenant) and journal entries by method and start time (`cost_summary`).
const V4: &str = r#"
CREATE INDEX runs_by_cost ON runs (cost_micro_usd, created_at_ms, id);
CREATE INDEX runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id);
CREATE INDEX journal_by_time ON journal (method, started_at_ms);
"#;

/// Version 2: nodes, run leases and the cluster's secret; see the module doc.
/// Version 3: the cluster's admission ledger (`keel_core::placement`): a row per run that
/// holds a live slot on a node (`node`) or waits for one (`node` NULL; `home`, a node
/// that alone may start it). Written before the run's record exists, so no foreign key.
const V3: &str = r#"
CREATE TABLE run_slots (
    run_id       TEXT COLLATE "C" PRIMARY KEY,
    tenant       TEXT NOT NULL,
    agent        TEXT NOT NULL,
    priority     TEXT NOT NULL,
    submitted_ms BIGINT NOT NULL,
    node         TEXT COLLATE "C",
    home         TEXT COLLATE "C"
);
"#;

const V2: &str = r#"
CREATE TABLE keel_nodes (
    id           TEXT COLLATE "C" PRIMARY KEY,
    addr         TEXT NOT NULL,
    version      TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    draining     BOOLEAN NOT NULL DEFAULT false,
    key_hash     TEXT NOT NULL
);
CREATE TABLE run_leases (
    run_id      TEXT COLLATE "C" PRIMARY KEY REFERENCES runs (id),
    node        TEXT COLLATE "C" NOT NULL,
    epoch       BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX run_leases_by_node ON run_leases (node);
CREATE TABLE keel_cluster (
    id     INTEGER PRIMARY KEY CHECK (id = 0),
    secret TEXT NOT NULL
);
"#;

/// Version 1; see the module doc.
const V1: &str = r#"
CREATE TABLE runs (
    id             TEXT COLLATE "C" PRIMARY KEY,
    tenant         TEXT COLLATE "C" NOT NULL,
    spec           TEXT NOT NULL,
    state          TEXT COLLATE "C" NOT NULL,
    wait_reason    TEXT,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL,
    ended_at_ms    BIGINT,
    attempt        BIGINT NOT NULL,
    pid            BIGINT,
    exit_code      INTEGER,
    output         TEXT,
    error          TEXT,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    llm_calls      BIGINT NOT NULL DEFAULT 0,
    tool_calls     BIGINT NOT NULL DEFAULT 0,
    cost_micro_usd BIGINT NOT NULL DEFAULT 0,
    provider_calls BIGINT NOT NULL DEFAULT 0,
    journal_last   BIGINT NOT NULL DEFAULT 0,
    events_last    BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_creation ON runs (created_at_ms, id);
CREATE INDEX runs_by_state ON runs (state, created_at_ms, id);
CREATE INDEX runs_by_tenant ON runs (tenant, created_at_ms, id);

CREATE TABLE blobs (
    hash  TEXT COLLATE "C" PRIMARY KEY,
    size  BIGINT NOT NULL,
    bytes BYTEA NOT NULL
);

CREATE TABLE journal (
    run_id         TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    seq            BIGINT NOT NULL,
    method         TEXT COLLATE "C" NOT NULL,
    params_hash    TEXT NOT NULL,
    params_blob    TEXT COLLATE "C" NOT NULL,
    status         TEXT COLLATE "C" NOT NULL,
    result_blob    TEXT COLLATE "C",
    error_blob     TEXT COLLATE "C",
    attempt        BIGINT NOT NULL,
    started_at_ms  BIGINT NOT NULL,
    finished_at_ms BIGINT,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    llm_calls      BIGINT NOT NULL DEFAULT 0,
    tool_calls     BIGINT NOT NULL DEFAULT 0,
    cost_micro_usd BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX journal_by_method ON journal (run_id, method, seq);

CREATE TABLE events (
    run_id TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    seq    BIGINT NOT NULL,
    ts_ms  BIGINT NOT NULL,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE kv (
    scope TEXT COLLATE "C" NOT NULL,
    key   TEXT COLLATE "C" NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE TABLE thread_messages (
    tenant          TEXT COLLATE "C" NOT NULL,
    thread          TEXT COLLATE "C" NOT NULL,
    idx             BIGINT NOT NULL,
    message_blob    TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C",
    appended_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread, idx)
);
CREATE UNIQUE INDEX thread_messages_by_key ON thread_messages (tenant, thread, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE memory_deletes (
    tenant          TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C" NOT NULL,
    deleted         BOOLEAN NOT NULL,
    PRIMARY KEY (tenant, idempotency_key)
);

CREATE TABLE message_chain (
    hash         TEXT COLLATE "C" PRIMARY KEY,
    prev         TEXT COLLATE "C",
    message_blob TEXT COLLATE "C" NOT NULL
);

CREATE TABLE memory (
    id            BIGSERIAL PRIMARY KEY,
    tenant        TEXT COLLATE "C" NOT NULL,
    namespace     TEXT COLLATE "C" NOT NULL,
    key           TEXT COLLATE "C" NOT NULL,
    value         TEXT NOT NULL,
    text          TEXT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    words         TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    UNIQUE (tenant, namespace, key)
);
CREATE INDEX memory_by_words ON memory USING GIN (words);

CREATE TABLE memory_embeddings (
    memory_id BIGINT PRIMARY KEY REFERENCES memory (id) ON DELETE CASCADE,
    model     TEXT COLLATE "C" NOT NULL,
    dims      INTEGER NOT NULL,
    vector    BYTEA NOT NULL
);

CREATE TABLE mailbox (
    run_id         TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    seq            BIGINT NOT NULL,
    from_run       TEXT,
    message        TEXT NOT NULL,
    correlation_id TEXT,
    topic          TEXT,
    send_key       TEXT COLLATE "C",
    receive_key    TEXT COLLATE "C",
    sent_at_ms     BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE UNIQUE INDEX mailbox_by_send_key ON mailbox (run_id, send_key) WHERE send_key IS NOT NULL;
CREATE UNIQUE INDEX mailbox_by_receive_key ON mailbox (run_id, receive_key) WHERE receive_key IS NOT NULL;
CREATE INDEX mailbox_undelivered ON mailbox (run_id, seq) WHERE receive_key IS NULL;

CREATE TABLE subscriptions (
    tenant TEXT COLLATE "C" NOT NULL,
    topic  TEXT COLLATE "C" NOT NULL,
    run_id TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    PRIMARY KEY (tenant, topic, run_id)
);

CREATE TABLE audit (
    seq       BIGINT PRIMARY KEY,
    tenant    TEXT COLLATE "C" NOT NULL,
    run_id    TEXT COLLATE "C",
    at_ms     BIGINT NOT NULL,
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
CREATE FUNCTION keel_audit_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: entries cannot be %',
        CASE TG_OP WHEN 'UPDATE' THEN 'changed' ELSE 'deleted' END;
END
$$;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    FOR EACH ROW EXECUTE FUNCTION keel_audit_is_append_only();
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION keel_audit_is_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION keel_audit_is_append_only();

CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 0),
    seq  BIGINT NOT NULL,
    hash TEXT NOT NULL
);

CREATE TABLE tenants (
    name          TEXT COLLATE "C" PRIMARY KEY,
    created_at_ms BIGINT NOT NULL,
    quota         TEXT NOT NULL
);

CREATE TABLE api_tokens (
    hash          TEXT COLLATE "C" PRIMARY KEY,
    prefix        TEXT COLLATE "C" NOT NULL,
    tenant        TEXT COLLATE "C" NOT NULL REFERENCES tenants (name),
    created_at_ms BIGINT NOT NULL,
    label         TEXT,
    revoked       BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX api_tokens_by_tenant ON api_tokens (tenant, prefix);
"#;

/// Why a server with these settings cannot give "durable on return", or `None` when it
/// can. `fsync=off` lets the OS lose committed data on a power cut; `synchronous_commit=off`
/// answers a `COMMIT` before its WAL is flushed (any other value flushes it locally first).
pub(crate) fn durability_problem(fsync: &str, synchronous_commit: &str) -> Option<String> {
    let fix = "Keel's \"durable on return\" (a write acknowledged survives a crash of the \
               database server) needs both fsync=on and synchronous_commit on; set them in \
               postgresql.conf or with ALTER SYSTEM SET ... and SELECT pg_reload_conf() \
               (and for synchronous_commit, no ALTER ROLE or ALTER DATABASE setting it off)";
    if fsync.eq_ignore_ascii_case("off") {
        return Some(format!("the server runs with fsync=off. {fix}"));
    }
    if synchronous_commit.eq_ignore_ascii_case("off") {
        return Some(format!("the server runs with synchronous_commit=off. {fix}"));
    }
    None
}

/// Refuses a server that would acknowledge commits it could lose (see
/// `durability_problem`), naming the URL.
pub(super) async fn check_durable(client: &Object, url: &str) -> Result<()> {
    let step = "checking the server makes commits durable";
    let fsync = show(client, step, "fsync").await?;
    let synchronous_commit = show(client, step, "synchronous_commit").await?;
    match durability_problem(&fsync, &synchronous_commit) {
        Some(problem) => Err(Error::Backend { step, source: format!("{url}: {problem}").into() }),
        None => Ok(()),
    }
}

async fn show(client: &Object, step: &'static str, setting: &str) -> Result<String> {
    let row = client.query_one(&format!("SHOW {setting}"), &[]).await.map_err(pg_error(step))?;
    row.try_get(0).map_err(pg_error(step))
}

/// Whether the server could load pgvector (it is not used; see `PgStore::semantic_index`).
pub(super) async fn pgvector_available(client: &Object) -> Result<bool> {
    let row = client
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')", &[])
        .await
        .map_err(pg_error("looking for pgvector"))?;
    row.try_get(0).map_err(pg_error("looking for pgvector"))
}

/// Brings the schema to `SCHEMA_VERSION` in one transaction holding the migration lock:
/// nodes starting together migrate one at a time, and a failed migration leaves nothing
/// half done (Postgres DDL is transactional). A database at a newer version is refused,
/// naming both versions.
pub(super) async fn migrate(client: &mut Object) -> Result<()> {
    let transaction = client.transaction().await.map_err(pg_error("beginning a schema migration"))?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_error("taking the schema migration lock"))?;
    let schema: Option<String> = transaction
        .query_one("SELECT current_schema()", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(pg_error("finding the schema to create tables in"))?;
    if schema.is_none() {
        let search_path: String = transaction
            .query_one("SHOW search_path", &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(pg_error("reading the search_path"))?;
        return Err(Error::Backend {
            step: "finding the schema to create tables in",
            source: format!(
                "no schema of the connection's search_path ({search_path}) exists; create the \
                 first one (CREATE SCHEMA ...) or name an existing one in the URL's options"
            )
            .into(),
        });
    }
    transaction
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS keel_schema_version (
                 version    INTEGER PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(pg_error("creating the schema version table"))?;
    let version: i32 = transaction
        .query_one("SELECT COALESCE(MAX(version), 0) FROM keel_schema_version", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(pg_error("reading the schema version"))?;
    let version = usize::try_from(version)
        .map_err(|_| Error::Corrupt(format!("the database has a negative schema version ({version})")))?;
    if version > SCHEMA_VERSION {
        return Err(Error::schema_too_new(version, SCHEMA_VERSION));
    }
    for (done, migration) in MIGRATIONS.iter().enumerate().skip(version) {
        transaction.batch_execute(migration).await.map_err(pg_error("applying a schema migration"))?;
        let reached = i32::try_from(done + 1).unwrap_or(i32::MAX);
        transaction
            .execute("INSERT INTO keel_schema_version (version) VALUES ($1)", &[&reached])
            .await
            .map_err(pg_error("recording the schema version"))?;
    }
    transaction.commit().await.map_err(pg_error("committing a schema migration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_durable_settings_pass() {
        assert_eq!(durability_problem("on", "on"), None);
        for synchronous_commit in ["local", "remote_write", "remote_apply", "ON"] {
            assert_eq!(durability_problem("on", synchronous_commit), None, "{synchronous_commit}");
        }
        let fsync = durability_problem("off", "on").expect("fsync=off is refused");
        assert!(fsync.contains("fsync=off") && fsync.contains("durable on return"), "{fsync}");
        let commit = durability_problem("on", "off").expect("synchronous_commit=off is refused");
        assert!(commit.contains("synchronous_commit=off") && commit.contains("ALTER SYSTEM"), "{commit}");
    }
}
