//! Parking and swapping (DESIGN section 5). A run that has waited longer than the swap
//! threshold (`keel serve --swap-after SECS`, `KEEL_SWAP_AFTER_SECS`, default 60) for
//! something durable (a human answer, a message, a child, an approval, a timer) has its
//! agent process stopped: the wait itself is a pending journal entry, so nothing is lost.
//! Such a run stays `waiting` with no process ("swapped out"); when what it waits for
//! happens, it is relaunched by replay from its last checkpoint and asks again, which
//! now answers at once. Only runs whose every call in flight is such a wait are swapped,
//! so no LLM or tool call is ever interrupted (and paid twice) by swapping.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_core::lifecycle::Command as Lifecycle;
use keel_store::{RunPatch, RunRecord};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use serde_json::{Value, json};

use crate::Kernel;
use crate::runtime::{LiveRun, now_ms};

/// The waits a swapped-out run can be woken from.
fn swappable(reason: Option<WaitReason>) -> bool {
    matches!(
        reason,
        Some(
            WaitReason::Human
                | WaitReason::Message
                | WaitReason::Child
                | WaitReason::Approval
                | WaitReason::Timer
        )
    )
}

/// A swapped-out run: waiting, with no agent process.
pub(crate) fn is_swapped(record: &RunRecord) -> bool {
    record.state == RunState::Waiting && record.pid.is_none() && swappable(record.wait_reason)
}

impl Kernel {
    /// Checks the live runs once a tick and swaps out those waiting too long.
    pub(crate) fn spawn_swapper(&self, threshold: Duration) {
        let kernel = self.clone();
        let tick = (threshold / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                if kernel.inner.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                let live: Vec<Arc<LiveRun>> = kernel.live_runs();
                for run in live {
                    kernel.maybe_swap_out(&run, threshold).await;
                }
            }
        });
    }

    async fn maybe_swap_out(&self, live: &Arc<LiveRun>, threshold: Duration) {
        // Every call in flight must be a durable wait: then killing the agent loses nothing.
        let inflight = live.inflight.load(Ordering::SeqCst);
        let waiting = live.waiting_calls.load(Ordering::SeqCst);
        if inflight == 0 || inflight != waiting || live.exited.load(Ordering::SeqCst) {
            return;
        }
        let Ok(record) = self.get(&live.id).await else { return };
        if record.state != RunState::Waiting || !swappable(record.wait_reason) {
            return;
        }
        if now_ms().saturating_sub(record.updated_at_ms) < threshold.as_millis() as u64 {
            return;
        }
        if live.swapping.swap(true, Ordering::SeqCst) {
            return;
        }
        self.emit(
            &live.id,
            "swap",
            json!({ "out": true, "wait_reason": record.wait_reason.map(|r| r.as_str()) }),
        );
        keel_sandbox::tree::kill_tree(Some(live.pid), live.id.as_str());
        if record.wait_reason == Some(WaitReason::Timer) {
            self.wake_at_timer(&live.id).await;
        }
    }

    /// After a swapped-out agent's process ended: the run stays waiting, with no process.
    pub(crate) async fn settle_swapped(&self, live: &Arc<LiveRun>) {
        let patch = RunPatch { pid: Some(None), updated_at_ms: Some(now_ms()), ..RunPatch::default() };
        if let Err(err) = self.store().update_run(&live.id, Some(RunState::Waiting), patch).await {
            // Woken (or stopped) meanwhile: whatever changed it also relaunches or ends it.
            tracing::debug!(run = %live.id, "swapped-out run changed while settling: {err}");
        }
        // What it waited for may have happened while the agent was being stopped.
        if let Ok(record) = self.get(&live.id).await
            && is_swapped(&record)
            && self.wait_is_over(&record).await
        {
            self.wake_swapped(&live.id).await;
        }
    }

    /// Relaunches a swapped-out run by replay (a no-op for any other run).
    pub(crate) async fn wake_swapped(&self, run: &RunId) {
        if self.live(run).is_some() {
            return;
        }
        let Ok(record) = self.get(run).await else { return };
        if !is_swapped(&record) {
            return;
        }
        self.emit(run, "swap", json!({ "out": false }));
        match self.transition(run, Lifecycle::KernelRestart, RunPatch::default()).await {
            Ok(record) => {
                let kernel = self.clone();
                tokio::spawn(async move {
                    let id = record.id.clone();
                    if let Err(err) = Box::pin(kernel.relaunch(record)).await {
                        tracing::warn!(run = %id, "could not swap the run back in: {err}");
                    }
                });
            }
            Err(err) => tracing::debug!(run = %run, "swap-in raced another change: {err}"),
        }
    }

    /// Whether a swapped-out run's wait has ended (an answer, a message, a child's end,
    /// a decision, or its timer), read from the store alone.
    pub(crate) async fn wait_is_over(&self, record: &RunRecord) -> bool {
        let store = self.store();
        match record.wait_reason {
            Some(WaitReason::Message) => store.mailbox_len(&record.id).await.is_ok_and(|n| n > 0),
            Some(WaitReason::Child) => self.any_child_ended(&record.id).await,
            Some(WaitReason::Human) => {
                let entries = store.journal(&record.id, 0).await.unwrap_or_default();
                !entries.iter().any(|e| e.method == "human.ask" && e.status == EntryStatus::Pending)
            }
            Some(WaitReason::Approval) => {
                let entries = store.journal(&record.id, 0).await.unwrap_or_default();
                let mut over = false;
                for entry in
                    entries.iter().filter(|e| e.method == "tool.call" && e.status == EntryStatus::Pending)
                {
                    for kind in [
                        crate::approvals::ApprovalKind::Required,
                        crate::approvals::ApprovalKind::RetryAfterCrash,
                    ] {
                        if self.stored_decision(&record.id, entry.seq, kind).await.ok().flatten().is_some() {
                            over = true;
                        }
                    }
                }
                over
            }
            Some(WaitReason::Timer) => self.timer_due(&record.id).await.is_some_and(|due| due <= now_ms()),
            _ => false,
        }
    }

    /// Whether a child named by one of the run's pending `proc.wait`s has ended.
    async fn any_child_ended(&self, run: &RunId) -> bool {
        let entries = self.store().journal(run, 0).await.unwrap_or_default();
        for entry in entries.iter().filter(|e| e.method == "proc.wait" && e.status == EntryStatus::Pending) {
            let waited =
                entry.params.get("run_id").and_then(Value::as_str).and_then(|id| RunId::parse(id).ok());
            if let Some(waited) = waited
                && let Ok(Some(child)) = self.store().get_run(&waited).await
                && child.state.is_terminal()
            {
                return true;
            }
        }
        false
    }

    /// When the pending `sys.sleep` of a run is due (Unix ms).
    async fn timer_due(&self, run: &RunId) -> Option<u64> {
        let entries = self.store().journal(run, 0).await.ok()?;
        entries
            .iter()
            .rev()
            .find(|e| e.method == "sys.sleep" && e.status == EntryStatus::Pending)
            .map(|e| e.started_at_ms + e.params.get("ms").and_then(Value::as_u64).unwrap_or(0))
    }

    /// Wakes a swapped-out sleeper when its timer is due.
    pub(crate) async fn wake_at_timer(&self, run: &RunId) {
        let Some(due) = self.timer_due(run).await else { return };
        let kernel = self.clone();
        let run = run.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(due.saturating_sub(now_ms()))).await;
            kernel.wake_swapped(&run).await;
        });
    }

    /// At kernel start: a swapped-out run stays swapped unless its wait ended meanwhile;
    /// sleepers get their timers back.
    pub(crate) async fn recover_swapped(&self, record: &RunRecord) -> bool {
        if !is_swapped(record) {
            return false;
        }
        if self.wait_is_over(record).await {
            return false; // Relaunch it now, like any interrupted run.
        }
        if record.wait_reason == Some(WaitReason::Timer) {
            self.wake_at_timer(&record.id).await;
        }
        true
    }
}

/// Counts a call for as long as it lives (`LiveRun::inflight`, `LiveRun::waiting_calls`).
pub(crate) struct Busy<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Busy<'a> {
    pub(crate) fn new(counter: &'a std::sync::atomic::AtomicUsize) -> Busy<'a> {
        counter.fetch_add(1, Ordering::SeqCst);
        Busy(counter)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
