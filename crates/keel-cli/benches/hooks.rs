//! Webhook to run started: GitHub-signed deliveries sent open-loop at a fixed rate (default
//! 200 a second), each on its own connection at its scheduled instant, timed from that
//! instant to the 202 (the signature checked, the delivery recorded, the run created and
//! durable). Open-loop, so a slow answer delays no later send: queueing shows in the tail.
//!
//! The floor in the same run, on a second daemon: `POST /v1/runs` with the same run at the
//! same rate (the path a delivery's run takes, without the signature and the fire record).
//! Each run is `true` in the `none` sandbox tier (BENCH_TIER=process for the process tier,
//! whose spawns alone saturate two cores at 200 runs a second): what is measured is the
//! delivery's path, not the agent's sandbox.
//!
//! cargo bench -p keel-cli --bench hooks
//!
//! BENCH_RATE (requests a second, default 200), BENCH_SECS (default 5), BENCH_SENDERS
//! (threads, default 32), BENCH_TIER (default none).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const SECRET: &str = "bench-secret";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run_body() -> Value {
    let tier = std::env::var("BENCH_TIER").unwrap_or_else(|_| "none".into());
    json!({"command": ["true"], "cwd": common::bench_dir().display().to_string(), "sandbox": {"tier": tier}})
}

/// One raw POST with extra headers; the status.
fn post(addr: &str, path: &str, headers: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let response = String::from_utf8_lossy(&response);
    response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Sends `total` requests open-loop at `rate` a second from `senders` threads; each
/// request `i` is made by `make(i)` as (path, headers, body). Latencies in ms.
fn open_loop(
    addr: &str,
    total: usize,
    rate: usize,
    senders: usize,
    make: impl Fn(usize) -> (String, String, String) + Send + Sync + 'static,
) -> Vec<f64> {
    let make = Arc::new(make);
    let samples = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let start = Instant::now() + Duration::from_millis(200);
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let threads: Vec<_> = (0..senders)
        .map(|t| {
            let (make, samples, addr) = (make.clone(), samples.clone(), addr.to_owned());
            std::thread::spawn(move || {
                for i in (t..total).step_by(senders) {
                    let due = start + interval * i as u32;
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let (path, headers, body) = make(i);
                    let status = post(&addr, &path, &headers, &body);
                    assert!(status == 202 || status == 201, "request {i}: status {status}");
                    let ms = Instant::now().duration_since(due).as_secs_f64() * 1000.0;
                    samples.lock().unwrap().push(ms);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("sender");
    }
    Arc::try_unwrap(samples).expect("senders done").into_inner().unwrap()
}

fn main() {
    let rate = env_usize("BENCH_RATE", 200);
    let total = rate * env_usize("BENCH_SECS", 5);
    let senders = env_usize("BENCH_SENDERS", 32);
    println!("cargo bench -p keel-cli --bench hooks   # BENCH_RATE={rate} total={total}\n");
    println!("| path | requests | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");

    let daemon = common::Daemon::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        &[("BENCH_HOOK_SECRET", SECRET.to_owned())],
    );
    let api = api::Api::of(&daemon);
    let (status, hook) = api.post(
        "/v1/hooks",
        &json!({"name": "bench", "verify": "github", "secret_env": "BENCH_HOOK_SECRET", "run": run_body()}),
    );
    assert_eq!(status, 201, "create hook: {hook}");
    let mut hooks = open_loop(&api.addr, total, rate, senders, |i| {
        let body = json!({"delivery": i, "ref": "refs/heads/main"}).to_string();
        let signature = keel_core::hook::sign(SECRET.as_bytes(), &[body.as_bytes()]);
        let headers = format!("X-Hub-Signature-256: sha256={signature}\r\nX-GitHub-Delivery: bench-{i}\r\n");
        ("/v1/hooks/bench".to_owned(), headers, body)
    });
    drop(daemon);

    let floor_daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let floor_api = api::Api::of(&floor_daemon);
    let auth = format!("Authorization: Bearer {}\r\n", floor_api.token);
    let body = run_body().to_string();
    let mut runs = open_loop(&floor_api.addr, total, rate, senders, move |_| {
        ("/v1/runs".to_owned(), auth.clone(), body.clone())
    });
    for (name, samples) in
        [("POST /v1/hooks/bench (signed delivery)", &mut hooks), ("POST /v1/runs (floor)", &mut runs)]
    {
        let (p50, p99) = api::percentiles(samples);
        let max = samples.last().copied().unwrap_or(0.0);
        println!("| {name} | {} | {p50:.1} | {p99:.1} | {max:.1} |", samples.len());
    }
}
