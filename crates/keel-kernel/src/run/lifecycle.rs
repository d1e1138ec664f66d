//! Lifecycle changes: decided by the pure state machine (`keel_core::lifecycle`), written
//! with a compare-and-set on the previous state under the run's own transition lock.

use keel_protocol::EventKind;

use keel_core::lifecycle::{self, Command as Lifecycle};
use keel_store::{RunPatch, RunRecord};
use keel_types::{RunId, RunState, WaitReason};
use serde_json::json;

use crate::{Error, Result};
use crate::{Kernel, lock, now_ms};

impl Kernel {
    /// Applies a lifecycle command: decides with the pure state machine, then writes the
    /// new state only if nobody changed it meanwhile. Emits a `state` event.
    pub(crate) async fn transition(
        &self,
        run: &RunId,
        command: Lifecycle,
        patch: RunPatch,
    ) -> Result<RunRecord> {
        let updated = self.transition_if(run, command, patch, |_| true).await?;
        updated.ok_or_else(|| Error::Conflict(format!("run {run} changed while it was being changed")))
    }

    /// The run's transition lock: held by every change of its state (and by anything that
    /// writes its record on the strength of a state it read).
    pub(crate) async fn run_lock(&self, run: &RunId) -> tokio::sync::OwnedMutexGuard<()> {
        let run_lock = lock(&self.inner.transitions).entry(run.clone()).or_default().clone();
        run_lock.lock_owned().await
    }

    /// [`Kernel::transition`], if `applies` holds for the run as it is under the run's
    /// transition lock (`None` when it does not): for changes decided by reading the run,
    /// so that two deciders cannot both act on what one of them already changed.
    pub(crate) async fn transition_if(
        &self,
        run: &RunId,
        command: Lifecycle,
        mut patch: RunPatch,
        applies: impl FnOnce(&RunRecord) -> bool,
    ) -> Result<Option<RunRecord>> {
        let serial = self.run_lock(run).await;
        let current = self.get(run).await?;
        if !applies(&current) {
            return Ok(None);
        }
        let next = lifecycle::transition(current.state, command)?;
        let now = now_ms();
        patch.state = Some(next);
        patch.updated_at_ms = Some(now);
        // A waiting run keeps its reason while paused, so resume knows where to go back.
        patch.wait_reason = Some(match (next, command) {
            (RunState::Waiting, Lifecycle::Park(reason)) => Some(reason),
            (RunState::Waiting, _) => current.wait_reason.or(Some(WaitReason::Human)),
            (RunState::Paused, _) => current.wait_reason,
            _ => None,
        });
        if next.is_terminal() {
            patch.ended_at_ms = Some(Some(now));
        }
        // From here the change is written and announced even if the caller stops waiting
        // (a syscall whose agent died): the task holds the run's lock until the write is
        // done, so no other change can read the state this one is replacing. (Released
        // with the caller, the lock let a dropped wake-up land after a stop had read
        // `waiting`, and the stop failed, leaving the run `running` with a dead process.)
        let kernel = self.clone();
        let run = run.clone();
        let write = tokio::spawn(async move {
            let _serial = serial;
            kernel.write_transition(&run, current, next, patch).await
        });
        match write.await {
            Ok(result) => result.map(Some),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => Err(Error::Conflict(format!("the change of a run was abandoned: {err}"))),
        }
    }

    /// The write and announcement of a transition decided by [`Kernel::transition_if`],
    /// under the run's lock.
    async fn write_transition(
        &self,
        run: &RunId,
        current: RunRecord,
        next: RunState,
        patch: RunPatch,
    ) -> Result<RunRecord> {
        if next.is_terminal() && self.inner.cluster.is_some() {
            // The write that ends a run ends its lease, and a write for a run whose lease
            // is gone is refused: the events emitted before the end (the agent's last
            // lines of output) must be in the store first, or they would be dropped.
            self.inner.events.flush().await;
        }
        let stamp = patch.updated_at_ms;
        let updated = match self.inner.store.update_run(run, Some(current.state), patch).await {
            // Cut off while committing: read back. Under the run's lock nothing else
            // changes its state, so the run found in `next` with this change's time is this
            // write, landed, and must still be announced (the end of a run releases its
            // slot, wakes its parent and its waiters). Otherwise the caller may try again:
            // a retry that found the write landed would be refused (`next` is no longer
            // `current`) and nothing would ever announce the change.
            Err(err @ keel_store::Error::OutcomeUnknown { .. }) => {
                let still_wanted = || !self.inner.shutting_down.load(std::sync::atomic::Ordering::SeqCst);
                match crate::outage::retry_while(run, still_wanted, false, || self.inner.store.get_run(run))
                    .await
                {
                    Ok(Some(found)) if found.state == next && Some(found.updated_at_ms) == stamp => found,
                    _ => return Err(err.into()),
                }
            }
            outcome => outcome?,
        };
        if next.is_terminal() {
            self.inner.telemetry.run_ended(&updated);
            lock(&self.inner.transitions).remove(run); // An ended run never changes again.
            self.inner.run_ended.notify_waiters();
            self.release_slot(run);
            // The parent gets back what is left of the child's budget slice, and comes
            // back itself if it was swapped out waiting for its children.
            let parent = match crate::run::RunSpec::of(&updated) {
                Ok(spec) => spec.parent,
                Err(err) => {
                    tracing::warn!(run = %run, "its parent cannot be told it ended: {err}");
                    None
                }
            };
            if let Some(parent) = parent {
                self.return_slice(&parent, &updated);
                self.request_wake(&parent);
            }
            self.event_run_ended(&updated);
        }
        let mut data = json!({ "state": next.as_str(), "from": current.state.as_str() });
        if let Some(reason) = updated.wait_reason {
            data["wait_reason"] = json!(reason.as_str());
        }
        if next.is_terminal() {
            if let Some(error) = &updated.error {
                data["error"] = json!(error);
            }
            if let Some(code) = updated.exit_code {
                data["exit_code"] = json!(code);
            }
        }
        // (Among several nodes, the store ended the run's lease with the write above.)
        self.emit(run, EventKind::State, data);
        Ok(updated)
    }
}
