//! The test kernel: a real [`Kernel`] on a temporary data directory, in a tokio runtime
//! of its own, whose runs are "puppets". A puppet is a tiny agent process (`sh` that
//! writes its run token to a file, then sleeps); the test drives the run's syscalls
//! itself through the Rust SDK with that token, so each test reads as a script of
//! syscalls and checks of what the kernel recorded.
//!
//! A simulated crash drops the kernel's runtime without a shutdown: every task (and with
//! it every clone of the kernel, the data directory's lock and the store) is dropped,
//! agents launched by the runtime's threads die with them (`PR_SET_PDEATHSIG`), and the
//! next kernel's recovery sweep kills any other leftover, as after a real crash.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_kernel::{Command, CreateRun, DataDir, Kernel, KernelOptions, Principal};
use keel_protocol::api::{ApprovalView, CreateRunParams, RunView};
use keel_store::{AuditEntry, AuditFilter, EventRecord, JournalEntry, RunRecord, Store};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use serde_json::{Value, json};

/// How long a wait may take before the test fails. Generous: it only matters on failure.
const DEADLINE: Duration = Duration::from_secs(30);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(5);

/// The puppet agent: records its token (one line per launch, so line N is attempt N's),
/// then waits to be killed. SIGTERM is ignored (and stays ignored across `exec`), so a
/// stopped run's agent lives through its grace period and can see the stop event.
const PUPPET: &str =
    r#"trap '' TERM; printf '%s\n' "$KEEL_RUN_TOKEN" >> "$0/$KEEL_RUN_ID.tokens"; exec sleep 3600"#;

/// What a test kernel is started with, besides its data directory.
#[derive(Default, Clone)]
pub struct Setup {
    /// A keel.toml text whose `[tools]` table configures the kernel's tools.
    pub keel_toml: String,
    pub swap_after: Option<Duration>,
    /// How many swapped-out runs' agents start at once (the kernel's default otherwise).
    pub swap_in: keel_kernel::SwapIn,
    /// Start interpreter workers for `code.exec` in python and javascript (this crate's
    /// test worker binary); off, only `cpython` runs.
    pub interp: bool,
    /// Run the kernel on a store whose writes this plan may cut off (`faults.rs`).
    pub faults: Option<Arc<crate::faults::Faults>>,
    /// keel.toml's `[scheduler]` caps (none by default).
    pub scheduler: keel_kernel::SchedulerConfig,
}

pub struct TestKernel {
    /// `None` only while a crash replaces it.
    kernel: Option<KernelThread>,
    setup: Setup,
    /// Holds the data directory (`data/`) and the puppets' token files (`puppets/`).
    dir: tempfile::TempDir,
    /// The test's own connection to the store, for reading what the kernel wrote (the
    /// kernel's public API answers views, and a crash must not keep the kernel's store
    /// alive). Opened on first use.
    inspect: std::sync::OnceLock<Arc<dyn Store>>,
}

/// Fails the test if `check` does not hold within the deadline; returns what it found.
pub fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

impl TestKernel {
    pub fn start() -> TestKernel {
        TestKernel::start_with(|_| Setup::default())
    }

    /// Starts a kernel whose setup may name paths of the test's scratch directory.
    pub fn start_with(setup: impl FnOnce(&Path) -> Setup) -> TestKernel {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("puppets")).expect("the puppets' directory");
        std::fs::create_dir_all(dir.path().join("scratch")).expect("the scratch directory");
        let setup = setup(&dir.path().join("scratch"));
        let mut test = TestKernel { kernel: None, setup, dir, inspect: Default::default() };
        test.boot();
        test
    }

    /// A directory for the test's own files (tools' marker files, say).
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    fn data_dir(&self) -> DataDir {
        DataDir::new(self.dir.path().join("data"))
    }

    fn boot(&mut self) {
        let tools = keel_tools::config::ToolsConfig::from_keel_toml(&self.setup.keel_toml)
            .expect("the test's keel.toml is valid");
        let dir = self.data_dir();
        let locked = dir.lock().expect("the data directory is free");
        let store: Arc<dyn Store> =
            Arc::new(keel_store::SqliteStore::open(&dir.database()).expect("the store opens"));
        let store: Arc<dyn Store> = match &self.setup.faults {
            Some(faults) => Arc::new(crate::faults::Faulty::new(store, faults.clone())),
            None => store,
        };
        let options = KernelOptions {
            data_dir: locked,
            store,
            sandbox: Arc::new(keel_sandbox::NoSandbox),
            default_stop_grace: Duration::from_secs(1),
            default_llm_script: None,
            gateway_addr: None,
            llm: keel_llm::Router::empty(),
            egress: Default::default(),
            tools,
            agents: Default::default(),
            interp_worker: self.setup.interp.then(|| keel_interp::WorkerCommand {
                program: env!("CARGO_BIN_EXE_keel-kernel-test-worker").into(),
                args: Vec::new(),
            }),
            swap_after: self.setup.swap_after,
            swap_in: self.setup.swap_in,
            scheduler: self.setup.scheduler.clone(),
            cluster: None,
            telemetry: keel_kernel::Telemetry::disabled(),
        };
        let (started, kernel) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<Stop>();
        let thread = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
            runtime.block_on(async move {
                let kernel = match Kernel::start(options).await {
                    Ok(kernel) => kernel,
                    Err(err) => return drop(started.send(Err(err))),
                };
                if let Err(err) = kernel.start_recovery().await {
                    return drop(started.send(Err(err)));
                }
                let _ = started.send(Ok((kernel.clone(), tokio::runtime::Handle::current())));
                if let Ok(Stop::Shutdown) = stopped.await {
                    kernel.shutdown().await;
                }
            });
            // Nothing is polled any more: dropping the runtime only drops the tasks.
        });
        let (kernel, handle) = kernel.recv().expect("the kernel thread").expect("the kernel starts");
        self.kernel = Some(KernelThread { kernel, handle, stop, thread });
    }

    /// The running kernel, for its synchronous probes (callable from any thread).
    pub fn kernel(&self) -> Kernel {
        self.kernel.as_ref().expect("a running kernel").kernel.clone()
    }

    /// Runs `f` on the kernel's runtime (so whatever it spawns belongs to this kernel
    /// and dies with it) and waits for its result.
    pub fn on_kernel<T, F>(&self, f: impl FnOnce(Kernel) -> F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let running = self.kernel.as_ref().expect("a running kernel");
        let (done, result) = std::sync::mpsc::channel();
        let task = f(running.kernel.clone());
        running.handle.spawn(async move {
            let _ = done.send(task.await);
        });
        result.recv().expect("the kernel task did not panic")
    }

    /// Simulates a crash: the kernel stops between two polls of its tasks (no agent is
    /// told, no pending event is flushed, no call in flight makes another write), its
    /// thread ends (its agents die with it), then a new kernel starts on the same data
    /// directory and recovers.
    pub fn crash_and_restart(&mut self) {
        if let Some(running) = self.kernel.take() {
            running.stop(Stop::Crash);
        }
        self.boot();
    }

    /// Creates a puppet run. `extra` holds fields of `CreateRunParams` (`llm_script`,
    /// `budget`, `grant`...); the command and working directory are the harness's.
    pub fn create_run(&self, extra: Value) -> RunId {
        let mut params = json!({
            "command": ["/bin/sh", "-c", PUPPET, self.dir.path().join("puppets")],
            "cwd": self.scratch(),
        });
        let (Value::Object(params_map), Value::Object(extra)) = (&mut params, extra) else {
            panic!("create_run takes a JSON object of CreateRunParams fields");
        };
        params_map.extend(extra);
        let params: CreateRunParams = serde_json::from_value(params).expect("valid CreateRunParams");
        let request = CreateRun::validate(params).expect("a valid run request");
        let view = self.execute(Command::Create(request)).expect("the run is created");
        RunId::parse(&view.run_id).expect("a run id")
    }

    pub fn execute(&self, command: Command) -> keel_kernel::Result<RunView> {
        self.on_kernel(|kernel| async move { kernel.execute(command).await })
    }

    /// An SDK client of the run's current agent process, as that agent would connect.
    pub fn agent(&self, run: &RunId) -> keel_sdk::Client {
        let record = self.wait_run(run, "its agent to be launched", |r| r.pid.is_some());
        let tokens = self.token_file(run);
        let token = wait_for(&format!("the token of attempt {} of {run}", record.attempt), || {
            let text = std::fs::read_to_string(&tokens).ok()?;
            text.lines().nth(record.attempt as usize - 1).map(str::to_owned)
        });
        let socket = self.data_dir().syscall_socket();
        keel_sdk::Client::connect_to(&socket.display().to_string(), &token).expect("the agent connects")
    }

    /// The tokens of the run's puppets, one line per launch.
    pub fn token_file(&self, run: &RunId) -> PathBuf {
        self.dir.path().join("puppets").join(format!("{run}.tokens"))
    }

    pub fn socket(&self) -> String {
        self.data_dir().syscall_socket().display().to_string()
    }

    /// The test's reading connection to the store (see `inspect`).
    pub fn store(&self) -> Arc<dyn Store> {
        let database = self.data_dir().database();
        self.inspect
            .get_or_init(|| Arc::new(keel_store::SqliteStore::open(&database).expect("the store opens")))
            .clone()
    }

    pub fn get(&self, run: &RunId) -> RunRecord {
        let (store, run) = (self.store(), run.clone());
        self.on_kernel(|_| async move { store.get_run(&run).await })
            .expect("the store")
            .expect("the run exists")
    }

    pub fn journal(&self, run: &RunId) -> Vec<JournalEntry> {
        let (store, run) = (self.store(), run.clone());
        self.on_kernel(|_| async move { store.journal(&run, 0).await }).expect("the journal")
    }

    /// The run's events so far (they are written in batches: wait for the ones you need).
    pub fn events(&self, run: &RunId) -> Vec<EventRecord> {
        let (store, run) = (self.store(), run.clone());
        self.on_kernel(|_| async move { store.events(&run, 0, 10_000).await }).expect("events")
    }

    /// The run's audit entries so far (written in batches, like events).
    pub fn audit(&self, run: &RunId) -> Vec<AuditEntry> {
        let store = self.store();
        let filter = AuditFilter { run_id: Some(run.clone()), ..AuditFilter::default() };
        self.on_kernel(|_| async move { store.audit_list(&filter).await }).expect("audit entries")
    }

    /// The run as the API shows it (its budget, why it waits).
    pub fn view(&self, run: &RunId) -> RunView {
        let run = run.clone();
        self.on_kernel(|kernel| async move { kernel.run(&Principal::Admin, &run).await }).expect("the run")
    }

    /// The run's calls waiting for an operator.
    pub fn pending_approvals(&self, run: &RunId) -> Vec<ApprovalView> {
        let run = run.clone();
        self.on_kernel(|kernel| async move { kernel.inspect(&Principal::Admin, &run).await })
            .expect("the run")
            .approvals
    }

    /// Waits until the run's record satisfies `check`; returns that record.
    pub fn wait_run(&self, run: &RunId, what: &str, check: impl Fn(&RunRecord) -> bool) -> RunRecord {
        wait_for(&format!("run {run}: {what}"), || Some(self.get(run)).filter(|r| check(r)))
    }

    /// SIGKILLs the run's agent process (a puppet waits to be told; after `run.exit`, this
    /// is how it ends).
    pub fn kill_agent(&self, run: &RunId) {
        let pid = self.get(run).pid.expect("the agent's pid");
        std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    }

    pub fn wait_state(&self, run: &RunId, state: RunState) -> RunRecord {
        self.wait_run(run, &format!("state {state}"), |r| r.state == state)
    }

    pub fn wait_waiting(&self, run: &RunId, reason: WaitReason) -> RunRecord {
        self.wait_run(run, &format!("waiting({reason})"), |r| {
            r.state == RunState::Waiting && r.wait_reason == Some(reason)
        })
    }

    /// Waits until the run has an event of `kind` whose data contains `fields`.
    pub fn wait_event(&self, run: &RunId, kind: &str, fields: Value) -> EventRecord {
        wait_for(&format!("a {kind} event {fields} of {run}"), || {
            self.events(run).into_iter().find(|e| e.kind == kind && contains(&e.data, &fields))
        })
    }
}

/// Whether every field of `fields` (an object) is in `data` with the same value.
pub fn contains(data: &Value, fields: &Value) -> bool {
    match fields.as_object() {
        Some(fields) => fields.iter().all(|(k, v)| data.get(k) == Some(v)),
        None => data == fields,
    }
}

/// The kind and code of the kernel's refusal, or a panic saying what came instead.
pub fn refusal<T: std::fmt::Debug>(outcome: keel_sdk::Result<T>) -> (String, i64, String) {
    match outcome {
        Err(keel_sdk::Error::Kernel { kind, code, message, .. }) => (kind, code, message),
        other => panic!("expected the kernel to refuse the call, got {other:?}"),
    }
}

/// Methods of the journal, in order: what a test usually compares.
pub fn methods(journal: &[JournalEntry]) -> Vec<(&str, EntryStatus)> {
    journal.iter().map(|e| (e.method.as_str(), e.status)).collect()
}

impl Drop for TestKernel {
    fn drop(&mut self) {
        // Agents are killed and blocked SDK clients see their connection close.
        if let Some(running) = self.kernel.take() {
            running.stop(Stop::Shutdown);
        }
    }
}

/// A kernel on a thread of its own, in a current-thread runtime: the kernel runs only
/// while that thread is in `block_on`, so stopping it freezes the kernel at once, as a
/// crash would (a multi-thread runtime keeps polling tasks on some workers while others
/// shut down, and those tasks then see the store refuse reads and journal that).
struct KernelThread {
    kernel: Kernel,
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<Stop>,
    thread: std::thread::JoinHandle<()>,
}

enum Stop {
    Crash,
    Shutdown,
}

impl KernelThread {
    fn stop(self, how: Stop) {
        let KernelThread { kernel, stop, thread, .. } = self;
        drop(kernel);
        let _ = stop.send(how);
        thread.join().expect("the kernel thread did not panic");
    }
}

/// Runs `f` on its own thread and fails the test if it does not return within the
/// deadline (for a call that would hang if the kernel never answered it).
pub fn with_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    result.recv_timeout(DEADLINE).unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Runs a blocking SDK call on its own thread (for calls that wait on the kernel: a
/// parked budget, an approval, a mailbox), so the test can act meanwhile.
pub fn in_background<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}
