//! Pure conversions for an upstream OpenAI Responses API (`POST {base_url}/responses`,
//! chosen with `api = "responses"`): the canonical request to a Responses body, and the
//! Responses answer (a `response` object, or its server-sent events) back to a
//! [`Parsed`] result and the [`Delta`]s of a stream. The kernel's own `/v1/responses`
//! endpoint (what an agent's SDK sends) is a different module.
//!
//! The request is stateless: `store: false` and `include: ["reasoning.encrypted_content"]`,
//! so the upstream keeps nothing and every turn carries its whole history; the reasoning
//! items a response returned travel in the canonical assistant message's `reasoning` and
//! go back, unchanged, before that turn's message and function calls.
//!
//! Messages become input items: leading system messages become `instructions` (joined
//! by a blank line, as a Responses client would have written them); a system message
//! later in the conversation becomes a `developer` message in place, so its position is
//! kept. User and assistant text become `message` items, an assistant's tool calls
//! `function_call` items (`call_id` is the canonical call id), tool results
//! `function_call_output` items.

use std::collections::BTreeMap;

use keel_protocol::rpc::{AssistantMessage, ChatMessage, ChatRole, LlmChatParams, TokenUsage};
use serde_json::{Map, Value, json};

use crate::Delta;
use crate::error::ErrorBody;
use crate::openai::wire::Parsed;
use crate::pricing::DEFAULT_MAX_OUTPUT_TOKENS;

// ---------------------------------------------------------------------------------------
// The request.
// ---------------------------------------------------------------------------------------

/// The body for `POST {base_url}/responses`, or why the request cannot be expressed
/// there. The output limit is always sent (the request's, else
/// [`DEFAULT_MAX_OUTPUT_TOKENS`]) so that a budget reservation is a true bound.
pub fn request_body(params: &LlmChatParams, model: &str, stream: bool) -> Result<Value, String> {
    if params.stop.as_ref().is_some_and(|s| !s.is_empty()) {
        // Dropping them would change what the model returns without saying so.
        return Err(format!(
            "model {model:?} is served through the OpenAI Responses API (`api = \"responses\"`), which has no \
             stop sequences; leave out `stop`, or set `api = \"chat\"` for this model in keel.toml"
        ));
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    let leading = params.messages.iter().take_while(|m| m.role == ChatRole::System).count();
    let instructions: Vec<&str> =
        params.messages[..leading].iter().filter_map(|m| m.content.as_deref()).collect();
    if !instructions.is_empty() {
        body.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    let mut input = Vec::new();
    for message in &params.messages[leading..] {
        input_items(message, &mut input);
    }
    body.insert("input".into(), Value::Array(input));
    if let Some(tools) = params.tools.as_ref().filter(|t| !t.is_empty()) {
        body.insert("tools".into(), Value::Array(tools.iter().map(function_tool).collect()));
        if let Some(choice) = &params.tool_choice {
            body.insert("tool_choice".into(), tool_choice(choice));
        }
        if let Some(parallel) = params.parallel_tool_calls {
            body.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    let max_tokens = params.max_tokens.map_or(DEFAULT_MAX_OUTPUT_TOKENS, u64::from);
    body.insert("max_output_tokens".into(), json!(max_tokens));
    if let Some(temperature) = params.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(top_p) = params.top_p {
        body.insert("top_p".into(), json!(top_p));
    }
    if let Some(format) = &params.response_format {
        body.insert("text".into(), json!({ "format": text_format(format) }));
    }
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

/// One canonical message as Responses input items, appended to `out`.
fn input_items(message: &ChatMessage, out: &mut Vec<Value>) {
    let text = message.content.clone().unwrap_or_default();
    match message.role {
        ChatRole::System => {
            out.push(json!({ "type": "message", "role": "developer", "content": text }));
        }
        ChatRole::User => out.push(json!({ "type": "message", "role": "user", "content": text })),
        ChatRole::Assistant => {
            // The turn's reasoning came first in its output, and the model expects it
            // back in that place.
            out.extend(message.reasoning.iter().flatten().cloned());
            if !text.is_empty() {
                out.push(json!({ "type": "message", "role": "assistant", "content": text }));
            }
            for call in message.tool_calls.iter().flatten() {
                out.push(function_call_item(call));
            }
        }
        ChatRole::Tool => out.push(json!({
            "type": "function_call_output",
            "call_id": message.tool_call_id.clone().unwrap_or_default(),
            "output": text,
        })),
    }
}

/// A canonical (chat) tool call as a `function_call` item; arguments must be JSON text.
fn function_call_item(call: &Value) -> Value {
    let arguments = match call.pointer("/function/arguments") {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => "{}".to_owned(),
        Some(other) => other.to_string(),
    };
    json!({
        "type": "function_call",
        "call_id": call.get("id").cloned().unwrap_or(json!("")),
        "name": call.pointer("/function/name").cloned().unwrap_or(json!("")),
        "arguments": arguments,
    })
}

/// A chat tool (`{"type":"function","function":{...}}`) as a Responses function tool,
/// which is flat and states `strict` (the API's default is strict; chat's is not, and a
/// strict schema has rules a chat schema need not follow).
fn function_tool(tool: &Value) -> Value {
    let Some(function) = tool.get("function").filter(|_| tool["type"] == "function") else {
        // Not a chat function tool: already in some other shape; pass it as it is.
        return tool.clone();
    };
    let mut out = Map::new();
    out.insert("type".into(), json!("function"));
    out.insert("name".into(), function.get("name").cloned().unwrap_or(json!("")));
    if let Some(description) = function.get("description").filter(|d| !d.is_null()) {
        out.insert("description".into(), description.clone());
    }
    out.insert(
        "parameters".into(),
        function
            .get("parameters")
            .filter(|p| !p.is_null())
            .cloned()
            .unwrap_or_else(|| json!({ "type": "object", "properties": {} })),
    );
    out.insert("strict".into(), json!(function.get("strict").and_then(Value::as_bool).unwrap_or(false)));
    Value::Object(out)
}

/// Chat's `tool_choice` in the Responses shape: the strings are the same; a named
/// function loses its `function` wrapper.
fn tool_choice(choice: &Value) -> Value {
    match choice.pointer("/function/name") {
        Some(name) if choice["type"] == "function" => json!({ "type": "function", "name": name }),
        _ => choice.clone(),
    }
}

/// Chat's `response_format` as Responses' `text.format`: a JSON schema is flattened out
/// of its `json_schema` wrapper; `text` and `json_object` are the same.
fn text_format(format: &Value) -> Value {
    match format.get("json_schema") {
        Some(Value::Object(schema)) if format["type"] == "json_schema" => {
            let mut out = schema.clone();
            out.insert("type".into(), json!("json_schema"));
            Value::Object(out)
        }
        _ => format.clone(),
    }
}

// ---------------------------------------------------------------------------------------
// The answer.
// ---------------------------------------------------------------------------------------

/// Why an answer could not be read as a result.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The upstream said the response failed (`status: "failed"`, `response.failed`, or
    /// an `error` event), with what it said.
    Upstream(ErrorBody),
    /// The answer is not what the API specifies.
    Invalid(String),
}

/// The HTTP status an upstream error object would have come with, so a failure inside a
/// 200 answer is classified (and retried or not) like the same failure as a status: a
/// rate limit as 429, a refused prompt as 400, anything else as a server error.
pub fn failure_status(body: &ErrorBody) -> u16 {
    let code = body.code.as_deref().or(body.kind.as_deref()).unwrap_or_default();
    match code {
        "rate_limit_exceeded" | "insufficient_quota" => 429,
        "invalid_prompt"
        | "invalid_request_error"
        | "context_length_exceeded"
        | "invalid_image"
        | "invalid_image_format"
        | "invalid_base64_image"
        | "image_too_large"
        | "empty_image_file"
        | "unsupported_image_media_type" => 400,
        "vector_store_timeout" => 408,
        _ => 500,
    }
}

/// Reads a `response` object (the JSON answer, or the one a terminal stream event
/// carries).
pub fn parse_response(value: &Value) -> Result<Parsed, Failure> {
    if !value.is_object() {
        return Err(Failure::Invalid("the response is not a JSON object".into()));
    }
    let status = value.get("status").and_then(Value::as_str);
    let error = value.get("error").filter(|e| !e.is_null());
    if let Some(error) = error {
        return Err(Failure::Upstream(ErrorBody::from_value(&json!({ "error": error }))));
    }
    match status {
        None | Some("completed" | "incomplete") => {}
        Some(failed @ ("failed" | "cancelled")) => {
            return Err(Failure::Upstream(ErrorBody {
                message: Some(format!("the response {failed} without saying why")),
                ..ErrorBody::default()
            }));
        }
        Some(other) => {
            return Err(Failure::Invalid(format!(
                "the response's status is {other:?}; expected completed, incomplete or failed"
            )));
        }
    }
    let output = match value.get("output") {
        Some(Value::Array(items)) => items.as_slice(),
        None | Some(Value::Null) => &[],
        Some(_) => return Err(Failure::Invalid("`output` is not an array".into())),
    };
    let message = assistant_message(output)?;
    let finish_reason = if status == Some("incomplete") {
        match value.pointer("/incomplete_details/reason").and_then(Value::as_str) {
            Some("max_output_tokens") | None => "length",
            Some("content_filter") => "content_filter",
            Some(other) => other,
        }
    } else if message.tool_calls.is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    Ok(Parsed {
        message,
        usage: usage_of(value),
        model: value.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).map(str::to_owned),
        finish_reason: Some(finish_reason.to_owned()),
        id: value.get("id").and_then(Value::as_str).map(str::to_owned),
    })
}

fn usage_of(response: &Value) -> Option<TokenUsage> {
    let usage = response.get("usage").filter(|u| u.is_object())?;
    Some(TokenUsage {
        input_tokens: usage.get("input_tokens").and_then(Value::as_u64)?,
        output_tokens: usage.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// The canonical assistant message of a response's output items: the text of its
/// `message` items (a refusal stands in for text, as in chat), its `function_call`s as
/// chat tool calls, its `reasoning` items kept whole. Other items (built-in tools the
/// request never enabled) carry nothing the canonical shape can hold.
fn assistant_message(output: &[Value]) -> Result<AssistantMessage, Failure> {
    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    let mut reasoning = Vec::new();
    for (i, item) in output.iter().enumerate() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    let piece = match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => part.get("text").and_then(Value::as_str),
                        Some("refusal") => part.get("refusal").and_then(Value::as_str),
                        _ => None,
                    };
                    if let Some(piece) = piece {
                        text.get_or_insert_with(String::new).push_str(piece);
                    }
                }
            }
            Some("function_call") => tool_calls.push(chat_tool_call(item, i)?),
            Some("reasoning") => reasoning.push(item.clone()),
            Some(_) => {}
            None => return Err(Failure::Invalid(format!("output[{i}] has no `type`"))),
        }
    }
    Ok(AssistantMessage {
        role: ChatRole::Assistant,
        content: text,
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
    })
}

/// A `function_call` item as a chat tool call whose `id` is the item's `call_id` (what a
/// `function_call_output` answers), not its item `id`.
fn chat_tool_call(item: &Value, at: usize) -> Result<Value, Failure> {
    let call_id = item.get("call_id").and_then(Value::as_str).filter(|c| !c.is_empty());
    let name = item.get("name").and_then(Value::as_str);
    let (Some(call_id), Some(name)) = (call_id, name) else {
        return Err(Failure::Invalid(format!("output[{at}] is a function_call without `call_id` or `name`")));
    };
    let arguments = match item.get("arguments") {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    };
    Ok(json!({ "id": call_id, "type": "function", "function": { "name": name, "arguments": arguments } }))
}

/// Assembles a streamed response from its events, yielding the deltas to forward as it
/// goes. The complete result is the `response` of the terminal event
/// (`response.completed`, or `response.incomplete` when the output was cut short); the
/// items of `response.output_item.done` stand in when that response lists no output.
#[derive(Debug, Default)]
pub struct EventAssembler {
    /// Tool-call index (position among the response's function calls) by item id.
    calls_by_item: BTreeMap<String, u32>,
    /// The same, by output index (for servers that leave out `item_id`).
    calls_by_output: BTreeMap<u64, u32>,
    /// How many function calls were added so far (the next one's index).
    calls: u32,
    /// Finished output items by output index.
    done_items: BTreeMap<u64, Value>,
    /// The terminal event's response, once seen.
    terminal: Option<Value>,
}

impl EventAssembler {
    pub fn new() -> EventAssembler {
        EventAssembler::default()
    }

    /// Takes one event (its JSON data; the type is its `type` field, which Responses
    /// servers always set and which matches the SSE event name).
    pub fn push(&mut self, event: &Value) -> Result<Vec<Delta>, Failure> {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
        let mut deltas = Vec::new();
        match kind {
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(text) = event.get("delta").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                    deltas.push(Delta::Text(text.to_owned()));
                }
            }
            "response.output_item.added" => {
                let item = event.get("item").unwrap_or(&Value::Null);
                if item["type"] == "function_call" {
                    let index = self.calls;
                    self.calls += 1;
                    if let Some(id) = item.get("id").and_then(Value::as_str) {
                        self.calls_by_item.insert(id.to_owned(), index);
                    }
                    if let Some(output_index) = event.get("output_index").and_then(Value::as_u64) {
                        self.calls_by_output.insert(output_index, index);
                    }
                    let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
                    deltas.push(Delta::ToolCall {
                        index,
                        id: text("call_id"),
                        name: text("name"),
                        arguments: text("arguments").unwrap_or_default(),
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                let by_item =
                    event.get("item_id").and_then(Value::as_str).and_then(|id| self.calls_by_item.get(id));
                let by_output = || {
                    event
                        .get("output_index")
                        .and_then(Value::as_u64)
                        .and_then(|i| self.calls_by_output.get(&i))
                };
                let Some(&index) = by_item.or_else(by_output) else {
                    return Err(Failure::Invalid(format!(
                        "arguments for a function call that was never added: {}",
                        short(event)
                    )));
                };
                let arguments = event.get("delta").and_then(Value::as_str).unwrap_or_default();
                if !arguments.is_empty() {
                    deltas.push(Delta::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments: arguments.to_owned(),
                    });
                }
            }
            "response.output_item.done" => {
                if let (Some(index), Some(item)) =
                    (event.get("output_index").and_then(Value::as_u64), event.get("item"))
                {
                    self.done_items.insert(index, item.clone());
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = event.get("response").filter(|r| r.is_object()).ok_or_else(|| {
                    Failure::Invalid(format!("a {kind} event without its `response`: {}", short(event)))
                })?;
                self.terminal = Some(response.clone());
            }
            "response.failed" => {
                let error = event.pointer("/response/error").filter(|e| !e.is_null());
                return Err(Failure::Upstream(match error {
                    Some(error) => ErrorBody::from_value(&json!({ "error": error })),
                    None => ErrorBody {
                        message: Some("the response failed without saying why".into()),
                        ..ErrorBody::default()
                    },
                }));
            }
            "error" => return Err(Failure::Upstream(ErrorBody::from_value(event))),
            // response.created / in_progress, content parts, the `.done` of text and
            // arguments (their deltas already went out), reasoning summaries: nothing to
            // forward.
            _ => {}
        }
        Ok(deltas)
    }

    /// Whether the terminal event arrived (the answer is whole).
    pub fn finished(&self) -> bool {
        self.terminal.is_some()
    }

    /// The complete result; `Err` when the stream never finished or its final response
    /// is not one.
    pub fn finish(self) -> Result<Parsed, Failure> {
        let Some(mut response) = self.terminal else {
            return Err(Failure::Invalid("the stream ended without response.completed".into()));
        };
        let listed = response.get("output").and_then(Value::as_array).is_some_and(|o| !o.is_empty());
        if !listed && !self.done_items.is_empty() {
            response["output"] = Value::Array(self.done_items.into_values().collect());
        }
        parse_response(&response)
    }
}

fn short(event: &Value) -> String {
    event.to_string().chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: ChatRole, content: Option<&str>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.map(str::to_owned),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning: None,
        }
    }

    fn reasoning_item() -> Value {
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think."}], "encrypted_content": "gAAAA-opaque"})
    }

    fn weather_call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}})
    }

    fn conversation() -> LlmChatParams {
        LlmChatParams {
            messages: vec![
                message(ChatRole::System, Some("Be terse.")),
                message(ChatRole::System, Some("Use metric units.")),
                message(ChatRole::User, Some("Weather in Paris?")),
                ChatMessage {
                    tool_calls: Some(vec![weather_call("call_1")]),
                    reasoning: Some(vec![reasoning_item()]),
                    ..message(ChatRole::Assistant, Some("Checking."))
                },
                ChatMessage { tool_call_id: Some("call_1".into()), ..message(ChatRole::Tool, Some("18C")) },
                message(ChatRole::System, Some("Answer in French.")),
                message(ChatRole::User, Some("And now?")),
            ],
            tools: Some(vec![
                json!({"type": "function", "function": {"name": "weather", "description": "Current weather", "parameters": {"type": "object"}}}),
                json!({"type": "function", "function": {"name": "now", "strict": true}}),
            ]),
            tool_choice: Some(json!({"type": "function", "function": {"name": "weather"}})),
            parallel_tool_calls: Some(false),
            temperature: Some(0.3),
            top_p: Some(0.9),
            response_format: Some(
                json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}}),
            ),
            ..LlmChatParams::default()
        }
    }

    #[test]
    fn the_request_carries_every_item_and_setting() {
        let body = request_body(&conversation(), "gpt-5", true).unwrap();
        assert_eq!(body["model"], "gpt-5");
        assert_eq!(body["instructions"], "Be terse.\n\nUse metric units.");
        assert_eq!(
            body["input"],
            json!([
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                reasoning_item(),
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {"type": "message", "role": "developer", "content": "Answer in French."},
                {"type": "message", "role": "user", "content": "And now?"},
            ])
        );
        assert_eq!(
            body["tools"],
            json!([
                {"type": "function", "name": "weather", "description": "Current weather", "parameters": {"type": "object"}, "strict": false},
                {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}, "strict": true},
            ])
        );
        assert_eq!(body["tool_choice"], json!({"type": "function", "name": "weather"}));
        assert_eq!(body["parallel_tool_calls"], false);
        assert_eq!(body["max_output_tokens"], DEFAULT_MAX_OUTPUT_TOKENS);
        assert_eq!(body["temperature"], 0.3);
        assert_eq!(body["top_p"], 0.9);
        assert_eq!(
            body["text"],
            json!({"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(body["store"], false);
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(body["stream"], true);
        for chat_only in
            ["messages", "max_tokens", "max_completion_tokens", "stream_options", "response_format"]
        {
            assert!(body.get(chat_only).is_none(), "{chat_only} is a Chat Completions field");
        }
    }

    #[test]
    fn a_plain_request_is_minimal() {
        let params = LlmChatParams {
            messages: vec![message(ChatRole::User, Some("hi"))],
            max_tokens: Some(64),
            tool_choice: Some(json!("required")),
            parallel_tool_calls: Some(true),
            response_format: Some(json!({"type": "json_object"})),
            ..LlmChatParams::default()
        };
        let body = request_body(&params, "gpt-4.1", false).unwrap();
        assert_eq!(body["max_output_tokens"], 64);
        assert!(body.get("instructions").is_none());
        assert!(body.get("stream").is_none());
        assert!(body.get("temperature").is_none() && body.get("top_p").is_none());
        assert!(
            body.get("tool_choice").is_none() && body.get("parallel_tool_calls").is_none(),
            "only with tools"
        );
        assert_eq!(body["text"], json!({"format": {"type": "json_object"}}));
        assert_eq!(body["input"], json!([{"type": "message", "role": "user", "content": "hi"}]));
    }

    #[test]
    fn odd_messages_still_make_well_formed_items() {
        let params = LlmChatParams {
            messages: vec![
                message(ChatRole::User, None),
                // Reasoning alone (the model thought, then answered nothing).
                ChatMessage { reasoning: Some(vec![reasoning_item()]), ..message(ChatRole::Assistant, None) },
                ChatMessage {
                    tool_calls: Some(vec![
                        json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}),
                    ]),
                    ..message(ChatRole::Assistant, Some(""))
                },
                ChatMessage { tool_call_id: Some("c".into()), ..message(ChatRole::Tool, None) },
            ],
            tool_choice: Some(json!("auto")),
            ..LlmChatParams::default()
        };
        let body = request_body(&params, "m", false).unwrap();
        assert_eq!(
            body["input"],
            json!([
                {"type": "message", "role": "user", "content": ""},
                reasoning_item(),
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c", "output": ""},
            ])
        );
        // Only system messages: all instructions, no input.
        let body = request_body(
            &LlmChatParams {
                messages: vec![message(ChatRole::System, Some("s"))],
                ..LlmChatParams::default()
            },
            "m",
            false,
        )
        .unwrap();
        assert_eq!((&body["instructions"], &body["input"]), (&json!("s"), &json!([])));
    }

    #[test]
    fn stop_sequences_are_refused_with_what_to_do() {
        let params = LlmChatParams { stop: Some(vec!["END".into()]), ..conversation() };
        let err = request_body(&params, "gpt-5", false).unwrap_err();
        assert!(err.contains("stop") && err.contains("api = \"chat\"") && err.contains("gpt-5"), "{err}");
        let empty = LlmChatParams { stop: Some(vec![]), ..conversation() };
        assert!(request_body(&empty, "gpt-5", false).is_ok());
    }

    fn response(output: Value) -> Value {
        json!({
            "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "status": "completed",
            "error": null, "incomplete_details": null, "model": "gpt-5-2025-08-07", "output": output,
            "usage": {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 33,
                      "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 153},
        })
    }

    fn text_item(text: &str) -> Value {
        json!({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn call_item(call_id: &str, arguments: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": "weather", "arguments": arguments, "status": "completed"})
    }

    #[test]
    fn a_response_with_reasoning_text_and_a_call_parses() {
        let parsed = parse_response(&response(json!([
            reasoning_item(),
            text_item("Checking."),
            call_item("call_7", "{\"city\":\"Paris\"}"),
        ])))
        .unwrap();
        assert_eq!(parsed.message.content.as_deref(), Some("Checking."));
        assert_eq!(parsed.message.tool_calls, Some(vec![weather_call("call_7")]), "id is the call_id");
        assert_eq!(parsed.message.reasoning, Some(vec![reasoning_item()]), "kept unchanged");
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 120, output_tokens: 33 }));
        assert_eq!(parsed.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(parsed.model.as_deref(), Some("gpt-5-2025-08-07"));
        assert_eq!(parsed.id.as_deref(), Some("resp_1"));

        let text = parse_response(&response(json!([text_item("Hel"), text_item("lo")]))).unwrap();
        assert_eq!(text.message.content.as_deref(), Some("Hello"));
        assert_eq!(text.message.tool_calls, None);
        assert_eq!(text.message.reasoning, None);
        assert_eq!(text.finish_reason.as_deref(), Some("stop"));

        let refusal = parse_response(&response(json!([
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"}]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ])))
        .unwrap();
        assert_eq!(refusal.message.content.as_deref(), Some("I can't"));
    }

    #[test]
    fn an_incomplete_response_finishes_with_length_or_its_reason() {
        let mut cut = response(json!([reasoning_item()]));
        cut["status"] = json!("incomplete");
        cut["incomplete_details"] = json!({"reason": "max_output_tokens"});
        let parsed = parse_response(&cut).unwrap();
        assert_eq!(parsed.finish_reason.as_deref(), Some("length"));
        assert_eq!(parsed.message.content, None);
        assert_eq!(parsed.message.reasoning, Some(vec![reasoning_item()]));
        cut["incomplete_details"] = json!({"reason": "content_filter"});
        assert_eq!(parse_response(&cut).unwrap().finish_reason.as_deref(), Some("content_filter"));
    }

    #[test]
    fn failed_and_malformed_responses_are_errors() {
        let mut failed = response(json!([]));
        failed["status"] = json!("failed");
        failed["error"] = json!({"code": "rate_limit_exceeded", "message": "Slow down"});
        let Err(Failure::Upstream(body)) = parse_response(&failed) else { panic!("not a failure") };
        assert_eq!(body.message.as_deref(), Some("Slow down"));
        assert_eq!(failure_status(&body), 429);
        failed["error"] = Value::Null;
        assert!(matches!(parse_response(&failed), Err(Failure::Upstream(_))));

        for (bad, needle) in [
            (json!([]), "not a JSON object"),
            (json!({"status": "in_progress"}), "in_progress"),
            (json!({"status": "completed", "output": {}}), "not an array"),
            (json!({"output": [{"content": []}]}), "output[0] has no `type`"),
            (json!({"output": [{"type": "function_call", "name": "f"}]}), "call_id"),
        ] {
            let Err(Failure::Invalid(message)) = parse_response(&bad) else { panic!("{bad} parsed") };
            assert!(message.contains(needle), "{bad}: {message}");
        }
    }

    #[test]
    fn failures_get_the_status_their_code_implies() {
        let status =
            |code: &str| failure_status(&ErrorBody { code: Some(code.into()), ..ErrorBody::default() });
        assert_eq!(status("rate_limit_exceeded"), 429);
        assert_eq!(status("insufficient_quota"), 429);
        assert_eq!(status("invalid_prompt"), 400);
        assert_eq!(status("context_length_exceeded"), 400);
        assert_eq!(status("server_error"), 500);
        assert_eq!(status("something_new"), 500);
        assert_eq!(failure_status(&ErrorBody::default()), 500);
        let typed = ErrorBody { kind: Some("invalid_request_error".into()), ..ErrorBody::default() };
        assert_eq!(failure_status(&typed), 400);
    }

    /// The events OpenAI sends for reasoning, text and one function call, in order.
    fn events() -> Vec<Value> {
        let final_response = response(json!([
            reasoning_item(),
            text_item("Checking Paris."),
            call_item("call_9", "{\"city\":\"Paris\"}"),
        ]));
        let mut created = final_response.clone();
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        created["usage"] = Value::Null;
        vec![
            json!({"type": "response.created", "sequence_number": 0, "response": created}),
            json!({"type": "response.in_progress", "sequence_number": 1, "response": created}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Think."}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning_item()}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}}),
            json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Checking "}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Paris."}),
            json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1, "content_index": 0, "text": "Checking Paris."}),
            json!({"type": "response.output_item.done", "output_index": 1, "item": text_item("Checking Paris.")}),
            json!({"type": "response.output_item.added", "output_index": 2, "item": {"type": "function_call", "id": "fc_call_9", "call_id": "call_9", "name": "weather", "arguments": "", "status": "in_progress"}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_call_9", "output_index": 2, "delta": "{\"city\":"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_call_9", "output_index": 2, "delta": "\"Paris\"}"}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_call_9", "output_index": 2, "arguments": "{\"city\":\"Paris\"}"}),
            json!({"type": "response.output_item.done", "output_index": 2, "item": call_item("call_9", "{\"city\":\"Paris\"}")}),
            json!({"type": "response.completed", "sequence_number": 16, "response": final_response}),
        ]
    }

    #[test]
    fn streamed_events_become_deltas_in_order_and_the_completed_response() {
        let mut assembler = EventAssembler::new();
        let mut deltas = Vec::new();
        for event in events() {
            assert!(!assembler.finished());
            deltas.extend(assembler.push(&event).unwrap());
        }
        assert!(assembler.finished());
        assert_eq!(
            deltas,
            vec![
                Delta::Text("Checking ".into()),
                Delta::Text("Paris.".into()),
                Delta::ToolCall {
                    index: 0,
                    id: Some("call_9".into()),
                    name: Some("weather".into()),
                    arguments: String::new()
                },
                Delta::ToolCall { index: 0, id: None, name: None, arguments: "{\"city\":".into() },
                Delta::ToolCall { index: 0, id: None, name: None, arguments: "\"Paris\"}".into() },
            ]
        );
        let parsed = assembler.finish().unwrap();
        assert_eq!(parsed.message.content.as_deref(), Some("Checking Paris."));
        assert_eq!(parsed.message.tool_calls, Some(vec![weather_call("call_9")]));
        assert_eq!(parsed.message.reasoning, Some(vec![reasoning_item()]));
        assert_eq!(parsed.usage, Some(TokenUsage { input_tokens: 120, output_tokens: 33 }));
        assert_eq!(parsed.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn two_calls_get_their_own_indexes_even_without_item_ids() {
        let mut assembler = EventAssembler::new();
        let mut deltas = Vec::new();
        for event in [
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "function_call", "call_id": "a", "name": "f", "arguments": ""}}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": ""}),
        ] {
            deltas.extend(assembler.push(&event).unwrap());
        }
        assert_eq!(deltas.len(), 3, "an empty fragment is not forwarded");
        assert!(matches!(&deltas[1], Delta::ToolCall { index: 1, arguments, .. } if arguments == "{}"));
        assert!(
            matches!(&deltas[2], Delta::ToolCall { index: 0, id: None, arguments, .. } if arguments == "{}")
        );
        let orphan = json!({"type": "response.function_call_arguments.delta", "item_id": "fc_x", "output_index": 7, "delta": "{"});
        assert!(matches!(assembler.push(&orphan), Err(Failure::Invalid(m)) if m.contains("never added")));
    }

    #[test]
    fn a_completed_event_without_output_takes_the_finished_items() {
        let mut assembler = EventAssembler::new();
        let mut bare = response(json!([]));
        bare["usage"] = Value::Null;
        for event in [
            json!({"type": "response.output_item.done", "output_index": 1, "item": call_item("c2", "{}")}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": text_item("Hi")}),
            json!({"type": "response.completed", "response": bare}),
        ] {
            assembler.push(&event).unwrap();
        }
        let parsed = assembler.finish().unwrap();
        assert_eq!(parsed.message.content.as_deref(), Some("Hi"));
        assert_eq!(parsed.message.tool_calls.unwrap()[0]["id"], "c2");
        assert_eq!(parsed.usage, None, "the provider estimates it");
    }

    #[test]
    fn an_incomplete_stream_ends_with_length() {
        let mut cut = response(json!([text_item("Partial")]));
        cut["status"] = json!("incomplete");
        cut["incomplete_details"] = json!({"reason": "max_output_tokens"});
        let mut assembler = EventAssembler::new();
        assembler.push(&json!({"type": "response.incomplete", "response": cut})).unwrap();
        assert!(assembler.finished());
        assert_eq!(assembler.finish().unwrap().finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn failures_in_the_stream_are_upstream_errors() {
        let mut assembler = EventAssembler::new();
        let failed = json!({"type": "response.failed", "response": {"id": "r", "status": "failed", "error": {"code": "server_error", "message": "The model crashed"}}});
        let Err(Failure::Upstream(body)) = assembler.push(&failed) else { panic!() };
        assert_eq!(body.message.as_deref(), Some("The model crashed"));
        assert_eq!(body.code.as_deref(), Some("server_error"));
        let error = json!({"type": "error", "code": "rate_limit_exceeded", "message": "Too fast", "param": null, "sequence_number": 3});
        let Err(Failure::Upstream(body)) = assembler.push(&error) else { panic!() };
        assert_eq!((body.message.as_deref(), failure_status(&body)), (Some("Too fast"), 429));
        let silent = json!({"type": "response.failed", "response": {"status": "failed", "error": null}});
        assert!(matches!(assembler.push(&silent), Err(Failure::Upstream(_))));
        let headless = json!({"type": "response.completed"});
        assert!(matches!(assembler.push(&headless), Err(Failure::Invalid(_))));
        assert!(
            matches!(EventAssembler::new().finish(), Err(Failure::Invalid(m)) if m.contains("response.completed"))
        );
    }

    #[test]
    fn a_parsed_response_goes_back_as_the_next_turns_input() {
        // What a Responses upstream returned, held in the canonical shape, is what the
        // follow-up request sends: the reasoning byte for byte, then the call.
        let parsed =
            parse_response(&response(json!([reasoning_item(), call_item("call_3", "{\"city\":\"Paris\"}")])))
                .unwrap();
        let assistant = parsed.message;
        let params = LlmChatParams {
            messages: vec![
                message(ChatRole::User, Some("Weather?")),
                ChatMessage {
                    role: ChatRole::Assistant,
                    content: assistant.content,
                    tool_calls: assistant.tool_calls,
                    tool_call_id: None,
                    name: None,
                    reasoning: assistant.reasoning,
                },
                ChatMessage { tool_call_id: Some("call_3".into()), ..message(ChatRole::Tool, Some("18C")) },
            ],
            ..LlmChatParams::default()
        };
        let input = request_body(&params, "gpt-5", false).unwrap()["input"].clone();
        assert_eq!(input[1], reasoning_item());
        assert_eq!(input[2]["call_id"], "call_3");
        assert_eq!(input[3], json!({"type": "function_call_output", "call_id": "call_3", "output": "18C"}));
    }
}
