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

#[test]
fn a_delivery_recorded_before_a_crash_is_created_by_its_redelivery() {
    let mut test = TestKernel::start();
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
    assert_eq!(record.spec["input"]["payload"]["ref"], "refs/heads/main", "{:?}", record.spec);
    let again = deliver(&test);
    assert_eq!((again.run_id.as_str(), again.duplicate), (recorded.to_string().as_str(), true));
}
