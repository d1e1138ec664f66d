//! Parked runs: N runs of a Python agent all waiting on `ipc.recv` under
//! `keel serve --swap-after 1`, so each is swapped out (its process stopped). Measures the
//! time to start them and to have them all swapped, the memory of the kernel and every
//! process left (RSS and PSS) per parked run, then a message to each and the rate at which
//! runs are resumed by replay and complete. The floor, in the same run: the idle daemon's
//! own memory before the runs start.
//!
//! cargo bench -p keel-cli --bench parked
//!
//! BENCH_RUNS (default 1000), BENCH_TIER (the runs' sandbox tier, default `process`),
//! BENCH_CLIENTS (concurrent API clients creating runs and sending messages, default 8),
//! BENCH_AGENT (`python`, the default: `bench_parked.py` on the SDK; or `perl`:
//! `bench_parked.pl`, the same calls written by hand, whose start costs a few milliseconds,
//! so 100,000 runs take minutes, not hours). The floor is the same agent's interpreter,
//! started bare, measured right before each phase (creating, resuming).

#[path = "api.rs"]
mod api;
#[path = "common.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Memory of one process from `/proc/PID/smaps_rollup`, in KiB.
#[derive(Default, Clone, Copy)]
struct Memory {
    rss: u64,
    pss: u64,
    anonymous: u64,
}

impl std::ops::AddAssign for Memory {
    fn add_assign(&mut self, other: Memory) {
        self.rss += other.rss;
        self.pss += other.pss;
        self.anonymous += other.anonymous;
    }
}

fn memory(pid: u32) -> Memory {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap_or(0)
    };
    Memory { rss: field("Rss:"), pss: field("Pss:"), anonymous: field("Anonymous:") }
}

/// Every process's parent, from `/proc`.
fn parents() -> HashMap<u32, u32> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            out.insert(pid, ppid);
        }
    }
    out
}

/// The daemon (the `keel serve` child of this process) and all its descendants.
fn daemon_tree() -> (u32, Vec<u32>) {
    let parents = parents();
    let me = std::process::id();
    let daemon = parents
        .iter()
        .filter(|(_, ppid)| **ppid == me)
        .map(|(pid, _)| *pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("serve"))
                .unwrap_or(false)
        })
        .expect("the daemon's process");
    let mut tree = vec![daemon];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(parents.iter().filter(|(_, ppid)| **ppid == parent).map(|(pid, _)| *pid));
        i += 1;
    }
    (daemon, tree)
}

/// The daemon's resident memory by mapping (heap and anonymous mappings together), largest first.
fn mappings(pid: u32) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    let mut name = String::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            let path = line.split_whitespace().nth(5).unwrap_or("[anonymous]");
            name = if path == "[heap]" { "[anonymous]".into() } else { path.to_owned() };
        } else if let Some(kb) = line.strip_prefix("Rss:") {
            *by_name.entry(name.clone()).or_default() +=
                kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        }
    }
    let mut out: Vec<(String, u64)> = by_name.into_iter().collect();
    out.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    out
}

fn tree_memory() -> (Memory, Memory, usize) {
    let (daemon, tree) = daemon_tree();
    let kernel = memory(daemon);
    let mut all = Memory::default();
    for pid in &tree {
        all += memory(*pid);
    }
    (kernel, all, tree.len())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `work(i)` for i in 0..n on `clients` threads.
fn parallel(n: usize, clients: usize, work: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    work(i);
                }
            });
        }
    });
}

/// The sum of the daemon's `/metrics` series `name` whose labels include any of
/// `labels` (every series of that name when empty), from one scrape. The run gauges are
/// one grouped store query, cheap at any N, where a listing is a page of at most 10,000
/// runs.
fn metric(api: &api::Api, name: &str, labels: &[&str]) -> u64 {
    let (status, text) = api::request_text(&api.addr, "GET", "/metrics", Some(&api.token), None);
    assert_eq!(status, 200, "GET /metrics: {text}");
    text.lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let own = series.strip_prefix(name)?;
            let counted = own.is_empty() && labels.is_empty()
                || own.starts_with('{') && (labels.is_empty() || labels.iter().any(|l| own.contains(l)));
            counted.then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

/// Waits until `done()` (a count) reaches `n`, reporting progress every 5 s.
fn wait_for(what: &str, n: usize, done: impl Fn() -> u64) {
    let deadline = Instant::now() + Duration::from_secs(3 * 3600);
    let mut report = Instant::now();
    loop {
        let done = done() as usize;
        if done == n {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {done} of {n}");
        if report.elapsed() > Duration::from_secs(5) {
            eprintln!("{what}: {done} of {n}");
            report = Instant::now();
        }
        // A count reads every run's row: at 100,000 runs, polled 4 times a second, it
        // would take a share of the CPU the phase being timed needs.
        std::thread::sleep(Duration::from_millis(if n > 10_000 { 2000 } else { 250 }));
    }
}

/// The agent the runs start: its command, and the floor's bare start of its interpreter
/// (what the agent does before its first call to the kernel).
struct Agent {
    command: Vec<String>,
    floor_program: String,
    floor_args: Vec<String>,
    label: &'static str,
}

impl Agent {
    fn of(name: &str) -> Agent {
        let dir = common::bench_dir();
        match name {
            "python" => {
                // The interpreter `python3` is (through a pyenv shim, say), as the sandbox runs it.
                let out = std::process::Command::new("python3")
                    .args(["-c", "import sys; print(sys.executable)"])
                    .output()
                    .expect("run python3");
                Agent {
                    command: vec!["python3".into(), dir.join("bench_parked.py").display().to_string()],
                    floor_program: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                    floor_args: vec!["-c".into(), "import keel".into()],
                    label: "python3 -c 'import keel'",
                }
            }
            "perl" => Agent {
                command: vec!["perl".into(), dir.join("bench_parked.pl").display().to_string()],
                floor_program: "perl".into(),
                floor_args: vec!["-Mstrict".into(), "-e".into(), "1".into()],
                label: "perl -Mstrict -e 1",
            },
            other => panic!("BENCH_AGENT must be `python` or `perl`, not {other:?}"),
        }
    }
}

const SETTLE: Duration = Duration::from_secs(6);

/// The floor: the same agent's interpreter started bare, `n` times on `clients` threads,
/// each waited for: fork+exec of `python3` importing the SDK (or of perl with `strict`),
/// which is all the agent does before its first call to the kernel, with the
/// interpreter and environment a sandboxed agent gets. It writes no bytecode: the SDK's
/// directory is the kernel's, and a cache written there would be one that only this
/// benchmark's agents had. Returns the time for all `n`.
fn bare_agents(agent: &Agent, n: usize, clients: usize, sdk: &std::path::Path) -> Duration {
    let started = Instant::now();
    parallel(n, clients, |_| {
        let status = std::process::Command::new(&agent.floor_program)
            .args(&agent.floor_args)
            .env_clear()
            .envs([("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8"), ("PYTHONUNBUFFERED", "1")])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("HOME", std::env::temp_dir())
            .env("PYTHONPATH", sdk)
            .stdin(std::process::Stdio::null())
            .status()
            .expect("spawn the agent's interpreter");
        assert!(status.success(), "{} failed: {status}", agent.label);
    });
    started.elapsed()
}

fn main() {
    let n = env_usize("BENCH_RUNS", 1000);
    let clients = env_usize("BENCH_CLIENTS", 8);
    let tier = std::env::var("BENCH_TIER").unwrap_or_else(|_| "process".into());
    let agent_name = std::env::var("BENCH_AGENT").unwrap_or_else(|_| "python".into());
    let agent = Agent::of(&agent_name);
    let daemon = common::Daemon::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        &[("KEEL_SWAP_AFTER_SECS", "1".to_owned()), ("KEEL_MAILBOX_CAPACITY", "1000".to_owned())],
    );
    let api = api::Api::of(&daemon);
    // The floor: the idle daemon (after one run, so the lazily started parts are up).
    let warm = api.create_run(&json!({
        "command": ["python3", "-c", "pass"], "cwd": common::bench_dir().display().to_string(),
        "sandbox": {"tier": tier},
    }));
    while !matches!(api.run(&warm)["state"].as_str(), Some("succeeded" | "failed")) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Longer than the kernel's 5 s period of giving freed memory back (`swap.rs`), so both
    // readings are of what it holds, not of what a moment ago's work left in the allocator.
    std::thread::sleep(SETTLE);
    let (idle_kernel, idle_all, idle_procs) = tree_memory();
    // The floor is measured before each of the two phases, and each phase is compared
    // with the floor of its own minutes: this machine's speed drifts by more than the
    // difference being measured.
    let floor_n = n.min(1000);
    let sdk = daemon.data.path().join("sdk/python");
    let floor = bare_agents(&agent, floor_n, clients, &sdk);
    std::thread::sleep(Duration::from_secs(1));

    let ids: Vec<std::sync::Mutex<String>> = (0..n).map(|_| std::sync::Mutex::new(String::new())).collect();
    let started = Instant::now();
    parallel(n, clients, |i| {
        let id = api.create_run(&json!({
            "command": agent.command, "cwd": common::bench_dir().display().to_string(),
            "sandbox": {"tier": tier},
        }));
        *ids[i].lock().expect("ids lock") = id;
    });
    let created = started.elapsed();
    eprintln!("created {n} runs in {created:?}");
    wait_for("runs swapped", n, || metric(&api, "keel_runs_swapped", &[]));
    let swapped = started.elapsed();
    // Longer than the kernel's 5 s period of giving freed memory back (`swap.rs`), so both
    // readings are of what it holds, not of what a moment ago's work left in the allocator.
    std::thread::sleep(SETTLE);
    let (kernel, all, procs) = tree_memory();
    let (daemon_pid, _) = daemon_tree();
    let top = mappings(daemon_pid);
    // Where the state is: the data directory's files, or on Postgres the database.
    let (disk, where_kept) = match &daemon.database {
        None => (
            std::fs::read_dir(daemon.data.path())
                .expect("data dir")
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum(),
            "Data directory on disk",
        ),
        Some(db) => (
            common::psql(&db.url, "SELECT pg_database_size(current_database())").parse().unwrap_or(0),
            "Postgres database size (pg_database_size, with the empty schema's own pages)",
        ),
    };

    if let Some(hold) = std::env::var("BENCH_HOLD_SECS").ok().and_then(|s| s.parse().ok()) {
        eprintln!("holding {hold} s with every run swapped out; daemon pid {daemon_pid}");
        std::thread::sleep(Duration::from_secs(hold));
    }
    let resume_floor = bare_agents(&agent, floor_n, clients, &sdk);
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    parallel(n, clients, |i| {
        let id = ids[i].lock().expect("ids lock").clone();
        let (status, body) = api.post(&format!("/v1/runs/{id}/messages"), &json!({"message": {"go": i}}));
        assert!((200..300).contains(&status), "send: {status} {body}");
    });
    let sent = started.elapsed();
    // The warm-up run ends too (`failed`: it never calls `run.exit`).
    wait_for("runs ended", n + 1, || metric(&api, "keel_runs", &["state=\"succeeded\"", "state=\"failed\""]));
    let resumed = started.elapsed();
    let failures: Vec<Value> =
        api.runs_where("state=failed", 1000).into_iter().filter(|r| r["run_id"] != warm.as_str()).collect();
    let failed = failures.len();
    for failure in &failures {
        let id = failure["run_id"].as_str().unwrap_or_default();
        eprintln!("failed run {id}: {}", failure["error"]);
        // What the agent printed, and the run's last events, say which call failed.
        let (_, page) = api.get(&format!("/v1/runs/{id}/events"));
        let events = page["events"].as_array().map(Vec::as_slice).unwrap_or_default();
        for event in &events[events.len().saturating_sub(30)..] {
            eprintln!("    {event}");
        }
    }

    let per_run = |now: u64, idle: u64| (now.saturating_sub(idle)) as f64 / n as f64;
    println!(
        "cargo bench -p keel-cli --bench parked   # BENCH_RUNS={n} BENCH_TIER={tier} BENCH_AGENT={agent_name}\n\n{}\n",
        common::store_label()
    );
    println!("| phase | runs | total s | runs/s | vs the floor's rate |");
    println!("|---|---:|---:|---:|---:|");
    let rate = |runs: usize, d: Duration| runs as f64 / d.as_secs_f64();
    let floor_row = |when: &str, d: Duration| {
        println!(
            "| floor, {when}: bare fork+exec of the agent's interpreter (`{}`, {clients} clients) | {floor_n} | {:.1} | {:.0} | 1.00x |",
            agent.label,
            d.as_secs_f64(),
            rate(floor_n, d)
        );
    };
    let row = |phase: String, d: Duration, floor: Duration| {
        println!(
            "| {phase} | {n} | {:.1} | {:.0} | {:.2}x |",
            d.as_secs_f64(),
            rate(n, d),
            rate(n, d) / rate(floor_n, floor)
        );
    };
    floor_row("before creating", floor);
    row(format!("create (POST /v1/runs, {clients} clients)"), created, floor);
    row("create to all swapped out".into(), swapped, floor);
    floor_row("before resuming", resume_floor);
    row(format!("send one message to each ({clients} clients)"), sent, resume_floor);
    row("first send to all resumed and succeeded".into(), resumed, resume_floor);
    println!();
    println!("| memory, KiB | processes | RSS | PSS | anonymous |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| floor: idle daemon, kernel process | 1 | {} | {} | {} |",
        idle_kernel.rss, idle_kernel.pss, idle_kernel.anonymous
    );
    println!(
        "| floor: idle daemon, all its processes | {idle_procs} | {} | {} | {} |",
        idle_all.rss, idle_all.pss, idle_all.anonymous
    );
    println!("| {n} parked: kernel process | 1 | {} | {} | {} |", kernel.rss, kernel.pss, kernel.anonymous);
    println!(
        "| {n} parked: all the daemon's processes | {procs} | {} | {} | {} |",
        all.rss, all.pss, all.anonymous
    );
    println!(
        "| per parked run, all processes, above idle | - | {:.1} | {:.1} | {:.1} |",
        per_run(all.rss, idle_all.rss),
        per_run(all.pss, idle_all.pss),
        per_run(all.anonymous, idle_all.anonymous)
    );
    println!(
        "| per parked run, all processes, total / N | - | {:.1} | {:.1} | {:.1} |",
        all.rss as f64 / n as f64,
        all.pss as f64 / n as f64,
        all.anonymous as f64 / n as f64
    );
    println!();
    println!(
        "Kernel RSS by mapping (KiB): {}",
        top.iter().take(5).map(|(name, kb)| format!("{name} {kb}")).collect::<Vec<_>>().join(", ")
    );
    println!(
        "{where_kept}: {} KiB ({:.1} KiB per run); failed runs: {failed}",
        disk / 1024,
        disk as f64 / 1024.0 / n as f64
    );
}
