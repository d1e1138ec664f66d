//! Tool calls parked for an operator: a call waits as `waiting(approval)` until
//! `keel approve`/`keel deny` decides; decisions are durable in the kv space
//! `approvals:<run>` before they take effect, so they survive a crash.

use crate::approvals::{ApprovalKind, Decision, PendingApproval};
use crate::error::SyscallError;
use crate::lock;
use crate::now_ms;
use crate::run::LiveRun;
use crate::{Error, Kernel, Result};
use keel_protocol::EventKind;
use keel_protocol::api::ApprovalView;
use keel_protocol::rpc::ErrorKind;
use keel_store::{RunRecord, Seq};
use keel_types::{EntryStatus, RunId, WaitReason};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::oneshot;

fn scope(run: &RunId) -> String {
    format!("approvals:{run}")
}

impl Kernel {
    /// The decision stored for a call, if an operator made one.
    pub(crate) async fn stored_decision(
        &self,
        run: &RunId,
        seq: Seq,
        kind: ApprovalKind,
    ) -> std::result::Result<Option<Decision>, SyscallError> {
        let key = format!("{}:{seq}", kind.as_str());
        let value = self
            .store()
            .kv_get(&scope(run), &key)
            .await
            .map_err(|e| SyscallError::new(ErrorKind::Internal, format!("the kernel failed: {e}")))?;
        Ok(value.map(|v| Decision {
            approve: v.get("approve").and_then(Value::as_bool).unwrap_or(false),
            note: v.get("note").and_then(Value::as_str).map(str::to_owned),
        }))
    }

    /// Parks the call `seq` until an operator decides (or uses the decision already
    /// stored). The run shows as `waiting(approval)` meanwhile.
    pub(crate) async fn await_approval(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        tool: &str,
        args: &Value,
        kind: ApprovalKind,
    ) -> std::result::Result<Decision, SyscallError> {
        if let Some(decision) = self.stored_decision(&live.id, seq, kind).await? {
            return Ok(decision);
        }
        let (tx, rx) = oneshot::channel();
        let view = ApprovalView {
            call: seq,
            tool: tool.to_owned(),
            args: args.clone(),
            kind: kind.as_str().to_owned(),
            requested_at: now_ms(),
        };
        // Parked first, so whoever sees the call waiting also sees the run waiting.
        self.park_run(live, WaitReason::Approval).await;
        lock(&live.approvals).insert(seq, PendingApproval { view, reply: tx });
        self.emit(
            &live.id,
            EventKind::Approval,
            json!({ "call": seq, "tool": tool, "args": args, "kind": kind.as_str() }),
        );
        self.audit_run(
            &live.id,
            &live.tenant,
            "agent",
            "approval.requested",
            tool,
            "pending",
            json!({ "call": seq, "args": args, "kind": kind.as_str() }),
        );
        // A decision stored between the first look and the registration above is not lost.
        if let Some(decision) = self.stored_decision(&live.id, seq, kind).await? {
            lock(&live.approvals).remove(&seq);
            self.wake_if_no_approvals(live).await;
            return Ok(decision);
        }
        let _waiting = crate::swap::Busy::new(&live.waiting_calls);
        let _span = self.inner.telemetry.wait(&live.id, live.attempt, "approval", Some(seq));
        rx.await.map_err(|_| {
            SyscallError::new(ErrorKind::Cancelled, "the run is ending; the call was not approved")
        })
    }

    async fn wake_if_no_approvals(&self, live: &Arc<LiveRun>) {
        if lock(&live.approvals).is_empty() {
            self.wake_run(live, WaitReason::Approval).await;
        }
    }

    /// Why a run waits for approval, in words (`keel ps`), while it does.
    pub(crate) fn approval_reason(&self, run: &RunId) -> Option<String> {
        let pending = self.pending_approvals(run);
        let first = pending.first()?;
        let what = match first.kind.as_str() {
            "retry_after_crash" => "was interrupted by a kernel crash; approve to run it again",
            _ => "needs approval",
        };
        let more =
            if pending.len() > 1 { format!(" (and {} more)", pending.len() - 1) } else { String::new() };
        Some(format!(
            "tool {} (call {}) {what}: keel approve {run} {} or keel deny {run} {}{more}",
            first.tool, first.call, first.call, first.call
        ))
    }

    /// The calls of a run waiting for an operator.
    pub(crate) fn pending_approvals(&self, run: &RunId) -> Vec<ApprovalView> {
        self.live(run)
            .map(|live| lock(&live.approvals).values().map(|p| p.view.clone()).collect())
            .unwrap_or_default()
    }

    /// `keel approve` / `keel deny`: stores the decision durably, audits it, then lets
    /// the parked call go on.
    pub(crate) async fn decide(
        &self,
        run: &RunId,
        call: Seq,
        approve: bool,
        note: Option<String>,
    ) -> Result<RunRecord> {
        let record = self.get(run).await?;
        if record.state.is_terminal() {
            return Err(Error::Conflict(format!(
                "run {run} has ended ({}); it has no call to approve",
                record.state
            )));
        }
        if note.as_ref().is_some_and(|n| n.len() > 4096) {
            return Err(Error::InvalidRequest("the note is over 4096 bytes".into()));
        }
        let live = self.live(run);
        let kind =
            match live.as_ref().and_then(|l| lock(&l.approvals).get(&call).map(|p| p.view.kind.clone())) {
                Some(kind) if kind == ApprovalKind::RetryAfterCrash.as_str() => ApprovalKind::RetryAfterCrash,
                Some(_) => ApprovalKind::Required,
                None => {
                    // Not parked in this kernel (yet): the agent asks again after a restart.
                    // The call must still be a pending tool call of the journal.
                    let entries = self.store().journal(run, call.saturating_sub(1)).await?;
                    let pending = entries
                        .iter()
                        .find(|e| e.seq == call)
                        .is_some_and(|e| e.method == "tool.call" && e.status == EntryStatus::Pending);
                    if !pending {
                        let open: Vec<String> =
                            self.pending_approvals(run).iter().map(|a| a.call.to_string()).collect();
                        return Err(Error::Conflict(format!(
                            "run {run} has no tool call {call} waiting for approval{}",
                            if open.is_empty() {
                                String::from(" (it has none; `keel inspect RUN` shows its calls)")
                            } else {
                                format!("; waiting: {}", open.join(", "))
                            }
                        )));
                    }
                    // Which question is open: approval of a tool that needs it and has none
                    // yet, else whether to run an interrupted call again.
                    let tool = entries
                        .iter()
                        .find(|e| e.seq == call)
                        .and_then(|e| e.params.get("name")?.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let needs = self.inner.tools.policy_of(&tool).is_some_and(|p| p.requires_approval);
                    let decided = self
                        .stored_decision(run, call, ApprovalKind::Required)
                        .await
                        .map_err(|e| Error::Conflict(e.message))?
                        .is_some();
                    if needs && !decided { ApprovalKind::Required } else { ApprovalKind::RetryAfterCrash }
                }
            };
        if self.stored_decision(run, call, kind).await.map_err(|e| Error::Conflict(e.message))?.is_some() {
            return Err(Error::Conflict(format!("call {call} of run {run} was already decided")));
        }
        let key = format!("{}:{call}", kind.as_str());
        let value = json!({ "approve": approve, "note": note, "at_ms": now_ms() });
        self.store().kv_put(&scope(run), &key, value).await?;
        let pending = live.as_ref().and_then(|l| lock(&l.approvals).remove(&call));
        let tool = pending.as_ref().map(|p| p.view.tool.clone()).unwrap_or_default();
        self.audit_run(
            run,
            &record.tenant,
            "operator",
            if approve { "approval.granted" } else { "approval.denied" },
            &tool,
            if approve { "allowed" } else { "denied" },
            json!({ "call": call, "kind": kind.as_str(), "note": note }),
        );
        self.emit(run, EventKind::Decision, json!({ "call": call, "approve": approve, "note": note }));
        if let Some(pending) = pending {
            let _ = pending.reply.send(Decision { approve, note });
        }
        match &live {
            Some(live) => self.wake_if_no_approvals(live).await,
            None => self.request_wake(run),
        }
        self.get(run).await
    }
}
