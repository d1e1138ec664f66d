//! How a commit reaches the disk: SQLite must flush its WAL with fdatasync(2), not
//! fsync(2). The bundled amalgamation falls back to fsync unless it is built with
//! `HAVE_FDATASYNC` (the workspace's `.cargo/config.toml` sets it through
//! `LIBSQLITE3_FLAGS`); fsync also writes the inode's times, one device round trip more
//! per commit whenever the clock has ticked since the last. This test binary re-executes
//! itself under strace(1), journals a few steps there, and reads which calls it made.

use std::path::Path;
use std::process::Command;

use keel_store::{Completion, Store};
use keel_types::{EntryStatus, Usage};
use serde_json::json;

use crate::{TestDb, new_run, open, pending_entry};

/// Set (to the database path) only in the traced child.
const CHILD_DB_ENV: &str = "KEEL_STORE_SYNC_CHILD";
const CHILD_TEST: &str = "sync::traced_child_commits";
const STEPS: u64 = 10;

#[test]
fn commits_flush_with_fdatasync_not_fsync() {
    let db = TestDb::new();
    let trace = db.dir.path().join("strace.out");
    let output = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DB_ENV, db.path())
        .output()
        .unwrap_or_else(|e| panic!("running strace(1) (install the `strace` package): {e}"));
    assert!(
        output.status.success(),
        "the traced child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let calls = std::fs::read_to_string(&trace).unwrap();
    let count = |name: &str| calls.lines().filter(|line| line.contains(&format!(" {name}("))).count();
    // A run and two commits a step, each flushed.
    assert!(count("fdatasync") as u64 > 2 * STEPS, "too few fdatasync calls:\n{calls}");
    assert_eq!(count("fsync"), 0, "SQLite flushed with fsync (built without HAVE_FDATASYNC?):\n{calls}");
}

/// The traced child: a run and `STEPS` journaled steps (an intent and its completion).
#[test]
fn traced_child_commits() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = open(Path::new(&path));
        let run = store.create_run(new_run(10)).await.unwrap().id;
        for step in 0..STEPS {
            let seq = store
                .append_entry(&run, pending_entry("llm.chat", json!({ "step": step }), step))
                .await
                .unwrap();
            let completion = Completion {
                status: EntryStatus::Ok,
                result: Some(json!({ "step": step })),
                error: None,
                finished_at_ms: step + 1,
                usage: Usage { llm_calls: 1, ..Usage::default() },
                provider_served: true,
            };
            store.complete_entry(&run, seq, completion).await.unwrap();
        }
    });
}
