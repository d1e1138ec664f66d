//! The SQLite backend against the conformance suite, and the lifecycle of a store file:
//! reopening, sharing clones, schema versions.

use std::sync::Arc;

use keel_store::{
    Completion, DumpItem, Error, NewEntry, NewEvent, RunFilter, RunPatch, SqliteStore, Store, conformance,
    dump,
};
use keel_types::{EntryStatus, RunState, Usage};
use serde_json::json;

use crate::{TestDb, new_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_suite_on_a_fresh_file() {
    let db = TestDb::new();
    conformance::run_all(Arc::new(db.open())).await;
}

/// The suite must also hold on a store that already has data, and on the
/// single-threaded runtime where every task interleaves on one thread.
#[tokio::test(flavor = "current_thread")]
async fn conformance_suite_twice_on_one_file_single_threaded() {
    let db = TestDb::new();
    let store: Arc<dyn Store> = Arc::new(db.open());
    conformance::run_all(Arc::clone(&store)).await;
    conformance::run_all(store).await;
}

/// SQLite completes a waiting receive in the send's own commit: the IPC round trip's two
/// commits (issue 16) rest on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_completes_a_waiting_receive_in_its_commit() {
    let db = TestDb::new();
    assert!(conformance::mailbox_send_completes_a_waiting_receive(&db.open()).await);
}

/// A dump of one file restored into another reads back the same, and the copy carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_restore_between_two_files() {
    let (source, target) = (TestDb::new(), TestDb::new());
    conformance::dump_and_restore(Arc::new(source.open()), Arc::new(target.open())).await;
}

/// Sections longer than a batch are paged through whole: every batch but the last is
/// full, and the copy compares equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dumps_page_through_sections_longer_than_a_batch() {
    let (source_db, target_db) = (TestDb::new(), TestDb::new());
    let source: Arc<dyn Store> = Arc::new(source_db.open());
    let target: Arc<dyn Store> = Arc::new(target_db.open());
    let run = source.create_run(new_run(1_000)).await.unwrap().id;
    let count = dump::DUMP_BATCH + 100;
    // Concurrent writes share commits (group commit), so this takes a few fsyncs.
    let writes: Vec<_> = (0..count)
        .map(|i| {
            let (source, run) = (Arc::clone(&source), run.clone());
            tokio::spawn(async move {
                let entry = NewEntry {
                    method: "kv.put".to_owned(),
                    params: json!({"messages": [{"n": i % 7}]}),
                    params_hash: format!("h{i}"),
                    status: EntryStatus::Ok,
                    result: Some(json!(i)),
                    error: None,
                    attempt: 1,
                    started_at_ms: 1,
                    finished_at_ms: Some(2),
                    usage: Usage::default(),
                };
                source.append_entry(&run, &entry).await.unwrap();
                source.kv_put("many", &format!("{i:05}"), json!(i)).await.unwrap();
            })
        })
        .collect();
    for write in writes {
        write.await.unwrap();
    }
    let (sink, mut batches) = tokio::sync::mpsc::channel(1);
    let dumping = tokio::spawn({
        let source = Arc::clone(&source);
        async move { source.dump(sink).await }
    });
    let mut sizes = Vec::new();
    while let Some(batch) = batches.recv().await {
        sizes.push(batch.len());
        target.restore(batch).await.unwrap();
    }
    dumping.await.unwrap().unwrap();
    let total = 1 + 2 * count;
    assert_eq!(sizes.iter().sum::<usize>(), total);
    assert!(sizes[..sizes.len() - 1].iter().all(|&size| size == dump::DUMP_BATCH), "{sizes:?}");
    assert_eq!(dump::compare_stores(&*source, &*target).await.unwrap(), Ok(total as u64));
    assert_eq!(target.journal(&run, 0).await.unwrap(), source.journal(&run, 0).await.unwrap());
}

/// A restore of an item the store already holds fails and writes none of its batch.
#[tokio::test]
async fn restoring_an_item_twice_fails_and_writes_nothing() {
    let (source_db, target_db) = (TestDb::new(), TestDb::new());
    let (source, target) = (source_db.open(), target_db.open());
    source.kv_put("s", "a", json!(1)).await.unwrap();
    target.kv_put("s", "a", json!(1)).await.unwrap();
    let run = source.create_run(new_run(1_000)).await.unwrap();
    let items = vec![
        DumpItem::Run(run.clone()),
        DumpItem::Kv { scope: "s".into(), key: "a".into(), value: json!(1) },
    ];
    let error = target.restore(items).await.unwrap_err();
    assert!(matches!(error, Error::Backend { step: "restoring a kv value", .. }), "{error}");
    assert_eq!(target.get_run(&run.id).await.unwrap(), None, "all or nothing");
    assert_eq!(
        dump::compare_stores(&source, &target).await.unwrap(),
        Err(format!("run {}: differs (the copy has kv value \"a\" in scope \"s\" in its place)", run.id))
    );
}

/// `open_existing` creates nothing and refuses what is not a keel database, untouched.
#[test]
fn open_existing_refuses_a_missing_or_foreign_file() {
    let db = TestDb::new();
    let refused = |path: &std::path::Path| match SqliteStore::open_existing(path) {
        Err(Error::Backend { step: "checking the file is a keel database", source }) => source.to_string(),
        Err(other) => panic!("{}: unexpected error {other}", path.display()),
        Ok(_) => panic!("{} was opened", path.display()),
    };
    assert!(refused(&db.path()).ends_with("no such file"));
    assert!(!db.path().exists(), "nothing created");
    std::fs::write(db.path(), "plain text, not SQLite at all, long enough to have a header").unwrap();
    assert!(refused(&db.path()).contains("not a keel database"));
    std::fs::remove_file(db.path()).unwrap();
    let foreign = rusqlite::Connection::open(db.path()).unwrap();
    foreign.execute_batch("CREATE TABLE notes (text TEXT)").unwrap();
    drop(foreign);
    assert!(refused(&db.path()).contains("not keel's"));
    std::fs::remove_file(db.path()).unwrap();
    drop(db.open());
    SqliteStore::open_existing(&db.path()).expect("a keel database opens");
}

#[tokio::test]
async fn reopened_store_keeps_everything() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1_000)).await.unwrap().id;
    let params = json!({"messages": ["hello"]});
    let seq = store
        .append_entry(
            &run,
            &NewEntry {
                method: "llm.chat".to_owned(),
                params: params.clone(),
                params_hash: "h".to_owned(),
                status: EntryStatus::Pending,
                result: None,
                error: None,
                attempt: 1,
                started_at_ms: 1_001,
                finished_at_ms: None,
                usage: Usage::default(),
            },
        )
        .await
        .unwrap();
    let usage = Usage { input_tokens: 3, output_tokens: 4, llm_calls: 1, tool_calls: 0, cost_micro_usd: 50 };
    store
        .complete_entry(
            &run,
            seq,
            &Completion {
                status: EntryStatus::Ok,
                result: Some(json!("hi")),
                error: None,
                finished_at_ms: 1_002,
                usage,
                provider_served: true,
            },
        )
        .await
        .unwrap();
    store
        .update_run(
            &run,
            Some(RunState::Created),
            RunPatch { state: Some(RunState::Running), pid: Some(Some(99)), ..RunPatch::default() },
        )
        .await
        .unwrap();
    let event = NewEvent { ts_ms: 1_003, kind: "stdout".to_owned(), data: json!("line") };
    store.append_events(&run, &[event]).await.unwrap();
    store.kv_put("scope", "key", json!({"v": 1})).await.unwrap();

    let run_before = store.get_run(&run).await.unwrap();
    let journal_before = store.journal(&run, 0).await.unwrap();
    let events_before = store.events(&run, 0, 10).await.unwrap();
    let stats_before = store.stats().await.unwrap();
    drop(store);

    let store = db.open();
    assert_eq!(store.get_run(&run).await.unwrap(), run_before);
    assert_eq!(store.journal(&run, 0).await.unwrap(), journal_before);
    assert_eq!(store.events(&run, 0, 10).await.unwrap(), events_before);
    assert_eq!(store.stats().await.unwrap(), stats_before);
    assert_eq!(store.kv_get("scope", "key").await.unwrap(), Some(json!({"v": 1})));
    let reopened_run = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(reopened_run.usage, usage);
    assert_eq!(reopened_run.provider_calls, 1);
    // Seqs continue after a reopen instead of starting over.
    assert_eq!(store.append_events(&run, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn clones_share_one_store_until_the_last_is_dropped() {
    let db = TestDb::new();
    let store = db.open();
    let clone = store.clone();
    let run = store.create_run(new_run(5)).await.unwrap().id;
    drop(store);
    // The writer thread lives on while a clone does.
    clone.update_run(&run, None, RunPatch::default()).await.unwrap();
    drop(clone);
    let reopened = db.open();
    let runs = reopened.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].id, run);
}

#[tokio::test]
async fn dropping_the_store_from_a_task_does_not_block_forever() {
    let db = TestDb::new();
    let store = db.open();
    store.create_run(new_run(7)).await.unwrap();
    // The last handle may well be dropped inside a spawned task; joining the writer there
    // must return once the writer has drained its queue.
    tokio::spawn(async move { drop(store) }).await.unwrap();
    assert_eq!(db.open().stats().await.unwrap().runs, 1);
}

/// The schema version this build writes.
const SCHEMA_VERSION: i64 = 10;

/// Opens the file of a store that was opened (and so migrated) and dropped, checking it
/// is at this build's schema version.
#[track_caller]
fn migrated_file(db: &TestDb) -> rusqlite::Connection {
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    let version: i64 = raw.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    raw
}

/// A version-1 database (before memory) keeps its runs and gains the memory tables when a
/// newer keel opens it. The v1 file is made by taking the version-2 objects out of a new
/// one, which leaves exactly the version-1 schema.
#[tokio::test]
async fn a_version_1_database_is_migrated_to_memory() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap().id;
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TABLE memory_embeddings; DROP TABLE memory_fts; DROP TABLE memory; DROP TABLE memory_deletes; DROP TABLE message_chain; \
         DROP TABLE thread_messages; DROP TABLE mailbox; DROP TABLE subscriptions; \
         DROP TABLE audit; DROP TABLE audit_head; DROP TABLE api_tokens; DROP TABLE tenants; \
         DROP INDEX runs_by_tenant; DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    assert!(store.get_run(&run).await.unwrap().is_some(), "v1 data must survive the migration");
    store.mem_put("t", "ns", "k", json!(1), "hello world".into(), None, 1).await.unwrap();
    assert_eq!(
        store
            .mem_search(
                "t",
                "ns",
                &keel_store::MemorySearch { query: "world".into(), ..Default::default() },
                5
            )
            .await
            .unwrap()[0]
            .key,
        "k"
    );
    assert_eq!(store.thread_append("t", "th", json!("m"), None, 1).await.unwrap(), 0);
    drop(store);
    migrated_file(&db);
}

/// A version-2 database (memory, no mailboxes) is migrated to version 3.
#[tokio::test]
async fn a_version_2_database_is_migrated_to_mailboxes() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap().id;
    store.thread_append("t", "th", json!("m"), None, 1).await.unwrap();
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TABLE memory_embeddings; DROP TRIGGER memory_embedding_deleted; \
         DROP TABLE mailbox; DROP TABLE subscriptions; DROP TABLE audit; DROP TABLE audit_head; \
         DROP TABLE api_tokens; DROP TABLE tenants; DROP INDEX runs_by_tenant; DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    assert_eq!(store.thread_read("t", "th", None).await.unwrap().len(), 1, "v2 data must survive");
    let tenant = store.get_run(&run).await.unwrap().unwrap().tenant;
    let message = keel_store::NewMessage {
        tenant,
        from: None,
        message: json!("hi"),
        correlation_id: None,
        topic: None,
        capacity: 10,
        idempotency_key: None,
        sent_at_ms: 1,
    };
    assert_eq!(store.mailbox_send(&run, message).await.unwrap(), 1);
    assert_eq!(store.mailbox_receive(&run, None).await.unwrap().unwrap().message, json!("hi"));
    drop(store);
    migrated_file(&db);
}

/// A version-3 database (mailboxes, no audit log) is migrated to version 4 and starts an
/// empty, intact chain.
#[tokio::test]
async fn a_version_3_database_is_migrated_to_the_audit_log() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap().id;
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TABLE memory_embeddings; DROP TRIGGER memory_embedding_deleted; \
         DROP TABLE audit; DROP TABLE audit_head; DROP TABLE api_tokens; DROP TABLE tenants; \
         DROP INDEX runs_by_tenant; DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 3;",
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    assert!(store.get_run(&run).await.unwrap().is_some(), "v3 data must survive the migration");
    let empty = store.audit_verify().await.unwrap();
    assert_eq!((empty.entries, empty.broken, empty.head_hash.as_str()), (0, None, keel_core::audit::GENESIS));
    let record = keel_store::AuditRecord {
        tenant: "t".into(),
        run_id: Some(run),
        at_ms: 1,
        actor: "kernel".into(),
        action: "egress".into(),
        subject: "example.com".into(),
        outcome: "denied".into(),
        detail: json!({}),
    };
    assert_eq!(store.audit_append(vec![record]).await.unwrap(), vec![1]);
    drop(store);
    migrated_file(&db);
}

/// A version-4 database (audit log, no tenants) is migrated to version 5: its runs keep
/// their tenant and can be listed by it, and tenants and tokens can be created.
#[tokio::test]
async fn a_version_4_database_is_migrated_to_tenants() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap();
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TABLE memory_embeddings; DROP TRIGGER memory_embedding_deleted; DROP TABLE api_tokens; \
         DROP TABLE tenants; DROP INDEX runs_by_tenant; DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 4;",
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    let filter = keel_store::RunFilter { tenant: Some(run.tenant.clone()), ..Default::default() };
    assert_eq!(store.list_runs(&filter).await.unwrap().len(), 1, "v4 runs must survive, with their tenant");
    let tenant = keel_store::TenantRecord { name: "acme".into(), created_at_ms: 1, quota: json!({}) };
    store.tenant_create(tenant).await.unwrap();
    let token = keel_store::ApiTokenRecord {
        hash: "h".into(),
        prefix: "kt_1".into(),
        tenant: "acme".into(),
        created_at_ms: 1,
        label: None,
        revoked: false,
    };
    store.token_create(token.clone()).await.unwrap();
    assert_eq!(store.token_lookup("h").await.unwrap(), Some(token));
    drop(store);
    migrated_file(&db);
}

/// A version-5 database (no embeddings) keeps its records, which search by text as
/// before and gain embeddings when put again.
#[tokio::test]
async fn a_version_5_database_is_migrated_to_embeddings() {
    use keel_store::{MemoryEmbedding, MemorySearch, SearchMode};
    let db = TestDb::new();
    let store = db.open();
    store.mem_put("t", "ns", "old", json!(1), "an old record".into(), None, 1).await.unwrap();
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TRIGGER memory_embedding_deleted; DROP TABLE memory_embeddings; DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    let text = MemorySearch { query: "old".into(), ..Default::default() };
    assert_eq!(store.mem_search("t", "ns", &text, 5).await.unwrap()[0].key, "old", "v5 data must survive");
    let embedding = MemoryEmbedding { model: "m".into(), vector: vec![0.0, 1.0] };
    store
        .mem_put("t", "ns", "old", json!(1), "an old record".into(), Some(embedding.clone()), 2)
        .await
        .unwrap();
    let semantic =
        MemorySearch { query: String::new(), mode: SearchMode::Semantic, embedding: Some(embedding) };
    assert_eq!(store.mem_search("t", "ns", &semantic, 5).await.unwrap()[0].key, "old");
    drop(store);
    migrated_file(&db);
}

/// A version-6 database (before the console's indexes) keeps its runs, gains the indexes,
/// and lists them by cost.
#[tokio::test]
async fn a_version_6_database_is_migrated_to_the_consoles_indexes() {
    use keel_store::{RunFilter, RunOrder};
    let db = TestDb::new();
    let store = db.open();
    let older = store.create_run(new_run(1)).await.unwrap().id;
    let newer = store.create_run(new_run(2)).await.unwrap().id;
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch("DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs; DROP INDEX llm_calls_by_time; DROP INDEX runs_by_end; DROP TABLE trigger_fires; DROP TABLE triggers; PRAGMA user_version = 6;").unwrap();
    drop(raw);

    let store = db.open();
    let filter = RunFilter { order: RunOrder::CheapestFirst, ..RunFilter::default() };
    let listed: Vec<_> = store.list_runs(&filter).await.unwrap().into_iter().map(|run| run.id).collect();
    assert_eq!(listed, vec![older, newer], "v6 runs survive and list by cost (equal costs oldest first)");
    drop(store);
    let raw = migrated_file(&db);
    let indexes: i64 = raw
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' \
             AND name IN ('ended_runs_by_cost', 'ended_runs_by_tenant_cost', 'live_runs', \
             'llm_calls_by_time')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 4);
}

/// A version-9 database (every payload a blob, both journal indexes) keeps its journal and
/// conversations when version 10 rebuilds `journal` and `message_chain`: old entries read
/// back from their blobs, new small payloads go inline, and the indexes are the new ones
/// (the cost indexes too).
/// The version-9 tables are made by hand, with the shapes that version created.
#[tokio::test]
async fn a_version_9_database_keeps_its_blobs_when_payloads_go_inline() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap().id;
    drop(store);
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "DROP TABLE journal; DROP TABLE message_chain;
         CREATE TABLE journal (
             run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL, method TEXT NOT NULL,
             params_hash TEXT NOT NULL, params_blob TEXT NOT NULL REFERENCES blobs (hash),
             status TEXT NOT NULL, result_blob TEXT REFERENCES blobs (hash),
             error_blob TEXT REFERENCES blobs (hash), attempt INTEGER NOT NULL,
             started_at_ms INTEGER NOT NULL, finished_at_ms INTEGER,
             input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
             llm_calls INTEGER NOT NULL DEFAULT 0, tool_calls INTEGER NOT NULL DEFAULT 0,
             cost_micro_usd INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
         CREATE INDEX journal_by_method ON journal (run_id, method, seq);
         CREATE INDEX journal_by_time ON journal (method, started_at_ms);
         CREATE TABLE message_chain (hash TEXT PRIMARY KEY NOT NULL, prev TEXT,
             message_blob TEXT NOT NULL REFERENCES blobs (hash)) WITHOUT ROWID;
         DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs;
         CREATE INDEX runs_by_cost ON runs (cost_micro_usd, created_at_ms, id);
         CREATE INDEX runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id);
         PRAGMA user_version = 9;",
    )
    .unwrap();
    // One `llm.chat` entry as version 9 wrote it: params naming a one-message chain, and
    // a result, each a blob.
    let message = json!({"role": "user", "content": "hello"});
    let (params, links) = keel_store::chain::split_params(&json!({"model": "m", "messages": [message]}));
    let result = keel_store::chain::Blob::of(&json!({"model": "m", "choices": []}));
    for blob in [&links[0].message, &params, &result] {
        raw.execute(
            "INSERT INTO blobs (hash, size, bytes) VALUES (?1, ?2, ?3)",
            rusqlite::params![blob.hash, blob.bytes.len(), blob.bytes],
        )
        .unwrap();
    }
    raw.execute(
        "INSERT INTO message_chain (hash, prev, message_blob) VALUES (?1, NULL, ?2)",
        rusqlite::params![links[0].hash, links[0].message.hash],
    )
    .unwrap();
    raw.execute(
        "INSERT INTO journal (run_id, seq, method, params_hash, params_blob, status, result_blob, \
         attempt, started_at_ms, finished_at_ms, llm_calls, cost_micro_usd) \
         VALUES (?1, 1, 'llm.chat', 'h', ?2, 'ok', ?3, 1, 5, 6, 1, 7)",
        rusqlite::params![run.as_str(), params.hash, result.hash],
    )
    .unwrap();
    // And a long journal of another run, so that the rebuild writes megabytes.
    let long = keel_types::RunId::generate(2);
    raw.execute(
        "INSERT INTO runs (id, tenant, spec, state, created_at_ms, updated_at_ms, attempt) \
         VALUES (?1, 't', '{}', 'running', 2, 2, 1)",
        [long.as_str()],
    )
    .unwrap();
    raw.execute(
        "WITH RECURSIVE n(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM n WHERE seq < 20000) \
         INSERT INTO journal (run_id, seq, method, params_hash, params_blob, status, attempt, started_at_ms) \
         SELECT ?1, seq, 'tool.call', printf('%064d', seq), ?2, 'ok', 1, seq FROM n",
        rusqlite::params![long.as_str(), params.hash],
    )
    .unwrap();
    drop(raw);

    let store = db.open();
    let wal = std::fs::metadata(format!("{}-wal", db.path().display())).map_or(0, |m| m.len());
    assert!(wal < 256 * 1024, "the WAL is truncated after the rebuild, not {wal} bytes");
    assert_eq!(store.journal(&long, 0).await.unwrap().len(), 20_000);
    let journal = store.journal(&run, 0).await.unwrap();
    assert_eq!(journal.len(), 1, "the version-9 entry survives");
    assert_eq!(journal[0].params, json!({"model": "m", "messages": [message.clone()]}));
    assert_eq!(journal[0].result, Some(json!({"model": "m", "choices": []})));
    let costs = store.cost_summary(&keel_store::CostFilter { since_ms: 0, bucket_ms: 1000, tenant: None });
    let costs = costs.await.unwrap();
    assert_eq!((costs.len(), costs[0].model.as_str(), costs[0].cost_micro_usd), (1, "m", 7));
    // A new call re-sending the old message shares its node and stores its reply inline.
    let next = NewEntry {
        method: "llm.chat".to_owned(),
        params: json!({"model": "m", "messages": [message.clone(), {"role": "user", "content": "again"}]}),
        params_hash: "h2".to_owned(),
        status: EntryStatus::Ok,
        result: Some(json!({"model": "m2", "choices": []})),
        error: None,
        attempt: 1,
        started_at_ms: 7,
        finished_at_ms: Some(8),
        usage: Usage { llm_calls: 1, cost_micro_usd: 3, ..Usage::default() },
    };
    let blobs = store.stats().await.unwrap().blobs;
    store.append_entry(&run, &next).await.unwrap();
    assert_eq!(store.stats().await.unwrap().blobs, blobs, "small payloads are stored inline");
    let journal = store.journal(&run, 0).await.unwrap();
    assert_eq!((journal[1].params.clone(), journal[1].result.clone()), (next.params, next.result));
    let costs = store.cost_summary(&keel_store::CostFilter { since_ms: 0, bucket_ms: 1000, tenant: None });
    let models: Vec<_> = costs.await.unwrap().into_iter().map(|bucket| bucket.model).collect();
    assert_eq!(models, ["m", "m2"], "the inline result names its model");
    drop(store);

    let raw = migrated_file(&db);
    let indexes: Vec<String> = raw
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'journal' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(indexes, ["llm_calls_by_time"], "the table itself is its primary key");
    let cost_indexes: i64 = raw
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name LIKE '%runs_by%cost'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(cost_indexes, 2, "ended_runs_by_cost and ended_runs_by_tenant_cost, no others");
}

#[test]
fn open_refuses_a_schema_newer_than_it_knows() {
    let db = TestDb::new();
    drop(db.open());
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.pragma_update(None, "user_version", 99).unwrap();
    drop(raw);
    match SqliteStore::open(&db.path()) {
        Err(error @ Error::Backend { .. }) => {
            let message = error.to_string();
            assert!(message.contains("schema version 99"), "{message}");
        }
        Err(other) => panic!("expected a schema version error, got {other}"),
        Ok(_) => panic!("a database from a newer keel must be refused"),
    }
}

#[test]
fn open_fails_clearly_when_the_directory_is_missing() {
    let db = TestDb::new();
    let path = db.path().join("missing-dir").join("keel.db");
    match SqliteStore::open(&path) {
        Err(error) => assert!(error.to_string().contains("opening the database file"), "{error}"),
        Ok(_) => panic!("opening a file in a missing directory must fail"),
    }
}

/// A thread message and the same message in `llm.chat` params are one blob: an agent that
/// mirrors its conversation into a thread stores each message once.
#[tokio::test]
async fn thread_messages_share_blobs_with_journaled_conversations() {
    let db = TestDb::new();
    let store = db.open();
    let run = store.create_run(new_run(1)).await.unwrap().id;
    let message = json!({"role": "user", "content": "x".repeat(10_000)});
    let entry = NewEntry {
        method: "llm.chat".to_owned(),
        params: json!({"messages": [message.clone()]}),
        params_hash: "h".to_owned(),
        status: EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms: 1,
        finished_at_ms: None,
        usage: Usage::default(),
    };
    store.append_entry(&run, &entry).await.unwrap();
    let before = store.stats().await.unwrap();
    store.thread_append("t", "chat", message, None, 1).await.unwrap();
    let after = store.stats().await.unwrap();
    assert_eq!((after.blobs, after.blob_bytes), (before.blobs, before.blob_bytes));
}
