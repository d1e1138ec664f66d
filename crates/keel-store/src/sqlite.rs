//! The embedded SQLite backend of the Store API: one writer thread that group-commits
//! every write, and a small pool of read-only connections that read alongside it (WAL).
//!
//! Shape: `SqliteStore` is a cheap-to-clone handle. Writes are turned into a closed
//! `WriteCommand` for the only read-write connection (`writer`). A write that is the only
//! one in flight is committed on its caller's thread; otherwise it is sent to the writer
//! thread, which drains whatever is queued into one transaction and commits it; its
//! flusher thread flushes the WAL and then answers every caller, while the writer commits
//! the next batch (`writer::run`). Reads run on tokio's blocking pool with a connection of
//! their own (`ReadPool`); since a write is answered only after its commit, a read that
//! starts after a write returned sees it. A read may also see a commit whose flush is
//! still under way: if the machine lost power then, that commit would be lost with every
//! later one, none of them answered (the WAL is one sequence, and a flush covers every
//! frame before it).

mod audit;
mod dump;
mod queries;
mod schema;
mod tenants;
mod triggers;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use async_trait::async_trait;
use keel_types::{RunId, RunState};
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::chain::Blob;
use crate::chain::{EncodedCompletion, EncodedEntry};
use crate::{
    ApiTokenRecord, AuditEntry, AuditFilter, AuditRecord, AuditVerify, Completion, CostBucket, CostFilter,
    DumpItem, Error, EventRecord, JournalEntry, MailboxDone, MailboxMessage, MailboxOp, MailboxResult,
    MemoryEmbedding, MemoryHit, MemoryRecord, MemorySearch, NewEntry, NewEvent, NewMessage, NewRun, Result,
    RunCount, RunFilter, RunPatch, RunRecord, Seq, Store, StoreStats, TenantRecord, ThreadMessage,
    WaitingReceive,
};
use crate::{FireRecord, TriggerRecord};
use writer::{EncodedEvent, WriteCommand};

/// How many write commands may wait for the writer before callers are held back. Large
/// enough that a burst from many runs forms big batches, small enough to bound memory.
const WRITE_QUEUE_CAPACITY: usize = 4096;

/// Idle read connections kept open for reuse; more are opened on demand under load.
const MAX_IDLE_READERS: usize = 8;

/// The SQLite store. Clones share one database, one writer thread and one read pool;
/// when the last clone is dropped the writer finishes what is queued, closes its
/// connection and its thread is joined.
///
/// A write whose caller stops waiting (its future is dropped) may still be committed:
/// the command has already been handed to the writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` only while `Drop` runs: dropping the sender is what tells the writer to stop.
    commands: Option<mpsc::Sender<WriteCommand>>,
    /// The read-write connection, shared by the writer thread and inline commits. Dropped
    /// after `Drop` has joined the writer thread, so it is the last connection to close.
    writer: Arc<Mutex<writer::Writer>>,
    /// Writes in flight: asked for and not yet answered (or given up on).
    writing: AtomicUsize,
    writer_thread: Option<JoinHandle<()>>,
    /// Dropping it stops the checkpointer.
    checkpoint_stop: Option<std::sync::mpsc::Sender<()>>,
    checkpoint_thread: Option<JoinHandle<()>>,
    readers: Arc<ReadPool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Idle readers close first, so that the writer's connection is the last one open:
        // SQLite checkpoints the WAL into the database file when its last connection closes.
        self.readers.idle.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.checkpoint_stop = None;
        if let Some(thread) = self.checkpoint_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the keel-store checkpoint thread panicked");
        }
        // Closing the channel lets the writer drain the queue and return; joining it means
        // the database file is closed once the store is gone, so the same process can
        // reopen it at once.
        self.commands = None;
        if let Some(thread) = self.writer_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the keel-store writer thread panicked");
        }
    }
}

/// Copies the WAL back into the database file once a second from a connection of its own,
/// so that the writer's automatic checkpoint (which runs inside a commit) finds little
/// left to copy. PASSIVE checkpoints never block the writer or readers.
fn start_checkpointer(path: &Path) -> Result<(std::sync::mpsc::Sender<()>, JoinHandle<()>)> {
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(writer::sql_error("opening the checkpoint connection"))?;
    schema::configure_reader(&connection)?;
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("keel-store-checkpoint".to_owned())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(std::time::Duration::from_secs(1))
            {
                if let Err(err) = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!("keel-store could not checkpoint the WAL: {err}");
                }
            }
        })
        .map_err(|source| Error::Backend {
            step: "starting the checkpoint thread",
            source: Box::new(source),
        })?;
    Ok((stop, thread))
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` and brings its schema up
    /// to date. The directory must exist. Blocks briefly (file IO), so call it at startup
    /// or from a blocking context.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        let mut connection = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(writer::sql_error("opening the database file"))?;
        schema::configure_writer(&connection)?;
        schema::migrate(&mut connection)?;

        let (commands, receiver) = mpsc::channel(WRITE_QUEUE_CAPACITY);
        let wal = Arc::new(writer::Wal::open(path)?);
        let writer = Arc::new(Mutex::new(writer::Writer::new(connection, wal)));
        let thread_writer = Arc::clone(&writer);
        let writer_thread = std::thread::Builder::new()
            .name("keel-store-writer".to_owned())
            .spawn(move || writer::run(thread_writer, receiver))
            .map_err(|source| Error::Backend {
                step: "starting the writer thread",
                source: Box::new(source),
            })?;
        let (checkpoint_stop, checkpoint_thread) = start_checkpointer(path)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                commands: Some(commands),
                writer,
                writing: AtomicUsize::new(0),
                writer_thread: Some(writer_thread),
                checkpoint_stop: Some(checkpoint_stop),
                checkpoint_thread: Some(checkpoint_thread),
                readers: Arc::new(ReadPool { path: path.to_owned(), idle: Mutex::new(Vec::new()) }),
            }),
        })
    }

    /// Opens the keel database at `path` like `open`, but only if it exists and is one:
    /// a missing file is not created and a foreign file (not SQLite, or SQLite without
    /// keel's tables) is refused untouched, naming what it is. For reading a store whose
    /// absence is a mistake (the source of `keel migrate`).
    pub fn open_existing(path: &Path) -> Result<SqliteStore> {
        let refused = |why: String| Error::Backend {
            step: "checking the file is a keel database",
            source: format!("{}: {why}", path.display()).into(),
        };
        if !path.is_file() {
            return Err(refused(if path.exists() {
                "it is not a file".to_owned()
            } else {
                "no such file".to_owned()
            }));
        }
        let connection = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(writer::sql_error("opening the database file"))?;
        // The first read is where SQLite finds out the file is not a database.
        let has_runs = connection
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('runs', 'journal')",
                [],
                |row| row.get::<_, i64>(0),
            )
            .map_err(|error| refused(format!("not a keel database ({error})")))?;
        if has_runs != 2 {
            return Err(refused(
                "an SQLite database, but not keel's (it has no runs and journal tables)".to_owned(),
            ));
        }
        drop(connection);
        SqliteStore::open(path)
    }

    /// Commits a command and waits until it is committed (or failed). Uncontended (no
    /// other write in flight, see `may_commit_inline`), the caller commits it on its own
    /// thread: handing it to the writer thread and being woken back costs two thread
    /// wake-ups, which on an idle machine take longer than the statements. Otherwise it
    /// queues for the writer thread, which commits everything queued in one transaction.
    async fn write<T>(&self, command: impl FnOnce(writer::Reply<T>) -> WriteCommand) -> Result<T> {
        let commands = self.inner.commands.as_ref().ok_or(Error::Closed)?;
        let _writing = Writing::enter(&self.inner.writing);
        let (reply, answer) = oneshot::channel();
        let mut command = command(reply);
        if self.may_commit_inline(commands, &command) {
            // The commit holds this thread until the flush: first let run what this task
            // just woke, which a runtime keeps for this thread (tokio's LIFO slot, which
            // other threads do not steal). Without it, a streamed answer's first token
            // waited behind the commit of the next call.
            tokio::task::yield_now().await;
            command = match self.commit_inline(commands, command) {
                None => return answer.await.map_err(|_| Error::Closed)?,
                Some(command) => command,
            };
        }
        commands.send(command).await.map_err(|_| Error::Closed)?;
        // The writer drops the reply sender without answering only if it died.
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Whether `command` may be committed on its caller's thread: it is of a kind that
    /// may (`writer::may_commit_inline`), no other write is in flight (with others, it
    /// joins their group commit: committed alone, it would take a flush of its own while
    /// they queue) and nothing is queued before it (queued commands were sent first and
    /// stay first). Whether a commit holds the writer is `commit_inline`'s `try_lock`.
    fn may_commit_inline(&self, commands: &mpsc::Sender<WriteCommand>, command: &WriteCommand) -> bool {
        writer::may_commit_inline(command)
            && self.inner.writing.load(Ordering::SeqCst) == 1
            && commands.capacity() == commands.max_capacity()
    }

    /// Commits `command` on this thread if it still may (after the yield) and the writer
    /// is free; otherwise hands it back. Never waits for the lock: a commit in flight means others are
    /// writing, and queueing behind it joins their group commit.
    fn commit_inline(
        &self,
        commands: &mpsc::Sender<WriteCommand>,
        command: WriteCommand,
    ) -> Option<WriteCommand> {
        if !self.may_commit_inline(commands, &command) {
            return Some(command);
        }
        let mut writer = match self.inner.writer.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Some(command),
        };
        let batch = &mut std::collections::VecDeque::from([command]);
        let committed = writer.commit(batch, writer::Flush::InCommit);
        let wal = Arc::clone(writer.wal());
        drop(writer);
        committed.deliver(&wal);
        None
    }

    /// `kv_put`, and `kv_put_unflushed` without `flush`.
    async fn put_kv(&self, scope: &str, key: &str, value: Value, flush: bool) -> Result<()> {
        let (scope, key, value) = (scope.to_owned(), key.to_owned(), value.to_string());
        self.write(|reply| WriteCommand::KvPut { scope, key, value, flush, reply }).await
    }

    /// Runs `read` on the blocking pool inside one read transaction, so that it sees one
    /// consistent snapshot that includes every write already answered.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let readers = Arc::clone(&self.inner.readers);
        match tokio::task::spawn_blocking(move || readers.with_snapshot(read)).await {
            Ok(result) => result,
            Err(join_error) if join_error.is_panic() => std::panic::resume_unwind(join_error.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(Error::Closed),
        }
    }
}

/// Read-only connections, reused across reads. WAL lets them read while the writer
/// writes; each read runs in its own transaction and therefore sees the latest commit.
struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    fn with_snapshot<T>(&self, read: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        // A poisoned lock only means another reader panicked while pushing or popping;
        // the vector of connections is still valid.
        let reused = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let connection = match reused {
            Some(connection) => connection,
            None => self.open()?,
        };
        // BEGIN and ROLLBACK through the connection's statement cache: rusqlite's
        // `transaction()` parses both anew on every read.
        writer::run_sql(&connection, "beginning a read transaction", "BEGIN", [])?;
        let result = read(&connection);
        // Nothing was written, so ending with a rollback is the cheapest correct end. A
        // connection that cannot even do that is not returned to the pool.
        if writer::run_sql(&connection, "ending a read transaction", "ROLLBACK", []).is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < MAX_IDLE_READERS {
                idle.push(connection);
            }
        }
        result
    }

    fn open(&self) -> Result<Connection> {
        let connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(writer::sql_error("opening a read connection"))?;
        schema::configure_reader(&connection)?;
        Ok(connection)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        self.write(|reply| WriteCommand::CreateRun { run, reply }).await
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>> {
        let id = id.clone();
        self.read(move |connection| queries::load_run(connection, &id)).await
    }

    async fn runs_ended_after(
        &self,
        tenant: &str,
        after_ms: u64,
        after_id: Option<&RunId>,
        limit: usize,
    ) -> Result<Vec<RunRecord>> {
        let (tenant, after_id) = (tenant.to_owned(), after_id.cloned());
        self.read(move |connection| {
            queries::runs_ended_after(connection, &tenant, after_ms, after_id.as_ref(), limit)
        })
        .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let filter = filter.clone();
        self.read(move |connection| queries::list_runs(connection, &filter)).await
    }

    async fn cost_summary(&self, filter: &CostFilter) -> Result<Vec<CostBucket>> {
        let filter = filter.clone();
        self.read(move |connection| queries::cost_summary(connection, &filter)).await
    }

    async fn count_runs(&self) -> Result<Vec<RunCount>> {
        self.read(queries::count_runs).await
    }

    async fn update_run(&self, id: &RunId, expected: Option<RunState>, patch: RunPatch) -> Result<RunRecord> {
        let id = id.clone();
        self.write(|reply| WriteCommand::UpdateRun { id, expected, patch, reply }).await
    }

    async fn append_entry(&self, run: &RunId, entry: &NewEntry) -> Result<Seq> {
        // Serializing and hashing happen here, in the caller's task, so the single writer
        // thread spends its time on SQLite only.
        let entry = EncodedEntry::of(entry);
        let run = run.clone();
        self.write(|reply| WriteCommand::AppendEntry { run, entry, reply }).await
    }

    async fn complete_entry_with(
        &self,
        run: &RunId,
        seq: Seq,
        completion: &Completion,
        entries: &[NewEntry],
    ) -> Result<Vec<Seq>> {
        let completion = EncodedCompletion::of(completion);
        let entries = entries.iter().map(EncodedEntry::of).collect();
        let run = run.clone();
        self.write(|reply| WriteCommand::CompleteEntryWith { run, seq, completion, entries, reply }).await
    }

    async fn abandon_entries(&self, run: &RunId, seqs: &[Seq]) -> Result<()> {
        let run = run.clone();
        let seqs = seqs.to_vec();
        self.write(|reply| WriteCommand::AbandonEntries { run, seqs, reply }).await
    }

    async fn journal(&self, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>> {
        let run = run.clone();
        self.read(move |connection| queries::journal(connection, &run, after)).await
    }

    async fn latest_entry(&self, run: &RunId, method: &str) -> Result<Option<JournalEntry>> {
        let run = run.clone();
        let method = method.to_owned();
        self.read(move |connection| queries::latest_entry(connection, &run, &method)).await
    }

    async fn append_events(&self, run: &RunId, events: &[NewEvent]) -> Result<Seq> {
        let events = events
            .iter()
            .map(|event| EncodedEvent {
                ts_ms: event.ts_ms,
                kind: event.kind.clone(),
                data: event.data.to_string(),
            })
            .collect();
        let run = run.clone();
        self.write(|reply| WriteCommand::AppendEvents { run, events, reply }).await
    }

    async fn events(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>> {
        let run = run.clone();
        self.read(move |connection| queries::events(connection, &run, after, limit)).await
    }

    async fn kv_get(&self, scope: &str, key: &str) -> Result<Option<Value>> {
        let scope = scope.to_owned();
        let key = key.to_owned();
        self.read(move |connection| queries::kv_get(connection, &scope, &key)).await
    }

    async fn kv_chain(&self, scope: &str, key: &str, link: &[&str], limit: usize) -> Result<Vec<Value>> {
        let scope = scope.to_owned();
        let key = key.to_owned();
        let link: Vec<String> = link.iter().map(|&name| name.to_owned()).collect();
        self.read(move |connection| {
            let mut chain = Vec::new();
            let mut next = Some(key);
            while let Some(key) = next.take()
                && chain.len() < limit
                && let Some(value) = queries::kv_get(connection, &scope, &key)?
            {
                next = kv_link(&value, &link).map(str::to_owned);
                chain.push(value);
            }
            Ok(chain)
        })
        .await
    }

    async fn kv_get_many(&self, keys: &[(String, String)]) -> Result<Vec<Option<Value>>> {
        let keys = keys.to_vec();
        self.read(move |connection| {
            keys.iter().map(|(scope, key)| queries::kv_get(connection, scope, key)).collect()
        })
        .await
    }

    async fn kv_put(&self, scope: &str, key: &str, value: Value) -> Result<()> {
        self.put_kv(scope, key, value, true).await
    }

    async fn kv_put_unflushed(&self, scope: &str, key: &str, value: Value) -> Result<()> {
        self.put_kv(scope, key, value, false).await
    }

    async fn thread_append(
        &self,
        tenant: &str,
        thread: &str,
        message: Value,
        idempotency_key: Option<&str>,
        appended_at_ms: u64,
    ) -> Result<u64> {
        let tenant = tenant.to_owned();
        let thread = thread.to_owned();
        let message = Blob::of(&message);
        let idempotency_key = idempotency_key.map(str::to_owned);
        self.write(|reply| WriteCommand::ThreadAppend {
            tenant,
            thread,
            message,
            idempotency_key,
            appended_at_ms,
            reply,
        })
        .await
    }

    async fn thread_read(
        &self,
        tenant: &str,
        thread: &str,
        last: Option<usize>,
    ) -> Result<Vec<ThreadMessage>> {
        let tenant = tenant.to_owned();
        let thread = thread.to_owned();
        self.read(move |connection| queries::thread_read(connection, &tenant, &thread, last)).await
    }

    async fn mem_put(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
        value: Value,
        text: String,
        embedding: Option<MemoryEmbedding>,
        updated_at_ms: u64,
    ) -> Result<()> {
        let tenant = tenant.to_owned();
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        let value = value.to_string();
        self.write(|reply| WriteCommand::MemPut {
            tenant,
            namespace,
            key,
            value,
            text,
            embedding,
            updated_at_ms,
            reply,
        })
        .await
    }

    async fn mem_get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryRecord>> {
        let tenant = tenant.to_owned();
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.read(move |connection| queries::mem_get(connection, &tenant, &namespace, &key)).await
    }

    async fn mem_delete(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
        idempotency_key: Option<&str>,
    ) -> Result<bool> {
        let tenant = tenant.to_owned();
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        let idempotency_key = idempotency_key.map(str::to_owned);
        self.write(|reply| WriteCommand::MemDelete { tenant, namespace, key, idempotency_key, reply }).await
    }

    async fn mem_search(
        &self,
        tenant: &str,
        namespace: &str,
        search: &MemorySearch,
        limit: usize,
    ) -> Result<Vec<MemoryHit>> {
        let tenant = tenant.to_owned();
        let namespace = namespace.to_owned();
        let search = search.clone();
        self.read(move |connection| queries::mem_search(connection, &tenant, &namespace, &search, limit))
            .await
    }

    async fn mailbox_send(&self, to: &RunId, message: NewMessage) -> Result<Seq> {
        let to = to.clone();
        let text = message.message.to_string();
        self.write(|reply| WriteCommand::MailboxSend { to, message, text, reply }).await
    }

    async fn mailbox_receive(
        &self,
        run: &RunId,
        idempotency_key: Option<&str>,
    ) -> Result<Option<MailboxMessage>> {
        let run = run.clone();
        let idempotency_key = idempotency_key.map(str::to_owned);
        self.write(|reply| WriteCommand::MailboxReceive { run, idempotency_key, reply }).await
    }

    async fn journal_mailbox(
        &self,
        run: &RunId,
        entry: NewEntry,
        op: MailboxOp,
        result_of: MailboxResult,
    ) -> Result<Option<(Seq, MailboxDone)>> {
        let entry = EncodedEntry::of(&NewEntry { result: None, ..entry });
        // A send's `receive` is encoded here, off the writer's thread, as the entry is.
        let (op, text, receive) = match op {
            MailboxOp::Send { to, message, receive } => {
                let text = message.message.to_string();
                let receive = receive.map(|receive| {
                    let WaitingReceive { entry, result_of } = *receive;
                    Box::new((EncodedEntry::of(&NewEntry { result: None, ..entry }), result_of))
                });
                (MailboxOp::Send { to, message, receive: None }, text, receive)
            }
            MailboxOp::Receive { max } => (MailboxOp::Receive { max }, String::new(), None),
        };
        let run = run.clone();
        let (entry, op) = (Box::new(entry), Box::new(op));
        self.write(|reply| WriteCommand::JournalMailbox { run, entry, op, receive, text, result_of, reply })
            .await
    }

    fn completes_waiting_receives(&self) -> bool {
        true
    }

    async fn mailbox_len(&self, run: &RunId) -> Result<u64> {
        let run = run.clone();
        self.read(move |connection| queries::mailbox_len(connection, &run)).await
    }

    async fn topic_subscribe(&self, tenant: &str, topic: &str, run: &RunId, subscribe: bool) -> Result<()> {
        let tenant = tenant.to_owned();
        let topic = topic.to_owned();
        let run = run.clone();
        self.write(|reply| WriteCommand::TopicSubscribe { tenant, topic, run, subscribe, reply }).await
    }

    async fn topic_publish(&self, topic: &str, message: NewMessage) -> Result<Vec<(RunId, Seq)>> {
        let topic = topic.to_owned();
        let text = message.message.to_string();
        self.write(|reply| WriteCommand::TopicPublish { topic, message, text, reply }).await
    }

    async fn audit_append(&self, records: Vec<AuditRecord>) -> Result<Vec<Seq>> {
        // Canonical JSON is built here, in the caller's task; the writer only chains hashes.
        let records = records.into_iter().map(audit::EncodedAudit::of).collect();
        self.write(|reply| WriteCommand::AuditAppend { records, reply }).await
    }

    async fn audit_list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        let filter = filter.clone();
        self.read(move |connection| audit::list(connection, &filter)).await
    }

    async fn audit_verify(&self) -> Result<AuditVerify> {
        // One read transaction: the walk sees one snapshot, rows streamed one at a time.
        self.read(audit::verify).await
    }

    async fn tenant_create(&self, tenant: TenantRecord) -> Result<()> {
        let quota = tenant.quota.to_string();
        self.write(|reply| WriteCommand::TenantCreate { tenant, quota, reply }).await
    }

    async fn tenant_get(&self, name: &str) -> Result<Option<TenantRecord>> {
        let name = name.to_owned();
        self.read(move |connection| tenants::get_tenant(connection, &name)).await
    }

    async fn tenant_list(&self) -> Result<Vec<TenantRecord>> {
        self.read(tenants::list_tenants).await
    }

    async fn token_create(&self, token: ApiTokenRecord) -> Result<()> {
        self.write(|reply| WriteCommand::TokenCreate { token, reply }).await
    }

    async fn token_lookup(&self, hash: &str) -> Result<Option<ApiTokenRecord>> {
        let hash = hash.to_owned();
        self.read(move |connection| tenants::lookup_token(connection, &hash)).await
    }

    async fn token_list(&self, tenant: &str) -> Result<Vec<ApiTokenRecord>> {
        let tenant = tenant.to_owned();
        self.read(move |connection| tenants::list_tokens(connection, &tenant)).await
    }

    async fn trigger_create(&self, trigger: TriggerRecord) -> Result<()> {
        self.write(|reply| writer::in_own_savepoint(reply, move |c| triggers::create(c, &trigger))).await
    }

    async fn trigger_get(&self, kind: &str, name: &str) -> Result<Option<TriggerRecord>> {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        self.read(move |connection| triggers::get(connection, &kind, &name)).await
    }

    async fn trigger_list(&self, kind: &str, tenant: Option<&str>) -> Result<Vec<TriggerRecord>> {
        let (kind, tenant) = (kind.to_owned(), tenant.map(str::to_owned));
        self.read(move |connection| triggers::list(connection, &kind, tenant.as_deref())).await
    }

    async fn trigger_set_paused(&self, kind: &str, name: &str, paused: bool, since_ms: u64) -> Result<bool> {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        self.write(|reply| {
            writer::in_own_savepoint(reply, move |c| triggers::set_paused(c, &kind, &name, paused, since_ms))
        })
        .await
    }

    async fn trigger_update(&self, kind: &str, name: &str, tenant: &str, spec: &Value) -> Result<bool> {
        let owned = (kind.to_owned(), name.to_owned(), tenant.to_owned(), spec.to_string());
        self.write(|reply| {
            writer::in_own_savepoint(reply, move |c| {
                let (kind, name, tenant, spec) = &owned;
                triggers::update(c, kind, name, tenant, spec)
            })
        })
        .await
    }

    async fn trigger_delete(&self, kind: &str, name: &str) -> Result<bool> {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        self.write(|reply| writer::in_own_savepoint(reply, move |c| triggers::delete(c, &kind, &name))).await
    }

    async fn trigger_fire(&self, fire: FireRecord) -> Result<(FireRecord, bool)> {
        self.write(|reply| writer::in_own_savepoint(reply, move |c| triggers::fire(c, fire))).await
    }

    async fn trigger_fire_settle(
        &self,
        kind: &str,
        trigger: &str,
        occasion: &str,
        outcome: &str,
        detail: Option<&str>,
    ) -> Result<()> {
        let owned = (kind.to_owned(), trigger.to_owned(), occasion.to_owned(), outcome.to_owned());
        let detail = detail.map(str::to_owned);
        self.write(|reply| {
            writer::in_own_savepoint(reply, move |c| {
                let (kind, trigger, occasion, outcome) = &owned;
                triggers::settle(c, kind, trigger, occasion, outcome, detail.as_deref())
            })
        })
        .await
    }

    async fn trigger_fires(&self, kind: &str, trigger: &str, limit: usize) -> Result<Vec<FireRecord>> {
        let (kind, trigger) = (kind.to_owned(), trigger.to_owned());
        self.read(move |connection| triggers::fires(connection, &kind, &trigger, limit)).await
    }

    async fn trigger_fires_unstarted(&self, kind: &str) -> Result<Vec<FireRecord>> {
        let kind = kind.to_owned();
        self.read(move |connection| triggers::unstarted(connection, &kind)).await
    }

    async fn token_revoke(&self, tenant: &str, prefix: &str) -> Result<u64> {
        let tenant = tenant.to_owned();
        let prefix = prefix.to_owned();
        self.write(|reply| WriteCommand::TokenRevoke { tenant, prefix, reply }).await
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.read(queries::stats).await
    }

    async fn dump(&self, sink: mpsc::Sender<Vec<DumpItem>>) -> Result<()> {
        let mut cursor = dump::Cursor::start();
        while cursor != dump::Cursor::Done {
            let (items, next) = self.read(move |connection| dump::read_batch(connection, cursor)).await?;
            cursor = next;
            if !items.is_empty() && sink.send(items).await.is_err() {
                // The receiver stopped listening (it found what it looked for).
                return Ok(());
            }
        }
        Ok(())
    }

    async fn restore(&self, items: Vec<DumpItem>) -> Result<()> {
        self.write(|reply| WriteCommand::Restore { items, reply }).await
    }

    async fn is_empty(&self) -> Result<bool> {
        self.read(dump::is_empty).await
    }
}

/// Counts a write in flight from its start until it is dropped (answered, or its caller
/// stopped waiting).
struct Writing<'a>(&'a AtomicUsize);

impl<'a> Writing<'a> {
    fn enter(count: &'a AtomicUsize) -> Writing<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Writing(count)
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The key a value of a `Store::kv_chain` links to: the string at `link` (a path of
/// object keys) in `value`, if there is one.
fn kv_link<'a>(value: &'a Value, link: &[String]) -> Option<&'a str> {
    link.iter().try_fold(value, |value, name| value.get(name))?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that answers the name of the thread that committed it.
    async fn committer(store: &SqliteStore) -> Option<String> {
        let name = |_: &Connection| Ok(std::thread::current().name().map(str::to_owned));
        store.write(|reply| writer::in_own_savepoint(reply, name)).await.expect("committed")
    }

    #[test]
    fn an_uncontended_write_commits_on_its_callers_thread_and_a_contended_one_queues() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("keel.db")).expect("open");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let here = std::thread::current().name().map(str::to_owned);
        assert_eq!(runtime.block_on(committer(&store)), here);

        // A commit in flight (the writer held): the write queues, and the writer thread
        // commits it once the writer is free. Its first poll, here, makes that choice.
        let held = writer::lock(&store.inner.writer);
        let mut queued = std::pin::pin!(committer(&store));
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        for _ in 0..3 {
            assert!(queued.as_mut().poll(&mut context).is_pending(), "committed while the writer was held");
        }
        drop(held);
        let committed_by = runtime.block_on(queued);
        assert_eq!(committed_by.as_deref(), Some("keel-store-writer"));
    }

    /// A store whose WAL flushes wait in `flush_hook` until `release` is called, and how
    /// many flushes have started.
    struct HeldFlushes {
        store: SqliteStore,
        started: Arc<std::sync::atomic::AtomicUsize>,
        gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
        _dir: tempfile::TempDir,
    }

    impl HeldFlushes {
        fn open() -> HeldFlushes {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = SqliteStore::open(&dir.path().join("keel.db")).expect("open");
            let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
            let (count, wait) = (Arc::clone(&started), Arc::clone(&gate));
            let hook: writer::FlushHook = Arc::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
                let (open, opened) = &*wait;
                let mut open = open.lock().unwrap();
                while !*open {
                    open = opened.wait(open).unwrap();
                }
                Ok(())
            });
            *writer::lock(&store.inner.writer).wal().hook.lock().unwrap() = Some(hook);
            HeldFlushes { store, started, gate, _dir: dir }
        }

        fn release(&self) {
            *self.gate.0.lock().unwrap() = true;
            self.gate.1.notify_all();
        }

        /// Waits (up to a minute) until `n` flushes have started.
        fn wait_for_flushes(&self, n: usize) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while self.started.load(Ordering::SeqCst) < n {
                assert!(std::time::Instant::now() < deadline, "no flush started");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }

    /// Creates a run through the writer thread (another write counted in flight keeps it
    /// from committing on its caller's thread); returns once it is committed, which a read
    /// sees, with the channel its answer arrives on.
    fn create_run_queued(store: &SqliteStore, id: &RunId) -> std::sync::mpsc::Receiver<Result<RunRecord>> {
        store.inner.writing.fetch_add(1, Ordering::SeqCst);
        let outcome = create_run_elsewhere(store, id);
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while runtime.block_on(store.get_run(id)).expect("read").is_none() {
            // Failed (its flush, say) before a read saw it: passed on as it came.
            if let Ok(answered) = outcome.try_recv() {
                assert!(answered.is_err(), "answered before a read saw it committed");
                store.inner.writing.fetch_sub(1, Ordering::SeqCst);
                let (again, outcome) = std::sync::mpsc::channel();
                let _ = again.send(answered);
                return outcome;
            }
            assert!(std::time::Instant::now() < deadline, "the write was not committed");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        store.inner.writing.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    /// A run created on a thread of its own; its outcome arrives on the returned channel.
    fn create_run_elsewhere(store: &SqliteStore, id: &RunId) -> std::sync::mpsc::Receiver<Result<RunRecord>> {
        let (done, outcome) = std::sync::mpsc::channel();
        let (store, id) = (store.clone(), id.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let run = NewRun {
                id,
                tenant: "default".to_owned(),
                spec: serde_json::json!({}),
                state: keel_types::RunState::Created,
                created_at_ms: 1,
            };
            let _ = done.send(runtime.block_on(store.create_run(run)));
        });
        outcome
    }

    #[test]
    fn a_queued_write_is_answered_only_after_its_flush_and_the_next_commits_meanwhile() {
        let held = HeldFlushes::open();
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (first_id, second_id) = (RunId::generate(1), RunId::generate(2));
        // The writer thread commits it and hands it to the flusher: committed (a reader
        // sees it) but, its flush held, not answered.
        let first = create_run_queued(&held.store, &first_id);
        held.wait_for_flushes(1);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(first.try_recv().is_err(), "answered before its flush");

        // The next write (queued: the first is still in flight) is committed while the
        // first flush is held, and waits for a flush too.
        let second = create_run_elsewhere(&held.store, &second_id);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while runtime.block_on(held.store.get_run(&second_id)).expect("read").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the second write waited for the first one's flush to commit"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(second.try_recv().is_err(), "answered before its flush");

        // Run events are promised no flush: answered while the flush is held.
        let events = runtime.block_on(held.store.append_events(
            &first_id,
            &[crate::NewEvent { ts_ms: 1, kind: "log".to_owned(), data: serde_json::json!({}) }],
        ));
        assert!(events.is_ok(), "{events:?}");

        held.release();
        let wait = std::time::Duration::from_secs(60);
        assert!(first.recv_timeout(wait).expect("answered").is_ok());
        assert!(second.recv_timeout(wait).expect("answered").is_ok());
    }

    #[test]
    fn a_failed_flush_fails_its_write_and_every_later_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("keel.db")).expect("open");
        let hook: writer::FlushHook = Arc::new(|| Err(std::io::Error::other("the disk went away")));
        *writer::lock(&store.inner.writer).wal().hook.lock().unwrap() = Some(hook);
        // Committed by the writer thread, flushed by the flusher.
        let failed = create_run_queued(&store, &RunId::generate(1)).recv().expect("answered");
        let error = failed.expect_err("a write whose flush failed succeeded").to_string();
        assert!(error.contains("the disk went away") && error.contains("restart keel"), "{error}");

        // The disk answers again, but what it dropped is not known: still refused.
        *writer::lock(&store.inner.writer).wal().hook.lock().unwrap() = None;
        let later = create_run_queued(&store, &RunId::generate(2)).recv().expect("answered");
        let error = later.expect_err("a write after a failed flush succeeded").to_string();
        assert!(error.contains("restart keel"), "{error}");
        // Committed on the caller's thread, where SQLite would flush it itself: refused too.
        let inline = create_run_elsewhere(&store, &RunId::generate(3)).recv().expect("answered");
        let error = inline.expect_err("an inline write after a failed flush succeeded").to_string();
        assert!(error.contains("restart keel"), "{error}");
    }
}
