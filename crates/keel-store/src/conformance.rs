//! The Store conformance suite: backend-independent checks of the `Store` contract, run
//! by every backend's tests through `run_all`. A violated property panics with a message
//! that names it.
//!
//! Every check makes its own runs (`RunId::generate`) and kv scopes, so the checks can
//! share one store, and a store that already holds data (an earlier suite run, other
//! tests) does not disturb them. The blob-size check reads global `stats()`, so the suite
//! expects no other writer to be storing payloads at the same moment.
//!
//! The suite needs a tokio runtime (the concurrency checks spawn tasks); any flavor works.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::{
    AuditFilter, AuditRecord, Completion, Error, NewEntry, NewEvent, NewMessage, NewRun, Result, RunFilter,
    RunPatch, RunRecord, Seq, Store,
};

/// Panics naming the operation unless the result is `Err` matching the pattern.
macro_rules! expect_error {
    ($result:expr, $pattern:pat $(if $guard:expr)?, $what:expr $(,)?) => {
        match $result {
            Err($pattern) $(if $guard)? => {}
            other => panic!(
                "store conformance: {}: expected Err({}), got {:?}",
                $what,
                stringify!($pattern),
                other
            ),
        }
    };
}

/// Runs every check, one after the other, against `store`.
pub async fn run_all(store: Arc<dyn Store>) {
    runs_create_get_list(&*store).await;
    runs_reject_duplicate_ids(&*store).await;
    runs_update_patches_every_field(&*store).await;
    runs_compare_and_set(&*store).await;
    journal_append_and_complete(&*store).await;
    journal_usage_totals(&*store).await;
    journal_abandon_entries(&*store).await;
    journal_paging(&*store).await;
    journal_latest_entry(&*store).await;
    blobs_store_each_payload_once(&*store).await;
    blobs_store_each_message_once(&*store).await;
    params_read_back_exactly(&*store).await;
    events_append_and_page(&*store).await;
    kv_put_get_and_scopes(&*store).await;
    unknown_runs_are_errors(&*store).await;
    threads_append_read_and_window(&*store).await;
    threads_idempotent_append_and_blobs(&*store).await;
    memory_put_get_delete_and_scopes(&*store).await;
    memory_search_ranks_and_scopes(&*store).await;
    memory_semantic_and_hybrid_search(&*store).await;
    mailbox_send_receive_in_order(&*store).await;
    mailbox_is_bounded(&*store).await;
    mailbox_idempotent_send_and_receive(&*store).await;
    mailbox_is_tenant_scoped(&*store).await;
    topics_publish_to_live_subscribers_all_or_nothing(&*store).await;
    audit_append_list_filter_and_verify(&*store).await;
    concurrent_audit_appends_form_one_chain(Arc::clone(&store)).await;
    tenants_create_get_list(&*store).await;
    tokens_create_lookup_list_revoke(&*store).await;
    runs_list_by_tenant(&*store).await;
    concurrent_thread_appends(Arc::clone(&store)).await;
    concurrent_mailbox_receives(Arc::clone(&store)).await;
    concurrent_appends_to_one_run(Arc::clone(&store)).await;
    concurrent_appends_to_many_runs(Arc::clone(&store)).await;
    failed_writes_do_not_disturb_concurrent_ones(Arc::clone(&store)).await;
}

/// Creating a run returns it as stored (with the documented defaults), `get_run` reads it
/// back, and `list_runs` filters by state, limits, and orders newest first.
pub async fn runs_create_get_list(store: &dyn Store) {
    let created_at_ms = now_ms();
    let new = new_run(created_at_ms, RunState::Created);
    let created = store.create_run(new.clone()).await.must("create_run");
    let expected = RunRecord {
        id: new.id.clone(),
        tenant: new.tenant.clone(),
        spec: new.spec.clone(),
        state: RunState::Created,
        wait_reason: None,
        created_at_ms,
        updated_at_ms: created_at_ms,
        ended_at_ms: None,
        attempt: 1,
        pid: None,
        exit_code: None,
        output: None,
        error: None,
        usage: Usage::default(),
        provider_calls: 0,
    };
    assert_eq!(created, expected, "create_run must return the new run with its defaults");
    let read = store.get_run(&new.id).await.must("get_run");
    assert_eq!(read, Some(expected), "get_run must return the run as created");
    let ghost = RunId::generate(now_ms());
    assert_eq!(store.get_run(&ghost).await.must("get_run of an unknown run"), None);

    // Dated a century ahead, so that these are the newest runs in the store even when it
    // holds runs of other checks or of earlier suite runs (later runs date further ahead).
    let base = now_ms() + 100 * 365 * 24 * 3600 * 1000;
    let mut ids = Vec::new();
    for (offset, state) in
        [RunState::Created, RunState::Running, RunState::Paused, RunState::Running].into_iter().enumerate()
    {
        let run = new_run(base + offset as u64, state);
        ids.push(store.create_run(run).await.must("create_run").id);
    }
    let [a, b, c, d] = [&ids[0], &ids[1], &ids[2], &ids[3]];

    let newest = list_ids(store, &[], Some(4)).await;
    assert_eq!(
        newest.iter().collect::<Vec<_>>(),
        [d, c, b, a],
        "list_runs must return the newest runs first"
    );
    let running = list_ids(store, &[RunState::Running], Some(2)).await;
    assert_eq!(running.iter().collect::<Vec<_>>(), [d, b], "list_runs must filter by state before limiting");
    let running_or_paused = list_ids(store, &[RunState::Running, RunState::Paused], Some(3)).await;
    assert_eq!(
        running_or_paused.iter().collect::<Vec<_>>(),
        [d, c, b],
        "list_runs must accept several states"
    );
    assert!(list_ids(store, &[], Some(0)).await.is_empty(), "list_runs with limit 0 must return nothing");

    let paused = store
        .list_runs(&RunFilter { states: vec![RunState::Paused], limit: None, tenant: None })
        .await
        .must("list_runs of paused runs");
    assert!(paused.iter().any(|run| &run.id == c), "list_runs must include every paused run");
    assert!(
        paused.iter().all(|run| run.state == RunState::Paused),
        "list_runs filtered to paused returned a run in another state"
    );
    assert_newest_first(&paused);

    let all = store.list_runs(&RunFilter::default()).await.must("list_runs without a filter");
    for id in [&new.id, a, b, c, d] {
        let listed = all.iter().find(|run| &run.id == id);
        let read = store.get_run(id).await.must("get_run");
        assert_eq!(listed, read.as_ref(), "list_runs must return each run as get_run does");
    }
    assert_newest_first(&all);
}

/// Creating a run with a taken id fails with `RunExists` and leaves the first one alone.
pub async fn runs_reject_duplicate_ids(store: &dyn Store) {
    let first = new_run(now_ms(), RunState::Created);
    store.create_run(first.clone()).await.must("create_run");
    let duplicate = NewRun { tenant: "someone-else".to_owned(), state: RunState::Running, ..first.clone() };
    expect_error!(
        store.create_run(duplicate).await,
        Error::RunExists(id) if id == first.id,
        "create_run with a taken id"
    );
    let stored = store.get_run(&first.id).await.must("get_run").expect_run(&first.id);
    assert_eq!(stored.tenant, first.tenant, "a rejected duplicate must not overwrite the run");
    assert_eq!(stored.state, RunState::Created);
}

/// `update_run` sets every field of a patch, clears optional ones with `Some(None)`,
/// leaves absent ones alone, and returns the run as stored.
pub async fn runs_update_patches_every_field(store: &dyn Store) {
    let run = fresh_run(store).await;
    let before = store.get_run(&run).await.must("get_run").expect_run(&run);

    let full = RunPatch {
        state: Some(RunState::Waiting),
        wait_reason: Some(Some(WaitReason::Approval)),
        updated_at_ms: Some(before.created_at_ms + 10),
        ended_at_ms: Some(Some(before.created_at_ms + 20)),
        attempt: Some(3),
        pid: Some(Some(4242)),
        exit_code: Some(Some(-9)),
        output: Some(Some(json!({"answer": 42, "text": "fin"}))),
        error: Some(Some("the agent exited with signal 9".to_owned())),
    };
    let updated = store.update_run(&run, None, full).await.must("update_run with every field");
    let expected = RunRecord {
        state: RunState::Waiting,
        wait_reason: Some(WaitReason::Approval),
        updated_at_ms: before.created_at_ms + 10,
        ended_at_ms: Some(before.created_at_ms + 20),
        attempt: 3,
        pid: Some(4242),
        exit_code: Some(-9),
        output: Some(json!({"answer": 42, "text": "fin"})),
        error: Some("the agent exited with signal 9".to_owned()),
        ..before.clone()
    };
    assert_eq!(updated, expected, "update_run must return the run with the patch applied");
    let read = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(read, expected, "update_run must store every patched field");

    let unchanged =
        store.update_run(&run, None, RunPatch::default()).await.must("update_run with an empty patch");
    assert_eq!(unchanged, expected, "an empty patch must change nothing");

    let clearing = RunPatch {
        state: Some(RunState::Running),
        wait_reason: Some(None),
        updated_at_ms: None,
        ended_at_ms: Some(None),
        attempt: None,
        pid: Some(None),
        exit_code: Some(None),
        output: Some(None),
        error: Some(None),
    };
    let cleared = store.update_run(&run, None, clearing).await.must("update_run clearing fields");
    let expected = RunRecord {
        state: RunState::Running,
        wait_reason: None,
        ended_at_ms: None,
        pid: None,
        exit_code: None,
        output: None,
        error: None,
        ..expected
    };
    assert_eq!(cleared, expected, "Some(None) must clear a field and None must keep it");
    let read = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(read, expected, "cleared fields must be stored cleared");
}

/// With `expected`, `update_run` is a compare-and-set on the state: a mismatch fails with
/// `StateConflict` carrying the actual state and writes nothing.
pub async fn runs_compare_and_set(store: &dyn Store) {
    let run = fresh_run(store).await;
    let queued = store
        .update_run(
            &run,
            Some(RunState::Created),
            RunPatch { state: Some(RunState::Queued), ..RunPatch::default() },
        )
        .await
        .must("update_run with the right expected state");
    assert_eq!(queued.state, RunState::Queued);

    let stale = RunPatch {
        state: Some(RunState::Running),
        pid: Some(Some(77)),
        error: Some(Some("must not be written".to_owned())),
        ..RunPatch::default()
    };
    expect_error!(
        store.update_run(&run, Some(RunState::Created), stale).await,
        Error::StateConflict { run: conflict_run, expected: RunState::Created, actual: RunState::Queued }
            if conflict_run == run,
        "update_run with a stale expected state"
    );
    let read = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(read, queued, "a failed compare-and-set must leave the run unchanged");
}

/// Journal seqs start at 1 and are dense; entries appended complete and pending entries
/// completed later read back exactly; completing twice, completing an entry appended
/// complete, and completing an unknown seq all fail without changing anything.
pub async fn journal_append_and_complete(store: &dyn Store) {
    let run = fresh_run(store).await;
    let params = json!({
        "messages": [{"role": "user", "content": "héllo ✓ \"quoted\"\n\ttab"}],
        "max": 18_446_744_073_709_551_615_u64,
        "negative": -5,
        "ratio": 1.5,
        "nothing": null,
        "empty": {},
        "list": [true, false, []],
    });
    let first = pending_entry("llm.chat", params.clone());
    let second = complete_entry("kv.get", json!({"key": "k"}), EntryStatus::Ok, Usage::default());
    let third = complete_entry("tool.call", json!({"tool": "grep"}), EntryStatus::Error, Usage::default());
    let fourth = pending_entry("tool.call", json!({"tool": "sed"}));
    let mut seqs = Vec::new();
    for entry in [&first, &second, &third, &fourth] {
        seqs.push(store.append_entry(&run, entry.clone()).await.must("append_entry"));
    }
    assert_eq!(seqs, [1, 2, 3, 4], "journal seqs must start at 1 and be dense");

    let journal = store.journal(&run, 0).await.must("journal");
    assert_eq!(journal.len(), 4, "the journal must hold every appended entry");
    for (stored, appended) in journal.iter().zip([&first, &second, &third, &fourth]) {
        assert_entry_matches(stored, appended);
    }

    let result = json!({"choices": [{"message": {"content": "hi"}}]});
    let usage =
        Usage { input_tokens: 10, output_tokens: 5, llm_calls: 1, tool_calls: 0, cost_micro_usd: 1234 };
    store
        .complete_entry(&run, 1, ok_completion(result.clone(), usage, true))
        .await
        .must("complete_entry of a pending entry");
    let completed = &store.journal(&run, 0).await.must("journal")[0];
    assert_eq!(completed.status, EntryStatus::Ok);
    assert_eq!(completed.result, Some(result.clone()), "the completion's result must be stored");
    assert_eq!(completed.error, None);
    assert_eq!(completed.finished_at_ms, Some(first.started_at_ms + 1));
    assert_eq!(completed.usage, usage, "the completion's usage must be stored on the entry");
    assert_eq!(completed.params, params, "completing must keep the params");

    let again = ok_completion(json!("second result"), usage, true);
    expect_error!(
        store.complete_entry(&run, 1, again.clone()).await,
        Error::Corrupt(message) if message.contains("not pending"),
        "completing an entry twice"
    );
    expect_error!(
        store.complete_entry(&run, 2, again.clone()).await,
        Error::Corrupt(message) if message.contains("not pending"),
        "completing an entry that was appended complete"
    );
    expect_error!(
        store.complete_entry(&run, 99, again).await,
        Error::EntryNotFound { run: missing_run, seq: 99 } if missing_run == run,
        "completing an unknown seq"
    );
    let after_failures = &store.journal(&run, 0).await.must("journal")[0];
    assert_eq!(after_failures, completed, "a rejected completion must leave the entry unchanged");

    let not_an_outcome = Completion { status: EntryStatus::Pending, ..ok_completion(json!(1), usage, true) };
    expect_error!(
        store.complete_entry(&run, 4, not_an_outcome).await,
        Error::Corrupt(_),
        "completing an entry with status pending"
    );
    let failure = Completion {
        status: EntryStatus::Error,
        result: None,
        error: Some(json!({"code": "timeout", "message": "sed took too long"})),
        finished_at_ms: fourth.started_at_ms + 7,
        usage: Usage::default(),
        provider_served: false,
    };
    store.complete_entry(&run, 4, failure.clone()).await.must("complete_entry with an error");
    let failed = &store.journal(&run, 3).await.must("journal")[0];
    assert_eq!(failed.seq, 4);
    assert_eq!(failed.status, EntryStatus::Error);
    assert_eq!(failed.error, failure.error, "the completion's error must be stored");
    assert_eq!(failed.result, None);
    assert_eq!(failed.finished_at_ms, Some(failure.finished_at_ms));
}

/// A run's usage is the exact sum of its completed entries (appended complete or
/// completed later); `provider_calls` counts completions a provider served. Pending
/// entries and rejected completions add nothing.
pub async fn journal_usage_totals(store: &dyn Store) {
    let run = fresh_run(store).await;
    let usages = [
        usage(100, 20, 1, 0, 3_000),
        usage(7, 0, 0, 1, 15),
        usage(1_000_000, 250_000, 1, 0, 9_999_999),
        usage(3, 4, 0, 2, 1),
    ];
    store
        .append_entry(&run, complete_entry("llm.chat", json!({"n": 0}), EntryStatus::Ok, usages[0]))
        .await
        .must("append_entry complete");
    for (index, (usage, provider_served)) in usages[1..].iter().zip([true, false, true]).enumerate() {
        let seq = store
            .append_entry(&run, pending_entry("llm.chat", json!({"n": index + 1})))
            .await
            .must("append_entry pending");
        let mut completion = ok_completion(json!({"n": index + 1}), *usage, provider_served);
        if index == 2 {
            completion.status = EntryStatus::Error;
            completion.result = None;
            completion.error = Some(json!("rate limited"));
        }
        store.complete_entry(&run, seq, completion.clone()).await.must("complete_entry");
        expect_error!(
            store.complete_entry(&run, seq, completion).await,
            Error::Corrupt(_),
            "completing an entry twice"
        );
    }
    // A pending entry's usage is not counted: it has not been spent yet.
    let mut never_completed = pending_entry("llm.chat", json!({"n": "never"}));
    never_completed.usage = usage(1, 1, 1, 1, 1);
    store.append_entry(&run, never_completed).await.must("append_entry pending");

    let mut expected = Usage::default();
    for usage in &usages {
        expected.add(usage);
    }
    let stored = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(stored.usage, expected, "run usage must be the exact sum of completed entries");
    assert_eq!(stored.provider_calls, 2, "provider_calls must count provider-served completions");
}

/// `abandon_entries` marks exactly the given entries, all or nothing, keeps usage totals,
/// and an abandoned entry cannot be completed.
pub async fn journal_abandon_entries(store: &dyn Store) {
    let run = fresh_run(store).await;
    store
        .append_entry(
            &run,
            complete_entry("llm.chat", json!({"n": 1}), EntryStatus::Ok, usage(1, 2, 1, 0, 3)),
        )
        .await
        .must("append_entry");
    for n in 2..=5 {
        store.append_entry(&run, pending_entry("tool.call", json!({"n": n}))).await.must("append_entry");
    }
    store
        .complete_entry(&run, 3, ok_completion(json!("ok"), usage(0, 0, 0, 1, 0), false))
        .await
        .must("complete_entry");
    let usage_before = store.get_run(&run).await.must("get_run").expect_run(&run).usage;

    store.abandon_entries(&run, &[3, 4, 5]).await.must("abandon_entries");
    let statuses = journal_statuses(store, &run).await;
    assert_eq!(
        statuses,
        [
            EntryStatus::Ok,
            EntryStatus::Pending,
            EntryStatus::Abandoned,
            EntryStatus::Abandoned,
            EntryStatus::Abandoned,
        ],
        "abandon_entries must mark exactly the given entries"
    );

    expect_error!(
        store.abandon_entries(&run, &[2, 99]).await,
        Error::EntryNotFound { run: missing_run, seq: 99 } if missing_run == run,
        "abandon_entries with an unknown seq"
    );
    assert_eq!(
        journal_statuses(store, &run).await[1],
        EntryStatus::Pending,
        "a failed abandon_entries must abandon nothing"
    );
    store.abandon_entries(&run, &[]).await.must("abandon_entries of nothing");
    expect_error!(
        store
            .complete_entry(&run, 4, ok_completion(json!("late"), Usage::default(), true))
            .await,
        Error::Corrupt(message) if message.contains("not pending"),
        "completing an abandoned entry"
    );
    let after = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(after.usage, usage_before, "abandoning must not change usage totals");
    assert_eq!(after.provider_calls, 0);
}

/// `journal(after)` returns exactly the entries with a greater seq, in order.
pub async fn journal_paging(store: &dyn Store) {
    let run = fresh_run(store).await;
    for n in 1..=10 {
        store.append_entry(&run, pending_entry("tool.call", json!({"n": n}))).await.must("append_entry");
    }
    for after in [0, 3, 9, 10, 100] {
        let seqs: Vec<Seq> =
            store.journal(&run, after).await.must("journal").iter().map(|entry| entry.seq).collect();
        let expected: Vec<Seq> = (after + 1..=10).collect();
        assert_eq!(seqs, expected, "journal(after = {after}) must return the later entries");
    }
    let page = store.journal(&run, 4).await.must("journal");
    assert_eq!(page[0].params, json!({"n": 5}), "paged entries must carry their params");
}

/// `latest_entry` returns the newest entry of the method whose status is ok, ignoring
/// other methods and entries pending, failed or abandoned.
pub async fn journal_latest_entry(store: &dyn Store) {
    let run = fresh_run(store).await;
    assert_eq!(
        store.latest_entry(&run, "state.checkpoint").await.must("latest_entry"),
        None,
        "an empty journal has no latest entry"
    );
    let checkpoint =
        |n: u64, status| complete_entry("state.checkpoint", json!({"n": n}), status, Usage::default());
    let appended = [
        checkpoint(1, EntryStatus::Ok),
        complete_entry("llm.chat", json!({}), EntryStatus::Ok, Usage::default()),
        checkpoint(3, EntryStatus::Ok),
        checkpoint(4, EntryStatus::Error),
        complete_entry("llm.chat", json!({}), EntryStatus::Ok, Usage::default()),
        pending_entry("state.checkpoint", json!({"n": 6})),
        checkpoint(7, EntryStatus::Ok),
    ];
    for entry in appended {
        store.append_entry(&run, entry).await.must("append_entry");
    }
    store.abandon_entries(&run, &[7]).await.must("abandon_entries");
    let latest = store
        .latest_entry(&run, "state.checkpoint")
        .await
        .must("latest_entry")
        .unwrap_or_else(|| panic!("latest_entry found no ok checkpoint in run {run}"));
    assert_eq!(latest.seq, 3, "latest_entry must pick the newest ok entry of the method");
    assert_eq!(latest.params, json!({"n": 3}));

    store
        .complete_entry(&run, 6, ok_completion(json!("saved"), Usage::default(), false))
        .await
        .must("complete_entry");
    let latest = store.latest_entry(&run, "state.checkpoint").await.must("latest_entry");
    assert_eq!(
        latest.map(|entry| (entry.seq, entry.result)),
        Some((6, Some(json!("saved")))),
        "a newly completed entry must become the latest"
    );
    assert_eq!(store.latest_entry(&run, "never.called").await.must("latest_entry"), None);
}

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
        store.append_entry(&run, pending_entry("llm.chat", params)).await.must("append_entry");
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
        store.append_entry(&run, entry).await.must("append_entry");
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
        store.append_entry(&run, pending_entry("llm.chat", conversation.clone())).await.must("append_entry");
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
            .complete_entry(&run, seq, ok_completion(reply.clone(), Usage::default(), true))
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
    assert_eq!(
        store.append_events(&run, vec![]).await.must("append_events"),
        0,
        "an empty log's last seq is 0"
    );
    let events: Vec<NewEvent> = (1..=5)
        .map(|n| NewEvent {
            ts_ms: 1_000 + n,
            kind: if n % 2 == 0 { "stderr" } else { "stdout" }.to_owned(),
            data: json!({"line": format!("line {n}"), "n": n}),
        })
        .collect();
    assert_eq!(store.append_events(&run, events[..3].to_vec()).await.must("append_events"), 3);
    assert_eq!(store.append_events(&run, events[3..].to_vec()).await.must("append_events"), 5);
    assert_eq!(
        store.append_events(&run, vec![]).await.must("append_events"),
        5,
        "appending no events must return the current last seq"
    );
    assert_eq!(
        store.append_events(&other, events[..1].to_vec()).await.must("append_events"),
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

/// Per-run operations on a run that does not exist fail with `RunNotFound`; `get_run`
/// returns `None`.
pub async fn unknown_runs_are_errors(store: &dyn Store) {
    let ghost = RunId::generate(now_ms());
    let is_ghost = |id: &RunId| id == &ghost;
    assert_eq!(store.get_run(&ghost).await.must("get_run"), None);
    expect_error!(
        store
            .update_run(&ghost, None, RunPatch::default())
            .await,
        Error::RunNotFound(id) if is_ghost(&id),
        "update_run of an unknown run"
    );
    expect_error!(
        store
            .update_run(&ghost, Some(RunState::Created), RunPatch::default())
            .await,
        Error::RunNotFound(id) if is_ghost(&id),
        "update_run with an expected state of an unknown run"
    );
    expect_error!(
        store
            .append_entry(&ghost, pending_entry("llm.chat", json!({})))
            .await,
        Error::RunNotFound(id) if is_ghost(&id),
        "append_entry to an unknown run"
    );
    expect_error!(
        store
            .complete_entry(&ghost, 1, ok_completion(json!(1), Usage::default(), false))
            .await,
        Error::RunNotFound(id) if is_ghost(&id),
        "complete_entry of an unknown run"
    );
    expect_error!(
        store.abandon_entries(&ghost, &[1]).await,
        Error::RunNotFound(id) if is_ghost(&id),
        "abandon_entries of an unknown run"
    );
    expect_error!(
        store.journal(&ghost, 0).await,
        Error::RunNotFound(id) if is_ghost(&id),
        "journal of an unknown run"
    );
    expect_error!(
        store.latest_entry(&ghost, "llm.chat").await,
        Error::RunNotFound(id) if is_ghost(&id),
        "latest_entry of an unknown run"
    );
    expect_error!(
        store.append_events(&ghost, vec![]).await,
        Error::RunNotFound(id) if is_ghost(&id),
        "append_events to an unknown run"
    );
    expect_error!(
        store.events(&ghost, 0, 10).await,
        Error::RunNotFound(id) if is_ghost(&id),
        "events of an unknown run"
    );
    assert_eq!(store.get_run(&ghost).await.must("get_run"), None, "failed writes must not create the run");
}

/// 100 tasks append to (and complete in) the same run at once: every task gets its own
/// seq, the seqs are exactly 1..=100, each entry holds its task's params, and the usage
/// totals count every completion.
pub async fn concurrent_appends_to_one_run(store: Arc<dyn Store>) {
    const TASKS: u64 = 100;
    let run = fresh_run(&*store).await;
    let tasks: Vec<JoinHandle<(u64, Seq)>> = (0..TASKS)
        .map(|task| {
            let store = Arc::clone(&store);
            let run = run.clone();
            tokio::spawn(async move {
                let seq = store
                    .append_entry(&run, pending_entry("tool.call", json!({"task": task})))
                    .await
                    .must("concurrent append_entry");
                let completion = ok_completion(json!({"task": task}), usage(0, 0, 0, 1, 0), true);
                store.complete_entry(&run, seq, completion).await.must("concurrent complete_entry");
                (task, seq)
            })
        })
        .collect();
    let mut acknowledged = join_all(tasks).await;

    acknowledged.sort_by_key(|&(_, seq)| seq);
    let seqs: Vec<Seq> = acknowledged.iter().map(|&(_, seq)| seq).collect();
    let expected: Vec<Seq> = (1..=TASKS).collect();
    assert_eq!(seqs, expected, "concurrent appends to one run must get unique, dense seqs");
    let journal = store.journal(&run, 0).await.must("journal");
    assert_eq!(journal.len() as u64, TASKS, "no concurrent append may be lost");
    for (entry, (task, seq)) in journal.iter().zip(&acknowledged) {
        assert_eq!(entry.seq, *seq);
        assert_eq!(
            entry.params,
            json!({"task": task}),
            "entry {seq} must hold the params of the task that was told its seq is {seq}"
        );
        assert_eq!(entry.status, EntryStatus::Ok);
        assert_eq!(entry.result, Some(json!({"task": task})));
    }
    let stored = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(stored.usage.tool_calls, TASKS, "every concurrent completion must add its usage");
    assert_eq!(stored.provider_calls, TASKS);
}

/// 100 tasks each create a run and journal steps in it at once: every run's journal is
/// dense from 1 and complete, and its events too.
pub async fn concurrent_appends_to_many_runs(store: Arc<dyn Store>) {
    const TASKS: u64 = 100;
    const STEPS: u64 = 5;
    let tasks: Vec<JoinHandle<RunId>> = (0..TASKS)
        .map(|task| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let run = fresh_run(&*store).await;
                for step in 1..=STEPS {
                    let params = json!({"task": task, "step": step});
                    let seq = store
                        .append_entry(&run, pending_entry("llm.chat", params))
                        .await
                        .must("concurrent append_entry");
                    assert_eq!(seq, step, "run {run}: seqs of one writer must be dense");
                    store
                        .complete_entry(&run, seq, ok_completion(json!(step), usage(1, 1, 1, 0, 1), true))
                        .await
                        .must("concurrent complete_entry");
                    let event = NewEvent { ts_ms: step, kind: "stdout".to_owned(), data: json!(step) };
                    let event_seq =
                        store.append_events(&run, vec![event]).await.must("concurrent append_events");
                    assert_eq!(event_seq, step, "run {run}: event seqs must be dense");
                }
                run
            })
        })
        .collect();
    let runs = join_all(tasks).await;

    for (task, run) in (0..).zip(&runs) {
        let journal = store.journal(run, 0).await.must("journal");
        let seqs: Vec<Seq> = journal.iter().map(|entry| entry.seq).collect();
        assert_eq!(seqs, (1..=STEPS).collect::<Vec<_>>(), "run {run} lost journal entries");
        for entry in &journal {
            assert_eq!(entry.params, json!({"task": task, "step": entry.seq}));
            assert_eq!(entry.result, Some(json!(entry.seq)));
        }
        let stored = store.get_run(run).await.must("get_run").expect_run(run);
        assert_eq!(stored.usage.llm_calls, STEPS);
        assert_eq!(stored.provider_calls, STEPS);
        let events = store.events(run, 0, 100).await.must("events");
        assert_eq!(events.len() as u64, STEPS, "run {run} lost events");
    }
}

/// Writes that fail (unknown run, stale compare-and-set, double completion) while others
/// are in flight fail alone: every valid concurrent write lands, no failed one leaves a
/// trace. A backend that commits writes in groups must isolate each writer's failure.
pub async fn failed_writes_do_not_disturb_concurrent_ones(store: Arc<dyn Store>) {
    const TASKS: u64 = 120;
    let run = fresh_run(&*store).await;
    store
        .append_entry(&run, complete_entry("seed", json!({}), EntryStatus::Ok, Usage::default()))
        .await
        .must("append_entry");
    let ghost = RunId::generate(now_ms());
    let tasks: Vec<JoinHandle<Option<Seq>>> = (0..TASKS)
        .map(|task| {
            let store = Arc::clone(&store);
            let run = run.clone();
            let ghost = ghost.clone();
            tokio::spawn(async move {
                match task % 4 {
                    0 | 1 => Some(
                        store
                            .append_entry(&run, pending_entry("tool.call", json!({"task": task})))
                            .await
                            .must("append_entry beside failing writes"),
                    ),
                    2 => {
                        expect_error!(
                            store
                                .append_entry(&ghost, pending_entry("tool.call", json!({"task": task})))
                                .await,
                            Error::RunNotFound(_),
                            "append_entry to an unknown run beside other writes"
                        );
                        None
                    }
                    _ => {
                        let stale = RunPatch {
                            error: Some(Some(format!("task {task} must not write this"))),
                            ..RunPatch::default()
                        };
                        expect_error!(
                            store.update_run(&run, Some(RunState::Failed), stale).await,
                            Error::StateConflict { actual: RunState::Created, .. },
                            "a stale compare-and-set beside other writes"
                        );
                        expect_error!(
                            store
                                .complete_entry(
                                    &run,
                                    1,
                                    ok_completion(json!(task), usage(1, 1, 1, 1, 1), true)
                                )
                                .await,
                            Error::Corrupt(_),
                            "completing a complete entry beside other writes"
                        );
                        None
                    }
                }
            })
        })
        .collect();
    let mut seqs: Vec<Seq> = join_all(tasks).await.into_iter().flatten().collect();
    seqs.sort_unstable();
    let expected: Vec<Seq> = (2..=TASKS / 2 + 1).collect();
    assert_eq!(seqs, expected, "valid appends beside failing writes must all land, densely");
    let journal = store.journal(&run, 0).await.must("journal");
    assert_eq!(journal.len() as u64, TASKS / 2 + 1, "failed writes must leave no entries");
    let stored = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(stored.error, None, "a failed compare-and-set must write nothing");
    assert_eq!(stored.usage, Usage::default(), "rejected completions must add no usage");
    assert_eq!(stored.provider_calls, 0);
    assert_eq!(store.get_run(&ghost).await.must("get_run"), None);
}

/// `Ok` or a panic naming the operation: the suite's way to say "this must succeed".
trait Must<T> {
    fn must(self, what: &str) -> T;
}

impl<T> Must<T> for Result<T> {
    #[track_caller]
    fn must(self, what: &str) -> T {
        match self {
            Ok(value) => value,
            Err(error) => panic!("store conformance: {what} failed: {error}"),
        }
    }
}

trait ExpectRun {
    fn expect_run(self, id: &RunId) -> RunRecord;
}

impl ExpectRun for Option<RunRecord> {
    #[track_caller]
    fn expect_run(self, id: &RunId) -> RunRecord {
        self.unwrap_or_else(|| panic!("store conformance: run {id} was written but get_run finds nothing"))
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

fn mail(from: Option<&RunId>, message: Value, capacity: u64, key: Option<&str>) -> NewMessage {
    NewMessage {
        tenant: "conformance".to_owned(),
        from: from.cloned(),
        message,
        correlation_id: None,
        topic: None,
        capacity,
        idempotency_key: key.map(str::to_owned),
        sent_at_ms: 7,
    }
}

/// Messages get dense seqs from 1 and are received oldest first, each once, with what was
/// sent; an empty mailbox receives `None`.
pub async fn mailbox_send_receive_in_order(store: &dyn Store) {
    let to = fresh_run(store).await;
    let from = fresh_run(store).await;
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    assert_eq!(store.mailbox_receive(&to, None).await.must("mailbox_receive"), None, "empty mailbox");
    for i in 0..3u64 {
        let mut message = mail(Some(&from), json!({"n": i}), 10, None);
        message.correlation_id = (i == 1).then(|| "req-1".to_owned());
        let seq = store.mailbox_send(&to, message).await.must("mailbox_send");
        assert_eq!(seq, i + 1, "mailbox seqs must be dense from 1");
    }
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 3);
    let operator = store.mailbox_send(&to, mail(None, json!("op"), 10, None)).await.must("send from nobody");
    assert_eq!(operator, 4);
    for i in 0..3u64 {
        let got = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("a message");
        assert_eq!(got.seq, i + 1, "oldest first");
        assert_eq!(got.message, json!({"n": i}));
        assert_eq!(got.from.as_ref(), Some(&from));
        assert_eq!(got.sent_at_ms, 7);
        assert_eq!(got.correlation_id.as_deref(), (i == 1).then_some("req-1"));
    }
    let last = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("the operator's");
    assert_eq!((last.seq, last.from), (4, None));
    assert_eq!(store.mailbox_receive(&to, None).await.must("mailbox_receive"), None, "each delivered once");
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    assert_eq!(store.mailbox_len(&from).await.must("mailbox_len"), 0, "mailboxes are per run");
}

/// A full mailbox refuses a send and writes nothing; a receive makes room again.
pub async fn mailbox_is_bounded(store: &dyn Store) {
    let to = fresh_run(store).await;
    for i in 0..2 {
        store.mailbox_send(&to, mail(None, json!(i), 2, None)).await.must("mailbox_send");
    }
    expect_error!(
        store.mailbox_send(&to, mail(None, json!(2), 2, None)).await,
        Error::MailboxFull { ref run, capacity: 2 } if *run == to,
        "a send to a full mailbox",
    );
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 2, "a refused send writes nothing");
    assert_eq!(store.mailbox_send(&to, mail(None, json!(2), 3, None)).await.must("bigger capacity"), 3);
    store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("a message");
    assert_eq!(store.mailbox_send(&to, mail(None, json!(3), 3, None)).await.must("room again"), 4);
    let mut got = Vec::new();
    while let Some(message) = store.mailbox_receive(&to, None).await.must("mailbox_receive") {
        got.push(message.message);
    }
    assert_eq!(got, [json!(1), json!(2), json!(3)], "no message lost or duplicated");
}

/// A retried send (same key) writes nothing and answers the first seq, even once the
/// mailbox is full; a retried receive (same key) answers the message the first took.
pub async fn mailbox_idempotent_send_and_receive(store: &dyn Store) {
    let to = fresh_run(store).await;
    let first = store.mailbox_send(&to, mail(None, json!("a"), 2, Some("s:1"))).await.must("send");
    store.mailbox_send(&to, mail(None, json!("b"), 2, None)).await.must("send");
    let again = store.mailbox_send(&to, mail(None, json!("a"), 2, Some("s:1"))).await.must("send retried");
    assert_eq!(again, first, "a retried send must answer the first seq even when the mailbox is full");
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 2, "no duplicate");
    let took = store.mailbox_receive(&to, Some("r:1")).await.must("receive").expect("a message");
    let retried = store.mailbox_receive(&to, Some("r:1")).await.must("receive retried").expect("a message");
    assert_eq!(took, retried, "a retried receive must answer the message the first took");
    assert_eq!(took.message, json!("a"));
    let next = store.mailbox_receive(&to, Some("r:2")).await.must("receive").expect("a message");
    assert_eq!(next.message, json!("b"));
    assert_eq!(store.mailbox_receive(&to, Some("r:3")).await.must("receive"), None);
    store.mailbox_send(&to, mail(None, json!("c"), 2, None)).await.must("send");
    let late = store.mailbox_receive(&to, Some("r:3")).await.must("receive again").expect("a message");
    assert_eq!(late.message, json!("c"), "a key whose first receive found nothing may take a message");
    assert_eq!(store.mailbox_receive(&to, Some("r:1")).await.must("receive").map(|m| m.seq), Some(first));
}

/// A send to a run of another tenant, or to no run, is `RunNotFound`; receiving from or
/// measuring an unknown run is too.
pub async fn mailbox_is_tenant_scoped(store: &dyn Store) {
    let to = fresh_run(store).await;
    let mut foreign = mail(None, json!("x"), 10, None);
    foreign.tenant = "conformance-other".to_owned();
    expect_error!(
        store.mailbox_send(&to, foreign).await,
        Error::RunNotFound(ref id) if *id == to,
        "a send to another tenant's run",
    );
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    let missing = RunId::generate(now_ms());
    expect_error!(
        store.mailbox_send(&missing, mail(None, json!("x"), 10, None)).await,
        Error::RunNotFound(_),
        "a send to no run",
    );
    expect_error!(store.mailbox_receive(&missing, None).await, Error::RunNotFound(_), "receive of no run");
    expect_error!(store.mailbox_len(&missing).await, Error::RunNotFound(_), "mailbox_len of no run");
}

/// A publish reaches every subscriber of the tenant's topic that has not ended, marked
/// with the topic; subscribing twice is once; a full mailbox fails the whole publish; a
/// retried publish (same key) delivers nothing twice.
pub async fn topics_publish_to_live_subscribers_all_or_nothing(store: &dyn Store) {
    let topic = format!("news-{}", RunId::generate(now_ms()));
    let mut runs = [fresh_run(store).await, fresh_run(store).await, fresh_run(store).await];
    runs.sort();
    let (a, b, c) = (runs[0].clone(), runs[1].clone(), runs[2].clone());
    let publish = |capacity: u64, key: Option<&str>| {
        let message = mail(None, json!({"headline": capacity}), capacity, key);
        store.topic_publish(&topic, message)
    };
    assert_eq!(publish(10, None).await.must("publish without subscribers"), []);
    for run in [&a, &b, &a] {
        store.topic_subscribe("conformance", &topic, run, true).await.must("topic_subscribe");
    }
    let delivered = publish(10, None).await.must("topic_publish");
    assert_eq!(delivered, [(a.clone(), 1), (b.clone(), 1)], "each subscriber once, by run id");
    let got = store.mailbox_receive(&b, None).await.must("receive").expect("the published message");
    assert_eq!((got.topic.as_deref(), got.message), (Some(topic.as_str()), json!({"headline": 10})));
    store.topic_subscribe("conformance", &topic, &b, false).await.must("unsubscribe");
    assert_eq!(publish(10, None).await.must("publish"), [(a.clone(), 2)], "b unsubscribed");

    store.topic_subscribe("conformance", &topic, &c, true).await.must("subscribe c");
    expect_error!(publish(2, None).await, Error::MailboxFull { ref run, .. } if *run == a, "a full subscriber");
    assert_eq!(store.mailbox_len(&c).await.must("mailbox_len"), 0, "a refused publish writes nothing");

    while store.mailbox_receive(&a, None).await.must("drain").is_some() {}
    let first = publish(10, Some("p:1")).await.must("publish with a key");
    let again = publish(10, Some("p:1")).await.must("publish retried");
    assert_eq!(first, again, "a retried publish answers the first deliveries");
    assert_eq!(store.mailbox_len(&a).await.must("len"), 1, "no duplicate");
    assert_eq!(store.mailbox_len(&c).await.must("len"), 1, "no duplicate");

    let patch = RunPatch { state: Some(RunState::Succeeded), ..RunPatch::default() };
    store.update_run(&c, None, patch).await.must("end c");
    let delivered = publish(10, None).await.must("publish");
    assert_eq!(delivered.iter().map(|(run, _)| run).collect::<Vec<_>>(), [&a], "ended runs get nothing");

    expect_error!(
        store.topic_subscribe("conformance-other", &topic, &a, true).await,
        Error::RunNotFound(_),
        "subscribing another tenant's run",
    );
    let mut foreign = mail(None, json!("x"), 10, None);
    foreign.tenant = "conformance-other".to_owned();
    assert_eq!(store.topic_publish(&topic, foreign).await.must("publish"), [], "topics are per tenant");
}

/// Receivers racing over one mailbox get every message exactly once.
pub async fn concurrent_mailbox_receives(store: Arc<dyn Store>) {
    let to = fresh_run(&*store).await;
    for i in 0..40u64 {
        store.mailbox_send(&to, mail(None, json!(i), 100, None)).await.must("mailbox_send");
    }
    let tasks = (0..8)
        .map(|r| {
            let store = Arc::clone(&store);
            let to = to.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut i = 0;
                loop {
                    let key = format!("r{r}:{i}");
                    i += 1;
                    match store.mailbox_receive(&to, Some(&key)).await.must("concurrent receive") {
                        Some(message) => got.push(message.seq),
                        None => break got,
                    }
                }
            })
        })
        .collect();
    let mut seqs: Vec<Seq> = join_all(tasks).await.into_iter().flatten().collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>(), "every message delivered exactly once");
}

fn audit_record(
    tenant: &str,
    run: Option<&RunId>,
    action: &str,
    outcome: &str,
    detail: Value,
) -> AuditRecord {
    AuditRecord {
        tenant: tenant.to_owned(),
        run_id: run.cloned(),
        at_ms: now_ms(),
        actor: "kernel".to_owned(),
        action: action.to_owned(),
        subject: "example.com".to_owned(),
        outcome: outcome.to_owned(),
        detail,
    }
}

/// Audit appends get dense seqs in order, each entry links to the one before it with the
/// documented hash, list filters by tenant, run, seq and limit, reads back every field
/// exactly, and verify finds the chain intact with the last entry's hash as its head.
pub async fn audit_append_list_filter_and_verify(store: &dyn Store) {
    let tenant = format!("audit-{}", RunId::generate(now_ms()));
    let run = fresh_run(store).await;
    let other_run = RunId::generate(now_ms());
    let records = vec![
        audit_record(&tenant, Some(&run), "egress", "allowed", json!({"port": 443, "n": 1.5})),
        audit_record(&tenant, Some(&run), "egress", "denied", json!({"reason": "not allowed"})),
        audit_record(&tenant, Some(&other_run), "tool.call", "ok", json!(null)),
        audit_record(
            &tenant,
            None,
            "approval.granted",
            "allowed",
            json!({"nested": {"b": [1, 2], "a": "x"}}),
        ),
    ];
    let seqs = store.audit_append(records.clone()).await.must("audit_append");
    assert_eq!(seqs.len(), 4, "store conformance: audit_append returns one seq per record");
    assert!(
        seqs.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "store conformance: one append's seqs are dense: {seqs:?}"
    );
    assert!(store.audit_append(Vec::new()).await.must("audit_append (none)").is_empty());
    let more = store
        .audit_append(vec![audit_record("other-tenant", Some(&run), "egress", "allowed", json!({}))])
        .await
        .must("audit_append (another tenant)");
    assert_eq!(more, vec![seqs[3] + 1], "store conformance: a later append continues the seqs");

    let filter = AuditFilter { tenant: Some(tenant.clone()), ..AuditFilter::default() };
    let listed = store.audit_list(&filter).await.must("audit_list by tenant");
    assert_eq!(listed.len(), 4, "store conformance: audit_list by tenant");
    for (entry, (record, seq)) in listed.iter().zip(records.iter().zip(&seqs)) {
        assert_eq!(entry.seq, *seq, "store conformance: audit entry seq");
        assert_eq!(&entry.record, record, "store conformance: an audit record reads back exactly");
        let expected = keel_core::audit::entry_hash(&entry.prev_hash, entry.seq, &record.canonical_json());
        assert_eq!(entry.hash, expected, "store conformance: an audit hash covers prev, seq and record");
    }
    for pair in listed.windows(2) {
        assert_eq!(
            pair[1].prev_hash, pair[0].hash,
            "store conformance: each audit entry links to the previous"
        );
    }

    let by_run = AuditFilter { run_id: Some(run.clone()), ..AuditFilter::default() };
    let by_run: Vec<Seq> =
        store.audit_list(&by_run).await.must("audit_list by run").iter().map(|entry| entry.seq).collect();
    assert_eq!(by_run, vec![seqs[0], seqs[1], more[0]], "store conformance: audit_list by run, all tenants");
    let paged =
        AuditFilter { tenant: Some(tenant.clone()), after_seq: seqs[0], limit: Some(2), run_id: None };
    let paged: Vec<Seq> =
        store.audit_list(&paged).await.must("audit_list paged").iter().map(|entry| entry.seq).collect();
    assert_eq!(paged, vec![seqs[1], seqs[2]], "store conformance: audit_list after a seq, limited");

    let verified = store.audit_verify().await.must("audit_verify");
    assert_eq!(verified.broken, None, "store conformance: a clean audit chain verifies");
    assert!(verified.entries >= more[0], "store conformance: verify checks every entry");
    let everything = AuditFilter { after_seq: verified.entries - 1, ..AuditFilter::default() };
    let last = store.audit_list(&everything).await.must("audit_list (last)");
    assert_eq!(
        Some(&verified.head_hash),
        last.last().map(|entry| &entry.hash),
        "store conformance: verify reports the last entry's hash as the head"
    );
}

/// Appends racing from many tasks still form one linear chain.
pub async fn concurrent_audit_appends_form_one_chain(store: Arc<dyn Store>) {
    let tenant = format!("audit-race-{}", RunId::generate(now_ms()));
    let tasks: Vec<JoinHandle<Vec<Seq>>> = (0..16)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenant = tenant.clone();
            tokio::spawn(async move {
                let records =
                    (0..3).map(|j| audit_record(&tenant, None, "egress", "allowed", json!([i, j]))).collect();
                store.audit_append(records).await.must("audit_append (concurrent)")
            })
        })
        .collect();
    let mut seqs: Vec<Seq> = join_all(tasks).await.into_iter().flatten().collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 48, "store conformance: concurrent audit appends get distinct seqs");
    let verified = store.audit_verify().await.must("audit_verify (after concurrent appends)");
    assert_eq!(verified.broken, None, "store conformance: concurrent audit appends form one chain");
}

/// Tenants are created once (a second create is `TenantExists`), read back exactly, and
/// listed by name.
pub async fn tenants_create_get_list(store: &dyn Store) {
    let name = format!("tenant-{}", RunId::generate(now_ms()));
    let tenant = crate::TenantRecord {
        name: name.clone(),
        created_at_ms: 7,
        quota: json!({"max_runs": 2, "max_usd_per_run": 0.5}),
    };
    store.tenant_create(tenant.clone()).await.must("tenant_create");
    expect_error!(
        store.tenant_create(tenant.clone()).await,
        Error::TenantExists(taken) if taken == name,
        "tenant_create of a taken name"
    );
    assert_eq!(
        store.tenant_get(&name).await.must("tenant_get"),
        Some(tenant.clone()),
        "store conformance: a tenant reads back exactly"
    );
    assert_eq!(store.tenant_get("no-such-tenant").await.must("tenant_get (unknown)"), None);
    let listed = store.tenant_list().await.must("tenant_list");
    assert!(listed.contains(&tenant), "store conformance: tenant_list includes a created tenant");
    assert!(
        listed.windows(2).all(|pair| pair[0].name < pair[1].name),
        "store conformance: tenant_list is ordered by name"
    );
}

/// Tokens are stored by hash for an existing tenant only, looked up by hash, listed per
/// tenant, and revoked by prefix within their tenant only.
pub async fn tokens_create_lookup_list_revoke(store: &dyn Store) {
    let name = format!("tokens-{}", RunId::generate(now_ms()));
    let other = format!("tokens-other-{}", RunId::generate(now_ms()));
    for tenant in [&name, &other] {
        let record = crate::TenantRecord { name: tenant.clone(), created_at_ms: 1, quota: json!({}) };
        store.tenant_create(record).await.must("tenant_create");
    }
    let token = |hash: &str, prefix: &str, tenant: &str, label: Option<&str>| crate::ApiTokenRecord {
        hash: hash.to_owned(),
        prefix: prefix.to_owned(),
        tenant: tenant.to_owned(),
        created_at_ms: 3,
        label: label.map(str::to_owned),
        revoked: false,
    };
    let first = token(&format!("{name}-h1"), "kt_aaaa", &name, Some("ci"));
    let second = token(&format!("{name}-h2"), "kt_bbbb", &name, None);
    let foreign = token(&format!("{name}-h3"), "kt_aaaa", &other, None);
    for record in [&first, &second, &foreign] {
        store.token_create(record.clone()).await.must("token_create");
    }
    expect_error!(
        store.token_create(token("orphan-hash", "kt_cccc", "no-such-tenant", None)).await,
        Error::TenantNotFound(_),
        "token_create for an unknown tenant"
    );
    assert_eq!(store.token_lookup(&first.hash).await.must("token_lookup"), Some(first.clone()));
    assert_eq!(store.token_lookup("unknown").await.must("token_lookup (unknown)"), None);
    assert_eq!(
        store.token_list(&name).await.must("token_list"),
        vec![first.clone(), second.clone()],
        "store conformance: token_list lists the tenant's tokens only"
    );

    assert_eq!(store.token_revoke(&name, "kt_aaaa").await.must("token_revoke"), 1);
    assert_eq!(store.token_revoke(&name, "kt_aaaa").await.must("token_revoke (again)"), 0);
    assert_eq!(store.token_revoke(&name, "kt_none").await.must("token_revoke (unknown)"), 0);
    let revoked = store.token_lookup(&first.hash).await.must("token_lookup (revoked)");
    assert_eq!(revoked.map(|t| t.revoked), Some(true), "store conformance: a revoked token reads as revoked");
    let untouched = store.token_lookup(&foreign.hash).await.must("token_lookup (other tenant)");
    assert_eq!(
        untouched.map(|t| t.revoked),
        Some(false),
        "store conformance: revoking by prefix touches only the named tenant's tokens"
    );
}

/// `RunFilter::tenant` lists one tenant's runs, with the state filter and limit.
pub async fn runs_list_by_tenant(store: &dyn Store) {
    let tenant = format!("runs-{}", RunId::generate(now_ms()));
    let mut mine = Vec::new();
    let start = now_ms();
    for (i, state) in [RunState::Running, RunState::Succeeded, RunState::Running].into_iter().enumerate() {
        let run = NewRun { tenant: tenant.clone(), ..new_run(start + i as u64, state) };
        mine.push(store.create_run(run).await.must("create_run").id);
    }
    store.create_run(new_run(now_ms(), RunState::Running)).await.must("create_run (another tenant)");
    let filter = RunFilter { tenant: Some(tenant.clone()), ..RunFilter::default() };
    let listed: Vec<RunId> =
        store.list_runs(&filter).await.must("list_runs by tenant").into_iter().map(|r| r.id).collect();
    assert_eq!(listed, vec![mine[2].clone(), mine[1].clone(), mine[0].clone()]);
    let running = RunFilter { states: vec![RunState::Running], limit: Some(1), tenant: Some(tenant) };
    let listed: Vec<RunId> = store
        .list_runs(&running)
        .await
        .must("list_runs by tenant and state")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, vec![mine[2].clone()], "store conformance: tenant, state and limit combine");
}

fn new_run(created_at_ms: u64, state: RunState) -> NewRun {
    NewRun {
        id: RunId::generate(created_at_ms),
        tenant: "conformance".to_owned(),
        spec: json!({"command": ["python3", "agent.py"], "env": {"MODE": "test"}}),
        state,
        created_at_ms,
    }
}

async fn fresh_run(store: &dyn Store) -> RunId {
    store.create_run(new_run(now_ms(), RunState::Created)).await.must("create_run").id
}

fn usage(
    input_tokens: u64,
    output_tokens: u64,
    llm_calls: u64,
    tool_calls: u64,
    cost_micro_usd: u64,
) -> Usage {
    Usage { input_tokens, output_tokens, llm_calls, tool_calls, cost_micro_usd }
}

/// An intent: the entry written before an effect.
fn pending_entry(method: &str, params: Value) -> NewEntry {
    NewEntry {
        method: method.to_owned(),
        params_hash: format!("{method}:{params}"),
        params,
        status: EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms: 1_700_000_000_000,
        finished_at_ms: None,
        usage: Usage::default(),
    }
}

/// An entry complete at once, ok (with a result) or error (with an error).
fn complete_entry(method: &str, params: Value, status: EntryStatus, usage: Usage) -> NewEntry {
    let outcome = json!({"for": method});
    NewEntry {
        result: (status == EntryStatus::Ok).then(|| outcome.clone()),
        error: (status == EntryStatus::Error).then_some(outcome),
        finished_at_ms: Some(1_700_000_000_002),
        usage,
        status,
        attempt: 2,
        ..pending_entry(method, params)
    }
}

fn ok_completion(result: Value, usage: Usage, provider_served: bool) -> Completion {
    Completion {
        status: EntryStatus::Ok,
        result: Some(result),
        error: None,
        finished_at_ms: 1_700_000_000_001,
        usage,
        provider_served,
    }
}

#[track_caller]
fn assert_entry_matches(stored: &crate::JournalEntry, appended: &NewEntry) {
    let NewEntry {
        method,
        params,
        params_hash,
        status,
        result,
        error,
        attempt,
        started_at_ms,
        finished_at_ms,
        usage,
    } = appended;
    let seq = stored.seq;
    assert_eq!(&stored.method, method, "entry {seq}: method");
    assert_eq!(&stored.params, params, "entry {seq}: params must read back exactly");
    assert_eq!(&stored.params_hash, params_hash, "entry {seq}: params_hash");
    assert_eq!(&stored.status, status, "entry {seq}: status");
    assert_eq!(&stored.result, result, "entry {seq}: result");
    assert_eq!(&stored.error, error, "entry {seq}: error");
    assert_eq!(&stored.attempt, attempt, "entry {seq}: attempt");
    assert_eq!(&stored.started_at_ms, started_at_ms, "entry {seq}: started_at_ms");
    assert_eq!(&stored.finished_at_ms, finished_at_ms, "entry {seq}: finished_at_ms");
    assert_eq!(&stored.usage, usage, "entry {seq}: usage");
}

async fn list_ids(store: &dyn Store, states: &[RunState], limit: Option<usize>) -> Vec<RunId> {
    let filter = RunFilter { states: states.to_vec(), limit, tenant: None };
    store.list_runs(&filter).await.must("list_runs").into_iter().map(|run| run.id).collect()
}

#[track_caller]
fn assert_newest_first(runs: &[RunRecord]) {
    for pair in runs.windows(2) {
        assert!(
            pair[0].created_at_ms >= pair[1].created_at_ms,
            "list_runs must order newest first, but {} ({}) precedes {} ({})",
            pair[0].id,
            pair[0].created_at_ms,
            pair[1].id,
            pair[1].created_at_ms
        );
    }
}

async fn journal_statuses(store: &dyn Store, run: &RunId) -> Vec<EntryStatus> {
    store.journal(run, 0).await.must("journal").iter().map(|entry| entry.status).collect()
}

/// Awaits every task in order, re-raising a task's panic so its message reaches the test.
async fn join_all<T: Debug>(tasks: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        match task.await {
            Ok(output) => outputs.push(output),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("store conformance: a spawned task was cancelled: {error}"),
        }
    }
    outputs
}
