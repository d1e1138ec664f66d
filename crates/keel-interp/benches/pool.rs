//! Latency of a 10-tool-call program through the worker pool (with an in-memory tool
//! handler), next to the same program run in this process with no worker: what the pool
//! costs over the interpreter itself. Then the same jobs back to back (each refill
//! competes with the next job for the CPU), and with no warm worker at all (each job
//! waits for its worker's start).
//!
//! cargo bench -p keel-interp --bench pool

use std::path::PathBuf;
use std::time::{Duration, Instant};

use keel_interp::{Job, Lang, Limits, Pool, PoolConfig, ToolHandler, WorkerCommand};
use serde_json::Value;

/// `echo` returns its arguments.
struct Echo;

#[async_trait::async_trait]
impl ToolHandler for Echo {
    async fn call(&self, _name: &str, args: Value) -> Result<Value, String> {
        Ok(args)
    }
}

fn job(lang: Lang, code: &str) -> Job {
    Job {
        lang,
        code: code.to_owned(),
        inputs: serde_json::Map::new(),
        tools: vec!["echo".to_owned()],
        limits: Limits { timeout: Duration::from_secs(2), ..Limits::default() },
    }
}

fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

fn worker() -> WorkerCommand {
    WorkerCommand { program: PathBuf::from(env!("CARGO_BIN_EXE_keel-interp-worker")), args: Vec::new() }
}

/// `n` jobs of `code` through `pool`, `pause` apart: p50 and p99.
async fn timed(pool: &Pool, lang: Lang, code: &str, n: usize, pause: Duration) -> (Duration, Duration) {
    let mut times = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let outcome = pool.exec(job(lang, code), &Echo).await;
        times.push(started.elapsed());
        assert_eq!(outcome.result, Ok(serde_json::json!(45)), "{code}");
        tokio::time::sleep(pause).await;
    }
    percentiles(&mut times)
}

const PY_TEN: &str = "t = 0\nfor i in range(10):\n    t += echo(i=i)['i']\nt";
const JS_TEN: &str = "let t = 0; for (let i = 0; i < 10; i++) t += echo({i}).i; t";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let pool = Pool::new(PoolConfig { worker: worker(), size: 4 });
        tokio::time::sleep(Duration::from_millis(500)).await;
        println!("\n| program | pool exec p50 | pool exec p99 | in process p50 | in process p99 |");
        println!("|---|---:|---:|---:|---:|");
        for (name, lang, code) in [
            ("python, 10 tool calls", Lang::Python, PY_TEN),
            ("javascript, 10 tool calls", Lang::JavaScript, JS_TEN),
            ("python, `45`", Lang::Python, "45"),
            ("javascript, `45`", Lang::JavaScript, "45"),
        ] {
            // 20 ms apart: the background refill keeps up, as it would between real jobs.
            let (p50, p99) = timed(&pool, lang, code, 200, Duration::from_millis(20)).await;
            let mut in_process = Vec::new();
            for _ in 0..200 {
                let started = Instant::now();
                let outcome = keel_interp::run_in_process(job(lang, code), &mut |_, args| Ok(args));
                in_process.push(started.elapsed());
                assert!(outcome.result.is_ok(), "{name}");
            }
            let (ip50, ip99) = percentiles(&mut in_process);
            println!("| {name} | {p50:.2?} | {p99:.2?} | {ip50:.2?} | {ip99:.2?} |");
        }
        println!("\npool: {:?}", pool.stats());

        println!(
            "\n| 10 tool calls, 300 jobs | back to back, 2 warm: p50 | p99 | no warm worker: p50 | p99 |"
        );
        println!("|---|---:|---:|---:|---:|");
        let warm = Pool::new(PoolConfig { worker: worker(), size: 2 });
        let cold = Pool::new(PoolConfig { worker: worker(), size: 0 });
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (name, lang, code) in [("python", Lang::Python, PY_TEN), ("javascript", Lang::JavaScript, JS_TEN)]
        {
            let (p50, p99) = timed(&warm, lang, code, 300, Duration::ZERO).await;
            let (cold50, cold99) = timed(&cold, lang, code, 300, Duration::ZERO).await;
            println!("| {name} | {p50:.2?} | {p99:.2?} | {cold50:.2?} | {cold99:.2?} |");
        }
        println!("\nback to back: {:?}\nno warm worker: {:?}", warm.stats(), cold.stats());
    });
}
