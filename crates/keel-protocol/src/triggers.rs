//! HTTP bodies and views of triggers: schedules (`/v1/schedules`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::CreateRunParams;

/// `POST /v1/schedules`: a run started on a cron schedule.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateScheduleParams {
    /// Letters, digits, `-`, `_` and `.`, at most 64; unique among schedules.
    pub name: String,
    /// 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first).
    pub cron: String,
    /// An IANA time zone; default `UTC`.
    #[serde(default)]
    pub tz: Option<String>,
    /// `skip` (default), `queue` or `allow`: what a tick does while the previous run is live.
    #[serde(default)]
    pub overlap: Option<String>,
    /// `none`, `latest` (default), `all` or `all:N`: which ticks missed while down fire.
    #[serde(default)]
    pub catch_up: Option<String>,
    /// The most a fire is delayed past its tick, in seconds (deterministic per tick).
    #[serde(default)]
    #[schema(maximum = 3600)]
    pub jitter_secs: Option<u64>,
    /// The run each fire starts; its input is `{"trigger": "schedule", "schedule",
    /// "scheduled_at", "scheduled_at_ms", "input"}`.
    pub run: CreateRunParams,
}

/// A schedule with its last and next fires.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleView {
    pub name: String,
    pub tenant: String,
    pub cron: String,
    pub tz: String,
    pub overlap: String,
    pub catch_up: String,
    pub jitter_secs: u64,
    pub paused: bool,
    pub command: Vec<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Newest first.
    pub last_fires: Vec<FireView>,
    /// The next scheduled times (RFC 3339 in the schedule's zone); empty when paused.
    pub next_fires: Vec<String>,
}

/// One occasion a trigger fired for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FireView {
    /// The scheduled time (RFC 3339 in the schedule's zone).
    pub scheduled_at: String,
    pub scheduled_at_ms: u64,
    pub run_id: Option<String>,
    /// `fired`, `skipped` or `failed`.
    pub outcome: String,
    pub detail: Option<String>,
    /// Unix milliseconds.
    pub fired_at: u64,
}
