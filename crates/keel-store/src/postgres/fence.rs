//! The write side of run leases (see `crate::cluster`): every write this store makes for
//! a run checks, in its own transaction, that this node still holds the run's lease at
//! the epoch it took, and locks the lease row against a claim while it commits.
//!
//! A store that has not joined a cluster (`PgStore::node` never called) checks nothing:
//! it is the only kernel on its database, like SQLite.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use keel_types::RunId;
use tokio::sync::broadcast;

use super::pg_error;
use crate::{Error, Result};

/// How many lost-run notices wait for the kernel before the oldest are dropped (it then
/// learns of them from the next heartbeat).
const LOST_BACKLOG: usize = 1024;

#[derive(Debug)]
pub(crate) struct Fences {
    /// This node's id, once it joined a cluster.
    node: OnceLock<String>,
    /// The epoch of each lease this node holds.
    held: Mutex<HashMap<RunId, u64>>,
    /// Runs lost to another node, announced to the kernel (`Cluster::lost`).
    lost: broadcast::Sender<RunId>,
}

impl Default for Fences {
    fn default() -> Fences {
        Fences { node: OnceLock::new(), held: Mutex::default(), lost: broadcast::channel(LOST_BACKLOG).0 }
    }
}

impl Fences {
    /// Refuses the write unless this node may write for `run`: it holds the run's lease
    /// at the epoch the lease row names, or holds none and no other live node does. Locks
    /// the lease row `FOR SHARE` until the transaction ends, so a claim (which takes it
    /// `FOR UPDATE SKIP LOCKED`) cannot overtake the write.
    pub(crate) async fn check(&self, tx: &tokio_postgres::Transaction<'_>, run: &RunId) -> Result<()> {
        self.check_locking(tx, run, "FOR SHARE OF l").await
    }

    /// `check` for a write that may end the run, and so delete the lease row (`end`):
    /// the row is locked `FOR UPDATE` at once. Taking it `FOR SHARE` and upgrading at the
    /// delete deadlocks with a concurrent write for the same run (events, the journal),
    /// which holds the lease row shared and then waits for the run's row this
    /// transaction has locked; Postgres then aborts one of them.
    pub(crate) async fn check_to_end(&self, tx: &tokio_postgres::Transaction<'_>, run: &RunId) -> Result<()> {
        self.check_locking(tx, run, "FOR UPDATE OF l").await
    }

    async fn check_locking(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        run: &RunId,
        lock: &str,
    ) -> Result<()> {
        let Some(node) = self.node.get() else { return Ok(()) };
        let row = tx
            .query_opt(
                &format!(
                    "SELECT l.node, l.epoch, COALESCE(n.expires_at > now(), false) AS live
                     FROM run_leases l LEFT JOIN keel_nodes n ON n.id = l.node
                     WHERE l.run_id = $1 {lock}"
                ),
                &[&run.as_str()],
            )
            .await
            .map_err(pg_error("checking the run's lease"))?;
        let lease =
            row.map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1) as u64, row.get::<_, bool>(2)));
        match (self.held(run), lease) {
            (Some(epoch), Some((owner, current, _))) if owner == *node && current == epoch => Ok(()),
            (Some(epoch), _) => {
                self.lose(run);
                Err(Error::Fenced { run: run.clone(), epoch })
            }
            (None, Some((owner, _, true))) if owner != *node => Err(Error::Refused(format!(
                "run {run} is run by node {owner}; this node does not write for it (send the request to that node)"
            ))),
            (None, _) => Ok(()),
        }
    }

    /// Removes the lease of a run that has just ended, inside the transaction that ends it.
    pub(crate) async fn end(&self, tx: &tokio_postgres::Transaction<'_>, run: &RunId) -> Result<()> {
        tx.execute("DELETE FROM run_leases WHERE run_id = $1", &[&run.as_str()])
            .await
            .map_err(pg_error("ending the run's lease"))?;
        Ok(())
    }

    pub(crate) fn join(&self, node: &str) -> Result<()> {
        let current = self.node.get_or_init(|| node.to_owned());
        if current != node {
            return Err(Error::Refused(format!(
                "this store already joined the cluster as node {current}; it cannot also be node {node}"
            )));
        }
        Ok(())
    }

    pub(crate) fn held(&self, run: &RunId) -> Option<u64> {
        self.leases().get(run).copied()
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<RunId, u64>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn hold(&self, run: &RunId, epoch: u64) {
        self.leases().insert(run.clone(), epoch);
    }

    pub(crate) fn release(&self, run: &RunId) {
        self.leases().remove(run);
    }

    /// Every lease this node holds, with its epoch.
    pub(crate) fn all_held(&self) -> Vec<(RunId, u64)> {
        self.leases().iter().map(|(run, epoch)| (run.clone(), *epoch)).collect()
    }

    /// Forgets the run's lease and tells the kernel it is lost.
    pub(crate) fn lose(&self, run: &RunId) {
        if self.leases().remove(run).is_some() {
            let _ = self.lost.send(run.clone());
        }
    }

    pub(crate) fn lost(&self) -> broadcast::Receiver<RunId> {
        self.lost.subscribe()
    }
}
