//! The audit log on SQLite against tampering done directly in the database file with a
//! raw connection (the append-only triggers dropped first, as a tamperer would): verify
//! names the first entry that does not hold and why.

use keel_store::{AuditRecord, AuditVerify, Store};
use keel_types::RunId;
use serde_json::json;

use crate::TestDb;

/// A store file holding a clean chain of `count` entries (seqs 1..=count).
async fn chain_of(count: u64) -> TestDb {
    let db = TestDb::new();
    let store = db.open();
    let run = RunId::generate(1_000);
    let records = (1..=count)
        .map(|i| AuditRecord {
            tenant: "tests".to_owned(),
            run_id: Some(run.clone()),
            at_ms: 1_000 + i,
            actor: "kernel".to_owned(),
            action: "egress".to_owned(),
            subject: format!("host{i}.example"),
            outcome: if i % 2 == 0 { "denied" } else { "allowed" }.to_owned(),
            detail: json!({"port": 443, "i": i}),
        })
        .collect();
    assert_eq!(store.audit_append(records).await.unwrap(), (1..=count).collect::<Vec<_>>());
    let clean = store.audit_verify().await.unwrap();
    assert_eq!(clean.broken, None, "{clean:?}");
    assert_eq!(clean.entries, count);
    db
}

/// Runs `sql` on the file the way a tamperer would: triggers dropped first.
fn tamper(db: &TestDb, sql: &str) {
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;").unwrap();
    raw.execute_batch(sql).unwrap();
}

async fn verify(db: &TestDb) -> AuditVerify {
    db.open().audit_verify().await.unwrap()
}

fn assert_broken_at(verified: &AuditVerify, seq: u64, words: &str) {
    let broken = verified.broken.as_ref().unwrap_or_else(|| panic!("tampering went unnoticed: {verified:?}"));
    assert_eq!(broken.seq, seq, "{broken:?}");
    assert!(broken.reason.contains(words), "the reason should say {words:?}: {}", broken.reason);
    assert_eq!(verified.entries, seq - 1, "entries before the break verify: {verified:?}");
}

#[tokio::test]
async fn the_audit_table_refuses_update_and_delete() {
    let db = chain_of(2).await;
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    let update = raw.execute("UPDATE audit SET outcome = 'allowed' WHERE seq = 2", []).unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let delete = raw.execute("DELETE FROM audit WHERE seq = 2", []).unwrap_err();
    assert!(delete.to_string().contains("append-only"), "{delete}");
    drop(raw);
    assert_eq!(verify(&db).await.broken, None);
}

#[tokio::test]
async fn a_modified_detail_is_caught_at_its_entry() {
    let db = chain_of(4).await;
    tamper(&db, r#"UPDATE audit SET detail = '{"port":443,"i":99}' WHERE seq = 3"#);
    assert_broken_at(&verify(&db).await, 3, "was modified");
}

#[tokio::test]
async fn a_modified_outcome_with_a_recomputed_hash_breaks_the_next_link() {
    let db = chain_of(4).await;
    // The tamperer recomputes entry 2's hash so it matches its new content, but entry 3
    // still names the old hash as its prev.
    let store = db.open();
    let mut entry = store.audit_list(&Default::default()).await.unwrap().remove(1);
    drop(store);
    entry.record.outcome = "allowed".to_owned();
    let forged = keel_core::audit::entry_hash(&entry.prev_hash, 2, &entry.record.canonical_json());
    tamper(&db, &format!("UPDATE audit SET outcome = 'allowed', hash = '{forged}' WHERE seq = 2"));
    assert_broken_at(&verify(&db).await, 3, "does not link");
}

#[tokio::test]
async fn a_modified_hash_is_caught_at_its_entry() {
    let db = chain_of(3).await;
    tamper(&db, &format!("UPDATE audit SET hash = '{}' WHERE seq = 1", "f".repeat(64)));
    assert_broken_at(&verify(&db).await, 1, "was modified");
}

#[tokio::test]
async fn a_deleted_middle_entry_is_caught() {
    let db = chain_of(4).await;
    tamper(&db, "DELETE FROM audit WHERE seq = 2");
    assert_broken_at(&verify(&db).await, 2, "entry 2 is missing");
}

#[tokio::test]
async fn deleted_last_entries_are_caught_by_the_head() {
    let db = chain_of(4).await;
    tamper(&db, "DELETE FROM audit WHERE seq >= 3");
    assert_broken_at(&verify(&db).await, 3, "entries 3 to 4 were removed");
}

#[tokio::test]
async fn swapped_entries_are_caught() {
    let db = chain_of(4).await;
    tamper(
        &db,
        "UPDATE audit SET seq = -2 WHERE seq = 2; UPDATE audit SET seq = 2 WHERE seq = 3; \
         UPDATE audit SET seq = 3 WHERE seq = -2;",
    );
    assert_broken_at(&verify(&db).await, 2, "does not link");
}

#[tokio::test]
async fn a_deleted_head_is_caught() {
    let db = chain_of(2).await;
    tamper(&db, "DELETE FROM audit_head");
    let verified = verify(&db).await;
    let broken = verified.broken.expect("a log without its head must not verify");
    assert!(broken.reason.contains("head is missing"), "{}", broken.reason);
}

#[tokio::test]
async fn appends_continue_the_chain_after_a_reopen() {
    let db = chain_of(2).await;
    let store = db.open();
    let record = store.audit_list(&Default::default()).await.unwrap()[0].record.clone();
    assert_eq!(store.audit_append(vec![record]).await.unwrap(), vec![3]);
    let verified = store.audit_verify().await.unwrap();
    assert_eq!((verified.entries, verified.broken), (3, None));
    assert_eq!(verified.head_hash, store.audit_list(&Default::default()).await.unwrap()[2].hash);
}
