//! Tracing overhead: the same agent (`benches/bench_otel.py`: sys.ping, a journaled
//! sys.now, and chat completions through the gateway) under two daemons in the same run,
//! one exporting traces and metrics over OTLP/HTTP to a local collector that accepts and
//! drops everything, one with no `OTEL_*` variable; twice each, alternating.
//!
//! cargo bench -p keel-cli --bench otel

#[path = "common.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn agent_output(daemon: &common::Daemon) -> Value {
    let dir = common::bench_dir().display();
    let args = [
        "--sandbox".to_owned(),
        "none".into(),
        "--llm-script".into(),
        format!("{dir}/bench_otel_script.json"),
        "--env".into(),
        format!("PYTHONPATH={dir}"),
        "--".into(),
        "python3".into(),
        format!("{dir}/bench_otel.py"),
    ];
    daemon.finished_run(&args)["output"].clone()
}

fn main() {
    // The collector: the tests' OTLP receiver, told to drop what it decodes.
    let collector_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(collector_dir.path().join("drop"), "").expect("drop marker");
    let receiver = common::bench_dir().join("../tests/agents/otlp_receiver.py");
    let mut collector = Command::new("python3")
        .arg(&receiver)
        .arg(collector_dir.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("start the OTLP receiver");
    let port_file = collector_dir.path().join("port");
    let deadline = Instant::now() + Duration::from_secs(30);
    let port = loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            break port;
        }
        assert!(Instant::now() < deadline, "the OTLP receiver did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let plain = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let traced = common::Daemon::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "1000".into())],
    );
    let mut rows = Vec::new();
    for round in 1..=2 {
        rows.push((format!("none, round {round}"), agent_output(&plain)));
        rows.push((format!("OTLP exporter, round {round}"), agent_output(&traced)));
    }
    let _ = collector.kill();
    let _ = collector.wait();
    println!("cargo bench -p keel-cli --bench otel\n");
    println!(
        "| exporter | sys.ping p50 / p99 µs | sys.now (journaled) p50 / p99 µs | gateway chat p50 / p99 µs |"
    );
    println!("|---|---:|---:|---:|");
    for (name, out) in &rows {
        let cell = |k: &str| format!("{} / {}", out[k]["p50_us"], out[k]["p99_us"]);
        println!("| {name} | {} | {} | {} |", cell("ping"), cell("now"), cell("gateway"));
    }
    let p50 = |i: usize, k: &str| rows[i].1[k]["p50_us"].as_f64().unwrap_or(0.0);
    for k in ["ping", "now", "gateway"] {
        let none = (p50(0, k) + p50(2, k)) / 2.0;
        let traced = (p50(1, k) + p50(3, k)) / 2.0;
        println!(
            "\n{k}: p50 {none:.1} µs without, {traced:.1} µs with the exporter: {:+.1}%",
            (traced / none - 1.0) * 100.0
        );
    }
}
