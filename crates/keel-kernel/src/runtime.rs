//! The kernel runtime: the registry of live runs, lifecycle changes (decided by
//! `keel_core::lifecycle`, persisted with a compare-and-set), launching agents, watching
//! them exit, operator commands and recovery after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use keel_core::lifecycle::{self, Command as Lifecycle};
use keel_core::replay::{RecordedCall, ReplayMatcher};
use keel_llm::{Provider, ScriptedProvider};
use keel_protocol::api::CreateRunParams;
use keel_sandbox::{KeelResources, LaunchSpec, Sandbox, tree};
use keel_store::{
    Completion, EventRecord, JournalEntry, NewRun, RunFilter, RunPatch, RunRecord, Seq, SqliteStore, Store,
};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::oneshot;

use crate::events::{EventLog, EventStream};
use crate::lock;
use crate::{DataDir, Error, Result};

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How a kernel is set up.
pub struct KernelOptions {
    pub data_dir: DataDir,
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
    /// How to start an interpreter worker (`keel` itself with a hidden argument); `None`
    /// leaves `code.exec` for python/javascript unavailable, saying so.
    pub interp_worker: Option<keel_interp::WorkerCommand>,
    /// Swap out runs that have waited this long for something durable (see `swap.rs`);
    /// `None` keeps every waiting agent resident.
    pub swap_after: Option<Duration>,
    /// The `[scheduler]` table of keel.toml: caps on live runs, the queue, aging, weights.
    pub scheduler: crate::admission::SchedulerConfig,
}

/// A request to start a run, validated (see [`CreateRun::validate`]).
#[derive(Debug, Clone)]
pub struct CreateRun {
    pub command: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub llm_script: Option<Value>,
    pub tenant: String,
    pub stop_grace_secs: Option<u64>,
    pub model: Option<String>,
    pub fallback_models: Vec<String>,
    pub budget: Option<keel_protocol::api::BudgetParams>,
    pub loop_threshold: Option<u32>,
    /// The run's sandbox tier and profile; `None`: the kernel's default tier.
    pub sandbox: Option<Box<keel_protocol::api::SandboxParams>>,
    /// Tool patterns the run may call; `None`: the built-in tools.
    pub grant: Option<Vec<String>>,
    /// The agent's input (`KEEL_INPUT`).
    pub input: Option<Value>,
    /// The run that started this one (an agent called as a tool).
    pub parent: Option<RunId>,
    /// `high`, `normal` or `low` (default normal).
    pub priority: Option<String>,
}

impl CreateRun {
    /// Checks a request from the wire and says exactly what is wrong with it.
    pub fn validate(params: CreateRunParams) -> Result<CreateRun> {
        let bad = |msg: String| Err(Error::InvalidRequest(msg));
        if params.command.is_empty() || params.command[0].is_empty() {
            return bad(
                "`command` is empty; give the program to run, e.g. [\"python3\", \"agent.py\"]".into()
            );
        }
        if params.command.iter().any(|a| a.contains('\0')) {
            return bad("`command` contains a NUL byte".into());
        }
        let cwd = match params.cwd {
            Some(cwd) => PathBuf::from(cwd),
            None => std::env::current_dir().map_err(|e| {
                Error::InvalidRequest(format!("no `cwd` given and the kernel's own is unreadable: {e}"))
            })?,
        };
        if !cwd.is_absolute() {
            return bad(format!("`cwd` must be an absolute path, got {:?}", cwd));
        }
        if !cwd.is_dir() {
            return bad(format!("`cwd` {:?} is not a directory on the kernel's host", cwd));
        }
        for (name, value) in &params.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
                return bad(format!(
                    "environment variable {name:?} is not valid (names are non-empty, without '=' or NUL)"
                ));
            }
            if name.starts_with("KEEL_") {
                return bad(format!(
                    "environment variable {name} is reserved: the kernel sets KEEL_* itself"
                ));
            }
        }
        if let Some(script) = &params.llm_script {
            ScriptedProvider::from_value(script).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        }
        let tenant = params.tenant.unwrap_or_else(|| "default".into());
        if tenant.is_empty()
            || tenant.len() > 64
            || !tenant.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return bad(format!("tenant {tenant:?} is not valid: use 1-64 letters, digits, '-' or '_'"));
        }
        if let Some(budget) = &params.budget {
            crate::budget::validate(budget, "budget")?;
        }
        for model in params.model.iter().chain(&params.fallback_models) {
            if model.is_empty() || model.len() > 200 || model.chars().any(char::is_whitespace) {
                return bad(format!("model {model:?} is not a model name (e.g. openai/gpt-4o-mini)"));
            }
        }
        if params.stop_grace_secs.is_some_and(|s| s > 3600) {
            return bad("`stop_grace_secs` is at most 3600".into());
        }
        if let Some(sandbox) = &params.sandbox {
            crate::sandboxing::validate(sandbox)?;
        }
        if let Some(priority) = &params.priority
            && !matches!(priority.as_str(), "high" | "normal" | "low")
        {
            return bad(format!("priority {priority:?} is not known; use high, normal or low"));
        }
        if let Some(grant) = &params.grant {
            keel_tools::grant::Grant::parse(grant)
                .map_err(|e| Error::InvalidRequest(format!("grant: {e}")))?;
        }
        if let Some(input) = &params.input
            && serde_json::to_vec(input).map_or(0, |v| v.len()) > MAX_INPUT_BYTES
        {
            return bad(format!("`input` is over {MAX_INPUT_BYTES} bytes; pass large data through a volume"));
        }
        Ok(CreateRun {
            command: params.command,
            cwd,
            env: params.env,
            llm_script: params.llm_script,
            tenant,
            stop_grace_secs: params.stop_grace_secs,
            model: params.model,
            fallback_models: params.fallback_models,
            budget: params.budget,
            loop_threshold: params.loop_threshold,
            sandbox: params.sandbox.map(Box::new),
            grant: params.grant,
            input: params.input,
            parent: None,
            priority: params.priority,
        })
    }

    fn to_spec(&self) -> Value {
        json!({
            "command": self.command,
            "cwd": self.cwd,
            "env": self.env,
            "llm_script": self.llm_script,
            "stop_grace_secs": self.stop_grace_secs,
            "model": self.model,
            "fallback_models": self.fallback_models,
            "budget": self.budget,
            "loop_threshold": self.loop_threshold,
            "sandbox": self.sandbox,
            "grant": self.grant,
            "input": self.input,
            "parent": self.parent.as_ref().map(RunId::as_str),
            "priority": self.priority,
        })
    }
}

impl CreateRun {
    /// The child run of an agent called as a tool: the tool's command with the call's
    /// arguments as input, in the caller's tenant, working directory, sandbox and grant.
    pub(crate) fn for_agent_tool(
        parent: &RunRecord,
        tool: &keel_tools::AgentTool,
        args: Value,
    ) -> std::result::Result<CreateRun, String> {
        let spec = RunSpec::from_value(&parent.spec).map_err(|e| e.to_string())?;
        Ok(CreateRun {
            command: tool.command.clone(),
            cwd: spec.cwd,
            env: tool.env.clone(),
            llm_script: spec.llm_script,
            tenant: parent.tenant.clone(),
            stop_grace_secs: spec.stop_grace_secs,
            model: spec.model,
            fallback_models: spec.fallback_models,
            budget: None,
            loop_threshold: None,
            sandbox: spec.sandbox.map(Box::new),
            grant: spec.grant,
            input: Some(args),
            parent: Some(parent.id.clone()),
            priority: parent.spec.get("priority").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// A child run started by `proc.spawn`: `command` in the parent's tenant, working
    /// directory, sandbox, model and grant.
    pub(crate) fn child_of(
        parent: &RunRecord,
        command: Vec<String>,
        input: Option<Value>,
    ) -> std::result::Result<CreateRun, String> {
        let tool = keel_tools::AgentTool { command, env: BTreeMap::new() };
        let mut request = CreateRun::for_agent_tool(parent, &tool, Value::Null)?;
        request.input = input;
        Ok(request)
    }
}

/// The largest `input` a run may be given, in bytes of JSON (it travels in the
/// environment).
const MAX_INPUT_BYTES: usize = 120 * 1024;

/// Operator commands, from the HTTP API or the CLI. Each documents when it is legal.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "one command per API request; boxing buys nothing")]
pub enum Command {
    /// Start a new run. Always legal for a valid request.
    Create(CreateRun),
    /// Freeze a running, waiting or recovering run's processes (SIGSTOP).
    Pause(RunId),
    /// Continue a paused run (relaunched by replay if its process is gone).
    Resume(RunId),
    /// End a run that has not ended: SIGTERM, then SIGKILL after the grace period.
    Stop { run: RunId, grace: Option<Duration> },
    /// Answer the run's open `human.ask`.
    Answer { run: RunId, text: String },
    /// Add to a run that has not ended's budget; with `continue_loop`, let a run parked
    /// by the loop detector go on.
    TopUp { run: RunId, add: keel_protocol::api::BudgetParams, continue_loop: bool },
    /// Approve or deny a tool call parked for approval (`call` is its journal seq).
    Decide { run: RunId, call: Seq, approve: bool, note: Option<String> },
}

/// The kernel. Cheap to clone; every clone is the same kernel.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    sandbox: Arc<dyn Sandbox>,
    pub(crate) data_dir: DataDir,
    default_stop_grace: Duration,
    default_llm_script: Option<Value>,
    gateway_addr: Option<std::net::SocketAddr>,
    pub(crate) llm: keel_llm::Router,
    pub(crate) egress: Arc<keel_sandbox::egress::EgressSettings>,
    live: Mutex<HashMap<RunId, Arc<LiveRun>>>,
    tokens: Mutex<HashMap<String, Arc<LiveRun>>>,
    /// Tokens of agents being launched, until their run is in `tokens` (see `try_launch`).
    launching: Mutex<HashMap<String, tokio::sync::watch::Receiver<Option<Arc<LiveRun>>>>>,
    /// Tokens of `code.exec` programs running as `cpython`: their run and the seq of
    /// their `code.exec`.
    pub(crate) exec_tokens: Mutex<HashMap<String, (Arc<LiveRun>, Seq)>>,
    /// One lock per run, serialising its lifecycle changes so that read-decide-write
    /// never races; runs do not wait for each other.
    transitions: Mutex<HashMap<RunId, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) events: EventLog,
    pub(crate) shutting_down: AtomicBool,
    /// Wake-ups for mailbox waiters (see `crate::ipc`).
    pub(crate) mailboxes: crate::ipc::Mailboxes,
    /// Admission control (caps on live runs, the queue).
    pub(crate) admissions: crate::admission::Admissions,
    /// Queued runs given a slot, to launch (served by one background task).
    launches: tokio::sync::mpsc::UnboundedSender<RunId>,
    /// Swapped-out runs to bring back (served by one background task).
    wakeups: tokio::sync::mpsc::UnboundedSender<RunId>,
    /// Runs whose descendants are to be stopped (served by one background task).
    stop_trees: tokio::sync::mpsc::UnboundedSender<(RunId, Option<Duration>)>,
    /// Fired whenever a run ends; `proc.wait` listens to it.
    pub(crate) run_ended: tokio::sync::Notify,
    /// The most undelivered messages a run's mailbox holds (`KEEL_MAILBOX_CAPACITY`).
    pub(crate) mailbox_capacity: u64,
    /// Every tool the kernel knows (built-ins, keel.toml's, mounted MCP servers').
    pub(crate) tools: crate::tools::Registry,
    /// Interpreter workers for `code.exec`.
    pub(crate) interp: Option<keel_interp::Pool>,
    /// True from `spawn_recovery` until recovery has listed the runs it brings back:
    /// runs created meanwhile wait, so recovery never takes this kernel's new runs for
    /// interrupted ones (and kills and relaunches them).
    recovery_listing: tokio::sync::watch::Sender<bool>,
    /// Held for the kernel's life; dropping it releases the data directory.
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// A token registered as launching for as long as it lives (see `Kernel::try_launch`).
struct Launching<'a> {
    kernel: &'a Kernel,
    token: String,
}

impl<'a> Launching<'a> {
    fn register(
        kernel: &'a Kernel,
        token: &str,
        ready: tokio::sync::watch::Receiver<Option<Arc<LiveRun>>>,
    ) -> Launching<'a> {
        lock(&kernel.inner.launching).insert(token.to_owned(), ready);
        Launching { kernel, token: token.to_owned() }
    }
}

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        lock(&self.kernel.inner.launching).remove(&self.token);
    }
}

/// A run whose agent process this kernel started and has not yet seen exit.
pub(crate) struct LiveRun {
    pub(crate) id: RunId,
    /// The run's owner, fixed at creation (memory and mailboxes are scoped by it).
    pub(crate) tenant: String,
    pub(crate) attempt: u32,
    pub(crate) pid: u32,
    pub(crate) provider: Option<Arc<dyn Provider>>,
    pub(crate) replay: tokio::sync::Mutex<Replay>,
    /// Set by `run.exit`: later syscalls are refused.
    pub(crate) exited: AtomicBool,
    stopping: AtomicBool,
    pub(crate) ask: Mutex<Option<PendingAsk>>,
    pub(crate) budget: crate::budget::RunBudget,
    /// The tools the run may call.
    pub(crate) grant: keel_tools::grant::Grant,
    /// Its priority class (for the order of LLM calls waiting for a provider).
    pub(crate) priority: keel_core::sched::Priority,
    /// The read-only tool calls of running `code.exec`s (by the exec's seq), journaled
    /// together when it completes (see `exec.rs`).
    pub(crate) exec_buffers: Mutex<HashMap<Seq, Vec<keel_store::NewEntry>>>,
    /// Tool calls parked until an operator decides, by seq.
    pub(crate) approvals: Mutex<BTreeMap<Seq, crate::approvals::PendingApproval>>,
    /// Where the `fs.*` tools act on the host: the volume mounted at `/workspace`, or the
    /// working directory of a `none`-tier run.
    pub(crate) workspace: Option<PathBuf>,
    /// The run's sandbox backend and profile, for the command tools it calls.
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) profile: keel_sandbox::Profile,
    pub(crate) cwd: PathBuf,
    /// `http.fetch`'s client: through the run's egress proxy, or none without egress.
    pub(crate) fetcher: tokio::sync::OnceCell<Result<crate::tools::Fetcher, String>>,
    /// Set when the agent is gone: syscalls still in flight are dropped (an LLM stream
    /// closes, a tool's process tree is killed, an MCP call is cancelled).
    pub(crate) ended: tokio::sync::watch::Sender<bool>,
    /// Syscalls in flight, and how many of them are durable waits (see `swap.rs`).
    pub(crate) inflight: std::sync::atomic::AtomicUsize,
    pub(crate) waiting_calls: std::sync::atomic::AtomicUsize,
    /// Set when the kernel stops the agent to swap the run out.
    pub(crate) swapping: AtomicBool,
    /// The run's egress proxy (`allowlist` runs); it stops when the run is dropped.
    _egress: Option<keel_sandbox::egress::EgressProxy>,
}

pub(crate) struct Replay {
    pub(crate) matcher: ReplayMatcher,
    /// The recorded entries the matcher may point at, by seq.
    pub(crate) recorded: HashMap<Seq, JournalEntry>,
}

pub(crate) struct PendingAsk {
    pub(crate) seq: Seq,
    pub(crate) question: String,
    pub(crate) reply: oneshot::Sender<String>,
}

impl Kernel {
    /// Brings back, in the background, the runs that were live when the previous kernel
    /// stopped. Call it once the sockets agents use (the gateway's) are listening, since
    /// relaunched agents connect at once. The daemon does; the kernel embedded in a
    /// foreground `keel run` does not (the runs would end with it). Call it before runs
    /// can be created: a run created until recovery has listed the interrupted runs
    /// waits for that, so it is never mistaken for one of them.
    pub fn spawn_recovery(&self) {
        self.inner.recovery_listing.send_replace(true);
        // In the background, so the API answers (and shows `recovering` runs) while a large
        // backlog is brought back.
        let kernel = self.clone();
        tokio::spawn(async move {
            if let Err(err) = kernel.recover_all().await {
                tracing::error!("recovery of interrupted runs stopped: {err}");
            }
        });
    }

    /// Opens the data directory (taking its exclusive lock), the store and the syscall
    /// socket. Recovery of interrupted runs is separate: [`Kernel::spawn_recovery`].
    pub async fn start(options: KernelOptions) -> Result<Kernel> {
        let dir = options.data_dir.clone();
        let dir_error = |source| Error::DataDir { dir: dir.root().display().to_string(), source };
        std::fs::create_dir_all(dir.root()).map_err(dir_error)?;
        let lock_file = take_lock(&dir)?;
        crate::sdk::unpack(&dir.python_sdk()).map_err(dir_error)?;
        let db_path = dir.database();
        let store: Arc<dyn Store> = Arc::new(
            tokio::task::spawn_blocking(move || SqliteStore::open(&db_path)).await.map_err(|e| {
                Error::DataDir { dir: dir.root().display().to_string(), source: std::io::Error::other(e) }
            })??,
        );
        let events = EventLog::start(store.clone());
        let (stop_trees, mut stop_requests) = tokio::sync::mpsc::unbounded_channel();
        let (wakeups, mut wake_requests) = tokio::sync::mpsc::unbounded_channel::<RunId>();
        let (launches, mut launch_requests) = tokio::sync::mpsc::unbounded_channel::<RunId>();
        let admissions = crate::admission::Admissions::new(&options.scheduler);
        let swap_after = options.swap_after;
        let kernel = Kernel {
            inner: Arc::new(Inner {
                store,
                sandbox: options.sandbox,
                data_dir: options.data_dir,
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
                mailboxes: crate::ipc::Mailboxes::default(),
                run_ended: tokio::sync::Notify::new(),
                stop_trees,
                wakeups,
                admissions,
                launches,
                mailbox_capacity: crate::ipc::capacity_from_env(),
                tools: crate::tools::Registry::new(options.tools),
                interp: options
                    .interp_worker
                    .map(|worker| keel_interp::Pool::new(keel_interp::PoolConfig { worker, size: 2 })),
                recovery_listing: tokio::sync::watch::Sender::new(false),
                _lock: lock_file,
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

    /// Whether `live` is still the live attempt of its run (its agent has not exited and
    /// the run is not stopping), so a call waiting on its behalf should go on waiting.
    pub(crate) fn is_current(&self, live: &Arc<LiveRun>) -> bool {
        !live.stopping.load(Ordering::SeqCst)
            && !self.inner.shutting_down.load(Ordering::SeqCst)
            && lock(&self.inner.live).get(&live.id).is_some_and(|current| Arc::ptr_eq(current, live))
    }

    pub fn store(&self) -> &Arc<dyn Store> {
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
            tree::kill_tree(Some(run.pid), run.id.as_str());
        }
        self.inner.sandbox.shutdown().await;
        self.inner.tools.close().await;
        self.inner.events.flush().await;
        let _ = std::fs::remove_file(self.inner.data_dir.syscall_socket());
    }

    /// Acts on an operator command; returns the run as it is afterwards.
    pub async fn execute(&self, command: Command) -> Result<RunRecord> {
        match command {
            Command::Create(request) => self.create(request).await,
            Command::Pause(run) => self.pause(&run).await,
            Command::Resume(run) => self.resume(&run).await,
            Command::Stop { run, grace } => self.stop(&run, grace).await,
            Command::Answer { run, text } => self.answer(&run, text).await,
            Command::TopUp { run, add, continue_loop } => self.top_up(&run, add, continue_loop).await,
            Command::Decide { run, call, approve, note } => self.decide(&run, call, approve, note).await,
        }
    }

    pub async fn get(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.store.get_run(run).await?.ok_or_else(|| Error::RunNotFound(run.clone()))
    }

    pub async fn list(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        Ok(self.inner.store.list_runs(filter).await?)
    }

    pub async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.get(run).await?;
        Ok(self.inner.store.journal(run, 0).await?)
    }

    /// The open `human.ask` question of a run, if it waits for one.
    pub async fn open_question(&self, run: &RunId) -> Result<Option<String>> {
        if let Some(live) = self.live(run)
            && let Some(ask) = lock(&live.ask).as_ref()
        {
            return Ok(Some(ask.question.clone()));
        }
        let record = self.get(run).await?;
        if record.state != RunState::Waiting && record.state != RunState::Paused {
            return Ok(None);
        }
        Ok(self.pending_ask_entry(run).await?.map(|(_, question)| question))
    }

    pub async fn events(&self, run: &RunId, after: Seq, follow: bool) -> Result<EventStream> {
        self.get(run).await?;
        Ok(EventStream::new(self.inner.store.clone(), &self.inner.events, run.clone(), after, follow))
    }

    /// Reads one page of events without following.
    pub async fn events_page(&self, run: &RunId, after: Seq, limit: usize) -> Result<Vec<EventRecord>> {
        self.get(run).await?;
        Ok(self.inner.store.events(run, after, limit).await?)
    }

    pub(crate) fn live(&self, run: &RunId) -> Option<Arc<LiveRun>> {
        lock(&self.inner.live).get(run).cloned()
    }

    pub(crate) fn live_by_token(&self, token: &str) -> Option<Arc<LiveRun>> {
        lock(&self.inner.tokens).get(token).cloned()
    }

    /// [`Kernel::live_by_token`], waiting for a run whose agent is still being launched
    /// (see `try_launch`); `None` for an unknown token or a launch that failed.
    pub(crate) async fn live_by_token_ready(&self, token: &str) -> Option<Arc<LiveRun>> {
        // Launching first: a launch registers the run before it stops being launching.
        let launching = lock(&self.inner.launching).get(token).cloned();
        if let Some(mut ready) = launching {
            return ready.wait_for(Option::is_some).await.ok()?.clone();
        }
        self.live_by_token(token)
    }

    /// Every run with an agent process of this kernel.
    pub(crate) fn live_runs(&self) -> Vec<Arc<LiveRun>> {
        lock(&self.inner.live).values().cloned().collect()
    }

    /// Asks for a queued run that got a slot to be launched.
    pub(crate) fn request_launch(&self, run: &RunId) {
        let _ = self.inner.launches.send(run.clone());
    }

    async fn launch_queued(&self, run: &RunId) {
        match self.get(run).await {
            Ok(record) if record.state == RunState::Queued => {
                if let Err(err) = Box::pin(self.launch(record, false)).await {
                    tracing::warn!(run = %run, "could not start the queued run: {err}");
                }
            }
            // A swapped-out run that waited for a slot to come back.
            Ok(record) if crate::swap::is_swapped(&record) => self.wake_swapped(run).await,
            // Stopped while queued, or started otherwise: give the slot back.
            Ok(record) if record.state.is_terminal() => self.release_slot(run),
            _ => {}
        }
    }

    /// Asks for a swapped-out run to be brought back (a no-op for any other run).
    pub(crate) fn request_wake(&self, run: &RunId) {
        let _ = self.inner.wakeups.send(run.clone());
    }

    /// Relaunches a run by replay; it is in `recovering`.
    pub(crate) async fn relaunch(&self, record: RunRecord) -> Result<RunRecord> {
        self.launch(record, true).await
    }

    pub(crate) fn exec_by_token(&self, token: &str) -> Option<(Arc<LiveRun>, Seq)> {
        lock(&self.inner.exec_tokens).get(token).cloned()
    }

    pub(crate) fn emit(&self, run: &RunId, kind: &str, data: Value) {
        self.inner.events.emit(run, kind, data);
    }

    /// Applies a lifecycle command: decides with the pure state machine, then writes the
    /// new state only if nobody changed it meanwhile. Emits a `state` event.
    pub(crate) async fn transition(
        &self,
        run: &RunId,
        command: Lifecycle,
        patch: RunPatch,
    ) -> Result<RunRecord> {
        let updated = self.transition_if(run, command, patch, |_| true).await?;
        updated.ok_or_else(|| Error::Conflict(format!("run {run} changed while it was being changed")))
    }

    /// The run's transition lock: held by every change of its state (and by anything that
    /// writes its record on the strength of a state it read).
    pub(crate) async fn run_lock(&self, run: &RunId) -> tokio::sync::OwnedMutexGuard<()> {
        let run_lock = lock(&self.inner.transitions).entry(run.clone()).or_default().clone();
        run_lock.lock_owned().await
    }

    /// [`Kernel::transition`], if `applies` holds for the run as it is under the run's
    /// transition lock (`None` when it does not): for changes decided by reading the run,
    /// so that two deciders cannot both act on what one of them already changed.
    pub(crate) async fn transition_if(
        &self,
        run: &RunId,
        command: Lifecycle,
        mut patch: RunPatch,
        applies: impl FnOnce(&RunRecord) -> bool,
    ) -> Result<Option<RunRecord>> {
        let serial = self.run_lock(run).await;
        let current = self.get(run).await?;
        if !applies(&current) {
            return Ok(None);
        }
        let next = lifecycle::transition(current.state, command)?;
        let now = now_ms();
        patch.state = Some(next);
        patch.updated_at_ms = Some(now);
        // A waiting run keeps its reason while paused, so resume knows where to go back.
        patch.wait_reason = Some(match (next, command) {
            (RunState::Waiting, Lifecycle::Park(reason)) => Some(reason),
            (RunState::Waiting, _) => current.wait_reason.or(Some(WaitReason::Human)),
            (RunState::Paused, _) => current.wait_reason,
            _ => None,
        });
        if next.is_terminal() {
            patch.ended_at_ms = Some(Some(now));
        }
        // From here the change is written and announced even if the caller stops waiting
        // (a syscall whose agent died): the task holds the run's lock until the write is
        // done, so no other change can read the state this one is replacing. (Released
        // with the caller, the lock let a dropped wake-up land after a stop had read
        // `waiting`, and the stop failed, leaving the run `running` with a dead process.)
        let kernel = self.clone();
        let run = run.clone();
        let write = tokio::spawn(async move {
            let _serial = serial;
            kernel.write_transition(&run, current, next, patch).await
        });
        match write.await {
            Ok(result) => result.map(Some),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => Err(Error::Conflict(format!("the change of a run was abandoned: {err}"))),
        }
    }

    /// The write and announcement of a transition decided by [`Kernel::transition_if`],
    /// under the run's lock.
    async fn write_transition(
        &self,
        run: &RunId,
        current: RunRecord,
        next: RunState,
        patch: RunPatch,
    ) -> Result<RunRecord> {
        let updated = self.inner.store.update_run(run, Some(current.state), patch).await?;
        if next.is_terminal() {
            lock(&self.inner.transitions).remove(run); // An ended run never changes again.
            self.inner.run_ended.notify_waiters();
            self.release_slot(run);
            // The parent gets back what is left of the child's budget slice, and comes
            // back itself if it was swapped out waiting for its children.
            if let Some(parent) =
                updated.spec.get("parent").and_then(Value::as_str).and_then(|p| RunId::parse(p).ok())
            {
                self.return_slice(&parent, &updated);
                self.request_wake(&parent);
            }
        }
        let mut data = json!({ "state": next.as_str(), "from": current.state.as_str() });
        if let Some(reason) = updated.wait_reason {
            data["wait_reason"] = json!(reason.as_str());
        }
        if next.is_terminal() {
            if let Some(error) = &updated.error {
                data["error"] = json!(error);
            }
            if let Some(code) = updated.exit_code {
                data["exit_code"] = json!(code);
            }
        }
        self.emit(run, "state", data);
        Ok(updated)
    }

    async fn create(&self, request: CreateRun) -> Result<RunRecord> {
        self.create_as(RunId::generate(now_ms()), request).await
    }

    /// Creates and launches a run under an id chosen before (an agent called as a tool
    /// records its child's id durably first, so a retried call finds the same child).
    pub(crate) async fn create_as(&self, id: RunId, mut request: CreateRun) -> Result<RunRecord> {
        // The sender lives in `inner`, so the wait ends only when the listing is done.
        let _ = self.inner.recovery_listing.subscribe().wait_for(|listing| !*listing).await;
        if request.llm_script.is_none() {
            request.llm_script = self.inner.default_llm_script.clone();
        }
        // What the run's sandbox cannot enforce on this host is refused before the run
        // exists, with the missing control named (never run with weaker isolation).
        let sandbox = crate::sandboxing::backend(&self.inner.sandbox, request.sandbox.as_deref())?;
        sandbox
            .check(&crate::sandboxing::profile(request.sandbox.as_deref(), &self.inner.data_dir))
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let now = now_ms();
        let spec = request.to_spec();
        // A live slot now, a place in the queue, or a refusal (429) before the run exists.
        let start = self.admit(crate::admission::ticket(&id, &request.tenant, &spec, now))?;
        let created = self
            .inner
            .store
            .create_run(NewRun {
                id: id.clone(),
                tenant: request.tenant.clone(),
                spec,
                state: RunState::Created,
                created_at_ms: now,
            })
            .await;
        let record = match created {
            Ok(record) => record,
            Err(err) => {
                self.release_slot(&id);
                return Err(err.into());
            }
        };
        self.emit(&id, "state", json!({ "state": "created", "command": request.command }));
        let queued = self.transition(&id, Lifecycle::Enqueue, RunPatch::default()).await?;
        if !start {
            self.emit(&id, "queued", json!({ "reason": self.queue_reason(&id) }));
            return Ok(queued);
        }
        self.launch(record, false).await
    }

    /// Starts the agent process of `record`. With `recovering`, the run is already in
    /// `recovering` and its journal after the last checkpoint is loaded for replay.
    async fn launch(&self, record: RunRecord, recovering: bool) -> Result<RunRecord> {
        let id = record.id.clone();
        match self.try_launch(&record, recovering).await {
            Ok(record) => Ok(record),
            Err(err) => {
                let message = format!("the agent could not be started: {err}");
                tracing::warn!(run = %id, "{message}");
                let patch = RunPatch { error: Some(Some(message)), pid: Some(None), ..RunPatch::default() };
                self.transition(&id, Lifecycle::Fail, patch).await
            }
        }
    }

    async fn try_launch(&self, record: &RunRecord, recovering: bool) -> Result<RunRecord> {
        let spec = RunSpec::from_value(&record.spec)?;
        let script = match &spec.llm_script {
            Some(script) => {
                Some(ScriptedProvider::from_value(script).map_err(|e| Error::InvalidRequest(e.to_string()))?)
            }
            None => None,
        };
        let router = self.inner.llm.for_run(script, spec.model.clone(), spec.fallback_models.clone());
        let provider: Option<Arc<dyn Provider>> =
            router.is_configured().then(|| Arc::new(router) as Arc<dyn Provider>);
        let replay = if recovering {
            self.load_replay(&record.id, provider.as_deref()).await?
        } else {
            Replay { matcher: ReplayMatcher::live(), recorded: HashMap::new() }
        };
        let budget = self.load_budget(record).await?;
        let token = keel_types::random_token();
        // The agent may say hello before its sandbox has reported the start (a cold
        // sandbox under load answers after the agent already runs): its token is known
        // as launching until the run is registered below, and hello waits for that.
        let (ready, _) = tokio::sync::watch::channel(None);
        let _launching = Launching::register(self, &token, ready.subscribe());
        // A new run is created as attempt 1; each relaunch by replay is one more.
        let attempt = if recovering { record.attempt + 1 } else { record.attempt.max(1) };
        let sandbox = crate::sandboxing::backend(&self.inner.sandbox, spec.sandbox.as_ref())?;
        let profile = crate::sandboxing::profile(spec.sandbox.as_ref(), &self.inner.data_dir);
        crate::sandboxing::prepare_volumes(&profile)?;
        let grant = match &spec.grant {
            Some(patterns) => keel_tools::grant::Grant::parse(patterns)
                .map_err(|e| Error::InvalidRequest(format!("grant: {e}")))?,
            None => keel_tools::grant::Grant::default_builtins(),
        };
        let workspace = crate::tools::workspace_of(&profile, sandbox.shares_host(), &spec.cwd);
        let (bridges, egress) =
            self.bridges(&record.id, sandbox.as_ref(), &profile, self.inner.gateway_addr.is_some())?;
        // Runs whose proxy may intercept TLS (to inject credentials) trust the Keel CA.
        let ca_bundle = egress.as_ref().and(self.inner.egress.ca_bundle()).map(std::path::Path::to_path_buf);
        let env =
            self.agent_env(&record.id, &token, &spec, sandbox.shares_host(), &bridges, ca_bundle.is_some());
        let data_dir = &self.inner.data_dir;
        let launched = sandbox
            .launch(LaunchSpec {
                command: spec.command.clone(),
                cwd: spec.cwd.clone(),
                env,
                run_marker: record.id.to_string(),
                profile: profile.clone(),
                stdin: None,
                keel: KeelResources {
                    syscall_socket: Some(data_dir.syscall_socket()),
                    python_sdk: Some(data_dir.python_sdk()),
                    ca_bundle,
                    secrets: vec![data_dir.root().to_path_buf()],
                },
                bridges,
            })
            .await
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let live = Arc::new(LiveRun {
            id: record.id.clone(),
            tenant: record.tenant.clone(),
            attempt,
            pid: launched.pid,
            provider,
            replay: tokio::sync::Mutex::new(replay),
            exited: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            ask: Mutex::new(None),
            budget,
            grant,
            priority: record
                .spec
                .get("priority")
                .and_then(Value::as_str)
                .and_then(|p| p.parse().ok())
                .unwrap_or_default(),
            approvals: Mutex::default(),
            exec_buffers: Mutex::default(),
            workspace,
            sandbox: sandbox.clone(),
            profile,
            cwd: spec.cwd.clone(),
            fetcher: tokio::sync::OnceCell::new(),
            ended: tokio::sync::watch::Sender::new(false),
            inflight: Default::default(),
            waiting_calls: Default::default(),
            swapping: AtomicBool::new(false),
            _egress: egress,
        });
        lock(&self.inner.live).insert(record.id.clone(), live.clone());
        lock(&self.inner.tokens).insert(token, live.clone());
        ready.send_replace(Some(live.clone()));
        self.emit(&record.id, "launch", json!({ "attempt": attempt, "pid": launched.pid, "sandbox": sandbox.tier(), "pooled": launched.pooled, "replaying": recovering }));
        let patch = RunPatch { attempt: Some(attempt), pid: Some(Some(launched.pid)), ..RunPatch::default() };
        let updated = if recovering {
            self.inner
                .store
                .update_run(&record.id, None, RunPatch { updated_at_ms: Some(now_ms()), ..patch })
                .await?
        } else {
            self.transition(&record.id, Lifecycle::Start, patch).await?
        };
        self.watch_wall_clock(live.clone());
        self.watch(live, launched.child);
        Ok(updated)
    }

    /// The journal after the last checkpoint, as the replay matcher wants it; also hands
    /// the provider what it served before, so it continues where it was.
    async fn load_replay(&self, run: &RunId, provider: Option<&dyn Provider>) -> Result<Replay> {
        let store = &self.inner.store;
        let after = store.latest_entry(run, "state.checkpoint").await?.map_or(0, |e| e.seq);
        let entries = store.journal(run, 0).await?;
        if let Some(provider) = provider {
            let served: Vec<Value> = entries
                .iter()
                .filter(|e| e.method == "llm.chat" && e.status == EntryStatus::Ok)
                .filter_map(|e| e.result.as_ref()?.get("provider").cloned())
                .collect();
            provider.restore(&served);
        }
        let mut recorded = HashMap::new();
        let mut calls = Vec::new();
        for entry in entries.into_iter().filter(|e| e.seq > after && e.status != EntryStatus::Abandoned) {
            calls.push(RecordedCall {
                seq: entry.seq,
                method: entry.method.clone(),
                params_hash: entry.params_hash.clone(),
                completed: matches!(entry.status, EntryStatus::Ok | EntryStatus::Error),
            });
            recorded.insert(entry.seq, entry);
        }
        Ok(Replay { matcher: ReplayMatcher::new(calls), recorded })
    }

    fn agent_env(
        &self,
        run: &RunId,
        token: &str,
        spec: &RunSpec,
        shares_host: bool,
        bridges: &[keel_sandbox::Bridge],
        ca_bundle: bool,
    ) -> Vec<(String, String)> {
        use keel_sandbox::plan::inside;
        // Tier `none` is for development: the agent sees the kernel's environment, like
        // any child process. Sandboxed tiers start from an empty one: only what Keel sets
        // and what the run passes with `--env`.
        // Provider credentials stay in the kernel: never inherited, even by tier `none`.
        let mut env: BTreeMap<String, String> = if shares_host {
            std::env::vars().filter(|(k, _)| !k.starts_with("KEEL_") && !is_provider_secret(k)).collect()
        } else {
            [("HOME", inside::WORKSPACE), ("TMPDIR", inside::TMP), ("LANG", "C.UTF-8")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        env.extend(spec.env.clone());
        let sdk = if shares_host {
            self.inner.data_dir.python_sdk().display().to_string()
        } else {
            inside::PYTHON_SDK.to_owned()
        };
        let python_path = match env.get("PYTHONPATH") {
            Some(existing) if !existing.is_empty() => format!("{sdk}:{existing}"),
            _ => sdk,
        };
        env.insert("PYTHONPATH".into(), python_path);
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
        let socket = if shares_host {
            self.inner.data_dir.syscall_socket().display().to_string()
        } else {
            inside::SYSCALL_SOCKET.to_owned()
        };
        env.insert("KEEL_SOCKET".into(), socket);
        env.insert("KEEL_RUN_TOKEN".into(), token.to_owned());
        env.insert("KEEL_RUN_ID".into(), run.to_string());
        if let Some(input) = &spec.input {
            env.insert("KEEL_INPUT".into(), input.to_string());
        }
        // In a sandbox the gateway is a bridge to its Unix socket on a loopback port.
        let gateway = if shares_host {
            self.inner.gateway_addr.map(|addr| format!("http://{addr}"))
        } else {
            bridges.iter().find(|b| b.port == crate::sandboxing::GATEWAY_PORT).map(keel_sandbox::Bridge::url)
        };
        if let Some(base) = gateway {
            // Unmodified OpenAI / Anthropic SDK programs talk to the kernel, which holds
            // the real keys; the run token is their "API key".
            env.insert("OPENAI_BASE_URL".into(), format!("{base}/v1"));
            env.insert("OPENAI_API_KEY".into(), token.to_owned());
            env.insert("ANTHROPIC_BASE_URL".into(), base.clone());
            env.insert("ANTHROPIC_API_KEY".into(), token.to_owned());
            // The run's granted tools as an MCP server (streamable HTTP; the token is
            // the bearer).
            env.insert("KEEL_MCP_URL".into(), format!("{base}/mcp"));
        }
        crate::sandboxing::bridge_env(bridges, ca_bundle, &mut env);
        env.into_iter().collect()
    }

    /// Reads the agent's output into the event log and settles the run when it exits.
    fn watch(&self, live: Arc<LiveRun>, mut child: keel_sandbox::Child) {
        let stdout = child.stdout.take().map(|out| self.pump(&live.id, "stdout", out));
        let stderr = child.stderr.take().map(|err| self.pump(&live.id, "stderr", err));
        let kernel = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Whatever the agent left behind dies with it: the run is its whole tree.
            tree::kill_tree(Some(live.pid), live.id.as_str());
            for pump in [stdout, stderr].into_iter().flatten() {
                let _ = pump.await;
            }
            let ended_by = child.ended_by().map(str::to_owned);
            kernel.settle(&live, status, ended_by).await;
        });
    }

    fn pump(
        &self,
        run: &RunId,
        kind: &'static str,
        output: impl AsyncRead + Unpin + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let kernel = self.clone();
        let run = run.clone();
        tokio::spawn(async move {
            const MAX_LINE: usize = 64 * 1024;
            let mut reader = BufReader::new(output);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        let text = String::from_utf8_lossy(&line).into_owned();
                        kernel.emit(&run, kind, json!({ "line": text }));
                    }
                }
            }
        })
    }

    /// Records how the agent process ended.
    /// `ended_by` names the sandbox limit that ended the agent, if one did.
    async fn settle(
        &self,
        live: &Arc<LiveRun>,
        status: std::io::Result<std::process::ExitStatus>,
        ended_by: Option<String>,
    ) {
        lock(&self.inner.live).remove(&live.id);
        lock(&self.inner.tokens).retain(|_, run| !Arc::ptr_eq(run, live));
        live.ended.send_replace(true);
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return; // The next kernel recovers the run.
        }
        if live.swapping.load(Ordering::SeqCst)
            && !live.stopping.load(Ordering::SeqCst)
            && !live.exited.load(Ordering::SeqCst)
        {
            return self.settle_swapped(live).await;
        }
        self.abandon_replay_tail(live).await;
        use std::os::unix::process::ExitStatusExt;
        let (exit_code, signal) = match &status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        let exited = live.exited.load(Ordering::SeqCst);
        let (command, error) = if live.stopping.load(Ordering::SeqCst) {
            (Lifecycle::Cancel, None)
        } else if exited || exit_code == Some(0) {
            (Lifecycle::Exit { success: true }, None)
        } else {
            let why = match (exit_code, signal, &status) {
                (Some(code), _, _) => format!("the agent exited with status {code} without calling run.exit"),
                (None, Some(sig), _) => format!(
                    "the agent was killed by signal {sig} ({})",
                    Signal::try_from(sig).map_or("unknown", |s| s.as_str())
                ),
                (_, _, Err(err)) => format!("the agent's exit status could not be read: {err}"),
                _ => "the agent ended without an exit status".to_owned(),
            };
            let why = match ended_by {
                Some(limit) => format!("{limit}; {why}"),
                None => why,
            };
            (Lifecycle::Exit { success: false }, Some(why))
        };
        let patch = RunPatch {
            pid: Some(None),
            exit_code: Some(exit_code.or(signal.map(|s| 128 + s))),
            error: Some(error),
            ..RunPatch::default()
        };
        if let Err(err) = self.transition(&live.id, command, patch).await {
            tracing::warn!(run = %live.id, "could not record the end of the run: {err}");
        }
    }

    /// Marks the journal entries a recovered agent never asked for again as abandoned
    /// (kept for audit, never replayed).
    pub(crate) async fn abandon_replay_tail(&self, live: &Arc<LiveRun>) {
        let abandoned = live.replay.lock().await.matcher.abandon_remaining();
        if abandoned.is_empty() {
            return;
        }
        match self.inner.store.abandon_entries(&live.id, &abandoned).await {
            Ok(()) => self.emit(&live.id, "replay", json!({ "abandoned": abandoned })),
            Err(err) => tracing::warn!(run = %live.id, "could not mark abandoned journal entries: {err}"),
        }
    }

    /// Tells the agent, as an event it receives with `ipc.recv`, that an operator paused,
    /// resumed or stopped it (best effort: a full mailbox skips the event, not the action).
    async fn control_event(&self, record: &RunRecord, signal: &str) {
        let _ = self.deliver_signal(&record.tenant, None, &record.id, signal, Value::Null, None).await;
    }

    async fn pause(&self, run: &RunId) -> Result<RunRecord> {
        let record = self.get(run).await?;
        lifecycle::transition(record.state, Lifecycle::Pause)?;
        self.control_event(&record, "pause").await;
        if let Some(live) = self.live(run) {
            tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGSTOP);
        }
        self.transition(run, Lifecycle::Pause, RunPatch::default()).await
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let record = self.get(run).await?;
        let Some(live) = self.live(run) else {
            // The process is gone (the kernel restarted while the run was paused): resume
            // it by replay, like any interrupted run.
            let waiting = self.pending_ask_entry(run).await?.is_some();
            self.transition(run, Lifecycle::Resume { waiting }, RunPatch::default()).await?;
            let record = self.transition(run, Lifecycle::KernelRestart, RunPatch::default()).await?;
            return self.launch(record, true).await;
        };
        let waiting = lock(&live.ask).is_some();
        lifecycle::transition(record.state, Lifecycle::Resume { waiting })?;
        let updated = self.transition(run, Lifecycle::Resume { waiting }, RunPatch::default()).await?;
        self.control_event(&record, "resume").await;
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGCONT);
        Ok(updated)
    }

    async fn stop(&self, run: &RunId, grace: Option<Duration>) -> Result<RunRecord> {
        let record = self.get(run).await?;
        lifecycle::transition(record.state, Lifecycle::Cancel)?;
        // Descendants go too (in the background: each has its own grace period).
        let _ = self.inner.stop_trees.send((run.clone(), grace));
        let Some(live) = self.live(run) else {
            return self
                .transition(run, Lifecycle::Cancel, RunPatch { pid: Some(None), ..RunPatch::default() })
                .await;
        };
        if live.stopping.swap(true, Ordering::SeqCst) {
            return Ok(record); // Already stopping.
        }
        let grace = grace
            .or_else(|| RunSpec::from_value(&record.spec).ok()?.stop_grace_secs.map(Duration::from_secs))
            .unwrap_or(self.inner.default_stop_grace);
        self.emit(run, "stop", json!({ "grace_secs": grace.as_secs_f64() }));
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGTERM);
        // A stopped (paused) process only sees SIGTERM once it runs again.
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGCONT);
        let kernel = self.clone();
        let dying = live.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if kernel.live(&dying.id).is_some_and(|current| Arc::ptr_eq(&current, &dying)) {
                tree::kill_tree(Some(dying.pid), dying.id.as_str());
            }
        });
        // The agent can see why it got SIGTERM and use its grace period to wrap up. Best
        // effort, and after the signals, so nothing can hold the stop back.
        self.control_event(&record, "stop").await;
        Ok(record)
    }

    async fn answer(&self, run: &RunId, text: String) -> Result<RunRecord> {
        let record = self.get(run).await?;
        if record.state.is_terminal() {
            return Err(Error::Conflict(format!(
                "run {run} has ended ({}); there is nothing to answer",
                record.state
            )));
        }
        let live = self.live(run);
        let pending = live.as_ref().and_then(|l| lock(&l.ask).take());
        let seq = match &pending {
            Some(ask) => ask.seq,
            None => match self.pending_ask_entry(run).await? {
                Some((seq, _)) => seq,
                None => {
                    return Err(Error::Conflict(format!(
                        "run {run} is {} and has no open question; answer only runs waiting for a human (`keel ps` shows them as waiting)",
                        record.state
                    )));
                }
            },
        };
        let completion = Completion {
            status: EntryStatus::Ok,
            result: Some(json!({ "answer": text })),
            error: None,
            finished_at_ms: now_ms(),
            usage: Default::default(),
            provider_served: false,
        };
        self.inner.store.complete_entry(run, seq, completion).await?;
        self.emit(run, "answer", json!({ "seq": seq, "text": text }));
        match pending {
            Some(ask) => {
                let _ = ask.reply.send(text);
            }
            // Swapped out (or not relaunched yet): the answer brings it back by replay,
            // which moves it on; there is no process here to wake.
            None => {
                self.request_wake(run);
                return self.get(run).await;
            }
        }
        match self.get(run).await?.state {
            RunState::Waiting => self.transition(run, Lifecycle::Wake, RunPatch::default()).await,
            _ => self.get(run).await,
        }
    }

    /// The newest `human.ask` intent without a result, from the store.
    async fn pending_ask_entry(&self, run: &RunId) -> Result<Option<(Seq, String)>> {
        let entries = self.inner.store.journal(run, 0).await?;
        Ok(entries
            .into_iter()
            .rev()
            .find(|e| e.method == "human.ask" && e.status == EntryStatus::Pending)
            .map(|e| {
                (e.seq, e.params.get("question").and_then(Value::as_str).unwrap_or_default().to_owned())
            }))
    }

    /// Registers an open question of a live run and parks it; resolves with the answer.
    pub(crate) async fn park_for_answer(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        question: String,
    ) -> Result<oneshot::Receiver<String>> {
        let (tx, rx) = oneshot::channel();
        *lock(&live.ask) = Some(PendingAsk { seq, question: question.clone(), reply: tx });
        let state = self.get(&live.id).await?.state;
        if state == RunState::Recovering {
            self.transition(&live.id, Lifecycle::Recovered, RunPatch::default()).await?;
        }
        if state != RunState::Paused {
            self.transition(&live.id, Lifecycle::Park(WaitReason::Human), RunPatch::default()).await?;
        }
        self.emit(&live.id, "question", json!({ "seq": seq, "question": question }));
        Ok(rx)
    }

    /// Brings back every run that was live when the previous kernel stopped, several at
    /// a time so that their journal writes share commits.
    async fn recover_all(&self) -> Result<()> {
        let filter = RunFilter {
            states: vec![
                RunState::Created,
                RunState::Queued,
                RunState::Running,
                RunState::Waiting,
                RunState::Recovering,
            ],
            limit: None,
            tenant: None,
        };
        let listed = self.inner.store.list_runs(&filter).await;
        self.inner.recovery_listing.send_replace(false);
        let mut runs = listed?;
        runs.reverse(); // Oldest first.
        // Swapped-out runs stay swapped out until what they wait for happens, and hold no
        // live slot meanwhile.
        let mut resident = Vec::with_capacity(runs.len());
        for run in runs {
            if !self.recover_swapped(&run).await {
                resident.push(run);
            }
        }
        let runs = resident;
        // Runs that were live keep their slots; queued ones queue again (in `recover`).
        for run in runs.iter().filter(|r| !matches!(r.state, RunState::Created | RunState::Queued)) {
            self.restore_slot(run, true);
        }
        // Agents of the previous kernel die with it (PDEATHSIG), but descendants that
        // escaped may linger; they must not race the relaunched agents. One scan of /proc
        // serves every run.
        let mut leftovers = tree::processes_by_marker();
        for run in &runs {
            if let Some(pid) = run.pid {
                tree::signal_group(pid, Signal::SIGKILL);
            }
            if let Some(pids) = leftovers.remove(run.id.as_str()) {
                tree::kill_pids(&pids);
            }
        }
        const PARALLEL: usize = 16;
        let kernel = self.clone();
        futures_util::stream::iter(runs)
            .for_each_concurrent(PARALLEL, |run| {
                let kernel = kernel.clone();
                async move {
                    let id = run.id.clone();
                    if let Err(err) = kernel.recover(run).await {
                        tracing::warn!(run = %id, "could not recover the run: {err}");
                    }
                }
            })
            .await;
        Ok(())
    }

    async fn recover(&self, run: RunRecord) -> Result<RunRecord> {
        match run.state {
            RunState::Created | RunState::Queued => {
                let run = if run.state == RunState::Created {
                    self.transition(&run.id, Lifecycle::Enqueue, RunPatch::default()).await?
                } else {
                    run
                };
                if !self.restore_slot(&run, false) {
                    return Ok(run); // Still waiting for a live slot.
                }
                self.launch(run, false).await
            }
            _ => {
                let record = if run.state == RunState::Recovering {
                    run
                } else {
                    self.transition(&run.id, Lifecycle::KernelRestart, RunPatch::default()).await?
                };
                self.launch(record, true).await
            }
        }
    }
}

/// The parts of a stored run spec the runtime uses.
struct RunSpec {
    model: Option<String>,
    fallback_models: Vec<String>,
    command: Vec<String>,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    llm_script: Option<Value>,
    stop_grace_secs: Option<u64>,
    sandbox: Option<keel_protocol::api::SandboxParams>,
    grant: Option<Vec<String>>,
    input: Option<Value>,
}

impl RunSpec {
    fn from_value(spec: &Value) -> Result<RunSpec> {
        let corrupt = |what: &str| Error::Store(keel_store::Error::Corrupt(format!("run spec: {what}")));
        let command = spec
            .get("command")
            .and_then(Value::as_array)
            .ok_or_else(|| corrupt("no command"))?
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| corrupt("command is not a list of strings")))
            .collect::<Result<Vec<_>>>()?;
        let cwd = PathBuf::from(spec.get("cwd").and_then(Value::as_str).ok_or_else(|| corrupt("no cwd"))?);
        let env = spec
            .get("env")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
            .unwrap_or_default();
        let llm_script = spec.get("llm_script").filter(|v| !v.is_null()).cloned();
        let stop_grace_secs = spec.get("stop_grace_secs").and_then(Value::as_u64);
        let model = spec.get("model").and_then(Value::as_str).map(str::to_owned);
        let fallback_models = spec
            .get("fallback_models")
            .and_then(Value::as_array)
            .map(|models| models.iter().filter_map(|m| m.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let sandbox = match spec.get("sandbox").filter(|v| !v.is_null()) {
            Some(value) => {
                Some(serde_json::from_value(value.clone()).map_err(|e| corrupt(&format!("sandbox: {e}")))?)
            }
            None => None,
        };
        let grant = match spec.get("grant").filter(|v| !v.is_null()) {
            Some(value) => {
                Some(serde_json::from_value(value.clone()).map_err(|e| corrupt(&format!("grant: {e}")))?)
            }
            None => None,
        };
        let input = spec.get("input").filter(|v| !v.is_null()).cloned();
        Ok(RunSpec {
            model,
            fallback_models,
            command,
            cwd,
            env,
            llm_script,
            stop_grace_secs,
            sandbox,
            grant,
            input,
        })
    }
}

/// Environment variables that carry provider credentials in the kernel's environment.
fn is_provider_secret(name: &str) -> bool {
    const PREFIXES: &[&str] =
        &["OPENAI_", "ANTHROPIC_", "AZURE_OPENAI_", "GROQ_", "TOGETHER_", "OPENROUTER_"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || name.ends_with("_API_KEY")
}

pub(crate) fn command_of(spec: &Value) -> Vec<String> {
    RunSpec::from_value(spec).map(|s| s.command).unwrap_or_default()
}

/// Takes the data directory's exclusive lock, or explains who holds it.
fn take_lock(dir: &DataDir) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let path = dir.lock_file();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| Error::DataDir { dir: dir.root().display().to_string(), source })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(locked),
        Err((_, errno)) => {
            let info = std::fs::read_to_string(dir.kernel_info()).unwrap_or_default();
            Err(Error::DataDirLocked {
                dir: dir.root().display().to_string(),
                detail: format!(
                    "{errno}; kernel info: {}. Stop that kernel, or use another --data-dir / KEEL_DATA_DIR",
                    if info.is_empty() { "none".into() } else { info.trim().to_owned() }
                ),
            })
        }
    }
}
