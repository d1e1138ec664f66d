//! Swapping: a run that has waited long enough for something durable (an answer, a
//! message, a child, an approval, a timer) has its agent stopped; when the wait ends it is
//! relaunched by replay. Decided under the run's transition lock, so two wake-ups at once
//! bring it back once.

use crate::Kernel;
use crate::now_ms;
use crate::run::LiveRun;
use crate::swap::{is_swapped, swappable};
use keel_core::lifecycle::Command as Lifecycle;
use keel_protocol::EventKind;
use keel_store::{RunPatch, RunRecord};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the swapper gives the allocator's free memory back even when nothing was
/// swapped out (see `spawn_swapper`).
const RELEASE_EVERY: Duration = Duration::from_secs(5);

impl Kernel {
    /// Checks the live runs once a tick and swaps out those waiting too long.
    pub(crate) fn spawn_swapper(&self, threshold: Duration) {
        let kernel = self.clone();
        let tick = (threshold / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        tokio::spawn(async move {
            // Whether runs were swapped out last tick: their agents have ended since.
            let mut swapped_last_tick = false;
            let mut last_release = std::time::Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                if kernel.inner.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                if swapped_last_tick || last_release.elapsed() >= RELEASE_EVERY {
                    // What swapped-out runs' connections and calls held (and what big
                    // listings took for a moment) is free now, but the allocator keeps a
                    // freed page in the middle of an arena: without this, parked runs cost
                    // about twice as much.
                    tokio::task::spawn_blocking(keel_sandbox::release_free_heap);
                    last_release = std::time::Instant::now();
                }
                let live: Vec<Arc<LiveRun>> = kernel.live_runs();
                swapped_last_tick = false;
                for run in live {
                    swapped_last_tick |= kernel.maybe_swap_out(&run, threshold).await;
                }
            }
        });
    }

    /// Returns whether the run is being swapped out.
    async fn maybe_swap_out(&self, live: &Arc<LiveRun>, threshold: Duration) -> bool {
        // Every call in flight must be a durable wait: then killing the agent loses nothing.
        let inflight = live.inflight.load(Ordering::SeqCst);
        let waiting = live.waiting_calls.load(Ordering::SeqCst);
        if inflight == 0 || inflight != waiting || live.exited.load(Ordering::SeqCst) {
            return false;
        }
        let Ok(record) = self.get(&live.id).await else { return false };
        if record.state != RunState::Waiting || !swappable(record.wait_reason) {
            return false;
        }
        if now_ms().saturating_sub(record.updated_at_ms) < threshold.as_millis() as u64 {
            return false;
        }
        if live.swapping.swap(true, Ordering::SeqCst) {
            return false;
        }
        // A wait that ended meanwhile keeps its process (one that ends after this point
        // is caught by `settle_swapped`).
        let inflight = live.inflight.load(Ordering::SeqCst);
        if inflight == 0 || inflight != live.waiting_calls.load(Ordering::SeqCst) {
            live.swapping.store(false, Ordering::SeqCst);
            return false;
        }
        self.emit(
            &live.id,
            EventKind::Swap,
            json!({ "out": true, "wait_reason": record.wait_reason.map(|r| r.as_str()) }),
        );
        live.kill_tree();
        if record.wait_reason == Some(WaitReason::Timer) {
            self.wake_at_timer(&live.id).await;
        }
        true
    }

    /// After a swapped-out agent's process ended: the run stays waiting, with no process.
    pub(crate) async fn settle_swapped(&self, live: &Arc<LiveRun>) {
        let patch = RunPatch { pid: Some(None), updated_at_ms: Some(now_ms()), ..RunPatch::default() };
        // Under the run's lock: a wake-up by the dead agent's own call either was written
        // before (then this fails, below) or finds the agent gone and does nothing.
        let serial = self.run_lock(&live.id).await;
        let settled = self.store().update_run(&live.id, Some(RunState::Waiting), patch).await;
        drop(serial);
        if let Err(err) = settled {
            // Its wait ended just as the agent was being stopped (the message came, and the
            // agent's own call took it): the run is running with no process, so it comes
            // back by replay, which answers that call from the journal or the mailbox.
            tracing::debug!(run = %live.id, "swapped-out run changed while settling: {err}");
            let relaunch = self
                .transition_if(&live.id, Lifecycle::KernelRestart, RunPatch::default(), |record| {
                    record.state == RunState::Running && self.live(&live.id).is_none()
                })
                .await;
            match relaunch {
                Ok(Some(record)) => {
                    if let Err(err) = Box::pin(self.relaunch(record)).await {
                        tracing::warn!(run = %live.id, "could not bring the run back: {err}");
                    }
                }
                Ok(None) => {} // Stopped, ended or already back.
                Err(err) => tracing::warn!(run = %live.id, "could not bring the run back: {err}"),
            }
            return;
        }
        // A run with no process holds no live slot: queued runs may start meanwhile.
        self.release_slot(&live.id);
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
        // It gave its live slot back when it was swapped out, and needs one again; if
        // none is free it waits in the admission queue, still swapped out.
        let Ok(record) = self.get(run).await else { return };
        if !is_swapped(&record) {
            return;
        }
        if !self.reclaim_slot(&record).await {
            self.emit(run, EventKind::Queued, json!({ "reason": self.queue_reason(run) }));
            return;
        }
        // Decided under the run's transition lock: of two wake-ups at once (a message
        // and the swap-out's own check, say), only the first relaunches.
        let woken = self
            .transition_if(run, Lifecycle::KernelRestart, RunPatch::default(), |record| {
                is_swapped(record) && self.live(run).is_none()
            })
            .await;
        match woken {
            // Brought back by another wake-up (which holds the same slot), or ended
            // meanwhile: then the slot just taken goes back.
            Ok(None) => {
                if self.get(run).await.is_ok_and(|record| record.state.is_terminal()) {
                    self.release_slot(run);
                }
            }
            Ok(Some(record)) => {
                self.emit(run, EventKind::Swap, json!({ "out": false }));
                let kernel = self.clone();
                tokio::spawn(async move { kernel.relaunch_in_turn(record).await });
            }
            Err(err) => tracing::debug!(run = %run, "swap-in raced another change: {err}"),
        }
    }

    /// Relaunches a woken run in its turn (`SwapIn`): at once when a turn is free, else
    /// once one is, if the run still waits to be started. The turn is held until the
    /// agent's first call, its end or the hold.
    async fn relaunch_in_turn(&self, record: RunRecord) {
        let id = record.id.clone();
        let turns = &self.inner.swap_in_turns;
        let (turn, record) = match turns.clone().try_acquire_owned() {
            Ok(turn) => (Some(turn), record),
            Err(_) => {
                // The semaphore is never closed.
                let turn = turns.clone().acquire_owned().await.ok();
                // Paused, stopped or resumed by an operator while it waited: not this
                // wake's to start.
                match self.get(&id).await {
                    Ok(now) if now.state == RunState::Recovering && self.live(&id).is_none() => (turn, now),
                    _ => return,
                }
            }
        };
        if let Err(err) = Box::pin(self.relaunch(record)).await {
            tracing::warn!(run = %id, "could not swap the run back in: {err}");
            return;
        }
        if let Some(live) = self.live(&id) {
            live.first_call_or_end(self.inner.swap_in_hold).await;
        }
        drop(turn);
    }

    /// Whether a swapped-out run's wait has ended (an answer, a message, a child's end,
    /// a decision, or its timer), read from the store alone.
    async fn wait_is_over(&self, record: &RunRecord) -> bool {
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
    async fn wake_at_timer(&self, run: &RunId) {
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
