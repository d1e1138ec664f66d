//! Governed tool calls: a call outside the run's grant is denied and audited, an unknown
//! tool within the grant is `not_found`, arguments that fail the schema are
//! `invalid_params` naming the path, all before anything is journaled; a read-only tool
//! is journaled complete at once.

use std::path::Path;

use keel_types::EntryStatus;
use serde_json::json;

use crate::harness::{Setup, TestKernel, methods, refusal, wait_for};

fn list_tool(_scratch: &Path) -> Setup {
    let keel_toml = r#"
[[tools.command]]
name = "sum"
description = "adds numbers"
command = ["/bin/cat"]
input_schema = { type = "object", required = ["items"], properties = { items = { type = "array", items = { type = "integer" } } } }
"#;
    Setup { keel_toml: keel_toml.into(), ..Setup::default() }
}

#[test]
fn a_tool_outside_the_grant_is_denied_audited_and_not_journaled() {
    let test = TestKernel::start();
    let run = test.create_run(json!({ "grant": ["echo"] }));
    let mut agent = test.agent(&run);
    let (kind, code, message) = refusal(agent.tool("kv.put", json!({"key": "k", "value": 1})));
    assert_eq!((kind.as_str(), code), ("denied", 1001));
    assert!(message.contains("not granted"), "{message}");
    // Outside the grant, a name that is no tool at all is denied alike: nothing leaks.
    assert_eq!(refusal(agent.tool("no.such.tool", json!({}))).0, "denied");
    assert!(test.journal(&run).is_empty());
    let audit = wait_for("two audited denials", || Some(test.audit(&run)).filter(|a| a.len() == 2));
    let record = &audit[0].record;
    assert_eq!(
        (record.actor.as_str(), record.action.as_str(), record.subject.as_str(), record.outcome.as_str()),
        ("agent", "tool.denied", "kv.put", "denied")
    );
    assert_eq!(record.detail["args"], json!({"key": "k", "value": 1}));
    assert_eq!(record.detail["grant"], json!(["echo"]));
}

#[test]
fn an_unknown_tool_within_the_grant_is_not_found() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let (kind, code, _) = refusal(agent.tool("kv.nope", json!({})));
    assert_eq!((kind.as_str(), code), ("not_found", 1002));
    assert!(test.journal(&run).is_empty());
}

#[test]
fn arguments_failing_the_schema_are_invalid_params_naming_the_path() {
    let test = TestKernel::start_with(list_tool);
    let run = test.create_run(json!({ "grant": ["sum", "kv.*"] }));
    let mut agent = test.agent(&run);
    let (kind, code, message) = refusal(agent.tool("sum", json!({"items": [1, "two"]})));
    assert_eq!((kind.as_str(), code), ("invalid_params", -32602));
    assert!(message.contains("args.items[1]"), "the path of the bad value: {message}");
    let (kind, _, message) = refusal(agent.tool("kv.put", json!({"value": 1})));
    assert_eq!(kind, "invalid_params");
    assert!(message.contains("key"), "the missing field: {message}");
    let (kind, _, message) =
        refusal(agent.call::<serde_json::Value>("tool.call", json!({"name": "sum", "args": [1]})));
    assert_eq!(kind, "invalid_params");
    assert!(message.contains("must be a JSON object"), "{message}");
    assert!(test.journal(&run).is_empty(), "a refused call leaves nothing to replay");
}

#[test]
fn a_read_only_tool_is_journaled_complete_at_once() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    assert_eq!(agent.tool("echo", json!({"a": [1, 2]})).unwrap(), json!({"a": [1, 2]}));
    let journal = test.journal(&run);
    assert_eq!(methods(&journal), [("tool.call", EntryStatus::Ok)]);
    assert_eq!(journal[0].result, Some(json!({"result": {"a": [1, 2]}})));
    assert_eq!(journal[0].usage.tool_calls, 1);
    // Appended complete, not as an intent completed later: one timestamp for both ends.
    assert_eq!(journal[0].finished_at_ms, Some(journal[0].started_at_ms));
    // A tool with an effect gets its intent first; its entry ends complete too.
    agent.tool("kv.put", json!({"key": "k", "value": 2})).unwrap();
    assert_eq!(agent.tool("kv.get", json!({"key": "k"})).unwrap(), json!(2));
    let journal = test.journal(&run);
    assert!(journal.iter().all(|e| e.status == EntryStatus::Ok), "{journal:#?}");
    let audit = wait_for("three audited calls", || Some(test.audit(&run)).filter(|a| a.len() == 3));
    let subjects: Vec<(&str, &str)> =
        audit.iter().map(|e| (e.record.subject.as_str(), e.record.outcome.as_str())).collect();
    assert_eq!(subjects, [("echo", "ok"), ("kv.put", "ok"), ("kv.get", "ok")]);
}
