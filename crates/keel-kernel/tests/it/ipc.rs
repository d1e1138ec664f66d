//! IPC between runs: send and receive with request/reply, a full mailbox refusing a
//! non-waiting send with `would_block`, and exactly-once delivery across a crash.

use keel_types::{EntryStatus, RunId};
use serde_json::json;

use crate::harness::{TestKernel, in_background, methods, refusal, wait_for};

fn send_as_operator(test: &TestKernel, run: &RunId, message: serde_json::Value) -> serde_json::Value {
    let to = run.to_string();
    test.on_kernel(|kernel| async move {
        kernel.send_message("default", json!({"to": to, "message": message})).await
    })
    .expect("the operator's message is sent")
}

/// Waits until `receiver`'s receive is on offer to senders.
fn wait_until_offered(test: &TestKernel, receiver: &RunId) {
    wait_for("the receive to be on offer", || {
        let id = receiver.clone();
        test.on_kernel(|kernel| async move { kernel.receive_on_offer(&id) }).then_some(())
    });
}

#[test]
fn two_runs_exchange_a_request_and_its_reply() {
    let test = TestKernel::start();
    let asker = test.create_run(json!({}));
    let answerer = test.create_run(json!({}));
    let mut asker_agent = test.agent(&asker);
    let mut answerer_agent = test.agent(&answerer);
    let answering = in_background(move || {
        let request = answerer_agent.recv(None).unwrap().expect("a request");
        let to = request.from.clone().expect("sent by a run");
        let reply = json!({"answer": request.message["q"].as_i64().unwrap() * 2});
        answerer_agent.send(&to, &reply, request.correlation_id.as_deref(), true).unwrap();
        request
    });
    assert_eq!(asker_agent.send(answerer.as_str(), &json!({"q": 21}), Some("req-1"), true).unwrap(), 1);
    let reply = asker_agent.recv(None).unwrap().expect("the reply");
    assert_eq!(reply.message, json!({"answer": 42}));
    assert_eq!(reply.correlation_id.as_deref(), Some("req-1"));
    assert_eq!(reply.from.as_deref(), Some(answerer.as_str()));
    let request = answering.join().unwrap();
    assert_eq!(request.from.as_deref(), Some(asker.as_str()));
    assert_eq!(
        methods(&test.journal(&asker)),
        [("ipc.send", EntryStatus::Ok), ("ipc.recv", EntryStatus::Ok)]
    );
    assert_eq!(
        methods(&test.journal(&answerer)),
        [("ipc.recv", EntryStatus::Ok), ("ipc.send", EntryStatus::Ok)]
    );
    let (kind, code, _) = refusal(asker_agent.send("run_00000000000000000000000001", &json!(1), None, true));
    assert_eq!((kind.as_str(), code), ("not_found", 1002));
    assert_eq!(test.journal(&asker).len(), 2, "a send to nobody leaves no trace");
}

/// A receive waiting on an empty mailbox is completed by the send's own commit: when the
/// send answers, the receiver's journal already holds the message, taken once.
#[test]
fn a_send_completes_the_receive_waiting_for_it_in_its_own_commit() {
    let test = TestKernel::start();
    let sender = test.create_run(json!({}));
    let receiver = test.create_run(json!({}));
    let mut sender_agent = test.agent(&sender);
    let mut receiver_agent = test.agent(&receiver);
    let receiving = in_background(move || receiver_agent.recv(Some(60_000)));
    wait_until_offered(&test, &receiver);
    assert_eq!(sender_agent.send(receiver.as_str(), &json!("hello"), Some("c-1"), true).unwrap(), 1);
    let journal = test.journal(&receiver);
    assert_eq!(methods(&journal), [("ipc.recv", EntryStatus::Ok)], "journaled by the send's commit");
    assert_eq!(journal[0].result.as_ref().unwrap()["message"]["message"], json!("hello"));
    let received = receiving.join().unwrap().unwrap().expect("the message");
    assert_eq!((received.message, received.seq), (json!("hello"), 1));
    assert_eq!(received.correlation_id.as_deref(), Some("c-1"));
    assert_eq!(received.from.as_deref(), Some(sender.as_str()));
    assert_eq!(test.journal(&receiver).len(), 1, "taken once");
    assert_eq!(methods(&test.journal(&sender)), [("ipc.send", EntryStatus::Ok)]);
    let id = receiver.clone();
    assert!(!test.on_kernel(|kernel| async move { kernel.receive_on_offer(&id) }), "the offer is gone");
    let mut receiver_agent = test.agent(&receiver);
    assert_eq!(receiver_agent.recv(Some(0)).unwrap(), None, "nothing is left in the mailbox");
}

/// `ipc.send` with `recv`: the peer hears of the send only once the sender's receive is
/// on offer, so even an instant reply completes that receive in the reply's own commit (a
/// round trip of two commits, however quick the peer). The journal holds the two calls
/// as if they had been made one after the other, and after a crash they are answered from
/// it, combined or not.
#[test]
fn a_send_with_recv_is_on_offer_before_its_peer_hears_of_the_send() {
    const ROUNDS: i64 = 20;
    let faults = std::sync::Arc::new(crate::faults::Faults::default());
    let plan = faults.clone();
    let mut test =
        TestKernel::start_with(|_| crate::harness::Setup { faults: Some(plan), ..Default::default() });
    let asker = test.create_run(json!({}));
    let answerer = test.create_run(json!({}));
    let mut asker_agent = test.agent(&asker);
    let mut answerer_agent = test.agent(&answerer);
    let to = answerer.as_str();
    for (recv, says) in [
        (json!({"max": 0}), "`max` must be 1 to 1000"),
        (json!(5), "`recv` must be an object"),
        (json!({"timeout": 1}), "unknown field"),
    ] {
        let (kind, _, message) = refusal(
            asker_agent.call::<serde_json::Value>("ipc.send", json!({"to": to, "message": 1, "recv": recv})),
        );
        assert_eq!(kind, "invalid_params", "{message}");
        assert!(message.contains(says), "{message}");
    }
    let (kind, _, _) =
        refusal(asker_agent.send_recv("run_00000000000000000000000001", &json!(1), None, Some(0)));
    assert_eq!(kind, "not_found");
    assert!(test.journal(&asker).is_empty(), "nothing sent, nothing received");

    // A receive that last found a message takes before it offers itself: the first
    // round's take is slowed down, so an answer not held back would arrive before the
    // offer, every time.
    send_as_operator(&test, &asker, json!("first"));
    assert_eq!(asker_agent.recv(Some(0)).unwrap().expect("a message").message, json!("first"));
    faults.slow_next_receive(std::time::Duration::from_millis(300));
    let (kernel, asker_id) = (test.kernel(), asker.clone());
    let answering = in_background(move || {
        let mut request = answerer_agent.recv(None).unwrap().expect("a request");
        let mut offered = Vec::new();
        for round in 1..=ROUNDS {
            // The asker's receive waits on offer from before its request arrives here.
            offered.push(kernel.receive_on_offer(&asker_id));
            let to = request.from.clone().expect("sent by a run");
            let reply = json!({"answer": request.message["q"].as_i64().unwrap() * 2});
            let id = request.correlation_id.clone();
            if round < ROUNDS {
                request =
                    answerer_agent.send_recv(&to, &reply, id.as_deref(), None).unwrap().expect("a request");
            } else {
                answerer_agent.send(&to, &reply, id.as_deref(), true).unwrap();
            }
        }
        offered
    });
    wait_until_offered(&test, &answerer);
    let ask = |agent: &mut keel_sdk::Client, q: i64| {
        let reply =
            agent.send_recv(to, &json!({"q": q}), Some(&format!("r{q}")), None).unwrap().expect("a reply");
        assert_eq!((reply.message, reply.correlation_id), (json!({"answer": q * 2}), Some(format!("r{q}"))));
    };
    for q in 0..ROUNDS {
        ask(&mut asker_agent, q);
    }
    assert_eq!(answering.join().unwrap(), vec![true; ROUNDS as usize]);
    let journal = test.journal(&asker);
    let pairs = (0..ROUNDS).flat_map(|_| [("ipc.send", EntryStatus::Ok), ("ipc.recv", EntryStatus::Ok)]);
    assert_eq!(methods(&journal[1..]), pairs.collect::<Vec<_>>());
    assert_eq!(journal[1].params, json!({"to": to, "message": {"q": 0}, "correlation_id": "r0"}));
    assert_eq!(journal[2].params, json!({}));
    assert_eq!(faults.left() + faults.slow_receives_left(), 0, "the slow take was made");
    let answered = test.journal(&answerer);
    let answers = methods(&answered);
    assert_eq!(answers.len() as i64, 2 * ROUNDS);
    assert_eq!(answers[..2], [("ipc.recv", EntryStatus::Ok), ("ipc.send", EntryStatus::Ok)]);

    test.crash_and_restart();
    test.wait_run(&asker, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    let mut asker_agent = test.agent(&asker);
    assert_eq!(asker_agent.recv(Some(0)).unwrap().expect("replayed").message, json!("first"));
    for q in 0..ROUNDS / 2 {
        ask(&mut asker_agent, q);
    }
    // The same entries answer the two calls made apart.
    for q in ROUNDS / 2..ROUNDS {
        let message = json!({"q": q});
        let seq = asker_agent.send(to, &message, Some(&format!("r{q}")), true).unwrap();
        assert_eq!(seq as i64, q + 1);
        let reply = asker_agent.recv(None).unwrap().expect("a reply");
        assert_eq!(reply.message, json!({"answer": q * 2}));
    }
    assert_eq!(test.journal(&asker).len() as i64, 1 + 2 * ROUNDS, "answered from the journal");
}

/// Set for the child process that runs `a_full_mailbox_refuses_a_send_that_will_not_wait`
/// with a small mailbox: the capacity is read from the environment at kernel start.
const SMALL_MAILBOX_CHILD: &str = "KEEL_KERNEL_IT_SMALL_MAILBOX";

#[test]
fn a_full_mailbox_refuses_a_send_that_will_not_wait() {
    if std::env::var_os(SMALL_MAILBOX_CHILD).is_none() {
        // KEEL_MAILBOX_CAPACITY is process-wide: set it only in a child running this test.
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "ipc::a_full_mailbox_refuses_a_send_that_will_not_wait"])
            .env(SMALL_MAILBOX_CHILD, "1")
            .env("KEEL_MAILBOX_CAPACITY", "2")
            .output()
            .unwrap();
        let output = String::from_utf8_lossy(&child.stdout);
        assert!(child.status.success(), "the test failed in its child process:\n{output}");
        assert!(output.contains("1 passed"), "the child ran the test:\n{output}");
        return;
    }
    let test = TestKernel::start();
    let sender = test.create_run(json!({}));
    let receiver = test.create_run(json!({}));
    let mut sender_agent = test.agent(&sender);
    let mut receiver_agent = test.agent(&receiver);
    assert_eq!(sender_agent.send(receiver.as_str(), &json!(1), None, false).unwrap(), 1);
    assert_eq!(sender_agent.send(receiver.as_str(), &json!(2), None, false).unwrap(), 2);
    let (kind, code, message) = refusal(sender_agent.send(receiver.as_str(), &json!(3), None, false));
    assert_eq!((kind.as_str(), code), ("would_block", 1010));
    assert!(message.contains("nothing was sent"), "{message}");
    // A waiting send waits for room, and gets it when the receiver takes a message.
    let waiting = in_background(move || sender_agent.send(receiver.as_str(), &json!(4), None, true));
    let id = sender.clone();
    wait_for("the send to wait for room", || {
        let id = id.clone();
        (test.on_kernel(|kernel| async move { kernel.calls_in_flight(&id) }) == 1).then_some(())
    });
    assert_eq!(test.journal(&sender).len(), 3, "a waiting send journals nothing yet");
    let received: Vec<_> =
        (0..3).map(|_| receiver_agent.recv(Some(5_000)).unwrap().unwrap().message).collect();
    assert_eq!(received, [json!(1), json!(2), json!(4)], "the refused message was never sent");
    assert_eq!(waiting.join().unwrap().unwrap(), 3, "the refused message took no seq either");
    assert_eq!(methods(&test.journal(&sender)).iter().filter(|(m, _)| *m == "ipc.send").count(), 4);
}

#[test]
fn each_message_reaches_the_receivers_journal_exactly_once_across_a_crash() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    send_as_operator(&test, &run, json!("m1"));
    send_as_operator(&test, &run, json!("m2"));
    assert_eq!(agent.recv(None).unwrap().unwrap().message, json!("m1"));
    // A receive caught waiting by the crash: nothing journaled for it, no message taken.
    let waiting = in_background(move || {
        let second = agent.recv(None).unwrap().unwrap().message;
        let third = agent.recv(None);
        (second, third)
    });
    let id = run.clone();
    wait_for("the third receive to wait", || {
        let id = id.clone();
        let in_flight = test.on_kernel(|kernel| async move { kernel.calls_in_flight(&id) });
        (test.journal(&run).len() == 2 && in_flight == 1).then_some(())
    });

    test.crash_and_restart();
    let (second, third) = waiting.join().unwrap();
    assert_eq!(second, json!("m2"));
    assert!(third.is_err(), "the agent lost its kernel");
    test.wait_run(&run, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    send_as_operator(&test, &run, json!("m3"));
    let mut agent = test.agent(&run);
    let replayed: Vec<_> = (0..3).map(|_| agent.recv(None).unwrap().unwrap().message).collect();
    assert_eq!(replayed, [json!("m1"), json!("m2"), json!("m3")], "each once, in order");
    assert_eq!(agent.recv(Some(0)).unwrap(), None, "nothing delivered twice");
    let journal = test.journal(&run);
    assert_eq!(methods(&journal), [("ipc.recv", EntryStatus::Ok); 4]);
    assert_eq!(journal[3].result, Some(json!({"message": null})));
}

/// A receive of many takes every waiting message up to its `max` in one journaled step,
/// oldest first, and answers the same batches from the journal after a crash: nothing is
/// taken twice or lost.
#[test]
fn a_receive_of_many_takes_what_waits_in_one_step_and_replays_it_after_a_crash() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({}));
    let mut agent = test.agent(&run);
    for i in 1..=5 {
        send_as_operator(&test, &run, json!(format!("m{i}")));
    }
    let bodies = |messages: Vec<keel_protocol::rpc::IpcMessage>| -> Vec<serde_json::Value> {
        messages.into_iter().map(|m| m.message).collect()
    };
    let (kind, _, message) = refusal(agent.recv_many(0, Some(0)));
    assert_eq!(kind, "invalid_params");
    assert!(message.contains("`max` must be 1 to 1000"), "{message}");
    let first = agent.recv_many(3, None).unwrap();
    assert_eq!(first.iter().map(|m| m.seq).collect::<Vec<_>>(), [1, 2, 3], "the oldest, in order");
    assert_eq!(bodies(first), [json!("m1"), json!("m2"), json!("m3")]);
    assert_eq!(bodies(agent.recv_many(10, Some(0)).unwrap()), [json!("m4"), json!("m5")]);
    assert!(agent.recv_many(10, Some(0)).unwrap().is_empty(), "a timeout answers no messages");
    let journal = test.journal(&run);
    assert_eq!(methods(&journal), [("ipc.recv", EntryStatus::Ok); 3], "one step per batch");
    assert_eq!(journal[2].result, Some(json!({"messages": []})));

    test.crash_and_restart();
    test.wait_run(&run, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    send_as_operator(&test, &run, json!("m6"));
    let mut agent = test.agent(&run);
    assert_eq!(bodies(agent.recv_many(3, None).unwrap()), [json!("m1"), json!("m2"), json!("m3")]);
    assert_eq!(bodies(agent.recv_many(10, Some(0)).unwrap()), [json!("m4"), json!("m5")]);
    assert!(agent.recv_many(10, Some(0)).unwrap().is_empty(), "replayed as it was answered");
    assert_eq!(bodies(agent.recv_many(10, Some(5_000)).unwrap()), [json!("m6")], "then live again");
    assert_eq!(agent.recv(Some(0)).unwrap(), None, "nothing delivered twice");
    assert_eq!(test.journal(&run).len(), 5);
}

/// A receive of many waiting on an empty mailbox is completed by a send's commit like a
/// receive of one, and answers in its own shape: a list.
#[test]
fn a_send_completes_a_waiting_receive_of_many_with_a_list() {
    let test = TestKernel::start();
    let sender = test.create_run(json!({}));
    let receiver = test.create_run(json!({}));
    let mut sender_agent = test.agent(&sender);
    let mut receiver_agent = test.agent(&receiver);
    let receiving = in_background(move || receiver_agent.recv_many(50, Some(60_000)));
    wait_until_offered(&test, &receiver);
    sender_agent.send(receiver.as_str(), &json!("hello"), None, true).unwrap();
    let journal = test.journal(&receiver);
    assert_eq!(methods(&journal), [("ipc.recv", EntryStatus::Ok)], "journaled by the send's commit");
    assert_eq!(journal[0].result.as_ref().unwrap()["messages"][0]["message"], json!("hello"));
    let received = receiving.join().unwrap().unwrap();
    assert_eq!(received.len(), 1);
    assert_eq!(
        (received[0].message.clone(), received[0].from.as_deref()),
        (json!("hello"), Some(sender.as_str()))
    );
}
