//! Agents that render UI: `ui.show` blocks are journaled and become `ui` events in order
//! (once, even across a crash), bad blocks leave no trace, and `human.ask` with a form
//! takes only an answer that matches the form.

use keel_kernel::{Answer, Command};
use keel_protocol::rpc::MAX_UI_BLOCK_BYTES;
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use serde_json::{Value, json};

use crate::harness::{TestKernel, in_background, methods, refusal, wait_for};

/// The run's `ui` events' data, in order.
fn ui_events(test: &TestKernel, run: &RunId) -> Vec<Value> {
    test.events(run).into_iter().filter(|e| e.kind == "ui").map(|e| e.data).collect()
}

fn wait_ui_events(test: &TestKernel, run: &RunId, count: usize) -> Vec<Value> {
    wait_for(&format!("{count} ui events of {run}"), || {
        Some(ui_events(test, run)).filter(|e| e.len() >= count)
    })
}

fn form() -> Value {
    json!({
        "type": "object",
        "properties": {
            "approve": {"type": "boolean"},
            "amount": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "required": ["approve"],
        "additionalProperties": false,
    })
}

#[test]
fn each_block_type_is_journaled_and_shown_in_order() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
    let seqs = [
        agent.show_table(
            &["name", "n"],
            &[vec![json!("a"), json!(1)], vec![json!(null), json!(true)]],
            Some("T"),
        ),
        agent.show_chart("line", &["q1", "q2"], &[("revenue", vec![1.0, 2.5])], None),
        agent.show_markdown("# Done"),
        agent.show_progress(0.5, Some("half")),
        agent.show_form("contact", &schema, Some("Who?")),
        agent.show(&json!({"type": "progress", "value": 1})),
    ]
    .map(|seq| seq.expect("the block is shown"));
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "each result is the block's journal seq");
    let journal = test.journal(&run);
    assert_eq!(methods(&journal), vec![("ui.show", EntryStatus::Ok); 6]);

    let events = wait_ui_events(&test, &run, 6);
    let shown: Vec<(u64, &str)> =
        events.iter().map(|e| (e["seq"].as_u64().unwrap(), e["block"]["type"].as_str().unwrap())).collect();
    assert_eq!(
        shown,
        [(1, "table"), (2, "chart"), (3, "markdown"), (4, "progress"), (5, "form"), (6, "progress")]
    );
    assert_eq!(
        events[0]["block"],
        json!({"type": "table", "title": "T", "columns": ["name", "n"], "rows": [["a", 1], [null, true]]})
    );
    assert_eq!(
        events[1]["block"],
        json!({"type": "chart", "kind": "line", "labels": ["q1", "q2"], "series": [{"name": "revenue", "values": [1.0, 2.5]}]})
    );
    assert_eq!(
        events[4]["block"],
        json!({"type": "form", "id": "contact", "title": "Who?", "schema": schema})
    );
}

#[test]
fn a_bad_block_is_refused_naming_the_field_and_nothing_is_journaled() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let cases = [
        (
            json!({"type": "gauge"}),
            "invalid_params",
            "block.type: expected one of table, chart, markdown, progress, form",
        ),
        (
            json!({"type": "table", "columns": ["a", "b"], "rows": [["x"]]}),
            "invalid_params",
            "block.rows[0]: has 1 cells but block.columns has 2",
        ),
        (
            json!({"type": "chart", "kind": "pie", "labels": [], "series": []}),
            "invalid_params",
            "block.kind: expected one of line, bar",
        ),
        (
            json!({"type": "chart", "kind": "bar", "labels": ["a"], "series": [{"name": "s", "values": []}]}),
            "invalid_params",
            "block.series[0].values: has 0 values but block.labels has 1",
        ),
        (json!({"type": "markdown"}), "invalid_params", "block.text: missing"),
        (
            json!({"type": "progress", "value": -0.1}),
            "invalid_params",
            "block.value: expected a number from 0 to 1",
        ),
        (
            json!({"type": "form", "id": "f", "schema": {"type": "object", "allOf": []}}),
            "invalid_params",
            "block.schema: `allOf` is not supported",
        ),
        (
            json!({"type": "markdown", "text": "x".repeat(MAX_UI_BLOCK_BYTES)}),
            "too_large",
            "over the limit of 262144",
        ),
    ];
    for (block, kind, expected) in cases {
        let (got_kind, _, message) = refusal(agent.show(&block));
        assert_eq!(got_kind, kind, "{message}");
        assert!(message.contains(expected), "{message}");
    }
    let (kind, _, message) = refusal(
        agent.call::<Value>("ui.show", json!({"block": {"type": "markdown", "text": "x"}, "extra": 1})),
    );
    assert_eq!(kind, "invalid_params", "{message}");
    assert!(test.journal(&run).is_empty(), "a refused block leaves no trace");
    // Nothing was shown either: the next good block is the first event and seq 1.
    assert_eq!(agent.show_markdown("ok").unwrap(), 1);
    assert_eq!(wait_ui_events(&test, &run, 1).len(), 1);
}

#[test]
fn a_replayed_ui_show_is_not_shown_twice() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    agent.show_markdown("one").unwrap();
    agent.show_progress(0.5, None).unwrap();
    wait_ui_events(&test, &run, 2);

    test.crash_and_restart();
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    let mut agent = test.agent(&run);
    assert_eq!(agent.show_markdown("one").unwrap(), 1, "answered from the journal");
    assert_eq!(agent.show_progress(0.5, None).unwrap(), 2);
    assert_eq!(agent.show_markdown("three").unwrap(), 3, "the first new block goes live");
    let events = wait_ui_events(&test, &run, 3);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3], "each block is shown once");
    test.wait_event(&run, "syscall", json!({"method": "ui.show", "seq": 1, "replayed": true}));
    assert_eq!(ui_events(&test, &run).len(), 3);
}

#[test]
fn a_form_question_takes_only_a_value_matching_its_form() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let asked = in_background(move || agent.ask_form("Approve the refund?", &form()));
    test.wait_waiting(&run, WaitReason::Human);
    let view = wait_for("the open question", || Some(test.view(&run)).filter(|v| v.question.is_some()));
    assert_eq!(view.question.as_deref(), Some("Approve the refund?"));
    assert_eq!(view.question_form, Some(form()));
    test.wait_event(&run, "question", json!({"question": "Approve the refund?", "form": form()}));

    let answer = |answer: Answer| test.execute(Command::Answer { run: run.clone(), answer });
    let refused = |outcome: keel_kernel::Result<_>| match outcome {
        Err(keel_kernel::Error::InvalidRequest(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    for (bad, expected) in [
        (Answer::Value(json!({"approve": "yes"})), "value.approve: expected a boolean, got \"yes\""),
        (Answer::Value(json!({"amount": 5})), "value.approve: is required"),
        (Answer::Value(json!({"approve": true, "amount": 500})), "value.amount: must be at most 100"),
        (Answer::Value(json!({"approve": true, "note": "x"})), "value.note: unknown property"),
        (Answer::Text("yes".into()), "the text answer is not JSON"),
        (Answer::Text("{\"approve\": 1}".into()), "value.approve: expected a boolean, got 1"),
    ] {
        let message = refused(answer(bad));
        assert!(message.contains(expected), "{message}");
    }
    let journal = test.journal(&run);
    assert_eq!(methods(&journal), [("human.ask", EntryStatus::Pending)], "nothing was recorded");
    assert_eq!(test.get(&run).state, RunState::Waiting, "the run still waits");
    assert_eq!(test.view(&run).question_form, Some(form()), "the question is still open");

    // Text holding the value as JSON is an answer too.
    answer(Answer::Text("{\"approve\": true, \"amount\": 42}".into())).expect("the answer is taken");
    let value = asked.join().unwrap().expect("the agent gets its answer");
    assert_eq!(value, json!({"approve": true, "amount": 42}));
    let entry = &test.journal(&run)[0];
    assert_eq!(entry.status, EntryStatus::Ok);
    let result = entry.result.clone().unwrap();
    assert_eq!(result["value"], value, "the structured value is journaled");
    assert_eq!(serde_json::from_str::<Value>(result["answer"].as_str().unwrap()).unwrap(), value);
    test.wait_event(&run, "answer", json!({"seq": 1, "value": value}));
}

#[test]
fn a_plain_question_refuses_a_value_and_a_form_answer_is_replayed_after_a_crash() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let plain = in_background(move || (agent.ask("ok?"), agent));
    test.wait_waiting(&run, WaitReason::Human);
    wait_for("the open question", || test.view(&run).question);
    assert_eq!(test.view(&run).question_form, None);
    let message = match test
        .execute(Command::Answer { run: run.clone(), answer: Answer::Value(json!({"ok": true})) })
    {
        Err(keel_kernel::Error::InvalidRequest(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(message.contains("has no form, so it takes a text answer"), "{message}");
    test.execute(Command::Answer { run: run.clone(), answer: Answer::Text("yes".into()) }).unwrap();
    let (text, mut agent) = plain.join().unwrap();
    assert_eq!(text.unwrap(), "yes", "a plain answer is unchanged");

    let asked = in_background(move || agent.ask_form("How much?", &form()));
    test.wait_run(&run, "the form question", |r| r.state == RunState::Waiting);
    wait_for("the form question", || test.view(&run).question_form);
    test.execute(Command::Answer { run: run.clone(), answer: Answer::Value(json!({"approve": false})) })
        .unwrap();
    assert_eq!(asked.join().unwrap().unwrap(), json!({"approve": false}));

    test.crash_and_restart();
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    let mut agent = test.agent(&run);
    assert_eq!(agent.ask("ok?").unwrap(), "yes");
    assert_eq!(agent.ask_form("How much?", &form()).unwrap(), json!({"approve": false}), "replayed durably");
    assert_eq!(
        methods(&test.journal(&run)),
        [("human.ask", EntryStatus::Ok), ("human.ask", EntryStatus::Ok)],
        "replay asked nothing again"
    );
}

#[test]
fn a_question_with_a_form_outside_the_schema_subset_is_refused() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    for (form, expected) in [
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/x"}}}),
            "form.properties.a: `$ref` is not supported",
        ),
        (json!({"type": "array"}), "form.type: a form's schema must have \"type\": \"object\""),
        (json!("name"), "form: expected a JSON schema object"),
    ] {
        let (kind, _, message) = refusal(agent.ask_form("?", &form));
        assert_eq!(kind, "invalid_params", "{message}");
        assert!(message.contains(expected), "{message}");
    }
    assert!(test.journal(&run).is_empty());
}
