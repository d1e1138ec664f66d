//! Recovery: time from daemon start to all of 1,000 interrupted runs live again (each
//! agent relaunched by the new kernel: attempt 2, process running), against the floor of
//! bare fork+exec of the same 1,000 processes.
//!
//! cargo bench -p keel-cli --bench recovery

#[path = "common.rs"]
mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

const RUNS: usize = 1000;

async fn list(http: &reqwest::Client, base: &str, token: &str) -> Vec<Value> {
    let response = http
        .get(format!("{base}/v1/runs"))
        .query(&[("limit", (RUNS * 2).to_string())])
        .bearer_auth(token)
        .send()
        .await;
    match response {
        Ok(r) => r.json::<Vec<Value>>().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

#[tokio::main]
async fn main() {
    // The floor: fork+exec the same 1,000 processes directly.
    let started = Instant::now();
    let mut children: Vec<_> = (0..RUNS)
        .map(|_| std::process::Command::new("sleep").arg("3600").spawn().expect("spawn sleep"))
        .collect();
    let floor = started.elapsed();
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }

    let mut daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let (base, token) = daemon.api();
    let http = reqwest::Client::builder().no_proxy().build().expect("http client");
    let cwd = std::env::temp_dir().display().to_string();
    for chunk in (0..RUNS).collect::<Vec<_>>().chunks(50) {
        let requests = chunk.iter().map(|_| {
            http.post(format!("{base}/v1/runs"))
                .bearer_auth(&token)
                .json(&json!({ "command": ["sleep", "3600"], "cwd": cwd }))
                .send()
        });
        for response in futures_util::future::join_all(requests).await {
            assert!(response.expect("create run").status().is_success());
        }
    }
    wait_until("1,000 running runs", async || {
        list(&http, &base, &token).await.iter().filter(|r| r["state"] == "running").count() == RUNS
    })
    .await;

    daemon.kill();
    let started = Instant::now();
    daemon.spawn();
    let (base, token) = daemon.api();
    let api_up = started.elapsed();
    wait_until("1,000 runs live again", async || live_again(&list(&http, &base, &token).await) == RUNS).await;
    let recovered = started.elapsed();

    println!("cargo bench -p keel-cli --bench recovery\n");
    println!("| case | runs | total | per run |");
    println!("|---|---:|---:|---:|");
    println!(
        "| floor: fork+exec of {RUNS} `sleep` processes | {RUNS} | {:.0} ms | {:.0} µs |",
        floor.as_secs_f64() * 1e3,
        floor.as_secs_f64() * 1e6 / RUNS as f64
    );
    println!("| daemon start to API answering | - | {:.0} ms | - |", api_up.as_secs_f64() * 1e3);
    println!(
        "| daemon start to all {RUNS} interrupted runs live again | {RUNS} | {:.0} ms | {:.0} µs |",
        recovered.as_secs_f64() * 1e3,
        recovered.as_secs_f64() * 1e6 / RUNS as f64
    );
}
