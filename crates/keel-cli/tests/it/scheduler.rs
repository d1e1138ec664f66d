//! Admission control with the real binary: a cap on live runs queues the rest (the queue
//! position shows in `keel ps`), a full queue answers 429 with Retry-After, a freed slot
//! goes to the highest (aged) priority first, and queued runs survive a daemon SIGKILL.

use serde_json::{Value, json};

use crate::harness::{Keel, agent, wait_for};

fn run(keel: &Keel, priority: &str, plan: Value) -> Result<String, String> {
    let input = plan.to_string();
    let out = keel.run(&[
        "run",
        "--detach",
        "--json",
        "--sandbox",
        "none",
        "--priority",
        priority,
        "--input",
        &input,
        "--",
        "python3",
        &agent("proc_agent.py"),
    ]);
    if out.status.success() {
        let value: Value = serde_json::from_slice(&out.stdout).unwrap();
        Ok(value["run_id"].as_str().unwrap().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn exit_time(keel: &Keel, run: &str) -> u64 {
    let view = keel.wait_state(run, &["succeeded", "failed"]);
    assert_eq!(view["state"], "succeeded", "{view}");
    view["journal"].as_array().unwrap().iter().find(|e| e["method"] == "run.exit").unwrap()["started_at"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_cap_queues_runs_a_full_queue_refuses_and_priority_picks_who_starts() {
    let mut keel = Keel::new();
    std::fs::write(keel.data.path().join("keel.toml"), "[scheduler]\nmax_live = 1\nqueue = 2\n").unwrap();
    keel.start_daemon();
    let holder = run(&keel, "normal", json!({"recv": true})).unwrap();
    keel.wait_state(&holder, &["waiting"]);
    let low = run(&keel, "low", json!({})).unwrap();
    let high = run(&keel, "high", json!({})).unwrap();
    let view = keel.inspect(&low);
    assert_eq!(view["state"], "queued", "{view}");
    assert!(view["reason"].as_str().unwrap().starts_with("queued:"), "{view}");
    assert!(keel.ok(&["ps"]).contains("queued"));
    // The queue holds two: a third waiting run is refused with a clear error.
    let refused = run(&keel, "normal", json!({})).unwrap_err();
    assert!(refused.contains("queue is full"), "{refused}");
    // Queued runs survive a daemon kill and stay queued behind the live one.
    keel.kill_daemon();
    keel.start_daemon();
    wait_for("the holder to be back", || (keel.inspect(&holder)["state"] == "waiting").then_some(()));
    assert_eq!(keel.inspect(&low)["state"], "queued");
    assert_eq!(keel.inspect(&high)["state"], "queued");
    // When the slot frees, the high-priority run starts before the low one.
    keel.ok(&["send", &holder, "--json", "1"]);
    keel.wait_state(&holder, &["succeeded"]);
    let (high_at, low_at) = (exit_time(&keel, &high), exit_time(&keel, &low));
    assert!(high_at <= low_at, "high {high_at} ran before low {low_at}");
}
