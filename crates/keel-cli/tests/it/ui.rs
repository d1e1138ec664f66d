//! Agents that render UI, end to end through the `keel` binary: a Python agent shows a
//! block of each type (run events of kind `ui`, in order), asks a question with a form
//! that `keel answer --json` answers with a structured value (a bad one refused clearly),
//! and receives a form submission sent to its mailbox.

use serde_json::{Value, json};

use crate::harness::{Keel, agent};

/// The `ui` events of a run, in order, from `keel logs --json`.
fn ui_events(keel: &Keel, run: &str) -> Vec<Value> {
    keel.ok(&["logs", run, "--json"])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["kind"] == "ui")
        .map(|event| event["data"].clone())
        .collect()
}

#[test]
fn an_agent_shows_blocks_and_a_form_question_is_answered_with_keel_answer_json() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("ui_agent.py")]);
    let view = keel.wait_state(&run, &["waiting"]);
    assert_eq!(view["wait_reason"], "human");
    assert_eq!(view["question"], "Approve the refund?");
    assert_eq!(view["question_form"]["required"], json!(["approve"]));

    let shown: Vec<(u64, String)> = ui_events(&keel, &run)
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["block"]["type"].as_str().unwrap().to_owned()))
        .collect();
    let types: Vec<&str> = shown.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(types, ["table", "chart", "markdown", "progress", "form"]);
    assert!(shown.windows(2).all(|w| w[0].0 < w[1].0), "in journal order: {shown:?}");
    let table = &ui_events(&keel, &run)[0]["block"];
    assert_eq!(table["rows"], json!([["eu", 12], ["us", 30]]));

    // The question and its form, as a person reads them.
    let text = keel.ok(&["inspect", &run]);
    assert!(text.contains("Approve the refund?  (fields amount, approve*; * required)"), "{text}");
    assert!(text.contains(&format!("keel answer {run} --json")), "{text}");
    let ps = keel.ok(&["ps"]);
    assert!(ps.contains("question with a form (fields amount, approve*)"), "{ps}");

    // Bad answers are refused, saying what is wrong, and the run still waits.
    let not_json = keel.run(&["answer", &run, "--json", "{approve: yes}"]);
    assert!(!not_json.status.success());
    let stderr = String::from_utf8_lossy(&not_json.stderr);
    assert!(stderr.contains("--json is not JSON"), "{stderr}");
    let wrong = keel.run(&["answer", &run, "--json", r#"{"approve": true, "amount": 500}"#]);
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("value.amount: must be at most 100"), "{stderr}");
    let plain = keel.run(&["answer", &run, "--text", "yes"]);
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(!plain.status.success() && stderr.contains("the text answer is not JSON"), "{stderr}");
    let view = keel.inspect(&run);
    assert_eq!(
        (view["state"].as_str(), view["question"].as_str()),
        (Some("waiting"), Some("Approve the refund?"))
    );

    let answered =
        keel.json(&["answer", &run, "--json", r#"{"approve": true, "amount": 42}"#, "--print-json"]);
    assert_eq!(answered["run_id"], run.as_str());
    // The agent now waits for the `contact` form's submission, as the console sends it.
    keel.ok(&["send", &run, "--json", r#"{"ui_form": "contact", "value": {"email": "a@b.c"}}"#]);
    let done = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(
        done["output"],
        json!({"answer": {"approve": true, "amount": 42}, "submitted": {"ui_form": "contact", "value": {"email": "a@b.c"}}})
    );
    let asks: Vec<&Value> =
        done["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "human.ask").collect();
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0]["result"]["value"], json!({"approve": true, "amount": 42}), "journaled durably");
    let types: Vec<String> =
        ui_events(&keel, &run).iter().map(|e| e["block"]["type"].as_str().unwrap().to_owned()).collect();
    assert_eq!(types, ["table", "chart", "markdown", "progress", "form", "progress"]);
}

#[test]
fn keel_answer_needs_text_or_json_and_reads_json_from_a_file() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let neither = keel.run(&["answer", "run_00000000000000000000000000"]);
    assert!(!neither.status.success());
    assert!(String::from_utf8_lossy(&neither.stderr).contains("--text"), "names the options");
    let both = keel.run(&["answer", "run_00000000000000000000000000", "--text", "a", "--json", "{}"]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    let missing =
        keel.run(&["answer", "run_00000000000000000000000000", "--json", "@/nonexistent/answer.json"]);
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("could not read --json @/nonexistent/answer.json")
    );

    let run = keel.detach(&["--", "python3", &agent("ui_agent.py")]);
    keel.wait_state(&run, &["waiting"]);
    let file = keel.data.path().join("answer.json");
    std::fs::write(&file, r#"{"approve": false}"#).unwrap();
    keel.ok(&["answer", &run, "--json", &format!("@{}", file.display())]);
    keel.ok(&["send", &run, "--json", r#"{"ui_form": "contact", "value": {}}"#]);
    let done = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(done["output"]["answer"], json!({"approve": false}));
}
