//! Pure conversions between the OpenAI Chat Completions wire format and Keel's canonical
//! `LlmChatParams` / `LlmChatResult` (which already use the OpenAI message shape), both
//! ways: what the provider sends upstream and reads back, and what the kernel's
//! OpenAI-compatible endpoint reads from an agent and answers.

use std::collections::BTreeMap;

use keel_protocol::rpc::{AssistantMessage, ChatMessage, ChatRole, LlmChatParams, LlmChatResult, TokenUsage};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::Delta;
use crate::error::{ErrorBody, Result};
use crate::pricing::DEFAULT_MAX_OUTPUT_TOKENS;

// ---------------------------------------------------------------------------------------
// Upstream: what the provider sends and reads.
// ---------------------------------------------------------------------------------------

/// Reasoning models take `max_completion_tokens` and refuse `max_tokens`.
fn takes_max_completion_tokens(model: &str) -> bool {
    ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        model == *family || model.strip_prefix(family).is_some_and(|rest| rest.starts_with('-'))
    })
}

/// The request body for `POST {base_url}/chat/completions`. The output limit is always
/// sent (the request's, else [`DEFAULT_MAX_OUTPUT_TOKENS`]) so that a budget reservation
/// is a true bound. Written from the canonical request in place: a conversation is re-sent
/// whole on every call, and building it as a `Value` first copied every message.
pub fn request_body<'a>(params: &'a LlmChatParams, model: &'a str, stream: bool) -> RequestBody<'a> {
    let tools = params.tools.as_deref().filter(|tools| !tools.is_empty());
    let max_tokens = params.max_tokens.map_or(DEFAULT_MAX_OUTPUT_TOKENS, u64::from);
    let completion_tokens = takes_max_completion_tokens(model);
    RequestBody {
        model,
        messages: UpstreamMessages(&params.messages),
        tools,
        tool_choice: tools.and(params.tool_choice.as_ref()),
        parallel_tool_calls: tools.and(params.parallel_tool_calls),
        max_completion_tokens: completion_tokens.then_some(max_tokens),
        max_tokens: (!completion_tokens).then_some(max_tokens),
        temperature: params.temperature,
        top_p: params.top_p,
        stop: params.stop.as_deref(),
        response_format: params.response_format.as_ref(),
        stream: stream.then_some(true),
        stream_options: stream.then_some(StreamOptions { include_usage: true }),
    }
}

/// See [`request_body`].
#[derive(Debug, Serialize)]
pub struct RequestBody<'a> {
    model: &'a str,
    messages: UpstreamMessages<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [Value]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The canonical messages as OpenAI wants them (see [`upstream_message`]).
#[derive(Debug)]
struct UpstreamMessages<'a>(&'a [ChatMessage]);

impl Serialize for UpstreamMessages<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|message| {
            // Written as it is, unless a tool call's arguments are not JSON text yet.
            let as_is = message
                .tool_calls
                .iter()
                .flatten()
                .all(|call| call.pointer("/function/arguments").is_none_or(Value::is_string));
            if as_is {
                UpstreamMessage::AsIs(message)
            } else {
                UpstreamMessage::Rewritten(upstream_message(message))
            }
        }))
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum UpstreamMessage<'a> {
    AsIs(&'a ChatMessage),
    Rewritten(Value),
}

/// A canonical message as OpenAI wants it; tool call arguments must be JSON text.
fn upstream_message(message: &ChatMessage) -> Value {
    let mut value = serde_json::to_value(message).unwrap_or(Value::Null);
    if let Some(calls) = value.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            if let Some(arguments) = call.pointer_mut("/function/arguments")
                && !arguments.is_string()
            {
                *arguments = Value::String(arguments.to_string());
            }
        }
    }
    value
}

/// What a completed upstream response says, before pricing.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub message: AssistantMessage,
    /// None when the server sent no usage (the provider then estimates it).
    pub usage: Option<TokenUsage>,
    pub model: Option<String>,
    pub finish_reason: Option<String>,
    pub id: Option<String>,
}

fn usage_of(value: &Value) -> Option<TokenUsage> {
    let usage = value.get("usage").filter(|u| u.is_object()).or_else(|| value.pointer("/x_groq/usage"))?;
    Some(TokenUsage {
        input_tokens: usage.get("prompt_tokens").and_then(Value::as_u64)?,
        output_tokens: usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// Reads a non-streamed `chat.completion`.
pub fn parse_chat_completion(value: &Value) -> std::result::Result<Parsed, String> {
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| "no `choices[0]`".to_owned())?;
    let message = choice.get("message").ok_or_else(|| "no `choices[0].message`".to_owned())?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .or_else(|| message.get("refusal").and_then(Value::as_str))
        .map(str::to_owned);
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|calls| !calls.is_empty())
        .map(|calls| calls.iter().map(normalize_tool_call).collect());
    Ok(Parsed {
        message: AssistantMessage { role: ChatRole::Assistant, content, tool_calls, reasoning: None },
        usage: usage_of(value),
        model: value.get("model").and_then(Value::as_str).map(str::to_owned),
        finish_reason: choice.get("finish_reason").and_then(Value::as_str).map(str::to_owned),
        id: value.get("id").and_then(Value::as_str).map(str::to_owned),
    })
}

/// Reads a non-streamed `chat.completion` from its body's bytes: read into typed fields
/// when the body has the usual shape (no `Value` tree built and dropped for every call),
/// else as [`parse_chat_completion`] reads it, whose answer is the same for any body the
/// typed reading takes (`a_completion_reads_the_same_typed_as_through_a_value`).
pub fn parse_chat_completion_bytes(bytes: &[u8]) -> std::result::Result<Parsed, String> {
    if let Ok(typed) = serde_json::from_slice::<WireCompletion>(bytes)
        && let Some(parsed) = typed.parsed()
    {
        return Ok(parsed);
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON ({e})"))?;
    parse_chat_completion(&value)
}

/// The fields of a `chat.completion` that [`parse_chat_completion`] reads, typed. Any
/// other type than these (a number for `model`, an object for `tool_calls`) fails the
/// typed reading, and the body is then read through a `Value`, leniently.
#[derive(Deserialize)]
struct WireCompletion {
    id: Option<String>,
    model: Option<String>,
    choices: Option<Vec<WireChoice>>,
    usage: Option<WireUsage>,
    x_groq: Option<WireGroq>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: Option<WireMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<Value>>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireGroq {
    usage: Option<WireUsage>,
}

impl WireUsage {
    fn tokens(&self) -> Option<TokenUsage> {
        Some(TokenUsage {
            input_tokens: self.prompt_tokens?,
            output_tokens: self.completion_tokens.unwrap_or(0),
        })
    }
}

impl WireCompletion {
    /// What [`parse_chat_completion`] would answer; `None` for a body it would refuse
    /// (which is then read through a `Value`, for the same error).
    fn parsed(self) -> Option<Parsed> {
        let WireCompletion { id, model, choices, usage, x_groq } = self;
        let choice = choices?.into_iter().next()?;
        let message = choice.message?;
        // A `usage` that is not an object (null) gives way to Groq's.
        let usage = match usage {
            Some(usage) => usage.tokens(),
            None => x_groq.and_then(|groq| groq.usage).and_then(|usage| usage.tokens()),
        };
        let tool_calls = message
            .tool_calls
            .filter(|calls| !calls.is_empty())
            .map(|calls| calls.iter().map(normalize_tool_call).collect());
        Some(Parsed {
            message: AssistantMessage {
                role: ChatRole::Assistant,
                content: message.content.or(message.refusal),
                tool_calls,
                reasoning: None,
            },
            usage,
            model,
            finish_reason: choice.finish_reason,
            id,
        })
    }
}

fn normalize_tool_call(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(object) = call.as_object_mut() {
        object.entry("type").or_insert_with(|| json!("function"));
    }
    if let Some(arguments) = call.pointer_mut("/function/arguments")
        && !arguments.is_string()
    {
        *arguments = Value::String(arguments.to_string());
    }
    call
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles a streamed response from its `chat.completion.chunk`s, yielding the deltas
/// to forward as it goes.
#[derive(Debug, Default)]
pub struct ChunkAssembler {
    content: Option<String>,
    calls: BTreeMap<u32, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<TokenUsage>,
    model: Option<String>,
    id: Option<String>,
}

impl ChunkAssembler {
    pub fn new() -> ChunkAssembler {
        ChunkAssembler::default()
    }

    /// Takes one chunk. An error object in the stream comes back as `Err`.
    pub fn push(&mut self, chunk: &Value) -> std::result::Result<Vec<Delta>, ErrorBody> {
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(ErrorBody::from_value(chunk));
        }
        if self.model.is_none() {
            self.model =
                chunk.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).map(str::to_owned);
        }
        if self.id.is_none() {
            self.id = chunk.get("id").and_then(Value::as_str).map(str::to_owned);
        }
        if let Some(usage) = usage_of(chunk) {
            self.usage = Some(usage);
        }
        let mut deltas = Vec::new();
        let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Ok(deltas);
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else { return Ok(deltas) };
        let text = delta
            .get("content")
            .and_then(Value::as_str)
            .or_else(|| delta.get("refusal").and_then(Value::as_str));
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            self.content.get_or_insert_with(String::new).push_str(text);
            deltas.push(Delta::Text(text.to_owned()));
        }
        for (position, call) in
            delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            // Some servers (older Ollama) leave out `index`; the position stands in.
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(position as u64) as u32;
            let id = call.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned);
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            let partial = self.calls.entry(index).or_default();
            if let Some(id) = &id {
                partial.id = Some(id.clone());
            }
            if let Some(name) = &name {
                partial.name.push_str(name);
            }
            partial.arguments.push_str(&arguments);
            deltas.push(Delta::ToolCall { index, id, name, arguments });
        }
        Ok(deltas)
    }

    /// Whether a chunk said why the model stopped (the stream is complete in substance).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    pub fn finish(self) -> Parsed {
        let tool_calls: Vec<Value> = self
            .calls
            .into_iter()
            .map(|(index, call)| {
                json!({
                    "id": call.id.unwrap_or_else(|| format!("call_{index}")),
                    "type": "function",
                    "function": { "name": call.name, "arguments": call.arguments },
                })
            })
            .collect();
        Parsed {
            message: AssistantMessage {
                role: ChatRole::Assistant,
                content: self.content,
                tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
                reasoning: None,
            },
            usage: self.usage,
            model: self.model,
            finish_reason: self.finish_reason,
            id: self.id,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The kernel's OpenAI-compatible endpoint: what an agent's SDK sends and gets back.
// ---------------------------------------------------------------------------------------

use crate::fields::{self, invalid};

/// Text of an OpenAI `content`: a string, null, or an array of parts (text parts are
/// joined; other kinds are refused, since the canonical message holds text only).
/// `at` names the message in errors (formatted only for one).
pub(crate) fn content_text(content: Option<&Value>, at: impl Fn() -> String) -> Result<Option<String>> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(piece)) => text.push_str(piece),
                    (kind, _) => {
                        return Err(invalid(format!(
                            "{}.content[{i}] is a {} part; Keel's gateway passes text only",
                            at(),
                            kind.unwrap_or("untyped")
                        )));
                    }
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(invalid(format!("{}.content must be a string, null or an array of parts", at()))),
    }
}

/// Reads a `POST /v1/chat/completions` body into the canonical request and whether the
/// client asked for a stream.
pub fn chat_request_to_canonical(body: &Value) -> Result<(LlmChatParams, bool)> {
    let object = body.as_object().ok_or_else(|| invalid("the body must be a JSON object"))?;
    let raw_messages = object
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("`messages` is required and must be an array"))?;
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, raw) in raw_messages.iter().enumerate() {
        let at = || format!("messages[{i}]");
        let role = match raw.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => ChatRole::System,
            Some("user") => ChatRole::User,
            Some("assistant") => ChatRole::Assistant,
            Some("tool") => ChatRole::Tool,
            other => {
                return Err(invalid(format!(
                    "{}.role is {other:?}; expected system, developer, user, assistant or tool",
                    at()
                )));
            }
        };
        let tool_calls = match raw.get("tool_calls") {
            None | Some(Value::Null) => None,
            Some(Value::Array(calls)) if calls.is_empty() => None,
            Some(Value::Array(calls)) => Some(calls.iter().map(normalize_tool_call).collect()),
            Some(_) => return Err(invalid(format!("{}.tool_calls must be an array", at()))),
        };
        let text = |key: &str| raw.get(key).and_then(Value::as_str).map(str::to_owned);
        let tool_call_id = text("tool_call_id");
        if role == ChatRole::Tool && tool_call_id.is_none() {
            return Err(invalid(format!("{} is a tool message without `tool_call_id`", at())));
        }
        messages.push(ChatMessage {
            role,
            content: content_text(raw.get("content"), at)?,
            tool_calls,
            tool_call_id,
            name: text("name"),
            reasoning: None,
        });
    }
    let tools = match object.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                if tool.get("type").and_then(Value::as_str) != Some("function")
                    || tool.pointer("/function/name").and_then(Value::as_str).is_none()
                {
                    return Err(invalid(format!(
                        "tools[{i}] must be {{\"type\":\"function\",\"function\":{{\"name\":...}}}}"
                    )));
                }
            }
            (!tools.is_empty()).then(|| tools.clone())
        }
        Some(_) => return Err(invalid("`tools` must be an array")),
    };
    if object.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(invalid("`n` greater than 1 is not supported; make several calls"));
    }
    let max_tokens = fields::max_tokens(object, &["max_completion_tokens", "max_tokens"])?;
    let stop = fields::stop_sequences(object, "stop", true)?;
    let params = LlmChatParams {
        messages,
        model: fields::model(object),
        tools,
        max_tokens,
        temperature: fields::number(object, "temperature")?,
        tool_choice: object.get("tool_choice").filter(|v| !v.is_null()).cloned(),
        stop,
        top_p: fields::number(object, "top_p")?,
        response_format: object.get("response_format").filter(|v| !v.is_null()).cloned(),
        parallel_tool_calls: object.get("parallel_tool_calls").and_then(Value::as_bool),
    };
    let stream = object.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok((params, stream))
}

/// Whether a chat request asked for the final usage chunk (`stream_options.include_usage`).
pub fn wants_usage_chunk(body: &Value) -> bool {
    body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false)
}

fn tool_calls_out(result: &LlmChatResult) -> Vec<Value> {
    result
        .message
        .tool_calls
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, call)| {
            let mut call = normalize_tool_call(call);
            if call.get("id").and_then(Value::as_str).is_none_or(str::is_empty) {
                call["id"] = json!(format!("call_{index}"));
            }
            call
        })
        .collect()
}

fn finish_reason_out(result: &LlmChatResult) -> String {
    result.finish_reason.clone().unwrap_or_else(|| {
        if result.message.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) { "tool_calls" } else { "stop" }
            .to_owned()
    })
}

fn usage_out(usage: &TokenUsage) -> Value {
    json!(UsageOut::of(usage))
}

/// The `chat.completion` object answering a non-streamed request, borrowed from the result
/// and serialized straight to its text (no `Value` tree is built for the answer: this runs
/// on every gateway call).
pub fn canonical_to_chat_completion<'a>(
    result: &'a LlmChatResult,
    id: &'a str,
    created: u64,
) -> ChatCompletion<'a> {
    let calls = tool_calls_out(result);
    ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: &result.model,
        choices: [CompletionChoice {
            index: 0,
            message: CompletionMessage {
                role: "assistant",
                content: result.message.content.as_deref(),
                refusal: None,
                tool_calls: (!calls.is_empty()).then_some(calls),
            },
            logprobs: None,
            finish_reason: finish_reason_out(result),
        }],
        usage: UsageOut::of(&result.usage),
        system_fingerprint: None,
    }
}

/// A `chat.completion`, as [`canonical_to_chat_completion`] renders it.
#[derive(Debug, Serialize)]
pub struct ChatCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [CompletionChoice<'a>; 1],
    usage: UsageOut,
    system_fingerprint: Option<()>,
}

#[derive(Debug, Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: CompletionMessage<'a>,
    logprobs: Option<()>,
    finish_reason: String,
}

#[derive(Debug, Serialize)]
struct CompletionMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl UsageOut {
    fn of(usage: &TokenUsage) -> UsageOut {
        UsageOut {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.input_tokens + usage.output_tokens,
        }
    }
}

/// The `chat.completion.chunk`s of a whole result, in order: the role, the text, one chunk
/// per tool call, the finish reason, and last a usage chunk (`choices: []`) — drop that one
/// unless the client sent `stream_options.include_usage` (see [`wants_usage_chunk`]). The
/// endpoint sends each as `data: <json>` and ends with `data: [DONE]`.
pub fn canonical_to_chunks(result: &LlmChatResult, id: &str, created: u64) -> Vec<Value> {
    let chunk = |choices: Value| json!({ "id": id, "object": "chat.completion.chunk", "created": created, "model": result.model, "choices": choices });
    let delta = |delta: Value, finish: Value| {
        chunk(json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }]))
    };
    let mut chunks = vec![delta(json!({ "role": "assistant", "content": "" }), Value::Null)];
    if let Some(text) = result.message.content.as_deref().filter(|t| !t.is_empty()) {
        chunks.push(delta(json!({ "content": text }), Value::Null));
    }
    for (index, call) in tool_calls_out(result).into_iter().enumerate() {
        let streamed = json!({
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": { "name": call.pointer("/function/name").cloned().unwrap_or(json!("")), "arguments": call.pointer("/function/arguments").cloned().unwrap_or(json!("")) },
        });
        chunks.push(delta(json!({ "tool_calls": [streamed] }), Value::Null));
    }
    chunks.push(delta(json!({}), json!(finish_reason_out(result))));
    let mut usage = chunk(json!([]));
    usage["usage"] = usage_out(&result.usage);
    chunks.push(usage);
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> ChatMessage {
        ChatMessage {
            role: ChatRole::User,
            content: Some(text.into()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning: None,
        }
    }

    fn weather_call() -> Value {
        json!({"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}})
    }

    fn result_with_tools() -> LlmChatResult {
        LlmChatResult {
            message: AssistantMessage {
                role: ChatRole::Assistant,
                content: Some("Let me check.".into()),
                tool_calls: Some(vec![weather_call()]),
                reasoning: None,
            },
            usage: TokenUsage { input_tokens: 12, output_tokens: 7 },
            cost_usd: 0.0,
            model: "gpt-4o-mini-2024-07-18".into(),
            finish_reason: Some("tool_calls".into()),
        }
    }

    #[test]
    fn upstream_body_carries_every_setting() {
        let params = LlmChatParams {
            messages: vec![
                user("hi"),
                ChatMessage {
                    role: ChatRole::Assistant,
                    content: None,
                    tool_calls: Some(vec![
                        json!({"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}),
                    ]),
                    tool_call_id: None,
                    name: None,
                    reasoning: None,
                },
            ],
            tools: Some(vec![json!({"type":"function","function":{"name":"f","parameters":{}}})]),
            tool_choice: Some(json!("required")),
            parallel_tool_calls: Some(false),
            temperature: Some(0.2),
            stop: Some(vec!["END".into()]),
            ..LlmChatParams::default()
        };
        let body = serde_json::to_value(request_body(&params, "gpt-4o-mini", true)).unwrap();
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["max_tokens"], 4096, "the default output limit is always sent");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["tool_choice"], "required");
        assert_eq!(body["parallel_tool_calls"], false);
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["stop"], json!(["END"]));
        assert_eq!(body["messages"][0], json!({"role":"user","content":"hi"}));
        assert_eq!(body["messages"][1]["content"], Value::Null);
        assert_eq!(body["messages"][1]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");

        let plain = serde_json::to_value(request_body(
            &LlmChatParams {
                messages: vec![user("x")],
                max_tokens: Some(9),
                parallel_tool_calls: Some(true),
                ..LlmChatParams::default()
            },
            "o3-mini",
            false,
        ))
        .unwrap();
        assert_eq!(plain["max_completion_tokens"], 9);
        assert!(plain.get("max_tokens").is_none());
        assert!(plain.get("stream").is_none());
        assert!(plain.get("parallel_tool_calls").is_none(), "only with tools");
        assert!(plain.get("temperature").is_none());
        assert!(takes_max_completion_tokens("gpt-5") && takes_max_completion_tokens("o1-2024-12-17"));
        assert!(!takes_max_completion_tokens("gpt-4o") && !takes_max_completion_tokens("o1x"));
    }

    /// The body as it was built before it was written in place: a `Value`, every message
    /// through `upstream_message`. The oracle of the property test below.
    fn request_body_as_value(params: &LlmChatParams, model: &str, stream: bool) -> Value {
        let mut body = serde_json::Map::new();
        body.insert("model".into(), json!(model));
        body.insert("messages".into(), Value::Array(params.messages.iter().map(upstream_message).collect()));
        if params.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            body.insert("tools".into(), json!(params.tools));
            if let Some(choice) = &params.tool_choice {
                body.insert("tool_choice".into(), choice.clone());
            }
            if let Some(parallel) = params.parallel_tool_calls {
                body.insert("parallel_tool_calls".into(), json!(parallel));
            }
        }
        let max_tokens = params.max_tokens.map_or(DEFAULT_MAX_OUTPUT_TOKENS, u64::from);
        let key = if takes_max_completion_tokens(model) { "max_completion_tokens" } else { "max_tokens" };
        body.insert(key.into(), json!(max_tokens));
        for (key, value) in [
            ("temperature", params.temperature.map(Value::from)),
            ("top_p", params.top_p.map(Value::from)),
            ("stop", params.stop.as_ref().map(|s| json!(s))),
            ("response_format", params.response_format.clone()),
        ] {
            if let Some(value) = value {
                body.insert(key.into(), value);
            }
        }
        if stream {
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({ "include_usage": true }));
        }
        Value::Object(body)
    }

    fn any_chat_params() -> impl proptest::strategy::Strategy<Value = LlmChatParams> {
        use proptest::prelude::*;
        let arguments = prop_oneof![
            Just(None),
            Just(Some(json!("{\"a\":1}"))),
            Just(Some(json!({"a": [1, "x"]}))),
            Just(Some(json!(7)))
        ];
        let call = (arguments, "[a-z]{1,5}").prop_map(|(arguments, name)| {
            let mut function = json!({ "name": name });
            if let Some(arguments) = arguments {
                function["arguments"] = arguments;
            }
            json!({ "id": "c", "type": "function", "function": function })
        });
        let role = prop_oneof![
            Just(ChatRole::System),
            Just(ChatRole::User),
            Just(ChatRole::Assistant),
            Just(ChatRole::Tool)
        ];
        let message =
            (
                role,
                prop::option::of("[a-z \"\\\\é]{0,20}"),
                prop::option::of(prop::collection::vec(call, 0..3)),
                prop::option::of("[a-z0-9]{1,4}"),
                prop::option::of("[a-z]{1,4}"),
                prop::option::of(Just(vec![json!({"type": "reasoning", "encrypted_content": "e"})])),
            )
                .prop_map(|(role, content, tool_calls, tool_call_id, name, reasoning)| {
                    ChatMessage { role, content, tool_calls, tool_call_id, name, reasoning }
                });
        let number = prop_oneof![Just(0.0), Just(0.7), Just(-1.5e300), Just(f64::NAN), Just(f64::INFINITY)];
        (
            prop::collection::vec(message, 0..5),
            prop::option::of(prop::collection::vec(
                Just(json!({"type": "function", "function": {"name": "f"}})),
                0..3,
            )),
            prop::option::of(prop_oneof![Just(json!("auto")), Just(json!({"type": "function"}))]),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<u32>()),
            (prop::option::of(number.clone()), prop::option::of(number)),
            prop::option::of(prop::collection::vec("[a-z]{0,3}", 0..3)),
            prop::option::of(Just(json!({"type": "json_object"}))),
        )
            .prop_map(
                |(
                    messages,
                    tools,
                    tool_choice,
                    parallel_tool_calls,
                    max_tokens,
                    (temperature, top_p),
                    stop,
                    response_format,
                )| {
                    LlmChatParams {
                        messages,
                        tools,
                        tool_choice,
                        parallel_tool_calls,
                        max_tokens,
                        temperature,
                        top_p,
                        stop,
                        response_format,
                        ..LlmChatParams::default()
                    }
                },
            )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1_000))]

        /// The body written in place says what the `Value` built before said, field for
        /// field, for any request, model family and stream setting.
        #[test]
        fn the_upstream_body_is_written_as_it_was_built(
            params in any_chat_params(),
            model in proptest::prop_oneof![proptest::strategy::Just("gpt-4o-mini"), proptest::strategy::Just("o3-mini")],
            stream in proptest::prelude::any::<bool>(),
        ) {
            let written: Value = serde_json::from_slice(&serde_json::to_vec(&request_body(&params, model, stream)).unwrap()).unwrap();
            let built: Value = serde_json::from_slice(&serde_json::to_vec(&request_body_as_value(&params, model, stream)).unwrap()).unwrap();
            proptest::prop_assert_eq!(written, built);
        }
    }

    #[test]
    fn completions_parse() {
        let parsed = parse_chat_completion(&json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": [weather_call()]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
        }))
        .unwrap();
        assert_eq!(parsed.message.content, None);
        assert_eq!(parsed.message.tool_calls, Some(vec![weather_call()]));
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 20, output_tokens: 5 }));
        assert_eq!(parsed.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(parsed.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
        assert!(parse_chat_completion(&json!({"choices": []})).is_err());
        let refusal =
            parse_chat_completion(&json!({"choices":[{"message":{"content":null,"refusal":"I can't"}}]}))
                .unwrap();
        assert_eq!(refusal.message.content.as_deref(), Some("I can't"));
        assert_eq!(refusal.usage, None);
    }

    #[test]
    fn streamed_chunks_assemble_with_fragmented_tool_calls() {
        let chunks = [
            json!({"id":"c1","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"Hel"}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"lo"}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"time","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":9}}),
        ];
        let mut assembler = ChunkAssembler::new();
        let deltas: Vec<Delta> = chunks.iter().flat_map(|c| assembler.push(c).unwrap()).collect();
        assert_eq!(deltas[0], Delta::Text("Hel".into()));
        assert_eq!(
            deltas[2],
            Delta::ToolCall {
                index: 0,
                id: Some("call_a".into()),
                name: Some("weather".into()),
                arguments: String::new()
            }
        );
        assert_eq!(deltas.len(), 6);
        assert!(assembler.finished());
        let parsed = assembler.finish();
        assert_eq!(parsed.message.content.as_deref(), Some("Hello"));
        assert_eq!(
            parsed.message.tool_calls,
            Some(vec![
                json!({"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}),
                json!({"id":"call_b","type":"function","function":{"name":"time","arguments":"{}"}}),
            ])
        );
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 30, output_tokens: 9 }));
        assert_eq!(parsed.model.as_deref(), Some("gpt-4o"));
        assert_eq!(parsed.id.as_deref(), Some("c1"));
    }

    #[test]
    fn stream_errors_and_groq_usage() {
        let mut assembler = ChunkAssembler::new();
        let err =
            assembler.push(&json!({"error":{"message":"overloaded","type":"server_error"}})).unwrap_err();
        assert_eq!(err.message.as_deref(), Some("overloaded"));
        let mut groq = ChunkAssembler::new();
        groq.push(&json!({"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}],"x_groq":{"usage":{"prompt_tokens":3,"completion_tokens":1}}})).unwrap();
        assert_eq!(groq.finish().usage, Some(TokenUsage { input_tokens: 3, output_tokens: 1 }));
    }

    #[test]
    fn sdk_requests_become_canonical() {
        let (params, stream) = chat_request_to_canonical(&json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":2}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
            ],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
            "tool_choice": "auto",
            "max_completion_tokens": 100,
            "temperature": 0,
            "stop": "END",
            "stream": true,
            "stream_options": {"include_usage": true},
            "n": 1,
            "user": "ignored",
        }))
        .unwrap();
        assert!(stream);
        assert_eq!(params.messages.len(), 4);
        assert_eq!(params.messages[0].role, ChatRole::System);
        assert_eq!(params.messages[1].content.as_deref(), Some("What is 2+2?"));
        assert_eq!(params.messages[2].tool_calls.as_ref().unwrap()[0]["id"], "c1");
        assert_eq!(params.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(params.max_tokens, Some(100));
        assert_eq!(params.temperature, Some(0.0));
        assert_eq!(params.stop, Some(vec!["END".to_owned()]));
        assert_eq!(params.tool_choice, Some(json!("auto")));
        assert_eq!(params.model.as_deref(), Some("gpt-4o-mini"));
        assert!(wants_usage_chunk(&json!({"stream_options": {"include_usage": true}})));
        assert!(!wants_usage_chunk(&json!({})));
    }

    #[test]
    fn bad_sdk_requests_are_explained() {
        for (body, needle) in [
            (json!([]), "JSON object"),
            (json!({"model": "m"}), "`messages` is required"),
            (json!({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
                "messages[0].content[0] is a image_url part",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "x"}]}),
                "messages[1] is a tool message without `tool_call_id`",
            ),
            (
                json!({"messages": [{"role": "user", "content": 7}]}),
                "messages[0].content must be a string, null or an array of parts",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "tool_calls": {}}]}),
                "messages[0].tool_calls must be an array",
            ),
            (json!({"messages": [], "tools": [{"type": "function"}]}), "tools[0]"),
            (json!({"messages": [], "n": 2}), "`n`"),
            (json!({"messages": [], "max_tokens": -1}), "max_tokens"),
            (json!({"messages": [], "temperature": "hot"}), "temperature"),
            (json!({"messages": [], "stop": [1]}), "stop"),
        ] {
            let err = chat_request_to_canonical(&body).unwrap_err().to_string();
            assert!(err.contains(needle), "{body}: {err}");
        }
    }

    /// A field's value: mostly one of `usual` (the types a completion has there), now
    /// and then any JSON type (its string is `text`) or left out (`None`).
    fn field(
        text: &'static str,
        usual: Vec<Option<Value>>,
    ) -> impl proptest::strategy::Strategy<Value = Option<Value>> {
        use proptest::prelude::*;
        let any = vec![
            None,
            Some(Value::Null),
            Some(json!(text)),
            Some(json!(7)),
            Some(json!(-3)),
            Some(json!(2.5)),
            Some(json!(true)),
            Some(json!([])),
            Some(json!({})),
        ];
        prop_oneof![6 => proptest::sample::select(usual), 1 => proptest::sample::select(any)]
    }

    fn text_field(text: &'static str) -> impl proptest::strategy::Strategy<Value = Option<Value>> {
        field(text, vec![None, Some(Value::Null), Some(json!(text))])
    }

    fn usage_field() -> impl proptest::strategy::Strategy<Value = Option<Value>> {
        field(
            "usage",
            vec![
                None,
                Some(Value::Null),
                Some(json!({"prompt_tokens": 12, "completion_tokens": 7})),
                Some(json!({"prompt_tokens": 12, "completion_tokens": null})),
                Some(json!({"prompt_tokens": 12})),
                Some(json!({"completion_tokens": 7})),
                Some(json!({"prompt_tokens": 1.5, "completion_tokens": 7})),
            ],
        )
    }

    fn object_of(fields: &[(&str, &Option<Value>)]) -> Value {
        Value::Object(
            fields.iter().filter_map(|(name, value)| Some(((*name).to_owned(), (*value).clone()?))).collect(),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// The typed reading of an upstream completion answers what the reading through
        /// a `Value` does, for every mix of field types, or leaves the body to it.
        #[test]
        fn a_completion_reads_the_same_typed_as_through_a_value(
            id in text_field("id"), model in text_field("model"), content in text_field("content"),
            refusal in text_field("refusal"), finish in text_field("stop"),
            tool_calls in field("calls", vec![None, Some(Value::Null), Some(json!([])), Some(json!([weather_call()])),
                Some(json!([{"function": {"name": "f", "arguments": {"x": 1}}}]))]),
            usage in usage_field(), groq in usage_field(),
            message_kind in 0..3u8, choices_kind in 0..4u8,
        ) {
            let message = match message_kind {
                0 => Some(object_of(&[("content", &content), ("refusal", &refusal), ("tool_calls", &tool_calls), ("role", &Some(json!("assistant")))])),
                1 => Some(Value::Null),
                _ => None,
            };
            let choice = object_of(&[("index", &Some(json!(0))), ("message", &message), ("finish_reason", &finish)]);
            let choices = match choices_kind {
                0 => Some(json!([choice])),
                1 => Some(json!([choice, {"index": 1, "message": 5}])),
                2 => Some(json!([])),
                _ => None,
            };
            let groq = groq.map(|usage| json!({ "usage": usage }));
            let body = object_of(&[("id", &id), ("model", &model), ("choices", &choices), ("usage", &usage), ("x_groq", &groq), ("object", &Some(json!("chat.completion")))]);
            let bytes = serde_json::to_vec(&body).unwrap();
            proptest::prop_assert_eq!(parse_chat_completion_bytes(&bytes), parse_chat_completion(&body));
        }
    }

    #[test]
    fn a_usual_completion_is_read_typed_and_a_body_that_is_not_json_is_refused() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}},
            "system_fingerprint": "fp",
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        let typed = serde_json::from_slice::<WireCompletion>(&bytes).ok().and_then(WireCompletion::parsed);
        assert_eq!(typed, Some(parse_chat_completion(&body).unwrap()));
        let err = parse_chat_completion_bytes(b"{\"choices\": [").unwrap_err();
        assert!(err.starts_with("not JSON ("), "{err}");
    }

    #[test]
    fn completion_and_chunks_for_the_sdk() {
        let result = result_with_tools();
        let completion = json!(canonical_to_chat_completion(&result, "chatcmpl-x", 1700000000));
        assert_eq!(
            completion,
            json!({
                "id": "chatcmpl-x", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o-mini-2024-07-18",
                "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": "Let me check.", "refusal": null, "tool_calls": [weather_call()]}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
                "system_fingerprint": null,
            })
        );
        // The completion parses back to the same result (what the provider would read).
        let parsed = parse_chat_completion(&completion).unwrap();
        assert_eq!(parsed.message, result.message);
        assert_eq!(parsed.usage, Some(result.usage));

        let chunks = canonical_to_chunks(&result, "chatcmpl-x", 1700000000);
        assert_eq!(chunks.len(), 5);
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == "chatcmpl-x"));
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[4]["choices"], json!([]));
        assert_eq!(chunks[4]["usage"]["total_tokens"], 19);
        // Reassembling the chunks gives the result back.
        let mut assembler = ChunkAssembler::new();
        for chunk in &chunks {
            assembler.push(chunk).unwrap();
        }
        let parsed = assembler.finish();
        assert_eq!(parsed.message, result.message);
        assert_eq!(parsed.usage, Some(result.usage));
        assert_eq!(parsed.finish_reason, result.finish_reason);
    }

    #[test]
    fn text_only_results_stream_without_tool_chunks_and_fill_missing_ids() {
        let mut result = result_with_tools();
        result.message.tool_calls = None;
        result.finish_reason = None;
        let chunks = canonical_to_chunks(&result, "i", 1);
        assert_eq!(chunks.len(), 4);
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Let me check.");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");

        result.message.tool_calls = Some(vec![json!({"function": {"name": "f", "arguments": {"x": 1}}})]);
        let completion = json!(canonical_to_chat_completion(&result, "i", 1));
        assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls");
        let call = &completion["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["id"], "call_0");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["arguments"], "{\"x\":1}");
    }
}
