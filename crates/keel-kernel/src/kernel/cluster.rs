//! The cluster as the API sees it: the nodes sharing this kernel's store, the node that
//! owns a run (where commands for it are forwarded), and the secret forwarded requests
//! carry.

use keel_protocol::api::{NodeView, NodesView};
use keel_types::RunId;

use crate::tenants::Principal;

/// How long `/v1/health` waits for the store: less than a client's patience, more than a
/// loaded database needs for one indexed read.
const STORE_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
use crate::{Kernel, Result};

impl Kernel {
    /// The nodes sharing this kernel's store (operator only).
    pub async fn nodes(&self, principal: &Principal) -> Result<NodesView> {
        principal.require_admin("listing the cluster's nodes")?;
        let Some(member) = &self.inner.cluster else {
            return Ok(NodesView { store: "sqlite".to_owned(), this_node: None, nodes: Vec::new() });
        };
        let nodes = member.cluster.nodes().await?;
        Ok(NodesView {
            store: "postgres".to_owned(),
            this_node: Some(member.cluster.node_id().to_owned()),
            nodes: nodes
                .into_iter()
                .map(|node| NodeView {
                    id: node.info.id,
                    addr: node.info.addr,
                    version: node.info.version,
                    started_at_ms: node.started_at_ms,
                    heartbeat_at_ms: node.heartbeat_at_ms,
                    live: node.live,
                    draining: node.draining,
                    runs: node.leases,
                })
                .collect(),
        })
    }

    /// This node's id in its cluster, if it is in one.
    pub fn node_id(&self) -> Option<&str> {
        self.inner.cluster.as_ref().map(|member| member.cluster.node_id())
    }

    /// Where to forward a command for `run`: the API address of the live node other than
    /// this one that holds its lease; `None` when this node should act itself (no
    /// cluster, no lease, its own lease, or a dead owner whose runs are being taken).
    pub async fn owner_elsewhere(&self, run: &RunId) -> Result<Option<String>> {
        let Some(member) = &self.inner.cluster else { return Ok(None) };
        if self.live(run).is_some() {
            return Ok(None);
        }
        let lease = member.cluster.owner(run).await?;
        Ok(lease.filter(|lease| lease.live && lease.node != member.cluster.node_id()).map(|lease| lease.addr))
    }

    /// Whether the store answers a small read within `STORE_PROBE_TIMEOUT` (for
    /// `/v1/health`); the cause in words when it does not.
    pub async fn store_answers(&self) -> std::result::Result<(), String> {
        match tokio::time::timeout(STORE_PROBE_TIMEOUT, self.inner.store.is_empty()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {} s", STORE_PROBE_TIMEOUT.as_secs())),
        }
    }

    /// The secret nodes of this cluster authenticate forwarded requests with.
    pub fn cluster_secret(&self) -> Option<&str> {
        self.inner.cluster_secret.as_deref()
    }
}

impl Kernel {
    /// Prepares this node to leave without losing work or paying for a call twice: it
    /// takes no new runs, starts no new syscall, and waits up to `grace` for the calls in
    /// flight (LLM and tool calls) to finish and be journaled; calls that only wait for
    /// something durable (a message, a child, an answer) are not waited for. Then
    /// `shutdown` hands every run over (the other nodes replay them). Returns how many
    /// runs had an agent here.
    pub async fn drain(&self, grace: std::time::Duration) -> usize {
        use std::sync::atomic::Ordering;
        self.inner.draining.store(true, Ordering::SeqCst);
        if let Some(member) = &self.inner.cluster
            && let Err(err) = member.cluster.set_draining(true).await
        {
            tracing::warn!("could not mark this node draining: {err}");
        }
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let busy = self
                .live_runs()
                .iter()
                .filter(|live| {
                    live.inflight.load(Ordering::SeqCst) > live.waiting_calls.load(Ordering::SeqCst)
                })
                .count();
            if busy == 0 || tokio::time::Instant::now() >= deadline {
                if busy > 0 {
                    tracing::warn!("{busy} run(s) still had a call in flight after the grace period");
                }
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.live_runs().len()
    }

    /// Asks the binary serving this node to drain it and exit (operator only; a node of a
    /// cluster only). Returns the runs it will hand over.
    pub fn request_drain(&self, principal: &Principal) -> Result<usize> {
        principal.require_admin("draining a node")?;
        if self.inner.cluster.is_none() {
            return Err(crate::Error::Conflict(
                "this kernel is alone with its store (SQLite): there is no other node to hand its runs to; \
                 stop it with SIGTERM, and its runs resume when it starts again"
                    .to_owned(),
            ));
        }
        self.inner.drain_requested.notify_one();
        Ok(self.live_runs().len())
    }

    /// Resolves once a drain was requested (`request_drain`).
    pub async fn drain_requested(&self) {
        self.inner.drain_requested.notified().await;
    }

    /// Whether this node is draining (it takes no new runs).
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(std::sync::atomic::Ordering::SeqCst)
    }
}
