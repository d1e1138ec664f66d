//! Bad input gets a clear error and the kernel stays up: a hostile syscall client,
//! malformed script files, bad arguments.

use crate::harness::{Keel, agent};

#[test]
fn hostile_syscall_client_gets_errors_and_the_daemon_stays_up() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("bad_client.py")]);
    let view = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    assert_eq!(view["state"], "succeeded", "bad_client saw unexpected answers:\n{logs}");
    assert_eq!(view["output"], serde_json::json!({"probe": "bad_client"}));
    // The daemon still serves new runs.
    let next = keel.detach(&["--", "python3", &agent("echo_agent.py")]);
    keel.wait_state(&next, &["succeeded"]);
}

#[test]
fn malformed_scripts_and_arguments_are_refused_with_a_reason() {
    let keel = Keel::new();
    let dir = keel.data.path();
    let cases = [
        ("not json at all", "not valid JSON"),
        (r#"{"responses": []}"#, "empty"),
        (r#"{"responses": [{"content": "x", "colour": 1}]}"#, "colour"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad{i}.json"));
        std::fs::write(&path, text).unwrap();
        let out = keel.run(&["run", "--llm-script", path.to_str().unwrap(), "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(needle) && stderr.contains("--llm-script"), "{stderr}");
    }
    let out = keel.run(&["run", "--llm-script", "/no/such/file.json", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));

    let out = keel.run(&["inspect", "run_nope"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keel ps"),
        "a malformed id says where to find ids"
    );
    let out = keel.run(&["inspect", "run_00000000000000000000000000"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run"));

    let out = keel.run(&["run", "--", "/definitely/not/a/program"]);
    assert!(!out.status.success());
    let runs = keel.json(&["ps", "--json"]);
    assert_eq!(runs[0]["state"], "failed");
    assert!(runs[0]["error"].as_str().unwrap().contains("could not start"), "{}", runs[0]);

    let out = keel.run(&["run", "--env", "KEEL_RUN_TOKEN=forged", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("reserved"));
}
