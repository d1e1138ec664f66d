//! This kernel as one node of several sharing a store (see `keel_store::cluster`): the
//! lease a run's agent starts under, the heartbeat that keeps this node's leases, runs
//! lost to another node (their agents die at once), and the runs of dead nodes, claimed
//! and brought back by replay exactly as a restart brings back its own.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_sandbox::tree;
use keel_store::RunRecord;
use keel_types::RunId;
use tokio::sync::broadcast::error::RecvError;

use crate::run::LiveRun;
use crate::{Kernel, Result};

/// How many orphaned runs one claim takes; the next claim follows at once while a
/// claim comes back full.
const CLAIM_BATCH: usize = 32;

/// How long after a heartbeat's expiry (by the database's clock) a claim looks: enough
/// for the expiry to have passed when the claim's query runs.
const LAPSE_MARGIN: Duration = Duration::from_millis(20);

impl Kernel {
    /// Takes the run's lease before its agent starts: whether this node may run it (no
    /// cluster: always). `false` means a live node already holds it.
    pub(crate) async fn take_lease(&self, run: &RunId) -> Result<bool> {
        let Some(member) = &self.inner.cluster else { return Ok(true) };
        Ok(member.cluster.acquire(run).await?.is_some())
    }

    /// Whether another node may have taken `live`'s run over: told so (`lose`), or found
    /// out by the store a moment ago (a fenced write drops the lease at once, before the
    /// notice reaches `lose`). An agent that exits on the error that write caused must not
    /// have its run's marker swept here: on a shared host that would kill the agent the
    /// new owner started. (Settling still waits for `lose`: the store refuses its writes.)
    pub(crate) fn lost(&self, live: &LiveRun) -> bool {
        live.lost.load(Ordering::SeqCst)
            || self.inner.cluster.as_ref().is_some_and(|member| !member.cluster.holds(&live.id))
    }

    /// Gives up the lease of a run this node claimed but does not run: it ended just as
    /// it was claimed, or it goes on waiting for a live slot (which the node with room
    /// takes).
    pub(crate) async fn give_up_lease(&self, run: &RunId) {
        let Some(member) = &self.inner.cluster else { return };
        if let Err(err) = member.cluster.release(run).await {
            // For an ended run the row is harmless; a queued run's waits until this node's
            // heartbeat lapses before another node can start it.
            tracing::warn!(run = %run, "could not give up the run's lease: {err}");
        }
    }

    /// The background duties of a node: the heartbeat, killing the agents of runs lost to
    /// another node, and claiming the runs of nodes whose heartbeat lapsed.
    pub(crate) fn spawn_cluster_duties(&self) {
        let Some(member) = self.inner.cluster.clone() else { return };
        let every = (member.lease_ttl / 3).max(Duration::from_millis(100));

        let kernel = self.clone();
        let cluster = Arc::clone(&member.cluster);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !kernel.inner.shutting_down.load(Ordering::SeqCst) {
                tick.tick().await;
                // A failed heartbeat is retried at the next tick; the leases stay good
                // until the ttl, and a write after that is fenced by the store.
                if let Err(err) = cluster.heartbeat().await {
                    tracing::warn!("the cluster heartbeat failed (retrying): {err}");
                }
            }
        });

        let kernel = self.clone();
        let mut lost = member.cluster.lost();
        tokio::spawn(async move {
            loop {
                match lost.recv().await {
                    Ok(run) => kernel.lose(&run),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            "{missed} lost-run notices were missed; the next heartbeat repeats them"
                        );
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        });

        let kernel = self.clone();
        let mut wakes = member.cluster.wakes();
        tokio::spawn(async move {
            loop {
                match wakes.recv().await {
                    Ok(run) => kernel.woken_from_elsewhere(&run),
                    // Waiters poll as well: a missed wake-up delays them, never loses one.
                    Err(RecvError::Lagged(_)) => kernel.inner.run_ended.notify_waiters(),
                    Err(RecvError::Closed) => break,
                }
            }
        });

        if self.inner.admissions.shared().is_some() {
            // Queued runs this node has room for: looked for when another node says one
            // may start, and at every heartbeat in case that word was lost.
            let kernel = self.clone();
            tokio::spawn(async move {
                while !kernel.inner.shutting_down.load(Ordering::SeqCst) {
                    let _ = tokio::time::timeout(every, kernel.inner.pull_wanted.notified()).await;
                    kernel.pull_queued().await;
                    // Word from several nodes at once is served by one look.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }

        let kernel = self.clone();
        tokio::spawn(async move {
            while !kernel.inner.shutting_down.load(Ordering::SeqCst) {
                let claimed = match member.cluster.claim_orphans(CLAIM_BATCH).await {
                    Ok(claimed) => claimed,
                    Err(err) => {
                        tracing::warn!("claiming the runs of dead nodes failed (retrying): {err}");
                        Vec::new()
                    }
                };
                let full = claimed.len() == CLAIM_BATCH;
                if !claimed.is_empty() {
                    tracing::info!("took over {} run(s) from nodes whose heartbeat lapsed", claimed.len());
                    kernel.recover_claimed(claimed).await;
                }
                if !full {
                    // Look again when the next live node's heartbeat would lapse, if that
                    // comes sooner than the next round: a dead node's runs are taken the
                    // moment its lease allows, not up to a third of a ttl later.
                    let lapse = member.cluster.next_lapse().await.ok().flatten();
                    let wait = lapse.map_or(every, |lapse| (lapse + LAPSE_MARGIN).min(every));
                    tokio::time::sleep(wait).await;
                }
            }
        });
    }

    /// Brings back runs whose leases this node just took, by replay.
    async fn recover_claimed(&self, claimed: Vec<RunId>) {
        let mut runs: Vec<RunRecord> = Vec::with_capacity(claimed.len());
        for run in claimed {
            match self.inner.store.get_run(&run).await {
                Ok(Some(record)) if !record.state.is_terminal() => runs.push(record),
                Ok(_) => self.give_up_lease(&run).await,
                Err(err) => tracing::warn!(run = %run, "a claimed run could not be read: {err}"),
            }
        }
        let kernel = self.clone();
        // In the background: a claim must not wait for relaunches, or a large takeover
        // would hold back the next claim.
        tokio::spawn(async move {
            if let Err(err) = kernel.recover_all(runs).await {
                tracing::error!("recovery of claimed runs stopped: {err}");
            }
        });
    }

    /// Another node took `run` over: its agent here dies at once and this node writes
    /// nothing more for it (the store would refuse it anyway).
    fn lose(&self, run: &RunId) {
        let Some(live) = self.live(run) else { return };
        tracing::warn!(run = %run, "another node took the run over; killing its agent here");
        live.lost.store(true, Ordering::SeqCst);
        live.ended.send_replace(true);
        // Its process group (and sandbox init) only, not every process carrying the run's
        // marker: on the same host, those include the agent the new owner started.
        tree::signal_group(live.pid, nix::sys::signal::Signal::SIGKILL);
        tree::kill_pids(&[live.pid]);
        self.release_slot(run);
    }
}

impl Kernel {
    /// Tells the other nodes something happened for `run` (see `Cluster::wake`), unless
    /// its agent runs here; without a cluster, nothing.
    pub(crate) fn tell_cluster(&self, run: &RunId) {
        let Some(member) = &self.inner.cluster else { return };
        if self.live(run).is_some() {
            return;
        }
        let cluster = Arc::clone(&member.cluster);
        let run = run.clone();
        tokio::spawn(async move {
            if let Err(err) = cluster.wake(&run).await {
                // Waiters re-check on their own timers (mailbox and proc.wait polls),
                // so a lost wake-up delays, never loses.
                tracing::warn!(run = %run, "could not tell the other nodes about the run: {err}");
            }
        });
    }

    /// Wakes, on this node, whatever waits for `run` after another node said something
    /// happened for it.
    fn woken_from_elsewhere(&self, run: &RunId) {
        self.inner.mailboxes.arrived(run);
        self.inner.mailboxes.taken(run, 1);
        self.inner.run_ended.notify_waiters();
        // A slot may have freed, or a run been queued, on another node.
        self.inner.pull_wanted.notify_one();
        // Only the owner brings a swapped-out run back; the others' writes would be
        // refused.
        if self.inner.cluster.as_ref().is_some_and(|member| member.cluster.holds(run)) {
            let _ = self.inner.wakeups.send(run.clone());
        }
    }
}
