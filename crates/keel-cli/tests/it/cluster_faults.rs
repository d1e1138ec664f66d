//! Faults and commands across the nodes of a cluster (issue 13): an answer, approvals,
//! `keel logs -f` and IPC messages sent through the node that does not run the run; and
//! the database itself going away under load (a private PostgreSQL server stopped and
//! started mid-run): syscalls wait rather than fail, `/v1/health` and `keel ps` say the
//! store is unreachable, and every run finishes with nothing lost or paid for twice.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::cluster::{TestDatabase, assert_all_done_once, node, nodes, now_ms, psql, start_agent, upstream};
use crate::harness::{Keel, agent, wait_for};

#[test]
fn answers_approvals_and_logs_go_through_the_node_that_does_not_run_the_run() {
    let _serial = crate::cluster::one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, _counts) = upstream(&probe);
    let marker = probe.data.path().join("marker");
    // Both nodes read the same tool policy: `kv.put` waits for an operator.
    let nodes: Vec<Keel> = (1..=2)
        .map(|i| {
            node(&db.url, i, port, crate::cluster::TTL, |keel| {
                crate::tools::config(keel, &marker);
            })
        })
        .collect();
    let (here, owner) = (&nodes[0], &nodes[1]);

    // `keel answer` through n1 reaches the question asked on n2, and `keel logs -f`
    // through n1 follows the run to its end.
    let asked = owner.detach(&["--sandbox", "none", "--", "python3", &agent("ask_agent.py")]);
    let waiting = here.wait_state(&asked, &["waiting"]);
    assert_eq!(waiting["wait_reason"], "human", "{waiting}");
    let follow = here
        .cmd()
        .args(["logs", &asked, "-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel logs -f");
    here.ok(&["answer", &asked, "--text", "yes"]);
    let done = here.wait_state(&asked, &["succeeded", "failed"]);
    assert_eq!(done["output"], json!({"answer": "yes"}), "{done}");
    let followed = wait_for_exit(follow);
    assert!(
        followed.contains(r#"{"answer": "yes"}"#),
        "keel logs -f through n1 showed the run's output: {followed}"
    );
    let logs = here.ok(&["logs", &asked]);
    assert!(logs.contains(r#"{"answer": "yes"}"#), "{logs}");

    // Approve one call and deny the next through n1; the run on n2 goes on.
    let run = crate::tools::tools_run(
        owner,
        &["kv.*"],
        json!([
            {"tool": "kv.put", "args": {"key": "a", "value": 1}},
            {"tool": "kv.put", "args": {"key": "b", "value": 2}},
            {"tool": "kv.get", "args": {"key": "a"}},
            {"tool": "kv.get", "args": {"key": "b"}},
        ]),
    );
    let first = wait_for("the first kv.put to wait for approval, seen through n1", || {
        let view = here.inspect(&run);
        (view["wait_reason"] == "approval").then(|| view["approvals"][0]["call"].as_u64()).flatten()
    });
    let approved = here.run(&["approve", &run, "--note", "looks fine"]);
    let said = String::from_utf8_lossy(&approved.stderr);
    assert!(approved.status.success() && said.contains(&format!("call {first} of {run} approved")), "{said}");
    let second = wait_for("the second kv.put to wait", || {
        here.inspect(&run)["approvals"][0]["call"].as_u64().filter(|call| *call != first)
    });
    here.ok(&["deny", &run, &second.to_string(), "--note", "b is reserved"]);
    let done = here.wait_state(&run, &["succeeded", "failed"]);
    let results = crate::tools::results(&done);
    assert_eq!(results[0], json!({"ok": true}));
    assert_eq!(results[1]["error"], "denied", "{results:?}");
    assert!(results[1]["message"].as_str().unwrap().contains("b is reserved"), "{results:?}");
    assert_eq!(results[2], json!({"ok": 1}));
    assert_eq!(results[3], json!({"ok": null}), "the denied put had no effect");
}

#[test]
fn a_run_waiting_in_ipc_recv_wakes_for_messages_sent_from_another_node() {
    let _serial = crate::cluster::one_cluster_at_a_time();
    let db = TestDatabase::new();
    let probe = Keel::new();
    let (_upstream, port, _counts) = upstream(&probe);
    let nodes = nodes(&db, 2, port);
    let ipc = agent("ipc_agent.py");
    let drainer = nodes[0].detach(&[
        "--sandbox",
        "none",
        "--env",
        "IPC_ROLE=drainer",
        "--env",
        "IPC_COUNT=2",
        "--env",
        "IPC_RECV_TIMEOUT_MS=600000",
        "--",
        "python3",
        &ipc,
    ]);
    wait_for("the receiver on n1 to wait in ipc.recv", || {
        (nodes[1].inspect(&drainer)["wait_reason"] == "message").then_some(())
    });
    // An operator through n2...
    assert!(nodes[1].ok(&["send", &drainer, "--json", r#"{"task":"a"}"#]).contains("sent message 1"));
    wait_for("the receiver to take the first message and wait again", || {
        let view = nodes[0].inspect(&drainer);
        let received = view["journal"]
            .as_array()?
            .iter()
            .filter(|e| e["method"] == "ipc.recv" && e["status"] == "ok")
            .count();
        (received >= 1).then_some(())
    });
    // ... then a run on n2.
    let sender = nodes[1].detach(&[
        "--sandbox",
        "none",
        "--env",
        "IPC_ROLE=sender",
        "--env",
        "IPC_COUNT=1",
        "--env",
        &format!("IPC_PEER={drainer}"),
        "--",
        "python3",
        &ipc,
    ]);
    let sent = nodes[1].wait_state(&sender, &["succeeded", "failed"]);
    assert_eq!(sent["state"], "succeeded", "{sent}");
    let done = nodes[1].wait_state(&drainer, &["succeeded", "failed"]);
    assert_eq!(done["output"]["received"], json!([{"task": "a"}, {"n": 0}]), "{done}");
}

/// A PostgreSQL 15 server of this test's own, on a free port with its socket in its own
/// directory: stopping it disturbs no other test (they share the machine's server).
struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl PrivatePostgres {
    fn start() -> PrivatePostgres {
        let dir = tempfile::tempdir().expect("tempdir");
        // The server refuses to run as root: it runs as `postgres`, owning its directory.
        run_ok(Command::new("chown").args(["postgres:postgres"]).arg(dir.path()));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = PrivatePostgres { dir, port };
        run_ok(server.as_postgres("initdb").args(["-A", "trust", "-U", "postgres", "-D"]).arg(server.data()));
        server.pg_ctl("start");
        psql(&server.url("postgres"), "CREATE DATABASE keel");
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn as_postgres(&self, program: &str) -> Command {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(Path::new(PG_BIN).join(program));
        command
    }

    /// `pg_ctl start` or `stop -m fast`, waiting until it is done.
    fn pg_ctl(&self, action: &str) {
        let mut command = self.as_postgres("pg_ctl");
        command.arg("-D").arg(self.data()).args(["-w", "-l"]).arg(self.dir.path().join("server.log"));
        match action {
            "start" => command
                .arg("-o")
                .arg(format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1",
                    self.port,
                    self.dir.path().display()
                ))
                .arg("start"),
            other => command.args([other, "-m", "fast"]),
        };
        run_ok(&mut command);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ =
            self.as_postgres("pg_ctl").arg("-D").arg(self.data()).args(["stop", "-m", "immediate"]).output();
    }
}

fn run_ok(command: &mut Command) {
    let out = command.output().expect("spawn");
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_database_going_away_mid_run_makes_syscalls_wait_and_loses_nothing() {
    let _serial = crate::cluster::one_cluster_at_a_time();
    let server = PrivatePostgres::start();
    let url = server.url("keel");
    let probe = Keel::new();
    let (_upstream, port, counts) = upstream(&probe);
    // Leases outlast the outage, so no node takes another's runs when it ends.
    let nodes: Vec<Keel> = (1..=2).map(|i| node(&url, i, port, "30", |_| ())).collect();
    let steps = 6;
    let runs: Vec<String> = (0..10).map(|i| start_agent(&nodes[i % 2], steps, 300)).collect();
    wait_for("every run to be under way", || {
        runs.iter().all(|run| crate::harness::journaled_llm_calls(&nodes[0].inspect(run)) >= 1).then_some(())
    });
    let stopped_at = now_ms();
    server.pg_ctl("stop");
    // While the database is away, each node says so.
    for node in &nodes {
        let health = wait_for("/v1/health to say the store is unreachable", || {
            let health = get_health(node);
            health["store"].as_str()?.starts_with("unreachable").then_some(health)
        });
        assert_eq!(health["status"], "ok", "{health}");
    }
    let ps = nodes[0].run(&["ps"]);
    let said = String::from_utf8_lossy(&ps.stderr);
    assert!(
        !ps.status.success() && said.contains("unreachable"),
        "keel ps says the store is unreachable: {said}"
    );
    server.pg_ctl("start");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_all_done_once(&nodes[0], &runs, steps, &counts, stopped_at)
    }));
    if let Err(panic) = result {
        for (i, node) in nodes.iter().enumerate() {
            let log = std::fs::read_to_string(node.data.path().join("daemon.log")).unwrap_or_default();
            let log: Vec<&str> = log.lines().filter(|l| !l.contains("cluster_agent")).collect();
            eprintln!("node n{} log:\n{}", i + 1, log.join("\n"));
        }
        std::panic::resume_unwind(panic);
    }
    for node in &nodes {
        assert_eq!(get_health(node)["store"], "ok");
    }
    let attempts: Vec<u64> =
        runs.iter().map(|run| nodes[1].inspect(run)["attempt"].as_u64().unwrap()).collect();
    assert!(attempts.iter().all(|&a| a == 1), "no run was relaunched or taken over: {attempts:?}");
}

/// `GET /v1/health` of a node, as JSON.
fn get_health(node: &Keel) -> Value {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(node.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let mut stream = TcpStream::connect(info["addr"].as_str().unwrap()).expect("connect to the node");
    write!(stream, "GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("/v1/health is not JSON ({e}): {response}"))
}

/// Waits for a `keel` child to exit; returns its stdout and stderr.
fn wait_for_exit(mut child: std::process::Child) -> String {
    wait_for("keel logs -f to end with the run", || child.try_wait().ok().flatten());
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut text).unwrap();
    text
}

#[test]
fn doctor_reports_the_store_a_daemon_would_use_and_whether_it_answers() {
    let keel = Keel::new();
    // No store configured: the data directory's SQLite file, which is not a failure.
    let report = keel.json(&["doctor", "--json"]);
    assert_eq!(report["store"]["backend"], "sqlite", "{report}");
    assert_eq!(report["store"]["ok"], true, "{report}");
    assert!(report["store"]["url"].as_str().unwrap().ends_with(".db"), "{report}");

    // keel.toml's [store] url: the server answers with its version and search mode.
    let db = TestDatabase::new();
    std::fs::write(keel.data.path().join("keel.toml"), format!("[store]\nurl = \"{}\"\n", db.url)).unwrap();
    let store = keel.json(&["doctor", "--json"])["store"].clone();
    assert_eq!((store["backend"].as_str(), store["ok"].as_bool()), (Some("postgres"), Some(true)), "{store}");
    assert!(store["source"].as_str().unwrap().contains("keel.toml"), "{store}");
    assert!(!store["server_version"].as_str().unwrap().is_empty(), "{store}");
    assert!(store["semantic_index"].as_str().unwrap().contains("brute-force"), "{store}");
    let text = keel.ok(&["doctor"]);
    assert!(text.contains("PostgreSQL") && text.contains("semantic search"), "{text}");

    // KEEL_STORE_URL wins; a server nobody listens on is reported with its cause, the
    // password hidden, and doctor fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://keel:s3cret@127.0.0.1:{closed}/keel");
    let out = keel.cmd().args(["doctor", "--json"]).env("KEEL_STORE_URL", &url).output().unwrap();
    assert!(!out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let store = &report["store"];
    assert_eq!(
        (store["source"].as_str(), store["ok"].as_bool()),
        (Some("KEEL_STORE_URL"), Some(false)),
        "{store}"
    );
    assert!(!report.to_string().contains("s3cret"), "the password is hidden: {report}");
    assert!(store["error"].as_str().unwrap().contains("refused"), "{store}");
}
