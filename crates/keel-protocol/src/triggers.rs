//! HTTP bodies and views of triggers: schedules (`/v1/schedules`), webhooks (`/v1/hooks`)
//! and event triggers (`/v1/event-triggers`).

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
    /// Declared in keel.toml (`[[triggers.schedule]]`): the daemon makes it match the file
    /// at each start, and it is removed there, not deleted through the API.
    #[serde(default)]
    pub declared: bool,
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

/// `POST /v1/hooks`: a run started by each signed delivery to `POST /v1/hooks/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateHookParams {
    /// Letters, digits, `-`, `_` and `.`, at most 64; unique among hooks (it is the URL).
    pub name: String,
    /// `github` (`X-Hub-Signature-256`), `stripe` (`Stripe-Signature`, with its timestamp
    /// tolerance) or `hmac-sha256` (a header of your choosing, default `X-Keel-Signature`).
    pub verify: String,
    /// The environment variable of the kernel that holds the shared secret. The secret is
    /// read from the kernel's environment at each delivery; it is never stored.
    pub secret_env: String,
    /// `hmac-sha256` only: the header that carries the signature.
    #[serde(default)]
    pub header: Option<String>,
    /// `stripe` only: how far the signed time may be from now, in seconds (default 300).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub tolerance_secs: Option<u64>,
    /// The run each delivery starts; its input is `{"trigger": "hook", "hook",
    /// "delivery_id", "content_type", "event", "payload", "input"}`.
    pub run: CreateRunParams,
}

/// A webhook with its last deliveries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HookView {
    pub name: String,
    pub tenant: String,
    pub verify: String,
    /// The header the signature is read from.
    pub signature_header: String,
    pub secret_env: String,
    /// Whether the kernel's environment holds the secret now (deliveries fail until it does).
    pub secret_present: bool,
    /// `stripe` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance_secs: Option<u64>,
    /// The path senders post to.
    pub path: String,
    /// Declared in keel.toml (`[[triggers.hook]]`): the daemon makes it match the file at
    /// each start, and it is removed there, not deleted through the API.
    #[serde(default)]
    pub declared: bool,
    pub command: Vec<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Newest first.
    pub last_deliveries: Vec<DeliveryView>,
}

/// One delivery a hook accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    /// The sender's delivery id, or one the kernel gave a delivery without.
    pub delivery_id: String,
    pub run_id: Option<String>,
    /// `fired` or `failed`.
    pub outcome: String,
    pub detail: Option<String>,
    /// Unix milliseconds.
    pub received_at: u64,
}

/// The answer to a delivery: 202 with the run it started, or 200 with the run an earlier
/// delivery of the same id started (`duplicate`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HookAccepted {
    pub run_id: String,
    pub delivery_id: String,
    pub duplicate: bool,
}

/// `POST /v1/event-triggers`: a run started when a run of an agent ends (`after_run`), or
/// when a message is published on a topic of the tenant (`topic`). Exactly one of the two.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEventTriggerParams {
    /// Letters, digits, `-`, `_` and `.`, at most 64; unique among event triggers.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    /// The agent whose runs' ends fire it: the file name of the run's program, or of its
    /// script when the program is an interpreter (`report.py` for `python3
    /// jobs/report.py`), as traces name runs; `*` for every agent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^/\\x00-\\x1f\\x7f-\\x9f]+$")]
    pub after_run: Option<String>,
    /// With `after_run`: which ends fire it: `succeeded` (the default), `failed`,
    /// `cancelled` or `ended` (any).
    #[serde(default)]
    #[schema(pattern = "^(succeeded|failed|cancelled|ended)$")]
    pub on: Option<String>,
    /// A topic of the tenant: every message published on it fires the trigger.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$")]
    pub topic: Option<String>,
    /// The run each fire starts; its input is `{"trigger": "event", "event", "on":
    /// "run_end", "agent", "run_id", "state", "output", "error", "input"}` after a run,
    /// `{"trigger": "event", "event", "on": "topic", "topic", "message", "from", "input"}`
    /// for a message.
    pub run: CreateRunParams,
}

/// An event trigger with its last fires.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventTriggerView {
    pub name: String,
    pub tenant: String,
    /// The agent whose runs' ends fire it (`*`: every agent); absent for a topic trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_run: Option<String>,
    /// With `after_run`: `succeeded`, `failed`, `cancelled` or `ended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<String>,
    /// The topic whose messages fire it; absent for a trigger after runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    pub paused: bool,
    /// Declared in keel.toml (`[[triggers.event]]`): the daemon makes it match the file at
    /// each start, and it is removed there, not deleted through the API.
    pub declared: bool,
    pub command: Vec<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Newest first.
    pub last_fires: Vec<EventFireView>,
}

/// One occasion an event trigger fired for (or skipped, when a chain of triggered runs
/// went too deep).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventFireView {
    /// The run that ended, or the publish (`RUN:SEQ`, the publishing run and its
    /// journal entry).
    pub occasion: String,
    /// When the run ended or the message was published, Unix milliseconds.
    pub at: u64,
    /// The run the fire started.
    pub run_id: Option<String>,
    /// `fired`, `skipped` or `failed`.
    pub outcome: String,
    pub detail: Option<String>,
    /// Unix milliseconds.
    pub fired_at: u64,
}
