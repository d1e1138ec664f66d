//! `Cluster` on Postgres: nodes in `keel_nodes` (a heartbeat with an expiry from the
//! database's clock), leases in `run_leases` (node, epoch), and the fences every write
//! checks (`fence.rs`). See `crate::cluster` for the rules.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use keel_types::RunId;

use super::fence::{Fences, LeaseLock, LeaseRow, lease_row};
use super::{PgStore, pg_error};
use crate::cluster::{Cluster, Lease, MAX_CLOCK_SKEW, NodeInfo, NodeRecord};
use crate::{Error, Result};
use keel_core::placement::{Change, Slot};
use keel_core::sched::Ticket;

/// The states of runs a dead node's successor takes over (the ones a restart recovers).
const RECOVERABLE: &str = "('created', 'queued', 'running', 'waiting', 'recovering')";

/// The advisory lock every node takes to decide an admission (`admission`): decisions
/// are serialized across the cluster.
const ADMISSION_LOCK: i64 = 0x6b65_656c_0002;

/// How long a ledger row may name a run with no record before it is taken for a node's
/// leftover (the record follows the row within moments).
const ORPHAN_SLOT_AFTER: Duration = Duration::from_secs(60);

/// One node's membership in the cluster of kernels sharing a Postgres database.
pub struct PgNode {
    store: PgStore,
    fences: Arc<Fences>,
    id: String,
    /// The heartbeat's lifetime, set by `join`.
    ttl: std::sync::Mutex<Duration>,
    /// Wake-ups from `LISTEN`, started by `join`.
    wakes: std::sync::OnceLock<tokio::sync::broadcast::Sender<RunId>>,
    /// Runs this node's id held leases on when it joined (its previous life): the next
    /// `claim_orphans` takes them back. Found at join, before this node takes any lease,
    /// so a lease this node is taking right now is never mistaken for one of them.
    previous_life: std::sync::Mutex<Vec<RunId>>,
}

/// Whether taking a lease waits for a lease row another transaction holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// `acquire`: a lock on the row is a write in flight or a claim; wait for it.
    ForLocks,
    /// `claim_orphans`: skip such a row and try it at the next round.
    SkipLocked,
}

impl PgNode {
    fn ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the run's lease inside `tx` unless a live node other than this one holds it
    /// (or, with `SkipLocked`, the row is locked): the epoch this node now holds. No lease
    /// yet: epoch 1. A lease this node already holds at the row's epoch is kept as it is
    /// (a relaunch); any other (a dead node's, this node's previous life's) is bumped.
    async fn take(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        run: &RunId,
        wait: Wait,
    ) -> Result<Option<u64>> {
        let lock = match wait {
            Wait::ForLocks => LeaseLock::Update,
            Wait::SkipLocked => LeaseLock::UpdateSkipLocked,
        };
        let row = lease_row(tx, run, lock).await?;
        let Some(row) = row else {
            // No row, or (skipping) a locked one: the insert tells them apart.
            let inserted = tx
                .execute(
                    "INSERT INTO run_leases (run_id, node, epoch, acquired_at) VALUES ($1, $2, 1, now())
                     ON CONFLICT (run_id) DO NOTHING",
                    &[&run.as_str(), &self.id],
                )
                .await
                .map_err(pg_error("taking a run's lease"))?;
            return Ok((inserted == 1).then_some(1));
        };
        let LeaseRow { node: owner, epoch, live } = row;
        if owner != self.id && live {
            return Ok(None);
        }
        if owner == self.id && self.fences.held(run) == Some(epoch) {
            return Ok(Some(epoch));
        }
        let epoch = epoch as i64;
        tx.execute(
            "UPDATE run_leases SET node = $2, epoch = $3, acquired_at = now() WHERE run_id = $1",
            &[&run.as_str(), &self.id, &(epoch + 1)],
        )
        .await
        .map_err(pg_error("taking a run's lease"))?;
        Ok(Some(epoch as u64 + 1))
    }
}

impl PgStore {
    /// This store as node `id` of a cluster: from now on every write it makes for a run
    /// is fenced by the run's lease (see `crate::cluster`). Call `Cluster::join` next.
    pub fn node(&self, id: &str) -> Result<PgNode> {
        if id.is_empty()
            || id.len() > 64
            || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Error::Refused(format!(
                "node id {id:?} is not valid: use 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        self.fences.join(id)?;
        Ok(PgNode {
            store: self.clone(),
            fences: Arc::clone(&self.fences),
            id: id.to_owned(),
            ttl: std::sync::Mutex::new(crate::cluster::DEFAULT_LEASE_TTL),
            wakes: std::sync::OnceLock::new(),
            previous_life: std::sync::Mutex::default(),
        })
    }
}

/// What the database keeps of a node's key: its sha256, so reading the table does not let
/// anyone join as that node.
fn key_hash(key: &str) -> String {
    use sha2::Digest as _;
    keel_types::hex(&sha2::Sha256::digest(key.as_bytes()))
}

/// Why a node whose clock is `skew_ms` off the database's may not join, if it may not.
fn clock_refusal(skew_ms: i64) -> Option<String> {
    let skew = Duration::from_millis(skew_ms.unsigned_abs());
    (skew > MAX_CLOCK_SKEW).then(|| {
        format!(
            "this machine's clock is {:.1} s {} the database's (at most {} s apart allowed): lease times \
             come from the database, so fix the clock (NTP) before this node joins",
            skew.as_secs_f64(),
            if skew_ms > 0 { "behind" } else { "ahead of" },
            MAX_CLOCK_SKEW.as_secs()
        )
    })
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

#[async_trait]
impl Cluster for PgNode {
    fn node_id(&self) -> &str {
        &self.id
    }

    async fn join(&self, info: NodeInfo, key: &str, ttl: Duration) -> Result<()> {
        if info.id != self.id {
            return Err(Error::Refused(format!(
                "joining as {} on a store that is node {}",
                info.id, self.id
            )));
        }
        *self.ttl.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = ttl;
        let client = self.store.client("joining the cluster").await?;
        let before = now_ms();
        let row = client
            .query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", &[])
            .await
            .map_err(pg_error("reading the database's clock"))?;
        let after = now_ms();
        let database: i64 = row.get(0);
        if let Some(refusal) = clock_refusal(database - (before + after) / 2) {
            return Err(Error::Refused(refusal));
        }
        // A live node with the id keeps it, unless this is that node restarted (its key);
        // a node whose heartbeat lapsed is replaced, and its leases become this node's to
        // take back.
        let taken = client
            .query_opt(
                "INSERT INTO keel_nodes (id, addr, version, started_at, heartbeat_at, expires_at, draining, key_hash)
                 VALUES ($1, $2, $3, now(), now(), now() + make_interval(secs => $4), false, $5)
                 ON CONFLICT (id) DO UPDATE SET addr = $2, version = $3, started_at = now(),
                     heartbeat_at = now(), expires_at = now() + make_interval(secs => $4), draining = false,
                     key_hash = $5
                 WHERE keel_nodes.expires_at < now() OR keel_nodes.key_hash = $5
                 RETURNING id",
                &[&info.id, &info.addr, &info.version, &ttl.as_secs_f64(), &key_hash(key)],
            )
            .await
            .map_err(pg_error("registering the node"))?;
        if taken.is_none() {
            let row = client
                .query_one(
                    "SELECT addr, extract(epoch FROM expires_at - now())::float8 FROM keel_nodes WHERE id = $1",
                    &[&info.id],
                )
                .await
                .map_err(pg_error("reading the node that holds the id"))?;
            let (addr, left): (String, f64) = (row.get(0), row.get(1));
            return Err(Error::Refused(format!(
                "node id {} is in use by a live node (serving {addr}, heartbeat good for {left:.1} s more): \
                 give each node its own --node-id",
                info.id
            )));
        }
        let previous = client
            .query("SELECT run_id FROM run_leases WHERE node = $1", &[&info.id])
            .await
            .map_err(pg_error("reading the leases of this node's previous life"))?;
        let previous: Vec<RunId> = previous
            .iter()
            .filter_map(|row| RunId::parse(row.get::<_, &str>(0)).ok())
            .filter(|run| self.fences.held(run).is_none())
            .collect();
        *self.previous_life.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = previous;
        self.wakes.get_or_init(|| super::listen::start(self.store.config.as_ref().clone()));
        Ok(())
    }

    async fn heartbeat(&self) -> Result<Vec<RunId>> {
        let ttl = self.ttl();
        let client = self.store.client("renewing the heartbeat").await?;
        let renewed = client
            .execute(
                "UPDATE keel_nodes SET heartbeat_at = now(), expires_at = now() + make_interval(secs => $2)
                 WHERE id = $1",
                &[&self.id, &ttl.as_secs_f64()],
            )
            .await
            .map_err(pg_error("renewing the heartbeat"))?;
        if renewed == 0 {
            return Err(Error::Refused(format!(
                "node {} is no longer registered (it left the cluster); restart it to join again",
                self.id
            )));
        }
        // Which of the leases this node believes it holds are still its own. Only leases
        // held before the read count: one taken (or given up with its run) while the read
        // is on its way was committed after it began, and the read cannot show it.
        let before = self.fences.all_held();
        let rows = client
            .query("SELECT run_id, epoch FROM run_leases WHERE node = $1", &[&self.id])
            .await
            .map_err(pg_error("reading this node's leases"))?;
        let current: std::collections::HashMap<String, i64> =
            rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1))).collect();
        let mut lost = Vec::new();
        for (run, epoch) in before {
            let still_believed = self.fences.held(&run) == Some(epoch);
            if still_believed && current.get(run.as_str()).copied() != Some(epoch as i64) {
                self.fences.lose(&run);
                lost.push(run);
            }
        }
        Ok(lost)
    }

    fn lost(&self) -> tokio::sync::broadcast::Receiver<RunId> {
        self.fences.lost()
    }

    async fn acquire(&self, run: &RunId) -> Result<Option<u64>> {
        let mut client = self.store.client("taking a run's lease").await?;
        let tx = client.transaction().await.map_err(pg_error("beginning a lease transaction"))?;
        let Some(epoch) = self.take(&tx, run, Wait::ForLocks).await? else { return Ok(None) };
        tx.commit().await.map_err(pg_error("committing a run's lease"))?;
        self.fences.hold(run, epoch);
        Ok(Some(epoch))
    }

    fn holds(&self, run: &RunId) -> bool {
        self.fences.held(run).is_some()
    }

    async fn release(&self, run: &RunId) -> Result<()> {
        let Some(epoch) = self.fences.held(run) else { return Ok(()) };
        let client = self.store.client("giving up a run's lease").await?;
        client
            .execute(
                "DELETE FROM run_leases WHERE run_id = $1 AND node = $2 AND epoch = $3",
                &[&run.as_str(), &self.id, &(epoch as i64)],
            )
            .await
            .map_err(pg_error("giving up a run's lease"))?;
        self.fences.release(run);
        Ok(())
    }

    async fn claim_orphans(&self, limit: usize) -> Result<Vec<RunId>> {
        let ttl = self.ttl();
        let previous: Vec<String> = std::mem::take(
            &mut *self.previous_life.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .map(|run| run.to_string())
        .collect();
        let mut client = self.store.client("claiming runs of dead nodes").await?;
        // Candidates: runs a restart would recover whose lease names a node whose
        // heartbeat lapsed, or this node's previous life (found at join), and runs without
        // a lease that have not changed for a whole ttl (their node died before it took
        // one, or they wait in a live node's queue: a node with room may start them),
        // unless they wait on the cluster's admission ledger, whose nodes start them.
        let candidates = client
            .query(
                &format!(
                    "SELECT r.id FROM runs r
                     LEFT JOIN run_leases l ON l.run_id = r.id
                     LEFT JOIN keel_nodes n ON n.id = l.node
                     WHERE r.state IN {RECOVERABLE}
                       AND ((l.run_id IS NULL AND r.updated_at_ms < $1
                             AND NOT EXISTS (SELECT 1 FROM run_slots s WHERE s.run_id = r.id AND s.node IS NULL))
                         OR (l.run_id IS NOT NULL AND l.node <> $2 AND (n.id IS NULL OR n.expires_at < now()))
                         OR r.id = ANY($3))
                     ORDER BY r.id = ANY($3) DESC, r.created_at_ms, r.id
                     LIMIT $4"
                ),
                &[
                    &(now_ms() - ttl.as_millis() as i64),
                    &self.id,
                    &previous,
                    &((limit + previous.len()) as i64),
                ],
            )
            .await
            .map_err(pg_error("finding runs of dead nodes"))?;
        let mut claimed = Vec::new();
        // Runs of the previous life skipped below are tried again at the next claim;
        // those no longer listed (ended meanwhile) are dropped.
        let mut retry = Vec::new();
        for row in candidates {
            let id: String = row.get(0);
            let run = RunId::parse(&id).map_err(|e| Error::Corrupt(format!("run id {id:?} in runs: {e}")))?;
            if self.fences.held(&run).is_some() {
                continue; // Already this node's: nothing to take over.
            }
            if previous.contains(&id) {
                retry.push(run.clone());
            }
            let tx = client.transaction().await.map_err(pg_error("beginning a claim"))?;
            // A lease row another node is claiming, or writing through (its fence holds
            // it FOR SHARE), is left alone rather than waited for.
            let Some(epoch) = self.take(&tx, &run, Wait::SkipLocked).await? else { continue };
            tx.commit().await.map_err(pg_error("committing a claim"))?;
            self.fences.hold(&run, epoch);
            retry.retain(|waiting| *waiting != run);
            claimed.push(run);
        }
        self.previous_life.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(retry);
        Ok(claimed)
    }

    async fn next_lapse(&self) -> Result<Option<Duration>> {
        let client = self.store.client("reading when the next heartbeat lapses").await?;
        let row = client
            .query_one(
                "SELECT (extract(epoch FROM min(expires_at) - now()) * 1000)::bigint
                 FROM keel_nodes WHERE id <> $1 AND expires_at > now()",
                &[&self.id],
            )
            .await
            .map_err(pg_error("reading when the next heartbeat lapses"))?;
        Ok(row.get::<_, Option<i64>>(0).map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    async fn owner(&self, run: &RunId) -> Result<Option<Lease>> {
        let client = self.store.client("reading a run's lease").await?;
        let row = client
            .query_opt(
                "SELECT l.node, COALESCE(n.addr, ''), l.epoch, COALESCE(n.expires_at > now(), false)
                 FROM run_leases l LEFT JOIN keel_nodes n ON n.id = l.node WHERE l.run_id = $1",
                &[&run.as_str()],
            )
            .await
            .map_err(pg_error("reading a run's lease"))?;
        Ok(row.map(|row| Lease {
            node: row.get(0),
            addr: row.get(1),
            epoch: row.get::<_, i64>(2) as u64,
            live: row.get(3),
        }))
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let client = self.store.client("listing the nodes").await?;
        let rows = client
            .query(
                "SELECT n.id, n.addr, n.version,
                        (extract(epoch FROM n.started_at) * 1000)::bigint,
                        (extract(epoch FROM n.heartbeat_at) * 1000)::bigint,
                        n.expires_at > now(), n.draining,
                        (SELECT count(*) FROM run_leases l WHERE l.node = n.id)
                 FROM keel_nodes n ORDER BY n.id",
                &[],
            )
            .await
            .map_err(pg_error("listing the nodes"))?;
        Ok(rows
            .iter()
            .map(|row| NodeRecord {
                info: NodeInfo { id: row.get(0), addr: row.get(1), version: row.get(2) },
                started_at_ms: row.get::<_, i64>(3) as u64,
                heartbeat_at_ms: row.get::<_, i64>(4) as u64,
                live: row.get(5),
                draining: row.get(6),
                leases: row.get::<_, i64>(7) as u64,
            })
            .collect())
    }

    async fn set_draining(&self, draining: bool) -> Result<()> {
        let client = self.store.client("marking the node draining").await?;
        client
            .execute("UPDATE keel_nodes SET draining = $2 WHERE id = $1", &[&self.id, &draining])
            .await
            .map_err(pg_error("marking the node draining"))?;
        Ok(())
    }

    async fn admission(
        &self,
        decide: &mut (dyn for<'l> FnMut(&'l [Slot]) -> Vec<Change> + Send),
    ) -> Result<()> {
        let mut client = self.store.client("deciding an admission").await?;
        let tx = client.transaction().await.map_err(pg_error("beginning an admission"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADMISSION_LOCK])
            .await
            .map_err(pg_error("taking the admission lock"))?;
        // Rows left behind by a node that died between a run's end and its release, or
        // between a row and its run's record (which follows within moments).
        tx.execute(
            "DELETE FROM run_slots s WHERE EXISTS (SELECT 1 FROM runs r WHERE r.id = s.run_id
                 AND r.state NOT IN ('created', 'queued', 'running', 'waiting', 'paused', 'recovering'))
             OR (NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = s.run_id) AND s.submitted_ms < $1)",
            &[&(now_ms() - ORPHAN_SLOT_AFTER.as_millis() as i64)],
        )
        .await
        .map_err(pg_error("dropping the slots of ended runs"))?;
        let rows = tx
            .query(
                "SELECT s.run_id, s.tenant, s.agent, s.priority, s.submitted_ms, s.node, s.home, r.state
                 FROM run_slots s LEFT JOIN runs r ON r.id = s.run_id",
                &[],
            )
            .await
            .map_err(pg_error("reading the admission ledger"))?;
        let mut ledger = Vec::with_capacity(rows.len());
        for row in rows {
            let priority: String = row.get(3);
            let home: Option<String> = row.get(6);
            let state: Option<String> = row.get(7);
            ledger.push(Slot {
                ticket: Ticket {
                    run: row.get(0),
                    tenant: row.get(1),
                    agent: row.get(2),
                    priority: priority
                        .parse()
                        .map_err(|e| Error::Corrupt(format!("run_slots: priority {priority:?}: {e}")))?,
                    submitted_ms: row.get::<_, i64>(4) as u64,
                },
                node: row.get(5),
                ready: home.is_some() || state.as_deref() == Some("queued"),
                home,
            });
        }
        for change in decide(&ledger) {
            match change {
                Change::Put(slot) => tx
                    .execute(
                        "INSERT INTO run_slots (run_id, tenant, agent, priority, submitted_ms, node, home)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (run_id) DO UPDATE SET node = EXCLUDED.node, home = EXCLUDED.home",
                        &[
                            &slot.ticket.run,
                            &slot.ticket.tenant,
                            &slot.ticket.agent,
                            &slot.ticket.priority.as_str(),
                            &(slot.ticket.submitted_ms as i64),
                            &slot.node,
                            &slot.home,
                        ],
                    )
                    .await
                    .map_err(pg_error("writing the admission ledger"))?,
                Change::Remove(run) => tx
                    .execute("DELETE FROM run_slots WHERE run_id = $1", &[&run])
                    .await
                    .map_err(pg_error("writing the admission ledger"))?,
            };
        }
        tx.commit().await.map_err(pg_error("committing an admission"))?;
        Ok(())
    }

    async fn wake(&self, run: &RunId) -> Result<()> {
        let client = self.store.client("waking a run's node").await?;
        client
            .execute("SELECT pg_notify($1, $2)", &[&super::listen::CHANNEL, &run.as_str()])
            .await
            .map_err(pg_error("waking a run's node"))?;
        Ok(())
    }

    fn wakes(&self) -> tokio::sync::broadcast::Receiver<RunId> {
        // Before `join` nothing listens yet: a receiver that hears nothing.
        match self.wakes.get() {
            Some(sender) => sender.subscribe(),
            None => tokio::sync::broadcast::channel(1).1,
        }
    }

    async fn secret(&self) -> Result<String> {
        let client = self.store.client("reading the cluster's secret").await?;
        client
            .execute(
                "INSERT INTO keel_cluster (id, secret) VALUES (0, $1) ON CONFLICT (id) DO NOTHING",
                &[&keel_types::random_token()],
            )
            .await
            .map_err(pg_error("making the cluster's secret"))?;
        let row = client
            .query_one("SELECT secret FROM keel_cluster WHERE id = 0", &[])
            .await
            .map_err(pg_error("reading the cluster's secret"))?;
        Ok(row.get(0))
    }

    async fn leave(&self) -> Result<()> {
        // The heartbeat ends now: the other nodes take this node's leases at once (the
        // record stays, shown as not live, until the id joins again).
        let client = self.store.client("leaving the cluster").await?;
        client
            .execute(
                "UPDATE keel_nodes SET expires_at = now() - interval '1 millisecond' WHERE id = $1",
                &[&self.id],
            )
            .await
            .map_err(pg_error("leaving the cluster"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::clock_refusal;

    #[test]
    fn a_clock_far_off_the_databases_is_refused_saying_which_way() {
        assert_eq!(clock_refusal(0), None);
        assert_eq!(clock_refusal(4_999), None);
        assert_eq!(clock_refusal(-5_000), None);
        let behind = clock_refusal(7_250).unwrap();
        assert!(behind.contains("7.2 s behind") && behind.contains("NTP"), "{behind}");
        assert!(clock_refusal(-60_000).unwrap().contains("60.0 s ahead of"));
    }
}
