//! The Postgres backend of the Store API, for installations where several kernels share one
//! database (or the operator wants one they already back up).
//!
//! Shape: `PgStore` is a cheap-to-clone handle on a connection pool (`deadpool-postgres`
//! over `tokio-postgres`). Each write is one transaction (or one statement, which is its
//! own transaction) that returns only after its `COMMIT`, and `connect` refuses a server
//! that does not flush commits (`fsync` or `synchronous_commit` off), so "durable on
//! return" holds as it does on SQLite. Concurrent writers are many connections here, not
//! one writer thread, so what the SQLite writer gives for free is earned with row locks:
//! the run's row for its journal, events and mailbox, `audit_head` for the audit chain,
//! unique indexes for idempotency keys and content-addressed blobs, and a transaction
//! advisory lock per thread for dense thread indexes. Postgres's own group commit
//! (concurrent commits share one WAL flush) serves many runs at once.
//!
//! Errors: a database that cannot be reached, or a connection lost before a write
//! commits, is `Unavailable` (nothing was written; the call may succeed later); a
//! connection lost while a write commits is `OutcomeUnknown`, since retrying it blindly
//! could write twice; any other SQL failure is `Backend` naming the step.
//!
//! Modules: `schema` (migrations and the durability check), `writes` (the write half),
//! `queries` (reads and row decoders), `audit`, `tenants`, `dump` (dump, restore,
//! is_empty), `combine` (a run's concurrent journal writes in one transaction), `cluster`
//! (`PgNode`: membership, leases, claims, the admission ledger),
//! `fence` (the lease check every write for a run makes) and `listen` (wake-ups over
//! `LISTEN/NOTIFY`).

mod audit;
mod cluster;
mod combine;
mod dump;
mod fence;
mod listen;
mod queries;
mod schema;
mod tenants;
mod triggers;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use keel_types::{RunId, RunState};
use serde_json::Value;

use crate::chain::Blob;
use crate::chain::{EncodedCompletion, EncodedEntry};
use crate::{
    ApiTokenRecord, AuditEntry, AuditFilter, AuditRecord, AuditVerify, Completion, CostBucket, CostFilter,
    DumpItem, Error, EventRecord, JournalEntry, MailboxDone, MailboxMessage, MailboxOp, MailboxResult,
    MemoryEmbedding, MemoryHit, MemoryRecord, MemorySearch, NewEntry, NewEvent, NewMessage, NewRun, Result,
    RunCount, RunFilter, RunPatch, RunRecord, Seq, Store, StoreStats, TenantRecord, ThreadMessage,
    WaitingReceive,
};
pub use cluster::PgNode;
use fence::Fences;
pub use schema::SCHEMA_VERSION;
use writes::ChainEnds;

/// The most connections one store opens unless told otherwise (`connect_with`). Each
/// write holds a connection only for its own transaction, so 32 keep 100 busy runs
/// committing in parallel (Postgres flushes concurrent commits together); several nodes
/// on a server with the default `max_connections` (100) should each take fewer.
pub const DEFAULT_POOL_SIZE: usize = 32;

/// How long opening a connection may take before the database counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the server lets a connection sit in an open transaction without a word from
/// it before it ends the session (`idle_in_transaction_session_timeout`). Keel's
/// transactions are a few pipelined round trips; a node paused or cut off inside one
/// would otherwise hold its row locks (a run's lease row, taken `FOR SHARE`) for as long
/// as it is gone, and no other node could claim that run.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a call waits for a free connection before the store counts as unreachable
/// (every connection stuck on a server that stopped answering).
const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// What `semantic_index` says when the server has no pgvector.
const BRUTE_FORCE: &str = "brute-force scan (pgvector not installed on this server)";

/// What `semantic_index` says when pgvector could be installed. Keel does not use it yet:
/// an ANN path needs a server with pgvector to be tested against, and the brute-force scan
/// answers exactly the same hits (see `SearchMode::Semantic`).
const BRUTE_FORCE_PGVECTOR_AVAILABLE: &str =
    "brute-force scan (pgvector is available on this server, but Keel does not use it yet)";

/// The Postgres store. Clones share one pool. A write whose caller stops waiting may
/// still commit (the `COMMIT` may already be on the wire); one that fails wrote nothing.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// The hook every write for a run calls inside its transaction (see `fence`).
    fences: Arc<Fences>,
    /// Where the message chains this store wrote end (saves a lookup per append).
    chain_ends: Arc<ChainEnds>,
    /// The journal writes waiting for each run's writer task (see `combine`).
    run_queues: Arc<combine::RunQueues>,
    /// The URL with its password hidden, for errors.
    url: Arc<str>,
    /// How to connect, for the connection a cluster node listens for wake-ups on.
    config: Arc<tokio_postgres::Config>,
    semantic_index: &'static str,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &self.url).finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db`, or the
    /// key=value form), checks that the server makes commits durable, and brings the schema
    /// (in the first schema of the connection's `search_path`) up to date. A server that
    /// cannot be reached is `Unavailable`, naming the URL without its password.
    pub async fn connect(url: &str) -> Result<PgStore> {
        PgStore::connect_with(url, DEFAULT_POOL_SIZE).await
    }

    /// [`PgStore::connect`] with at most `pool_size` connections (at least 2: a node's
    /// heartbeat must not wait behind its writes for long).
    pub async fn connect_with(url: &str, pool_size: usize) -> Result<PgStore> {
        let redacted: Arc<str> = redact_url(url).into();
        let mut config: tokio_postgres::Config = url.parse().map_err(|error| Error::Backend {
            step: "parsing the database URL",
            source: format!(
                "{redacted} is not a Postgres connection string ({error}); \
                 expected postgres://user:password@host:port/database"
            )
            .into(),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // After the URL's own options (a `search_path`, say), unless it sets this one.
        let options = config.get_options().unwrap_or_default().to_owned();
        if !options.contains("idle_in_transaction_session_timeout") {
            let timeout =
                format!("-c idle_in_transaction_session_timeout={}", IDLE_IN_TRANSACTION_TIMEOUT.as_millis());
            config.options(if options.is_empty() { timeout } else { format!("{options} {timeout}") });
        }
        // `NoTls`: Keel talks to a database on the same host or a private network today; a
        // TLS connector (and `sslmode` in the URL) comes with the first deployment that
        // crosses an untrusted network. A URL asking `sslmode=require` fails to connect
        // rather than silently going in clear.
        let shared_config = Arc::new(config.clone());
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(2))
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|error| Error::Backend {
                step: "building the connection pool",
                source: Box::new(error),
            })?;
        let mut store = PgStore {
            pool,
            fences: Arc::default(),
            chain_ends: Arc::default(),
            run_queues: Arc::default(),
            url: redacted,
            config: shared_config,
            semantic_index: BRUTE_FORCE,
        };
        let mut client = store.client("connecting to the database").await?;
        schema::check_durable(&client, &store.url).await?;
        schema::migrate(&mut client).await?;
        if schema::pgvector_available(&client).await? {
            store.semantic_index = BRUTE_FORCE_PGVECTOR_AVAILABLE;
        }
        Ok(store)
    }

    /// How semantic memory search finds its hits on this server, for `keel doctor` and the
    /// logs. Always the brute-force cosine scan shared with SQLite; the answer says whether
    /// pgvector could be used instead.
    pub fn semantic_index(&self) -> &'static str {
        self.semantic_index
    }

    /// The server's version as it reports it (`SHOW server_version`), for `keel doctor`.
    pub async fn server_version(&self) -> Result<String> {
        let client = self.client("asking the server's version").await?;
        let row = client
            .query_one("SHOW server_version", &[])
            .await
            .map_err(pg_error("asking the server's version"))?;
        row.try_get(0).map_err(|source| Error::Backend {
            step: "reading the server's version",
            source: Box::new(source),
        })
    }

    /// A connection from the pool. A server that cannot be reached (or a pool whose every
    /// connection is stuck) is `Unavailable`; any failure names the URL (without its
    /// password), since a wrong URL is the likely cause.
    async fn client(&self, step: &'static str) -> Result<Object> {
        self.pool.get().await.map_err(|error| match error {
            PoolError::Backend(source) if is_connection_failure(&source) => {
                Error::Unavailable { step, source: format!("{}: {}", self.url, cause(&source)).into() }
            }
            PoolError::Backend(source) => {
                Error::Backend { step, source: format!("{}: {}", self.url, cause(&source)).into() }
            }
            PoolError::Timeout(_) => Error::Unavailable {
                step,
                source: format!(
                    "{}: no connection became free or could be opened within {} s",
                    self.url,
                    POOL_WAIT_TIMEOUT.as_secs()
                )
                .into(),
            },
            PoolError::Closed => Error::Closed,
            other => Error::Backend { step, source: Box::new(other) },
        })
    }
}

/// `url` with any password replaced by `***`, for messages and logs: the password of the
/// URL form (`postgres://user:secret@host`), and a `password` parameter of the query
/// string or of the key=value form.
pub fn redact_url(url: &str) -> String {
    let mut redacted = url.to_owned();
    if let Some(scheme_end) = redacted.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end =
            redacted[authority_start..].find(['/', '?']).map_or(redacted.len(), |end| authority_start + end);
        if let Some(at) = redacted[authority_start..authority_end].rfind('@') {
            let userinfo = authority_start..authority_start + at;
            if let Some(colon) = redacted[userinfo.clone()].find(':') {
                redacted.replace_range(userinfo.start + colon + 1..userinfo.end, "***");
            }
        }
    }
    let mut searched = 0;
    while let Some(found) = redacted[searched..].find("password=") {
        let start = searched + found;
        let value_start = start + "password=".len();
        let before = redacted[..start].chars().next_back();
        if before.is_some_and(|c| !matches!(c, '?' | '&' | ' ' | '\t' | '\n')) {
            searched = value_start;
            continue;
        }
        let rest = &redacted[value_start..];
        let value_len = if let Some(quoted) = rest.strip_prefix('\'') {
            quoted.find('\'').map_or(rest.len(), |end| end + 2)
        } else {
            rest.find(['&', ' ', '\t', '\n']).unwrap_or(rest.len())
        };
        redacted.replace_range(value_start..value_start + value_len, "***");
        searched = value_start + 3;
    }
    redacted
}

/// Whether a driver error means the database could not be reached (the call may succeed
/// later) rather than that the SQL failed: a closed connection, an I/O error, a
/// connection-class SQLSTATE (`08...`) or the server shutting down (`57P01` admin
/// shutdown, `57P02` crash shutdown, `57P03` not accepting connections yet).
fn is_connection_failure(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(code) = error.code() {
        let code = code.code();
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    }
    std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>())
}

/// The driver error's innermost cause in words ("Connection refused (os error 111)").
fn cause(error: &tokio_postgres::Error) -> String {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let (outer, inner) = (error.to_string(), innermost.to_string());
    if outer.contains(&inner) { outer } else { format!("{outer}: {inner}") }
}

/// Maps a driver failure to `Unavailable` (the database could not be reached) or
/// `Backend` (the SQL failed), naming the step.
pub(crate) fn pg_error(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |source| {
        if is_connection_failure(&source) {
            Error::Unavailable { step, source: Box::new(source) }
        } else {
            Error::Backend { step, source: Box::new(source) }
        }
    }
}

/// A u64 as a Postgres BIGINT. No stored count, seq or timestamp comes near `i64::MAX`;
/// clamping keeps comparisons right without a conversion error.
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Begins a transaction (writes for a run check their fence inside it).
async fn begin(client: &mut Object) -> Result<Transaction<'_>> {
    client.transaction().await.map_err(pg_error("beginning a transaction"))
}

/// Commits, so that the caller's `Ok` means durable.
async fn commit(transaction: Transaction<'_>) -> Result<()> {
    transaction.commit().await.map_err(pg_error("committing a transaction")).map_err(outcome_unknown)
}

/// For a statement that commits (a `COMMIT`, or a write outside a transaction): a
/// connection lost meanwhile leaves the outcome unknown, so it is not `Unavailable` (which
/// promises that nothing was written and invites a retry, which could then write twice)
/// but `OutcomeUnknown`.
fn outcome_unknown(error: Error) -> Error {
    match error {
        Error::Unavailable { step, source } => Error::OutcomeUnknown { step, source },
        other => other,
    }
}

#[async_trait]
impl Store for PgStore {
    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        let client = self.client("creating a run").await?;
        writes::create_run(&client, run).await.map_err(outcome_unknown)
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>> {
        let client = self.client("reading a run").await?;
        queries::load_run(&client, id).await
    }

    async fn runs_ended_after(
        &self,
        tenant: &str,
        after_ms: u64,
        after_id: Option<&RunId>,
        limit: usize,
    ) -> Result<Vec<RunRecord>> {
        let client = self.client("listing runs that ended").await?;
        queries::runs_ended_after(&client, tenant, after_ms, after_id, limit).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let client = self.client("listing runs").await?;
        queries::list_runs(&client, filter).await
    }

    async fn cost_summary(&self, filter: &CostFilter) -> Result<Vec<CostBucket>> {
        let client = self.client("summing costs").await?;
        queries::cost_summary(&client, filter).await
    }

    async fn count_runs(&self) -> Result<Vec<RunCount>> {
        let client = self.client("counting runs").await?;
        queries::count_runs(&client).await
    }

    async fn update_run(&self, id: &RunId, expected: Option<RunState>, patch: RunPatch) -> Result<RunRecord> {
        let mut client = self.client("updating a run").await?;
        let transaction = begin(&mut client).await?;
        // An update that ends the run takes its lease row `FOR UPDATE` (see `checked_to_end`).
        let ending = patch.state.is_some_and(RunState::is_terminal);
        let update = writes::update_run(&transaction, id, expected, patch);
        let run = if ending {
            self.fences.checked_to_end(&transaction, id, update).await?
        } else {
            self.fences.checked(&transaction, id, update).await?
        };
        // An ended run's lease ends with it, in the same transaction: no node is ever left
        // holding a run that has nothing left to run.
        if run.state.is_terminal() {
            self.fences.end(&transaction, id).await?;
        }
        commit(transaction).await?;
        if run.state.is_terminal() {
            self.fences.release(id);
        }
        Ok(run)
    }

    async fn append_entry(&self, run: &RunId, entry: &NewEntry) -> Result<Seq> {
        let op = combine::JournalOp::Append(EncodedEntry::of(entry));
        let seqs = self.journal_write(run, op).await?;
        seqs.first().copied().ok_or_else(|| Error::Corrupt("an append wrote no entry".to_owned()))
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
        self.journal_write(run, combine::JournalOp::Complete { seq, completion, entries }).await
    }

    async fn abandon_entries(&self, run: &RunId, seqs: &[Seq]) -> Result<()> {
        let mut client = self.client("abandoning journal entries").await?;
        let transaction = begin(&mut client).await?;
        self.fences.check(&transaction, run).await?;
        writes::abandon_entries(&transaction, run, seqs).await?;
        commit(transaction).await?;
        Ok(())
    }

    async fn journal(&self, run: &RunId, after: Seq) -> Result<Vec<JournalEntry>> {
        let client = self.client("reading a journal").await?;
        queries::journal(&client, run, after).await
    }

    async fn latest_entry(&self, run: &RunId, method: &str) -> Result<Option<JournalEntry>> {
        let client = self.client("reading a journal").await?;
        queries::latest_entry(&client, run, method).await
    }

    async fn append_events(&self, run: &RunId, events: &[NewEvent]) -> Result<Seq> {
        // Committed without waiting for the flush (see the trait and `writes::append_events`):
        // the server writes the commit record in order, so a later durable commit covers
        // these too.
        let mut client = self.client("appending events").await?;
        if !self.fences.joined() {
            // Nothing to check: the statement is its own transaction, one round trip.
            return writes::append_events(&client, run, events).await.map_err(outcome_unknown);
        }
        let transaction = begin(&mut client).await?;
        let last =
            self.fences.checked(&transaction, run, writes::append_events(&transaction, run, events)).await?;
        commit(transaction).await?;
        Ok(last)
    }

    async fn events(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>> {
        let client = self.client("reading events").await?;
        queries::events(&client, run, after, limit).await
    }

    async fn kv_get(&self, scope: &str, key: &str) -> Result<Option<Value>> {
        let client = self.client("reading a kv value").await?;
        queries::kv_get(&client, scope, key).await
    }

    async fn kv_chain(&self, scope: &str, key: &str, link: &[&str], limit: usize) -> Result<Vec<Value>> {
        let client = self.client("reading a chain of kv values").await?;
        queries::kv_chain(&client, scope, key, link, limit).await
    }

    async fn kv_get_many(&self, keys: &[(String, String)]) -> Result<Vec<Option<Value>>> {
        let client = self.client("reading kv values").await?;
        queries::kv_get_many(&client, keys).await
    }

    async fn kv_put(&self, scope: &str, key: &str, value: Value) -> Result<()> {
        let client = self.client("writing a kv value").await?;
        writes::kv_put(&client, scope, key, &value.to_string(), true).await.map_err(outcome_unknown)
    }

    async fn kv_put_unflushed(&self, scope: &str, key: &str, value: Value) -> Result<()> {
        let client = self.client("writing a kv value").await?;
        writes::kv_put(&client, scope, key, &value.to_string(), false).await.map_err(outcome_unknown)
    }

    async fn thread_append(
        &self,
        tenant: &str,
        thread: &str,
        message: Value,
        idempotency_key: Option<&str>,
        appended_at_ms: u64,
    ) -> Result<u64> {
        let message = Blob::of(&message);
        let mut client = self.client("appending a thread message").await?;
        let transaction = begin(&mut client).await?;
        let index =
            writes::thread_append(&transaction, tenant, thread, &message, idempotency_key, appended_at_ms)
                .await?;
        commit(transaction).await?;
        Ok(index)
    }

    async fn thread_read(
        &self,
        tenant: &str,
        thread: &str,
        last: Option<usize>,
    ) -> Result<Vec<ThreadMessage>> {
        let client = self.client("reading a thread").await?;
        queries::thread_read(&client, tenant, thread, last).await
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
        let client = self.client("writing a memory record").await?;
        let record = writes::MemoryPut {
            tenant,
            namespace,
            key,
            value: &value.to_string(),
            text: &text,
            embedding: embedding.as_ref(),
            updated_at_ms,
        };
        writes::mem_put(&client, &record).await.map_err(outcome_unknown)
    }

    async fn mem_get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryRecord>> {
        let client = self.client("reading a memory record").await?;
        queries::mem_get(&client, tenant, namespace, key).await
    }

    async fn mem_delete(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
        idempotency_key: Option<&str>,
    ) -> Result<bool> {
        let mut client = self.client("deleting a memory record").await?;
        let transaction = begin(&mut client).await?;
        let deleted = writes::mem_delete(&transaction, tenant, namespace, key, idempotency_key).await?;
        commit(transaction).await?;
        Ok(deleted)
    }

    async fn mem_search(
        &self,
        tenant: &str,
        namespace: &str,
        search: &MemorySearch,
        limit: usize,
    ) -> Result<Vec<MemoryHit>> {
        let client = self.client("searching memory").await?;
        queries::mem_search(&client, tenant, namespace, search, limit).await
    }

    async fn mailbox_send(&self, to: &RunId, message: NewMessage) -> Result<Seq> {
        let text = message.message.to_string();
        let mut client = self.client("sending to a mailbox").await?;
        let transaction = begin(&mut client).await?;
        let seq = writes::mailbox_send(&transaction, to, &message, &text).await?;
        commit(transaction).await?;
        Ok(seq)
    }

    async fn mailbox_receive(
        &self,
        run: &RunId,
        idempotency_key: Option<&str>,
    ) -> Result<Option<MailboxMessage>> {
        let mut client = self.client("receiving from a mailbox").await?;
        let transaction = begin(&mut client).await?;
        self.fences.check(&transaction, run).await?;
        let message = writes::mailbox_receive(&transaction, run, idempotency_key).await?;
        commit(transaction).await?;
        Ok(message)
    }

    async fn journal_mailbox(
        &self,
        run: &RunId,
        entry: NewEntry,
        op: MailboxOp,
        result_of: MailboxResult,
    ) -> Result<Option<(Seq, MailboxDone)>> {
        let mut entry = EncodedEntry::of(&NewEntry { result: None, ..entry });
        let (op, receive) = match op {
            MailboxOp::Send { to, message, receive } => {
                let receive = receive.map(|receive| {
                    let WaitingReceive { entry, result_of } = *receive;
                    (EncodedEntry::of(&NewEntry { result: None, ..entry }), result_of)
                });
                (MailboxOp::Send { to, message, receive: None }, receive)
            }
            MailboxOp::Receive { max } => (MailboxOp::Receive { max }, None),
        };
        let mut client = self.client("journaling a mailbox write").await?;
        let unstored = self.chain_ends.unstored(&client, &entry.params_chain).await?.to_vec();
        let (receive_chain, receive_unstored) = match &receive {
            Some((receive, _)) => (
                receive.params_chain.clone(),
                self.chain_ends.unstored(&client, &receive.params_chain).await?.to_vec(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let transaction = begin(&mut client).await?;
        let tx = &transaction;
        let fences = &self.fences;
        let write = async move {
            let done = match op {
                MailboxOp::Send { to, message, .. } => {
                    let text = message.message.to_string();
                    // The receiver's lease too, before any run's row (the order every
                    // write takes them in); a receiver this node no longer holds takes
                    // nothing, and the send goes on alone.
                    let receive = match receive {
                        Some(receive) => match fences.check(tx, &to).await {
                            Ok(()) => Some(receive),
                            Err(Error::Fenced { .. } | Error::Refused(_)) => None,
                            Err(err) => return Err(err),
                        },
                        None => None,
                    };
                    // Both run rows, in id order: two runs sending to each other at once then
                    // wait for one another instead of deadlocking.
                    let tenants = writes::lock_runs(tx, &[run, &to]).await?;
                    let owner = tenants.get(to.as_str()).map(String::as_str);
                    let seq = writes::mailbox_send_locked(tx, &to, owner, &message, &text).await?;
                    match receive {
                        Some((receive, receive_result)) => {
                            writes::take_for_receiver(
                                tx,
                                &to,
                                seq,
                                receive,
                                &receive_unstored,
                                receive_result,
                            )
                            .await?
                        }
                        None => MailboxDone::Sent(seq),
                    }
                }
                MailboxOp::Receive { max } => {
                    let taken = writes::mailbox_receive_many(tx, run, max).await?;
                    if taken.is_empty() {
                        return Ok(None);
                    }
                    MailboxDone::Received(taken)
                }
            };
            entry.result = Some(Blob::of(&result_of(&done)));
            let seq = writes::append_entry(tx, run, &entry, &unstored).await?;
            Ok(Some((seq, done, entry)))
        };
        // Nothing taken, nothing written: the transaction rolls back on drop.
        let Some((seq, done, entry)) = self.fences.checked(tx, run, write).await? else { return Ok(None) };
        commit(transaction).await?;
        self.chain_ends.committed(&entry.params_chain);
        if matches!(done, MailboxDone::SentAndTaken { .. }) {
            self.chain_ends.committed(&receive_chain);
        }
        Ok(Some((seq, done)))
    }

    fn completes_waiting_receives(&self) -> bool {
        true
    }

    async fn mailbox_len(&self, run: &RunId) -> Result<u64> {
        let client = self.client("counting a mailbox").await?;
        queries::mailbox_len(&client, run).await
    }

    async fn topic_subscribe(&self, tenant: &str, topic: &str, run: &RunId, subscribe: bool) -> Result<()> {
        let mut client = self.client("changing a topic subscription").await?;
        let transaction = begin(&mut client).await?;
        self.fences.check(&transaction, run).await?;
        writes::topic_subscribe(&transaction, tenant, topic, run, subscribe).await?;
        commit(transaction).await?;
        Ok(())
    }

    async fn topic_publish(&self, topic: &str, message: NewMessage) -> Result<Vec<(RunId, Seq)>> {
        let text = message.message.to_string();
        let mut client = self.client("publishing to a topic").await?;
        let transaction = begin(&mut client).await?;
        let delivered = writes::topic_publish(&transaction, topic, &message, &text).await?;
        commit(transaction).await?;
        Ok(delivered)
    }

    async fn audit_append(&self, records: Vec<AuditRecord>) -> Result<Vec<Seq>> {
        let mut client = self.client("appending to the audit log").await?;
        let transaction = begin(&mut client).await?;
        // Committed without waiting for the flush, as events are (see the trait and
        // `audit::append`).
        let seqs = audit::append(&transaction, &records).await?;
        commit(transaction).await?;
        Ok(seqs)
    }

    async fn audit_list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        let client = self.client("listing audit entries").await?;
        audit::list(&client, filter).await
    }

    async fn audit_verify(&self) -> Result<AuditVerify> {
        let mut client = self.client("verifying the audit log").await?;
        audit::verify(&mut client).await
    }

    async fn tenant_create(&self, tenant: TenantRecord) -> Result<()> {
        let client = self.client("creating a tenant").await?;
        tenants::create_tenant(&client, &tenant).await.map_err(outcome_unknown)
    }

    async fn tenant_get(&self, name: &str) -> Result<Option<TenantRecord>> {
        let client = self.client("reading a tenant").await?;
        tenants::get_tenant(&client, name).await
    }

    async fn tenant_list(&self) -> Result<Vec<TenantRecord>> {
        let client = self.client("listing tenants").await?;
        tenants::list_tenants(&client).await
    }

    async fn trigger_create(&self, trigger: crate::TriggerRecord) -> Result<()> {
        let client = self.client("creating a trigger").await?;
        triggers::create(&client, &trigger).await.map_err(outcome_unknown)
    }

    async fn trigger_get(&self, kind: &str, name: &str) -> Result<Option<crate::TriggerRecord>> {
        let client = self.client("reading a trigger").await?;
        triggers::get(&client, kind, name).await
    }

    async fn trigger_list(&self, kind: &str, tenant: Option<&str>) -> Result<Vec<crate::TriggerRecord>> {
        let client = self.client("listing triggers").await?;
        triggers::list(&client, kind, tenant).await
    }

    async fn trigger_set_paused(&self, kind: &str, name: &str, paused: bool, since_ms: u64) -> Result<bool> {
        let client = self.client("pausing or resuming a trigger").await?;
        triggers::set_paused(&client, kind, name, paused, since_ms).await.map_err(outcome_unknown)
    }

    async fn trigger_update(&self, kind: &str, name: &str, tenant: &str, spec: &Value) -> Result<bool> {
        let client = self.client("updating a trigger").await?;
        triggers::update(&client, kind, name, tenant, &spec.to_string()).await.map_err(outcome_unknown)
    }

    async fn trigger_delete(&self, kind: &str, name: &str) -> Result<bool> {
        let client = self.client("deleting a trigger").await?;
        triggers::delete(&client, kind, name).await.map_err(outcome_unknown)
    }

    async fn trigger_fire(&self, fire: crate::FireRecord) -> Result<(crate::FireRecord, bool)> {
        let client = self.client("recording a trigger's fire").await?;
        triggers::fire(&client, fire).await.map_err(outcome_unknown)
    }

    async fn trigger_fire_settle(
        &self,
        kind: &str,
        trigger: &str,
        occasion: &str,
        outcome: &str,
        detail: Option<&str>,
    ) -> Result<()> {
        let client = self.client("settling a trigger's fire").await?;
        triggers::settle(&client, kind, trigger, occasion, outcome, detail).await.map_err(outcome_unknown)
    }

    async fn trigger_fires(&self, kind: &str, trigger: &str, limit: usize) -> Result<Vec<crate::FireRecord>> {
        let client = self.client("listing a trigger's fires").await?;
        triggers::fires(&client, kind, trigger, limit).await
    }

    async fn trigger_fires_unstarted(&self, kind: &str) -> Result<Vec<crate::FireRecord>> {
        let client = self.client("listing fires whose run was never created").await?;
        triggers::unstarted(&client, kind).await
    }

    async fn token_create(&self, token: ApiTokenRecord) -> Result<()> {
        let client = self.client("creating an API token").await?;
        tenants::create_token(&client, &token).await.map_err(outcome_unknown)
    }

    async fn token_lookup(&self, hash: &str) -> Result<Option<ApiTokenRecord>> {
        let client = self.client("looking up an API token").await?;
        tenants::lookup_token(&client, hash).await
    }

    async fn token_list(&self, tenant: &str) -> Result<Vec<ApiTokenRecord>> {
        let client = self.client("listing API tokens").await?;
        tenants::list_tokens(&client, tenant).await
    }

    async fn token_revoke(&self, tenant: &str, prefix: &str) -> Result<u64> {
        let client = self.client("revoking API tokens").await?;
        tenants::revoke_tokens(&client, tenant, prefix).await.map_err(outcome_unknown)
    }

    async fn stats(&self) -> Result<StoreStats> {
        let client = self.client("counting rows").await?;
        queries::stats(&client).await
    }

    async fn dump(&self, sink: tokio::sync::mpsc::Sender<Vec<DumpItem>>) -> Result<()> {
        let mut client = self.client("dumping the store").await?;
        dump::dump(&mut client, &sink).await
    }

    async fn restore(&self, items: Vec<DumpItem>) -> Result<()> {
        let mut client = self.client("restoring a dump").await?;
        let transaction = begin(&mut client).await?;
        dump::restore(&transaction, items).await?;
        commit(transaction).await?;
        Ok(())
    }

    async fn is_empty(&self) -> Result<bool> {
        let client = self.client("checking the store is empty").await?;
        dump::is_empty(&client).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_in_every_url_form() {
        assert_eq!(redact_url("postgres://keel:s3cret@db:5432/keel"), "postgres://keel:***@db:5432/keel");
        assert_eq!(redact_url("postgresql://keel:p@ss@db/keel?x=1"), "postgresql://keel:***@db/keel?x=1");
        assert_eq!(redact_url("postgres://keel@db/keel"), "postgres://keel@db/keel");
        assert_eq!(redact_url("postgres://db/keel"), "postgres://db/keel");
        assert_eq!(
            redact_url("postgres://db/keel?user=k&password=s3cret&sslmode=disable"),
            "postgres://db/keel?user=k&password=***&sslmode=disable"
        );
        assert_eq!(
            redact_url("host=db user=keel password=s3cret dbname=keel"),
            "host=db user=keel password=*** dbname=keel"
        );
        assert_eq!(redact_url("host=db password='a b c' dbname=k"), "host=db password=*** dbname=k");
        assert_eq!(redact_url("host=db oldpassword=x"), "host=db oldpassword=x");
    }
}
