//! How a commit reaches the disk: SQLite must flush its WAL with fdatasync(2), not
//! fsync(2). The bundled amalgamation falls back to fsync unless it is built with
//! `HAVE_FDATASYNC` (the workspace's `.cargo/config.toml` sets it through
//! `LIBSQLITE3_FLAGS`); fsync also writes the inode's times, one device round trip more
//! per commit whenever the clock has ticked since the last. And a write the store does
//! not promise to flush (`Store::kv_put_unflushed`) must not flush. This test binary
//! re-executes itself under strace(1), writes there, and reads which calls it made.

use std::path::Path;
use std::process::Command;

use keel_store::{Completion, Store};
use keel_types::{EntryStatus, Usage};
use serde_json::json;

use crate::{TestDb, new_run, open, pending_entry};

/// Set (to the database path) only in the traced child.
const CHILD_DB_ENV: &str = "KEEL_STORE_SYNC_CHILD";
const CHILD_TEST: &str = "sync::traced_child_commits";
const UNFLUSHED_CHILD_TEST: &str = "sync::traced_child_puts_unflushed";
const STEPS: u64 = 10;

/// Runs the test `child` of this binary under strace(1), tracing `syscalls` of every
/// thread, with a database of its own; returns the trace (one call a line, each led by
/// its thread's id).
fn traced(child: &str, syscalls: &str) -> String {
    let db = TestDb::new();
    let trace = db.dir.path().join("strace.out");
    let output = Command::new("strace")
        .args(["-f", "-qq", "-e", &format!("trace={syscalls}"), "-o"])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args([child, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DB_ENV, db.path())
        .output()
        .unwrap_or_else(|e| panic!("running strace(1) (install the `strace` package): {e}"));
    assert!(
        output.status.success(),
        "the traced child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read_to_string(&trace).unwrap()
}

#[test]
fn commits_flush_with_fdatasync_not_fsync() {
    let calls = traced(CHILD_TEST, "fsync,fdatasync");
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
                .append_entry(&run, &pending_entry("llm.chat", json!({ "step": step }), step))
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
            store.complete_entry(&run, seq, &completion).await.unwrap();
        }
    });
}

/// Unflushed kv values commit without a flush: between two marks the traced child puts
/// ten of them, and no thread but the store's checkpointer (which flushes on its own
/// clock, and says nothing about commits) calls fdatasync or fsync. The flushed put after
/// the marks does.
#[test]
fn unflushed_kv_values_commit_without_a_flush() {
    let calls = traced(UNFLUSHED_CHILD_TEST, "fsync,fdatasync,mkdir");
    let (mut checkpointer, mut phase) = (None, "before");
    let (mut inside, mut after) = (Vec::new(), 0);
    for line in calls.lines() {
        let (thread, call) =
            line.split_once(' ').map_or(("", line), |(thread, call)| (thread, call.trim_start()));
        if call.starts_with("mkdir(") {
            if let Some(tid) = call.split("/begin-").nth(1) {
                checkpointer = tid.split('"').next().map(str::to_owned);
                phase = "inside";
            } else if call.contains("/end\"") {
                phase = "after";
            }
            continue;
        }
        let flush = call.starts_with("fdatasync(") || call.starts_with("fsync(");
        match phase {
            "inside" if flush && Some(thread) != checkpointer.as_deref() => inside.push(line),
            "after" if flush => after += 1,
            _ => {}
        }
    }
    assert!(checkpointer.is_some(), "the child never marked its start:\n{calls}");
    assert_eq!(inside, Vec::<&str>::new(), "unflushed puts flushed:\n{calls}");
    assert!(after >= 1, "the flushed put after them did not flush:\n{calls}");
}

/// The traced child of `unflushed_kv_values_commit_without_a_flush`: marks (a directory
/// named for the checkpoint thread's id), ten unflushed puts, each read back, a mark,
/// and one flushed put.
#[test]
fn traced_child_puts_unflushed() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let dir = Path::new(&path).parent().unwrap().to_owned();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = open(Path::new(&path));
        store.create_run(new_run(10)).await.unwrap();
        // A thread takes its name once it first runs, which on a busy machine (and under
        // strace) can be after `open` returned.
        let named = || {
            std::fs::read_dir("/proc/self/task").unwrap().map(|task| task.unwrap().path()).find(|task| {
                std::fs::read_to_string(task.join("comm")).unwrap().starts_with("keel-store-chec")
            })
        };
        let checkpointer = (0..500)
            .find_map(|_| {
                let found = named();
                if found.is_none() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                found
            })
            .expect("the store's checkpoint thread");
        let tid = checkpointer.file_name().unwrap().to_str().unwrap();
        std::fs::create_dir(dir.join(format!("begin-{tid}"))).unwrap();
        for i in 0..10 {
            store.kv_put_unflushed("responses", &format!("k{i}"), json!({ "i": i })).await.unwrap();
            assert_eq!(store.kv_get("responses", &format!("k{i}")).await.unwrap(), Some(json!({ "i": i })));
        }
        std::fs::create_dir(dir.join("end")).unwrap();
        store.kv_put("responses", "flushed", json!(true)).await.unwrap();
    });
}
