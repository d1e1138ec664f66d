//! Kernel nodes on one Postgres database (issue 13), through real `keel serve` processes
//! with data directories of their own on a database this benchmark creates and drops.
//!
//! - Failover: 3 nodes with `--lease-ttl T`, runs of a multi-step agent (a journaled
//!   `sys.sleep` per step) spread over them, one node SIGKILLed. Measured from the SIGKILL
//!   to each of its runs taken over (relaunched by another node: `attempt` increased) and
//!   live (its agent replayed the journal and journaled a new step: state `running`
//!   again), reported against the TTL: a dead node is noticed only once its heartbeat
//!   lapses, which is between T minus one heartbeat period (T / 3) and T after the kill
//!   (the lease left at the kill, read from the database, is reported too), and then at
//!   the next claim of another node (every T / 3).
//! - Recovery: one node with N runs parked in `ipc.recv`, SIGKILLed and started again
//!   with the same `--node-id`; time until every run is back (relaunched, replayed, and
//!   waiting in `ipc.recv` again). The peer in the same run: the same N runs on a daemon
//!   with the default SQLite store, killed and restarted the same way. Both run with
//!   `--swap-after 0`: a swapped-out run stays swapped out across a restart (nothing to
//!   relaunch), and parking 1,000 runs takes longer than the default 60 s.
//! - Throughput: R runs of an agent journaling steps back to back (`sys.now`), created
//!   on one node, then on three nodes (a third each) of a fresh database, then on one
//!   daemon with the default SQLite store (read with the `sqlite3` tool); journal rows
//!   counted in the store over a window once every run is under way, with the CPU the
//!   nodes, their agents, Postgres and the whole machine used meanwhile.
//!
//! cargo bench -p keel-cli --bench cluster
//!
//! Needs `KEEL_BENCH_POSTGRES_URL` (else `KEEL_TEST_POSTGRES_URL`): a server where it may
//! create and drop databases named `keel_test_bench_*`. BENCH_TTLS (failover lease TTLs in
//! seconds, default `2,5,10`), BENCH_FAILOVER_RUNS (default 30), BENCH_FAILOVER_REPEATS
//! (kills per TTL, each on a fresh cluster whose nodes start at random moments within a
//! heartbeat period, default 3), BENCH_RECOVERY_RUNS
//! (default 1000), BENCH_RECOVERY_TTL (the recovery node's lease TTL, default 2),
//! BENCH_CLIENTS (concurrent API clients creating runs, default 8), BENCH_STORE_POOL
//! (each node's `--store-pool`, default 24: three nodes share the server's 100
//! connections), BENCH_STEP_RUNS (throughput runs, default 100; 0 skips it),
//! BENCH_STEP_SECS (its window, default 10), BENCH_CASES (which of `failover`,
//! `recovery`, `steps` to run, default all).

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

    /// SIGKILL, as a crash; returns how long the process took to be gone (reaped): its
    /// exit takes its sandboxed agents down with it, which with many runs takes the OS
    /// seconds.
    fn kill(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        started.elapsed()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
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

/// `keel serve` arguments of node `id` on the database at `url`.
fn node_args(url: &str, id: &str, ttl: f64, pool: usize) -> Vec<String> {
    ["--store", url, "--node-id", id, "--lease-ttl", &ttl.to_string(), "--store-pool", &pool.to_string()]
        .map(str::to_owned)
        .to_vec()
}

/// A number in [0, 1) that differs from call to call (not for anything but spreading
/// start times).
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

struct Failover {
    ttl: f64,
    runs: usize,
    moved: usize,
    /// From the SIGKILL to the killed node's heartbeat expiring.
    lease_left: Duration,
    first_taken: Duration,
    all_taken: Duration,
    all_live: Duration,
}

/// 3 nodes, `runs` agents spread over them, node n2 SIGKILLed once every run journaled a
/// few steps.
fn failover(admin: &str, ttl: f64, runs: usize, clients: usize, pool: usize, script: &str) -> Failover {
    let db = common::Database::create(admin, &format!("failover_{}", ttl as u64));
    // Each node beats and claims every third of the TTL from its start: started together,
    // the survivors would claim just after the dead node's heartbeat lapses every time. A
    // random pause before each start puts them out of step, as independent nodes are.
    let period = ttl / 3.0;
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| {
            std::thread::sleep(Duration::from_secs_f64(period * random_fraction()));
            Node::start(&node_args(&db.url, &format!("n{i}"), ttl, pool))
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
    // What was left of its heartbeat's lifetime at the SIGKILL (the database's clock):
    // nobody may take its runs before that.
    let left: f64 = common::psql(
        &db.url,
        "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM keel_nodes WHERE id = 'n2'",
    )
    .parse()
    .expect("the killed node's heartbeat expiry");
    let lease_left = Duration::from_secs_f64((left + secs(killed.elapsed())).max(0.0));
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
        lease_left,
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
    /// From the SIGKILL to the killed process reaped (its agents gone with it).
    gone: Duration,
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
    let gone = node.kill();
    let refused = node.spawn();
    let up = killed.elapsed();
    let api = node.api();
    let back = |view: &Value| view["attempt"].as_u64().unwrap_or(0) >= 2 && view["state"] == "waiting";
    let times = wait_each("runs back", &api, &ids, killed, Duration::from_millis(100), &[&back]);
    Recovery { store, runs, gone, up, refused, all_back: max(&times[0]) }
}

struct Throughput {
    store: &'static str,
    nodes: usize,
    runs: usize,
    /// Journal rows written during the window.
    steps: u64,
    window: Duration,
    /// Runs each node held (by lease) at the end of the window; one node: all.
    per_node: Vec<usize>,
    /// Cores busy during the window: the nodes, Postgres, the agents and their sandboxes,
    /// the whole machine.
    cpu: Cpu,
}

/// Clock ticks of CPU used, by who.
#[derive(Default, Clone, Copy)]
struct Cpu {
    nodes: f64,
    postgres: f64,
    agents: f64,
    machine: f64,
}

/// Linux's `USER_HZ`, the unit of `/proc`'s CPU times (100 on every architecture Keel
/// runs on).
const TICKS_PER_SEC: f64 = 100.0;

/// CPU ticks so far of the `keel serve` processes `nodes`, of the processes under them
/// (sandboxes and agents), of every `postgres` process, and of the whole machine (busy,
/// not idle). Processes that exited are not counted, so a window should see few exits.
fn cpu_ticks(nodes: &[u32]) -> Cpu {
    // pid: (parent, ticks, is postgres)
    let mut procs: HashMap<u32, (u32, f64, bool)> = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let comm = head.split_once('(').map_or("", |(_, c)| c);
        // After the command: state, ppid, ... utime is the 14th field, stime the 15th.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let parent = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let ticks: f64 =
            fields.get(11..13).map_or(0.0, |t| t.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
        procs.insert(pid, (parent, ticks, comm == "postgres"));
    }
    let under_a_node = |mut pid: u32| {
        for _ in 0..64 {
            match procs.get(&pid) {
                Some(&(parent, _, _)) if nodes.contains(&parent) => return true,
                Some(&(parent, _, _)) if parent > 1 => pid = parent,
                _ => return false,
            }
        }
        false
    };
    let mut cpu = Cpu::default();
    for (&pid, &(_, ticks, postgres)) in &procs {
        if nodes.contains(&pid) {
            cpu.nodes += ticks;
        } else if postgres {
            cpu.postgres += ticks;
        } else if under_a_node(pid) {
            cpu.agents += ticks;
        }
    }
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    if let Some(line) = machine.lines().next() {
        // user nice system idle iowait irq softirq steal ...
        let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        cpu.machine = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    }
    cpu
}

/// Journal rows in the node's store: the Postgres database, or the data directory's
/// SQLite file.
fn journal_rows(db: Option<&common::Database>, node: &Node) -> u64 {
    let out = match db {
        Some(db) => common::psql(&db.url, "SELECT count(*) FROM journal"),
        None => {
            let file = node.data.path().join("keel.db");
            let out = Command::new("sqlite3")
                .args([&file.display().to_string(), "SELECT count(*) FROM journal"])
                .output()
                .expect("sqlite3 runs (the SQLite peer of the throughput case needs the sqlite3 tool)");
            assert!(out.status.success(), "sqlite3: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        }
    };
    out.parse().expect("a count of journal rows")
}

/// `runs` agents journaling steps back to back, spread over `nodes` nodes of a fresh
/// Postgres database (`admin` given) or on one node with the default SQLite store; the
/// steps journaled during `window` once every run is under way.
fn throughput(
    admin: Option<&str>,
    nodes: usize,
    runs: usize,
    clients: usize,
    pool: usize,
    window: Duration,
    script: &str,
) -> Throughput {
    let db = admin.map(|admin| common::Database::create(admin, &format!("steps_{nodes}")));
    // The default TTL: the nodes are loaded, and a false takeover is not what this measures.
    let started: Vec<Node> = match &db {
        Some(db) => {
            (1..=nodes).map(|i| Node::start(&node_args(&db.url, &format!("s{i}"), 10.0, pool))).collect()
        }
        None => vec![Node::start(&[])],
    };
    let apis: Vec<api::Api> = started.iter().map(Node::api).collect();
    let pids: Vec<u32> = started.iter().map(Node::pid).collect();
    let targets: Vec<api::Api> = (0..runs).map(|i| apis[i % apis.len()].clone()).collect();
    let created = Instant::now();
    let ids = create_runs(&targets, script, clients);
    wait_each(
        "runs stepping",
        &apis[0],
        &ids,
        created,
        Duration::from_millis(250),
        &[&|view: &Value| view["state"] == "running"],
    );
    eprintln!("{nodes} node(s): {runs} runs under way in {:.1} s", created.elapsed().as_secs_f64());
    // Past the last agents' start (a Python start each, competing for the same cores).
    std::thread::sleep(Duration::from_secs(2));
    let (before, cpu0, t0) = (journal_rows(db.as_ref(), &started[0]), cpu_ticks(&pids), Instant::now());
    std::thread::sleep(window);
    let (after, cpu1, t1) = (journal_rows(db.as_ref(), &started[0]), cpu_ticks(&pids), Instant::now());
    let seconds = secs(t1 - t0);
    let cores = |a: f64, b: f64| (b - a) / TICKS_PER_SEC / seconds;
    let cpu = Cpu {
        nodes: cores(cpu0.nodes, cpu1.nodes),
        postgres: cores(cpu0.postgres, cpu1.postgres),
        agents: cores(cpu0.agents, cpu1.agents),
        machine: cores(cpu0.machine, cpu1.machine),
    };
    let per_node = match &db {
        Some(db) => {
            let leases = db.leases();
            (1..=nodes).map(|i| leases.get(&format!("s{i}")).map_or(0, Vec::len)).collect()
        }
        None => vec![runs],
    };
    drop(started);
    Throughput {
        store: if db.is_some() { "Postgres" } else { "SQLite" },
        nodes,
        runs,
        steps: after - before,
        window: t1 - t0,
        per_node,
        cpu,
    }
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
    let failover_repeats = env_usize("BENCH_FAILOVER_REPEATS", 3);
    let recovery_runs = env_usize("BENCH_RECOVERY_RUNS", 1000);
    let recovery_ttl = env_usize("BENCH_RECOVERY_TTL", 2);
    let clients = env_usize("BENCH_CLIENTS", 8);
    let pool = env_usize("BENCH_STORE_POOL", 24);
    let step_runs = env_usize("BENCH_STEP_RUNS", 100);
    let step_window = Duration::from_secs(env_usize("BENCH_STEP_SECS", 10) as u64);
    let cases = std::env::var("BENCH_CASES").unwrap_or_else(|_| "failover,recovery,steps".into());
    let case = |name: &str| cases.split(',').any(|c| c.trim() == name);
    let failover_agent = common::bench_dir().join("bench_cluster.py").display().to_string();
    let parked_agent = common::bench_dir().join("bench_parked.py").display().to_string();
    let steps_agent = common::bench_dir().join("bench_cluster_steps.py").display().to_string();

    let mut failovers: Vec<Failover> = Vec::new();
    if case("failover") {
        for &ttl in &ttls {
            for _ in 0..failover_repeats {
                let f = failover(&admin, ttl, failover_runs, clients, pool, &failover_agent);
                eprintln!(
                    "failover, TTL {ttl} s: {} runs moved, lease left {:.2} s, first {:.2} s, all taken {:.2} s, \
                     all live {:.2} s",
                    f.moved,
                    secs(f.lease_left),
                    secs(f.first_taken),
                    secs(f.all_taken),
                    secs(f.all_live)
                );
                failovers.push(f);
            }
        }
    }

    let mut recoveries: Vec<Recovery> = Vec::new();
    if case("recovery") {
        let db = common::Database::create(&admin, "recovery");
        let mut postgres_args = node_args(&db.url, "r1", recovery_ttl as f64, pool);
        postgres_args.extend(["--swap-after".to_owned(), "0".to_owned()]);
        let sqlite_args = ["--swap-after".to_owned(), "0".to_owned()];
        for (store, args) in
            [("SQLite (default store)", &sqlite_args[..]), ("Postgres, one node", &postgres_args[..])]
        {
            let r = recovery(store, args, recovery_runs, clients, &parked_agent);
            eprintln!(
                "recovery, {store}: {} runs, answering after {:.2} s, all back {:.2} s",
                r.runs,
                secs(r.up),
                secs(r.all_back)
            );
            recoveries.push(r);
        }
    }

    let mut throughputs: Vec<Throughput> = Vec::new();
    if case("steps") && step_runs > 0 {
        for (store, nodes) in [(Some(admin.as_str()), 1), (Some(admin.as_str()), 3), (None, 1)] {
            let t = throughput(store, nodes, step_runs, clients, pool, step_window, &steps_agent);
            eprintln!(
                "steps, {} {nodes} node(s): {} steps in {:.2} s = {:.0}/s",
                t.store,
                t.steps,
                secs(t.window),
                t.steps as f64 / secs(t.window)
            );
            throughputs.push(t);
        }
    }

    println!("cargo bench -p keel-cli --bench cluster\n");
    println!(
        "{} CPUs; Postgres {}; each node --store-pool {pool}\n",
        std::thread::available_parallelism().map_or(1, usize::from),
        common::psql(&admin, "SHOW server_version")
    );
    if !failovers.is_empty() {
        println!(
            "Failover: 3 nodes, {failover_runs} runs of a multi-step agent, one node SIGKILLed; \
             {failover_repeats} times per TTL, each on a fresh database\n"
        );
        println!(
            "| lease TTL | runs moved | lease left at kill | first taken over | after expiry | all taken over \
             | all live again | = TTL + |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for f in &failovers {
            println!(
                "| {:.0} s | {} of {} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s |",
                f.ttl,
                f.moved,
                f.runs,
                secs(f.lease_left),
                secs(f.first_taken),
                secs(f.first_taken) - secs(f.lease_left),
                secs(f.all_taken),
                secs(f.all_live),
                secs(f.all_live) - f.ttl,
            );
        }
        println!();
    }
    if !recoveries.is_empty() {
        println!("Recovery: one node, runs parked in `ipc.recv`, SIGKILLed and restarted\n");
        println!(
            "| store | runs | killed process gone | restarted node answering | starts refused | all runs back | \
             per run |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for r in &recoveries {
            println!(
                "| {} | {} | {:.2} s | {:.2} s | {} | {:.2} s | {:.1} ms |",
                r.store,
                r.runs,
                secs(r.gone),
                secs(r.up),
                r.refused,
                secs(r.all_back),
                secs(r.all_back) * 1e3 / r.runs as f64,
            );
        }
        println!();
    }
    if !throughputs.is_empty() {
        println!("Throughput: {step_runs} runs journaling `sys.now` steps back to back\n");
        println!(
            "| store | nodes | runs per node | window | steps | steps/s | steps/s per run | cores: nodes | \
             postgres | agents, sandboxes | machine |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for t in &throughputs {
            let rate = t.steps as f64 / secs(t.window);
            println!(
                "| {} | {} | {} | {:.1} s | {} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
                t.store,
                t.nodes,
                t.per_node.iter().map(usize::to_string).collect::<Vec<_>>().join(" / "),
                secs(t.window),
                t.steps,
                rate,
                rate / t.runs as f64,
                t.cpu.nodes,
                t.cpu.postgres,
                t.cpu.agents,
                t.cpu.machine,
            );
        }
    }
}
