//! Dumping an SQLite store as `DumpItem`s and restoring a dump into an empty one (see
//! `crate::dump` for the order and the contract).
//!
//! A dump is read one batch per read transaction, resuming from a `Cursor` (keyset
//! paging over each table's primary key or a unique index), so no transaction stays open
//! between batches and a dump of any size holds one batch in memory. A restore runs in
//! the writer thread like every write: one command, one savepoint, committed with its
//! batch.

use keel_types::{RunId, WaitReason};
use rusqlite::{Connection, params};
use serde_json::Value;

use super::queries::{
    self, MAILBOX_COLUMNS, blob_column, column, decode_message, json_column, query_all, query_first,
    seq_param,
};
use super::tenants::{TENANT_COLUMNS, TOKEN_COLUMNS, decode_tenant, decode_token};
use super::triggers::{FIRE_COLUMNS, TRIGGER_COLUMNS, decode_fire, decode_trigger};
use super::writer::{insert_entry, put_blob, run_sql, sql_error};
use crate::chain::{Blob, EncodedEntry};
use crate::dump::DUMP_BATCH;
use crate::search;
use crate::{AuditFilter, DumpItem, Error, JournalEntry, MemoryEmbedding, MemoryRecord, Result, Seq};

/// Where a dump is: the section it reads and the last item it sent from there (`None`:
/// the section's start). Sections follow the dump order of `crate::dump`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cursor {
    Tenants {
        after: Option<String>,
    },
    /// After (tenant, created_at_ms, hash).
    Tokens {
        after: Option<(String, u64, String)>,
    },
    /// The next run after this one.
    Runs {
        after: Option<RunId>,
    },
    Journal {
        run: RunId,
        after: Seq,
    },
    Events {
        run: RunId,
        after: Seq,
    },
    Mailbox {
        run: RunId,
        after: Seq,
    },
    /// After (tenant, topic, run).
    Subscriptions {
        after: Option<(String, String, String)>,
    },
    /// After (scope, key).
    Kv {
        after: Option<(String, String)>,
    },
    /// After (tenant, thread, index).
    Threads {
        after: Option<(String, String, u64)>,
    },
    /// After (tenant, namespace, key).
    Memory {
        after: Option<(String, String, String)>,
    },
    /// After (tenant, idempotency key).
    MemoryDeletes {
        after: Option<(String, String)>,
    },
    /// After (kind, name).
    Triggers {
        after: Option<(String, String)>,
    },
    /// After (kind, trigger, occasion).
    Fires {
        after: Option<(String, String, String)>,
    },
    Audit {
        after: Seq,
    },
    Done,
}

impl Cursor {
    pub(super) fn start() -> Cursor {
        Cursor::Tenants { after: None }
    }
}

/// Reads the next batch (at most `DUMP_BATCH` items; fewer only at the end) from
/// `cursor` on, and where the batch after it starts.
pub(super) fn read_batch(connection: &Connection, mut cursor: Cursor) -> Result<(Vec<DumpItem>, Cursor)> {
    let mut items = Vec::with_capacity(DUMP_BATCH);
    while items.len() < DUMP_BATCH && cursor != Cursor::Done {
        cursor = read_section(connection, cursor, DUMP_BATCH - items.len(), &mut items)?;
    }
    Ok((items, cursor))
}

/// Appends up to `room` items of the cursor's section to `items` and returns where to go
/// on: the same section after the last item read when `room` ran out, else the next one.
fn read_section(
    connection: &Connection,
    cursor: Cursor,
    room: usize,
    items: &mut Vec<DumpItem>,
) -> Result<Cursor> {
    let limit = i64::try_from(room).unwrap_or(i64::MAX);
    // Whether a page came back full, so the section may have more.
    let full = |read: usize| read == room;
    Ok(match cursor {
        Cursor::Tenants { after } => {
            let tenants = query_all(
                connection,
                "dumping tenants",
                &format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE ?1 IS NULL OR name > ?1 ORDER BY name LIMIT ?2"
                ),
                params![after, limit],
                decode_tenant,
            )?;
            let next = tenants.last().map(|tenant| tenant.name.clone());
            let read = tenants.len();
            items.extend(tenants.into_iter().map(DumpItem::Tenant));
            if full(read) { Cursor::Tenants { after: next } } else { Cursor::Tokens { after: None } }
        }
        Cursor::Tokens { after } => {
            let (tenant, created_at_ms, hash) =
                after.map_or((None, 0, None), |(t, c, h)| (Some(t), c, Some(h)));
            // Tokens are few (a handful a tenant), so sorting them per page is cheap.
            let tokens = query_all(
                connection,
                "dumping API tokens",
                &format!(
                    "SELECT {TOKEN_COLUMNS} FROM api_tokens \
                     WHERE ?1 IS NULL OR (tenant, created_at_ms, hash) > (?1, ?2, ?3) \
                     ORDER BY tenant, created_at_ms, hash LIMIT ?4"
                ),
                params![tenant, seq_param(created_at_ms), hash, limit],
                decode_token,
            )?;
            let next = tokens.last().map(|t| (t.tenant.clone(), t.created_at_ms, t.hash.clone()));
            let read = tokens.len();
            items.extend(tokens.into_iter().map(DumpItem::Token));
            if full(read) { Cursor::Tokens { after: next } } else { Cursor::Runs { after: None } }
        }
        Cursor::Runs { after } => {
            let run = query_first(
                connection,
                "dumping runs",
                &format!(
                    "SELECT {} FROM runs WHERE ?1 IS NULL OR id > ?1 ORDER BY id LIMIT 1",
                    queries::RUN_COLUMNS
                ),
                params![after.as_ref().map(RunId::as_str)],
                queries::decode_run,
            )?;
            match run {
                Some(run) => {
                    let id = run.id.clone();
                    items.push(DumpItem::Run(run));
                    Cursor::Journal { run: id, after: 0 }
                }
                None => Cursor::Subscriptions { after: None },
            }
        }
        Cursor::Journal { run, after } => {
            let entries = queries::journal_page(connection, &run, after, Some(room))?;
            let next = entries.last().map_or(after, |entry| entry.seq);
            let read = entries.len();
            items.extend(entries.into_iter().map(|entry| DumpItem::Entry { run: run.clone(), entry }));
            if full(read) { Cursor::Journal { run, after: next } } else { Cursor::Events { run, after: 0 } }
        }
        Cursor::Events { run, after } => {
            let events = queries::events(connection, &run, after, room)?;
            let next = events.last().map_or(after, |event| event.seq);
            let read = events.len();
            items.extend(events.into_iter().map(|event| DumpItem::Event { run: run.clone(), event }));
            if full(read) { Cursor::Events { run, after: next } } else { Cursor::Mailbox { run, after: 0 } }
        }
        Cursor::Mailbox { run, after } => {
            let mail = query_all(
                connection,
                "dumping a mailbox",
                &format!(
                    "SELECT {MAILBOX_COLUMNS}, send_key, receive_key FROM mailbox \
                     WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
                ),
                params![run.as_str(), seq_param(after), limit],
                |row| {
                    let message = decode_message(row, &run)?;
                    let place = format!("mailbox message {} of run {run}", message.seq);
                    Ok(DumpItem::Mail {
                        run: run.clone(),
                        send_key: column(row, "send_key", &place)?,
                        receive_key: column(row, "receive_key", &place)?,
                        message,
                    })
                },
            )?;
            let next = match mail.last() {
                Some(DumpItem::Mail { message, .. }) => message.seq,
                _ => after,
            };
            let read = mail.len();
            items.extend(mail);
            if full(read) { Cursor::Mailbox { run, after: next } } else { Cursor::Runs { after: Some(run) } }
        }
        Cursor::Subscriptions { after } => {
            let (tenant, topic, run) =
                after.map_or((None, None, None), |(a, b, c)| (Some(a), Some(b), Some(c)));
            let subscriptions = query_all(
                connection,
                "dumping subscriptions",
                "SELECT tenant, topic, run_id FROM subscriptions \
                 WHERE ?1 IS NULL OR (tenant, topic, run_id) > (?1, ?2, ?3) \
                 ORDER BY tenant, topic, run_id LIMIT ?4",
                params![tenant, topic, run, limit],
                |row| {
                    let place = "a subscription";
                    let run: String = column(row, "run_id", place)?;
                    Ok((column(row, "tenant", place)?, column(row, "topic", place)?, run))
                },
            )?;
            let next = subscriptions.last().cloned();
            let read = subscriptions.len();
            for (tenant, topic, run) in subscriptions {
                let run = RunId::parse(&run)
                    .map_err(|error| Error::Corrupt(format!("a subscriber of topic {topic:?}: {error}")))?;
                items.push(DumpItem::Subscription { tenant, topic, run });
            }
            if full(read) { Cursor::Subscriptions { after: next } } else { Cursor::Kv { after: None } }
        }
        Cursor::Kv { after } => {
            let (scope, key) = after.map_or((None, None), |(scope, key)| (Some(scope), Some(key)));
            let values = query_all(
                connection,
                "dumping kv values",
                "SELECT scope, key, value FROM kv WHERE ?1 IS NULL OR (scope, key) > (?1, ?2) \
                 ORDER BY scope, key LIMIT ?3",
                params![scope, key, limit],
                |row| {
                    let scope: String = column(row, "scope", "a kv value")?;
                    let key: String = column(row, "key", "a kv value")?;
                    let value = json_column(row, "value", &format!("kv key {key:?} in scope {scope:?}"))?;
                    Ok((scope, key, value))
                },
            )?;
            let next = values.last().map(|(scope, key, _)| (scope.clone(), key.clone()));
            let read = values.len();
            items.extend(values.into_iter().map(|(scope, key, value)| DumpItem::Kv { scope, key, value }));
            if full(read) { Cursor::Kv { after: next } } else { Cursor::Threads { after: None } }
        }
        Cursor::Threads { after } => {
            let (tenant, thread, index) = after.map_or((None, None, 0), |(a, b, c)| (Some(a), Some(b), c));
            let messages = query_all(
                connection,
                "dumping thread messages",
                "SELECT t.tenant AS tenant, t.thread AS thread, t.idx AS idx, \
                 t.appended_at_ms AS appended_at_ms, t.idempotency_key AS idempotency_key, \
                 t.message_blob AS message_blob, b.bytes AS message_bytes \
                 FROM thread_messages t LEFT JOIN blobs b ON b.hash = t.message_blob \
                 WHERE ?1 IS NULL OR (t.tenant, t.thread, t.idx) > (?1, ?2, ?3) \
                 ORDER BY t.tenant, t.thread, t.idx LIMIT ?4",
                params![tenant, thread, seq_param(index), limit],
                |row| {
                    let tenant: String = column(row, "tenant", "a thread message")?;
                    let thread: String = column(row, "thread", "a thread message")?;
                    let index: u64 = column(row, "idx", "a thread message")?;
                    let place = format!("message {index} of thread {thread:?} of tenant {tenant:?}");
                    let message = crate::ThreadMessage {
                        index,
                        message: blob_column(row, "message", &place)?
                            .ok_or_else(|| Error::Corrupt(format!("{place} references no blob")))?,
                        appended_at_ms: column(row, "appended_at_ms", &place)?,
                    };
                    let idempotency_key = column(row, "idempotency_key", &place)?;
                    Ok(DumpItem::Thread { tenant, thread, message, idempotency_key })
                },
            )?;
            let next = match messages.last() {
                Some(DumpItem::Thread { tenant, thread, message, .. }) => {
                    Some((tenant.clone(), thread.clone(), message.index))
                }
                _ => None,
            };
            let read = messages.len();
            items.extend(messages);
            if full(read) { Cursor::Threads { after: next } } else { Cursor::Memory { after: None } }
        }
        Cursor::Memory { after } => {
            let (tenant, namespace, key) =
                after.map_or((None, None, None), |(a, b, c)| (Some(a), Some(b), Some(c)));
            let records = query_all(
                connection,
                "dumping memory records",
                "SELECT m.tenant AS tenant, m.namespace AS namespace, m.key AS key, m.value AS value, \
                 m.text AS text, m.updated_at_ms AS updated_at_ms, e.model AS model, e.dims AS dims, \
                 e.vector AS vector \
                 FROM memory m LEFT JOIN memory_embeddings e ON e.memory_id = m.id \
                 WHERE ?1 IS NULL OR (m.tenant, m.namespace, m.key) > (?1, ?2, ?3) \
                 ORDER BY m.tenant, m.namespace, m.key LIMIT ?4",
                params![tenant, namespace, key, limit],
                decode_memory,
            )?;
            let next = match records.last() {
                Some(DumpItem::Memory { tenant, record, .. }) => {
                    Some((tenant.clone(), record.namespace.clone(), record.key.clone()))
                }
                _ => None,
            };
            let read = records.len();
            items.extend(records);
            if full(read) { Cursor::Memory { after: next } } else { Cursor::MemoryDeletes { after: None } }
        }
        Cursor::MemoryDeletes { after } => {
            let (tenant, key) = after.map_or((None, None), |(tenant, key)| (Some(tenant), Some(key)));
            let deletes = query_all(
                connection,
                "dumping memory deletes",
                "SELECT tenant, idempotency_key, deleted FROM memory_deletes \
                 WHERE ?1 IS NULL OR (tenant, idempotency_key) > (?1, ?2) \
                 ORDER BY tenant, idempotency_key LIMIT ?3",
                params![tenant, key, limit],
                |row| {
                    let place = "a remembered memory delete";
                    Ok(DumpItem::MemoryDelete {
                        tenant: column(row, "tenant", place)?,
                        idempotency_key: column(row, "idempotency_key", place)?,
                        deleted: column(row, "deleted", place)?,
                    })
                },
            )?;
            let next = match deletes.last() {
                Some(DumpItem::MemoryDelete { tenant, idempotency_key, .. }) => {
                    Some((tenant.clone(), idempotency_key.clone()))
                }
                _ => None,
            };
            let read = deletes.len();
            items.extend(deletes);
            if full(read) { Cursor::MemoryDeletes { after: next } } else { Cursor::Triggers { after: None } }
        }
        Cursor::Triggers { after } => {
            let (kind, name) = after.map_or((None, None), |(kind, name)| (Some(kind), Some(name)));
            let triggers = query_all(
                connection,
                "dumping triggers",
                &format!(
                    "SELECT {TRIGGER_COLUMNS} FROM triggers WHERE ?1 IS NULL OR (kind, name) > (?1, ?2) \
                     ORDER BY kind, name LIMIT ?3"
                ),
                params![kind, name, limit],
                decode_trigger,
            )?;
            let next = triggers.last().map(|trigger| (trigger.kind.clone(), trigger.name.clone()));
            let read = triggers.len();
            items.extend(triggers.into_iter().map(DumpItem::Trigger));
            if full(read) { Cursor::Triggers { after: next } } else { Cursor::Fires { after: None } }
        }
        Cursor::Fires { after } => {
            let (kind, trigger, occasion) =
                after.map_or((None, None, None), |(a, b, c)| (Some(a), Some(b), Some(c)));
            let fires = query_all(
                connection,
                "dumping trigger fires",
                &format!(
                    "SELECT {FIRE_COLUMNS} FROM trigger_fires \
                     WHERE ?1 IS NULL OR (kind, trigger, occasion) > (?1, ?2, ?3) \
                     ORDER BY kind, trigger, occasion LIMIT ?4"
                ),
                params![kind, trigger, occasion, limit],
                decode_fire,
            )?;
            let next =
                fires.last().map(|fire| (fire.kind.clone(), fire.trigger.clone(), fire.occasion.clone()));
            let read = fires.len();
            items.extend(fires.into_iter().map(DumpItem::Fire));
            if full(read) { Cursor::Fires { after: next } } else { Cursor::Audit { after: 0 } }
        }
        Cursor::Audit { after } => {
            let filter = AuditFilter {
                after_seq: after,
                limit: Some(u32::try_from(room).unwrap_or(u32::MAX)),
                ..AuditFilter::default()
            };
            let entries = super::audit::list(connection, &filter)?;
            let next = entries.last().map_or(after, |entry| entry.seq);
            let read = entries.len();
            items.extend(entries.into_iter().map(DumpItem::Audit));
            if full(read) { Cursor::Audit { after: next } } else { Cursor::Done }
        }
        Cursor::Done => Cursor::Done,
    })
}

fn decode_memory(row: &rusqlite::Row<'_>) -> Result<DumpItem> {
    let tenant: String = column(row, "tenant", "a memory record")?;
    let namespace: String = column(row, "namespace", "a memory record")?;
    let key: String = column(row, "key", "a memory record")?;
    let place = format!("memory record {key:?} in namespace {namespace:?} of tenant {tenant:?}");
    let model: Option<String> = column(row, "model", &place)?;
    let embedding = match model {
        None => None,
        Some(model) => {
            let dims: i64 = column(row, "dims", &place)?;
            let bytes: Vec<u8> = column(row, "vector", &place)?;
            let vector = search::vector_from_bytes(&bytes)
                .filter(|vector| i64::try_from(vector.len()) == Ok(dims))
                .ok_or_else(|| {
                    Error::Corrupt(format!(
                        "the embedding of {place} has {} bytes, not the {dims} f32 values it claims",
                        bytes.len()
                    ))
                })?;
            Some(MemoryEmbedding { model, vector })
        }
    };
    Ok(DumpItem::Memory {
        record: MemoryRecord {
            value: json_column(row, "value", &place)?,
            text: column(row, "text", &place)?,
            updated_at_ms: column(row, "updated_at_ms", &place)?,
            namespace,
            key,
        },
        embedding,
        tenant,
    })
}

/// Whether the store holds nothing a restore would write (see `Store::is_empty`; the
/// content-addressed blobs and message chain only exist for the rows that name them).
pub(super) fn is_empty(connection: &Connection) -> Result<bool> {
    let tables = [
        "tenants",
        "api_tokens",
        "runs",
        "subscriptions",
        "kv",
        "thread_messages",
        "memory",
        "memory_deletes",
        "triggers",
        "trigger_fires",
        "audit",
    ];
    let any = tables.map(|table| format!("EXISTS (SELECT 1 FROM {table})")).join(" OR ");
    let held = query_first(connection, "checking the store is empty", &format!("SELECT {any}"), [], |row| {
        row.get::<_, bool>(0).map_err(sql_error("checking the store is empty"))
    })?;
    Ok(!held.unwrap_or(false))
}

/// Writes a batch of a dump as it is, inside the writer's savepoint (all or nothing).
/// Payloads are encoded here, in the writer thread, unlike the other writes: a restore
/// fills a store nothing else uses yet, so there is no other caller to keep waiting.
pub(super) fn restore(connection: &Connection, items: Vec<DumpItem>) -> Result<()> {
    let mut audit_head = None;
    for item in items {
        match item {
            DumpItem::Tenant(tenant) => {
                run_sql(
                    connection,
                    "restoring a tenant",
                    &format!("INSERT INTO tenants ({TENANT_COLUMNS}) VALUES (?1, ?2, ?3)"),
                    params![tenant.name, seq_param(tenant.created_at_ms), tenant.quota.to_string()],
                )?;
            }
            DumpItem::Token(token) => super::tenants::create_token(connection, &token)?,
            DumpItem::Run(run) => {
                run_sql(
                    connection,
                    "restoring a run",
                    &format!(
                        "INSERT INTO runs ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
                         ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
                        queries::RUN_COLUMNS
                    ),
                    params![
                        run.id.as_str(),
                        run.tenant,
                        run.spec.to_string(),
                        run.state.as_str(),
                        run.wait_reason.map(WaitReason::as_str),
                        run.created_at_ms,
                        run.updated_at_ms,
                        run.ended_at_ms,
                        run.attempt,
                        run.pid,
                        run.exit_code,
                        run.output.as_ref().map(Value::to_string),
                        run.error,
                        run.usage.input_tokens,
                        run.usage.output_tokens,
                        run.usage.llm_calls,
                        run.usage.tool_calls,
                        run.usage.cost_micro_usd,
                        run.provider_calls,
                    ],
                )?;
            }
            DumpItem::Entry { run, entry } => restore_entry(connection, &run, &entry)?,
            DumpItem::Event { run, event } => {
                run_sql(
                    connection,
                    "restoring an event",
                    "INSERT INTO events (run_id, seq, ts_ms, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        run.as_str(),
                        seq_param(event.seq),
                        event.ts_ms,
                        event.kind,
                        event.data.to_string()
                    ],
                )?;
            }
            DumpItem::Mail { run, message, send_key, receive_key } => {
                run_sql(
                    connection,
                    "restoring a mailbox message",
                    "INSERT INTO mailbox (run_id, seq, from_run, message, correlation_id, topic, send_key, \
                     receive_key, sent_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![
                        run.as_str(),
                        seq_param(message.seq),
                        message.from.as_ref().map(RunId::as_str),
                        message.message.to_string(),
                        message.correlation_id,
                        message.topic,
                        send_key,
                        receive_key,
                        message.sent_at_ms,
                    ],
                )?;
            }
            DumpItem::Subscription { tenant, topic, run } => {
                run_sql(
                    connection,
                    "restoring a subscription",
                    "INSERT INTO subscriptions (tenant, topic, run_id) VALUES (?1, ?2, ?3)",
                    params![tenant, topic, run.as_str()],
                )?;
            }
            DumpItem::Kv { scope, key, value } => {
                run_sql(
                    connection,
                    "restoring a kv value",
                    "INSERT INTO kv (scope, key, value) VALUES (?1, ?2, ?3)",
                    params![scope, key, value.to_string()],
                )?;
            }
            DumpItem::Thread { tenant, thread, message, idempotency_key } => {
                let blob = Blob::of(&message.message);
                put_blob(connection, &blob)?;
                run_sql(
                    connection,
                    "restoring a thread message",
                    "INSERT INTO thread_messages (tenant, thread, idx, message_blob, idempotency_key, \
                     appended_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        tenant,
                        thread,
                        seq_param(message.index),
                        blob.hash,
                        idempotency_key,
                        message.appended_at_ms
                    ],
                )?;
            }
            DumpItem::Memory { tenant, record, embedding } => {
                restore_memory(connection, &tenant, &record, embedding.as_ref())?;
            }
            DumpItem::MemoryDelete { tenant, idempotency_key, deleted } => {
                run_sql(
                    connection,
                    "restoring a memory delete",
                    "INSERT INTO memory_deletes (tenant, idempotency_key, deleted) VALUES (?1, ?2, ?3)",
                    params![tenant, idempotency_key, deleted],
                )?;
            }
            DumpItem::Trigger(trigger) => super::triggers::create(connection, &trigger)?,
            DumpItem::Fire(fire) => {
                let (_, inserted) = super::triggers::fire(connection, fire)?;
                if !inserted {
                    return Err(Error::Corrupt("a dump holds one trigger fire twice".into()));
                }
            }
            DumpItem::Audit(entry) => {
                super::audit::insert_entry(connection, &entry)?;
                audit_head = Some((entry.seq, entry.hash));
            }
        }
    }
    // Audit entries come last and in seq order, so the last one restored is the head.
    if let Some((seq, hash)) = audit_head {
        super::audit::set_head(connection, seq, &hash)?;
    }
    Ok(())
}

/// A journal entry with its seq, status and usage as given: the run's totals were
/// restored with the run, so nothing is added to them. Params are stored as `append_entry`
/// stores them (their `messages` in the message chain), so they read back exactly.
fn restore_entry(connection: &Connection, run: &RunId, entry: &JournalEntry) -> Result<()> {
    insert_entry(connection, run, entry.seq, &EncodedEntry::of_recorded(entry))
}

fn restore_memory(
    connection: &Connection,
    tenant: &str,
    record: &MemoryRecord,
    embedding: Option<&MemoryEmbedding>,
) -> Result<()> {
    // The full-text index follows by trigger, as for `mem_put`.
    let id: i64 = connection
        .query_row(
            "INSERT INTO memory (tenant, namespace, key, value, text, updated_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
            params![
                tenant,
                record.namespace,
                record.key,
                record.value.to_string(),
                record.text,
                record.updated_at_ms
            ],
            |row| row.get(0),
        )
        .map_err(sql_error("restoring a memory record"))?;
    if let Some(embedding) = embedding {
        run_sql(
            connection,
            "restoring a memory embedding",
            "INSERT INTO memory_embeddings (memory_id, model, dims, vector) VALUES (?1, ?2, ?3, ?4)",
            params![
                id,
                embedding.model,
                embedding.vector.len() as i64,
                search::vector_to_bytes(&embedding.vector)
            ],
        )?;
    }
    Ok(())
}
