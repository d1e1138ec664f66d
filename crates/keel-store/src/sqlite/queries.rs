//! Reading the SQLite schema back into Store records: the read queries (used by the read
//! pool and, for runs, by the writer) and the row decoders that turn bad stored data into
//! `Error::Corrupt` naming what and where.

use std::str::FromStr;

use keel_types::{RunId, Usage};
use rusqlite::types::FromSql;
use rusqlite::{Connection, Params, Row, params, params_from_iter};
use serde_json::Value;

use super::writer::sql_error;
use crate::chain::{ChainCache, ChainNode};
use crate::search::{self, BestHits, CosineQuery};
use crate::{
    CostBucket, CostFilter, Error, EventRecord, JournalEntry, MailboxMessage, MemoryHit, MemoryRecord,
    MemorySearch, Result, RunCount, RunFilter, RunOrder, RunRecord, SearchMode, Seq, SpecJson, StoreStats,
    ThreadMessage,
};

/// The columns `decode_run` reads, in `SELECT` form.
pub(super) const RUN_COLUMNS: &str = "id, tenant, spec, state, wait_reason, created_at_ms, updated_at_ms, \
     ended_at_ms, attempt, pid, exit_code, output, error, input_tokens, output_tokens, \
     llm_calls, tool_calls, cost_micro_usd, provider_calls";

/// A journal row joined with its three payloads (inline, or the blob each names);
/// `decode_entry` reads these names.
const ENTRY_SELECT: &str = "SELECT j.seq AS seq, j.method AS method, j.params_hash AS params_hash, \
     j.status AS status, j.attempt AS attempt, j.started_at_ms AS started_at_ms, \
     j.finished_at_ms AS finished_at_ms, j.input_tokens AS input_tokens, \
     j.output_tokens AS output_tokens, j.llm_calls AS llm_calls, j.tool_calls AS tool_calls, \
     j.cost_micro_usd AS cost_micro_usd, \
     j.params_blob AS params_blob, p.bytes AS params_bytes, j.params_inline AS params_inline, \
     j.result_blob AS result_blob, r.bytes AS result_bytes, j.result_inline AS result_inline, \
     j.error_blob AS error_blob, e.bytes AS error_bytes, j.error_inline AS error_inline \
     FROM journal j \
     LEFT JOIN blobs p ON p.hash = j.params_blob \
     LEFT JOIN blobs r ON r.hash = j.result_blob \
     LEFT JOIN blobs e ON e.hash = j.error_blob";

pub(super) fn load_run(connection: &Connection, id: &RunId) -> Result<Option<RunRecord>> {
    query_first(
        connection,
        "reading a run",
        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
        params![id.as_str()],
        decode_run,
    )
}

pub(super) fn list_runs(connection: &Connection, filter: &RunFilter) -> Result<Vec<RunRecord>> {
    let mut conditions = Vec::new();
    let mut values: Vec<String> = Vec::new();
    if !filter.states.is_empty() {
        let placeholders = vec!["?"; filter.states.len()].join(", ");
        conditions.push(format!("state IN ({placeholders})"));
        values.extend(filter.states.iter().map(|state| state.as_str().to_owned()));
    }
    if let Some(tenant) = &filter.tenant {
        conditions.push("tenant = ?".to_owned());
        values.push(tenant.clone());
    }
    if let Some(text) = filter.text.as_deref().filter(|text| !text.is_empty()) {
        // `instr`, not LIKE: the text is matched as typed, `%` and `_` included.
        conditions.push(
            "instr(lower(id || ' ' || tenant || ' ' || COALESCE(json_extract(spec, '$.command'), '')), \
             lower(?)) > 0"
                .to_owned(),
        );
        values.push(text.to_owned());
    }
    let matching =
        if conditions.is_empty() { String::new() } else { format!("WHERE {}", conditions.join(" AND ")) };
    // SQLite reads a negative LIMIT as "no limit".
    let limit = match filter.limit {
        Some(limit) => i64::try_from(limit).unwrap_or(i64::MAX),
        None => -1,
    };
    let offset = i64::try_from(filter.offset).unwrap_or(i64::MAX);
    let order = filter.order.order_by();
    if !matches!(filter.order, RunOrder::CostliestFirst | RunOrder::CheapestFirst) {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs {matching} ORDER BY {order} LIMIT {limit} OFFSET {offset}"
        );
        return query_all(connection, "listing runs", &sql, params_from_iter(values.iter()), decode_run);
    }
    // Only ended runs are indexed by cost (`ended_runs_by_cost`, `ended_runs_by_tenant_cost`):
    // a live run's cost changes with every paid call, and keeping it in an index cost each
    // of those commits two pages. So the ended runs come in cost order from the index, the
    // live ones (`live_runs`) are sorted here, and the two meet in one order. Each side
    // gives at most the rows the page could need from it. The indexes are named, so that
    // a state filter never makes SQLite read every ended run of that state for the live
    // side.
    let each = if limit < 0 { -1 } else { limit.saturating_add(offset) };
    let and = if conditions.is_empty() { String::new() } else { format!("AND {}", conditions.join(" AND ")) };
    let ended = if filter.tenant.is_some() { "ended_runs_by_tenant_cost" } else { "ended_runs_by_cost" };
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM \
         (SELECT {RUN_COLUMNS} FROM runs INDEXED BY {ended} WHERE ended_at_ms IS NOT NULL {and} \
          ORDER BY {order} LIMIT {each}) \
         UNION ALL SELECT {RUN_COLUMNS} FROM \
         (SELECT {RUN_COLUMNS} FROM runs INDEXED BY live_runs WHERE ended_at_ms IS NULL {and} \
          ORDER BY {order} LIMIT {each}) \
         ORDER BY {order} LIMIT {limit} OFFSET {offset}"
    );
    let both = values.iter().chain(values.iter());
    query_all(connection, "listing runs by cost", &sql, params_from_iter(both), decode_run)
}

/// See `Store::runs_ended_after`; `runs_by_end` serves it.
pub(super) fn runs_ended_after(
    connection: &Connection,
    tenant: &str,
    after_ms: u64,
    after_id: Option<&RunId>,
    limit: usize,
) -> Result<Vec<RunRecord>> {
    query_all(
        connection,
        "listing runs that ended",
        &format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND ended_at_ms IS NOT NULL \
             AND ended_at_ms >= ?2 AND (ended_at_ms > ?2 OR (?3 IS NOT NULL AND id > ?3)) \
             ORDER BY ended_at_ms, id LIMIT ?4"
        ),
        params![
            tenant,
            seq_param(after_ms),
            after_id.map(RunId::as_str),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        decode_run,
    )
}

/// The usage of completed `llm.chat` entries per (time bucket, tenant, model); see
/// `Store::cost_summary`. The model is read from the entry's result (the kernel's
/// `response.model`, or a top-level `model`), else its params.
pub(super) fn cost_summary(connection: &Connection, filter: &CostFilter) -> Result<Vec<CostBucket>> {
    let bucket = i64::try_from(filter.bucket_ms.max(1)).unwrap_or(i64::MAX);
    let since = i64::try_from(filter.since_ms).unwrap_or(i64::MAX);
    let sql = "SELECT (j.started_at_ms / ?1) * ?1 AS bucket_start_ms, r.tenant AS tenant, \
         COALESCE(json_extract(CAST(COALESCE(j.result_inline, res.bytes) AS TEXT), '$.response.model'), \
                  json_extract(CAST(COALESCE(j.result_inline, res.bytes) AS TEXT), '$.model'), \
                  json_extract(CAST(COALESCE(j.params_inline, par.bytes) AS TEXT), '$.model'), \
                  'unknown') AS model, \
         COUNT(*) AS calls, SUM(j.input_tokens) AS input_tokens, \
         SUM(j.output_tokens) AS output_tokens, SUM(j.cost_micro_usd) AS cost_micro_usd \
         FROM journal j INDEXED BY llm_calls_by_time \
         JOIN runs r ON r.id = j.run_id \
         LEFT JOIN blobs par ON par.hash = j.params_blob \
         LEFT JOIN blobs res ON res.hash = j.result_blob \
         WHERE j.method = 'llm.chat' AND j.status = 'ok' AND j.started_at_ms >= ?2 \
           AND (?3 IS NULL OR r.tenant = ?3) \
         GROUP BY bucket_start_ms, r.tenant, model ORDER BY bucket_start_ms, r.tenant, model";
    query_all(connection, "summing costs", sql, params![bucket, since, filter.tenant.as_deref()], |row| {
        let place = "a cost bucket";
        let number = |name: &str| -> Result<u64> {
            let value: i64 = column(row, name, place)?;
            Ok(u64::try_from(value).unwrap_or(0))
        };
        Ok(CostBucket {
            bucket_start_ms: number("bucket_start_ms")?,
            tenant: column(row, "tenant", place)?,
            model: column(row, "model", place)?,
            calls: number("calls")?,
            input_tokens: number("input_tokens")?,
            output_tokens: number("output_tokens")?,
            cost_micro_usd: number("cost_micro_usd")?,
        })
    })
}

/// Runs per tenant, state, wait reason and presence of a process, in one grouped read.
pub(super) fn count_runs(connection: &Connection) -> Result<Vec<RunCount>> {
    query_all(
        connection,
        "counting runs",
        "SELECT tenant, state, wait_reason, pid IS NOT NULL AS has_pid, COUNT(*) AS runs \
         FROM runs GROUP BY tenant, state, wait_reason, pid IS NOT NULL",
        [],
        |row| {
            let place = "the run counts";
            Ok(RunCount {
                tenant: column(row, "tenant", place)?,
                state: parsed_column(row, "state", place)?,
                wait_reason: optional_parsed_column(row, "wait_reason", place)?,
                has_pid: column(row, "has_pid", place)?,
                count: column(row, "runs", place)?,
            })
        },
    )
}

/// Whether the run exists; per-run reads and writes fail with `RunNotFound` otherwise.
pub(super) fn require_run(connection: &Connection, run: &RunId) -> Result<()> {
    let found = query_first(
        connection,
        "looking up a run",
        "SELECT 1 FROM runs WHERE id = ?1",
        params![run.as_str()],
        |_| Ok(()),
    )?;
    found.ok_or_else(|| Error::RunNotFound(run.clone()))
}

pub(super) fn journal(connection: &Connection, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>> {
    journal_page(connection, run, after, None)
}

/// The statement of `journal_page`: a run's entries after a seq, at most a limit.
pub(super) fn journal_page_sql() -> String {
    format!("{ENTRY_SELECT} WHERE j.run_id = ?1 AND j.seq > ?2 ORDER BY j.seq LIMIT ?3")
}

/// Up to `limit` entries (all when `None`) with seq greater than `after`, in seq order.
pub(super) fn journal_page(
    connection: &Connection,
    run: &RunId,
    after: Seq,
    limit: Option<usize>,
) -> Result<Vec<JournalEntry>> {
    require_run(connection, run)?;
    // SQLite reads a negative LIMIT as "no limit".
    let limit = limit.map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let mut entries = query_all(
        connection,
        "reading a journal",
        &journal_page_sql(),
        params![run.as_str(), seq_param(after), limit],
        |row| decode_entry(row, run),
    )?;
    let mut chain = ChainCache::default();
    for entry in &mut entries {
        join_params(connection, &mut chain, entry, run)?;
    }
    Ok(entries)
}

/// Gives params stored split (see `chain`) their `messages` back from `message_chain`.
fn join_params(
    connection: &Connection,
    cache: &mut ChainCache,
    entry: &mut JournalEntry,
    run: &RunId,
) -> Result<()> {
    let seq = entry.seq;
    cache.join_params(
        &mut entry.params,
        || format!("params of journal entry {seq} of run {run}"),
        |hash, place| {
            query_first(
                connection,
                "reading a message chain node",
                "SELECT c.prev AS prev, c.message_blob AS message_blob, b.bytes AS message_bytes, \
                 c.message_inline AS message_inline \
                 FROM message_chain c LEFT JOIN blobs b ON b.hash = c.message_blob WHERE c.hash = ?1",
                params![hash],
                |row| {
                    Ok(ChainNode {
                        prev: column(row, "prev", place)?,
                        message: payload_column(row, "message", place)?.unwrap_or(Value::Null),
                    })
                },
            )
        },
    )
}

pub(super) fn latest_entry(
    connection: &Connection,
    run: &RunId,
    method: &str,
) -> Result<Option<JournalEntry>> {
    require_run(connection, run)?;
    let entry = query_first(
        connection,
        "reading the latest journal entry of a method",
        &format!(
            "{ENTRY_SELECT} WHERE j.run_id = ?1 AND j.method = ?2 AND j.status = 'ok' \
             ORDER BY j.seq DESC LIMIT 1"
        ),
        params![run.as_str(), method],
        |row| decode_entry(row, run),
    )?;
    let Some(mut entry) = entry else {
        return Ok(None);
    };
    join_params(connection, &mut ChainCache::default(), &mut entry, run)?;
    Ok(Some(entry))
}

pub(super) fn events(
    connection: &Connection,
    run: &RunId,
    after: Seq,
    limit: usize,
) -> Result<Vec<EventRecord>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let events = query_all(
        connection,
        "reading events",
        "SELECT seq, ts_ms, kind, data FROM events WHERE run_id = ?1 AND seq > ?2 \
         ORDER BY seq LIMIT ?3",
        params![run.as_str(), seq_param(after), limit],
        |row| {
            let seq: Seq = column(row, "seq", &Lazy(|| format!("an event of run {run}")))?;
            let place = Lazy(|| format!("event {seq} of run {run}"));
            Ok(EventRecord {
                seq,
                ts_ms: column(row, "ts_ms", &place)?,
                kind: column(row, "kind", &place)?,
                data: json_column(row, "data", &place)?,
            })
        },
    )?;
    // A run's events exist only while the run does: no event, and only then, may mean no
    // run (a follower reads this after every batch).
    if events.is_empty() {
        require_run(connection, run)?;
    }
    Ok(events)
}

pub(super) fn kv_get(connection: &Connection, scope: &str, key: &str) -> Result<Option<Value>> {
    query_first(
        connection,
        "reading a kv value",
        "SELECT value FROM kv WHERE scope = ?1 AND key = ?2",
        params![scope, key],
        |row| json_column(row, "value", &format!("kv key {key:?} in scope {scope:?}")),
    )
}

pub(super) fn thread_read(
    connection: &Connection,
    tenant: &str,
    thread: &str,
    last: Option<usize>,
) -> Result<Vec<ThreadMessage>> {
    // SQLite reads a negative LIMIT as "no limit".
    let limit = last.map_or(-1, |last| i64::try_from(last).unwrap_or(i64::MAX));
    let place = format!("thread {thread:?} of tenant {tenant:?}");
    let mut messages = query_all(
        connection,
        "reading a thread",
        "SELECT t.idx AS idx, t.appended_at_ms AS appended_at_ms, t.message_blob AS message_blob, \
         b.bytes AS message_bytes FROM thread_messages t LEFT JOIN blobs b ON b.hash = t.message_blob \
         WHERE t.tenant = ?1 AND t.thread = ?2 ORDER BY t.idx DESC LIMIT ?3",
        params![tenant, thread, limit],
        |row| {
            Ok(ThreadMessage {
                index: column(row, "idx", &place)?,
                message: blob_column(row, "message", &place)?
                    .ok_or_else(|| Error::Corrupt(format!("a message of {place} references no blob")))?,
                appended_at_ms: column(row, "appended_at_ms", &place)?,
            })
        },
    )?;
    messages.reverse();
    Ok(messages)
}

pub(super) fn mem_get(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    key: &str,
) -> Result<Option<MemoryRecord>> {
    let place = format!("memory record {key:?} in namespace {namespace:?} of tenant {tenant:?}");
    query_first(
        connection,
        "reading a memory record",
        "SELECT value, text, updated_at_ms FROM memory WHERE tenant = ?1 AND namespace = ?2 AND key = ?3",
        params![tenant, namespace, key],
        |row| {
            Ok(MemoryRecord {
                namespace: namespace.to_owned(),
                key: key.to_owned(),
                value: json_column(row, "value", &place)?,
                text: column(row, "text", &place)?,
                updated_at_ms: column(row, "updated_at_ms", &place)?,
            })
        },
    )
}

/// Turns plain words into an FTS5 query that matches any of them (`search::query_words`):
/// each word is quoted, so no user text is ever read as FTS5 syntax. `None` when there
/// are no words.
fn fts_query(query: &str) -> Option<String> {
    let words = search::query_words(query);
    (!words.is_empty())
        .then(|| words.iter().map(|word| format!("\"{word}\"")).collect::<Vec<_>>().join(" OR "))
}

pub(super) fn mem_search(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    search: &MemorySearch,
    limit: usize,
) -> Result<Vec<MemoryHit>> {
    match search.mode {
        SearchMode::Text => text_search(connection, tenant, namespace, &search.query, limit),
        SearchMode::Semantic => semantic_search(connection, tenant, namespace, search, limit),
        SearchMode::Hybrid => {
            let depth = search::fusion_depth(limit);
            let text = text_search(connection, tenant, namespace, &search.query, depth)?;
            let semantic = semantic_search(connection, tenant, namespace, search, depth)?;
            Ok(search::fuse(&[text, semantic], limit))
        }
    }
}

fn text_search(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<MemoryHit>> {
    let Some(fts) = fts_query(query) else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let place = format!("a search of namespace {namespace:?}");
    query_all(
        connection,
        "searching memory",
        "SELECT m.key AS key, bm25(memory_fts) AS rank, \
         snippet(memory_fts, 0, '[', ']', '...', 16) AS snippet \
         FROM memory_fts JOIN memory m ON m.id = memory_fts.rowid \
         WHERE memory_fts MATCH ?1 AND m.tenant = ?2 AND m.namespace = ?3 \
         ORDER BY rank, m.key LIMIT ?4",
        params![fts, tenant, namespace, limit],
        |row| {
            let rank: f64 = column(row, "rank", &place)?;
            Ok(MemoryHit {
                key: column(row, "key", &place)?,
                // bm25 is lower-is-better (negative); report higher-is-better.
                score: -rank,
                snippet: column(row, "snippet", &place)?,
            })
        },
    )
}

/// Brute force: reads every embedding of the namespace made by the query's model and
/// keeps the `limit` most similar. Linear in the namespace's size (13 ms over 10k records
/// of 256 dimensions, 57 ms at 1536, release build); fine up to ~100k records a namespace.
fn semantic_search(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    search: &MemorySearch,
    limit: usize,
) -> Result<Vec<MemoryHit>> {
    let Some(query) = &search.embedding else {
        return Ok(Vec::new());
    };
    let Some(cosine) = CosineQuery::new(&query.vector) else {
        return Ok(Vec::new());
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let step = "searching memory embeddings";
    let mut statement = connection
        .prepare_cached(
            "SELECT m.key, m.text, e.vector FROM memory m JOIN memory_embeddings e ON e.memory_id = m.id \
             WHERE m.tenant = ?1 AND m.namespace = ?2 AND e.model = ?3 AND e.dims = ?4",
        )
        .map_err(sql_error(step))?;
    let mut rows = statement
        .query(params![tenant, namespace, query.model, query.vector.len() as i64])
        .map_err(sql_error(step))?;
    let mut best = BestHits::new(limit);
    while let Some(row) = rows.next().map_err(sql_error(step))? {
        let bytes = row.get_ref(2).map_err(sql_error(step))?.as_blob().map_err(|e| {
            Error::Corrupt(format!("a memory embedding of namespace {namespace:?} is not a blob: {e}"))
        })?;
        best.offer_stored(&cosine, bytes, namespace, || {
            Ok((row.get(0).map_err(sql_error(step))?, row.get(1).map_err(sql_error(step))?))
        })?;
    }
    Ok(best.into_hits())
}

pub(super) fn stats(connection: &Connection) -> Result<StoreStats> {
    let stats = query_first(
        connection,
        "counting rows",
        "SELECT (SELECT COUNT(*) FROM runs) AS runs, \
                (SELECT COUNT(*) FROM journal) AS journal_entries, \
                (SELECT COUNT(*) FROM blobs) AS blobs, \
                (SELECT COALESCE(SUM(size), 0) FROM blobs) + \
                (SELECT COALESCE(SUM(COALESCE(length(params_inline), 0) + \
                    COALESCE(length(result_inline), 0) + COALESCE(length(error_inline), 0)), 0) \
                    FROM journal) + \
                (SELECT COUNT(*) * 128 + COALESCE(SUM(length(message_inline)), 0) \
                    FROM message_chain) AS blob_bytes",
        [],
        |row| {
            Ok(StoreStats {
                runs: column(row, "runs", "the store statistics")?,
                journal_entries: column(row, "journal_entries", "the store statistics")?,
                blobs: column(row, "blobs", "the store statistics")?,
                blob_bytes: column(row, "blob_bytes", "the store statistics")?,
            })
        },
    )?;
    // An aggregate query always yields exactly one row.
    Ok(stats.unwrap_or_default())
}

/// The last journal seq of a run (0 for an empty journal); `RunNotFound` if there is no
/// such run.
pub(super) fn last_journal_seq(connection: &Connection, run: &RunId) -> Result<Seq> {
    last_seq(connection, "finding the last journal seq", LAST_JOURNAL_SEQ, "journal", run)
}

/// The last event seq of a run (0 for an empty log); `RunNotFound` if there is no such run.
pub(super) fn last_event_seq(connection: &Connection, run: &RunId) -> Result<Seq> {
    last_seq(connection, "finding the last event seq", LAST_EVENT_SEQ, "events", run)
}

/// `last_seq`'s statement for each table: MAX over the (run_id, seq) primary key is one
/// index seek.
const LAST_JOURNAL_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) AS last FROM journal WHERE run_id = ?1";
const LAST_EVENT_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) AS last FROM events WHERE run_id = ?1";

fn last_seq(connection: &Connection, step: &'static str, sql: &str, table: &str, run: &RunId) -> Result<Seq> {
    let last = query_first(connection, step, sql, params![run.as_str()], |row| {
        column(row, "last", &Lazy(|| format!("the {table} of run {run}")))
    })?
    .unwrap_or(0);
    // Entries and events exist only with their run (a foreign key): only an empty log
    // needs the run looked up.
    if last == 0 {
        require_run(connection, run)?;
    }
    Ok(last)
}

/// Runs a cached statement and decodes the first row, if any.
pub(super) fn query_first<T>(
    connection: &Connection,
    step: &'static str,
    sql: &str,
    params: impl Params,
    decode: impl FnOnce(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let mut statement = connection.prepare_cached(sql).map_err(sql_error(step))?;
    let mut rows = statement.query(params).map_err(sql_error(step))?;
    match rows.next().map_err(sql_error(step))? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Runs a cached statement and decodes every row.
pub(super) fn query_all<T>(
    connection: &Connection,
    step: &'static str,
    sql: &str,
    params: impl Params,
    mut decode: impl FnMut(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut statement = connection.prepare_cached(sql).map_err(sql_error(step))?;
    let mut rows = statement.query(params).map_err(sql_error(step))?;
    let mut decoded = Vec::new();
    while let Some(row) = rows.next().map_err(sql_error(step))? {
        decoded.push(decode(row)?);
    }
    Ok(decoded)
}

/// The columns `decode_message` reads, in `SELECT` form.
pub(super) const MAILBOX_COLUMNS: &str = "seq, from_run, message, correlation_id, topic, sent_at_ms";

pub(super) fn decode_message(row: &Row<'_>, run: &RunId) -> Result<MailboxMessage> {
    let seq: Seq = column(row, "seq", &format!("a mailbox message of run {run}"))?;
    let place = format!("mailbox message {seq} of run {run}");
    let from: Option<String> = column(row, "from_run", &place)?;
    let from = match from {
        Some(text) => Some(RunId::parse(&text).map_err(|error| corrupt("from_run", &place, error))?),
        None => None,
    };
    Ok(MailboxMessage {
        seq,
        from,
        message: json_column(row, "message", &place)?,
        correlation_id: column(row, "correlation_id", &place)?,
        topic: column(row, "topic", &place)?,
        sent_at_ms: column(row, "sent_at_ms", &place)?,
    })
}

/// How many undelivered messages a run's mailbox holds (the run must exist).
pub(super) fn mailbox_len(connection: &Connection, run: &RunId) -> Result<u64> {
    require_run(connection, run)?;
    let len = query_first(
        connection,
        "counting a mailbox",
        // Named: SQLite otherwise counts over every message the run ever received.
        "SELECT COUNT(*) FROM mailbox INDEXED BY mailbox_undelivered WHERE run_id = ?1 AND receive_key IS NULL",
        params![run.as_str()],
        |row| row.get::<_, u64>(0).map_err(sql_error("reading a mailbox length")),
    )?;
    Ok(len.unwrap_or(0))
}

pub(super) fn decode_run(row: &Row<'_>) -> Result<RunRecord> {
    let id_text: String = column(row, "id", "a run")?;
    let place = format!("run {id_text}");
    let id = RunId::parse(&id_text).map_err(|error| corrupt("id", &place, error))?;
    Ok(RunRecord {
        id,
        tenant: column(row, "tenant", &place)?,
        spec: spec_column(row, &place)?,
        state: parsed_column(row, "state", &place)?,
        wait_reason: optional_parsed_column(row, "wait_reason", &place)?,
        created_at_ms: column(row, "created_at_ms", &place)?,
        updated_at_ms: column(row, "updated_at_ms", &place)?,
        ended_at_ms: column(row, "ended_at_ms", &place)?,
        attempt: column(row, "attempt", &place)?,
        pid: column(row, "pid", &place)?,
        exit_code: column(row, "exit_code", &place)?,
        output: optional_json_column(row, "output", &place)?,
        error: column(row, "error", &place)?,
        usage: usage_columns(row, &place)?,
        provider_calls: column(row, "provider_calls", &place)?,
    })
}

fn decode_entry(row: &Row<'_>, run: &RunId) -> Result<JournalEntry> {
    let seq: Seq = column(row, "seq", &format!("a journal entry of run {run}"))?;
    let place = format!("journal entry {seq} of run {run}");
    let params = payload_column(row, "params", &place)?
        .ok_or_else(|| Error::Corrupt(format!("params of {place}: none are stored")))?;
    Ok(JournalEntry {
        seq,
        method: column(row, "method", &place)?,
        params,
        params_hash: column(row, "params_hash", &place)?,
        status: parsed_column(row, "status", &place)?,
        result: payload_column(row, "result", &place)?,
        error: payload_column(row, "error", &place)?,
        attempt: column(row, "attempt", &place)?,
        started_at_ms: column(row, "started_at_ms", &place)?,
        finished_at_ms: column(row, "finished_at_ms", &place)?,
        usage: usage_columns(row, &place)?,
    })
}

fn usage_columns(row: &Row<'_>, place: &str) -> Result<Usage> {
    Ok(Usage {
        input_tokens: column(row, "input_tokens", place)?,
        output_tokens: column(row, "output_tokens", place)?,
        llm_calls: column(row, "llm_calls", place)?,
        tool_calls: column(row, "tool_calls", place)?,
        cost_micro_usd: column(row, "cost_micro_usd", place)?,
    })
}

/// Where a column is read, for the `Corrupt` error of a bad value: text, or [`Lazy`]
/// text made only when a read fails (most rows are read fine, many on hot paths).
pub(super) trait Place {
    fn text(&self) -> String;
}

impl Place for str {
    fn text(&self) -> String {
        self.to_owned()
    }
}

impl Place for String {
    fn text(&self) -> String {
        self.clone()
    }
}

/// A [`Place`] formatted only when it is needed.
pub(super) struct Lazy<F>(pub(super) F);

impl<F: Fn() -> String> Place for Lazy<F> {
    fn text(&self) -> String {
        (self.0)()
    }
}

/// Reads a column, reporting a value of the wrong type or range as corrupt data at
/// `place` rather than as a backend failure.
pub(super) fn column<T: FromSql>(row: &Row<'_>, name: &str, place: &(impl Place + ?Sized)) -> Result<T> {
    row.get(name).map_err(|error| match error {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => corrupt(name, &place.text(), error),
        other => Error::Backend { step: "reading a column", source: Box::new(other) },
    })
}

fn parsed_column<T>(row: &Row<'_>, name: &str, place: &str) -> Result<T>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: String = column(row, name, place)?;
    text.parse().map_err(|error| corrupt(name, place, error))
}

fn optional_parsed_column<T>(row: &Row<'_>, name: &str, place: &str) -> Result<Option<T>>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<String> = column(row, name, place)?;
    text.map(|text| text.parse().map_err(|error| corrupt(name, place, error))).transpose()
}

/// A run's spec: its text, checked to be JSON.
fn spec_column(row: &Row<'_>, place: &str) -> Result<SpecJson> {
    let text: String = column(row, "spec", place)?;
    SpecJson::parse(text).map_err(|error| corrupt("spec", place, error))
}

pub(super) fn json_column(row: &Row<'_>, name: &str, place: &(impl Place + ?Sized)) -> Result<Value> {
    let text: String = column(row, name, place)?;
    serde_json::from_str(&text).map_err(|error| corrupt(name, &place.text(), error))
}

fn optional_json_column(row: &Row<'_>, name: &str, place: &str) -> Result<Option<Value>> {
    let text: Option<String> = column(row, name, place)?;
    text.map(|text| serde_json::from_str(&text).map_err(|error| corrupt(name, place, error))).transpose()
}

/// Reads a payload through its blob reference (`{what}_blob`) and the joined bytes
/// (`{what}_bytes`): a reference without bytes is a missing blob.
pub(super) fn blob_column(row: &Row<'_>, what: &str, place: &str) -> Result<Option<Value>> {
    let hash: Option<String> = column(row, &format!("{what}_blob"), place)?;
    let Some(hash) = hash else {
        return Ok(None);
    };
    let bytes: Option<Vec<u8>> = column(row, &format!("{what}_bytes"), place)?;
    let bytes = bytes.ok_or_else(|| Error::Corrupt(format!("{what} of {place}: blob {hash} is missing")))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|error| Error::Corrupt(format!("{what} of {place}: blob {hash} is not JSON: {error}")))
}

/// A payload stored inline (`{what}_inline`, see `writer::INLINE_MAX`) or as a blob
/// (`blob_column`).
fn payload_column(row: &Row<'_>, what: &str, place: &str) -> Result<Option<Value>> {
    let inline: Option<Vec<u8>> = column(row, &format!("{what}_inline"), place)?;
    match inline {
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            Error::Corrupt(format!("{what} of {place}: the stored bytes are not JSON: {error}"))
        }),
        None => blob_column(row, what, place),
    }
}

/// A seq as an SQL parameter. SQLite integers are signed; no stored seq comes near
/// `i64::MAX`, so clamping keeps comparisons right without a conversion error.
pub(super) fn seq_param(seq: Seq) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn corrupt(column: &str, place: &str, error: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("column {column} of {place}: {error}"))
}
