//! Syscall round trip: the Python SDK's no-op syscall (`sys.ping`) through the kernel,
//! against the floor of a raw Unix-socket echo server doing nothing, in the same run.
//!
//! cargo bench -p keel-cli --bench syscall

#[path = "common.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The floor: echoes each line back, on a plain thread per connection.
fn echo_server(path: &std::path::Path) {
    let listener = UnixListener::bind(path).expect("bind echo socket");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().expect("clone stream");
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    if writer.write_all(line.as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
}

fn row(name: &str, stats: &Value, floor: f64) -> String {
    let p50 = stats["p50_us"].as_f64().unwrap_or(0.0);
    format!(
        "| {name} | {} | {} | {} | {} | {:.2}x |",
        stats["n"],
        stats["mean_us"],
        stats["p50_us"],
        stats["p99_us"],
        p50 / floor
    )
}

fn main() {
    let client = common::bench_dir().join("bench_client.py");
    let scratch = tempfile::tempdir().expect("tempdir");
    let echo_path = scratch.path().join("echo.sock");
    echo_server(&echo_path);
    let out = Command::new("python3")
        .arg(&client)
        .args(["echo", &echo_path.display().to_string()])
        .output()
        .expect("run the echo client");
    assert!(out.status.success(), "echo client failed: {}", String::from_utf8_lossy(&out.stderr));
    let echo: Value = serde_json::from_slice(&out.stdout).expect("echo stats");

    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let out = daemon
        .keel()
        .args(["run", "--detach", "--json", "--", "python3", &client.display().to_string(), "kernel"])
        .output()
        .expect("keel run");
    assert!(out.status.success(), "keel run failed: {}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).expect("run id");
    let run = run["run_id"].as_str().expect("run_id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(600);
    let view = loop {
        let out = daemon.keel().args(["inspect", &run, "--json"]).output().expect("keel inspect");
        let view: Value = serde_json::from_slice(&out.stdout).expect("inspect json");
        if matches!(view["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
            break view;
        }
        assert!(Instant::now() < deadline, "the benchmark agent did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(view["state"], "succeeded", "benchmark agent failed: {view}");
    let output = &view["output"];
    let floor = echo["echo"]["p50_us"].as_f64().unwrap_or(1.0);
    println!("cargo bench -p keel-cli --bench syscall\n");
    println!("| round trip | n | mean µs | p50 µs | p99 µs | p50 vs floor |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "{}",
        row("floor: raw Unix-socket echo (Python client, Rust echo server)", &echo["echo"], floor)
    );
    println!("{}", row("kernel: sys.ping, raw socket client", &output["kernel_raw"], floor));
    println!("{}", row("kernel: sys.ping through the Python SDK", &output["kernel_sdk"], floor));
}
