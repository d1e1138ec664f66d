//! A2A (Agent2Agent) on the wire: the JSON-RPC binding of A2A 1.0 and the 0.3 shapes
//! still answered. Keel keeps one model of a task, a message and its parts, and writes it
//! in the version the caller spoke: a method's name says which (`SendMessage` is 1.0,
//! `message/send` is 0.3).
//!
//! The two versions differ in spelling, not in meaning:
//! - 1.0 is protobuf's JSON: `"role": "ROLE_USER"`, `"state": "TASK_STATE_COMPLETED"`,
//!   parts untagged (`{"text": ...}`, `{"data": ...}`), results wrapped by what they are
//!   (`{"task": {...}}`, `{"statusUpdate": {...}}`).
//! - 0.3 tags everything with `kind` (`"kind": "task"`, `{"kind": "text", "text": ...}`),
//!   with lowercase roles and states (`"input-required"`), and answers a send with the
//!   bare task.
//!
//! Reading is lenient (either spelling of a role, a state or a part is taken in either
//! version); writing is exact.

use serde_json::{Map, Value, json};

/// The protocol versions Keel serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V03,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1 => "1.0",
            Version::V03 => "0.3",
        }
    }
}

/// A task's state (A2A's `TaskState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
}

impl TaskState {
    pub const ALL: [TaskState; 8] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];

    /// The 0.3 name (`input-required`).
    pub fn v03(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::AuthRequired => "auth-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Rejected => "rejected",
        }
    }

    /// The 1.0 name (`TASK_STATE_INPUT_REQUIRED`).
    pub fn v1(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        }
    }

    pub fn name(self, version: Version) -> &'static str {
        match version {
            Version::V1 => self.v1(),
            Version::V03 => self.v03(),
        }
    }

    /// Either version's name.
    pub fn parse(text: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|state| state.v1() == text || state.v03() == text)
    }

    /// Completed, failed, canceled and rejected tasks never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
    }

    /// Where a blocking send or a stream stops: an end, or the agent waiting for its caller.
    pub fn is_interrupted(self) -> bool {
        self.is_terminal() || matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Agent,
}

/// One part of a message or an artifact.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// Structured data (a JSON value).
    Data(Value),
    /// A file, by reference or inline, kept as 1.0 spells it (`url` or `raw`, with
    /// `filename` and `mediaType`).
    File(Map<String, Value>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub message_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
    pub metadata: Option<Value>,
}

impl Message {
    /// The text parts joined by newlines.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }

    /// The first data part, if any.
    pub fn data(&self) -> Option<&Value> {
        self.parts.iter().find_map(|part| match part {
            Part::Data(value) => Some(value),
            _ => None,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    pub artifact_id: String,
    pub name: Option<String>,
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskStatus {
    pub state: TaskState,
    /// The agent's word with the state (its question, when input is required).
    pub message: Option<Message>,
    pub timestamp_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    pub artifacts: Vec<Artifact>,
    pub history: Vec<Message>,
}

/// What a stream sends (and a push notification carries).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Task(Task),
    Status { task_id: String, context_id: String, status: TaskStatus },
    Artifact { task_id: String, context_id: String, artifact: Artifact },
}

impl StreamEvent {
    /// Whether the stream ends with this event.
    pub fn is_final(&self) -> bool {
        match self {
            StreamEvent::Task(task) => task.status.state.is_interrupted(),
            StreamEvent::Status { status, .. } => status.state.is_interrupted(),
            StreamEvent::Artifact { .. } => false,
        }
    }
}

/// Where a push notification goes (`TaskPushNotificationConfig`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PushConfig {
    pub id: String,
    pub task_id: String,
    pub url: String,
    /// Sent back as `X-A2A-Notification-Token`.
    pub token: Option<String>,
    /// `Authorization: <scheme> <credentials>` on each notification.
    pub scheme: Option<String>,
    pub credentials: Option<String>,
}

/// Milliseconds since the epoch as RFC 3339 in UTC (`2026-11-27T02:31:55.806Z`).
pub fn timestamp(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

// ---- Writing -------------------------------------------------------------------------

pub fn part_json(part: &Part, version: Version) -> Value {
    match (part, version) {
        (Part::Text(text), Version::V1) => json!({ "text": text }),
        (Part::Text(text), Version::V03) => json!({ "kind": "text", "text": text }),
        (Part::Data(data), Version::V1) => json!({ "data": data, "mediaType": "application/json" }),
        (Part::Data(data), Version::V03) => json!({ "kind": "data", "data": data }),
        (Part::File(file), Version::V1) => Value::Object(file.clone()),
        (Part::File(file), Version::V03) => {
            let mut inner = Map::new();
            if let Some(url) = file.get("url") {
                inner.insert("uri".into(), url.clone());
            }
            if let Some(raw) = file.get("raw") {
                inner.insert("bytes".into(), raw.clone());
            }
            if let Some(name) = file.get("filename") {
                inner.insert("name".into(), name.clone());
            }
            if let Some(media) = file.get("mediaType") {
                inner.insert("mimeType".into(), media.clone());
            }
            json!({ "kind": "file", "file": inner })
        }
    }
}

fn parts_json(parts: &[Part], version: Version) -> Value {
    Value::Array(parts.iter().map(|part| part_json(part, version)).collect())
}

pub fn message_json(message: &Message, version: Version) -> Value {
    let mut out = Map::new();
    if version == Version::V03 {
        out.insert("kind".into(), json!("message"));
    }
    out.insert("messageId".into(), json!(message.message_id));
    if let Some(context) = &message.context_id {
        out.insert("contextId".into(), json!(context));
    }
    if let Some(task) = &message.task_id {
        out.insert("taskId".into(), json!(task));
    }
    let role = match (message.role, version) {
        (Role::User, Version::V1) => "ROLE_USER",
        (Role::Agent, Version::V1) => "ROLE_AGENT",
        (Role::User, Version::V03) => "user",
        (Role::Agent, Version::V03) => "agent",
    };
    out.insert("role".into(), json!(role));
    out.insert("parts".into(), parts_json(&message.parts, version));
    if let Some(metadata) = &message.metadata {
        out.insert("metadata".into(), metadata.clone());
    }
    Value::Object(out)
}

pub fn status_json(status: &TaskStatus, version: Version) -> Value {
    let mut out = Map::new();
    out.insert("state".into(), json!(status.state.name(version)));
    if let Some(message) = &status.message {
        out.insert("message".into(), message_json(message, version));
    }
    if let Some(ms) = status.timestamp_ms {
        out.insert("timestamp".into(), json!(timestamp(ms)));
    }
    Value::Object(out)
}

pub fn artifact_json(artifact: &Artifact, version: Version) -> Value {
    let mut out = Map::new();
    out.insert("artifactId".into(), json!(artifact.artifact_id));
    if let Some(name) = &artifact.name {
        out.insert("name".into(), json!(name));
    }
    out.insert("parts".into(), parts_json(&artifact.parts, version));
    Value::Object(out)
}

/// A task; `history_length` keeps the last N messages (`Some(0)`: none).
pub fn task_json(task: &Task, version: Version, history_length: Option<usize>) -> Value {
    let mut out = Map::new();
    if version == Version::V03 {
        out.insert("kind".into(), json!("task"));
    }
    out.insert("id".into(), json!(task.id));
    out.insert("contextId".into(), json!(task.context_id));
    out.insert("status".into(), status_json(&task.status, version));
    if !task.artifacts.is_empty() {
        let artifacts = task.artifacts.iter().map(|artifact| artifact_json(artifact, version)).collect();
        out.insert("artifacts".into(), Value::Array(artifacts));
    }
    let keep = history_length.unwrap_or(usize::MAX).min(task.history.len());
    if keep > 0 {
        let history = &task.history[task.history.len() - keep..];
        let history = history.iter().map(|message| message_json(message, version)).collect();
        out.insert("history".into(), Value::Array(history));
    }
    Value::Object(out)
}

/// The result of a send: 1.0 wraps the task (`{"task": ...}`), 0.3 sends it bare.
pub fn send_result(task: &Task, version: Version, history_length: Option<usize>) -> Value {
    let task = task_json(task, version, history_length);
    match version {
        Version::V1 => json!({ "task": task }),
        Version::V03 => task,
    }
}

/// One event of a stream (also the body of a push notification).
pub fn stream_event_json(event: &StreamEvent, version: Version) -> Value {
    match (event, version) {
        (StreamEvent::Task(task), _) => send_result(task, version, None),
        (StreamEvent::Status { task_id, context_id, status }, Version::V1) => json!({
            "statusUpdate": { "taskId": task_id, "contextId": context_id, "status": status_json(status, version) }
        }),
        (StreamEvent::Status { task_id, context_id, status }, Version::V03) => json!({
            "kind": "status-update",
            "taskId": task_id,
            "contextId": context_id,
            "status": status_json(status, version),
            "final": status.state.is_interrupted(),
        }),
        (StreamEvent::Artifact { task_id, context_id, artifact }, Version::V1) => json!({
            "artifactUpdate": { "taskId": task_id, "contextId": context_id, "artifact": artifact_json(artifact, version) }
        }),
        (StreamEvent::Artifact { task_id, context_id, artifact }, Version::V03) => json!({
            "kind": "artifact-update",
            "taskId": task_id,
            "contextId": context_id,
            "artifact": artifact_json(artifact, version),
            "append": false,
            "lastChunk": true,
        }),
    }
}

pub fn push_config_json(config: &PushConfig, version: Version) -> Value {
    let mut inner = Map::new();
    inner.insert("id".into(), json!(config.id));
    inner.insert("url".into(), json!(config.url));
    if let Some(token) = &config.token {
        inner.insert("token".into(), json!(token));
    }
    if let Some(scheme) = &config.scheme {
        let auth = match version {
            Version::V1 => json!({ "scheme": scheme, "credentials": config.credentials }),
            Version::V03 => json!({ "schemes": [scheme], "credentials": config.credentials }),
        };
        inner.insert("authentication".into(), auth);
    }
    match version {
        Version::V1 => {
            inner.insert("taskId".into(), json!(config.task_id));
            Value::Object(inner)
        }
        Version::V03 => json!({ "taskId": config.task_id, "pushNotificationConfig": inner }),
    }
}

// ---- Errors --------------------------------------------------------------------------

/// A JSON-RPC error: the standard codes and A2A's own.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const PUSH_NOT_SUPPORTED: i64 = -32003;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;

    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(RpcError::INVALID_PARAMS, message)
    }

    /// The reason 1.0 names in the error's `ErrorInfo`.
    fn reason(&self) -> &'static str {
        match self.code {
            RpcError::PARSE => "PARSE_ERROR",
            RpcError::INVALID_REQUEST => "INVALID_REQUEST",
            RpcError::METHOD_NOT_FOUND => "METHOD_NOT_FOUND",
            RpcError::INVALID_PARAMS => "INVALID_PARAMS",
            RpcError::TASK_NOT_FOUND => "TASK_NOT_FOUND",
            RpcError::TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
            RpcError::PUSH_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            RpcError::UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
            RpcError::CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
            RpcError::VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
            _ => "INTERNAL_ERROR",
        }
    }

    pub fn to_json(&self, version: Version) -> Value {
        match version {
            Version::V1 => json!({
                "code": self.code,
                "message": self.message,
                "data": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason(),
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }],
            }),
            Version::V03 => json!({ "code": self.code, "message": self.message }),
        }
    }
}

/// A whole JSON-RPC answer.
pub fn response(id: &Value, outcome: Result<Value, RpcError>, version: Version) -> Value {
    match outcome {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json(version) }),
    }
}

// ---- Reading -------------------------------------------------------------------------

mod remote;
pub use remote::parse_task;

/// The methods, in either version's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreatePushConfig,
    GetPushConfig,
    ListPushConfigs,
    DeletePushConfig,
    GetExtendedCard,
}

impl Method {
    pub fn parse(name: &str) -> Option<(Method, Version)> {
        use Method::*;
        Some(match name {
            "SendMessage" => (SendMessage, Version::V1),
            "SendStreamingMessage" => (SendStreamingMessage, Version::V1),
            "GetTask" => (GetTask, Version::V1),
            "ListTasks" => (ListTasks, Version::V1),
            "CancelTask" => (CancelTask, Version::V1),
            "SubscribeToTask" => (SubscribeToTask, Version::V1),
            "CreateTaskPushNotificationConfig" => (CreatePushConfig, Version::V1),
            "GetTaskPushNotificationConfig" => (GetPushConfig, Version::V1),
            "ListTaskPushNotificationConfigs" => (ListPushConfigs, Version::V1),
            "DeleteTaskPushNotificationConfig" => (DeletePushConfig, Version::V1),
            "GetExtendedAgentCard" => (GetExtendedCard, Version::V1),
            "message/send" => (SendMessage, Version::V03),
            "message/stream" => (SendStreamingMessage, Version::V03),
            "tasks/get" => (GetTask, Version::V03),
            "tasks/list" => (ListTasks, Version::V03),
            "tasks/cancel" => (CancelTask, Version::V03),
            "tasks/resubscribe" => (SubscribeToTask, Version::V03),
            "tasks/pushNotificationConfig/set" => (CreatePushConfig, Version::V03),
            "tasks/pushNotificationConfig/get" => (GetPushConfig, Version::V03),
            "tasks/pushNotificationConfig/list" => (ListPushConfigs, Version::V03),
            "tasks/pushNotificationConfig/delete" => (DeletePushConfig, Version::V03),
            "agent/getAuthenticatedExtendedCard" => (GetExtendedCard, Version::V03),
            _ => return None,
        })
    }

    /// Whether the answer is a stream of server-sent events.
    pub fn streams(self) -> bool {
        matches!(self, Method::SendStreamingMessage | Method::SubscribeToTask)
    }
}

/// A JSON-RPC request, checked: its id, method and params.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: Value,
    pub method: Method,
    pub version: Version,
    pub params: Map<String, Value>,
}

/// Reads a JSON-RPC request body; an error comes with the id to answer it under (null
/// when the body has none).
pub fn parse_request(body: &[u8]) -> Result<Request, (Value, RpcError, Version)> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        (Value::Null, RpcError::new(RpcError::PARSE, format!("the body is not JSON: {error}")), Version::V1)
    })?;
    let Value::Object(mut request) = value else {
        let error = RpcError::new(RpcError::INVALID_REQUEST, "a JSON-RPC request is an object");
        return Err((Value::Null, error, Version::V1));
    };
    let id = request.remove("id").unwrap_or(Value::Null);
    if !matches!(id, Value::String(_) | Value::Number(_)) {
        let error = RpcError::new(RpcError::INVALID_REQUEST, "`id` must be a string or a number");
        return Err((Value::Null, error, Version::V1));
    }
    if request.get("jsonrpc") != Some(&json!("2.0")) {
        let error = RpcError::new(RpcError::INVALID_REQUEST, "`jsonrpc` must be \"2.0\"");
        return Err((id, error, Version::V1));
    }
    let Some(name) = request.get("method").and_then(Value::as_str) else {
        let error = RpcError::new(RpcError::INVALID_REQUEST, "`method` must be a string");
        return Err((id, error, Version::V1));
    };
    let Some((method, version)) = Method::parse(name) else {
        let error = RpcError::new(
            RpcError::METHOD_NOT_FOUND,
            format!(
                "no method {name:?}: A2A 1.0's are SendMessage, SendStreamingMessage, GetTask, ListTasks, \
                 CancelTask, SubscribeToTask and the TaskPushNotificationConfig ones; 0.3's names \
                 (message/send, tasks/get, ...) work too"
            ),
        );
        return Err((id, error, Version::V1));
    };
    let params = match request.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => return Err((id, RpcError::invalid_params("`params` must be an object"), version)),
    };
    Ok(Request { id, method, version, params })
}

fn field<'a>(object: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    object.get(camel).or_else(|| object.get(snake)).filter(|value| !value.is_null())
}

/// A string field, if present; `where_` names the object in the error.
pub fn string_field(
    object: &Map<String, Value>,
    camel: &str,
    snake: &str,
    where_: &str,
) -> Result<Option<String>, RpcError> {
    match field(object, camel, snake) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(RpcError::invalid_params(format!("`{where_}.{camel}` must be a string"))),
    }
}

/// A required non-empty string field.
pub fn required_string(
    object: &Map<String, Value>,
    camel: &str,
    snake: &str,
    where_: &str,
) -> Result<String, RpcError> {
    match string_field(object, camel, snake, where_)? {
        Some(text) if !text.is_empty() => Ok(text),
        _ => Err(RpcError::invalid_params(format!("`{where_}.{camel}` is required"))),
    }
}

/// An optional non-negative integer field.
pub fn count_field(
    object: &Map<String, Value>,
    camel: &str,
    snake: &str,
    where_: &str,
) -> Result<Option<u64>, RpcError> {
    match field(object, camel, snake) {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            RpcError::invalid_params(format!("`{where_}.{camel}` must be a non-negative integer"))
        }),
    }
}

/// A bool field (absent: false).
pub fn bool_field(
    object: &Map<String, Value>,
    camel: &str,
    snake: &str,
    where_: &str,
) -> Result<bool, RpcError> {
    match field(object, camel, snake) {
        None => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(_) => Err(RpcError::invalid_params(format!("`{where_}.{camel}` must be true or false"))),
    }
}

fn parse_part(value: &Value, at: &str) -> Result<Part, RpcError> {
    let Value::Object(part) = value else {
        return Err(RpcError::invalid_params(format!("`{at}` must be an object")));
    };
    let kind = part.get("kind").and_then(Value::as_str);
    if let Some(text) = part.get("text") {
        return match text {
            Value::String(text) if matches!(kind, None | Some("text")) => Ok(Part::Text(text.clone())),
            _ => Err(RpcError::invalid_params(format!("`{at}.text` must be a string"))),
        };
    }
    if let Some(data) = part.get("data") {
        return Ok(Part::Data(data.clone()));
    }
    if let Some(Value::Object(file)) = part.get("file") {
        // 0.3: {"kind": "file", "file": {"uri"|"bytes", "name", "mimeType"}}.
        let mut out = Map::new();
        for (from, to) in [("uri", "url"), ("bytes", "raw"), ("name", "filename"), ("mimeType", "mediaType")]
        {
            if let Some(value) = file.get(from) {
                out.insert(to.into(), value.clone());
            }
        }
        return Ok(Part::File(out));
    }
    if part.contains_key("url") || part.contains_key("raw") {
        let mut out = Map::new();
        for key in ["url", "raw", "filename", "mediaType"] {
            if let Some(value) = part.get(key) {
                out.insert(key.into(), value.clone());
            }
        }
        return Ok(Part::File(out));
    }
    Err(RpcError::new(
        RpcError::CONTENT_TYPE_NOT_SUPPORTED,
        format!("`{at}` is not a part Keel reads: give `text`, `data`, or a file (`url`/`raw`)"),
    ))
}

/// A message from a request's params (`params.message`), in either version's spelling.
pub fn parse_message(value: Option<&Value>) -> Result<Message, RpcError> {
    let Some(Value::Object(message)) = value else {
        return Err(RpcError::invalid_params("`params.message` is required and must be an object"));
    };
    let message_id = required_string(message, "messageId", "message_id", "message")?;
    let role = match field(message, "role", "role").and_then(Value::as_str) {
        Some("ROLE_USER" | "user") => Role::User,
        Some("ROLE_AGENT" | "agent") => Role::Agent,
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`message.role` {other:?} is not a role: ROLE_USER or ROLE_AGENT (0.3: user, agent)"
            )));
        }
        None => return Err(RpcError::invalid_params("`message.role` is required")),
    };
    let Some(Value::Array(raw_parts)) = message.get("parts") else {
        return Err(RpcError::invalid_params("`message.parts` is required: a list of parts"));
    };
    if raw_parts.is_empty() {
        return Err(RpcError::invalid_params("`message.parts` is empty: send at least one part"));
    }
    let parts = raw_parts
        .iter()
        .enumerate()
        .map(|(index, part)| parse_part(part, &format!("message.parts[{index}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Message {
        message_id,
        role,
        parts,
        context_id: string_field(message, "contextId", "context_id", "message")?,
        task_id: string_field(message, "taskId", "task_id", "message")?,
        metadata: message.get("metadata").filter(|value| !value.is_null()).cloned(),
    })
}

/// A message as Keel stores it in a run's input (1.0's spelling), and back.
pub fn message_to_input(message: &Message) -> Value {
    message_json(message, Version::V1)
}

pub fn message_from_input(value: &Value) -> Option<Message> {
    parse_message(Some(value)).ok()
}

/// A push-notification config from `CreateTaskPushNotificationConfig`'s params (1.0:
/// flat with `taskId`; 0.3: `{taskId, pushNotificationConfig: {...}}`) or a send's
/// `configuration` (`taskPushNotificationConfig` / 0.3 `pushNotificationConfig`).
pub fn parse_push_config(
    object: &Map<String, Value>,
    task_id: Option<&str>,
    default_id: &str,
) -> Result<PushConfig, RpcError> {
    let inner = match object.get("pushNotificationConfig") {
        Some(Value::Object(inner)) => inner,
        Some(_) => return Err(RpcError::invalid_params("`pushNotificationConfig` must be an object")),
        None => object,
    };
    let task_id = match task_id {
        Some(task) => task.to_owned(),
        None => required_string(object, "taskId", "task_id", "params")?,
    };
    let url = required_string(inner, "url", "url", "pushNotificationConfig")?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(RpcError::invalid_params(format!(
            "the push notification url {url:?} is not http:// or https://"
        )));
    }
    let (scheme, credentials) = match inner.get("authentication") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(auth)) => {
            let scheme = match (auth.get("scheme"), auth.get("schemes")) {
                (Some(Value::String(scheme)), _) => Some(scheme.clone()),
                (_, Some(Value::Array(schemes))) => {
                    schemes.first().and_then(Value::as_str).map(str::to_owned)
                }
                _ => None,
            };
            let credentials = auth.get("credentials").and_then(Value::as_str).map(str::to_owned);
            (scheme, credentials)
        }
        Some(_) => return Err(RpcError::invalid_params("`authentication` must be an object")),
    };
    if scheme.as_deref().is_some_and(|scheme| scheme.is_empty() || scheme.contains(char::is_whitespace)) {
        return Err(RpcError::invalid_params("`authentication.scheme` must be one word, e.g. Bearer"));
    }
    let id = string_field(inner, "id", "id", "pushNotificationConfig")?
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| default_id.to_owned());
    Ok(PushConfig {
        id,
        task_id,
        url,
        token: string_field(inner, "token", "token", "pushNotificationConfig")?,
        scheme,
        credentials,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> Message {
        Message {
            message_id: "m1".into(),
            role: Role::User,
            parts: vec![Part::Text("hi".into()), Part::Data(json!({"n": 1}))],
            context_id: Some("c".into()),
            task_id: None,
            metadata: None,
        }
    }

    #[test]
    fn states_have_both_names_and_read_back() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::parse(state.v1()), Some(state));
            assert_eq!(TaskState::parse(state.v03()), Some(state));
        }
        assert_eq!(TaskState::parse("done"), None);
        assert!(TaskState::InputRequired.is_interrupted() && !TaskState::InputRequired.is_terminal());
        assert!(!TaskState::Working.is_interrupted());
    }

    #[test]
    fn a_message_round_trips_in_both_versions() {
        for version in [Version::V1, Version::V03] {
            let written = message_json(&message(), version);
            assert_eq!(parse_message(Some(&written)).unwrap(), message(), "{version:?}: {written}");
        }
        let v1 = message_json(&message(), Version::V1);
        assert_eq!(v1["role"], "ROLE_USER");
        assert_eq!(v1["parts"][0], json!({"text": "hi"}));
        let v03 = message_json(&message(), Version::V03);
        assert_eq!(v03["kind"], "message");
        assert_eq!(v03["role"], "user");
        assert_eq!(v03["parts"][1], json!({"kind": "data", "data": {"n": 1}}));
        assert_eq!(message().text(), "hi");
    }

    #[test]
    fn bad_messages_say_what_is_wrong() {
        let cases = [
            (json!(null), "params.message"),
            (json!({"role": "ROLE_USER", "parts": [{"text": "x"}]}), "messageId"),
            (json!({"messageId": "m", "parts": [{"text": "x"}]}), "role"),
            (json!({"messageId": "m", "role": "boss", "parts": [{"text": "x"}]}), "not a role"),
            (json!({"messageId": "m", "role": "user", "parts": []}), "empty"),
            (json!({"messageId": "m", "role": "user", "parts": [{"text": 3}]}), "must be a string"),
        ];
        for (value, needle) in cases {
            let error = parse_message(Some(&value)).unwrap_err();
            assert!(error.message.contains(needle), "{value}: {error:?}");
        }
        let odd = json!({"messageId": "m", "role": "user", "parts": [{"video": 1}]});
        assert_eq!(parse_message(Some(&odd)).unwrap_err().code, RpcError::CONTENT_TYPE_NOT_SUPPORTED);
    }

    #[test]
    fn tasks_and_events_are_spelled_per_version() {
        let task = Task {
            id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus { state: TaskState::Completed, message: None, timestamp_ms: Some(0) },
            artifacts: vec![Artifact { artifact_id: "a".into(), name: Some("output".into()), parts: vec![] }],
            history: vec![message(), message()],
        };
        let v1 = send_result(&task, Version::V1, Some(1));
        assert_eq!(v1["task"]["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(v1["task"]["status"]["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v1["task"]["history"].as_array().unwrap().len(), 1);
        let v03 = send_result(&task, Version::V03, Some(0));
        assert_eq!(v03["kind"], "task");
        assert_eq!(v03["status"]["state"], "completed");
        assert!(v03.get("history").is_none());
        let status =
            StreamEvent::Status { task_id: "t".into(), context_id: "c".into(), status: task.status.clone() };
        assert_eq!(stream_event_json(&status, Version::V1)["statusUpdate"]["taskId"], "t");
        assert_eq!(stream_event_json(&status, Version::V03)["final"], true);
        assert!(status.is_final());
    }

    #[test]
    fn requests_are_read_with_their_version_and_refused_with_the_protocols_codes() {
        let request =
            parse_request(br#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"t"}}"#).unwrap();
        assert_eq!((request.method, request.version), (Method::GetTask, Version::V03));
        let cases: [(&[u8], i64); 5] = [
            (b"{not json", RpcError::PARSE),
            (b"[1]", RpcError::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1}"#, RpcError::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":"Nope"}"#, RpcError::METHOD_NOT_FOUND),
            (br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#, RpcError::INVALID_PARAMS),
        ];
        for (body, code) in cases {
            let (_, error, _) = parse_request(body).unwrap_err();
            assert_eq!(error.code, code, "{}", String::from_utf8_lossy(body));
        }
        let error = RpcError::new(RpcError::TASK_NOT_FOUND, "no task");
        assert_eq!(error.to_json(Version::V1)["data"][0]["reason"], "TASK_NOT_FOUND");
    }

    #[test]
    fn push_configs_are_read_in_both_shapes() {
        let v1 = json!({"taskId": "t", "url": "http://h/x", "token": "k", "authentication": {"scheme": "Bearer", "credentials": "s"}});
        let config = parse_push_config(v1.as_object().unwrap(), None, "d").unwrap();
        assert_eq!((config.id.as_str(), config.scheme.as_deref()), ("d", Some("Bearer")));
        assert_eq!(push_config_json(&config, Version::V1)["authentication"]["credentials"], "s");
        let v03 = json!({"taskId": "t", "pushNotificationConfig": {"id": "c", "url": "https://h", "authentication": {"schemes": ["Bearer"]}}});
        let config = parse_push_config(v03.as_object().unwrap(), None, "d").unwrap();
        assert_eq!((config.id.as_str(), config.task_id.as_str()), ("c", "t"));
        assert_eq!(push_config_json(&config, Version::V03)["pushNotificationConfig"]["id"], "c");
        let bad = json!({"taskId": "t", "url": "file:///etc/passwd"});
        assert!(parse_push_config(bad.as_object().unwrap(), None, "d").is_err());
    }
}
