//! keel-mcp's integration tests: real MCP servers and clients from npm and PyPI, and our own.

mod filesystem;
mod pagination;
mod python;
mod serve;
mod stdio;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A file under `tests/fixtures/`.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name)
}

/// Whether process `pid` is gone (or a zombie nobody will reap) within `within`.
async fn process_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
        let gone = match status {
            Err(_) => true,
            Ok(status) => status.lines().any(|line| line.starts_with("State:") && line.contains('Z')),
        };
        if gone {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Wait until something listens on `port`.
async fn wait_for_port(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listened on port {port} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
