//! What the web console asks of the kernel beyond single runs: the inbox (everything
//! waiting for a person), costs summed in the store, and the live stream of changed runs.
//! Each answers within what the principal may see.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use keel_protocol::api::{CostBucketView, CostsView, InboxItemView, InboxView, RunView};
use keel_store::{CostFilter, RunFilter, RunOrder};
use keel_types::{RunId, RunState, Usage, WaitReason};
use tokio::sync::broadcast;

use crate::{Kernel, Principal, Result};

/// The most runs the inbox lists (the oldest waits first).
const MAX_INBOX: usize = 1_000;

/// How many of the costliest runs `costs` lists.
const TOP_RUNS: usize = 10;

/// How long the stream of changed runs gathers announcements before it reads the runs:
/// a busy run announces itself many times a second, and is read once.
const GATHER: Duration = Duration::from_millis(150);

/// One item of the stream of changed runs.
#[derive(Debug, Clone)]
pub enum RunChange {
    /// A run as it is now (created, changed state, used budget, began or ended a wait).
    Run(Box<RunView>),
    /// The follower fell behind and missed changes: read the listing afresh.
    Lagged,
}

/// The runs that change, within what a principal may see; see [`Kernel::run_changes`].
pub struct RunChanges {
    kernel: Kernel,
    principal: Principal,
    changes: broadcast::Receiver<RunId>,
    ready: VecDeque<RunId>,
}

impl RunChanges {
    /// The next change; `None` when the kernel stops.
    pub async fn next(&mut self) -> Result<Option<RunChange>> {
        loop {
            while let Some(run) = self.ready.pop_front() {
                let Some(record) = self.kernel.inner.store.get_run(&run).await? else { continue };
                if self.principal.owns(&record) {
                    return Ok(Some(RunChange::Run(Box::new(self.kernel.view(&record).await?))));
                }
            }
            let first = match self.changes.recv().await {
                Ok(run) => run,
                Err(broadcast::error::RecvError::Lagged(_)) => return Ok(Some(RunChange::Lagged)),
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            };
            // Gather what else changes meanwhile; each run is read once.
            let mut seen = HashSet::from([first.clone()]);
            self.ready.push_back(first);
            let deadline = tokio::time::Instant::now() + GATHER;
            loop {
                match tokio::time::timeout_at(deadline, self.changes.recv()).await {
                    Ok(Ok(run)) => {
                        if seen.insert(run.clone()) {
                            self.ready.push_back(run);
                        }
                    }
                    Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                        self.ready.clear();
                        return Ok(Some(RunChange::Lagged));
                    }
                    Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => break,
                }
            }
        }
    }
}

impl Kernel {
    /// The runs of this node that change from now on (created, a state change, usage, a
    /// wait begun or ended), as views, within what `principal` may see. Runs served by
    /// other nodes of a cluster are not announced here.
    pub fn run_changes(&self, principal: &Principal) -> RunChanges {
        RunChanges {
            kernel: self.clone(),
            principal: principal.clone(),
            changes: self.inner.events.changed_runs(),
            ready: VecDeque::new(),
        }
    }

    /// Everything waiting for a person (a question, a call to approve, a budget that ran
    /// out, a loop), oldest wait first, within what `principal` may see.
    pub async fn inbox(&self, principal: &Principal) -> Result<InboxView> {
        let tenant = principal.listing(None)?;
        let filter = RunFilter {
            states: vec![RunState::Waiting],
            tenant,
            order: RunOrder::OldestFirst,
            ..RunFilter::default()
        };
        let mut records: Vec<_> = self
            .list(&filter)
            .await?
            .into_iter()
            .filter(|record| {
                matches!(
                    record.wait_reason,
                    Some(WaitReason::Human | WaitReason::Approval | WaitReason::Budget)
                )
            })
            .collect();
        records.sort_by_key(|record| (record.updated_at_ms, record.created_at_ms));
        records.truncate(MAX_INBOX);
        let mut items = Vec::with_capacity(records.len());
        let views = self.views(&records).await?;
        for (record, run) in records.iter().zip(views) {
            let approvals = self.pending_approvals(&record.id);
            let (kind, summary) = match record.wait_reason {
                Some(WaitReason::Human) => {
                    ("question", run.question.clone().unwrap_or_else(|| "a question".to_owned()))
                }
                Some(WaitReason::Approval) => {
                    let summary = match approvals.as_slice() {
                        [] => "a tool call awaits approval".to_owned(),
                        [one] => format!("tool {} (call {}) awaits approval", one.tool, one.call),
                        [first, rest @ ..] => {
                            format!(
                                "tool {} (call {}) and {} more await approval",
                                first.tool,
                                first.call,
                                rest.len()
                            )
                        }
                    };
                    ("approval", summary)
                }
                _ => {
                    let reason = run.reason.clone().unwrap_or_else(|| "a budget limit ran out".to_owned());
                    (if reason.starts_with("loop detected") { "loop" } else { "budget" }, reason)
                }
            };
            items.push(InboxItemView {
                kind: kind.to_owned(),
                since: record.updated_at_ms,
                summary,
                run,
                approvals,
            });
        }
        Ok(InboxView { items })
    }

    /// LLM usage summed per time bucket, tenant and model since `since_ms` (in the
    /// store), and the costliest runs, within what `principal` may see (`tenant` narrows
    /// the operator's view to one tenant).
    pub async fn costs(
        &self,
        principal: &Principal,
        tenant: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<CostsView> {
        if let Some(tenant) = tenant {
            crate::tenants::validate_name(tenant)?;
        }
        let tenant = principal.listing(tenant)?;
        let filter = CostFilter { since_ms, bucket_ms: bucket_ms.max(1), tenant: tenant.clone() };
        let buckets = self
            .inner
            .store
            .cost_summary(&filter)
            .await?
            .into_iter()
            .map(|bucket| CostBucketView {
                bucket_start: bucket.bucket_start_ms,
                tenant: bucket.tenant,
                model: bucket.model,
                calls: bucket.calls,
                input_tokens: bucket.input_tokens,
                output_tokens: bucket.output_tokens,
                cost_usd: Usage { cost_micro_usd: bucket.cost_micro_usd, ..Usage::default() }.cost_usd(),
            })
            .collect();
        let top = RunFilter {
            tenant,
            order: RunOrder::CostliestFirst,
            limit: Some(TOP_RUNS),
            ..RunFilter::default()
        };
        let mut costly = self.list(&top).await?;
        costly.retain(|record| record.usage.cost_micro_usd > 0);
        let top_runs = self.views(&costly).await?;
        Ok(CostsView { since: since_ms, bucket_ms: filter.bucket_ms, buckets, top_runs })
    }
}
