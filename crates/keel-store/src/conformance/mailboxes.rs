//! Conformance checks of mailboxes and topics: order, bounds, idempotent send and
//! receive, tenant scoping, all-or-nothing publish, racing receivers.

use std::sync::Arc;

use keel_types::{RunId, RunState};
use serde_json::{Value, json};

use super::{Must, complete_entry, fresh_run, join_all, now_ms};
use crate::{Error, MailboxDone, MailboxOp, NewMessage, RunPatch, Seq, Store, WaitingReceive};
use keel_types::{EntryStatus, Usage};

fn mail(from: Option<&RunId>, message: Value, capacity: u64, key: Option<&str>) -> NewMessage {
    NewMessage {
        tenant: "conformance".to_owned(),
        from: from.cloned(),
        message,
        correlation_id: None,
        topic: None,
        capacity,
        idempotency_key: key.map(str::to_owned),
        sent_at_ms: 7,
    }
}

/// Messages get dense seqs from 1 and are received oldest first, each once, with what was
/// sent; an empty mailbox receives `None`.
pub async fn mailbox_send_receive_in_order(store: &dyn Store) {
    let to = fresh_run(store).await;
    let from = fresh_run(store).await;
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    assert_eq!(store.mailbox_receive(&to, None).await.must("mailbox_receive"), None, "empty mailbox");
    for i in 0..3u64 {
        let mut message = mail(Some(&from), json!({"n": i}), 10, None);
        message.correlation_id = (i == 1).then(|| "req-1".to_owned());
        let seq = store.mailbox_send(&to, message).await.must("mailbox_send");
        assert_eq!(seq, i + 1, "mailbox seqs must be dense from 1");
    }
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 3);
    let operator = store.mailbox_send(&to, mail(None, json!("op"), 10, None)).await.must("send from nobody");
    assert_eq!(operator, 4);
    for i in 0..3u64 {
        let got = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("a message");
        assert_eq!(got.seq, i + 1, "oldest first");
        assert_eq!(got.message, json!({"n": i}));
        assert_eq!(got.from.as_ref(), Some(&from));
        assert_eq!(got.sent_at_ms, 7);
        assert_eq!(got.correlation_id.as_deref(), (i == 1).then_some("req-1"));
    }
    let last = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("the operator's");
    assert_eq!((last.seq, last.from), (4, None));
    assert_eq!(store.mailbox_receive(&to, None).await.must("mailbox_receive"), None, "each delivered once");
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    assert_eq!(store.mailbox_len(&from).await.must("mailbox_len"), 0, "mailboxes are per run");
}

/// A full mailbox refuses a send and writes nothing; a receive makes room again.
pub async fn mailbox_is_bounded(store: &dyn Store) {
    let to = fresh_run(store).await;
    for i in 0..2 {
        store.mailbox_send(&to, mail(None, json!(i), 2, None)).await.must("mailbox_send");
    }
    expect_error!(
        store.mailbox_send(&to, mail(None, json!(2), 2, None)).await,
        Error::MailboxFull { ref run, capacity: 2 } if *run == to,
        "a send to a full mailbox",
    );
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 2, "a refused send writes nothing");
    assert_eq!(store.mailbox_send(&to, mail(None, json!(2), 3, None)).await.must("bigger capacity"), 3);
    store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("a message");
    assert_eq!(store.mailbox_send(&to, mail(None, json!(3), 3, None)).await.must("room again"), 4);
    let mut got = Vec::new();
    while let Some(message) = store.mailbox_receive(&to, None).await.must("mailbox_receive") {
        got.push(message.message);
    }
    assert_eq!(got, [json!(1), json!(2), json!(3)], "no message lost or duplicated");
}

/// A retried send (same key) writes nothing and answers the first seq, even once the
/// mailbox is full; a retried receive (same key) answers the message the first took.
pub async fn mailbox_idempotent_send_and_receive(store: &dyn Store) {
    let to = fresh_run(store).await;
    let first = store.mailbox_send(&to, mail(None, json!("a"), 2, Some("s:1"))).await.must("send");
    store.mailbox_send(&to, mail(None, json!("b"), 2, None)).await.must("send");
    let again = store.mailbox_send(&to, mail(None, json!("a"), 2, Some("s:1"))).await.must("send retried");
    assert_eq!(again, first, "a retried send must answer the first seq even when the mailbox is full");
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 2, "no duplicate");
    let took = store.mailbox_receive(&to, Some("r:1")).await.must("receive").expect("a message");
    let retried = store.mailbox_receive(&to, Some("r:1")).await.must("receive retried").expect("a message");
    assert_eq!(took, retried, "a retried receive must answer the message the first took");
    assert_eq!(took.message, json!("a"));
    let next = store.mailbox_receive(&to, Some("r:2")).await.must("receive").expect("a message");
    assert_eq!(next.message, json!("b"));
    assert_eq!(store.mailbox_receive(&to, Some("r:3")).await.must("receive"), None);
    store.mailbox_send(&to, mail(None, json!("c"), 2, None)).await.must("send");
    let late = store.mailbox_receive(&to, Some("r:3")).await.must("receive again").expect("a message");
    assert_eq!(late.message, json!("c"), "a key whose first receive found nothing may take a message");
    assert_eq!(store.mailbox_receive(&to, Some("r:1")).await.must("receive").map(|m| m.seq), Some(first));
}

/// The result a journaled mailbox write records: what it came to, in a shape of the test's.
fn recorded(done: &MailboxDone) -> Value {
    match done {
        MailboxDone::Sent(seq) | MailboxDone::SentAndTaken { seq, .. } => json!({ "sent": seq }),
        MailboxDone::Received(taken) => match taken.as_slice() {
            [message] => json!({ "took": message.seq, "message": message.message }),
            many => panic!("store conformance: a receive of one message took {}", many.len()),
        },
    }
}

/// The result a receive of many messages records, in a shape of the test's own.
fn recorded_many(done: &MailboxDone) -> Value {
    match done {
        MailboxDone::Received(taken) => json!({ "took": taken.iter().map(|m| m.seq).collect::<Vec<_>>() }),
        other => json!({ "other": format!("{other:?}") }),
    }
}

/// A send or receive journaled with its entry: both land in one write, the entry complete
/// with the result made from the outcome; a refused send and an empty receive write
/// neither; a message taken so is never taken again.
pub async fn mailbox_writes_journaled_with_their_entry(store: &dyn Store) {
    let (from, to) = (fresh_run(store).await, fresh_run(store).await);
    let entry = |method: &str| complete_entry(method, json!({"to": "x"}), EntryStatus::Ok, Usage::default());
    let send = |message: &str| MailboxOp::Send {
        to: to.clone(),
        message: mail(Some(&from), json!(message), 2, None),
        receive: None,
    };

    let (seq, done) = store
        .journal_mailbox(&from, entry("ipc.send"), send("a"), recorded)
        .await
        .must("journal_mailbox send")
        .expect("a send always writes");
    assert_eq!((seq, &done), (1, &MailboxDone::Sent(1)));
    let journal = store.journal(&from, 0).await.must("journal");
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].status, EntryStatus::Ok, "appended complete");
    assert_eq!(journal[0].result, Some(json!({"sent": 1})), "the result is made from the outcome");
    assert_eq!(journal[0].method, "ipc.send");
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 1);

    store.journal_mailbox(&from, entry("ipc.send"), send("b"), recorded).await.must("second send");
    expect_error!(
        store.journal_mailbox(&from, entry("ipc.send"), send("c"), recorded).await,
        Error::MailboxFull { capacity: 2, .. },
        "a journaled send to a full mailbox",
    );
    assert_eq!(store.journal(&from, 0).await.must("journal").len(), 2, "a refused send journals nothing");
    let mut foreign = mail(Some(&from), json!("x"), 10, None);
    foreign.tenant = "conformance-other".to_owned();
    expect_error!(
        store
            .journal_mailbox(&from, entry("ipc.send"), MailboxOp::Send { to: to.clone(), message: foreign, receive: None }, recorded)
            .await,
        Error::RunNotFound(ref id) if *id == to,
        "a journaled send to another tenant's run",
    );
    assert_eq!(store.journal(&from, 0).await.must("journal").len(), 2, "a send to no run journals nothing");

    let (seq, done) = store
        .journal_mailbox(&to, entry("ipc.recv"), MailboxOp::Receive { max: 1 }, recorded)
        .await
        .must("journal_mailbox receive")
        .expect("a message");
    assert_eq!(seq, 1);
    let MailboxDone::Received(taken) = done else { panic!("a receive answers Received, got {done:?}") };
    let [message] = taken.as_slice() else { panic!("a receive of one took {}", taken.len()) };
    assert_eq!((message.seq, &message.message, message.from.as_ref()), (1, &json!("a"), Some(&from)));
    let journal = store.journal(&to, 0).await.must("journal");
    assert_eq!(journal[0].result, Some(json!({"took": 1, "message": "a"})));
    let next = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("the second");
    assert_eq!(next.message, json!("b"), "the message a journaled receive took is not taken again");
    assert_eq!(
        store
            .journal_mailbox(&to, entry("ipc.recv"), MailboxOp::Receive { max: 1 }, recorded)
            .await
            .must("empty receive"),
        None,
    );
    assert_eq!(store.journal(&to, 0).await.must("journal").len(), 1, "an empty receive journals nothing");
    let missing = RunId::generate(now_ms());
    expect_error!(
        store.journal_mailbox(&missing, entry("ipc.recv"), MailboxOp::Receive { max: 1 }, recorded).await,
        Error::RunNotFound(_),
        "a journaled receive of no run",
    );
}

/// A receive of up to `max` messages takes the oldest, in order, as many as are waiting
/// up to `max`, and past the first only while their bodies fit `RECEIVE_BATCH_BYTES`;
/// what it took is never taken again, and an empty mailbox writes nothing.
pub async fn mailbox_receive_takes_many(store: &dyn Store) {
    let to = fresh_run(store).await;
    let entry = || complete_entry("ipc.recv", json!({"max": 3}), EntryStatus::Ok, Usage::default());
    for i in 1..=5 {
        store.mailbox_send(&to, mail(None, json!(i), 10, None)).await.must("mailbox_send");
    }
    let mut took = Vec::new();
    for expected in [vec![1, 2, 3], vec![4, 5]] {
        let (_, done) = store
            .journal_mailbox(&to, entry(), MailboxOp::Receive { max: 3 }, recorded_many)
            .await
            .must("journal_mailbox receive many")
            .expect("messages");
        let MailboxDone::Received(taken) = done else { panic!("a receive answers Received, got {done:?}") };
        assert_eq!(taken.iter().map(|m| m.seq).collect::<Vec<_>>(), expected, "the oldest, in order");
        assert_eq!(
            taken.iter().map(|m| m.message.clone()).collect::<Vec<_>>(),
            expected.iter().map(|i| json!(i)).collect::<Vec<_>>()
        );
        took.push(json!({ "took": expected }));
    }
    let journal = store.journal(&to, 0).await.must("journal");
    assert_eq!(journal.iter().map(|e| e.result.clone().unwrap_or_default()).collect::<Vec<_>>(), took);
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0, "each taken once");
    let empty = store.journal_mailbox(&to, entry(), MailboxOp::Receive { max: 3 }, recorded_many).await;
    assert!(empty.must("an empty receive").is_none());
    assert_eq!(store.journal(&to, 0).await.must("journal").len(), 2, "an empty receive journals nothing");

    // Bodies past the first stop at RECEIVE_BATCH_BYTES: the first is taken whatever its size.
    let big = "x".repeat(crate::RECEIVE_BATCH_BYTES * 3 / 5);
    for _ in 0..3 {
        store.mailbox_send(&to, mail(None, json!(big), 10, None)).await.must("mailbox_send");
    }
    let mut sizes = Vec::new();
    while let Some((_, MailboxDone::Received(taken))) = store
        .journal_mailbox(&to, entry(), MailboxOp::Receive { max: 10 }, recorded_many)
        .await
        .must("journal_mailbox receive many")
    {
        sizes.push(taken.len());
    }
    assert_eq!(sizes, vec![2, 1], "two bodies of 0.6 MiB: the second fits past the first, a third does not");
}

/// A send to a waiting receiver (`MailboxOp::Send` with a `receive`) either completes the receive
/// in its own write (`SentAndTaken`: the receiver's oldest message taken, its entry
/// appended complete with the result made from `Received`) or is a plain send (`Sent`,
/// the message left for the receiver); either way nothing is taken twice, and a refused
/// send writes nothing in either journal. Which one is the backend's
/// `completes_waiting_receives`; returned, so a backend's own tests may require it.
pub async fn mailbox_send_completes_a_waiting_receive(store: &dyn Store) -> bool {
    let (from, to) = (fresh_run(store).await, fresh_run(store).await);
    let entry = |method: &str| complete_entry(method, json!({"to": "x"}), EntryStatus::Ok, Usage::default());
    let handoff = |message: &str| MailboxOp::Send {
        to: to.clone(),
        message: mail(Some(&from), json!(message), 2, None),
        receive: Some(Box::new(WaitingReceive { entry: entry("ipc.recv"), result_of: recorded_many })),
    };
    store.mailbox_send(&to, mail(None, json!("older"), 2, None)).await.must("mailbox_send");

    let (seq, done) = store
        .journal_mailbox(&from, entry("ipc.send"), handoff("a"), recorded)
        .await
        .must("journal_mailbox send to a receiver")
        .expect("a send always writes");
    assert_eq!(seq, 1);
    let sender = store.journal(&from, 0).await.must("journal");
    assert_eq!(sender.len(), 1);
    assert_eq!(sender[0].result, Some(json!({"sent": 2})), "the sender's result is made from the outcome");
    let receiver = store.journal(&to, 0).await.must("journal");
    let completes = match done {
        MailboxDone::SentAndTaken { seq: 2, receive_seq: 1, message } => {
            assert_eq!(
                message.message,
                json!("older"),
                "the receiver takes its oldest message, not the one sent"
            );
            assert_eq!(receiver.len(), 1, "the receive is journaled with the send");
            assert_eq!((receiver[0].method.as_str(), receiver[0].status), ("ipc.recv", EntryStatus::Ok));
            assert_eq!(
                receiver[0].result,
                Some(json!({"took": [1]})),
                "the receive's result is made by its own function"
            );
            assert_eq!(
                store.mailbox_len(&to).await.must("mailbox_len"),
                1,
                "the message sent is still there"
            );
            true
        }
        MailboxDone::Sent(2) => {
            assert!(receiver.is_empty(), "a plain send journals nothing for the receiver");
            assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 2);
            store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("the older message");
            false
        }
        other => panic!("store conformance: a send to a receiver answered {other:?}"),
    };
    assert_eq!(
        completes,
        store.completes_waiting_receives(),
        "a backend completes waiting receives exactly when it says it does"
    );
    let next = store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("the message sent");
    assert_eq!(next.message, json!("a"), "each message is taken once");

    // Into an empty mailbox: the receiver takes the message sent.
    let (_, done) = store
        .journal_mailbox(&from, entry("ipc.send"), handoff("b"), recorded)
        .await
        .must("journal_mailbox send to a receiver")
        .expect("a send always writes");
    if completes {
        let MailboxDone::SentAndTaken { message, receive_seq: 2, .. } = done else {
            panic!("store conformance: a backend that completed one receive answered {done:?}")
        };
        assert_eq!(message.message, json!("b"));
        assert_eq!(store.mailbox_receive(&to, None).await.must("mailbox_receive"), None, "taken once");
    } else {
        assert!(matches!(done, MailboxDone::Sent(_)), "{done:?}");
        assert_eq!(
            store.mailbox_receive(&to, None).await.must("mailbox_receive").expect("b").message,
            json!("b")
        );
    }

    // A refused send writes nothing, for either run.
    let full = fresh_run(store).await;
    for i in 0..2 {
        store.mailbox_send(&full, mail(None, json!(i), 2, None)).await.must("mailbox_send");
    }
    let refused = MailboxOp::Send {
        to: full.clone(),
        message: mail(Some(&from), json!("c"), 2, None),
        receive: Some(Box::new(WaitingReceive { entry: entry("ipc.recv"), result_of: recorded })),
    };
    expect_error!(
        store.journal_mailbox(&from, entry("ipc.send"), refused, recorded).await,
        Error::MailboxFull { capacity: 2, .. },
        "a send to a receiver whose mailbox is full",
    );
    assert_eq!(store.journal(&from, 0).await.must("journal").len(), 2, "a refused send journals nothing");
    assert!(store.journal(&full, 0).await.must("journal").is_empty(), "nor the receive");
    assert_eq!(store.mailbox_len(&full).await.must("mailbox_len"), 2, "and takes nothing");
    completes
}

/// A send to a run of another tenant, or to no run, is `RunNotFound`; receiving from or
/// measuring an unknown run is too.
pub async fn mailbox_is_tenant_scoped(store: &dyn Store) {
    let to = fresh_run(store).await;
    let mut foreign = mail(None, json!("x"), 10, None);
    foreign.tenant = "conformance-other".to_owned();
    expect_error!(
        store.mailbox_send(&to, foreign).await,
        Error::RunNotFound(ref id) if *id == to,
        "a send to another tenant's run",
    );
    assert_eq!(store.mailbox_len(&to).await.must("mailbox_len"), 0);
    let missing = RunId::generate(now_ms());
    expect_error!(
        store.mailbox_send(&missing, mail(None, json!("x"), 10, None)).await,
        Error::RunNotFound(_),
        "a send to no run",
    );
    expect_error!(store.mailbox_receive(&missing, None).await, Error::RunNotFound(_), "receive of no run");
    expect_error!(store.mailbox_len(&missing).await, Error::RunNotFound(_), "mailbox_len of no run");
}

/// A publish reaches every subscriber of the tenant's topic that has not ended, marked
/// with the topic; subscribing twice is once; a full mailbox fails the whole publish; a
/// retried publish (same key) delivers nothing twice.
pub async fn topics_publish_to_live_subscribers_all_or_nothing(store: &dyn Store) {
    let topic = format!("news-{}", RunId::generate(now_ms()));
    let mut runs = [fresh_run(store).await, fresh_run(store).await, fresh_run(store).await];
    runs.sort();
    let (a, b, c) = (runs[0].clone(), runs[1].clone(), runs[2].clone());
    let publish = |capacity: u64, key: Option<&str>| {
        let message = mail(None, json!({"headline": capacity}), capacity, key);
        store.topic_publish(&topic, message)
    };
    assert_eq!(publish(10, None).await.must("publish without subscribers"), []);
    for run in [&a, &b, &a] {
        store.topic_subscribe("conformance", &topic, run, true).await.must("topic_subscribe");
    }
    let delivered = publish(10, None).await.must("topic_publish");
    assert_eq!(delivered, [(a.clone(), 1), (b.clone(), 1)], "each subscriber once, by run id");
    let got = store.mailbox_receive(&b, None).await.must("receive").expect("the published message");
    assert_eq!((got.topic.as_deref(), got.message), (Some(topic.as_str()), json!({"headline": 10})));
    store.topic_subscribe("conformance", &topic, &b, false).await.must("unsubscribe");
    assert_eq!(publish(10, None).await.must("publish"), [(a.clone(), 2)], "b unsubscribed");

    store.topic_subscribe("conformance", &topic, &c, true).await.must("subscribe c");
    expect_error!(publish(2, None).await, Error::MailboxFull { ref run, .. } if *run == a, "a full subscriber");
    assert_eq!(store.mailbox_len(&c).await.must("mailbox_len"), 0, "a refused publish writes nothing");

    while store.mailbox_receive(&a, None).await.must("drain").is_some() {}
    let first = publish(10, Some("p:1")).await.must("publish with a key");
    let again = publish(10, Some("p:1")).await.must("publish retried");
    assert_eq!(first, again, "a retried publish answers the first deliveries");
    assert_eq!(store.mailbox_len(&a).await.must("len"), 1, "no duplicate");
    assert_eq!(store.mailbox_len(&c).await.must("len"), 1, "no duplicate");

    let patch = RunPatch { state: Some(RunState::Succeeded), ..RunPatch::default() };
    store.update_run(&c, None, patch).await.must("end c");
    let delivered = publish(10, None).await.must("publish");
    assert_eq!(delivered.iter().map(|(run, _)| run).collect::<Vec<_>>(), [&a], "ended runs get nothing");

    expect_error!(
        store.topic_subscribe("conformance-other", &topic, &a, true).await,
        Error::RunNotFound(_),
        "subscribing another tenant's run",
    );
    let mut foreign = mail(None, json!("x"), 10, None);
    foreign.tenant = "conformance-other".to_owned();
    assert_eq!(store.topic_publish(&topic, foreign).await.must("publish"), [], "topics are per tenant");
}

/// Receivers racing over one mailbox get every message exactly once.
pub async fn concurrent_mailbox_receives(store: Arc<dyn Store>) {
    let to = fresh_run(&*store).await;
    for i in 0..40u64 {
        store.mailbox_send(&to, mail(None, json!(i), 100, None)).await.must("mailbox_send");
    }
    let tasks = (0..8)
        .map(|r| {
            let store = Arc::clone(&store);
            let to = to.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut i = 0;
                loop {
                    let key = format!("r{r}:{i}");
                    i += 1;
                    match store.mailbox_receive(&to, Some(&key)).await.must("concurrent receive") {
                        Some(message) => got.push(message.seq),
                        None => break got,
                    }
                }
            })
        })
        .collect();
    let mut seqs: Vec<Seq> = join_all(tasks).await.into_iter().flatten().collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>(), "every message delivered exactly once");
}
