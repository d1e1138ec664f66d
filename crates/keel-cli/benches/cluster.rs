//! Kernel nodes on one Postgres database (issue 13), through real `keel serve` processes
//! with data directories of their own on a database this benchmark creates and drops.
//!
//! - Failover: 3 nodes with `--lease-ttl T`, runs of a multi-step agent (a journaled
//!   `sys.sleep` per step) spread over them, one node SIGKILLed. Measured from the SIGKILL
//!   to each of its runs taken over (relaunched by another node: `attempt` increased) and
//!   live (its agent replayed the journal and journaled a new step: state `running`
//!   again), reported against the TTL: a dead node is noticed only once its heartbeat
//!   lapses, so T is the floor.
//! - Recovery: one node with N runs parked in `ipc.recv`, SIGKILLed and started again
//!   with the same `--node-id`; time until every run is back (relaunched, replayed, and
//!   waiting in `ipc.recv` again). The peer in the same run: the same N runs on a daemon
//!   with the default SQLite store, killed and restarted the same way.
//!
//! cargo bench -p keel-cli --bench cluster
//!
//! Needs `KEEL_BENCH_POSTGRES_URL` (else `KEEL_TEST_POSTGRES_URL`): a server where it may
//! create and drop databases named `keel_test_bench_*`. BENCH_TTLS (failover lease TTLs in
//! seconds, default `2,5,10`), BENCH_FAILOVER_RUNS (default 30), BENCH_RECOVERY_RUNS
//! (default 1000), BENCH_RECOVERY_TTL (the recovery node's lease TTL, default 2),
//! BENCH_CLIENTS (concurrent API clients creating runs, default 8).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The longest any wait below may take before the benchmark gives up.
const PATIENCE: Duration = Duration::from_secs(900);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A database of its own on the benchmark's server, dropped at the end.
struct Database {
    admin: String,
    name: String,
    url: String,
}

impl Database {
    fn create(admin: &str, label: &str) -> Database {
        let name = format!("keel_test_bench_{}_{label}", std::process::id());
        psql(admin, &format!("CREATE DATABASE {name}"));
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("the Postgres URL {admin:?} names no database; give one, e.g. .../postgres"),
        };
        Database { admin: admin.to_owned(), name, url }
    }

    /// The runs each node holds a lease on.
    fn leases(&self) -> BTreeMap<String, Vec<String>> {
        let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in psql(&self.url, "SELECT node || ' ' || run_id FROM run_leases").lines() {
            if let Some((node, run)) = line.split_once(' ') {
                by_node.entry(node.to_owned()).or_default().push(run.to_owned());
            }
        }
        by_node
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([&self.admin, "-qc", &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)])
            .output();
    }
}

fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql").args([url, "-qAtc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One `keel serve` process with its own data directory and arguments.
struct Node {
    data: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl Node {
    fn start(args: &[String]) -> Node {
        let mut node = Node { data: tempfile::tempdir().expect("tempdir"), args: args.to_vec(), child: None };
        node.spawn();
        node
    }

    /// Starts the process, and starts it again while it exits at once (a node restarted
    /// with its id is refused until its previous life's heartbeat lapses). Returns how
    /// many starts were refused.
    fn spawn(&mut self) -> usize {
        let info = self.data.path().join("kernel.json");
        let deadline = Instant::now() + PATIENCE;
        let mut refused = 0;
        loop {
            let _ = std::fs::remove_file(&info);
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.data.path().join("serve.log"))
                .expect("the node's log file");
            let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
                .env("KEEL_DATA_DIR", self.data.path())
                .env_remove("KEEL_ADDR")
                .env_remove("KEEL_LLM_SCRIPT")
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(&self.args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start keel serve");
            loop {
                if info.exists() {
                    self.child = Some(child);
                    return refused;
                }
                if child.try_wait().expect("waiting for keel serve").is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "the node did not start: see {}", self.log());
                std::thread::sleep(Duration::from_millis(5));
            }
            refused += 1;
            assert!(Instant::now() < deadline, "the node kept exiting at start: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("serve.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn api(&self) -> api::Api {
        let info: Value = serde_json::from_slice(
            &std::fs::read(self.data.path().join("kernel.json")).expect("kernel.json"),
        )
        .expect("kernel.json is JSON");
        let token = std::fs::read_to_string(self.data.path().join("api-token")).expect("api token");
        api::Api { addr: info["addr"].as_str().expect("addr").to_owned(), token: token.trim().to_owned() }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Creates a run of `python3 script` for each of `nodes` (a node per run), `clients` at
/// a time; returns their ids in the same order.
fn create_runs(nodes: &[api::Api], script: &str, clients: usize) -> Vec<String> {
    let ids: Vec<std::sync::Mutex<String>> = nodes.iter().map(|_| std::sync::Mutex::default()).collect();
    let next = AtomicUsize::new(0);
    let cwd = common::bench_dir().display().to_string();
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(node) = nodes.get(i) else { break };
                    let id = node.create_run(&json!({ "command": ["python3", script], "cwd": cwd }));
                    *ids[i].lock().expect("ids lock") = id;
                }
            });
        }
    });
    ids.into_iter().map(|id| id.into_inner().expect("ids lock")).collect()
}

/// Polls `api`'s run list every `every` until the last of `checks` holds for every run of
/// `runs`; returns, for each check, when each run first passed it, measured from `since`.
fn wait_each(
    what: &str,
    api: &api::Api,
    runs: &[String],
    since: Instant,
    every: Duration,
    checks: &[&dyn Fn(&Value) -> bool],
) -> Vec<HashMap<String, Duration>> {
    let mut at: Vec<HashMap<String, Duration>> = checks.iter().map(|_| HashMap::new()).collect();
    let mut report = Instant::now();
    while at.last().map_or(0, HashMap::len) < runs.len() {
        let listed = api.runs(runs.len() * 2 + 10);
        let now = since.elapsed();
        let ours: Vec<&Value> =
            listed.iter().filter(|view| runs.iter().any(|run| view["run_id"] == run.as_str())).collect();
        for view in &ours {
            let id = view["run_id"].as_str().unwrap_or_default();
            for (check, times) in checks.iter().zip(&mut at) {
                if check(view) {
                    times.entry(id.to_owned()).or_insert(now);
                }
            }
        }
        let done = at.last().map_or(0, HashMap::len);
        assert!(since.elapsed() < PATIENCE, "timed out waiting for {what}: {done} of {}", runs.len());
        if report.elapsed() > Duration::from_secs(5) {
            let mut states: BTreeMap<String, usize> = BTreeMap::new();
            for view in &ours {
                *states.entry(format!("{} (attempt {})", view["state"], view["attempt"])).or_default() += 1;
            }
            eprintln!("{what}: {done} of {} ({states:?})", runs.len());
            report = Instant::now();
        }
        std::thread::sleep(every);
    }
    at
}

fn max(times: &HashMap<String, Duration>) -> Duration {
    times.values().copied().max().unwrap_or_default()
}

fn min(times: &HashMap<String, Duration>) -> Duration {
    times.values().copied().min().unwrap_or_default()
}

fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

struct Failover {
    ttl: f64,
    runs: usize,
    moved: usize,
    first_taken: Duration,
    all_taken: Duration,
    all_live: Duration,
}

/// 3 nodes, `runs` agents spread over them, node n2 SIGKILLed once every run journaled a
/// few steps.
fn failover(admin: &str, ttl: f64, runs: usize, clients: usize, script: &str) -> Failover {
    let db = Database::create(admin, &format!("failover_{}", ttl as u64));
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| {
            Node::start(&[
                "--store".into(),
                db.url.clone(),
                "--node-id".into(),
                format!("n{i}"),
                "--lease-ttl".into(),
                ttl.to_string(),
            ])
        })
        .collect();
    let apis: Vec<api::Api> = nodes.iter().map(Node::api).collect();
    let targets: Vec<api::Api> = (0..runs).map(|i| apis[i % apis.len()].clone()).collect();
    let ids = create_runs(&targets, script, clients);
    // Every run under way, then a second more for a few of its 250 ms steps to be journaled.
    wait_each(
        "runs under way",
        &apis[0],
        &ids,
        Instant::now(),
        Duration::from_millis(100),
        &[&|view: &Value| view["state"] == "running"],
    );
    std::thread::sleep(Duration::from_secs(1));
    let victims = db.leases().remove("n2").unwrap_or_default();
    assert!(!victims.is_empty(), "node n2 holds no run: {:?}", db.leases());
    let before: HashMap<String, u64> = apis[0]
        .runs(runs * 2)
        .iter()
        .map(|v| (v["run_id"].as_str().unwrap_or_default().to_owned(), v["attempt"].as_u64().unwrap_or(0)))
        .collect();

    let killed = Instant::now();
    nodes[1].kill();
    let attempt_rose = |view: &Value| {
        let id = view["run_id"].as_str().unwrap_or_default();
        view["attempt"].as_u64().unwrap_or(0) > before.get(id).copied().unwrap_or(u64::MAX)
    };
    let live = |view: &Value| attempt_rose(view) && view["state"] == "running";
    let times = wait_each(
        "the dead node's runs live again",
        &apis[0],
        &victims,
        killed,
        Duration::from_millis(20),
        &[&attempt_rose, &live],
    );
    Failover {
        ttl,
        runs,
        moved: victims.len(),
        first_taken: min(&times[0]),
        all_taken: max(&times[0]),
        all_live: max(&times[1]),
    }
}

struct Recovery {
    store: &'static str,
    runs: usize,
    /// From the SIGKILL to the restarted node's API answering.
    up: Duration,
    /// Starts refused meanwhile (the id still held by the dead node's heartbeat).
    refused: usize,
    /// From the SIGKILL to every run back in `ipc.recv`.
    all_back: Duration,
}

/// `runs` agents parked in `ipc.recv` on one node started with `args`, SIGKILLed and
/// started again with the same arguments.
fn recovery(store: &'static str, args: &[String], runs: usize, clients: usize, script: &str) -> Recovery {
    let mut node = Node::start(args);
    let api = node.api();
    let started = Instant::now();
    let ids = create_runs(&vec![api.clone(); runs], script, clients);
    wait_each(
        "runs parked",
        &api,
        &ids,
        started,
        Duration::from_millis(250),
        &[&|view: &Value| view["state"] == "waiting"],
    );
    eprintln!("{store}: {runs} runs parked in {:.1} s", started.elapsed().as_secs_f64());

    let killed = Instant::now();
    node.kill();
    let refused = node.spawn();
    let up = killed.elapsed();
    let api = node.api();
    let back = |view: &Value| view["attempt"].as_u64().unwrap_or(0) >= 2 && view["state"] == "waiting";
    let times = wait_each("runs back", &api, &ids, killed, Duration::from_millis(100), &[&back]);
    Recovery { store, runs, up, refused, all_back: max(&times[0]) }
}

fn main() {
    let Ok(admin) =
        std::env::var("KEEL_BENCH_POSTGRES_URL").or_else(|_| std::env::var("KEEL_TEST_POSTGRES_URL"))
    else {
        eprintln!(
            "the cluster benchmark needs a PostgreSQL server: set KEEL_BENCH_POSTGRES_URL (or \
             KEEL_TEST_POSTGRES_URL), e.g. postgres://postgres@127.0.0.1:5432/test"
        );
        std::process::exit(2);
    };
    let ttls: Vec<f64> = std::env::var("BENCH_TTLS")
        .unwrap_or_else(|_| "2,5,10".into())
        .split(',')
        .map(|t| t.trim().parse().expect("BENCH_TTLS: seconds, separated by commas"))
        .collect();
    let failover_runs = env_usize("BENCH_FAILOVER_RUNS", 30);
    let recovery_runs = env_usize("BENCH_RECOVERY_RUNS", 1000);
    let recovery_ttl = env_usize("BENCH_RECOVERY_TTL", 2);
    let clients = env_usize("BENCH_CLIENTS", 8);
    let failover_agent = common::bench_dir().join("bench_cluster.py").display().to_string();
    let parked_agent = common::bench_dir().join("bench_parked.py").display().to_string();

    let failovers: Vec<Failover> =
        ttls.iter().map(|&ttl| failover(&admin, ttl, failover_runs, clients, &failover_agent)).collect();

    let db = Database::create(&admin, "recovery");
    let postgres_args = [
        "--store".to_owned(),
        db.url.clone(),
        "--node-id".to_owned(),
        "r1".to_owned(),
        "--lease-ttl".to_owned(),
        recovery_ttl.to_string(),
    ];
    let recoveries = [
        recovery("SQLite (default store)", &[], recovery_runs, clients, &parked_agent),
        recovery("Postgres, one node", &postgres_args, recovery_runs, clients, &parked_agent),
    ];

    println!("cargo bench -p keel-cli --bench cluster\n");
    println!(
        "{} CPUs; Postgres {}\n",
        std::thread::available_parallelism().map_or(1, usize::from),
        psql(&db.url, "SHOW server_version")
    );
    println!("Failover: 3 nodes, {failover_runs} runs of a multi-step agent, one node SIGKILLed\n");
    println!("| lease TTL | runs moved | first taken over | all taken over | all live again | = TTL + |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for f in &failovers {
        println!(
            "| {:.0} s | {} of {} | {:.2} s | {:.2} s | {:.2} s | {:.2} s |",
            f.ttl,
            f.moved,
            f.runs,
            secs(f.first_taken),
            secs(f.all_taken),
            secs(f.all_live),
            secs(f.all_live) - f.ttl,
        );
    }
    println!("\nRecovery: one node, runs parked in `ipc.recv`, SIGKILLed and restarted\n");
    println!("| store | runs | restarted node answering | starts refused | all runs back | per run |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &recoveries {
        println!(
            "| {} | {} | {:.2} s | {} | {:.2} s | {:.1} ms |",
            r.store,
            r.runs,
            secs(r.up),
            r.refused,
            secs(r.all_back),
            secs(r.all_back) * 1e3 / r.runs as f64,
        );
    }
}
