//! The Postgres backend against the conformance suite, and what is particular to a
//! database server: reconnecting, schema versions, the durability check, unreachable
//! servers, `search_path`, dropped connections, dump and restore.

use std::sync::Arc;

use keel_store::{AuditRecord, DumpItem, Error, NewEvent, PgStore, RunPatch, Store, conformance};
use keel_types::RunState;
use serde_json::json;
use tokio_postgres::GenericClient;

use crate::new_run;
use crate::pg_database::TestDatabase;

async fn connect(url: &str) -> PgStore {
    PgStore::connect(url).await.unwrap_or_else(|error| panic!("connecting to {url}: {error}"))
}

/// Waits until some connection to the test database waits for a lock (panics with
/// `never` after about 10 s).
async fn until_a_backend_waits_for_a_lock(client: &impl GenericClient, db: &TestDatabase, never: &str) {
    let waiting = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'";
    let mut attempts = 0;
    while client.query(waiting, &[&db.name()]).await.unwrap().is_empty() {
        attempts += 1;
        assert!(attempts < 1_000, "{never}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Has the server end every connection to the test database but `client`'s own.
async fn end_the_other_backends(client: &impl GenericClient, db: &TestDatabase) {
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db.name()],
        )
        .await
        .unwrap();
}

/// A raw connection to the test database, for checks and tampering outside the store.
async fn raw(db: &TestDatabase) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_suite_on_a_fresh_database() {
    let db = TestDatabase::create().await;
    conformance::run_all(Arc::new(connect(db.url()).await)).await;
}

/// The suite must also hold on a store that already has data, and on the
/// single-threaded runtime where every task interleaves on one thread.
#[tokio::test(flavor = "current_thread")]
async fn conformance_suite_twice_on_one_database_single_threaded() {
    let db = TestDatabase::create().await;
    let store: Arc<dyn Store> = Arc::new(connect(db.url()).await);
    conformance::run_all(Arc::clone(&store)).await;
    conformance::run_all(store).await;
}

/// Semantic search says how it finds its hits: always a scan, and whether the server
/// could offer pgvector instead.
#[tokio::test]
async fn semantic_search_says_it_scans() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let pgvector: bool = raw(&db)
        .await
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')", &[])
        .await
        .unwrap()
        .get(0);
    let expected = if pgvector {
        "brute-force scan (pgvector is available on this server, but Keel does not use it yet)"
    } else {
        "brute-force scan (pgvector not installed on this server)"
    };
    assert_eq!(store.semantic_index(), expected);
}

#[tokio::test]
async fn a_new_connection_sees_everything_and_seqs_continue() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let run = store.create_run(new_run(1_000)).await.unwrap().id;
    store
        .update_run(
            &run,
            Some(RunState::Created),
            RunPatch { state: Some(RunState::Running), ..RunPatch::default() },
        )
        .await
        .unwrap();
    let event = NewEvent { ts_ms: 1_003, kind: "stdout".to_owned(), data: json!("line") };
    store.append_events(&run, &[event]).await.unwrap();
    store.kv_put("scope", "key", json!({"v": 1})).await.unwrap();
    let run_before = store.get_run(&run).await.unwrap();
    let stats_before = store.stats().await.unwrap();
    drop(store);

    let store = connect(db.url()).await;
    assert_eq!(store.get_run(&run).await.unwrap(), run_before);
    assert_eq!(store.stats().await.unwrap(), stats_before);
    assert_eq!(store.kv_get("scope", "key").await.unwrap(), Some(json!({"v": 1})));
    assert_eq!(store.append_events(&run, &[]).await.unwrap(), 1, "seqs continue after a reconnect");
}

/// Version 7 moved each run's event counter out of its row: a database written by
/// version 6 (counters in `runs.events_last`) keeps its event seqs dense after the move.
#[tokio::test]
async fn migrating_to_version_7_keeps_event_seqs() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let run = store.create_run(new_run(1)).await.unwrap().id;
    let quiet = store.create_run(new_run(2)).await.unwrap().id;
    let event = |i: u64| NewEvent { ts_ms: i, kind: "stdout".to_owned(), data: json!(i) };
    assert_eq!(store.append_events(&run, &[event(1), event(2), event(3)]).await.unwrap(), 3);
    drop(store);
    // Back to version 6, as that build left it.
    let client = raw(&db).await;
    client.batch_execute(BACK_TO_VERSION_7).await.unwrap();
    client
        .batch_execute(
            "ALTER TABLE runs ADD COLUMN events_last BIGINT NOT NULL DEFAULT 0;
             UPDATE runs SET events_last = h.events_last FROM event_heads h WHERE h.run_id = runs.id;
             DROP TABLE event_heads;
             DELETE FROM keel_schema_version WHERE version = 7;",
        )
        .await
        .unwrap();

    let store = connect(db.url()).await;
    assert_eq!(store.append_events(&run, &[event(4)]).await.unwrap(), 4, "seqs continue after the move");
    assert_eq!(store.append_events(&quiet, &[event(1)]).await.unwrap(), 1);
    let seqs: Vec<u64> = store.events(&run, 0, 10).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

/// Paid calls of a live run: `calls` times an `llm.chat` intent appended, then completed
/// with a cost, as the kernel journals one.
async fn paid_calls(store: &PgStore, run: &keel_types::RunId, calls: u64) {
    for i in 0..calls {
        let seq = store
            .append_entry(run, &crate::pending_entry("llm.chat", json!({"i": i}), 1_000 + i))
            .await
            .unwrap();
        store.complete_entry(run, seq, &paid(json!({"ok": i}), 7)).await.unwrap();
    }
}

/// A provider's answer to an `llm.chat` call that cost `cost_micro_usd`.
fn paid(result: serde_json::Value, cost_micro_usd: u64) -> keel_store::Completion {
    keel_store::Completion {
        status: keel_types::EntryStatus::Ok,
        result: Some(result),
        error: None,
        finished_at_ms: 2_000,
        usage: keel_types::Usage { llm_calls: 1, cost_micro_usd, ..keel_types::Usage::default() },
        provider_served: true,
    }
}

/// A table's (updates, heap-only updates) once the server's statistics count at least
/// `updates` (each backend reports its counts about a second after it goes idle).
async fn updates_of(client: &impl GenericClient, table: &str, updates: i64) -> (i64, i64) {
    let sql = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1";
    for _ in 0..300 {
        let row = client.query_one(sql, &[&table]).await.unwrap();
        let (all, hot): (i64, i64) = (row.get(0), row.get(1));
        if all >= updates {
            return (all, hot);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the server never counted {updates} updates of {table}");
}

/// A lone journal write outside a cluster is one statement (its blobs and chain nodes in
/// it): it answers like the transaction it replaced, and a refused one stores nothing, not
/// even the payloads it brought.
#[tokio::test]
async fn a_lone_journal_write_is_one_statement_and_a_refused_one_stores_nothing() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let run = store.create_run(new_run(1)).await.unwrap().id;
    let conversation = |n: usize| json!({"messages": (0..n).map(|i| json!({"role": "user", "content": format!("message {i}")})).collect::<Vec<_>>()});
    let seq = store.append_entry(&run, &crate::pending_entry("llm.chat", conversation(3), 1)).await.unwrap();
    let completion = |text: &str| paid(json!({"text": text}), 5);
    store.complete_entry(&run, seq, &completion("first")).await.unwrap();
    let entry = &store.journal(&run, 0).await.unwrap()[0];
    assert_eq!(
        (entry.params.clone(), entry.result.clone()),
        (conversation(3), Some(json!({"text": "first"})))
    );
    assert_eq!(store.get_run(&run).await.unwrap().unwrap().usage.cost_micro_usd, 5);
    let stored = store.stats().await.unwrap();

    let missing = keel_types::RunId::generate(2);
    let refused = store.append_entry(&missing, &crate::pending_entry("llm.chat", conversation(5), 3)).await;
    assert!(matches!(refused, Err(Error::RunNotFound(_))), "{refused:?}");
    let again = store.complete_entry(&run, seq, &completion("second")).await;
    assert!(matches!(&again, Err(Error::Corrupt(text)) if text.contains("not pending")), "{again:?}");
    let unknown = store.complete_entry(&run, 99, &completion("third")).await;
    assert!(matches!(unknown, Err(Error::EntryNotFound { .. })), "{unknown:?}");
    assert_eq!(store.stats().await.unwrap(), stored, "refused writes stored no blob, node or entry");
    assert_eq!(store.get_run(&run).await.unwrap().unwrap().usage.cost_micro_usd, 5, "nor any usage");
    assert_eq!(store.journal(&run, 0).await.unwrap()[0].result, Some(json!({"text": "first"})));
}

/// Undoes version 8's migration.
const BACK_TO_VERSION_7: &str = "
    DROP INDEX ended_runs_by_cost; DROP INDEX ended_runs_by_tenant_cost; DROP INDEX live_runs;
    DROP INDEX llm_calls_by_time;
    ALTER TABLE runs DROP COLUMN ended_cost_micro_usd;
    ALTER TABLE runs RESET (fillfactor); ALTER TABLE journal RESET (fillfactor);
    CREATE INDEX runs_by_cost ON runs (cost_micro_usd, created_at_ms, id);
    CREATE INDEX runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id);
    CREATE INDEX journal_by_time ON journal (method, started_at_ms);
    CREATE INDEX journal_by_method ON journal (run_id, method, seq);
    DELETE FROM keel_schema_version WHERE version = 8;";

/// Version 8: no index holds a live run's cost, so the updates a journaled step makes to
/// the run's row are heap-only (HOT: no new index entry, no dead version for a lookup by
/// id to walk past), and so are the completions of its entries. With the run's cost in
/// `runs_by_cost` (version 7), every paid completion wrote a new entry into each of the
/// run's seven indexes.
#[tokio::test]
async fn a_live_runs_row_and_its_entries_are_updated_in_place() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let run = store.create_run(new_run(1)).await.unwrap().id;
    paid_calls(&store, &run, 40).await;
    let client = raw(&db).await;
    // 40 appends (the next seq) and 40 completions (the usage) of the run's row.
    // Not all: an update finding its page full while another backend holds the page
    // (which keeps the server from pruning it) goes to another page. With the cost indexed,
    // 40 of the 80 were not heap-only.
    let (all, hot) = updates_of(&client, "runs", 80).await;
    assert!(hot * 10 >= all * 9, "the live run's row is updated in place: {hot} of {all} updates heap-only");
    let (all, hot) = updates_of(&client, "journal", 40).await;
    assert!(hot * 10 >= all * 9, "entries are completed in place: {hot} of {all} updates heap-only");
}

/// A version-7 database (the run's cost in `runs_by_cost` and `runs_by_tenant_cost`, both
/// journal indexes) gains version 8's columns and indexes, and lists its runs by cost, the
/// live ones merged with the ended ones.
#[tokio::test]
async fn migrating_to_version_8_keeps_listing_by_cost() {
    use keel_store::{RunFilter, RunOrder};
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let (cheap, dear, live) = (
        store.create_run(new_run(1)).await.unwrap().id,
        store.create_run(new_run(2)).await.unwrap().id,
        store.create_run(new_run(3)).await.unwrap().id,
    );
    paid_calls(&store, &cheap, 1).await;
    paid_calls(&store, &dear, 3).await;
    paid_calls(&store, &live, 2).await;
    for run in [&cheap, &dear] {
        let ended = RunPatch { ended_at_ms: Some(Some(10)), ..RunPatch::default() };
        store.update_run(run, None, ended).await.unwrap();
    }
    drop(store);
    // Back to version 7, as that build left it.
    raw(&db).await.batch_execute(BACK_TO_VERSION_7).await.unwrap();

    let store = connect(db.url()).await;
    let listed = |order| {
        let store = &store;
        async move {
            let filter = RunFilter { order, ..RunFilter::default() };
            store.list_runs(&filter).await.unwrap().into_iter().map(|run| run.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(RunOrder::CostliestFirst).await, [dear.clone(), live.clone(), cheap.clone()]);
    assert_eq!(listed(RunOrder::CheapestFirst).await, [cheap, live.clone(), dear]);
    let page =
        RunFilter { order: RunOrder::CostliestFirst, limit: Some(1), offset: 1, ..RunFilter::default() };
    let page: Vec<_> = store.list_runs(&page).await.unwrap().into_iter().map(|run| run.id).collect();
    assert_eq!(page, std::slice::from_ref(&live), "a page of the merged order");
    let client = raw(&db).await;
    let ended: Vec<Option<i64>> = client
        .query("SELECT ended_cost_micro_usd FROM runs ORDER BY created_at_ms", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ended, [Some(7), Some(21), None], "an ended run's cost, none for the live one");
    let indexes: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM pg_indexes WHERE indexname IN ('ended_runs_by_cost', \
             'ended_runs_by_tenant_cost', 'live_runs', 'llm_calls_by_time', 'runs_by_cost', \
             'runs_by_tenant_cost', 'journal_by_time', 'journal_by_method')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexes, 4, "version 8's four indexes, none of version 7's four");
}

/// A store that did not write a conversation's start (another node, or before a restart)
/// finds its stored prefix in the database and writes only the new messages.
#[tokio::test]
async fn a_conversation_another_store_began_stores_only_its_new_messages() {
    let db = TestDatabase::create().await;
    let (first, second) = (connect(db.url()).await, connect(db.url()).await);
    let run = first.create_run(new_run(1)).await.unwrap().id;
    let message =
        |i: usize| json!({"role": "user", "content": format!("message {i}: {}", "x".repeat(1_000))});
    let entry =
        |messages: Vec<serde_json::Value>| crate::pending_entry("llm.chat", json!({"messages": messages}), 1);
    first.append_entry(&run, &entry((0..10).map(message).collect())).await.unwrap();
    let before = second.stats().await.unwrap();
    second.append_entry(&run, &entry((0..11).map(message).collect())).await.unwrap();
    let after = second.stats().await.unwrap();
    assert_eq!(after.blobs - before.blobs, 2, "the new message and the params blob: {before:?} {after:?}");
    assert!(after.blob_bytes - before.blob_bytes < 2_000, "{before:?} {after:?}");
    let journal = second.journal(&run, 0).await.unwrap();
    assert_eq!(journal[1].params, json!({"messages": (0..11).map(message).collect::<Vec<_>>()}));
}

/// A run's journal writes that arrive while one is in flight share one transaction
/// (rows written together share their `xmin`); when one of a batch is refused, the batch
/// is rolled back and each write runs alone, so the refusal fails alone and the others
/// still land, densely.
#[tokio::test(flavor = "current_thread")]
async fn a_runs_concurrent_journal_writes_share_a_transaction_and_fail_alone() {
    let db = TestDatabase::create().await;
    let store = Arc::new(connect(db.url()).await);
    let run = store.create_run(new_run(1)).await.unwrap().id;
    let entry = |i: u64| crate::pending_entry("tool.call", json!({"i": i}), i);
    // On this one-threaded runtime every task below queues its write before the first
    // batch is taken.
    let appends = |range: std::ops::Range<u64>| -> Vec<tokio::task::JoinHandle<u64>> {
        range
            .map(|i| {
                let (store, run) = (Arc::clone(&store), run.clone());
                tokio::spawn(async move { store.append_entry(&run, &entry(i)).await.unwrap() })
            })
            .collect()
    };
    let first = appends(0..40);
    let refused = {
        let (store, run) = (Arc::clone(&store), run.clone());
        tokio::spawn(async move {
            let completion = keel_store::Completion {
                status: keel_types::EntryStatus::Ok,
                result: Some(json!("late")),
                error: None,
                finished_at_ms: 2,
                usage: keel_types::Usage { tool_calls: 1, ..keel_types::Usage::default() },
                provider_served: false,
            };
            store.complete_entry(&run, 999, &completion).await
        })
    };
    let second = appends(40..80);
    let mut seqs = Vec::new();
    for task in first.into_iter().chain(second) {
        seqs.push(task.await.unwrap());
    }
    assert!(matches!(refused.await.unwrap(), Err(Error::EntryNotFound { seq: 999, .. })));
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=80).collect::<Vec<_>>());
    let raw = raw(&db).await;
    let transactions = |from: i64| {
        let (raw, run) = (&raw, run.as_str().to_owned());
        async move {
            let row = raw
                .query_one(
                    "SELECT count(DISTINCT xmin::text) FROM journal WHERE run_id = $1 AND seq >= $2",
                    &[&run, &from],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };
    assert_eq!(transactions(1).await, 80, "after the refusal, each write ran alone");

    let together = appends(80..130);
    for task in together {
        task.await.unwrap();
    }
    assert_eq!(transactions(81).await, 1, "50 appends queued together commit together");
    let journal = store.journal(&run, 0).await.unwrap();
    assert_eq!(journal.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=130).collect::<Vec<_>>());
    assert_eq!(store.get_run(&run).await.unwrap().unwrap().usage.tool_calls, 0, "the refusal added nothing");
}

/// Nodes starting at once on a new database migrate one at a time (the advisory lock):
/// every one connects, and the schema is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_connecting_at_once_migrate_once() {
    let db = TestDatabase::create().await;
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url().to_owned();
            tokio::spawn(async move { PgStore::connect(&url).await })
        })
        .collect();
    for connect in connects {
        let store =
            connect.await.unwrap().unwrap_or_else(|error| panic!("a concurrent connect failed: {error}"));
        assert!(store.is_empty().await.unwrap());
    }
    let versions: i64 =
        raw(&db).await.query_one("SELECT COUNT(*) FROM keel_schema_version", &[]).await.unwrap().get(0);
    assert_eq!(versions, keel_store::postgres::SCHEMA_VERSION as i64, "each migration recorded once");
}

#[tokio::test]
async fn connect_refuses_a_schema_newer_than_it_knows() {
    let db = TestDatabase::create().await;
    drop(connect(db.url()).await);
    raw(&db).await.batch_execute("INSERT INTO keel_schema_version (version) VALUES (99)").await.unwrap();
    match PgStore::connect(db.url()).await {
        Err(error @ Error::Backend { .. }) => {
            let message = error.to_string();
            let newer = format!(
                "schema version 99, newer than the {} this build",
                keel_store::postgres::SCHEMA_VERSION
            );
            assert!(message.contains(&newer), "{message}");
        }
        Err(other) => panic!("expected a schema version error, got {other}"),
        Ok(_) => panic!("a database from a newer keel must be refused"),
    }
}

/// The durability check runs at connect: a database whose sessions default to
/// `synchronous_commit=off` is refused, saying why and how to fix it.
#[tokio::test]
async fn connect_refuses_a_server_that_acknowledges_commits_before_flushing() {
    let db = TestDatabase::create().await;
    raw(&db)
        .await
        .batch_execute(&format!("ALTER DATABASE {} SET synchronous_commit = off", db.name()))
        .await
        .unwrap();
    match PgStore::connect(db.url()).await {
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains("synchronous_commit=off"), "{message}");
            assert!(message.contains("durable on return"), "{message}");
        }
        Ok(_) => panic!("a server with synchronous_commit=off must be refused"),
    }
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_and_the_password_stays_hidden() {
    // Port 1 on the loopback: nothing listens there, so the connection is refused.
    let url = "postgres://keel:s3cret@127.0.0.1:1/keel";
    match PgStore::connect(url).await {
        Err(error @ Error::Unavailable { .. }) => {
            let message = error.to_string();
            assert!(message.contains("postgres://keel:***@127.0.0.1:1/keel"), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
            assert!(message.to_lowercase().contains("refused"), "the cause: {message}");
            assert_eq!(message.matches("refused").count(), 1, "the cause once: {message}");
        }
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("nothing listens on port 1"),
    }
}

#[tokio::test]
async fn a_wrong_database_is_named_without_the_password() {
    let url = crate::pg_database::url_of_database("keel_test_missing");
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}password=s3cret");
    match PgStore::connect(&url).await {
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains("keel_test_missing") && message.contains("password=***"), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
        Ok(_) => panic!("the database does not exist"),
    }
}

#[tokio::test]
async fn a_malformed_url_is_refused_clearly() {
    match PgStore::connect("postgres://keel:s3cret@db:notaport/keel").await {
        Err(error @ Error::Backend { .. }) => {
            let message = error.to_string();
            assert!(message.contains("not a Postgres connection string"), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
        Err(other) => panic!("expected a URL error, got {other:?}"),
        Ok(_) => panic!("the port is not a number"),
    }
}

#[tokio::test]
async fn tables_live_in_the_schema_the_url_names() {
    let db = TestDatabase::create().await;
    let raw = raw(&db).await;
    raw.batch_execute("CREATE SCHEMA keel_app").await.unwrap();
    let store = connect(&db.url_with("options=-csearch_path%3Dkeel_app")).await;
    store.create_run(new_run(1)).await.unwrap();
    let row = raw
        .query_one("SELECT to_regclass('keel_app.runs')::text, to_regclass('public.runs')::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("keel_app.runs"));
    assert_eq!(row.get::<_, Option<String>>(1), None, "nothing may be created in public");
    let runs: i64 = raw.query_one("SELECT COUNT(*) FROM keel_app.runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, 1);

    match PgStore::connect(&db.url_with("options=-csearch_path%3Dmissing")).await {
        Err(error) => assert!(error.to_string().contains("CREATE SCHEMA"), "{error}"),
        Ok(_) => panic!("a search_path naming no existing schema has nowhere to create tables"),
    }
}

/// A connection the server ends (a restart, an operator's pg_terminate_backend) fails
/// the call in progress as `Unavailable`, writing nothing; the pool then opens new ones. The call is held
/// in progress deterministically: it waits for a thread's advisory lock, which a raw
/// connection holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_ended_by_the_server_is_unavailable_then_replaced() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let raw = raw(&db).await;
    raw.execute("SELECT pg_advisory_lock(hashtext('t'), hashtext('chat'))", &[]).await.unwrap();
    let append = tokio::spawn({
        let store = store.clone();
        async move { store.thread_append("t", "chat", json!("hello"), None, 1).await }
    });
    until_a_backend_waits_for_a_lock(&raw, &db, "the append never waited for the thread's lock").await;
    end_the_other_backends(&raw, &db).await;
    match append.await.unwrap() {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("a call whose connection the server ended must be Unavailable, got {other:?}"),
    }
    raw.execute("SELECT pg_advisory_unlock_all()", &[]).await.unwrap();
    // Idle connections the server also ended may each fail one call, as Unavailable, until
    // the pool has replaced them.
    let mut attempts = 0;
    let index = loop {
        match store.thread_append("t", "chat", json!("again"), None, 2).await {
            Ok(index) => break index,
            Err(Error::Unavailable { .. }) if attempts < 40 => attempts += 1,
            Err(other) => panic!("the pool must reconnect, got {other:?}"),
        }
    };
    assert_eq!(index, 0, "the failed append wrote nothing");
}

/// A batch of a run's journal writes whose connection the server ends answers every
/// write of it with `Unavailable` at once; writing each again alone would wait for the
/// database once per write (here, forever: the run's row stays locked meanwhile).
#[tokio::test(flavor = "current_thread")]
async fn a_batch_cut_off_from_the_database_fails_all_at_once_and_writes_nothing() {
    let db = TestDatabase::create().await;
    let store = Arc::new(connect(db.url()).await);
    let run = store.create_run(new_run(1)).await.unwrap().id;
    let mut raw = raw(&db).await;
    let holder = raw.transaction().await.unwrap();
    holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&run.as_str()]).await.unwrap();
    // On this one-threaded runtime all ten queue before the batch is taken.
    let appends: Vec<_> = (0..10)
        .map(|i| {
            let (store, run) = (Arc::clone(&store), run.clone());
            tokio::spawn(async move {
                store.append_entry(&run, &crate::pending_entry("tool.call", json!({"i": i}), i)).await
            })
        })
        .collect();
    until_a_backend_waits_for_a_lock(&holder, &db, "the batch never waited for the run's row").await;
    end_the_other_backends(&holder, &db).await;
    for append in appends {
        let answered = tokio::time::timeout(std::time::Duration::from_secs(60), append).await;
        match answered.expect("a write of the cut-off batch waited for the database again").unwrap() {
            Err(Error::Unavailable { .. }) => {}
            other => panic!("every write of a batch cut off must be Unavailable, got {other:?}"),
        }
    }
    holder.rollback().await.unwrap();
    let mut attempts = 0;
    let journal = loop {
        match store.journal(&run, 0).await {
            Ok(journal) => break journal,
            Err(Error::Unavailable { .. }) => attempts += 1,
            Err(other) => panic!("the pool must reconnect, got {other:?}"),
        }
        assert!(attempts < 2_000);
    };
    assert!(journal.is_empty(), "the batch wrote nothing: {journal:?}");
}

#[tokio::test]
async fn the_audit_table_refuses_update_delete_and_truncate() {
    let db = TestDatabase::create().await;
    let store = connect(db.url()).await;
    let record = AuditRecord {
        tenant: "t".to_owned(),
        run_id: None,
        at_ms: 1,
        actor: "kernel".to_owned(),
        action: "egress".to_owned(),
        subject: "host".to_owned(),
        outcome: "allowed".to_owned(),
        detail: json!({}),
    };
    store.audit_append(vec![record]).await.unwrap();
    let raw = raw(&db).await;
    for sql in ["UPDATE audit SET outcome = 'denied'", "DELETE FROM audit", "TRUNCATE audit"] {
        let error = raw.batch_execute(sql).await.expect_err(sql);
        let message = error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_owned());
        assert!(message.contains("append-only"), "{sql}: {message}");
    }
    assert_eq!(store.audit_verify().await.unwrap().broken, None);
}

/// Everything the conformance suite writes, dumped, restored into an empty database in
/// batches, and dumped again, is the same sequence; the copy is a working store (seqs and
/// the audit chain continue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_restore_copy_a_store_exactly() {
    let source_db = TestDatabase::create().await;
    let source = Arc::new(connect(source_db.url()).await);
    conformance::run_all(Arc::clone(&source) as Arc<dyn Store>).await;
    let original = dump_all(&*source).await;
    assert!(original.len() > 1_000, "the suite writes plenty: {}", original.len());

    let target_db = TestDatabase::create().await;
    let target = connect(target_db.url()).await;
    assert!(target.is_empty().await.unwrap());
    for batch in original.chunks(keel_store::dump::DUMP_BATCH) {
        target.restore(batch.to_vec()).await.unwrap();
    }
    assert!(!target.is_empty().await.unwrap());
    let copy = dump_all(&target).await;
    assert_eq!(copy.len(), original.len());
    for (index, (a, b)) in original.iter().zip(&copy).enumerate() {
        assert_eq!(a, b, "item {index} differs");
    }
    assert_eq!(target.stats().await.unwrap(), source.stats().await.unwrap());
    let verified = target.audit_verify().await.unwrap();
    assert_eq!((verified.broken, verified.entries), (None, source.audit_verify().await.unwrap().entries));

    let run = original
        .iter()
        .find_map(|item| match item {
            DumpItem::Entry { run, entry } if entry.seq > 1 => Some(run.clone()),
            _ => None,
        })
        .expect("a run with a journal");
    let last = source.journal(&run, 0).await.unwrap().last().map(|entry| entry.seq).unwrap();
    let entry = keel_store::NewEntry {
        method: "after.restore".to_owned(),
        params: json!({}),
        params_hash: "h".to_owned(),
        status: keel_types::EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms: 1,
        finished_at_ms: None,
        usage: keel_types::Usage::default(),
    };
    assert_eq!(target.append_entry(&run, &entry).await.unwrap(), last + 1, "the journal continues");

    let conflict = target.restore(original[..1].to_vec()).await;
    assert!(
        matches!(conflict, Err(Error::Backend { .. })),
        "an item already there is an error: {conflict:?}"
    );
}

async fn dump_all(store: &dyn Store) -> Vec<DumpItem> {
    let (sink, mut batches) = tokio::sync::mpsc::channel(4);
    let (dumped, items) = tokio::join!(store.dump(sink), async {
        let mut items = Vec::new();
        while let Some(batch) = batches.recv().await {
            assert!(batch.len() <= keel_store::dump::DUMP_BATCH);
            items.extend(batch);
        }
        items
    });
    dumped.unwrap();
    items
}

/// The conformance round trip between every pair of backends: an SQLite installation
/// moved to Postgres (what `keel migrate` does), back, and Postgres to Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_restore_between_backends() {
    let file = crate::TestDb::new();
    let to_postgres = TestDatabase::create().await;
    conformance::dump_and_restore(Arc::new(file.open()), Arc::new(connect(to_postgres.url()).await)).await;
    let from_postgres = TestDatabase::create().await;
    let back = crate::TestDb::new();
    conformance::dump_and_restore(Arc::new(connect(from_postgres.url()).await), Arc::new(back.open())).await;
    let (one, two) = (TestDatabase::create().await, TestDatabase::create().await);
    conformance::dump_and_restore(Arc::new(connect(one.url()).await), Arc::new(connect(two.url()).await))
        .await;
}
