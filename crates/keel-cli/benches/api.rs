//! Raw HTTP/1.1 requests (one connection each, no client library or pool) to the daemon's
//! API and to the benchmarks' mock servers, plus `/proc` readings, for the benchmarks that
//! time single requests or watch processes: `ipc`, `stop` and `parked`.
#![allow(dead_code, reason = "each benchmark uses a different part of this harness")]

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::Value;

/// The daemon's API: address (`host:port`) and admin token.
#[derive(Clone)]
pub struct Api {
    pub addr: String,
    pub token: String,
}

impl Api {
    pub fn of(daemon: &super::common::Daemon) -> Api {
        let (base, token) = daemon.api();
        Api { addr: base.trim_start_matches("http://").to_owned(), token }
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        request(&self.addr, "GET", path, Some(&self.token), None)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        request(&self.addr, "POST", path, Some(&self.token), Some(body))
    }

    /// Creates a run and returns its id.
    pub fn create_run(&self, body: &Value) -> String {
        let (status, run) = self.post("/v1/runs", body);
        assert!((200..300).contains(&status), "create run: {status} {run}");
        run["run_id"].as_str().expect("run_id").to_owned()
    }

    pub fn runs(&self, limit: usize) -> Vec<Value> {
        self.runs_where("", limit)
    }

    /// The newest `limit` runs (at most 10,000) matching `filter` (a query string such
    /// as `state=failed`, or empty).
    pub fn runs_where(&self, filter: &str, limit: usize) -> Vec<Value> {
        let (status, runs) = self.get(&format!("/v1/runs?limit={limit}&{filter}"));
        assert_eq!(status, 200, "list runs: {runs}");
        runs.as_array().cloned().unwrap_or_default()
    }

    pub fn run(&self, id: &str) -> Value {
        self.get(&format!("/v1/runs/{id}")).1
    }
}

/// One request on its own connection; the status and the body parsed as JSON (null if
/// it is not JSON).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let (status, body) = request_text(addr, method, path, token, body);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// One request on its own connection; the status and the body as text.
pub fn request_text(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read response");
    let response = String::from_utf8_lossy(&response);
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, body.to_owned())
}

/// Whether a process has exited: no `/proc` entry, or a zombie (dead, not yet reaped).
pub fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => matches!(
            stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
    }
}

/// p50 and p99 of samples (sorted in place).
pub fn percentiles(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    (samples[n / 2], samples[((n as f64 * 0.99) as usize).min(n - 1)])
}
