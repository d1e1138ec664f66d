//! Swapping: a run waiting in `ipc.recv` longer than `swap_after` has its agent process
//! stopped and stays `waiting(message)` with no process; a message brings it back by
//! replay, and the relaunched agent's receive takes that message.

use std::time::Duration;

use keel_types::{EntryStatus, RunState, WaitReason};
use serde_json::json;

use crate::harness::{Setup, TestKernel, in_background, methods, wait_for};

#[test]
fn a_run_waiting_for_a_message_is_swapped_out_and_a_message_brings_it_back() {
    let test = TestKernel::start_with(|_| Setup {
        swap_after: Some(Duration::from_millis(200)),
        ..Setup::default()
    });
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let pid = test.get(&run).pid.expect("a live agent");
    let waiting = in_background(move || agent.recv(None));

    let swapped = test.wait_run(&run, "swapped out", |r| r.pid.is_none());
    assert_eq!((swapped.state, swapped.wait_reason), (RunState::Waiting, Some(WaitReason::Message)));
    test.wait_event(&run, "swap", json!({"out": true, "wait_reason": "message"}));
    wait_for("the agent process to be gone", || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
    // The wait is durable as the run's state (`waiting(message)`, above): a receive
    // journals nothing until it takes a message, in the same commit.
    assert_eq!(methods(&test.journal(&run)), [], "nothing taken, nothing journaled");

    let to = run.to_string();
    let sent = test.on_kernel(|kernel| async move {
        kernel.send_message("default", json!({"to": to, "message": "wake up"})).await
    });
    assert_eq!(sent.unwrap(), json!({"seq": 1}));
    let back = test.wait_run(&run, "swapped back in", |r| r.attempt == 2 && r.pid.is_some());
    assert_ne!(back.pid, Some(pid));
    let mut agent = test.agent(&run);
    let message = agent.recv(None).unwrap().expect("the message that woke it");
    assert_eq!((message.message, message.from, message.seq), (json!("wake up"), None, 1));
    assert_eq!(
        methods(&test.journal(&run)),
        [("ipc.recv", EntryStatus::Ok)],
        "taken once, by the relaunched agent"
    );
    agent.now_ms().unwrap();
    assert_eq!(test.get(&run).state, RunState::Running, "past the replay");
    test.wait_event(&run, "swap", json!({"out": false}));

    drop(test);
    assert!(waiting.join().unwrap().is_err(), "the swapped-out agent's call was never answered");
}
