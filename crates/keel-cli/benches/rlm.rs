//! LLM calls from agent-written code over a large input (`examples/rlm`): a question about
//! a generated 20 MB log, answered by a `keel exec --input-file` program that filters and
//! chunks before calling `llm_batch` / `llm` (scripted provider, offline), against sending
//! the whole file in one prompt, which the run's budget refuses up front. The floor is the
//! same exec of `len(log)`: carrying the 20 MB input into a program, no model call.
//!
//! cargo bench -p keel-cli --bench rlm

#[path = "common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

const RUNS: usize = 5;
const BUDGET_TOKENS: &str = "200000";
const QUESTION: &str = "question=\"Why are checkout requests failing, and since when?\"";

fn example(name: &str) -> PathBuf {
    common::bench_dir().join("../../../examples/rlm").join(name)
}

/// Runs `keel exec` with the log as `log`; returns the outcome and the wall time (ms).
fn exec(daemon: &common::Daemon, log: &Path, program: &[&str]) -> (Value, f64) {
    let input = format!("log={}", log.display());
    let script = example("script.json").display().to_string();
    let mut args = vec![
        "exec",
        "--input-file",
        &input,
        "--input",
        QUESTION,
        "--llm-script",
        &script,
        "--budget-tokens",
        BUDGET_TOKENS,
        "--memory-bytes",
        "536870912",
        "--timeout-ms",
        "120000",
        "--json",
    ];
    args.extend(program);
    let start = Instant::now();
    let out = daemon.keel().args(&args).output().expect("keel exec");
    let wall = start.elapsed().as_secs_f64() * 1000.0;
    let view: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("keel exec printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
    });
    (view, wall)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let daemon = common::Daemon::start(tempfile::tempdir().expect("tempdir"));
    let log = daemon.data.path().join("app.log");
    let status = Command::new("python3")
        .arg(example("gen_log.py"))
        .args([log.as_os_str(), "20".as_ref()])
        .status()
        .expect("python3 gen_log.py");
    assert!(status.success());
    let bytes = std::fs::metadata(&log).expect("the log").len();

    let mut floor = Vec::new();
    let mut rlm = Vec::new();
    let mut whole = Vec::new();
    let (mut rlm_view, mut whole_view) = (Value::Null, Value::Null);
    for _ in 0..RUNS {
        let (view, wall) = exec(&daemon, &log, &["-e", "len(log)"]);
        assert_eq!(view["result"], bytes, "{view}");
        floor.push(wall);
        let (view, wall) = exec(&daemon, &log, &[&example("rlm.py").display().to_string()]);
        assert_eq!(view["ok"], true, "{view}");
        rlm.push(wall);
        rlm_view = view;
        let (view, wall) = exec(&daemon, &log, &[&example("whole.py").display().to_string()]);
        assert_eq!(view["ok"], false, "the one-prompt attempt must be refused: {view}");
        whole.push(wall);
        whole_view = view;
    }
    let usage = |view: &Value| {
        let out = daemon.keel().args(["inspect", view["run_id"].as_str().unwrap(), "--json"]).output();
        let run: Value = serde_json::from_slice(&out.expect("keel inspect").stdout).expect("inspect json");
        run["usage"].clone()
    };
    let rlm_usage = usage(&rlm_view);
    let whole_usage = usage(&whole_view);
    let message = whole_view["error"]["message"].as_str().unwrap_or_default();
    let estimate: u64 = message
        .split("needs about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    println!(
        "\n### A question over a {:.1} MB log ({RUNS} runs each, budget {BUDGET_TOKENS} tokens)\n",
        bytes as f64 / 1e6
    );
    println!("| approach | LLM calls sent | input tokens | output tokens | wall p50 (ms) | outcome |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| floor: `len(log)`, the input carried into a program | 0 | 0 | 0 | {:.0} | {} bytes |",
        median(floor),
        bytes
    );
    println!(
        "| filter + chunk + `llm_batch` + `llm` (`rlm.py`) | {} | {} | {} | {:.0} | answered: {} ERROR lines of {} in {} chunks |",
        rlm_usage["llm_calls"],
        rlm_usage["input_tokens"],
        rlm_usage["output_tokens"],
        median(rlm),
        rlm_view["result"]["error_lines"],
        rlm_view["result"]["lines"],
        rlm_view["result"]["chunks"],
    );
    println!(
        "| the whole file in one prompt (`whole.py`) | {} | {} (would be ~{} by the kernel's estimate, ~{} at 4 bytes a token) | {} | {:.0} | refused up front by the budget |",
        whole_usage["llm_calls"],
        whole_usage["input_tokens"],
        estimate,
        bytes / 4,
        whole_usage["output_tokens"],
        median(whole),
    );
    println!("\nThe refusal: {message}");
}
