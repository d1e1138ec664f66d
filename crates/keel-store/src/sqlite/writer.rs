//! The only read-write connection, and the writer thread: it takes `WriteCommand`s from
//! a channel, group-commits them (many commands, one transaction, one fsync) and answers
//! each caller only after the commit. An uncontended caller commits its command on its
//! own thread with the same code (`Writer::commit`), taking turns under a mutex. One
//! command's failure must not touch the others in its batch: most commands run in a
//! savepoint of their own, which undoes their writes if they fail. The hot ones (the
//! journal, run events, run rows, mailboxes) are written so that they refuse before their
//! first write, and run without one (`unguarded`): a savepoint copies every page the
//! command touches into a statement journal, which cost 100 concurrent runs 15-25% of
//! their journaled steps per second.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keel_types::{EntryStatus, RunId, RunState, Usage, WaitReason};
use rusqlite::{Connection, Params, params};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::queries::{self, seq_param};
use crate::chain::{self, Blob, ChainLink, EncodedCompletion, EncodedEntry};
use crate::{
    Error, MailboxDone, MailboxMessage, MailboxOp, MailboxResult, MemoryEmbedding, NewMessage, NewRun,
    Result, RunPatch, RunRecord, Seq,
};
use crate::{mailbox, search};

/// The most commands one transaction serves. Bounds how long the first caller of a big
/// batch waits, and the memory of the answers held until the commit.
const MAX_BATCH: usize = 512;

/// An `Apply` command's write: given the connection (or the error that fails its batch),
/// it answers its caller.
pub(super) type ApplyWrite =
    Box<dyn FnOnce(std::result::Result<&Connection, Error>) -> Box<dyn Answer> + Send>;

/// Where the writer sends a command's outcome.
pub(super) type Reply<T> = oneshot::Sender<Result<T>>;

/// Everything the writer can do: the write half of the Store API, with payloads already
/// serialized by the caller.
pub(super) enum WriteCommand {
    CreateRun {
        run: NewRun,
        reply: Reply<RunRecord>,
    },
    UpdateRun {
        id: RunId,
        expected: Option<RunState>,
        patch: RunPatch,
        reply: Reply<RunRecord>,
    },
    AppendEntry {
        run: RunId,
        entry: EncodedEntry,
        reply: Reply<Seq>,
    },
    CompleteEntryWith {
        run: RunId,
        seq: Seq,
        completion: EncodedCompletion,
        entries: Vec<EncodedEntry>,
        reply: Reply<Vec<Seq>>,
    },
    AbandonEntries {
        run: RunId,
        seqs: Vec<Seq>,
        reply: Reply<()>,
    },
    AppendEvents {
        run: RunId,
        events: Vec<EncodedEvent>,
        reply: Reply<Seq>,
    },
    KvPut {
        scope: String,
        key: String,
        /// JSON text.
        value: String,
        /// False for `Store::kv_put_unflushed`.
        flush: bool,
        reply: Reply<()>,
    },
    ThreadAppend {
        tenant: String,
        thread: String,
        message: Blob,
        idempotency_key: Option<String>,
        appended_at_ms: u64,
        reply: Reply<u64>,
    },
    MemPut {
        tenant: String,
        namespace: String,
        key: String,
        /// JSON text.
        value: String,
        text: String,
        embedding: Option<MemoryEmbedding>,
        updated_at_ms: u64,
        reply: Reply<()>,
    },
    MemDelete {
        tenant: String,
        namespace: String,
        key: String,
        idempotency_key: Option<String>,
        reply: Reply<bool>,
    },
    MailboxSend {
        to: RunId,
        message: NewMessage,
        /// `message.message` as JSON text.
        text: String,
        reply: Reply<Seq>,
    },
    MailboxReceive {
        run: RunId,
        idempotency_key: Option<String>,
        reply: Reply<Option<MailboxMessage>>,
    },
    JournalMailbox {
        run: RunId,
        /// The entry, its result still to be made from the op's outcome.
        entry: Box<EncodedEntry>,
        op: Box<MailboxOp>,
        /// A send's `receive`, encoded, its result still to be made (by its own function).
        receive: Option<Box<(EncodedEntry, MailboxResult)>>,
        /// A send's message as JSON text.
        text: String,
        result_of: MailboxResult,
        reply: Reply<Option<(Seq, MailboxDone)>>,
    },
    TopicSubscribe {
        tenant: String,
        topic: String,
        run: RunId,
        subscribe: bool,
        reply: Reply<()>,
    },
    TopicPublish {
        topic: String,
        message: NewMessage,
        /// `message.message` as JSON text.
        text: String,
        reply: Reply<Vec<(RunId, Seq)>>,
    },
    AuditAppend {
        records: Vec<super::audit::EncodedAudit>,
        reply: Reply<Vec<Seq>>,
    },
    TenantCreate {
        tenant: crate::TenantRecord,
        /// `tenant.quota` as JSON text.
        quota: String,
        reply: Reply<()>,
    },
    TokenCreate {
        token: crate::ApiTokenRecord,
        reply: Reply<()>,
    },
    /// A write whose SQL lives beside its table (`triggers.rs`), made by [`in_own_savepoint`]: it
    /// runs in a savepoint of its own like every command, and answers its caller itself.
    Apply {
        write: ApplyWrite,
    },
    TokenRevoke {
        tenant: String,
        prefix: String,
        reply: Reply<u64>,
    },
    /// A batch of a dump, written as it is (see `super::dump::restore`).
    Restore {
        items: Vec<crate::DumpItem>,
        reply: Reply<()>,
    },
}

impl WriteCommand {
    /// Whether the command's caller is promised a flushed commit. Run events, audit
    /// records and unflushed kv values are not (see `Store::append_events`,
    /// `Store::audit_append` and `Store::kv_put_unflushed`).
    fn needs_flush(&self) -> bool {
        match self {
            WriteCommand::KvPut { flush, .. } => *flush,
            _ => !self.is_background(),
        }
    }

    /// Whether the command is background work nobody waits on: run events and audit
    /// records.
    fn is_background(&self) -> bool {
        matches!(self, WriteCommand::AppendEvents { .. } | WriteCommand::AuditAppend { .. })
    }
}

/// A `NewEvent` with its data as JSON text.
pub(super) struct EncodedEvent {
    pub(super) ts_ms: u64,
    pub(super) kind: String,
    pub(super) data: String,
}

/// Maps an SQLite failure to `Error::Backend` naming the step.
pub(super) fn sql_error(step: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |source| Error::Backend { step, source: Box::new(source) }
}

/// The only read-write connection, the WAL it commits into, and whether it was last set
/// to `synchronous=FULL` (else `NORMAL`). The writer thread and a caller committing inline
/// (see `SqliteStore::write`) take turns with it under a mutex.
pub(super) struct Writer {
    connection: Connection,
    wal: Arc<Wal>,
    full: bool,
}

/// How many WAL pages the writer's commits write before one of them checkpoints (SQLite's
/// default is 1,000). The checkpoint runs inside that commit and, with `NORMAL`, flushes
/// the WAL before copying it and the database file after: the writer thread waits through
/// both while the flusher has nothing to flush. At 1,000 pages, under 64 gateway calls in
/// flight, that was 78 times a second, 1.96 ms each. At 4,000 (16 MB of WAL at most
/// between checkpoints, besides the checkpoint thread's every second), 100 concurrent
/// runs made 16,953-18,084 journaled steps/s against 11,238-13,327 at 1,000, alternated.
pub(super) const AUTOCHECKPOINT_PAGES: u32 = 4000;

/// Who flushes a commit that must be flushed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Flush {
    /// SQLite, inside `COMMIT` (`synchronous=FULL`): a caller committing inline, whose
    /// thread waits for the flush either way.
    InCommit,
    /// Whoever answers the batch, after `COMMIT` (`synchronous=NORMAL`, then
    /// [`Wal::flush`]): the writer thread's batches, whose flush the flusher thread waits
    /// for while the writer commits the next batch ([`run`]).
    AfterCommit,
}

/// A batch's answers once its transaction is over: to be delivered now, or only once the
/// WAL is flushed.
pub(super) struct Committed {
    answers: Vec<Box<dyn Answer>>,
    /// Whether the answers wait for [`Wal::flush`].
    flush: bool,
}

impl Committed {
    /// Delivers the answers, after flushing `wal` if they wait for it.
    pub(super) fn deliver(self, wal: &Wal) {
        let flushed = if self.flush { wal.flush() } else { Ok(()) };
        deliver_after(flushed, self.answers);
    }
}

impl Writer {
    /// The connection starts with `synchronous=FULL` (see `schema::configure_writer`).
    pub(super) fn new(connection: Connection, wal: Arc<Wal>) -> Writer {
        // Best effort: SQLite's default (1,000 pages) only checkpoints more often.
        if let Err(error) =
            connection.execute_batch(&format!("PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}"))
        {
            tracing::warn!(%error, "keel-store could not set wal_autocheckpoint");
        }
        Writer { connection, wal, full: true }
    }

    /// Commits every command of `batch` (in one transaction, unless SQLite aborts one
    /// midway) and returns their answers, to be delivered once the writer is unlocked
    /// ([`Committed::deliver`], or the flusher thread). `synchronous=NORMAL` still flushes
    /// the WAL before each checkpoint and the database file after it, as `FULL` does;
    /// `AfterCommit` moves only the flush of each commit out of `COMMIT`.
    pub(super) fn commit(&mut self, batch: &mut VecDeque<WriteCommand>, flush: Flush) -> Committed {
        // A batch of only run events, audit records and unflushed kv values is answered
        // without flushing the WAL: they are durable with the next flush, which covers
        // every frame before it (see `Store::append_events`). Anything else in the batch
        // waits for one.
        let needs_flush = batch.iter().any(WriteCommand::needs_flush);
        // After a failed flush, every write that needs one is answered by `Wal::flush`,
        // which fails it: SQLite's own flush might report success for what was lost.
        let full = needs_flush && flush == Flush::InCommit && !self.wal.has_failed();
        if full != self.full {
            let pragma = if full { "PRAGMA synchronous = FULL" } else { "PRAGMA synchronous = NORMAL" };
            // Through the statement cache: a busy kernel switches back and forth.
            match run_sql(&self.connection, "switching synchronous", pragma, []) {
                Ok(_) => self.full = full,
                Err(error) => tracing::error!(%error, "keel-store could not run {pragma}"),
            }
        }
        let mut answers = Vec::with_capacity(batch.len());
        while !batch.is_empty() {
            answers.extend(run_transaction(&self.connection, batch));
        }
        // Flushed inside COMMIT only if the switch to FULL took; otherwise flushed after.
        Committed { answers, flush: needs_flush && !self.full }
    }

    /// The WAL this writer commits into.
    pub(super) fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }
}

/// The database's write-ahead log, opened a second time to flush it: `fdatasync` flushes
/// a file's data whichever descriptor names it. Opened once, with the store: SQLite made
/// it when the writer's connection first read the database (the migrations), and deletes
/// it only when its last connection closes, which the writer's is. After a failed flush
/// every later one fails too: the kernel may have dropped the pages it could not write and
/// report success the next time, so nothing written since can be promised durable until
/// the store is opened again.
pub(super) struct Wal {
    path: std::path::PathBuf,
    file: std::fs::File,
    /// Why a flush failed, once one has.
    failed: Mutex<Option<String>>,
    /// Runs inside each flush, before the flush itself: tests hold flushes in the disk, or
    /// fail them.
    #[cfg(test)]
    pub(super) hook: Mutex<Option<FlushHook>>,
}

#[cfg(test)]
pub(super) type FlushHook = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

impl Wal {
    /// The WAL of the database at `database`, which the writer's connection has opened.
    pub(super) fn open(database: &std::path::Path) -> Result<Wal> {
        let mut path = database.as_os_str().to_owned();
        path.push("-wal");
        let path = std::path::PathBuf::from(path);
        let file = std::fs::OpenOptions::new().write(true).open(&path).map_err(|source| Error::Backend {
            step: "opening the WAL to flush it",
            source: Box::new(source),
        })?;
        Ok(Wal {
            path,
            file,
            failed: Mutex::new(None),
            #[cfg(test)]
            hook: Mutex::new(None),
        })
    }

    /// Whether a flush has failed (and every later one fails).
    fn has_failed(&self) -> bool {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    fn sync(&self) -> std::io::Result<()> {
        #[cfg(test)]
        {
            // Taken out first: the lock is not held while the hook waits.
            let hook = self.hook.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(hook) = hook {
                hook()?;
            }
        }
        self.file.sync_data()
    }

    /// Flushes every frame written to the WAL so far; what went wrong if it did not.
    fn flush(&self) -> std::result::Result<(), String> {
        if let Some(message) = &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            return Err(message.clone());
        }
        self.sync().map_err(|error| {
            let message = format!(
                "flushing {} failed ({error}); nothing written since can be promised durable: \
                 check the disk, then restart keel",
                self.path.display()
            );
            tracing::error!("keel-store: {message}");
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
            message
        })
    }
}

/// Delivers `answers`, each turned into the flush's failure if it failed.
fn deliver_after(flushed: std::result::Result<(), String>, answers: Vec<Box<dyn Answer>>) {
    for mut answer in answers {
        if let Err(message) = &flushed {
            answer.revoke(batch_error("flushing the WAL", message));
        }
        answer.deliver();
    }
}

/// Whether a caller may commit `command` on its own thread rather than queue it: one
/// whose caller waits for it. Run events and audit records are background work nobody
/// waits on (on a runtime thread they delayed the tasks queued behind them: a
/// `code.exec` job's in-kernel time grew by a quarter), and a dump's restore comes in
/// batches big enough to hold a thread; those always go to the writer thread.
pub(super) fn may_commit_inline(command: &WriteCommand) -> bool {
    !command.is_background() && !matches!(command, WriteCommand::Restore { .. })
}

/// Locks the writer; a caller that panicked holding it left no transaction the next
/// commit does not roll back first (`run_transaction`).
pub(super) fn lock(writer: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writer thread's body. Returns when every sender is gone (the store was dropped);
/// commands already queued are still served first, and their flushes waited for.
///
/// A batch that must be flushed goes to a flusher thread, which flushes the WAL and then
/// answers it while this thread commits the next batch: one batch's statements and the
/// previous batch's flush overlap instead of taking turns. Batches that queue for the
/// flusher while it flushes share its next flush, which covers every frame before it.
pub(super) fn run(writer: Arc<Mutex<Writer>>, mut commands: mpsc::Receiver<WriteCommand>) {
    let wal = Arc::clone(lock(&writer).wal());
    let flusher = start_flusher(Arc::clone(&wal));
    let mut batch = VecDeque::with_capacity(MAX_BATCH);
    while let Some(first) = commands.blocking_recv() {
        batch.push_back(first);
        let committed = {
            let mut writer = lock(&writer);
            // Whatever queued up while the previous commit (this thread's, or a caller's
            // inline one) was being written joins this one: that is the group commit, and
            // it needs no timer.
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(command) => batch.push_back(command),
                    Err(_) => break,
                }
            }
            writer.commit(&mut batch, Flush::AfterCommit)
        };
        // Unlocked first, so a caller woken by its answer may commit its next write inline.
        match &flusher {
            // The flusher ends only after this loop does.
            Some((flushes, _)) if committed.flush => {
                let _ = flushes.send(committed.answers);
            }
            _ => committed.deliver(&wal),
        }
    }
    if let Some((flushes, thread)) = flusher {
        drop(flushes);
        if thread.join().is_err() {
            tracing::error!("the keel-store flush thread panicked");
        }
    }
}

/// Where the writer thread sends the answers of a batch that waits for a flush.
type Flushes = std::sync::mpsc::Sender<Vec<Box<dyn Answer>>>;

/// The flusher thread: it flushes the WAL for whatever batches have queued, then answers
/// them, until the writer thread drops its sender. Without it (the thread could not be
/// started), the writer thread flushes each batch itself.
fn start_flusher(wal: Arc<Wal>) -> Option<(Flushes, std::thread::JoinHandle<()>)> {
    let (flushes, to_flush) = std::sync::mpsc::channel::<Vec<Box<dyn Answer>>>();
    let thread = std::thread::Builder::new().name("keel-store-flush".to_owned()).spawn(move || {
        while let Ok(mut answers) = to_flush.recv() {
            while let Ok(more) = to_flush.try_recv() {
                answers.extend(more);
            }
            deliver_after(wal.flush(), answers);
        }
    });
    match thread {
        Ok(thread) => Some((flushes, thread)),
        Err(error) => {
            tracing::error!(%error, "keel-store could not start its flush thread; the writer flushes each batch itself");
            None
        }
    }
}

/// Runs commands from the front of `batch` in one transaction and returns their answers,
/// to be delivered only now that the transaction is over. Normally it consumes the whole
/// batch; if SQLite aborts the transaction midway, the commands not yet run stay in
/// `batch` for the next transaction.
fn run_transaction(connection: &Connection, batch: &mut VecDeque<WriteCommand>) -> Vec<Box<dyn Answer>> {
    let mut answers: Vec<Box<dyn Answer>> = Vec::with_capacity(batch.len());
    // Only a failed rollback after a failed commit could have left one open; without
    // this, every later BEGIN would fail.
    abort_transaction(connection);
    if let Err(error) = run_sql(connection, "beginning a write transaction", "BEGIN IMMEDIATE", []) {
        let message = error.to_string();
        tracing::error!(%message, "keel-store could not begin a write transaction");
        for command in batch.drain(..) {
            answers.push(command.fail(batch_error("beginning a write transaction", &message)));
        }
        return answers;
    }

    while let Some(command) = batch.pop_front() {
        answers.push(apply(connection, command));
        if connection.is_autocommit() {
            // SQLite rolled the whole transaction back (it does on some I/O, disk-full and
            // out-of-memory errors), so the writes answered so far in it are gone.
            let message = "SQLite rolled back the transaction after another write of the same batch failed";
            tracing::error!(message, "keel-store lost a write transaction");
            for answer in &mut answers {
                answer.revoke(batch_error("running a batch of writes", message));
            }
            return answers;
        }
    }

    if let Err(error) = run_sql(connection, "committing a batch of writes", "COMMIT", []) {
        let message = error.to_string();
        tracing::error!(%message, "keel-store could not commit a batch of writes");
        abort_transaction(connection);
        for answer in &mut answers {
            answer.revoke(batch_error("committing a batch of writes", &message));
        }
    }
    answers
}

/// Rolls the open transaction back, if there still is one.
fn abort_transaction(connection: &Connection) {
    if !connection.is_autocommit()
        && let Err(error) = run_sql(connection, "rolling back a transaction", "ROLLBACK", [])
    {
        tracing::error!(%error, "keel-store could not roll back a write transaction");
    }
}

/// The error every command of a failed batch gets: the original SQLite error can be
/// owned by one answer only, so the others carry its text.
fn batch_error(step: &'static str, message: &str) -> Error {
    Error::Backend { step, source: message.into() }
}

/// Runs one command (in its own savepoint, or `unguarded`) and holds its outcome for
/// delivery.
fn apply(connection: &Connection, command: WriteCommand) -> Box<dyn Answer> {
    match command {
        WriteCommand::CreateRun { run, reply } => {
            answer(reply, unguarded(connection, |c| create_run(c, run)))
        }
        WriteCommand::UpdateRun { id, expected, patch, reply } => {
            answer(reply, unguarded(connection, |c| update_run(c, id, expected, patch)))
        }
        WriteCommand::AppendEntry { run, entry, reply } => {
            answer(reply, unguarded(connection, |c| append_entry(c, run, entry)))
        }
        WriteCommand::CompleteEntryWith { run, seq, completion, entries, reply } => {
            answer(reply, unguarded(connection, |c| complete_entry_with(c, run, seq, completion, &entries)))
        }
        WriteCommand::AbandonEntries { run, seqs, reply } => {
            answer(reply, in_savepoint(connection, |c| abandon_entries(c, run, &seqs)))
        }
        WriteCommand::AppendEvents { run, events, reply } => {
            answer(reply, unguarded(connection, |c| append_events(c, run, events)))
        }
        WriteCommand::KvPut { scope, key, value, reply, .. } => {
            answer(reply, in_savepoint(connection, |c| kv_put(c, &scope, &key, &value)))
        }
        WriteCommand::ThreadAppend { tenant, thread, message, idempotency_key, appended_at_ms, reply } => {
            answer(
                reply,
                in_savepoint(connection, |c| {
                    thread_append(c, &tenant, &thread, &message, idempotency_key.as_deref(), appended_at_ms)
                }),
            )
        }
        WriteCommand::MemPut { tenant, namespace, key, value, text, embedding, updated_at_ms, reply } => {
            answer(
                reply,
                in_savepoint(connection, |c| {
                    mem_put(c, &tenant, &namespace, &key, &value, &text, embedding.as_ref(), updated_at_ms)
                }),
            )
        }
        WriteCommand::MemDelete { tenant, namespace, key, idempotency_key, reply } => answer(
            reply,
            in_savepoint(connection, |c| {
                mem_delete(c, &tenant, &namespace, &key, idempotency_key.as_deref())
            }),
        ),
        WriteCommand::MailboxSend { to, message, text, reply } => {
            answer(reply, unguarded(connection, |c| mailbox_send(c, &to, &message, &text)))
        }
        WriteCommand::MailboxReceive { run, idempotency_key, reply } => {
            answer(reply, unguarded(connection, |c| mailbox_receive(c, &run, idempotency_key.as_deref())))
        }
        WriteCommand::JournalMailbox { run, entry, op, receive, text, result_of, reply } => answer(
            reply,
            unguarded(connection, |c| {
                journal_mailbox(c, &run, *entry, *op, receive.map(|r| *r), &text, result_of)
            }),
        ),
        WriteCommand::TopicSubscribe { tenant, topic, run, subscribe, reply } => {
            answer(reply, in_savepoint(connection, |c| topic_subscribe(c, &tenant, &topic, &run, subscribe)))
        }
        WriteCommand::TopicPublish { topic, message, text, reply } => {
            answer(reply, in_savepoint(connection, |c| topic_publish(c, &topic, &message, &text)))
        }
        WriteCommand::AuditAppend { records, reply } => {
            answer(reply, in_savepoint(connection, |c| super::audit::append(c, records)))
        }
        WriteCommand::TenantCreate { tenant, quota, reply } => {
            answer(reply, in_savepoint(connection, |c| super::tenants::create_tenant(c, &tenant, &quota)))
        }
        WriteCommand::TokenCreate { token, reply } => {
            answer(reply, in_savepoint(connection, |c| super::tenants::create_token(c, &token)))
        }
        WriteCommand::TokenRevoke { tenant, prefix, reply } => {
            answer(reply, in_savepoint(connection, |c| super::tenants::revoke_tokens(c, &tenant, &prefix)))
        }
        WriteCommand::Restore { items, reply } => {
            answer(reply, in_savepoint(connection, |c| super::dump::restore(c, items)))
        }
        WriteCommand::Apply { write } => write(Ok(connection)),
    }
}

impl WriteCommand {
    /// Answers the command with `error` without running it.
    fn fail(self, error: Error) -> Box<dyn Answer> {
        match self {
            WriteCommand::CreateRun { reply, .. } | WriteCommand::UpdateRun { reply, .. } => {
                answer(reply, Err(error))
            }
            WriteCommand::AppendEntry { reply, .. } | WriteCommand::AppendEvents { reply, .. } => {
                answer(reply, Err(error))
            }
            WriteCommand::AbandonEntries { reply, .. }
            | WriteCommand::KvPut { reply, .. }
            | WriteCommand::MemPut { reply, .. }
            | WriteCommand::Restore { reply, .. } => answer(reply, Err(error)),
            WriteCommand::ThreadAppend { reply, .. } => answer(reply, Err(error)),
            WriteCommand::CompleteEntryWith { reply, .. } => answer(reply, Err(error)),
            WriteCommand::MemDelete { reply, .. } => answer(reply, Err(error)),
            WriteCommand::MailboxSend { reply, .. } => answer(reply, Err(error)),
            WriteCommand::MailboxReceive { reply, .. } => answer(reply, Err(error)),
            WriteCommand::JournalMailbox { reply, .. } => answer(reply, Err(error)),
            WriteCommand::TopicSubscribe { reply, .. } => answer(reply, Err(error)),
            WriteCommand::TopicPublish { reply, .. } => answer(reply, Err(error)),
            WriteCommand::AuditAppend { reply, .. } => answer(reply, Err(error)),
            WriteCommand::TenantCreate { reply, .. } | WriteCommand::TokenCreate { reply, .. } => {
                answer(reply, Err(error))
            }
            WriteCommand::TokenRevoke { reply, .. } => answer(reply, Err(error)),
            WriteCommand::Apply { write } => write(Err(error)),
        }
    }
}

/// A command that runs `write` in its own savepoint and answers `reply`.
pub(super) fn in_own_savepoint<T: Send + 'static>(
    reply: Reply<T>,
    write: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
) -> WriteCommand {
    WriteCommand::Apply {
        write: Box::new(move |connection| match connection {
            Ok(connection) => answer(reply, in_savepoint(connection, write)),
            Err(error) => answer(reply, Err(error)),
        }),
    }
}

/// A command's outcome, held until its transaction has ended.
pub(super) trait Answer: Send {
    /// Turns a success into `error`: the transaction that made it did not commit.
    fn revoke(&mut self, error: Error);
    fn deliver(self: Box<Self>);
}

struct Outcome<T> {
    reply: Reply<T>,
    result: Result<T>,
}

impl<T: Send + 'static> Answer for Outcome<T> {
    fn revoke(&mut self, error: Error) {
        if self.result.is_ok() {
            self.result = Err(error);
        }
    }

    fn deliver(self: Box<Self>) {
        // A caller that stopped waiting has nobody to tell; the write stands regardless.
        let _ = self.reply.send(self.result);
    }
}

fn answer<T: Send + 'static>(reply: Reply<T>, result: Result<T>) -> Box<dyn Answer> {
    Box::new(Outcome { reply, result })
}

/// Runs `write` so that, if it fails (for a reason of its own such as `StateConflict`,
/// or in SQLite), its partial writes are undone while the rest of the batch carries on.
fn in_savepoint<T>(connection: &Connection, write: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    run_sql(connection, "opening a savepoint", "SAVEPOINT request", [])?;
    let result = write(connection);
    if connection.is_autocommit() {
        // SQLite already rolled back the whole transaction; the caller sees that.
        return result;
    }
    let ended = match &result {
        Ok(_) => run_sql(connection, "releasing a savepoint", "RELEASE request", []),
        Err(_) => run_sql(connection, "rolling back a savepoint", "ROLLBACK TO request", [])
            .and_then(|_| run_sql(connection, "releasing a savepoint", "RELEASE request", [])),
    };
    match ended {
        Ok(_) => result,
        Err(error) => {
            // The savepoint could not be ended, so this command's writes cannot be told
            // apart from the batch's: drop the whole transaction (`run_transaction`
            // notices and fails the batch) rather than commit something half known.
            abort_transaction(connection);
            Err(error)
        }
    }
}

/// Runs `write` without a savepoint. For a command whose every refusal (`RunNotFound`,
/// `StateConflict`, `MailboxFull`, ...) comes before its first write, so that only SQLite
/// itself can fail it after one: each statement is atomic, so a command that fails
/// without having changed a row wrote nothing, and the batch carries on. One that fails
/// after changing rows (an I/O error midway, or a command that broke that rule) cannot
/// be undone alone: the whole transaction is rolled back, as SQLite does on its own for
/// some errors, and `run_transaction` fails what the batch had answered and runs the
/// rest in a new transaction. Nothing half-written is ever committed.
fn unguarded<T>(connection: &Connection, write: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    let before = connection.total_changes();
    let result = write(connection);
    if let Err(error) = &result
        && connection.total_changes() != before
        && !connection.is_autocommit()
    {
        tracing::error!(%error, "keel-store rolls back a batch: a write failed after changing rows");
        abort_transaction(connection);
    }
    result
}

/// Executes one cached statement and returns how many rows it changed.
pub(super) fn run_sql(
    connection: &Connection,
    step: &'static str,
    sql: &str,
    params: impl Params,
) -> Result<usize> {
    connection
        .prepare_cached(sql)
        .and_then(|mut statement| statement.execute(params))
        .map_err(sql_error(step))
}

fn create_run(connection: &Connection, run: NewRun) -> Result<RunRecord> {
    let inserted = run_sql(
        connection,
        "inserting a run",
        "INSERT INTO runs (id, tenant, spec, state, created_at_ms, updated_at_ms, attempt) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1) ON CONFLICT (id) DO NOTHING",
        params![run.id.as_str(), run.tenant, run.spec.to_string(), run.state.as_str(), run.created_at_ms,],
    )?;
    if inserted == 0 {
        return Err(Error::RunExists(run.id));
    }
    Ok(run.into_record())
}

fn update_run(
    connection: &Connection,
    id: RunId,
    expected: Option<RunState>,
    patch: RunPatch,
) -> Result<RunRecord> {
    let Some(mut run) = queries::load_run(connection, &id)? else {
        return Err(Error::RunNotFound(id));
    };
    if let Some(expected) = expected
        && run.state != expected
    {
        return Err(Error::StateConflict { run: id, expected, actual: run.state });
    }
    patch.apply_to(&mut run);
    run_sql(
        connection,
        "updating a run",
        "UPDATE runs SET state = ?2, wait_reason = ?3, updated_at_ms = ?4, ended_at_ms = ?5, \
         attempt = ?6, pid = ?7, exit_code = ?8, output = ?9, error = ?10 WHERE id = ?1",
        params![
            id.as_str(),
            run.state.as_str(),
            run.wait_reason.map(WaitReason::as_str),
            run.updated_at_ms,
            run.ended_at_ms,
            run.attempt,
            run.pid,
            run.exit_code,
            run.output.as_ref().map(Value::to_string),
            run.error,
        ],
    )?;
    Ok(run)
}

fn append_entry(connection: &Connection, run: RunId, entry: EncodedEntry) -> Result<Seq> {
    // Only this thread writes, so last + 1 cannot race: concurrent appends to one run get
    // dense seqs in the order they reached the writer.
    let seq = queries::last_journal_seq(connection, &run)? + 1;
    insert_entry(connection, &run, seq, &entry)?;
    if matches!(entry.status, EntryStatus::Ok | EntryStatus::Error) {
        add_usage(connection, &run, &entry.usage, false)?;
    }
    Ok(seq)
}

/// Stores an entry's payloads and its journal row at `seq` (for `append_entry`, and for a
/// restore, which keeps the recorded seq and leaves the run's totals as restored).
pub(super) fn insert_entry(
    connection: &Connection,
    run: &RunId,
    seq: Seq,
    entry: &EncodedEntry,
) -> Result<()> {
    let params = store_payload(connection, Some(&entry.params))?;
    put_chain(connection, &entry.params_chain)?;
    let result = store_payload(connection, entry.result.as_ref())?;
    let error = store_payload(connection, entry.error.as_ref())?;
    run_sql(
        connection,
        "inserting a journal entry",
        "INSERT INTO journal (run_id, seq, method, params_hash, params_blob, params_inline, status, \
         result_blob, result_inline, error_blob, error_inline, attempt, started_at_ms, \
         finished_at_ms, input_tokens, output_tokens, llm_calls, tool_calls, cost_micro_usd) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
        params![
            run.as_str(),
            seq_param(seq),
            entry.method,
            entry.params_hash,
            params.blob,
            params.inline,
            entry.status.as_str(),
            result.blob,
            result.inline,
            error.blob,
            error.inline,
            entry.attempt,
            entry.started_at_ms,
            entry.finished_at_ms,
            entry.usage.input_tokens,
            entry.usage.output_tokens,
            entry.usage.llm_calls,
            entry.usage.tool_calls,
            entry.usage.cost_micro_usd,
        ],
    )?;
    Ok(())
}

fn complete_entry(
    connection: &Connection,
    run: RunId,
    seq: Seq,
    completion: EncodedCompletion,
) -> Result<()> {
    if !matches!(completion.status, EntryStatus::Ok | EntryStatus::Error) {
        return Err(Error::completion_not_final(&run, seq, completion.status));
    }
    let status = queries::query_first(
        connection,
        "reading the status of a journal entry",
        "SELECT status FROM journal WHERE run_id = ?1 AND seq = ?2",
        params![run.as_str(), seq_param(seq)],
        |row| row.get::<_, String>(0).map_err(sql_error("reading the status of a journal entry")),
    )?;
    match status {
        // An entry exists only with its run (a foreign key): the run is looked up only to
        // say which of the two is missing.
        None => {
            queries::require_run(connection, &run)?;
            return Err(Error::EntryNotFound { run, seq });
        }
        Some(status) if status != EntryStatus::Pending.as_str() => {
            return Err(Error::entry_not_pending(&run, seq, &status));
        }
        Some(_) => {}
    }
    let result = store_payload(connection, completion.result.as_ref())?;
    let error = store_payload(connection, completion.error.as_ref())?;
    run_sql(
        connection,
        "completing a journal entry",
        "UPDATE journal SET status = ?3, result_blob = ?4, result_inline = ?5, error_blob = ?6, \
         error_inline = ?7, finished_at_ms = ?8, input_tokens = ?9, output_tokens = ?10, \
         llm_calls = ?11, tool_calls = ?12, cost_micro_usd = ?13 WHERE run_id = ?1 AND seq = ?2",
        params![
            run.as_str(),
            seq_param(seq),
            completion.status.as_str(),
            result.blob,
            result.inline,
            error.blob,
            error.inline,
            completion.finished_at_ms,
            completion.usage.input_tokens,
            completion.usage.output_tokens,
            completion.usage.llm_calls,
            completion.usage.tool_calls,
            completion.usage.cost_micro_usd,
        ],
    )?;
    add_usage(connection, &run, &completion.usage, completion.provider_served)
}

/// Adds to a run's usage totals (and provider call count) in the current transaction;
/// an entry that adds nothing writes nothing.
fn add_usage(connection: &Connection, run: &RunId, usage: &Usage, provider_served: bool) -> Result<()> {
    if *usage == Usage::default() && !provider_served {
        return Ok(());
    }
    run_sql(
        connection,
        "adding to a run's usage",
        "UPDATE runs SET input_tokens = input_tokens + ?2, output_tokens = output_tokens + ?3, \
         llm_calls = llm_calls + ?4, tool_calls = tool_calls + ?5, \
         cost_micro_usd = cost_micro_usd + ?6, provider_calls = provider_calls + ?7 \
         WHERE id = ?1",
        params![
            run.as_str(),
            usage.input_tokens,
            usage.output_tokens,
            usage.llm_calls,
            usage.tool_calls,
            usage.cost_micro_usd,
            u64::from(provider_served),
        ],
    )?;
    Ok(())
}

fn complete_entry_with(
    connection: &Connection,
    run: RunId,
    seq: Seq,
    completion: EncodedCompletion,
    entries: &[EncodedEntry],
) -> Result<Vec<Seq>> {
    complete_entry(connection, run.clone(), seq, completion)?;
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let mut last = queries::last_journal_seq(connection, &run)?;
    // The appended entries' usage goes to the run's totals in one update, not one each.
    let mut usage = Usage::default();
    let mut seqs = Vec::with_capacity(entries.len());
    for entry in entries {
        last += 1;
        insert_entry(connection, &run, last, entry)?;
        if matches!(entry.status, EntryStatus::Ok | EntryStatus::Error) {
            usage.add(&entry.usage);
        }
        seqs.push(last);
    }
    if usage != Usage::default() {
        add_usage(connection, &run, &usage, false)?;
    }
    Ok(seqs)
}

fn abandon_entries(connection: &Connection, run: RunId, seqs: &[Seq]) -> Result<()> {
    queries::require_run(connection, &run)?;
    for &seq in seqs {
        let changed = run_sql(
            connection,
            "marking a journal entry abandoned",
            "UPDATE journal SET status = 'abandoned' WHERE run_id = ?1 AND seq = ?2",
            params![run.as_str(), seq_param(seq)],
        )?;
        if changed == 0 {
            // The savepoint undoes the entries already marked: all or nothing.
            return Err(Error::EntryNotFound { run, seq });
        }
    }
    Ok(())
}

fn append_events(connection: &Connection, run: RunId, events: Vec<EncodedEvent>) -> Result<Seq> {
    let mut seq = queries::last_event_seq(connection, &run)?;
    for event in events {
        seq += 1;
        run_sql(
            connection,
            "inserting an event",
            "INSERT INTO events (run_id, seq, ts_ms, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![run.as_str(), seq, event.ts_ms, event.kind, event.data],
        )?;
    }
    Ok(seq)
}

fn kv_put(connection: &Connection, scope: &str, key: &str, value: &str) -> Result<()> {
    run_sql(
        connection,
        "writing a kv value",
        "INSERT INTO kv (scope, key, value) VALUES (?1, ?2, ?3) \
         ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value",
        params![scope, key, value],
    )?;
    Ok(())
}

fn thread_append(
    connection: &Connection,
    tenant: &str,
    thread: &str,
    message: &Blob,
    idempotency_key: Option<&str>,
    appended_at_ms: u64,
) -> Result<u64> {
    if let Some(key) = idempotency_key {
        let earlier = queries::query_first(
            connection,
            "looking up an idempotency key",
            "SELECT idx FROM thread_messages WHERE tenant = ?1 AND thread = ?2 AND idempotency_key = ?3",
            params![tenant, thread, key],
            |row| row.get::<_, u64>(0).map_err(sql_error("reading a thread index")),
        )?;
        if let Some(index) = earlier {
            return Ok(index);
        }
    }
    let next = queries::query_first(
        connection,
        "finding the end of a thread",
        "SELECT COALESCE(MAX(idx) + 1, 0) FROM thread_messages WHERE tenant = ?1 AND thread = ?2",
        params![tenant, thread],
        |row| row.get::<_, u64>(0).map_err(sql_error("reading the end of a thread")),
    )?
    .unwrap_or(0);
    put_blob(connection, message)?;
    run_sql(
        connection,
        "appending a thread message",
        "INSERT INTO thread_messages (tenant, thread, idx, message_blob, idempotency_key, appended_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![tenant, thread, next, message.hash, idempotency_key, appended_at_ms],
    )?;
    Ok(next)
}

#[allow(clippy::too_many_arguments, reason = "the fields of one record")]
fn mem_put(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    key: &str,
    value: &str,
    text: &str,
    embedding: Option<&MemoryEmbedding>,
    updated_at_ms: u64,
) -> Result<()> {
    let id: i64 = connection
        .query_row(
            "INSERT INTO memory (tenant, namespace, key, value, text, updated_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (tenant, namespace, key) DO UPDATE SET \
             value = excluded.value, text = excluded.text, updated_at_ms = excluded.updated_at_ms \
             RETURNING id",
            params![tenant, namespace, key, value, text, updated_at_ms],
            |row| row.get(0),
        )
        .map_err(sql_error("writing a memory record"))?;
    match embedding {
        Some(embedding) => {
            run_sql(
                connection,
                "writing a memory embedding",
                "INSERT OR REPLACE INTO memory_embeddings (memory_id, model, dims, vector) VALUES (?1, ?2, ?3, ?4)",
                params![
                    id,
                    embedding.model,
                    embedding.vector.len() as i64,
                    search::vector_to_bytes(&embedding.vector)
                ],
            )?;
        }
        None => {
            run_sql(
                connection,
                "removing a stale memory embedding",
                "DELETE FROM memory_embeddings WHERE memory_id = ?1",
                params![id],
            )?;
        }
    }
    Ok(())
}

fn mem_delete(
    connection: &Connection,
    tenant: &str,
    namespace: &str,
    key: &str,
    idempotency_key: Option<&str>,
) -> Result<bool> {
    if let Some(idempotency_key) = idempotency_key {
        let earlier = queries::query_first(
            connection,
            "looking up an idempotency key",
            "SELECT deleted FROM memory_deletes WHERE tenant = ?1 AND idempotency_key = ?2",
            params![tenant, idempotency_key],
            |row| row.get::<_, bool>(0).map_err(sql_error("reading an earlier delete")),
        )?;
        if let Some(deleted) = earlier {
            return Ok(deleted);
        }
    }
    let deleted = run_sql(
        connection,
        "deleting a memory record",
        "DELETE FROM memory WHERE tenant = ?1 AND namespace = ?2 AND key = ?3",
        params![tenant, namespace, key],
    )? > 0;
    if let Some(idempotency_key) = idempotency_key {
        run_sql(
            connection,
            "remembering a delete",
            "INSERT INTO memory_deletes (tenant, idempotency_key, deleted) VALUES (?1, ?2, ?3)",
            params![tenant, idempotency_key, deleted],
        )?;
    }
    Ok(deleted)
}

/// Fails with `RunNotFound` unless `run` exists and belongs to `tenant` (another tenant's
/// run answers exactly as a missing one: no existence leak).
fn require_tenant_run(connection: &Connection, tenant: &str, run: &RunId) -> Result<()> {
    let owner = queries::query_first(
        connection,
        "looking up a run's tenant",
        "SELECT tenant FROM runs WHERE id = ?1",
        params![run.as_str()],
        |row| row.get::<_, String>(0).map_err(sql_error("reading a run's tenant")),
    )?;
    mailbox::check_owner(run, owner.as_deref(), tenant)
}

fn mailbox_send(connection: &Connection, to: &RunId, message: &NewMessage, text: &str) -> Result<Seq> {
    require_tenant_run(connection, &message.tenant, to)?;
    deliver(connection, to, message, text)
}

/// Puts a message in a mailbox whose run was checked: the seq of an earlier delivery
/// under the same key, else `MailboxFull` or the new seq.
fn deliver(connection: &Connection, to: &RunId, message: &NewMessage, text: &str) -> Result<Seq> {
    if let Some(key) = &message.idempotency_key {
        let earlier = queries::query_first(
            connection,
            "looking up a send's idempotency key",
            "SELECT seq FROM mailbox WHERE run_id = ?1 AND send_key = ?2",
            params![to.as_str(), key],
            |row| row.get::<_, Seq>(0).map_err(sql_error("reading a mailbox seq")),
        )?;
        if let Some(seq) = earlier {
            return Ok(seq);
        }
    }
    mailbox::check_room(to, queries::mailbox_len(connection, to)?, message.capacity)?;
    let next = queries::query_first(
        connection,
        "finding the end of a mailbox",
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM mailbox WHERE run_id = ?1",
        params![to.as_str()],
        |row| row.get::<_, Seq>(0).map_err(sql_error("reading the end of a mailbox")),
    )?
    .unwrap_or(1);
    run_sql(
        connection,
        "putting a message in a mailbox",
        "INSERT INTO mailbox (run_id, seq, from_run, message, correlation_id, topic, send_key, sent_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            to.as_str(),
            next,
            message.from.as_ref().map(RunId::as_str),
            text,
            message.correlation_id,
            message.topic,
            message.idempotency_key,
            message.sent_at_ms
        ],
    )?;
    Ok(next)
}

fn topic_subscribe(
    connection: &Connection,
    tenant: &str,
    topic: &str,
    run: &RunId,
    subscribe: bool,
) -> Result<()> {
    require_tenant_run(connection, tenant, run)?;
    let sql = if subscribe {
        "INSERT INTO subscriptions (tenant, topic, run_id) VALUES (?1, ?2, ?3) \
         ON CONFLICT (tenant, topic, run_id) DO NOTHING"
    } else {
        "DELETE FROM subscriptions WHERE tenant = ?1 AND topic = ?2 AND run_id = ?3"
    };
    run_sql(connection, "changing a topic subscription", sql, params![tenant, topic, run.as_str()])?;
    Ok(())
}

fn topic_publish(
    connection: &Connection,
    topic: &str,
    message: &NewMessage,
    text: &str,
) -> Result<Vec<(RunId, Seq)>> {
    let ended = [RunState::Succeeded, RunState::Failed, RunState::Cancelled].map(RunState::as_str);
    let subscribers = queries::query_all(
        connection,
        "listing a topic's subscribers",
        "SELECT s.run_id FROM subscriptions s JOIN runs r ON r.id = s.run_id \
         WHERE s.tenant = ?1 AND s.topic = ?2 AND r.state NOT IN (?3, ?4, ?5) ORDER BY s.run_id",
        params![message.tenant, topic, ended[0], ended[1], ended[2]],
        |row| {
            let text: String = row.get(0).map_err(sql_error("reading a subscriber"))?;
            RunId::parse(&text).map_err(|e| Error::Corrupt(format!("a subscriber of topic {topic:?}: {e}")))
        },
    )?;
    let message = NewMessage { topic: Some(topic.to_owned()), ..message.clone() };
    let mut delivered = Vec::with_capacity(subscribers.len());
    for run in subscribers {
        // A full mailbox fails the whole publish: the savepoint undoes the deliveries
        // already made.
        let seq = deliver(connection, &run, &message, text)?;
        delivered.push((run, seq));
    }
    Ok(delivered)
}

fn mailbox_receive(
    connection: &Connection,
    run: &RunId,
    key: Option<&str>,
) -> Result<Option<MailboxMessage>> {
    queries::require_run(connection, run)?;
    if let Some(key) = key {
        let earlier = queries::query_first(
            connection,
            "reading a mailbox message",
            &format!(
                "SELECT {} FROM mailbox WHERE run_id = ?1 AND receive_key = ?2",
                queries::MAILBOX_COLUMNS
            ),
            params![run.as_str(), key],
            |row| queries::decode_message(row, run),
        )?;
        if earlier.is_some() {
            return Ok(earlier);
        }
    }
    take_oldest(connection, run, key)
}

/// Takes the oldest undelivered message of a mailbox whose run was checked, marking it
/// with `key` (or a marker of its own).
fn take_oldest(connection: &Connection, run: &RunId, key: Option<&str>) -> Result<Option<MailboxMessage>> {
    let mut taken = take_oldest_many(connection, run, key, 1)?;
    Ok(taken.pop())
}

/// Takes up to `max` of the oldest undelivered messages of a mailbox whose run was
/// checked (as many as `mailbox::fit_batch` keeps), marking each with `key` (one
/// message at most then) or a marker of its own. Delivered rows stay, so the partial
/// index of the undelivered ones is named: without it SQLite walked the run's whole
/// mailbox history by primary key, a cost that grew with every message the run ever
/// received.
fn take_oldest_many(
    connection: &Connection,
    run: &RunId,
    key: Option<&str>,
    max: usize,
) -> Result<Vec<MailboxMessage>> {
    let max = if key.is_some() { 1 } else { max.max(1) };
    let mut oldest = queries::query_all(
        connection,
        "reading a mailbox message",
        &format!(
            "SELECT {} FROM mailbox INDEXED BY mailbox_undelivered \
             WHERE run_id = ?1 AND receive_key IS NULL ORDER BY seq LIMIT ?2",
            queries::MAILBOX_COLUMNS
        ),
        params![run.as_str(), max as i64],
        |row| queries::decode_message(row, run),
    )?;
    mailbox::fit_batch(&mut oldest, max);
    for message in &oldest {
        let marker = key.map_or_else(|| mailbox::delivered_marker(message.seq), str::to_owned);
        run_sql(
            connection,
            "marking a mailbox message delivered",
            "UPDATE mailbox SET receive_key = ?3 WHERE run_id = ?1 AND seq = ?2",
            params![run.as_str(), message.seq, marker],
        )?;
    }
    Ok(oldest)
}

/// A mailbox write and the journal entry recording it (with a send, also the entry of
/// the receive it completes, `receive`), run `unguarded`: every refusal comes before the
/// first write.
fn journal_mailbox(
    connection: &Connection,
    run: &RunId,
    mut entry: EncodedEntry,
    op: MailboxOp,
    receive: Option<(EncodedEntry, MailboxResult)>,
    text: &str,
    result_of: MailboxResult,
) -> Result<Option<(Seq, MailboxDone)>> {
    queries::require_run(connection, run)?;
    let done = match op {
        MailboxOp::Send { to, message, .. } => {
            require_tenant_run(connection, &message.tenant, &to)?;
            let seq = deliver(connection, &to, &message, text)?;
            match receive {
                Some((receive, result_of)) => take_for_receiver(connection, &to, seq, receive, result_of)?,
                None => MailboxDone::Sent(seq),
            }
        }
        MailboxOp::Receive { max } => {
            let taken = take_oldest_many(connection, run, None, max)?;
            if taken.is_empty() {
                return Ok(None);
            }
            MailboxDone::Received(taken)
        }
    };
    entry.result = Some(Blob::of(&result_of(&done)));
    let seq = queries::last_journal_seq(connection, run)? + 1;
    insert_entry(connection, run, seq, &entry)?;
    if matches!(entry.status, EntryStatus::Ok | EntryStatus::Error) && entry.usage != Usage::default() {
        add_usage(connection, run, &entry.usage, false)?;
    }
    Ok(Some((seq, done)))
}

/// The second half of a send to a waiting receiver (`MailboxOp::Send`'s `receive`): run `to`
/// takes its oldest message and its `receive` entry is appended, complete, recording it.
/// Finding nothing to take (a retried send whose message was taken since) is a plain send.
fn take_for_receiver(
    connection: &Connection,
    to: &RunId,
    seq: Seq,
    mut receive: EncodedEntry,
    result_of: MailboxResult,
) -> Result<MailboxDone> {
    let Some(message) = take_oldest(connection, to, None)? else {
        return Ok(MailboxDone::Sent(seq));
    };
    receive.result = Some(Blob::of(&result_of(&MailboxDone::Received(vec![message.clone()]))));
    let receive_seq = queries::last_journal_seq(connection, to)? + 1;
    insert_entry(connection, to, receive_seq, &receive)?;
    Ok(MailboxDone::SentAndTaken { seq, receive_seq, message })
}

/// Stores the nodes of a message chain that are not stored yet (see
/// `chain::unstored_links`): a call that re-sends a history writes only the new messages.
/// A small message is stored in its node, a larger one as a blob the node names.
fn put_chain(connection: &Connection, links: &[ChainLink]) -> Result<()> {
    let unstored = chain::unstored_links(links, |link| {
        let found = queries::query_first(
            connection,
            "looking up a message chain node",
            "SELECT 1 FROM message_chain WHERE hash = ?1",
            params![link.hash],
            |_| Ok(()),
        )?;
        Ok(found.is_some())
    })?;
    for link in unstored {
        let message = store_payload(connection, Some(&link.message))?;
        run_sql(
            connection,
            "storing a message chain node",
            "INSERT INTO message_chain (hash, prev, message_blob, message_inline) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (hash) DO NOTHING",
            params![link.hash, link.prev, message.blob, message.inline],
        )?;
    }
    Ok(())
}

/// Payloads up to this many bytes are stored in the row that names them (a journal entry,
/// a message chain node) rather than as a blob of their own: a blob is a row at a random
/// place of `blobs` (its key is a content hash), so every commit storing one wrote a page
/// there besides the row's own. Small enough that a journal row with its params and
/// result inline stays within a leaf's local payload (about 1,000 bytes in a WITHOUT ROWID
/// table), so it never needs an overflow page. Inline payloads are not shared: the same
/// small payload stored twice takes its bytes twice, where a blob would have been one.
pub(super) const INLINE_MAX: usize = 256;

/// Where a payload went: exactly one of the two is set for a payload, neither for none.
struct StoredPayload<'a> {
    blob: Option<&'a str>,
    inline: Option<&'a [u8]>,
}

/// Stores a payload inline (see [`INLINE_MAX`]) or as a blob, and says which for the row
/// that names it.
fn store_payload<'a>(connection: &Connection, payload: Option<&'a Blob>) -> Result<StoredPayload<'a>> {
    Ok(match payload {
        None => StoredPayload { blob: None, inline: None },
        Some(blob) if blob.bytes.len() <= INLINE_MAX => {
            StoredPayload { blob: None, inline: Some(blob.bytes.as_slice()) }
        }
        Some(blob) => {
            put_blob(connection, blob)?;
            StoredPayload { blob: Some(blob.hash.as_str()), inline: None }
        }
    })
}

/// Stores a payload once: a blob with the same hash is already the same bytes.
/// (`ON CONFLICT (hash) DO NOTHING` rather than `INSERT OR IGNORE`, which would also
/// swallow other constraint failures.)
pub(super) fn put_blob(connection: &Connection, blob: &Blob) -> Result<()> {
    run_sql(
        connection,
        "storing a payload blob",
        "INSERT INTO blobs (hash, size, bytes) VALUES (?1, ?2, ?3) ON CONFLICT (hash) DO NOTHING",
        params![blob.hash, blob.bytes.len(), blob.bytes],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Completion, NewEntry};

    fn database() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut connection = Connection::open(dir.path().join("keel.db")).expect("open");
        super::super::schema::configure_writer(&connection).expect("configure");
        super::super::schema::migrate(&mut connection).expect("migrate");
        (dir, connection)
    }

    fn new_run(id: &RunId) -> NewRun {
        NewRun {
            id: id.clone(),
            tenant: "default".into(),
            spec: json!({}),
            state: RunState::Running,
            created_at_ms: 1,
        }
    }

    fn entry(step: u64) -> EncodedEntry {
        EncodedEntry::of(&NewEntry {
            method: "tool.call".into(),
            params_hash: format!("h{step}"),
            params: json!({"step": step}),
            status: EntryStatus::Pending,
            result: None,
            error: None,
            attempt: 1,
            started_at_ms: step,
            finished_at_ms: None,
            usage: Usage::default(),
        })
    }

    fn completion(step: u64) -> EncodedCompletion {
        EncodedCompletion::of(&Completion {
            status: EntryStatus::Ok,
            result: Some(json!({"done": step})),
            error: None,
            finished_at_ms: step + 1,
            usage: Usage { tool_calls: 1, ..Usage::default() },
            provider_served: false,
        })
    }

    fn count(connection: &Connection, sql: &str) -> i64 {
        connection.query_row(sql, [], |row| row.get(0)).expect(sql)
    }

    /// A cached statement is planned once: reading other runs' journals with other
    /// limits binds new values to `LIMIT ?3` and `?1`, and must not make SQLite parse and
    /// plan the statement again (`keep_statements_prepared`). A connection without the
    /// setting does re-prepare, which shows the check can fail.
    #[test]
    fn a_journal_read_is_planned_once_whatever_it_binds() {
        use rusqlite::StatementStatus;
        let (dir, connection) = database();
        let runs = [RunId::generate(1), RunId::generate(2)];
        for run in &runs {
            create_run(&connection, new_run(run)).expect("create");
            for step in 1..=3 {
                append_entry(&connection, run.clone(), entry(step)).expect("append");
            }
        }
        let reprepared = |connection: &Connection| {
            for round in 0..3 {
                for run in &runs {
                    let limit = [None, Some(1), Some(2)][round];
                    let entries = queries::journal_page(connection, run, 0, limit).expect("read");
                    assert_eq!(entries.len(), limit.unwrap_or(3));
                }
            }
            let statement = connection.prepare_cached(&queries::journal_page_sql()).expect("cached");
            statement.get_status(StatementStatus::RePrepare)
        };
        let reader = Connection::open(dir.path().join("keel.db")).expect("open a reader");
        super::super::schema::configure_reader(&reader).expect("configure the reader");
        assert_eq!(reprepared(&reader), 0, "the reader re-planned its journal read");
        assert_eq!(reprepared(&connection), 0, "the writer re-planned its journal read");
        let plain = Connection::open(dir.path().join("keel.db")).expect("open");
        assert!(reprepared(&plain) > 0, "without the setting SQLite re-plans on a new LIMIT");
    }

    /// Commands that run without a savepoint refuse before writing, so a refused one
    /// in the middle of a batch leaves the others' writes, and writes nothing itself.
    #[test]
    fn a_refused_command_leaves_its_batch_whole() {
        let (_dir, connection) = database();
        let run = RunId::generate(1);
        let missing = RunId::generate(2);
        let append = |run: &RunId, step: u64| {
            let (reply, receiver) = oneshot::channel();
            (WriteCommand::AppendEntry { run: run.clone(), entry: entry(step), reply }, receiver)
        };
        let (created, created_rx) = oneshot::channel();
        let mut first = VecDeque::from([WriteCommand::CreateRun { run: new_run(&run), reply: created }]);
        for answer in run_transaction(&connection, &mut first) {
            answer.deliver();
        }
        created_rx.blocking_recv().expect("answered").expect("created");

        let mut batch = VecDeque::new();
        let mut replies = Vec::new();
        let (command, reply) = append(&run, 1);
        batch.push_back(command);
        replies.push(reply);
        // Refused: no such run, a completion of an entry that does not exist, a run that
        // exists already.
        let (command, reply) = append(&missing, 2);
        batch.push_back(command);
        replies.push(reply);
        let (done, done_rx) = oneshot::channel();
        batch.push_back(WriteCommand::CompleteEntryWith {
            run: run.clone(),
            seq: 9,
            completion: completion(9),
            entries: vec![entry(3)],
            reply: done,
        });
        let (created_again, created_again_rx) = oneshot::channel();
        batch.push_back(WriteCommand::CreateRun { run: new_run(&run), reply: created_again });
        let (command, reply) = append(&run, 4);
        batch.push_back(command);
        replies.push(reply);
        for answer in run_transaction(&connection, &mut batch) {
            answer.deliver();
        }
        assert!(batch.is_empty());
        assert!(connection.is_autocommit(), "the batch committed");

        let seqs: Vec<Result<Seq>> =
            replies.into_iter().map(|rx| rx.blocking_recv().expect("answered")).collect();
        assert_eq!(seqs[0].as_ref().ok(), Some(&1));
        assert!(matches!(seqs[1], Err(Error::RunNotFound(_))), "{:?}", seqs[1]);
        assert_eq!(seqs[2].as_ref().ok(), Some(&2));
        assert!(matches!(done_rx.blocking_recv().expect("answered"), Err(Error::EntryNotFound { .. })));
        assert!(matches!(created_again_rx.blocking_recv().expect("answered"), Err(Error::RunExists(_))));

        assert_eq!(count(&connection, "SELECT count(*) FROM journal"), 2);
        assert_eq!(count(&connection, "SELECT count(*) FROM runs"), 1);
        // Entry 3, appended by the refused completion, was never stored, nor its params.
        let params = entry(3).params.hash;
        assert_eq!(count(&connection, &format!("SELECT count(*) FROM blobs WHERE hash = '{params}'")), 0);
    }

    /// A write without a savepoint that fails after changing rows takes its whole
    /// transaction with it rather than commit half of itself.
    #[test]
    fn an_unguarded_write_failing_midway_rolls_the_transaction_back() {
        let (_dir, connection) = database();
        let run = RunId::generate(1);
        run_sql(&connection, "begin", "BEGIN IMMEDIATE", []).expect("begin");
        create_run(&connection, new_run(&run)).expect("an earlier command of the batch");
        let result: Result<()> = unguarded(&connection, |c| {
            append_entry(c, run.clone(), entry(1))?;
            Err(Error::Refused("refused after writing".into()))
        });
        assert!(matches!(result, Err(Error::Refused(_))));
        assert!(connection.is_autocommit(), "the transaction was rolled back");
        assert_eq!(count(&connection, "SELECT count(*) FROM journal"), 0);
        assert_eq!(count(&connection, "SELECT count(*) FROM runs"), 0);

        // A refusal before any write leaves the transaction open.
        run_sql(&connection, "begin", "BEGIN IMMEDIATE", []).expect("begin");
        create_run(&connection, new_run(&run)).expect("an earlier command of the batch");
        let result = unguarded(&connection, |c| append_entry(c, RunId::generate(3), entry(1)));
        assert!(matches!(result, Err(Error::RunNotFound(_))));
        assert!(!connection.is_autocommit());
        run_sql(&connection, "commit", "COMMIT", []).expect("commit");
        assert_eq!(count(&connection, "SELECT count(*) FROM runs"), 1);
    }
}
