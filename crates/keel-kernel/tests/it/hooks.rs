//! Webhook deliveries against a kernel that died between recording a delivery and creating
//! its run: the sender, answered nothing, delivers again, and that redelivery creates the
//! recorded run (one run, under the recorded id); a third delivery is a duplicate.

use keel_kernel::Principal;
use keel_protocol::api::CreateRunParams;
use keel_protocol::triggers::CreateHookParams;
use keel_store::FireRecord;
use keel_types::RunId;
use serde_json::json;

use crate::harness::TestKernel;

/// Creates the hook `pushes` (GitHub signatures, a run of `true`); its secret.
fn create_hook(test: &TestKernel) -> String {
    // The secret is a variable of the kernel's environment; PATH is one every test
    // process has (setting a variable would race the other tests' threads).
    let secret = std::env::var("PATH").expect("PATH is set");
    let run: CreateRunParams = serde_json::from_value(json!({
        "command": ["true"], "cwd": test.scratch(), "sandbox": {"tier": "none"},
    }))
    .unwrap();
    let params = CreateHookParams {
        name: "pushes".into(),
        verify: "github".into(),
        secret_env: "PATH".into(),
        header: None,
        tolerance_secs: None,
        run,
    };
    test.on_kernel(|kernel| async move { kernel.hook_create(&Principal::Admin, params).await })
        .expect("the hook is created");
    secret
}

#[test]
fn a_delivery_recorded_before_a_crash_is_created_by_its_redelivery() {
    let mut test = TestKernel::start();
    let secret = create_hook(&test);

    // A kernel that recorded delivery d-1 and died before creating its run.
    let recorded = RunId::generate(1);
    let fire = FireRecord {
        kind: "hook".into(),
        trigger: "pushes".into(),
        occasion: "d-1".into(),
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

    let body = br#"{"ref":"refs/heads/main"}"#.to_vec();
    let signature = format!("sha256={}", keel_core::hook::sign(secret.as_bytes(), &[&body]));
    let deliver = |test: &TestKernel| {
        let (body, signature) = (body.clone(), signature.clone());
        test.on_kernel(|kernel| async move {
            let header = move |name: &str| match name {
                "X-Hub-Signature-256" => Some(signature.clone()),
                "X-GitHub-Delivery" => Some("d-1".to_owned()),
                _ => None,
            };
            kernel.hook_deliver("pushes", &header, &body).await
        })
        .expect("the delivery is accepted")
    };
    let redelivered = deliver(&test);
    assert_eq!(redelivered.run_id, recorded.to_string(), "the recorded run, not a second one");
    assert!(!redelivered.duplicate, "the first delivery to be answered 2xx is not a duplicate");
    let record = test.get(&recorded);
    assert_eq!(record.spec.to_value()["input"]["payload"]["ref"], "refs/heads/main", "{:?}", record.spec);
    let again = deliver(&test);
    assert_eq!((again.run_id.as_str(), again.duplicate), (recorded.to_string().as_str(), true));
}

/// A create refused because its run id already exists must not give back a slot: the
/// slot is that run's. Here a redelivery's read misses the run its first delivery
/// created (a read losing a race with that creation), so it creates the recorded run
/// again; the store refuses, and the live run must keep the only slot `[scheduler]
/// max_live = 1` allows, so the next run waits for it. (It used to give the slot back,
/// and the next run started beside it, over the cap.)
#[test]
fn a_create_refused_for_a_live_runs_id_leaves_that_run_its_slot() {
    let faults = std::sync::Arc::new(crate::faults::Faults::default());
    let test = TestKernel::start_with(|_| crate::harness::Setup {
        faults: Some(faults.clone()),
        scheduler: keel_kernel::SchedulerConfig::from_keel_toml("[scheduler]\nmax_live = 1\n").unwrap(),
        ..Default::default()
    });
    let secret = create_hook(&test);

    // The run of a first delivery, live and holding the only slot.
    let live = test.create_run(json!({}));
    test.wait_run(&live, "the run to hold the slot", |r| r.state == keel_types::RunState::Running);
    let fire = FireRecord {
        kind: "hook".into(),
        trigger: "pushes".into(),
        occasion: "d-1".into(),
        tenant: "default".into(),
        at_ms: 1,
        run_id: Some(live.clone()),
        outcome: "fired".into(),
        detail: None,
        fired_at_ms: 1,
    };
    let store = test.store();
    test.on_kernel(|_| async move { store.trigger_fire(fire).await }).expect("recorded");

    // The redelivery misses the run, and so tries to create it.
    faults.hide_next_runs(1);
    let body = br#"{"ref":"refs/heads/main"}"#.to_vec();
    let signature = format!("sha256={}", keel_core::hook::sign(secret.as_bytes(), &[&body]));
    let accepted = test
        .on_kernel(|kernel| async move {
            let header = move |name: &str| match name {
                "X-Hub-Signature-256" => Some(signature.clone()),
                "X-GitHub-Delivery" => Some("d-1".to_owned()),
                _ => None,
            };
            kernel.hook_deliver("pushes", &header, &body).await
        })
        .expect("the redelivery is answered");
    assert_eq!(accepted.run_id, live.to_string());
    assert!(!accepted.duplicate, "the redelivery went as far as creating the run");

    let next = test.create_run(json!({}));
    assert_eq!(
        test.get(&next).state,
        keel_types::RunState::Queued,
        "the live run still holds the only slot, so the next run waits"
    );
    assert_eq!(test.get(&live).state, keel_types::RunState::Running);
}
