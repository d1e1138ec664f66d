//! Run events (agent output, state changes, syscalls, emitted events): one writer task
//! batches them into the store off the syscall path, and followers are woken by a per-run
//! watch of the newest stored events. A follower that has every event before the ones the
//! watch holds takes them from there; one that fell behind (or came late) reads the
//! store. Either way it goes by seq, so it never misses or repeats an event however it
//! interleaves with the writer. Every stored batch that is more than agent output also
//! announces its run on a broadcast of changed runs, which the console's live list of
//! runs follows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_protocol::EventKinds;
use keel_protocol::api::EventView;
use keel_store::{EventRecord, NewEvent, Seq, Store};
use keel_types::{RunId, RunState};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

enum Message {
    Event(RunId, NewEvent),
    Flush(oneshot::Sender<()>),
}

/// What a run's followers are woken with: the events of the newest write of the run's
/// events, with their seqs (a write's events take consecutive seqs ending at the one the
/// store returns). `None` until the first write after the first follower came.
type Head = Option<Arc<[EventRecord]>>;

/// The watches of the runs someone follows. A watch nobody holds any more is dropped at
/// the run's next write of events, or by the sweep when the map has doubled.
struct Heads {
    runs: HashMap<RunId, watch::Sender<Head>>,
    sweep_at: usize,
}

/// The fewest watches before `EventLog::head` sweeps away those nobody holds.
const SWEEP_AT_LEAST: usize = 64;

/// Handle to the event writer. Cheap to clone.
#[derive(Clone)]
pub(crate) struct EventLog {
    tx: mpsc::UnboundedSender<Message>,
    heads: Arc<Mutex<Heads>>,
    /// Runs whose state, usage or waits may have changed: announced once their events are
    /// in the store, so a reader that hears of one reads the change.
    changes: broadcast::Sender<RunId>,
    /// The audit writer lives beside the event writer: started, and flushed, with it.
    pub(crate) audit: crate::audit::AuditLog,
}

/// How many announcements of changed runs a slow follower may fall behind by before it
/// is told it lagged (and must read the runs afresh).
const CHANGES_CAPACITY: usize = 4096;

impl EventLog {
    /// Starts the event writer and the audit writer (`crate::audit`).
    pub(crate) fn start(store: Arc<dyn Store>) -> EventLog {
        let (tx, rx) = mpsc::unbounded_channel();
        let heads = Arc::new(Mutex::new(Heads { runs: HashMap::new(), sweep_at: SWEEP_AT_LEAST }));
        let audit = crate::audit::AuditLog::start(store.clone());
        let (changes, _) = broadcast::channel(CHANGES_CAPACITY);
        tokio::spawn(write_loop(store, rx, heads.clone(), changes.clone()));
        EventLog { tx, heads, changes, audit }
    }

    /// Follows the runs that change from now on (see `changes`).
    pub(crate) fn changed_runs(&self) -> broadcast::Receiver<RunId> {
        self.changes.subscribe()
    }

    pub(crate) fn emit(&self, run: &RunId, kind: keel_protocol::EventKind, data: Value) {
        let event = NewEvent { ts_ms: crate::now_ms(), kind: kind.as_str().to_owned(), data };
        // The writer only stops when the kernel is dropped; events after that are moot.
        let _ = self.tx.send(Message::Event(run.clone(), event));
    }

    /// Waits until every event emitted, and every audit record queued, before this call
    /// is in the store.
    pub(crate) async fn flush(&self) {
        self.audit.flush().await;
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Message::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    fn head(&self, run: &RunId) -> watch::Receiver<Head> {
        let mut heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        if heads.runs.len() >= heads.sweep_at {
            // Receivers are only made under this lock, so a watch with none stays so.
            heads.runs.retain(|_, head| head.receiver_count() > 0);
            heads.sweep_at = (heads.runs.len() * 2).max(SWEEP_AT_LEAST);
        }
        heads.runs.entry(run.clone()).or_insert_with(|| watch::channel(None).0).subscribe()
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    heads: Arc<Mutex<Heads>>,
    changes: broadcast::Sender<RunId>,
) {
    let mut batch: Vec<Message> = Vec::new();
    while rx.recv_many(&mut batch, 1024).await > 0 {
        // Events need not be durable before a reply: gather for a moment, so a busy run's
        // events share one commit instead of costing an fsync per syscall.
        tokio::time::sleep(Duration::from_millis(2)).await;
        while batch.len() < 4096
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        let mut per_run: Vec<(RunId, Vec<NewEvent>)> = Vec::new();
        let mut flushes = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Event(run, event) => match per_run.iter_mut().find(|(r, _)| *r == run) {
                    Some((_, events)) => events.push(event),
                    None => per_run.push((run, vec![event])),
                },
                Message::Flush(done) => flushes.push(done),
            }
        }
        // Every run's events at once, so a store that group-commits (SQLite's writer)
        // makes them durable in one commit rather than one per run.
        let appends = per_run.iter().map(|(run, events)| {
            // A store that is away (a database restarting) is waited for, the events kept;
            // any other refusal (a run another node took over) drops them.
            crate::outage::retry_while(run, || true, false, || store.append_events(run, events))
        });
        let appended = futures_util::future::join_all(appends).await;
        for ((run, events), appended) in per_run.into_iter().zip(appended) {
            // Output lines change nothing a listing shows; anything else may.
            let output_only = events.iter().all(|event| {
                event.kind == keel_protocol::EventKind::Stdout.as_str()
                    || event.kind == keel_protocol::EventKind::Stderr.as_str()
            });
            match appended {
                Ok(last) => {
                    let mut heads = heads.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(head) = heads.runs.get(&run) {
                        if head.receiver_count() == 0 {
                            heads.runs.remove(&run);
                        } else {
                            head.send_replace(stored(events, last));
                        }
                    }
                    drop(heads);
                    if !output_only {
                        // No follower is no error.
                        let _ = changes.send(run);
                    }
                }
                Err(err) => tracing::warn!(run = %run, "could not record run events: {err}"),
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// The records of `events`, just written with `last` the seq of the last one; `None` if
/// the store's seq cannot be theirs, or if they are more than a follower reads at once
/// (they are kept until the run's next write: a burst of output is read from the store).
fn stored(events: Vec<NewEvent>, last: Seq) -> Head {
    if events.len() > PAGE {
        return None;
    }
    let first = (last + 1).checked_sub(events.len() as Seq).filter(|first| *first > 0)?;
    let records = events.into_iter().zip(first..).map(|(event, seq)| EventRecord {
        seq,
        ts_ms: event.ts_ms,
        kind: event.kind,
        data: event.data,
    });
    Some(records.collect())
}

/// Reads a run's events from `after` on. With `follow`, waits for new ones until the run
/// has ended and its final state event was delivered.
pub struct EventStream {
    store: Arc<dyn Store>,
    run: RunId,
    after: Seq,
    follow: bool,
    head: watch::Receiver<Head>,
    buffered: std::collections::VecDeque<EventRecord>,
    done: bool,
    /// The last read of a follower found every event stored then: wait for the next.
    caught_up: bool,
    /// The next read that finds nothing new also reads the run, to see whether it ended
    /// without its final state event (set at first, and after a quiet while).
    check_run: bool,
    /// When the follower first found the run ended with its final state event not yet
    /// delivered (see `LAST_EVENTS_GRACE`).
    ended_seen: Option<tokio::time::Instant>,
    /// The kinds delivered; the others are passed over (a passed-over final state event
    /// still ends a follower's stream).
    kinds: EventKinds,
}

/// How long a follower that finds its run ended waits for the run's last events. The
/// run's row is written first and its events after it (the final state event is emitted
/// once the row is stored, and the event writer stores events a few milliseconds late),
/// so a follower reading between the two must not end there. Only a kernel that died in
/// between (or a node of a cluster that lost the run) leaves them unwritten: then the
/// stream ends after this.
const LAST_EVENTS_GRACE: Duration = Duration::from_secs(2);

/// How long a follower waits for a new event before it looks at the run's row again.
const QUIET: Duration = Duration::from_secs(2);

/// The most events a follower reads at once.
const PAGE: usize = 512;

impl EventStream {
    pub(crate) fn new(store: Arc<dyn Store>, log: &EventLog, run: RunId, after: Seq, follow: bool) -> Self {
        let head = log.head(&run);
        EventStream {
            store,
            run,
            after,
            follow,
            head,
            buffered: Default::default(),
            done: false,
            caught_up: false,
            check_run: true,
            ended_seen: None,
            kinds: EventKinds::ALL,
        }
    }

    /// Only events of `kinds`.
    pub(crate) fn with_kinds(mut self, kinds: EventKinds) -> Self {
        self.kinds = kinds;
        self
    }

    /// The next event, or `None` at the end (at once when not following).
    pub async fn next(&mut self) -> crate::Result<Option<EventView>> {
        loop {
            if let Some(event) = self.buffered.pop_front() {
                self.after = event.seq;
                if self.follow
                    && event.kind == keel_protocol::EventKind::State.as_str()
                    && is_terminal_state_event(&event.data)
                {
                    self.done = true;
                }
                if !self.kinds.contains_name(&event.kind) {
                    continue;
                }
                return Ok(Some(crate::views::event(event)));
            }
            if self.done {
                return Ok(None);
            }
            if self.caught_up {
                // The last read found every event stored then. Wait on a new event, or
                // look at the run after a quiet while in case it ended without a further
                // event (e.g. it was ended by another kernel).
                self.caught_up = false;
                let woken = tokio::time::timeout(QUIET, self.head.changed()).await;
                self.check_run = woken.is_err();
                continue;
            }
            // Mark the head as seen before reading, so a write that lands after the read
            // still wakes us.
            let newest = self.head.borrow_and_update().clone();
            if self.follow
                && let Some(newest) = newest
                && newest.first().is_some_and(|first| first.seq <= self.after + 1)
            {
                // The newest write follows on from what this follower has: its events
                // need no read (the store holds them; they were written before the
                // watch was told). Only the unseen ones, in case a read got some first.
                self.buffered.extend(newest.iter().filter(|event| event.seq > self.after).cloned());
                if !self.buffered.is_empty() {
                    self.caught_up = !self.check_run;
                    continue;
                }
            }
            let page = self.store.events(&self.run, self.after, PAGE).await?;
            let full = page.len() == PAGE;
            if !page.is_empty() {
                self.buffered.extend(page);
                // A short page had every event there was: once it is delivered, wait for
                // the next rather than read an empty page to find that out.
                self.caught_up = self.follow && !full && !self.check_run;
                continue;
            }
            if !self.follow {
                return Ok(None);
            }
            // Whether the run is still going: read only when this follower has not looked
            // yet, or has heard nothing for a while. A run that ends emits its final state
            // event, which ends the stream without this read.
            if self.check_run {
                self.check_run = false;
                let run = self.store.get_run(&self.run).await?;
                if run.is_none_or(|r| r.state.is_terminal()) {
                    // Ended, but its final state event has not come (else `done`): it and
                    // the events just before it may still be on their way to the store.
                    let first = *self.ended_seen.get_or_insert_with(tokio::time::Instant::now);
                    let left = LAST_EVENTS_GRACE.saturating_sub(first.elapsed());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    let _ = tokio::time::timeout(left, self.head.changed()).await;
                    // Until the grace ends, each read that finds nothing looks again.
                    self.check_run = true;
                    continue;
                }
            }
            self.caught_up = true;
        }
    }
}

fn is_terminal_state_event(data: &Value) -> bool {
    data.get("state")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<RunState>().ok())
        .is_some_and(RunState::is_terminal)
}

#[cfg(test)]
mod tests {
    use keel_protocol::EventKind;
    use keel_store::{NewRun, RunPatch, SqliteStore};
    use serde_json::json;

    use super::*;

    /// A store (in `dir`) with an event log, and a running run.
    async fn a_running_run(dir: &tempfile::TempDir) -> (Arc<dyn Store>, EventLog, NewRun) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("keel.db")).unwrap());
        let log = EventLog::start(store.clone());
        let run = NewRun {
            id: RunId::generate(1),
            tenant: "t".into(),
            spec: json!({}),
            state: RunState::Running,
            created_at_ms: 1,
        };
        store.create_run(run.clone()).await.unwrap();
        (store, log, run)
    }

    /// The same, but the run's row says it ended, and none of its events are stored.
    async fn an_ended_run(dir: &tempfile::TempDir) -> (Arc<dyn Store>, EventLog, RunId) {
        let (store, log, run) = a_running_run(dir).await;
        let ended =
            RunPatch { state: Some(RunState::Succeeded), ended_at_ms: Some(Some(2)), ..RunPatch::default() };
        store.update_run(&run.id, None, ended).await.unwrap();
        (store, log, run.id)
    }

    /// A write of more events than a follower reads at once is not kept in the watch;
    /// a follower reads it from the store, in pages, all the same.
    #[tokio::test]
    async fn a_burst_is_read_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = a_running_run(&dir).await;
        let mut stream = EventStream::new(store, &log, run.id.clone(), 0, true);
        let burst = PAGE as u64 + 1;
        emit_stored(&log, &run.id, 0, burst).await;
        assert!(log.heads.lock().unwrap().runs[&run.id].borrow().is_none());
        let seqs = next_seqs(&mut stream, PAGE + 1).await;
        assert_eq!(seqs, (1..=burst).collect::<Vec<_>>());
    }

    /// Emits `n` syscall events numbered from `from` and waits until they are stored.
    async fn emit_stored(log: &EventLog, run: &RunId, from: u64, n: u64) {
        for i in from..from + n {
            log.emit(run, EventKind::Syscall, json!({"i": i}));
        }
        log.flush().await;
    }

    async fn next_seqs(stream: &mut EventStream, n: usize) -> Vec<Seq> {
        let mut seqs = Vec::new();
        for _ in 0..n {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
            seqs.push(event.expect("an event in time").unwrap().expect("an event").seq);
        }
        seqs
    }

    /// A follower that has every event before a write takes the write's events from the
    /// watch: its store here is another database, holding the run but none of its events.
    #[tokio::test]
    async fn a_caught_up_follower_takes_a_write_from_the_watch() {
        let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_store, log, run) = a_running_run(&dir).await;
        let empty: Arc<dyn Store> = Arc::new(SqliteStore::open(&elsewhere.path().join("keel.db")).unwrap());
        empty.create_run(run.clone()).await.unwrap();
        let mut stream = EventStream::new(empty, &log, run.id.clone(), 0, true);
        let writer = log.clone();
        let id = run.id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            emit_stored(&writer, &id, 0, 3).await;
            writer.emit(&id, EventKind::State, json!({"state": "succeeded", "from": "running"}));
        });
        assert_eq!(next_seqs(&mut stream, 4).await, [1, 2, 3, 4]);
        assert!(stream.next().await.unwrap().is_none(), "the stream ends after the final state");
    }

    /// A follower of some kinds gets only those, from the watch and from the store
    /// alike, and its stream still ends at the run's final state event when that is not
    /// one of them.
    #[tokio::test]
    async fn a_follower_of_some_kinds_gets_only_those_and_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = a_running_run(&dir).await;
        let output = EventKinds::of(&[EventKind::Stdout]);
        // Stored before the follower came: read from the store.
        emit_stored(&log, &run.id, 0, 3).await;
        log.emit(&run.id, EventKind::Stdout, json!({"line": "one"}));
        log.flush().await;
        let mut stream = EventStream::new(store.clone(), &log, run.id.clone(), 0, true).with_kinds(output);
        assert_eq!(next_seqs(&mut stream, 1).await, [4]);
        // Written while it follows: taken from the watch.
        let writer = log.clone();
        let id = run.id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            writer.emit(&id, EventKind::Syscall, json!({}));
            writer.emit(&id, EventKind::Stdout, json!({"line": "two"}));
            writer.emit(&id, EventKind::State, json!({"state": "succeeded", "from": "running"}));
        });
        assert_eq!(next_seqs(&mut stream, 1).await, [6]);
        let end =
            tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("the end in time");
        assert!(end.unwrap().is_none(), "the stream ends after the final state it passed over");
        // Not following: a page of the same.
        let mut page = EventStream::new(store, &log, run.id.clone(), 0, false).with_kinds(output);
        assert_eq!(next_seqs(&mut page, 2).await, [4, 6]);
        assert!(page.next().await.unwrap().is_none());
    }

    /// Followers that missed writes, or start part-way into one, read what they miss
    /// from the store and still get every event once, in order.
    #[tokio::test]
    async fn a_follower_behind_the_watch_gets_every_event_once() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = a_running_run(&dir).await;
        let mut behind = EventStream::new(store.clone(), &log, run.id.clone(), 0, true);
        // Three writes before the follower looks: the watch holds only the last.
        for write in 0..3 {
            emit_stored(&log, &run.id, write * 2, 2).await;
        }
        assert_eq!(next_seqs(&mut behind, 6).await, [1, 2, 3, 4, 5, 6]);
        // One that starts inside the newest write gets the rest of it.
        emit_stored(&log, &run.id, 6, 3).await;
        let mut inside = EventStream::new(store, &log, run.id.clone(), 8, true);
        assert_eq!(next_seqs(&mut inside, 1).await, [9]);
        assert_eq!(next_seqs(&mut behind, 3).await, [7, 8, 9]);
        log.emit(&run.id, EventKind::State, json!({"state": "succeeded", "from": "running"}));
        for stream in [&mut behind, &mut inside] {
            assert_eq!(next_seqs(stream, 1).await, [10]);
            assert!(stream.next().await.unwrap().is_none());
        }
    }

    /// The watch of a run nobody follows any more goes at the run's next write.
    #[tokio::test]
    async fn a_watch_nobody_holds_goes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = a_running_run(&dir).await;
        drop(EventStream::new(store, &log, run.id.clone(), 0, true));
        assert_eq!(log.heads.lock().unwrap().runs.len(), 1);
        emit_stored(&log, &run.id, 0, 1).await;
        assert!(log.heads.lock().unwrap().runs.is_empty());
    }

    /// The run's row says it ended before its final state event is stored (the order in
    /// which the kernel writes them): a follower reading in between still gets the event.
    #[tokio::test]
    async fn a_follower_gets_the_events_stored_after_the_run_ended() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = an_ended_run(&dir).await;
        let mut stream = EventStream::new(store, &log, run.clone(), 0, true);
        let late = log.clone();
        let id = run.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            late.emit(&id, EventKind::Syscall, json!({"seq": 1, "method": "state.checkpoint"}));
            late.emit(&id, EventKind::State, json!({"state": "succeeded", "from": "running"}));
        });
        let checkpoint = stream.next().await.unwrap().expect("the event before the final state");
        assert_eq!(checkpoint.kind, "syscall");
        let last = stream.next().await.unwrap().expect("the final state event");
        assert_eq!(last.data["state"], "succeeded");
        assert!(stream.next().await.unwrap().is_none(), "the stream ends after the final state");
    }

    /// A run whose final state event never comes (its kernel died between the two
    /// writes) ends the stream after the grace rather than following it forever.
    #[tokio::test]
    async fn a_follower_of_an_ended_run_without_its_last_events_stops() {
        let dir = tempfile::tempdir().unwrap();
        let (store, log, run) = an_ended_run(&dir).await;
        let mut stream = EventStream::new(store, &log, run, 0, true);
        let ended = tokio::time::timeout(LAST_EVENTS_GRACE * 5, stream.next()).await;
        assert!(ended.expect("the stream must end").unwrap().is_none());
    }
}
