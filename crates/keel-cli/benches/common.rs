//! Shared by the benchmarks: a daemon in a temporary data directory, driven through the
//! real `keel` binary (the release build `cargo bench` makes).
//!
//! `BENCH_STORE=postgres` puts the daemon of every benchmark that starts one through
//! `Daemon` on a Postgres database of its own (created on the server named by
//! `KEEL_BENCH_POSTGRES_URL` or `KEEL_TEST_POSTGRES_URL`, dropped at the end) instead of
//! the data directory's SQLite file; `store_label` says which, for the output.
#![allow(dead_code, reason = "each benchmark uses a different part of this harness")]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub data: tempfile::TempDir,
    child: Option<Child>,
    env: Vec<(String, String)>,
    /// The Postgres database the daemon keeps its state in (`BENCH_STORE=postgres`);
    /// dropped after the daemon is killed (fields drop after `Drop::drop`).
    pub database: Option<Database>,
}

/// The Postgres server the benchmarks may use: `KEEL_BENCH_POSTGRES_URL`, else
/// `KEEL_TEST_POSTGRES_URL`.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var("KEEL_BENCH_POSTGRES_URL").or_else(|_| std::env::var("KEEL_TEST_POSTGRES_URL")).ok()
}

/// Whether `BENCH_STORE` asks for Postgres; panics on a value it does not know, or on
/// Postgres without a server to use.
pub fn postgres_store() -> Option<String> {
    match std::env::var("BENCH_STORE").as_deref() {
        Err(_) | Ok("" | "sqlite") => None,
        Ok("postgres") => Some(postgres_admin_url().expect(
            "BENCH_STORE=postgres needs a server: set KEEL_BENCH_POSTGRES_URL (or KEEL_TEST_POSTGRES_URL), \
             e.g. postgres://postgres@127.0.0.1:5432/test",
        )),
        Ok(other) => panic!("BENCH_STORE={other:?}: expected `sqlite` (the default) or `postgres`"),
    }
}

/// The store the benchmark's daemon uses, for the output.
pub fn store_label() -> String {
    match postgres_store() {
        None => "store: SQLite (the data directory's file, the default)".to_owned(),
        Some(admin) => {
            format!("store: Postgres {}, a database of its own", psql(&admin, "SHOW server_version"))
        }
    }
}

impl Daemon {
    pub fn start(data: tempfile::TempDir) -> Daemon {
        Daemon::start_with_env(data, &[])
    }

    /// Starts the daemon with extra environment (e.g. the provider keys the kernel holds).
    pub fn start_with_env(data: tempfile::TempDir, env: &[(&str, String)]) -> Daemon {
        let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let database = postgres_store().map(|admin| Database::create(&admin, "daemon"));
        if let Some(database) = &database {
            env.push(("KEEL_STORE_URL".to_owned(), database.url.clone()));
        }
        let mut daemon = Daemon { data, child: None, env, database };
        daemon.spawn();
        daemon
    }

    pub fn keel(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
        cmd.env("KEEL_DATA_DIR", self.data.path())
            .env_remove("KEEL_ADDR")
            .env_remove("KEEL_LLM_SCRIPT")
            .env_remove("KEEL_STORE_URL")
            .stdin(Stdio::null());
        cmd
    }

    pub fn spawn(&mut self) {
        let info = self.data.path().join("kernel.json");
        let _ = std::fs::remove_file(&info);
        let child = self
            .keel()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start keel serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !info.exists() {
            assert!(Instant::now() < deadline, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a run (`keel run --detach --json ARGS`), waits up to 15 minutes for it to
    /// end, and returns its view; panics, with its logs, unless it succeeded.
    pub fn finished_run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> serde_json::Value {
        let out = self.keel().args(["run", "--detach", "--json"]).args(args).output().expect("keel run");
        assert!(out.status.success(), "keel run failed: {}", String::from_utf8_lossy(&out.stderr));
        let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("run id");
        let run = run["run_id"].as_str().expect("run_id").to_owned();
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            // The run list, not `keel inspect`: inspecting reads the whole journal, which for
            // a benchmark's agent grows to thousands of entries and, read every 100 ms, took
            // a fifth of the daemon's CPU from what was being measured.
            let out = self.keel().args(["ps", "--json", "--limit", "1000"]).output().expect("keel ps");
            let runs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ps json");
            let view =
                runs.as_array().and_then(|runs| runs.iter().find(|r| r["run_id"] == run.as_str())).cloned();
            let view = view.unwrap_or_else(|| panic!("run {run} is not listed: {runs}"));
            if matches!(view["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                let logs = || self.keel().args(["logs", &run]).output().expect("keel logs").stdout;
                assert_eq!(view["state"], "succeeded", "{view}\n{}", String::from_utf8_lossy(&logs()));
                return view;
            }
            assert!(Instant::now() < deadline, "the benchmark agent did not finish");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The CPU time (user and system, all threads) the daemon has used so far.
    pub fn cpu(&self) -> Duration {
        let Some(pid) = self.pid() else { return Duration::ZERO };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields 14 and 15 (utime, stime), counted after the `)` that ends the command name.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks: u64 =
            fields.get(11..13).map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum()).unwrap_or(0);
        // In USER_HZ, which Linux fixes at 100 for what it reports to user space.
        Duration::from_millis(ticks * 10)
    }

    /// The daemon's API address and token.
    pub fn api(&self) -> (String, String) {
        let info: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.data.path().join("kernel.json")).expect("kernel.json"),
        )
        .expect("kernel.json is JSON");
        let token = std::fs::read_to_string(self.data.path().join("api-token")).expect("api token");
        (format!("http://{}", info["addr"].as_str().expect("addr")), token.trim().to_owned())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `python3 ARGS` (a floor measured by one of the benchmarks' Python scripts) and
/// returns the JSON it prints.
pub fn python_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3").args(args).output().expect("run python3");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("floor stats")
}

pub fn bench_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches"))
}

/// A database of its own on the benchmark's Postgres server, dropped at the end.
pub struct Database {
    admin: String,
    pub name: String,
    pub url: String,
}

impl Database {
    pub fn create(admin: &str, label: &str) -> Database {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("keel_test_bench_{}_{n}_{label}", std::process::id());
        psql(admin, &format!("CREATE DATABASE {name}"));
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("the Postgres URL {admin:?} names no database; give one, e.g. .../postgres"),
        };
        Database { admin: admin.to_owned(), name, url }
    }

    /// The runs each node holds a lease on.
    pub fn leases(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut by_node: std::collections::BTreeMap<String, Vec<String>> = Default::default();
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

/// Runs `sql` with `psql` and returns what it printed, unaligned and trimmed.
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql").args([url, "-qAtc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The commit floor of the store the benchmark's daemon uses, measured in `dir` (SQLite)
/// or on the same server (Postgres): what it is, and its stats (`n`, `mean_us`, `p50_us`,
/// `p99_us`, `per_s`).
/// - SQLite: one INSERT and one fsync'd commit per message (WAL, synchronous=FULL),
///   `bench_ipc.py sqlite`.
/// - Postgres: 2,000 autocommitted single-row INSERTs (each a round trip and a flushed
///   commit) sent by one `psql`; only their mean is known, so it stands for p50 too.
pub fn commit_floor(dir: &Path) -> (&'static str, serde_json::Value) {
    let Some(admin) = postgres_store() else {
        let script = bench_dir().join("bench_ipc.py").display().to_string();
        let db = dir.join("floor.db").display().to_string();
        return ("a raw fsync'd SQLite commit", python_json(&[&script, "sqlite", &db])["commit"].clone());
    };
    let n = 2000;
    let db = Database::create(&admin, "floor");
    psql(&db.url, "CREATE TABLE m (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)");
    let script: String =
        (0..n).map(|i| format!("INSERT INTO m (body) VALUES ('{{\"op\":\"req\",\"i\":{i}}}');\n")).collect();
    let started = Instant::now();
    let mut child = Command::new("psql")
        .args([db.url.as_str(), "-qAt", "-v", "ON_ERROR_STOP=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("psql runs");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), script.as_bytes())
        .expect("write the script");
    assert!(child.wait().expect("psql ends").success(), "the Postgres commit floor failed");
    let elapsed = started.elapsed();
    assert_eq!(psql(&db.url, "SELECT count(*) FROM m"), n.to_string());
    let mean = (elapsed.as_secs_f64() * 1e7 / n as f64).round() / 10.0;
    let stats = serde_json::json!({
        "n": n, "mean_us": mean, "p50_us": mean, "p99_us": "-", "per_s": (1e6 / mean).round(),
    });
    ("a raw autocommitted Postgres INSERT (its mean as p50)", stats)
}
