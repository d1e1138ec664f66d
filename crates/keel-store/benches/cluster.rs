//! What being a cluster node costs a `PgStore` (issue 13). Prints markdown tables.
//! Run with `cargo bench -p keel-store --bench cluster`; needs `KEEL_BENCH_POSTGRES_URL`
//! (or else `KEEL_TEST_POSTGRES_URL`), and works in a schema of its own
//! (`keel_bench_cluster_<pid>`, dropped at the end).
//!
//! - The journaled step (intent, then result: two commits) on a store that joined a
//!   cluster and holds the run's lease, so each write also checks and locks the lease row;
//!   against the same step on a store outside any cluster, and the floor of two raw
//!   statements committed one by one with the same driver. The three take turns in rounds,
//!   so background load on the shared machine weighs on each alike.
//! - The heartbeat of a node holding 10,000 leases (`KEEL_BENCH_LEASES`) against one
//!   holding none: time per heartbeat, the heartbeats per second one node could afford, and
//!   the CPU the database server's processes spent per heartbeat (utime + stime from
//!   `/proc` over the burst).
//! - Claims: one node takes over the 1,000 runs of a node that left, `claim_orphans(32)`
//!   after `claim_orphans(32)`, as the kernel does.
//!
//! `KEEL_BENCH_STEPS` overrides the number of journaled steps per case (2000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_store::cluster::{Cluster, NodeInfo};
use keel_store::{Completion, NewEntry, NewRun, PgNode, PgStore, Store};
use keel_types::{EntryStatus, RunId, RunState, Usage};
use serde_json::{Value, json};

#[path = "pg_bench.rs"]
mod pg_bench;

const DEFAULT_STEPS: usize = 2000;
const WARMUP_STEPS: usize = 50;
const ROUNDS: usize = 8;
const DEFAULT_LEASES: usize = 10_000;
const HEARTBEATS: usize = 200;
const ORPHANS: usize = 1000;
/// What the kernel passes to `claim_orphans` (`keel-kernel`'s `run/cluster.rs`).
const CLAIM_BATCH: usize = 32;
/// Long enough that no node's heartbeat lapses during the benchmark unless it leaves.
const TTL: Duration = Duration::from_secs(600);
/// Concurrent writers when setting up many runs and leases.
const SETUP_TASKS: usize = 32;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let Ok(server_url) =
        std::env::var("KEEL_BENCH_POSTGRES_URL").or_else(|_| std::env::var("KEEL_TEST_POSTGRES_URL"))
    else {
        eprintln!(
            "the cluster benchmark needs a PostgreSQL server: set KEEL_BENCH_POSTGRES_URL (or \
             KEEL_TEST_POSTGRES_URL), e.g. postgres://postgres@127.0.0.1:5432/test"
        );
        std::process::exit(2);
    };
    let steps = env_usize("KEEL_BENCH_STEPS", DEFAULT_STEPS);
    let leases = env_usize("KEEL_BENCH_LEASES", DEFAULT_LEASES);

    let schema = pg_bench::BenchSchema::create(&server_url, "keel_bench_cluster").await;
    let (url, version) = (schema.url.clone(), schema.version.clone());
    println!("command: cargo bench -p keel-store --bench cluster");
    println!(
        "Postgres {version} (fsync=on, synchronous_commit=on), schema {}, {} CPUs\n",
        schema.name,
        std::thread::available_parallelism().map_or(1, usize::from),
    );

    journaled_steps(&url, steps).await;
    heartbeats(&url, leases).await;
    claims(&url).await;

    schema.drop().await;
}

/// The fenced step against the unfenced one and the raw floor.
async fn journaled_steps(url: &str, steps: usize) {
    let floor = pg_bench::Floor::new(url).await;

    let plain = PgStore::connect(url).await.expect("connecting the plain store");
    let plain_run = create_runs(&plain, 1).await.remove(0);
    let (fenced, node) = joined(url, "bench-fenced").await;
    let fenced_run = create_runs(&fenced, 1).await.remove(0);
    node.acquire(&fenced_run).await.expect("taking the run's lease").expect("nobody else holds it");

    let mut cases: [Vec<Duration>; 3] = Default::default();
    let mut next = 0;
    for round in 0..=ROUNDS {
        // Round 0 is the warm-up, not measured.
        let count =
            if round == 0 { WARMUP_STEPS } else { steps / ROUNDS + usize::from(round <= steps % ROUNDS) };
        let mut floor_latencies = Vec::with_capacity(count);
        for step in next..next + count {
            let params = step_params(step).to_string().into_bytes();
            let result = step_result(step).to_string().into_bytes();
            floor_latencies.push(floor.step(step, &params, &result).await);
        }
        let plain_latencies = store_steps(&plain, &plain_run, next..next + count).await;
        let fenced_latencies = store_steps(&fenced, &fenced_run, next..next + count).await;
        if round > 0 {
            cases[0].extend(floor_latencies);
            cases[1].extend(plain_latencies);
            cases[2].extend(fenced_latencies);
        }
        next += count;
    }
    let [floor, plain, fenced] = cases.map(Latencies::new);
    println!("Journaled step (append_entry(pending) + complete_entry), sequential, one run\n");
    println!("| case | steps | mean µs | p50 µs | p99 µs | steps/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    floor.print_row("floor: raw INSERT + UPDATE, 2 commits");
    plain.print_row("PgStore, no cluster");
    fenced.print_row("PgStore as a cluster node holding the run's lease (fenced writes)");
    println!(
        "\nfenced / no cluster (mean): {:.2}x; fenced / floor: {:.2}x\n",
        fenced.mean().as_secs_f64() / plain.mean().as_secs_f64(),
        fenced.mean().as_secs_f64() / floor.mean().as_secs_f64(),
    );
    node.leave().await.expect("leaving the cluster");
}

/// A heartbeat with `leases` leases held against one with none.
async fn heartbeats(url: &str, leases: usize) {
    let (_idle_store, idle) = joined(url, "bench-idle").await;
    let (busy_store, busy) = joined(url, "bench-busy").await;
    let setup = Instant::now();
    let runs = create_runs(&busy_store, leases).await;
    let busy = Arc::new(busy);
    for_each_concurrently(runs, |run| {
        let busy = Arc::clone(&busy);
        async move {
            busy.acquire(&run).await.expect("taking a lease").expect("nobody else holds it");
        }
    })
    .await;
    eprintln!("{leases} runs created and leased in {:.1} s", setup.elapsed().as_secs_f64());

    println!("Heartbeat (one UPDATE of the node's row, then a read of its leases to find lost ones)\n");
    println!(
        "| node holds | heartbeats | mean µs | p50 µs | p99 µs | heartbeats/s | server CPU µs each | client CPU µs each |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (held, node) in [(0, &idle), (leases, &*busy)] {
        for _ in 0..10 {
            node.heartbeat().await.expect("heartbeat");
        }
        let server_before = server_cpu();
        let client_before = own_cpu();
        let mut latencies = Vec::with_capacity(HEARTBEATS);
        for _ in 0..HEARTBEATS {
            let started = Instant::now();
            let lost = node.heartbeat().await.expect("heartbeat");
            latencies.push(started.elapsed());
            assert!(lost.is_empty(), "no lease was taken from this node");
        }
        let server = (server_cpu() - server_before) / HEARTBEATS as f64;
        let client = (own_cpu() - client_before) / HEARTBEATS as f64;
        let latencies = Latencies::new(latencies);
        println!(
            "| {held} leases | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            latencies.latencies.len(),
            micros(latencies.mean()),
            micros(latencies.percentile(50)),
            micros(latencies.percentile(99)),
            1.0 / latencies.mean().as_secs_f64(),
            server * 1e6,
            client * 1e6,
        );
    }
    println!();
    idle.leave().await.expect("leaving the cluster");
    busy.leave().await.expect("leaving the cluster");
    // The busy node's runs end here, so the claims below see only their own orphans.
    let ended = pg_bench::raw_postgres(url).await;
    ended
        .execute("DELETE FROM run_leases WHERE node = 'bench-busy'", &[])
        .await
        .expect("dropping the heartbeat case's leases");
    ended
        .execute("UPDATE runs SET state = 'succeeded' WHERE state = 'running'", &[])
        .await
        .expect("ending the heartbeat case's runs");
}

/// One node takes over the runs of a node that left, a batch at a time.
async fn claims(url: &str) {
    let (dead_store, dead) = joined(url, "bench-dead").await;
    let runs = create_runs(&dead_store, ORPHANS).await;
    let dead = Arc::new(dead);
    for_each_concurrently(runs, |run| {
        let dead = Arc::clone(&dead);
        async move {
            dead.acquire(&run).await.expect("taking a lease").expect("nobody else holds it");
        }
    })
    .await;
    dead.leave().await.expect("leaving the cluster");
    let (_heir_store, heir) = joined(url, "bench-heir").await;
    let started = Instant::now();
    let mut batches = Vec::new();
    let mut claimed = 0;
    loop {
        let batch_started = Instant::now();
        let batch = heir.claim_orphans(CLAIM_BATCH).await.expect("claiming orphans");
        if batch.is_empty() {
            break;
        }
        batches.push(batch_started.elapsed());
        claimed += batch.len();
    }
    let total = started.elapsed();
    assert_eq!(claimed, ORPHANS, "every orphan was claimed once");
    let batches = Latencies::new(batches);
    println!(
        "Claims: one node takes over {ORPHANS} runs of a node that left, claim_orphans({CLAIM_BATCH}) at a time\n"
    );
    println!("| runs | batches | total ms | per run µs | batch p50 ms | batch p99 ms |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {claimed} | {} | {:.0} | {:.0} | {:.1} | {:.1} |",
        batches.latencies.len(),
        total.as_secs_f64() * 1e3,
        micros(total) / claimed as f64,
        micros(batches.percentile(50)) / 1e3,
        micros(batches.percentile(99)) / 1e3,
    );
}

/// A store of its own (as a node in its own process would have) that joined as `id`.
async fn joined(url: &str, id: &str) -> (PgStore, PgNode) {
    let store = PgStore::connect(url).await.expect("connecting a node's store");
    let node = store.node(id).expect("a valid node id");
    let info = NodeInfo { id: id.to_owned(), addr: "127.0.0.1:1".to_owned(), version: "bench".to_owned() };
    node.join(info, "bench-key", TTL).await.expect("joining the cluster");
    (store, node)
}

/// Runs `work` on each item, `SETUP_TASKS` at a time.
async fn for_each_concurrently<T: Send + 'static, F>(items: Vec<T>, work: impl Fn(T) -> F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    for item in items {
        if tasks.len() >= SETUP_TASKS {
            tasks.join_next().await.expect("a task").expect("a setup task panicked");
        }
        tasks.spawn(work(item));
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a setup task panicked");
    }
}

/// Creates `count` running runs, made now.
async fn create_runs(store: &PgStore, count: usize) -> Vec<RunId> {
    let store: Arc<dyn Store> = Arc::new(store.clone());
    let ids = Arc::new(std::sync::Mutex::new(Vec::with_capacity(count)));
    let requests: Vec<usize> = (0..count).collect();
    let collected = Arc::clone(&ids);
    for_each_concurrently(requests, move |_| {
        let (store, ids) = (Arc::clone(&store), Arc::clone(&collected));
        async move {
            let now = now_ms();
            let run = NewRun {
                id: RunId::generate(now),
                tenant: "bench".to_owned(),
                spec: json!({"command": ["agent"]}),
                state: RunState::Running,
                created_at_ms: now,
            };
            let id = store.create_run(run).await.expect("creating a run").id;
            ids.lock().expect("ids lock").push(id);
        }
    })
    .await;
    let mut ids = std::mem::take(&mut *ids.lock().expect("ids lock"));
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    ids
}

/// CPU seconds (user + system) spent so far by every process named `postgres` on this
/// machine: the server's backends, and its background workers.
fn server_cpu() -> f64 {
    let mut ticks = 0;
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else { continue };
        if comm.trim() == "postgres" {
            ticks += stat_ticks(&format!("/proc/{pid}/stat"));
        }
    }
    ticks as f64 / clock_ticks()
}

/// CPU seconds (user + system) this process has spent so far.
fn own_cpu() -> f64 {
    stat_ticks("/proc/self/stat") as f64 / clock_ticks()
}

/// utime + stime from a `/proc/.../stat` file, in clock ticks (0 if it is gone).
fn stat_ticks(path: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0 };
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    // After the command: state is field 3, utime 14 and stime 15 (proc(5)).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(14) + field(15)
}

/// `/proc` counts CPU time in clock ticks of `getconf CLK_TCK` (100 on Linux).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Latencies of one case, sorted.
struct Latencies {
    latencies: Vec<Duration>,
}

impl Latencies {
    fn new(mut latencies: Vec<Duration>) -> Latencies {
        latencies.sort_unstable();
        Latencies { latencies }
    }

    fn mean(&self) -> Duration {
        self.latencies.iter().sum::<Duration>() / self.latencies.len().max(1) as u32
    }

    fn percentile(&self, percent: usize) -> Duration {
        let index = (self.latencies.len() * percent / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(index).copied().unwrap_or_default()
    }

    fn print_row(&self, case: &str) {
        println!(
            "| {case} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            self.latencies.len(),
            micros(self.mean()),
            micros(self.percentile(50)),
            micros(self.percentile(99)),
            1.0 / self.mean().as_secs_f64(),
        );
    }
}

/// A small chat request, different at every step (as in `journal.rs`).
fn step_params(step: usize) -> Value {
    json!({
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. ".repeat(8)},
            {"role": "user", "content": format!("step {step}: what next?")},
        ],
        "max_tokens": 512,
    })
}

fn step_result(step: usize) -> Value {
    json!({"choices": [{"message": {"role": "assistant", "content": format!("step {step} done")}}]})
}

/// One journaled step, as the kernel performs it around an external effect.
async fn journaled_step(store: &PgStore, run: &RunId, step: usize) {
    let intent = NewEntry {
        method: "llm.chat".to_owned(),
        params_hash: format!("{step}"),
        params: step_params(step),
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

async fn store_steps(store: &PgStore, run: &RunId, steps: std::ops::Range<usize>) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(steps.len());
    for step in steps {
        let started = Instant::now();
        journaled_step(store, run, step).await;
        latencies.push(started.elapsed());
    }
    latencies
}
