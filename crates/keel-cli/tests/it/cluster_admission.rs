//! Admission across the nodes of a cluster (issue 13): `[scheduler]` caps count every
//! node's live runs, a node at its own `--max-live` leaves a new run queued for a node
//! with room, a freed slot goes to the highest priority wherever the run was submitted,
//! and a parent's `proc.wait` wakes for a child that ran on another node.

use serde_json::{Value, json};

use crate::cluster::{TestDatabase, node_with, owners, upstream};
use crate::harness::{Keel, agent, wait_for};

/// A detached run of the process-tree test agent on `node`.
fn run(node: &Keel, priority: &str, plan: Value) -> String {
    crate::scheduler::run(node, priority, plan).expect("the run is accepted")
}

/// The runs in each state, from one node's `keel ps` (every node lists every run).
fn states(node: &Keel) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut states = std::collections::BTreeMap::<String, Vec<String>>::new();
    for view in node.json(&["ps", "--json"]).as_array().unwrap() {
        states
            .entry(view["state"].as_str().unwrap().to_owned())
            .or_default()
            .push(view["run_id"].as_str().unwrap().to_owned());
    }
    states
}

fn count(states: &std::collections::BTreeMap<String, Vec<String>>, wanted: &[&str]) -> usize {
    wanted.iter().map(|state| states.get(*state).map_or(0, Vec::len)).sum()
}

#[test]
fn caps_count_every_node_and_a_queued_run_starts_where_there_is_room() {
    let _serial = crate::cluster::one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, _counts) = upstream(&probe);
    // Three live runs in the whole cluster; n1 holds one at most, n2 three.
    let scheduler = |keel: &Keel| {
        std::fs::write(keel.data.path().join("keel.toml"), "[scheduler]\nmax_live = 3\n").unwrap();
    };
    let n1 = node_with(&db.url, 1, port, crate::cluster::TTL, scheduler, &["--max-live", "1"]);
    let n2 = node_with(&db.url, 2, port, crate::cluster::TTL, scheduler, &["--max-live", "3"]);

    // proc.wait across nodes: a parent on n1 takes n1's one slot, so the child it spawns
    // waits for a node with room: n2 starts it, and the parent wakes when it ends there.
    let child = json!({"command": ["python3", agent("proc_agent.py")], "input": {"sleep_ms": 1500}});
    let parent = run(&n1, "normal", json!({"spawn": [child], "wait": true}));
    let child_id = wait_for("the child to be spawned", || {
        let runs = n1.json(&["ps", "--json"]);
        runs.as_array()?
            .iter()
            .find(|v| v["parent"] == parent.as_str())
            .map(|v| v["run_id"].as_str().unwrap().to_owned())
    });
    wait_for("the child to run on n2", || {
        (owners(&db).get(&child_id).map(String::as_str) == Some("n2")).then_some(())
    });
    assert_eq!(owners(&db).get(&parent).map(String::as_str), Some("n1"), "the parent stays on n1");
    let done = n2.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["waited"][0]["state"], "succeeded", "{done}");
    assert_eq!(
        done["output"]["waited"][0]["output"]["slept_ms"].as_u64().map(|ms| ms >= 1500),
        Some(true),
        "{done}"
    );

    // The global cap counts both nodes: two runs submitted to n1 (one starts there, the
    // other on n2, since n1 is full) and two to n2 (one starts, the other waits: three are
    // live in all).
    let mut held = Vec::new();
    for node in [&n1, &n1, &n2, &n2] {
        held.push(run(node, "normal", json!({"recv": true})));
    }
    wait_for("three live runs and one queued", || {
        let states = states(&n1);
        (count(&states, &["waiting"]) == 3 && count(&states, &["queued"]) == 1).then_some(())
    });
    let leases = owners(&db);
    let on =
        |node: &str| held.iter().filter(|run| leases.get(*run).map(String::as_str) == Some(node)).count();
    assert_eq!((on("n1"), on("n2")), (1, 2), "{leases:?}");
    let queued = held.iter().find(|run| n2.inspect(run)["state"] == "queued").unwrap().clone();
    let reason = n1.inspect(&queued)["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("queued"), "{reason}");

    // A high-priority run submitted to n1 waits too, and takes the first slot to free
    // (on n2) before the older normal one.
    let urgent = run(&n1, "high", json!({}));
    assert_eq!(n1.inspect(&urgent)["state"], "queued");
    let on_n2 = held.iter().find(|run| leases.get(*run).map(String::as_str) == Some("n2")).unwrap();
    n1.ok(&["send", on_n2, "--json", "1"]);
    let urgent_done = n2.wait_state(&urgent, &["succeeded", "failed"]);
    assert_eq!(urgent_done["state"], "succeeded", "{urgent_done}");
    // The normal run could start only once the urgent one had ended: three were live.
    let started = |view: &Value, method: &str| {
        view["journal"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["method"] == method)
            .map(|e| e["started_at"].as_u64().unwrap())
    };
    // Its launch, from its events (its waiting receive journals nothing until a message
    // comes).
    let launched = || {
        let logs = n1.ok(&["logs", &queued, "--json"]);
        logs.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|event| event["kind"] == "launch")
            .and_then(|event| event["ts"].as_u64())
    };
    let waited_from = wait_for("the older normal run to start", launched);
    let urgent_exit = started(&urgent_done, "run.exit").unwrap();
    assert!(urgent_exit <= waited_from, "the urgent run ({urgent_exit}) went first ({waited_from})");

    // Every slot that frees goes on: the rest finish.
    for run in held.iter().filter(|run| **run != *on_n2 && **run != queued) {
        n2.ok(&["send", run, "--json", "1"]);
    }
    n1.ok(&["send", &queued, "--json", "1"]);
    for run in held.iter().chain([&urgent]) {
        assert_eq!(n1.wait_state(run, &["succeeded", "failed"])["state"], "succeeded");
    }
    let states = states(&n2);
    assert_eq!(count(&states, &["queued", "running", "waiting"]), 0, "{states:?}");
}

#[test]
fn a_dead_nodes_live_runs_keep_their_slots_on_the_node_that_takes_them_over() {
    let _serial = crate::cluster::one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, _counts) = upstream(&probe);
    let scheduler = |keel: &Keel| {
        std::fs::write(keel.data.path().join("keel.toml"), "[scheduler]\nmax_live = 2\n").unwrap();
    };
    let mut n1 = node_with(&db.url, 1, port, crate::cluster::TTL, scheduler, &[]);
    let n2 = node_with(&db.url, 2, port, crate::cluster::TTL, scheduler, &[]);
    let live: Vec<String> = (0..2).map(|_| run(&n1, "normal", json!({"recv": true}))).collect();
    for run in &live {
        n1.wait_state(run, &["waiting"]);
    }
    let queued = run(&n2, "normal", json!({"recv": true}));
    assert_eq!(n2.inspect(&queued)["state"], "queued");

    // n1 dies: n2 takes its two runs over when its heartbeat lapses, and they still fill
    // the cluster's two slots, so the queued run keeps waiting.
    n1.kill_daemon();
    wait_for("n2 to take both runs over", || {
        let leases = owners(&db);
        live.iter().all(|run| leases.get(run).map(String::as_str) == Some("n2")).then_some(())
    });
    for run in &live {
        n2.wait_state(run, &["waiting"]);
    }
    assert_eq!(n2.inspect(&queued)["state"], "queued", "the taken-over runs hold both slots");

    // As they end, the queued run starts.
    for run in &live {
        n2.ok(&["send", run, "--json", "1"]);
    }
    n2.wait_state(&queued, &["waiting"]);
    n2.ok(&["send", &queued, "--json", "1"]);
    for run in live.iter().chain([&queued]) {
        assert_eq!(n2.wait_state(run, &["succeeded", "failed"])["state"], "succeeded");
    }
}
