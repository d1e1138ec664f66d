//! Latency of a 10-tool-call snippet through the pool, printed as p50/p99. Run with
//! `cargo test -p keel-interp --release --test it -- --ignored --nocapture bench`.

use std::time::{Duration, Instant};

use keel_interp::Lang;

use crate::{Tools, job, pool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints numbers, asserts nothing about speed"]
async fn bench_pool_exec_ten_tool_calls() {
    let pool = pool(4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tools = Tools::default();
    for (lang, code) in [
        (Lang::Python, "t = 0\nfor i in range(10):\n    t += echo(i=i)['i']\nt"),
        (Lang::JavaScript, "let t = 0; for (let i = 0; i < 10; i++) t += echo({i}).i; t"),
        (Lang::Python, "45"),
        (Lang::JavaScript, "45"),
    ] {
        let mut pool_times = Vec::new();
        let mut interpreter_times = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            let outcome = pool.exec(job(lang, code), &tools).await;
            pool_times.push(started.elapsed());
            assert_eq!(outcome.result, Ok(serde_json::json!(45)));
            // Let the background refill keep up, as it would between real jobs.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..200 {
            let started = Instant::now();
            let outcome = keel_interp::run_in_process(job(lang, code), &mut |_, args| Ok(args));
            interpreter_times.push(started.elapsed());
            assert!(outcome.result.is_ok());
        }
        let (p50, p99) = percentiles(&mut pool_times);
        let (ip50, ip99) = percentiles(&mut interpreter_times);
        println!("{lang}: pool exec p50 {p50:?} p99 {p99:?}; interpreter alone p50 {ip50:?} p99 {ip99:?}");
        println!("stats {:?}", pool.stats());
    }
}

fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[times.len() * 99 / 100])
}
