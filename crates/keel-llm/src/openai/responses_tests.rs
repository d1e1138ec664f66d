//! Tests of the Responses conversions and the streamed event sequence.

use keel_protocol::rpc::{AssistantMessage, ChatRole, LlmChatResult, TokenUsage};
use serde_json::{Value, json};

use super::*;
use crate::Delta;
use crate::openai::responses_stream::ResponseStream;

fn parse(body: Value) -> ResponsesRequest {
    parse_request(&body).unwrap_or_else(|e| panic!("{body} should parse: {e:?}"))
}

fn refused(body: Value) -> RequestError {
    match parse_request(&body) {
        Ok(request) => match conversation(&[], &request) {
            Ok(params) => panic!("{body} should be refused, got {params:?}"),
            Err(err) => err,
        },
        Err(err) => err,
    }
}

fn result(text: Option<&str>, calls: &[(&str, &str, &str)], finish: Option<&str>) -> LlmChatResult {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({ "id": id, "type": "function", "function": { "name": name, "arguments": args } }))
        .collect();
    LlmChatResult {
        message: AssistantMessage {
            role: ChatRole::Assistant,
            content: text.map(str::to_owned),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
            reasoning: None,
        },
        usage: TokenUsage { input_tokens: 11, output_tokens: 7 },
        cost_usd: 0.0,
        model: "gpt-4o-mini".into(),
        finish_reason: finish.map(str::to_owned),
    }
}

#[test]
fn a_string_input_is_one_user_message_after_the_instructions() {
    let request = parse(
        json!({ "model": "gpt-4o-mini", "input": "hi", "instructions": "be brief", "max_output_tokens": 50 }),
    );
    let params = conversation(&[], &request).unwrap();
    assert_eq!(params.messages.len(), 2);
    assert_eq!(params.messages[0].role, ChatRole::System);
    assert_eq!(params.messages[0].content.as_deref(), Some("be brief"));
    assert_eq!(params.messages[1].role, ChatRole::User);
    assert_eq!(params.messages[1].content.as_deref(), Some("hi"));
    assert_eq!(params.max_tokens, Some(50));
    assert_eq!(params.model.as_deref(), Some("gpt-4o-mini"));
    assert!(request.store && !request.stream);
}

#[test]
fn a_tool_round_trip_becomes_chat_messages() {
    let request = parse(json!({
        "model": "m",
        "input": [
            { "role": "developer", "content": "sys" },
            { "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "add " }, { "type": "input_text", "text": "2 and 3" }] },
            { "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque" },
            { "type": "message", "role": "assistant", "content": [{ "type": "output_text", "text": "calling" }] },
            { "type": "function_call", "call_id": "call_a", "name": "add", "arguments": "{\"a\":2,\"b\":3}" },
            { "type": "function_call", "call_id": "call_b", "name": "add", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "call_a", "output": "5" },
            { "type": "function_call_output", "call_id": "call_b", "output": [{ "type": "input_text", "text": "0" }] },
        ],
        "tools": [{ "type": "function", "name": "add", "description": "adds", "parameters": { "type": "object", "properties": {} }, "strict": true }],
        "tool_choice": { "type": "function", "name": "add" },
        "parallel_tool_calls": false,
    }));
    let params = conversation(&[], &request).unwrap();
    let roles: Vec<ChatRole> = params.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [ChatRole::System, ChatRole::User, ChatRole::Assistant, ChatRole::Tool, ChatRole::Tool]
    );
    assert_eq!(params.messages[1].content.as_deref(), Some("add 2 and 3"));
    let assistant = &params.messages[2];
    assert_eq!(assistant.content.as_deref(), Some("calling"));
    let calls = assistant.tool_calls.as_ref().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "call_a");
    assert_eq!(calls[0]["function"]["name"], "add");
    assert_eq!(calls[0]["function"]["arguments"], "{\"a\":2,\"b\":3}");
    assert_eq!(assistant.reasoning.as_ref().unwrap()[0]["encrypted_content"], "opaque");
    assert_eq!(params.messages[3].tool_call_id.as_deref(), Some("call_a"));
    assert_eq!(params.messages[4].content.as_deref(), Some("0"));
    let tools = params.tools.unwrap();
    assert_eq!(
        tools[0],
        json!({ "type": "function", "function": { "name": "add", "description": "adds", "parameters": { "type": "object", "properties": {} }, "strict": true } })
    );
    assert_eq!(params.tool_choice, Some(json!({ "type": "function", "function": { "name": "add" } })));
    assert_eq!(params.parallel_tool_calls, Some(false));
}

#[test]
fn a_follow_up_continues_the_history_and_may_answer_its_calls() {
    let first = parse(json!({ "input": "add 2 and 3", "instructions": "old" }));
    let answer = result(None, &[("call_1", "add", "{}")], None);
    let mut history = first.input.clone();
    history.extend(output_items("resp_x", &answer));
    let follow_up = parse(json!({
        "input": [{ "type": "function_call_output", "call_id": "call_1", "output": "5" }],
        "previous_response_id": "resp_x",
    }));
    let params = conversation(&history, &follow_up).unwrap();
    let roles: Vec<ChatRole> = params.messages.iter().map(|m| m.role).collect();
    // Instructions are not inherited from the earlier request.
    assert_eq!(roles, [ChatRole::User, ChatRole::Assistant, ChatRole::Tool]);
    assert_eq!(params.messages[1].tool_calls.as_ref().unwrap()[0]["id"], "call_1");
}

#[test]
fn bad_requests_name_the_field() {
    let cases = [
        (json!([]), None),
        (json!({ "model": "m" }), Some("input")),
        (json!({ "input": 3 }), Some("input")),
        (
            json!({ "input": [{ "type": "function_call_output", "call_id": "nope", "output": "x" }] }),
            Some("input[0].call_id"),
        ),
        (
            json!({ "input": [{ "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "a" }, { "type": "input_image", "image_url": "x" }] }] }),
            Some("input[0].content[1].type"),
        ),
        (json!({ "input": [{ "type": "web_search_call", "id": "x" }] }), Some("input[0].type")),
        (json!({ "input": [{ "type": "item_reference", "id": "x" }] }), Some("input[0].type")),
        (json!({ "input": [{ "role": "robot", "content": "x" }] }), Some("input[0].role")),
        (
            json!({ "input": [{ "type": "function_call", "call_id": "c", "name": "f" }] }),
            Some("input[0].arguments"),
        ),
        (json!({ "input": "x", "tools": [{ "type": "web_search" }] }), Some("tools[0].type")),
        (
            json!({ "input": "x", "tools": [{ "type": "function", "name": "f", "parameters": "nope" }] }),
            Some("tools[0].parameters"),
        ),
        (
            json!({ "input": "x", "tools": [{ "type": "function", "name": "f", "parameters": { "type": "array" } }] }),
            Some("tools[0].parameters"),
        ),
        (json!({ "input": "x", "tools": [{ "type": "function" }] }), Some("tools[0].name")),
        (json!({ "input": "x", "tool_choice": { "type": "file_search" } }), Some("tool_choice")),
        (json!({ "input": "x", "max_output_tokens": 0 }), Some("max_output_tokens")),
        (json!({ "input": "x", "temperature": "hot" }), Some("temperature")),
        (json!({ "input": "x", "stream": "yes" }), Some("stream")),
        (json!({ "input": "x", "background": true }), Some("background")),
        (json!({ "input": "x", "conversation": "conv_1" }), Some("conversation")),
        (json!({ "input": "x", "metadata": { "a": 1 } }), Some("metadata")),
        (
            json!({ "input": "x", "text": { "format": { "type": "json_schema", "name": "n" } } }),
            Some("text.format"),
        ),
    ];
    for (body, param) in cases {
        let err = refused(body.clone());
        assert_eq!(err.param.as_deref(), param, "{body}: {err:?}");
        assert!(!err.message.is_empty());
    }
}

#[test]
fn structured_output_becomes_a_response_format() {
    let request = parse(
        json!({ "input": "x", "text": { "format": { "type": "json_schema", "name": "answer", "schema": { "type": "object" }, "strict": true } } }),
    );
    assert_eq!(
        request.params.response_format,
        Some(
            json!({ "type": "json_schema", "json_schema": { "name": "answer", "schema": { "type": "object" }, "strict": true } })
        )
    );
}

#[test]
fn a_result_renders_as_a_response_object() {
    let request = parse(
        json!({ "model": "m", "input": "x", "metadata": { "k": "v" }, "tools": [{ "type": "function", "name": "add" }] }),
    );
    let answer = result(Some("Sure."), &[("call_1", "add", "{\"a\":1}")], Some("tool_calls"));
    let response = response_object("resp_1", 7, &request, &answer);
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["metadata"], json!({ "k": "v" }));
    assert_eq!(response["tools"][0]["name"], "add");
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 2);
    assert_eq!(output[0]["type"], "message");
    assert_eq!(
        output[0]["content"][0],
        json!({ "type": "output_text", "text": "Sure.", "annotations": [], "logprobs": [] })
    );
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["call_id"], "call_1");
    assert_eq!(output[1]["arguments"], "{\"a\":1}");
    assert_eq!(response["usage"]["total_tokens"], 18);

    let cut = response_object("resp_1", 7, &request, &result(Some("Su"), &[], Some("length")));
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
}

#[test]
fn ids_are_derived_from_the_journal_entry() {
    assert_eq!(response_id("run:4"), response_id("run:4"));
    assert_ne!(response_id("run:4"), response_id("run:5"));
    assert!(response_id("run:4").starts_with("resp_"));
    assert_ne!(call_item_id("resp_a", 0), call_item_id("resp_a", 1));
}

fn types(events: &[(String, Value)]) -> Vec<String> {
    events.iter().map(|(name, _)| name.clone()).collect()
}

fn stream_of(deltas: &[Delta], answer: &LlmChatResult) -> (Vec<(String, Value)>, Value) {
    let request = parse(json!({ "model": "m", "input": "x" }));
    let mut stream = ResponseStream::new("resp_s", response_skeleton("resp_s", 1, "m", &request));
    let mut events = stream.start();
    for delta in deltas {
        events.extend(stream.delta(delta));
    }
    let (end, response) = stream.finish(answer);
    events.extend(end);
    (events, response)
}

#[test]
fn a_live_stream_and_its_replay_send_the_same_event_types() {
    let answer = result(Some("Hello there"), &[("call_9", "add", "{\"a\":1}")], None);
    let live = [
        Delta::Text("Hello".into()),
        Delta::Text(" there".into()),
        Delta::ToolCall {
            index: 0,
            id: Some("call_9".into()),
            name: Some("add".into()),
            arguments: String::new(),
        },
        Delta::ToolCall { index: 0, id: None, name: None, arguments: "{\"a\":".into() },
        Delta::ToolCall { index: 0, id: None, name: None, arguments: "1}".into() },
    ];
    let (streamed, streamed_response) = stream_of(&live, &answer);
    let (replayed, replayed_response) = stream_of(&[], &answer);
    let mut deduped = types(&streamed);
    deduped.dedup();
    let mut replayed_types = types(&replayed);
    replayed_types.dedup();
    assert_eq!(deduped, replayed_types);
    assert_eq!(
        replayed_types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(streamed_response, replayed_response);
    assert_eq!(
        streamed_response["output"],
        response_object("resp_s", 1, &parse(json!({ "model": "m", "input": "x" })), &answer)["output"]
    );
    for (i, (name, data)) in streamed.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{name}");
        assert_eq!(data["type"], name.as_str());
    }
    let done = streamed.iter().find(|(name, _)| name == "response.output_text.done").unwrap();
    assert_eq!(done.1["text"], "Hello there");
    let args = streamed.iter().find(|(name, _)| name == "response.function_call_arguments.done").unwrap();
    assert_eq!(args.1["arguments"], "{\"a\":1}");
    let added = streamed.iter().filter(|(name, _)| name == "response.output_item.added").nth(1).unwrap();
    assert_eq!(added.1["item"]["call_id"], "call_9");
}

#[test]
fn reasoning_from_the_upstream_is_sent_and_kept_first() {
    let mut answer = result(Some("ok"), &[], None);
    answer.message.reasoning =
        Some(vec![json!({ "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e" })]);
    let (events, response) = stream_of(&[Delta::Text("ok".into())], &answer);
    assert_eq!(response["output"][0]["type"], "message");
    assert_eq!(response["output"][1]["encrypted_content"], "e");
    assert!(types(&events).contains(&"response.output_item.done".to_owned()));
    let (_, replayed) = stream_of(&[], &answer);
    assert_eq!(replayed["output"][0]["type"], "reasoning");
}

#[test]
fn a_cut_off_answer_ends_with_response_incomplete() {
    let (events, response) =
        stream_of(&[Delta::Text("Hel".into())], &result(Some("Hel"), &[], Some("length")));
    assert_eq!(events.last().unwrap().0, "response.incomplete");
    assert_eq!(response["status"], "incomplete");
}

#[test]
fn reasoning_after_a_turn_belongs_to_that_turn() {
    // A streamed response sends the upstream's reasoning after the items it streamed.
    let history = vec![
        json!({ "type": "message", "role": "user", "content": "add" }),
        json!({ "type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}" }),
        json!({ "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e" }),
    ];
    let follow_up =
        parse(json!({ "input": [{ "type": "function_call_output", "call_id": "c1", "output": "5" }] }));
    let params = conversation(&history, &follow_up).unwrap();
    assert_eq!(params.messages[1].reasoning.as_ref().unwrap()[0]["id"], "rs_1");
    assert_eq!(params.messages[2].role, ChatRole::Tool);
    assert_eq!(params.messages[2].reasoning, None);
}
