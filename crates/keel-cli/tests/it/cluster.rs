//! Many kernel nodes on one Postgres database (issue 13): real `keel serve` processes with
//! their own data directories and ports, sharing a fresh database on the server named by
//! `KEEL_TEST_POSTGRES_URL`; runs spread over them; a node SIGKILLed mid-run, another
//! SIGSTOPped past its lease and resumed (fencing), commands sent through a node that does
//! not run the run, and a drain. The mock upstream counts every distinct model call:
//! each must have been served exactly once.

use std::collections::BTreeMap;
use std::process::Command;

use crate::gateway::{Upstream, mock_upstream, read_counts};
use crate::harness::{Keel, agent, alive, wait_for, wait_for_explained};

/// Held by each test that runs several nodes, so two such tests never overlap: each
/// starts many sandboxed agents, and on a 2-core machine two at once starve the nodes'
/// heartbeats past a short lease (false takeovers) and their runs past the tests' waits.
pub(crate) fn one_cluster_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    CLUSTERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A database of its own on the test server, dropped when the test ends.
pub(crate) struct TestDatabase {
    admin: String,
    name: String,
    pub(crate) url: String,
}

impl TestDatabase {
    pub(crate) fn new() -> TestDatabase {
        let admin = std::env::var("KEEL_TEST_POSTGRES_URL").expect(
            "KEEL_TEST_POSTGRES_URL names the PostgreSQL server the cluster tests use \
             (e.g. postgres://postgres@127.0.0.1:5432/test; scripts/test sets it)",
        );
        let name = format!("keel_test_{}", std::process::id()) + &format!("_{:08x}", rand_u32());
        psql(&admin, &format!("CREATE DATABASE {name}"));
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("KEEL_TEST_POSTGRES_URL {admin:?} names no database"),
        };
        TestDatabase { admin, name, url }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([&self.admin, "-qc", &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)])
            .output();
    }
}

pub(crate) fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql").args([url, "-qAtc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn rand_u32() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    nanos ^ (std::process::id() << 16)
}

/// Lease lifetime of the test nodes, in seconds: short, so takeovers are quick.
pub(crate) const TTL: &str = "2";

/// `n` nodes on the database, each with the mock upstream as its OpenAI provider.
pub(crate) fn nodes(db: &TestDatabase, n: usize, port: u16) -> Vec<Keel> {
    (1..=n).map(|i| node(&db.url, i, port, TTL, |_| ())).collect()
}

/// Node `n{i}` on the database at `url`, with the mock upstream on `port` as its OpenAI
/// provider and leases good for `ttl` seconds; `prepare` sees its data directory before
/// it starts (to write a keel.toml).
pub(crate) fn node(url: &str, i: usize, port: u16, ttl: &str, prepare: impl FnOnce(&Keel)) -> Keel {
    node_with(url, i, port, ttl, prepare, &[])
}

/// [`node`] with more `keel serve` arguments.
pub(crate) fn node_with(
    url: &str,
    i: usize,
    port: u16,
    ttl: &str,
    prepare: impl FnOnce(&Keel),
    extra: &[&str],
) -> Keel {
    let mut node = Keel::new();
    crate::gateway::use_upstream(&mut node, port, false);
    prepare(&node);
    // Several nodes of several tests share the server's 100 connections.
    node.start_daemon_with(
        &["--store", url, "--node-id", &format!("n{i}"), "--lease-ttl", ttl, "--store-pool", "8"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect::<Vec<_>>(),
    );
    node
}

pub(crate) fn start_agent(node: &Keel, steps: usize, delay_ms: u64) -> String {
    node.detach(&[
        "--model",
        "openai/gpt-4o-mini",
        "-e",
        &format!("STEPS={steps}"),
        "-e",
        &format!("CLUSTER_AGENT_DELAY_MS={delay_ms}"),
        "--",
        "python3",
        &agent("cluster_agent.py"),
    ])
}

pub(crate) fn upstream(node: &Keel) -> (Upstream, u16, std::path::PathBuf) {
    mock_upstream(node, &agent("echo_script.json"))
}

/// Which node holds each run's lease, from the database's `run_leases`.
pub(crate) fn owners(db: &TestDatabase) -> BTreeMap<String, String> {
    psql(&db.url, "SELECT run_id || ' ' || node FROM run_leases")
        .lines()
        .filter_map(|line| line.split_once(' ').map(|(run, node)| (run.to_owned(), node.to_owned())))
        .collect()
}

/// `wait_for` with a deadline of four minutes, for waits that start many agents at once.
fn wait_long(what: &str, mut check: impl FnMut() -> Option<()>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    while check().is_none() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Every run ended `succeeded` with each step's echo, and the upstream served each
/// distinct call exactly once, except a call in flight when a node was killed or paused
/// at `stopped_at_ms` (its intent journaled before, its result after): Keel's stated crash
/// window, where a model call is sent again on replay. Such calls are counted from the
/// journals and may have been served twice, never more.
pub(crate) fn assert_all_done_once(
    node: &Keel,
    runs: &[String],
    steps: usize,
    counts: &std::path::Path,
    stopped_at_ms: u64,
) {
    let mut in_flight = 0;
    for run in runs {
        let view = node.wait_state(run, &["succeeded", "failed", "cancelled"]);
        assert_eq!(view["state"], "succeeded", "run {run}: {view}");
        let replies: Vec<String> = (1..=steps).map(|s| format!("echo: run {run} step {s}")).collect();
        assert_eq!(view["output"]["replies"], serde_json::json!(replies), "run {run}");
        in_flight += view["journal"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["method"] == "llm.chat")
            .filter(|e| {
                e["started_at"].as_u64().is_some_and(|started| started <= stopped_at_ms)
                    && e["finished_at"].as_u64().is_none_or(|finished| finished >= stopped_at_ms)
            })
            .count();
    }
    let counts = read_counts(counts);
    assert_eq!(counts["errors"], serde_json::json!([]), "{counts}");
    let served: Vec<u64> =
        counts["counts"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(served.len(), runs.len() * steps, "every distinct call reached the upstream: {counts}");
    assert!(served.iter().all(|&n| n <= 2), "a call was served more than twice: {counts}");
    let twice = served.iter().filter(|&&n| n == 2).count();
    assert!(
        twice <= in_flight,
        "{twice} calls were served twice, but only {in_flight} were in flight: {}",
        counts["repeated"]
    );
}

#[test]
fn thirty_runs_on_three_nodes_survive_a_node_sigkill_and_pay_nothing_twice() {
    let _serial = one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, counts) = upstream(&probe);
    let mut nodes = nodes(&db, 3, port);
    let steps = 8;
    let runs: Vec<String> = (0..30).map(|i| start_agent(&nodes[i % 3], steps, 400)).collect();
    // Node 2 dies once several of its runs are under way (a model call answered, more to
    // come), read straight from the database so the wait itself is quick.
    // Thirty sandboxed agents starting at once on a loaded 2-core machine can take a while.
    wait_long("node n2's runs to be mid-way", || {
        let mid_way = psql(
            &db.url,
            &format!(
                "SELECT count(*) FROM run_leases l WHERE l.node = 'n2' AND (SELECT count(*) FROM journal j \
                 WHERE j.run_id = l.run_id AND j.method = 'llm.chat' AND j.status = 'ok') BETWEEN 1 AND {}",
                steps - 3
            ),
        );
        (mid_way.parse::<usize>().unwrap_or(0) >= 3).then_some(())
    });
    let killed_at = now_ms();
    nodes[1].kill_daemon();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_all_done_once(&nodes[0], &runs, steps, &counts, killed_at)
    }));
    if let Err(panic) = result {
        for (i, node) in nodes.iter().enumerate() {
            let log = std::fs::read_to_string(node.data.path().join("daemon.log")).unwrap_or_default();
            eprintln!(
                "node n{} log:\n{}",
                i + 1,
                log.lines().filter(|l| !l.contains("cluster_agent")).collect::<Vec<_>>().join("\n")
            );
        }
        eprintln!("killed at {killed_at}");
        std::panic::resume_unwind(panic);
    }
    let listed = nodes[0].json(&["nodes", "--json"]);
    let n2 = listed["nodes"].as_array().unwrap().iter().find(|n| n["id"] == "n2").cloned().unwrap();
    assert_eq!(n2["live"], false, "{listed}");
    assert_eq!(n2["runs"], 0, "the dead node's runs went to the others: {listed}");
}

#[test]
fn a_paused_node_past_its_lease_is_fenced_and_its_agents_die() {
    let _serial = one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, counts) = upstream(&probe);
    let nodes = nodes(&db, 2, port);
    let steps = 8;
    let runs: Vec<String> = (0..4).map(|_| start_agent(&nodes[1], steps, 400)).collect();
    let pids: Vec<u32> = runs
        .iter()
        .map(|run| {
            wait_for("the agent to make a call", || {
                let view = nodes[1].inspect(run);
                (crate::harness::journaled_llm_calls(&view) >= 1).then(|| view["pid"].as_u64()).flatten()
            }) as u32
        })
        .collect();
    let paused = nodes[1].daemon_pid();
    let paused_at = now_ms();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(paused as i32), nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    // Node 1 takes every run over once n2's heartbeat lapses...
    // This wait timed out twice in full suites (never alone); on a timeout, say what held it.
    wait_for_explained(
        "node n1 to take the paused node's runs",
        || {
            let owners = owners(&db);
            runs.iter().all(|run| owners.get(run).is_some_and(|node| node == "n1")).then_some(())
        },
        || {
            format!(
                "leases: {:?}\nnodes:\n{}\nruns:\n{}\nsessions:\n{}\nlocks on leases:\n{}\n\
                 n1's log:\n{}\nn2's log:\n{}",
                owners(&db),
                psql(&db.url, "SELECT id, expires_at < now(), draining FROM keel_nodes ORDER BY id"),
                psql(&db.url, "SELECT id, state, wait_reason, attempt, pid FROM runs ORDER BY id"),
                psql(
                    &db.url,
                    "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 120) \
                     FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ),
                psql(
                    &db.url,
                    "SELECT l.pid, l.mode, l.granted FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                     WHERE c.relname = 'run_leases'"
                ),
                nodes[0].daemon_log_tail(40),
                nodes[1].daemon_log_tail(40),
            )
        },
    );
    // ... and once n2 resumes, its late writes are refused and its agents die.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(paused as i32), nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    for pid in pids {
        wait_for("the paused node's agent to die", || (!alive(pid)).then_some(()));
    }
    assert_all_done_once(&nodes[0], &runs, steps, &counts, paused_at);
    for run in &runs {
        let view = nodes[0].inspect(run);
        let mut seqs: Vec<u64> =
            view["journal"].as_array().unwrap().iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        let total = seqs.len();
        seqs.dedup();
        assert_eq!(seqs.len(), total, "no journal entry written twice: {view}");
        assert_eq!(
            crate::harness::journaled_llm_calls(&view),
            steps,
            "one journaled answer per step: {view}"
        );
    }
}

#[test]
fn any_node_answers_for_any_run_and_a_drained_node_hands_its_runs_over() {
    let _serial = one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, counts) = upstream(&probe);
    let nodes = nodes(&db, 3, port);
    // Stop through the node that does not run it.
    let stopped = start_agent(&nodes[1], 50, 200);
    wait_for("the run to start", || {
        (crate::harness::journaled_llm_calls(&nodes[1].inspect(&stopped)) >= 1).then_some(())
    });
    nodes[0].ok(&["stop", &stopped]);
    let view = nodes[0].wait_state(&stopped, &["cancelled"]);
    assert_eq!(view["state"], "cancelled");
    // Inspecting from the other node shows the owner's live view.
    let drained: Vec<String> = (0..3).map(|_| start_agent(&nodes[1], 6, 300)).collect();
    wait_for("the runs to start", || {
        drained
            .iter()
            .all(|run| crate::harness::journaled_llm_calls(&nodes[0].inspect(run)) >= 1)
            .then_some(())
    });
    let out = nodes[1].run(&["drain"]);
    assert!(out.status.success(), "keel drain: {}", String::from_utf8_lossy(&out.stderr));
    // SIGTERM drains a node the same way.
    let terminated: Vec<String> = (0..2).map(|_| start_agent(&nodes[2], 6, 300)).collect();
    wait_for("the runs on n3 to start", || {
        terminated
            .iter()
            .all(|run| crate::harness::journaled_llm_calls(&nodes[0].inspect(run)) >= 1)
            .then_some(())
    });
    let n3 = nodes[2].daemon_pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(n3 as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    for run in drained.iter().chain(&terminated) {
        let view = nodes[0].wait_state(run, &["succeeded", "failed", "cancelled"]);
        assert_eq!(view["state"], "succeeded", "{view}");
    }
    wait_for("n3 to exit after handing its runs over", || (!alive(n3)).then_some(()));
    let counts = read_counts(&counts);
    let served: Vec<u64> =
        counts["counts"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).collect();
    assert!(served.iter().all(|&n| n == 1), "some call was served twice: {counts}");
}

#[test]
fn a_second_node_with_a_live_nodes_id_is_refused_and_bad_settings_are_named() {
    let db = TestDatabase::new();
    let mut first = Keel::new();
    first.start_daemon_with(&["--store", &db.url, "--node-id", "same", "--store-pool", "4"]);
    let twin = Keel::new();
    let out = twin.run(&["serve", "--listen", "127.0.0.1:0", "--store", &db.url, "--node-id", "same"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("node id same is in use by a live node") && stderr.contains("--node-id"),
        "{stderr}"
    );
    let out = twin.run(&["serve", "--listen", "0.0.0.0:0", "--store", &db.url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--advertise"), "{stderr}");
    let out = twin.run(&["serve", "--store", &db.url, "--lease-ttl", "0.2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("outside 1..600"), "{stderr}");
    let out = twin.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "postgres://keel:hunter2@127.0.0.1:1/keel",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("keel:***@127.0.0.1:1/keel") && !stderr.contains("hunter2"), "{stderr}");
    // A node whose clock is a minute ahead of the database's (libfaketime shifts this
    // process's wall clock only) is refused, saying so.
    let out = Command::new("faketime")
        .args(["-f", "+60s", env!("CARGO_BIN_EXE_keel"), "serve", "--listen", "127.0.0.1:0"])
        .args(["--store", &db.url, "--node-id", "skewed"])
        .env("KEEL_DATA_DIR", twin.data.path())
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("faketime runs (apt install faketime; .ci/run installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("s ahead of the database's") && stderr.contains("NTP"), "{stderr}");
    // The embedded kernel of a command does not serve a shared store.
    let out = twin.cmd().env("KEEL_STORE_URL", &db.url).args(["ps"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("served by `keel serve` nodes"), "{stderr}");
    // The first node is unharmed.
    let nodes = first.json(&["nodes", "--json"]);
    assert_eq!(nodes["this_node"], "same");
    assert_eq!(nodes["nodes"][0]["live"], true);
}

#[test]
fn a_node_killed_and_restarted_at_once_takes_its_runs_back() {
    let _serial = one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, counts) = upstream(&probe);
    // A lease lifetime far longer than the test: only the node's key lets it back in.
    let mut nodes: Vec<Keel> = (1..=1).map(|i| node(&db.url, i, port, "600", |_| ())).collect();
    let node = &mut nodes[0];
    let run = start_agent(node, 6, 300);
    wait_for("the run to be mid-way", || {
        (crate::harness::journaled_llm_calls(&node.inspect(&run)) >= 2).then_some(())
    });
    let killed_at = now_ms();
    node.kill_daemon();
    node.start_daemon_with(&[
        "--store",
        &db.url,
        "--node-id",
        "n1",
        "--lease-ttl",
        "600",
        "--store-pool",
        "8",
    ]);
    assert_all_done_once(node, std::slice::from_ref(&run), 6, &counts, killed_at);
    assert_eq!(node.inspect(&run)["attempt"], 2, "relaunched once, by the restarted node");
}
