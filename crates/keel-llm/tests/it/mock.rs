//! Mock upstreams that speak the real OpenAI Chat Completions, OpenAI Responses (at
//! `/v1/responses` of the OpenAI dialect) and Anthropic Messages wire formats. Each answers
//! from a queue of scripted replies and checks the protocol's invariants on EVERY request
//! it receives; a violation fails the test when the mock is dropped (or at `assert_clean`).

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    /// OpenAI's `POST /v1/embeddings`.
    OpenAiEmbeddings,
}

pub enum Reply {
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Value,
    },
    /// A whole event stream; `(event name, data)` pairs.
    Sse {
        headers: Vec<(&'static str, String)>,
        events: Vec<(Option<String>, String)>,
    },
    /// Raw SSE text fed through a channel, so a test controls when each piece is sent.
    Live(mpsc::UnboundedReceiver<String>),
    /// Never answers (for timeouts).
    Stall,
}

impl Reply {
    pub fn json(body: Value) -> Reply {
        Reply::Json { status: 200, headers: Vec::new(), body }
    }

    pub fn status(status: u16, body: Value) -> Reply {
        Reply::Json { status, headers: Vec::new(), body }
    }

    pub fn with_headers(self, extra: &[(&'static str, &str)]) -> Reply {
        let add = |headers: &mut Vec<(&'static str, String)>| {
            headers.extend(extra.iter().map(|(n, v)| (*n, (*v).to_owned())));
        };
        match self {
            Reply::Json { status, mut headers, body } => {
                add(&mut headers);
                Reply::Json { status, headers, body }
            }
            Reply::Sse { mut headers, events } => {
                add(&mut headers);
                Reply::Sse { headers, events }
            }
            other => other,
        }
    }

    /// OpenAI chunks as `data:` lines, ending with `data: [DONE]`.
    pub fn openai_stream(chunks: &[Value]) -> Reply {
        let mut events: Vec<(Option<String>, String)> =
            chunks.iter().map(|c| (None, c.to_string())).collect();
        events.push((None, "[DONE]".into()));
        Reply::Sse { headers: Vec::new(), events }
    }

    /// OpenAI Responses events, each named after its `type` (as OpenAI sends them).
    pub fn responses_stream(events: &[Value]) -> Reply {
        Self::anthropic_stream(events)
    }

    /// Anthropic events, each named after its `type`.
    pub fn anthropic_stream(events: &[Value]) -> Reply {
        let events = events.iter().map(|e| (e["type"].as_str().map(str::to_owned), e.to_string())).collect();
        Reply::Sse { headers: Vec::new(), events }
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

struct MockState {
    dialect: Dialect,
    /// The key every request must carry (None: no key header at all).
    key: Option<String>,
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    violations: Mutex<Vec<String>>,
    /// Every Responses `reasoning` item this mock answered with: a later request may send
    /// one back only exactly as it was.
    reasoning_sent: Mutex<Vec<Value>>,
}

pub struct Mock {
    pub addr: SocketAddr,
    state: Arc<MockState>,
}

impl Mock {
    pub async fn start(dialect: Dialect, key: Option<&str>, replies: Vec<Reply>) -> Mock {
        let state = Arc::new(MockState {
            dialect,
            key: key.map(str::to_owned),
            replies: Mutex::new(replies.into()),
            requests: Mutex::default(),
            violations: Mutex::default(),
            reasoning_sent: Mutex::default(),
        });
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Mock { addr, state }
    }

    /// The base URL a provider of this dialect is configured with.
    pub fn base_url(&self) -> String {
        match self.state.dialect {
            Dialect::OpenAi | Dialect::OpenAiEmbeddings => format!("http://{}/v1", self.addr),
            Dialect::Anthropic => format!("http://{}", self.addr),
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn assert_clean(&self) {
        let violations = self.state.violations.lock().unwrap();
        assert!(violations.is_empty(), "protocol violations:\n{}", violations.join("\n"));
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_clean();
        }
    }
}

async fn handle(
    State(state): State<Arc<MockState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut problems = Vec::new();
    if method != Method::POST {
        problems.push(format!("method {method}, expected POST"));
    }
    match state.dialect {
        Dialect::OpenAi if uri.path() == "/v1/responses" => {
            let sent = state.reasoning_sent.lock().unwrap().clone();
            check_responses(uri.path(), &headers, &parsed, state.key.as_deref(), &sent, &mut problems)
        }
        Dialect::OpenAi => check_openai(uri.path(), &headers, &parsed, state.key.as_deref(), &mut problems),
        Dialect::Anthropic => {
            check_anthropic(uri.path(), &headers, &parsed, state.key.as_deref(), &mut problems)
        }
        Dialect::OpenAiEmbeddings => {
            check_embeddings(uri.path(), &headers, &parsed, state.key.as_deref(), &mut problems)
        }
    }
    let number = {
        let mut requests = state.requests.lock().unwrap();
        requests.push(Recorded { path: uri.path().to_owned(), headers, body: parsed });
        requests.len()
    };
    if !problems.is_empty() {
        let mut violations = state.violations.lock().unwrap();
        violations.extend(problems.into_iter().map(|p| format!("request {number}: {p}")));
    }
    let reply = state.replies.lock().unwrap().pop_front();
    let Some(reply) = reply else {
        state.violations.lock().unwrap().push(format!("request {number}: no reply was scripted for it"));
        return (StatusCode::INTERNAL_SERVER_ERROR, "mock: no reply scripted").into_response();
    };
    remember_reasoning(&state, &reply);
    match reply {
        Reply::Json { status, headers, body } => {
            let mut response = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        Reply::Sse { headers, events } => {
            let mut text = String::new();
            for (name, data) in events {
                if let Some(name) = name {
                    text.push_str(&format!("event: {name}\n"));
                }
                text.push_str(&format!("data: {data}\n\n"));
            }
            let mut response = Response::new(Body::from(text));
            response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        Reply::Live(receiver) => {
            let stream = UnboundedReceiverStream::new(receiver).map(Ok::<_, Infallible>);
            let mut response = Response::new(Body::from_stream(stream));
            response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            response
        }
        Reply::Stall => {
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

/// Notes the reasoning items a reply carries (in a response's `output`, a terminal
/// event's `response.output`, or a finished output item).
fn remember_reasoning(state: &MockState, reply: &Reply) {
    let mut found = Vec::new();
    let mut collect = |value: &Value| {
        let items = value
            .pointer("/output")
            .or_else(|| value.pointer("/response/output"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .chain(value.get("item").cloned());
        found.extend(items.filter(|item| item["type"] == "reasoning"));
    };
    match reply {
        Reply::Json { body, .. } => collect(body),
        Reply::Sse { events, .. } => {
            for (_, data) in events {
                collect(&serde_json::from_str(data).unwrap_or(Value::Null));
            }
        }
        Reply::Live(_) | Reply::Stall => {}
    }
    state.reasoning_sent.lock().unwrap().extend(found);
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// What every OpenAI POST must be: the endpoint's path, a JSON body, bearer auth with
/// the configured key.
fn check_openai_post(
    path: &str,
    expected: &str,
    headers: &HeaderMap,
    key: Option<&str>,
    problems: &mut Vec<String>,
) {
    if path != expected {
        problems.push(format!("path {path}, expected {expected}"));
    }
    if header(headers, "content-type") != Some("application/json") {
        problems.push(format!("content-type {:?}", header(headers, "content-type")));
    }
    let expected_auth = key.map(|k| format!("Bearer {k}"));
    if header(headers, "authorization") != expected_auth.as_deref() {
        problems.push(format!(
            "authorization {:?}, expected {expected_auth:?}",
            header(headers, "authorization")
        ));
    }
}

/// OpenAI embeddings: `{"model", "input": [strings]}` (a list, never empty, no empty
/// strings; at most 2048), optional `dimensions` and `encoding_format`, bearer auth.
fn check_embeddings(
    path: &str,
    headers: &HeaderMap,
    body: &Value,
    key: Option<&str>,
    problems: &mut Vec<String>,
) {
    check_openai_post(path, "/v1/embeddings", headers, key, problems);
    let mut fail = |p: String| problems.push(p);
    if !body["model"].as_str().is_some_and(|m| !m.is_empty() && !m.contains('/')) {
        fail(format!("model {:?}", body["model"]));
    }
    match body["input"].as_array() {
        Some(input) if !input.is_empty() && input.len() <= 2048 => {
            if !input.iter().all(|i| i.as_str().is_some_and(|s| !s.is_empty())) {
                fail(format!("input holds something other than non-empty strings: {input:?}"));
            }
        }
        _ => fail(format!("input {:?}, expected a list of 1 to 2048 strings", body["input"])),
    }
    if let Some(format) = body.get("encoding_format")
        && format != "float"
    {
        fail(format!("encoding_format {format}"));
    }
    for field in body.as_object().into_iter().flat_map(|o| o.keys()) {
        if !["model", "input", "dimensions", "encoding_format", "user"].contains(&field.as_str()) {
            fail(format!("unknown field {field:?}"));
        }
    }
}

fn check_openai(
    path: &str,
    headers: &HeaderMap,
    body: &Value,
    key: Option<&str>,
    problems: &mut Vec<String>,
) {
    check_openai_post(path, "/v1/chat/completions", headers, key, problems);
    let mut fail = |p: String| problems.push(p);
    if headers.contains_key("x-api-key") {
        fail("an x-api-key header on an OpenAI request".into());
    }
    if !body["model"].as_str().is_some_and(|m| !m.is_empty() && !m.contains('/')) {
        fail(format!("model {} is not a bare model name", body["model"]));
    }
    let limits = ["max_tokens", "max_completion_tokens"].iter().filter(|k| body.get(**k).is_some()).count();
    let limit = body.get("max_tokens").or_else(|| body.get("max_completion_tokens"));
    if limits != 1 || limit.and_then(Value::as_u64).is_none_or(|n| n == 0) {
        fail(format!("exactly one positive max_tokens / max_completion_tokens expected, got {limit:?}"));
    }
    match body.get("stream") {
        None => {
            if body.get("stream_options").is_some() {
                fail("stream_options without stream".into());
            }
        }
        Some(Value::Bool(true)) => {
            if body.pointer("/stream_options/include_usage") != Some(&json!(true)) {
                fail("a stream without stream_options.include_usage".into());
            }
        }
        Some(other) => fail(format!("stream is {other}")),
    }
    if let Some(tools) = body.get("tools") {
        for tool in tools.as_array().into_iter().flatten() {
            if tool["type"] != "function" || !tool["function"]["name"].is_string() {
                fail(format!("tool {tool} is not a function tool"));
            }
        }
    } else if body.get("tool_choice").is_some() || body.get("parallel_tool_calls").is_some() {
        fail("tool_choice / parallel_tool_calls without tools".into());
    }
    let Some(messages) = body["messages"].as_array().filter(|m| !m.is_empty()) else {
        fail("messages missing or empty".into());
        return;
    };
    let mut call_ids = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        if !["system", "user", "assistant", "tool"].contains(&role) {
            fail(format!("messages[{i}].role {role:?}"));
        }
        let has_calls = message.get("tool_calls").is_some();
        match &message["content"] {
            Value::String(_) => {}
            Value::Null if role == "assistant" && has_calls => {}
            other => fail(format!("messages[{i}].content {other}")),
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let arguments = call["function"]["arguments"].as_str();
            if role != "assistant"
                || !call["id"].is_string()
                || call["type"] != "function"
                || !call["function"]["name"].is_string()
                || arguments.is_none_or(|a| serde_json::from_str::<Value>(a).is_err())
            {
                fail(format!("messages[{i}] has a malformed tool call {call}"));
            }
            call_ids.insert(call["id"].as_str().unwrap_or_default().to_owned());
        }
        if role == "tool" && !message["tool_call_id"].as_str().is_some_and(|id| call_ids.contains(id)) {
            fail(format!("messages[{i}] answers no earlier tool call"));
        }
    }
}

/// OpenAI Responses: bearer auth; a bare model; `input` items, never chat's `messages`;
/// `max_output_tokens` always; stateless (`store: false`, encrypted reasoning included);
/// flat function tools; every item well-formed, every `function_call_output` answering an
/// earlier `function_call`, and every `reasoning` item one this mock sent, unchanged.
fn check_responses(
    path: &str,
    headers: &HeaderMap,
    body: &Value,
    key: Option<&str>,
    reasoning_sent: &[Value],
    problems: &mut Vec<String>,
) {
    check_openai_post(path, "/v1/responses", headers, key, problems);
    let mut fail = |p: String| problems.push(p);
    if !body["model"].as_str().is_some_and(|m| !m.is_empty() && !m.contains('/')) {
        fail(format!("model {} is not a bare model name", body["model"]));
    }
    for chat_only in
        ["messages", "max_tokens", "max_completion_tokens", "stream_options", "response_format", "stop", "n"]
    {
        if body.get(chat_only).is_some() {
            fail(format!("Chat Completions field `{chat_only}` in a Responses request"));
        }
    }
    if body["max_output_tokens"].as_u64().is_none_or(|n| n == 0) {
        fail(format!("max_output_tokens {} (always sent, positive)", body["max_output_tokens"]));
    }
    if body["store"] != json!(false) {
        fail(format!("store is {}, expected false (the kernel keeps the history)", body["store"]));
    }
    if !body["include"].as_array().is_some_and(|i| i.contains(&json!("reasoning.encrypted_content"))) {
        fail(format!("include {} lacks reasoning.encrypted_content", body["include"]));
    }
    if body.get("stream").is_some_and(|s| s != &json!(true)) {
        fail(format!("stream is {}", body["stream"]));
    }
    if body.get("instructions").is_some_and(|i| !i.is_string()) {
        fail(format!("instructions {}", body["instructions"]));
    }
    if let Some(tools) = body.get("tools") {
        for tool in tools.as_array().into_iter().flatten() {
            if tool["type"] != "function"
                || !tool["name"].is_string()
                || !tool["parameters"].is_object()
                || !tool["strict"].is_boolean()
                || tool.get("function").is_some()
            {
                fail(format!("tool {tool} is not {{type: function, name, parameters, strict}}"));
            }
        }
    } else if body.get("tool_choice").is_some() || body.get("parallel_tool_calls").is_some() {
        fail("tool_choice / parallel_tool_calls without tools".into());
    }
    let Some(input) = body["input"].as_array().filter(|i| !i.is_empty()) else {
        fail(format!("input {} is not a non-empty item list", body["input"]));
        return;
    };
    let mut call_ids = HashSet::new();
    for (i, item) in input.iter().enumerate() {
        match item["type"].as_str() {
            Some("message") => {
                let role = item["role"].as_str().unwrap_or_default();
                if !["user", "assistant", "developer", "system"].contains(&role) {
                    fail(format!("input[{i}].role {role:?}"));
                }
                let parts_ok = item["content"].as_array().is_some_and(|parts| {
                    parts.iter().all(|p| {
                        ["input_text", "output_text"].contains(&p["type"].as_str().unwrap_or_default())
                            && p["text"].is_string()
                    })
                });
                if !item["content"].is_string() && !parts_ok {
                    fail(format!("input[{i}].content {}", item["content"]));
                }
            }
            Some("function_call") => {
                let arguments = item["arguments"].as_str();
                if item["call_id"].as_str().is_none_or(str::is_empty)
                    || !item["name"].is_string()
                    || arguments.is_none_or(|a| serde_json::from_str::<Value>(a).is_err())
                {
                    fail(format!("input[{i}] is a malformed function_call {item}"));
                }
                call_ids.insert(item["call_id"].as_str().unwrap_or_default().to_owned());
            }
            Some("function_call_output") => {
                if !item["call_id"].as_str().is_some_and(|id| call_ids.contains(id))
                    || !item["output"].is_string()
                {
                    fail(format!("input[{i}] answers no earlier function_call: {item}"));
                }
            }
            Some("reasoning") => {
                if !reasoning_sent.contains(item) {
                    fail(format!(
                        "input[{i}] is a reasoning item this upstream never sent (or changed): {item}"
                    ));
                }
            }
            other => fail(format!("input[{i}] has type {other:?}")),
        }
    }
}

fn check_anthropic(
    path: &str,
    headers: &HeaderMap,
    body: &Value,
    key: Option<&str>,
    problems: &mut Vec<String>,
) {
    let mut fail = |p: String| problems.push(p);
    if path != "/v1/messages" {
        fail(format!("path {path}, expected /v1/messages"));
    }
    if header(headers, "content-type") != Some("application/json") {
        fail(format!("content-type {:?}", header(headers, "content-type")));
    }
    if header(headers, "x-api-key") != key {
        fail(format!("x-api-key {:?}, expected {key:?}", header(headers, "x-api-key")));
    }
    if header(headers, "anthropic-version") != Some("2023-06-01") {
        fail(format!("anthropic-version {:?}", header(headers, "anthropic-version")));
    }
    if headers.contains_key("authorization") {
        fail("an authorization header on an Anthropic request".into());
    }
    if !body["model"].as_str().is_some_and(|m| !m.is_empty() && !m.contains('/')) {
        fail(format!("model {} is not a bare model name", body["model"]));
    }
    if body["max_tokens"].as_u64().is_none_or(|n| n == 0) {
        fail(format!("max_tokens {} (required, positive)", body["max_tokens"]));
    }
    if body.get("system").is_some_and(|s| !s.is_string()) {
        fail("system is not a string".into());
    }
    if body.get("stream").is_some_and(|s| s != &json!(true)) {
        fail(format!("stream is {}", body["stream"]));
    }
    for key in ["stream_options", "tool_calls", "response_format", "stop", "parallel_tool_calls"] {
        if body.get(key).is_some() {
            fail(format!("OpenAI field `{key}` in an Anthropic request"));
        }
    }
    if let Some(tools) = body.get("tools") {
        for tool in tools.as_array().into_iter().flatten() {
            if !tool["name"].is_string()
                || !tool["input_schema"].is_object()
                || tool.get("function").is_some()
            {
                fail(format!("tool {tool} is not {{name, description, input_schema}}"));
            }
        }
    }
    let Some(messages) = body["messages"].as_array().filter(|m| !m.is_empty()) else {
        fail("messages missing or empty".into());
        return;
    };
    let mut previous_tool_uses: HashSet<String> = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            fail(format!("messages[{i}].role {role:?}: turns must alternate, starting with user"));
        }
        let Some(blocks) = message["content"].as_array().filter(|b| !b.is_empty()) else {
            fail(format!("messages[{i}].content is not a non-empty block array"));
            continue;
        };
        let mut tool_uses = HashSet::new();
        let mut seen_text = false;
        for block in blocks {
            match (role, block["type"].as_str()) {
                (_, Some("text")) => {
                    seen_text = true;
                    if block["text"].as_str().is_none_or(str::is_empty) {
                        fail(format!("messages[{i}] has an empty text block"));
                    }
                }
                ("assistant", Some("tool_use")) => {
                    if !block["id"].is_string() || !block["name"].is_string() || !block["input"].is_object() {
                        fail(format!("messages[{i}] has a malformed tool_use {block}"));
                    }
                    tool_uses.insert(block["id"].as_str().unwrap_or_default().to_owned());
                }
                ("user", Some("tool_result")) => {
                    if seen_text {
                        fail(format!("messages[{i}]: a tool_result after text"));
                    }
                    if !block["tool_use_id"].as_str().is_some_and(|id| previous_tool_uses.contains(id)) {
                        fail(format!(
                            "messages[{i}]: tool_result {block} answers no tool_use of the previous turn"
                        ));
                    }
                }
                (_, kind) => fail(format!("messages[{i}] ({role}) has a {kind:?} block")),
            }
        }
        previous_tool_uses = tool_uses;
    }
}
