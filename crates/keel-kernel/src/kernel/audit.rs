//! The kernel's side of the audit log: records queued for the batched writer
//! (`crate::audit`), each of a run's also emitted as an `audit` event of that run, and
//! the log's queries.

use crate::Kernel;
use crate::Result;
use crate::audit::run_record;
use keel_protocol::EventKind;
use keel_store::{AuditEntry, AuditFilter, AuditRecord, AuditVerify};
use keel_types::RunId;
use serde_json::Value;

impl Kernel {
    /// Queues a record for the audit log (and, for a run's record, emits it as an `audit`
    /// event of the run). Never blocks; the writer appends it within milliseconds.
    pub(crate) fn audit(&self, record: AuditRecord) {
        self.queue_audit(record, false);
    }

    fn queue_audit(&self, record: AuditRecord, tenant_from_run: bool) {
        if let Some(run) = &record.run_id {
            let data = serde_json::json!({
                "actor": record.actor,
                "action": record.action,
                "subject": record.subject,
                "outcome": record.outcome,
                "detail": record.detail,
            });
            self.emit(run, EventKind::Audit, data);
        }
        self.inner.events.audit.record(record, tenant_from_run);
    }

    /// Audits an action of a run, stamped now.
    #[allow(clippy::too_many_arguments, reason = "the fields of one audit record")]
    pub(crate) fn audit_run(
        &self,
        run: &RunId,
        tenant: &str,
        actor: &str,
        action: &str,
        subject: &str,
        outcome: &str,
        detail: Value,
    ) {
        self.audit(run_record(run, tenant, actor, action, subject, outcome, detail));
    }

    /// Like `audit_run` for a caller that does not know the run's tenant: the writer
    /// reads it from the run's record.
    pub(crate) fn audit_run_any_tenant(
        &self,
        run: &RunId,
        actor: &str,
        action: &str,
        subject: &str,
        outcome: &str,
        detail: Value,
    ) {
        self.queue_audit(run_record(run, "", actor, action, subject, outcome, detail), true);
    }

    /// Audit entries matching `filter`, in seq order, including every record queued
    /// before the call.
    pub(crate) async fn audit_entries(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        self.inner.events.audit.flush().await;
        Ok(self.store().audit_list(filter).await?)
    }

    /// Verifies the whole audit chain (see `Store::audit_verify`), after writing what is
    /// queued.
    pub(crate) async fn audit_check(&self) -> Result<AuditVerify> {
        self.inner.events.audit.flush().await;
        Ok(self.store().audit_verify().await?)
    }
}
