//! An API request on a connection of its own, as most HTTP clients without a pool, curl,
//! webhooks and Prometheus make them: the daemon's `GET /v1/health` and `GET /v1/runs/{id}`
//! (with the token), each over a fresh TCP connection, against the floor in the same
//! process: a one-route axum server answering the same way on the same loopback. Also the
//! daemon's CPU per request (from `/proc/PID/stat`), where the gap shows without the
//! client's share. Sequential requests; p50, mean and p99 in µs.
//!
//! cargo bench -p keel-cli --bench http
//!
//! BENCH_N (requests per case, default 2000).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::time::Instant;

use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Case {
    name: String,
    p50: f64,
    mean: f64,
    p99: f64,
    /// The server's CPU per request in µs, when it is the daemon.
    cpu: Option<f64>,
}

/// `n` sequential requests, each on its own connection; checks every status. With
/// `daemon`, also the daemon's CPU per request.
fn measure(name: &str, n: usize, daemon: Option<&common::Daemon>, request: impl Fn() -> u16) -> Case {
    for _ in 0..n / 10 {
        assert_eq!(request(), 200, "{name}: warm-up");
    }
    let cpu_before = daemon.map(common::Daemon::cpu);
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let status = request();
        samples.push(started.elapsed().as_secs_f64() * 1e6);
        assert_eq!(status, 200, "{name}");
    }
    let cpu =
        daemon.zip(cpu_before).map(|(daemon, before)| (daemon.cpu() - before).as_secs_f64() * 1e6 / n as f64);
    let mean = samples.iter().sum::<f64>() / n as f64;
    let (p50, p99) = api::percentiles(&mut samples);
    Case { name: name.to_owned(), p50, mean, p99, cpu }
}

fn main() {
    let n = env_usize("BENCH_N", 2000);
    // The floor: the least an axum server does for a request on a new connection.
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime for the floor's server");
    let listener =
        runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind the floor's server");
    let floor_addr = listener.local_addr().expect("floor addr").to_string();
    let floor = axum::Router::new()
        .route("/v1/health", axum::routing::get(|| async { axum::Json(json!({"ok": true})) }));
    runtime
        .spawn(async move { axum::serve(listener, floor.into_make_service()).await.expect("floor server") });

    let daemon = common::Daemon::start_with_env(tempfile::tempdir().expect("tempdir"), &[]);
    let api = api::Api::of(&daemon);
    let run = api.create_run(&json!({
        "command": ["true"], "cwd": common::bench_dir().display().to_string(), "sandbox": {"tier": "none"},
    }));

    let cases = [
        measure("floor: one-route axum server, `GET /v1/health`", n, None, || {
            api::request_text(&floor_addr, "GET", "/v1/health", None, None).0
        }),
        measure("daemon: `GET /v1/health` (no token)", n, Some(&daemon), || {
            api::request_text(&api.addr, "GET", "/v1/health", None, None).0
        }),
        measure("daemon: `GET /v1/runs/{id}` (token, a store read)", n, Some(&daemon), || {
            api.get(&format!("/v1/runs/{run}")).0
        }),
    ];

    println!("cargo bench -p keel-cli --bench http   # BENCH_N={n}, one connection per request\n");
    println!("| case | p50 µs | mean µs | p99 µs | daemon CPU per request µs |");
    println!("|---|---:|---:|---:|---:|");
    for case in cases {
        let cpu = case.cpu.map_or("-".to_owned(), |c| format!("{c:.0}"));
        println!("| {} | {:.0} | {:.0} | {:.0} | {cpu} |", case.name, case.p50, case.mean, case.p99);
    }
}
