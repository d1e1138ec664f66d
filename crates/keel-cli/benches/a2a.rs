//! A2A `SendMessage` to a completed task, against a direct `keel run` of the same agent,
//! on one daemon. The agent is `true` (BENCH_TIER=none by default, `process` for the
//! process sandbox): what is measured is the path, not the agent.
//!
//! - A2A: a blocking `SendMessage` on its own connection, timed from the request to the
//!   answer holding the completed task (the message recorded, the run created, launched,
//!   ended, and read back as a task).
//! - A direct `keel run --sandbox TIER -- true`: the CLI process from start to exit (it
//!   submits the run to the daemon and waits for its end), as the issue asks.
//! - The API's floor: `POST /v1/runs` of the same run, then its event stream
//!   (`/v1/runs/{id}/events?follow=true`) read until it closes at the run's end.
//!
//! cargo bench -p keel-cli --bench a2a
//!
//! BENCH_N (sends each, default 200), BENCH_TIER (default none).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::process::Stdio;
use std::time::Instant;

use serde_json::json;

fn main() {
    let n: usize = std::env::var("BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let tier = std::env::var("BENCH_TIER").unwrap_or_else(|_| "none".into());
    let data = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[[agents]]\nname = \"bench\"\ndescription = \"Does nothing.\"\na2a = true\ncommand = [\"true\"]\n\
         sandbox = {{ tier = \"{tier}\" }}\n"
    );
    std::fs::write(data.path().join("keel.toml"), config).expect("keel.toml");
    let daemon = common::Daemon::start(data);
    let api = api::Api::of(&daemon);
    println!("cargo bench -p keel-cli --bench a2a   # BENCH_N={n} BENCH_TIER={tier}\n");
    println!("| path | tasks | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");

    let mut a2a = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({
            "jsonrpc": "2.0", "id": i, "method": "SendMessage",
            "params": {"message": {"messageId": format!("bench-{i}"), "role": "ROLE_USER", "parts": [{"text": "go"}]}}
        });
        let started = Instant::now();
        let (status, answer) = api.post("/a2a/bench", &body);
        a2a.push(started.elapsed().as_secs_f64() * 1000.0);
        let state = &answer["result"]["task"]["status"]["state"];
        assert!(status == 200 && state == "TASK_STATE_COMPLETED", "send {i}: {status} {answer}");
    }

    let mut direct = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let status = daemon
            .keel()
            .args(["run", "--sandbox", &tier, "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("keel run");
        direct.push(started.elapsed().as_secs_f64() * 1000.0);
        assert!(status.success(), "keel run {i}: {status}");
    }

    let run = json!({"command": ["true"], "sandbox": {"tier": tier}});
    let mut floor = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let id = api.create_run(&run);
        let (status, _) = api.get(&format!("/v1/runs/{id}/events?follow=true"));
        floor.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(status, 200, "events of {id}");
        assert_eq!(api.run(&id)["state"], "succeeded", "run {id}");
    }

    for (name, samples) in [
        ("A2A SendMessage (blocking)", &mut a2a),
        ("keel run (the CLI, start to exit)", &mut direct),
        ("POST /v1/runs + its events to the end (floor)", &mut floor),
    ] {
        let (p50, p99) = api::percentiles(samples);
        let max = samples.last().copied().unwrap_or(0.0);
        println!("| {name} | {} | {p50:.1} | {p99:.1} | {max:.1} |", samples.len());
    }
}
