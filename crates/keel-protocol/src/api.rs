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
    /// The program and its arguments, e.g. `["python3", "agent.py"]`. The program must not
    /// be empty; no argument may hold a NUL.
    #[schema(min_items = 1)]
    pub command: Vec<String>,
    /// Working directory of the agent: an absolute path to a directory on the kernel's
    /// host. Defaults to the kernel's.
    #[serde(default)]
    #[schema(pattern = "^/")]
    pub cwd: Option<String>,
    /// Extra environment variables for the agent. Names are non-empty, without `=` or NUL,
    /// and not `KEEL_*` (the kernel sets those).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The scripted LLM provider's script (the JSON document itself, not a path); a
    /// script the provider cannot read is refused with 400.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub llm_script: Option<Value>,
    /// Owner of the run: 1-64 letters, digits, `-` or `_`. Defaults to `default` (a
    /// tenant's token: its own tenant).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when the run is stopped (at most 3600).
    /// Default 5.
    #[serde(default)]
    #[schema(maximum = 3600)]
    pub stop_grace_secs: Option<u64>,
    /// The model for LLM calls that name none, e.g. `openai/gpt-4o-mini` (1-200 bytes,
    /// no whitespace).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    /// Models to try, in order, when the model of a call fails for good.
    #[serde(default)]
    pub fallback_models: Vec<String>,
    /// Spending limits; spend never exceeds them (calls are reserved at their worst case).
    #[serde(default)]
    pub budget: Option<BudgetParams>,
    /// Park the run when it sends the same LLM request this many times in a row (0: off;
    /// default 5).
    #[serde(default)]
    pub loop_threshold: Option<u32>,
    /// The run's sandbox: tier and profile. Absent: the kernel's default tier (the
    /// process sandbox on Linux) with its default limits.
    #[serde(default)]
    pub sandbox: Option<SandboxParams>,
    /// The tools the run may call, as patterns: `echo`, `fs.*`, `mcp:github/*`, `*`.
    /// Absent: the built-in tools (`echo`, `kv.*`, `fs.*`, `http.fetch`). A call outside
    /// the grant is denied and audited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Vec<String>>,
    /// `high`, `normal` (the default) or `low`: the run's priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(high|normal|low)$")]
    pub priority: Option<String>,
    /// Input for the agent, as JSON; it reads it from `KEEL_INPUT` (`keel.input()` in the
    /// Python SDK). Agents started as tools get their call's arguments here. At most
    /// 120 KiB of JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub input: Option<Value>,
}

/// A run's sandbox. Every field is optional; an absent limit takes the kernel's default
/// where the host can enforce one. A limit the host cannot enforce is refused, never
/// silently dropped (`keel doctor` shows what this host enforces).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SandboxParams {
    /// `process` (the default on Linux) or `none` (no isolation; development only).
    #[serde(default)]
    #[schema(pattern = "^(process|none)$")]
    pub tier: Option<String>,
    /// Memory of the whole sandbox, bytes (cgroup).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub memory_bytes: Option<u64>,
    /// CPU seconds per process.
    #[serde(default)]
    pub cpu_time_secs: Option<u64>,
    /// Wall-clock seconds before the sandbox is killed.
    #[serde(default)]
    pub wall_time_secs: Option<u64>,
    /// Processes and threads (cgroup).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub pids: Option<u64>,
    /// Open files per process.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub open_files: Option<u64>,
    /// Largest file a process may write, bytes.
    #[serde(default)]
    pub file_size_bytes: Option<u64>,
    /// Size of each scratch file system (`/tmp`, and `/workspace` without a volume), bytes.
    #[serde(default)]
    pub scratch_bytes: Option<u64>,
    /// `none` (default: loopback only) or `allowlist` (HTTP(S) through the kernel's
    /// egress proxy to `allow_hosts`).
    #[serde(default)]
    #[schema(pattern = "^(none|allowlist)$")]
    pub network: Option<String>,
    /// Host patterns for `allowlist` (at least one; none for any other network):
    /// `api.example.com`, `*.example.com`, optionally with `:port`.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Named volumes: directories the kernel keeps across runs, mounted read-write.
    #[serde(default)]
    pub volumes: Vec<VolumeParams>,
    /// Extra host paths bound read-only at the same path (each absolute, else 400).
    #[serde(default)]
    pub ro_binds: Vec<String>,
    /// Bind the working directory read-write (default read-only).
    #[serde(default)]
    pub writable_cwd: bool,
}

/// A named volume and where it appears inside the sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VolumeParams {
    /// 1-64 letters, digits, `-`, `_` or `.`, not starting with `.`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
    /// Absolute path inside the sandbox, e.g. `/workspace`.
    #[schema(pattern = "^/")]
    pub path: String,
}

/// Budget limits (or, in `POST /v1/runs/{id}/budget`, amounts to add). Absent = unlimited
/// (or nothing added).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetParams {
    /// US dollars, from 0 to less than 1e9.
    #[serde(default)]
    #[schema(minimum = 0, exclusive_maximum = 1_000_000_000)]
    pub usd: Option<f64>,
    /// Input plus output tokens.
    #[serde(default)]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub llm_calls: Option<u64>,
    #[serde(default)]
    pub tool_calls: Option<u64>,
    /// Wall-clock seconds from the run's start.
    #[serde(default)]
    pub wall_secs: Option<u64>,
}

/// `POST /v1/runs/{id}/budget`: add to a run's budget, and/or let a run parked by the
/// loop detector go on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopUpParams {
    #[serde(default)]
    pub add: BudgetParams,
    /// Clear the loop detector and let parked calls try again.
    #[serde(default, rename = "continue")]
    pub continue_loop: bool,
}

/// A run's budget: its limits and what is left of each (absent = unlimited).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BudgetView {
    pub limits: BudgetParams,
    pub remaining: BudgetParams,
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
    #[schema(value_type = Option<serde_json::Value>)]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub usage: UsageView,
    /// Calls the LLM provider actually served for this run; replayed calls do not count.
    pub provider_calls: u64,
    /// The open `human.ask` question, while the run waits for an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The open question's form: the JSON schema its answer must match (answer with
    /// `value`), when the agent asked with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub question_form: Option<Value>,
    /// The run's budget, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetView>,
    /// Why the run waits or stopped, in words: which budget ran out or the repeated
    /// request of a loop, the tool call awaiting approval, its place in the admission
    /// queue (`queued: 2 of 5 ...`), or its LLM call's place in a provider's queue
    /// (`llm queue: openai/gpt-4o, 3 of 12 waiting for 14s (requests limit)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run that started this one (`proc.spawn`, or an agent called as a tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What started the run by itself: `schedule:NAME`; absent when a caller did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    /// A waiting run whose agent process was stopped to save memory; it is relaunched by
    /// replay when what it waits for happens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub swapped: bool,
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
    #[schema(value_type = Option<serde_json::Value>)]
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
    /// Tool calls parked until an operator approves or denies them.
    #[serde(default)]
    pub approvals: Vec<ApprovalView>,
}

/// A tool call waiting for `keel approve RUN CALL` / `keel deny RUN CALL`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalView {
    /// The call's journal seq: the CALL of `keel approve RUN CALL`.
    pub call: u64,
    pub tool: String,
    #[schema(value_type = Object)]
    pub args: Value,
    /// `requires_approval` (the tool's policy), or `retry_after_crash` (the kernel died
    /// while the call ran and its policy is `ask`: approving runs it again).
    pub kind: String,
    /// Unix milliseconds.
    pub requested_at: u64,
}

/// `POST /v1/runs/{id}/approvals/{call}`: approve or deny a parked tool call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionParams {
    /// `approve` or `deny`.
    #[schema(pattern = "^(approve|deny)$")]
    pub decision: String,
    /// Recorded in the audit log; a denial's note is also the agent's error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `POST /v1/runs/{id}/signal`: a named signal for the run, received as an event.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalParams {
    /// A custom signal's name (1-64 letters, digits, `-`, `_`, `.`); `stop`, `pause` and
    /// `resume` are refused with 400: `keel pause`, `keel resume` and `keel stop` control
    /// the process itself.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub signal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub data: Option<Value>,
}

/// A tool of the kernel's registry (`GET /v1/tools`, `keel tools`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolView {
    pub name: String,
    /// builtin, command, mcp, agent, a2a.
    pub kind: String,
    pub description: String,
    #[schema(value_type = Object)]
    pub input_schema: Value,
    pub requires_approval: bool,
    /// What happens when the kernel dies while the tool runs: retry, ask, fail.
    pub crash: String,
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// For an MCP server's tools and an A2A agent's skills: `connected`, or why it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// `POST /v1/exec`: run a program with tools as functions, as a run of its own.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecParams {
    /// `python` (monty), `javascript` (QuickJS) or `cpython` (`py` and `js` are accepted
    /// too).
    #[schema(pattern = "^(python|py|javascript|js|cpython)$")]
    pub lang: String,
    pub code: String,
    /// Bound as global variables of the program. Up to 64 MiB in all (a string counts
    /// its text); an input over 4 KiB is stored once in the store, content-addressed
    /// under the tenant, and the run's `code.exec` names it by hash (see
    /// docs/protocol.md, "Large inputs").
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: serde_json::Map<String, Value>,
    /// Tool patterns the program may call; default: the built-in tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Vec<String>>,
    /// The run's tenant, as for `POST /v1/runs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// Limits: timeout_ms, memory_bytes, max_tool_calls, max_output_bytes, max_recursion,
    /// max_llm_calls (null or absent: the defaults; an unknown field or a value out of
    /// range is a 400).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub limits: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxParams>,
    /// The scripted LLM provider's script for the program's `llm` calls, as for
    /// `POST /v1/runs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub llm_script: Option<Value>,
    /// The model for `llm` calls that name none, as for `POST /v1/runs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    /// The run's spending limits, as for `POST /v1/runs`: the program's model calls
    /// reserve against them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetParams>,
}

/// What `POST /v1/exec` answers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecView {
    /// The run the execution was journaled and audited under.
    pub run_id: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Value>,
    /// On failure: `{kind, message}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub stdout: String,
    #[schema(value_type = Vec<Object>)]
    pub tool_calls: Vec<Value>,
    /// Model calls the program made (`llm`, each prompt of `llm_batch`).
    #[serde(default)]
    pub llm_calls: u32,
    pub duration_us: u64,
}

/// One record of a run's event log; also the `data` of each server-sent event.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct EventView {
    pub seq: u64,
    /// Unix milliseconds.
    pub ts: u64,
    /// What the event records: the wire name of a `keel_protocol::EventKind` (`state`,
    /// `stdout`, `syscall`...), whose doc says what `data` holds for each.
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

/// `POST /v1/runs/{id}/answer`: exactly one of `text` and `value`. A plain question
/// takes `text`; a question with a form (`question_form`) takes `value`, valid against
/// the form's schema, or `text` holding that value as JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
// With no other fields allowed, one property exactly is "exactly one of the two".
#[schema(min_properties = 1, max_properties = 1)]
pub struct AnswerParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The structured answer to a form question (`null` counts as sent).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub value: Option<Value>,
}

/// A field that was sent, even as `null`, is `Some` (absent is `None`, by `default`).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// `POST /v1/runs/{id}/messages`: an operator's message to the run's mailbox (received by
/// `ipc.recv` with `from: null`). When the mailbox is full the answer is 429 `would_block`
/// unless `wait` is true, in which case the request waits for room.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageParams {
    pub message: serde_json::Value,
    /// 1-256 bytes without control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub correlation_id: Option<String>,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageSentView {
    /// The message's position in the run's mailbox (1 for the first).
    pub seq: u64,
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

/// `GET /v1/inbox`: everything waiting for a person, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InboxView {
    pub items: Vec<InboxItemView>,
}

/// One run waiting for a person, and what it waits for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InboxItemView {
    /// `question` (answer it: `POST /v1/runs/{id}/answer`), `approval` (decide each call:
    /// `POST /v1/runs/{id}/approvals/{call}`), `budget` (a limit ran out: top it up with
    /// `POST /v1/runs/{id}/budget`) or `loop` (the loop detector parked it: `POST
    /// /v1/runs/{id}/budget` with `continue`).
    #[schema(pattern = "^(question|approval|budget|loop)$")]
    pub kind: String,
    /// Unix milliseconds: when the run began to wait (its last state change).
    pub since: u64,
    /// What is asked, in words: the question, the call awaiting approval, the budget
    /// that ran out.
    pub summary: String,
    pub run: RunView,
    /// The calls parked for approval (for `approval`; empty otherwise).
    #[serde(default)]
    pub approvals: Vec<ApprovalView>,
}

/// `GET /v1/costs`: LLM usage per time bucket, tenant and model, and the costliest runs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CostsView {
    /// Unix milliseconds: the calls summed started at or after this.
    pub since: u64,
    /// The width of a bucket, in milliseconds.
    pub bucket_ms: u64,
    /// Ordered by bucket, tenant and model; buckets without calls are absent.
    pub buckets: Vec<CostBucketView>,
    /// The costliest runs of all time (within what the token sees), costliest first.
    pub top_runs: Vec<RunView>,
}

/// The completed `llm.chat` calls of one (time bucket, tenant, model).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CostBucketView {
    /// Unix milliseconds: the bucket's start (a multiple of `bucket_ms`).
    pub bucket_start: u64,
    pub tenant: String,
    /// The model that answered (else the one asked for, else `unknown`).
    pub model: String,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthView {
    pub status: String,
    pub version: String,
    pub pid: u32,
    /// The model providers this kernel can call (empty: only runs with a script can use
    /// LLMs).
    #[serde(default)]
    pub llm_providers: Vec<String>,
    /// Whether the kernel's store answers: `ok`, or `unreachable: <cause>` (a Postgres
    /// server down or restarting; runs wait for it rather than fail). Empty from a kernel
    /// older than this field.
    #[serde(default)]
    pub store: String,
}

/// `GET /v1/nodes`: the kernel nodes sharing this node's store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodesView {
    /// The store's backend: `sqlite` (one kernel alone with it) or `postgres`.
    pub store: String,
    /// The id of the node that answered (absent without a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_node: Option<String>,
    /// Every node that has joined, by id (empty without a cluster).
    pub nodes: Vec<NodeView>,
}

/// `POST /v1/drain`: the node drains (hands its runs over) and exits.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DrainView {
    pub node: String,
    /// The runs with an agent on the node, which the other nodes take over by replay.
    pub runs: u64,
}

/// One kernel node of a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    /// Where it serves the HTTP API (`host:port`).
    pub addr: String,
    /// The keel version it runs.
    pub version: String,
    pub started_at_ms: u64,
    /// Its last heartbeat, by the database's clock.
    pub heartbeat_at_ms: u64,
    /// Whether its heartbeat is current; a node that is not live has its runs taken over.
    pub live: bool,
    /// It takes no new runs and hands its live ones over.
    pub draining: bool,
    /// The runs it holds (their leases).
    pub runs: u64,
}

/// `GET /v1/status`: what the kernel is doing now, at a glance (`keel top`'s header, the
/// console's health page). A tenant's token sees its own tenant's counts only; the
/// operator's sees every tenant's.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatusView {
    /// The id of the node that answered (Postgres); `null` for a kernel alone with SQLite.
    pub node: Option<String>,
    /// Runs holding a live slot (running, or waiting without being swapped out). Among
    /// several nodes with `[scheduler]` caps, every node's as this node last read the
    /// shared ledger; among nodes without caps, this node's.
    pub live: u32,
    /// The most live slots (`[scheduler] max_live`, or `max_live_per_tenant` for a
    /// tenant when smaller); `null` when there is no cap.
    pub max_live: Option<u32>,
    /// Runs in `queued`, waiting for a live slot.
    pub queued: u32,
    /// Runs in `waiting`, by what they wait for (resident or swapped out).
    pub waiting: StatusWaitingView,
    /// Waiting runs whose agent process was stopped until their wait is over.
    pub swapped: u32,
    /// Every model of every configured provider the kernel has called or queued for,
    /// with its queue and learned rate limits.
    pub providers: Vec<ProviderStatusView>,
    /// The sandbox tier and its pool of pre-built sandboxes.
    pub pool: PoolStatusView,
    /// The nodes sharing the store (Postgres, operator only); empty on SQLite and for a
    /// tenant's token.
    pub nodes: Vec<NodeView>,
    pub store: StoreStatusView,
}

/// Waiting runs by what they wait for (`StatusView::waiting`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct StatusWaitingView {
    /// An answer to `human.ask`.
    pub human: u32,
    /// An operator's decision on a governed tool call.
    pub approval: u32,
    /// A budget top-up.
    pub budget: u32,
    /// A message in the run's mailbox.
    pub message: u32,
    /// A child run to end.
    pub child: u32,
}

/// One model of one provider (`StatusView::providers`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ProviderStatusView {
    /// The provider's name (its key in `[llm.providers]`: `openai`, `anthropic`...).
    pub provider: String,
    pub model: String,
    /// Calls waiting in the model's queue for capacity (a tenant's own only).
    pub waiting: u32,
    /// Calls sent upstream and not yet answered (a tenant's own only).
    pub in_flight: u32,
    /// Whether a rate limit holds calls back now.
    pub limited: bool,
    /// Which limit: `provider's Retry-After`, `requests limit` or `tokens limit`.
    pub reason: Option<String>,
    /// When the limit is expected to let the next call go, in milliseconds from now.
    pub reset_in_ms: Option<u64>,
}

/// The sandbox pool (`StatusView::pool`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PoolStatusView {
    /// The kernel's sandbox tier: `process` or `none`.
    pub tier: String,
    /// Pre-built sandboxes ready to be claimed.
    pub warm: u32,
    /// How many the pool keeps ready (its size times the configurations kept warm; 0
    /// without a pool).
    pub target: u32,
}

/// The store (`StatusView::store`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct StoreStatusView {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Whether it answered a small read just now.
    pub ok: bool,
}

/// `PUT /v1/memory/{namespace}/{key}`: write a long-term record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryPutBody {
    /// Any JSON.
    pub value: Value,
    /// What search finds the record by; without it, a string value is indexed as is and
    /// any other value as its JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A long-term record (`GET /v1/memory/{namespace}/{key}`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct MemoryRecordView {
    pub namespace: String,
    pub key: String,
    pub value: Value,
    /// The indexed text.
    pub text: String,
    pub updated_at_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemoryDeleteView {
    pub deleted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct MemoryHitView {
    pub key: String,
    /// Higher is more relevant; comparable within one search only.
    pub score: f64,
    /// An excerpt with the matched words in `[...]`.
    pub snippet: String,
}

/// `GET /v1/memory/{namespace}?q=...&mode=text|semantic|hybrid`: most relevant first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemorySearchView {
    pub hits: Vec<MemoryHitView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ThreadMessageView {
    pub index: u64,
    pub role: String,
    pub content: String,
}

/// `GET /v1/threads/{id}`: a conversation thread, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ThreadView {
    pub thread: String,
    pub messages: Vec<ThreadMessageView>,
}

/// An entry of the audit log (`GET /v1/audit`, one line of `GET /v1/audit/export`).
/// `hash` is sha256 over `prev_hash`, `seq` and the canonical JSON of the record fields
/// (`keel_core::audit::entry_hash`), so a copy can be checked offline.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AuditEntryView {
    /// Position in the log, from 1, over all runs.
    pub seq: u64,
    /// When it happened, in Unix milliseconds.
    pub at: u64,
    pub tenant: String,
    /// The run it concerns; null for a kernel-wide record.
    pub run_id: Option<String>,
    /// agent, operator or kernel.
    pub actor: String,
    /// e.g. tool.call, tool.denied, approval.requested, approval.granted, approval.denied,
    /// code.exec, egress.
    pub action: String,
    /// The tool name or host acted on.
    pub subject: String,
    /// allowed, denied, ok, error or pending.
    pub outcome: String,
    #[schema(value_type = Object)]
    pub detail: Value,
    pub prev_hash: String,
    pub hash: String,
}

/// `GET /v1/audit/verify`: whether every hash of the audit log recomputes and the log
/// ends at its recorded head.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AuditVerifyView {
    pub ok: bool,
    /// Entries checked (up to the break, when there is one).
    pub entries: u64,
    /// The hash of the last entry checked; keep it elsewhere to detect a rewrite of the
    /// whole log later.
    pub head_hash: String,
    /// The first entry that does not verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken_at: Option<u64>,
    /// What does not hold there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A tenant's quotas. Absent fields are unlimited.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuotaParams {
    /// The most runs of the tenant that may be live (not ended) at once; creating one
    /// more answers 429 with `Retry-After`. At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_runs: Option<u32>,
    /// The USD budget a run of the tenant gets when it brings none (more than 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0)]
    pub max_usd_per_run: Option<f64>,
}

/// `POST /v1/tenants` (operator only): create a tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantParams {
    /// 1-64 letters, digits, '-' or '_'.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    #[serde(default)]
    pub quota: Option<QuotaParams>,
}

/// A tenant, with its tokens (never the tokens themselves).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub name: String,
    /// Unix milliseconds.
    pub created_at: u64,
    pub quota: QuotaParams,
    pub tokens: Vec<TokenView>,
}

/// An API token of a tenant, named by its public prefix.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    pub revoked: bool,
}

/// `POST /v1/tenants/{name}/tokens`: mint an API token for the tenant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenParams {
    /// At most 200 bytes, without control characters.
    #[serde(default)]
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub label: Option<String>,
}

/// A freshly minted token: the only time it is shown (the kernel keeps its hash).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreatedView {
    pub tenant: String,
    pub prefix: String,
    pub token: String,
}

/// `DELETE /v1/tenants/{name}/tokens/{prefix}`: how many tokens were revoked.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenRevokedView {
    pub revoked: u64,
}
