//! The kernel handle: [`Kernel`] (cheap to clone), what it is built from
//! ([`KernelOptions`]), starting it, and its public API. Everything else in the crate is
//! `pub(crate)`: the methods here are the kernel's whole surface.

mod a2a;
mod agui;
mod audit;
mod cluster;
mod console;
mod declared;
mod event_triggers;
mod gateway;
mod hooks;
mod metrics;
mod queries;
mod schedules;
mod status;
mod tenants;
mod triggers;

pub use a2a::{A2aAnswer, A2aStream};
pub use agui::{AguiIds, AguiStream};
pub use console::{RunChange, RunChanges};
pub use declared::{DeclaredChanges, DeclaredTriggers};
pub use hooks::MAX_HOOK_BODY;
pub use queries::{AuditQuery, RunQuery, RunSort};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_llm::Provider;
use keel_protocol::api::{
    AuditEntryView, AuditVerifyView, CreateRunParams, EventsPage, ExecParams, ExecView, InspectView,
    MemoryRecordView, RunView, ToolView,
};
use keel_protocol::rpc::HumanAskParams;
use keel_protocol::{EventKind, EventKinds};
use keel_sandbox::Sandbox;
use keel_store::{AuditFilter, RunFilter, RunRecord, Seq, Store};
use keel_types::{RunId, RunState, WaitReason};
use serde_json::Value;

use crate::events::{EventLog, EventStream};
use crate::llmqueue::LlmQueues;
use crate::run::{Command, LiveRun, RunSpec};
use crate::tenants::Principal;
use crate::{DataDir, Error, LockedDataDir, Result, lock, views};

/// How a kernel is set up.
pub struct KernelOptions {
    /// The data directory, locked by this process (see [`DataDir::lock`]).
    pub data_dir: LockedDataDir,
    /// The store, chosen and opened by the binary (after it took the data directory's
    /// lock, when the store lives inside it).
    pub store: Arc<dyn Store>,
    pub sandbox: Arc<dyn Sandbox>,
    /// Seconds between SIGTERM and SIGKILL on stop, unless the run sets its own.
    pub default_stop_grace: Duration,
    /// The scripted provider's script for runs that bring none (`keel serve
    /// --llm-script`). Copied into each run's spec when it is created, so a later change
    /// of the kernel's configuration never changes what a recovering run replays against.
    pub default_llm_script: Option<Value>,
    /// Where the provider-compatible gateway listens on loopback (for agents outside a
    /// sandbox); sandboxed agents reach it through `DataDir::gateway_socket`.
    pub gateway_addr: Option<std::net::SocketAddr>,
    /// The model providers (from keel.toml or the kernel's environment); each run gets
    /// `for_run` of it, with its own script, model and fallbacks.
    pub llm: keel_llm::Router,
    /// What the egress proxies of `allowlist` runs share: credentials they inject,
    /// `egress.resolve` overrides, the Keel CA (from the `[egress]` table of keel.toml).
    pub egress: Arc<keel_sandbox::egress::EgressSettings>,
    /// The `[tools]` table of keel.toml: command tools, MCP servers, agents as tools and
    /// policy overrides.
    pub tools: keel_tools::config::ToolsConfig,
    /// The `[[agents]]` of keel.toml: those with `a2a = true` are served over A2A.
    pub agents: crate::agents::AgentsConfig,
    /// How to start an interpreter worker (`keel` itself with a hidden argument); `None`
    /// leaves `code.exec` for python/javascript unavailable, saying so.
    pub interp_worker: Option<keel_interp::WorkerCommand>,
    /// Swap out runs that have waited this long for something durable (see `swap.rs`);
    /// `None` keeps every waiting agent resident.
    pub swap_after: Option<Duration>,
    /// How many swapped-out runs' agents start at once when many wake together.
    pub swap_in: crate::SwapIn,
    /// The `[scheduler]` table of keel.toml: caps on live runs, the queue, aging, weights.
    pub scheduler: crate::admission::SchedulerConfig,
    /// Membership of a cluster of nodes sharing the store (`keel serve --store
    /// postgres://...`), already joined; `None` for a kernel alone with its store.
    pub cluster: Option<ClusterMember>,
    /// OpenTelemetry export (`Telemetry::from_env`), or `Telemetry::disabled()`.
    pub telemetry: crate::Telemetry,
}

/// This kernel as one node of a cluster: its membership and how often it must renew it.
#[derive(Clone)]
pub struct ClusterMember {
    pub cluster: Arc<dyn keel_store::cluster::Cluster>,
    /// The lifetime of a heartbeat; renewed every third of it.
    pub lease_ttl: Duration,
}

/// The kernel. Cheap to clone; every clone is the same kernel.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) data_dir: DataDir,
    pub(crate) default_stop_grace: Duration,
    pub(crate) default_llm_script: Option<Value>,
    pub(crate) gateway_addr: Option<std::net::SocketAddr>,
    pub(crate) llm: keel_llm::Router,
    pub(crate) egress: Arc<keel_sandbox::egress::EgressSettings>,
    pub(crate) live: Mutex<HashMap<RunId, Arc<LiveRun>>>,
    pub(crate) tokens: Mutex<HashMap<String, Arc<LiveRun>>>,
    /// Tokens of agents being launched, until their run is in `tokens` (see `try_launch`).
    pub(crate) launching: Mutex<HashMap<String, tokio::sync::watch::Receiver<Option<Arc<LiveRun>>>>>,
    /// Tokens of `code.exec` programs running as `cpython`: their run and the seq of
    /// their `code.exec`.
    pub(crate) exec_tokens: Mutex<HashMap<String, (Arc<LiveRun>, Seq)>>,
    /// One lock per run, serialising its lifecycle changes so that read-decide-write
    /// never races; runs do not wait for each other.
    pub(crate) transitions: Mutex<HashMap<RunId, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) events: EventLog,
    pub(crate) shutting_down: AtomicBool,
    /// Set by `drain`: no new syscall starts, and no new run is taken.
    pub(crate) draining: AtomicBool,
    /// Fired by `request_drain` (`POST /v1/drain`); the binary serving the node drains it.
    pub(crate) drain_requested: tokio::sync::Notify,
    /// Wake-ups for mailbox waiters (see `crate::syscall::ipc`).
    pub(crate) mailboxes: crate::mailboxes::Mailboxes,
    /// The AG-UI streams watching runs' LLM calls live (see `crate::deltas`).
    pub(crate) live_deltas: Arc<crate::deltas::LiveDeltas>,
    /// Admission control (caps on live runs, the queue).
    pub(crate) admissions: crate::admission::Admissions,
    /// Among several nodes with caps: another node said a queued run may start (see
    /// `Kernel::pull_queued`).
    pub(crate) pull_wanted: tokio::sync::Notify,
    /// Queued runs given a slot, to launch (served by one background task).
    pub(crate) launches: tokio::sync::mpsc::UnboundedSender<RunId>,
    /// Swapped-out runs to bring back (served by one background task).
    pub(crate) wakeups: tokio::sync::mpsc::UnboundedSender<RunId>,
    /// Runs whose descendants are to be stopped (served by one background task).
    pub(crate) stop_trees: tokio::sync::mpsc::UnboundedSender<(RunId, Option<Duration>)>,
    /// Fired whenever a run ends; `proc.wait` listens to it.
    pub(crate) run_ended: tokio::sync::Notify,
    /// A schedule was created or resumed: the schedule loop looks again at once.
    pub(crate) schedules_changed: tokio::sync::Notify,
    /// Event triggers' fires in flight, and whether this kernel starts their runs.
    pub(crate) event_firing: event_triggers::EventFiring,
    /// The most undelivered messages a run's mailbox holds (`KEEL_MAILBOX_CAPACITY`).
    pub(crate) mailbox_capacity: u64,
    /// Turns for woken runs' agents to start in: `SwapIn::at_once` permits, each held for
    /// at most `swap_in_hold` (see `SwapIn`).
    pub(crate) swap_in_turns: Arc<tokio::sync::Semaphore>,
    pub(crate) swap_in_hold: Duration,
    /// Every tool the kernel knows (built-ins, keel.toml's, mounted MCP servers').
    pub(crate) tools: crate::tools::Registry,
    /// keel.toml's `[[agents]]` (the A2A server's).
    pub(crate) agents: crate::agents::AgentsConfig,
    /// Interpreter workers for `code.exec`.
    pub(crate) interp: Option<keel_interp::Pool>,
    /// This node's cluster membership, when it shares its store with other nodes.
    pub(crate) cluster: Option<ClusterMember>,
    /// The cluster's shared secret (see `Cluster::secret`), with `cluster`.
    pub(crate) cluster_secret: Option<String>,
    /// The Prometheus instruments (`GET /metrics`).
    pub(crate) metrics: crate::metrics::Metrics,
    /// Traces and GenAI metrics over OTLP (a no-op unless configured).
    pub(crate) telemetry: crate::Telemetry,
    /// Held for the kernel's life; dropping it releases the data directory.
    pub(crate) _lock: LockedDataDir,
}

impl Kernel {
    /// Lists the runs that were live when the previous kernel stopped, then brings them
    /// back in the background (so the API answers, and shows `recovering` runs, while a
    /// large backlog is relaunched). Call it once the sockets agents use (the gateway's)
    /// are listening, since relaunched agents connect at once, and before runs can be
    /// created: the listing is taken before this returns, so a run created afterwards is
    /// never mistaken for an interrupted one. The daemon recovers; the kernel embedded in
    /// a foreground `keel run` does not (the runs would end with it).
    pub async fn start_recovery(&self) -> Result<()> {
        // A node of a cluster recovers only what it claims (its own runs from before a
        // restart among them): see `run/cluster.rs`.
        if self.inner.cluster.is_some() {
            return Ok(());
        }
        let interrupted = self.interrupted_runs().await?;
        let kernel = self.clone();
        tokio::spawn(async move {
            if let Err(err) = kernel.recover_all(interrupted).await {
                tracing::error!("recovery of interrupted runs stopped: {err}");
            }
        });
        Ok(())
    }

    /// Opens the data directory (taking its exclusive lock), the store and the syscall
    /// socket. Recovery of interrupted runs is separate: [`Kernel::start_recovery`].
    pub async fn start(options: KernelOptions) -> Result<Kernel> {
        let dir = options.data_dir.dir().clone();
        let dir_error = |source| Error::DataDir { dir: dir.root().display().to_string(), source };
        crate::sdk::unpack(&dir).await.map_err(dir_error)?;
        let store = options.store;
        let events = EventLog::start(store.clone());
        let (stop_trees, mut stop_requests) = tokio::sync::mpsc::unbounded_channel();
        let (wakeups, mut wake_requests) = tokio::sync::mpsc::unbounded_channel::<RunId>();
        let (launches, mut launch_requests) = tokio::sync::mpsc::unbounded_channel::<RunId>();
        let admissions = crate::admission::Admissions::new(&options.scheduler, options.cluster.is_some());
        let swap_after = options.swap_after;
        let cluster_secret = match &options.cluster {
            Some(member) => Some(member.cluster.secret().await?),
            None => None,
        };
        let kernel = Kernel {
            inner: Arc::new(Inner {
                store,
                sandbox: options.sandbox,
                data_dir: dir,
                default_stop_grace: options.default_stop_grace,
                default_llm_script: options.default_llm_script,
                gateway_addr: options.gateway_addr,
                llm: options.llm,
                egress: options.egress,
                live: Mutex::default(),
                tokens: Mutex::default(),
                launching: Mutex::default(),
                exec_tokens: Mutex::default(),
                transitions: Mutex::default(),
                events,
                shutting_down: AtomicBool::new(false),
                draining: AtomicBool::new(false),
                drain_requested: tokio::sync::Notify::new(),
                mailboxes: crate::mailboxes::Mailboxes::default(),
                live_deltas: Arc::default(),
                run_ended: tokio::sync::Notify::new(),
                schedules_changed: tokio::sync::Notify::new(),
                event_firing: Default::default(),
                stop_trees,
                wakeups,
                admissions,
                pull_wanted: tokio::sync::Notify::new(),
                launches,
                mailbox_capacity: crate::mailboxes::capacity_from_env(),
                swap_in_turns: Arc::new(tokio::sync::Semaphore::new(options.swap_in.at_once.max(1))),
                swap_in_hold: options.swap_in.hold,
                tools: crate::tools::Registry::new(options.tools),
                agents: options.agents,
                interp: options
                    .interp_worker
                    .map(|worker| keel_interp::Pool::new(keel_interp::PoolConfig { worker, size: 2 })),
                cluster: options.cluster,
                cluster_secret,
                metrics: crate::metrics::Metrics::new(),
                telemetry: options.telemetry,
                _lock: options.data_dir,
            }),
        };
        crate::syscall::listen(kernel.clone())?;
        let launcher = kernel.clone();
        tokio::spawn(async move {
            while let Some(run) = launch_requests.recv().await {
                launcher.launch_queued(&run).await;
            }
        });
        let waker = kernel.clone();
        tokio::spawn(async move {
            while let Some(run) = wake_requests.recv().await {
                waker.wake_swapped(&run).await;
            }
        });
        if let Some(threshold) = swap_after {
            kernel.spawn_swapper(threshold);
        }
        kernel.spawn_cluster_duties();
        let stopper = kernel.clone();
        tokio::spawn(async move {
            while let Some((run, grace)) = stop_requests.recv().await {
                stopper.stop_descendants(&run, grace).await;
            }
        });
        Ok(kernel)
    }

    pub fn data_dir(&self) -> &DataDir {
        &self.inner.data_dir
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Names of the configured model providers (`openai`, `anthropic`, ...).
    pub fn llm_provider_names(&self) -> Vec<String> {
        self.inner.llm.provider_names()
    }

    pub fn sandbox_tier(&self) -> &'static str {
        self.inner.sandbox.tier()
    }

    /// Stops serving: agents are killed, runs keep their state so the next kernel
    /// recovers them. Waits until pending events are written.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let live: Vec<Arc<LiveRun>> = lock(&self.inner.live).values().cloned().collect();
        for run in live {
            run.kill_tree();
        }
        self.inner.sandbox.shutdown().await;
        self.inner.tools.close().await;
        self.inner.events.flush().await;
        self.inner.telemetry.shutdown().await;
        // Among several nodes, the others take this node's runs over at once (by
        // replay) rather than after its heartbeat lapses.
        if let Some(member) = &self.inner.cluster
            && let Err(err) = member.cluster.leave().await
        {
            tracing::warn!(
                "could not hand this node's runs over (the others take them when its heartbeat lapses): {err}"
            );
        }
        let _ = std::fs::remove_file(self.inner.data_dir.syscall_socket());
    }

    /// Acts on an operator command; returns the run's record as it is afterwards.
    pub(crate) async fn act(&self, command: Command) -> Result<RunRecord> {
        match command {
            Command::Create(request) => self.create(request).await,
            Command::Pause(run) => self.pause(&run).await,
            Command::Resume(run) => self.resume(&run).await,
            Command::Stop { run, grace } => self.stop(&run, grace).await,
            Command::Answer { run, answer } => self.answer(&run, answer).await,
            Command::TopUp { run, add, continue_loop } => self.top_up(&run, add, continue_loop).await,
            Command::Decide { run, call, approve, note } => self.decide(&run, call, approve, note).await,
        }
    }

    pub(crate) async fn get(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.store.get_run(run).await?.ok_or_else(|| Error::RunNotFound(run.clone()))
    }

    pub(crate) async fn list(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        Ok(self.inner.store.list_runs(filter).await?)
    }

    /// How many syscalls of the run's live agent are being served now (0 when it has no
    /// live agent here), waits included: a receive waiting for a message, a send waiting
    /// for room. For diagnostics and tests; nothing of it is journaled.
    pub fn calls_in_flight(&self, run: &RunId) -> usize {
        self.live(run).map_or(0, |live| live.inflight.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Whether a receive of the run's live agent is on offer to senders: waiting on an
    /// empty mailbox, to be completed in the commit of the next send to it (see
    /// `syscall/ipc.rs`). For diagnostics and tests.
    pub fn receive_on_offer(&self, run: &RunId) -> bool {
        self.inner.mailboxes.on_offer(run)
    }

    /// The open `human.ask` question of a waiting or paused run (with its form, if any).
    async fn open_question(&self, run: &RunId) -> Result<Option<HumanAskParams>> {
        if let Some(live) = self.live(run)
            && let Some(ask) = lock(&live.ask).as_ref()
        {
            return Ok(Some(ask.question.clone()));
        }
        Ok(self.pending_ask_entry(run).await?.map(|(_, question)| question))
    }

    pub(crate) fn emit(&self, run: &RunId, kind: EventKind, data: Value) {
        self.inner.events.emit(run, kind, data);
    }

    /// The calls waiting for every configured provider now.
    fn llm_queues(&self) -> LlmQueues {
        LlmQueues::new(self.inner.llm.waiting_calls())
    }
}

/// Operators talking to runs (the HTTP API's messages and signals).
impl Kernel {
    /// An operator's named signal (`keel signal`, `POST /v1/runs/{id}/signal`).
    pub async fn signal_run(
        &self,
        tenant: &str,
        run: &RunId,
        signal: &str,
        data: Value,
    ) -> Result<Value, keel_protocol::rpc::RpcError> {
        self.signal_run_syscall(tenant, run, signal, data).await.map_err(Into::into)
    }

    /// An operator's message to a run (the HTTP API and `keel send`), with the checks of
    /// `ipc.send`; not journaled (there is no sending run). Answers `{"seq": n}`.
    pub async fn send_message(
        &self,
        tenant: &str,
        params: Value,
    ) -> Result<Value, keel_protocol::rpc::RpcError> {
        self.send_message_syscall(tenant, params).await.map_err(Into::into)
    }
}

/// Memory and tools outside any run (the HTTP API, `keel mem`, `keel tools`).
impl Kernel {
    /// A memory call from outside any run (the HTTP API and `keel mem`): the same params,
    /// checks and answers as the `mem.*` syscall `method`, for `tenant`. Not journaled:
    /// there is no run to replay.
    pub async fn memory(
        &self,
        tenant: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, keel_protocol::rpc::RpcError> {
        self.memory_syscall(tenant, method, params).await.map_err(Into::into)
    }

    /// A whole record (value, indexed text, time) for the HTTP API, with the checks of
    /// `mem.get`; `None` when there is none.
    pub async fn memory_record(
        &self,
        tenant: &str,
        namespace: &str,
        key: &str,
    ) -> Result<Option<MemoryRecordView>, keel_protocol::rpc::RpcError> {
        let record = self.memory_record_syscall(tenant, namespace, key).await?;
        Ok(record.map(|record| MemoryRecordView {
            namespace: record.namespace,
            key: record.key,
            value: record.value,
            text: record.text,
            updated_at_ms: record.updated_at_ms,
        }))
    }

    /// `GET /v1/tools`.
    pub async fn tool_views(&self) -> Vec<ToolView> {
        self.inner.tools.views().await
    }
}

/// The runs: what the HTTP API and the CLI see of them. Every answer is a view of
/// `keel_protocol::api`, never a store record.
impl Kernel {
    /// Acts on an operator command; returns the run as it is afterwards.
    pub async fn execute(&self, command: Command) -> Result<RunView> {
        let record = self.act(command).await?;
        self.view(&record).await
    }

    /// Starts a run for `principal` (within its tenant's quotas).
    pub async fn create_run_for(&self, principal: &Principal, params: CreateRunParams) -> Result<RunView> {
        let record = self.create_within_quota(principal, params).await?;
        self.view(&record).await
    }

    /// A run as `principal` sees it (another tenant's run is `RunNotFound`, like a
    /// missing one).
    pub async fn run(&self, principal: &Principal, run: &RunId) -> Result<RunView> {
        let record = self.run_for(principal, run).await?;
        self.view(&record).await
    }

    /// Whether `principal` may see and act on `run`: `RunNotFound` when not (another
    /// tenant's run answers like a missing one).
    pub async fn authorize(&self, principal: &Principal, run: &RunId) -> Result<()> {
        self.run_for(principal, run).await.map(drop)
    }

    /// The tenant a run belongs to (for an operator acting on it).
    pub async fn tenant_of(&self, run: &RunId) -> Result<String> {
        Ok(self.get(run).await?.tenant)
    }

    /// Runs in the query's order (newest first by default), within what `principal` may
    /// see; the filtering, ordering and paging happen in the store's query.
    pub async fn runs(&self, principal: &Principal, query: &RunQuery) -> Result<Vec<RunView>> {
        if let Some(tenant) = &query.tenant {
            crate::tenants::validate_name(tenant)?;
        }
        let tenant = principal.listing(query.tenant.as_deref())?;
        let filter = RunFilter {
            states: query.states.clone(),
            limit: query.limit,
            tenant,
            text: query.text.clone().filter(|text| !text.is_empty()),
            order: query.sort.order(),
            offset: query.offset,
        };
        let records = self.list(&filter).await?;
        self.views(&records).await
    }

    /// A run with its journal and the calls waiting for an operator.
    pub async fn inspect(&self, principal: &Principal, run: &RunId) -> Result<InspectView> {
        let record = self.run_for(principal, run).await?;
        let journal = self.inner.store.journal(run, 0).await?;
        Ok(InspectView {
            run: self.view(&record).await?,
            journal: journal.iter().map(views::journal_entry).collect(),
            approvals: self.pending_approvals(run),
        })
    }

    /// A run's events of `kinds` after `after`; with `follow`, waiting for new ones until
    /// the run has ended and its last event was delivered (or passed over).
    pub async fn events(
        &self,
        run: &RunId,
        after: Seq,
        follow: bool,
        kinds: EventKinds,
    ) -> Result<EventStream> {
        self.get(run).await?;
        let stream =
            EventStream::new(self.inner.store.clone(), &self.inner.events, run.clone(), after, follow);
        Ok(stream.with_kinds(kinds))
    }

    /// One page of a run's events of `kinds`, without following: at most `limit`, read
    /// on past the events of other kinds until there are `limit` or there are no more;
    /// `complete` once the run has ended and the page holds the rest of its events.
    pub async fn events_page(
        &self,
        run: &RunId,
        mut after: Seq,
        limit: usize,
        kinds: EventKinds,
    ) -> Result<EventsPage> {
        let record = self.get(run).await?;
        let mut events = Vec::new();
        loop {
            let page = self.inner.store.events(run, after, limit).await?;
            let more = page.len() == limit;
            after = page.last().map_or(after, |event| event.seq);
            events.extend(page.into_iter().filter(|event| kinds.contains_name(&event.kind)));
            if !more || events.len() >= limit {
                break;
            }
        }
        let complete = record.state.is_terminal() && events.len() < limit;
        events.truncate(limit);
        Ok(EventsPage { events: events.into_iter().map(views::event).collect(), complete })
    }

    /// Audit entries in seq order, within what `principal` may see.
    pub async fn audit_list(&self, principal: &Principal, query: &AuditQuery) -> Result<Vec<AuditEntryView>> {
        let filter = AuditFilter {
            tenant: principal.listing(None)?,
            run_id: query.run.clone(),
            after_seq: query.after,
            limit: Some(query.limit),
        };
        Ok(self.audit_entries(&filter).await?.iter().map(views::audit_entry).collect())
    }

    /// Recomputes every hash of the audit log (the operator's: one chain over every
    /// tenant).
    pub async fn audit_verify(&self, principal: &Principal) -> Result<AuditVerifyView> {
        principal.require_admin("verifying the audit log (one chain over every tenant)")?;
        Ok(views::audit_verify(&self.audit_check().await?))
    }

    /// `POST /v1/exec` / `keel exec`: one program, run as a run of its own (so its tool
    /// calls are journaled, budgeted and audited like any), answered when it ends.
    pub async fn exec(&self, params: ExecParams) -> Result<ExecView> {
        self.exec_program(params).await
    }

    /// A run's view: its record, its open question, its budget and why it waits (a
    /// budget, an approval, a live slot, its place in an LLM queue).
    async fn view(&self, record: &RunRecord) -> Result<RunView> {
        let mut views = self.views(std::slice::from_ref(record)).await?;
        Ok(views.pop().expect("one view per record"))
    }

    /// The views of several runs, reading what the records lack (the runs' budget
    /// top-ups) in one read for all of them. The LLM queues are looked at once, and only
    /// if some run has no other reason to show.
    async fn views(&self, records: &[RunRecord]) -> Result<Vec<RunView>> {
        let queues = std::cell::OnceCell::new();
        // A spec that does not parse still lists the run (without command, parent or
        // budget); acting on it reports the bad spec.
        let specs: Vec<_> = records.iter().map(|record| RunSpec::of(record).ok()).collect();
        let budgets = self.budget_views(records, &specs).await?;
        let mut views = Vec::with_capacity(records.len());
        for ((record, spec), budget) in records.iter().zip(&specs).zip(budgets) {
            // Only a run waiting for a person (or paused, which keeps what it waited for)
            // can have a question open: one waiting for a message, its children, a
            // budget or an approval is not searched for one in its journal.
            let asking = matches!(record.state, RunState::Waiting | RunState::Paused)
                && matches!(record.wait_reason, Some(WaitReason::Human) | None);
            let question = if asking { self.open_question(&record.id).await? } else { None };
            let mut view = views::run(record, spec.as_ref(), question);
            view.budget = budget;
            view.reason = self
                .budget_reason(&record.id)
                .or_else(|| self.approval_reason(&record.id))
                .or_else(|| self.queue_reason(&record.id))
                // Among several nodes, a run queued through another node may not be in the
                // ledger as this node last read it.
                .or_else(|| {
                    (record.state == RunState::Queued).then(|| "queued: waiting for a live slot".to_owned())
                })
                .or_else(|| queues.get_or_init(|| self.llm_queues()).reason(&record.id));
            views.push(view);
        }
        Ok(views)
    }
}
