//! Triggers and their fires: create, list by tenant, pause, delete; an occasion recorded
//! once whatever races it; fires without their run found; newest fires first.

use std::sync::Arc;

use keel_types::{RunId, RunState};
use serde_json::json;

use super::{Must, new_run, now_ms};
use crate::{Error, FireRecord, Store, TriggerRecord};

fn trigger(name: &str, tenant: &str) -> TriggerRecord {
    TriggerRecord {
        kind: "schedule".into(),
        name: name.into(),
        tenant: tenant.into(),
        spec: json!({"cron": "*/2 * * * * *", "run": {"command": ["true"]}}),
        paused: false,
        since_ms: 1_000,
        created_at_ms: 1_000,
    }
}

fn fire(name: &str, at_ms: u64, run_id: Option<RunId>) -> FireRecord {
    FireRecord {
        kind: "schedule".into(),
        trigger: name.into(),
        occasion: at_ms.to_string(),
        tenant: "conformance".into(),
        at_ms,
        run_id,
        outcome: "fired".into(),
        detail: None,
        fired_at_ms: at_ms + 3,
    }
}

pub async fn triggers_create_list_pause_delete(store: &dyn Store) {
    let unique = RunId::generate(now_ms()).to_string();
    let (a, b) = (format!("a-{unique}"), format!("b-{unique}"));
    let tenant = format!("t-{unique}");
    store.trigger_create(trigger(&a, &tenant)).await.must("creating a trigger");
    store.trigger_create(trigger(&b, &tenant)).await.must("creating a second trigger");
    expect_error!(
        store.trigger_create(trigger(&a, "other")).await,
        Error::TriggerExists { .. },
        "creating a trigger whose kind and name are taken (by any tenant)"
    );
    let mut hook = trigger(&a, &tenant);
    hook.kind = "hook".into();
    store.trigger_create(hook).await.must("a hook may share a schedule's name");
    let read = store.trigger_get("schedule", &a).await.must("reading a trigger");
    assert_eq!(read, Some(trigger(&a, &tenant)), "store conformance: a trigger reads back as written");
    let listed = store.trigger_list("schedule", Some(&tenant)).await.must("listing a tenant's triggers");
    let names: Vec<_> = listed.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, [a.clone(), b.clone()], "store conformance: a tenant's triggers by name");
    let everyone = store.trigger_list("schedule", None).await.must("listing all triggers");
    assert!(everyone.iter().any(|t| t.name == a), "store conformance: listing without a tenant lists all");
    assert!(store.trigger_list("schedule", Some("nobody")).await.must("listing").is_empty());

    assert!(store.trigger_set_paused("schedule", &a, true, 5_000).await.must("pausing"));
    let paused = store.trigger_get("schedule", &a).await.must("reading").expect("a paused trigger exists");
    assert!(paused.paused && paused.since_ms == 5_000, "store conformance: pause sets paused and since");
    assert!(
        !store.trigger_set_paused("schedule", "missing", true, 1).await.must("pausing a missing trigger")
    );

    store.trigger_fire(fire(&a, 10_000, None)).await.must("recording a fire");
    assert!(store.trigger_delete("schedule", &a).await.must("deleting a trigger"));
    assert!(!store.trigger_delete("schedule", &a).await.must("deleting it again"));
    assert_eq!(store.trigger_get("schedule", &a).await.must("reading a deleted trigger"), None);
    assert!(store.trigger_fires("schedule", &a, 10).await.must("reading fires").is_empty());
    assert!(store.trigger_get("hook", &a).await.must("reading the hook").is_some(), "other kinds stay");
}

pub async fn trigger_fires_are_recorded_once(store: Arc<dyn Store>) {
    let name = format!("fires-{}", RunId::generate(now_ms()));
    // Eight racers record the same occasion with run ids of their own: one wins, every
    // one reads back the winner's run id.
    let mut racers = Vec::new();
    for _ in 0..8 {
        let store = Arc::clone(&store);
        let name = name.clone();
        racers.push(tokio::spawn(async move {
            store.trigger_fire(fire(&name, 20_000, Some(RunId::generate(now_ms())))).await
        }));
    }
    let mut winners = 0;
    let mut run_ids = std::collections::BTreeSet::new();
    for racer in racers {
        let (stored, wrote) = racer.await.expect("a racer panicked").must("recording a fire concurrently");
        winners += usize::from(wrote);
        run_ids.insert(stored.run_id.expect("the fire has a run id"));
    }
    assert_eq!((winners, run_ids.len()), (1, 1), "store conformance: an occasion is recorded once");

    let skipped =
        FireRecord { outcome: "skipped".into(), detail: Some("busy".into()), ..fire(&name, 22_000, None) };
    store.trigger_fire(skipped.clone()).await.must("recording a skipped tick");
    store.trigger_fire(fire(&name, 18_000, None)).await.must("recording an older tick");
    let newest = store.trigger_fires("schedule", &name, 2).await.must("reading the newest fires");
    let times: Vec<_> = newest.iter().map(|f| f.at_ms).collect();
    assert_eq!(times, [22_000, 20_000], "store conformance: fires newest first, limited");
    assert_eq!(newest[0], skipped, "store conformance: a fire reads back as written");

    // A fire whose run was never created is found; once the run exists it is not.
    let run = new_run(now_ms(), RunState::Created);
    let (pending, _) = store.trigger_fire(fire(&name, 30_000, Some(run.id.clone()))).await.must("recording");
    let unstarted = store.trigger_fires_unstarted("schedule").await.must("listing unstarted fires");
    assert!(unstarted.contains(&pending), "store conformance: a fire without its run is unstarted");
    let lost = run.id.clone();
    store.create_run(run).await.must("creating the fire's run");
    let unstarted = store.trigger_fires_unstarted("schedule").await.must("listing unstarted fires");
    assert!(
        !unstarted.iter().any(|f| f.run_id.as_ref() == Some(&lost)),
        "store conformance: a fire whose run exists is started"
    );
    store
        .trigger_fire_settle("schedule", &name, "20000", "failed", Some("sandbox refused"))
        .await
        .must("settling a fire");
    let unstarted = store.trigger_fires_unstarted("schedule").await.must("listing unstarted fires");
    assert!(
        !unstarted.iter().any(|f| f.trigger == name && f.occasion == "20000"),
        "store conformance: a failed fire is not retried"
    );
    let failed = store.trigger_fires("schedule", &name, 10).await.must("reading fires");
    let settled = failed.iter().find(|f| f.occasion == "20000").expect("the settled fire");
    assert_eq!((settled.outcome.as_str(), settled.detail.as_deref()), ("failed", Some("sandbox refused")));
}

pub async fn triggers_update_keeps_fires_and_pause(store: &dyn Store) {
    let name = format!("update-{}", RunId::generate(now_ms()));
    store.trigger_create(trigger(&name, "before")).await.must("creating a trigger");
    store.trigger_set_paused("schedule", &name, true, 7_000).await.must("pausing");
    store.trigger_fire(fire(&name, 10_000, None)).await.must("recording a fire");
    let spec = json!({"cron": "0 9 * * *", "declared": true});
    assert!(store.trigger_update("schedule", &name, "after", &spec).await.must("updating a trigger"));
    let read = store.trigger_get("schedule", &name).await.must("reading").expect("the updated trigger");
    assert_eq!(
        (read.tenant.as_str(), &read.spec, read.paused, read.since_ms, read.created_at_ms),
        ("after", &spec, true, 7_000, 1_000),
        "store conformance: an update replaces tenant and spec and keeps the rest"
    );
    let fires = store.trigger_fires("schedule", &name, 10).await.must("reading fires");
    assert_eq!(fires.len(), 1, "store conformance: an update keeps the trigger's fires");
    assert!(
        !store.trigger_update("schedule", "missing", "t", &spec).await.must("updating a missing trigger"),
        "store conformance: updating a missing trigger says so"
    );
    store.trigger_delete("schedule", &name).await.must("cleaning up");
}

pub async fn runs_ended_after_pages_in_end_order(store: &dyn Store) {
    let tenant = format!("ended-{}", RunId::generate(now_ms()));
    let base = now_ms();
    // Five runs ending at 100, 200, 200, 200, 300 ms after `base`, one still live, and one
    // of another tenant ending in the same window.
    let mut ended = Vec::new();
    for (offset, state) in [
        (100, RunState::Succeeded),
        (200, RunState::Failed),
        (200, RunState::Succeeded),
        (200, RunState::Cancelled),
        (300, RunState::Succeeded),
    ] {
        let run = tenant_run(&tenant);
        let id = store.create_run(run).await.must("creating a run").id;
        let patch = crate::RunPatch {
            state: Some(state),
            ended_at_ms: Some(Some(base + offset)),
            updated_at_ms: Some(base + offset),
            ..Default::default()
        };
        store.update_run(&id, None, patch).await.must("ending a run");
        ended.push((base + offset, id));
    }
    store.create_run(tenant_run(&tenant)).await.must("creating a live run");
    let other = store.create_run(tenant_run("someone-else")).await.must("another tenant's run").id;
    let patch = crate::RunPatch {
        state: Some(RunState::Succeeded),
        ended_at_ms: Some(Some(base + 150)),
        ..Default::default()
    };
    store.update_run(&other, None, patch).await.must("ending another tenant's run");
    ended.sort();
    let expected: Vec<RunId> = ended.iter().map(|(_, id)| id.clone()).collect();

    let all = store.runs_ended_after(&tenant, base, None, 100).await.must("listing ended runs");
    let ids: Vec<RunId> = all.iter().map(|run| run.id.clone()).collect();
    assert_eq!(ids, expected, "store conformance: a tenant's ended runs, oldest end first, ties by id");
    let after = store.runs_ended_after(&tenant, base + 200, None, 100).await.must("listing after a time");
    assert_eq!(
        after.iter().map(|run| run.id.clone()).collect::<Vec<_>>(),
        expected[4..],
        "store conformance: strictly after the time when no id is given"
    );
    // Pages of two, each starting after the last one's (end, id), read each run once.
    let mut paged = Vec::new();
    let mut cursor: Option<(u64, RunId)> = None;
    loop {
        let (after_ms, after_id) = match &cursor {
            Some((ms, id)) => (*ms, Some(id)),
            None => (base, None),
        };
        let page = store.runs_ended_after(&tenant, after_ms, after_id, 2).await.must("a page of ended runs");
        let Some(last) = page.last() else { break };
        cursor = Some((last.ended_at_ms.expect("an ended run has its end"), last.id.clone()));
        paged.extend(page.into_iter().map(|run| run.id));
    }
    assert_eq!(paged, expected, "store conformance: paging by (end, id) reads every ended run once");
    assert!(
        store.runs_ended_after(&tenant, base + 300, None, 10).await.must("listing after the last").is_empty()
    );
}

/// A new live run of `tenant` (`new_run` makes the conformance tenant's).
fn tenant_run(tenant: &str) -> crate::NewRun {
    crate::NewRun { tenant: tenant.to_owned(), ..new_run(now_ms(), RunState::Running) }
}
