//! Bodies of the HTTP API (`/v1/runs...`). The CLI is a client of exactly these shapes,
//! and `keel ... --json` prints them unchanged, so scripts see one format everywhere.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `POST /v1/runs`: start an agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRunParams {
    /// The program and its arguments, e.g. `["python3", "agent.py"]`.
    pub command: Vec<String>,
    /// Working directory of the agent (absolute). Defaults to the kernel's.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for the agent.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The scripted LLM provider's script (the JSON document itself, not a path).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub llm_script: Option<Value>,
    /// Owner of the run. Defaults to `default`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when the run is stopped. Default 5.
    #[serde(default)]
    pub stop_grace_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct UsageView {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub cost_usd: f64,
}

/// One run, as `keel ps --json` and `GET /v1/runs` show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub tenant: String,
    /// created, queued, running, paused, waiting, recovering, succeeded, failed, cancelled.
    pub state: String,
    /// Why a waiting run waits (human, child, message, approval, budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_reason: Option<String>,
    pub command: Vec<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    pub updated_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// How many times the agent process was launched (more than 1 after recovery).
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What the agent passed to `run.exit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub usage: UsageView,
    /// Calls the LLM provider actually served for this run; replayed calls do not count.
    pub provider_calls: u64,
    /// The open `human.ask` question, while the run waits for an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
}

/// One journal entry, as `keel inspect` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JournalEntryView {
    pub seq: u64,
    pub method: String,
    /// pending (intent, no result yet), ok, error, abandoned.
    pub status: String,
    /// First 16 hex digits of the canonical params hash (the replay key).
    pub params_digest: String,
    #[schema(value_type = Object)]
    pub params: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub attempt: u32,
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    pub usage: UsageView,
}

/// `GET /v1/runs/{id}`: a run with its journal.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InspectView {
    #[serde(flatten)]
    pub run: RunView,
    pub journal: Vec<JournalEntryView>,
}

/// One record of a run's event log; also the `data` of each server-sent event.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct EventView {
    pub seq: u64,
    /// Unix milliseconds.
    pub ts: u64,
    /// stdout, stderr, state, syscall, emit.
    pub kind: String,
    #[schema(value_type = Object)]
    pub data: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<EventView>,
    /// True once the run has ended and every event has been returned.
    pub complete: bool,
}

/// `POST /v1/runs/{id}/answer`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerParams {
    pub text: String,
}

/// `POST /v1/runs/{id}/stop`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    /// Seconds between SIGTERM and SIGKILL; the run's own setting when absent.
    #[serde(default)]
    pub grace_secs: Option<u64>,
}

/// Every error the HTTP API returns.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable machine-readable kind, e.g. `not_found`, `invalid_request`, `conflict`.
    pub kind: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthView {
    pub status: String,
    pub version: String,
    pub pid: u32,
}
