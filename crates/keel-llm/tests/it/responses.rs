//! A model configured with `api = "responses"`: the OpenAI provider calls the upstream
//! Responses API (the mock's `/v1/responses`, checked on every request), JSON and SSE,
//! reasoning items carried across turns unchanged, failures classified like any other
//! upstream error, and the config mistakes explained.

use keel_llm::config::LlmConfig;
use keel_llm::{Delta, Error, ErrorClass, Provider, Router};
use keel_protocol::rpc::{ChatMessage, ChatRole, LlmChatParams, TokenUsage};
use serde_json::{Value, json};

use crate::mock::{Dialect, Mock, Reply};
use crate::{
    KEY, ask, attempt_classes, chat_streaming, message, openai_completion, openai_toml, router, text_of,
    tool_conversation, weather_call, weather_tool,
};

/// The provider `openai` at the mock, with `gpt-5` on the Responses API (and every other
/// model on Chat Completions).
fn responses_router(mock: &Mock) -> Router {
    router(&openai_toml(mock, "[llm.models.\"openai/gpt-5\"]\napi = \"responses\"\n"))
}

fn on_gpt5(params: LlmChatParams) -> LlmChatParams {
    LlmChatParams { model: Some("openai/gpt-5".into()), ..params }
}

fn reasoning(n: u32) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [{"type": "summary_text", "text": format!("Thought {n}.")}],
           "encrypted_content": format!("gAAAAB{n}-opaque+/=")})
}

fn text_item(text: &str) -> Value {
    json!({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(call_id: &str, city: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": "weather",
           "arguments": json!({"city": city}).to_string(), "status": "completed"})
}

fn response(output: Value, input_tokens: u64, output_tokens: u64) -> Value {
    json!({
        "id": "resp_abc", "object": "response", "created_at": 1_700_000_000, "status": "completed", "error": null,
        "incomplete_details": null, "model": "gpt-5-2025-08-07", "output": output, "store": false,
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": output_tokens,
                  "output_tokens_details": {"reasoning_tokens": 64}, "total_tokens": input_tokens + output_tokens},
    })
}

/// The events OpenAI streams for `output` (reasoning, text split at spaces, function
/// calls with their arguments in two fragments), ending with `response.completed`.
fn response_events(output: &[Value], final_response: &Value) -> Vec<Value> {
    let mut created = final_response.clone();
    created["status"] = json!("in_progress");
    created["output"] = json!([]);
    created["usage"] = Value::Null;
    let mut events = vec![
        json!({"type": "response.created", "response": created}),
        json!({"type": "response.in_progress", "response": created}),
    ];
    for (index, item) in output.iter().enumerate() {
        match item["type"].as_str().unwrap() {
            "message" => {
                let text = item["content"][0]["text"].as_str().unwrap();
                events.push(json!({"type": "response.output_item.added", "output_index": index, "item": {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}}));
                events.push(json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
                for piece in text.split_inclusive(' ') {
                    events.push(json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": index, "content_index": 0, "delta": piece}));
                }
                events.push(json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": index, "content_index": 0, "text": text}));
            }
            "function_call" => {
                let mut added = item.clone();
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                events.push(
                    json!({"type": "response.output_item.added", "output_index": index, "item": added}),
                );
                let arguments = item["arguments"].as_str().unwrap();
                let (head, tail) = arguments.split_at(arguments.len() / 2);
                for piece in [head, tail] {
                    events.push(json!({"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": index, "delta": piece}));
                }
                events.push(json!({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index, "arguments": arguments}));
            }
            _ => {
                events.push(json!({"type": "response.output_item.added", "output_index": index, "item": {"type": "reasoning", "id": item["id"], "summary": []}}));
            }
        }
        events.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
    events.push(json!({"type": "response.completed", "response": final_response}));
    for (number, event) in events.iter_mut().enumerate() {
        event["sequence_number"] = json!(number);
    }
    events
}

#[tokio::test]
async fn a_tool_call_round_trip_goes_through_the_responses_api() {
    let output = json!([reasoning(1), call_item("call_2", "Rome")]);
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![Reply::json(response(output, 1000, 200))]).await;
    let router = responses_router(&mock);
    let served = router.chat(&on_gpt5(tool_conversation()), None).await.unwrap();

    let response = &served.response;
    assert_eq!(response.message.content, None);
    assert_eq!(response.message.tool_calls, Some(vec![weather_call("call_2", "Rome")]));
    assert_eq!(response.message.reasoning, Some(vec![reasoning(1)]));
    assert_eq!(response.usage, TokenUsage { input_tokens: 1000, output_tokens: 200 });
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.model, "gpt-5-2025-08-07");
    assert!(response.cost_usd > 0.0, "priced like any gpt-5 call");
    assert_eq!(served.meta["api"], "responses");
    assert_eq!(served.meta["response_id"], "resp_abc");
    assert_eq!(served.meta["model"], "openai/gpt-5");
    assert_eq!(attempt_classes(&served.meta), ["ok"]);

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/responses");
    let sent = &requests[0].body;
    assert_eq!(sent["model"], "gpt-5");
    assert_eq!(sent["instructions"], "You are terse.");
    assert_eq!(sent["max_output_tokens"], 4096, "the reservation's output bound is sent upstream");
    assert_eq!(
        sent["input"],
        json!([
            {"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
            {"type": "message", "role": "user", "content": "And Rome?"},
        ])
    );
    let function = &weather_tool()["function"];
    assert_eq!(
        sent["tools"],
        json!([{"type": "function", "name": "weather", "description": function["description"], "parameters": function["parameters"], "strict": false}])
    );
    assert!(sent.get("stream").is_none());
}

#[tokio::test]
async fn a_streamed_call_forwards_deltas_in_order_and_returns_the_completed_response() {
    let output = [reasoning(1), text_item("Checking the weather in Rome."), call_item("call_9", "Rome")];
    let final_response = response(json!(output), 321, 45);
    let events = response_events(&output, &final_response);
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![Reply::responses_stream(&events)]).await;
    let router = responses_router(&mock);
    let request =
        LlmChatParams { max_tokens: Some(300), temperature: Some(0.0), ..on_gpt5(tool_conversation()) };
    let (served, deltas) = chat_streaming(&router, &request).await;
    let served = served.unwrap();

    assert_eq!(text_of(&deltas), "Checking the weather in Rome.");
    let calls: Vec<&Delta> = deltas.iter().filter(|d| matches!(d, Delta::ToolCall { .. })).collect();
    assert_eq!(
        calls[0],
        &Delta::ToolCall {
            index: 0,
            id: Some("call_9".into()),
            name: Some("weather".into()),
            arguments: String::new()
        }
    );
    let arguments: String = calls
        .iter()
        .filter_map(|d| match d {
            Delta::ToolCall { arguments, .. } => Some(arguments.as_str()),
            Delta::Text(_) => None,
        })
        .collect();
    assert_eq!(arguments, "{\"city\":\"Rome\"}", "argument fragments are forwarded in order");
    let last_text = deltas.iter().rposition(|d| matches!(d, Delta::Text(_))).unwrap();
    let first_call = deltas.iter().position(|d| matches!(d, Delta::ToolCall { .. })).unwrap();
    assert!(last_text < first_call, "deltas keep the upstream's order: {deltas:?}");

    let response = &served.response;
    assert_eq!(response.message.content.as_deref(), Some("Checking the weather in Rome."));
    assert_eq!(response.message.tool_calls, Some(vec![weather_call("call_9", "Rome")]));
    assert_eq!(response.message.reasoning, Some(vec![reasoning(1)]));
    assert_eq!(response.usage, TokenUsage { input_tokens: 321, output_tokens: 45 });
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(served.meta["streamed"], true);

    let sent = &mock.requests()[0].body;
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["max_output_tokens"], 300);
    assert_eq!(sent["temperature"], 0.0);
}

#[tokio::test]
async fn encrypted_reasoning_goes_back_unchanged_on_the_next_turn() {
    let first = response(json!([reasoning(7), call_item("call_5", "Oslo")]), 50, 80);
    let second_output = [reasoning(8), text_item("Oslo: 4C and windy.")];
    let second = response(json!(second_output), 90, 20);
    let mock = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::json(first), Reply::responses_stream(&response_events(&second_output, &second))],
    )
    .await;
    let router = responses_router(&mock);
    let mut conversation = on_gpt5(LlmChatParams {
        messages: vec![message(ChatRole::User, Some("Weather in Oslo?"))],
        tools: Some(vec![weather_tool()]),
        ..LlmChatParams::default()
    });
    let turn = router.chat(&conversation, None).await.unwrap().response.message;
    // The agent's next request holds the assistant turn as the canonical message it got
    // (reasoning included, as the kernel journals it), then the tool's result.
    conversation.messages.push(ChatMessage {
        role: ChatRole::Assistant,
        content: turn.content,
        tool_calls: turn.tool_calls,
        tool_call_id: None,
        name: None,
        reasoning: turn.reasoning,
    });
    conversation.messages.push(ChatMessage {
        tool_call_id: Some("call_5".into()),
        ..message(ChatRole::Tool, Some("4C, wind 40 km/h"))
    });
    let (served, _) = chat_streaming(&router, &conversation).await;
    let served = served.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("Oslo: 4C and windy."));
    assert_eq!(served.response.message.reasoning, Some(vec![reasoning(8)]));

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let input = requests[1].body["input"].as_array().unwrap().clone();
    assert_eq!(
        input,
        vec![
            json!({"type": "message", "role": "user", "content": "Weather in Oslo?"}),
            reasoning(7),
            json!({"type": "function_call", "call_id": "call_5", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"}),
            json!({"type": "function_call_output", "call_id": "call_5", "output": "4C, wind 40 km/h"}),
        ],
        "the reasoning item, byte for byte, before the turn's function call"
    );
    mock.assert_clean();
}

#[tokio::test]
async fn upstream_failures_are_classified_like_any_other() {
    // A 400 is not retried; the error says what the upstream said.
    let bad = Reply::status(
        400,
        json!({"error": {"message": "Unsupported parameter: 'temperature'", "type": "invalid_request_error", "param": "temperature", "code": "unsupported_parameter"}}),
    );
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![bad]).await;
    let err = responses_router(&mock).chat(&on_gpt5(ask("hi")), None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::BadRequest));
    assert!(err.to_string().contains("Unsupported parameter"), "{err}");
    assert_eq!(mock.requests().len(), 1);

    // A failed response (200, status failed) with a rate-limit code is retried as one; a
    // response.failed event in a stream as a server error; then the call succeeds.
    let mut limited = response(json!([]), 0, 0);
    limited["status"] = json!("failed");
    limited["error"] = json!({"code": "rate_limit_exceeded", "message": "Rate limit reached for gpt-5"});
    let failed_stream = Reply::responses_stream(&[
        json!({"type": "response.created", "sequence_number": 0, "response": {"id": "r", "status": "in_progress", "output": []}}),
        json!({"type": "response.failed", "sequence_number": 1, "response": {"id": "r", "status": "failed", "output": [], "error": {"code": "server_error", "message": "The server had an error"}}}),
    ]);
    let ok_output = [text_item("fine")];
    let ok = Reply::responses_stream(&response_events(&ok_output, &response(json!(ok_output), 5, 1)));
    let thrice = (0..3).map(|_| Reply::json(limited.clone())).collect();
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), thrice).await;
    let err = responses_router(&mock).chat(&on_gpt5(ask("hi")), None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::RateLimited), "{err}");
    assert!(err.to_string().contains("Rate limit reached for gpt-5"), "{err}");
    assert_eq!(mock.requests().len(), 3, "retried as a rate limit is, up to max_attempts");
    drop(mock);

    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![failed_stream, ok]).await;
    let (served, deltas) = chat_streaming(&responses_router(&mock), &on_gpt5(ask("hi"))).await;
    let served = served.unwrap();
    assert_eq!(text_of(&deltas), "fine");
    assert_eq!(attempt_classes(&served.meta), ["server", "ok"]);

    // A stream cut before response.completed is a broken connection, not an answer.
    let output = [text_item("never finished")];
    let mut events = response_events(&output, &response(json!(output), 1, 1));
    events.pop();
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![Reply::responses_stream(&events)]).await;
    let (result, _) = chat_streaming(&responses_router(&mock), &on_gpt5(ask("hi"))).await;
    let err = result.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Connection), "{err}");
    assert!(err.to_string().contains("ended before the response was complete"), "{err}");
}

#[tokio::test]
async fn one_provider_serves_both_apis_each_call_by_its_model() {
    let replies = vec![
        Reply::json(openai_completion(Some("from chat"), None, "stop")),
        Reply::json(response(json!([text_item("from responses")]), 3, 2)),
    ];
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), replies).await;
    let both = responses_router(&mock);
    let chat = both.chat(&ask("hi"), None).await.unwrap();
    let responses = both.chat(&on_gpt5(ask("hi")), None).await.unwrap();
    assert_eq!(chat.response.message.content.as_deref(), Some("from chat"));
    assert!(chat.meta.get("api").is_none());
    assert_eq!(responses.response.message.content.as_deref(), Some("from responses"));
    let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/chat/completions", "/v1/responses"]);

    // Set on the provider, every model of it goes to /responses.
    let mock = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::json(response(json!([text_item("all of them")]), 3, 2))],
    )
    .await;
    let toml = openai_toml(&mock, "")
        .replace("[llm.providers.openai]\n", "[llm.providers.openai]\napi = \"responses\"\n");
    let served = router(&toml).chat(&ask("hi"), None).await.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("all of them"));
    assert_eq!(mock.requests()[0].path, "/v1/responses");
}

#[tokio::test]
async fn what_the_responses_api_cannot_express_fails_before_any_upstream_call() {
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![]).await;
    let request = LlmChatParams { stop: Some(vec!["END".into()]), ..on_gpt5(ask("hi")) };
    let err = responses_router(&mock).chat(&request, None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::BadRequest));
    let text = err.to_string();
    assert!(text.contains("stop") && text.contains("api = \"chat\""), "{text}");
    assert!(mock.requests().is_empty());
}

#[test]
fn api_config_mistakes_are_explained() {
    for (toml, needles) in [
        (
            "[llm.providers.anthropic]\napi = \"responses\"\n",
            &["provider `anthropic`", "kind openai only"][..],
        ),
        (
            "[llm.providers.openai]\napi = \"response\"\n",
            &["`api`", "\"response\"", "\"chat\"", "\"responses\""],
        ),
        (
            "[llm.models.\"openai/gpt-5\"]\napi = \"Responses\"\n[llm.providers.openai]\n",
            &["`api`", "\"responses\""],
        ),
        (
            "[llm.providers.claude]\nkind = \"anthropic\"\n[llm.models.\"claude/claude-sonnet-4-5\"]\napi = \"chat\"\n",
            &["[llm.models.\"claude/claude-sonnet-4-5\"]", "provider `claude`"],
        ),
    ] {
        let err = match LlmConfig::from_keel_toml(toml) {
            Ok(config) => Router::from_config_with_env(&config, |_| None).unwrap_err(),
            Err(err) => err,
        };
        assert!(matches!(err, Error::Config(_)), "{toml:?}: {err:?}");
        let text = err.to_string();
        for needle in needles {
            assert!(text.contains(needle), "{toml:?}: {text} (wanted {needle:?})");
        }
    }
}
