//! LLM call scheduling end to end: a provider limited to N requests/min (the kernel's own
//! rate limiter, configured in keel.toml, in front of a fast mock upstream), 3 tenants (one
//! with 4x the threads) and 3 priority classes, each a real Python agent making LLM calls
//! back to back. Latency of high-priority calls and Jain's fairness index across tenants,
//! with the kernel's call queue and with plain FIFO (`KEEL_LLM_QUEUE=fifo`) in the same run.
//!
//! cargo bench -p keel-cli --bench llmsched
//! BENCH_RPM (120), BENCH_CALLS (6 per thread), BENCH_HEAVY_THREADS (4)

#[path = "common.rs"]
mod common;

#[path = "api.rs"]
mod api;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Outcome {
    high_all: (f64, f64),
    high_light: (f64, f64),
    served: Vec<(String, usize)>,
    jain: f64,
}

fn run_policy(policy: &str, port: u16, rpm: u64, calls: u64, heavy_threads: u64) -> Outcome {
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        data.path().join("keel.toml"),
        format!("[llm.models.\"openai/m\"]\nrequests_per_minute = {rpm}\n"),
    )
    .expect("keel.toml");
    let daemon = common::Daemon::start_with_env(
        data,
        &[
            ("OPENAI_API_KEY", "sk-bench".to_owned()),
            ("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1")),
            ("KEEL_LLM_QUEUE", policy.to_owned()),
        ],
    );
    let api = api::Api::of(&daemon);
    let agent = common::bench_dir().join("bench_llm_agent.py").display().to_string();
    let start = |tenant: &str, priority: &str, threads: u64, calls: u64| {
        api.create_run(&json!({
            "command": ["python3", agent],
            "tenant": tenant,
            "priority": priority,
            "model": "openai/m",
            "loop_threshold": 0,
            "sandbox": {"tier": "none"},
            "input": {"threads": threads, "calls": calls, "tag": format!("{tenant}-{priority}")},
        }))
    };
    let wait = |runs: &[String]| -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(900);
        runs.iter()
            .map(|run| {
                loop {
                    let view = api.run(run);
                    if matches!(view["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                        assert_eq!(view["state"], "succeeded", "{view}");
                        break view;
                    }
                    assert!(Instant::now() < deadline, "run {run} did not finish");
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .collect()
    };
    // Empty the bucket first (its burst is a whole minute's worth), so every measured call
    // contends for capacity.
    let warmup = start("warmup", "normal", 8, rpm.div_ceil(8));
    wait(&[warmup]);
    let mut runs = Vec::new();
    for (tenant, threads) in [("heavy", heavy_threads), ("light-a", 1), ("light-b", 1)] {
        for priority in ["high", "normal", "low"] {
            runs.push((tenant, priority, start(tenant, priority, threads, calls)));
        }
    }
    let ids: Vec<String> = runs.iter().map(|(_, _, id)| id.clone()).collect();
    let views = wait(&ids);
    let mut high_all = Vec::new();
    let mut high_light = Vec::new();
    let mut finished: Vec<(String, Vec<u64>)> = Vec::new();
    for ((tenant, priority, _), view) in runs.iter().zip(&views) {
        let output = &view["output"];
        let latencies: Vec<f64> =
            output["latencies_ms"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        if *priority == "high" {
            high_all.extend(&latencies);
            if *tenant != "heavy" {
                high_light.extend(&latencies);
            }
        }
        let done: Vec<u64> =
            output["finished_ms"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        match finished.iter_mut().find(|(t, _)| t == tenant) {
            Some((_, all)) => all.extend(done),
            None => finished.push((tenant.to_string(), done)),
        }
    }
    // While every tenant still had calls waiting: up to the first tenant's last call.
    let window_end = finished.iter().map(|(_, done)| *done.iter().max().unwrap()).min().unwrap();
    let served: Vec<(String, usize)> = finished
        .iter()
        .map(|(t, done)| (t.clone(), done.iter().filter(|&&at| at <= window_end).count()))
        .collect();
    let x: Vec<f64> = served.iter().map(|(_, n)| *n as f64).collect();
    let jain = x.iter().sum::<f64>().powi(2) / (x.len() as f64 * x.iter().map(|v| v * v).sum::<f64>());
    Outcome {
        high_all: api::percentiles(&mut high_all),
        high_light: api::percentiles(&mut high_light),
        served,
        jain,
    }
}

fn main() {
    let rpm = env_or("BENCH_RPM", 120);
    let calls = env_or("BENCH_CALLS", 6);
    let heavy_threads = env_or("BENCH_HEAVY_THREADS", 4);
    let scratch = tempfile::tempdir().expect("tempdir");
    let port_file = scratch.path().join("port");
    let mut upstream = std::process::Command::new("python3")
        .arg(common::bench_dir().join("bench_llm_upstream.py"))
        .arg(&port_file)
        .spawn()
        .expect("start the mock upstream");
    let deadline = Instant::now() + Duration::from_secs(30);
    let port: u16 = loop {
        if let Some(port) = std::fs::read_to_string(&port_file).ok().and_then(|p| p.trim().parse().ok()) {
            break port;
        }
        assert!(Instant::now() < deadline, "the mock upstream did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "\n### LLM calls under a {rpm} requests/min provider: 3 tenants (heavy has {heavy_threads}x the threads), 3 priority classes\n"
    );
    println!(
        "| policy | high p50 / p99 ms, all | high p50 / p99 ms, light tenants | served while all waited (heavy / light-a / light-b) | Jain |"
    );
    println!("|---|---|---|---|---|");
    for policy in ["fair", "fifo"] {
        let outcome = run_policy(policy, port, rpm, calls, heavy_threads);
        let served: Vec<String> = outcome.served.iter().map(|(_, n)| n.to_string()).collect();
        println!(
            "| {policy} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {:.3} |",
            outcome.high_all.0,
            outcome.high_all.1,
            outcome.high_light.0,
            outcome.high_light.1,
            served.join(" / "),
            outcome.jain
        );
    }
    let _ = upstream.kill();
    let _ = upstream.wait();
}
