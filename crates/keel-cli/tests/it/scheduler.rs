//! Scheduling with the real binary. Admission control: a cap on live runs queues the rest
//! (the queue position shows in `keel ps`), a full queue answers 429 with Retry-After, a
//! freed slot goes to the highest (aged) priority first, and queued runs survive a daemon
//! SIGKILL. LLM calls: a call waiting for a rate-limited provider shows its place in the
//! provider's queue in `keel ps`.

use serde_json::{Value, json};

use crate::gateway::mock_upstream;
use crate::harness::{Keel, agent, wait_for};

pub(crate) fn run(keel: &Keel, priority: &str, plan: Value) -> Result<String, String> {
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

#[test]
fn a_swapped_out_run_gives_its_slot_back_and_queues_for_one_when_its_message_comes() {
    // One live slot. A run parked on a message is swapped out and gives the slot to the
    // queued run; when its message comes while the other holds the slot, it waits in the
    // queue (still swapped out), and comes back when the slot frees.
    let mut keel = Keel::new();
    std::fs::write(keel.data.path().join("keel.toml"), "[scheduler]\nmax_live = 1\n").unwrap();
    keel.start_daemon_with(&["--swap-after", "1"]);
    let first = run(&keel, "normal", json!({"recv": true})).unwrap();
    let second = run(&keel, "normal", json!({"recv": true})).unwrap();
    assert_eq!(keel.inspect(&second)["state"], "queued");
    let swapped = |id: &str| {
        wait_for(&format!("run {id} to be swapped out"), || {
            (keel.inspect(id)["swapped"] == true).then_some(())
        })
    };
    swapped(&first);
    // The freed slot went to the queued run, which now waits (resident) for its message.
    keel.wait_state(&second, &["waiting"]);
    keel.ok(&["send", &first, "--json", r#""one""#]);
    // Read from its events, not caught in `inspect`: the wait lasts only until the other
    // run is swapped out in turn, which a loaded machine's polling can miss. A woken run
    // reports it queued only while it stays swapped out (`wake_swapped`).
    let queued = wait_for("the woken run to queue for a slot", || {
        let (_, body) = keel.http("GET", &format!("/v1/runs/{first}/events?kinds=queued"), true);
        let page: serde_json::Value = serde_json::from_str(&body).ok()?;
        page["events"].as_array()?.first().cloned()
    });
    let reason = queued["data"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("queued: 1 of 1"), "{queued}");
    // The second run is swapped out in turn: its slot goes to the first, which finishes.
    let done = keel.wait_state(&first, &["succeeded", "failed"]);
    assert_eq!(done["output"]["message"], "one", "{done}");
    keel.ok(&["send", &second, "--json", r#""two""#]);
    let done = keel.wait_state(&second, &["succeeded", "failed"]);
    assert_eq!(done["output"]["message"], "two", "{done}");
}

/// The issue's "`keel ps` shows what each run is waiting for": with a provider limited to
/// one request a minute, the first run's call goes at once and the next two wait in the
/// provider's queue, the high-priority one ahead; `keel ps` (table and tree) and `keel
/// inspect` say so.
#[test]
fn ps_shows_a_run_waiting_in_a_providers_llm_queue_and_its_place() {
    let mut keel = Keel::new();
    let script = keel.data.path().join("always_ok.json");
    std::fs::write(&script, r#"{"responses": [{"match": "", "content": "ok"}]}"#).unwrap();
    let (upstream, port, _) = mock_upstream(&keel, script.to_str().unwrap());
    // Killed however the test ends: a leaked upstream would hold the test's output open.
    let _upstream = upstream; // Killed when the test ends.
    std::fs::write(
        keel.data.path().join("keel.toml"),
        "[llm.models.\"openai/m\"]\nrequests_per_minute = 1\n[llm.retry]\nmax_queue_wait_ms = 600000\n",
    )
    .unwrap();
    keel.daemon_env = vec![
        ("OPENAI_API_KEY".into(), "sk-upstream-test".into()),
        ("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")),
    ];
    keel.start_daemon();
    let start = |priority: &str, prompt: &str| {
        let input = json!({ "prompt": prompt }).to_string();
        keel.detach(&[
            "--sandbox",
            "none",
            "--model",
            "openai/m",
            "--priority",
            priority,
            "--input",
            &input,
            "--",
            "python3",
            &agent("llm_once_agent.py"),
        ])
    };
    // The minute's one request.
    let first = start("normal", "first");
    let view = keel.wait_state(&first, &["succeeded", "failed"]);
    assert_eq!(view["output"]["reply"], "ok", "{view}");
    assert!(view.get("reason").is_none(), "{view}");

    let low = start("low", "second");
    let high = start("high", "third");
    // A run's reason is the `↳` line under its own line in `keel ps`.
    let reason_under = |ps: &str, run: &str| -> Option<String> {
        let mut lines = ps.lines().skip_while(|line| !line.contains(run));
        lines.next()?;
        lines.next()?.trim_start().strip_prefix("↳ ").map(str::to_owned)
    };
    let ps = wait_for("both calls to wait in the provider's queue", || {
        let ps = keel.ok(&["ps"]);
        let both = [&low, &high]
            .iter()
            .all(|run| reason_under(&ps, run).is_some_and(|reason| reason.contains("of 2 waiting")));
        both.then_some(ps)
    });
    let high_reason = reason_under(&ps, &high).unwrap();
    let low_reason = reason_under(&ps, &low).unwrap();
    assert!(high_reason.starts_with("llm queue: openai/m, 1 of 2 waiting for "), "{ps}");
    assert!(low_reason.starts_with("llm queue: openai/m, 2 of 2 waiting for "), "{ps}");
    assert!(high_reason.ends_with("(requests limit)"), "{ps}");
    assert!(reason_under(&ps, &first).is_none(), "a finished run waits for nothing:\n{ps}");
    let tree = keel.ok(&["ps", "--tree"]);
    assert!(reason_under(&tree, &high).is_some_and(|r| r.starts_with("llm queue: openai/m, ")), "{tree}");
    let view = keel.inspect(&low);
    assert_eq!(view["state"], "running", "{view}");
    assert!(view["reason"].as_str().unwrap().starts_with("llm queue: openai/m, "), "{view}");
}
