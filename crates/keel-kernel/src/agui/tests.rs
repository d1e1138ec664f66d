//! The AG-UI mapping, step by step, without IO.

use super::*;

fn event(seq: u64, kind: &str, data: Value) -> EventView {
    EventView { seq, ts: 1000 + seq, kind: kind.into(), data }
}

fn entry(seq: u64, method: &str, status: &str, params: Value, result: Option<Value>) -> JournalEntryView {
    JournalEntryView {
        seq,
        method: method.into(),
        status: status.into(),
        params_digest: String::new(),
        params,
        result,
        error: (status == "error").then(|| json!({"message": "refused"})),
        attempt: 1,
        started_at: 0,
        finished_at: None,
        duration_ms: None,
        usage: Default::default(),
    }
}

fn syscall(event_seq: u64, call: u64, method: &str) -> EventView {
    event(event_seq, "syscall", json!({"seq": call, "method": method, "status": "ok"}))
}

fn mapper() -> AguiMapper {
    AguiMapper::new("thread".into(), "run".into(), "run_x".into())
}

/// The events as `TYPE` or `TYPE:detail` strings, for compact comparisons.
fn names(events: &[AguiEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match &e.body {
            AguiEventBody::TextMessageContent { delta, .. } | AguiEventBody::ToolCallArgs { delta, .. } => {
                format!("{}:{delta}", e.kind())
            }
            AguiEventBody::ToolCallStart { tool_call_id, tool_call_name, .. } => {
                format!("{}:{tool_call_id}:{tool_call_name}", e.kind())
            }
            AguiEventBody::ToolCallResult { tool_call_id, content, .. } => {
                format!("{}:{tool_call_id}:{content}", e.kind())
            }
            AguiEventBody::Custom { name, .. } => format!("{}:{name}", e.kind()),
            _ => e.kind().to_owned(),
        })
        .collect()
}

fn llm_result(content: &str, calls: Value) -> Value {
    let response = json!({"message": {"role": "assistant", "content": content, "tool_calls": calls}, "usage": {}, "model": "m"});
    json!({"response": response, "provider": {"provider": "scripted"}})
}

#[test]
fn history_renders_each_call_whole_and_ends_with_the_output() {
    let mut m = mapper();
    let mut out = m.step(Step::Event {
        event: &event(1, "state", json!({"state": "created"})),
        entry: None,
        output: None,
    });
    let calls = json!([{"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"message\":\"hi\"}"}}]);
    let llm = entry(1, "llm.chat", "ok", json!({}), Some(llm_result("Let me echo.", calls)));
    out.extend(m.step(Step::Event { event: &syscall(2, 1, "llm.chat"), entry: Some(&llm), output: None }));
    let tool = entry(
        2,
        "tool.call",
        "ok",
        json!({"name": "echo", "args": {"message": "hi"}}),
        Some(json!({"result": {"echoed": "hi"}})),
    );
    out.extend(m.step(Step::Event { event: &syscall(3, 2, "tool.call"), entry: Some(&tool), output: None }));
    let own = entry(
        3,
        "tool.call",
        "ok",
        json!({"name": "kv.get", "args": {"key": "k"}}),
        Some(json!({"result": "v"})),
    );
    out.extend(m.step(Step::Event { event: &syscall(4, 3, "tool.call"), entry: Some(&own), output: None }));
    let checkpoint =
        entry(4, "state.checkpoint", "ok", json!({"state": {"step": 2}}), Some(json!({"seq": 4})));
    out.extend(m.step(Step::Event {
        event: &syscall(5, 4, "state.checkpoint"),
        entry: Some(&checkpoint),
        output: None,
    }));
    out.extend(m.step(Step::Event {
        event: &event(6, "question", json!({"seq": 5, "question": "Ship?"})),
        entry: None,
        output: None,
    }));
    out.extend(m.step(Step::Event {
        event: &event(7, "answer", json!({"seq": 5, "text": "yes"})),
        entry: None,
        output: None,
    }));
    let done = event(8, "state", json!({"state": "succeeded", "from": "running"}));
    out.extend(m.step(Step::Event { event: &done, entry: None, output: Some(&json!({"ok": true})) }));
    assert_eq!(
        names(&out),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT:Let me echo.",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START:call_1:echo",
            "TOOL_CALL_ARGS:{\"message\":\"hi\"}",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT:call_1:{\"echoed\":\"hi\"}",
            "TOOL_CALL_START:run_x-c3:kv.get",
            "TOOL_CALL_ARGS:{\"key\":\"k\"}",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT:run_x-c3:v",
            "STATE_SNAPSHOT",
            "CUSTOM:keel.question",
            "CUSTOM:keel.answer",
            "RUN_FINISHED",
        ]
    );
    assert!(m.finished());
    match &out.last().unwrap().body {
        AguiEventBody::RunFinished { result, outcome, thread_id, run_id } => {
            assert_eq!(result, &Some(json!({"ok": true})));
            assert_eq!(outcome, &None);
            assert_eq!((thread_id.as_str(), run_id.as_str()), ("thread", "run"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(out[12].body, AguiEventBody::StateSnapshot { snapshot: json!({"step": 2}) });
    // The tool call's parent is the message that proposed it.
    assert!(
        matches!(&out[4].body, AguiEventBody::ToolCallStart { parent_message_id: Some(p), .. } if p == "run_x-m1")
    );
    // Nothing follows the end.
    assert!(
        m.step(Step::Event {
            event: &event(9, "stdout", json!({"line": "late"})),
            entry: None,
            output: None
        })
        .is_empty()
    );
}

#[test]
fn a_call_seen_starting_streams_its_deltas_and_its_completion_only_closes() {
    let mut m = mapper();
    let mut out = m.step(Step::CallBegun(3));
    out.extend(m.step(Step::Delta(3, &Delta::Text("Hel".into()))));
    out.extend(m.step(Step::Delta(3, &Delta::Text("lo".into()))));
    let first = Delta::ToolCall {
        index: 0,
        id: Some("c9".into()),
        name: Some("echo".into()),
        arguments: "{\"a\":".into(),
    };
    out.extend(m.step(Step::Delta(3, &first)));
    let rest = Delta::ToolCall { index: 0, id: None, name: None, arguments: "1}".into() };
    out.extend(m.step(Step::Delta(3, &rest)));
    let calls = json!([{"id": "c9", "function": {"name": "echo", "arguments": "{\"a\":1}"}}]);
    let llm = entry(3, "llm.chat", "ok", json!({}), Some(llm_result("Hello", calls)));
    out.extend(m.step(Step::Event { event: &syscall(10, 3, "llm.chat"), entry: Some(&llm), output: None }));
    // A late delta of a completed call changes nothing.
    out.extend(m.step(Step::Delta(3, &Delta::Text("!".into()))));
    assert_eq!(
        names(&out),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT:Hel",
            "TEXT_MESSAGE_CONTENT:lo",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START:c9:echo",
            "TOOL_CALL_ARGS:{\"a\":",
            "TOOL_CALL_ARGS:1}",
            "TOOL_CALL_END",
        ]
    );
    // The streamed call was proposed: the agent's matching tool call answers it.
    let tool = entry(
        4,
        "tool.call",
        "ok",
        json!({"name": "echo", "args": {"a": 1}}),
        Some(json!({"result": "done"})),
    );
    let result =
        m.step(Step::Event { event: &syscall(11, 4, "tool.call"), entry: Some(&tool), output: None });
    assert_eq!(names(&result), ["TOOL_CALL_RESULT:c9:done"]);
}

#[test]
fn deltas_of_a_call_not_seen_starting_are_dropped_and_the_call_is_rendered_whole() {
    let mut m = mapper();
    let mut out = m.step(Step::Delta(2, &Delta::Text("lo".into())));
    let llm = entry(2, "llm.chat", "ok", json!({}), Some(llm_result("Hello", Value::Null)));
    out.extend(m.step(Step::Event { event: &syscall(5, 2, "llm.chat"), entry: Some(&llm), output: None }));
    assert_eq!(
        names(&out),
        ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT:Hello", "TEXT_MESSAGE_END"]
    );
}

#[test]
fn a_tool_call_name_that_arrives_late_opens_the_call_with_what_was_buffered() {
    let mut m = mapper();
    m.step(Step::CallBegun(1));
    let out = m.step(Step::Delta(
        1,
        &Delta::ToolCall { index: 0, id: Some("x".into()), name: None, arguments: "{".into() },
    ));
    assert!(out.is_empty(), "{out:?}");
    let out = m.step(Step::Delta(
        1,
        &Delta::ToolCall { index: 0, id: None, name: Some("f".into()), arguments: "}".into() },
    ));
    assert_eq!(names(&out), ["TOOL_CALL_START:x:f", "TOOL_CALL_ARGS:{}"]);
    let out = m.step(Step::Delta(
        1,
        &Delta::ToolCall { index: 1, id: Some("y".into()), name: Some("g".into()), arguments: String::new() },
    ));
    assert_eq!(names(&out), ["TOOL_CALL_END", "TOOL_CALL_START:y:g"]);
}

#[test]
fn a_failed_run_closes_what_is_open_and_ends_in_run_error() {
    let mut m = mapper();
    m.step(Step::CallBegun(1));
    m.step(Step::Delta(1, &Delta::Text("partial".into())));
    let failed = event(4, "state", json!({"state": "failed", "error": "agent crashed", "exit_code": 3}));
    let out = m.step(Step::Event { event: &failed, entry: None, output: None });
    assert_eq!(names(&out), ["TEXT_MESSAGE_END", "RUN_ERROR"]);
    assert_eq!(
        out[1].body,
        AguiEventBody::RunError {
            message: "agent crashed (exit code 3)".into(),
            code: Some("failed".into())
        }
    );
}

#[test]
fn a_cancelled_run_finishes_with_the_cancelled_outcome() {
    let mut m = mapper();
    let out = m.step(Step::Event {
        event: &event(1, "state", json!({"state": "cancelled"})),
        entry: None,
        output: None,
    });
    assert_eq!(names(&out), ["RUN_STARTED", "RUN_FINISHED"]);
    assert!(
        matches!(&out[1].body, AguiEventBody::RunFinished { outcome: Some(o), .. } if o == &json!({"type": "cancelled"}))
    );
}

#[test]
fn replayed_calls_approvals_and_a_stream_that_ends_early() {
    let mut m = mapper();
    let replayed =
        event(2, "syscall", json!({"seq": 1, "method": "llm.chat", "status": "ok", "replayed": true}));
    assert_eq!(needs_entry(&replayed), None, "a replayed call was shown when it ran");
    assert_eq!(needs_entry(&syscall(3, 1, "llm.chat")), Some(1));
    assert_eq!(needs_entry(&syscall(3, 1, "mem.put")), None);
    let mut out = m.step(Step::Event { event: &replayed, entry: None, output: None });
    let approval = event(3, "approval", json!({"call": 4, "tool": "kv.put", "args": {}, "kind": "approval"}));
    out.extend(m.step(Step::Event { event: &approval, entry: None, output: None }));
    out.extend(m.step(Step::Event {
        event: &event(4, "decision", json!({"call": 4, "approve": true})),
        entry: None,
        output: None,
    }));
    let denied = entry(4, "tool.call", "error", json!({"name": "kv.put", "args": {"k": 1}}), None);
    out.extend(m.step(Step::Event {
        event: &syscall(5, 4, "tool.call"),
        entry: Some(&denied),
        output: None,
    }));
    out.extend(m.step(Step::Ended));
    assert_eq!(
        names(&out),
        [
            "RUN_STARTED",
            "CUSTOM:keel.approval",
            "CUSTOM:keel.decision",
            "TOOL_CALL_START:run_x-c4:kv.put",
            "TOOL_CALL_ARGS:{\"k\":1}",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT:run_x-c4:{\"error\":{\"message\":\"refused\"}}",
            "RUN_ERROR",
        ]
    );
    assert!(m.finished());
}
