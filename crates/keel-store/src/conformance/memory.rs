//! Conformance checks of memory: conversation threads and long-term records with text,
//! semantic and hybrid search.

use std::sync::Arc;

use keel_types::RunId;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{Must, join_all, now_ms};
use crate::Store;

/// Appends get dense indexes from 0, reads are oldest first, `last` windows from the end,
/// and threads are scoped by tenant and id.
pub async fn threads_append_read_and_window(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let tenant = format!("conformance-{unique}");
    let thread = "chat";
    assert!(store.thread_read(&tenant, thread, None).await.must("thread_read").is_empty());
    for i in 0..5u64 {
        let message = json!({"role": "user", "content": format!("message {i}")});
        let index = store.thread_append(&tenant, thread, message, None, 100 + i).await.must("thread_append");
        assert_eq!(index, i, "thread_append must return dense indexes from 0");
    }
    let all = store.thread_read(&tenant, thread, None).await.must("thread_read");
    assert_eq!(all.iter().map(|m| m.index).collect::<Vec<_>>(), [0, 1, 2, 3, 4], "oldest first");
    assert_eq!(all[3].message, json!({"role": "user", "content": "message 3"}));
    assert_eq!(all[3].appended_at_ms, 103);
    let tail = store.thread_read(&tenant, thread, Some(2)).await.must("thread_read last 2");
    assert_eq!(tail.iter().map(|m| m.index).collect::<Vec<_>>(), [3, 4], "`last` keeps the newest, in order");
    assert!(store.thread_read(&tenant, thread, Some(0)).await.must("thread_read last 0").is_empty());
    assert_eq!(store.thread_read(&tenant, thread, Some(50)).await.must("thread_read").len(), 5);
    let other_tenant = format!("{tenant}-other");
    assert!(
        store.thread_read(&other_tenant, thread, None).await.must("thread_read").is_empty(),
        "a thread must not be visible to another tenant"
    );
    assert!(store.thread_read(&tenant, "other", None).await.must("thread_read").is_empty());
    let index = store.thread_append(&other_tenant, thread, json!({"x": 1}), None, 1).await.must("append");
    assert_eq!(index, 0, "another tenant's thread of the same id is a separate thread");
}

/// An append repeated with the same idempotency key writes nothing and answers the first
/// index; the same message appended to many threads is one blob.
pub async fn threads_idempotent_append_and_blobs(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let tenant = format!("conformance-{unique}");
    let message = json!({"role": "assistant", "content": format!("unique reply {unique}")});
    let first = store
        .thread_append(&tenant, "t", message.clone(), Some("run:1"), 1)
        .await
        .must("thread_append with a key");
    store.thread_append(&tenant, "t", json!("between"), None, 2).await.must("thread_append");
    let again = store
        .thread_append(&tenant, "t", message.clone(), Some("run:1"), 3)
        .await
        .must("thread_append retried");
    assert_eq!(again, first, "a retried append must answer the index of the first");
    assert_eq!(store.thread_read(&tenant, "t", None).await.must("thread_read").len(), 2, "no duplicate");
    let before = store.stats().await.must("stats");
    for thread in ["a", "b", "c"] {
        store.thread_append(&tenant, thread, message.clone(), None, 4).await.must("thread_append");
    }
    let after = store.stats().await.must("stats");
    assert_eq!(after.blobs, before.blobs, "a message already stored must not be stored again");
    assert_eq!(after.blob_bytes, before.blob_bytes);
}

/// Records are written, overwritten, read and deleted, scoped by tenant and namespace.
pub async fn memory_put_get_delete_and_scopes(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let tenant = format!("conformance-{unique}");
    assert_eq!(store.mem_get(&tenant, "ns", "k").await.must("mem_get"), None);
    store.mem_put(&tenant, "ns", "k", json!({"v": 1}), "one".into(), None, 10).await.must("mem_put");
    let record = store.mem_get(&tenant, "ns", "k").await.must("mem_get").expect("the record just put");
    assert_eq!(
        (
            record.namespace.as_str(),
            record.key.as_str(),
            &record.value,
            record.text.as_str(),
            record.updated_at_ms
        ),
        ("ns", "k", &json!({"v": 1}), "one", 10)
    );
    store.mem_put(&tenant, "ns", "k", Value::Null, "two".into(), None, 11).await.must("mem_put overwrite");
    let record = store.mem_get(&tenant, "ns", "k").await.must("mem_get").expect("overwritten record");
    assert_eq!((record.value, record.text.as_str()), (Value::Null, "two"), "mem_put must overwrite");
    assert_eq!(store.mem_get(&tenant, "other", "k").await.must("mem_get"), None, "namespaces are separate");
    let other_tenant = format!("{tenant}-other");
    assert_eq!(store.mem_get(&other_tenant, "ns", "k").await.must("mem_get"), None, "tenants are separate");
    store.mem_put(&other_tenant, "ns", "k", json!(2), "x".into(), None, 1).await.must("mem_put");
    assert!(!store.mem_delete(&tenant, "other", "k", None).await.must("mem_delete"), "nothing to delete");
    assert!(store.mem_delete(&tenant, "ns", "k", None).await.must("mem_delete"), "the record existed");
    assert!(
        !store.mem_delete(&tenant, "ns", "k", None).await.must("mem_delete"),
        "deleting twice finds nothing"
    );
    assert_eq!(store.mem_get(&tenant, "ns", "k").await.must("mem_get"), None);
    assert!(
        store.mem_get(&other_tenant, "ns", "k").await.must("mem_get").is_some(),
        "deleting must not touch another tenant's record"
    );
    store.mem_put(&tenant, "ns", "k", json!(3), "three".into(), None, 12).await.must("mem_put");
    assert!(store.mem_delete(&tenant, "ns", "k", Some("run:7")).await.must("mem_delete with a key"));
    assert!(
        store.mem_delete(&tenant, "ns", "k", Some("run:7")).await.must("mem_delete retried"),
        "a retried delete must answer what the first answered"
    );
    assert!(!store.mem_delete(&tenant, "ns", "k", Some("run:8")).await.must("mem_delete, another key"));
    assert!(
        !store.mem_delete(&other_tenant, "ns", "nothing", Some("run:7")).await.must("mem_delete"),
        "idempotency keys are per tenant"
    );
}

/// Search finds records by words of their text, most relevant first, never across
/// namespaces or tenants, follows overwrites and deletes, and reads punctuation as text.
pub async fn memory_search_ranks_and_scopes(store: &dyn Store) {
    let unique = RunId::generate(now_ms());
    let tenant = format!("conformance-{unique}");
    let put = |ns: &'static str, key: &'static str, text: &'static str| {
        let tenant = tenant.clone();
        async move { store.mem_put(&tenant, ns, key, json!(key), text.into(), None, 1).await.must("mem_put") }
    };
    put("docs", "rust", "Rust is a language. Rust rust rust: ownership and borrowing.").await;
    put("docs", "python", "Python is a language with a garbage collector.").await;
    put("docs", "cooking", "A recipe for bread: flour, water, salt.").await;
    put("other", "rust2", "rust everywhere").await;
    store
        .mem_put(&format!("{tenant}-x"), "docs", "leak", json!(1), "rust".into(), None, 1)
        .await
        .must("mem_put");

    let hits = store.mem_search(&tenant, "docs", &text_query("rust"), 10).await.must("mem_search");
    assert_eq!(hits.iter().map(|h| h.key.as_str()).collect::<Vec<_>>(), ["rust"], "scoped hits only");
    assert!(
        hits[0].snippet.contains("[Rust]") || hits[0].snippet.contains("[rust]"),
        "{:?}",
        hits[0].snippet
    );
    // Ranking statistics may span the whole index, so the words here are ones no other
    // record of this check shares.
    let hits = store
        .mem_search(&tenant, "docs", &text_query("garbage bread collector"), 10)
        .await
        .must("mem_search");
    let keys: Vec<&str> = hits.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, ["python", "cooking"], "any word matches; the best match ranks first");
    assert!(hits[0].score > hits[1].score, "scores must be higher for better hits");
    assert_eq!(
        store.mem_search(&tenant, "docs", &text_query("language"), 1).await.must("mem_search").len(),
        1,
        "limit"
    );
    let hits = store
        .mem_search(&tenant, "docs", &text_query("\"AND OR * ("), 10)
        .await
        .must("FTS syntax is plain words");
    assert_eq!(hits.iter().map(|h| h.key.as_str()).collect::<Vec<_>>(), ["rust"], "`and` is a plain word");
    assert!(store.mem_search(&tenant, "docs", &text_query(""), 10).await.must("empty query").is_empty());
    assert_eq!(
        store.mem_search(&tenant, "docs", &text_query("flour)"), 10).await.must("mem_search")[0].key,
        "cooking",
        "punctuation around words is ignored"
    );
    store
        .mem_put(&tenant, "docs", "cooking", json!(0), "nothing edible".into(), None, 2)
        .await
        .must("mem_put");
    assert!(
        store.mem_search(&tenant, "docs", &text_query("flour"), 10).await.must("mem_search").is_empty(),
        "overwrite"
    );
    assert_eq!(
        store.mem_search(&tenant, "docs", &text_query("edible"), 10).await.must("mem_search").len(),
        1
    );
    store.mem_delete(&tenant, "docs", "cooking", None).await.must("mem_delete");
    assert!(
        store.mem_search(&tenant, "docs", &text_query("edible"), 10).await.must("mem_search").is_empty(),
        "delete"
    );
}

fn text_query(query: &str) -> crate::MemorySearch {
    crate::MemorySearch { query: query.to_owned(), ..Default::default() }
}

fn embedding(model: &str, vector: &[f32]) -> crate::MemoryEmbedding {
    crate::MemoryEmbedding { model: model.to_owned(), vector: vector.to_vec() }
}

/// Semantic search ranks by cosine similarity to the query embedding, compares only
/// vectors of the query's model and length, follows overwrites (a put without an
/// embedding drops the old one) and deletes; hybrid fuses the text and semantic rankings
/// so a record high in both wins over one that tops only one.
pub async fn memory_semantic_and_hybrid_search(store: &dyn Store) {
    use crate::{MemorySearch, SearchMode};
    let unique = RunId::generate(now_ms());
    let tenant = format!("conformance-{unique}");
    let put = |key: &'static str, text: &'static str, vector: Option<&[f32]>| {
        let tenant = tenant.clone();
        let embedding = vector.map(|v| embedding("m1", v));
        async move {
            store.mem_put(&tenant, "sem", key, json!(key), text.into(), embedding, 1).await.must("mem_put")
        }
    };
    put("north", "pointing north", Some(&[1.0, 0.0, 0.0])).await;
    put("northeast", "pointing northeast and a zebra", Some(&[0.7, 0.7, 0.0])).await;
    put("east", "pointing east", Some(&[0.0, 2.0, 0.0])).await;
    put("plain", "no embedding at all, zebra zebra zebra", None).await;
    store
        .mem_put(
            &tenant,
            "sem",
            "other-model",
            json!(0),
            "x".into(),
            Some(embedding("m2", &[1.0, 0.0, 0.0])),
            1,
        )
        .await
        .must("mem_put");
    store
        .mem_put(&tenant, "sem", "short", json!(0), "x".into(), Some(embedding("m1", &[1.0, 0.0])), 1)
        .await
        .must("mem_put");
    store
        .mem_put(
            &format!("{tenant}-x"),
            "sem",
            "leak",
            json!(0),
            "x".into(),
            Some(embedding("m1", &[1.0, 0.0, 0.0])),
            1,
        )
        .await
        .must("mem_put");

    let semantic = |vector: &[f32], mode: SearchMode, query: &str| MemorySearch {
        query: query.to_owned(),
        mode,
        embedding: Some(embedding("m1", vector)),
    };
    let keys = |hits: &[crate::MemoryHit]| hits.iter().map(|h| h.key.clone()).collect::<Vec<_>>();
    let hits = store
        .mem_search(&tenant, "sem", &semantic(&[0.9, 0.1, 0.0], SearchMode::Semantic, ""), 10)
        .await
        .must("semantic");
    assert_eq!(
        keys(&hits),
        ["north", "northeast", "east"],
        "by cosine; same model and length; this tenant only"
    );
    assert!((hits[0].score - 0.9939).abs() < 1e-3, "the score is the cosine similarity: {}", hits[0].score);
    assert!(hits[2].score < 0.2 && hits[0].score > hits[1].score);
    assert_eq!(hits[0].snippet, "pointing north");
    let hits = store
        .mem_search(&tenant, "sem", &semantic(&[0.9, 0.1, 0.0], SearchMode::Semantic, ""), 1)
        .await
        .must("semantic");
    assert_eq!(keys(&hits), ["north"], "limit");
    let none = MemorySearch { mode: SearchMode::Semantic, ..text_query("north") };
    assert!(
        store.mem_search(&tenant, "sem", &none, 10).await.must("semantic").is_empty(),
        "no query embedding"
    );
    let zero = semantic(&[0.0, 0.0, 0.0], SearchMode::Semantic, "");
    assert!(store.mem_search(&tenant, "sem", &zero, 10).await.must("semantic").is_empty(), "a zero query");

    // Text alone ranks `plain` first (three zebras); semantic alone `north`. `northeast`
    // is second in both, so fusion puts it first.
    let text = store.mem_search(&tenant, "sem", &text_query("zebra"), 10).await.must("text");
    assert_eq!(keys(&text), ["plain", "northeast"]);
    let hybrid = semantic(&[1.0, 0.0, 0.0], SearchMode::Hybrid, "zebra");
    let hits = store.mem_search(&tenant, "sem", &hybrid, 10).await.must("hybrid");
    assert_eq!(keys(&hits)[0], "northeast", "{hits:?}");
    assert_eq!(hits.len(), 4, "the union of both rankings: {hits:?}");
    let text_only = MemorySearch { mode: SearchMode::Hybrid, ..text_query("zebra") };
    assert_eq!(
        keys(&store.mem_search(&tenant, "sem", &text_only, 10).await.must("hybrid")),
        ["plain", "northeast"]
    );

    put("north", "pointing north, no vector now", None).await;
    put("east", "pointing east", Some(&[1.0, 0.0, 0.0])).await;
    let hits = store
        .mem_search(&tenant, "sem", &semantic(&[1.0, 0.0, 0.0], SearchMode::Semantic, ""), 10)
        .await
        .must("semantic");
    assert_eq!(keys(&hits), ["east", "northeast"], "an overwrite replaces or drops the embedding");
    store.mem_delete(&tenant, "sem", "east", None).await.must("mem_delete");
    let hits = store
        .mem_search(&tenant, "sem", &semantic(&[1.0, 0.0, 0.0], SearchMode::Semantic, ""), 10)
        .await
        .must("semantic");
    assert_eq!(keys(&hits), ["northeast"], "a delete drops the embedding");
}

/// Concurrent appends to one thread get distinct, dense indexes.
pub async fn concurrent_thread_appends(store: Arc<dyn Store>) {
    let tenant = format!("conformance-{}", RunId::generate(now_ms()));
    let tasks: Vec<JoinHandle<u64>> = (0..32)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenant = tenant.clone();
            tokio::spawn(async move {
                store.thread_append(&tenant, "t", json!(i), None, 1).await.must("concurrent thread_append")
            })
        })
        .collect();
    let mut indexes = join_all(tasks).await;
    indexes.sort_unstable();
    assert_eq!(indexes, (0..32).collect::<Vec<u64>>(), "concurrent appends must get dense distinct indexes");
}
