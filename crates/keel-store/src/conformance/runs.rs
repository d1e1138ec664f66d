//! Conformance checks of runs: create, read, list (by state, tenant, limit), patch,
//! compare-and-set, and `RunNotFound` for every per-run method on an unknown run.

use keel_types::{RunId, RunState, Usage, WaitReason};
use serde_json::json;

use super::{ExpectRun, Must, fresh_run, new_run, now_ms, ok_completion, pending_entry};
use crate::{Error, NewRun, RunCount, RunFilter, RunPatch, RunRecord, Store};

/// Creating a run returns it as stored (with the documented defaults), `get_run` reads it
/// back, and `list_runs` filters by state, limits, and orders newest first.
pub async fn runs_create_get_list(store: &dyn Store) {
    let created_at_ms = now_ms();
    let new = new_run(created_at_ms, RunState::Created);
    let created = store.create_run(new.clone()).await.must("create_run");
    let expected = RunRecord {
        id: new.id.clone(),
        tenant: new.tenant.clone(),
        spec: crate::SpecJson::from(&new.spec),
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
        .list_runs(&RunFilter { states: vec![RunState::Paused], ..RunFilter::default() })
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
            .append_entry(&ghost, &pending_entry("llm.chat", json!({})))
            .await,
        Error::RunNotFound(id) if is_ghost(&id),
        "append_entry to an unknown run"
    );
    expect_error!(
        store
            .complete_entry(&ghost, 1, &ok_completion(json!(1), Usage::default(), false))
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
        store.append_events(&ghost, &[]).await,
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
    let running = RunFilter {
        states: vec![RunState::Running],
        limit: Some(1),
        tenant: Some(tenant),
        ..RunFilter::default()
    };
    let listed: Vec<RunId> = store
        .list_runs(&running)
        .await
        .must("list_runs by tenant and state")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, vec![mine[2].clone()], "store conformance: tenant, state and limit combine");
}

async fn list_ids(store: &dyn Store, states: &[RunState], limit: Option<usize>) -> Vec<RunId> {
    let filter = RunFilter { states: states.to_vec(), limit, ..RunFilter::default() };
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

/// `count_runs` groups runs by tenant, state, wait reason and whether they have a process,
/// counts every run once, and follows state changes; tenants are counted apart.
pub async fn runs_counted_by_tenant_and_state(store: &dyn Store) {
    let tenant = format!("counts-{}", RunId::generate(now_ms()));
    let other = format!("counts-other-{}", RunId::generate(now_ms()));
    let start = now_ms();
    let mut ids = Vec::new();
    let states =
        [RunState::Running, RunState::Running, RunState::Queued, RunState::Waiting, RunState::Waiting];
    for (i, state) in states.into_iter().enumerate() {
        let run = NewRun { tenant: tenant.clone(), ..new_run(start + i as u64, state) };
        ids.push(store.create_run(run).await.must("create_run").id);
    }
    let run = NewRun { tenant: other.clone(), ..new_run(start, RunState::Running) };
    store.create_run(run).await.must("create_run (another tenant)");
    // Two runs wait for a human: one with its process (resident), one without (swapped).
    let resident =
        RunPatch { wait_reason: Some(Some(WaitReason::Human)), pid: Some(Some(4242)), ..RunPatch::default() };
    store.update_run(&ids[3], None, resident).await.must("update_run (resident wait)");
    let swapped = RunPatch { wait_reason: Some(Some(WaitReason::Human)), ..RunPatch::default() };
    store.update_run(&ids[4], None, swapped).await.must("update_run (swapped wait)");
    // A running run with a process, to tell `has_pid` apart within one state.
    store
        .update_run(&ids[1], None, RunPatch { pid: Some(Some(77)), ..RunPatch::default() })
        .await
        .must("update_run (pid)");

    let counts = |all: Vec<RunCount>, tenant: &str| {
        let mut mine: Vec<(RunState, Option<WaitReason>, bool, u64)> = all
            .into_iter()
            .filter(|count| count.tenant == tenant)
            .map(|count| (count.state, count.wait_reason, count.has_pid, count.count))
            .collect();
        mine.sort_by_key(|(state, reason, pid, _)| (state.as_str(), reason.map(WaitReason::as_str), *pid));
        mine
    };
    let all = store.count_runs().await.must("count_runs");
    let pairs: Vec<_> = all.iter().map(|c| (&c.tenant, c.state, c.wait_reason, c.has_pid)).collect();
    let mut unique = pairs.clone();
    unique.sort_by_key(|(tenant, state, reason, pid)| {
        ((*tenant).clone(), state.as_str(), reason.map(WaitReason::as_str), *pid)
    });
    unique.dedup();
    assert_eq!(
        unique.len(),
        pairs.len(),
        "store conformance: count_runs must return each group once: {all:?}"
    );
    assert!(all.iter().all(|c| c.count > 0), "store conformance: count_runs must not return empty groups");
    assert_eq!(
        counts(all.clone(), &tenant),
        vec![
            (RunState::Queued, None, false, 1),
            (RunState::Running, None, false, 1),
            (RunState::Running, None, true, 1),
            (RunState::Waiting, Some(WaitReason::Human), false, 1),
            (RunState::Waiting, Some(WaitReason::Human), true, 1),
        ],
        "store conformance: count_runs must group by state, wait reason and process"
    );
    assert_eq!(counts(all, &other), vec![(RunState::Running, None, false, 1)]);

    // A state change moves the run from one group to another.
    let done = RunPatch { state: Some(RunState::Succeeded), ..RunPatch::default() };
    store.update_run(&ids[2], None, done).await.must("update_run (end)");
    let after = counts(store.count_runs().await.must("count_runs after a change"), &tenant);
    assert!(after.contains(&(RunState::Succeeded, None, false, 1)), "{after:?}");
    assert!(
        !after.iter().any(|(state, ..)| *state == RunState::Queued),
        "store conformance: count_runs must follow a state change: {after:?}"
    );
    let total: u64 = after.iter().map(|(.., count)| count).sum();
    assert_eq!(total, 5, "store conformance: count_runs must count each run once");
}
