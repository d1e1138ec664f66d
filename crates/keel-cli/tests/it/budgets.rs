//! Budgets that cannot be overshot, with many calls in flight; top-ups; the loop detector.

use std::time::{Duration, Instant};

use crate::harness::{Keel, agent};

#[test]
fn twenty_concurrent_calls_against_a_budget_for_five() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let script = keel.data.path().join("any.json");
    std::fs::write(&script, r#"{"responses":[{"match":"question","content":"answer","usage":{"input_tokens":5,"output_tokens":5}}]}"#).unwrap();
    let run = keel.detach(&[
        "--llm-script",
        script.to_str().unwrap(),
        "--budget-llm-calls",
        "5",
        "--",
        "python3",
        &agent("budget_agent.py"),
    ]);
    let mut parked = keel.wait_state(&run, &["waiting"]);
    assert_eq!(parked["wait_reason"], "budget");
    // The run parks when a call is refused; calls already sent go on and their results
    // land just after (one was seen still pending in the parked view under load). Wait
    // for them, never seeing more than five sent.
    let deadline = Instant::now() + Duration::from_secs(30);
    while parked["provider_calls"] != 5 && Instant::now() < deadline {
        assert!(parked["provider_calls"].as_u64().unwrap() < 5, "at most 5 calls were sent: {parked}");
        std::thread::sleep(Duration::from_millis(20));
        parked = keel.inspect(&run);
    }
    assert_eq!(parked["state"], "waiting", "{parked}");
    assert_eq!(parked["provider_calls"], 5, "at most 5 calls were sent: {parked}");
    assert!(parked["reason"].as_str().unwrap().contains("LLM calls"), "{parked}");
    assert_eq!(parked["budget"]["remaining"]["llm_calls"], 0);
    let shown = keel.ok(&["budget", &run]);
    assert!(shown.contains("parked") && shown.contains("--add-llm-calls"), "{shown}");

    let topped = keel.json(&["budget", &run, "--add-llm-calls", "15", "--json"]);
    assert_eq!(topped["budget"]["limits"]["llm_calls"], 20);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["replies"], 20);
    assert_eq!(done["provider_calls"], 20);
}

#[test]
fn spend_in_dollars_never_exceeds_the_limit() {
    let mut keel = Keel::new();
    keel.start_daemon();
    // $0.01 per output token: a call reserves 100 tokens ($1.00) and uses 10 ($0.10).
    let script = keel.data.path().join("priced.json");
    std::fs::write(&script, r#"{"price":{"input_per_mtok":0,"output_per_mtok":10000},"responses":[{"match":"question","content":"answer","usage":{"input_tokens":5,"output_tokens":10}}]}"#).unwrap();
    let run = keel.detach(&[
        "--llm-script",
        script.to_str().unwrap(),
        "--budget-usd",
        "1.35",
        "--",
        "python3",
        &agent("budget_agent.py"),
    ]);
    let parked = keel.wait_state(&run, &["waiting"]);
    let cost = parked["usage"]["cost_usd"].as_f64().unwrap();
    assert!(cost <= 1.35 + 1e-9, "spent {cost} of 1.35");
    // Calls go one at a time (each holds $1.00 while in flight); after four ($0.40 spent)
    // a fifth would reach $1.40, so the run parks.
    assert_eq!(parked["provider_calls"], 4, "{parked}");
    assert!(parked["reason"].as_str().unwrap().contains("--add-usd"), "{parked}");
    keel.ok(&["budget", &run, "--add-usd", "2.00"]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["provider_calls"], 20);
    assert!(done["usage"]["cost_usd"].as_f64().unwrap() <= 3.35 + 1e-9);
}

#[test]
fn the_loop_detector_parks_a_repeating_run_until_told_to_continue() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let script = keel.data.path().join("loop.json");
    std::fs::write(&script, r#"{"responses":[{"match":"there yet","content":"no"}]}"#).unwrap();
    let run = keel.detach(&[
        "--llm-script",
        script.to_str().unwrap(),
        "--loop-threshold",
        "3",
        "--",
        "python3",
        &agent("loop_agent.py"),
    ]);
    let parked = keel.wait_state(&run, &["waiting"]);
    assert!(parked["reason"].as_str().unwrap().contains("loop detected"), "{parked}");
    assert_eq!(parked["provider_calls"], 2);
    let inspect = keel.ok(&["inspect", &run]);
    assert!(inspect.contains("loop detected"), "{inspect}");
    keel.ok(&["budget", &run, "--continue"]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["provider_calls"], 3);
}

#[test]
fn the_wall_clock_budget_freezes_the_run_until_topped_up() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&["--budget-wall", "1s", "--", "python3", "-c", "import time; time.sleep(3600)"]);
    let parked = keel.wait_state(&run, &["waiting"]);
    assert_eq!(parked["wait_reason"], "budget");
    assert!(parked["reason"].as_str().unwrap().contains("wall-time"), "{parked}");
    let topped = keel.json(&["budget", &run, "--add-wall", "1h", "--json"]);
    assert_eq!(topped["budget"]["limits"]["wall_secs"], 3601);
    let view = keel.wait_state(&run, &["running"]);
    assert!(view.get("reason").is_none(), "{view}");
    assert_eq!(keel.json(&["stop", &run, "--grace", "1", "--json"])["state"], "cancelled");
}
