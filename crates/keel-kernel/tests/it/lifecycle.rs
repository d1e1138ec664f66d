//! The lifecycle of a live run as its agent sees it (pause, resume and stop arrive as
//! control events in its mailbox), and the syscall channel's refusals: bad params leave
//! no journal entry, and a forged or stale token is not let in.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use keel_kernel::Command;
use keel_types::RunState;
use serde_json::{Value, json};

use crate::harness::{TestKernel, refusal, wait_for};

/// The scheduler state of a process (`S` sleeping, `T` stopped...), if it exists.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The next control event in the agent's mailbox: the signal's name.
fn control_event(agent: &mut keel_sdk::Client) -> String {
    let message = agent.recv(Some(5_000)).unwrap().expect("a control event");
    assert_eq!(message.topic.as_deref(), Some("signal"));
    assert_eq!(message.from, None, "from the operator");
    message.message["signal"].as_str().unwrap().to_owned()
}

#[test]
fn pause_resume_and_stop_reach_the_agent_as_control_events() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    let pid = test.get(&run).pid.unwrap();

    assert_eq!(test.execute(Command::Pause(run.clone())).unwrap().state, "paused");
    wait_for("the agent process to be stopped", || (process_state(pid) == Some('T')).then_some(()));
    assert_eq!(control_event(&mut agent), "pause");

    assert_eq!(test.execute(Command::Resume(run.clone())).unwrap().state, "running");
    wait_for("the agent process to run again", || (process_state(pid) != Some('T')).then_some(()));
    assert_eq!(control_event(&mut agent), "resume");

    // A long grace period: the agent wraps up and ends itself, well before it.
    let grace = Some(Duration::from_secs(600));
    test.execute(Command::Stop { run: run.clone(), grace }).unwrap();
    assert_eq!(control_event(&mut agent), "stop");
    assert_eq!(process_state(pid).map(|s| s != 'Z'), Some(true), "SIGTERM leaves it its grace period");
    test.wait_event(&run, "stop", json!({"grace_secs": 600.0}));
    std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    let stopped = test.wait_state(&run, RunState::Cancelled);
    assert_eq!(stopped.pid, None);
    assert!(test.execute(Command::Resume(run.clone())).is_err(), "an ended run does not resume");
}

#[test]
fn bad_params_are_refused_and_leave_no_journal_entry() {
    let test = TestKernel::start();
    let run = test.create_run(json!({"llm_script": {"responses": [{"content": "unused"}]}}));
    let mut agent = test.agent(&run);
    let calls: &[(&str, Value, &str)] = &[
        ("llm.chat", json!({}), "invalid_params"),
        ("llm.chat", json!({"messages": []}), "invalid_params"),
        ("sys.now", json!({"x": 1}), "invalid_params"),
        ("human.ask", json!({"question": 7}), "invalid_params"),
        ("mem.put", json!({"namespace": "", "key": "k", "value": 1}), "invalid_params"),
        ("ipc.send", json!({"to": "no one!", "message": 1}), "invalid_params"),
        ("ipc.recv", json!({"timeout": 1}), "invalid_params"),
        ("tool.call", json!({"args": {}}), "invalid_params"),
        ("sys.nope", json!({}), "unknown_method"),
    ];
    for (method, params, expected) in calls {
        let (kind, _, message) = refusal(agent.call::<Value>(method, params.clone()));
        assert_eq!(&kind, expected, "{method} {params}: {message}");
    }
    assert!(test.journal(&run).is_empty(), "{:#?}", test.journal(&run));
    assert_eq!(test.get(&run).provider_calls, 0);
    assert_eq!(test.get(&run).state, RunState::Running, "the run goes on");
    agent.now_ms().unwrap();
    assert_eq!(test.journal(&run).len(), 1);
}

/// One raw JSON-RPC exchange on the syscall socket.
fn exchange(stream: &mut BufReader<UnixStream>, line: &str) -> Value {
    stream.get_mut().write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap()
}

#[test]
fn a_forged_or_stale_token_is_refused() {
    let test = TestKernel::start();
    let run = test.create_run(json!({}));
    let (kind, code, _) = refusal(keel_sdk::Client::connect_to(&test.socket(), "forged-token").map(|_| ()));
    assert_eq!((kind.as_str(), code), ("unauthenticated", 1000));

    let mut raw = BufReader::new(UnixStream::connect(test.socket()).unwrap());
    let refused = |reply: Value| reply["error"]["data"]["kind"].as_str().unwrap_or_default().to_owned();
    assert_eq!(refused(exchange(&mut raw, "not json")), "parse_error");
    assert_eq!(refused(exchange(&mut raw, r#"{"jsonrpc":"2.0","method":"sys.now"}"#)), "invalid_request");
    let before_hello = exchange(&mut raw, r#"{"jsonrpc":"2.0","id":1,"method":"sys.now","params":{}}"#);
    assert_eq!(refused(before_hello), "unauthenticated");

    // A real token stops working when its run ends.
    let mut agent = test.agent(&run);
    agent.exit(&json!({"done": true})).unwrap();
    test.kill_agent(&run);
    assert_eq!(test.wait_state(&run, RunState::Succeeded).output, Some(json!({"done": true})));
    let tokens = std::fs::read_to_string(test.token_file(&run)).unwrap();
    let stale = tokens.lines().next().unwrap();
    let (kind, _, _) = refusal(keel_sdk::Client::connect_to(&test.socket(), stale).map(|_| ()));
    assert_eq!(kind, "unauthenticated");
    assert!(test.journal(&run).iter().all(|e| e.method == "run.exit"), "nothing but the exit is journaled");
}
