//! Conformance of dump and restore between two stores (of the same backend or not): a
//! store filled with every kind of record dumps into an empty one, the two dump the same
//! sequence, the copy's audit chain verifies to the same head, and the copy behaves as the
//! original would (seqs continue, keyed retries answer what they answered before).

use std::collections::BTreeSet;
use std::sync::Arc;

use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use serde_json::json;
use tokio::sync::mpsc;

use super::{Must, complete_entry, now_ms, ok_completion, pending_entry, usage};
use crate::dump::{self, DumpItem};
use crate::{
    ApiTokenRecord, AuditFilter, AuditRecord, FireRecord, MemoryEmbedding, MemorySearch, NewEvent,
    NewMessage, NewRun, RunPatch, SearchMode, Store, TenantRecord, TriggerRecord,
};

/// Every kind of item a dump sends, by `DumpItem::kind`.
const ALL_KINDS: [&str; 14] = [
    "tenant",
    "api token",
    "run",
    "journal entry",
    "event",
    "mailbox message",
    "subscription",
    "kv value",
    "thread message",
    "memory record",
    "memory delete",
    "trigger",
    "trigger fire",
    "audit entry",
];

/// What `fill` wrote that the checks after the copy use.
struct Filled {
    tenant: String,
    /// A run with a journal (usage, message-chain params, pending and abandoned entries),
    /// events and a mailbox.
    run: RunId,
    /// The key of a keyed receive from `run`'s mailbox, and the seq it took.
    receive_key: String,
    received_seq: u64,
}

/// Fills `source` with at least one item of every kind, copies it into `target` (which
/// must be empty) batch by batch through `restore`, and checks the copy: equal dumps, the
/// same audit head, and a copy that carries on where the source stopped.
pub async fn dump_and_restore(source: Arc<dyn Store>, target: Arc<dyn Store>) {
    let filled = fill(&*source).await;
    assert!(
        target.is_empty().await.must("is_empty of the target"),
        "store conformance: dump_and_restore needs an empty target, and is_empty must say it is"
    );
    assert!(
        !source.is_empty().await.must("is_empty of the source"),
        "store conformance: a store holding runs, tenants and kv is not empty"
    );

    let (sink, mut batches) = mpsc::channel(2);
    let dumping = {
        let source = Arc::clone(&source);
        tokio::spawn(async move { source.dump(sink).await })
    };
    while let Some(batch) = batches.recv().await {
        assert!(
            !batch.is_empty() && batch.len() <= dump::DUMP_BATCH,
            "store conformance: a dump batch holds 1 to DUMP_BATCH items, not {}",
            batch.len()
        );
        target.restore(batch).await.must("restore of a dump batch");
    }
    dumping.await.expect("the dump task panicked").must("dump of the source");
    assert!(!target.is_empty().await.must("is_empty of the copy"), "store conformance: a restored store");

    let source_items = dump_all(&*source).await;
    let copy_items = dump_all(&*target).await;
    let kinds: BTreeSet<&str> = source_items.iter().map(DumpItem::kind).collect();
    assert_eq!(kinds, BTreeSet::from(ALL_KINDS), "store conformance: the dump holds every kind of item");
    for (index, (original, copy)) in source_items.iter().zip(&copy_items).enumerate() {
        assert_eq!(
            original,
            copy,
            "store conformance: item {index} of the dumps differs: {}",
            dump::difference(Some(original), Some(copy)).unwrap_or_default()
        );
    }
    assert_eq!(source_items.len(), copy_items.len(), "store conformance: both dumps hold as many items");
    assert_eq!(
        dump::compare_stores(&*source, &*target).await.must("compare_stores"),
        Ok(source_items.len() as u64),
        "store conformance: compare_stores finds the copy equal"
    );

    let original_audit = source.audit_verify().await.must("audit_verify of the source");
    let copied_audit = target.audit_verify().await.must("audit_verify of the copy");
    assert_eq!(copied_audit.broken, None, "store conformance: the copied audit chain is whole");
    assert_eq!(copied_audit, original_audit, "store conformance: the copy verifies to the same head");

    carries_on(&*target, &filled, &copied_audit.head_hash).await;
}

/// Every item of a store's dump, in order.
async fn dump_all(store: &dyn Store) -> Vec<DumpItem> {
    let (sink, mut batches) = mpsc::channel(2);
    let (dumped, items) = tokio::join!(store.dump(sink), async {
        let mut items = Vec::new();
        while let Some(batch) = batches.recv().await {
            items.extend(batch);
        }
        items
    });
    dumped.must("dump");
    items
}

async fn fill(store: &dyn Store) -> Filled {
    let tenant = format!("dump-{}", RunId::generate(now_ms()));
    store
        .tenant_create(TenantRecord { name: tenant.clone(), created_at_ms: 5, quota: json!({"max_runs": 3}) })
        .await
        .must("tenant_create");
    for (n, label) in [(1, Some("ci")), (2, None)] {
        let token = ApiTokenRecord {
            hash: format!("{tenant}-hash-{n}"),
            prefix: format!("kt_{n}"),
            tenant: tenant.clone(),
            created_at_ms: 10 + n,
            label: label.map(str::to_owned),
            revoked: false,
        };
        store.token_create(token).await.must("token_create");
    }
    assert_eq!(store.token_revoke(&tenant, "kt_2").await.must("token_revoke"), 1);

    let created_at_ms = now_ms();
    let new_run = |state| NewRun {
        id: RunId::generate(created_at_ms),
        tenant: tenant.clone(),
        spec: json!({"command": ["agent"], "n": 1.5}),
        state,
        created_at_ms,
    };
    let run = store.create_run(new_run(RunState::Created)).await.must("create_run").id;
    let other = store.create_run(new_run(RunState::Created)).await.must("create_run").id;
    let patch = RunPatch {
        state: Some(RunState::Waiting),
        wait_reason: Some(Some(WaitReason::Human)),
        updated_at_ms: Some(created_at_ms + 1),
        attempt: Some(2),
        pid: Some(Some(4242)),
        output: Some(Some(json!({"partial": true}))),
        ..RunPatch::default()
    };
    store.update_run(&run, None, patch).await.must("update_run");

    // A journal: complete entries with usage, a provider-served completion, params whose
    // messages go to the message chain, one left pending and one abandoned.
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    store
        .append_entry(
            &run,
            &complete_entry("kv.put", json!({"key": "a"}), EntryStatus::Ok, usage(0, 0, 0, 1, 0)),
        )
        .await
        .must("append_entry");
    let seq = store.append_entry(&run, &pending_entry("llm.chat", chat)).await.must("append_entry");
    let completion = ok_completion(json!({"content": "hello"}), usage(3, 4, 1, 0, 50), true);
    store.complete_entry(&run, seq, &completion).await.must("complete_entry");
    let longer = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]});
    store.append_entry(&run, &pending_entry("llm.chat", longer)).await.must("append_entry");
    let abandoned =
        store.append_entry(&run, &pending_entry("sys.sleep", json!({"ms": 5}))).await.must("append");
    store.abandon_entries(&run, &[abandoned]).await.must("abandon_entries");
    store
        .append_entry(
            &run,
            &complete_entry("tool.call", json!(null), EntryStatus::Error, usage(0, 0, 0, 1, 7)),
        )
        .await
        .must("append_entry");

    let events: Vec<NewEvent> = (0..3)
        .map(|i| NewEvent {
            ts_ms: created_at_ms + i,
            kind: "stdout".to_owned(),
            data: json!(format!("line {i}")),
        })
        .collect();
    store.append_events(&run, &events).await.must("append_events");

    // A mailbox with a message delivered under a key, one delivered without one, and one
    // waiting; a send with a key; a published message through a subscription.
    let mail = |message, key: Option<&str>| NewMessage {
        tenant: tenant.clone(),
        from: Some(other.clone()),
        message,
        correlation_id: Some("c-1".to_owned()),
        topic: None,
        capacity: 10,
        idempotency_key: key.map(str::to_owned),
        sent_at_ms: 9,
    };
    store.mailbox_send(&run, mail(json!("first"), Some("send-1"))).await.must("mailbox_send");
    store.mailbox_send(&run, mail(json!("second"), None)).await.must("mailbox_send");
    store.mailbox_send(&run, mail(json!("third"), None)).await.must("mailbox_send");
    let receive_key = "receive-1".to_owned();
    let received = store.mailbox_receive(&run, Some(&receive_key)).await.must("receive").expect("first");
    store.mailbox_receive(&run, None).await.must("receive").expect("second");
    store.topic_subscribe(&tenant, "news", &other, true).await.must("topic_subscribe");
    store.topic_publish("news", mail(json!("headline"), None)).await.must("topic_publish");

    store.kv_put(&format!("run:{run}"), "answer", json!({"n": 42})).await.must("kv_put");
    store.kv_put(&format!("run:{run}"), "list", json!([1, "two", null])).await.must("kv_put");
    store.thread_append(&tenant, "chat", json!({"role": "user"}), Some("turn-1"), 20).await.must("append");
    store.thread_append(&tenant, "chat", json!({"role": "assistant"}), None, 21).await.must("append");

    let embedding = MemoryEmbedding { model: "embed-small".to_owned(), vector: vec![0.25, -1.5, 3.0] };
    store
        .mem_put(&tenant, "notes", "vec", json!({"v": 1}), "with a vector".into(), Some(embedding), 30)
        .await
        .must("mem_put");
    store.mem_put(&tenant, "notes", "plain", json!(2), "no vector".into(), None, 31).await.must("mem_put");
    store.mem_put(&tenant, "notes", "gone", json!(3), "deleted".into(), None, 32).await.must("mem_put");
    assert!(store.mem_delete(&tenant, "notes", "gone", Some("delete-1")).await.must("mem_delete"));

    // A paused schedule with a fired and a skipped tick, and a webhook with a delivery.
    for (kind, name, paused) in [("schedule", "nightly", true), ("hook", "github", false)] {
        let trigger = TriggerRecord {
            kind: kind.to_owned(),
            name: format!("{name}-{tenant}"),
            tenant: tenant.clone(),
            spec: json!({"cron": "0 9 * * *", "command": ["agent"]}),
            paused,
            since_ms: 40,
            created_at_ms: 41,
        };
        store.trigger_create(trigger).await.must("trigger_create");
    }
    let fire = |kind: &str, name: &str, occasion: &str, run_id: Option<RunId>, outcome: &str| FireRecord {
        kind: kind.to_owned(),
        trigger: format!("{name}-{tenant}"),
        occasion: occasion.to_owned(),
        tenant: tenant.clone(),
        at_ms: 50,
        run_id,
        outcome: outcome.to_owned(),
        detail: (outcome == "skipped").then(|| "the last run is still going".to_owned()),
        fired_at_ms: 51,
    };
    for fire in [
        fire("schedule", "nightly", "1000", Some(other.clone()), "fired"),
        fire("schedule", "nightly", "2000", None, "skipped"),
        fire("hook", "github", "delivery-1", Some(run.clone()), "fired"),
    ] {
        assert!(store.trigger_fire(fire).await.must("trigger_fire").1, "a new occasion is recorded");
    }

    let audit = |action: &str| AuditRecord {
        tenant: tenant.clone(),
        run_id: Some(run.clone()),
        at_ms: created_at_ms,
        actor: "kernel".to_owned(),
        action: action.to_owned(),
        subject: "example.com".to_owned(),
        outcome: "allowed".to_owned(),
        detail: json!({"port": 443}),
    };
    store.audit_append(vec![audit("egress"), audit("tool.call")]).await.must("audit_append");

    Filled { tenant, run, receive_key, received_seq: received.seq }
}

/// The copy carries on where the source stopped.
async fn carries_on(copy: &dyn Store, filled: &Filled, audit_head: &str) {
    let run = &filled.run;
    let journal = copy.journal(run, 0).await.must("journal of the copy");
    let last = journal.last().map_or(0, |entry| entry.seq);
    let next = copy.append_entry(run, &pending_entry("kv.get", json!({"key": "a"}))).await.must("append");
    assert_eq!(next, last + 1, "store conformance: a copied journal continues at the next seq");
    let copied = copy.get_run(run).await.must("get_run").expect("the copied run");
    assert_eq!(
        (copied.usage, copied.provider_calls),
        (Usage { input_tokens: 3, output_tokens: 4, llm_calls: 1, tool_calls: 2, cost_micro_usd: 57 }, 1),
        "store conformance: usage totals and provider_calls are copied as they were"
    );

    let retried = copy.mailbox_receive(run, Some(&filled.receive_key)).await.must("receive retried");
    assert_eq!(
        retried.map(|message| message.seq),
        Some(filled.received_seq),
        "store conformance: a retried keyed receive on the copy answers the message the first took"
    );
    let waiting = copy.mailbox_receive(run, None).await.must("receive").expect("the undelivered message");
    assert_eq!(waiting.message, json!("third"), "store conformance: delivered messages stay delivered");
    let token = copy.token_lookup(&format!("{}-hash-2", filled.tenant)).await.must("token_lookup");
    assert!(token.is_some_and(|token| token.revoked), "store conformance: a revoked token stays revoked");
    let index =
        copy.thread_append(&filled.tenant, "chat", json!("again"), Some("turn-1"), 40).await.must("append");
    assert_eq!(index, 0, "store conformance: a retried keyed thread append answers the first index");
    let deleted = copy.mem_delete(&filled.tenant, "notes", "gone", Some("delete-1")).await.must("mem_delete");
    assert!(deleted, "store conformance: a retried keyed delete answers what the first did");
    let search = MemorySearch {
        query: String::new(),
        mode: SearchMode::Semantic,
        embedding: Some(MemoryEmbedding { model: "embed-small".to_owned(), vector: vec![0.25, -1.5, 3.0] }),
    };
    let hits = copy.mem_search(&filled.tenant, "notes", &search, 5).await.must("mem_search");
    assert_eq!(hits.first().map(|hit| hit.key.as_str()), Some("vec"), "store conformance: embeddings copied");
    let text = MemorySearch { query: "vector".to_owned(), ..MemorySearch::default() };
    let hits = copy.mem_search(&filled.tenant, "notes", &text, 5).await.must("mem_search");
    assert_eq!(hits.len(), 2, "store conformance: the copy's full-text index holds the copied records");

    let seqs = copy
        .audit_append(vec![AuditRecord {
            tenant: filled.tenant.clone(),
            run_id: None,
            at_ms: now_ms(),
            actor: "operator".to_owned(),
            action: "migrate".to_owned(),
            subject: "store".to_owned(),
            outcome: "ok".to_owned(),
            detail: json!({}),
        }])
        .await
        .must("audit_append on the copy");
    let appended = copy
        .audit_list(&AuditFilter { after_seq: seqs[0] - 1, ..AuditFilter::default() })
        .await
        .must("audit_list");
    assert_eq!(appended[0].prev_hash, audit_head, "store conformance: the copy's audit chain continues");
    let verified = copy.audit_verify().await.must("audit_verify");
    assert_eq!(verified.broken, None, "store conformance: the continued chain verifies");
}
