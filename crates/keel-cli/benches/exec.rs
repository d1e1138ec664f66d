//! Programmatic tool calling: `code.exec` of a program making 10 governed, journaled tool
//! calls, in monty (Python), QuickJS (JavaScript) and CPython in the process sandbox, next
//! to `python3 -c 'pass'` start-up in the same run; then the same 10-step task done as 10
//! LLM tool-call round trips vs one `code.exec`, with the scripted provider: LLM calls and
//! tokens used by each.
//!
//! cargo bench -p keel-cli --bench exec

#[path = "common.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use serde_json::Value;

fn python_startup(n: usize) -> (f64, f64) {
    let mut samples: Vec<f64> = (0..n)
        .map(|_| {
            let start = Instant::now();
            let status = Command::new("python3").args(["-c", "pass"]).status().expect("python3");
            assert!(status.success());
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[n / 2], samples[(n * 99 / 100).min(n - 1)])
}

fn main() {
    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let (py_p50, py_p99) = python_startup(50);
    let latency = run_agent_mode(&daemon, "latency", None);
    println!("cargo bench -p keel-cli --bench exec\n\n{}", common::store_label());
    println!("\n### code.exec of a program making 10 tool calls (µs)\n");
    println!("| path | n | agent p50 | agent p99 | in kernel p50 | in kernel p99 |");
    println!("|---|---|---|---|---|---|");
    for lang in ["python", "javascript", "cpython"] {
        let stats = &latency["output"][lang];
        println!(
            "| {lang} | {} | {} | {} | {} | {} |",
            stats["agent"]["n"],
            stats["agent"]["p50_us"],
            stats["agent"]["p99_us"],
            stats["kernel"]["p50_us"],
            stats["kernel"]["p99_us"]
        );
    }
    println!(
        "| `python3 -c 'pass'` start-up (floor for a fresh interpreter) | 50 | {py_p50:.0} | {py_p99:.0} | | |"
    );

    let scripts = common::bench_dir();
    let looped =
        run_agent_mode(&daemon, "loop", Some(&scripts.join("exec_loop_script.json").display().to_string()));
    let once =
        run_agent_mode(&daemon, "exec", Some(&scripts.join("exec_once_script.json").display().to_string()));
    println!("\n### The same 10-step task: 10 LLM tool-call round trips vs one code.exec\n");
    println!("| approach | LLM calls | input tokens | output tokens | tool calls |");
    println!("|---|---|---|---|---|");
    for (name, view) in [("10 tool-call round trips", &looped), ("one code.exec", &once)] {
        let usage = &view["usage"];
        println!(
            "| {name} | {} | {} | {} | {} |",
            usage["llm_calls"], usage["input_tokens"], usage["output_tokens"], usage["tool_calls"]
        );
    }
}

fn run_agent_mode(daemon: &common::Daemon, mode: &str, script: Option<&str>) -> Value {
    let client = common::bench_dir().join("bench_exec.py");
    let mut args = vec!["--grant".to_owned(), "echo".into()];
    if let Some(script) = script {
        args.extend(["--llm-script".into(), script.to_owned()]);
    }
    args.extend(["--".into(), "python3".into(), client.display().to_string(), mode.into()]);
    daemon.finished_run(&args)
}
