//! Budgets at run time. The arithmetic is `keel_core::budget` (pure); this module keeps a
//! run's account, parks the run as `waiting(budget)` when a call does not fit and wakes it
//! on a top-up, runs the loop detector and the wall-clock limit, and persists top-ups.
//!
//! A call reserves its worst case before it is journaled or sent and settles the actual
//! after, so spend never exceeds a limit however many calls are in flight.

use std::sync::Mutex;

use keel_core::budget::{Account, Limits, LoopDetector, ReservationId};
use keel_protocol::api::BudgetParams;
use tokio::sync::Notify;

use crate::{Error, Result};

/// How many identical LLM requests in a row park a run, unless the run says otherwise.
pub const DEFAULT_LOOP_THRESHOLD: u32 = 5;

/// A live run's budget state.
pub(crate) struct RunBudget {
    pub(crate) account: Mutex<Account>,
    pub(crate) loops: Mutex<LoopDetector>,
    pub(crate) loop_threshold: u32,
    /// Signalled on every top-up, so parked calls try again.
    pub(crate) changed: Notify,
    /// Unix ms after which the run is frozen, if it has a wall-time limit.
    pub(crate) wall_deadline: Mutex<Option<u64>>,
    /// Why the run is parked, while it is.
    pub(crate) reason: Mutex<Option<String>>,
    /// Serialises parking and waking, which many calls in flight may attempt at once.
    pub(crate) parking: tokio::sync::Mutex<()>,
    /// The slices carved for children still running (by child id), returned when each
    /// ends; and a lock serialising updates of the durable slice table.
    pub(crate) slices: Mutex<std::collections::HashMap<String, ReservationId>>,
    pub(crate) slice_table: tokio::sync::Mutex<()>,
}

/// Converts wire budget params to limits (USD to exact micro-dollars) and wall seconds.
pub(crate) fn limits_of(params: &BudgetParams) -> (Limits, Option<u64>) {
    let limits = Limits {
        cost_micro_usd: params.usd.map(|usd| (usd * 1_000_000.0).round() as u64),
        tokens: params.tokens,
        llm_calls: params.llm_calls,
        tool_calls: params.tool_calls,
    };
    (limits, params.wall_secs)
}

pub(crate) fn params_of(limits: &Limits, wall_secs: Option<u64>) -> BudgetParams {
    BudgetParams {
        usd: limits.cost_micro_usd.map(|m| m as f64 / 1_000_000.0),
        tokens: limits.tokens,
        llm_calls: limits.llm_calls,
        tool_calls: limits.tool_calls,
        wall_secs,
    }
}

/// Checks budget numbers from a request.
pub(crate) fn validate(params: &BudgetParams, what: &str) -> Result<()> {
    if let Some(usd) = params.usd
        && !(usd.is_finite() && (0.0..1e9).contains(&usd))
    {
        return Err(Error::InvalidRequest(format!("{what}: usd must be a non-negative amount, got {usd}")));
    }
    Ok(())
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// Sums two sets of budget params (initial limits plus top-ups).
pub(crate) fn sum(a: &BudgetParams, b: &BudgetParams) -> BudgetParams {
    BudgetParams {
        usd: match (a.usd, b.usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        },
        tokens: add(a.tokens, b.tokens),
        llm_calls: add(a.llm_calls, b.llm_calls),
        tool_calls: add(a.tool_calls, b.tool_calls),
        wall_secs: add(a.wall_secs, b.wall_secs),
    }
}

/// Why a prompt bigger than the whole budget is refused, and what to do instead.
pub(crate) fn never_fits_message(never: &keel_core::budget::NeverFits) -> String {
    use keel_core::budget::Dimension;
    let (what, flag) = match never.dimension {
        Dimension::CostUsd => ("cost", "--budget-usd"),
        _ => ("input tokens", "--budget-tokens"),
    };
    format!(
        "llm.chat: budget exhausted before the call: this prompt alone needs about {} {what} (estimated from \
         its size, before any output), more than the run's whole {} budget of {}, so no reservation can ever \
         fit it. Send less: filter the input and ask about the relevant pieces (in code.exec, slice it and \
         call llm() or llm_batch() on the chunks), or give the run a budget that can hold it ({flag})",
        never.dimension.format(never.needs),
        never.dimension,
        never.dimension.format(never.limit),
    )
}
