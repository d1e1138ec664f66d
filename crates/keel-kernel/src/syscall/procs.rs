//! Process trees and timers: `proc.spawn` starts a child run, `proc.wait` waits for one
//! to end, `proc.signal` stops, pauses or resumes a descendant, and `sys.sleep` is a
//! durable timer. A child's id is stored under the spawning call's idempotency key before
//! the child is created, so a `proc.spawn` retried after a crash finds the same child;
//! `proc.wait` is journaled with the child's outcome, so after a crash the parent's wait
//! replays it. Stopping a run stops its descendants (`Kernel::stop_descendants`).

use keel_protocol::EventKind;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::rpc::{ErrorKind, ProcSignalParams, ProcSpawnParams, ProcWaitParams, SysSleepParams};
use keel_store::{RunFilter, RunRecord};
use keel_types::{RunId, RunState, WaitReason};
use serde_json::{Value, json};

use crate::now_ms;
use crate::run::{CreateRun, LiveRun};
use crate::syscall::Reply;
use crate::syscall::SyscallError;
use crate::syscall::{internal, parse};
use crate::{Command, Kernel};

/// The longest `sys.sleep`: a day. Longer waits belong to a scheduler, not a timer.
const MAX_SLEEP_MS: u64 = 24 * 3600 * 1000;

/// A process or timer call whose params were checked.
pub(crate) enum ProcCall {
    Spawn(ProcSpawnParams),
    Wait { child: RunId, timeout_ms: Option<u64> },
    Signal { child: RunId, signal: String },
    Sleep { ms: u64 },
}

pub(crate) fn is_proc_method(method: &str) -> bool {
    matches!(method, "proc.spawn" | "proc.wait" | "proc.signal" | "sys.sleep")
}

fn run_id(method: &str, text: &str) -> Result<RunId, SyscallError> {
    RunId::parse(text)
        .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("{method}: `run_id`: {e}")))
}

pub(crate) fn check(method: &str, params: &Value) -> Result<ProcCall, SyscallError> {
    Ok(match method {
        "proc.spawn" => {
            let p: ProcSpawnParams =
                parse(method, params, "{\"command\":[\"python3\",\"worker.py\"],\"input\":{...}}")?;
            match (&p.command, &p.agent) {
                (Some(command), None) if !command.is_empty() && !command[0].is_empty() => {}
                (None, Some(agent)) if !agent.is_empty() => {}
                _ => {
                    return Err(SyscallError::new(
                        ErrorKind::InvalidParams,
                        "proc.spawn: give exactly one of `command` (a non-empty list) or `agent` (an agent tool's name)",
                    ));
                }
            }
            if let Some(priority) = &p.priority
                && !matches!(priority.as_str(), "high" | "normal" | "low")
            {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!("proc.spawn: priority {priority:?} is not high, normal or low"),
                ));
            }
            ProcCall::Spawn(p)
        }
        "proc.wait" => {
            let p: ProcWaitParams = parse(method, params, "{\"run_id\":\"run_...\",\"timeout_ms\"?:1000}")?;
            ProcCall::Wait { child: run_id(method, &p.run_id)?, timeout_ms: p.timeout_ms }
        }
        "proc.signal" => {
            let p: ProcSignalParams = parse(method, params, "{\"run_id\":\"run_...\",\"signal\":\"stop\"}")?;
            if !valid_signal(&p.signal) {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!(
                        "proc.signal: signal {:?} is not stop, pause, resume or a custom name (1-64 letters, digits, '-', '_', '.')",
                        p.signal
                    ),
                ));
            }
            ProcCall::Signal { child: run_id(method, &p.run_id)?, signal: p.signal }
        }
        "sys.sleep" => {
            let p: SysSleepParams = parse(method, params, "{\"ms\":1000}")?;
            if p.ms > MAX_SLEEP_MS {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!("sys.sleep: `ms` is at most {MAX_SLEEP_MS} (a day)"),
                ));
            }
            ProcCall::Sleep { ms: p.ms }
        }
        other => {
            return Err(SyscallError::new(ErrorKind::UnknownMethod, format!("unknown method {other:?}")));
        }
    })
}

/// A child's outcome as `proc.wait` answers it.
fn outcome(record: &RunRecord) -> Value {
    json!({
        "run_id": record.id.as_str(),
        "state": record.state.as_str(),
        "output": record.output,
        "error": record.error,
        "exit_code": record.exit_code,
    })
}

/// The run that started this one; none for a run whose spec does not parse (it is then
/// nobody's child as far as signals and waits go).
fn parent_of(record: &RunRecord) -> Option<RunId> {
    crate::run::RunSpec::of(record).ok()?.parent
}

impl Kernel {
    /// Starts the child run of a `proc.spawn` (or finds the one this call started before a
    /// crash: its id is under the call's key).
    pub(crate) async fn proc_spawn(&self, live: &Arc<LiveRun>, params: ProcSpawnParams, key: &str) -> Reply {
        let store = self.store();
        let scope = format!("children:{}", live.id);
        if let Some(Value::String(id)) = store.kv_get(&scope, key).await.map_err(internal)? {
            let child = RunId::parse(&id).map_err(internal)?;
            if self.get(&child).await.is_ok() {
                return Ok(json!({ "run_id": child.as_str() }));
            }
        }
        let parent = self.get(&live.id).await.map_err(internal)?;
        let mut request = match (&params.command, &params.agent) {
            (_, Some(agent)) => {
                let def = self
                    .inner
                    .tools
                    .resolve(agent)
                    .await
                    .map_err(|e| SyscallError::new(ErrorKind::NotFound, e))?;
                let keel_tools::ToolKind::Agent(tool) = &def.kind else {
                    return Err(SyscallError::new(
                        ErrorKind::InvalidParams,
                        format!("proc.spawn: {agent} is a tool, not an agent; name a [[tools.agent]] entry"),
                    ));
                };
                CreateRun::for_agent_tool(&parent, tool, params.input.clone().unwrap_or(Value::Null))
                    .map_err(internal)?
            }
            (Some(command), None) => {
                CreateRun::child_of(&parent, command.clone(), params.input.clone()).map_err(internal)?
            }
            (None, None) => {
                return Err(SyscallError::new(ErrorKind::InvalidParams, "proc.spawn: no command"));
            }
        };
        request.env.extend(params.env.clone());
        if let Some(patterns) = &params.grant {
            let narrower = keel_tools::grant::Grant::parse(patterns).map_err(|e| {
                SyscallError::new(ErrorKind::InvalidParams, format!("proc.spawn: grant: {e}"))
            })?;
            for pattern in narrower.patterns() {
                // A child never gets more than its parent: every pattern must lie within
                // the parent's grant (a `*` pattern is checked by its prefix).
                let probe = pattern.trim_end_matches('*');
                let within =
                    live.grant.allows(&pattern) || (pattern.ends_with('*') && covered(&live.grant, probe));
                if !within {
                    return Err(SyscallError::new(
                        ErrorKind::Denied,
                        format!(
                            "proc.spawn: grant {pattern:?} is wider than this run's ({})",
                            live.grant.patterns().join(", ")
                        ),
                    ));
                }
            }
            request.grant = Some(patterns.clone());
        }
        if let Some(priority) = &params.priority {
            request.priority = Some(priority.clone());
        }
        let slice = match &params.budget {
            Some(budget) => {
                let budget: keel_protocol::api::BudgetParams = serde_json::from_value(budget.clone())
                    .map_err(|e| {
                        SyscallError::new(ErrorKind::InvalidParams, format!("proc.spawn: budget: {e}"))
                    })?;
                crate::budget::validate(&budget, "proc.spawn budget")
                    .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, e.to_string()))?;
                request.budget = Some(budget.clone());
                Some(budget)
            }
            None => None,
        };
        let child = RunId::generate(now_ms());
        store.kv_put(&scope, key, json!(child.as_str())).await.map_err(internal)?;
        // The child's budget is a slice of this run's: carved (durably) before it exists.
        if let Some(slice) = &slice {
            self.carve_slice(live, &child, slice).await?;
        }
        self.create_as(child.clone(), request)
            .await
            .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("proc.spawn: {e}")))?;
        self.emit(&live.id, EventKind::Spawn, json!({ "child": child.as_str() }));
        Ok(json!({ "run_id": child.as_str() }))
    }

    /// Waits for a child (any descendant) to end; the parent shows as `waiting(child)`.
    pub(crate) async fn proc_wait(
        &self,
        live: &Arc<LiveRun>,
        child: &RunId,
        timeout_ms: Option<u64>,
    ) -> Reply {
        let record = self.descendant(live, child).await?;
        if record.state.is_terminal() {
            return Ok(outcome(&record));
        }
        let deadline = timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        self.park_run(live, WaitReason::Child).await;
        let _waiting = crate::swap::Busy::new(&live.waiting_calls);
        let result = loop {
            let ended = self.inner.run_ended.notified();
            let record = self.get(child).await.map_err(internal)?;
            if record.state.is_terminal() {
                break Ok(outcome(&record));
            }
            if !self.is_current(live) {
                break Err(SyscallError::new(ErrorKind::Cancelled, "proc.wait: the run is ending"));
            }
            let poll = tokio::time::sleep(Duration::from_millis(500));
            match deadline {
                Some(deadline) => tokio::select! {
                    _ = ended => {}
                    _ = poll => {}
                    _ = tokio::time::sleep_until(deadline) => {
                        break Ok(json!({ "run_id": child.as_str(), "state": record.state.as_str(), "timed_out": true }));
                    }
                },
                None => tokio::select! { _ = ended => {}, _ = poll => {} },
            }
        };
        self.wake_run(live, WaitReason::Child).await;
        result
    }

    /// Stops, pauses or resumes a descendant.
    pub(crate) async fn proc_signal(&self, live: &Arc<LiveRun>, child: &RunId, signal: &str) -> Reply {
        let record = self.descendant(live, child).await?;
        if record.state.is_terminal() {
            return Ok(json!({ "run_id": child.as_str(), "state": record.state.as_str() }));
        }
        let command = match signal {
            "stop" => Command::Stop { run: child.clone(), grace: None },
            "pause" => Command::Pause(child.clone()),
            "resume" => Command::Resume(child.clone()),
            custom => {
                // A custom signal is an event the child receives in its mailbox.
                return self
                    .deliver_signal(&live.tenant, Some(&live.id), child, custom, Value::Null, None)
                    .await;
            }
        };
        let record = Box::pin(self.act(command))
            .await
            .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("proc.signal: {e}")))?;
        Ok(json!({ "run_id": child.as_str(), "state": record.state.as_str() }))
    }

    /// A durable timer: the remaining time is measured from the journaled intent, so a
    /// run recovered mid-sleep sleeps only what was left.
    pub(crate) async fn sys_sleep(&self, live: &Arc<LiveRun>, ms: u64, started_at_ms: u64) -> Reply {
        let _waiting = crate::swap::Busy::new(&live.waiting_calls);
        let wake_at = started_at_ms + ms;
        let left = wake_at.saturating_sub(now_ms());
        if left > 0 {
            if left >= 1000 {
                self.park_run(live, WaitReason::Timer).await;
            }
            tokio::time::sleep(Duration::from_millis(left)).await;
            if left >= 1000 {
                self.wake_run(live, WaitReason::Timer).await;
            }
        }
        Ok(json!({ "slept_ms": ms, "woke_at": wake_at }))
    }

    /// `child` when it is a descendant of the caller (of its tenant), else `not_found`
    /// (another run's children answer like runs that do not exist).
    async fn descendant(&self, live: &Arc<LiveRun>, child: &RunId) -> Result<RunRecord, SyscallError> {
        let missing = || SyscallError::new(ErrorKind::NotFound, format!("no child run {child} of this run"));
        let record = self.store().get_run(child).await.map_err(internal)?.ok_or_else(missing)?;
        let mut cursor = record.clone();
        for _ in 0..64 {
            match parent_of(&cursor) {
                Some(parent) if parent == live.id => return Ok(record),
                Some(parent) => match self.store().get_run(&parent).await.map_err(internal)? {
                    Some(next) => cursor = next,
                    None => break,
                },
                None => break,
            }
        }
        Err(missing())
    }

    /// Parks the run while one of its calls waits (if it is running).
    pub(crate) async fn park_run(&self, live: &Arc<LiveRun>, reason: WaitReason) {
        use keel_core::lifecycle::Command as Lifecycle;
        for _ in 0..5 {
            let Ok(record) = self.get(&live.id).await else { return };
            let step = match record.state {
                RunState::Recovering => Lifecycle::Recovered,
                RunState::Running => Lifecycle::Park(reason),
                _ => return,
            };
            let _ = self.transition(&live.id, step, keel_store::RunPatch::default()).await;
        }
    }

    /// Wakes the run parked for `reason`, unless something else keeps it waiting.
    /// Only while `live` is the run's agent: once it has ended, the run is the swapper's or
    /// the stopper's (see `settle_swapped`).
    pub(crate) async fn wake_run(&self, live: &Arc<LiveRun>, reason: WaitReason) {
        use keel_core::lifecycle::Command as Lifecycle;
        let _ = self
            .transition_if(&live.id, Lifecycle::Wake, keel_store::RunPatch::default(), |record| {
                record.state == RunState::Waiting
                    && record.wait_reason == Some(reason)
                    && self.is_current(live)
            })
            .await;
    }

    /// The runs (not ended) whose parent is `run`, by parent.
    pub(crate) async fn children(&self, run: &RunId) -> Vec<RunId> {
        let filter = RunFilter { states: crate::tenants::LIVE_STATES.to_vec(), ..RunFilter::default() };
        let runs = self.store().list_runs(&filter).await.unwrap_or_default();
        runs.iter().filter(|r| parent_of(r).as_ref() == Some(run)).map(|r| r.id.clone()).collect()
    }

    /// Stopping a run stops its descendants, depth first.
    pub(crate) async fn stop_descendants(&self, run: &RunId, grace: Option<Duration>) {
        let mut pending = self.children(run).await;
        let mut seen: BTreeMap<RunId, ()> = BTreeMap::new();
        while let Some(child) = pending.pop() {
            if seen.insert(child.clone(), ()).is_some() {
                continue;
            }
            pending.extend(self.children(&child).await);
            if let Err(err) = Box::pin(self.act(Command::Stop { run: child.clone(), grace })).await {
                tracing::debug!(run = %child, "stopping a descendant: {err}");
            }
        }
    }
}

/// `stop`, `pause`, `resume`, or a custom signal's name.
pub(crate) fn valid_signal(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether every name starting with `prefix` is allowed by `grant` (approximated by the
/// grant holding `*` or a prefix pattern at least as wide).
fn covered(grant: &keel_tools::grant::Grant, prefix: &str) -> bool {
    grant
        .patterns()
        .iter()
        .any(|p| p == "*" || (p.ends_with('*') && prefix.starts_with(p.trim_end_matches('*'))))
}
