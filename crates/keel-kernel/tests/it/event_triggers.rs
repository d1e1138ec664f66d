//! Event triggers against kernels that stop at the wrong moment: a publish recorded by a
//! kernel that starts no triggered run (one embedded in a command), and a run end whose
//! fire was recorded by a kernel that died before creating its run. The next kernel that
//! fires event triggers creates each recorded run once, its input rebuilt from what fired
//! it (the publish in its run's journal, the ended run's record).

use keel_kernel::Principal;
use keel_protocol::api::CreateRunParams;
use keel_protocol::triggers::CreateEventTriggerParams;
use keel_store::{FireRecord, RunFilter};
use keel_types::{RunId, RunState};
use serde_json::{Value, json};

use crate::harness::{TestKernel, wait_for};

fn trigger(test: &TestKernel, name: &str, after_run: Option<&str>, topic: Option<&str>) {
    let run: CreateRunParams = serde_json::from_value(json!({
        "command": ["true"], "cwd": test.scratch(), "sandbox": {"tier": "none"}, "input": {"given": 1},
    }))
    .unwrap();
    let params = CreateEventTriggerParams {
        name: name.into(),
        after_run: after_run.map(str::to_owned),
        on: after_run.map(|_| "ended".to_owned()),
        topic: topic.map(str::to_owned),
        run,
    };
    test.on_kernel(|kernel| async move { kernel.event_trigger_create(&Principal::Admin, params).await })
        .expect("the event trigger is created");
}

/// The inputs of the runs `trigger` started, as their specs hold them.
fn started_by(test: &TestKernel, trigger: &str) -> Vec<(RunId, Value)> {
    let store = test.store();
    let runs = test.on_kernel(|_| async move { store.list_runs(&RunFilter::default()).await }).expect("runs");
    runs.into_iter()
        .filter(|run| run.spec.to_value()["trigger"] == format!("event:{trigger}"))
        .map(|run| (run.id, run.spec.to_value()["input"].clone()))
        .collect()
}

#[test]
fn recorded_fires_without_their_run_are_started_once_by_the_next_firing_kernel() {
    let mut test = TestKernel::start();
    trigger(&test, "on-news", None, Some("news"));
    trigger(&test, "after-any", Some("*"), None);

    // This kernel fires nothing itself (as one embedded in `keel run`): the publish's fire
    // is recorded, with its run's id, and the run is left for the next firing kernel.
    let publisher = test.create_run(json!({}));
    let mut agent = test.agent(&publisher);
    agent.publish("news", &json!({"headline": "hello"}), true).expect("the publish");
    agent.exit(&json!({"done": true})).expect("the exit");
    test.kill_agent(&publisher);
    test.wait_state(&publisher, RunState::Succeeded);
    let store = test.store();
    let fires = test.on_kernel(|_| async move { store.trigger_fires("event", "on-news", 10).await }).unwrap();
    assert_eq!(fires.len(), 1, "{fires:?}");
    assert!(fires[0].occasion.starts_with(&format!("{publisher}:")), "keyed by the publish: {fires:?}");
    assert!(started_by(&test, "on-news").is_empty(), "no run yet");

    // A kernel that recorded the publisher's end as a fire of after-any and died before
    // creating the run.
    let recorded = RunId::generate(1);
    let fire = FireRecord {
        kind: "event".into(),
        trigger: "after-any".into(),
        occasion: publisher.to_string(),
        tenant: "default".into(),
        at_ms: 1,
        run_id: Some(recorded.clone()),
        outcome: "fired".into(),
        detail: None,
        fired_at_ms: 1,
    };
    let store = test.store();
    let (_, wrote) = test.on_kernel(|_| async move { store.trigger_fire(fire).await }).expect("recorded");
    assert!(wrote);
    test.crash_and_restart();

    test.on_kernel(|kernel| async move { kernel.start_event_triggers() });
    let news = wait_for("the publish's run", || {
        let runs = started_by(&test, "on-news");
        (!runs.is_empty()).then_some(runs)
    });
    assert_eq!(news[0].0, fires[0].run_id.clone().unwrap(), "created under the recorded id");
    assert_eq!(
        news[0].1,
        json!({
            "trigger": "event", "event": "on-news", "on": "topic", "topic": "news",
            "message": {"headline": "hello"}, "from": publisher.as_str(), "input": {"given": 1},
        })
    );
    // Found by its id: the triggered run of on-news may end, and fire after-any, first.
    let (_, input) = wait_for("the recorded end's run, created under the recorded id", || {
        started_by(&test, "after-any").into_iter().find(|(id, _)| *id == recorded)
    });
    assert_eq!(input["run_id"], publisher.as_str());
    assert_eq!(input["output"], json!({"done": true}));
    assert_eq!(input["state"], "succeeded");

    // The sweep finds the publisher's end fired already, and the triggered runs' ends
    // (runs of `true`) fire after-any once each, never the trigger that started them.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = started_by(&test, "after-any");
    let sources: Vec<Value> = after.iter().map(|(_, input)| input["run_id"].clone()).collect();
    let unique: std::collections::BTreeSet<String> = sources.iter().map(Value::to_string).collect();
    assert_eq!(unique.len(), sources.len(), "one run per ended run: {sources:?}");
    assert!(
        !sources.iter().any(|source| *source == json!(recorded.as_str())),
        "the trigger's own run does not fire it: {sources:?}"
    );
}
