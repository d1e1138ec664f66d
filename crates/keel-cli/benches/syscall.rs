//! Syscall round trip: the Python and TypeScript SDKs' no-op syscall (`sys.ping`) through
//! the kernel, each against the floor of its language's client on a raw Unix-socket echo
//! server doing nothing, in the same run.
//!
//! cargo bench -p keel-cli --bench syscall

#[path = "common.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::Command;

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

/// Runs `program` (an interpreter and its arguments) as a benchmark agent under the daemon
/// and returns the output it exited with.
fn agent_output(daemon: &common::Daemon, program: &[&str]) -> Value {
    let mut args = vec!["--"];
    args.extend_from_slice(program);
    daemon.finished_run(&args)["output"].clone()
}

/// The floor: `interpreter client echo PATH`'s stats.
fn echo_floor(interpreter: &str, client: &std::path::Path, echo_path: &std::path::Path) -> Value {
    let out = Command::new(interpreter)
        .arg(client)
        .args(["echo", &echo_path.display().to_string()])
        .output()
        .expect("run the echo client");
    assert!(out.status.success(), "echo client failed: {}", String::from_utf8_lossy(&out.stderr));
    let echo: Value = serde_json::from_slice(&out.stdout).expect("echo stats");
    echo["echo"].clone()
}

fn main() {
    let python_client = common::bench_dir().join("bench_client.py");
    let node_client = common::bench_dir().join("bench_client.js");
    let scratch = tempfile::tempdir().expect("tempdir");
    let echo_path = scratch.path().join("echo.sock");
    echo_server(&echo_path);
    let python_echo = echo_floor("python3", &python_client, &echo_path);
    let node_echo = echo_floor("node", &node_client, &echo_path);

    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let python = agent_output(&daemon, &["python3", &python_client.display().to_string(), "kernel"]);
    let node = agent_output(&daemon, &["node", &node_client.display().to_string(), "kernel"]);
    let python_floor = python_echo["p50_us"].as_f64().unwrap_or(1.0);
    let node_floor = node_echo["p50_us"].as_f64().unwrap_or(1.0);
    println!("cargo bench -p keel-cli --bench syscall\n");
    println!("| round trip | n | mean µs | p50 µs | p99 µs | p50 vs floor |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "{}",
        row("floor: raw Unix-socket echo (Python client, Rust echo server)", &python_echo, python_floor)
    );
    println!("{}", row("kernel: sys.ping, raw socket client", &python["kernel_raw"], python_floor));
    println!("{}", row("kernel: sys.ping through the Python SDK", &python["kernel_sdk"], python_floor));
    println!(
        "{}",
        row("floor: raw Unix-socket echo (Node client, Rust echo server)", &node_echo, node_floor)
    );
    println!(
        "{}",
        row("kernel: sys.ping through the TypeScript SDK (Node)", &node["kernel_sdk"], node_floor)
    );
}
