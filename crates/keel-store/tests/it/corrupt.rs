//! Garbage in the database file (written behind the store's back with raw SQLite) must
//! come back as `Error::Corrupt` naming what and where, never as a panic, and must not
//! stop the store from serving everything else.

use keel_store::{Error, NewEntry, RunFilter, RunPatch, SqliteStore, Store};
use keel_types::{EntryStatus, RunId, Usage};
use serde_json::json;

use crate::{TestDb, new_run};

/// A database with one healthy run and one run (with a journal entry) to damage. The
/// entry's params are large enough to be a blob of their own, its result small enough to
/// be stored inline in the journal row.
async fn two_runs(db: &TestDb) -> (RunId, RunId) {
    let store = db.open();
    let healthy = store.create_run(new_run(1)).await.unwrap().id;
    let damaged = store.create_run(new_run(2)).await.unwrap().id;
    let entry = NewEntry {
        method: "llm.chat".to_owned(),
        params: json!({"prompt": "unique to the damaged run", "padding": "x".repeat(300)}),
        params_hash: "h".to_owned(),
        status: EntryStatus::Ok,
        result: Some(json!("answer")),
        error: None,
        attempt: 1,
        started_at_ms: 3,
        finished_at_ms: Some(4),
        usage: Usage::default(),
    };
    store.append_entry(&damaged, &entry).await.unwrap();
    (healthy, damaged)
}

/// Runs `sql` on the file with a plain connection, foreign keys off as a careless tool
/// would have them (the bundled SQLite turns them on by default).
fn tamper(db: &TestDb, sql: &str, run: &RunId) {
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.pragma_update(None, "foreign_keys", false).unwrap();
    raw.execute(sql, [run.as_str()]).unwrap();
}

#[track_caller]
fn assert_corrupt<T: std::fmt::Debug>(result: keel_store::Result<T>, mentions: &[&str]) {
    match result {
        Err(Error::Corrupt(message)) => {
            for needle in mentions {
                assert!(message.contains(needle), "{message:?} must mention {needle:?}");
            }
        }
        other => panic!("expected Error::Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unknown_run_state_is_corrupt_not_a_panic() {
    let db = TestDb::new();
    let (healthy, damaged) = two_runs(&db).await;
    tamper(&db, "UPDATE runs SET state = 'exploded' WHERE id = ?1", &damaged);
    let store = db.open();

    assert_corrupt(store.get_run(&damaged).await, &[damaged.as_str(), "state", "exploded"]);
    assert_corrupt(store.list_runs(&RunFilter::default()).await, &["exploded"]);
    // The writer reads the run to patch it, and must report the same.
    assert_corrupt(store.update_run(&damaged, None, RunPatch::default()).await, &[damaged.as_str(), "state"]);
    // Everything else still works.
    assert!(store.get_run(&healthy).await.unwrap().is_some());
    store.update_run(&healthy, None, RunPatch::default()).await.unwrap();
}

#[tokio::test]
async fn unparsable_json_is_corrupt() {
    let db = TestDb::new();
    let (_, damaged) = two_runs(&db).await;
    tamper(&db, "UPDATE runs SET spec = '{not json' WHERE id = ?1", &damaged);
    let store = db.open();
    assert_corrupt(store.get_run(&damaged).await, &[damaged.as_str(), "spec"]);
}

#[tokio::test]
async fn a_wrongly_typed_column_is_corrupt() {
    let db = TestDb::new();
    let (_, damaged) = two_runs(&db).await;
    tamper(&db, "UPDATE runs SET attempt = -3 WHERE id = ?1", &damaged);
    let store = db.open();
    assert_corrupt(store.get_run(&damaged).await, &[damaged.as_str(), "attempt"]);
}

#[tokio::test]
async fn a_missing_blob_is_corrupt() {
    let db = TestDb::new();
    let (_, damaged) = two_runs(&db).await;
    tamper(
        &db,
        "DELETE FROM blobs WHERE hash = (SELECT params_blob FROM journal WHERE run_id = ?1)",
        &damaged,
    );
    let store = db.open();
    assert_corrupt(
        store.journal(&damaged, 0).await,
        &["params", "journal entry 1", damaged.as_str(), "missing"],
    );
    assert_corrupt(store.latest_entry(&damaged, "llm.chat").await, &["missing"]);
}

#[tokio::test]
async fn an_inline_payload_that_is_not_json_is_corrupt() {
    let db = TestDb::new();
    let (healthy, damaged) = two_runs(&db).await;
    tamper(&db, "UPDATE journal SET result_inline = x'7b6e6f' WHERE run_id = ?1", &damaged);
    let store = db.open();
    assert_corrupt(
        store.journal(&damaged, 0).await,
        &["result", "journal entry 1", damaged.as_str(), "not JSON"],
    );
    assert_corrupt(store.latest_entry(&damaged, "llm.chat").await, &["result", "not JSON"]);
    assert_eq!(store.journal(&healthy, 0).await.unwrap().len(), 0);
}

#[tokio::test]
async fn an_unknown_entry_status_is_corrupt() {
    let db = TestDb::new();
    let (_, damaged) = two_runs(&db).await;
    tamper(&db, "UPDATE journal SET status = 'maybe' WHERE run_id = ?1", &damaged);
    let store = db.open();
    assert_corrupt(store.journal(&damaged, 0).await, &["status", "maybe", "journal entry 1"]);
}

#[tokio::test]
async fn a_corrupt_kv_value_is_corrupt() {
    let db = TestDb::new();
    let store = db.open();
    store.kv_put("scope", "key", json!(1)).await.unwrap();
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute("UPDATE kv SET value = 'nope'", []).unwrap();
    drop(raw);
    let store = SqliteStore::open(&db.path()).unwrap();
    assert_corrupt(store.kv_get("scope", "key").await, &["key", "scope"]);
}
