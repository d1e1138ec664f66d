//! The OpenAI Responses API as the kernel's gateway serves it (`POST /v1/responses`):
//! pure conversions between what an agent's SDK sends and gets back and Keel's canonical
//! `LlmChatParams` / `LlmChatResult`, so a Responses request is served by any provider
//! (OpenAI chat, Anthropic, scripted) and journaled like every other LLM call.
//!
//! A request is read in two steps: [`parse_request`] checks the body and normalizes its
//! `input` into a list of items; [`conversation`] turns the items of earlier responses
//! (what `previous_response_id` names, which the kernel keeps) and this request's items
//! into canonical messages, checking that every `function_call_output` answers a call.
//! [`response_object`] renders a result as the Responses object; the streamed event
//! sequence is [`ResponseStream`](super::responses_stream::ResponseStream)'s.
//!
//! What the chat shape cannot express is refused with the field named (built-in tools
//! such as `web_search`, image and file inputs, background responses, stored prompts and
//! conversations), except `reasoning` items, which ride along on the assistant message
//! they precede so a Responses upstream gets them back unchanged. An `item_reference` to
//! an output item of a kept response is resolved by the gateway ([`response_of_item`]
//! says which response holds it) before [`conversation`] sees the input.

use keel_protocol::rpc::{ChatMessage, ChatRole, LlmChatParams, LlmChatResult};
use serde_json::{Map, Value, json};

/// A request the gateway refuses: the field (`input[2].call_id`, OpenAI's `param`) and
/// what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub param: Option<String>,
    pub message: String,
}

impl RequestError {
    fn new(param: impl Into<String>, message: impl Into<String>) -> RequestError {
        RequestError { param: Some(param.into()), message: message.into() }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

type Checked<T> = std::result::Result<T, RequestError>;

/// A checked `POST /v1/responses` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// This request's input as items (a string input becomes one user message item).
    pub input: Vec<Value>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub stream: bool,
    /// `false` asks the kernel not to keep the response (it cannot be continued or read).
    pub store: bool,
    /// The canonical parameters other than the messages (`tools` already in chat shape).
    pub params: LlmChatParams,
    /// The request fields the response object repeats (`tools` as sent, `tool_choice`,
    /// `metadata`, `text`, `reasoning`...).
    pub echo: Map<String, Value>,
}

/// Fields the Responses API has that a canonical call cannot honour, with what to do.
const REFUSED_FIELDS: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported by the Keel gateway; make the call in the foreground",
    ),
    (
        "conversation",
        "conversations are not supported by the Keel gateway; continue with `previous_response_id`",
    ),
    (
        "prompt",
        "stored prompt templates are not supported by the Keel gateway; send `instructions` and `input`",
    ),
];

/// Reads a `POST /v1/responses` body.
pub fn parse_request(body: &Value) -> Checked<ResponsesRequest> {
    let object = body
        .as_object()
        .ok_or_else(|| RequestError { param: None, message: "the body must be a JSON object".into() })?;
    for (field, why) in REFUSED_FIELDS {
        match object.get(*field) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => return Err(RequestError::new(*field, *why)),
        }
    }
    let input = match object.get("input") {
        None | Some(Value::Null) => {
            return Err(RequestError::new("input", "`input` is required: a string or an array of items"));
        }
        Some(Value::String(text)) => vec![json!({ "type": "message", "role": "user", "content": text })],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| normalize_item(item, &format!("input[{i}]")))
            .collect::<Checked<_>>()?,
        Some(_) => return Err(RequestError::new("input", "`input` must be a string or an array of items")),
    };
    let string = |key: &str| -> Checked<Option<String>> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(RequestError::new(key, format!("`{key}` must be a string"))),
        }
    };
    let boolean = |key: &str, default: bool| -> Checked<bool> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RequestError::new(key, format!("`{key}` must be true or false"))),
        }
    };
    // The readers both dialects share, with the field named as OpenAI's `param`.
    let number = |key: &str| -> Checked<Option<f64>> {
        crate::fields::number(object, key).map_err(|err| match err {
            crate::Error::InvalidRequest(message) => RequestError::new(key, message),
            other => RequestError::new(key, other.to_string()),
        })
    };
    let instructions = match object.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err(RequestError::new("instructions", "`instructions` must be a string")),
    };
    let max_tokens = match object.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(value) => {
            Some(value.as_u64().filter(|n| *n > 0).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                RequestError::new("max_output_tokens", "`max_output_tokens` must be a positive integer")
            })?)
        }
    };
    let tools = tools(object.get("tools"))?;
    let tool_choice = tool_choice(object.get("tool_choice"))?;
    let response_format = text_format(object.get("text"))?;
    if let Some(metadata) = object.get("metadata").filter(|m| !m.is_null()) {
        let fine = metadata.as_object().is_some_and(|m| m.values().all(Value::is_string));
        if !fine {
            return Err(RequestError::new("metadata", "`metadata` must be an object of string values"));
        }
    }
    let params = LlmChatParams {
        messages: Vec::new(),
        model: crate::fields::model(object),
        tools,
        max_tokens,
        temperature: number("temperature")?,
        tool_choice,
        stop: None,
        top_p: number("top_p")?,
        response_format,
        parallel_tool_calls: match object.get("parallel_tool_calls") {
            None | Some(Value::Null) => None,
            Some(_) => Some(boolean("parallel_tool_calls", true)?),
        },
    };
    let mut echo = Map::new();
    for key in [
        "tools",
        "tool_choice",
        "metadata",
        "text",
        "reasoning",
        "truncation",
        "user",
        "temperature",
        "top_p",
        "max_output_tokens",
        "parallel_tool_calls",
        "instructions",
    ] {
        if let Some(value) = object.get(key).filter(|v| !v.is_null()) {
            echo.insert(key.to_owned(), value.clone());
        }
    }
    Ok(ResponsesRequest {
        input,
        instructions,
        previous_response_id: string("previous_response_id")?,
        stream: boolean("stream", false)?,
        store: boolean("store", true)?,
        params,
        echo,
    })
}

/// One input item, checked, in its explicit form (a message item always has `type`).
fn normalize_item(item: &Value, at: &str) -> Checked<Value> {
    let object = item.as_object().ok_or_else(|| RequestError::new(at, format!("{at} must be an object")))?;
    let kind = match object.get("type") {
        None if object.contains_key("role") => "message",
        None => return Err(RequestError::new(format!("{at}.type"), format!("{at} has no `type`"))),
        Some(kind) => kind
            .as_str()
            .ok_or_else(|| RequestError::new(format!("{at}.type"), format!("{at}.type must be a string")))?,
    };
    let text_field = |key: &str| -> Checked<&str> {
        object.get(key).and_then(Value::as_str).ok_or_else(|| {
            RequestError::new(
                format!("{at}.{key}"),
                format!("{at} is a {kind} item without a string `{key}`"),
            )
        })
    };
    match kind {
        "message" => {
            let role = object.get("role").and_then(Value::as_str).unwrap_or("");
            if !["user", "system", "developer", "assistant"].contains(&role) {
                return Err(RequestError::new(
                    format!("{at}.role"),
                    format!("{at}.role is {role:?}; expected user, system, developer or assistant"),
                ));
            }
            let text = message_text(object.get("content"), role, at)?;
            Ok(json!({ "type": "message", "role": role, "content": text }))
        }
        "function_call" => {
            text_field("call_id")?;
            text_field("name")?;
            let arguments = text_field("arguments")?;
            let mut normalized = item.clone();
            normalized["arguments"] = json!(arguments);
            Ok(normalized)
        }
        "function_call_output" => {
            let call_id = text_field("call_id")?;
            let output = match object.get("output") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => parts_text(parts, &format!("{at}.output"))?,
                _ => {
                    return Err(RequestError::new(
                        format!("{at}.output"),
                        format!("{at}.output must be a string or an array of text parts"),
                    ));
                }
            };
            Ok(json!({ "type": "function_call_output", "call_id": call_id, "output": output }))
        }
        "reasoning" => Ok(item.clone()),
        // Resolved by the gateway from the responses the kernel keeps (see
        // `response_of_item`) before the conversation is built.
        "item_reference" => {
            let id = text_field("id")?;
            Ok(json!({ "type": "item_reference", "id": id }))
        }
        other => Err(RequestError::new(
            format!("{at}.type"),
            format!(
                "{at} is a {other:?} item; the Keel gateway serves message, function_call, function_call_output and reasoning items (built-in tools such as web_search, file_search and computer use are not available: define a function tool instead)"
            ),
        )),
    }
}

/// The text of a message's `content`: a string, or text parts (`input_text` from the
/// caller, `output_text` and `refusal` on an assistant message), joined.
fn message_text(content: Option<&Value>, role: &str, at: &str) -> Checked<String> {
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts_text(parts, &format!("{at}.content")),
        None | Some(Value::Null) if role == "assistant" => Ok(String::new()),
        _ => Err(RequestError::new(
            format!("{at}.content"),
            format!("{at}.content must be a string or an array of content parts"),
        )),
    }
}

fn parts_text(parts: &[Value], at: &str) -> Checked<String> {
    let mut text = String::new();
    for (i, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("untyped");
        let piece = match kind {
            "input_text" | "output_text" | "text" => part.get("text").and_then(Value::as_str),
            "refusal" => part.get("refusal").and_then(Value::as_str),
            _ => {
                return Err(RequestError::new(
                    format!("{at}[{i}].type"),
                    format!(
                        "{at}[{i}] is a {kind} part; the Keel gateway passes text only (image, file and audio inputs are not supported)"
                    ),
                ));
            }
        };
        let piece = piece.ok_or_else(|| {
            RequestError::new(format!("{at}[{i}]"), format!("{at}[{i}] is a {kind} part without its text"))
        })?;
        text.push_str(piece);
    }
    Ok(text)
}

/// Responses function tools (`{"type":"function","name",...}`) in the chat shape
/// (`{"type":"function","function":{"name",...}}`).
fn tools(tools: Option<&Value>) -> Checked<Option<Vec<Value>>> {
    let tools = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(RequestError::new("tools", "`tools` must be an array")),
    };
    let mut converted = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("untyped");
        if kind != "function" {
            return Err(RequestError::new(
                format!("{at}.type"),
                format!(
                    "{at} is a {kind:?} tool; the Keel gateway serves function tools only (built-in tools such as web_search, file_search, code_interpreter and computer use are not available: define a function tool, or grant the agent a Keel tool)"
                ),
            ));
        }
        let name = tool.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
            RequestError::new(format!("{at}.name"), format!("{at} is a function tool without a `name`"))
        })?;
        let parameters = match tool.get("parameters") {
            None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
            Some(Value::Object(schema)) => {
                if schema.get("type").is_some_and(|t| t != "object") {
                    return Err(RequestError::new(
                        format!("{at}.parameters"),
                        format!("{at}.parameters must be a JSON Schema of type \"object\""),
                    ));
                }
                Value::Object(schema.clone())
            }
            Some(_) => {
                return Err(RequestError::new(
                    format!("{at}.parameters"),
                    format!("{at}.parameters must be a JSON Schema object"),
                ));
            }
        };
        let mut function = json!({ "name": name, "parameters": parameters });
        for key in ["description", "strict"] {
            if let Some(value) = tool.get(key).filter(|v| !v.is_null()) {
                function[key] = value.clone();
            }
        }
        converted.push(json!({ "type": "function", "function": function }));
    }
    Ok((!converted.is_empty()).then_some(converted))
}

fn tool_choice(choice: Option<&Value>) -> Checked<Option<Value>> {
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(mode)) if ["auto", "none", "required"].contains(&mode.as_str()) => {
            Ok(Some(json!(mode)))
        }
        Some(choice) if choice.get("type") == Some(&json!("function")) => {
            let name = choice.get("name").and_then(Value::as_str).ok_or_else(|| {
                RequestError::new("tool_choice.name", "a function `tool_choice` needs the function's `name`")
            })?;
            Ok(Some(json!({ "type": "function", "function": { "name": name } })))
        }
        Some(_) => Err(RequestError::new(
            "tool_choice",
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"name\":...} (allowed_tools and built-in tool choices are not supported)",
        )),
    }
}

/// `text.format` as a chat `response_format`.
fn text_format(text: Option<&Value>) -> Checked<Option<Value>> {
    let Some(format) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "json_object" }))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.to_owned(), value.clone());
                }
            }
            if !schema.contains_key("name") || !schema.get("schema").is_some_and(Value::is_object) {
                return Err(RequestError::new(
                    "text.format",
                    "a json_schema `text.format` needs a `name` and a `schema` object",
                ));
            }
            Ok(Some(json!({ "type": "json_schema", "json_schema": schema })))
        }
        _ => Err(RequestError::new(
            "text.format.type",
            "`text.format.type` must be text, json_object or json_schema",
        )),
    }
}

/// The canonical request for `request`, continuing `history` (the input and output
/// items of the responses `previous_response_id` chains back to, oldest first).
/// Instructions are not inherited: each request's own become the first system message,
/// as with OpenAI. Consecutive assistant-side items (messages, function calls, the
/// reasoning before them) form one assistant message; a `function_call_output` must
/// answer a function call made earlier in the conversation.
pub fn conversation(history: &[Value], request: &ResponsesRequest) -> Checked<LlmChatParams> {
    let mut messages = Vec::new();
    if let Some(instructions) = request.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(message(ChatRole::System, Some(instructions.clone())));
    }
    let mut calls = std::collections::HashSet::new();
    let mut pending_reasoning: Vec<Value> = Vec::new();
    let labelled = history
        .iter()
        .map(|item| (None, item))
        .chain(request.input.iter().enumerate().map(|(i, item)| (Some(i), item)));
    for (index, item) in labelled {
        let at = index.map_or_else(|| "previous_response_id".to_owned(), |i| format!("input[{i}]"));
        let text = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        match item.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("assistant") => ChatRole::Assistant,
                    Some("user") => ChatRole::User,
                    _ => ChatRole::System,
                };
                let content = message_text(item.get("content"), "assistant", &at)?;
                if role == ChatRole::Assistant {
                    let turn = assistant_turn(&mut messages, &mut pending_reasoning);
                    match &mut turn.content {
                        Some(existing) if !existing.is_empty() => {
                            existing.push('\n');
                            existing.push_str(&content);
                        }
                        slot => *slot = Some(content),
                    }
                } else {
                    attach_to_last_turn(&mut messages, &mut pending_reasoning);
                    messages.push(message(role, Some(content)));
                }
            }
            "function_call" => {
                let call_id = text("call_id");
                calls.insert(call_id.clone());
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": { "name": text("name"), "arguments": text("arguments") },
                });
                let turn = assistant_turn(&mut messages, &mut pending_reasoning);
                turn.tool_calls.get_or_insert_with(Vec::new).push(call);
            }
            "function_call_output" => {
                let call_id = text("call_id");
                if !calls.contains(&call_id) {
                    return Err(RequestError::new(
                        format!("{at}.call_id"),
                        format!(
                            "{at} answers call_id {call_id:?}, but no function_call with that call_id came before it in the conversation"
                        ),
                    ));
                }
                attach_to_last_turn(&mut messages, &mut pending_reasoning);
                let mut tool = message(ChatRole::Tool, Some(text("output")));
                tool.tool_call_id = Some(call_id);
                messages.push(tool);
            }
            "reasoning" => pending_reasoning.push(item.clone()),
            "item_reference" => {
                return Err(RequestError::new(
                    format!("{at}.id"),
                    format!(
                        "{at} refers to item {:?}, which no response kept for this tenant holds; send the item itself, or continue with `previous_response_id`",
                        text("id")
                    ),
                ));
            }
            _ => {}
        }
    }
    attach_to_last_turn(&mut messages, &mut pending_reasoning);
    Ok(LlmChatParams { messages, ..request.params.clone() })
}

/// Reasoning followed by no assistant-side item belongs to the assistant turn it ended
/// (a streamed response sends reasoning it learns of only at the end after the items it
/// streamed); with no such turn it has nowhere to go in the chat shape and is dropped.
fn attach_to_last_turn(messages: &mut [ChatMessage], reasoning: &mut Vec<Value>) {
    if !reasoning.is_empty()
        && let Some(last) = messages.last_mut().filter(|m| m.role == ChatRole::Assistant)
    {
        last.reasoning.get_or_insert_with(Vec::new).append(reasoning);
    }
    reasoning.clear();
}

fn message(role: ChatRole, content: Option<String>) -> ChatMessage {
    ChatMessage { role, content, tool_calls: None, tool_call_id: None, name: None, reasoning: None }
}

/// The assistant message the next assistant-side item belongs to: the last message if it
/// is an assistant's, else a new one. Reasoning seen since takes its place on it.
fn assistant_turn<'a>(messages: &'a mut Vec<ChatMessage>, reasoning: &mut Vec<Value>) -> &'a mut ChatMessage {
    if messages.last().is_none_or(|m| m.role != ChatRole::Assistant) {
        messages.push(message(ChatRole::Assistant, None));
    }
    let Some(turn) = messages.last_mut() else { unreachable!("an assistant message was just pushed") };
    if !reasoning.is_empty() {
        turn.reasoning.get_or_insert_with(Vec::new).append(reasoning);
    }
    turn
}

/// A response id derived from the journal entry that made it (`run:seq`), so a call
/// answered from the journal after a crash gets the same id and the agent's next
/// `previous_response_id` still finds it.
pub fn response_id(call_key: &str) -> String {
    format!("resp_{}", digest(&["response", call_key]))
}

/// The id of a response's output message: the response's own digest, so an
/// `item_reference` to it leads back to the response ([`response_of_item`]).
pub fn message_item_id(response_id: &str) -> String {
    format!("msg_{}", id_digest(response_id))
}

/// The id of a response's `index`th function call item.
pub fn call_item_id(response_id: &str, index: usize) -> String {
    format!("fc_{}_{index}", id_digest(response_id))
}

fn id_digest(response_id: &str) -> &str {
    response_id.strip_prefix("resp_").unwrap_or(response_id)
}

/// The response whose output holds the item `item_id` (a message or function call item
/// the gateway made), for resolving an `item_reference`. Other ids (an upstream's
/// reasoning items) name none.
pub fn response_of_item(item_id: &str) -> Option<String> {
    let digest = match item_id.strip_prefix("msg_") {
        Some(digest) => digest,
        None => item_id.strip_prefix("fc_")?.rsplit_once('_')?.0,
    };
    (!digest.is_empty() && digest.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("resp_{digest}"))
}

/// Replaces each `item_reference` in `input` with the item it names, found by `lookup`
/// (the output items of the response [`response_of_item`] names, or `None` when that
/// response is not kept). References that resolve to nothing stay, and
/// [`conversation`] refuses them naming the field.
pub fn resolve_references(input: &mut [Value], mut lookup: impl FnMut(&str) -> Option<Vec<Value>>) {
    for item in input.iter_mut() {
        if item.get("type").and_then(Value::as_str) != Some("item_reference") {
            continue;
        }
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        let found = response_of_item(&id).and_then(|response| lookup(&response)).and_then(|output| {
            output
                .into_iter()
                .find(|candidate| candidate.get("id").and_then(Value::as_str) == Some(id.as_str()))
        });
        if let Some(found) = found {
            *item = found;
        }
    }
}

/// 48 hex digits of a SHA-256 over `parts` (the journal's own stable digest).
fn digest(parts: &[&str]) -> String {
    let mut hash = keel_core::replay::params_hash("responses.id", &json!(parts));
    hash.truncate(48);
    hash
}

/// The tool calls of a result in the Responses shape, each with its item id; a call the
/// upstream gave no id gets one derived from the response id.
fn function_calls(response_id: &str, result: &LlmChatResult, status: &str) -> Vec<Value> {
    result
        .message
        .tool_calls
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, call)| {
            let call_id = call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()).map_or_else(
                || format!("call_{}", digest(&[response_id, "call_id", &index.to_string()])),
                str::to_owned,
            );
            json!({
                "type": "function_call",
                "id": call_item_id(response_id, index),
                "call_id": call_id,
                "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default(),
                "arguments": call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}"),
                "status": status,
            })
        })
        .collect()
}

/// The status of a finished response and why it is incomplete, if it is.
pub fn status_of(result: &LlmChatResult) -> (&'static str, Value) {
    match result.finish_reason.as_deref() {
        Some("length") => ("incomplete", json!({ "reason": "max_output_tokens" })),
        Some("content_filter") => ("incomplete", json!({ "reason": "content_filter" })),
        _ => ("completed", Value::Null),
    }
}

/// A message output item with one `output_text` part.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [output_text(text)],
    })
}

pub fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

/// The output items of a result, in order: reasoning (as the upstream gave it), the
/// message (when there is text), then the function calls.
pub fn output_items(response_id: &str, result: &LlmChatResult) -> Vec<Value> {
    let (status, _) = status_of(result);
    let item_status = if status == "completed" { "completed" } else { "incomplete" };
    let mut items: Vec<Value> = result.message.reasoning.iter().flatten().cloned().collect();
    if let Some(text) = result.message.content.as_deref().filter(|t| !t.is_empty()) {
        items.push(message_item(&message_item_id(response_id), text, item_status));
    }
    items.extend(function_calls(response_id, result, "completed"));
    items
}

/// A Responses object before it has output: what `response.created` carries, with
/// `status: in_progress`, and the frame [`response_object`] fills in.
pub fn response_skeleton(id: &str, created_at: u64, model: &str, request: &ResponsesRequest) -> Value {
    let echo = |key: &str, default: Value| request.echo.get(key).cloned().unwrap_or(default);
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "model": model,
        "output": [],
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": request.previous_response_id,
        "reasoning": echo("reasoning", json!({ "effort": null, "summary": null })),
        "store": request.store,
        "temperature": echo("temperature", json!(1.0)),
        "text": echo("text", json!({ "format": { "type": "text" } })),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": echo("truncation", json!("disabled")),
        "usage": null,
        "user": echo("user", Value::Null),
        "metadata": echo("metadata", json!({})),
    })
}

/// The finished Responses object: `skeleton` with the result's status, usage and
/// `output` (the items in the order they were sent, for a stream; else
/// [`output_items`]).
pub fn finish_object(mut skeleton: Value, result: &LlmChatResult, output: Vec<Value>) -> Value {
    let (status, incomplete) = status_of(result);
    skeleton["status"] = json!(status);
    skeleton["incomplete_details"] = incomplete;
    skeleton["model"] = json!(result.model);
    skeleton["output"] = Value::Array(output);
    skeleton["usage"] = json!({
        "input_tokens": result.usage.input_tokens,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": result.usage.output_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": result.usage.input_tokens + result.usage.output_tokens,
    });
    skeleton
}

/// The Responses object answering a non-streamed request.
pub fn response_object(
    id: &str,
    created_at: u64,
    request: &ResponsesRequest,
    result: &LlmChatResult,
) -> Value {
    let skeleton = response_skeleton(id, created_at, &result.model, request);
    finish_object(skeleton, result, output_items(id, result))
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
