//! Cancellation latency: `POST /v1/runs/{id}/stop {"grace_secs": 0}` on the root of a tree
//! of 9 runs (a parent, four children, a grandchild under each) whose agents are in the
//! middle of an LLM call streaming from a slow upstream (two through the OpenAI-compatible
//! gateway, two through the `llm.chat` syscall), a `sys.sleep` or an `ipc.recv`, timed to
//! (a) every run's recorded process gone and (b) the upstream seeing each stream closed
//! (waiting at most BENCH_CLOSE_WAIT_MS after (a); a stream still open then is counted as
//! not closed). The floor, in the same run: SIGKILL of a plain process tree of the same 9
//! processes, timed to every process gone.
//!
//! cargo bench -p keel-cli --bench stop
//!
//! BENCH_ITERATIONS (default 30), BENCH_TIER (the runs' sandbox tier, default `none`),
//! BENCH_CLOSE_WAIT_MS (default 2000).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

const TREE: usize = 9;
const STREAMS: usize = 4;

fn unix_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_nanos()
}

fn wait_until<T>(what: &str, timeout: Duration, poll: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(poll);
    }
}

/// The floor: SIGKILL to the process group of a plain 9-process fork tree.
fn floor_once(script: &str) -> f64 {
    let mut child = Command::new("python3")
        .args([script, "floor"])
        .process_group(0)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the floor tree");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("floor pids");
    let pids: Vec<u32> = serde_json::from_str(&line).expect("pids JSON");
    assert_eq!(pids.len(), TREE);
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).expect("kill the floor tree");
    wait_until("the floor tree to die", Duration::from_secs(10), Duration::from_millis(1), || {
        pids.iter().all(|pid| api::exited(*pid)).then_some(())
    });
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    let _ = child.wait();
    elapsed
}

fn streams(upstream: &str) -> Vec<Value> {
    api::request(upstream, "GET", "/state", None, None).1["streams"].as_array().cloned().unwrap_or_default()
}

/// The two ways an agent's LLM call reaches the upstream; the tag is in its prompt.
const PATHS: [(&str, &str); 2] =
    [("gateway", "stream slowly (gateway)"), ("llm.chat syscall", "stream slowly (syscall)")];

struct Sample {
    stop_answered_ms: f64,
    processes_gone_ms: f64,
    /// Per path: stop to the last of its streams closed by the kernel, if all were.
    streams_closed_ms: [Option<f64>; 2],
}

/// Kills the mock upstream however the benchmark ends.
struct Upstream(std::process::Child);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kernel_once(api: &api::Api, upstream: &str, script: &str, tier: &str) -> Sample {
    let known: HashSet<String> =
        api.runs(100_000).iter().filter_map(|r| r["run_id"].as_str().map(str::to_owned)).collect();
    let streams_before = streams(upstream).len();
    let parent = api.create_run(&json!({
        "command": ["python3", script],
        "cwd": common::bench_dir().display().to_string(),
        "input": {"role": "parent"},
        "sandbox": {"tier": tier},
    }));
    // Wait for the whole tree to be running and every stream to be open upstream.
    let tree: Vec<(String, u32)> =
        wait_until("the tree to be up", Duration::from_secs(120), Duration::from_millis(20), || {
            let runs: Vec<(String, u32)> = api
                .runs(100_000)
                .iter()
                .filter(|r| !known.contains(r["run_id"].as_str().unwrap_or_default()))
                .filter(|r| matches!(r["state"].as_str(), Some("running" | "waiting")))
                .filter_map(|r| Some((r["run_id"].as_str()?.to_owned(), r["pid"].as_u64()? as u32)))
                .collect();
            let open =
                streams(upstream)[streams_before..].iter().filter(|s| s["closed_ns"].is_null()).count();
            (runs.len() == TREE && open == STREAMS).then_some(runs)
        });
    // Let the sleepers and receivers settle into their calls.
    std::thread::sleep(Duration::from_millis(200));

    let started_ns = unix_ns();
    let started = Instant::now();
    let (status, body) = api.post(&format!("/v1/runs/{parent}/stop"), &json!({"grace_secs": 0}));
    let stop_answered_ms = started.elapsed().as_secs_f64() * 1e3;
    assert!((200..300).contains(&status), "stop: {status} {body}");
    wait_until("every run's process to be gone", Duration::from_secs(30), Duration::from_millis(1), || {
        tree.iter().all(|(_, pid)| api::exited(*pid)).then_some(())
    });
    let processes_gone_ms = started.elapsed().as_secs_f64() * 1e3;
    let close_wait = Duration::from_millis(close_wait_ms());
    let deadline = Instant::now() + close_wait;
    let ours = loop {
        let ours: Vec<Value> = streams(upstream)[streams_before..].to_vec();
        let closed = ours.iter().filter(|s| s["by_client"] == true).count();
        if closed == STREAMS || Instant::now() >= deadline {
            break ours;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let streams_closed_ms = PATHS.map(|(_, tag)| {
        let mine: Vec<&Value> = ours.iter().filter(|s| s["tag"] == tag).collect();
        let closed: Vec<u128> = mine
            .iter()
            .filter(|s| s["by_client"] == true)
            .filter_map(|s| s["closed_ns"].as_u64().map(u128::from))
            .collect();
        (!mine.is_empty() && closed.len() == mine.len())
            .then(|| closed.into_iter().max().unwrap_or(started_ns).saturating_sub(started_ns) as f64 / 1e6)
    });
    wait_until("every run to end cancelled", Duration::from_secs(30), Duration::from_millis(20), || {
        tree.iter().all(|(id, _)| api.run(id)["state"] == "cancelled").then_some(())
    });
    Sample { stop_answered_ms, processes_gone_ms, streams_closed_ms }
}

fn row(name: &str, samples: &mut [f64]) -> String {
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    let (p50, p99) = api::percentiles(samples);
    let max = samples.last().copied().unwrap_or_default();
    format!("| {name} | {} | {mean:.1} | {p50:.1} | {p99:.1} | {max:.1} |", samples.len())
}

fn main() {
    let iterations: usize = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let tier = std::env::var("BENCH_TIER").unwrap_or_else(|_| "none".into());
    let script = common::bench_dir().join("bench_tree.py").display().to_string();
    let mut floor: Vec<f64> = (0..iterations).map(|_| floor_once(&script)).collect();

    let scratch = tempfile::tempdir().expect("tempdir");
    let port_file = scratch.path().join("upstream.port");
    let _upstream = Upstream(
        Command::new("python3")
            .arg(common::bench_dir().join("bench_upstream.py"))
            .arg(&port_file)
            .spawn()
            .expect("start the slow upstream"),
    );
    let port: u16 = wait_until("the upstream", Duration::from_secs(30), Duration::from_millis(10), || {
        std::fs::read_to_string(&port_file).ok()?.trim().parse().ok()
    });
    let upstream_addr = format!("127.0.0.1:{port}");
    let daemon = common::Daemon::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        &[
            ("OPENAI_API_KEY", "sk-bench-upstream".to_owned()),
            ("OPENAI_BASE_URL", format!("http://{upstream_addr}/v1")),
        ],
    );
    let api = api::Api::of(&daemon);
    let samples: Vec<Sample> =
        (0..iterations).map(|_| kernel_once(&api, &upstream_addr, &script, &tier)).collect();
    drop(daemon);

    let mut answered: Vec<f64> = samples.iter().map(|s| s.stop_answered_ms).collect();
    let mut gone: Vec<f64> = samples.iter().map(|s| s.processes_gone_ms).collect();
    println!("cargo bench -p keel-cli --bench stop\n");
    println!("Tree of {TREE} runs ({STREAMS} mid-stream), sandbox `{tier}`.\n");
    println!("| from stop to ... | n | mean ms | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!("{}", row(&format!("floor: SIGKILL to a plain {TREE}-process tree, all gone"), &mut floor));
    println!("{}", row("kernel: the stop request answered", &mut answered));
    println!("{}", row(&format!("kernel: all {TREE} runs' processes gone"), &mut gone));
    for (i, (path, _)) in PATHS.iter().enumerate() {
        let mut closed: Vec<f64> = samples.iter().filter_map(|s| s.streams_closed_ms[i]).collect();
        let open = samples.len() - closed.len();
        let name = format!("kernel: both {path} streams closed upstream");
        if closed.is_empty() {
            println!("| {name} | 0 | - | - | - | - |");
        } else {
            println!("{}", row(&name, &mut closed));
        }
        if open > 0 {
            println!(
                "| kernel: {path}: stops after which a stream was still open {} ms after the processes were gone | {open} of {} | | | | |",
                close_wait_ms(),
                samples.len()
            );
        }
    }
}

fn close_wait_ms() -> u64 {
    std::env::var("BENCH_CLOSE_WAIT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}
