//! Pure conversions between the Anthropic Messages wire format and Keel's canonical
//! (OpenAI-shaped) `LlmChatParams` / `LlmChatResult`, both ways: what the provider sends
//! upstream and reads back (JSON and the SSE event sequence), and what the kernel's
//! Anthropic-compatible endpoint reads from an agent and answers.
//!
//! The mapping: system messages ↔ `system`; assistant `tool_calls` ↔ `tool_use` blocks
//! (arguments JSON text ↔ `input` object); tool messages ↔ `tool_result` blocks in a user
//! turn; tools ↔ `{name, description, input_schema}`; finish reasons `stop` ↔ `end_turn`,
//! `length` ↔ `max_tokens`, `tool_calls` ↔ `tool_use`, `content_filter` ↔ `refusal`.

use std::collections::BTreeMap;

use keel_protocol::rpc::{AssistantMessage, ChatMessage, ChatRole, LlmChatParams, LlmChatResult, TokenUsage};
use serde_json::{Map, Value, json};

use crate::Delta;
use crate::error::{ErrorBody, Result};
use crate::openai::wire::Parsed;
use crate::pricing::DEFAULT_MAX_OUTPUT_TOKENS;

/// The API version every request declares.
pub const API_VERSION: &str = "2023-06-01";

use crate::fields::{self, invalid};

/// Anthropic's `stop_reason` in OpenAI's words.
pub fn finish_reason_from_stop_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" | "pause_turn" => "stop",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        other => other,
    }
    .to_owned()
}

/// OpenAI's finish reason in Anthropic's words.
pub fn stop_reason_from_finish_reason(result: &LlmChatResult) -> &'static str {
    let has_tools = result.message.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    match result.finish_reason.as_deref() {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        Some("content_filter") => "refusal",
        Some("stop") if !has_tools => "end_turn",
        _ if has_tools => "tool_use",
        _ => "end_turn",
    }
}

// ---------------------------------------------------------------------------------------
// Upstream: what the provider sends and reads.
// ---------------------------------------------------------------------------------------

/// A tool call's arguments (JSON text, or already an object) as a `tool_use` input.
fn input_of(arguments: Option<&Value>, at: &str) -> Result<Value> {
    let value = match arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(text)) if text.trim().is_empty() => json!({}),
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| invalid(format!("{at}.function.arguments is not valid JSON ({e})")))?,
        Some(other) => other.clone(),
    };
    if !value.is_object() {
        return Err(invalid(format!("{at}.function.arguments must be a JSON object")));
    }
    Ok(value)
}

struct Turns(Vec<(&'static str, Vec<Value>)>);

impl Turns {
    /// Appends a block, merging into the previous turn when the role is the same (the API
    /// wants user and assistant turns to alternate).
    fn push(&mut self, role: &'static str, block: Value) {
        match self.0.last_mut() {
            Some((last, blocks)) if *last == role => blocks.push(block),
            _ => self.0.push((role, vec![block])),
        }
    }
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// OpenAI's `tool_choice` as Anthropic's, with `parallel_tool_calls: false` folded in.
fn tool_choice_upstream(choice: Option<&Value>, parallel: Option<bool>) -> Option<Value> {
    let mut mapped = match choice {
        Some(Value::String(s)) if s == "auto" => Some(json!({ "type": "auto" })),
        Some(Value::String(s)) if s == "required" => Some(json!({ "type": "any" })),
        Some(Value::String(s)) if s == "none" => Some(json!({ "type": "none" })),
        Some(object) => object
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|name| json!({ "type": "tool", "name": name })),
        None => None,
    };
    if parallel == Some(false) {
        let choice = mapped.get_or_insert_with(|| json!({ "type": "auto" }));
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
    }
    mapped
}

/// The request body for `POST {base_url}/v1/messages`. `max_tokens` is required there:
/// the request's, else [`DEFAULT_MAX_OUTPUT_TOKENS`].
pub fn request_body(params: &LlmChatParams, model: &str, stream: bool) -> Result<Value> {
    let mut system = Vec::new();
    let mut turns = Turns(Vec::new());
    for (i, message) in params.messages.iter().enumerate() {
        let text = message.content.as_deref().filter(|t| !t.is_empty());
        match message.role {
            ChatRole::System => system.extend(text),
            ChatRole::User => {
                // Anthropic refuses empty text blocks; an empty user message says nothing.
                if let Some(text) = text {
                    turns.push("user", text_block(text));
                }
            }
            ChatRole::Assistant => {
                if let Some(text) = text {
                    turns.push("assistant", text_block(text));
                }
                for (j, call) in message.tool_calls.iter().flatten().enumerate() {
                    let at = format!("messages[{i}].tool_calls[{j}]");
                    let function = call.get("function");
                    let name =
                        function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default();
                    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
                    if name.is_empty() || id.is_empty() {
                        return Err(invalid(format!("{at} needs an `id` and a `function.name`")));
                    }
                    let input = input_of(function.and_then(|f| f.get("arguments")), &at)?;
                    turns.push(
                        "assistant",
                        json!({ "type": "tool_use", "id": id, "name": name, "input": input }),
                    );
                }
            }
            ChatRole::Tool => {
                let id = message.tool_call_id.as_deref().ok_or_else(|| {
                    invalid(format!("messages[{i}] is a tool message without `tool_call_id`"))
                })?;
                let mut block = json!({ "type": "tool_result", "tool_use_id": id });
                if let Some(text) = text {
                    block["content"] = json!(text);
                }
                turns.push("user", block);
            }
        }
    }
    let messages: Vec<Value> =
        turns.0.into_iter().map(|(role, content)| json!({ "role": role, "content": content })).collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(params.max_tokens.map_or(DEFAULT_MAX_OUTPUT_TOKENS, u64::from)));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = params.tools.as_ref().filter(|t| !t.is_empty()) {
        let tools = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                let function = tool.get("function").unwrap_or(tool);
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("tools[{i}] has no function name")))?;
                let mut out = json!({
                    "name": name,
                    "input_schema": function.get("parameters").filter(|p| p.is_object()).cloned()
                        .unwrap_or_else(|| json!({ "type": "object", "properties": {} })),
                });
                if let Some(description) = function.get("description").and_then(Value::as_str) {
                    out["description"] = json!(description);
                }
                Ok(out)
            })
            .collect::<Result<Vec<_>>>()?;
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice_upstream(params.tool_choice.as_ref(), params.parallel_tool_calls) {
            body.insert("tool_choice".into(), choice);
        }
    }
    for (key, value) in [
        ("temperature", params.temperature.map(Value::from)),
        ("top_p", params.top_p.map(Value::from)),
        ("stop_sequences", params.stop.as_ref().filter(|s| !s.is_empty()).map(|s| json!(s))),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), value);
        }
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

fn tool_call(id: &str, name: &str, arguments: String) -> Value {
    json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } })
}

/// Input tokens, counting prompt-cache reads and writes (they are input too).
fn input_tokens_of(usage: &Value) -> Option<u64> {
    let base = usage.get("input_tokens").and_then(Value::as_u64)?;
    let cached = ["cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|key| usage.get(*key).and_then(Value::as_u64))
        .sum::<u64>();
    Some(base + cached)
}

/// Reads a non-streamed `message`.
pub fn parse_message(value: &Value) -> std::result::Result<Parsed, String> {
    let blocks =
        value.get("content").and_then(Value::as_array).ok_or_else(|| "no `content` array".to_owned())?;
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text
                .get_or_insert_with(String::new)
                .push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(tool_call(
                block.get("id").and_then(Value::as_str).unwrap_or_default(),
                block.get("name").and_then(Value::as_str).unwrap_or_default(),
                block.get("input").map_or_else(|| "{}".to_owned(), Value::to_string),
            )),
            _ => {} // thinking and server-tool blocks have no canonical form
        }
    }
    let usage = value.get("usage").and_then(|usage| {
        Some(TokenUsage {
            input_tokens: input_tokens_of(usage)?,
            output_tokens: usage.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
        })
    });
    Ok(Parsed {
        message: AssistantMessage {
            role: ChatRole::Assistant,
            content: text,
            tool_calls: (!calls.is_empty()).then_some(calls),
            reasoning: None,
        },
        usage,
        model: value.get("model").and_then(Value::as_str).map(str::to_owned),
        finish_reason: value.get("stop_reason").and_then(Value::as_str).map(finish_reason_from_stop_reason),
        id: value.get("id").and_then(Value::as_str).map(str::to_owned),
    })
}

#[derive(Debug)]
enum Block {
    Text,
    Tool { ordinal: u32, id: String, name: String, json: String, start_input: Option<Value> },
    Other,
}

/// Assembles a streamed message from its events (`message_start`, `content_block_*`,
/// `message_delta`, `message_stop`, `ping`, `error`), yielding the deltas to forward.
#[derive(Debug, Default)]
pub struct EventAssembler {
    blocks: BTreeMap<u64, Block>,
    text: Option<String>,
    tools: u32,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    stop_reason: Option<String>,
    model: Option<String>,
    id: Option<String>,
    stopped: bool,
}

impl EventAssembler {
    pub fn new() -> EventAssembler {
        EventAssembler::default()
    }

    /// Takes one event's JSON (its `type` names the event). An `error` event comes back as
    /// `Err`.
    pub fn push(&mut self, data: &Value) -> std::result::Result<Vec<Delta>, ErrorBody> {
        let mut deltas = Vec::new();
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match data.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => {
                let message = &data["message"];
                self.id = message.get("id").and_then(Value::as_str).map(str::to_owned);
                self.model = message.get("model").and_then(Value::as_str).map(str::to_owned);
                if let Some(usage) = message.get("usage") {
                    self.input_tokens = input_tokens_of(usage).or(self.input_tokens);
                    self.output_tokens =
                        usage.get("output_tokens").and_then(Value::as_u64).or(self.output_tokens);
                }
            }
            "content_block_start" => {
                let block = &data["content_block"];
                let started = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(text) =
                            block.get("text").and_then(Value::as_str).filter(|t| !t.is_empty())
                        {
                            self.text.get_or_insert_with(String::new).push_str(text);
                            deltas.push(Delta::Text(text.to_owned()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let ordinal = self.tools;
                        self.tools += 1;
                        let id = block.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                        let name = block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                        deltas.push(Delta::ToolCall {
                            index: ordinal,
                            id: Some(id.clone()),
                            name: Some(name.clone()),
                            arguments: String::new(),
                        });
                        let start_input = block
                            .get("input")
                            .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()))
                            .cloned();
                        Block::Tool { ordinal, id, name, json: String::new(), start_input }
                    }
                    _ => Block::Other,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                match (delta.get("type").and_then(Value::as_str), self.blocks.get_mut(&index)) {
                    (Some("text_delta"), _) => {
                        if let Some(text) =
                            delta.get("text").and_then(Value::as_str).filter(|t| !t.is_empty())
                        {
                            self.text.get_or_insert_with(String::new).push_str(text);
                            deltas.push(Delta::Text(text.to_owned()));
                        }
                    }
                    (Some("input_json_delta"), Some(Block::Tool { ordinal, json, .. })) => {
                        let part = delta.get("partial_json").and_then(Value::as_str).unwrap_or_default();
                        json.push_str(part);
                        if !part.is_empty() {
                            deltas.push(Delta::ToolCall {
                                index: *ordinal,
                                id: None,
                                name: None,
                                arguments: part.to_owned(),
                            });
                        }
                    }
                    _ => {} // thinking, signatures, citations
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = data.get("usage") {
                    self.output_tokens =
                        usage.get("output_tokens").and_then(Value::as_u64).or(self.output_tokens);
                    self.input_tokens = input_tokens_of(usage).or(self.input_tokens);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(ErrorBody::from_value(data)),
            _ => {} // ping, content_block_stop, and events added later
        }
        Ok(deltas)
    }

    /// Whether `message_stop` arrived.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    pub fn finish(self) -> Parsed {
        let mut tools: Vec<(u32, Value)> = self
            .blocks
            .into_values()
            .filter_map(|block| match block {
                Block::Tool { ordinal, id, name, json, start_input } => {
                    let arguments = if !json.trim().is_empty() {
                        json
                    } else {
                        start_input.map_or_else(|| "{}".to_owned(), |v| v.to_string())
                    };
                    Some((ordinal, tool_call(&id, &name, arguments)))
                }
                Block::Text | Block::Other => None,
            })
            .collect();
        tools.sort_by_key(|(ordinal, _)| *ordinal);
        let calls: Vec<Value> = tools.into_iter().map(|(_, call)| call).collect();
        let usage = self
            .input_tokens
            .map(|input_tokens| TokenUsage { input_tokens, output_tokens: self.output_tokens.unwrap_or(0) });
        Parsed {
            message: AssistantMessage {
                role: ChatRole::Assistant,
                content: self.text,
                tool_calls: (!calls.is_empty()).then_some(calls),
                reasoning: None,
            },
            usage,
            model: self.model,
            finish_reason: self.stop_reason.as_deref().map(finish_reason_from_stop_reason),
            id: self.id,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The kernel's Anthropic-compatible endpoint: what an agent's SDK sends and gets back.
// ---------------------------------------------------------------------------------------

/// Text of an Anthropic `content` (a string, or text blocks joined by newlines).
fn blocks_text(content: &Value, at: &str) -> Result<String> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, block) in blocks.iter().enumerate() {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(block.get("text").and_then(Value::as_str).unwrap_or_default()),
                    kind => {
                        return Err(invalid(format!(
                            "{at}[{i}] is a {} block where only text is supported",
                            kind.unwrap_or("untyped")
                        )));
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(invalid(format!("{at} must be a string or an array of content blocks"))),
    }
}

/// Reads a `POST /v1/messages` body into the canonical request and whether the client
/// asked for a stream.
pub fn messages_request_to_canonical(body: &Value) -> Result<(LlmChatParams, bool)> {
    let object = body.as_object().ok_or_else(|| invalid("the body must be a JSON object"))?;
    let mut messages = Vec::new();
    let message = |role, content: Option<String>| ChatMessage {
        role,
        content,
        tool_calls: None,
        tool_call_id: None,
        name: None,
        reasoning: None,
    };
    if let Some(system) = object.get("system").filter(|s| !s.is_null()) {
        let text = blocks_text(system, "system")?;
        if !text.is_empty() {
            messages.push(message(ChatRole::System, Some(text)));
        }
    }
    let raw_messages = object
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("`messages` is required and must be an array"))?;
    for (i, raw) in raw_messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let content = raw.get("content").unwrap_or(&Value::Null);
        match raw.get("role").and_then(Value::as_str) {
            Some("user") => {
                let Value::Array(blocks) = content else {
                    messages
                        .push(message(ChatRole::User, Some(blocks_text(content, &format!("{at}.content"))?)));
                    continue;
                };
                // Tool results first (they answer the previous assistant turn), then the text.
                let mut texts = Vec::new();
                for (j, block) in blocks.iter().enumerate() {
                    let block_at = format!("{at}.content[{j}]");
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => texts
                            .push(block.get("text").and_then(Value::as_str).unwrap_or_default().to_owned()),
                        Some("tool_result") => {
                            let id = block
                                .get("tool_use_id")
                                .and_then(Value::as_str)
                                .ok_or_else(|| invalid(format!("{block_at} has no `tool_use_id`")))?;
                            let mut text = blocks_text(
                                block.get("content").unwrap_or(&Value::Null),
                                &format!("{block_at}.content"),
                            )?;
                            if block.get("is_error").and_then(Value::as_bool) == Some(true) && text.is_empty()
                            {
                                text = "error".to_owned();
                            }
                            messages.push(ChatMessage {
                                role: ChatRole::Tool,
                                content: Some(text),
                                tool_calls: None,
                                tool_call_id: Some(id.to_owned()),
                                name: None,
                                reasoning: None,
                            });
                        }
                        kind => {
                            return Err(invalid(format!(
                                "{block_at} is a {} block; Keel's gateway passes text, tool_use and tool_result only",
                                kind.unwrap_or("untyped")
                            )));
                        }
                    }
                }
                if !texts.is_empty() {
                    messages.push(message(ChatRole::User, Some(texts.join("\n"))));
                }
            }
            Some("assistant") => {
                let Value::Array(blocks) = content else {
                    messages.push(message(
                        ChatRole::Assistant,
                        Some(blocks_text(content, &format!("{at}.content"))?),
                    ));
                    continue;
                };
                let mut text: Option<String> = None;
                let mut calls = Vec::new();
                for (j, block) in blocks.iter().enumerate() {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => text
                            .get_or_insert_with(String::new)
                            .push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
                        Some("tool_use") => {
                            let field = |key: &str| {
                                block
                                    .get(key)
                                    .and_then(Value::as_str)
                                    .ok_or_else(|| invalid(format!("{at}.content[{j}] has no `{key}`")))
                            };
                            calls.push(tool_call(
                                field("id")?,
                                field("name")?,
                                block.get("input").map_or_else(|| "{}".to_owned(), Value::to_string),
                            ));
                        }
                        Some("thinking" | "redacted_thinking") => {}
                        kind => {
                            return Err(invalid(format!(
                                "{at}.content[{j}] is a {} block; Keel's gateway passes text and tool_use only",
                                kind.unwrap_or("untyped")
                            )));
                        }
                    }
                }
                messages.push(ChatMessage {
                    role: ChatRole::Assistant,
                    content: text,
                    tool_calls: (!calls.is_empty()).then_some(calls),
                    tool_call_id: None,
                    name: None,
                    reasoning: None,
                });
            }
            other => return Err(invalid(format!("{at}.role is {other:?}; expected user or assistant"))),
        }
    }
    let tools = match object.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(
            tools
                .iter()
                .enumerate()
                .map(|(i, tool)| {
                    if tool.get("type").and_then(Value::as_str).is_some_and(|t| t != "custom") {
                        return Err(invalid(format!(
                            "tools[{i}] is a server tool ({}); Keel's gateway passes client tools only",
                            tool["type"]
                        )));
                    }
                    let name = tool.get("name").and_then(Value::as_str).ok_or_else(|| invalid(format!("tools[{i}] has no `name`")))?;
                    let mut function = json!({
                        "name": name,
                        "parameters": tool.get("input_schema").cloned().unwrap_or_else(|| json!({ "type": "object", "properties": {} })),
                    });
                    if let Some(description) = tool.get("description").and_then(Value::as_str) {
                        function["description"] = json!(description);
                    }
                    Ok(json!({ "type": "function", "function": function }))
                })
                .collect::<Result<Vec<_>>>()?,
        )
        .filter(|t| !t.is_empty()),
        Some(_) => return Err(invalid("`tools` must be an array")),
    };
    let choice = object.get("tool_choice").filter(|c| c.is_object());
    let tool_choice = choice.and_then(|c| match c.get("type").and_then(Value::as_str) {
        Some("auto") => Some(json!("auto")),
        Some("any") => Some(json!("required")),
        Some("none") => Some(json!("none")),
        Some("tool") => c.get("name").map(|name| json!({ "type": "function", "function": { "name": name } })),
        _ => None,
    });
    let parallel_tool_calls = choice
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        .filter(|disable| *disable)
        .map(|_| false);
    let max_tokens = fields::max_tokens(object, &["max_tokens"])?;
    let stop = fields::stop_sequences(object, "stop_sequences", false)?.filter(|s| !s.is_empty());
    let params = LlmChatParams {
        messages,
        model: fields::model(object),
        tools,
        max_tokens,
        temperature: fields::number(object, "temperature")?,
        tool_choice,
        stop,
        top_p: fields::number(object, "top_p")?,
        response_format: None,
        parallel_tool_calls,
    };
    Ok((params, object.get("stream").and_then(Value::as_bool).unwrap_or(false)))
}

/// The content blocks of a result: its text (if any), then one `tool_use` per call.
fn content_blocks(result: &LlmChatResult) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(text) = result.message.content.as_deref().filter(|t| !t.is_empty()) {
        blocks.push(text_block(text));
    }
    for (index, call) in result.message.tool_calls.iter().flatten().enumerate() {
        let function = call.get("function");
        let input = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(text)) if text.trim().is_empty() => json!({}),
            Some(Value::String(text)) => serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({ "_unparsed_arguments": text })),
            Some(object @ Value::Object(_)) => object.clone(),
            _ => json!({}),
        };
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("toolu_{index}"), str::to_owned);
        blocks.push(json!({
            "type": "tool_use",
            "id": id,
            "name": function.and_then(|f| f.get("name")).cloned().unwrap_or(json!("")),
            "input": input,
        }));
    }
    blocks
}

/// The `message` object answering a non-streamed request.
pub fn canonical_to_messages_response(result: &LlmChatResult, id: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": result.model,
        "content": content_blocks(result),
        "stop_reason": stop_reason_from_finish_reason(result),
        "stop_sequence": null,
        "usage": { "input_tokens": result.usage.input_tokens, "output_tokens": result.usage.output_tokens },
    })
}

/// The server-sent events of a whole result as `(event name, data)`, in the order the
/// Messages API sends them: `message_start`, then per content block (text first, then each
/// tool_use) `content_block_start` / `content_block_delta` / `content_block_stop`, then
/// `message_delta` (stop reason and output tokens) and `message_stop`.
pub fn canonical_to_messages_stream_events(result: &LlmChatResult, id: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut push = |data: Value| {
        let name = data["type"].as_str().unwrap_or_default().to_owned();
        events.push((name, data));
    };
    push(json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": result.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": result.usage.input_tokens, "output_tokens": 0 },
        },
    }));
    for (index, block) in content_blocks(result).into_iter().enumerate() {
        let (start, delta) = if block["type"] == "text" {
            (text_block(""), json!({ "type": "text_delta", "text": block["text"] }))
        } else {
            let mut start = block.clone();
            start["input"] = json!({});
            (start, json!({ "type": "input_json_delta", "partial_json": block["input"].to_string() }))
        };
        push(json!({ "type": "content_block_start", "index": index, "content_block": start }));
        push(json!({ "type": "content_block_delta", "index": index, "delta": delta }));
        push(json!({ "type": "content_block_stop", "index": index }));
    }
    push(json!({
        "type": "message_delta",
        "delta": { "stop_reason": stop_reason_from_finish_reason(result), "stop_sequence": null },
        "usage": { "output_tokens": result.usage.output_tokens },
    }));
    push(json!({ "type": "message_stop" }));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: ChatRole, content: Option<&str>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.map(str::to_owned),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning: None,
        }
    }

    fn weather_call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}})
    }

    fn tool_conversation() -> LlmChatParams {
        LlmChatParams {
            messages: vec![
                msg(ChatRole::System, Some("be brief")),
                msg(ChatRole::User, Some("weather in Paris and Rome?")),
                ChatMessage {
                    tool_calls: Some(vec![weather_call("toolu_1"), weather_call("toolu_2")]),
                    ..msg(ChatRole::Assistant, Some("Checking."))
                },
                ChatMessage { tool_call_id: Some("toolu_1".into()), ..msg(ChatRole::Tool, Some("sunny")) },
                ChatMessage { tool_call_id: Some("toolu_2".into()), ..msg(ChatRole::Tool, Some("")) },
                msg(ChatRole::User, Some("and tomorrow?")),
                msg(ChatRole::System, Some("answer in French")),
            ],
            tools: Some(vec![
                json!({"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
                json!({"type": "function", "function": {"name": "time"}}),
            ]),
            tool_choice: Some(json!({"type": "function", "function": {"name": "weather"}})),
            parallel_tool_calls: Some(false),
            stop: Some(vec!["END".into()]),
            temperature: Some(0.5),
            ..LlmChatParams::default()
        }
    }

    #[test]
    fn canonical_requests_become_messages_requests() {
        let body = request_body(&tool_conversation(), "claude-sonnet-4-5", true).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 4096,
                "system": "be brief\n\nanswer in French",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather in Paris and Rome?"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Paris"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "tool_result", "tool_use_id": "toolu_2"},
                        {"type": "text", "text": "and tomorrow?"},
                    ]},
                ],
                "tools": [
                    {"name": "weather", "description": "Weather now", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                    {"name": "time", "input_schema": {"type": "object", "properties": {}}},
                ],
                "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": true},
                "temperature": 0.5,
                "stop_sequences": ["END"],
                "stream": true,
            })
        );
    }

    #[test]
    fn tool_choices_map() {
        for (choice, expected) in [
            (json!("auto"), json!({"type": "auto"})),
            (json!("required"), json!({"type": "any"})),
            (json!("none"), json!({"type": "none"})),
        ] {
            assert_eq!(tool_choice_upstream(Some(&choice), None), Some(expected));
        }
        assert_eq!(
            tool_choice_upstream(None, Some(false)),
            Some(json!({"type": "auto", "disable_parallel_tool_use": true}))
        );
        assert_eq!(tool_choice_upstream(None, Some(true)), None);
        assert_eq!(tool_choice_upstream(Some(&json!("none")), Some(false)), Some(json!({"type": "none"})));
    }

    #[test]
    fn unsendable_requests_are_explained() {
        let mut bad_args = tool_conversation();
        bad_args.messages[2].tool_calls =
            Some(vec![json!({"id": "t", "function": {"name": "f", "arguments": "{not json"}})]);
        let err = request_body(&bad_args, "m", false).unwrap_err().to_string();
        assert!(err.contains("messages[2].tool_calls[0].function.arguments is not valid JSON"), "{err}");
        let mut no_id = tool_conversation();
        no_id.messages[3].tool_call_id = None;
        assert!(request_body(&no_id, "m", false).unwrap_err().to_string().contains("tool_call_id"));
        let mut array_args = tool_conversation();
        array_args.messages[2].tool_calls =
            Some(vec![json!({"id": "t", "function": {"name": "f", "arguments": "[1]"}})]);
        assert!(request_body(&array_args, "m", false).unwrap_err().to_string().contains("JSON object"));
    }

    fn sample_message() -> Value {
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 100, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 5, "output_tokens": 30},
        })
    }

    #[test]
    fn messages_parse_to_canonical() {
        let parsed = parse_message(&sample_message()).unwrap();
        assert_eq!(parsed.message.content.as_deref(), Some("Checking."));
        assert_eq!(parsed.message.tool_calls, Some(vec![weather_call("toolu_1")]));
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 125, output_tokens: 30 }));
        assert_eq!(parsed.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(parsed.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
        assert!(parse_message(&json!({"type": "message"})).is_err());
        for (stop, finish) in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
            ("new_reason", "new_reason"),
        ] {
            assert_eq!(finish_reason_from_stop_reason(stop), finish);
        }
    }

    /// The event sequence the real API sends for a text + tool_use answer.
    fn sample_events() -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5", "content": [], "stop_reason": null, "usage": {"input_tokens": 50, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Par"}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "is\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 42}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn stream_events_assemble() {
        let mut assembler = EventAssembler::new();
        let deltas: Vec<Delta> = sample_events().iter().flat_map(|e| assembler.push(e).unwrap()).collect();
        assert_eq!(
            deltas,
            vec![
                Delta::Text("Let me ".into()),
                Delta::Text("check.".into()),
                Delta::ToolCall {
                    index: 0,
                    id: Some("toolu_1".into()),
                    name: Some("weather".into()),
                    arguments: String::new()
                },
                Delta::ToolCall { index: 0, id: None, name: None, arguments: "{\"city\": \"Par".into() },
                Delta::ToolCall { index: 0, id: None, name: None, arguments: "is\"}".into() },
                Delta::ToolCall {
                    index: 1,
                    id: Some("toolu_2".into()),
                    name: Some("time".into()),
                    arguments: String::new()
                },
            ]
        );
        assert!(assembler.stopped());
        let parsed = assembler.finish();
        assert_eq!(parsed.message.content.as_deref(), Some("Let me check."));
        assert_eq!(
            parsed.message.tool_calls,
            Some(vec![
                json!({"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}),
                json!({"id": "toolu_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}),
            ])
        );
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 50, output_tokens: 42 }));
        assert_eq!(parsed.finish_reason.as_deref(), Some("tool_calls"));
        let mut failing = EventAssembler::new();
        let err = failing
            .push(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
            .unwrap_err();
        assert_eq!(err.kind.as_deref(), Some("overloaded_error"));
    }

    #[test]
    fn sdk_requests_become_canonical() {
        let (params, stream) = messages_request_to_canonical(&json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "..."},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "thanks"},
                ]},
            ],
            "tools": [{"name": "weather", "description": "Weather now", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"],
            "temperature": 1,
            "stream": true,
            "metadata": {"user_id": "ignored"},
        }))
        .unwrap();
        assert!(stream);
        let roles: Vec<ChatRole> = params.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [ChatRole::System, ChatRole::User, ChatRole::Assistant, ChatRole::Tool, ChatRole::User]
        );
        assert_eq!(params.messages[0].content.as_deref(), Some("be brief"));
        assert_eq!(params.messages[2].content.as_deref(), Some("Checking."));
        assert_eq!(params.messages[2].tool_calls, Some(vec![weather_call("toolu_1")]));
        assert_eq!(params.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(params.messages[3].content.as_deref(), Some("sunny"));
        assert_eq!(params.messages[4].content.as_deref(), Some("thanks"));
        assert_eq!(
            params.tools,
            Some(vec![
                json!({"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": {"type": "object"}}})
            ])
        );
        assert_eq!(params.tool_choice, Some(json!("required")));
        assert_eq!(params.parallel_tool_calls, Some(false));
        assert_eq!(params.max_tokens, Some(1024));
        assert_eq!(params.stop, Some(vec!["END".to_owned()]));
        assert_eq!(params.model.as_deref(), Some("claude-sonnet-4-5"));
        // And back upstream, the conversation is what the client sent.
        let upstream = request_body(&params, "claude-sonnet-4-5", false).unwrap();
        assert_eq!(upstream["system"], "be brief");
        assert_eq!(
            upstream["messages"][1]["content"][1],
            json!({"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}})
        );
        assert_eq!(
            upstream["messages"][2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(upstream["tool_choice"], json!({"type": "any", "disable_parallel_tool_use": true}));
    }

    #[test]
    fn bad_sdk_requests_are_explained() {
        for (body, needle) in [
            (json!("x"), "JSON object"),
            (json!({"max_tokens": 5}), "`messages` is required"),
            (json!({"messages": [{"role": "system", "content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "image block",
            ),
            (json!({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}), "tool_use_id"),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]}),
                "`id`",
            ),
            (
                json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "server tool",
            ),
            (json!({"messages": [], "max_tokens": "lots"}), "max_tokens"),
            (json!({"messages": [], "stop_sequences": "END"}), "stop_sequences"),
        ] {
            let err = messages_request_to_canonical(&body).unwrap_err().to_string();
            assert!(err.contains(needle), "{body}: {err}");
        }
    }

    fn tool_result() -> LlmChatResult {
        LlmChatResult {
            message: AssistantMessage {
                role: ChatRole::Assistant,
                content: Some("Checking.".into()),
                tool_calls: Some(vec![weather_call("toolu_1")]),
                reasoning: None,
            },
            usage: TokenUsage { input_tokens: 10, output_tokens: 20 },
            cost_usd: 0.001,
            model: "claude-haiku-4-5".into(),
            finish_reason: Some("tool_calls".into()),
        }
    }

    #[test]
    fn responses_for_the_sdk_round_trip() {
        let result = tool_result();
        let response = canonical_to_messages_response(&result, "msg_x");
        assert_eq!(
            response,
            json!({
                "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 10, "output_tokens": 20},
            })
        );
        let parsed = parse_message(&response).unwrap();
        assert_eq!(parsed.message, result.message);
        assert_eq!(parsed.usage, Some(result.usage));
        assert_eq!(parsed.finish_reason, result.finish_reason);
    }

    #[test]
    fn stream_events_for_the_sdk_round_trip() {
        let result = tool_result();
        let events = canonical_to_messages_stream_events(&result, "msg_x");
        let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], name.as_str(), "the event name is the data's type");
        }
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 10);
        assert_eq!(
            events[4].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}})
        );
        assert_eq!(
            events[5].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
        );
        assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[7].1["usage"]["output_tokens"], 20);
        let mut assembler = EventAssembler::new();
        for (_, data) in &events {
            assembler.push(data).unwrap();
        }
        let parsed = assembler.finish();
        assert_eq!(parsed.message, result.message);
        assert_eq!(parsed.usage, Some(result.usage));
        assert_eq!(parsed.finish_reason, result.finish_reason);
    }

    #[test]
    fn stop_reasons_and_odd_tool_calls_for_the_sdk() {
        let mut result = tool_result();
        result.message.tool_calls = None;
        for (finish, stop) in [
            (Some("stop"), "end_turn"),
            (Some("length"), "max_tokens"),
            (Some("content_filter"), "refusal"),
            (None, "end_turn"),
        ] {
            result.finish_reason = finish.map(str::to_owned);
            assert_eq!(stop_reason_from_finish_reason(&result), stop);
        }
        result.message.content = None;
        result.message.tool_calls = Some(vec![json!({"function": {"name": "f", "arguments": "oops"}})]);
        result.finish_reason = None;
        let response = canonical_to_messages_response(&result, "m");
        assert_eq!(response["stop_reason"], "tool_use");
        assert_eq!(
            response["content"],
            json!([{"type": "tool_use", "id": "toolu_0", "name": "f", "input": {"_unparsed_arguments": "oops"}}])
        );
        let events = canonical_to_messages_stream_events(&result, "m");
        assert_eq!(events.len(), 6, "no text block when there is no text");
    }
}
