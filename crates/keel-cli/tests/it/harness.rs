//! Test harness: a private data directory per test, the real `keel` binary, and a daemon
//! that can be SIGKILLed and restarted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

pub fn agents() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents")
}

pub fn agent(name: &str) -> String {
    agents().join(name).display().to_string()
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `check` until it returns Some, or panics with `what` after a generous deadline.
pub fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    wait_for_explained(what, check, String::new)
}

/// [`wait_for`], and on a timeout `explain()` says what held the wait.
pub fn wait_for_explained<T>(
    what: &str,
    mut check: impl FnMut() -> Option<T>,
    explain: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            let explanation = explain();
            let sep = if explanation.is_empty() { "" } else { "\n" };
            panic!("timed out waiting for {what}{sep}{explanation}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

pub struct Keel {
    pub data: tempfile::TempDir,
    daemon: Option<Child>,
    /// Extra environment for the daemon (e.g. provider keys the kernel holds).
    pub daemon_env: Vec<(String, String)>,
}

impl Keel {
    pub fn new() -> Keel {
        Keel { data: tempfile::tempdir().expect("tempdir"), daemon: None, daemon_env: Vec::new() }
    }

    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
        cmd.env("KEEL_DATA_DIR", self.data.path())
            .env_remove("KEEL_ADDR")
            .env_remove("KEEL_LLM_SCRIPT")
            .env_remove("KEEL_API_TOKEN")
            .current_dir(repo_root())
            .stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("spawn keel")
    }

    /// Runs keel and asserts it succeeded; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "keel {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("keel {args:?} printed no JSON ({e}): {text}"))
    }

    pub fn inspect(&self, run: &str) -> Value {
        self.json(&["inspect", run, "--json"])
    }

    pub fn start_daemon(&mut self) {
        self.start_daemon_with(&[]);
    }

    /// Starts `keel serve` with extra arguments and waits until it answers.
    pub fn start_daemon_with(&mut self, extra: &[&str]) {
        assert!(self.daemon.is_none(), "daemon already running");
        let info = self.data.path().join("kernel.json");
        let _ = std::fs::remove_file(&info);
        let child = self
            .cmd()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(self.daemon_log())
            .spawn()
            .expect("spawn keel serve");
        self.daemon = Some(child);
        wait_for("the daemon to answer", || {
            std::fs::read_to_string(&info).ok()?;
            let out = self.run(&["ps", "--json"]);
            out.status.success().then_some(())
        });
    }

    /// The daemon's API: its base URL (`http://host:port`) and the operator's token.
    pub fn api(&self) -> (String, String) {
        let info: Value =
            serde_json::from_str(&std::fs::read_to_string(self.data.path().join("kernel.json")).unwrap())
                .unwrap();
        let token = std::fs::read_to_string(self.data.path().join("api-token")).unwrap();
        (format!("http://{}", info["addr"].as_str().unwrap()), token.trim().to_owned())
    }

    /// The pid of the running daemon.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon running").id()
    }

    /// SIGKILLs the daemon (and, through PDEATHSIG, its agents).
    pub fn kill_daemon(&mut self) {
        let mut child = self.daemon.take().expect("daemon running");
        child.kill().expect("SIGKILL the daemon");
        child.wait().expect("reap the daemon");
    }

    /// SIGKILLs the daemon, waits until the agent of `view` (a run as `inspect` shows it)
    /// has died with it, and starts a new daemon: a crash the next kernel recovers from.
    pub fn crash_daemon_under(&mut self, view: &Value) {
        let agent_pid = view["pid"].as_u64().map(|p| p as u32);
        self.kill_daemon();
        if let Some(pid) = agent_pid {
            wait_for("the agent to die with the daemon", || (!alive(pid)).then_some(()));
        }
        self.start_daemon();
    }

    /// A request to the daemon's HTTP API (`kernel.json` has its address), with the
    /// operator's token or none: the status and the body.
    pub fn http(&self, method: &str, path: &str, token: bool) -> (u16, String) {
        use std::io::{Read, Write};
        let info: Value =
            serde_json::from_str(&std::fs::read_to_string(self.data.path().join("kernel.json")).unwrap())
                .unwrap();
        let addr = info["addr"].as_str().unwrap().to_owned();
        let auth = if token {
            let token = std::fs::read_to_string(self.data.path().join("api-token")).unwrap();
            format!("Authorization: Bearer {}\r\n", token.trim())
        } else {
            String::new()
        };
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    }

    pub fn detach(&self, args: &[&str]) -> String {
        let mut full = vec!["run", "--detach", "--json"];
        full.extend_from_slice(args);
        let value = self.json(&full);
        value["run_id"].as_str().expect("run_id").to_owned()
    }

    /// The daemon's stderr (appended across restarts), shown when a wait times out.
    fn daemon_log(&self) -> Stdio {
        let path = self.data.path().join("daemon.log");
        match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Stdio::from(file),
            Err(_) => Stdio::null(),
        }
    }

    /// The last `n` lines of the daemon's stderr (appended across restarts).
    pub fn daemon_log_tail(&self, n: usize) -> String {
        last_lines(&std::fs::read_to_string(self.data.path().join("daemon.log")).unwrap_or_default(), n)
    }

    /// Waits for `run` to reach one of `wanted`; on timeout, the panic shows the run as
    /// it is and its last events, so a failure says where it got stuck.
    pub fn wait_state(&self, run: &str, wanted: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let view = self.inspect(run);
            if wanted.contains(&view["state"].as_str().unwrap_or_default()) {
                return view;
            }
            if Instant::now() >= deadline {
                // The data directory goes with the test: keep a copy to look into.
                let kept = std::env::temp_dir().join(format!("keel-failed-{run}"));
                let _ = Command::new("cp").arg("-a").arg(self.data.path()).arg(&kept).status();
                let logs = self.run(&["logs", run]);
                let events = format!(
                    "{}{}",
                    String::from_utf8_lossy(&logs.stdout),
                    String::from_utf8_lossy(&logs.stderr)
                );
                let log = std::fs::read_to_string(self.data.path().join("daemon.log")).unwrap_or_default();
                panic!(
                    "timed out waiting for run {run} to be {wanted:?}; it is {}\nlast events:\n{}\n\
                     runs:\n{}\ndaemon log:\n{}\n(data directory copied to {})",
                    serde_json::json!({"state": view["state"], "wait_reason": view["wait_reason"], "pid": view["pid"]}),
                    last_lines(&events, 40),
                    String::from_utf8_lossy(&self.run(&["ps", "--tree"]).stdout),
                    last_lines(&log, 30),
                    kept.display()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Keel {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs an SQL script on a stopped kernel's database file through Python's sqlite3: the
/// tests' stand-in for someone editing the file, or for a power cut that lost a write.
pub fn sql(db: &Path, script: &str) {
    let program =
        "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.close()";
    let status = Command::new("python3").args(["-c", program]).arg(db).arg(script).status().unwrap();
    assert!(status.success(), "python3 sqlite3 on {}", db.display());
}

/// How many `llm.chat` calls of a run's view (`keel inspect --json`) have a journaled
/// result.
pub fn journaled_llm_calls(view: &Value) -> usize {
    view["journal"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["method"] == "llm.chat" && e["status"] == "ok")
        .count()
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next());
            state != Some('Z') && state != Some('X')
        }
        Err(_) => false,
    }
}

/// The process state letter of `pid` (R, S, T, Z...).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

/// The official A2A SDK the A2A tests run, as pinned in scripts/test-requirements.txt.
pub const A2A_SDK: &str = "a2a-sdk[http-server]==1.3.0";

/// A Python with the official A2A SDK (`a2a-sdk` 1.3.0: its client, and its server with
/// Starlette and uvicorn): `KEEL_TEST_PYTHON` or `python3`, after `pip install` of
/// [`A2A_SDK`] when it lacks it (once per test process). Panics saying what to install
/// when that fails. `tests/fixtures/a2a_remote.py` is a remote agent served by it.
pub fn a2a_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let found = PYTHON.get_or_init(|| {
        let python = std::env::var("KEEL_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let check = "import importlib.metadata as m, a2a.client, a2a.server.routes, uvicorn, starlette\n\
                     assert m.version('a2a-sdk') == '1.3.0', m.version('a2a-sdk')";
        let ready =
            || Command::new(&python).args(["-c", check]).output().is_ok_and(|out| out.status.success());
        if !ready() {
            let out = Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", A2A_SDK])
                .output()
                .map_err(|e| {
                    format!("could not run `{python} -m pip` ({e}); install Python 3.10+ with pip")
                })?;
            if !out.status.success() || !ready() {
                return Err(format!(
                    "`{python} -m pip install '{A2A_SDK}'` did not make the A2A SDK importable ({}); install \
                     scripts/test-requirements.txt:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(PathBuf::from(python))
    });
    found.clone().unwrap_or_else(|e| panic!("{e}"))
}
