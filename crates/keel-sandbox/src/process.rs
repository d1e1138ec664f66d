//! The `process` tier, kernel side: decides the sandbox (program resolution, mount plan,
//! limits), asks the zygote to build it, and follows it to the end (status pipe, wall
//! clock, cgroup). With a pool, sandboxes for a recently used configuration are built
//! ahead of time and a launch only hands over the job.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::cgroup::RunCgroup;
use crate::host::{self, Defaults, Effective, HostFacts};
use crate::plan::{self, HostLayout, PlanInputs, inside};
use crate::pool::Pool;
use crate::profile::{Profile, format_size};
use crate::wire::{Job, Resource, Rlimit, SPAWN_FDS, SpawnReply, SpawnRequest, Status};
use crate::zygote::{MAX_REQUEST, ZYGOTE_ARG};
use crate::{Child, Error, LaunchSpec, Launched, Result, Sandbox, Waiter, sys};

/// How the process tier is set up.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The binary that serves as zygote (it must call
    /// [`crate::zygote::run_if_requested`] first thing). Default: this very binary.
    pub zygote_program: PathBuf,
    /// Limits for runs that set none (cgroup ones only where enforceable).
    pub defaults: Defaults,
    /// Ready sandboxes kept per recently used configuration (0: no pool).
    pub pool_size: usize,
    /// Bytes of stdout and of stderr kept per run.
    pub output_limit: u64,
}

impl Default for ProcessConfig {
    fn default() -> ProcessConfig {
        ProcessConfig {
            zygote_program: PathBuf::from("/proc/self/exe"),
            defaults: Defaults::default(),
            pool_size: 0,
            output_limit: crate::output::DEFAULT_LIMIT,
        }
    }
}

/// The Linux process sandbox. Cheap to clone.
#[derive(Clone)]
pub struct ProcessSandbox {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) config: ProcessConfig,
    facts: HostFacts,
    layout: HostLayout,
    zygote: tokio::sync::Mutex<Option<Zygote>>,
    pub(crate) pool: Pool,
    /// Empty cgroups with both controllers, made ahead of time (making one costs more
    /// than the rest of a sandbox's kernel-side setup).
    cgroups: std::sync::Mutex<Vec<RunCgroup>>,
}

/// Cgroups kept ready in the stash.
const CGROUP_STASH: usize = 4;

/// A sandbox decided but not yet built: the request for the zygote (without a job), the
/// job, the limits, and the pool key (sandboxes with equal keys are interchangeable).
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) request: SpawnRequest,
    pub(crate) job: Job,
    pub(crate) limits: Effective,
    pub(crate) key: String,
}

/// A built sandbox whose init runs: its pipes, and its cgroup.
pub(crate) struct Built {
    pid: i32,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The write end of the agent's stdin pipe (used when its job has `stdin`).
    stdin: Option<OwnedFd>,
    status: Lines<BufReader<pipe::Receiver>>,
    control: Option<OwnedFd>,
    cgroup: Option<RunCgroup>,
    pub(crate) built_at: Instant,
}

impl Drop for Built {
    fn drop(&mut self) {
        // An unused pooled sandbox ends when its control pipe closes; its cgroup is
        // removed once it is empty.
        self.control.take();
        if let Some(cgroup) = self.cgroup.take() {
            crate::cgroup::remove_when_empty(cgroup);
        }
    }
}

impl ProcessSandbox {
    pub fn new(config: ProcessConfig) -> ProcessSandbox {
        let facts = HostFacts::probe();
        // Off the start path: a host may hold many groups of kernels that crashed.
        let support = facts.cgroups.clone();
        let _ = std::thread::Builder::new().name("keel-cgroup-sweep".into()).spawn(move || {
            // After the start's busy moment (recovery relaunches), and politely.
            std::thread::sleep(Duration::from_secs(5));
            sys::lower_thread_priority();
            crate::cgroup::remove_stale(&support)
        });
        let pool = Pool::new(config.pool_size);
        ProcessSandbox {
            shared: Arc::new(Shared {
                config,
                facts,
                layout: crate::resolve::host_layout(),
                zygote: tokio::sync::Mutex::new(None),
                pool,
                cgroups: std::sync::Mutex::default(),
            }),
        }
    }

    /// Starts the zygote now (in the background when called inside a tokio runtime), so
    /// the first launch does not wait for it.
    pub fn warm_up(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let mut zygote = shared.zygote.lock().await;
            if zygote.is_none() {
                match Zygote::start(&shared.config.zygote_program) {
                    Ok(started) => *zygote = Some(started),
                    Err(err) => tracing::warn!("could not start the sandbox zygote: {err}"),
                }
            }
        });
    }

    /// What this host offers, as probed when the sandbox was made.
    pub fn facts(&self) -> &HostFacts {
        &self.shared.facts
    }

    pub fn defaults(&self) -> &Defaults {
        &self.shared.config.defaults
    }

    /// Builds `size` sandboxes for `spec`'s configuration now, so launches of it are
    /// claims. Returns when they are ready.
    pub async fn prewarm(&self, spec: &LaunchSpec) -> Result<()> {
        let prepared = self.shared.prepare(spec)?;
        Shared::fill(&self.shared, &prepared).await
    }

    /// Ready sandboxes for `spec`'s configuration.
    pub fn ready(&self, spec: &LaunchSpec) -> usize {
        self.shared.prepare(spec).map_or(0, |p| self.shared.pool.ready(&p.key))
    }
}

/// Host paths an agent must never see even if the working directory contains them.
fn home_secrets() -> Vec<PathBuf> {
    let Some(home) = std::env::var_os("HOME").map(PathBuf::from) else { return Vec::new() };
    [
        ".ssh",
        ".gnupg",
        ".aws",
        ".azure",
        ".config/gcloud",
        ".kube",
        ".docker",
        ".netrc",
        ".pgpass",
        ".git-credentials",
        ".npmrc",
        ".pypirc",
        ".local/share/keel",
    ]
    .iter()
    .map(|rest| home.join(rest))
    .collect()
}

/// `PATH` for a program whose environment has none.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Shared {
    /// Decides everything about a sandbox for `spec` (pure apart from looking up the
    /// program on the host).
    pub(crate) fn prepare(&self, spec: &LaunchSpec) -> Result<Prepared> {
        let (program, args) = spec.command.split_first().ok_or(Error::EmptyCommand)?;
        if !spec.cwd.is_dir() {
            return Err(Error::BadWorkingDir(spec.cwd.clone()));
        }
        let run_env = |name: &str| spec.env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let lookup = |name: &str| run_env(name).or_else(|| std::env::var(name).ok());
        let path_var = lookup("PATH").unwrap_or_else(|| DEFAULT_PATH.to_owned());
        let resolved = crate::resolve::resolve(program, &spec.cwd, &path_var, &lookup)
            .map_err(|reason| Error::NotFound { program: program.clone(), reason })?;
        let limits = host::effective(&self.facts, &self.config.defaults, &spec.profile);
        let mut secrets = spec.keel.secrets.clone();
        secrets.extend(home_secrets());
        // Their real paths too, so a symlink into a hidden place is caught by name.
        let real: Vec<PathBuf> = secrets.iter().filter_map(|s| std::fs::canonicalize(s).ok()).collect();
        secrets.extend(real);
        secrets.sort();
        secrets.dedup();
        let argument_files = if spec.bind_argument_files {
            crate::resolve::argument_files(args, &spec.cwd)
        } else {
            Vec::new()
        };
        let bridges: Vec<(u16, PathBuf)> =
            spec.bridges.iter().map(|b| (b.port, b.host_socket.clone())).collect();
        let plan = plan::build(&PlanInputs {
            host: &self.layout,
            cwd: &spec.cwd,
            writable_cwd: spec.profile.writable_cwd,
            program_binds: &resolved.binds,
            ro_binds: &spec.profile.ro_binds,
            argument_files: &argument_files,
            volumes: &spec.profile.volumes,
            syscall_socket: spec.keel.syscall_socket.as_deref(),
            python_sdk: spec.keel.python_sdk.as_deref(),
            node_sdk: spec.keel.node_sdk.as_deref(),
            ca_bundle: spec.keel.ca_bundle.as_deref(),
            bridges: &bridges,
            secrets: &secrets,
            scratch_bytes: limits.scratch_bytes,
            uid: self.facts.uid,
            gid: self.facts.gid,
        })?;
        let mut env = spec.env.clone();
        if run_env("PATH").is_none() {
            let mut dirs: Vec<String> = resolved.path_dirs.iter().map(|d| d.display().to_string()).collect();
            dirs.push(DEFAULT_PATH.to_owned());
            env.push(("PATH".into(), dirs.join(":")));
        }
        let mut rlimits = vec![
            Rlimit { resource: Resource::CoreSize, value: 0 },
            Rlimit { resource: Resource::OpenFiles, value: limits.open_files },
        ];
        if let Some(secs) = limits.cpu_time_secs {
            rlimits.push(Rlimit { resource: Resource::Cpu, value: secs });
        }
        if let Some(bytes) = limits.file_size_bytes {
            rlimits.push(Rlimit { resource: Resource::FileSize, value: bytes });
        }
        let job = Job {
            program: resolved.program,
            argv: spec.command.clone(),
            env,
            rlimits,
            stdin: spec.stdin.is_some(),
        };
        let request = SpawnRequest {
            plan,
            cwd: spec.cwd.clone(),
            uid: self.facts.uid,
            gid: self.facts.gid,
            cgroup_procs: Vec::new(),
            cgroup_tasks: Vec::new(),
            bridges: spec
                .bridges
                .iter()
                .map(|b| (b.port, PathBuf::from(inside::bridge_socket(b.port))))
                .collect(),
            allow_inet: !spec.bridges.is_empty(),
            landlock_abi: self.facts.landlock_abi,
            job: None,
        };
        let key = serde_json::to_string(&(&request, limits.memory_bytes, limits.pids))
            .map_err(|e| Error::Setup(format!("encode the sandbox request: {e}")))?;
        Ok(Prepared { request, job, limits, key })
    }

    /// The cgroup for a sandbox with `limits`: from the stash when it has both limits
    /// (the common case), made now otherwise. Refills the stash in the background.
    fn cgroup(self: &Arc<Self>, limits: &Effective) -> Result<Option<RunCgroup>> {
        let (memory, pids) = (limits.memory_bytes, limits.pids);
        if memory.is_none() || pids.is_none() {
            return RunCgroup::create(&self.facts.cgroups, memory, pids).map_err(Error::Cgroup);
        }
        let stashed = self.cgroups.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let group = match stashed {
            Some(group) => group,
            None => match RunCgroup::make(&self.facts.cgroups, true, true).map_err(Error::Cgroup)? {
                Some(group) => group,
                None => return Ok(None),
            },
        };
        group.limit(memory, pids).map_err(Error::Cgroup)?;
        let shared = self.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::task::spawn_blocking(move || {
                loop {
                    if shared.cgroups.lock().unwrap_or_else(|p| p.into_inner()).len() >= CGROUP_STASH {
                        return;
                    }
                    match RunCgroup::make(&shared.facts.cgroups, true, true) {
                        Ok(Some(group)) => {
                            shared.cgroups.lock().unwrap_or_else(|p| p.into_inner()).push(group)
                        }
                        _ => return,
                    }
                }
            });
        }
        Ok(Some(group))
    }

    /// Sends a request to the zygote (starting it if needed) and returns its reply.
    async fn ask_zygote(&self, request: &[u8], fds: [BorrowedFd<'_>; SPAWN_FDS]) -> Result<SpawnReply> {
        if request.len() > MAX_REQUEST {
            return Err(Error::Setup(format!(
                "the sandbox request is {} bytes (at most {}); the run's environment is too large",
                request.len(),
                MAX_REQUEST
            )));
        }
        let mut zygote = self.zygote.lock().await;
        // One retry with a fresh zygote if the current one died.
        for attempt in 0..2 {
            if zygote.is_none() {
                *zygote = Some(Zygote::start(&self.config.zygote_program).map_err(Error::Zygote)?);
            }
            let Some(live) = zygote.as_ref() else { continue };
            match live.exchange(request, &fds).await {
                Ok(reply) => return Ok(reply),
                Err(err) if attempt == 0 => {
                    tracing::warn!("the sandbox zygote failed ({err}); starting a new one");
                    *zygote = None;
                }
                Err(err) => return Err(Error::Zygote(err)),
            }
        }
        Err(Error::Zygote(std::io::Error::other("the zygote could not be started")))
    }

    /// Builds a sandbox (running `request.job` at once if it has one).
    pub(crate) async fn build(
        self: &Arc<Self>,
        mut request: SpawnRequest,
        limits: &Effective,
    ) -> Result<Built> {
        let cgroup = self.cgroup(limits)?;
        if let Some(group) = &cgroup {
            (request.cgroup_procs, request.cgroup_tasks) = group.join_files();
        }
        let bytes =
            serde_json::to_vec(&request).map_err(|e| Error::Setup(format!("encode the request: {e}")))?;
        let pipe = || sys::pipe().map_err(|e| Error::Setup(format!("make a pipe: {e}")));
        let (stdout, stdout_child) = pipe()?;
        let (stderr, stderr_child) = pipe()?;
        let (status, status_child) = pipe()?;
        let (control_child, control) = pipe()?;
        let (stdin_child, stdin) = pipe()?;
        let reply = self
            .ask_zygote(
                &bytes,
                [
                    stdout_child.as_fd(),
                    stderr_child.as_fd(),
                    status_child.as_fd(),
                    control_child.as_fd(),
                    stdin_child.as_fd(),
                ],
            )
            .await;
        drop((stdout_child, stderr_child, status_child, control_child, stdin_child));
        let fail = |error: Error| {
            if let Some(group) = &cgroup {
                group.remove();
            }
            Err(error)
        };
        let pid = match reply {
            Ok(SpawnReply::Spawned { pid }) => pid,
            Ok(SpawnReply::Failed { error }) => return fail(Error::Setup(error)),
            Err(error) => return fail(error),
        };
        let status = pipe::Receiver::from_owned_fd(status)
            .map_err(|e| Error::Setup(format!("watch the sandbox: {e}")))?;
        Ok(Built {
            pid,
            stdout: Some(stdout),
            stderr: Some(stderr),
            stdin: Some(stdin),
            status: BufReader::new(status).lines(),
            control: Some(control),
            cgroup,
            built_at: Instant::now(),
        })
    }

    /// Waits for the init's next report.
    async fn next_status(built: &mut Built) -> Result<Status> {
        match built.status.next_line().await {
            Ok(Some(line)) => {
                Status::parse(&line).ok_or_else(|| Error::Setup(format!("the sandbox reported {line:?}")))
            }
            Ok(None) | Err(_) => Err(Error::Setup("the sandbox ended while it was being set up".into())),
        }
    }

    /// Hands `job` to a pooled sandbox and waits until the agent runs.
    pub(crate) async fn claim(
        &self,
        mut built: Built,
        job: &Job,
        limits: &Effective,
        stdin: Option<&[u8]>,
    ) -> Result<Launched> {
        let text = serde_json::to_vec(job).map_err(|e| Error::Setup(format!("encode the job: {e}")))?;
        let control =
            built.control.take().ok_or_else(|| Error::Setup("the sandbox was claimed twice".into()))?;
        let mut sender = pipe::Sender::from_owned_fd(control)
            .map_err(|e| Error::Setup(format!("hand over the job: {e}")))?;
        sender.write_all(&text).await.map_err(|e| Error::Setup(format!("hand over the job: {e}")))?;
        drop(sender);
        // The sandbox is built and its agent process exists, waiting for this job: the
        // claim is done. Whether the exec worked is the waiter's first report.
        self.child(built, limits, true, stdin)
    }

    /// Waits for `started` and wraps the sandbox as the run's child.
    async fn started(&self, mut built: Built, limits: &Effective, stdin: Option<&[u8]>) -> Result<Launched> {
        match Self::next_status(&mut built).await? {
            Status::Started => {}
            Status::Error(message) => return Err(start_error(message)),
            other => return Err(Error::Setup(format!("the sandbox reported {other:?} before starting"))),
        }
        self.child(built, limits, false, stdin)
    }

    /// Wraps a sandbox whose agent process runs (or is about to exec) as the run's child.
    /// With `stdin`, the bytes are written to the agent's stdin pipe in the background and
    /// the pipe is closed after them; without, the kernel's end closes now.
    fn child(
        &self,
        mut built: Built,
        limits: &Effective,
        pooled: bool,
        stdin: Option<&[u8]>,
    ) -> Result<Launched> {
        let output = |fd: Option<OwnedFd>| -> Result<crate::Output> {
            let fd = fd.ok_or_else(|| Error::Setup("the sandbox's output was already taken".into()))?;
            let receiver =
                pipe::Receiver::from_owned_fd(fd).map_err(|e| Error::Setup(format!("read output: {e}")))?;
            Ok(crate::output::capped(receiver, self.config.output_limit))
        };
        let stdout = output(built.stdout.take())?;
        let stderr = output(built.stderr.take())?;
        let input = built.stdin.take();
        if let (Some(bytes), Some(fd)) = (stdin, input) {
            let mut sender =
                pipe::Sender::from_owned_fd(fd).map_err(|e| Error::Setup(format!("write stdin: {e}")))?;
            let bytes = bytes.to_vec();
            tokio::spawn(async move {
                // An agent that exits without reading all of it just ends the write.
                let _ = sender.write_all(&bytes).await;
            });
        }
        let pid = built.pid;
        let waiter = SandboxWaiter {
            pid,
            deadline: limits.wall_time_secs.map(|s| Instant::now() + Duration::from_secs(s)),
            limits: limits.clone(),
            built: Some(built),
            exit: None,
            ended_by: None,
        };
        Ok(Launched {
            child: Child {
                stdout: Some(stdout),
                stderr: Some(stderr),
                waiter: Waiter::Sandboxed(Box::new(waiter)),
                ended_by: None,
            },
            pid: pid as u32,
            pooled,
        })
    }

    /// Builds a sandbox with its job and waits until the agent runs.
    pub(crate) async fn cold(
        self: &Arc<Self>,
        prepared: &Prepared,
        stdin: Option<&[u8]>,
    ) -> Result<Launched> {
        let mut request = prepared.request.clone();
        request.job = Some(prepared.job.clone());
        let built = self.build(request, &prepared.limits).await?;
        self.started(built, &prepared.limits, stdin).await
    }

    /// Builds pooled sandboxes for `prepared` until the pool holds its size.
    pub(crate) async fn fill(shared: &Arc<Shared>, prepared: &Prepared) -> Result<()> {
        while shared.pool.wants(&prepared.key) {
            let mut built = shared.build(prepared.request.clone(), &prepared.limits).await?;
            match Self::next_status(&mut built).await? {
                Status::Ready => shared.pool.put(&prepared.key, built),
                Status::Error(message) => return Err(Error::Setup(message)),
                other => return Err(Error::Setup(format!("a pooled sandbox reported {other:?}"))),
            }
        }
        Ok(())
    }

    /// Refills the pool for `prepared` in the background.
    fn refill(shared: &Arc<Shared>, prepared: Prepared) {
        if !shared.pool.start_refill(&prepared.key) {
            return;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(err) = Shared::fill(&shared, &prepared).await {
                tracing::warn!("could not refill the sandbox pool: {err}");
            }
            shared.pool.end_refill(&prepared.key);
        });
    }
}

/// An exec failure reported by the init reads like the `none` tier's.
fn start_error(message: String) -> Error {
    match message.strip_prefix("could not start ") {
        Some(rest) => match rest.split_once(": ") {
            Some((program, reason)) => {
                Error::NotFound { program: program.to_owned(), reason: reason.to_owned() }
            }
            None => Error::Setup(message),
        },
        None => Error::Setup(message),
    }
}

#[async_trait]
impl Sandbox for ProcessSandbox {
    fn tier(&self) -> &'static str {
        "process"
    }

    /// The sandbox is a PID namespace whose init is `pid`: its death ends every process
    /// in it, whatever they did (setsid, a cleared environment), so no search is needed.
    fn kill_tree(&self, pid: u32, _marker: &str) {
        crate::tree::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
    }

    fn pool_status(&self) -> crate::PoolStatus {
        self.shared.pool.status()
    }

    async fn shutdown(&self) {
        drop(self.shared.pool.drain());
        let stash: Vec<RunCgroup> =
            std::mem::take(&mut *self.shared.cgroups.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = tokio::task::spawn_blocking(move || {
            for group in stash {
                group.remove();
            }
            crate::cgroup::remove_pending(Duration::from_secs(1))
        })
        .await;
    }

    fn check(&self, profile: &Profile) -> Result<()> {
        let missing = host::missing_controls(&self.shared.facts, profile);
        if missing.is_empty() { Ok(()) } else { Err(Error::Unenforceable(host::refusal(&missing))) }
    }

    async fn launch(&self, spec: LaunchSpec) -> Result<Launched> {
        self.check(&spec.profile)?;
        let shared = &self.shared;
        let prepared = shared.prepare(&spec)?;
        for socket in spec.bridges.iter().map(|b| &b.host_socket) {
            // The kernel's sockets appear as it starts; give a just-started one a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !socket.exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if shared.config.pool_size > 0 {
            while let Some(built) = shared.pool.take(&prepared.key) {
                match shared.claim(built, &prepared.job, &prepared.limits, spec.stdin.as_deref()).await {
                    Ok(launched) => {
                        Shared::refill(shared, prepared);
                        return Ok(launched);
                    }
                    Err(err) => tracing::debug!("a pooled sandbox was unusable: {err}"),
                }
            }
        }
        let launched = shared.cold(&prepared, spec.stdin.as_deref()).await;
        if shared.config.pool_size > 0 && launched.is_ok() {
            Shared::refill(shared, prepared);
        }
        launched
    }
}

/// Follows a sandbox to its end.
pub(crate) struct SandboxWaiter {
    pid: i32,
    deadline: Option<Instant>,
    limits: Effective,
    built: Option<Built>,
    exit: Option<i32>,
    ended_by: Option<String>,
}

impl SandboxWaiter {
    pub(crate) async fn wait(&mut self) -> (ExitStatus, Option<String>) {
        if let Some(mut built) = self.built.take() {
            loop {
                let line = match self.deadline {
                    Some(deadline) => match tokio::time::timeout_at(deadline, built.status.next_line()).await
                    {
                        Ok(line) => line,
                        Err(_) => {
                            sys::kill(self.pid, libc::SIGKILL);
                            self.deadline = None;
                            let secs = self.limits.wall_time_secs.unwrap_or_default();
                            self.ended_by = Some(format!("the wall-clock limit of {secs}s was reached"));
                            continue;
                        }
                    },
                    None => built.status.next_line().await,
                };
                match line.map(|l| l.as_deref().map(Status::parse)) {
                    Ok(Some(Some(Status::Exit(raw)))) => self.exit = Some(raw),
                    // A claimed pooled sandbox reports here whether its exec worked.
                    Ok(Some(Some(Status::Error(message)))) => {
                        self.ended_by = Some(start_error(message).to_string());
                        self.exit = Some(127 << 8);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            let raw = self.exit.unwrap_or(libc::SIGKILL);
            if self.ended_by.is_none() {
                self.ended_by = self.limit_reached(&built, ExitStatus::from_raw(raw));
            }
            drop(built);
        }
        (ExitStatus::from_raw(self.exit.unwrap_or(libc::SIGKILL)), self.ended_by.clone())
    }

    fn limit_reached(&self, built: &Built, status: ExitStatus) -> Option<String> {
        if let (Some(bytes), Some(cgroup)) = (self.limits.memory_bytes, &built.cgroup)
            && cgroup.memory_exhausted()
        {
            return Some(format!("the memory limit of {} was reached", format_size(bytes)));
        }
        if let Some(secs) = self.limits.cpu_time_secs
            && matches!(status.signal(), Some(libc::SIGXCPU) | Some(libc::SIGKILL))
        {
            return Some(format!("the CPU time limit of {secs}s was reached"));
        }
        None
    }
}

/// The zygote process and the kernel's end of its socket.
struct Zygote {
    socket: AsyncFd<OwnedFd>,
    _process: tokio::process::Child,
}

impl Zygote {
    fn start(program: &Path) -> std::io::Result<Zygote> {
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(std::io::Error::from)?;
        let theirs_raw = std::os::fd::AsRawFd::as_raw_fd(&theirs);
        let mut command = tokio::process::Command::new(program);
        command
            .arg(ZYGOTE_ARG)
            .arg(theirs_raw.to_string())
            // Nothing of the kernel's environment (provider keys...) reaches a sandbox.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Away from the terminal's signals: Ctrl-C is the kernel's to handle.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs in the forked child before exec and only calls
        // fcntl(2) (async-signal-safe) on an fd number it was given.
        unsafe {
            command.pre_exec(move || sys::clear_cloexec(theirs_raw));
        }
        let process = command.spawn()?;
        drop(theirs);
        nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .map_err(std::io::Error::from)?;
        // SAFETY: an OwnedFd keeps its fd open and unchanged until it is dropped, which
        // happens only with the AsyncFd.
        let socket = unsafe { AsyncFd::register(ours) }.map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Zygote { socket, _process: process })
    }

    async fn exchange(
        &self,
        request: &[u8],
        fds: &[BorrowedFd<'_>; SPAWN_FDS],
    ) -> std::io::Result<SpawnReply> {
        let raw: Vec<i32> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        loop {
            let mut ready = self.socket.writable().await?;
            let sent = ready.try_io(|socket| sys::send_with_fds(socket.get_ref().as_fd(), request, &raw));
            match sent {
                Ok(result) => {
                    result?;
                    break;
                }
                Err(_would_block) => continue,
            }
        }
        let mut buffer = vec![0u8; 64 * 1024];
        let length = loop {
            let mut ready = self.socket.readable().await?;
            match ready.try_io(|socket| sys::read(socket.get_ref().as_fd(), &mut buffer)) {
                Ok(result) => break result?,
                Err(_would_block) => continue,
            }
        };
        if length == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the zygote exited"));
        }
        serde_json::from_slice(&buffer[..length]).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_failures_read_like_the_none_tier() {
        let err = start_error("could not start /x/y: No such file or directory (os error 2)".into());
        assert_eq!(err.to_string(), "could not start \"/x/y\": No such file or directory (os error 2)");
        assert!(matches!(start_error("mount /proc: denied".into()), Error::Setup(_)));
    }
}
