//! Unit tests of the pure parts of telemetry.

use super::facts::*;
use super::*;
use keel_types::Usage;
use opentelemetry::Value as OtelValue;
use serde_json::json;

fn run() -> RunId {
    RunId::parse("run_01jtestrun0000000000000000").expect("a run id")
}

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> =
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |name| map.get(name).cloned()
}

fn get<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a OtelValue> {
    attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

#[test]
fn ids_are_a_function_of_the_run_id() {
    let a = run();
    let b: RunId = RunId::parse("run_01jtestrun0000000000000001").expect("a run id");
    assert_eq!(trace_id(&a), trace_id(&a));
    assert_ne!(trace_id(&a), trace_id(&b));
    assert_ne!(run_span_id(&a), run_span_id(&b));
    assert_ne!(syscall_span_id(&a, 1, 3), syscall_span_id(&a, 2, 3), "a replay is a span of its own");
    assert_ne!(syscall_span_id(&a, 1, 3), syscall_span_id(&a, 1, 4));
    assert_ne!(run_span_id(&a), SpanId::INVALID);
}

#[test]
fn traceparent_round_trips_and_bad_headers_are_refused() {
    let header = traceparent(&run());
    assert_eq!(parse_traceparent(&header), Some((trace_id(&run()), run_span_id(&run()))));
    assert!(header.starts_with("00-") && header.ends_with("-01") && header.len() == 55);
    for bad in [
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    ] {
        assert_eq!(parse_traceparent(bad), None, "{bad:?}");
    }
    assert!(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later").is_some());
}

#[test]
fn config_is_off_without_an_endpoint_and_checks_what_is_set() {
    assert_eq!(Config::read(vars(&[])).expect("fine"), None);
    assert_eq!(Config::read(vars(&[("OTEL_SERVICE_NAME", "x")])).expect("fine"), None);
    let on = Config::read(vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]))
        .expect("fine")
        .expect("on");
    assert!(on.traces && on.metrics && !on.capture_content);
    let traces_only =
        Config::read(vars(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c:4318/v1/traces")]))
            .expect("fine")
            .expect("on");
    assert!(traces_only.traces && !traces_only.metrics);
    let disabled =
        vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_SDK_DISABLED", "true")]);
    assert_eq!(Config::read(disabled).expect("fine"), None);
    let capture = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"), (CAPTURE_CONTENT, "true")]);
    assert!(Config::read(capture).expect("fine").expect("on").capture_content);

    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces"),
    ] {
        let err = Config::read(vars(&[(name, value)])).expect_err(value).to_string();
        assert!(err.contains(name) && err.contains("http://"), "{err}");
    }
    let grpc =
        vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert!(Config::read(grpc).expect_err("grpc").to_string().contains("http/protobuf"));
    let headers =
        vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"), ("OTEL_EXPORTER_OTLP_HEADERS", "a=b,oops")]);
    assert!(Config::read(headers).expect_err("headers").to_string().contains("\"oops\""));
}

#[test]
fn agent_names_come_from_the_program_or_its_script() {
    let name = |args: &[&str]| agent_name(&args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    assert_eq!(name(&["python3", "-u", "/work/agents/triage.py"]), "triage.py");
    assert_eq!(name(&["python3.12", "agent.py"]), "agent.py");
    assert_eq!(name(&["/usr/bin/my-agent", "--flag"]), "my-agent");
    assert_eq!(name(&["sh", "-c", "echo hi"]), "echo hi");
    assert_eq!(name(&[]), "agent");
}

#[test]
fn a_chat_span_has_the_conventions_attributes_and_no_content_by_default() {
    let params = json!({ "model": "gpt-x", "max_tokens": 50, "messages": [{ "role": "user", "content": "secret prompt" }] });
    let facts = SyscallFacts::of("llm.chat", &params, false);
    assert_eq!(facts.name, "chat gpt-x");
    assert_eq!(facts.kind, SpanKind::Client);
    assert!(get(&facts.attributes, "gen_ai.input.messages").is_none());
    let result = json!({
        "response": { "model": "gpt-x-2025", "finish_reason": "stop", "message": { "role": "assistant", "content": "secret answer" } },
        "provider": { "provider": "openai", "model": "gpt-x-2025" },
    });
    let usage =
        Usage { input_tokens: 12, output_tokens: 3, llm_calls: 1, tool_calls: 0, cost_micro_usd: 1500 };
    let outcome = Outcome { seq: Some(4), result: Ok(&result), usage };
    let (attributes, status, metric) = outcome_attributes(&facts, &outcome, false);
    assert_eq!(status, Status::Unset);
    assert_eq!(get(&attributes, "gen_ai.response.model"), Some(&OtelValue::from("gpt-x-2025")));
    assert_eq!(get(&attributes, "gen_ai.usage.input_tokens"), Some(&OtelValue::I64(12)));
    assert_eq!(get(&attributes, "gen_ai.usage.output_tokens"), Some(&OtelValue::I64(3)));
    assert_eq!(get(&attributes, "gen_ai.provider.name"), Some(&OtelValue::from("openai")));
    assert_eq!(get(&attributes, "keel.cost_usd"), Some(&OtelValue::F64(0.0015)));
    assert!(get(&attributes, "gen_ai.output.messages").is_none());
    let metric = metric.expect("a model call is counted");
    assert_eq!((metric.input_tokens, metric.output_tokens), (12, 3));
    assert_eq!(metric.response_model.as_deref(), Some("gpt-x-2025"));

    let captured = SyscallFacts::of("llm.chat", &params, true);
    assert!(
        matches!(get(&captured.attributes, "gen_ai.input.messages"), Some(v) if v.as_str().contains("secret prompt"))
    );
    let (attributes, _, _) = outcome_attributes(&captured, &outcome, true);
    assert!(
        matches!(get(&attributes, "gen_ai.output.messages"), Some(v) if v.as_str().contains("secret answer"))
    );
}

#[test]
fn a_failed_call_sets_the_status_and_error_type() {
    let facts = SyscallFacts::of("tool.call", &json!({ "name": "fs.read", "args": { "path": "x" } }), false);
    assert_eq!(facts.name, "execute_tool fs.read");
    assert!(get(&facts.attributes, "gen_ai.tool.call.arguments").is_none());
    let outcome = Outcome { seq: None, result: Err(("denied", "not granted")), usage: Usage::default() };
    let (attributes, status, metric) = outcome_attributes(&facts, &outcome, false);
    assert_eq!(status, Status::error("not granted"));
    assert_eq!(get(&attributes, "error.type"), Some(&OtelValue::from("denied")));
    assert!(metric.is_none(), "a tool call is not a GenAI client operation");
}

#[test]
fn a_child_runs_span_links_to_its_parents_and_a_program_call_nests_in_its_exec() {
    let parent: RunId = RunId::parse("run_01jtestrun0000000000000009").expect("a run id");
    let end = RunEnd {
        run: &run(),
        tenant: "acme",
        agent: "agent.py".into(),
        parent: Some(&parent),
        state: "failed",
        attempt: 2,
        created_at_ms: 1,
        ended_at_ms: 2,
        usage: Usage::default(),
        exit_code: Some(3),
        error: Some("exit status 3"),
    };
    let (context, attributes, status, links, name) = run_span_parts(&end);
    assert_eq!(name, "invoke_agent agent.py");
    assert_eq!(context.trace_id(), trace_id(&run()));
    assert_eq!(context.span_id(), run_span_id(&run()));
    assert_eq!(status, Status::error("exit status 3"));
    assert_eq!(get(&attributes, "keel.attempt"), Some(&OtelValue::I64(2)));
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].span_context.trace_id(), trace_id(&parent));
    assert_eq!(links[0].span_context.span_id(), run_span_id(&parent));

    let program_call = SyscallFacts::of("tool.call", &json!({ "name": "t", "exec": 7 }), false);
    assert_eq!(parent_of(&run(), 1, &program_call, None), (syscall_span_id(&run(), 1, 7), false));
    let plain = SyscallFacts::of("sys.now", &json!({}), false);
    assert_eq!(parent_of(&run(), 1, &plain, None), (run_span_id(&run()), false));
    let gateway = SpanId::from_bytes([9; 8]);
    assert_eq!(parent_of(&run(), 1, &plain, Some(gateway)), (gateway, true));
}
