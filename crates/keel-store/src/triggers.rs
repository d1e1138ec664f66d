//! Triggers in the store: what starts runs by itself (a schedule, a webhook) and each
//! occasion it fired for. The records are plain data; each backend has the SQL.
//!
//! The one rule: a fire is keyed by (kind, trigger, occasion) (a schedule's occasion is
//! its scheduled time, a webhook's the delivery id), and `trigger_fire` records it, with
//! the id of the run it starts, only if that key is new. The kernel creates the run
//! afterwards under that id (creation is idempotent by id), so a kernel that dies
//! between the two finds the fire without its run (`trigger_fires_unstarted`) and
//! creates it then: an occasion starts at most one run, and one that was recorded is
//! never lost.

use keel_types::RunId;
use serde_json::Value;

/// A trigger. `kind` is `schedule` or `hook`; names are unique per kind across tenants
/// (a webhook's URL names no tenant).
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerRecord {
    pub kind: String,
    pub name: String,
    pub tenant: String,
    /// What the kernel needs to fire it (the cron expression, the run to start...).
    pub spec: Value,
    pub paused: bool,
    /// Occasions up to this time are settled (its creation, or its resumption).
    pub since_ms: u64,
    pub created_at_ms: u64,
}

/// One occasion a trigger fired for.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRecord {
    pub kind: String,
    pub trigger: String,
    /// The occasion's key: a scheduled time in ms as decimal text, or a delivery id.
    pub occasion: String,
    pub tenant: String,
    /// The scheduled time, or when the delivery arrived.
    pub at_ms: u64,
    /// The run it starts (`None` for a skipped tick).
    pub run_id: Option<RunId>,
    /// `fired`, `skipped` or `failed`.
    pub outcome: String,
    /// Why a fire failed or was skipped.
    pub detail: Option<String>,
    pub fired_at_ms: u64,
}
