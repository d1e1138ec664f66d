//! A run's journal writes, combined: concurrent appends and completions for one run share
//! one transaction.
//!
//! Every journal write for a run updates the run's row (the next seq, the usage totals),
//! so Postgres runs them one at a time, each holding that row locked until its commit is
//! flushed. A run with many calls in flight (an agent fanning out 64 LLM calls) got about
//! 1,200 journal writes per second on a server that flushes 5,000 commits a second. Here
//! the writes for one run queue up behind the one in flight, and the next transaction
//! takes all of them, their statements pipelined: the row is locked for one round trip
//! and the WAL flushed once per batch, as the SQLite writer's group commit does for the
//! whole store.
//!
//! A batch commits only if every write in it succeeded; if one fails (a refusal such as a
//! completion of an entry that is not pending, or any database error), the transaction is
//! rolled back and each write runs again by itself, as it would have
//! alone, so one write's failure never reaches another's answer. Only when the database is
//! out of reach (or a commit's outcome is unknown) does every write of the batch get the
//! same error at once, rather than each waiting for the pool in turn. Each caller is answered
//! after the commit that made its write durable. The batch is written by a task of its
//! own, so a caller that stops waiting leaves the others' writes alone (its own may still
//! commit, as with any write).
//!
//! A batch of one write (a sequential agent's every write) outside a cluster is one
//! statement instead, its blobs and chain nodes in it (`writes::append_entry_alone`,
//! `complete_entry_alone`): its own transaction, so one round trip where `BEGIN`, the
//! pipelined statements and `COMMIT` took three. In a cluster a write checks the run's
//! lease in its transaction, so it keeps the transaction.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, PoisonError};

use keel_types::RunId;
use tokio::sync::oneshot;

use super::{PgStore, begin, commit, outcome_unknown, writes};
use crate::chain::{ChainLink, EncodedCompletion, EncodedEntry};
use crate::{Error, Result, Seq};

/// A journal write for one run.
pub(super) enum JournalOp {
    Append(EncodedEntry),
    /// `Store::complete_entry_with`: complete `seq`, then append `entries`.
    Complete {
        seq: Seq,
        completion: EncodedCompletion,
        entries: Vec<EncodedEntry>,
    },
}

impl JournalOp {
    /// Whether the op is one statement when written alone: an append, or a completion
    /// that appends nothing.
    fn is_one_statement(&self) -> bool {
        match self {
            JournalOp::Append(_) => true,
            JournalOp::Complete { entries, .. } => entries.is_empty(),
        }
    }

    fn entries(&self) -> &[EncodedEntry] {
        match self {
            JournalOp::Append(entry) => std::slice::from_ref(entry),
            JournalOp::Complete { entries, .. } => entries,
        }
    }
}

/// What a `JournalOp` answered: the seq of each entry it appended.
pub(super) type JournalDone = Vec<Seq>;

/// `error` again, for each write of a batch that failed as one (an `Error` is not `Clone`:
/// its source is kept as text).
fn copy_of(error: &Error) -> Error {
    match error {
        Error::Unavailable { step, source } => Error::Unavailable { step, source: source.to_string().into() },
        Error::OutcomeUnknown { step, source } => {
            Error::OutcomeUnknown { step, source: source.to_string().into() }
        }
        Error::Closed => Error::Closed,
        other => Error::Backend { step: "writing a run's journal", source: other.to_string().into() },
    }
}

struct Waiting {
    op: JournalOp,
    reply: oneshot::Sender<Result<JournalDone>>,
}

/// The journal writes waiting for each run whose writer task is busy. A run is a key here
/// exactly while a task writes for it.
#[derive(Default)]
pub(super) struct RunQueues {
    queues: Mutex<HashMap<RunId, Vec<Waiting>>>,
}

impl std::fmt::Debug for RunQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunQueues").finish_non_exhaustive()
    }
}

impl RunQueues {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Vec<Waiting>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Ends a run's writer task: removes the run's queue if the task ends early (a panic, or
/// the runtime shutting down), so its waiting callers get an error instead of waiting
/// forever and the next write starts a new task.
struct Writing<'a> {
    queues: &'a RunQueues,
    run: RunId,
    done: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.queues.lock().remove(&self.run);
        }
    }
}

impl PgStore {
    /// Writes `op` for `run`, with whatever other journal writes for the run arrive
    /// meanwhile, and answers once it is durable.
    pub(super) async fn journal_write(&self, run: &RunId, op: JournalOp) -> Result<JournalDone> {
        let (reply, answer) = oneshot::channel();
        let start = match self.run_queues.lock().entry(run.clone()) {
            Entry::Occupied(mut waiting) => {
                waiting.get_mut().push(Waiting { op, reply });
                false
            }
            Entry::Vacant(slot) => {
                slot.insert(vec![Waiting { op, reply }]);
                true
            }
        };
        if start {
            let (store, run) = (self.clone(), run.clone());
            tokio::spawn(async move { store.write_run_journal(run).await });
        }
        answer.await.map_err(|_| Error::Backend {
            step: "writing a run's journal",
            source: "the task writing the run's journal ended before answering".into(),
        })?
    }

    /// The writer task of `run`: takes everything queued for it, writes it, and again,
    /// until nothing is left.
    async fn write_run_journal(&self, run: RunId) {
        let mut writing = Writing { queues: &self.run_queues, run: run.clone(), done: false };
        loop {
            let batch = {
                let mut queues = self.run_queues.lock();
                match queues.get_mut(&run) {
                    Some(waiting) if !waiting.is_empty() => std::mem::take(waiting),
                    _ => {
                        queues.remove(&run);
                        writing.done = true;
                        return;
                    }
                }
            };
            let (ops, replies): (Vec<JournalOp>, Vec<_>) =
                batch.into_iter().map(|waiting| (waiting.op, waiting.reply)).unzip();
            let answers = self.write_batch(&run, &ops).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                // A caller that stopped waiting has nobody to tell; the write stands.
                let _ = reply.send(answer);
            }
        }
    }

    /// Each of `ops`' answer: all of them in one transaction, or, if that did not commit
    /// (or there is only one), each alone (`write_one`).
    async fn write_batch(&self, run: &RunId, ops: &[JournalOp]) -> Vec<Result<JournalDone>> {
        if ops.len() > 1 {
            match self.write_in_one_transaction(run, ops).await {
                Ok(done) => return done.into_iter().map(Ok).collect(),
                // The database is out of reach, or the commit's outcome is unknown: every
                // write of the batch is told so (writing each alone would wait for the
                // database once per write, or could write twice).
                Err(error @ (Error::Unavailable { .. } | Error::OutcomeUnknown { .. } | Error::Closed)) => {
                    return ops.iter().map(|_| Err(copy_of(&error))).collect();
                }
                // Rolled back, nothing written.
                Err(_) => {}
            }
        }
        let mut answers = Vec::with_capacity(ops.len());
        let mut out_of_reach: Option<Error> = None;
        for op in ops {
            let answer = match &out_of_reach {
                Some(error) => Err(copy_of(error)),
                None => self.write_one(run, op).await,
            };
            if let Err(error @ (Error::Unavailable { .. } | Error::Closed)) = &answer {
                out_of_reach = Some(copy_of(error));
            }
            answers.push(answer);
        }
        answers
    }

    /// `ops` in one transaction, each write's answer; any failure rolls all of them back
    /// (only `OutcomeUnknown` leaves it open whether they committed).
    async fn write_in_one_transaction(&self, run: &RunId, ops: &[JournalOp]) -> Result<Vec<JournalDone>> {
        let mut client = self.client("writing a run's journal").await?;
        // Outside the transaction: a node found stored stays stored.
        let mut unstored: Vec<Vec<&[ChainLink]>> = Vec::with_capacity(ops.len());
        for op in ops {
            let mut links = Vec::new();
            for entry in op.entries() {
                links.push(self.chain_ends.unstored(&client, &entry.params_chain).await?);
            }
            unstored.push(links);
        }
        let transaction = begin(&mut client).await?;
        // Pipelined: the lease check, then each write, sending its statements on its first
        // poll; the futures are first polled in order, so the server runs them in the order
        // queued while the run's row is locked for one round trip, not one per write.
        let writes = futures_util::future::join_all(
            ops.iter().zip(&unstored).map(|(op, unstored)| write_op(&transaction, run, op, unstored)),
        );
        let written = self.fences.checked(&transaction, run, async { Ok(writes.await) }).await?;
        // Any failure returns before the commit and drops the transaction, which rolls it
        // back.
        let done = written.into_iter().collect::<Result<Vec<_>>>()?;
        commit(transaction).await?;
        for op in ops {
            self.remember_chains(op);
        }
        Ok(done)
    }

    /// One write by itself: one statement outside a cluster when it can be (`write_alone`),
    /// else a transaction of its own (a fenced write checks the run's lease in it).
    async fn write_one(&self, run: &RunId, op: &JournalOp) -> Result<JournalDone> {
        if !self.fences.joined() && op.is_one_statement() {
            return self.write_alone(run, op).await;
        }
        // One answer per write.
        self.write_in_one_transaction(run, std::slice::from_ref(op))
            .await
            .map(|mut done| done.pop().unwrap_or_default())
    }

    /// `op` as one statement, its own transaction: one round trip where a transaction
    /// takes three (`BEGIN`, the pipelined statements, `COMMIT`).
    async fn write_alone(&self, run: &RunId, op: &JournalOp) -> Result<JournalDone> {
        let client = self.client("writing a run's journal").await?;
        let done = match op {
            JournalOp::Append(entry) => {
                let unstored = self.chain_ends.unstored(&client, &entry.params_chain).await?;
                vec![
                    writes::append_entry_alone(&client, run, entry, unstored)
                        .await
                        .map_err(outcome_unknown)?,
                ]
            }
            JournalOp::Complete { seq, completion, .. } => {
                writes::complete_entry_alone(&client, run, *seq, completion)
                    .await
                    .map_err(outcome_unknown)?;
                Vec::new()
            }
        };
        self.remember_chains(op);
        Ok(done)
    }

    fn remember_chains(&self, op: &JournalOp) {
        for entry in op.entries() {
            self.chain_ends.committed(&entry.params_chain);
        }
    }
}

/// The statements of `op`, in the caller's transaction; `unstored` is, per entry it
/// appends, the chain links it still has to store.
async fn write_op(
    transaction: &deadpool_postgres::Transaction<'_>,
    run: &RunId,
    op: &JournalOp,
    unstored: &[&[ChainLink]],
) -> Result<JournalDone> {
    if let JournalOp::Complete { seq, completion, .. } = op {
        writes::complete_entry(transaction, run, *seq, completion).await?;
    }
    let mut seqs = Vec::with_capacity(unstored.len());
    for (entry, links) in op.entries().iter().zip(unstored) {
        seqs.push(writes::append_entry(transaction, run, entry, links).await?);
    }
    Ok(seqs)
}
