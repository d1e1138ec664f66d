//! The write half of the Store API on Postgres. Each function runs inside the caller's
//! transaction (or is one statement, its own transaction); the caller commits. What the
//! SQLite writer thread gets from running alone is earned here with locks, named at each
//! function: the run's row (journal, events, mailbox), unique indexes (idempotency keys,
//! blobs, chain nodes), and advisory locks where there is no row to lock yet.
//!
//! Lock order, so that no two transactions wait on each other in a cycle: blobs (in hash
//! order, each insert one statement), then message-chain nodes, then journal rows, then run
//! rows (in id order when there are several); a transaction that locks a run row first
//! (append, events, mailbox) takes no existing journal row after it.

use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, Mutex, PoisonError};

use deadpool_postgres::{GenericClient, Transaction};
use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::queries::{self, RUN_COLUMNS, count, execute, prepare, query_opt, query_rows};
use super::{int, pg_error};
use crate::chain::{self, Blob, ChainLink, EncodedCompletion, EncodedEntry};
use crate::{
    Error, MailboxDone, MailboxMessage, MailboxResult, MemoryEmbedding, NewEvent, NewMessage, NewRun, Result,
    RunPatch, RunRecord, Seq,
};
use crate::{mailbox, search};

/// The fields of one `mem_put`.
pub(super) struct MemoryPut<'a> {
    pub(super) tenant: &'a str,
    pub(super) namespace: &'a str,
    pub(super) key: &'a str,
    /// JSON text.
    pub(super) value: &'a str,
    pub(super) text: &'a str,
    pub(super) embedding: Option<&'a MemoryEmbedding>,
    pub(super) updated_at_ms: u64,
}

pub(super) async fn create_run(client: &impl GenericClient, run: NewRun) -> Result<RunRecord> {
    let inserted = execute(
        client,
        "inserting a run",
        "INSERT INTO runs (id, tenant, spec, state, created_at_ms, updated_at_ms, attempt) \
         VALUES ($1, $2, $3, $4, $5, $5, 1) ON CONFLICT (id) DO NOTHING",
        &[&run.id.as_str(), &run.tenant, &run.spec.to_string(), &run.state.as_str(), &int(run.created_at_ms)],
    )
    .await?;
    if inserted == 0 {
        return Err(Error::RunExists(run.id));
    }
    Ok(run.into_record())
}

/// The compare-and-set: one `UPDATE ... WHERE id = $1 AND state = $2`, whose row lock
/// orders it against every other write to the run. Each patched field comes as a flag
/// (whether the patch names it) and a value, so that `Some(None)` clears a column. When
/// nothing matched, the run's current state tells `StateConflict` from `RunNotFound`.
pub(super) async fn update_run(
    transaction: &Transaction<'_>,
    id: &RunId,
    expected: Option<RunState>,
    patch: RunPatch,
) -> Result<RunRecord> {
    let RunPatch { state, wait_reason, updated_at_ms, ended_at_ms, attempt, pid, exit_code, output, error } =
        patch;
    let state_value = state.map(RunState::as_str);
    let wait_reason_value = wait_reason.flatten().map(WaitReason::as_str);
    let updated_value = updated_at_ms.map(int);
    let ended_value = ended_at_ms.flatten().map(int);
    let attempt_value = attempt.map(i64::from);
    let pid_value = pid.flatten().map(i64::from);
    let exit_code_value = exit_code.flatten();
    let output_value = output.as_ref().and_then(|output| output.as_ref().map(Value::to_string));
    let error_value = error.as_ref().and_then(Option::as_deref);
    let sql = format!(
        "UPDATE runs SET \
         state = CASE WHEN $3 THEN $4 ELSE state END, \
         wait_reason = CASE WHEN $5 THEN $6 ELSE wait_reason END, \
         updated_at_ms = CASE WHEN $7 THEN $8 ELSE updated_at_ms END, \
         ended_at_ms = CASE WHEN $9 THEN $10 ELSE ended_at_ms END, \
         attempt = CASE WHEN $11 THEN $12 ELSE attempt END, \
         pid = CASE WHEN $13 THEN $14 ELSE pid END, \
         exit_code = CASE WHEN $15 THEN $16 ELSE exit_code END, \
         output = CASE WHEN $17 THEN $18 ELSE output END, \
         error = CASE WHEN $19 THEN $20 ELSE error END \
         WHERE id = $1 AND ($2::text IS NULL OR state = $2) RETURNING {RUN_COLUMNS}"
    );
    let updated = query_opt(
        transaction,
        "updating a run",
        &sql,
        &[
            &id.as_str(),
            &expected.map(RunState::as_str),
            &state.is_some(),
            &state_value,
            &wait_reason.is_some(),
            &wait_reason_value,
            &updated_at_ms.is_some(),
            &updated_value,
            &ended_at_ms.is_some(),
            &ended_value,
            &attempt.is_some(),
            &attempt_value,
            &pid.is_some(),
            &pid_value,
            &exit_code.is_some(),
            &exit_code_value,
            &output.is_some(),
            &output_value,
            &error.is_some(),
            &error_value,
        ],
    )
    .await?;
    if let Some(row) = updated {
        return queries::decode_run(&row);
    }
    let current = queries::load_run(transaction, id).await?;
    match (current, expected) {
        (Some(run), Some(expected)) => {
            Err(Error::StateConflict { run: id.clone(), expected, actual: run.state })
        }
        _ => Err(Error::RunNotFound(id.clone())),
    }
}

/// The `UPDATE` of the run's row an append makes, with its parameters (see `EntryValues`):
/// the next seq, and an entry complete at once added to the usage totals.
const APPEND_RUN: &str = "UPDATE runs SET journal_last = journal_last + 1, \
     input_tokens = input_tokens + $11, output_tokens = output_tokens + $12, \
     llm_calls = llm_calls + $13, tool_calls = tool_calls + $14, \
     cost_micro_usd = cost_micro_usd + $15 \
     WHERE id = $1";

/// The `INSERT` of the entry, reading the seq from `run` (the `APPEND_RUN` above).
const APPEND_INSERT: &str = "INSERT INTO journal (run_id, seq, method, params_hash, params_blob, status, \
     result_blob, error_blob, attempt, started_at_ms, finished_at_ms, input_tokens, output_tokens, \
     llm_calls, tool_calls, cost_micro_usd) \
     SELECT $1, journal_last, $2, $3, $4, $5, $6, $7, $8, $9, $10, $16, $17, $18, $19, $20 FROM run \
     RETURNING seq";

/// An append in the caller's transaction, after its blobs and chain nodes.
static APPEND_IN_TRANSACTION: LazyLock<String> =
    LazyLock::new(|| format!("WITH run AS ({APPEND_RUN} RETURNING journal_last) {APPEND_INSERT}"));

/// An append alone: its blobs (`$21`-`$23`) and chain nodes (`$24`-`$26`) in the same
/// statement, stored only if the run exists (a refused append leaves nothing), and before
/// the run's row is locked (the subqueries in its `WHERE` run first), the order every
/// transaction takes them in.
static APPEND_ALONE: LazyLock<String> = LazyLock::new(|| {
    const RUN_EXISTS: &str = "EXISTS (SELECT 1 FROM runs WHERE id = $1)";
    format!(
        "WITH blobs_put AS ({} RETURNING 1), chain_put AS ({} RETURNING 1), \
         run AS ({APPEND_RUN} AND (SELECT count(*) FROM blobs_put) >= 0 \
             AND (SELECT count(*) FROM chain_put) >= 0 RETURNING journal_last) \
         {APPEND_INSERT}",
        Stored::Blobs.insert(21, RUN_EXISTS),
        Stored::ChainNodes.insert(24, RUN_EXISTS),
    )
});

/// What is stored content-addressed, once each: payload blobs and message chain nodes.
#[derive(Clone, Copy)]
enum Stored {
    Blobs,
    ChainNodes,
}

impl Stored {
    /// The `INSERT` of rows given as three arrays (`BlobColumns`, `ChainColumns`) from
    /// parameter `$first` on, where `guard` holds, in hash order, so that two transactions
    /// storing the same rows wait for each other in one order, never in a cycle; a row
    /// already stored is nothing to do.
    fn insert(self, first: usize, guard: &str) -> String {
        let (table, [a, b, c]) = match self {
            Stored::Blobs => ("blobs (hash, size, bytes)", ["text", "bigint", "bytea"]),
            Stored::ChainNodes => ("message_chain (hash, prev, message_blob)", ["text", "text", "text"]),
        };
        let (second, third) = (first + 1, first + 2);
        format!(
            "INSERT INTO {table} \
             SELECT * FROM unnest(${first}::{a}[], ${second}::{b}[], ${third}::{c}[]) WHERE {guard} \
             ORDER BY 1 ON CONFLICT (hash) DO NOTHING"
        )
    }
}

/// The values of an append's `$1`-`$20`.
struct EntryValues<'a> {
    run: &'a str,
    entry: &'a EncodedEntry,
    status: &'static str,
    result: Option<&'a str>,
    error: Option<&'a str>,
    attempt: i64,
    started: i64,
    finished: Option<i64>,
    /// What the entry adds to the run's totals (only an entry complete at once adds).
    added: [i64; 5],
    usage: [i64; 5],
}

impl<'a> EntryValues<'a> {
    fn of(run: &'a RunId, entry: &'a EncodedEntry) -> EntryValues<'a> {
        let usage = |usage: &Usage| {
            [
                int(usage.input_tokens),
                int(usage.output_tokens),
                int(usage.llm_calls),
                int(usage.tool_calls),
                int(usage.cost_micro_usd),
            ]
        };
        let added = if matches!(entry.status, EntryStatus::Ok | EntryStatus::Error) {
            usage(&entry.usage)
        } else {
            [0; 5]
        };
        EntryValues {
            run: run.as_str(),
            entry,
            status: entry.status.as_str(),
            result: entry.result.as_ref().map(|blob| blob.hash.as_str()),
            error: entry.error.as_ref().map(|blob| blob.hash.as_str()),
            attempt: i64::from(entry.attempt),
            started: int(entry.started_at_ms),
            finished: entry.finished_at_ms.map(int),
            added,
            usage: usage(&entry.usage),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 20] {
        let entry = self.entry;
        let [a0, a1, a2, a3, a4] = &self.added;
        let [u0, u1, u2, u3, u4] = &self.usage;
        [
            &self.run,
            &entry.method,
            &entry.params_hash,
            &entry.params.hash,
            &self.status,
            &self.result,
            &self.error,
            &self.attempt,
            &self.started,
            &self.finished,
            a0,
            a1,
            a2,
            a3,
            a4,
            u0,
            u1,
            u2,
            u3,
            u4,
        ]
    }
}

/// The blobs an append stores: its params, the messages of the chain nodes it stores, its
/// result or error.
fn entry_blobs<'a>(entry: &'a EncodedEntry, unstored: &'a [ChainLink]) -> Vec<&'a Blob> {
    let mut blobs: Vec<&Blob> = vec![&entry.params];
    blobs.extend(unstored.iter().map(|link| &link.message));
    blobs.extend(entry.result.iter().chain(&entry.error));
    blobs
}

/// Appends under the run's row lock: the statement that inserts the entry is the one that
/// bumps `runs.journal_last` (and adds an entry complete at once to the usage totals), so
/// concurrent appends to one run take dense seqs in lock order. The blobs and the chain
/// nodes in `unstored` (see `ChainEnds::unstored`) are written first in the same
/// transaction; all three go to the server in one round trip (pipelined).
pub(super) async fn append_entry(
    transaction: &Transaction<'_>,
    run: &RunId,
    entry: &EncodedEntry,
    unstored: &[ChainLink],
) -> Result<Seq> {
    let blobs = entry_blobs(entry, unstored);
    let insert = prepare(transaction, "inserting a journal entry", &APPEND_IN_TRANSACTION).await?;
    // The three statements are pipelined: sent at once, run by the server in the order
    // sent, which `try_join!` keeps (it polls them in order, and each sends its request on
    // its first poll because its statement is prepared already). So the blobs and chain
    // nodes exist when the entry that references them is inserted.
    prepare(transaction, "storing payload blobs", &PUT_BLOBS).await?;
    prepare(transaction, "storing message chain nodes", &PUT_CHAIN).await?;
    let (blobs_stored, chain_stored) = (put_blobs(transaction, &blobs), put_chain(transaction, unstored));
    let values = EntryValues::of(run, entry);
    let inserted = async {
        transaction.query_opt(&insert, &values.params()).await.map_err(pg_error("inserting a journal entry"))
    };
    let ((), (), row) = tokio::try_join!(blobs_stored, chain_stored, inserted)?;
    let row = row.ok_or_else(|| Error::RunNotFound(run.clone()))?;
    count(&row, "seq", "a new journal entry")
}

/// `append_entry` as one statement, its own transaction: one round trip, committed (and
/// flushed) on return. For a lone write outside a cluster, where nothing else shares the
/// transaction.
pub(super) async fn append_entry_alone(
    client: &impl GenericClient,
    run: &RunId,
    entry: &EncodedEntry,
    unstored: &[ChainLink],
) -> Result<Seq> {
    let blobs = BlobColumns::of(&entry_blobs(entry, unstored));
    let chain = ChainColumns::of(unstored);
    let values = EntryValues::of(run, entry);
    let mut params: Vec<&(dyn ToSql + Sync)> = values.params().to_vec();
    params.extend_from_slice(&blobs.params());
    params.extend_from_slice(&chain.params());
    let row = query_opt(client, "inserting a journal entry", &APPEND_ALONE, &params).await?;
    let row = row.ok_or_else(|| Error::RunNotFound(run.clone()))?;
    count(&row, "seq", "a new journal entry")
}

/// The `UPDATE`s of a completion: the entry if it is still pending, then the run's totals,
/// from the entry's row (`done`); `$1`-`$12`, see `CompletionValues`.
const COMPLETE_ENTRY: &str = "UPDATE journal SET status = $3, result_blob = $4, error_blob = $5, \
     finished_at_ms = $6, input_tokens = $7, output_tokens = $8, llm_calls = $9, tool_calls = $10, \
     cost_micro_usd = $11 \
     WHERE run_id = $1 AND seq = $2 AND status = 'pending'";
const COMPLETE_RUN: &str = "UPDATE runs SET input_tokens = input_tokens + $7, output_tokens = output_tokens + $8, \
     llm_calls = llm_calls + $9, tool_calls = tool_calls + $10, \
     cost_micro_usd = cost_micro_usd + $11, provider_calls = provider_calls + $12 \
     FROM done WHERE runs.id = done.run_id RETURNING runs.id";

static COMPLETE_IN_TRANSACTION: LazyLock<String> =
    LazyLock::new(|| format!("WITH done AS ({COMPLETE_ENTRY} RETURNING run_id) {COMPLETE_RUN}"));

/// A completion alone: its blobs (`$13`-`$15`) stored in the same statement, only if the
/// entry is pending, and before the entry's row is locked.
static COMPLETE_ALONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH blobs_put AS ({} RETURNING 1), \
         done AS ({COMPLETE_ENTRY} AND (SELECT count(*) FROM blobs_put) >= 0 RETURNING run_id) \
         {COMPLETE_RUN}",
        Stored::Blobs.insert(
            13,
            "EXISTS (SELECT 1 FROM journal WHERE run_id = $1 AND seq = $2 AND status = 'pending')"
        )
    )
});

/// The values of a completion's `$1`-`$12`.
struct CompletionValues<'a> {
    run: &'a str,
    seq: i64,
    status: &'static str,
    result: Option<&'a str>,
    error: Option<&'a str>,
    finished: i64,
    usage: [i64; 5],
    served: i64,
}

impl<'a> CompletionValues<'a> {
    fn of(run: &'a RunId, seq: Seq, completion: &'a EncodedCompletion) -> CompletionValues<'a> {
        let usage = &completion.usage;
        CompletionValues {
            run: run.as_str(),
            seq: int(seq),
            status: completion.status.as_str(),
            result: completion.result.as_ref().map(|blob| blob.hash.as_str()),
            error: completion.error.as_ref().map(|blob| blob.hash.as_str()),
            finished: int(completion.finished_at_ms),
            usage: [
                int(usage.input_tokens),
                int(usage.output_tokens),
                int(usage.llm_calls),
                int(usage.tool_calls),
                int(usage.cost_micro_usd),
            ],
            served: i64::from(completion.provider_served),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 12] {
        let [u0, u1, u2, u3, u4] = &self.usage;
        [
            &self.run,
            &self.seq,
            &self.status,
            &self.result,
            &self.error,
            &self.finished,
            u0,
            u1,
            u2,
            u3,
            u4,
            &self.served,
        ]
    }
}

/// Completes a pending entry: one statement updates the entry only if it is still pending
/// (its row lock orders two completions of one entry: the second finds it done) and adds
/// its usage to the run's totals. When nothing matched, reads say why.
pub(super) async fn complete_entry(
    transaction: &Transaction<'_>,
    run: &RunId,
    seq: Seq,
    completion: &EncodedCompletion,
) -> Result<()> {
    let blobs = completion_blobs(run, seq, completion)?;
    let update = prepare(transaction, "completing a journal entry", &COMPLETE_IN_TRANSACTION).await?;
    // Pipelined like `append_entry`'s statements: blobs first.
    prepare(transaction, "storing payload blobs", &PUT_BLOBS).await?;
    let values = CompletionValues::of(run, seq, completion);
    let updated = async {
        transaction.query_opt(&update, &values.params()).await.map_err(pg_error("completing a journal entry"))
    };
    let ((), row) = tokio::try_join!(put_blobs(transaction, &blobs), updated)?;
    if row.is_some() {
        return Ok(());
    }
    why_not_completed(transaction, run, seq).await
}

/// `complete_entry` as one statement, its own transaction: one round trip, committed (and
/// flushed) on return (see `append_entry_alone`).
pub(super) async fn complete_entry_alone(
    client: &impl GenericClient,
    run: &RunId,
    seq: Seq,
    completion: &EncodedCompletion,
) -> Result<()> {
    let blobs = BlobColumns::of(&completion_blobs(run, seq, completion)?);
    let values = CompletionValues::of(run, seq, completion);
    let mut params: Vec<&(dyn ToSql + Sync)> = values.params().to_vec();
    params.extend_from_slice(&blobs.params());
    if query_opt(client, "completing a journal entry", &COMPLETE_ALONE, &params).await?.is_some() {
        return Ok(());
    }
    why_not_completed(client, run, seq).await
}

/// The blobs a completion stores (its result or error); refuses one that is not final.
fn completion_blobs<'a>(run: &RunId, seq: Seq, completion: &'a EncodedCompletion) -> Result<Vec<&'a Blob>> {
    if !matches!(completion.status, EntryStatus::Ok | EntryStatus::Error) {
        return Err(Error::completion_not_final(run, seq, completion.status));
    }
    Ok(completion.result.iter().chain(&completion.error).collect())
}

/// Why a completion matched no pending entry: no such run, no such entry, or an entry
/// already complete.
async fn why_not_completed(client: &impl GenericClient, run: &RunId, seq: Seq) -> Result<()> {
    queries::require_run(client, run).await?;
    let status = query_opt(
        client,
        "reading the status of a journal entry",
        "SELECT status FROM journal WHERE run_id = $1 AND seq = $2",
        &[&run.as_str(), &int(seq)],
    )
    .await?;
    match status {
        None => Err(Error::EntryNotFound { run: run.clone(), seq }),
        Some(row) => {
            let status: String =
                queries::column(&row, "status", &format!("journal entry {seq} of run {run}"))?;
            Err(Error::entry_not_pending(run, seq, &status))
        }
    }
}

/// Marks entries abandoned, all or nothing: one `UPDATE` (locking the journal rows only, as
/// a completion locks its row before the run's, so the two never wait on each other in a
/// cycle); an unknown seq fails the transaction, which the caller then drops.
pub(super) async fn abandon_entries(transaction: &Transaction<'_>, run: &RunId, seqs: &[Seq]) -> Result<()> {
    let wanted: Vec<i64> = seqs.iter().copied().map(int).collect();
    let marked = query_rows(
        transaction,
        "marking journal entries abandoned",
        "UPDATE journal SET status = 'abandoned' WHERE run_id = $1 AND seq = ANY($2) RETURNING seq",
        &[&run.as_str(), &wanted],
    )
    .await?;
    let marked: HashSet<i64> = marked.iter().map(|row| row.get::<_, i64>(0)).collect();
    let missing = seqs.iter().find(|&&seq| !marked.contains(&int(seq)));
    if missing.is_some() || seqs.is_empty() {
        queries::require_run(transaction, run).await?;
    }
    match missing {
        Some(&seq) => Err(Error::EntryNotFound { run: run.clone(), seq }),
        None => Ok(()),
    }
}

/// Appends events in order, in one statement: bumping the run's row of `event_heads`
/// (created at its first append) hands out the seqs and orders concurrent appends. The
/// run's own row is not locked, so events do not wait behind its journal writes.
/// Committed without waiting for the flush (`Store::append_events`): the statement sets
/// `synchronous_commit` off for its transaction, whether that is the caller's or, outside
/// one, the statement's own, so a lone append is one round trip.
pub(super) async fn append_events(
    client: &impl GenericClient,
    run: &RunId,
    events: &[NewEvent],
) -> Result<Seq> {
    let added = int(events.len() as u64);
    let ts: Vec<i64> = events.iter().map(|event| int(event.ts_ms)).collect();
    let kinds: Vec<&str> = events.iter().map(|event| event.kind.as_str()).collect();
    let data: Vec<String> = events.iter().map(|event| event.data.to_string()).collect();
    let row = query_opt(
        client,
        "appending events",
        "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true)), \
         head AS ( \
             INSERT INTO event_heads AS h (run_id, events_last) \
             SELECT $1, $2 FROM unflushed WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1) \
             ON CONFLICT (run_id) DO UPDATE SET events_last = h.events_last + $2 RETURNING events_last), \
         added AS (INSERT INTO events (run_id, seq, ts_ms, kind, data) \
             SELECT $1, head.events_last - $2 + e.ord, e.ts_ms, e.kind, e.data \
             FROM head, unnest($3::bigint[], $4::text[], $5::text[]) WITH ORDINALITY AS e (ts_ms, kind, data, ord)) \
         SELECT events_last FROM head",
        &[&run.as_str(), &added, &ts, &kinds, &data],
    )
    .await?;
    let row = row.ok_or_else(|| Error::RunNotFound(run.clone()))?;
    count(&row, "events_last", &format!("the event log of run {run}"))
}

/// Writes or overwrites a kv value. Without `flush`, committed without waiting for the
/// flush, still in one statement (one round trip): `set_config(..., true)` is `SET LOCAL`,
/// and the statement is its own transaction, whose commit reads the setting.
pub(super) async fn kv_put(
    client: &impl GenericClient,
    scope: &str,
    key: &str,
    value: &str,
    flush: bool,
) -> Result<()> {
    let sql = if flush {
        "INSERT INTO kv (scope, key, value) VALUES ($1, $2, $3) \
         ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value"
    } else {
        "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true)) \
         INSERT INTO kv (scope, key, value) SELECT $1, $2, $3 FROM unflushed \
         ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value"
    };
    execute(client, "writing a kv value", sql, &[&scope, &key, &value]).await?;
    Ok(())
}

/// Appends to a thread under a transaction advisory lock of the thread (tenant and thread
/// hashed: a collision only makes two threads wait for each other), since a thread has no
/// row to lock until its first message: the next index and the idempotency key are read
/// under it.
pub(super) async fn thread_append(
    transaction: &Transaction<'_>,
    tenant: &str,
    thread: &str,
    message: &Blob,
    idempotency_key: Option<&str>,
    appended_at_ms: u64,
) -> Result<u64> {
    execute(
        transaction,
        "locking a thread",
        "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))",
        &[&tenant, &thread],
    )
    .await?;
    let place = format!("thread {thread:?} of tenant {tenant:?}");
    if let Some(key) = idempotency_key {
        let earlier = query_opt(
            transaction,
            "looking up an idempotency key",
            "SELECT idx FROM thread_messages WHERE tenant = $1 AND thread = $2 AND idempotency_key = $3",
            &[&tenant, &thread, &key],
        )
        .await?;
        if let Some(row) = earlier {
            return count(&row, "idx", &place);
        }
    }
    let next = query_opt(
        transaction,
        "finding the end of a thread",
        "SELECT COALESCE(MAX(idx) + 1, 0) AS next FROM thread_messages WHERE tenant = $1 AND thread = $2",
        &[&tenant, &thread],
    )
    .await?
    .map_or(Ok(0), |row| count(&row, "next", &place))?;
    put_blobs(transaction, &[message]).await?;
    execute(
        transaction,
        "appending a thread message",
        "INSERT INTO thread_messages (tenant, thread, idx, message_blob, idempotency_key, appended_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[&tenant, &thread, &int(next), &message.hash, &idempotency_key, &int(appended_at_ms)],
    )
    .await?;
    Ok(next)
}

/// Writes a record and its embedding (or removes a stale one) in one statement.
pub(super) async fn mem_put(client: &impl GenericClient, record: &MemoryPut<'_>) -> Result<()> {
    const UPSERT: &str = "WITH record AS ( \
         INSERT INTO memory (tenant, namespace, key, value, text, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, namespace, key) DO UPDATE SET \
         value = excluded.value, text = excluded.text, updated_at_ms = excluded.updated_at_ms \
         RETURNING id)";
    let MemoryPut { tenant, namespace, key, value, text, embedding, updated_at_ms } = record;
    let updated_at_ms = int(*updated_at_ms);
    match embedding {
        Some(embedding) => {
            let dims = i32::try_from(embedding.vector.len()).unwrap_or(i32::MAX);
            execute(
                client,
                "writing a memory record and its embedding",
                &format!(
                    "{UPSERT} INSERT INTO memory_embeddings (memory_id, model, dims, vector) \
                     SELECT id, $7, $8, $9 FROM record ON CONFLICT (memory_id) DO UPDATE SET \
                     model = excluded.model, dims = excluded.dims, vector = excluded.vector"
                ),
                &[
                    tenant,
                    namespace,
                    key,
                    value,
                    text,
                    &updated_at_ms,
                    &embedding.model,
                    &dims,
                    &search::vector_to_bytes(&embedding.vector),
                ],
            )
            .await?;
        }
        None => {
            execute(
                client,
                "writing a memory record",
                &format!("{UPSERT} DELETE FROM memory_embeddings USING record WHERE memory_id = record.id"),
                &[tenant, namespace, key, value, text, &updated_at_ms],
            )
            .await?;
        }
    }
    Ok(())
}

/// Deletes a record; with an idempotency key, under an advisory lock of (tenant, key), so
/// a retry racing the first attempt waits for it and then answers what it answered.
pub(super) async fn mem_delete(
    transaction: &Transaction<'_>,
    tenant: &str,
    namespace: &str,
    key: &str,
    idempotency_key: Option<&str>,
) -> Result<bool> {
    if let Some(idempotency_key) = idempotency_key {
        execute(
            transaction,
            "locking a delete's idempotency key",
            "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))",
            &[&tenant, &idempotency_key],
        )
        .await?;
        let earlier = query_opt(
            transaction,
            "looking up an idempotency key",
            "SELECT deleted FROM memory_deletes WHERE tenant = $1 AND idempotency_key = $2",
            &[&tenant, &idempotency_key],
        )
        .await?;
        if let Some(row) = earlier {
            return queries::column(&row, "deleted", "an earlier delete");
        }
    }
    let deleted = execute(
        transaction,
        "deleting a memory record",
        "DELETE FROM memory WHERE tenant = $1 AND namespace = $2 AND key = $3",
        &[&tenant, &namespace, &key],
    )
    .await?
        > 0;
    if let Some(idempotency_key) = idempotency_key {
        execute(
            transaction,
            "remembering a delete",
            "INSERT INTO memory_deletes (tenant, idempotency_key, deleted) VALUES ($1, $2, $3)",
            &[&tenant, &idempotency_key, &deleted],
        )
        .await?;
    }
    Ok(deleted)
}

/// Locks the run's row for the rest of the transaction and returns its tenant;
/// `RunNotFound` when there is none. `FOR NO KEY UPDATE`, the lock an `UPDATE` of the row
/// takes: it orders this transaction with every other write to the run, but not with the
/// foreign-key checks of rows that reference the run (an event appended meanwhile).
async fn lock_run(transaction: &Transaction<'_>, run: &RunId) -> Result<String> {
    let row = query_opt(
        transaction,
        "locking a run",
        "SELECT tenant FROM runs WHERE id = $1 FOR NO KEY UPDATE",
        &[&run.as_str()],
    )
    .await?
    .ok_or_else(|| Error::RunNotFound(run.clone()))?;
    queries::column(&row, "tenant", &format!("run {run}"))
}

/// Locks the rows of `runs` (missing ones are skipped) in id order, the order every
/// transaction locking more than one run takes them in; returns each locked run's tenant.
pub(super) async fn lock_runs(
    transaction: &Transaction<'_>,
    runs: &[&RunId],
) -> Result<HashMap<String, String>> {
    let ids: Vec<&str> = runs.iter().map(|run| run.as_str()).collect();
    let rows = transaction
        .query("SELECT id, tenant FROM runs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE", &[&ids])
        .await
        .map_err(pg_error("locking runs"))?;
    rows.iter()
        .map(|row| {
            Ok((queries::column(row, "id", "a locked run")?, queries::column(row, "tenant", "a locked run")?))
        })
        .collect()
}

/// Sends under the target run's row lock, so the capacity check, the seq and the insert
/// see every other send and receive of that mailbox.
pub(super) async fn mailbox_send(
    transaction: &Transaction<'_>,
    to: &RunId,
    message: &NewMessage,
    text: &str,
) -> Result<Seq> {
    let owner = lock_run(transaction, to).await.map(Some).or_else(|error| match error {
        Error::RunNotFound(_) => Ok(None),
        other => Err(other),
    })?;
    mailbox_send_locked(transaction, to, owner.as_deref(), message, text).await
}

/// `mailbox_send` to a run whose row the transaction has locked already (`owner`: its
/// tenant, `None` if it does not exist).
pub(super) async fn mailbox_send_locked(
    transaction: &Transaction<'_>,
    to: &RunId,
    owner: Option<&str>,
    message: &NewMessage,
    text: &str,
) -> Result<Seq> {
    mailbox::check_owner(to, owner, &message.tenant)?;
    deliver(transaction, to, message, text).await
}

/// Puts a message in a mailbox whose run row the transaction holds locked: the seq of an
/// earlier delivery under the same key, else `MailboxFull` or the new seq.
async fn deliver(transaction: &Transaction<'_>, to: &RunId, message: &NewMessage, text: &str) -> Result<Seq> {
    let place = format!("the mailbox of run {to}");
    if let Some(key) = &message.idempotency_key {
        let earlier = query_opt(
            transaction,
            "looking up a send's idempotency key",
            "SELECT seq FROM mailbox WHERE run_id = $1 AND send_key = $2",
            &[&to.as_str(), key],
        )
        .await?;
        if let Some(row) = earlier {
            return count(&row, "seq", &place);
        }
    }
    // One statement: the room check and the next seq read two indexes (the undelivered
    // rows' partial index, the mailbox's last entry), not every message the run ever
    // received, and no row comes back when the mailbox is full. The run's row lock orders
    // it with every other send and receive of this mailbox.
    let row = query_opt(
        transaction,
        "putting a message in a mailbox",
        "INSERT INTO mailbox (run_id, seq, from_run, message, correlation_id, topic, send_key, sent_at_ms) \
         SELECT $1, state.last + 1, $3, $4, $5, $6, $7, $8 FROM ( \
             SELECT (SELECT COUNT(*) FROM mailbox WHERE run_id = $1 AND receive_key IS NULL) AS undelivered, \
             (SELECT COALESCE(MAX(seq), 0) FROM mailbox WHERE run_id = $1) AS last) AS state \
         WHERE state.undelivered < $2 RETURNING seq",
        &[
            &to.as_str(),
            &int(message.capacity),
            &message.from.as_ref().map(RunId::as_str),
            &text,
            &message.correlation_id,
            &message.topic,
            &message.idempotency_key,
            &int(message.sent_at_ms),
        ],
    )
    .await?;
    match row {
        Some(row) => count(&row, "seq", &place),
        None => Err(Error::MailboxFull { run: to.clone(), capacity: message.capacity }),
    }
}

pub(super) async fn topic_subscribe(
    transaction: &Transaction<'_>,
    tenant: &str,
    topic: &str,
    run: &RunId,
    subscribe: bool,
) -> Result<()> {
    let owner = queries::run_tenant(transaction, run).await?;
    mailbox::check_owner(run, owner.as_deref(), tenant)?;
    let sql = if subscribe {
        "INSERT INTO subscriptions (tenant, topic, run_id) VALUES ($1, $2, $3) \
         ON CONFLICT (tenant, topic, run_id) DO NOTHING"
    } else {
        "DELETE FROM subscriptions WHERE tenant = $1 AND topic = $2 AND run_id = $3"
    };
    execute(transaction, "changing a topic subscription", sql, &[&tenant, &topic, &run.as_str()]).await?;
    Ok(())
}

/// Delivers to every live subscriber, locking their runs in id order (the order every
/// publish takes them in, so two publishes never wait on each other in a cycle); a full
/// mailbox fails the whole transaction.
pub(super) async fn topic_publish(
    transaction: &Transaction<'_>,
    topic: &str,
    message: &NewMessage,
    text: &str,
) -> Result<Vec<(RunId, Seq)>> {
    let ended: Vec<&str> =
        [RunState::Succeeded, RunState::Failed, RunState::Cancelled].map(RunState::as_str).to_vec();
    let rows = query_rows(
        transaction,
        "listing a topic's subscribers",
        "SELECT s.run_id FROM subscriptions s JOIN runs r ON r.id = s.run_id \
         WHERE s.tenant = $1 AND s.topic = $2 AND r.state <> ALL($3) ORDER BY s.run_id",
        &[&message.tenant, &topic, &ended],
    )
    .await?;
    let message = NewMessage { topic: Some(topic.to_owned()), ..message.clone() };
    let mut delivered = Vec::with_capacity(rows.len());
    for row in rows {
        let text_id: String = queries::column(&row, "run_id", &format!("a subscriber of topic {topic:?}"))?;
        let run = RunId::parse(&text_id)
            .map_err(|error| Error::Corrupt(format!("a subscriber of topic {topic:?}: {error}")))?;
        lock_run(transaction, &run).await?;
        let seq = deliver(transaction, &run, &message, text).await?;
        delivered.push((run, seq));
    }
    Ok(delivered)
}

/// The second half of a send to a waiting receiver (`MailboxOp::Send`'s `receive`): run
/// `to` takes its oldest message and its `receive` entry is appended, complete, recording
/// it. Finding nothing to take is a plain send.
pub(super) async fn take_for_receiver(
    transaction: &Transaction<'_>,
    to: &RunId,
    seq: Seq,
    mut receive: EncodedEntry,
    unstored: &[ChainLink],
    result_of: MailboxResult,
) -> Result<MailboxDone> {
    let Some(message) = mailbox_receive(transaction, to, None).await? else {
        return Ok(MailboxDone::Sent(seq));
    };
    receive.result = Some(Blob::of(&result_of(&MailboxDone::Received(vec![message.clone()]))));
    let receive_seq = append_entry(transaction, to, &receive, unstored).await?;
    Ok(MailboxDone::SentAndTaken { seq, receive_seq, message })
}

/// Takes the oldest undelivered message under the run's row lock, so two receives never
/// take the same one.
pub(super) async fn mailbox_receive(
    transaction: &Transaction<'_>,
    run: &RunId,
    key: Option<&str>,
) -> Result<Option<MailboxMessage>> {
    lock_run(transaction, run).await?;
    if let Some(key) = key {
        let earlier = query_opt(
            transaction,
            "reading a mailbox message",
            &format!(
                "SELECT {} FROM mailbox WHERE run_id = $1 AND receive_key = $2",
                queries::MAILBOX_COLUMNS
            ),
            &[&run.as_str(), &key],
        )
        .await?;
        if let Some(row) = earlier {
            return queries::decode_message(&row, run).map(Some);
        }
    }
    let oldest = query_opt(
        transaction,
        "reading a mailbox message",
        &format!(
            "SELECT {} FROM mailbox WHERE run_id = $1 AND receive_key IS NULL ORDER BY seq LIMIT 1",
            queries::MAILBOX_COLUMNS
        ),
        &[&run.as_str()],
    )
    .await?;
    let Some(row) = oldest else {
        return Ok(None);
    };
    let message = queries::decode_message(&row, run)?;
    let marker = key.map_or_else(|| mailbox::delivered_marker(message.seq), str::to_owned);
    execute(
        transaction,
        "marking a mailbox message delivered",
        "UPDATE mailbox SET receive_key = $3 WHERE run_id = $1 AND seq = $2",
        &[&run.as_str(), &int(message.seq), &marker],
    )
    .await?;
    Ok(Some(message))
}

/// Takes up to `max` of the oldest undelivered messages under the run's row lock (as
/// many as `mailbox::fit_batch` keeps), so two receives never take the same one.
pub(super) async fn mailbox_receive_many(
    transaction: &Transaction<'_>,
    run: &RunId,
    max: usize,
) -> Result<Vec<MailboxMessage>> {
    if max <= 1 {
        return Ok(mailbox_receive(transaction, run, None).await?.into_iter().collect());
    }
    lock_run(transaction, run).await?;
    let rows = query_rows(
        transaction,
        "reading mailbox messages",
        &format!(
            "SELECT {} FROM mailbox WHERE run_id = $1 AND receive_key IS NULL ORDER BY seq LIMIT $2",
            queries::MAILBOX_COLUMNS
        ),
        &[&run.as_str(), &int(max as u64)],
    )
    .await?;
    let mut taken = rows.iter().map(|row| queries::decode_message(row, run)).collect::<Result<Vec<_>>>()?;
    mailbox::fit_batch(&mut taken, max);
    let seqs: Vec<i64> = taken.iter().map(|m| int(m.seq)).collect();
    let markers: Vec<String> = taken.iter().map(|m| mailbox::delivered_marker(m.seq)).collect();
    execute(
        transaction,
        "marking mailbox messages delivered",
        "UPDATE mailbox m SET receive_key = u.key FROM unnest($2::bigint[], $3::text[]) AS u(seq, key) \
         WHERE m.run_id = $1 AND m.seq = u.seq",
        &[&run.as_str(), &seqs, &markers],
    )
    .await?;
    Ok(taken)
}

/// The last nodes of message chains this store committed, so that an append re-sending a
/// conversation finds where its stored prefix ends without asking the database: a stored
/// node implies its whole prefix is stored (nodes are written prefix first and never
/// deleted), so the end of each committed chain is all it needs to remember. Bounded: when
/// full it starts over, and a miss only costs one lookup.
#[derive(Debug, Default)]
pub(super) struct ChainEnds {
    ends: Mutex<HashSet<String>>,
}

impl ChainEnds {
    /// How many chain ends are remembered before starting over (about 100 bytes each).
    const CAPACITY: usize = 16_384;

    /// Chains of at most this many nodes whose stored prefix is unknown are written whole
    /// (a conflict is nothing to do) rather than looked up first: a lookup is a round trip,
    /// and a few short messages cost less than one.
    const WRITE_BLIND: usize = 4;

    /// The links of `links` not stored yet, or a superset of them: the suffix after the
    /// last remembered node; when none is remembered, short chains whole and long ones
    /// after what one query finds stored (`chain::unstored_links` either way).
    pub(super) async fn unstored<'a>(
        &self,
        client: &impl GenericClient,
        links: &'a [ChainLink],
    ) -> Result<&'a [ChainLink]> {
        let remembered = {
            let ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
            chain::unstored_links(links, |link| Ok(ends.contains(&link.hash)))?
        };
        if remembered.len() < links.len() || links.len() <= Self::WRITE_BLIND {
            return Ok(remembered);
        }
        let hashes: Vec<&str> = links.iter().map(|link| link.hash.as_str()).collect();
        let rows = query_rows(
            client,
            "looking up message chain nodes",
            "SELECT hash FROM message_chain WHERE hash = ANY($1)",
            &[&hashes],
        )
        .await?;
        let stored: HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        chain::unstored_links(links, |link| Ok(stored.contains(&link.hash)))
    }

    /// Remembers that the chain ending at `links`' last node is stored (call once its
    /// transaction committed).
    pub(super) fn committed(&self, links: &[ChainLink]) {
        let Some(last) = links.last() else {
            return;
        };
        let mut ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
        if ends.len() >= Self::CAPACITY {
            ends.clear();
        }
        ends.insert(last.hash.clone());
    }
}

/// Inserts message chain nodes given as arrays (hash, prev, message blob), in hash order.
static PUT_CHAIN: LazyLock<String> = LazyLock::new(|| Stored::ChainNodes.insert(1, "TRUE"));

/// Inserts blobs given as arrays (hash, size, bytes), in hash order.
static PUT_BLOBS: LazyLock<String> = LazyLock::new(|| Stored::Blobs.insert(1, "TRUE"));

/// Stores message chain nodes (their message blobs are in the same transaction's
/// `put_blobs`). Content-addressed: a node another transaction stores at the same time is
/// the same node, so a conflict is nothing to do.
pub(super) async fn put_chain(transaction: &Transaction<'_>, links: &[ChainLink]) -> Result<()> {
    if links.is_empty() {
        return Ok(());
    }
    let columns = ChainColumns::of(links);
    execute(transaction, "storing message chain nodes", &PUT_CHAIN, &columns.params()).await?;
    Ok(())
}

/// Chain nodes as `PUT_CHAIN`'s arrays: hash, previous node, message blob.
struct ChainColumns<'a> {
    hashes: Vec<&'a str>,
    prevs: Vec<Option<&'a str>>,
    messages: Vec<&'a str>,
}

impl<'a> ChainColumns<'a> {
    fn of(links: &'a [ChainLink]) -> ChainColumns<'a> {
        ChainColumns {
            hashes: links.iter().map(|link| link.hash.as_str()).collect(),
            prevs: links.iter().map(|link| link.prev.as_deref()).collect(),
            messages: links.iter().map(|link| link.message.hash.as_str()).collect(),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 3] {
        [&self.hashes, &self.prevs, &self.messages]
    }
}

/// Blobs as `PUT_BLOBS`' arrays: hash, size, bytes.
struct BlobColumns<'a> {
    hashes: Vec<&'a str>,
    sizes: Vec<i64>,
    bytes: Vec<&'a [u8]>,
}

impl<'a> BlobColumns<'a> {
    fn of(blobs: &[&'a Blob]) -> BlobColumns<'a> {
        BlobColumns {
            hashes: blobs.iter().map(|blob| blob.hash.as_str()).collect(),
            sizes: blobs.iter().map(|blob| int(blob.bytes.len() as u64)).collect(),
            bytes: blobs.iter().map(|blob| blob.bytes.as_slice()).collect(),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 3] {
        [&self.hashes, &self.sizes, &self.bytes]
    }
}

/// Stores payloads once each, in one statement (`PUT_BLOBS`).
pub(super) async fn put_blobs(client: &impl GenericClient, blobs: &[&Blob]) -> Result<()> {
    if blobs.is_empty() {
        return Ok(());
    }
    let columns = BlobColumns::of(blobs);
    execute(client, "storing payload blobs", &PUT_BLOBS, &columns.params()).await?;
    Ok(())
}
