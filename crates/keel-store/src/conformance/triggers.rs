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
