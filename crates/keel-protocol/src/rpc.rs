//! The syscall channel: JSON-RPC 2.0 envelopes, the error codes, and each syscall's
//! `*Params` / `*Result`. Extend (new methods, new optional fields); never change.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest accepted request line, in bytes. Longer lines are refused with `too_large` and
/// the connection is closed (the rest of the line cannot be resynchronised cheaply),
/// except a `code.exec` after `hello` (see [`MAX_EXEC_LINE_BYTES`]).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// Longest `code.exec` request line an authenticated connection may send: its `inputs`
/// hold up to 64 MiB of text, which JSON escaping can make longer. The kernel reads and
/// serves one such line at a time (others wait their turn), so agents cannot make it hold
/// many at once. Any other method on a line over [`MAX_LINE_BYTES`] is refused with
/// `too_large` and the connection closed, as before.
pub const MAX_EXEC_LINE_BYTES: usize = 129 << 20;

/// Every syscall method of protocol 1 that is served after `hello`.
pub const METHODS: &[&str] = &[
    "llm.chat",
    "tool.call",
    "tool.list",
    "state.checkpoint",
    "state.restore",
    "sys.now",
    "sys.random",
    "sys.ping",
    "human.ask",
    "ui.show",
    "run.emit",
    "run.exit",
    "mem.thread.append",
    "mem.thread.read",
    "mem.put",
    "mem.get",
    "mem.delete",
    "mem.search",
    "llm.embed",
    "ipc.send",
    "ipc.recv",
    "ipc.subscribe",
    "ipc.unsubscribe",
    "ipc.publish",
    "ipc.register",
    "code.exec",
    "proc.spawn",
    "proc.wait",
    "proc.signal",
    "sys.sleep",
];

/// A request as read off the socket (after the line parsed as JSON).
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    #[serde(default)]
    pub id: Option<Value>,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Response {
        Response { jsonrpc: "2.0".into(), id, result: Some(result), error: None }
    }

    pub fn err(id: Value, error: RpcError) -> Response {
        Response { jsonrpc: "2.0".into(), id, result: None, error: Some(error) }
    }
}

/// The closed set of error kinds, each with its JSON-RPC code. `data.kind` carries the
/// string so that clients need not know the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    ParseError,
    InvalidRequest,
    TooLarge,
    UnknownMethod,
    InvalidParams,
    Unauthenticated,
    Denied,
    NotFound,
    RunExited,
    ProviderError,
    NoProvider,
    ToolError,
    BudgetExhausted,
    Internal,
    Cancelled,
    /// `ipc.send` with `wait: false` found the target's mailbox full: nothing was sent.
    WouldBlock,
}

impl ErrorKind {
    /// Every kind, for lookups by name or code.
    pub const ALL: [ErrorKind; 16] = [
        ErrorKind::ParseError,
        ErrorKind::InvalidRequest,
        ErrorKind::TooLarge,
        ErrorKind::UnknownMethod,
        ErrorKind::InvalidParams,
        ErrorKind::Unauthenticated,
        ErrorKind::Denied,
        ErrorKind::NotFound,
        ErrorKind::RunExited,
        ErrorKind::ProviderError,
        ErrorKind::NoProvider,
        ErrorKind::ToolError,
        ErrorKind::BudgetExhausted,
        ErrorKind::Internal,
        ErrorKind::Cancelled,
        ErrorKind::WouldBlock,
    ];

    pub fn code(self) -> i64 {
        match self {
            ErrorKind::ParseError => -32700,
            ErrorKind::InvalidRequest | ErrorKind::TooLarge => -32600,
            ErrorKind::UnknownMethod => -32601,
            ErrorKind::InvalidParams => -32602,
            ErrorKind::Unauthenticated => 1000,
            ErrorKind::Denied => 1001,
            ErrorKind::NotFound => 1002,
            ErrorKind::RunExited => 1003,
            ErrorKind::ProviderError => 1004,
            ErrorKind::NoProvider => 1005,
            ErrorKind::ToolError => 1006,
            ErrorKind::BudgetExhausted => 1007,
            ErrorKind::Internal => 1008,
            ErrorKind::Cancelled => 1009,
            ErrorKind::WouldBlock => 1010,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ParseError => "parse_error",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::UnknownMethod => "unknown_method",
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Denied => "denied",
            ErrorKind::NotFound => "not_found",
            ErrorKind::RunExited => "run_exited",
            ErrorKind::ProviderError => "provider_error",
            ErrorKind::NoProvider => "no_provider",
            ErrorKind::ToolError => "tool_error",
            ErrorKind::BudgetExhausted => "budget_exhausted",
            ErrorKind::Internal => "internal",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::WouldBlock => "would_block",
        }
    }

    pub fn error(self, message: impl Into<String>) -> RpcError {
        RpcError {
            code: self.code(),
            message: message.into(),
            data: Some(serde_json::json!({ "kind": self.as_str() })),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloParams {
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelloResult {
    pub run_id: String,
    pub protocol: u32,
}

/// A chat message in the OpenAI chat shape. `content` may be null on an assistant
/// message that only carries tool calls.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: ChatRole,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Items of an OpenAI Responses API turn that the chat shape cannot express
    /// (`reasoning` items, with their `encrypted_content`), kept as they came so a
    /// Responses upstream gets them back unchanged; every other provider ignores them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LlmChatParams {
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// OpenAI shape: `"auto"`, `"none"`, `"required"` or
    /// `{"type":"function","function":{"name":"..."}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// OpenAI shape (`{"type":"json_object"}`, `{"type":"json_schema",...}`); providers
    /// without an equivalent ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// `false` asks for at most one tool call per response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AssistantMessage {
    pub role: ChatRole,
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Items of an OpenAI Responses API turn that the chat shape cannot express
    /// (`reasoning` items, with their `encrypted_content`), kept as they came so a
    /// Responses upstream gets them back unchanged; every other provider ignores them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LlmChatResult {
    pub message: AssistantMessage,
    pub usage: TokenUsage,
    pub cost_usd: f64,
    pub model: String,
    /// Why the model stopped, in OpenAI's words: `stop`, `length`, `tool_calls`,
    /// `content_filter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallParams {
    pub name: String,
    #[serde(default = "empty_object")]
    pub args: Value,
    /// Set by the kernel on the calls a `code.exec` program makes: the seq of that
    /// `code.exec`, so they are journaled (and replayed) as its own. Agents leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<u64>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// `proc.spawn`: start a child run (in the caller's tenant, working directory and
/// sandbox; with the caller's grant unless it names a narrower one).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcSpawnParams {
    /// The child's program and arguments; or name an agent tool with `agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// An agent declared under `[[tools.agent]]` in keel.toml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The child's input (`KEEL_INPUT`, `keel.input()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Tool patterns, each within the caller's grant; default: the caller's grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Vec<String>>,
    /// `high`, `normal` or `low`; default: the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The child's own budget (`max_usd`, `max_tokens`, ...), the same shape as a run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Value>,
}

/// `proc.wait`: until a child run ends (or `timeout_ms` passes) → its outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcWaitParams {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `proc.signal`: `stop`, `pause` or `resume` a descendant run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcSignalParams {
    pub run_id: String,
    pub signal: String,
}

/// `sys.sleep`: a durable timer; after a crash the run sleeps only what was left.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SysSleepParams {
    pub ms: u64,
}

/// `code.exec`: run a short program whose tool calls go through the kernel's governed
/// dispatch; only its result comes back.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeExecParams {
    /// `python` (the monty interpreter), `javascript` (QuickJS) or `cpython` (python3 in
    /// the process sandbox).
    pub lang: String,
    pub code: String,
    /// Bound as global variables of the program.
    #[serde(default)]
    pub inputs: serde_json::Map<String, Value>,
    /// More inputs, each named by the hash of an input that `POST /v1/exec` stored for
    /// the run's tenant (`sha256:<hex>`): how an input too large for the socket's lines
    /// reaches the program without passing through the journal.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub input_refs: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub limits: ExecLimits,
}

/// Limits of one `code.exec`; absent ones take the kernel's defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recursion: Option<u32>,
    /// Model calls the program may make (`llm`, each prompt of `llm_batch`); default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u32>,
}

/// One tool call a `code.exec` program made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecToolCall {
    pub name: String,
    pub args: Value,
    pub ok: bool,
    pub duration_us: u64,
}

/// What a successful `code.exec` returns. A failed one is a `tool_error` whose `data`
/// holds `kind` (syntax, runtime, timeout, memory, recursion, output_limit,
/// tool_call_limit, llm_call_limit, not_granted, worker_crashed, invalid), `stdout` and `tool_calls`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodeExecResult {
    pub result: Value,
    pub stdout: String,
    pub tool_calls: Vec<ExecToolCall>,
    /// Model calls the program made (each is an `llm.chat` of the run).
    #[serde(default)]
    pub llm_calls: u32,
    pub duration_us: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolCallResult {
    pub result: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolListResult {
    pub tools: Vec<ToolSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateCheckpointParams {
    pub state: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateCheckpointResult {
    pub seq: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateRestoreResult {
    pub state: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SysNowResult {
    pub unix_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SysRandomResult {
    pub value: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HumanAskParams {
    pub question: String,
    /// A form for the answer: a JSON schema of an object, within the subset tool
    /// parameters use (`keel_tools::schema`). The answer must validate against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HumanAskResult {
    /// The answer's text; for a form question, the answer as JSON text.
    pub answer: String,
    /// For a form question, the answer as a value (valid against the form's schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// Largest `ui.show` block, in bytes of JSON.
pub const MAX_UI_BLOCK_BYTES: usize = 256 * 1024;

/// `ui.show`: a typed block for the run's console page, journaled and shown in order
/// (a `ui` event). Its kinds, by `type`:
/// - `table`: `{"title"?, "columns": [str], "rows": [[str|number|bool|null]]}`, each row
///   as long as `columns`;
/// - `chart`: `{"title"?, "kind": "line"|"bar", "labels": [str], "series": [{"name",
///   "values": [number]}]}`, each `values` as long as `labels`;
/// - `markdown`: `{"text"}`;
/// - `progress`: `{"value": number in [0, 1], "label"?}`;
/// - `form`: `{"id", "title"?, "schema": <JSON schema of an object>}`; the submitted value
///   arrives as an operator message `{"ui_form": id, "value": {...}}` (`ipc.recv`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiShowParams {
    pub block: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UiShowResult {
    /// The journal seq of the shown block (the `seq` of its `ui` event).
    pub seq: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunEmitParams {
    pub event: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunExitParams {
    #[serde(default)]
    pub output: Value,
}

/// A message of a conversation thread.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ThreadMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
}

/// `mem.thread.append`: adds a message to the tenant's thread `thread` (created on first
/// append; any run of the tenant may share it by id).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemThreadAppendParams {
    pub thread: String,
    pub message: ThreadMessage,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemThreadAppendResult {
    /// The message's position in the thread (0 for the first).
    pub index: u64,
}

/// `mem.thread.read`: the thread's newest messages, oldest first. `last` keeps at most that
/// many; `max_tokens` keeps the newest messages whose estimated token count (about four
/// bytes a token) fits. Both may be given; neither reads the whole thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemThreadReadParams {
    pub thread: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

/// A message as read back, with its index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThreadEntry {
    pub index: u64,
    pub role: String,
    pub content: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemThreadReadResult {
    pub messages: Vec<ThreadEntry>,
}

/// `mem.put`: writes a long-term record. `text` is what `mem.search` indexes; without it,
/// a string value is indexed as is and any other value as its JSON text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemPutParams {
    pub namespace: String,
    pub key: String,
    pub value: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemKeyParams {
    pub namespace: String,
    pub key: String,
}

/// `mem.get` answers `{"value": <JSON>}` or `{"value": null}` when there is no record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemGetResult {
    pub value: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemDeleteResult {
    pub deleted: bool,
}

/// `ipc.send`: puts `message` (any JSON) in the mailbox of run `to` (a run of the same
/// tenant; any other id, including another tenant's run, is `not_found`). When the
/// mailbox is full, `wait` (default true) waits until the receiver makes room; with
/// `wait: false` the call fails with `would_block` and nothing is sent. Request/reply is a
/// convention over `ipc.send` and `ipc.recv`: the requester sends with a fresh
/// `correlation_id`, the replier answers the `from` of what it received with the same
/// `correlation_id`.
/// `ipc.register`: the caller takes a name; `ipc.send` accepts it as `to`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcRegisterParams {
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcSendParams {
    pub to: String,
    pub message: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// With `recv`, the call goes on, once the message is sent, to receive as
    /// `ipc.recv` with these params would, and answers both: `{"seq", "message"}` (with
    /// `max`, `{"seq", "messages"}`). The journal keeps the two calls as two entries, as if
    /// they had been made one after the other; made in one request, the receive waits on
    /// offer from the moment the send is durable, so a peer's immediate answer completes
    /// it in the answer's own commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv: Option<IpcRecvParams>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpcSendResult {
    /// The message's position in the target's mailbox (1 for the first).
    pub seq: u64,
}

/// `ipc.recv`: takes the oldest undelivered message of the run's own mailbox, waiting up
/// to `timeout_ms` (forever when absent) for one; `{"message": null}` on timeout
/// ([`IpcRecvResult`]).
///
/// With `max` (1 to [`MAX_RECV_MESSAGES`]), it takes up to `max` of the oldest waiting
/// messages at once, in one journaled step, and answers `{"messages": [...]}` oldest
/// first ([`IpcRecvManyResult`]): at least one, or none on timeout. Past the first, a
/// batch stops before its message bodies exceed 1 MiB of JSON text in all.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcRecvParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

/// The most messages one `ipc.recv` with `max` takes.
pub const MAX_RECV_MESSAGES: u64 = 1000;

/// A received message. `from` is the sending run's id, or null for an operator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IpcMessage {
    pub from: Option<String>,
    pub seq: u64,
    pub message: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The topic, for a message published on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpcRecvResult {
    pub message: Option<IpcMessage>,
}

/// What an `ipc.recv` with `max` answers: the messages taken, oldest first (empty on
/// timeout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpcRecvManyResult {
    pub messages: Vec<IpcMessage>,
}

/// `ipc.subscribe` / `ipc.unsubscribe`: starts (stops) delivering messages published on
/// the tenant's topic `topic` to this run's mailbox. Answers `{}`; doing it twice is
/// doing it once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcTopicParams {
    pub topic: String,
}

/// `ipc.publish`: puts `message` in the mailbox of every run of the tenant subscribed to
/// `topic` (and not ended), all or nothing; received with `topic` set. A full subscriber
/// mailbox makes the call wait (`wait`, default true) or fail with `would_block`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcPublishParams {
    pub topic: String,
    pub message: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpcPublishResult {
    /// How many subscribers got the message.
    pub delivered: u64,
}

/// `mem.search`: searches a namespace; `limit` defaults to 10 (at most 100), `mode` to
/// `text`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemSearchParams {
    pub namespace: String,
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MemSearchMode>,
}

/// `llm.embed`: vectors for `input` from the kernel's embedder (`[llm.embeddings]`; the
/// offline hash embedder by default). `model` is what the agent asked for; the answer
/// names the model that made the vectors. Journaled like a read, so a replay answers the
/// same vectors without calling the provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmEmbedParams {
    pub input: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LlmEmbedResult {
    pub model: String,
    /// One vector per input, in order.
    pub embeddings: Vec<Vec<f32>>,
    /// As reported by the provider; 0 when it reports none.
    pub input_tokens: u64,
}

/// How `mem.search` ranks: `text` (full-text, BM25), `semantic` (cosine similarity of the
/// kernel embedder's vectors) or `hybrid` (reciprocal rank fusion of both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemSearchMode {
    Text,
    Semantic,
    Hybrid,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemSearchHit {
    pub key: String,
    /// Higher is more relevant; comparable within one search only.
    pub score: f64,
    /// An excerpt around the matched words, which are in `[...]` (for a semantic hit, the
    /// start of the text).
    pub snippet: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemSearchResult {
    pub hits: Vec<MemSearchHit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_carry_code_and_kind() {
        let err = ErrorKind::RunExited.error("the run has exited");
        assert_eq!(err.code, 1003);
        assert_eq!(err.data.unwrap()["kind"], "run_exited");
        let text =
            serde_json::to_string(&Response::err(Value::from(7), ErrorKind::TooLarge.error("x"))).unwrap();
        assert_eq!(
            text,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"x","data":{"kind":"too_large"}}}"#
        );
    }

    #[test]
    fn optional_llm_fields_stay_off_the_wire_when_unset() {
        // Journaled params are hashed for replay: a request without the newer optional
        // fields must serialize exactly as before they existed.
        let params: LlmChatParams =
            serde_json::from_str(r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&params).unwrap(),
            r#"{"messages":[{"role":"user","content":"hi"}]}"#
        );
        let params: LlmChatParams = serde_json::from_str(
            r#"{"messages":[],"tool_choice":"auto","stop":["x"],"top_p":0.5,"response_format":{"type":"json_object"},"parallel_tool_calls":false}"#,
        )
        .unwrap();
        assert_eq!(params.tool_choice, Some(Value::from("auto")));
        assert_eq!(params.parallel_tool_calls, Some(false));
        let old: LlmChatResult = serde_json::from_str(
            r#"{"message":{"role":"assistant","content":"x"},"usage":{"input_tokens":1,"output_tokens":2},"cost_usd":0.0,"model":"m"}"#,
        )
        .unwrap();
        assert_eq!(old.finish_reason, None);
        assert!(!serde_json::to_string(&old).unwrap().contains("finish_reason"));
    }

    #[test]
    fn llm_chat_params_accept_the_openai_shape() {
        let params: LlmChatParams = serde_json::from_str(
            r#"{"messages":[{"role":"system","content":"be brief"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]},{"role":"tool","content":"4","tool_call_id":"c1"}],"max_tokens":64}"#,
        )
        .unwrap();
        assert_eq!(params.messages.len(), 3);
        assert_eq!(params.max_tokens, Some(64));
        assert!(
            serde_json::from_str::<LlmChatParams>(r#"{"messages":[{"role":"robot","content":"x"}]}"#)
                .is_err()
        );
    }
}
