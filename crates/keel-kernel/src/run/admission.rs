//! Admission of runs to live slots: a run asks for a slot before its record exists (a
//! full queue is a 429 with Retry-After), waits in `queued` otherwise, and gives its
//! slot back when it ends or swaps out. The policy is `keel_core::sched::Admitter`, in
//! this kernel's memory, or among several nodes with caps `keel_core::placement`, on the
//! cluster's ledger in the store.

use crate::now_ms;
use crate::run::RunSpec;
use crate::{Error, Kernel, Result};
use keel_core::placement::{self, Decision, Placement, Slot};
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
    pub(crate) async fn admit(&self, ticket: Ticket) -> Result<bool> {
        if self.inner.admissions.shared().is_none() {
            return match self.inner.admissions.lock().submit(ticket, now_ms()) {
                Admission::Start => Ok(true),
                Admission::Queued { .. } => Ok(false),
                rejected => Err(queue_full(rejected)),
            };
        }
        let run = ticket.run.clone();
        let decided = self
            .on_ledger(true, |p, ledger, node| p.submit(ledger, node, ticket.clone(), now_ms(), true, false))
            .await?;
        Ok(decided.map_err(queue_full)?.start_here.contains(&run))
    }

    /// A run ended (or was stopped while queued, or swapped out): its slot goes to the
    /// next queued runs.
    pub(crate) fn release_slot(&self, run: &RunId) {
        if self.inner.admissions.shared().is_none() {
            let next = self.inner.admissions.lock().finish(run.as_str(), now_ms());
            for run in next {
                if let Ok(run) = RunId::parse(&run) {
                    self.request_launch(&run);
                }
            }
            return;
        }
        // On the ledger: in the background, retried while the store is away (a slot left
        // taken would hold a queued run back; an ended run's row is also dropped by the
        // next decision anywhere, but a swapped-out run's is not).
        let kernel = self.clone();
        let run = run.clone();
        tokio::spawn(async move {
            let mut backoff = std::time::Duration::from_millis(100);
            loop {
                let released = kernel
                    .on_ledger(true, |p, ledger, node| Ok(p.release(ledger, node, run.as_str(), now_ms())))
                    .await;
                match released {
                    Ok(Ok(decision)) => return kernel.start_pulled(decision),
                    Ok(Err(_)) => return,
                    Err(err) if kernel.inner.shutting_down.load(std::sync::atomic::Ordering::SeqCst) => {
                        tracing::debug!(run = %run, "the slot was not given back before shutdown: {err}");
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(run = %run, "could not give the run's slot back (retrying): {err}")
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
            }
        });
    }

    /// A swapped-out run whose wait is over asks for its live slot back: `true` when it
    /// may be relaunched now; otherwise it stays swapped out in the queue, never refused,
    /// and `launch_queued` brings it back when a slot frees (among several nodes: a slot
    /// on this node, which keeps its lease).
    pub(crate) async fn reclaim_slot(&self, record: &RunRecord) -> bool {
        let ticket = record_ticket(record, now_ms());
        if self.inner.admissions.shared().is_some() {
            return self.decide_on_ledger(ticket, true).await;
        }
        matches!(self.inner.admissions.lock().resume(ticket, now_ms()), Admission::Start)
    }

    /// Recovery: a queued run queues again (`true`: it may start now).
    pub(crate) async fn restore_slot(&self, record: &RunRecord) -> bool {
        let ticket = record_ticket(record, record.created_at_ms);
        if self.inner.admissions.shared().is_some() {
            return self.decide_on_ledger(ticket, false).await;
        }
        matches!(self.inner.admissions.lock().submit(ticket, now_ms()), Admission::Start)
    }

    /// Recovery: runs that were live keep their slots (here, now), over the caps if need
    /// be. Among several nodes, one decision on the ledger for all of them.
    pub(crate) async fn restore_live_slots(&self, records: &[&RunRecord]) {
        let tickets: Vec<Ticket> = records.iter().map(|r| record_ticket(r, r.created_at_ms)).collect();
        if self.inner.admissions.shared().is_none() {
            let mut admitter = self.inner.admissions.lock();
            for ticket in tickets {
                admitter.restore_live(ticket);
            }
            return;
        }
        if tickets.is_empty() {
            return;
        }
        let restored = self
            .on_ledger(false, |p, _, node| {
                let changes =
                    tickets.iter().flat_map(|ticket| p.restore_live(node, ticket.clone()).changes).collect();
                Ok(Decision { changes, start_here: Vec::new() })
            })
            .await;
        if let Err(err) = restored {
            // They run anyway (they were live); until they end, the next decisions may
            // start that many runs too many.
            tracing::warn!("could not count {} recovered runs' slots: {err}", tickets.len());
        }
    }

    /// A run that may not be refused asks for a slot on the ledger: whether it starts
    /// here now (a store error: not now; it is asked again when it is woken or pulled).
    async fn decide_on_ledger(&self, ticket: Ticket, home: bool) -> bool {
        let run = ticket.run.clone();
        match self
            .on_ledger(true, |p, ledger, node| p.submit(ledger, node, ticket.clone(), now_ms(), false, home))
            .await
        {
            Ok(Ok(decision)) => decision.start_here.contains(&run),
            Ok(Err(_)) => false,
            Err(err) => {
                tracing::warn!(run = %run, "could not ask for a live slot: {err}");
                false
            }
        }
    }

    /// Starts here the waiting runs this node has room for (among several nodes with
    /// caps; otherwise nothing).
    pub(crate) async fn pull_queued(&self) {
        if self.inner.admissions.shared().is_none() || self.is_draining() {
            return;
        }
        match self.on_ledger(false, |p, ledger, node| Ok(p.pull(ledger, node, now_ms()))).await {
            Ok(Ok(decision)) => self.start_pulled(decision),
            Ok(Err(_)) => {}
            Err(err) => tracing::warn!("could not look for queued runs to start: {err}"),
        }
    }

    fn start_pulled(&self, decision: Decision) {
        for run in decision.start_here {
            if let Ok(run) = RunId::parse(&run) {
                self.request_launch(&run);
            }
        }
    }

    /// One decision on the cluster's admission ledger (see `keel_core::placement`), by
    /// `decide`; the ledger as it then stands is kept for queue positions. With `nudge_others`,
    /// when a waiting run could start on a node with room, the other nodes are told (a
    /// pull never nudges, or nodes without room would wake each other forever).
    async fn on_ledger(
        &self,
        nudge_others: bool,
        mut decide: impl FnMut(&Placement, &[Slot], &str) -> std::result::Result<Decision, Admission> + Send,
    ) -> Result<std::result::Result<Decision, Admission>> {
        let (Some(placement), Some(member)) = (self.inner.admissions.shared(), &self.inner.cluster) else {
            return Ok(Ok(Decision::default()));
        };
        let node = member.cluster.node_id().to_owned();
        let mut outcome = None;
        let mut nudge = None;
        let mut seen = None;
        member
            .cluster
            .admission(&mut |ledger: &[Slot]| {
                let decided = decide(placement, ledger, &node);
                let changes = decided.as_ref().map(|d| d.changes.clone()).unwrap_or_default();
                let after = placement::apply(ledger, &changes);
                let admitter = placement.admitter(&after);
                nudge = if nudge_others { placement.startable_elsewhere(&after, &admitter) } else { None };
                seen = Some(admitter);
                outcome = Some(decided);
                changes
            })
            .await?;
        if let Some(admitter) = seen {
            *self.inner.admissions.lock() = admitter;
        }
        if let Some(run) = nudge.and_then(|run| RunId::parse(&run).ok()) {
            self.tell_cluster(&run);
        }
        Ok(outcome.unwrap_or_else(|| Ok(Decision::default())))
    }

    /// Where a queued run stands, in words (`keel ps`).
    pub(crate) fn queue_reason(&self, run: &RunId) -> Option<String> {
        let admitter = self.inner.admissions.lock();
        let queued = admitter.queued();
        let position = queued.iter().find(|(id, _)| id == run.as_str())?.1;
        let scope = if self.inner.admissions.shared().is_some() { " across the cluster" } else { "" };
        Some(format!(
            "queued: {position} of {} waiting for a live slot{scope} ({} live)",
            queued.len(),
            admitter.live_count()
        ))
    }
}

/// A full queue's refusal (`Admission::Rejected`) as the error a caller sees: HTTP 429
/// with Retry-After.
fn queue_full(rejected: Admission) -> Error {
    let (retry_after_ms, reason) = match rejected {
        Admission::Rejected { retry_after_ms, reason } => (retry_after_ms, reason),
        other => (keel_core::sched::MIN_RETRY_AFTER_MS, format!("{other:?}")),
    };
    Error::QuotaExceeded {
        message: format!("the run queue is full: {reason}; try again later"),
        retry_after_secs: retry_after_ms.div_ceil(1000),
    }
}
