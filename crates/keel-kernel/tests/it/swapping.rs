//! Swapping: a run waiting in `ipc.recv` longer than `swap_after` has its agent process
//! stopped and stays `waiting(message)` with no process; a message brings it back by
//! replay, and the relaunched agent's receive takes that message.

use std::time::Duration;

use keel_kernel::{Command, SwapIn};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
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

/// Parks `n` puppet runs in `ipc.recv` until each is swapped out, then sends each a
/// message; returns the runs, and their first agents' receives (never answered).
fn park_and_wake(test: &TestKernel, n: usize) -> (Vec<RunId>, Vec<std::thread::JoinHandle<WaitResult>>) {
    let runs: Vec<RunId> = (0..n).map(|_| test.create_run(json!({}))).collect();
    let waiting = runs
        .iter()
        .map(|run| {
            let mut agent = test.agent(run);
            in_background(move || agent.recv(None).map(|_| ()).map_err(|e| e.to_string()))
        })
        .collect();
    for run in &runs {
        test.wait_run(run, "swapped out", |r| r.state == RunState::Waiting && r.pid.is_none());
    }
    for run in &runs {
        let to = run.to_string();
        let sent = test.on_kernel(|kernel| async move {
            kernel.send_message("default", json!({"to": to, "message": "wake up"})).await
        });
        assert_eq!(sent.unwrap(), json!({"seq": 1}));
    }
    (runs, waiting)
}

type WaitResult = Result<(), String>;

/// The runs whose second agent has been launched.
fn relaunched(test: &TestKernel, runs: &[RunId]) -> Vec<RunId> {
    runs.iter()
        .filter(|run| {
            let record = test.get(run);
            record.attempt == 2 && record.pid.is_some()
        })
        .cloned()
        .collect()
}

/// A kernel that swaps runs out after 200 ms and starts woken runs in `swap_in`'s turns.
fn kernel_with_turns(swap_in: SwapIn) -> TestKernel {
    TestKernel::start_with(|_| Setup {
        swap_after: Some(Duration::from_millis(200)),
        swap_in,
        ..Setup::default()
    })
}

#[test]
fn runs_woken_together_start_a_few_at_a_time_each_until_its_first_call() {
    // A hold longer than the test: only the agents' first calls let the next start.
    let test = kernel_with_turns(SwapIn { at_once: 2, hold: Duration::from_secs(600) });
    let (runs, _waiting) = park_and_wake(&test, 5);

    let mut started = wait_for("two agents relaunched", || {
        let now = relaunched(&test, &runs);
        (now.len() == 2).then_some(now)
    });
    // Time enough for the kernel to launch the other three if it would (a puppet starts
    // in milliseconds); they wait in `recovering`, their wake recorded.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(relaunched(&test, &runs), started, "no third agent starts before a first call");
    let waiting: Vec<RunId> = runs.iter().filter(|run| !started.contains(run)).cloned().collect();
    for run in &waiting {
        assert_eq!(test.get(run).state, RunState::Recovering, "{run} waits its turn");
    }
    // One stopped while it waits is not started when its turn comes.
    let stopped = waiting[0].clone();
    test.execute(Command::Stop { run: stopped.clone(), grace: None }).unwrap();
    assert_eq!(test.get(&stopped).state, RunState::Cancelled);
    let runs: Vec<RunId> = runs.into_iter().filter(|run| *run != stopped).collect();

    // Each agent's first call (its hello) lets the next one start, until all have.
    let mut agents = Vec::new();
    while started.len() < runs.len() {
        let greeting = started[agents.len()].clone();
        agents.push(test.agent(&greeting));
        started = wait_for("one more agent relaunched", || {
            let now = relaunched(&test, &runs);
            (now.len() == (agents.len() + 2).min(runs.len())).then_some(now)
        });
    }
    let stopped = test.get(&stopped);
    assert_eq!(
        (stopped.state, stopped.attempt, stopped.pid),
        (RunState::Cancelled, 1, None),
        "never relaunched"
    );
    // Every relaunched agent takes the message that woke it, once.
    for run in &runs {
        let mut agent = test.agent(run);
        let message = agent.recv(None).unwrap().expect("the message that woke it");
        assert_eq!(message.message, json!("wake up"));
        assert_eq!(methods(&test.journal(run)), [("ipc.recv", EntryStatus::Ok)]);
    }
}

#[test]
fn a_swapped_in_agent_that_never_calls_gives_its_turn_up_after_the_hold() {
    let test = kernel_with_turns(SwapIn { at_once: 1, hold: Duration::from_millis(200) });
    let (runs, _waiting) = park_and_wake(&test, 3);
    // No agent ever calls: each start is counted for the hold, then the next begins.
    wait_for("every agent relaunched", || (relaunched(&test, &runs).len() == runs.len()).then_some(()));
}
