//! Reading the Postgres schema back into Store records: the statement helpers every
//! module uses (prepared once per connection, errors naming the step), the read queries,
//! and the row decoders that turn bad stored data into `Error::Corrupt` naming what and
//! where.

use std::collections::HashMap;
use std::str::FromStr;

use deadpool_postgres::GenericClient;
use keel_types::{RunId, Usage};
use serde_json::Value;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Row, Statement};

use super::{int, pg_error};
use crate::chain::{self, ChainCache, ChainNode};
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

/// A journal row joined with its three payloads; `decode_entry` reads these names.
pub(super) const ENTRY_SELECT: &str = "SELECT j.seq AS seq, j.method AS method, j.params_hash AS params_hash, \
     j.status AS status, j.attempt AS attempt, j.started_at_ms AS started_at_ms, \
     j.finished_at_ms AS finished_at_ms, j.input_tokens AS input_tokens, \
     j.output_tokens AS output_tokens, j.llm_calls AS llm_calls, j.tool_calls AS tool_calls, \
     j.cost_micro_usd AS cost_micro_usd, \
     j.params_blob AS params_blob, p.bytes AS params_bytes, \
     j.result_blob AS result_blob, r.bytes AS result_bytes, \
     j.error_blob AS error_blob, e.bytes AS error_bytes \
     FROM journal j \
     LEFT JOIN blobs p ON p.hash = j.params_blob \
     LEFT JOIN blobs r ON r.hash = j.result_blob \
     LEFT JOIN blobs e ON e.hash = j.error_blob";

/// The columns `decode_message` reads, in `SELECT` form.
pub(super) const MAILBOX_COLUMNS: &str = "seq, from_run, message, correlation_id, topic, sent_at_ms";

/// Prepares `sql` on the connection once (later calls reuse the statement).
pub(super) async fn prepare(client: &impl GenericClient, step: &'static str, sql: &str) -> Result<Statement> {
    client.prepare_cached(sql).await.map_err(pg_error(step))
}

/// Runs a statement; how many rows it changed.
pub(super) async fn execute(
    client: &impl GenericClient,
    step: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    let statement = prepare(client, step, sql).await?;
    client.execute(&statement, params).await.map_err(pg_error(step))
}

/// Runs a query; its rows.
pub(super) async fn query_rows(
    client: &impl GenericClient,
    step: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>> {
    let statement = prepare(client, step, sql).await?;
    client.query(&statement, params).await.map_err(pg_error(step))
}

/// Runs a query that returns at most one row.
pub(super) async fn query_opt(
    client: &impl GenericClient,
    step: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>> {
    let statement = prepare(client, step, sql).await?;
    client.query_opt(&statement, params).await.map_err(pg_error(step))
}

pub(super) async fn load_run(client: &impl GenericClient, id: &RunId) -> Result<Option<RunRecord>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1");
    query_opt(client, "reading a run", &sql, &[&id.as_str()]).await?.map(|row| decode_run(&row)).transpose()
}

/// See `Store::runs_ended_after`; `runs_by_end` serves it.
pub(super) async fn runs_ended_after(
    client: &impl GenericClient,
    tenant: &str,
    after_ms: u64,
    after_id: Option<&RunId>,
    limit: usize,
) -> Result<Vec<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = $1 AND ended_at_ms IS NOT NULL \
         AND ended_at_ms >= $2 AND (ended_at_ms > $2 OR ($3::text IS NOT NULL AND id > $3)) \
         ORDER BY ended_at_ms, id LIMIT $4"
    );
    let after_id = after_id.map(RunId::as_str);
    let rows = query_rows(
        client,
        "listing runs that ended",
        &sql,
        &[&tenant, &int(after_ms), &after_id, &int(limit as u64)],
    )
    .await?;
    rows.iter().map(decode_run).collect()
}

pub(super) async fn list_runs(client: &impl GenericClient, filter: &RunFilter) -> Result<Vec<RunRecord>> {
    let states: Option<Vec<&str>> =
        (!filter.states.is_empty()).then(|| filter.states.iter().map(|state| state.as_str()).collect());
    // `LIMIT NULL` is no limit.
    let limit = filter.limit.map(|limit| int(limit as u64));
    let offset = int(filter.offset as u64);
    let text = filter.text.as_deref().filter(|text| !text.is_empty());
    // `strpos`, not LIKE: the text is matched as typed, `%` and `_` included. `lower` of
    // both sides, as SQLite's (ASCII) `lower`; the spec is always a JSON text.
    let matching = "($1::text[] IS NULL OR state = ANY($1)) AND ($2::text IS NULL OR tenant = $2) \
         AND ($5::text IS NULL OR strpos(lower(id || ' ' || tenant || ' ' || \
              COALESCE((spec::jsonb -> 'command')::text, '')), lower($5)) > 0)";
    let order = filter.order.order_by();
    if !matches!(filter.order, RunOrder::CostliestFirst | RunOrder::CheapestFirst) {
        let sql =
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE {matching} ORDER BY {order} LIMIT $3 OFFSET $4");
        let rows =
            query_rows(client, "listing runs", &sql, &[&states, &filter.tenant, &limit, &offset, &text])
                .await?;
        return rows.iter().map(decode_run).collect();
    }
    // Only ended runs are indexed by cost (`ended_runs_by_cost`, `ended_runs_by_tenant_cost`,
    // over `ended_cost_micro_usd`: schema version 8): a live run's cost changes with every
    // paid call, and an indexed cost made each of those updates write an entry into every
    // index of the run's row. So the ended runs come in cost order from the index, the
    // live ones (`live_runs`) are sorted here, and the two meet in one order. Each side
    // gives at most the rows the page could need from it (`$6`; NULL is no limit).
    let ended_order = order.replace("cost_micro_usd", "ended_cost_micro_usd");
    let each = limit.map(|limit| limit.saturating_add(offset));
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM \
         ((SELECT {RUN_COLUMNS} FROM runs WHERE ended_at_ms IS NOT NULL AND {matching} \
           ORDER BY {ended_order} LIMIT $6) \
          UNION ALL \
          (SELECT {RUN_COLUMNS} FROM runs WHERE ended_at_ms IS NULL AND {matching} \
           ORDER BY {order} LIMIT $6)) AS both_sides \
         ORDER BY {order} LIMIT $3 OFFSET $4"
    );
    let rows = query_rows(
        client,
        "listing runs by cost",
        &sql,
        &[&states, &filter.tenant, &limit, &offset, &text, &each],
    )
    .await?;
    rows.iter().map(decode_run).collect()
}

/// The usage of completed `llm.chat` entries per (time bucket, tenant, model); see
/// `Store::cost_summary`. The model is read from the entry's result (the kernel's
/// `response.model`, or a top-level `model`), else its params.
pub(super) async fn cost_summary(
    client: &impl GenericClient,
    filter: &CostFilter,
) -> Result<Vec<CostBucket>> {
    let bucket = int(filter.bucket_ms.max(1));
    let since = int(filter.since_ms);
    let sql = "SELECT (j.started_at_ms / $1) * $1 AS bucket_start_ms, r.tenant AS tenant, \
         COALESCE(convert_from(res.bytes, 'UTF8')::jsonb #>> '{response,model}', \
                  convert_from(res.bytes, 'UTF8')::jsonb ->> 'model', \
                  convert_from(par.bytes, 'UTF8')::jsonb ->> 'model', 'unknown') AS model, \
         COUNT(*)::bigint AS calls, SUM(j.input_tokens)::bigint AS input_tokens, \
         SUM(j.output_tokens)::bigint AS output_tokens, SUM(j.cost_micro_usd)::bigint AS cost_micro_usd \
         FROM journal j \
         JOIN runs r ON r.id = j.run_id \
         LEFT JOIN blobs par ON par.hash = j.params_blob \
         LEFT JOIN blobs res ON res.hash = j.result_blob \
         WHERE j.method = 'llm.chat' AND j.status = 'ok' AND j.started_at_ms >= $2 \
           AND ($3::text IS NULL OR r.tenant = $3) \
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";
    let rows = query_rows(client, "summing costs", sql, &[&bucket, &since, &filter.tenant]).await?;
    rows.iter()
        .map(|row| {
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
        .collect()
}

/// Runs per tenant, state, wait reason and presence of a process, in one grouped read.
pub(super) async fn count_runs(client: &impl GenericClient) -> Result<Vec<RunCount>> {
    let rows = query_rows(
        client,
        "counting runs",
        "SELECT tenant, state, wait_reason, pid IS NOT NULL AS has_pid, COUNT(*) AS runs \
         FROM runs GROUP BY tenant, state, wait_reason, pid IS NOT NULL",
        &[],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let place = "the run counts";
            Ok(RunCount {
                tenant: column(row, "tenant", place)?,
                state: parsed_column(row, "state", place)?,
                wait_reason: optional_parsed_column(row, "wait_reason", place)?,
                has_pid: column(row, "has_pid", place)?,
                count: count(row, "runs", place)?,
            })
        })
        .collect()
}

/// The run's tenant, `None` when there is no such run.
pub(super) async fn run_tenant(client: &impl GenericClient, run: &RunId) -> Result<Option<String>> {
    let row =
        query_opt(client, "looking up a run", "SELECT tenant FROM runs WHERE id = $1", &[&run.as_str()])
            .await?;
    row.map(|row| column(&row, "tenant", &format!("run {run}"))).transpose()
}

/// Whether the run exists; per-run reads and writes fail with `RunNotFound` otherwise.
/// Rows of a run's journal and events reference the run and runs are never deleted, so a
/// read that found rows needs no such check: it is made only when a read found none.
pub(super) async fn require_run(client: &impl GenericClient, run: &RunId) -> Result<()> {
    match run_tenant(client, run).await? {
        Some(_) => Ok(()),
        None => Err(Error::RunNotFound(run.clone())),
    }
}

pub(super) async fn journal(
    client: &impl GenericClient,
    run: &RunId,
    after: Seq,
) -> Result<Vec<JournalEntry>> {
    let rows = query_rows(
        client,
        "reading a journal",
        &format!("{ENTRY_SELECT} WHERE j.run_id = $1 AND j.seq > $2 ORDER BY j.seq"),
        &[&run.as_str(), &int(after)],
    )
    .await?;
    if rows.is_empty() {
        require_run(client, run).await?;
    }
    let mut entries = rows.iter().map(|row| decode_entry(row, run)).collect::<Result<Vec<_>>>()?;
    join_params(client, &mut entries, run).await?;
    Ok(entries)
}

/// Gives params stored split (see `chain`) their `messages` back: every chain the entries
/// name is read in one recursive query (walking `prev` from each end), then joined.
pub(super) async fn join_params(
    client: &impl GenericClient,
    entries: &mut [JournalEntry],
    run: &RunId,
) -> Result<()> {
    let ends: Vec<&str> = entries.iter().filter_map(|entry| chain::chain_end(&entry.params)).collect();
    if ends.is_empty() {
        return Ok(());
    }
    let rows = query_rows(
        client,
        "reading message chain nodes",
        "WITH RECURSIVE walk (hash, prev, message_blob) AS ( \
             SELECT hash, prev, message_blob FROM message_chain WHERE hash = ANY($1) \
             UNION SELECT c.hash, c.prev, c.message_blob FROM message_chain c JOIN walk w ON c.hash = w.prev) \
         SELECT w.hash AS hash, w.prev AS prev, w.message_blob AS message_blob, b.bytes AS message_bytes \
         FROM walk w LEFT JOIN blobs b ON b.hash = w.message_blob",
        &[&ends],
    )
    .await?;
    let mut nodes = HashMap::with_capacity(rows.len());
    for row in &rows {
        let hash: String = column(row, "hash", "a message chain node")?;
        let place = format!("message chain node {hash}");
        let node = ChainNode {
            prev: column(row, "prev", &place)?,
            message: blob_column(row, "message", &place)?.unwrap_or(Value::Null),
        };
        nodes.insert(hash, node);
    }
    let mut cache = ChainCache::default();
    for entry in entries {
        let seq = entry.seq;
        cache.join_params(
            &mut entry.params,
            || format!("params of journal entry {seq} of run {run}"),
            |hash, _| Ok(nodes.get(hash).cloned()),
        )?;
    }
    Ok(())
}

pub(super) async fn latest_entry(
    client: &impl GenericClient,
    run: &RunId,
    method: &str,
) -> Result<Option<JournalEntry>> {
    let row = query_opt(
        client,
        "reading the latest journal entry of a method",
        &format!(
            "{ENTRY_SELECT} WHERE j.run_id = $1 AND j.method = $2 AND j.status = 'ok' \
             ORDER BY j.seq DESC LIMIT 1"
        ),
        &[&run.as_str(), &method],
    )
    .await?;
    let Some(row) = row else {
        require_run(client, run).await?;
        return Ok(None);
    };
    let mut entries = [decode_entry(&row, run)?];
    join_params(client, &mut entries, run).await?;
    let [entry] = entries;
    Ok(Some(entry))
}

pub(super) async fn events(
    client: &impl GenericClient,
    run: &RunId,
    after: Seq,
    limit: usize,
) -> Result<Vec<EventRecord>> {
    let rows = query_rows(
        client,
        "reading events",
        "SELECT seq, ts_ms, kind, data FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        &[&run.as_str(), &int(after), &int(limit as u64)],
    )
    .await?;
    if rows.is_empty() {
        require_run(client, run).await?;
    }
    rows.iter().map(|row| decode_event(row, run)).collect()
}

pub(super) fn decode_event(row: &Row, run: &RunId) -> Result<EventRecord> {
    let seq = count(row, "seq", &format!("an event of run {run}"))?;
    let place = format!("event {seq} of run {run}");
    Ok(EventRecord {
        seq,
        ts_ms: count(row, "ts_ms", &place)?,
        kind: column(row, "kind", &place)?,
        data: json_column(row, "data", &place)?,
    })
}

pub(super) async fn kv_get(client: &impl GenericClient, scope: &str, key: &str) -> Result<Option<Value>> {
    let row = query_opt(
        client,
        "reading a kv value",
        "SELECT value FROM kv WHERE scope = $1 AND key = $2",
        &[&scope, &key],
    )
    .await?;
    row.map(|row| json_column(&row, "value", &format!("kv key {key:?} in scope {scope:?}"))).transpose()
}

/// `Store::kv_chain` in one statement: a recursive query that follows each value's link
/// (`#>>` at the path) to the next key, numbered so that the chain comes back in order.
pub(super) async fn kv_chain(
    client: &impl GenericClient,
    scope: &str,
    key: &str,
    link: &[&str],
    limit: usize,
) -> Result<Vec<Value>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = query_rows(
        client,
        "reading a chain of kv values",
        "WITH RECURSIVE chain (n, key, value) AS ( \
             SELECT 1::bigint, key, value FROM kv WHERE scope = $1 AND key = $2 AND $4::bigint > 0 \
             UNION ALL \
             SELECT chain.n + 1, kv.key, kv.value FROM chain \
             JOIN kv ON kv.scope = $1 AND kv.key = (chain.value::jsonb #>> $3::text[]) \
             WHERE chain.n < $4) \
         SELECT key, value FROM chain ORDER BY n",
        &[&scope, &key, &link, &limit],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let key: &str = row.try_get("key").map_err(pg_error("reading a chain of kv values"))?;
            json_column(row, "value", &format!("kv key {key:?} in scope {scope:?}"))
        })
        .collect()
}

/// Every pair's value in one statement: the pairs go as two arrays, numbered by
/// `WITH ORDINALITY` so that each row finds its place in the answer.
pub(super) async fn kv_get_many(
    client: &impl GenericClient,
    keys: &[(String, String)],
) -> Result<Vec<Option<Value>>> {
    let mut values = vec![None; keys.len()];
    if keys.is_empty() {
        return Ok(values);
    }
    let (scopes, names): (Vec<&str>, Vec<&str>) = keys.iter().map(|(s, k)| (s.as_str(), k.as_str())).unzip();
    let rows = query_rows(
        client,
        "reading kv values",
        "SELECT asked.i, kv.value FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS asked(scope, key, i) \
         JOIN kv ON kv.scope = asked.scope AND kv.key = asked.key",
        &[&scopes, &names],
    )
    .await?;
    for row in rows {
        let index: i64 = column(&row, "i", "a kv value asked for")?;
        let slot = usize::try_from(index - 1).ok().filter(|i| *i < values.len()).ok_or_else(|| {
            Error::Corrupt(format!("Postgres numbered an asked kv key {index} of {}", keys.len()))
        })?;
        let (scope, key) = &keys[slot];
        values[slot] = Some(json_column(&row, "value", &format!("kv key {key:?} in scope {scope:?}"))?);
    }
    Ok(values)
}

pub(super) async fn thread_read(
    client: &impl GenericClient,
    tenant: &str,
    thread: &str,
    last: Option<usize>,
) -> Result<Vec<ThreadMessage>> {
    let limit = last.map(|last| int(last as u64));
    let place = format!("thread {thread:?} of tenant {tenant:?}");
    let rows = query_rows(
        client,
        "reading a thread",
        "SELECT t.idx AS idx, t.appended_at_ms AS appended_at_ms, t.message_blob AS message_blob, \
         b.bytes AS message_bytes FROM thread_messages t LEFT JOIN blobs b ON b.hash = t.message_blob \
         WHERE t.tenant = $1 AND t.thread = $2 ORDER BY t.idx DESC LIMIT $3",
        &[&tenant, &thread, &limit],
    )
    .await?;
    let mut messages =
        rows.iter().map(|row| decode_thread_message(row, &place)).collect::<Result<Vec<_>>>()?;
    messages.reverse();
    Ok(messages)
}

pub(super) fn decode_thread_message(row: &Row, place: &str) -> Result<ThreadMessage> {
    Ok(ThreadMessage {
        index: count(row, "idx", place)?,
        message: blob_column(row, "message", place)?
            .ok_or_else(|| Error::Corrupt(format!("a message of {place} references no blob")))?,
        appended_at_ms: count(row, "appended_at_ms", place)?,
    })
}

pub(super) async fn mem_get(
    client: &impl GenericClient,
    tenant: &str,
    namespace: &str,
    key: &str,
) -> Result<Option<MemoryRecord>> {
    let row = query_opt(
        client,
        "reading a memory record",
        "SELECT namespace, key, value, text, updated_at_ms FROM memory \
         WHERE tenant = $1 AND namespace = $2 AND key = $3",
        &[&tenant, &namespace, &key],
    )
    .await?;
    row.map(|row| decode_memory(&row, tenant)).transpose()
}

pub(super) fn decode_memory(row: &Row, tenant: &str) -> Result<MemoryRecord> {
    let namespace: String = column(row, "namespace", &format!("a memory record of tenant {tenant:?}"))?;
    let key: String = column(row, "key", &format!("a memory record of tenant {tenant:?}"))?;
    let place = format!("memory record {key:?} in namespace {namespace:?} of tenant {tenant:?}");
    Ok(MemoryRecord {
        value: json_column(row, "value", &place)?,
        text: column(row, "text", &place)?,
        updated_at_ms: count(row, "updated_at_ms", &place)?,
        namespace,
        key,
    })
}

pub(super) async fn mem_search(
    client: &impl GenericClient,
    tenant: &str,
    namespace: &str,
    search: &MemorySearch,
    limit: usize,
) -> Result<Vec<MemoryHit>> {
    match search.mode {
        SearchMode::Text => text_search(client, tenant, namespace, &search.query, limit).await,
        SearchMode::Semantic => semantic_search(client, tenant, namespace, search, limit).await,
        SearchMode::Hybrid => {
            let depth = search::fusion_depth(limit);
            let text = text_search(client, tenant, namespace, &search.query, depth).await?;
            let semantic = semantic_search(client, tenant, namespace, search, depth).await?;
            Ok(search::fuse(&[text, semantic], limit))
        }
    }
}

/// Full-text search: the query's words (`search::query_words`, so punctuation is never
/// syntax) joined with `|` into a tsquery bound as a parameter; a record matches when it
/// has any of them. Ranked by `ts_rank_cd` (cover density: more and closer occurrences
/// rank higher), ties by key; the snippet marks matches in `[...]` (`ts_headline`, over
/// the best `limit` only).
async fn text_search(
    client: &impl GenericClient,
    tenant: &str,
    namespace: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<MemoryHit>> {
    let words = search::query_words(query);
    if words.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let tsquery = words.join(" | ");
    let place = format!("a search of namespace {namespace:?}");
    let rows = query_rows(
        client,
        "searching memory",
        "SELECT key, rank, ts_headline('simple', text, query, \
             'StartSel=\"[\", StopSel=\"]\", FragmentDelimiter=\"...\", MaxWords=16, MinWords=4, ShortWord=0') \
             AS snippet \
         FROM (SELECT m.key, m.text, q.query, ts_rank_cd(m.words, q.query) AS rank \
             FROM memory m, to_tsquery('simple', $1) AS q (query) \
             WHERE m.tenant = $2 AND m.namespace = $3 AND m.words @@ q.query \
             ORDER BY rank DESC, m.key LIMIT $4) AS best \
         ORDER BY rank DESC, key",
        &[&tsquery, &tenant, &namespace, &int(limit as u64)],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let rank: f32 = column(row, "rank", &place)?;
            Ok(MemoryHit {
                key: column(row, "key", &place)?,
                score: f64::from(rank),
                snippet: column(row, "snippet", &place)?,
            })
        })
        .collect()
}

/// Brute force, as on SQLite: reads every embedding of the namespace made by the query's
/// model with its length and keeps the `limit` most similar (`search::BestHits`). There
/// is no pgvector path: it cannot be tested here (see `PgStore::semantic_index`).
async fn semantic_search(
    client: &impl GenericClient,
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
    let dims = i32::try_from(query.vector.len()).unwrap_or(i32::MAX);
    let rows = query_rows(
        client,
        "searching memory embeddings",
        "SELECT m.key, m.text, e.vector FROM memory m JOIN memory_embeddings e ON e.memory_id = m.id \
         WHERE m.tenant = $1 AND m.namespace = $2 AND e.model = $3 AND e.dims = $4",
        &[&tenant, &namespace, &query.model, &dims],
    )
    .await?;
    let place = format!("a memory embedding of namespace {namespace:?}");
    let mut best = BestHits::new(limit);
    for row in &rows {
        let stored: &[u8] = column(row, "vector", &place)?;
        best.offer_stored(&cosine, stored, namespace, || {
            Ok((column(row, "key", &place)?, column(row, "text", &place)?))
        })?;
    }
    Ok(best.into_hits())
}

/// Counts as SQLite does: blob bytes plus 128 per message-chain node (its three hashes).
pub(super) async fn stats(client: &impl GenericClient) -> Result<StoreStats> {
    let row = query_opt(
        client,
        "counting rows",
        "SELECT (SELECT COUNT(*) FROM runs) AS runs, \
                (SELECT COUNT(*) FROM journal) AS journal_entries, \
                (SELECT COUNT(*) FROM blobs) AS blobs, \
                (SELECT COALESCE(SUM(size), 0)::bigint FROM blobs) + \
                (SELECT COUNT(*) * 128 FROM message_chain) AS blob_bytes",
        &[],
    )
    .await?;
    // An aggregate query always yields exactly one row.
    let Some(row) = row else {
        return Ok(StoreStats::default());
    };
    let place = "the store statistics";
    Ok(StoreStats {
        runs: count(&row, "runs", place)?,
        journal_entries: count(&row, "journal_entries", place)?,
        blobs: count(&row, "blobs", place)?,
        blob_bytes: count(&row, "blob_bytes", place)?,
    })
}

/// How many undelivered messages a run's mailbox holds (the run must exist).
pub(super) async fn mailbox_len(client: &impl GenericClient, run: &RunId) -> Result<u64> {
    require_run(client, run).await?;
    let row = query_opt(
        client,
        "counting a mailbox",
        "SELECT COUNT(*) AS undelivered FROM mailbox WHERE run_id = $1 AND receive_key IS NULL",
        &[&run.as_str()],
    )
    .await?;
    row.map_or(Ok(0), |row| count(&row, "undelivered", &format!("the mailbox of run {run}")))
}

pub(super) fn decode_message(row: &Row, run: &RunId) -> Result<MailboxMessage> {
    let seq = count(row, "seq", &format!("a mailbox message of run {run}"))?;
    let place = format!("mailbox message {seq} of run {run}");
    let from: Option<String> = column(row, "from_run", &place)?;
    let from = from
        .map(|text| RunId::parse(&text).map_err(|error| corrupt("from_run", &place, error)))
        .transpose()?;
    Ok(MailboxMessage {
        seq,
        from,
        message: json_column(row, "message", &place)?,
        correlation_id: column(row, "correlation_id", &place)?,
        topic: column(row, "topic", &place)?,
        sent_at_ms: count(row, "sent_at_ms", &place)?,
    })
}

pub(super) fn decode_run(row: &Row) -> Result<RunRecord> {
    let id_text: String = column(row, "id", "a run")?;
    let place = format!("run {id_text}");
    let id = RunId::parse(&id_text).map_err(|error| corrupt("id", &place, error))?;
    let attempt = count(row, "attempt", &place)?;
    let pid = optional_count(row, "pid", &place)?;
    Ok(RunRecord {
        id,
        tenant: column(row, "tenant", &place)?,
        spec: spec_column(row, &place)?,
        state: parsed_column(row, "state", &place)?,
        wait_reason: optional_parsed_column(row, "wait_reason", &place)?,
        created_at_ms: count(row, "created_at_ms", &place)?,
        updated_at_ms: count(row, "updated_at_ms", &place)?,
        ended_at_ms: optional_count(row, "ended_at_ms", &place)?,
        attempt: u32::try_from(attempt).map_err(|error| corrupt("attempt", &place, error))?,
        pid: pid.map(|pid| u32::try_from(pid).map_err(|error| corrupt("pid", &place, error))).transpose()?,
        exit_code: column(row, "exit_code", &place)?,
        output: optional_json_column(row, "output", &place)?,
        error: column(row, "error", &place)?,
        usage: usage_columns(row, &place)?,
        provider_calls: count(row, "provider_calls", &place)?,
    })
}

pub(super) fn decode_entry(row: &Row, run: &RunId) -> Result<JournalEntry> {
    let seq = count(row, "seq", &format!("a journal entry of run {run}"))?;
    let place = format!("journal entry {seq} of run {run}");
    let params = blob_column(row, "params", &place)?
        .ok_or_else(|| Error::Corrupt(format!("params of {place}: no blob is referenced")))?;
    let attempt = count(row, "attempt", &place)?;
    Ok(JournalEntry {
        seq,
        method: column(row, "method", &place)?,
        params,
        params_hash: column(row, "params_hash", &place)?,
        status: parsed_column(row, "status", &place)?,
        result: blob_column(row, "result", &place)?,
        error: blob_column(row, "error", &place)?,
        attempt: u32::try_from(attempt).map_err(|error| corrupt("attempt", &place, error))?,
        started_at_ms: count(row, "started_at_ms", &place)?,
        finished_at_ms: optional_count(row, "finished_at_ms", &place)?,
        usage: usage_columns(row, &place)?,
    })
}

fn usage_columns(row: &Row, place: &str) -> Result<Usage> {
    Ok(Usage {
        input_tokens: count(row, "input_tokens", place)?,
        output_tokens: count(row, "output_tokens", place)?,
        llm_calls: count(row, "llm_calls", place)?,
        tool_calls: count(row, "tool_calls", place)?,
        cost_micro_usd: count(row, "cost_micro_usd", place)?,
    })
}

/// Reads a column, reporting a value of the wrong type as corrupt data at `place`.
pub(super) fn column<'a, T: FromSql<'a>>(row: &'a Row, name: &str, place: &str) -> Result<T> {
    row.try_get(name).map_err(|error| corrupt(name, place, error))
}

/// Reads a BIGINT that holds a count, seq or timestamp: negative is corrupt.
pub(super) fn count(row: &Row, name: &str, place: &str) -> Result<u64> {
    let value: i64 = column(row, name, place)?;
    u64::try_from(value).map_err(|error| corrupt(name, place, error))
}

pub(super) fn optional_count(row: &Row, name: &str, place: &str) -> Result<Option<u64>> {
    let value: Option<i64> = column(row, name, place)?;
    value.map(|value| u64::try_from(value).map_err(|error| corrupt(name, place, error))).transpose()
}

fn parsed_column<T>(row: &Row, name: &str, place: &str) -> Result<T>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: &str = column(row, name, place)?;
    text.parse().map_err(|error| corrupt(name, place, error))
}

fn optional_parsed_column<T>(row: &Row, name: &str, place: &str) -> Result<Option<T>>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<&str> = column(row, name, place)?;
    text.map(|text| text.parse().map_err(|error| corrupt(name, place, error))).transpose()
}

/// A run's spec: its text, checked to be JSON.
fn spec_column(row: &Row, place: &str) -> Result<SpecJson> {
    let text: String = column(row, "spec", place)?;
    SpecJson::parse(text).map_err(|error| corrupt("spec", place, error))
}

pub(super) fn json_column(row: &Row, name: &str, place: &str) -> Result<Value> {
    let text: &str = column(row, name, place)?;
    serde_json::from_str(text).map_err(|error| corrupt(name, place, error))
}

pub(super) fn optional_json_column(row: &Row, name: &str, place: &str) -> Result<Option<Value>> {
    let text: Option<&str> = column(row, name, place)?;
    text.map(|text| serde_json::from_str(text).map_err(|error| corrupt(name, place, error))).transpose()
}

/// Reads a payload through its blob reference (`{what}_blob`) and the joined bytes
/// (`{what}_bytes`): a reference without bytes is a missing blob.
pub(super) fn blob_column(row: &Row, what: &str, place: &str) -> Result<Option<Value>> {
    let hash: Option<&str> = column(row, &format!("{what}_blob"), place)?;
    let Some(hash) = hash else {
        return Ok(None);
    };
    let bytes: Option<&[u8]> = column(row, &format!("{what}_bytes"), place)?;
    let bytes = bytes.ok_or_else(|| Error::Corrupt(format!("{what} of {place}: blob {hash} is missing")))?;
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|error| Error::Corrupt(format!("{what} of {place}: blob {hash} is not JSON: {error}")))
}

pub(super) fn corrupt(column: &str, place: &str, error: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("column {column} of {place}: {error}"))
}
