//! Conformance checks of the journal: append, complete, abandon, paging, the latest ok
//! entry, usage totals, and concurrent appends whose failures stay isolated.

use std::sync::Arc;

use keel_types::{EntryStatus, RunId, RunState, Usage};
use serde_json::json;
use tokio::task::JoinHandle;

use super::{
    ExpectRun, Must, complete_entry, fresh_run, join_all, now_ms, ok_completion, pending_entry, usage,
};
use crate::{Completion, Error, JournalEntry, NewEntry, NewEvent, RunPatch, Seq, Store};

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
        seqs.push(store.append_entry(&run, entry).await.must("append_entry"));
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
        .complete_entry(&run, 1, &ok_completion(result.clone(), usage, true))
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
        store.complete_entry(&run, 1, &again).await,
        Error::Corrupt(message) if message.contains("not pending"),
        "completing an entry twice"
    );
    expect_error!(
        store.complete_entry(&run, 2, &again).await,
        Error::Corrupt(message) if message.contains("not pending"),
        "completing an entry that was appended complete"
    );
    expect_error!(
        store.complete_entry(&run, 99, &again).await,
        Error::EntryNotFound { run: missing_run, seq: 99 } if missing_run == run,
        "completing an unknown seq"
    );
    let after_failures = &store.journal(&run, 0).await.must("journal")[0];
    assert_eq!(after_failures, completed, "a rejected completion must leave the entry unchanged");

    let not_an_outcome = Completion { status: EntryStatus::Pending, ..ok_completion(json!(1), usage, true) };
    expect_error!(
        store.complete_entry(&run, 4, &not_an_outcome).await,
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
    store.complete_entry(&run, 4, &failure).await.must("complete_entry with an error");
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
        .append_entry(&run, &complete_entry("llm.chat", json!({"n": 0}), EntryStatus::Ok, usages[0]))
        .await
        .must("append_entry complete");
    for (index, (usage, provider_served)) in usages[1..].iter().zip([true, false, true]).enumerate() {
        let seq = store
            .append_entry(&run, &pending_entry("llm.chat", json!({"n": index + 1})))
            .await
            .must("append_entry pending");
        let mut completion = ok_completion(json!({"n": index + 1}), *usage, provider_served);
        if index == 2 {
            completion.status = EntryStatus::Error;
            completion.result = None;
            completion.error = Some(json!("rate limited"));
        }
        store.complete_entry(&run, seq, &completion).await.must("complete_entry");
        expect_error!(
            store.complete_entry(&run, seq, &completion).await,
            Error::Corrupt(_),
            "completing an entry twice"
        );
    }
    // A pending entry's usage is not counted: it has not been spent yet.
    let mut never_completed = pending_entry("llm.chat", json!({"n": "never"}));
    never_completed.usage = usage(1, 1, 1, 1, 1);
    store.append_entry(&run, &never_completed).await.must("append_entry pending");

    let mut expected = Usage::default();
    for usage in &usages {
        expected.add(usage);
    }
    let stored = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(stored.usage, expected, "run usage must be the exact sum of completed entries");
    assert_eq!(stored.provider_calls, 2, "provider_calls must count provider-served completions");
}

/// `complete_entry_with` completes an entry and appends the entries after it in one
/// commit: all of them land with their usage and the completion's, and when the completion
/// is refused (the entry is no longer pending) none of the entries land either.
pub async fn journal_complete_with_entries(store: &dyn Store) {
    let run = fresh_run(store).await;
    let exec = store
        .append_entry(&run, &pending_entry("code.exec", json!({"code": "1 + 1"})))
        .await
        .must("append_entry pending");
    let reads = [
        complete_entry("tool.call", json!({"exec": exec, "n": 0}), EntryStatus::Ok, usage(0, 0, 0, 1, 0)),
        complete_entry("tool.call", json!({"exec": exec, "n": 1}), EntryStatus::Error, usage(0, 0, 0, 1, 5)),
        // An entry that is not complete counts no usage, as with `append_entry`.
        pending_entry("tool.call", json!({"exec": exec, "n": 2})),
    ];
    let completion = ok_completion(json!({"result": 2}), usage(10, 2, 1, 0, 40), true);
    let seqs = store.complete_entry_with(&run, exec, &completion, &reads).await.must("complete_entry_with");
    assert_eq!(seqs, [exec + 1, exec + 2, exec + 3], "the entries follow, dense");
    let journal = store.journal(&run, 0).await.must("journal");
    assert_eq!(journal.len(), 4, "{journal:?}");
    assert_eq!(journal[0].status, EntryStatus::Ok);
    assert_eq!(journal[0].result, completion.result, "the completion's result must be stored");
    for (stored, appended) in journal[1..].iter().zip(&reads) {
        assert_entry_matches(stored, appended);
    }
    let stored = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(stored.usage, usage(10, 2, 1, 2, 45), "the completion's usage plus the complete entries'");
    assert_eq!(stored.provider_calls, 1);

    // Completed already: refused, and none of the entries are appended.
    expect_error!(
        store.complete_entry_with(&run, exec, &completion, &reads).await,
        Error::Corrupt(_),
        "completing an entry twice, with entries"
    );
    assert_eq!(store.journal(&run, 0).await.must("journal").len(), 4, "a refused completion appends nothing");
    let unchanged = store.get_run(&run).await.must("get_run").expect_run(&run);
    assert_eq!(unchanged.usage, stored.usage, "a refused completion adds no usage");
}

/// `abandon_entries` marks exactly the given entries, all or nothing, keeps usage totals,
/// and an abandoned entry cannot be completed.
pub async fn journal_abandon_entries(store: &dyn Store) {
    let run = fresh_run(store).await;
    store
        .append_entry(
            &run,
            &complete_entry("llm.chat", json!({"n": 1}), EntryStatus::Ok, usage(1, 2, 1, 0, 3)),
        )
        .await
        .must("append_entry");
    for n in 2..=5 {
        store.append_entry(&run, &pending_entry("tool.call", json!({"n": n}))).await.must("append_entry");
    }
    store
        .complete_entry(&run, 3, &ok_completion(json!("ok"), usage(0, 0, 0, 1, 0), false))
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
            .complete_entry(&run, 4, &ok_completion(json!("late"), Usage::default(), true))
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
        store.append_entry(&run, &pending_entry("tool.call", json!({"n": n}))).await.must("append_entry");
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
        store.append_entry(&run, &entry).await.must("append_entry");
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
        .complete_entry(&run, 6, &ok_completion(json!("saved"), Usage::default(), false))
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
                    .append_entry(&run, &pending_entry("tool.call", json!({"task": task})))
                    .await
                    .must("concurrent append_entry");
                let completion = ok_completion(json!({"task": task}), usage(0, 0, 0, 1, 0), true);
                store.complete_entry(&run, seq, &completion).await.must("concurrent complete_entry");
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
                        .append_entry(&run, &pending_entry("llm.chat", params))
                        .await
                        .must("concurrent append_entry");
                    assert_eq!(seq, step, "run {run}: seqs of one writer must be dense");
                    store
                        .complete_entry(&run, seq, &ok_completion(json!(step), usage(1, 1, 1, 0, 1), true))
                        .await
                        .must("concurrent complete_entry");
                    let event = NewEvent { ts_ms: step, kind: "stdout".to_owned(), data: json!(step) };
                    let event_seq =
                        store.append_events(&run, &[event]).await.must("concurrent append_events");
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
        .append_entry(&run, &complete_entry("seed", json!({}), EntryStatus::Ok, Usage::default()))
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
                            .append_entry(&run, &pending_entry("tool.call", json!({"task": task})))
                            .await
                            .must("append_entry beside failing writes"),
                    ),
                    2 => {
                        expect_error!(
                            store
                                .append_entry(&ghost, &pending_entry("tool.call", json!({"task": task})))
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
                                    &ok_completion(json!(task), usage(1, 1, 1, 1, 1), true)
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

#[track_caller]
fn assert_entry_matches(stored: &JournalEntry, appended: &NewEntry) {
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

async fn journal_statuses(store: &dyn Store, run: &RunId) -> Vec<EntryStatus> {
    store.journal(run, 0).await.must("journal").iter().map(|entry| entry.status).collect()
}
