//! Recovery: time from daemon start to all of 1,000 interrupted runs live again (each
//! agent relaunched by the new kernel: attempt 2, process running), against the floor of
//! bare fork+exec of the same 1,000 processes, for each sandbox tier.
//!
//! cargo bench -p keel-cli --bench recovery
//!
//! BENCH_TIERS (the runs' sandbox tiers, default `none,process`), BENCH_RUNS (1000),
//! BENCH_OBSERVE (`metrics`, the default: poll the `keel_runs_recovered` counter every
//! 20 ms, then check every run once the count is reached; `list`: poll `GET /v1/runs`
//! every 100 ms, as this benchmark did before the counter existed).

#[path = "common.rs"]
mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

async fn list(http: &reqwest::Client, base: &str, token: &str, runs: usize) -> Vec<Value> {
    let response = http
        .get(format!("{base}/v1/runs"))
        .query(&[("limit", (runs * 2).to_string())])
        .bearer_auth(token)
        .send()
        .await;
    match response {
        Ok(r) => r.json::<Vec<Value>>().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// Polls every `every` until `check` holds.
async fn wait_until(what: &str, every: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// The daemon's `keel_runs_recovered` counter (0 until it answers).
async fn recovered_count(http: &reqwest::Client, base: &str, token: &str) -> usize {
    let Ok(response) = http.get(format!("{base}/metrics")).bearer_auth(token).send().await else { return 0 };
    let Ok(text) = response.text().await else { return 0 };
    text.lines()
        .find_map(|line| line.strip_prefix("keel_runs_recovered_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as usize)
}

fn live_again(runs: &[Value]) -> usize {
    runs.iter()
        .filter(|r| {
            r["attempt"] == 2
                && r["pid"].is_u64()
                && matches!(r["state"].as_str(), Some("recovering" | "running"))
        })
        .count()
}

struct Recovered {
    api_up: Duration,
    all_live: Duration,
    /// The new daemon's CPU time (all threads) until then.
    cpu: Duration,
}

async fn recover(tier: &str, runs: usize) -> Recovered {
    let mut daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let (base, token) = daemon.api();
    let http = reqwest::Client::builder().no_proxy().build().expect("http client");
    let cwd = std::env::temp_dir().display().to_string();
    for chunk in (0..runs).collect::<Vec<_>>().chunks(50) {
        let requests = chunk.iter().map(|_| {
            http.post(format!("{base}/v1/runs"))
                .bearer_auth(&token)
                .json(&json!({ "command": ["sleep", "3600"], "cwd": cwd, "sandbox": {"tier": tier} }))
                .send()
        });
        for response in futures_util::future::join_all(requests).await {
            let response = response.expect("create run");
            assert!(
                response.status().is_success(),
                "create run: {}",
                response.text().await.unwrap_or_default()
            );
        }
    }
    wait_until(&format!("{runs} running runs"), Duration::from_millis(100), async || {
        list(&http, &base, &token, runs).await.iter().filter(|r| r["state"] == "running").count() == runs
    })
    .await;

    daemon.kill();
    // Let the host finish tearing down the killed agents (and, for sandboxes, their
    // namespaces) before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    daemon.spawn();
    let (base, token) = daemon.api();
    let api_up = started.elapsed();
    let what = format!("{runs} runs live again");
    if std::env::var("BENCH_OBSERVE").as_deref() == Ok("list") {
        // Listing 1,000 runs costs the daemon milliseconds of CPU, taken from the
        // recovery being measured: hence only every 100 ms.
        wait_until(&what, Duration::from_millis(100), async || {
            live_again(&list(&http, &base, &token, runs).await) == runs
        })
        .await;
    } else {
        // A scrape is a grouped count and the exposition: cheap enough for every 20 ms.
        wait_until(&what, Duration::from_millis(20), async || {
            recovered_count(&http, &base, &token).await >= runs
        })
        .await;
    }
    let all_live = started.elapsed();
    let cpu = daemon.cpu();
    // The counter counts relaunches; the runs themselves must say so too.
    let live = live_again(&list(&http, &base, &token, runs).await);
    assert_eq!(
        live, runs,
        "the counter says {runs} runs were recovered, the listing shows {live} live again"
    );
    Recovered { api_up, all_live, cpu }
}

/// Starts `runs` processes made by `command`, one after another, and returns how long
/// that took; then kills them all and lets the host settle.
async fn spawn_all(runs: usize, command: impl Fn() -> std::process::Command) -> Duration {
    let started = Instant::now();
    let mut children: Vec<_> =
        (0..runs).map(|_| command().spawn().expect("spawn the floor's process")).collect();
    let took = started.elapsed();
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    took
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let tiers = std::env::var("BENCH_TIERS").unwrap_or_else(|_| "none,process".into());
    let mut results = Vec::new();
    for tier in tiers.split(',') {
        // The floor, again before each tier: fork+exec the same processes directly.
        let floor = spawn_all(runs, || {
            let mut sleep = std::process::Command::new("sleep");
            sleep.arg("3600");
            sleep
        })
        .await;
        // For a sandbox, also the namespaces it is made of: `unshare(1)` creating the
        // same ones around each process (as in `--bench sandbox`).
        let namespaces = (tier != "none").then_some(
            spawn_all(runs, || {
                let mut unshare = std::process::Command::new("unshare");
                unshare
                    .args([
                        "--user",
                        "--map-root-user",
                        "--mount",
                        "--pid",
                        "--fork",
                        "--ipc",
                        "--uts",
                        "--net",
                    ])
                    // Killing unshare kills its child, the namespace's init.
                    .args(["--kill-child", "sleep", "3600"]);
                unshare
            })
            .await,
        );
        results.push((tier.to_owned(), floor, namespaces, recover(tier, runs).await));
    }

    println!("cargo bench -p keel-cli --bench recovery   # BENCH_RUNS={runs}\n\n{}\n", common::store_label());
    println!("| case | runs | total ms | per run µs | vs the floor | daemon CPU per run µs |");
    println!("|---|---:|---:|---:|---:|---:|");
    let per_run = |d: Duration| d.as_secs_f64() * 1e6 / runs as f64;
    for (tier, floor, namespaces, recovered) in &results {
        println!(
            "| floor: fork+exec of {runs} `sleep` processes (before tier `{tier}`) | {runs} | {:.0} | {:.0} | 1.00x | - |",
            floor.as_secs_f64() * 1e3,
            per_run(*floor)
        );
        if let Some(namespaces) = namespaces {
            println!(
                "| floor: the same in user, mount, pid, ipc, uts and net namespaces (`unshare(1)`) | {runs} | {:.0} | {:.0} | {:.2}x | - |",
                namespaces.as_secs_f64() * 1e3,
                per_run(*namespaces),
                namespaces.as_secs_f64() / floor.as_secs_f64()
            );
        }
        println!(
            "| tier `{tier}`: daemon start to API answering | - | {:.0} | - | - | - |",
            recovered.api_up.as_secs_f64() * 1e3
        );
        println!(
            "| tier `{tier}`: daemon start to all {runs} interrupted runs live again | {runs} | {:.0} | {:.0} | {:.2}x | {:.0} |",
            recovered.all_live.as_secs_f64() * 1e3,
            per_run(recovered.all_live),
            recovered.all_live.as_secs_f64() / floor.as_secs_f64(),
            per_run(recovered.cpu)
        );
    }
}
