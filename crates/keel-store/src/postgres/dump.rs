//! Dump, restore and is_empty on Postgres (the order and rules are `crate::dump`'s).
//! A dump reads in one repeatable-read transaction, so it is one snapshot even while a
//! kernel writes, a page at a time through portals; a restore writes a batch verbatim in
//! the caller's transaction.

use std::collections::BTreeSet;

use deadpool_postgres::{GenericClient, Object, Transaction};
use keel_types::{RunId, WaitReason};
use serde_json::Value;
use tokio::sync::mpsc::Sender;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, Row};

use super::audit::{self, AuditColumns};
use super::queries::{self, column, execute, json_column, query_opt, query_rows};
use super::tenants::{self, TENANT_COLUMNS, TOKEN_COLUMNS};
use super::triggers;
use super::writes::{put_blobs, put_chain};
use super::{int, pg_error};
use crate::chain::{Blob, EncodedEntry};
use crate::dump::DUMP_BATCH;
use crate::{DumpItem, Error, JournalEntry, MemoryEmbedding, Result, RunRecord, search};

/// Collects items into batches of `DUMP_BATCH` and sends each full one; remembers when the
/// receiver is gone, so the dump can stop early.
struct Batches<'a> {
    sink: &'a Sender<Vec<DumpItem>>,
    batch: Vec<DumpItem>,
    gone: bool,
}

impl Batches<'_> {
    async fn push(&mut self, item: DumpItem) {
        self.batch.push(item);
        if self.batch.len() >= DUMP_BATCH {
            self.flush().await;
        }
    }

    async fn flush(&mut self) {
        if !self.batch.is_empty() && !self.gone {
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(DUMP_BATCH));
            self.gone = self.sink.send(batch).await.is_err();
        }
        self.batch.clear();
    }
}

/// Pages of a query's rows through a portal, `DUMP_BATCH` rows at a time.
async fn pages<'t>(
    transaction: &'t Transaction<'_>,
    step: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Portal<'t>> {
    let statement = transaction.prepare_cached(sql).await.map_err(pg_error(step))?;
    let portal = transaction.bind(&statement, params).await.map_err(pg_error(step))?;
    Ok(Portal { transaction, portal, step })
}

struct Portal<'t> {
    transaction: &'t tokio_postgres::Transaction<'t>,
    portal: tokio_postgres::Portal,
    step: &'static str,
}

impl Portal<'_> {
    /// The next page; empty at the end.
    async fn next(&self) -> Result<Vec<Row>> {
        let page = i32::try_from(DUMP_BATCH).unwrap_or(i32::MAX);
        self.transaction.query_portal(&self.portal, page).await.map_err(pg_error(self.step))
    }
}

/// Sends every row of `sql`, decoded, in order. Stops early (Ok) when the receiver is gone.
async fn send_rows(
    transaction: &Transaction<'_>,
    batches: &mut Batches<'_>,
    step: &'static str,
    sql: &str,
    decode: impl Fn(&Row) -> Result<DumpItem>,
) -> Result<()> {
    let portal = pages(transaction, step, sql, &[]).await?;
    loop {
        let rows = portal.next().await?;
        if rows.is_empty() || batches.gone {
            return Ok(());
        }
        for row in &rows {
            batches.push(decode(row)?).await;
        }
    }
}

pub(super) async fn dump(client: &mut Object, sink: &Sender<Vec<DumpItem>>) -> Result<()> {
    let transaction = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_error("beginning a dump"))?;
    let mut batches = Batches { sink, batch: Vec::with_capacity(DUMP_BATCH), gone: false };
    let out = &mut batches;
    send_rows(
        &transaction,
        out,
        "dumping tenants",
        &format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"),
        |row| tenants::decode_tenant(row).map(DumpItem::Tenant),
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping API tokens",
        &format!("SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY tenant, created_at_ms, hash"),
        |row| tenants::decode_token(row).map(DumpItem::Token),
    )
    .await?;
    dump_runs(&transaction, out).await?;
    send_rows(
        &transaction,
        out,
        "dumping subscriptions",
        "SELECT tenant, topic, run_id FROM subscriptions ORDER BY tenant, topic, run_id",
        |row| {
            let place = "a subscription";
            Ok(DumpItem::Subscription {
                tenant: column(row, "tenant", place)?,
                topic: column(row, "topic", place)?,
                run: parse_run(column(row, "run_id", place)?, place)?,
            })
        },
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping kv values",
        "SELECT scope, key, value FROM kv ORDER BY scope, key",
        |row| {
            let scope: String = column(row, "scope", "a kv value")?;
            let key: String = column(row, "key", "a kv value")?;
            let value = json_column(row, "value", &format!("kv key {key:?} in scope {scope:?}"))?;
            Ok(DumpItem::Kv { scope, key, value })
        },
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping threads",
        "SELECT t.tenant AS tenant, t.thread AS thread, t.idx AS idx, t.appended_at_ms AS appended_at_ms, \
         t.idempotency_key AS idempotency_key, t.message_blob AS message_blob, b.bytes AS message_bytes \
         FROM thread_messages t LEFT JOIN blobs b ON b.hash = t.message_blob ORDER BY t.tenant, t.thread, t.idx",
        |row| {
            let tenant: String = column(row, "tenant", "a thread message")?;
            let thread: String = column(row, "thread", "a thread message")?;
            let place = format!("thread {thread:?} of tenant {tenant:?}");
            Ok(DumpItem::Thread {
                message: queries::decode_thread_message(row, &place)?,
                idempotency_key: column(row, "idempotency_key", &place)?,
                tenant,
                thread,
            })
        },
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping memory records",
        "SELECT m.tenant AS tenant, m.namespace AS namespace, m.key AS key, m.value AS value, m.text AS text, \
         m.updated_at_ms AS updated_at_ms, e.model AS model, e.vector AS vector \
         FROM memory m LEFT JOIN memory_embeddings e ON e.memory_id = m.id ORDER BY m.tenant, m.namespace, m.key",
        |row| {
            let tenant: String = column(row, "tenant", "a memory record")?;
            let record = queries::decode_memory(row, &tenant)?;
            let place = format!("the embedding of memory record {:?} of tenant {tenant:?}", record.key);
            let model: Option<String> = column(row, "model", &place)?;
            let vector: Option<&[u8]> = column(row, "vector", &place)?;
            let embedding = match (model, vector) {
                (Some(model), Some(bytes)) => Some(MemoryEmbedding {
                    model,
                    vector: search::vector_from_bytes(bytes).ok_or_else(|| {
                        Error::Corrupt(format!("{place}: {} bytes is not a whole number of f32s", bytes.len()))
                    })?,
                }),
                _ => None,
            };
            Ok(DumpItem::Memory { tenant, record, embedding })
        },
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping memory deletes",
        "SELECT tenant, idempotency_key, deleted FROM memory_deletes ORDER BY tenant, idempotency_key",
        |row| {
            let place = "a memory delete";
            Ok(DumpItem::MemoryDelete {
                tenant: column(row, "tenant", place)?,
                idempotency_key: column(row, "idempotency_key", place)?,
                deleted: column(row, "deleted", place)?,
            })
        },
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping triggers",
        &format!("SELECT {} FROM triggers ORDER BY kind, name", triggers::TRIGGER_COLUMNS),
        |row| triggers::decode_trigger(row).map(DumpItem::Trigger),
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping trigger fires",
        &format!("SELECT {} FROM trigger_fires ORDER BY kind, trigger, occasion", triggers::FIRE_COLUMNS),
        |row| triggers::decode_fire(row).map(DumpItem::Fire),
    )
    .await?;
    send_rows(
        &transaction,
        out,
        "dumping the audit log",
        &format!("SELECT {} FROM audit ORDER BY seq", audit::COLUMNS),
        |row| audit::decode(row).map(DumpItem::Audit).map_err(Error::Corrupt),
    )
    .await?;
    out.flush().await;
    Ok(())
}

/// Runs by id, each followed by its journal, events and mailbox.
async fn dump_runs(transaction: &Transaction<'_>, out: &mut Batches<'_>) -> Result<()> {
    let portal = pages(
        transaction,
        "dumping runs",
        &format!("SELECT {} FROM runs ORDER BY id", queries::RUN_COLUMNS),
        &[],
    )
    .await?;
    loop {
        let rows = portal.next().await?;
        if rows.is_empty() || out.gone {
            return Ok(());
        }
        for row in &rows {
            let run = queries::decode_run(row)?;
            let id = run.id.clone();
            out.push(DumpItem::Run(run)).await;
            for entry in queries::journal(transaction, &id, 0).await? {
                out.push(DumpItem::Entry { run: id.clone(), entry }).await;
            }
            let events = query_rows(
                transaction,
                "dumping events",
                "SELECT seq, ts_ms, kind, data FROM events WHERE run_id = $1 ORDER BY seq",
                &[&id.as_str()],
            )
            .await?;
            for row in &events {
                out.push(DumpItem::Event { run: id.clone(), event: queries::decode_event(row, &id)? }).await;
            }
            let mail = query_rows(
                transaction,
                "dumping a mailbox",
                &format!(
                    "SELECT {}, send_key, receive_key FROM mailbox WHERE run_id = $1 ORDER BY seq",
                    queries::MAILBOX_COLUMNS
                ),
                &[&id.as_str()],
            )
            .await?;
            for row in &mail {
                let message = queries::decode_message(row, &id)?;
                let place = format!("mailbox message {} of run {id}", message.seq);
                out.push(DumpItem::Mail {
                    run: id.clone(),
                    send_key: column(row, "send_key", &place)?,
                    receive_key: column(row, "receive_key", &place)?,
                    message,
                })
                .await;
            }
        }
    }
}

fn parse_run(text: String, place: &str) -> Result<RunId> {
    RunId::parse(&text).map_err(|error| Error::Corrupt(format!("{place}: run id {text:?}: {error}")))
}

/// Writes a batch verbatim in the caller's transaction. Plain `INSERT`s: an item already
/// there fails the batch. The runs' seq counters are set from what their journals and
/// event logs hold, and the audit head follows the last audit entry.
pub(super) async fn restore(transaction: &Transaction<'_>, items: Vec<DumpItem>) -> Result<()> {
    let mut touched_runs: BTreeSet<String> = BTreeSet::new();
    let mut audit = AuditColumns::default();
    let mut audit_head: Option<(u64, String)> = None;
    for item in items {
        match item {
            DumpItem::Tenant(tenant) => {
                execute(
                    transaction,
                    "restoring a tenant",
                    &format!("INSERT INTO tenants ({TENANT_COLUMNS}) VALUES ($1, $2, $3)"),
                    &[&tenant.name, &int(tenant.created_at_ms), &tenant.quota.to_string()],
                )
                .await?;
            }
            DumpItem::Token(token) => {
                execute(
                    transaction,
                    "restoring an API token",
                    &format!("INSERT INTO api_tokens ({TOKEN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"),
                    &[
                        &token.hash,
                        &token.prefix,
                        &token.tenant,
                        &int(token.created_at_ms),
                        &token.label,
                        &token.revoked,
                    ],
                )
                .await?;
            }
            DumpItem::Run(run) => restore_run(transaction, &run).await?,
            DumpItem::Entry { run, entry } => {
                restore_entry(transaction, &run, &entry).await?;
                touched_runs.insert(run.as_str().to_owned());
            }
            DumpItem::Event { run, event } => {
                execute(
                    transaction,
                    "restoring an event",
                    "INSERT INTO events (run_id, seq, ts_ms, kind, data) VALUES ($1, $2, $3, $4, $5)",
                    &[
                        &run.as_str(),
                        &int(event.seq),
                        &int(event.ts_ms),
                        &event.kind,
                        &event.data.to_string(),
                    ],
                )
                .await?;
                touched_runs.insert(run.as_str().to_owned());
            }
            DumpItem::Mail { run, message, send_key, receive_key } => {
                execute(
                    transaction,
                    "restoring a mailbox message",
                    "INSERT INTO mailbox (run_id, seq, from_run, message, correlation_id, topic, send_key, \
                     receive_key, sent_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[
                        &run.as_str(),
                        &int(message.seq),
                        &message.from.as_ref().map(RunId::as_str),
                        &message.message.to_string(),
                        &message.correlation_id,
                        &message.topic,
                        &send_key,
                        &receive_key,
                        &int(message.sent_at_ms),
                    ],
                )
                .await?;
            }
            DumpItem::Subscription { tenant, topic, run } => {
                execute(
                    transaction,
                    "restoring a subscription",
                    "INSERT INTO subscriptions (tenant, topic, run_id) VALUES ($1, $2, $3)",
                    &[&tenant, &topic, &run.as_str()],
                )
                .await?;
            }
            DumpItem::Kv { scope, key, value } => {
                execute(
                    transaction,
                    "restoring a kv value",
                    "INSERT INTO kv (scope, key, value) VALUES ($1, $2, $3)",
                    &[&scope, &key, &value.to_string()],
                )
                .await?;
            }
            DumpItem::Thread { tenant, thread, message, idempotency_key } => {
                let blob = Blob::of(&message.message);
                put_blobs(transaction, &[&blob]).await?;
                execute(
                    transaction,
                    "restoring a thread message",
                    "INSERT INTO thread_messages (tenant, thread, idx, message_blob, idempotency_key, appended_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[&tenant, &thread, &int(message.index), &blob.hash, &idempotency_key, &int(message.appended_at_ms)],
                )
                .await?;
            }
            DumpItem::Memory { tenant, record, embedding } => {
                let id = query_opt(
                    transaction,
                    "restoring a memory record",
                    "INSERT INTO memory (tenant, namespace, key, value, text, updated_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                    &[
                        &tenant,
                        &record.namespace,
                        &record.key,
                        &record.value.to_string(),
                        &record.text,
                        &int(record.updated_at_ms),
                    ],
                )
                .await?
                .map(|row| row.get::<_, i64>("id"))
                .ok_or_else(|| Error::Corrupt("restoring a memory record inserted no row".to_owned()))?;
                if let Some(embedding) = embedding {
                    execute(
                        transaction,
                        "restoring a memory embedding",
                        "INSERT INTO memory_embeddings (memory_id, model, dims, vector) VALUES ($1, $2, $3, $4)",
                        &[
                            &id,
                            &embedding.model,
                            &i32::try_from(embedding.vector.len()).unwrap_or(i32::MAX),
                            &search::vector_to_bytes(&embedding.vector),
                        ],
                    )
                    .await?;
                }
            }
            DumpItem::MemoryDelete { tenant, idempotency_key, deleted } => {
                execute(
                    transaction,
                    "restoring a memory delete",
                    "INSERT INTO memory_deletes (tenant, idempotency_key, deleted) VALUES ($1, $2, $3)",
                    &[&tenant, &idempotency_key, &deleted],
                )
                .await?;
            }
            DumpItem::Trigger(trigger) => triggers::create(transaction, &trigger).await?,
            DumpItem::Fire(fire) => {
                let (_, inserted) = triggers::fire(transaction, fire).await?;
                if !inserted {
                    return Err(Error::Corrupt("a dump holds one trigger fire twice".into()));
                }
            }
            DumpItem::Audit(entry) => {
                audit.push(entry.seq, &entry.record, &entry.prev_hash, &entry.hash);
                audit_head = Some((entry.seq, entry.hash));
            }
        }
    }
    audit.insert(transaction).await?;
    if let Some((seq, hash)) = audit_head {
        execute(
            transaction,
            "moving the audit head",
            "INSERT INTO audit_head (id, seq, hash) VALUES (0, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
            &[&int(seq), &hash],
        )
        .await?;
    }
    if !touched_runs.is_empty() {
        let runs: Vec<String> = touched_runs.into_iter().collect();
        execute(
            transaction,
            "setting restored runs' seq counters",
            "UPDATE runs SET \
             journal_last = (SELECT COALESCE(MAX(seq), 0) FROM journal WHERE run_id = runs.id) \
             WHERE id = ANY($1)",
            &[&runs],
        )
        .await?;
        execute(
            transaction,
            "setting restored runs' event counters",
            "INSERT INTO event_heads (run_id, events_last) \
             SELECT id, (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = runs.id) FROM runs \
             WHERE id = ANY($1) \
             ON CONFLICT (run_id) DO UPDATE SET events_last = excluded.events_last",
            &[&runs],
        )
        .await?;
    }
    Ok(())
}

async fn restore_run(transaction: &Transaction<'_>, run: &RunRecord) -> Result<()> {
    let usage = &run.usage;
    execute(
        transaction,
        "restoring a run",
        &format!("INSERT INTO runs ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)", queries::RUN_COLUMNS),
        &[
            &run.id.as_str(),
            &run.tenant,
            &run.spec.to_string(),
            &run.state.as_str(),
            &run.wait_reason.map(WaitReason::as_str),
            &int(run.created_at_ms),
            &int(run.updated_at_ms),
            &run.ended_at_ms.map(int),
            &i64::from(run.attempt),
            &run.pid.map(i64::from),
            &run.exit_code,
            &run.output.as_ref().map(Value::to_string),
            &run.error,
            &int(usage.input_tokens),
            &int(usage.output_tokens),
            &int(usage.llm_calls),
            &int(usage.tool_calls),
            &int(usage.cost_micro_usd),
            &int(run.provider_calls),
        ],
    )
    .await?;
    Ok(())
}

/// An entry as dumped: its payloads stored as `append_entry` stores them (params split
/// into the message chain), its seq, status and usage as given; the run's totals are not
/// touched (the run item carries them).
async fn restore_entry(transaction: &Transaction<'_>, run: &RunId, entry: &JournalEntry) -> Result<()> {
    let encoded = EncodedEntry::of_recorded(entry);
    let (params, result, error) = (&encoded.params, &encoded.result, &encoded.error);
    let mut blobs: Vec<&Blob> = vec![params];
    blobs.extend(encoded.params_chain.iter().map(|link| &link.message));
    blobs.extend(result.iter().chain(error));
    put_blobs(transaction, &blobs).await?;
    put_chain(transaction, &encoded.params_chain).await?;
    let usage = &entry.usage;
    execute(
        transaction,
        "restoring a journal entry",
        "INSERT INTO journal (run_id, seq, method, params_hash, params_blob, status, result_blob, error_blob, \
         attempt, started_at_ms, finished_at_ms, input_tokens, output_tokens, llm_calls, tool_calls, \
         cost_micro_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        &[
            &run.as_str(),
            &int(entry.seq),
            &entry.method,
            &entry.params_hash,
            &params.hash,
            &entry.status.as_str(),
            &result.as_ref().map(|blob| blob.hash.as_str()),
            &error.as_ref().map(|blob| blob.hash.as_str()),
            &i64::from(entry.attempt),
            &int(entry.started_at_ms),
            &entry.finished_at_ms.map(int),
            &int(usage.input_tokens),
            &int(usage.output_tokens),
            &int(usage.llm_calls),
            &int(usage.tool_calls),
            &int(usage.cost_micro_usd),
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn is_empty(client: &impl GenericClient) -> Result<bool> {
    let row = query_opt(
        client,
        "checking the store is empty",
        "SELECT NOT (EXISTS (SELECT 1 FROM tenants) OR EXISTS (SELECT 1 FROM runs) \
         OR EXISTS (SELECT 1 FROM kv) OR EXISTS (SELECT 1 FROM thread_messages) \
         OR EXISTS (SELECT 1 FROM memory) OR EXISTS (SELECT 1 FROM triggers) \
         OR EXISTS (SELECT 1 FROM trigger_fires) OR EXISTS (SELECT 1 FROM audit)) AS empty",
        &[],
    )
    .await?;
    row.map_or(Ok(true), |row| column(&row, "empty", "the emptiness check"))
}
