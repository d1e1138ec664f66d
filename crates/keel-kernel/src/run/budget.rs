//! Budgets at run time: a live run's account (rebuilt at launch from its spec, durable
//! top-ups and what it spent), worst-case reservations before a call is journaled,
//! settlement after, parking as `waiting(budget)`, the loop detector, slices carved for
//! children, and the wall-clock limit. The accounting itself is `keel_core::budget`.

use crate::budget::{DEFAULT_LOOP_THRESHOLD, RunBudget, limits_of, params_of, sum, validate};
use crate::error::SyscallError;
use crate::lock;
use crate::now_ms;
use crate::run::{LiveRun, RunSpec};
use crate::{Error, Kernel, Result};
use keel_core::budget::{Account, Exhausted, LoopDetector, ReservationId};
use keel_core::lifecycle::Command as Lifecycle;
use keel_protocol::EventKind;
use keel_protocol::api::{BudgetParams, BudgetView};
use keel_store::{RunPatch, RunRecord};
use keel_types::{RunId, RunState, Usage, WaitReason};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The kv space of children's budget slices: key = parent run id, value = {child: budget}.
const SLICE_SCOPE: &str = "kernel:budget-slices";

const TOPUP_SCOPE: &str = "kernel:budget-topups";

/// The kv key of a run's top-ups.
fn topup_key(run: &RunId) -> (String, String) {
    (TOPUP_SCOPE.to_owned(), run.to_string())
}

/// The kv key of the slices a run carved for its children.
fn slice_key(run: &RunId) -> (String, String) {
    (SLICE_SCOPE.to_owned(), run.to_string())
}

/// The run's effective limits: those it was created with (`initial`) plus every top-up
/// (`topups`, kept durably in the kv space so that they survive restarts). `None` if it
/// has no budget.
fn effective_params(
    run: &RunId,
    initial: Option<BudgetParams>,
    topups: Option<Value>,
) -> Result<Option<BudgetParams>> {
    let topups: Option<BudgetParams> = topups.map(serde_json::from_value).transpose().map_err(|e| {
        Error::Store(keel_store::Error::Corrupt(format!("the budget top-ups of run {run}: {e}")))
    })?;
    Ok(match (initial, topups) {
        (Some(a), Some(b)) => Some(sum(&a, &b)),
        (a, b) => a.or(b),
    })
}

impl Kernel {
    /// The budget state of a freshly launched attempt: what was spent before (including
    /// every call a replay will answer from the journal) is already spent. Its top-ups
    /// and its children's slices come in one read.
    pub(crate) async fn load_budget(&self, record: &RunRecord, spec: &RunSpec) -> Result<RunBudget> {
        let keys = [topup_key(&record.id), slice_key(&record.id)];
        let mut values = self.store().kv_get_many(&keys).await?.into_iter();
        let (topups, slices) = (values.next().flatten(), values.next().flatten());
        let params = effective_params(&record.id, spec.budget.clone(), topups)?.unwrap_or_default();
        let (limits, wall_secs) = limits_of(&params);
        let mut account = Account::new(limits);
        account.record(record.usage);
        let slices = self.charge_children(&mut account, slices).await?;
        let threshold = spec.loop_threshold.unwrap_or(DEFAULT_LOOP_THRESHOLD);
        Ok(RunBudget {
            account: Mutex::new(account),
            loops: Mutex::new(LoopDetector::new(threshold)),
            loop_threshold: threshold,
            changed: Notify::new(),
            wall_deadline: Mutex::new(
                wall_secs.map(|s| record.created_at_ms.saturating_add(s.saturating_mul(1000))),
            ),
            reason: Mutex::new(None),
            parking: tokio::sync::Mutex::new(()),
            slices: Mutex::new(slices),
            slice_table: tokio::sync::Mutex::new(()),
        })
    }

    /// A parent's children count against its budget: a child still running holds its
    /// whole slice, one that ended is charged what it spent (the rest of its slice came
    /// back). Read from the durable slice table and the children's records, so it holds
    /// across restarts. Returns the reservations of the running children.
    async fn charge_children(
        &self,
        account: &mut Account,
        slices: Option<Value>,
    ) -> Result<std::collections::HashMap<String, ReservationId>> {
        let mut held = std::collections::HashMap::new();
        let Some(Value::Object(table)) = slices else { return Ok(held) };
        for (child, slice) in table {
            let Ok(params) = serde_json::from_value::<BudgetParams>(slice) else { continue };
            let Ok(child_id) = RunId::parse(&child) else { continue };
            match self.store().get_run(&child_id).await? {
                Some(record) if record.state.is_terminal() => account.record(record.usage),
                Some(_) => {
                    // Carving cannot fail here in a way that matters: the slice was carved
                    // before; a top-up since only makes room.
                    if let Ok(id) = account.carve(limits_of(&params).0) {
                        held.insert(child, id);
                    }
                }
                None => {}
            }
        }
        Ok(held)
    }

    /// Carves a child's budget out of its parent's and records it durably before the
    /// child exists. Fails (nothing carved) when the slice does not fit.
    pub(crate) async fn carve_slice(
        &self,
        live: &Arc<LiveRun>,
        child: &RunId,
        slice: &BudgetParams,
    ) -> std::result::Result<(), SyscallError> {
        let _table = live.budget.slice_table.lock().await;
        let id = lock(&live.budget.account).carve(limits_of(slice).0).map_err(|exhausted| {
            SyscallError::new(
                keel_protocol::rpc::ErrorKind::BudgetExhausted,
                format!(
                    "proc.spawn: the child's budget does not fit in what is left of this run's: {exhausted}"
                ),
            )
        })?;
        let store = self.store();
        let mut table = match store.kv_get(SLICE_SCOPE, live.id.as_str()).await {
            Ok(Some(Value::Object(table))) => table,
            Ok(_) => serde_json::Map::new(),
            Err(err) => {
                self.release_budget(live, id);
                return Err(SyscallError::new(keel_protocol::rpc::ErrorKind::Internal, err.to_string()));
            }
        };
        table.insert(child.to_string(), json!(slice));
        if let Err(err) = store.kv_put(SLICE_SCOPE, live.id.as_str(), Value::Object(table)).await {
            self.release_budget(live, id);
            return Err(SyscallError::new(keel_protocol::rpc::ErrorKind::Internal, err.to_string()));
        }
        lock(&live.budget.slices).insert(child.to_string(), id);
        Ok(())
    }

    /// A child ended: what it spent is charged to its parent and the rest of its slice
    /// returns. A parent not live now is charged when it is next launched.
    pub(crate) fn return_slice(&self, parent: &RunId, child: &RunRecord) {
        let Some(live) = self.live(parent) else { return };
        let Some(id) = lock(&live.budget.slices).remove(child.id.as_str()) else { return };
        lock(&live.budget.account).return_slice(id, child.usage);
        live.budget.changed.notify_waiters();
    }

    /// What `keel ps` / `inspect` show of each run: limits and what is left, from durable
    /// state (`specs` are the runs' decoded specs, `None` where one does not parse). The
    /// top-ups of every run come in one read.
    pub(crate) async fn budget_views(
        &self,
        records: &[RunRecord],
        specs: &[Option<RunSpec>],
    ) -> Result<Vec<Option<BudgetView>>> {
        let keys: Vec<_> = records.iter().map(|record| topup_key(&record.id)).collect();
        let topups = self.store().kv_get_many(&keys).await?;
        let now = now_ms();
        records
            .iter()
            .zip(specs)
            .zip(topups)
            .map(|((record, spec), topups)| {
                let initial = spec.as_ref().and_then(|spec| spec.budget.clone());
                let Some(params) = effective_params(&record.id, initial, topups)? else { return Ok(None) };
                let (limits, wall_secs) = limits_of(&params);
                let mut account = Account::new(limits);
                account.record(record.usage);
                let remaining = account.remaining();
                let elapsed_secs =
                    record.ended_at_ms.unwrap_or(now).saturating_sub(record.created_at_ms) / 1000;
                let wall_left = wall_secs.map(|w| w.saturating_sub(elapsed_secs));
                Ok(Some(BudgetView {
                    limits: params_of(&limits, wall_secs),
                    remaining: params_of(&remaining, wall_left),
                }))
            })
            .collect()
    }

    /// Why a live run is parked by its budget, if it is.
    pub(crate) fn budget_reason(&self, run: &RunId) -> Option<String> {
        self.live(run).and_then(|live| lock(&live.budget.reason).clone())
    }

    /// Notes an LLM request for the loop detector; parks the run while it repeats.
    pub(crate) async fn check_loop(&self, live: &Arc<LiveRun>, key: &str) -> Result<(), SyscallError> {
        loop {
            let looping = lock(&live.budget.loops).observe(key);
            if !looping {
                return Ok(());
            }
            let reason = format!(
                "loop detected: the same LLM request was sent {} times in a row; \
                 `keel budget {} --continue` lets it go on",
                live.budget.loop_threshold, live.id
            );
            let notified = live.budget.changed.notified();
            let _span = self.inner.telemetry.wait(&live.id, live.attempt, "loop", None);
            self.park_for_budget(live, reason).await?;
            notified.await;
            // An operator continued the run: the detector was reset; count this call anew.
        }
    }

    /// Reserves `amount` (a call's worst case). If it does not fit while other calls are
    /// in flight, it waits for them to settle (they usually use less than they reserved);
    /// if it does not fit with nothing in flight, only a top-up can help, so the run parks
    /// as `waiting(budget)` until one comes.
    pub(crate) async fn reserve(
        &self,
        live: &Arc<LiveRun>,
        amount: Usage,
    ) -> Result<ReservationId, SyscallError> {
        loop {
            let notified = live.budget.changed.notified();
            let attempt: Result<ReservationId, (Exhausted, usize)> = {
                let mut account = lock(&live.budget.account);
                account.reserve(amount).map_err(|e| (e, account.outstanding()))
            };
            match attempt {
                Ok(id) => {
                    self.unpark_after_budget(live).await;
                    return Ok(id);
                }
                Err((_, in_flight)) if in_flight > 0 => notified.await,
                Err((exhausted, _)) => {
                    let reason = exhausted.to_string().replace("RUN", live.id.as_str());
                    let _span = self.inner.telemetry.wait(&live.id, live.attempt, "budget", None);
                    self.park_for_budget(live, reason).await?;
                    notified.await;
                }
            }
        }
    }

    pub(crate) fn settle_budget(&self, live: &Arc<LiveRun>, id: ReservationId, actual: Usage) {
        lock(&live.budget.account).settle(id, actual);
        live.budget.changed.notify_waiters();
    }

    pub(crate) fn release_budget(&self, live: &Arc<LiveRun>, id: ReservationId) {
        lock(&live.budget.account).release(id);
        live.budget.changed.notify_waiters();
    }

    /// Records why the run is parked and moves it to `waiting(budget)`. Never fails the
    /// call that asked: at worst the state lags (and is logged), the wait itself holds.
    async fn park_for_budget(&self, live: &Arc<LiveRun>, reason: String) -> Result<(), SyscallError> {
        let _serial = live.budget.parking.lock().await;
        let first = lock(&live.budget.reason).replace(reason.clone()).is_none();
        if first {
            self.emit(&live.id, EventKind::Budget, json!({ "parked": true, "reason": reason }));
        }
        let state = match self.get(&live.id).await {
            Ok(record) => record.state,
            Err(err) => {
                tracing::warn!(run = %live.id, "could not read the run to park it: {err}");
                return Ok(());
            }
        };
        if state == RunState::Recovering {
            let _ = self.transition(&live.id, Lifecycle::Recovered, RunPatch::default()).await;
        }
        if matches!(state, RunState::Running | RunState::Recovering)
            && let Err(err) =
                self.transition(&live.id, Lifecycle::Park(WaitReason::Budget), RunPatch::default()).await
        {
            tracing::warn!(run = %live.id, "could not park the run: {err}");
        }
        Ok(())
    }

    async fn unpark_after_budget(&self, live: &Arc<LiveRun>) {
        let _serial = live.budget.parking.lock().await;
        if lock(&live.budget.reason).take().is_none() {
            return;
        }
        self.emit(&live.id, EventKind::Budget, json!({ "parked": false }));
        if let Ok(record) = self.get(&live.id).await
            && record.state == RunState::Waiting
            && record.wait_reason == Some(WaitReason::Budget)
            && let Err(err) = self.transition(&live.id, Lifecycle::Wake, RunPatch::default()).await
        {
            tracing::warn!(run = %live.id, "could not wake the run after a top-up: {err}");
        }
    }

    /// Adds to a run's budget (durably), lets parked calls try again, and with
    /// `continue_loop` also lets a run parked by the loop detector go on.
    pub(crate) async fn top_up(
        &self,
        run: &RunId,
        add: BudgetParams,
        continue_loop: bool,
    ) -> Result<RunRecord> {
        validate(&add, "top-up")?;
        let record = self.get(run).await?;
        if record.state.is_terminal() {
            return Err(Error::Conflict(format!(
                "run {run} has ended ({}); its budget can no longer change",
                record.state
            )));
        }
        let previous: BudgetParams = self
            .store()
            .kv_get(TOPUP_SCOPE, run.as_str())
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let total = sum(&previous, &add);
        let value = serde_json::to_value(&total).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        self.store().kv_put(TOPUP_SCOPE, run.as_str(), value).await?;
        self.emit(run, EventKind::Budget, json!({ "top_up": add, "continue": continue_loop }));
        if let Some(live) = self.live(run) {
            let (limits, wall) = limits_of(&add);
            lock(&live.budget.account).top_up(limits);
            if let Some(wall) = wall {
                let mut deadline = lock(&live.budget.wall_deadline);
                *deadline = deadline.map(|d| d.saturating_add(wall * 1000));
            }
            if continue_loop {
                lock(&live.budget.loops).reset();
            }
            live.budget.changed.notify_waiters();
        }
        self.get(run).await
    }

    /// Freezes the run when its wall-time budget is used up and thaws it after a top-up.
    pub(crate) fn watch_wall_clock(&self, live: Arc<LiveRun>) {
        let Some(_) = *lock(&live.budget.wall_deadline) else { return };
        let kernel = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(deadline) = *lock(&live.budget.wall_deadline) else { return };
                let now = now_ms();
                if now < deadline {
                    tokio::time::sleep(Duration::from_millis(deadline - now)).await;
                    continue;
                }
                if kernel.live(&live.id).is_none_or(|current| !Arc::ptr_eq(&current, &live)) {
                    return; // The attempt ended.
                }
                let notified = live.budget.changed.notified();
                keel_sandbox::tree::signal_tree(Some(live.pid), live.id.as_str(), Signal::SIGSTOP);
                let reason = format!(
                    "wall-time budget used up; `keel budget {} --add-wall SECS` lets it go on",
                    live.id
                );
                let _ = kernel.park_for_budget(&live, reason).await;
                notified.await;
                if lock(&live.budget.wall_deadline).is_some_and(|d| d > now_ms()) {
                    keel_sandbox::tree::signal_tree(Some(live.pid), live.id.as_str(), Signal::SIGCONT);
                    kernel.unpark_after_budget(&live).await;
                }
            }
        });
    }
}
