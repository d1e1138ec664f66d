//! Journal benchmark: latency of a journaled step in `SqliteStore` (and `PgStore`, below)
//! against the floor of raw commits, and throughput under 100 concurrent runs. Prints a
//! markdown table. Run with `cargo bench -p keel-store --bench journal`.
//!
//! Every case writes a fresh database in its own temporary directory under one parent
//! (`KEEL_BENCH_DIR`, default the system temp dir), so all cases fsync to the same
//! filesystem. The three sequential cases run interleaved in rounds, so that background
//! disk activity (other builds on a shared machine) weighs on each of them alike.
//! `KEEL_BENCH_STEPS` overrides the number of sequential steps per case (2000).
//!
//! With `KEEL_BENCH_POSTGRES_URL` (or else `KEEL_TEST_POSTGRES_URL`) set, the same cases
//! run on `PgStore` too, in a schema of their own (`keel_bench_<pid>`, dropped at the end)
//! of that database: the floor there is two raw statements committed one by one (an
//! INSERT, then an UPDATE recording the result) with the same driver on the same server.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_store::{Completion, NewEntry, NewRun, PgStore, SqliteStore, Store};
use keel_types::{EntryStatus, RunId, RunState, Usage};
use rusqlite::{Connection, params};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::runtime::Runtime;

#[path = "pg_bench.rs"]
mod pg_bench;

const DEFAULT_STEPS: usize = 2000;
/// Unmeasured steps first, so that file growth and statement caches settle.
const WARMUP_STEPS: usize = 50;
/// The sequential cases take turns this many times.
const ROUNDS: usize = 8;
const CONCURRENT_RUNS: usize = 100;
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(3);

fn main() {
    let steps =
        std::env::var("KEEL_BENCH_STEPS").ok().and_then(|text| text.parse().ok()).unwrap_or(DEFAULT_STEPS);
    let parent = std::env::var_os("KEEL_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let runtime = Runtime::new().expect("starting the tokio runtime");

    println!("command: cargo bench -p keel-store --bench journal");
    println!(
        "SQLite {} (WAL, synchronous=FULL), databases under {}, {} CPUs\n",
        rusqlite::version(),
        parent.display(),
        std::thread::available_parallelism().map_or(1, usize::from),
    );

    let [floor, floor2, sequential] = sequential_cases(&runtime, &parent, steps);
    let (concurrent, window) = runtime.block_on(store_concurrent(&fresh_dir(&parent)));

    println!("| case | steps | mean µs | p50 µs | p99 µs | steps/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    floor.print_row("floor: raw INSERT, 1 commit per step", floor.sequential_rate());
    floor2.print_row("floor2: raw INSERT + UPDATE, 2 commits per step", floor2.sequential_rate());
    sequential
        .print_row("store: append_entry(pending) + complete_entry, sequential", sequential.sequential_rate());
    concurrent.print_row(
        &format!("store: {CONCURRENT_RUNS} concurrent runs, {:.0} s (group commit)", window.as_secs_f64()),
        concurrent.latencies.len() as f64 / window.as_secs_f64(),
    );

    let postgres_url =
        std::env::var("KEEL_BENCH_POSTGRES_URL").or_else(|_| std::env::var("KEEL_TEST_POSTGRES_URL"));
    if let Ok(url) = postgres_url {
        runtime.block_on(postgres_cases(&url, steps));
    }
}

/// The Postgres cases, in a schema of their own that is dropped at the end.
async fn postgres_cases(server_url: &str, steps: usize) {
    let schema = pg_bench::BenchSchema::create(server_url, "keel_bench").await;
    let url = schema.url.clone();
    println!("\nPostgres {} (fsync=on, synchronous_commit=on), schema {}\n", schema.version, schema.name);

    let floor = pg_bench::Floor::new(&url).await;
    let store = PgStore::connect(&url).await.expect("connecting the store");
    let store: Arc<dyn Store> = Arc::new(store);
    let runs = create_runs(&*store, CONCURRENT_RUNS + 1).await;
    let (run, concurrent_runs) = runs.split_first().expect("runs were created");

    let floor_steps = |range: Range<usize>| {
        let floor = &floor;
        async move {
            let mut latencies = Vec::with_capacity(range.len());
            for step in range {
                let params = step_params(0, step).to_string().into_bytes();
                let result = step_result(step).to_string().into_bytes();
                latencies.push(floor.step(step, &params, &result).await);
            }
            latencies
        }
    };
    floor_steps(0..WARMUP_STEPS).await;
    store_steps(&*store, run, 0..WARMUP_STEPS).await;
    let (mut floor_latencies, mut store_latencies) = (Vec::new(), Vec::new());
    let mut next = WARMUP_STEPS;
    for round in 0..ROUNDS {
        let count = steps / ROUNDS + usize::from(round < steps % ROUNDS);
        floor_latencies.extend(floor_steps(next..next + count).await);
        store_latencies.extend(store_steps(&*store, run, next..next + count).await);
        next += count;
    }
    let (floor_latencies, store_latencies) =
        (Latencies::new(floor_latencies), Latencies::new(store_latencies));
    let (concurrent, window) = concurrent_steps(&store, concurrent_runs.to_vec()).await;

    println!("| case | steps | mean µs | p50 µs | p99 µs | steps/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    floor_latencies
        .print_row("pg floor: raw INSERT + UPDATE, 2 commits per step", floor_latencies.sequential_rate());
    store_latencies.print_row(
        "pg store: append_entry(pending) + complete_entry, sequential",
        store_latencies.sequential_rate(),
    );
    concurrent.print_row(
        &format!("pg store: {CONCURRENT_RUNS} concurrent runs, {:.0} s", window.as_secs_f64()),
        concurrent.latencies.len() as f64 / window.as_secs_f64(),
    );
    println!(
        "\npg store / pg floor (mean): {:.2}x",
        store_latencies.mean().as_secs_f64() / floor_latencies.mean().as_secs_f64()
    );

    drop(store);
    schema.drop().await;
}

/// The floor, floor2 and store cases, `steps` each, taking turns in `ROUNDS` rounds.
fn sequential_cases(runtime: &Runtime, parent: &Path, steps: usize) -> [Latencies; 3] {
    let (floor_dir, floor2_dir, store_dir) = (fresh_dir(parent), fresh_dir(parent), fresh_dir(parent));
    let mut floor = RawFloor::open(&floor_dir, false);
    let mut floor2 = RawFloor::open(&floor2_dir, true);
    let (store, runs) = runtime.block_on(open_store_with_runs(&store_dir, 1));
    let run = &runs[0];

    floor.steps(WARMUP_STEPS);
    floor2.steps(WARMUP_STEPS);
    runtime.block_on(store_steps(&*store, run, 0..WARMUP_STEPS));
    let mut latencies = [(); 3].map(|()| Vec::with_capacity(steps));
    let mut next_store_step = WARMUP_STEPS;
    for round in 0..ROUNDS {
        // Spread `steps` over the rounds, the remainder going to the first ones.
        let count = steps / ROUNDS + usize::from(round < steps % ROUNDS);
        latencies[0].extend(floor.steps(count));
        latencies[1].extend(floor2.steps(count));
        latencies[2].extend(runtime.block_on(store_steps(
            &*store,
            run,
            next_store_step..next_store_step + count,
        )));
        next_store_step += count;
    }
    latencies.map(Latencies::new)
}

fn fresh_dir(parent: &Path) -> TempDir {
    tempfile::tempdir_in(parent).expect("creating a temporary directory for the database")
}

/// Per-step latencies of one case.
struct Latencies {
    latencies: Vec<Duration>,
}

impl Latencies {
    fn new(latencies: Vec<Duration>) -> Latencies {
        let mut latencies = latencies;
        latencies.sort_unstable();
        Latencies { latencies }
    }

    fn mean(&self) -> Duration {
        self.latencies.iter().sum::<Duration>() / self.latencies.len().max(1) as u32
    }

    fn percentile(&self, percent: usize) -> Duration {
        let index = (self.latencies.len() * percent / 100).min(self.latencies.len() - 1);
        self.latencies[index]
    }

    /// Steps per second when steps run one after another.
    fn sequential_rate(&self) -> f64 {
        1.0 / self.mean().as_secs_f64()
    }

    fn print_row(&self, case: &str, steps_per_second: f64) {
        let micros = |duration: Duration| duration.as_secs_f64() * 1e6;
        println!(
            "| {case} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            self.latencies.len(),
            micros(self.mean()),
            micros(self.percentile(50)),
            micros(self.percentile(99)),
            steps_per_second,
        );
    }
}

/// A journal step's params: a small chat request, different at every step (as in life,
/// so that blob deduplication does not flatter the store).
fn step_params(run: usize, step: usize) -> Value {
    json!({
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. ".repeat(8)},
            {"role": "user", "content": format!("run {run}, step {step}: what next?")},
        ],
        "max_tokens": 512,
    })
}

fn step_result(step: usize) -> Value {
    json!({"choices": [{"message": {"role": "assistant", "content": format!("step {step} done")}}]})
}

/// The floor: the same row written with plain rusqlite, autocommit (one commit, one
/// fsync per statement), in a WAL database with `synchronous=FULL`. With `and_update`,
/// each step also commits an UPDATE recording the result, as a journaled step does.
struct RawFloor {
    connection: Connection,
    run: RunId,
    and_update: bool,
    next_step: usize,
}

impl RawFloor {
    fn open(dir: &TempDir, and_update: bool) -> RawFloor {
        let connection = Connection::open(dir.path().join("floor.db")).expect("opening the floor db");
        let mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .expect("switching to WAL");
        assert_eq!(mode, "wal");
        connection
            .execute_batch(
                "PRAGMA synchronous = FULL;
                 CREATE TABLE journal (
                     run_id TEXT NOT NULL, seq INTEGER NOT NULL, method TEXT NOT NULL,
                     params_hash TEXT NOT NULL, params BLOB NOT NULL, status TEXT NOT NULL,
                     result BLOB, attempt INTEGER NOT NULL, started_at_ms INTEGER NOT NULL,
                     finished_at_ms INTEGER, PRIMARY KEY (run_id, seq)
                 ) WITHOUT ROWID;",
            )
            .expect("creating the floor schema");
        RawFloor { connection, run: RunId::generate(0), and_update, next_step: 0 }
    }

    /// Runs `count` steps and returns the latency of each.
    fn steps(&mut self, count: usize) -> Vec<Duration> {
        let mut latencies = Vec::with_capacity(count);
        for step in self.next_step..self.next_step + count {
            let params = step_params(0, step).to_string();
            let result = step_result(step).to_string();
            let started = Instant::now();
            self.connection
                .prepare_cached(
                    "INSERT INTO journal (run_id, seq, method, params_hash, params, status, \
                     attempt, started_at_ms) VALUES (?1, ?2, 'llm.chat', ?3, ?4, 'pending', 1, ?5)",
                )
                .and_then(|mut insert| insert.execute(params![self.run.as_str(), step, "hash", params, step]))
                .expect("inserting a floor row");
            if self.and_update {
                self.connection
                    .prepare_cached(
                        "UPDATE journal SET status = 'ok', result = ?3, finished_at_ms = ?4 \
                         WHERE run_id = ?1 AND seq = ?2",
                    )
                    .and_then(|mut update| update.execute(params![self.run.as_str(), step, result, step]))
                    .expect("updating a floor row");
            }
            latencies.push(started.elapsed());
        }
        self.next_step += count;
        latencies
    }
}

async fn open_store_with_runs(dir: &TempDir, runs: usize) -> (Arc<dyn Store>, Vec<RunId>) {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("keel.db")).expect("opening the store"));
    let ids = create_runs(&*store, runs).await;
    (store, ids)
}

async fn create_runs(store: &dyn Store, runs: usize) -> Vec<RunId> {
    let mut ids = Vec::with_capacity(runs);
    for index in 0..runs {
        let run = NewRun {
            id: RunId::generate(index as u64),
            tenant: "bench".to_owned(),
            spec: json!({"command": ["agent"]}),
            state: RunState::Running,
            created_at_ms: index as u64,
        };
        ids.push(store.create_run(run).await.expect("creating a run").id);
    }
    ids
}

/// One journaled step, as the kernel performs it around an external effect: the intent,
/// durable before the effect, then the result.
async fn journaled_step(store: &dyn Store, run: &RunId, run_index: usize, step: usize) {
    let params = step_params(run_index, step);
    let intent = NewEntry {
        method: "llm.chat".to_owned(),
        params_hash: format!("{run_index}:{step}"),
        params,
        status: EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms: step as u64,
        finished_at_ms: None,
        usage: Usage::default(),
    };
    let seq = store.append_entry(run, &intent).await.expect("append_entry");
    let completion = Completion {
        status: EntryStatus::Ok,
        result: Some(step_result(step)),
        error: None,
        finished_at_ms: step as u64 + 1,
        usage: Usage {
            input_tokens: 100,
            output_tokens: 20,
            llm_calls: 1,
            tool_calls: 0,
            cost_micro_usd: 150,
        },
        provider_served: true,
    };
    store.complete_entry(run, seq, &completion).await.expect("complete_entry");
}

/// Journals the given steps one after another in `run`; returns each step's latency.
async fn store_steps(store: &dyn Store, run: &RunId, steps: Range<usize>) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(steps.len());
    for step in steps {
        let started = Instant::now();
        journaled_step(store, run, 0, step).await;
        latencies.push(started.elapsed());
    }
    latencies
}

/// Every run journals steps back to back until the window closes; returns each step's
/// latency and the measured window.
async fn store_concurrent(dir: &TempDir) -> (Latencies, Duration) {
    let (store, runs) = open_store_with_runs(dir, CONCURRENT_RUNS).await;
    concurrent_steps(&store, runs).await
}

/// Each of `runs` journals steps back to back until the window closes.
async fn concurrent_steps(store: &Arc<dyn Store>, runs: Vec<RunId>) -> (Latencies, Duration) {
    let started = Instant::now();
    let deadline = started + THROUGHPUT_WINDOW;
    let tasks: Vec<_> = runs
        .into_iter()
        .enumerate()
        .map(|(run_index, run)| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut step = 0;
                while Instant::now() < deadline {
                    let step_started = Instant::now();
                    journaled_step(&*store, &run, run_index, step).await;
                    latencies.push(step_started.elapsed());
                    step += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a benchmark task panicked"));
    }
    (Latencies::new(latencies), started.elapsed())
}
