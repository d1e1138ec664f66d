//! IPC between two runs: request/reply round trips (as separate `ipc.send` and `ipc.recv`
//! calls, then as one `ipc.send` with `recv` on each side) and one-way throughput through
//! `ipc.send` / `ipc.recv` (each journaled and fsync'd) between two Python agents under
//! `keel serve`, against the floors of a raw Unix-socket echo between two Python processes
//! and a raw SQLite INSERT with an fsync'd commit per message, in the same run.
//!
//! cargo bench -p keel-cli --bench ipc
//!
//! BENCH_N (round trips, default 2000), BENCH_ONEWAY (one-way messages, default 5000),
//! BENCH_SENDERS (threads sending at once, default 16; run once to a receiver taking one
//! message per `ipc.recv`, once to one taking up to BENCH_RECV_MAX, default 100, per call),
//! BENCH_TIERS (default `none,process`),
//! BENCH_STORE (`sqlite`, the default, or `postgres`: see `common.rs`; the commit floor is
//! then Postgres's).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The floor: the same protocol over a raw Unix socket between two Python processes.
fn echo_floor(script: &str, dir: &std::path::Path) -> Value {
    let path = dir.join("echo.sock").display().to_string();
    let mut server = Command::new("python3")
        .args([script, "echo-serve", &path])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the echo server");
    let mut ready = String::new();
    BufReader::new(server.stdout.take().expect("stdout")).read_line(&mut ready).expect("server ready");
    let stats = common::python_json(&[script, "echo-client", &path]);
    let _ = server.kill();
    let _ = server.wait();
    stats
}

/// Both agents of one tier; the client's measurements (its `run.exit` output).
fn kernel(api: &api::Api, script: &str, tier: &str) -> Value {
    let cwd = common::bench_dir().display().to_string();
    let sandbox = json!({ "tier": tier });
    let server = api.create_run(&json!({
        "command": ["python3", script, "server"], "cwd": cwd, "sandbox": sandbox,
    }));
    let mut env = serde_json::Map::new();
    env.insert("BENCH_PEER".into(), json!(server));
    for name in ["BENCH_N", "BENCH_WARMUP", "BENCH_ONEWAY", "BENCH_SENDERS"] {
        if let Ok(value) = std::env::var(name) {
            env.insert(name.into(), json!(value));
        }
    }
    let client = api.create_run(&json!({
        "command": ["python3", script, "client"], "cwd": cwd, "sandbox": sandbox, "env": env,
    }));
    let deadline = Instant::now() + Duration::from_secs(1200);
    loop {
        // The run list, not the run's inspect view: that reads the whole journal, which
        // here grows to thousands of entries, and took a fifth of the daemon's CPU.
        let runs = api.runs(10);
        let view = runs.iter().find(|run| run["run_id"] == client.as_str()).cloned().unwrap_or_default();
        match view["state"].as_str() {
            Some("succeeded") => return view["output"].clone(),
            Some("failed" | "cancelled") => panic!("the IPC client failed: {view}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the IPC client did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn round_trip_row(name: &str, stats: &Value, floor_p50: f64) -> String {
    let p50 = stats["p50_us"].as_f64().unwrap_or(0.0);
    format!(
        "| {name} | {} | {} | {} | {} | {} | {:.1}x |",
        stats["n"],
        stats["mean_us"],
        stats["p50_us"],
        stats["p99_us"],
        stats["per_s"],
        p50 / floor_p50
    )
}

fn main() {
    let script = common::bench_dir().join("bench_ipc.py").display().to_string();
    let scratch = tempfile::tempdir().expect("tempdir");
    let echo = echo_floor(&script, scratch.path());
    // The commit floor of the store the kernel uses: one INSERT and one flushed commit.
    let (commit_what, commit) = common::commit_floor(scratch.path());

    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let api = api::Api::of(&daemon);
    let tiers = std::env::var("BENCH_TIERS").unwrap_or_else(|_| "none,process".into());
    let results: Vec<(String, Value)> =
        tiers.split(',').map(|tier| (tier.to_owned(), kernel(&api, &script, tier))).collect();

    let floor = echo["round_trip"]["p50_us"].as_f64().unwrap_or(1.0);
    println!("cargo bench -p keel-cli --bench ipc\n\n{}\n", common::store_label());
    println!(
        "| request/reply round trip | n | mean µs | p50 µs | p99 µs | round trips/s | p50 vs echo floor |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "{}",
        round_trip_row("floor: raw Unix-socket echo, two Python processes", &echo["round_trip"], floor)
    );
    println!("{}", round_trip_row(&format!("floor: {commit_what} (one, not a round trip)"), &commit, floor));
    for (tier, result) in &results {
        println!(
            "{}",
            round_trip_row(
                &format!("kernel: ipc.send + ipc.recv each way, sandbox `{tier}`"),
                &result["round_trip"],
                floor
            )
        );
        println!(
            "{}",
            round_trip_row(
                &format!("kernel: ipc.send with `recv` (`send_recv`) each way, sandbox `{tier}`"),
                &result["round_trip_combined"],
                floor
            )
        );
    }
    println!();
    println!("| one-way, send and receive (receiver keeps up) | messages | seconds | messages/s |");
    println!("|---|---:|---:|---:|");
    let oneway = &echo["oneway"];
    println!(
        "| floor: raw Unix socket, 1 sender | {} | {} | {} |",
        oneway["n"], oneway["seconds"], oneway["per_s"]
    );
    for (tier, result) in &results {
        let senders = &result["senders"];
        let rows = [
            ("oneway_1", "1 sender thread".to_owned()),
            ("oneway_many", format!("{senders} sender threads")),
            (
                "oneway_many_batched",
                format!("{senders} sender threads, received with `ipc.recv` `max` {}", result["recv_max"]),
            ),
        ];
        for (key, what) in rows {
            let r = &result[key];
            println!("| kernel, sandbox `{tier}`: {what} | {} | {} | {} |", r["n"], r["seconds"], r["per_s"]);
        }
    }
}
