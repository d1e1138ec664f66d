//! Conformance checks of payload storage (each payload and each conversation message
//! stored once, params read back exactly), the event log and the kv space.

use keel_types::{EntryStatus, RunId, Usage};
use serde_json::{Value, json};

use super::{Must, complete_entry, fresh_run, now_ms, ok_completion, pending_entry};
use crate::{NewEvent, Seq, Store};

/// A conversation re-sent whole on every call, one message longer each time, stores each
/// message once: 100 calls grow blob storage by a small multiple of the conversation's own
/// size, not by the sum of every call's (quadratic) params.
pub async fn blobs_store_each_message_once(store: &dyn Store) {
    let run = fresh_run(store).await;
    let mut messages: Vec<Value> = Vec::new();
    let mut conversation_bytes = 0u64;
    let before = store.stats().await.must("stats");
    for turn in 0..100 {
        let message = json!({"role": "user", "content": format!("{run} turn {turn}: {}", "m".repeat(300))});
        conversation_bytes += message.to_string().len() as u64;
        messages.push(message);
        let params = json!({"messages": messages, "model": "m"});
        store.append_entry(&run, &pending_entry("llm.chat", params)).await.must("append_entry");
    }
    let grown = store.stats().await.must("stats").blob_bytes - before.blob_bytes;
    assert!(
        grown < 2 * conversation_bytes,
        "100 calls re-sending a {conversation_bytes}-byte conversation grew blob storage by {grown} bytes"
    );
    let journal = store.journal(&run, 0).await.must("journal");
    for (turn, entry) in journal.iter().enumerate() {
        assert_eq!(entry.params, json!({"messages": messages[..=turn], "model": "m"}), "entry {}", entry.seq);
    }
    let latest = store.latest_entry(&run, "llm.chat").await.must("latest_entry");
    assert_eq!(latest, None, "pending entries are not `latest`");
}

/// Params read back exactly as appended, whatever their shape (including shapes a backend
/// might store specially).
pub async fn params_read_back_exactly(store: &dyn Store) {
    let run = fresh_run(store).await;
    let shapes = [
        json!({"messages": []}),
        json!({"messages": "not an array"}),
        json!({"messages": [1, null, "x", {"role": "user"}], "other": {"messages": [1]}}),
        json!({"$keel_messages": {"fields": {}, "chain": null}}),
        json!({"$keel_messages": 1, "messages": [{"a": 1}]}),
        json!({"$keel_messages": {"fields": {"x": 1}, "chain": "0000"}}),
        json!([{"messages": [1]}]),
        json!("messages"),
        json!({"state": {"messages": [1, 2]}}),
    ];
    for shape in &shapes {
        let entry = complete_entry("any.method", shape.clone(), EntryStatus::Ok, Usage::default());
        store.append_entry(&run, &entry).await.must("append_entry");
    }
    let journal = store.journal(&run, 0).await.must("journal");
    let read: Vec<&Value> = journal.iter().map(|entry| &entry.params).collect();
    assert_eq!(read, shapes.iter().collect::<Vec<_>>(), "params must read back exactly");
    let latest = store.latest_entry(&run, "any.method").await.must("latest_entry").expect("an ok entry");
    assert_eq!(latest.params, shapes[shapes.len() - 1]);
}

/// The same payload appended many times is stored once: `stats()` grows by about one
/// payload, not a hundred, for params and for results alike.
pub async fn blobs_store_each_payload_once(store: &dyn Store) {
    const COPIES: u64 = 100;
    let run = fresh_run(store).await;
    // The run id makes the payload new to this store, so its first copy must be stored.
    let conversation = json!({
        "run": run.as_str(),
        "messages": (0..200)
            .map(|turn| json!({"role": "user", "content": format!("turn {turn}: {}", "x".repeat(400))}))
            .collect::<Vec<_>>(),
    });
    let payload_len = conversation.to_string().len() as u64;

    let before = store.stats().await.must("stats");
    for _ in 0..COPIES {
        store.append_entry(&run, &pending_entry("llm.chat", conversation.clone())).await.must("append_entry");
    }
    let after = store.stats().await.must("stats");
    assert!(
        after.journal_entries >= before.journal_entries + COPIES,
        "stats must count journal entries: {before:?} then {after:?}"
    );
    let grown = after.blob_bytes - before.blob_bytes;
    assert!(
        grown > 0 && grown < 2 * payload_len,
        "{COPIES} copies of a {payload_len}-byte payload grew blob storage by {grown} bytes; \
         it must be stored once"
    );
    // A backend may store each message of `messages` as a blob of its own (see
    // `blobs_store_each_message_once`), so up to 200 more.
    assert!(
        after.blobs - before.blobs <= 2 + 200,
        "{COPIES} copies of one payload added {} blobs",
        after.blobs - before.blobs
    );

    let reply = json!({"run": run.as_str(), "reply": "y".repeat(50_000)});
    let reply_len = reply.to_string().len() as u64;
    let before = store.stats().await.must("stats");
    for seq in 1..=COPIES {
        store
            .complete_entry(&run, seq, &ok_completion(reply.clone(), Usage::default(), true))
            .await
            .must("complete_entry");
    }
    let after = store.stats().await.must("stats");
    let grown = after.blob_bytes - before.blob_bytes;
    assert!(
        grown > 0 && grown < 2 * reply_len,
        "{COPIES} copies of a {reply_len}-byte result grew blob storage by {grown} bytes; \
         it must be stored once"
    );

    let journal = store.journal(&run, 0).await.must("journal");
    assert_eq!(journal.len() as u64, COPIES);
    assert!(
        journal.iter().all(|entry| entry.params == conversation && entry.result.as_ref() == Some(&reply)),
        "every entry must read back its full payloads"
    );
}

/// Event seqs are per run and dense from 1; `append_events` returns the last seq (the
/// current one for an empty batch); `events(after, limit)` pages in order.
pub async fn events_append_and_page(store: &dyn Store) {
    let run = fresh_run(store).await;
    let other = fresh_run(store).await;
    assert_eq!(store.append_events(&run, &[]).await.must("append_events"), 0, "an empty log's last seq is 0");
    let events: Vec<NewEvent> = (1..=5)
        .map(|n| NewEvent {
            ts_ms: 1_000 + n,
            kind: if n % 2 == 0 { "stderr" } else { "stdout" }.to_owned(),
            data: json!({"line": format!("line {n}"), "n": n}),
        })
        .collect();
    assert_eq!(store.append_events(&run, &events[..3]).await.must("append_events"), 3);
    assert_eq!(store.append_events(&run, &events[3..]).await.must("append_events"), 5);
    assert_eq!(
        store.append_events(&run, &[]).await.must("append_events"),
        5,
        "appending no events must return the current last seq"
    );
    assert_eq!(
        store.append_events(&other, &events[..1]).await.must("append_events"),
        1,
        "event seqs must be per run"
    );

    let all = store.events(&run, 0, 100).await.must("events");
    assert_eq!(all.len(), 5);
    for (stored, (seq, appended)) in all.iter().zip((1..).zip(&events)) {
        assert_eq!(stored.seq, seq, "event seqs must be dense from 1");
        assert_eq!(
            (stored.ts_ms, &stored.kind, &stored.data),
            (appended.ts_ms, &appended.kind, &appended.data),
            "an event must read back as appended"
        );
    }
    for (after, limit, expected) in
        [(0, 2, vec![1, 2]), (2, 2, vec![3, 4]), (4, 10, vec![5]), (5, 10, vec![]), (0, 0, vec![])]
    {
        let seqs: Vec<Seq> =
            store.events(&run, after, limit).await.must("events").iter().map(|event| event.seq).collect();
        assert_eq!(seqs, expected, "events(after = {after}, limit = {limit})");
    }
}

/// `kv_put` writes and overwrites, `kv_get` reads, and scopes do not see each other.
pub async fn kv_put_get_and_scopes(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let scope = format!("conformance/{unique}/a");
    let other_scope = format!("conformance/{unique}/b");
    assert_eq!(store.kv_get(&scope, "k").await.must("kv_get"), None);

    store.kv_put(&scope, "k", json!({"v": 1})).await.must("kv_put");
    assert_eq!(store.kv_get(&scope, "k").await.must("kv_get"), Some(json!({"v": 1})));
    store.kv_put(&scope, "k", json!("two")).await.must("kv_put");
    assert_eq!(store.kv_get(&scope, "k").await.must("kv_get"), Some(json!("two")), "kv_put must overwrite");
    assert_eq!(
        store.kv_get(&other_scope, "k").await.must("kv_get"),
        None,
        "a key must not leak into another scope"
    );
    store.kv_put(&other_scope, "k", json!([3])).await.must("kv_put");
    assert_eq!(
        store.kv_get(&scope, "k").await.must("kv_get"),
        Some(json!("two")),
        "writing another scope must not change this one"
    );
    store.kv_put(&scope, "null", Value::Null).await.must("kv_put");
    assert_eq!(
        store.kv_get(&scope, "null").await.must("kv_get"),
        Some(Value::Null),
        "a stored JSON null must read back as Some(null), not as a missing key"
    );
}

/// `kv_put_unflushed` is a `kv_put` in all a reader sees: read back at once, by one read
/// or many, overwriting and overwritten by flushed puts, in its scope only, and written
/// many at once beside flushed writes (which share commits with it on SQLite).
pub async fn kv_put_unflushed_reads_back_like_kv_put(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let scope = format!("conformance/{unique}/unflushed");
    store.kv_put_unflushed(&scope, "k", json!({"v": 1})).await.must("kv_put_unflushed");
    assert_eq!(store.kv_get(&scope, "k").await.must("kv_get"), Some(json!({"v": 1})), "seen on return");
    store.kv_put(&scope, "k", json!("flushed")).await.must("kv_put");
    store.kv_put_unflushed(&scope, "k", json!("unflushed")).await.must("kv_put_unflushed");
    assert_eq!(store.kv_get(&scope, "k").await.must("kv_get"), Some(json!("unflushed")), "it overwrites");
    store.kv_put(&scope, "k", json!("flushed again")).await.must("kv_put");
    assert_eq!(
        store.kv_get(&scope, "k").await.must("kv_get"),
        Some(json!("flushed again")),
        "and is overwritten"
    );
    let other = format!("conformance/{unique}/unflushed-other");
    assert_eq!(store.kv_get(&other, "k").await.must("kv_get"), None, "in its scope only");

    let scope = scope.as_str();
    let writes = (0..20).map(|i| async move {
        let key = format!("many-{i}");
        if i % 2 == 0 {
            store.kv_put_unflushed(scope, &key, json!(i)).await.must("kv_put_unflushed");
        } else {
            store.kv_put(scope, &key, json!(i)).await.must("kv_put");
        }
    });
    futures_util::future::join_all(writes).await;
    let keys: Vec<_> = (0..20).map(|i| (scope.to_owned(), format!("many-{i}"))).collect();
    let values = store.kv_get_many(&keys).await.must("kv_get_many");
    assert_eq!(values, (0..20).map(|i| Some(json!(i))).collect::<Vec<_>>(), "every put, flushed or not");
}

/// `kv_chain` follows each value's link to the next key of its scope, in order, up to its
/// limit; it stops at a value without a link (or whose link is not a string), before a
/// missing key, and never crosses into another scope.
pub async fn kv_chain_follows_links_in_one_scope(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let scope = format!("conformance/{unique}/chain");
    let other = format!("conformance/{unique}/chain-other");
    let link = ["response", "previous_response_id"];
    let record =
        |n: u32, previous: Option<&str>| json!({"n": n, "response": {"previous_response_id": previous}});
    // r1 <- r2 <- r3 <- r4 <- r5, and r6 links to r0, which is missing.
    store.kv_put(&scope, "r1", record(1, None)).await.must("kv_put");
    for n in 2..=5 {
        let previous = format!("r{}", n - 1);
        store.kv_put(&scope, &format!("r{n}"), record(n, Some(&previous))).await.must("kv_put");
    }
    store.kv_put(&scope, "r6", record(6, Some("r0"))).await.must("kv_put");
    // In another scope, the missing key exists; the chain must not find it there.
    store.kv_put(&other, "r0", record(0, None)).await.must("kv_put");
    store.kv_put(&scope, "odd", json!({"response": {"previous_response_id": 5}})).await.must("kv_put");

    let numbers =
        |chain: Vec<Value>| chain.iter().map(|value| value["n"].as_u64().unwrap()).collect::<Vec<_>>();
    let chain = |key: &'static str, limit: usize| {
        let scope = scope.clone();
        async move { store.kv_chain(&scope, key, &link, limit).await.must("kv_chain") }
    };
    assert_eq!(numbers(chain("r5", 100).await), [5, 4, 3, 2, 1], "newest first, to the end of the chain");
    assert_eq!(numbers(chain("r5", 3).await), [5, 4, 3], "at most the limit");
    assert_eq!(chain("r5", 0).await, Vec::<Value>::new(), "a limit of none reads none");
    assert_eq!(numbers(chain("r1", 100).await), [1], "a value without a link ends it");
    assert_eq!(numbers(chain("r6", 100).await), [6], "it stops before a missing key, in its own scope");
    assert_eq!(chain("odd", 100).await.len(), 1, "a link that is not a string ends it");
    assert_eq!(chain("nothing", 100).await, Vec::<Value>::new(), "no value at the key, none");
}

/// `kv_get_many` answers every pair in the order asked: keys of several scopes, a missing
/// key, a stored null and a pair asked twice; nothing asked, nothing answered.
pub async fn kv_get_many_answers_each_pair_in_order(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let a = format!("conformance/{unique}/many-a");
    let b = format!("conformance/{unique}/many-b");
    store.kv_put(&a, "k", json!({"v": 1})).await.must("kv_put");
    store.kv_put(&b, "k", json!([2])).await.must("kv_put");
    store.kv_put(&a, "null", Value::Null).await.must("kv_put");
    let pair = |scope: &str, key: &str| (scope.to_owned(), key.to_owned());
    let asked = [
        pair(&b, "k"),
        pair(&a, "missing"),
        pair(&a, "k"),
        pair(&a, "null"),
        pair(&b, "k"),
        pair(&b, "null"),
    ];
    assert_eq!(
        store.kv_get_many(&asked).await.must("kv_get_many"),
        vec![Some(json!([2])), None, Some(json!({"v": 1})), Some(Value::Null), Some(json!([2])), None],
        "one answer per pair, in the order asked"
    );
    assert_eq!(store.kv_get_many(&[]).await.must("kv_get_many"), Vec::<Option<Value>>::new());
}
