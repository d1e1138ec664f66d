//! Every record of a store in a backend-neutral form, for moving an installation from one
//! backend to another (`keel migrate`) and proving the copy whole.
//!
//! `Store::dump` sends a store's records as `DumpItem`s in a fixed order (below), so two
//! stores holding the same data dump the same sequence and a copy is verified by dumping
//! both and comparing item by item. `Store::restore` writes items verbatim into an empty
//! store: seqs, usage totals, audit hashes and delivery marks are kept, not recomputed,
//! and the audit head is set from the last audit entry.
//!
//! The order, which `restore` relies on (a run before its entries, a tenant before its
//! tokens):
//!
//! 1. tenants by name, then tokens by (tenant, created_at_ms, hash);
//! 2. runs by id; after each run its journal by seq, its events by seq, its mailbox by
//!    seq;
//! 3. subscriptions by (tenant, topic, run);
//! 4. kv by (scope, key);
//! 5. thread messages by (tenant, thread, index);
//! 6. memory records by (tenant, namespace, key), then memory deletes by (tenant, key);
//! 7. triggers by (kind, name), then their fires by (kind, trigger, occasion);
//! 8. audit entries by seq.
//!
//! Text keys sort by their bytes (UTF-8), as SQLite compares text; another backend sorts
//! the same way (Postgres: `COLLATE "C"`), or two dumps of the same data would differ.
//!
//! Beside the trait's dump: `describe` and `DumpComparison`, which compare two dumps as
//! they stream and name the first difference, `compare_stores`, which drives them over two
//! stores, and the migration marker (`migration_incomplete`), which keeps a kernel off a
//! copy that was not verified.

use std::collections::VecDeque;

use keel_types::RunId;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::{
    ApiTokenRecord, AuditEntry, EventRecord, FireRecord, JournalEntry, MailboxMessage, MemoryEmbedding,
    MemoryRecord, Result, RunRecord, Store, TenantRecord, ThreadMessage, TriggerRecord,
};

/// One record of a store. See the module doc for the order a dump sends them in.
#[derive(Debug, Clone, PartialEq)]
pub enum DumpItem {
    Tenant(TenantRecord),
    Token(ApiTokenRecord),
    /// A run with its usage totals and `provider_calls` as stored.
    Run(RunRecord),
    Entry {
        run: RunId,
        entry: JournalEntry,
    },
    Event {
        run: RunId,
        event: EventRecord,
    },
    /// A mailbox message, delivered or not: `receive_key` is set once it was taken (a
    /// backend's marker when the receiver gave no key).
    Mail {
        run: RunId,
        message: MailboxMessage,
        send_key: Option<String>,
        receive_key: Option<String>,
    },
    Subscription {
        tenant: String,
        topic: String,
        run: RunId,
    },
    Kv {
        scope: String,
        key: String,
        value: Value,
    },
    Thread {
        tenant: String,
        thread: String,
        message: ThreadMessage,
        idempotency_key: Option<String>,
    },
    Memory {
        tenant: String,
        record: MemoryRecord,
        embedding: Option<MemoryEmbedding>,
    },
    /// What a keyed `mem_delete` answered, so its retry answers the same.
    MemoryDelete {
        tenant: String,
        idempotency_key: String,
        deleted: bool,
    },
    /// A schedule, webhook or event trigger, paused or not.
    Trigger(TriggerRecord),
    /// One occasion a trigger fired for (what keeps a fire from happening twice).
    Fire(FireRecord),
    Audit(AuditEntry),
}

impl DumpItem {
    /// What the item is, for messages and counts: `run`, `journal entry`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            DumpItem::Tenant(_) => "tenant",
            DumpItem::Token(_) => "api token",
            DumpItem::Run(_) => "run",
            DumpItem::Entry { .. } => "journal entry",
            DumpItem::Event { .. } => "event",
            DumpItem::Mail { .. } => "mailbox message",
            DumpItem::Subscription { .. } => "subscription",
            DumpItem::Kv { .. } => "kv value",
            DumpItem::Thread { .. } => "thread message",
            DumpItem::Memory { .. } => "memory record",
            DumpItem::MemoryDelete { .. } => "memory delete",
            DumpItem::Trigger(_) => "trigger",
            DumpItem::Fire(_) => "trigger fire",
            DumpItem::Audit(_) => "audit entry",
        }
    }
}

/// How many items `Store::dump` sends per batch, and `restore` is given at most.
pub const DUMP_BATCH: usize = 500;

/// What `item` is and which one, for messages: `journal entry 7 of run run_...`,
/// `kv value "k" in scope "s"`. Two items of one store never share a description.
pub fn describe(item: &DumpItem) -> String {
    let kind = item.kind();
    match item {
        DumpItem::Tenant(tenant) => format!("{kind} {}", tenant.name),
        DumpItem::Token(token) => format!("{kind} {} of tenant {}", token.prefix, token.tenant),
        DumpItem::Run(run) => format!("{kind} {}", run.id),
        DumpItem::Entry { run, entry } => format!("{kind} {} of run {run}", entry.seq),
        DumpItem::Event { run, event } => format!("{kind} {} of run {run}", event.seq),
        DumpItem::Mail { run, message, .. } => format!("{kind} {} of run {run}", message.seq),
        DumpItem::Subscription { tenant, topic, run } => {
            format!("{kind} of run {run} to topic {topic:?} of tenant {tenant}")
        }
        DumpItem::Kv { scope, key, .. } => format!("{kind} {key:?} in scope {scope:?}"),
        DumpItem::Thread { tenant, thread, message, .. } => {
            format!("{kind} {} of thread {thread:?} of tenant {tenant}", message.index)
        }
        DumpItem::Memory { tenant, record, .. } => {
            format!("{kind} {:?} in namespace {:?} of tenant {tenant}", record.key, record.namespace)
        }
        DumpItem::MemoryDelete { tenant, idempotency_key, .. } => {
            format!("{kind} with key {idempotency_key:?} of tenant {tenant}")
        }
        DumpItem::Trigger(trigger) => format!("{kind} {} {:?}", trigger.kind, trigger.name),
        DumpItem::Fire(fire) => {
            format!("{kind} {:?} of {} {:?}", fire.occasion, fire.kind, fire.trigger)
        }
        DumpItem::Audit(entry) => format!("{kind} {}", entry.seq),
    }
}

/// The first place two dumps part, in words: `None` when both items are there and equal.
/// `source` is the item of the dump taken as right, `copy` the other's at the same place
/// (`None`: that dump ended there).
pub fn difference(source: Option<&DumpItem>, copy: Option<&DumpItem>) -> Option<String> {
    match (source, copy) {
        (None, None) => None,
        (Some(source), Some(copy)) if source == copy => None,
        (Some(source), Some(copy)) => {
            let (expected, found) = (describe(source), describe(copy));
            Some(if expected == found {
                format!("{expected}: differs")
            } else {
                format!("{expected}: differs (the copy has {found} in its place)")
            })
        }
        (Some(source), None) => Some(format!("{}: missing from the copy", describe(source))),
        (None, Some(copy)) => Some(format!("{}: only in the copy", describe(copy))),
    }
}

/// One of the two dumps a `DumpComparison` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Copy,
}

/// Two dumps compared item by item as their batches arrive, which may be of different
/// sizes: it buffers only what one side sent ahead of the other, so the caller reads the
/// side `next_read` names and memory stays about one batch. Pure: the caller does the
/// reading (`compare_stores` does it for two stores).
///
/// The migration marker (`is_migration_marker`) is left out on both sides: it describes
/// a copy, it is not part of the data copied.
#[derive(Debug, Default)]
pub struct DumpComparison {
    source: VecDeque<DumpItem>,
    copy: VecDeque<DumpItem>,
    source_ended: bool,
    copy_ended: bool,
    equal: u64,
    difference: Option<String>,
}

impl DumpComparison {
    /// Takes the next batch of one side's dump (`None`: that dump has ended).
    pub fn push(&mut self, side: Side, batch: Option<Vec<DumpItem>>) {
        let (queue, ended) = match side {
            Side::Source => (&mut self.source, &mut self.source_ended),
            Side::Copy => (&mut self.copy, &mut self.copy_ended),
        };
        match batch {
            Some(batch) => queue.extend(batch.into_iter().filter(|item| !is_migration_marker(item))),
            None => *ended = true,
        }
        while self.difference.is_none() && !self.source.is_empty() && !self.copy.is_empty() {
            let (source, copy) = (self.source.pop_front(), self.copy.pop_front());
            self.difference = difference(source.as_ref(), copy.as_ref());
            if self.difference.is_none() {
                self.equal += 1;
            }
        }
    }

    /// Which dump to read next, or `None` when the outcome is known (a difference was
    /// found, or both dumps ended): then call `finish`.
    pub fn next_read(&self) -> Option<Side> {
        if self.difference.is_some() {
            None
        } else if self.source.is_empty() && !self.source_ended {
            Some(Side::Source)
        } else if self.copy.is_empty() && !self.copy_ended {
            Some(Side::Copy)
        } else {
            None
        }
    }

    /// How many items were equal, or the first difference. Call it once `next_read` is
    /// `None`; an item left over on one side is a difference.
    pub fn finish(self) -> std::result::Result<u64, String> {
        let leftover = || difference(self.source.front(), self.copy.front());
        match self.difference.clone().or_else(leftover) {
            Some(difference) => Err(difference),
            None => Ok(self.equal),
        }
    }
}

/// Dumps both stores and compares the dumps (`DumpComparison`): how many items are
/// equal, or, as `Err` inside `Ok`, the first difference. Both dumps stop as soon as a
/// difference is found. An error of either dump is the outer `Err`.
pub async fn compare_stores(
    source: &dyn Store,
    copy: &dyn Store,
) -> Result<std::result::Result<u64, String>> {
    let (source_sink, mut source_batches) = mpsc::channel(1);
    let (copy_sink, mut copy_batches) = mpsc::channel(1);
    let compare = async move {
        let mut comparison = DumpComparison::default();
        while let Some(side) = comparison.next_read() {
            let batch = match side {
                Side::Source => source_batches.recv().await,
                Side::Copy => copy_batches.recv().await,
            };
            comparison.push(side, batch);
        }
        // Dropping the receivers here ends both dumps early when they differ.
        comparison.finish()
    };
    let (source_dumped, copy_dumped, verdict) =
        tokio::join!(source.dump(source_sink), copy.dump(copy_sink), compare);
    source_dumped?;
    copy_dumped?;
    Ok(verdict)
}

/// The kv scope and key of the migration marker: `keel migrate` writes
/// `{"state": "copying", "from": ...}` there in the target before copying anything and
/// replaces it with `{"state": "verified", ...}` only once the copy is verified, so a
/// copy cut short or found different is never taken for a good store.
pub const MIGRATION_SCOPE: &str = "keel";
pub const MIGRATION_KEY: &str = "migration";
/// The marker's `state` once the copy was verified; any other state is unfinished.
pub const MIGRATION_VERIFIED: &str = "verified";

/// Whether `item` is the migration marker (which describes a copy, not its data).
pub fn is_migration_marker(item: &DumpItem) -> bool {
    matches!(item, DumpItem::Kv { scope, key, .. } if scope == MIGRATION_SCOPE && key == MIGRATION_KEY)
}

/// Why a kernel must not use `store`, when it is a `keel migrate` copy that was not
/// verified (cut short, or found different from its source); `None` for any other store.
pub async fn migration_incomplete(store: &dyn Store) -> Result<Option<String>> {
    let Some(marker) = store.kv_get(MIGRATION_SCOPE, MIGRATION_KEY).await? else {
        return Ok(None);
    };
    let state = marker.get("state").and_then(Value::as_str).unwrap_or("unknown");
    if state == MIGRATION_VERIFIED {
        return Ok(None);
    }
    let from = marker.get("from").and_then(Value::as_str).unwrap_or("an unknown source");
    Ok(Some(format!(
        "this store is a copy of {from} that `keel migrate` did not verify (its state is {state:?}): \
         it may be incomplete and must not be used. Delete it and run `keel migrate` again into an \
         empty store, or keep using {from}"
    )))
}

#[cfg(test)]
mod tests {
    use keel_types::{EntryStatus, Usage};
    use serde_json::json;

    use super::*;

    fn run() -> RunId {
        RunId::parse("run_00000000000000000000000001").unwrap()
    }

    fn entry(seq: u64, result: Value) -> DumpItem {
        DumpItem::Entry {
            run: run(),
            entry: JournalEntry {
                seq,
                method: "llm.chat".to_owned(),
                params: json!({}),
                params_hash: "h".to_owned(),
                status: EntryStatus::Ok,
                result: Some(result),
                error: None,
                attempt: 1,
                started_at_ms: 1,
                finished_at_ms: Some(2),
                usage: Usage::default(),
            },
        }
    }

    fn kv(key: &str) -> DumpItem {
        DumpItem::Kv { scope: "s".to_owned(), key: key.to_owned(), value: json!(1) }
    }

    fn marker() -> DumpItem {
        DumpItem::Kv {
            scope: MIGRATION_SCOPE.to_owned(),
            key: MIGRATION_KEY.to_owned(),
            value: json!({"state": "verified"}),
        }
    }

    /// Feeds both dumps in the given batches, reading the side the comparison asks for.
    fn compare(source: Vec<Vec<DumpItem>>, copy: Vec<Vec<DumpItem>>) -> std::result::Result<u64, String> {
        let (mut source, mut copy) = (source.into_iter(), copy.into_iter());
        let mut comparison = DumpComparison::default();
        while let Some(side) = comparison.next_read() {
            let batch = match side {
                Side::Source => source.next(),
                Side::Copy => copy.next(),
            };
            comparison.push(side, batch);
        }
        comparison.finish()
    }

    #[test]
    fn descriptions_name_the_kind_and_the_item() {
        assert_eq!(describe(&entry(7, json!(1))), format!("journal entry 7 of run {}", run()));
        assert_eq!(describe(&kv("k")), "kv value \"k\" in scope \"s\"");
    }

    #[test]
    fn equal_dumps_in_batches_of_any_size_are_equal() {
        let items: Vec<DumpItem> = (1..=5).map(|seq| entry(seq, json!(seq))).collect();
        let in_ones = items.iter().cloned().map(|item| vec![item]).collect();
        let whole = vec![items.clone()];
        assert_eq!(compare(in_ones, whole), Ok(5));
        assert_eq!(compare(vec![], vec![]), Ok(0));
    }

    #[test]
    fn the_first_difference_is_named() {
        let source = vec![vec![entry(1, json!(1)), entry(2, json!(2))], vec![entry(3, json!(3))]];
        let copy = vec![vec![entry(1, json!(1))], vec![entry(2, json!("other")), entry(3, json!(3))]];
        assert_eq!(compare(source, copy), Err(format!("journal entry 2 of run {}: differs", run())));
    }

    #[test]
    fn missing_extra_and_misplaced_items_are_differences() {
        let source = vec![vec![kv("a"), kv("b")]];
        assert_eq!(
            compare(source.clone(), vec![vec![kv("a")]]),
            Err("kv value \"b\" in scope \"s\": missing from the copy".to_owned())
        );
        assert_eq!(
            compare(vec![vec![kv("a")]], source.clone()),
            Err("kv value \"b\" in scope \"s\": only in the copy".to_owned())
        );
        assert_eq!(
            compare(source, vec![vec![kv("b")]]),
            Err("kv value \"a\" in scope \"s\": differs (the copy has kv value \"b\" in scope \"s\" in its place)".to_owned())
        );
    }

    #[test]
    fn the_migration_marker_is_not_compared() {
        assert_eq!(compare(vec![vec![kv("a"), marker()]], vec![vec![marker()], vec![kv("a")]]), Ok(1));
        assert_eq!(compare(vec![vec![kv("a")]], vec![vec![kv("a"), marker()]]), Ok(1));
    }
}
