//! IPC end to end: real Python agents (`tests/agents/ipc_agent.py`) exchange request/reply
//! messages through their mailboxes; a full mailbox refuses a `wait: false` sender and
//! holds a waiting one until the receiver drains it; operators send with `keel send` and
//! `POST /v1/runs/{id}/messages`; and a SIGKILLed daemon neither loses nor duplicates a
//! message.

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{Value, json};

use crate::harness::{Keel, agent, alive, wait_for};

fn ipc_agent(keel: &Keel, env: &[&str]) -> String {
    let mut args = vec!["--sandbox", "none"];
    for pair in env {
        args.extend(["--env", pair]);
    }
    let path = agent("ipc_agent.py");
    args.extend(["--", "python3", &path]);
    keel.detach(&args)
}

fn post(keel: &Keel, path: &str, body: &str) -> (u16, String) {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let addr = info["addr"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(keel.data.path().join("api-token")).unwrap();
    let mut stream = TcpStream::connect(&addr).expect("connect");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        token.trim(),
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn echoes(count: u64) -> Value {
    json!((0..count).map(|n| json!({"echo": {"n": n}})).collect::<Vec<_>>())
}

fn requests_then_stop(count: u64) -> Value {
    let mut received: Vec<Value> = (0..count).map(|n| json!({"n": n})).collect();
    received.push(json!("stop"));
    Value::Array(received)
}

#[test]
fn two_runs_exchange_requests_and_replies_and_operators_send() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let server = ipc_agent(&keel, &["IPC_ROLE=server"]);
    let client = ipc_agent(&keel, &["IPC_ROLE=client", "IPC_COUNT=5", &format!("IPC_PEER={server}")]);
    let client_done = keel.wait_state(&client, &["succeeded", "failed"]);
    assert_eq!(client_done["state"], "succeeded", "{client_done}");
    assert_eq!(client_done["output"], json!({"replies": echoes(5)}));
    let server_done = keel.wait_state(&server, &["succeeded", "failed"]);
    assert_eq!(server_done["output"], json!({"received": requests_then_stop(5)}), "{server_done}");
    let journal = server_done["journal"].as_array().unwrap();
    assert!(journal.iter().all(|e| e["status"] == "ok"), "{journal:?}");
    let sends = journal.iter().filter(|e| e["method"] == "ipc.send").count();
    assert_eq!(sends, 5, "one journaled send per reply");

    // Operators: `keel send` and the HTTP API put messages in a run's mailbox (from null).
    let drainer = ipc_agent(&keel, &["IPC_ROLE=drainer", "IPC_COUNT=2"]);
    assert!(keel.ok(&["send", &drainer, "--json", r#"{"task":"a"}"#]).contains("sent message 1"));
    let (status, body) =
        post(&keel, &format!("/v1/runs/{drainer}/messages"), r#"{"message":"b","correlation_id":"c-1"}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"seq":2}"#));
    let done = keel.wait_state(&drainer, &["succeeded", "failed"]);
    assert_eq!(done["output"]["received"], json!([{"task": "a"}, "b"]), "{done}");
    let recvs: Vec<&Value> = done["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "ipc.recv" && !e["result"]["message"].is_null())
        .collect();
    assert_eq!(
        recvs[1]["result"]["message"],
        json!({"from": null, "seq": 2, "message": "b", "correlation_id": "c-1"})
    );

    // Unknown runs are not_found (404); bad JSON is refused before anything is sent.
    let nobody = "run_00000000000000000000000001";
    let out = keel.run(&["send", nobody, "--json", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run"), "{out:?}");
    assert_eq!(post(&keel, &format!("/v1/runs/{nobody}/messages"), r#"{"message":1}"#).0, 404);
    let out = keel.run(&["send", &drainer, "--json", "not json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not JSON"), "{out:?}");
}

#[test]
fn a_publish_reaches_every_subscriber_of_the_topic() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let publisher = ipc_agent(&keel, &["IPC_ROLE=publisher", "IPC_COUNT=3", "IPC_TOPIC=news"]);
    let peer = format!("IPC_PEER={publisher}");
    let subscribers: Vec<String> =
        (0..2).map(|_| ipc_agent(&keel, &["IPC_ROLE=subscriber", "IPC_TOPIC=news", &peer])).collect();
    let done = keel.wait_state(&publisher, &["succeeded", "failed"]);
    assert_eq!(done["output"], json!({"delivered": [2, 2, 2, 2]}), "{done}");
    for subscriber in &subscribers {
        let done = keel.wait_state(subscriber, &["succeeded", "failed"]);
        assert_eq!(
            done["output"],
            json!({"received": [["news", {"n": 0}], ["news", {"n": 1}], ["news", {"n": 2}], ["news", "stop"]]}),
            "{done}"
        );
    }
}

#[test]
fn a_full_mailbox_refuses_or_holds_the_sender_until_the_receiver_drains() {
    let mut keel = Keel::new();
    keel.daemon_env.push(("KEEL_MAILBOX_CAPACITY".into(), "2".into()));
    keel.start_daemon();
    // The receiver drains only after a while: long enough for the senders to fill its
    // mailbox and find it full.
    let target = ipc_agent(&keel, &["IPC_ROLE=drainer", "IPC_COUNT=5", "IPC_START_DELAY_MS=8000"]);
    let peer = format!("IPC_PEER={target}");
    let refused = ipc_agent(&keel, &["IPC_ROLE=sender", "IPC_COUNT=3", "IPC_WAIT=0", &peer]);
    let refused = keel.wait_state(&refused, &["succeeded", "failed"]);
    assert_eq!(refused["output"], json!({"outcomes": [1, 2, "would_block"]}), "{refused}");
    let (status, body) = post(&keel, &format!("/v1/runs/{target}/messages"), r#"{"message":"op"}"#);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("would_block"), "{body}");
    let out = keel.run(&["send", &target, "--json", "1"]);
    assert!(!out.status.success(), "keel send without --wait refuses a full mailbox");

    // A send waiting for room journals nothing until the message is in the mailbox (the
    // two are one commit): while the receiver has not drained, the sender runs and has
    // sent nothing.
    let waiting = ipc_agent(&keel, &["IPC_ROLE=sender", "IPC_COUNT=3", &peer]);
    let view = wait_for("the waiting sender to run", || {
        let view = keel.inspect(&waiting);
        (view["state"] == "running" && view["pid"].is_u64()).then_some(view)
    });
    assert_eq!(view["journal"], json!([]), "{view}");
    assert_eq!(keel.inspect(&target)["state"], "running", "the receiver has not drained yet");

    let waiting = keel.wait_state(&waiting, &["succeeded", "failed"]);
    assert_eq!(waiting["output"], json!({"outcomes": [3, 4, 5]}), "{waiting}");
    let target = keel.wait_state(&target, &["succeeded", "failed"]);
    assert_eq!(
        target["output"]["received"],
        json!([{"n": 0}, {"n": 1}, {"n": 0}, {"n": 1}, {"n": 2}]),
        "no message lost: {target}"
    );
}

#[test]
fn sigkill_mid_exchange_delivers_every_message_exactly_once() {
    sigkill_mid_exchange("IPC_COMBINED=0");
}

/// The same with each side's send and next receive made as one call (`send_recv`): a kill
/// between the two halves of a call replays the send and makes the receive live.
#[test]
fn sigkill_mid_exchange_of_send_recv_calls_delivers_every_message_exactly_once() {
    sigkill_mid_exchange("IPC_COMBINED=1");
}

fn sigkill_mid_exchange(combined: &str) {
    const COUNT: u64 = 8;
    let mut keel = Keel::new();
    keel.start_daemon();
    let server = ipc_agent(&keel, &["IPC_ROLE=server", "IPC_DELAY_MS=100", combined]);
    let client = ipc_agent(
        &keel,
        &[
            "IPC_ROLE=client",
            &format!("IPC_COUNT={COUNT}"),
            "IPC_DELAY_MS=150",
            &format!("IPC_PEER={server}"),
            combined,
        ],
    );
    for kill_at in [4usize, 10] {
        let view = wait_for(&format!("{kill_at} journal entries"), || {
            let view = keel.inspect(&client);
            let len = view["journal"].as_array().map_or(0, Vec::len);
            (len >= kill_at || view["state"] == "succeeded").then_some(view)
        });
        assert_ne!(view["state"], "succeeded", "the exchange finished before kill point {kill_at}");
        let pids: Vec<u32> = [&client, &server]
            .iter()
            .filter_map(|run| keel.inspect(run)["pid"].as_u64().map(|p| p as u32))
            .collect();
        keel.kill_daemon();
        for pid in pids {
            wait_for("the agents to die with the daemon", || (!alive(pid)).then_some(()));
        }
        keel.start_daemon();
    }
    let client_done = keel.wait_state(&client, &["succeeded", "failed"]);
    assert_eq!(client_done["state"], "succeeded", "{client_done}");
    assert!(client_done["attempt"].as_u64().unwrap() >= 3, "relaunched after each kill");
    assert_eq!(client_done["output"], json!({"replies": echoes(COUNT)}), "no reply lost or repeated");
    let server_done = keel.wait_state(&server, &["succeeded", "failed"]);
    assert_eq!(server_done["state"], "succeeded", "{server_done}");
    assert_eq!(
        server_done["output"],
        json!({"received": requests_then_stop(COUNT)}),
        "every request received exactly once"
    );
    // Each message is in exactly one receive entry of the receiver's journal.
    for (done, expected) in [(&server_done, COUNT + 1), (&client_done, COUNT)] {
        let received: Vec<&Value> = done["journal"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["method"] == "ipc.recv" && e["status"] == "ok" && !e["result"]["message"].is_null())
            .collect();
        let mut seqs: Vec<u64> =
            received.iter().map(|e| e["result"]["message"]["seq"].as_u64().unwrap()).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=expected).collect::<Vec<_>>(), "each message journaled once");
    }
}

/// A receiver taking its backlog in batches (`recv_many`), the daemon SIGKILLed while it
/// drains: every message arrives exactly once and in order, each in exactly one batch of
/// the receiver's journal, and the batches replayed are the batches first taken.
#[test]
fn sigkill_while_draining_in_batches_delivers_every_message_once() {
    const COUNT: u64 = 40;
    let mut keel = Keel::new();
    keel.start_daemon();
    let drainer = ipc_agent(
        &keel,
        &[
            "IPC_ROLE=drainer",
            &format!("IPC_COUNT={COUNT}"),
            "IPC_RECV_MAX=7",
            "IPC_START_DELAY_MS=3000",
            "IPC_DELAY_MS=300",
        ],
    );
    let sender =
        ipc_agent(&keel, &["IPC_ROLE=sender", &format!("IPC_COUNT={COUNT}"), &format!("IPC_PEER={drainer}")]);
    let sent = keel.wait_state(&sender, &["succeeded", "failed"]);
    assert_eq!(sent["output"]["outcomes"], json!((1..=COUNT).collect::<Vec<_>>()), "{sent}");
    let batches_journaled = |view: &Value| {
        view["journal"].as_array().map_or(0, |journal| {
            journal.iter().filter(|e| e["method"] == "ipc.recv" && e["status"] == "ok").count()
        })
    };
    let view = wait_for("two batches taken", || {
        let view = keel.inspect(&drainer);
        (batches_journaled(&view) >= 2 || view["state"] == "succeeded").then_some(view)
    });
    assert_ne!(view["state"], "succeeded", "the drain finished before the kill");
    let pid = view["pid"].as_u64().expect("the drainer's pid") as u32;
    keel.kill_daemon();
    wait_for("the drainer to die with the daemon", || (!alive(pid)).then_some(()));
    keel.start_daemon();

    let done = keel.wait_state(&drainer, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 2, "relaunched after the kill");
    let expected: Vec<Value> = (0..COUNT).map(|n| json!({ "n": n })).collect();
    assert_eq!(done["output"]["received"], json!(expected), "each message once, in order");
    let batches: Vec<u64> =
        done["output"]["batches"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
    assert!(batches.iter().all(|b| (1..=7).contains(b)), "{batches:?}");
    assert!(batches.iter().any(|b| *b > 1), "a backlog is taken many at a time: {batches:?}");
    let mut seqs: Vec<u64> = done["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "ipc.recv" && e["status"] == "ok")
        .flat_map(|e| e["result"]["messages"].as_array().unwrap().iter().map(|m| m["seq"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        seqs.len() as u64,
        COUNT,
        "the journal holds each message once, in the batches the agent got: {batches:?}"
    );
    seqs.dedup();
    assert_eq!(seqs, (1..=COUNT).collect::<Vec<_>>(), "in order");
}
