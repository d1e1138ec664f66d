//! Writes whose commit is cut off (`keel_store::Error::OutcomeUnknown`: the connection was
//! lost while the write committed, so it may or may not have landed), made deterministic:
//! a [`Faulty`] store wraps the kernel's and, on the test's [`Faults`] plan, answers the
//! next journal appends, completions or run updates with `OutcomeUnknown`, after making
//! the write ("landed") or without making it ("lost"). The kernel must come out the same
//! either way: every call answered, every entry journaled once, the run ended with its
//! output (see `syscall/journal.rs`). Before this, only a Postgres restart under load
//! reached these paths, by chance. The plan can also slow a receive's commit down, to open
//! a race wide enough to lose every time.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use keel_sdk::user;
use keel_store::{
    ApiTokenRecord, AuditEntry, AuditFilter, AuditRecord, AuditVerify, Completion, CostBucket, CostFilter,
    DumpItem, Error, EventRecord, JournalEntry, MailboxDone, MailboxMessage, MailboxOp, MailboxResult,
    MemoryEmbedding, MemoryHit, MemoryRecord, MemorySearch, NewEntry, NewEvent, NewMessage, NewRun, Result,
    RunFilter, RunPatch, RunRecord, Seq, Store, StoreStats, TenantRecord, ThreadMessage,
};
use keel_types::{EntryStatus, RunId, RunState};
use serde_json::{Value, json};

use crate::harness::{Setup, TestKernel};

/// A store write the plan can cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    AppendEntry,
    CompleteEntry,
    /// `update_run` without an expected state: a patch of fields (`run.exit`'s output).
    PatchRun,
    /// `update_run` with an expected state: a lifecycle transition's compare-and-set.
    Transition,
    /// `journal_mailbox`: a send or receive with its journal entry, in one commit.
    JournalMailbox,
}

/// How a planned write is cut off: both answer `OutcomeUnknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The write is made, then the answer is lost.
    Landed,
    /// The write is not made.
    Lost,
}

/// The test's plan, shared with the store: per kind of write, how its next calls are cut.
#[derive(Default)]
pub struct Faults {
    planned: Mutex<HashMap<Write, VecDeque<Cut>>>,
    /// How many of the next `get_run` calls answer that the run does not exist (a read
    /// that lost a race with the run's creation).
    hidden_runs: Mutex<usize>,
    /// How long the next receives' own takes (`journal_mailbox` with a receive) wait
    /// before they are made, one each: a slow commit, for the races it opens.
    slow_receives: Mutex<VecDeque<std::time::Duration>>,
    /// How many `events` and `get_run` reads the store has answered.
    reads: Mutex<Reads>,
}

/// The reads a follower of a run's events makes, counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reads {
    pub events: usize,
    pub get_run: usize,
}

impl Faults {
    /// The next `cuts.len()` calls of `write` are cut off, in order, as `cuts` says.
    pub fn cut_next(&self, write: Write, cuts: &[Cut]) {
        self.planned.lock().unwrap().entry(write).or_default().extend(cuts);
    }

    /// The next `n` `get_run` calls answer `None`, as if the run were not there yet.
    pub fn hide_next_runs(&self, n: usize) {
        *self.hidden_runs.lock().unwrap() += n;
    }

    fn hides_run(&self) -> bool {
        let mut hidden = self.hidden_runs.lock().unwrap();
        let hide = *hidden > 0;
        *hidden = hidden.saturating_sub(1);
        hide
    }

    /// The `events` and `get_run` reads answered so far.
    pub fn reads(&self) -> Reads {
        *self.reads.lock().unwrap()
    }

    /// The next receive's own take waits `delay` before it is made.
    pub fn slow_next_receive(&self, delay: std::time::Duration) {
        self.slow_receives.lock().unwrap().push_back(delay);
    }

    /// How many planned slow receives no receive has met yet.
    pub fn slow_receives_left(&self) -> usize {
        self.slow_receives.lock().unwrap().len()
    }

    /// How many planned cuts no call has met yet.
    pub fn left(&self) -> usize {
        self.planned.lock().unwrap().values().map(VecDeque::len).sum()
    }

    fn take(&self, write: Write) -> Option<Cut> {
        self.planned.lock().unwrap().get_mut(&write)?.pop_front()
    }
}

/// A [`Store`] that delegates everything to `inner`, except the writes `faults` cuts off.
pub struct Faulty {
    inner: Arc<dyn Store>,
    faults: Arc<Faults>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Store>, faults: Arc<Faults>) -> Faulty {
        Faulty { inner, faults }
    }

    /// `real` (the inner store's write, not yet started), unless the plan cuts it off.
    async fn write<T>(&self, write: Write, real: impl Future<Output = Result<T>>) -> Result<T> {
        let lost = || Error::OutcomeUnknown {
            step: "committing (cut off by the test)",
            source: format!("the test cut off this {write:?}").into(),
        };
        match self.faults.take(write) {
            None => real.await,
            Some(Cut::Landed) => real.await.and_then(|_| Err(lost())),
            Some(Cut::Lost) => Err(lost()),
        }
    }
}

/// The `Store` impl of [`Faulty`]: the methods in `special` as written, and every one in
/// `delegate` passed on to the inner store unchanged.
macro_rules! faulty_store {
    (
        special { $($special:tt)* }
        delegate { $( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )* }
    ) => {
        #[async_trait::async_trait]
        impl Store for Faulty {
            $($special)*
            $( async fn $name(&self $(, $arg: $ty)*) -> $ret { self.inner.$name($($arg),*).await } )*
        }
    };
}

faulty_store! {
    special {
        async fn append_entry(&self, run: &RunId, entry: &NewEntry) -> Result<Seq> {
            self.write(Write::AppendEntry, self.inner.append_entry(run, entry)).await
        }
        async fn complete_entry_with(&self, run: &RunId, seq: Seq, completion: &Completion,
            entries: &[NewEntry]) -> Result<Vec<Seq>> {
            self.write(Write::CompleteEntry, self.inner.complete_entry_with(run, seq, completion, entries)).await
        }
        async fn update_run(&self, id: &RunId, expected: Option<RunState>, patch: RunPatch) -> Result<RunRecord> {
            let write = if expected.is_some() { Write::Transition } else { Write::PatchRun };
            self.write(write, self.inner.update_run(id, expected, patch)).await
        }
        async fn journal_mailbox(&self, run: &RunId, entry: NewEntry, op: MailboxOp,
            result_of: MailboxResult) -> Result<Option<(Seq, MailboxDone)>> {
            if matches!(op, MailboxOp::Receive { .. }) {
                let delay = self.faults.slow_receives.lock().unwrap().pop_front();
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
            }
            self.write(Write::JournalMailbox, self.inner.journal_mailbox(run, entry, op, result_of)).await
        }
        async fn events(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>> {
            self.faults.reads.lock().unwrap().events += 1;
            self.inner.events(run, after, limit).await
        }
        fn completes_waiting_receives(&self) -> bool {
            self.inner.completes_waiting_receives()
        }
        async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>> {
            self.faults.reads.lock().unwrap().get_run += 1;
            if self.faults.hides_run() {
                return Ok(None);
            }
            self.inner.get_run(id).await
        }
    }
    delegate {
        fn create_run(&self, run: NewRun) -> Result<RunRecord>;
        fn runs_ended_after(&self, tenant: &str, after_ms: u64, after_id: Option<&RunId>, limit: usize)
            -> Result<Vec<RunRecord>>;
        fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>>;
        fn cost_summary(&self, filter: &CostFilter) -> Result<Vec<CostBucket>>;
        fn count_runs(&self) -> Result<Vec<keel_store::RunCount>>;
        fn abandon_entries(&self, run: &RunId, seqs: &[Seq]) -> Result<()>;
        fn journal(&self, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>>;
        fn latest_entry(&self, run: &RunId, method: &str) -> Result<Option<JournalEntry>>;
        fn append_events(&self, run: &RunId, events: &[NewEvent]) -> Result<Seq>;
        fn kv_get(&self, scope: &str, key: &str) -> Result<Option<Value>>;
        fn kv_get_many(&self, keys: &[(String, String)]) -> Result<Vec<Option<Value>>>;
        fn kv_put(&self, scope: &str, key: &str, value: Value) -> Result<()>;
        fn kv_put_unflushed(&self, scope: &str, key: &str, value: Value) -> Result<()>;
        fn kv_chain(&self, scope: &str, key: &str, link: &[&str], limit: usize) -> Result<Vec<Value>>;
        fn thread_append(&self, tenant: &str, thread: &str, message: Value, idempotency_key: Option<&str>,
            appended_at_ms: u64) -> Result<u64>;
        fn thread_read(&self, tenant: &str, thread: &str, last: Option<usize>) -> Result<Vec<ThreadMessage>>;
        fn mem_put(&self, tenant: &str, namespace: &str, key: &str, value: Value, text: String,
            embedding: Option<MemoryEmbedding>, updated_at_ms: u64) -> Result<()>;
        fn mem_get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryRecord>>;
        fn mem_delete(&self, tenant: &str, namespace: &str, key: &str, idempotency_key: Option<&str>)
            -> Result<bool>;
        fn mem_search(&self, tenant: &str, namespace: &str, search: &MemorySearch, limit: usize)
            -> Result<Vec<MemoryHit>>;
        fn mailbox_send(&self, to: &RunId, message: NewMessage) -> Result<Seq>;
        fn mailbox_receive(&self, run: &RunId, idempotency_key: Option<&str>) -> Result<Option<MailboxMessage>>;
        fn mailbox_len(&self, run: &RunId) -> Result<u64>;
        fn topic_subscribe(&self, tenant: &str, topic: &str, run: &RunId, subscribe: bool) -> Result<()>;
        fn topic_publish(&self, topic: &str, message: NewMessage) -> Result<Vec<(RunId, Seq)>>;
        fn audit_append(&self, records: Vec<AuditRecord>) -> Result<Vec<Seq>>;
        fn audit_list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>>;
        fn audit_verify(&self) -> Result<AuditVerify>;
        fn tenant_create(&self, tenant: TenantRecord) -> Result<()>;
        fn tenant_get(&self, name: &str) -> Result<Option<TenantRecord>>;
        fn tenant_list(&self) -> Result<Vec<TenantRecord>>;
        fn token_create(&self, token: ApiTokenRecord) -> Result<()>;
        fn token_lookup(&self, hash: &str) -> Result<Option<ApiTokenRecord>>;
        fn token_list(&self, tenant: &str) -> Result<Vec<ApiTokenRecord>>;
        fn token_revoke(&self, tenant: &str, prefix: &str) -> Result<u64>;
        fn trigger_create(&self, trigger: keel_store::TriggerRecord) -> Result<()>;
        fn trigger_get(&self, kind: &str, name: &str) -> Result<Option<keel_store::TriggerRecord>>;
        fn trigger_list(&self, kind: &str, tenant: Option<&str>) -> Result<Vec<keel_store::TriggerRecord>>;
        fn trigger_set_paused(&self, kind: &str, name: &str, paused: bool, since_ms: u64) -> Result<bool>;
        fn trigger_update(&self, kind: &str, name: &str, tenant: &str, spec: &Value) -> Result<bool>;
        fn trigger_delete(&self, kind: &str, name: &str) -> Result<bool>;
        fn trigger_fire(&self, fire: keel_store::FireRecord) -> Result<(keel_store::FireRecord, bool)>;
        fn trigger_fire_settle(&self, kind: &str, trigger: &str, occasion: &str, outcome: &str, detail: Option<&str>) -> Result<()>;
        fn trigger_fires(&self, kind: &str, trigger: &str, limit: usize) -> Result<Vec<keel_store::FireRecord>>;
        fn trigger_fires_unstarted(&self, kind: &str) -> Result<Vec<keel_store::FireRecord>>;
        fn stats(&self) -> Result<StoreStats>;
        fn dump(&self, sink: tokio::sync::mpsc::Sender<Vec<DumpItem>>) -> Result<()>;
        fn restore(&self, items: Vec<DumpItem>) -> Result<()>;
        fn is_empty(&self) -> Result<bool>;
    }
}

/// A kernel on a [`Faulty`] store, a running puppet run (with one scripted LLM reply)
/// and its agent; the plan starts empty.
fn faulty_run() -> (TestKernel, Arc<Faults>, RunId, keel_sdk::Client) {
    let faults = Arc::new(Faults::default());
    let plan = faults.clone();
    let test = TestKernel::start_with(|_| Setup { faults: Some(plan), ..Setup::default() });
    let run = test.create_run(json!({"llm_script": {"responses": [{"content": "one"}]}}));
    let agent = test.agent(&run);
    test.wait_state(&run, RunState::Running);
    (test, faults, run, agent)
}

/// Ends the run through `run.exit` and the agent's exit; the run must succeed with
/// `output`, announced by its `state` event.
fn finish(test: &TestKernel, run: &RunId, agent: &mut keel_sdk::Client, output: Value) {
    agent.exit(&output).expect("run.exit is answered");
    test.kill_agent(run);
    let ended = test.wait_state(run, RunState::Succeeded);
    assert_eq!(ended.output, Some(output));
    test.wait_event(run, "state", json!({"state": "succeeded"}));
}

/// The journal's methods and statuses, and no seq twice.
fn journaled(test: &TestKernel, run: &RunId) -> Vec<(String, EntryStatus)> {
    let journal = test.journal(run);
    let seqs: Vec<Seq> = journal.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=journal.len() as Seq).collect::<Vec<_>>(), "{journal:#?}");
    journal.into_iter().map(|e| (e.method, e.status)).collect()
}

#[test]
fn an_append_cut_off_is_read_back_and_journaled_once() {
    for cut in [Cut::Landed, Cut::Lost] {
        let (test, faults, run, mut agent) = faulty_run();
        // An entry appended complete (`sys.now`), then the intent of a call with an
        // outside effect (`kv.put`, a tool that writes), each cut off.
        faults.cut_next(Write::AppendEntry, &[cut]);
        agent.now_ms().unwrap_or_else(|err| panic!("{cut:?}: sys.now answers: {err}"));
        assert_eq!(faults.left(), 0, "{cut:?}: the append was cut off");
        faults.cut_next(Write::AppendEntry, &[cut]);
        let put = agent.tool("kv.put", json!({"key": "k", "value": 1}));
        assert_eq!(put.unwrap_or_else(|err| panic!("{cut:?}: tool.call answers: {err}")), json!(true));
        assert_eq!(faults.left(), 0, "{cut:?}: the intent's append was cut off");

        let ok = EntryStatus::Ok;
        assert_eq!(journaled(&test, &run), [("sys.now".into(), ok), ("tool.call".into(), ok)], "{cut:?}");
        assert_eq!(test.journal(&run)[1].result, Some(json!({"result": true})), "{cut:?}");
        finish(&test, &run, &mut agent, json!({"cut": format!("{cut:?}")}));
        assert_eq!(journaled(&test, &run).len(), 3, "{cut:?}: and run.exit");
    }
}

#[test]
fn a_completion_cut_off_is_read_back_and_made_once() {
    for cut in [Cut::Landed, Cut::Lost] {
        let (test, faults, run, mut agent) = faulty_run();
        faults.cut_next(Write::CompleteEntry, &[cut]);
        let put = agent.tool("kv.put", json!({"key": "k", "value": 2}));
        assert_eq!(put.unwrap_or_else(|err| panic!("{cut:?}: tool.call answers: {err}")), json!(true));
        assert_eq!(faults.left(), 0, "{cut:?}: the completion was cut off");
        faults.cut_next(Write::CompleteEntry, &[cut]);
        let reply = agent.llm_chat(&[user("hi")]);
        let reply = reply.unwrap_or_else(|err| panic!("{cut:?}: llm.chat answers: {err}"));
        assert_eq!(reply.message.content.as_deref(), Some("one"), "{cut:?}");
        assert_eq!(faults.left(), 0, "{cut:?}: the completion was cut off");

        let ok = EntryStatus::Ok;
        assert_eq!(journaled(&test, &run), [("tool.call".into(), ok), ("llm.chat".into(), ok)], "{cut:?}");
        let journal = test.journal(&run);
        assert_eq!(journal[0].result, Some(json!({"result": true})), "{cut:?}");
        assert!(journal[1].result.as_ref().is_some_and(|r| r.to_string().contains("\"one\"")), "{cut:?}");
        assert_eq!(test.get(&run).provider_calls, 1, "{cut:?}: the model call is counted once");
        finish(&test, &run, &mut agent, json!({"cut": format!("{cut:?}")}));
    }
}

/// A `code.exec`'s result and its program's reads are one commit
/// (`Store::complete_entry_with`): cut off, landed or lost, the exec and each read are
/// journaled once and the reads counted once.
#[test]
fn a_code_exec_result_cut_off_journals_its_reads_once() {
    for cut in [Cut::Landed, Cut::Lost] {
        let faults = Arc::new(Faults::default());
        let plan = faults.clone();
        let test = TestKernel::start_with(|_| Setup { faults: Some(plan), interp: true, ..Setup::default() });
        let run = test.create_run(json!({}));
        let mut agent = test.agent(&run);
        test.wait_state(&run, RunState::Running);
        faults.cut_next(Write::CompleteEntry, &[cut]);
        let code = "total = 0\nfor i in range(3):\n    total = total + echo(n=i)['n']\ntotal";
        let out: keel_sdk::Result<Value> = agent.call("code.exec", json!({"lang": "python", "code": code}));
        let out = out.unwrap_or_else(|err| panic!("{cut:?}: code.exec answers: {err}"));
        assert_eq!(out["result"], json!(3), "{cut:?}: {out}");
        assert_eq!(faults.left(), 0, "{cut:?}: the result's commit was cut off");

        let ok = EntryStatus::Ok;
        let read = ("tool.call".to_owned(), ok);
        assert_eq!(
            journaled(&test, &run),
            [("code.exec".to_owned(), ok), read.clone(), read.clone(), read],
            "{cut:?}"
        );
        let reads: Vec<Value> =
            test.journal(&run)[1..].iter().map(|e| e.params["args"]["n"].clone()).collect();
        assert_eq!(reads, [json!(0), json!(1), json!(2)], "{cut:?}: the reads in the program's order");
        assert_eq!(test.get(&run).usage.tool_calls, 3, "{cut:?}: each read counted once");
        finish(&test, &run, &mut agent, json!({"cut": format!("{cut:?}")}));
    }
}

#[test]
fn a_mailbox_write_cut_off_delivers_its_message_once() {
    for cut in [Cut::Landed, Cut::Lost] {
        let (test, faults, run, mut agent) = faulty_run();
        // A send to itself, then the receive, each with its journal entry in one commit
        // that is cut off: read back if it landed, made again if not, never twice.
        faults.cut_next(Write::JournalMailbox, &[cut]);
        let sent = agent.send(run.as_str(), &json!({"n": 1}), None, true);
        assert_eq!(sent.unwrap_or_else(|err| panic!("{cut:?}: ipc.send answers: {err}")), 1, "{cut:?}");
        assert_eq!(faults.left(), 0, "{cut:?}: the send was cut off");
        faults.cut_next(Write::JournalMailbox, &[cut]);
        let got = agent.recv(Some(5_000)).unwrap_or_else(|err| panic!("{cut:?}: ipc.recv answers: {err}"));
        let got = got.unwrap_or_else(|| panic!("{cut:?}: the message is received"));
        assert_eq!((got.seq, &got.message), (1, &json!({"n": 1})), "{cut:?}");
        assert_eq!(faults.left(), 0, "{cut:?}: the receive was cut off");
        let none = agent.recv(Some(10)).unwrap_or_else(|err| panic!("{cut:?}: ipc.recv answers: {err}"));
        assert_eq!(none, None, "{cut:?}: the message is not delivered twice");

        let ok = EntryStatus::Ok;
        let methods = [("ipc.send".into(), ok), ("ipc.recv".into(), ok), ("ipc.recv".into(), ok)];
        assert_eq!(journaled(&test, &run), methods, "{cut:?}");
        let journal = test.journal(&run);
        assert_eq!(journal[0].result, Some(json!({"seq": 1})), "{cut:?}");
        assert_eq!(
            journal[1].result.as_ref().and_then(|r| r.pointer("/message/message")),
            Some(&json!({"n": 1}))
        );
        assert_eq!(journal[2].result, Some(json!({"message": null})), "{cut:?}");
        finish(&test, &run, &mut agent, json!({"cut": format!("{cut:?}")}));
    }
}

#[test]
fn run_exit_and_the_end_of_the_run_cut_off_still_end_it_succeeded() {
    for cut in [Cut::Landed, Cut::Lost] {
        let (test, faults, run, mut agent) = faulty_run();
        // `run.exit`'s output patch, then the transition that ends the run.
        faults.cut_next(Write::PatchRun, &[cut]);
        faults.cut_next(Write::Transition, &[cut]);
        finish(&test, &run, &mut agent, json!({"cut": format!("{cut:?}")}));
        assert_eq!(faults.left(), 0, "{cut:?}: both updates were cut off");
        assert_eq!(journaled(&test, &run), [("run.exit".into(), EntryStatus::Ok)], "{cut:?}");
    }
}

/// A follower of a run's events (`keel run`, `keel logs -f`, the console) reads each batch
/// of new events once, without an empty read after it, and reads the run only when it
/// starts and after a quiet while, not after every batch; it still gets every event and
/// ends with the run.
#[test]
fn a_follower_reads_each_batch_of_events_once_and_the_run_only_now_and_then() {
    const CALLS: usize = 20;
    let (test, faults, run, mut agent) = faulty_run();
    let pid = test.get(&run).pid.expect("the agent's pid");
    let before = faults.reads();
    let calls = std::thread::spawn(move || {
        for _ in 0..CALLS {
            agent.now_ms().expect("sys.now answers");
            // Longer than the event log's gathering, so each call's event is a batch.
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        agent.exit(&json!({"calls": CALLS})).expect("run.exit is answered");
        std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    });
    let followed = run.clone();
    let kinds: Vec<(String, Value)> = test.on_kernel(|kernel| async move {
        let mut stream =
            kernel.events(&followed, 0, true, keel_protocol::EventKinds::ALL).await.expect("follow");
        let mut kinds = Vec::new();
        while let Some(event) = stream.next().await.expect("the next event") {
            kinds.push((event.kind.clone(), event.data.clone()));
        }
        kinds
    });
    calls.join().expect("the agent's calls");
    let reads = faults.reads();
    let (events, get_run) = (reads.events - before.events, reads.get_run - before.get_run);
    let syscalls =
        kinds.iter().filter(|(kind, data)| kind == "syscall" && data["method"] == "sys.now").count();
    assert_eq!(syscalls, CALLS, "{kinds:?}");
    assert_eq!(kinds.last().map(|(_, data)| data["state"].clone()), Some(json!("succeeded")), "{kinds:?}");
    // One read per batch (about one per call, and a few for the run's start and end);
    // an empty read after each batch would make it two.
    assert!(events <= CALLS + 8, "{events} reads of events for {CALLS} batches ({get_run} of the run)");
    // At the start, and once per two quiet seconds; the run's whole life is well under.
    assert!(get_run <= 6, "{get_run} reads of the run while following it ({events} of events)");
}
