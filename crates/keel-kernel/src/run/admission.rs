//! Admission of runs to live slots: a run asks for a slot before its record exists (a
//! full queue is a 429 with Retry-After), waits in `queued` otherwise, and gives its
//! slot back when it ends or swaps out. The policy is `keel_core::sched::Admitter`.

use crate::now_ms;
use crate::run::RunSpec;
use crate::{Error, Kernel, Result};
use keel_core::sched::{Admission, Priority, Ticket};
use keel_store::RunRecord;
use keel_types::RunId;

/// A run's claim on a live slot. The agent spec it counts against
/// (`max_live_per_agent`) is its command.
pub(crate) fn ticket(id: &RunId, tenant: &str, spec: &RunSpec, submitted_ms: u64) -> Ticket {
    Ticket {
        run: id.to_string(),
        tenant: tenant.to_owned(),
        agent: spec.command.join(" "),
        priority: spec.priority(),
        submitted_ms,
    }
}

/// [`ticket`] for a stored run. A spec that does not parse still gets its slot back (as
/// a normal-priority run of no agent): the slot accounting must not leak.
fn record_ticket(record: &RunRecord, submitted_ms: u64) -> Ticket {
    match RunSpec::of(record) {
        Ok(spec) => ticket(&record.id, &record.tenant, &spec, submitted_ms),
        Err(err) => {
            tracing::warn!(run = %record.id, "{err}");
            Ticket {
                run: record.id.to_string(),
                tenant: record.tenant.clone(),
                agent: String::new(),
                priority: Priority::default(),
                submitted_ms,
            }
        }
    }
}

impl Kernel {
    /// Asks for a live slot for a new run: `Ok(true)` start now, `Ok(false)` wait in
    /// `queued`, `Err` a full queue (HTTP 429 with Retry-After).
    pub(crate) fn admit(&self, ticket: Ticket) -> Result<bool> {
        match self.inner.admissions.lock().submit(ticket, now_ms()) {
            Admission::Start => Ok(true),
            Admission::Queued { .. } => Ok(false),
            Admission::Rejected { retry_after_ms, reason } => Err(Error::QuotaExceeded {
                message: format!("the run queue is full: {reason}; try again later"),
                retry_after_secs: retry_after_ms.div_ceil(1000),
            }),
        }
    }

    /// A run ended (or was stopped while queued): its slot goes to the next queued runs.
    pub(crate) fn release_slot(&self, run: &RunId) {
        let next = self.inner.admissions.lock().finish(run.as_str(), now_ms());
        for run in next {
            if let Ok(run) = RunId::parse(&run) {
                self.request_launch(&run);
            }
        }
    }

    /// A swapped-out run whose wait is over asks for its live slot back: `true` when it
    /// may be relaunched now; otherwise it stays swapped out in the queue, never refused,
    /// and `launch_queued` brings it back when a slot frees.
    pub(crate) fn reclaim_slot(&self, record: &RunRecord) -> bool {
        let ticket = record_ticket(record, now_ms());
        matches!(self.inner.admissions.lock().resume(ticket, now_ms()), Admission::Start)
    }

    /// Recovery: a run already live keeps its slot; a queued one queues again.
    pub(crate) fn restore_slot(&self, record: &RunRecord, live: bool) -> bool {
        let ticket = record_ticket(record, record.created_at_ms);
        if live {
            self.inner.admissions.lock().restore_live(ticket);
            true
        } else {
            matches!(self.inner.admissions.lock().submit(ticket, now_ms()), Admission::Start)
        }
    }

    /// Where a queued run stands, in words (`keel ps`).
    pub(crate) fn queue_reason(&self, run: &RunId) -> Option<String> {
        let admitter = self.inner.admissions.lock();
        let queued = admitter.queued();
        let position = queued.iter().find(|(id, _)| id == run.as_str())?.1;
        Some(format!(
            "queued: {position} of {} waiting for a live slot ({} live)",
            queued.len(),
            admitter.live_count()
        ))
    }
}
