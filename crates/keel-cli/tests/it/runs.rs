//! Runs started with `keel run`, embedded and against a daemon.

use crate::harness::{Keel, agent};

#[test]
fn quickstart_completes_offline_with_an_embedded_kernel() {
    let keel = Keel::new();
    let out = keel.run(&[
        "run",
        "--llm-script",
        "examples/quickstart/script.json",
        "--",
        "python3",
        "examples/quickstart/agent.py",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "quickstart failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("[step 3/3]"), "{stdout}");
    assert!(stderr.contains("llm.chat"), "kernel lines show the journal: {stderr}");
    assert!(stderr.contains("succeeded"), "{stderr}");
    let runs = keel.json(&["ps", "--json"]);
    let run = &runs[0];
    assert_eq!(run["state"], "succeeded");
    for field in ["run_id", "created_at", "usage"] {
        assert!(run.get(field).is_some(), "ps --json lacks {field}: {run}");
    }
    let view = keel.inspect(run["run_id"].as_str().unwrap());
    assert_eq!(view["state"], "succeeded");
    assert!(view["output"]["summary"].is_string(), "{}", view["output"]);
    let journal = view["journal"].as_array().unwrap();
    let llm = journal.iter().filter(|e| e["method"] == "llm.chat").count();
    assert_eq!(llm as u64, view["provider_calls"].as_u64().unwrap());
    assert!(llm >= 4, "the quickstart calls the LLM several times");
    assert!(journal.iter().all(|e| e["status"] == "ok" && e["seq"].is_u64()));
}

#[test]
fn agent_output_passes_through_and_exit_status_is_the_agents() {
    let keel = Keel::new();
    let out = keel.run(&["run", "--quiet", "--", "python3", &agent("echo_agent.py")]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from agent\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "warn\n");

    let out = keel.run(&["run", "--quiet", "--", "python3", &agent("fail_agent.py")]);
    assert_eq!(out.status.code(), Some(3), "keel run exits with the agent's status");
    let runs = keel.json(&["ps", "--json"]);
    assert_eq!(runs[0]["state"], "failed");
    assert!(runs[0]["error"].as_str().unwrap().contains("status 3"), "{}", runs[0]);
    let logs = keel.ok(&["logs", runs[1]["run_id"].as_str().unwrap()]);
    assert!(logs.contains("hello from agent"), "{logs}");
}

#[test]
fn detached_runs_go_to_the_daemon() {
    let mut keel = Keel::new();
    let out = keel.run(&["run", "--detach", "--", "python3", &agent("echo_agent.py")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("keel serve"), "says how to start a daemon");

    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("echo_agent.py")]);
    let view = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(view["output"], serde_json::json!({"message": "hello", "n": 1}));
    assert_eq!(view["usage"]["tool_calls"], 1);
    let logs = keel.ok(&["logs", &run, "-f"]);
    assert!(logs.contains("hello from agent"), "{logs}");
    // The API gives the events of the kinds asked for, and refuses a kind it does not know.
    let (status, body) = keel.http("GET", &format!("/v1/runs/{run}/events?kinds=stdout,state"), true);
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let kinds: Vec<&str> =
        page["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"stdout") && kinds.contains(&"state"), "{kinds:?}");
    assert!(kinds.iter().all(|k| ["stdout", "state"].contains(k)), "{kinds:?}");
    assert_eq!(page["complete"], true);
    let (status, body) = keel.http("GET", &format!("/v1/runs/{run}/events?kinds=stdout,syscalls"), true);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown event kind \\\"syscalls\\\"") && body.contains("syscall"), "{body}");
    // A follower of some kinds ends with the run all the same.
    let (status, body) = keel.http("GET", &format!("/v1/runs/{run}/events?follow=true&kinds=stderr"), true);
    assert_eq!(status, 200, "{body}");
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data:")).collect();
    assert_eq!(data.len(), 1, "{body}");
    assert!(data[0].contains("\"warn\""), "{body}");
    let ps = keel.ok(&["ps"]);
    assert!(ps.contains(&run) && ps.contains("succeeded"), "{ps}");
}

#[test]
fn concurrent_calls_are_each_served_once() {
    let keel = Keel::new();
    let script = agent("concurrent_script.json");
    let out = keel.run(&[
        "run",
        "--quiet",
        "--llm-script",
        &script,
        "--",
        "python3",
        &agent("concurrent_agent.py"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = keel.json(&["ps", "--json"]);
    assert_eq!(runs[0]["provider_calls"], 12);
    assert_eq!(runs[0]["output"]["replies"].as_array().unwrap().len(), 12);
}

#[test]
fn the_daemons_default_script_serves_runs_that_bring_none() {
    let mut keel = Keel::new();
    let script = agent("crash_script.json");
    keel.start_daemon_with(&["--llm-script", &script]);
    let run = keel.detach(&["--", "python3", &agent("crash_agent.py")]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["provider_calls"], 12);

    // Without any script, llm.chat says how to configure one.
    let keel = Keel::new();
    let out = keel.run(&["run", "--", "python3", &agent("crash_agent.py")]);
    assert!(!out.status.success());
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().unwrap().to_owned();
    let logs = keel.run(&["logs", &run]);
    let stderr = String::from_utf8_lossy(&logs.stderr);
    assert!(stderr.contains("no_provider") && stderr.contains("--llm-script"), "{stderr}");
}
