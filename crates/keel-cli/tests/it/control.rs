//! Operator controls: stop (the whole tree dies), pause/resume, answering human.ask, also
//! across a daemon restart.

use crate::harness::{Keel, agent, alive, proc_state, wait_for};

#[test]
fn stop_kills_the_whole_tree_even_when_it_ignores_sigterm() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let pid_file = keel.data.path().join("stubborn.pids");
    let env = format!("STUBBORN_PID_FILE={}", pid_file.display());
    // Tier `none`: the agent reports host pids in a file under the data directory, which a
    // sandboxed agent can neither see nor write. `sandbox::stop_kills_every_process_of_a_sandbox`
    // is this test for the process sandbox.
    let run = keel.detach(&["--sandbox", "none", "--env", &env, "--", "python3", &agent("stubborn.py")]);
    let pids: Vec<u32> = wait_for("the agent's pids", || {
        let text = std::fs::read_to_string(&pid_file).ok()?;
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (pids.len() == 2).then_some(pids)
    });
    assert!(pids.iter().all(|&p| alive(p)));
    let stopped = keel.json(&["stop", &run, "--grace", "1", "--json"]);
    assert_eq!(stopped["state"], "cancelled");
    for pid in pids {
        wait_for(&format!("pid {pid} to die"), || (!alive(pid)).then_some(()));
    }
    let again = keel.run(&["stop", &run]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("cancelled"), "explains why");
}

#[test]
fn pause_freezes_and_resume_continues() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let script = agent("crash_script.json");
    let run = keel.detach(&[
        "--llm-script",
        &script,
        "--env",
        "CRASH_AGENT_DELAY_MS=100",
        "--",
        "python3",
        &agent("crash_agent.py"),
    ]);
    let view = keel.wait_state(&run, &["running"]);
    let pid = view["pid"].as_u64().unwrap() as u32;
    assert_eq!(keel.json(&["pause", &run, "--json"])["state"], "paused");
    wait_for("the agent to be stopped", || (proc_state(pid) == Some('T')).then_some(()));
    let err = keel.run(&["pause", &run]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("already paused"));
    assert_eq!(keel.json(&["resume", &run, "--json"])["state"], "running");
    let done = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(done["output"]["replies"].as_array().unwrap().len(), 12);
}

#[test]
fn human_ask_waits_durably_across_a_daemon_kill() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("ask_agent.py")]);
    let view = keel.wait_state(&run, &["waiting"]);
    assert_eq!(view["wait_reason"], "human");
    assert_eq!(view["question"], "approve?");

    keel.kill_daemon();
    keel.start_daemon();
    let view = keel.wait_state(&run, &["waiting"]);
    assert!(view["attempt"].as_u64().unwrap() >= 2, "relaunched: {view}");
    assert_eq!(view["question"], "approve?");

    let answered = keel.json(&["answer", &run, "--text", "yes", "--print-json"]);
    assert_ne!(answered["state"], "waiting");
    let done = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(done["output"], serde_json::json!({"answer": "yes"}));
    let asks: Vec<_> =
        done["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "human.ask").collect();
    assert_eq!(asks.len(), 1, "the question was journaled once");

    let err = keel.run(&["answer", &run, "--text", "again"]);
    assert!(!err.status.success());
}
