//! keel-llm against mock upstreams that speak the real OpenAI and Anthropic wire formats
//! (JSON and SSE, tool calls, usage, rate-limit headers, 429 / 5xx / 400, timeouts,
//! fallback), through the `Router` the kernel uses. Every request the mocks receive is
//! checked against the protocol's invariants (see `mock.rs`). Backoffs are a millisecond.

mod embeddings;
mod mock;
mod responses;

use std::sync::Arc;
use std::time::Duration;

use keel_llm::config::LlmConfig;
use keel_llm::router::Route;
use keel_llm::{
    AnthropicProvider, Delta, Error, ErrorClass, OpenAiProvider, PriceTable, Provider, Router,
    ScriptedProvider,
};
use keel_protocol::rpc::{ChatMessage, ChatRole, LlmChatParams, TokenUsage};
use mock::{Dialect, Mock, Reply};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const KEY: &str = "sk-test-123";
const ANTHROPIC_KEY: &str = "sk-ant-test-456";

/// Fast retries for tests: 3 attempts, 1-5 ms backoff.
const FAST: &str = "
[llm.retry]
max_attempts = 3
initial_backoff_ms = 1
max_backoff_ms = 5

[llm.http]
connect_timeout_ms = 5000
read_timeout_ms = 20000
";

fn env(name: &str) -> Option<String> {
    match name {
        "OPENAI_API_KEY" => Some(KEY.to_owned()),
        "ANTHROPIC_API_KEY" => Some(ANTHROPIC_KEY.to_owned()),
        _ => None,
    }
}

fn router(toml: &str) -> Router {
    let config = LlmConfig::from_keel_toml(toml).unwrap();
    Router::from_config_with_env(&config, env).unwrap()
}

fn openai_toml(mock: &Mock, llm: &str) -> String {
    format!(
        "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\n{llm}\n[llm.providers.openai]\nbase_url = \"{}\"\n{FAST}",
        mock.base_url()
    )
}

fn anthropic_toml(mock: &Mock) -> String {
    format!(
        "[llm]\ndefault_model = \"anthropic/claude-haiku-4-5\"\n[llm.providers.anthropic]\nbase_url = \"{}\"\n{FAST}",
        mock.base_url()
    )
}

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

fn ask(text: &str) -> LlmChatParams {
    LlmChatParams { messages: vec![message(ChatRole::User, Some(text))], ..LlmChatParams::default() }
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn weather_call(id: &str, city: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": json!({"city": city}).to_string()}})
}

/// A conversation mid tool loop: system, user, assistant tool call, tool result, user.
fn tool_conversation() -> LlmChatParams {
    LlmChatParams {
        messages: vec![
            message(ChatRole::System, Some("You are terse.")),
            message(ChatRole::User, Some("Weather in Paris?")),
            ChatMessage {
                tool_calls: Some(vec![weather_call("call_1", "Paris")]),
                ..message(ChatRole::Assistant, None)
            },
            ChatMessage {
                tool_call_id: Some("call_1".into()),
                ..message(ChatRole::Tool, Some("18C, sunny"))
            },
            message(ChatRole::User, Some("And Rome?")),
        ],
        tools: Some(vec![weather_tool()]),
        ..LlmChatParams::default()
    }
}

fn openai_completion(content: Option<&str>, tool_calls: Option<Vec<Value>>, finish: &str) -> Value {
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if let Some(calls) = tool_calls {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": "chatcmpl-abc", "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200},
        "system_fingerprint": "fp_1",
    })
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini-2024-07-18",
           "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
}

fn usage_chunk(input: u64, output: u64) -> Value {
    json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini-2024-07-18",
           "choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})
}

fn anthropic_message(blocks: Value, stop_reason: &str) -> Value {
    json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-haiku-4-5-20251001",
        "content": blocks, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 2000, "output_tokens": 100, "cache_read_input_tokens": 0},
    })
}

fn anthropic_events(text: &str, tool: Option<(&str, &str, &[&str])>, stop_reason: &str) -> Vec<Value> {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant", "model": "claude-haiku-4-5-20251001", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 300, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
    ];
    for piece in text.split_inclusive(' ') {
        events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}));
    }
    events.push(json!({"type": "content_block_stop", "index": 0}));
    if let Some((id, name, parts)) = tool {
        events.push(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}));
        for part in parts {
            events.push(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": part}}));
        }
        events.push(json!({"type": "content_block_stop", "index": 1}));
    }
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 25}}));
    events.push(json!({"type": "message_stop"}));
    events
}

/// Runs a streamed call and returns its result and every delta it sent.
async fn chat_streaming(
    provider: &dyn Provider,
    request: &LlmChatParams,
) -> (keel_llm::Result<keel_llm::Served>, Vec<Delta>) {
    let (sink, mut deltas) = mpsc::unbounded_channel();
    let result = provider.chat(request, Some(&sink)).await;
    drop(sink);
    let mut received = Vec::new();
    while let Some(delta) = deltas.recv().await {
        received.push(delta);
    }
    (result, received)
}

fn text_of(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(text) => Some(text.as_str()),
            Delta::ToolCall { .. } => None,
        })
        .collect()
}

fn attempt_classes(meta: &Value) -> Vec<String> {
    meta["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.get("class").and_then(Value::as_str).unwrap_or(a["outcome"].as_str().unwrap()).to_owned())
        .collect()
}

#[tokio::test]
async fn openai_json_with_tool_calls_usage_and_price() {
    let reply =
        Reply::json(openai_completion(None, Some(vec![weather_call("call_2", "Rome")]), "tool_calls"));
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![reply]).await;
    let router = router(&openai_toml(&mock, ""));
    let served = router.chat(&tool_conversation(), None).await.unwrap();

    let response = &served.response;
    assert_eq!(response.message.content, None);
    assert_eq!(response.message.tool_calls, Some(vec![weather_call("call_2", "Rome")]));
    assert_eq!(response.usage, TokenUsage { input_tokens: 1000, output_tokens: 200 });
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.model, "gpt-4o-mini-2024-07-18");
    // gpt-4o-mini: $0.15 in, $0.60 out per million.
    assert!((response.cost_usd - 0.00027).abs() < 1e-12, "{}", response.cost_usd);
    assert_eq!(served.meta["provider"], "openai");
    assert_eq!(served.meta["model"], "openai/gpt-4o-mini");
    assert_eq!(served.meta["response_id"], "chatcmpl-abc");
    assert_eq!(attempt_classes(&served.meta), ["ok"]);

    let sent = &mock.requests()[0].body;
    assert_eq!(sent["model"], "gpt-4o-mini");
    assert_eq!(sent["max_tokens"], 4096, "the reservation's output bound is sent upstream");
    assert_eq!(sent["tools"], json!([weather_tool()]));
    assert_eq!(sent["messages"].as_array().unwrap().len(), 5);
    assert!(sent.get("stream").is_none());
}

#[tokio::test]
async fn openai_stream_assembles_text_fragmented_tool_calls_and_usage() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Checking "}), None),
        chunk(json!({"content": "Rome."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
            None,
        ),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}), None),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Rome\"}"}}]}), None),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(321, 45),
    ];
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![Reply::openai_stream(&chunks)]).await;
    let router = router(&openai_toml(&mock, ""));
    let request = LlmChatParams { max_tokens: Some(300), temperature: Some(0.0), ..tool_conversation() };
    let (served, deltas) = chat_streaming(&router, &request).await;
    let served = served.unwrap();

    assert_eq!(text_of(&deltas), "Checking Rome.");
    assert_eq!(served.response.message.content.as_deref(), Some("Checking Rome."));
    assert_eq!(served.response.message.tool_calls, Some(vec![weather_call("call_9", "Rome")]));
    let arguments: String = deltas
        .iter()
        .filter_map(|d| match d {
            Delta::ToolCall { index: 0, arguments, .. } => Some(arguments.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(arguments, "{\"city\":\"Rome\"}", "argument fragments are forwarded in order");
    assert_eq!(served.response.usage, TokenUsage { input_tokens: 321, output_tokens: 45 });
    assert_eq!(served.response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(served.meta["streamed"], true);

    let sent = &mock.requests()[0].body;
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["max_tokens"], 300);
    assert_eq!(sent["temperature"], 0.0);
}

#[tokio::test]
async fn openai_stream_deltas_arrive_while_the_response_is_still_open() {
    let (feed, live) = mpsc::unbounded_channel::<String>();
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![Reply::Live(live)]).await;
    let router = router(&openai_toml(&mock, ""));
    let (sink, mut deltas) = mpsc::unbounded_channel();
    let call = tokio::spawn({
        let router = router.clone();
        async move { router.chat(&ask("count"), Some(&sink)).await }
    });
    let data = |value: Value| format!("data: {value}\n\n");
    feed.send(data(chunk(json!({"role": "assistant", "content": "one"}), None))).unwrap();
    // The first delta reaches the sink before the upstream has sent anything else.
    assert_eq!(deltas.recv().await, Some(Delta::Text("one".into())));
    feed.send(data(chunk(json!({"content": " two"}), None))).unwrap();
    assert_eq!(deltas.recv().await, Some(Delta::Text(" two".into())));
    feed.send(data(chunk(json!({}), Some("stop")))).unwrap();
    feed.send(data(usage_chunk(5, 2))).unwrap();
    feed.send("data: [DONE]\n\n".into()).unwrap();
    drop(feed);
    let served = call.await.unwrap().unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("one two"));
    assert_eq!(served.response.usage, TokenUsage { input_tokens: 5, output_tokens: 2 });
}

#[tokio::test]
async fn anthropic_json_converts_both_ways() {
    let reply = Reply::json(anthropic_message(
        json!([
            {"type": "text", "text": "Checking Rome."},
            {"type": "tool_use", "id": "toolu_7", "name": "weather", "input": {"city": "Rome"}},
        ]),
        "tool_use",
    ));
    let mock = Mock::start(Dialect::Anthropic, Some(ANTHROPIC_KEY), vec![reply]).await;
    let router = router(&anthropic_toml(&mock));
    let served = router.chat(&tool_conversation(), None).await.unwrap();

    let response = &served.response;
    assert_eq!(response.message.content.as_deref(), Some("Checking Rome."));
    assert_eq!(response.message.tool_calls, Some(vec![weather_call("toolu_7", "Rome")]));
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.usage, TokenUsage { input_tokens: 2000, output_tokens: 100 });
    assert_eq!(response.model, "claude-haiku-4-5-20251001");
    // claude-haiku-4-5: $1 in, $5 out per million.
    assert!((response.cost_usd - 0.0025).abs() < 1e-12, "{}", response.cost_usd);
    assert_eq!(served.meta["model"], "anthropic/claude-haiku-4-5");

    let sent = &mock.requests()[0].body;
    assert_eq!(sent["model"], "claude-haiku-4-5");
    assert_eq!(sent["max_tokens"], 4096, "max_tokens is required; the default is sent");
    assert_eq!(sent["system"], "You are terse.");
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C, sunny"},
                {"type": "text", "text": "And Rome?"},
            ]},
        ])
    );
    assert_eq!(
        sent["tools"],
        json!([{"name": "weather", "description": "Current weather", "input_schema": weather_tool()["function"]["parameters"]}])
    );
}

#[tokio::test]
async fn anthropic_stream_with_ping_text_and_partial_tool_json() {
    let events = anthropic_events(
        "Checking the weather.",
        Some(("toolu_3", "weather", &["{\"ci", "ty\": \"Ro", "me\"}"])),
        "tool_use",
    );
    let mock =
        Mock::start(Dialect::Anthropic, Some(ANTHROPIC_KEY), vec![Reply::anthropic_stream(&events)]).await;
    let router = router(&anthropic_toml(&mock));
    let (served, deltas) = chat_streaming(&router, &tool_conversation()).await;
    let served = served.unwrap();

    assert_eq!(text_of(&deltas), "Checking the weather.");
    assert_eq!(
        deltas.iter().filter(|d| matches!(d, Delta::ToolCall { .. })).count(),
        4,
        "the tool_use start and three argument fragments"
    );
    assert_eq!(served.response.message.content.as_deref(), Some("Checking the weather."));
    let calls = served.response.message.tool_calls.unwrap();
    assert_eq!(calls[0]["id"], "toolu_3");
    assert_eq!(
        serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Rome"})
    );
    assert_eq!(served.response.usage, TokenUsage { input_tokens: 300, output_tokens: 25 });
    assert_eq!(served.response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(mock.requests()[0].body["stream"], true);
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_after_the_wait() {
    let limited = Reply::status(429, json!({"error": {"message": "Rate limit reached for gpt-4o-mini on requests per min", "type": "requests", "code": "rate_limit_exceeded"}}))
        .with_headers(&[("retry-after-ms", "5"), ("x-ratelimit-limit-requests", "3"), ("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "5ms")]);
    let ok = Reply::json(openai_completion(Some("hello"), None, "stop"));
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![limited, ok]).await;
    let router = router(&openai_toml(&mock, ""));
    let served = router.chat(&ask("hi"), None).await.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("hello"));
    assert_eq!(mock.requests().len(), 2);
    assert_eq!(attempt_classes(&served.meta), ["rate_limited", "ok"]);
    assert_eq!(served.meta["attempts"][0]["status"], 429);
}

#[tokio::test]
async fn server_errors_and_overload_are_retried_then_succeed() {
    let overloaded = Reply::status(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    let server = Reply::status(
        500,
        json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
    );
    let ok = Reply::json(anthropic_message(json!([{"type": "text", "text": "fine"}]), "end_turn"));
    let mock = Mock::start(Dialect::Anthropic, Some(ANTHROPIC_KEY), vec![overloaded, server, ok]).await;
    let router = router(&anthropic_toml(&mock));
    let served = router.chat(&ask("hi"), None).await.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("fine"));
    assert_eq!(served.response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(mock.requests().len(), 3);
    assert_eq!(attempt_classes(&served.meta), ["overloaded", "server", "ok"]);
}

#[tokio::test]
async fn an_error_event_before_any_content_is_retried() {
    let failing = Reply::anthropic_stream(&[
        anthropic_events("", None, "end_turn")[0].clone(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let ok = Reply::anthropic_stream(&anthropic_events("All good.", None, "end_turn"));
    let mock = Mock::start(Dialect::Anthropic, Some(ANTHROPIC_KEY), vec![failing, ok]).await;
    let router = router(&anthropic_toml(&mock));
    let (served, deltas) = chat_streaming(&router, &ask("hi")).await;
    let served = served.unwrap();
    assert_eq!(text_of(&deltas), "All good.");
    assert_eq!(attempt_classes(&served.meta), ["overloaded", "ok"]);
}

#[tokio::test]
async fn a_stream_that_breaks_after_text_is_not_retried() {
    // No finish reason and no [DONE]: the connection dropped mid-answer.
    let cut = Reply::Sse {
        headers: Vec::new(),
        events: vec![(None, chunk(json!({"role": "assistant", "content": "partial"}), None).to_string())],
    };
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![cut]).await;
    let router = router(&openai_toml(&mock, ""));
    let (result, deltas) = chat_streaming(&router, &ask("hi")).await;
    let err = result.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Connection));
    assert!(err.to_string().contains("ended before the response was complete"), "{err}");
    assert_eq!(deltas, [Delta::Text("partial".into())]);
    assert_eq!(mock.requests().len(), 1, "a retry would show the listener the text twice");
}

#[tokio::test]
async fn a_bad_request_is_not_retried_and_says_why() {
    let bad = Reply::status(
        400,
        json!({"error": {"message": "Invalid value for 'temperature': must be at most 2.", "type": "invalid_request_error", "param": "temperature", "code": null}}),
    );
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![bad]).await;
    let router = router(&openai_toml(&mock, ""));
    let err = router.chat(&LlmChatParams { temperature: Some(9.0), ..ask("hi") }, None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::BadRequest));
    assert!(!err.is_retryable());
    assert_eq!(
        err.to_string(),
        "openai: 400 the provider rejected the request (Invalid value for 'temperature': must be at most 2.)"
    );
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_rejected_key_says_which_variable_to_set() {
    let denied = Reply::status(
        401,
        json!({"error": {"message": "Incorrect API key provided: sk-test***123.", "type": "invalid_request_error", "code": "invalid_api_key"}}),
    );
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![denied]).await;
    let err = router(&openai_toml(&mock, "")).chat(&ask("hi"), None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth));
    assert!(err.to_string().starts_with("openai: 401 invalid API key"), "{err}");
    assert!(err.to_string().contains("set OPENAI_API_KEY in the kernel's environment"), "{err}");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_failing_model_falls_back_to_the_next_in_the_chain() {
    let missing = Reply::status(
        404,
        json!({"error": {"message": "The model `gpt-9` does not exist or you do not have access to it.", "type": "invalid_request_error", "code": "model_not_found"}}),
    );
    let openai = Mock::start(Dialect::OpenAi, Some(KEY), vec![missing]).await;
    let anthropic = Mock::start(
        Dialect::Anthropic,
        Some(ANTHROPIC_KEY),
        vec![Reply::json(anthropic_message(json!([{"type": "text", "text": "from claude"}]), "end_turn"))],
    )
    .await;
    let toml = format!(
        "[llm]\ndefault_model = \"openai/gpt-9\"\nfallback = [\"anthropic/claude-haiku-4-5\"]\n\
         [llm.providers.openai]\nbase_url = \"{}\"\n[llm.providers.anthropic]\nbase_url = \"{}\"\n{FAST}",
        openai.base_url(),
        anthropic.base_url()
    );
    let served = router(&toml).chat(&ask("hi"), None).await.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("from claude"));
    assert_eq!(served.meta["provider"], "anthropic");
    assert_eq!(served.meta["model"], "anthropic/claude-haiku-4-5");
    assert_eq!(attempt_classes(&served.meta), ["not_found", "ok"]);
    assert_eq!(served.meta["attempts"][0]["model"], "openai/gpt-9");
    assert_eq!(openai.requests().len(), 1, "404 is not retried");
    assert_eq!(anthropic.requests().len(), 1);
}

#[tokio::test]
async fn fallback_follows_exhausted_retries_and_a_run_can_override_the_chain() {
    let unavailable =
        || Reply::status(503, json!({"error": {"message": "Service unavailable", "type": "server_error"}}));
    let openai =
        Mock::start(Dialect::OpenAi, Some(KEY), vec![unavailable(), unavailable(), unavailable()]).await;
    let anthropic = Mock::start(
        Dialect::Anthropic,
        Some(ANTHROPIC_KEY),
        vec![Reply::json(anthropic_message(json!([{"type": "text", "text": "ok"}]), "end_turn"))],
    )
    .await;
    let toml = format!(
        "[llm]\n[llm.providers.openai]\nbase_url = \"{}\"\n[llm.providers.anthropic]\nbase_url = \"{}\"\n{FAST}",
        openai.base_url(),
        anthropic.base_url()
    );
    // The run's model and fallback chain (from `keel run --model ... --fallback-model ...`).
    let run = router(&toml).for_run(None, Some("gpt-4o".into()), vec!["claude-sonnet-4-5".into()]);
    let served = run.chat(&ask("hi"), None).await.unwrap();
    assert_eq!(attempt_classes(&served.meta), ["overloaded", "overloaded", "overloaded", "ok"]);
    assert_eq!(served.meta["model"], "anthropic/claude-sonnet-4-5");
    assert_eq!(openai.requests().len(), 3, "max_attempts bounds the retries");
    assert_eq!(anthropic.requests()[0].body["model"], "claude-sonnet-4-5");
}

#[tokio::test]
async fn when_every_model_fails_the_error_names_them_all() {
    let bad = || Reply::status(400, json!({"error": {"message": "bad", "type": "invalid_request_error"}}));
    let openai = Mock::start(Dialect::OpenAi, Some(KEY), vec![bad(), bad()]).await;
    let toml = openai_toml(&openai, "fallback = [\"gpt-4o\"]");
    let err = router(&toml).chat(&ask("hi"), None).await.unwrap_err();
    let Error::FallbackExhausted { tried, last } = &err else { panic!("{err:?}") };
    assert_eq!(tried, &["openai/gpt-4o-mini", "gpt-4o"]);
    assert_eq!(last.class(), Some(ErrorClass::BadRequest));
    assert_eq!(err.class(), Some(ErrorClass::BadRequest));
    let models: Vec<Value> = openai.requests().iter().map(|r| r.body["model"].clone()).collect();
    assert_eq!(models, [json!("gpt-4o-mini"), json!("gpt-4o")]);
}

#[tokio::test]
async fn a_stalled_upstream_times_out_and_is_retried() {
    let mock = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::Stall, Reply::json(openai_completion(Some("late but fine"), None, "stop"))],
    )
    .await;
    let toml = openai_toml(&mock, "").replace("read_timeout_ms = 20000", "read_timeout_ms = 150");
    let served = router(&toml).chat(&ask("hi"), None).await.unwrap();
    assert_eq!(served.response.message.content.as_deref(), Some("late but fine"));
    assert_eq!(attempt_classes(&served.meta), ["timeout", "ok"]);
    assert!(served.meta["attempts"][0]["error"].as_str().unwrap().contains("read_timeout_ms"));
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error_naming_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let toml = format!(
        "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\n[llm.providers.openai]\nbase_url = \"http://127.0.0.1:{port}/v1\"\n{FAST}"
    );
    let err = router(&toml).chat(&ask("hi"), None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Connection));
    assert!(
        err.to_string()
            .contains(&format!("could not connect to http://127.0.0.1:{port}/v1/chat/completions")),
        "{err}"
    );
}

#[tokio::test]
async fn https_uses_rustls_and_fails_cleanly_against_a_plain_http_server() {
    let mock = Mock::start(Dialect::OpenAi, Some(KEY), vec![]).await;
    let toml = format!(
        "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\n[llm.providers.openai]\nbase_url = \"https://{}/v1\"\n{FAST}",
        mock.addr
    )
    .replace("max_attempts = 3", "max_attempts = 1");
    let err = router(&toml).chat(&ask("hi"), None).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Connection), "{err}");
    assert!(mock.requests().is_empty(), "no HTTP request got through a failed TLS handshake");
}

#[tokio::test]
async fn a_local_rate_limit_moves_to_the_fallback_without_calling_upstream() {
    let openai = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::json(openai_completion(Some("first"), None, "stop"))],
    )
    .await;
    let anthropic = Mock::start(
        Dialect::Anthropic,
        Some(ANTHROPIC_KEY),
        vec![Reply::json(anthropic_message(json!([{"type": "text", "text": "second"}]), "end_turn"))],
    )
    .await;
    let toml = format!(
        "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\nfallback = [\"anthropic/claude-haiku-4-5\"]\n\
         [llm.providers.openai]\nbase_url = \"{}\"\n[llm.providers.anthropic]\nbase_url = \"{}\"\n\
         [llm.models.\"openai/gpt-4o-mini\"]\nrequests_per_minute = 1\n{FAST}",
        openai.base_url(),
        anthropic.base_url()
    )
    .replace("[llm.retry]", "[llm.retry]\nmax_queue_wait_ms = 10\nmax_retry_after_ms = 10");
    let router = router(&toml);
    let first = router.chat(&ask("one"), None).await.unwrap();
    assert_eq!(first.meta["model"], "openai/gpt-4o-mini");
    let second = router.chat(&ask("two"), None).await.unwrap();
    assert_eq!(second.meta["model"], "anthropic/claude-haiku-4-5");
    assert_eq!(attempt_classes(&second.meta), ["rate_limited", "ok"]);
    assert!(second.meta["attempts"][0]["error"].as_str().unwrap().contains("at its rate limit"));
    assert_eq!(openai.requests().len(), 1, "the second call never reached the rate-limited model");
}

/// A call waiting for a rate-limited model is visible through the router, named as routes
/// name it and tagged with its caller's run, until it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_lists_waiting_calls_with_their_provider_and_run() {
    use keel_llm::ratelimit::{Blocker, CALLER, Caller};
    let mock = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::json(openai_completion(Some("first"), None, "stop"))],
    )
    .await;
    let toml = openai_toml(&mock, "[llm.models.\"openai/gpt-4o-mini\"]\nrequests_per_minute = 1\n")
        .replace("[llm.retry]", "[llm.retry]\nmax_queue_wait_ms = 600000");
    let router = Arc::new(router(&toml));
    assert!(router.waiting_calls().is_empty());
    router.chat(&ask("one"), None).await.unwrap();
    let waiting = {
        let router = router.clone();
        let caller =
            Caller { tenant: "acme".into(), priority: Default::default(), run: Some("run_a".into()) };
        tokio::spawn(CALLER.scope(caller, async move { router.chat(&ask("two"), None).await }))
    };
    let calls = loop {
        let calls = router.for_run(None, None, Vec::new()).waiting_calls();
        if !calls.is_empty() {
            break calls;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(
        (call.provider.as_str(), call.model.as_str(), call.run.as_deref(), call.tenant.as_str()),
        ("openai", "gpt-4o-mini", Some("run_a"), "acme")
    );
    assert_eq!((call.position, call.queue_len, call.blocked_by), (1, 1, Some(Blocker::Requests)));
    waiting.abort();
    let _ = waiting.await;
    assert!(router.waiting_calls().is_empty(), "a dropped call leaves the queue");
    assert_eq!(mock.requests().len(), 1, "the waiting call never reached the upstream");
}

#[tokio::test]
async fn rate_limit_headers_are_learned() {
    let openai_headers = [
        ("x-ratelimit-limit-requests", "100"),
        ("x-ratelimit-remaining-requests", "42"),
        ("x-ratelimit-reset-requests", "6m0s"),
        ("x-ratelimit-limit-tokens", "50000"),
        ("x-ratelimit-remaining-tokens", "49000"),
        ("x-ratelimit-reset-tokens", "1.2s"),
    ];
    let mock = Mock::start(
        Dialect::OpenAi,
        Some(KEY),
        vec![Reply::json(openai_completion(Some("x"), None, "stop")).with_headers(&openai_headers)],
    )
    .await;
    let config = LlmConfig::from_keel_toml(&openai_toml(&mock, "")).unwrap();
    let resolved = config.resolve_providers(env).unwrap();
    let provider = OpenAiProvider::new(
        &resolved[0],
        &config.http,
        Arc::new(PriceTable::default()),
        Duration::from_secs(1),
    )
    .unwrap();
    provider.chat(&LlmChatParams { model: Some("gpt-4o-mini".into()), ..ask("hi") }, None).await.unwrap();
    let state = provider.limiter().snapshot("gpt-4o-mini").unwrap();
    assert_eq!(state.requests.capacity, Some(100.0));
    assert!(
        state.requests.available < 100.0,
        "what is left comes from the provider: {}",
        state.requests.available
    );
    assert!(state.requests.reset_at.is_some());
    assert_eq!(state.tokens.capacity, Some(50000.0));

    let anthropic_headers = [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("anthropic-ratelimit-requests-reset", "2030-01-01T00:00:00Z"),
        ("anthropic-ratelimit-tokens-limit", "80000"),
        ("anthropic-ratelimit-tokens-remaining", "79000"),
        ("anthropic-ratelimit-tokens-reset", "2030-01-01T00:00:00Z"),
    ];
    let mock = Mock::start(
        Dialect::Anthropic,
        Some(ANTHROPIC_KEY),
        vec![
            Reply::json(anthropic_message(json!([{"type": "text", "text": "x"}]), "end_turn"))
                .with_headers(&anthropic_headers),
        ],
    )
    .await;
    let config = LlmConfig::from_keel_toml(&anthropic_toml(&mock)).unwrap();
    let resolved = config.resolve_providers(env).unwrap();
    let provider = AnthropicProvider::new(
        &resolved[0],
        &config.http,
        Arc::new(PriceTable::default()),
        Duration::from_secs(1),
    )
    .unwrap();
    provider
        .chat(&LlmChatParams { model: Some("claude-haiku-4-5".into()), ..ask("hi") }, None)
        .await
        .unwrap();
    let state = provider.limiter().snapshot("claude-haiku-4-5").unwrap();
    assert_eq!(state.requests.capacity, Some(50.0));
    assert_eq!(state.tokens.capacity, Some(80000.0));
}

#[tokio::test]
async fn a_keyless_local_server_gets_no_auth_header_and_usage_is_estimated_when_missing() {
    let mut completion = openai_completion(Some("local answer"), None, "stop");
    completion.as_object_mut().unwrap().remove("usage");
    completion.as_object_mut().unwrap().remove("model");
    let mock = Mock::start(Dialect::OpenAi, None, vec![Reply::json(completion)]).await;
    let toml = format!(
        "[llm.providers.local]\nkind = \"openai\"\nbase_url = \"{}\"\nheaders = {{ \"HTTP-Referer\" = \"https://keel.example\" }}\n{FAST}",
        mock.base_url()
    );
    let router = router(&toml).for_run(None, Some("llama3.1:8b".into()), Vec::new());
    let served = router.chat(&ask("hi there"), None).await.unwrap();
    assert_eq!(served.meta["model"], "local/llama3.1:8b");
    assert_eq!(served.meta["usage_estimated"], true);
    assert_eq!(served.response.model, "llama3.1:8b");
    assert!(served.response.usage.input_tokens > 0 && served.response.usage.output_tokens > 0);
    assert_eq!(served.response.cost_usd, 0.0, "no price is known for a local model");
    let sent = &mock.requests()[0];
    assert_eq!(sent.body["model"], "llama3.1:8b");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["http-referer"], "https://keel.example", "configured extra headers are sent");
    assert!(!sent.headers.contains_key("authorization"));
}

#[tokio::test]
async fn a_runs_script_answers_through_the_router_and_streams() {
    let script = ScriptedProvider::from_text(
        r#"{"responses":[{"content":"Looking.","tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":{"city":"Oslo"}}}]},{"content":"Cold."}]}"#,
    )
    .unwrap();
    let run = Router::empty().for_run(Some(script), None, Vec::new());
    assert!(run.is_configured());
    let (first, deltas) = chat_streaming(&run, &ask("weather?")).await;
    let first = first.unwrap();
    assert_eq!(
        deltas,
        [
            Delta::Text("Looking.".into()),
            Delta::ToolCall {
                index: 0,
                id: Some("c1".into()),
                name: Some("weather".into()),
                arguments: "{\"city\":\"Oslo\"}".into()
            },
        ]
    );
    assert_eq!(first.response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.meta["provider"], "scripted");
    assert_eq!(first.meta["ordered"], true);
    // After a restart, the journaled metas put the cursor back.
    let fresh = Router::empty().for_run(
        Some(ScriptedProvider::from_text(r#"{"responses":[{"content":"a"},{"content":"b"}]}"#).unwrap()),
        None,
        Vec::new(),
    );
    fresh.restore(&[first.meta]);
    assert_eq!(fresh.chat(&ask("x"), None).await.unwrap().response.message.content.as_deref(), Some("b"));
}

#[tokio::test]
async fn no_provider_says_how_to_configure_one() {
    let router = Router::empty();
    assert!(!router.is_configured());
    let err = router.chat(&ask("hi"), None).await.unwrap_err();
    assert!(err.to_string().contains("set OPENAI_API_KEY"), "{err}");
    assert!(err.to_string().contains("--llm-script"), "{err}");
}

#[test]
fn model_names_resolve_to_providers() {
    let toml = r#"
        [llm]
        default_model = "openai/gpt-4o-mini"
        [llm.providers.openai]
        [llm.providers.anthropic]
        [llm.providers.local]
        kind = "openai"
        base_url = "http://localhost:11434/v1"
        [llm.providers.openrouter]
        kind = "openai"
        base_url = "https://openrouter.ai/api/v1"
        [llm.models."llama3.1"]
        provider = "local"
    "#;
    let router = router(toml);
    let resolve = |model: &str| router.resolve(model).map(|r| r.label()).map_err(|e| e.to_string());
    assert_eq!(resolve("openai/gpt-4o"), Ok("openai/gpt-4o".into()));
    assert_eq!(resolve("gpt-4o-mini"), Ok("openai/gpt-4o-mini".into()));
    assert_eq!(resolve("o3-mini"), Ok("openai/o3-mini".into()));
    assert_eq!(resolve("claude-sonnet-4-5"), Ok("anthropic/claude-sonnet-4-5".into()));
    assert_eq!(resolve("llama3.1"), Ok("local/llama3.1".into()));
    assert_eq!(
        router.resolve("openrouter/openai/gpt-4o").unwrap(),
        Route { provider: "openrouter".into(), model: "openai/gpt-4o".into() }
    );
    assert_eq!(resolve("mistral-large"), Ok("openai/mistral-large".into()), "the default model's provider");
    assert_eq!(
        resolve("meta-llama/Llama-3-8B"),
        Ok("openai/meta-llama/Llama-3-8B".into()),
        "not a provider prefix"
    );

    let only_local =
        self::router("[llm.providers.local]\nkind = \"openai\"\nbase_url = \"http://localhost:8000/v1\"");
    assert_eq!(only_local.resolve("gpt-4o").unwrap().label(), "local/gpt-4o", "the only provider");
    let err = only_local.resolve("anthropic/claude-haiku-4-5").unwrap_err().to_string();
    assert!(err.contains("set ANTHROPIC_API_KEY"), "{err}");
    let two = self::router("[llm.providers.a]\nkind = \"openai\"\n[llm.providers.b]\nkind = \"openai\"");
    assert!(two.resolve("mystery").unwrap_err().to_string().contains("providers: a, b"));
}

#[test]
fn the_worst_case_covers_the_whole_chain() {
    let toml = "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\nfallback = [\"anthropic/claude-sonnet-4-5\"]\n\
                [llm.providers.openai]\n[llm.providers.anthropic]\n[llm.prices.\"gpt-4o-mini\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 1.0\n";
    let router = router(toml);
    // claude-sonnet-4-5 at $3 / $15 is the priciest model the call may end up on.
    let worst = router.worst_case_cost_usd(ask("hi").model.as_deref(), 1000, 1000);
    assert!((worst - 0.018).abs() < 1e-12, "{worst}");
    let cheap_only = router.for_run(None, None, vec!["openai/gpt-4o-mini".into()]);
    assert!(
        (cheap_only.worst_case_cost_usd(ask("hi").model.as_deref(), 1000, 1000) - 0.002).abs() < 1e-12,
        "the price override applies"
    );
}

#[test]
fn a_run_lists_its_default_its_fallbacks_and_the_routed_models_once() {
    let toml = r#"
        [llm]
        default_model = "openai/gpt-4o-mini"
        fallback = ["anthropic/claude-haiku-4-5"]
        [llm.providers.openai]
        [llm.providers.anthropic]
        [llm.providers.local]
        kind = "openai"
        base_url = "http://localhost:11434/v1"
        [llm.models."llama3.1"]
        provider = "local"
    "#;
    let configured = router(toml);
    assert_eq!(configured.models(), ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "llama3.1"]);
    let run = configured.for_run(None, Some("llama3.1".into()), Vec::new());
    assert_eq!(run.models(), ["llama3.1", "anthropic/claude-haiku-4-5"], "each once, the run's first");
    let script = keel_llm::ScriptedProvider::from_value(&json!({"responses": [{"content": "hi"}]})).unwrap();
    assert_eq!(Router::empty().for_run(Some(script), None, Vec::new()).models(), ["scripted"]);
}
