//! Parking and swapping: with `keel serve --swap-after 1`, a run waiting for a message, an
//! answer, a child or a timer has its agent process stopped; the wait stays durable (also
//! across a daemon SIGKILL), and when it ends the run is relaunched by replay and finishes.

use serde_json::{Value, json};

use crate::harness::{Keel, agent, alive, wait_for};

fn swapped(keel: &Keel, run: &str) -> Value {
    wait_for(&format!("run {run} to be swapped out"), || {
        let view = keel.inspect(run);
        (view["swapped"] == true).then_some(view)
    })
}

fn proc_run(keel: &Keel, plan: Value) -> String {
    let input = plan.to_string();
    keel.detach(&["--sandbox", "none", "--input", &input, "--", "python3", &agent("proc_agent.py")])
}

#[test]
fn a_run_waiting_for_a_message_is_swapped_out_and_back_in_even_across_a_restart() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--swap-after", "1"]);
    let run = proc_run(&keel, json!({"recv": true}));
    let first = keel.wait_state(&run, &["waiting"]);
    let pid = first["pid"].as_u64().expect("a resident agent has a pid") as u32;
    let view = swapped(&keel, &run);
    assert_eq!(view["wait_reason"], "message");
    assert!(view["pid"].is_null(), "{view}");
    wait_for("the agent process to be gone", || (!alive(pid)).then_some(()));
    assert!(keel.ok(&["ps"]).contains("swapped:message"));
    // Still swapped out after a kernel restart: no process is started for it.
    keel.kill_daemon();
    keel.start_daemon_with(&["--swap-after", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let view = keel.inspect(&run);
    assert_eq!(view["swapped"], true, "{view}");
    keel.ok(&["send", &run, "--json", r#"{"hello": "swapped"}"#]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["message"], json!({"hello": "swapped"}));
    assert!(done["attempt"].as_u64().unwrap() >= 2, "relaunched by replay: {done}");
    let recvs = done["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "ipc.recv").count();
    assert_eq!(recvs, 1, "the wait is one journal entry, answered once");
}

#[test]
fn answers_children_and_timers_bring_swapped_runs_back() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--swap-after", "1"]);
    // A human answer.
    let asker = keel.detach(&["--sandbox", "none", "--", "python3", &agent("ask_agent.py")]);
    swapped(&keel, &asker);
    keel.ok(&["answer", &asker, "--text", "yes"]);
    let done = keel.wait_state(&asker, &["succeeded", "failed"]);
    assert_eq!(done["output"], json!({"answer": "yes"}), "{done}");
    // A child that ends.
    let child = json!({"command": ["python3", agent("proc_agent.py")], "input": {"recv": true}});
    let parent = proc_run(&keel, json!({"spawn": [child], "wait": true}));
    let view = swapped(&keel, &parent);
    assert_eq!(view["wait_reason"], "child");
    let spawned = view["journal"].as_array().unwrap().iter().find(|e| e["method"] == "proc.spawn").unwrap()["result"]
        ["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    swapped(&keel, &spawned);
    keel.ok(&["send", &spawned, "--json", "1"]);
    let done = keel.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(done["output"]["waited"][0]["state"], "succeeded", "{done}");
    // A timer.
    let sleeper = proc_run(&keel, json!({"sleep_ms": 3000}));
    let view = swapped(&keel, &sleeper);
    assert_eq!(view["wait_reason"], "timer");
    let done = keel.wait_state(&sleeper, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["output"]["slept_ms"].as_u64().unwrap() >= 3000, "{done}");
}

#[test]
fn messages_that_arrive_while_runs_are_being_swapped_out_are_received_once() {
    // Messages are sent across the moment each run is swapped out (1 s after it starts
    // waiting, checked every 250 ms): some arrive before, some while its agent is being
    // stopped, some after. Every run must end with its own message, received once, and
    // no run may be left running without a process or relaunched twice.
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--swap-after", "1"]);
    let runs: Vec<String> = (0..12).map(|_| proc_run(&keel, json!({"recv": true}))).collect();
    for run in &runs {
        keel.wait_state(run, &["waiting"]);
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    for (i, run) in runs.iter().enumerate() {
        keel.ok(&["send", run, "--json", &json!({"n": i}).to_string()]);
        std::thread::sleep(std::time::Duration::from_millis(90));
    }
    for (i, run) in runs.iter().enumerate() {
        let done = keel.wait_state(run, &["succeeded", "failed", "cancelled"]);
        assert_eq!(done["state"], "succeeded", "{done}");
        assert_eq!(done["output"]["message"], json!({"n": i}), "{done}");
        let recvs = done["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "ipc.recv").count();
        assert_eq!(recvs, 1, "{done}");
    }
}
