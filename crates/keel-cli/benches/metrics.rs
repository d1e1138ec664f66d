//! `GET /metrics` scrape time with 10,000 runs in the store (goal: under 50 ms). The runs
//! (ended ones, spread over 10 tenants and the three final states, so the daemon has
//! nothing to recover) are written straight into the store before `keel serve` starts;
//! then the benchmark scrapes the daemon's `/metrics` over HTTP, one connection per
//! scrape, as Prometheus does, and reports the time to the whole answer. On SQLite, and
//! on Postgres when `KEEL_BENCH_POSTGRES_URL` (else `KEEL_TEST_POSTGRES_URL`) names a
//! server where it may create a database of its own (dropped at the end).
//!
//! cargo bench -p keel-cli --bench metrics
//!
//! BENCH_RUNS (default 10000), BENCH_ITERATIONS (default 200).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use keel_store::{NewRun, RunPatch, Store};
use keel_types::{RunId, RunState};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Writes `runs` ended runs into `store`.
async fn fill(store: Arc<dyn Store>, runs: usize) {
    let states = [RunState::Succeeded, RunState::Failed, RunState::Cancelled];
    let start = 1_700_000_000_000u64;
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..runs {
        let store = store.clone();
        writes.spawn(async move {
            let created_at_ms = start + i as u64;
            let run = NewRun {
                id: RunId::generate(created_at_ms),
                tenant: format!("tenant-{}", i % 10),
                spec: serde_json::json!({"command": ["python3", "agent.py"]}),
                state: RunState::Running,
                created_at_ms,
            };
            let id = store.create_run(run).await.expect("create run").id;
            let end = RunPatch {
                state: Some(states[i % 3]),
                ended_at_ms: Some(Some(created_at_ms)),
                ..RunPatch::default()
            };
            store.update_run(&id, None, end).await.expect("end run");
        });
        // Bounded concurrency: enough to use group commit, not a task per run at once.
        if writes.len() >= 64 {
            writes.join_next().await;
        }
    }
    while writes.join_next().await.is_some() {}
}

/// Scrapes `/metrics` `iterations` times; returns (mean, p50, p99) in ms and the size.
fn scrape(daemon: &common::Daemon, iterations: usize) -> (f64, f64, f64, usize) {
    let api = api::Api::of(daemon);
    let get = || {
        let mut cmd_out = Vec::new();
        let started = Instant::now();
        let (status, size) = raw_get(&api.addr, "/metrics", &api.token, &mut cmd_out);
        let took = started.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&cmd_out));
        (took, size)
    };
    // Warm up (the first scrape prepares statements, creates the label sets).
    let (_, size) = get();
    let text = String::from_utf8_lossy(&{
        let mut body = Vec::new();
        raw_get(&api.addr, "/metrics", &api.token, &mut body);
        body
    })
    .into_owned();
    assert!(text.contains("keel_runs{tenant=\"tenant-0\",state=\"succeeded\"}"), "the runs are counted");
    let mut samples: Vec<f64> = (0..iterations).map(|_| get().0).collect();
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    let (p50, p99) = api::percentiles(&mut samples);
    (mean, p50, p99, size)
}

/// One GET over its own connection; the body into `body`, returns (status, body bytes).
fn raw_get(addr: &str, path: &str, token: &str, body: &mut Vec<u8>) -> (u16, usize) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
    let status = String::from_utf8_lossy(&response[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    body.extend_from_slice(&response[split..]);
    (status, response.len() - split)
}

fn report(store: &str, runs: usize, iterations: usize, (mean, p50, p99, size): (f64, f64, f64, usize)) {
    println!("| {store} | {runs} | {iterations} | {mean:.2} | {p50:.2} | {p99:.2} | {} |", size / 1024);
}

fn psql(url: &str, sql: &str) {
    let out = Command::new("psql").args([url, "-qAtc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn main() {
    let runs = env_usize("BENCH_RUNS", 10_000);
    let iterations = env_usize("BENCH_ITERATIONS", 200);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    println!("| store | runs | scrapes | mean ms | p50 ms | p99 ms | KiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|");

    let data = tempfile::tempdir().expect("tempdir");
    runtime.block_on(async {
        let store = keel_store::SqliteStore::open(&data.path().join("keel.db")).expect("open the store");
        fill(Arc::new(store), runs).await;
    });
    let daemon = common::Daemon::start(data);
    report("sqlite", runs, iterations, scrape(&daemon, iterations));
    drop(daemon);

    let admin = std::env::var("KEEL_BENCH_POSTGRES_URL").or_else(|_| std::env::var("KEEL_TEST_POSTGRES_URL"));
    let Ok(admin) = admin else {
        eprintln!("(no KEEL_BENCH_POSTGRES_URL or KEEL_TEST_POSTGRES_URL: Postgres skipped)");
        return;
    };
    let name = format!("keel_test_bench_metrics_{}", std::process::id());
    let Some((server, _)) = admin.rsplit_once('/') else { panic!("{admin:?} names no database") };
    let url = format!("{server}/{name}");
    psql(&admin, &format!("CREATE DATABASE {name}"));
    runtime.block_on(async {
        let store = keel_store::PgStore::connect(&url).await.expect("open the Postgres store");
        fill(Arc::new(store), runs).await;
    });
    let daemon = common::Daemon::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        &[("KEEL_STORE_URL", url.clone())],
    );
    report("postgres", runs, iterations, scrape(&daemon, iterations));
    drop(daemon);
    psql(&admin, &format!("DROP DATABASE {name} WITH (FORCE)"));
}
