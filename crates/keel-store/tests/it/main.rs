//! keel-store's integration tests: the conformance suite on SQLite files and on Postgres
//! (`KEEL_TEST_POSTGRES_URL`), reopening a store, acknowledged writes surviving a SIGKILL,
//! corrupt data read back as errors, and commits flushed with fdatasync.

mod audit;
mod corrupt;
mod crash;
mod pg_cluster;
mod pg_database;
mod postgres;
mod sqlite;
mod sync;

use std::path::{Path, PathBuf};

use keel_store::{NewRun, SqliteStore};
use keel_types::{RunId, RunState};
use serde_json::json;
use tempfile::TempDir;

/// A fresh directory for one test's database file; removed when dropped.
struct TestDb {
    dir: TempDir,
}

impl TestDb {
    fn new() -> TestDb {
        TestDb { dir: tempfile::tempdir().expect("creating a temporary directory") }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("keel.db")
    }

    fn open(&self) -> SqliteStore {
        open(&self.path())
    }
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path).unwrap_or_else(|error| panic!("opening {}: {error}", path.display()))
}

fn new_run(created_at_ms: u64) -> NewRun {
    NewRun {
        id: RunId::generate(created_at_ms),
        tenant: "tests".to_owned(),
        spec: json!({"command": ["agent"]}),
        state: RunState::Created,
        created_at_ms,
    }
}

/// A pending journal entry of `method` with `params`, started at `started_at_ms`.
fn pending_entry(method: &str, params: serde_json::Value, started_at_ms: u64) -> keel_store::NewEntry {
    keel_store::NewEntry {
        method: method.to_owned(),
        params_hash: format!("{method}:{started_at_ms}"),
        params,
        status: keel_types::EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms,
        finished_at_ms: None,
        usage: keel_types::Usage::default(),
    }
}
