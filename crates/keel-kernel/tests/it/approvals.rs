//! Approvals: a tool that requires approval parks its run as `waiting(approval)` until an
//! operator decides; a denial reaches the agent with the operator's note; a decision is
//! durable, so one made after a crash (before the agent asks again) is found again.

use std::path::Path;

use keel_kernel::Command;
use keel_types::{EntryStatus, RunState, WaitReason};
use serde_json::json;

use crate::harness::{Setup, TestKernel, in_background, methods, refusal, wait_for};

fn kv_put_needs_approval(_scratch: &Path) -> Setup {
    let keel_toml = "[tools.policy.\"kv.put\"]\nrequires_approval = true\n";
    Setup { keel_toml: keel_toml.into(), ..Setup::default() }
}

#[test]
fn a_tool_requiring_approval_waits_for_the_operator_who_approves_or_denies_with_a_note() {
    let test = TestKernel::start_with(kv_put_needs_approval);
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let call = in_background(move || {
        let approved = agent.tool("kv.put", json!({"key": "k", "value": 1}));
        let denied = agent.tool("kv.put", json!({"key": "k", "value": 2}));
        (approved, denied, agent)
    });
    // The run is parked before its call is listed as waiting: wait for the call.
    let pending = wait_for("the call to wait for approval", || {
        Some(test.pending_approvals(&run)).filter(|p| !p.is_empty())
    });
    assert_eq!((pending.len(), pending[0].call, pending[0].tool.as_str()), (1, 1, "kv.put"));
    let record = test.get(&run);
    assert_eq!((record.state, record.wait_reason), (RunState::Waiting, Some(WaitReason::Approval)));
    assert_eq!(pending[0].kind, "requires_approval");
    assert_eq!(methods(&test.journal(&run)), [("tool.call", EntryStatus::Pending)], "intent first");
    test.execute(Command::Decide { run: run.clone(), call: 1, approve: true, note: None }).unwrap();

    wait_for("the second call to wait", || {
        test.pending_approvals(&run).first().map(|p| p.call == 2).filter(|&b| b)
    });
    let note = Some("not that value".to_owned());
    test.execute(Command::Decide { run: run.clone(), call: 2, approve: false, note }).unwrap();
    let (approved, denied, mut agent) = call.join().unwrap();
    approved.unwrap();
    let (kind, code, message) = refusal(denied);
    assert_eq!((kind.as_str(), code), ("denied", 1001));
    assert!(message.contains("not that value"), "the operator's note: {message}");
    assert_eq!(agent.tool("kv.get", json!({"key": "k"})).unwrap(), json!(1), "only the approved call ran");
    assert_eq!(test.get(&run).state, RunState::Running);
    let deciding = test.execute(Command::Decide { run: run.clone(), call: 2, approve: true, note: None });
    assert!(deciding.is_err(), "a call is decided once");
    let audit = wait_for("the decisions audited", || {
        let audit = test.audit(&run);
        audit.iter().any(|e| e.record.action == "approval.denied").then_some(audit)
    });
    assert!(audit.iter().any(|e| e.record.action == "approval.granted" && e.record.actor == "operator"));
}

#[test]
fn an_approval_decided_after_a_crash_is_found_by_the_relaunched_agent() {
    let mut test = TestKernel::start_with(kv_put_needs_approval);
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let call = in_background(move || agent.tool("kv.put", json!({"key": "k", "value": 1})));
    test.wait_waiting(&run, WaitReason::Approval);
    test.crash_and_restart();
    assert!(call.join().unwrap().is_err(), "the agent lost its kernel");
    test.wait_run(&run, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    // Decided before the relaunched agent asks again: the decision is stored and waits.
    test.execute(Command::Decide { run: run.clone(), call: 1, approve: true, note: None }).unwrap();
    let mut agent = test.agent(&run);
    agent.tool("kv.put", json!({"key": "k", "value": 1})).unwrap();
    assert_eq!(agent.tool("kv.get", json!({"key": "k"})).unwrap(), json!(1));
    assert_eq!(methods(&test.journal(&run))[0], ("tool.call", EntryStatus::Ok));
    assert!(test.pending_approvals(&run).is_empty());
    assert_eq!(test.get(&run).state, RunState::Running);
}
