//! `GET /metrics` as the API sees it: a scrape reads the store's run counts and the
//! kernel's queues, slots, pool and audit writer, then renders them with every recorded
//! instrument (see `crate::metrics`).

use keel_llm::Provider as _;

use crate::metrics::{Format, Snapshot};
use crate::tenants::Principal;
use crate::{Kernel, Result};

impl Kernel {
    /// Every metric, in `format`; operator only (the numbers span every tenant).
    pub async fn metrics(&self, principal: &Principal, format: Format) -> Result<String> {
        principal.require_admin("reading the kernel's metrics")?;
        let runs = self.inner.store.count_runs().await?;
        let llm_waiting =
            self.inner.llm.waiting_calls().into_iter().map(|call| (call.provider, call.model)).collect();
        let (live_slots_used, live_slots_cap, admission_queue) = {
            let admitter = self.inner.admissions.lock();
            (admitter.live_count(), admitter.caps().global, admitter.queued_count())
        };
        let (audit_pending, audit_oldest_pending) = self.inner.events.audit.lag();
        let snapshot = Snapshot {
            runs,
            llm_waiting,
            live_slots_used,
            live_slots_cap,
            admission_queue,
            sandbox_pool_ready: self.inner.sandbox.pool_status().warm,
            audit_pending,
            audit_oldest_pending,
        };
        Ok(self.inner.metrics.render(&snapshot, format))
    }
}
