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

use deadpool_postgres::Transaction;

use super::pg_error;
use super::queries::{prepare, query_opt};
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
    pub(crate) async fn check(&self, tx: &Transaction<'_>, run: &RunId) -> Result<()> {
        self.check_locking(tx, run, LeaseLock::Share).await
    }

    /// `write` (a write for `run` in `tx`, not yet polled) with `check` pipelined ahead of
    /// it: one round trip for both, not one each. The check's statement is prepared first
    /// (a round trip the first time on a connection only), so its query goes out before
    /// the write's statements and the lease row is locked before the run's row, the order
    /// every write for a run takes them in. The write's outcome counts only if the check
    /// passed, and nothing commits before the caller commits.
    pub(crate) async fn checked<T>(
        &self,
        tx: &Transaction<'_>,
        run: &RunId,
        write: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.checked_locking(tx, run, LeaseLock::Share, write).await
    }

    /// `checked` for a write that may end the run, and so delete the lease row (`end`):
    /// the row is locked `FOR UPDATE` at once. Taking it `FOR SHARE` and upgrading at the
    /// delete deadlocks with a concurrent write for the same run (events, the journal),
    /// which holds the lease row shared and then waits for the run's row this
    /// transaction has locked; Postgres then aborts one of them.
    pub(crate) async fn checked_to_end<T>(
        &self,
        tx: &Transaction<'_>,
        run: &RunId,
        write: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.checked_locking(tx, run, LeaseLock::Update, write).await
    }

    async fn checked_locking<T>(
        &self,
        tx: &Transaction<'_>,
        run: &RunId,
        lock: LeaseLock,
        write: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.joined() {
            prepare(tx, "reading the run's lease", lease_sql(lock)).await?;
        }
        let (fenced, written) = tokio::join!(self.check_locking(tx, run, lock), write);
        fenced?;
        written
    }

    async fn check_locking(&self, tx: &Transaction<'_>, run: &RunId, lock: LeaseLock) -> Result<()> {
        let Some(node) = self.node.get() else { return Ok(()) };
        match (self.held(run), lease_row(tx, run, lock).await?) {
            (Some(epoch), Some(lease)) if lease.node == *node && lease.epoch == epoch => Ok(()),
            (Some(epoch), _) => {
                self.lose(run);
                Err(Error::Fenced { run: run.clone(), epoch })
            }
            (None, Some(lease)) if lease.live && lease.node != *node => Err(Error::Refused(format!(
                "run {run} is run by node {}; this node does not write for it (send the request to that node)",
                lease.node
            ))),
            (None, _) => Ok(()),
        }
    }

    /// Removes the lease of a run that has just ended, inside the transaction that ends it.
    pub(crate) async fn end(&self, tx: &Transaction<'_>, run: &RunId) -> Result<()> {
        tx.execute("DELETE FROM run_leases WHERE run_id = $1", &[&run.as_str()])
            .await
            .map_err(pg_error("ending the run's lease"))?;
        Ok(())
    }

    /// Whether this store joined a cluster, so that its writes for a run are checked.
    pub(crate) fn joined(&self) -> bool {
        self.node.get().is_some()
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

/// A run's lease row as a write or a claim reads it.
pub(crate) struct LeaseRow {
    pub(crate) node: String,
    pub(crate) epoch: u64,
    /// Whether its node's heartbeat is current (by the database's clock).
    pub(crate) live: bool,
}

/// How a lease row is locked while it is read.
#[derive(Clone, Copy)]
pub(crate) enum LeaseLock {
    /// A write for the run: a claim must not overtake it.
    Share,
    /// A write that may delete the row, or `acquire`: waits for the row's other holders.
    Update,
    /// A claim: a row another transaction holds is skipped (read as absent).
    UpdateSkipLocked,
}

/// Reads (and locks) the run's lease row; one prepared statement per lock, cached on the
/// connection, since every write for a run in a cluster does this.
pub(crate) async fn lease_row(
    tx: &Transaction<'_>,
    run: &RunId,
    lock: LeaseLock,
) -> Result<Option<LeaseRow>> {
    let row = query_opt(tx, "reading the run's lease", lease_sql(lock), &[&run.as_str()]).await?;
    Ok(row.map(|row| LeaseRow { node: row.get(0), epoch: row.get::<_, i64>(1) as u64, live: row.get(2) }))
}

/// The statement reading a run's lease row with `lock`.
fn lease_sql(lock: LeaseLock) -> &'static str {
    macro_rules! select {
        ($lock:literal) => {
            concat!(
                "SELECT l.node, l.epoch, COALESCE(n.expires_at > now(), false) ",
                "FROM run_leases l LEFT JOIN keel_nodes n ON n.id = l.node WHERE l.run_id = $1 ",
                $lock
            )
        };
    }
    match lock {
        LeaseLock::Share => select!("FOR SHARE OF l"),
        LeaseLock::Update => select!("FOR UPDATE OF l"),
        LeaseLock::UpdateSkipLocked => select!("FOR UPDATE OF l SKIP LOCKED"),
    }
}
