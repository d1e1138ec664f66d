//! Process trees end to end: the team example (a supervisor, three workers, messages,
//! `keel ps --tree`), stopping a parent stops every descendant process, a parent's spawn
//! and wait survive a daemon SIGKILL without a duplicate child, and `sys.sleep` is a
//! durable timer.

use serde_json::{Value, json};

use crate::harness::{Keel, agent, alive, repo_root, wait_for};

fn proc_run(keel: &Keel, plan: Value) -> String {
    let input = plan.to_string();
    keel.detach(&["--sandbox", "none", "--input", &input, "--", "python3", &agent("proc_agent.py")])
}

#[test]
fn the_team_example_runs_a_supervisor_and_three_workers() {
    let mut keel = Keel::new();
    let script = repo_root().join("examples/team/script.json");
    keel.start_daemon_with(&["--llm-script", script.to_str().unwrap()]);
    let run = keel.detach(&["--", "python3", "examples/team/supervisor.py"]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.run(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{done}\n{}", String::from_utf8_lossy(&logs.stdout));
    let workers: Vec<String> = done["output"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(workers.len(), 3);
    let results = done["output"]["results"].to_string();
    assert!(results.contains("worker-1: A sandbox per agent"), "{results}");
    assert!(done["output"]["summary"].as_str().unwrap().contains("isolation, durability and governance"));
    for worker in &workers {
        let view = keel.inspect(worker);
        assert_eq!(view["state"], "succeeded", "{view}");
        assert_eq!(view["parent"], run.as_str());
    }
    let tree = keel.ok(&["ps", "--tree"]);
    let lines: Vec<&str> = tree.lines().collect();
    let top = lines.iter().position(|l| l.starts_with(&run)).expect("the supervisor is a root");
    for worker in &workers {
        let line = lines.iter().position(|l| l.contains(&format!("└─ {worker}"))).expect("worker under it");
        assert!(line > top, "{tree}");
    }
}

#[test]
fn stopping_a_parent_stops_every_descendant() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let grandchild = json!({"command": ["python3", agent("proc_agent.py")], "input": {"sleep_ms": 600000}});
    let child = json!({"command": ["python3", agent("proc_agent.py")],
        "input": {"spawn": [grandchild], "wait": true}});
    let parent = proc_run(&keel, json!({"spawn": [child.clone(), child], "wait": true}));
    let tree = wait_for("the tree of 1 + 2 + 2 runs to be up", || {
        let runs = keel.json(&["ps", "--json"]);
        let runs = runs.as_array()?;
        (runs.len() == 5 && runs.iter().all(|r| r["pid"].as_u64().is_some())).then(|| runs.clone())
    });
    let parent_view = keel.wait_state(&parent, &["waiting"]);
    assert_eq!(parent_view["wait_reason"], "child");
    keel.ok(&["stop", &parent, "--grace", "0"]);
    for run in &tree {
        let id = run["run_id"].as_str().unwrap();
        let view = keel.wait_state(id, &["cancelled", "succeeded", "failed"]);
        assert_eq!(view["state"], "cancelled", "{view}");
        let pid = run["pid"].as_u64().unwrap() as u32;
        wait_for("the run's process to be gone", || (!alive(pid)).then_some(()));
    }
}

#[test]
fn spawn_and_wait_survive_a_daemon_kill_without_a_second_child() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let child = json!({"command": ["python3", agent("proc_agent.py")], "input": {"recv": true}});
    let parent = proc_run(&keel, json!({"spawn": [child], "wait": true}));
    let waiting = keel.wait_state(&parent, &["waiting"]);
    assert_eq!(waiting["wait_reason"], "child");
    keel.kill_daemon();
    keel.start_daemon();
    wait_for("two runs, recovered", || {
        let runs = keel.json(&["ps", "--json"]);
        (runs.as_array()?.len() == 2).then_some(())
    });
    let view = keel.inspect(&parent);
    let children: Vec<&Value> =
        view["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "proc.spawn").collect();
    assert_eq!(children.len(), 1, "{view}");
    let child = children[0]["result"]["run_id"].as_str().unwrap().to_owned();
    keel.ok(&["send", &child, "--json", r#"{"go": true}"#]);
    let done = keel.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["waited"][0]["state"], "succeeded");
    assert_eq!(done["output"]["waited"][0]["output"]["message"], json!({"go": true}));
    assert_eq!(keel.json(&["ps", "--json"]).as_array().unwrap().len(), 2, "no second child was started");
}

#[test]
fn sys_sleep_is_a_durable_timer() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = proc_run(&keel, json!({"sleep_ms": 3000}));
    let waiting = keel.wait_state(&run, &["waiting"]);
    assert_eq!(waiting["wait_reason"], "timer");
    keel.kill_daemon();
    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    let sleep =
        done["journal"].as_array().unwrap().iter().find(|e| e["method"] == "sys.sleep").unwrap().clone();
    // The wake time is the first attempt's start + 3 s, kept across the restart.
    assert_eq!(sleep["result"]["woke_at"].as_u64().unwrap(), sleep["started_at"].as_u64().unwrap() + 3000);
    assert!(done["output"]["slept_ms"].as_u64().unwrap() >= 3000, "{done}");
}

#[test]
fn runs_register_names_and_receive_signals_as_events() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let planner = proc_run(&keel, json!({"register": "planner", "recv": true}));
    wait_for("the name to be registered", || {
        let view = keel.inspect(&planner);
        view["journal"].as_array()?.iter().any(|e| e["method"] == "ipc.register").then_some(())
    });
    // The name is taken while its holder lives.
    let rival = proc_run(&keel, json!({"register": "planner"}));
    let rival = keel.wait_state(&rival, &["succeeded", "failed"]);
    assert_eq!(rival["output"]["registered"], "denied", "{rival}");
    let sender = proc_run(&keel, json!({"send_to": ["planner", {"plan": "ship it"}]}));
    keel.wait_state(&sender, &["succeeded", "failed"]);
    let done = keel.wait_state(&planner, &["succeeded", "failed"]);
    assert_eq!(done["output"]["message"], json!({"plan": "ship it"}), "{done}");
    // Free again once its holder ended.
    let next = proc_run(&keel, json!({"register": "planner"}));
    assert_eq!(keel.wait_state(&next, &["succeeded", "failed"])["output"]["registered"], true);

    // An operator's signal arrives as an event, with its data.
    let listener = proc_run(&keel, json!({"recv": true}));
    keel.wait_state(&listener, &["waiting"]);
    let out = keel.run(&["signal", &listener, "reload", "--json", r#"{"why": "config"}"#]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = keel.wait_state(&listener, &["succeeded", "failed"]);
    assert_eq!(done["output"]["received"]["topic"], "signal", "{done}");
    assert_eq!(done["output"]["message"], json!({"signal": "reload", "data": {"why": "config"}}));
    let bad = keel.run(&["signal", &listener, "pause"]);
    assert!(!bad.status.success());
    // A parent's custom signal reaches its child the same way.
    let child = json!({"command": ["python3", agent("proc_agent.py")], "input": {"recv": true}});
    let parent = proc_run(&keel, json!({"spawn": [child], "signal_children": "wrap-up", "wait": true}));
    let done = keel.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(
        done["output"]["waited"][0]["output"]["message"],
        json!({"signal": "wrap-up", "data": null}),
        "{done}"
    );
}

#[test]
fn a_childs_budget_is_a_slice_of_its_parents() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&[
        "--sandbox",
        "none",
        "--budget-tool-calls",
        "5",
        "--",
        "python3",
        &agent("slice_agent.py"),
    ]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["output"],
        json!({"second_while_first_runs": "budget_exhausted", "first": "succeeded", "second_after": "succeeded"})
    );
}

#[test]
fn pause_and_resume_reach_the_agent_as_events() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let listener = proc_run(&keel, json!({"recv": true}));
    keel.wait_state(&listener, &["waiting"]);
    keel.ok(&["pause", &listener]);
    keel.ok(&["resume", &listener]);
    let done = keel.wait_state(&listener, &["succeeded", "failed"]);
    assert_eq!(done["output"]["message"], json!({"signal": "pause", "data": null}), "{done}");
    assert_eq!(done["output"]["received"]["topic"], "signal");
}
