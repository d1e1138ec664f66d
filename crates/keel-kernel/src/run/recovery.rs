//! Recovery after a restart: every run that was live when the previous kernel stopped is
//! brought back by relaunching its agent against its journal.

use futures_util::StreamExt;
use keel_core::lifecycle::Command as Lifecycle;
use keel_sandbox::tree;
use keel_store::{RunFilter, RunPatch, RunRecord};
use keel_types::RunState;
use nix::sys::signal::Signal;

use crate::Kernel;
use crate::Result;

impl Kernel {
    /// The runs that were live when the previous kernel stopped, oldest first.
    pub(crate) async fn interrupted_runs(&self) -> Result<Vec<RunRecord>> {
        let filter = RunFilter {
            states: vec![
                RunState::Created,
                RunState::Queued,
                RunState::Running,
                RunState::Waiting,
                RunState::Recovering,
            ],
            ..RunFilter::default()
        };
        let mut runs = self.inner.store.list_runs(&filter).await?;
        runs.reverse(); // Oldest first.
        Ok(runs)
    }

    /// Brings back interrupted runs (listed at start, or claimed from other nodes),
    /// several at a time so that their journal writes share commits.
    pub(crate) async fn recover_all(&self, runs: Vec<RunRecord>) -> Result<()> {
        // A kernel alone recovers its own runs from before a restart, whose recorded pids
        // are on this host; a node recovers what it claimed, possibly from another host
        // (its own previous life's included, whose leftovers died with it by PDEATHSIG).
        let own = self.inner.cluster.is_none();
        // Swapped-out runs stay swapped out until what they wait for happens, and hold no
        // live slot meanwhile.
        let mut resident = Vec::with_capacity(runs.len());
        for run in runs {
            if !self.recover_swapped(&run).await {
                resident.push(run);
            }
        }
        let runs = resident;
        // Runs that were live keep their slots; queued ones queue again (in `recover`).
        let live: Vec<&RunRecord> =
            runs.iter().filter(|r| !matches!(r.state, RunState::Created | RunState::Queued)).collect();
        self.restore_live_slots(&live).await;
        // Agents of the previous kernel die with it (PDEATHSIG), but descendants that
        // escaped may linger; they must not race the relaunched agents. One scan of /proc
        // serves every run. Runs taken over from another node are that node's to kill:
        // their pids mean nothing here, and a node that was only paused kills its own
        // agents once it finds its leases gone (see `run/cluster.rs`).
        if own {
            let mut leftovers = tree::processes_by_marker();
            for run in &runs {
                if let Some(pid) = run.pid {
                    tree::signal_group(pid, Signal::SIGKILL);
                }
                if let Some(pids) = leftovers.remove(run.id.as_str()) {
                    tree::kill_pids(&pids);
                }
            }
        }
        const PARALLEL: usize = 16;
        let kernel = self.clone();
        futures_util::stream::iter(runs)
            .for_each_concurrent(PARALLEL, |run| {
                let kernel = kernel.clone();
                async move {
                    let (id, before) = (run.id.clone(), (run.pid, run.attempt));
                    match kernel.recover(run).await {
                        // Started here, not left queued, failed, or to another node's lease.
                        Ok(record) if record.pid.is_some() && (record.pid, record.attempt) != before => {
                            kernel.inner.metrics.run_recovered();
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!(run = %id, "could not recover the run: {err}"),
                    }
                }
            })
            .await;
        Ok(())
    }

    async fn recover(&self, run: RunRecord) -> Result<RunRecord> {
        match run.state {
            RunState::Created | RunState::Queued => {
                let run = if run.state == RunState::Created {
                    self.transition(&run.id, Lifecycle::Enqueue, RunPatch::default()).await?
                } else {
                    run
                };
                if !self.restore_slot(&run).await {
                    // Still waiting for a live slot. Among several nodes, the node with
                    // room starts it: a lease taken to recover it here is given up.
                    self.give_up_lease(&run.id).await;
                    return Ok(run);
                }
                self.launch(run, false).await
            }
            _ => {
                let record = if run.state == RunState::Recovering {
                    run
                } else {
                    self.transition(&run.id, Lifecycle::KernelRestart, RunPatch::default()).await?
                };
                self.launch(record, true).await
            }
        }
    }
}
