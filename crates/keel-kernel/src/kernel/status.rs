//! `GET /v1/status`: the kernel at a glance, from its real state: live slots from the
//! admission `Admitter`, queued and waiting runs from the store, the LLM router's queues
//! and learned limits, the sandbox pool, the cluster's nodes.

use keel_llm::Provider as _;
use keel_protocol::api::{
    NodeView, PoolStatusView, ProviderStatusView, StatusView, StatusWaitingView, StoreStatusView,
};
use keel_store::RunCount;
use keel_types::{RunState, WaitReason};

use crate::tenants::Principal;
use crate::{Kernel, Result};

/// How long the status waits for the store's listing before it answers without it (and
/// says the store is not ok): the same patience as `/v1/health`'s probe.
const STORE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl Kernel {
    /// What the kernel is doing now, as `principal` may see it: a tenant's token gets its
    /// own tenant's runs and calls counted, and no node list (the nodes' run counts are
    /// every tenant's). When the store does not answer, the counts it holds (queued,
    /// waiting, swapped) are 0 and `store.ok` is false; the rest is still answered.
    pub async fn status(&self, principal: &Principal) -> Result<StatusView> {
        let tenant = principal.listing(None)?;
        // One grouped count (no run is loaded), so a poll every second stays cheap
        // whatever the queue holds.
        let counted = tokio::time::timeout(STORE_READ_TIMEOUT, self.inner.store.count_runs()).await;
        let (groups, store_ok) = match counted {
            Ok(Ok(groups)) => (groups, true),
            Ok(Err(err)) => {
                tracing::debug!("status without the store's counts: {err}");
                (Vec::new(), false)
            }
            Err(_) => (Vec::new(), false),
        };
        let counts =
            RunCounts::of(groups.iter().filter(|group| tenant.as_deref().is_none_or(|t| group.tenant == t)));
        let (live, max_live) = {
            let admitter = self.inner.admissions.lock();
            let caps = admitter.caps();
            match tenant.as_deref() {
                None => (admitter.live_count(), caps.global),
                Some(tenant) => (
                    admitter.live_count_of(tenant),
                    match (caps.global, caps.per_tenant) {
                        (Some(global), Some(per_tenant)) => Some(global.min(per_tenant)),
                        (global, per_tenant) => global.or(per_tenant),
                    },
                ),
            }
        };
        let nodes = match (&self.inner.cluster, principal.is_admin() && store_ok) {
            (Some(_), true) => self.nodes(principal).await.map(|view| view.nodes).unwrap_or_else(|err| {
                tracing::debug!("status without the cluster's nodes: {err}");
                Vec::<NodeView>::new()
            }),
            _ => Vec::new(),
        };
        let pool = self.inner.sandbox.pool_status();
        Ok(StatusView {
            node: self.node_id().map(str::to_owned),
            live: clamp(live),
            max_live,
            queued: counts.queued,
            waiting: counts.waiting,
            swapped: counts.swapped,
            providers: self
                .inner
                .llm
                .model_status(tenant.as_deref())
                .into_iter()
                .map(|model| ProviderStatusView {
                    provider: model.provider,
                    model: model.model,
                    waiting: clamp(model.waiting),
                    in_flight: clamp(model.in_flight),
                    limited: model.blocked_by.is_some(),
                    reason: model.blocked_by.map(|blocker| blocker.as_str().to_owned()),
                    reset_in_ms: model
                        .reset_in
                        .map(|wait| u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
                })
                .collect(),
            pool: PoolStatusView {
                tier: self.inner.sandbox.tier().to_owned(),
                warm: clamp(pool.warm),
                target: clamp(pool.target),
            },
            nodes,
            store: StoreStatusView {
                backend: if self.inner.cluster.is_some() { "postgres" } else { "sqlite" }.to_owned(),
                ok: store_ok,
            },
        })
    }
}

/// The counts of a status that come from the store's queued and waiting runs.
#[derive(Debug, Default, PartialEq)]
struct RunCounts {
    queued: u32,
    waiting: StatusWaitingView,
    swapped: u32,
}

impl RunCounts {
    fn of<'a>(groups: impl Iterator<Item = &'a RunCount>) -> RunCounts {
        let mut counts = RunCounts::default();
        for group in groups {
            let n = clamp(usize::try_from(group.count).unwrap_or(usize::MAX));
            match group.state {
                RunState::Queued => counts.queued += n,
                RunState::Waiting => {
                    let slot = match group.wait_reason {
                        Some(WaitReason::Human) => Some(&mut counts.waiting.human),
                        Some(WaitReason::Approval) => Some(&mut counts.waiting.approval),
                        Some(WaitReason::Budget) => Some(&mut counts.waiting.budget),
                        Some(WaitReason::Message) => Some(&mut counts.waiting.message),
                        Some(WaitReason::Child) => Some(&mut counts.waiting.child),
                        // A timer (`sys.sleep`) has no count of its own in the view.
                        Some(WaitReason::Timer) | None => None,
                    };
                    if let Some(slot) = slot {
                        *slot += n;
                    }
                    if !group.has_pid && crate::swap::swappable(group.wait_reason) {
                        counts.swapped += n;
                    }
                }
                _ => {}
            }
        }
        counts
    }
}

fn clamp(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}
