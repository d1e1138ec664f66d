//! Schedule precision: with 1,000 schedules on one daemon, how late each fire is recorded
//! (`fired_at - scheduled_at`) and how late its run exists (`created_at - scheduled_at`).
//!
//! Two shapes, each in its own daemon (SQLite, the release build):
//! - `spread`: schedule `i` fires at second `i % 60` of every minute (about 17 fires a
//!   second, the steady load of many minute-level schedules);
//! - `burst`: every schedule fires at second 0 (1,000 fires due at the same instant, the
//!   worst case of `0 9 * * *` everywhere).
//!
//! Each fire starts `true` under the `process` sandbox tier, so a fire costs what a run
//! costs. The floor in the same run: the same number of runs created one at a time through
//! `POST /v1/runs` (time to the answer), the path a fire's run takes inside the kernel.
//!
//! cargo bench -p keel-cli --bench schedules
//!
//! BENCH_SCHEDULES (default 1000), BENCH_MINUTES (fires per schedule, default 1),
//! BENCH_SHAPES (default `spread,burst`).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as u64
}

fn run_body() -> Value {
    json!({
        "command": ["true"], "cwd": common::bench_dir().display().to_string(),
        "sandbox": {"tier": "process"},
    })
}

/// p50, p99 and max of `samples`, in ms.
fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    let (p50, p99) = api::percentiles(samples);
    (p50, p99, samples.last().copied().unwrap_or(0.0))
}

/// Creates the schedules of `shape`, waits for `minutes` fires of each, and returns the
/// lateness of the fires and of their runs (ms).
fn measure(shape: &str, schedules: usize, minutes: usize) -> (Vec<f64>, Vec<f64>) {
    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let api = api::Api::of(&daemon);
    for i in 0..schedules {
        let second = if shape == "burst" { 0 } else { i % 60 };
        let (status, body) = api.post(
            "/v1/schedules",
            &json!({
                "name": format!("s{i}"), "cron": format!("{second} * * * * *"),
                "overlap": "allow", "catch_up": "none", "run": run_body(),
            }),
        );
        assert!((200..300).contains(&status), "create schedule: {status} {body}");
    }
    // Ticks from the next whole minute on (a schedule created mid-minute may fire for the
    // current one: those ticks are counted too, every fire is measured alike).
    let start = now_ms();
    let end = (start / 60_000 + 1 + minutes as u64) * 60_000;
    eprintln!("{shape}: {schedules} schedules created; waiting {} s", (end - start) / 1000 + 5);
    std::thread::sleep(Duration::from_millis(end - start + 5_000));
    let (status, runs) = api.get(&format!("/v1/runs?limit={}", schedules * (minutes + 2)));
    assert_eq!(status, 200, "{runs}");
    let created: HashMap<String, u64> = runs
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| Some((r["run_id"].as_str()?.to_owned(), r["created_at"].as_u64()?)))
        .collect();
    let (mut fired, mut started) = (Vec::new(), Vec::new());
    for i in 0..schedules {
        let (status, view) = api.get(&format!("/v1/schedules/s{i}"));
        assert_eq!(status, 200, "{view}");
        for fire in view["last_fires"].as_array().expect("last_fires") {
            let at = fire["scheduled_at_ms"].as_u64().expect("scheduled_at_ms");
            if fire["outcome"] != "fired" || at >= end {
                continue;
            }
            fired.push(fire["fired_at"].as_u64().expect("fired_at").saturating_sub(at) as f64);
            if let Some(run) = fire["run_id"].as_str().and_then(|id| created.get(id)) {
                started.push(run.saturating_sub(at) as f64);
            }
        }
    }
    (fired, started)
}

/// The floor: `n` runs of the same agent created one after another over HTTP.
fn floor(n: usize) -> Vec<f64> {
    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let api = api::Api::of(&daemon);
    (0..n)
        .map(|_| {
            let t = Instant::now();
            api.create_run(&run_body());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

fn main() {
    let schedules = env_usize("BENCH_SCHEDULES", 1000);
    let minutes = env_usize("BENCH_MINUTES", 1);
    let shapes = std::env::var("BENCH_SHAPES").unwrap_or_else(|_| "spread,burst".into());
    println!(
        "cargo bench -p keel-cli --bench schedules   # BENCH_SCHEDULES={schedules} BENCH_MINUTES={minutes}\n"
    );
    println!("| shape | fires | fire late p50 / p99 / max ms | run created late p50 / p99 / max ms |");
    println!("|---|---:|---:|---:|");
    for shape in shapes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (mut fired, mut started) = measure(shape, schedules, minutes);
        let (f50, f99, fmax) = summary(&mut fired);
        let (s50, s99, smax) = summary(&mut started);
        println!(
            "| {shape} | {} | {f50:.0} / {f99:.0} / {fmax:.0} | {s50:.0} / {s99:.0} / {smax:.0} |",
            fired.len()
        );
    }
    let mut create = floor(schedules.min(500));
    let (c50, c99, cmax) = summary(&mut create);
    println!(
        "\nfloor: POST /v1/runs one at a time, {} runs: p50 {c50:.1} ms, p99 {c99:.1} ms, max {cmax:.1} ms",
        create.len()
    );
}
