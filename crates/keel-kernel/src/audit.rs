//! The audit log at run time: one background writer batches audit records into the
//! store's hash chain (`Store::audit_append`) off the syscall path, like the event writer,
//! and each record of a run is also emitted as an `audit` event of that run.
//!
//! The writer is started with the event log (`EventLog::start`) and flushed with it
//! (`EventLog::flush`, which `Kernel::shutdown` awaits), so a record queued before
//! shutdown is in the store when the kernel is gone. A record is kept only once written:
//! a kernel killed within a few milliseconds of an action can lose its record, never
//! reorder or alter one. The write is committed without a flush of its own (the next
//! durable commit flushes it, see `Store::audit_append`), so it never holds up a journal
//! commit queued behind it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use keel_store::{AuditRecord, Store};
use keel_types::RunId;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// How often a failed append is tried before its records are given up (and logged).
const APPEND_ATTEMPTS: u32 = 3;

enum Message {
    /// With `tenant_from_run`, the writer fills `record.tenant` from the run's record
    /// (for callers that know the run but not its tenant, like the egress proxy).
    Record {
        record: AuditRecord,
        tenant_from_run: bool,
    },
    Flush(oneshot::Sender<()>),
}

/// Handle to the audit writer. Cheap to clone.
#[derive(Clone)]
pub(crate) struct AuditLog {
    tx: mpsc::UnboundedSender<Message>,
    lag: Arc<Lag>,
}

/// How far the writer is behind (for metrics): plain counters, no lock on the way in.
#[derive(Default)]
struct Lag {
    /// Records queued and not yet written (or given up).
    pending: AtomicU64,
    /// `at_ms` of the oldest record of the batch being written; 0 when none is.
    writing_since_ms: AtomicU64,
}

impl AuditLog {
    pub(crate) fn start(store: Arc<dyn Store>) -> AuditLog {
        let (tx, rx) = mpsc::unbounded_channel();
        let lag = Arc::new(Lag::default());
        tokio::spawn(write_loop(store, rx, lag.clone()));
        AuditLog { tx, lag }
    }

    pub(crate) fn record(&self, record: AuditRecord, tenant_from_run: bool) {
        self.lag.pending.fetch_add(1, Ordering::Relaxed);
        // The writer only stops when the kernel is dropped; records after that are moot.
        let _ = self.tx.send(Message::Record { record, tenant_from_run });
    }

    /// Records queued and not yet in the store, and the age of the oldest record being
    /// written (records queued behind a batch are younger than its oldest).
    pub(crate) fn lag(&self) -> (u64, Option<Duration>) {
        let pending = self.lag.pending.load(Ordering::Relaxed);
        let since = self.lag.writing_since_ms.load(Ordering::Relaxed);
        let age =
            (pending > 0 && since > 0).then(|| Duration::from_millis(crate::now_ms().saturating_sub(since)));
        (pending, age)
    }

    /// Waits until every record queued before this call is in the store (or given up).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Message::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

async fn write_loop(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Message>, lag: Arc<Lag>) {
    let mut batch: Vec<Message> = Vec::new();
    let mut tenants: HashMap<RunId, String> = HashMap::new();
    while rx.recv_many(&mut batch, 1024).await > 0 {
        // Gather for a moment so a burst of decisions shares one commit.
        tokio::time::sleep(Duration::from_millis(2)).await;
        while batch.len() < 4096
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        let mut records = Vec::new();
        let mut flushes = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Record { mut record, tenant_from_run } => {
                    if tenant_from_run && let Some(run) = &record.run_id {
                        record.tenant = tenant_of(&*store, &mut tenants, run).await;
                    }
                    records.push(record);
                }
                Message::Flush(done) => flushes.push(done),
            }
        }
        if !records.is_empty() {
            let count = records.len() as u64;
            let oldest = records.iter().map(|record| record.at_ms).min().unwrap_or_default().max(1);
            lag.writing_since_ms.store(oldest, Ordering::Relaxed);
            append(&*store, records).await;
            lag.writing_since_ms.store(0, Ordering::Relaxed);
            lag.pending.fetch_sub(count, Ordering::Relaxed);
        }
        for done in flushes {
            let _ = done.send(());
        }
        // Runs come and go; the cache only saves lookups within bursts.
        if tenants.len() > 4096 {
            tenants.clear();
        }
    }
}

async fn append(store: &dyn Store, records: Vec<AuditRecord>) {
    let count = records.len();
    for attempt in 1..=APPEND_ATTEMPTS {
        match store.audit_append(records.clone()).await {
            Ok(_) => return,
            Err(err) if attempt < APPEND_ATTEMPTS => {
                tracing::warn!(attempt, "could not append {count} audit records, retrying: {err}");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            Err(err) => tracing::error!("lost {count} audit records: {err}"),
        }
    }
}

/// The run's tenant, from the cache or the store (`default` when the run is unknown, so
/// the record is still kept).
async fn tenant_of(store: &dyn Store, cache: &mut HashMap<RunId, String>, run: &RunId) -> String {
    if let Some(tenant) = cache.get(run) {
        return tenant.clone();
    }
    let tenant = match store.get_run(run).await {
        Ok(Some(record)) => record.tenant,
        Ok(None) => "default".to_owned(),
        Err(err) => {
            tracing::warn!(run = %run, "could not read the run's tenant for an audit record: {err}");
            return "default".to_owned();
        }
    };
    cache.insert(run.clone(), tenant.clone());
    tenant
}

pub(crate) fn run_record(
    run: &RunId,
    tenant: &str,
    actor: &str,
    action: &str,
    subject: &str,
    outcome: &str,
    detail: Value,
) -> AuditRecord {
    AuditRecord {
        tenant: tenant.to_owned(),
        run_id: Some(run.clone()),
        at_ms: crate::now_ms(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        subject: subject.to_owned(),
        outcome: outcome.to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use keel_store::{NewRun, SqliteStore};
    use keel_types::RunState;
    use serde_json::json;

    use super::*;
    use keel_store::AuditFilter;

    /// Records queued before a flush are in the store after it, in order, in one chain,
    /// and a record queued without a tenant gets its run's.
    #[tokio::test]
    async fn flush_writes_queued_records_and_resolves_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("keel.db")).unwrap());
        let run = RunId::generate(1);
        let new_run = NewRun {
            id: run.clone(),
            tenant: "acme".into(),
            spec: json!({}),
            state: RunState::Created,
            created_at_ms: 1,
        };
        store.create_run(new_run).await.unwrap();
        let log = AuditLog::start(store.clone());
        let denied = run_record(&run, "", "agent", "egress", "evil.example", "denied", json!({"port": 443}));
        log.record(denied, true);
        log.record(
            run_record(&run, "other", "operator", "approval.granted", "fs.write", "allowed", json!(null)),
            false,
        );
        log.flush().await;

        let entries = store.audit_list(&AuditFilter::default()).await.unwrap();
        let summary: Vec<(u64, &str, &str)> =
            entries.iter().map(|e| (e.seq, e.record.tenant.as_str(), e.record.action.as_str())).collect();
        assert_eq!(summary, vec![(1, "acme", "egress"), (2, "other", "approval.granted")]);
        assert_eq!(store.audit_verify().await.unwrap().broken, None);
    }
}
