//! Durability under a real crash: a child process (this test binary, re-executed) journals
//! steps and reports each one only after the store acknowledged it; the parent SIGKILLs it
//! mid-stream, reopens the file and requires every acknowledged write to be there, intact.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use keel_store::{Completion, NewEntry, Store};
use keel_types::{EntryStatus, RunId, Usage};
use serde_json::{Value, json};

use crate::{TestDb, new_run, open};

/// Set (to the database path) only in the child; its presence turns `child_writer` on.
const CHILD_DB_ENV: &str = "KEEL_STORE_CRASH_CHILD";
const CHILD_RUN_ENV: &str = "KEEL_STORE_CRASH_RUN";
/// The child's test name, as libtest filters it.
const CHILD_TEST: &str = "crash::child_writer";
/// Starts every acknowledgement line the child prints.
const ACK_MARKER: &str = "ack:";
/// Concurrent writers in the child, so that the kill lands amid group commits.
const CHILD_WRITERS: u64 = 8;
/// Completed steps the parent waits to see acknowledged before it kills the child.
const ACKNOWLEDGED_STEPS: usize = 300;

/// Kills the child if the parent test fails before it does, so no writer outlives it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let db = TestDb::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = runtime.block_on(async {
        let store = db.open();
        store.create_run(new_run(10)).await.unwrap().id
    });

    let child = Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DB_ENV, db.path())
        .env(CHILD_RUN_ENV, run.as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().unwrap();

    // seq -> (task, n) for acknowledged intents; seqs whose completion was acknowledged.
    let mut intents: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut completed: Vec<u64> = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // libtest writes `test crash::child_writer ... ` without a newline before the
        // test runs, so an acknowledgement may share its line: look for the marker.
        let Some(start) = line.find(ACK_MARKER) else {
            continue;
        };
        let words: Vec<&str> = line[start + ACK_MARKER.len()..].split_whitespace().collect();
        match words.as_slice() {
            ["intent", seq, task, n] => {
                let previous =
                    intents.insert(seq.parse().unwrap(), (task.parse().unwrap(), n.parse().unwrap()));
                assert_eq!(previous, None, "seq {seq} was acknowledged twice");
            }
            ["done", seq] => completed.push(seq.parse().unwrap()),
            _ => panic!("unexpected acknowledgement {line:?}"),
        }
        if completed.len() >= ACKNOWLEDGED_STEPS {
            break;
        }
    }
    assert!(
        completed.len() >= ACKNOWLEDGED_STEPS,
        "the child stopped after {} acknowledged steps: {:?}",
        completed.len(),
        child.0.wait()
    );
    // `Child::kill` is SIGKILL: no destructor, no flush, no clean close of SQLite.
    child.0.kill().unwrap();
    child.0.wait().unwrap();

    let raw = rusqlite::Connection::open(db.path()).unwrap();
    let integrity: String = raw.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(integrity, "ok");
    drop(raw);

    runtime.block_on(async {
        let store = db.open();
        let journal = store.journal(&run, 0).await.unwrap();
        let seqs: Vec<u64> = journal.iter().map(|entry| entry.seq).collect();
        assert_eq!(
            seqs,
            (1..=journal.len() as u64).collect::<Vec<_>>(),
            "the journal must be dense from 1 after a crash"
        );
        let by_seq: BTreeMap<u64, _> = journal.iter().map(|entry| (entry.seq, entry)).collect();
        for (seq, (task, n)) in &intents {
            let entry = by_seq
                .get(seq)
                .unwrap_or_else(|| panic!("acknowledged entry {seq} is missing after SIGKILL"));
            assert_eq!(entry.params, step_params(*task, *n), "entry {seq} params");
        }
        for seq in &completed {
            let entry = by_seq[seq];
            assert_eq!(entry.status, EntryStatus::Ok, "completed entry {seq} lost its result");
            let (task, n) = intents[seq];
            assert_eq!(entry.result, Some(json!({"task": task, "n": n})));
        }
        // Usage and provider calls were added in the same transactions as the
        // completions, so they agree with the journal exactly, crash or not.
        let ok_entries = journal.iter().filter(|entry| entry.status == EntryStatus::Ok).count() as u64;
        let stored = store.get_run(&run).await.unwrap().unwrap();
        assert_eq!(stored.usage.llm_calls, ok_entries);
        assert_eq!(stored.provider_calls, ok_entries);
    });
}

/// The writer half of `acknowledged_writes_survive_sigkill`; does nothing in a normal
/// test run. Prints `ack:intent <seq> <task> <n>` once an append is durable and
/// `ack:done <seq>` once its completion is, until killed (or until its stdout is closed).
#[test]
fn child_writer() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let run = RunId::parse(&std::env::var(CHILD_RUN_ENV).unwrap()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(open(Path::new(&path)));
        let writers: Vec<_> = (0..CHILD_WRITERS)
            .map(|task| {
                let store = Arc::clone(&store);
                let run = run.clone();
                tokio::spawn(async move { journal_steps(&*store, &run, task).await })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
    });
}

async fn journal_steps(store: &dyn Store, run: &RunId, task: u64) {
    // Bounded so that a child whose parent vanished without closing the pipe still ends.
    for n in 0..100_000 {
        let entry = NewEntry {
            method: "llm.chat".to_owned(),
            params: step_params(task, n),
            params_hash: format!("{task}:{n}"),
            status: EntryStatus::Pending,
            result: None,
            error: None,
            attempt: 1,
            started_at_ms: n,
            finished_at_ms: None,
            usage: Usage::default(),
        };
        let seq = store.append_entry(run, &entry).await.unwrap();
        if !acknowledge(&format!("intent {seq} {task} {n}")) {
            return;
        }
        let completion = Completion {
            status: EntryStatus::Ok,
            result: Some(json!({"task": task, "n": n})),
            error: None,
            finished_at_ms: n + 1,
            usage: Usage { llm_calls: 1, ..Usage::default() },
            provider_served: true,
        };
        store.complete_entry(run, seq, &completion).await.unwrap();
        if !acknowledge(&format!("done {seq}")) {
            return;
        }
    }
}

/// Writes one acknowledgement line to stdout (whole, under the stdout lock; std flushes
/// at the newline). False once the parent has stopped reading.
fn acknowledge(line: &str) -> bool {
    writeln!(std::io::stdout(), "{ACK_MARKER}{line}").is_ok()
}

fn step_params(task: u64, n: u64) -> Value {
    json!({"task": task, "n": n, "padding": "p".repeat(256)})
}
