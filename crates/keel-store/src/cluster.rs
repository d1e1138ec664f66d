//! Many kernel nodes on one shared store: node membership, run leases with a fencing
//! epoch, and wake-ups that cross nodes.
//!
//! A node joins with an id and the address it serves its API on, then renews a heartbeat
//! (`heartbeat`, one write however many runs it holds). A run is owned by at most one node
//! through a lease: (run, node, epoch). A lease is live while its node's heartbeat is;
//! there is no per-lease expiry to renew. Taking a lease (`acquire`, or `claim_orphans`
//! for runs whose node died) bumps the epoch.
//!
//! A run's lease ends with the run: the write that puts a run in an ended state removes
//! its lease in the same transaction.
//!
//! Fencing: once a node holds a lease, every write the store makes for that run (state,
//! journal, events, mailbox delivery) checks, in the same transaction, that the lease
//! still names this node and the epoch it took; otherwise it writes nothing and fails
//! with `Error::Fenced`. The check locks the lease row (`FOR SHARE`), and a claim skips
//! rows locked that way (`FOR UPDATE SKIP LOCKED`), so a claim never overtakes a write in
//! flight: a write either commits before the claim (and the new owner's replay sees it)
//! or fails. A node paused or cut off past its heartbeat can therefore never write for a
//! run another node took, whatever its own clock says: lease times come from the
//! database's clock only.

use std::time::Duration;

use async_trait::async_trait;
use keel_core::placement::{Change, Slot};
use keel_types::RunId;

use crate::Result;

/// What a node says about itself when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Unique among live nodes; a node restarting with its id takes back its runs.
    pub id: String,
    /// Where the node serves its HTTP API (`host:port`), for forwarding commands to it.
    pub addr: String,
    /// The keel version it runs.
    pub version: String,
}

/// A node as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub info: NodeInfo,
    pub started_at_ms: u64,
    pub heartbeat_at_ms: u64,
    /// Whether its heartbeat is current (by the database's clock).
    pub live: bool,
    /// Draining: it takes no new runs and hands its live ones over.
    pub draining: bool,
    /// How many run leases it holds.
    pub leases: u64,
}

/// The owner of a run's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub node: String,
    pub addr: String,
    pub epoch: u64,
    /// Whether the owner's heartbeat is current.
    pub live: bool,
}

/// Membership and leases of one node. All methods are safe to call concurrently.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> &str;

    /// Registers this node with a heartbeat good for `ttl`. `key` is a secret the node
    /// keeps (in its data directory): a node joining with the key of the id's current
    /// holder is that node restarted, and takes its id (and its runs) back at once, even
    /// while the dead process's heartbeat has not lapsed. Refuses (`Error::Refused`) when
    /// a live node with another key has the id, and when this machine's clock is more than
    /// `MAX_CLOCK_SKEW` off the database's.
    async fn join(&self, info: NodeInfo, key: &str, ttl: Duration) -> Result<()>;

    /// Extends this node's heartbeat, and so every lease it holds, by the `ttl` it joined
    /// with, from the database's now: one write, however many leases, then one read of
    /// the node's leases (linear in their number) to find the ones another node took since.
    /// Those are announced on `lost` (and returned).
    async fn heartbeat(&self) -> Result<Vec<RunId>>;

    /// Runs this node has lost to another node, as it finds out: a write refused as
    /// `Fenced`, or a heartbeat that found the lease gone. Their agents must die at once,
    /// and nothing more may be written for them from this node.
    fn lost(&self) -> tokio::sync::broadcast::Receiver<RunId>;

    /// Takes the run's lease when no live node holds it (no lease yet, its node's
    /// heartbeat lapsed, or it is this node's own), bumping the epoch; `None` when a live
    /// node other than this one holds it.
    async fn acquire(&self, run: &RunId) -> Result<Option<u64>>;

    /// Whether this node holds the run's lease (as far as it knows: a lease lost a
    /// moment ago still counts until a write or heartbeat finds out).
    fn holds(&self, run: &RunId) -> bool;

    /// Gives up the run's lease (the run ended here, or is handed over).
    async fn release(&self, run: &RunId) -> Result<()>;

    /// Takes up to `limit` leases of runs that are not ended and whose node's heartbeat
    /// lapsed, oldest run first, bumping each epoch; rows another node is claiming or
    /// writing through are skipped (`FOR UPDATE SKIP LOCKED`), never waited for.
    async fn claim_orphans(&self, limit: usize) -> Result<Vec<RunId>>;

    /// How long until the next heartbeat of another live node lapses (by the database's
    /// clock), if any is live: when a claim of its runs could first succeed.
    async fn next_lapse(&self) -> Result<Option<Duration>>;

    /// Who holds the run's lease, if anyone.
    async fn owner(&self, run: &RunId) -> Result<Option<Lease>>;

    /// Every node that has joined and not left, by id.
    async fn nodes(&self) -> Result<Vec<NodeRecord>>;

    /// Marks this node draining (it takes no new runs) or not.
    async fn set_draining(&self, draining: bool) -> Result<()>;

    /// Leaves the cluster: this node's heartbeat ends now, so the other nodes take its
    /// runs over at once (its record stays, not live, until the id joins again).
    async fn leave(&self) -> Result<()>;

    /// One admission decision on the cluster's ledger of live slots and waiting runs (see
    /// `keel_core::placement`): under a lock every node takes, the rows (those of ended
    /// runs, and rows whose run never got a record, dropped first) are given to `decide`,
    /// and the changes it returns are written, in one transaction. `decide` may be called
    /// again if the transaction has to be retried, so it must not act on its own.
    async fn admission(
        &self,
        decide: &mut (dyn for<'l> FnMut(&'l [Slot]) -> Vec<Change> + Send),
    ) -> Result<()>;

    /// Tells every node that something happened for `run` (a message arrived, a child
    /// ended, a decision was taken): its owner wakes whatever waits for it.
    async fn wake(&self, run: &RunId) -> Result<()>;

    /// The runs other nodes (or this one) said something happened for (`wake`).
    fn wakes(&self) -> tokio::sync::broadcast::Receiver<RunId>;

    /// A secret every node of the cluster shares (made by the first node that asks), with
    /// which a node authenticates a request it forwards to the run's owner.
    async fn secret(&self) -> Result<String>;
}

/// How far a node's clock may be from the database's before it is refused at join.
/// Leases use the database's clock only; a node far off would still show confusing
/// times and expire its own timers (sleeps, deadlines) at the wrong moments.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5);

/// The default heartbeat lifetime of a node's leases (`keel serve --lease-ttl`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
