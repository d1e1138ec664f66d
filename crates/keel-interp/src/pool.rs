//! The pool of single-use worker processes: the template that forks them, warm spares,
//! the pipe conversation for one job, the wall-clock caps and crash reporting.

use std::{
    os::{
        fd::{AsFd, OwnedFd},
        unix::process::ExitStatusExt,
    },
    process::{ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, unix::AsyncFd},
    net::unix::{OwnedReadHalf, OwnedWriteHalf, pipe},
    process::Command,
    task::JoinHandle,
};

use crate::{
    ExecError, ExecErrorKind, ExecOutcome, Job, LLM_CALL, LlmRequest, PoolConfig, ToolHandler, WorkerCommand,
    protocol, sys,
    template::{FAILED, READY, SPAWN, WORKER, WorkerFds},
};

/// Interpreter time past the job's timeout before the pool kills the worker itself.
const KILL_GRACE: Duration = Duration::from_millis(250);
/// The whole job, tool waits included, may take this many timeouts.
const OVERALL_CAP_FACTOR: u32 = 10;
/// How long the template has to warm up, and a worker to confine itself, before saying
/// it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a worker's (or the template's) stderr kept for crash reports.
const STDERR_KEEP: usize = 8 << 10;

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Worker processes started, ever.
    pub started: u64,
    /// Workers that died or had to be killed (crash, timeout, protocol violation).
    pub crashed: u64,
    /// Warm workers ready now.
    pub ready: usize,
    /// Templates started, ever: one, unless a template died and was replaced.
    pub templates: u64,
}

/// Runs jobs in single-use worker processes, keeping `size` of them warm.
///
/// Cancel safety: dropping the future of [`exec`](Self::exec) SIGKILLs its worker.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    config: PoolConfig,
    ready: Mutex<Vec<Worker>>,
    starting: AtomicUsize,
    started: AtomicU64,
    crashed: AtomicU64,
    templates: AtomicU64,
    /// The process that forks the workers; started on first use, replaced if it died.
    template: tokio::sync::Mutex<Option<Template>>,
}

/// A forked, confined worker waiting for its job. Dropping it SIGKILLs it.
struct Worker {
    pidfd: OwnedFd,
    stdin: OwnedWriteHalf,
    stdout: BufReader<OwnedReadHalf>,
    stderr: JoinHandle<Vec<u8>>,
    /// The template writes the worker's raw wait status here once it has reaped it.
    status: pipe::Receiver,
}

impl Worker {
    fn new(fds: WorkerFds) -> std::io::Result<Worker> {
        let io = std::os::unix::net::UnixStream::from(fds.io);
        io.set_nonblocking(true)?;
        let (stdout, stdin) = tokio::net::UnixStream::from_std(io)?.into_split();
        let stderr = keep_stderr(pipe::Receiver::from_owned_fd(fds.stderr)?);
        let status = pipe::Receiver::from_owned_fd(fds.status)?;
        Ok(Worker { pidfd: fds.pidfd, stdin, stdout: BufReader::new(stdout), stderr, status })
    }

    fn kill(&self) {
        sys::pidfd_kill(self.pidfd.as_fd());
    }

    fn has_exited(&self) -> bool {
        sys::has_exited(self.pidfd.as_fd())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads up to [`STDERR_KEEP`] bytes of `stderr` in the background, for a crash report.
fn keep_stderr(stderr: impl AsyncRead + Unpin + Send + 'static) -> JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut kept = Vec::new();
        let _ = stderr.take(STDERR_KEEP as u64).read_to_end(&mut kept).await;
        kept
    })
}

impl Pool {
    /// Creates the pool; when called inside a tokio runtime it starts warming workers at once,
    /// otherwise on the first [`exec`](Self::exec).
    pub fn new(config: PoolConfig) -> Pool {
        let pool = Pool {
            inner: Arc::new(Inner {
                config,
                ready: Mutex::new(Vec::new()),
                starting: AtomicUsize::new(0),
                started: AtomicU64::new(0),
                crashed: AtomicU64::new(0),
                templates: AtomicU64::new(0),
                template: tokio::sync::Mutex::new(None),
            }),
        };
        refill(&pool.inner);
        pool
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            started: self.inner.started.load(Ordering::Relaxed),
            crashed: self.inner.crashed.load(Ordering::Relaxed),
            ready: self.inner.ready.lock().map_or(0, |ready| ready.len()),
            templates: self.inner.templates.load(Ordering::Relaxed),
        }
    }

    /// Takes a warm worker that is still alive, dropping any that exited.
    fn claim_warm(&self) -> Option<Worker> {
        let mut ready = self.inner.ready.lock().ok()?;
        while let Some(worker) = ready.pop() {
            if !worker.has_exited() {
                return Some(worker);
            }
            self.inner.crashed.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    /// Runs `job` in a worker, serving its tool calls with `tools`.
    pub async fn exec(&self, job: Job, tools: &dyn ToolHandler) -> ExecOutcome {
        let started = Instant::now();
        // A warm worker that died while idle fails on the job line; one retry with another.
        for attempt in 0..2 {
            let warm = self.claim_warm();
            let worker = match warm {
                Some(worker) => worker,
                None => match start_worker(&self.inner).await {
                    Ok(worker) => worker,
                    Err(message) => {
                        self.inner.crashed.fetch_add(1, Ordering::Relaxed);
                        let error = ExecError::new(
                            ExecErrorKind::WorkerCrashed,
                            format!("could not start an interpreter worker: {message}"),
                        );
                        return ExecOutcome::failed(error, started.elapsed());
                    }
                },
            };
            let mut outcome = match drive(worker, &job, tools, &self.inner).await {
                Driven::Stale if attempt == 0 => continue,
                Driven::Stale => ExecOutcome::failed(
                    ExecError::new(
                        ExecErrorKind::WorkerCrashed,
                        "the worker closed its pipe before taking the job",
                    ),
                    started.elapsed(),
                ),
                Driven::Done(outcome) => outcome,
            };
            outcome.duration = started.elapsed();
            // Refill after the job, not before: a fork from the template costs CPU that
            // would otherwise compete with this job.
            refill(&self.inner);
            return outcome;
        }
        ExecOutcome::failed(
            ExecError::new(ExecErrorKind::WorkerCrashed, "no worker took the job"),
            started.elapsed(),
        )
    }
}
/// Starts workers in the background until `size` are ready or starting.
fn refill(inner: &Arc<Inner>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let ready = inner.ready.lock().map_or(0, |ready| ready.len());
    let wanted = inner.config.size.saturating_sub(ready + inner.starting.load(Ordering::Relaxed));
    for _ in 0..wanted {
        inner.starting.fetch_add(1, Ordering::Relaxed);
        let inner = inner.clone();
        runtime.spawn(async move {
            let worker = start_worker(&inner).await;
            match worker {
                Ok(worker) => {
                    if let Ok(mut ready) = inner.ready.lock() {
                        ready.push(worker);
                    }
                }
                Err(_) => {
                    inner.crashed.fetch_add(1, Ordering::Relaxed);
                }
            }
            inner.starting.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Has the template fork a worker and waits until it is confined and ready.
async fn start_worker(inner: &Arc<Inner>) -> Result<Worker, String> {
    // In a task of its own: a caller that stops waiting must not cut an exchange with the
    // template in half (its reply would answer the next request).
    let forking = inner.clone();
    let fds = tokio::spawn(async move { fork_worker(&forking).await })
        .await
        .map_err(|error| format!("forking a worker: {error}"))??;
    inner.started.fetch_add(1, Ordering::Relaxed);
    let mut worker = Worker::new(fds).map_err(|error| format!("the worker's pipes: {error}"))?;
    let mut line = String::new();
    let read =
        tokio::time::timeout(START_TIMEOUT, (&mut worker.stdout).take(64 << 10).read_line(&mut line)).await;
    match read {
        Ok(Ok(_)) if line.contains("\"ready\"") => Ok(worker),
        Ok(Ok(_)) => {
            Err(format!("the worker did not start: {} {}", line.trim(), crash_report(&mut worker).await))
        }
        Ok(Err(error)) => Err(format!("reading the worker: {error}")),
        Err(_) => Err(format!("the worker did not start within {START_TIMEOUT:?}")),
    }
}

/// One worker's descriptors from the template, starting the template first if there is
/// none, and replacing it once if it has died.
async fn fork_worker(inner: &Inner) -> Result<WorkerFds, String> {
    let mut template = inner.template.lock().await;
    let mut attempts = 0;
    loop {
        let current = match template.as_ref() {
            Some(current) => current,
            None => {
                inner.templates.fetch_add(1, Ordering::Relaxed);
                template.insert(Template::start(&inner.config.worker).await?)
            }
        };
        match current.fork().await {
            Ok(forked) => return forked,
            Err(error) => {
                *template = None;
                attempts += 1;
                if attempts == 2 {
                    return Err(format!("the interpreter template failed twice in a row: {error}"));
                }
            }
        }
    }
}

/// The process that forks workers ([`crate::template`]) and the pool's end of its socket.
struct Template {
    control: AsyncFd<OwnedFd>,
    /// Killed when the pool drops it; its workers die with it.
    process: tokio::process::Child,
    /// Its stderr, kept for the report of a template that did not start.
    stderr: JoinHandle<Vec<u8>>,
}

impl Template {
    async fn start(command: &WorkerCommand) -> Result<Template, String> {
        let program = command.program.display();
        let (ours, theirs) = sys::socket_pair(libc::SOCK_SEQPACKET)
            .map_err(|error| format!("a socket for the interpreter template: {error}"))?;
        // No `pre_exec` hook: without one the standard library spawns with `posix_spawn` (a
        // vfork), where a fork would copy the page tables of the whole kernel process on
        // this thread. The template sets its own death signal (`worker::PARENT_ENV`).
        let mut process = Command::new(&command.program)
            .args(&command.args)
            .env_clear()
            .env(crate::worker::PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| format!("spawn {program}: {error}"))?;
        let stderr = keep_stderr(process.stderr.take().ok_or("the template's stderr is missing")?);
        let control = sys::async_fd(ours).map_err(|error| format!("the template's socket: {error}"))?;
        let template = Template { control, process, stderr };
        let mut reply = [0u8; 16];
        match tokio::time::timeout(START_TIMEOUT, template.receive(&mut reply)).await {
            Ok(Ok((1, _))) if reply[0] == READY => Ok(template),
            Ok(_) => {
                let Template { mut process, stderr, .. } = template;
                let status = match tokio::time::timeout(Duration::from_secs(2), process.wait()).await {
                    Ok(Ok(status)) => describe(status),
                    _ => "did not exit".to_owned(),
                };
                let stderr = tokio::time::timeout(Duration::from_millis(500), stderr).await;
                let stderr = stderr.ok().and_then(Result::ok).unwrap_or_default();
                Err(format!(
                    "the interpreter template {program} did not start ({status}): {}",
                    String::from_utf8_lossy(&stderr).trim()
                ))
            }
            Err(_) => {
                Err(format!("the interpreter template {program} did not start within {START_TIMEOUT:?}"))
            }
        }
    }

    /// One worker forked: its descriptors, or why the template could not fork one. An
    /// error is the template's: it died or broke its protocol.
    async fn fork(&self) -> std::io::Result<Result<WorkerFds, String>> {
        loop {
            let mut ready = self.control.writable().await?;
            let sent = ready
                .try_io(|socket| keel_sandbox::unix::send_with_fds(socket.get_ref().as_fd(), &[SPAWN], &[]));
            if let Ok(sent) = sent {
                sent?;
                break;
            }
        }
        let mut reply = [0u8; 4096];
        let (length, fds) = self.receive(&mut reply).await?;
        match &reply[..length] {
            [] => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the template exited")),
            [WORKER] => WorkerFds::from_received(fds)
                .map(Ok)
                .ok_or_else(|| std::io::Error::other("a worker came without its four descriptors")),
            [FAILED, message @ ..] => Ok(Err(String::from_utf8_lossy(message).into_owned())),
            _ => Err(std::io::Error::other("the template broke its protocol")),
        }
    }

    async fn receive(&self, buffer: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
        loop {
            let mut ready = self.control.readable().await?;
            if let Ok(received) =
                ready.try_io(|socket| keel_sandbox::unix::receive_with_fds(socket.get_ref().as_fd(), buffer))
            {
                return received;
            }
        }
    }
}

/// What running a job on one worker came to.
enum Driven {
    Done(ExecOutcome),
    /// The worker was gone before it took the job; another may.
    Stale,
}

/// Why the conversation with a worker ended early.
enum Ended {
    /// Writing the job failed, or the worker reset the connection before answering
    /// anything: it was dead before it took the job.
    Stale,
    Error(ExecError),
    /// The worker closed its stdout: it died.
    Died,
}

async fn drive(mut worker: Worker, job: &Job, tools: &dyn ToolHandler, inner: &Inner) -> Driven {
    let started = Instant::now();
    match converse(&mut worker, job, tools, started).await {
        Ok(outcome) => Driven::Done(outcome),
        Err(ended) => {
            inner.crashed.fetch_add(1, Ordering::Relaxed);
            let error = match ended {
                Ended::Stale => return Driven::Stale,
                Ended::Error(error) => {
                    worker.kill();
                    error
                }
                Ended::Died => crash_error(job, &mut worker).await,
            };
            Driven::Done(ExecOutcome::failed(error, started.elapsed()))
        }
    }
}

async fn converse(
    worker: &mut Worker,
    job: &Job,
    tools: &dyn ToolHandler,
    started: Instant,
) -> Result<ExecOutcome, Ended> {
    let pipe_error = |error: std::io::Error| {
        Ended::Error(ExecError::new(ExecErrorKind::WorkerCrashed, format!("talking to the worker: {error}")))
    };
    let timeout = job.limits.timeout;
    let overall_cap = timeout.saturating_mul(OVERALL_CAP_FACTOR);
    let interpreter_cap = timeout.saturating_add(KILL_GRACE);
    let timed_out = || {
        Ended::Error(ExecError::new(
            ExecErrorKind::Timeout,
            format!(
                "the program ran past its {timeout:?} of interpreter time and its worker was killed; make it do \
                 less work or raise the timeout"
            ),
        ))
    };
    let overall_exceeded = |what: &str| {
        Ended::Error(ExecError::new(
            ExecErrorKind::Timeout,
            format!(
                "the job passed its overall cap of {overall_cap:?} (10 × timeout, tool waits included) {what}; \
                 check that the tools answer, or raise the timeout"
            ),
        ))
    };
    let max_line = usize::try_from(job.limits.memory_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(job.limits.max_output_bytes.saturating_mul(2))
        .saturating_add(1 << 20) as u64;

    let mut line = protocol::job_to_json(job).to_string();
    line.push('\n');
    let sent = worker.stdin.write_all(line.as_bytes()).await;
    if sent.is_err() || worker.stdin.flush().await.is_err() {
        return Err(Ended::Stale);
    }

    let mut interpreter_time = Duration::ZERO;
    // Nothing read from the worker yet: a reset then means it closed without reading the
    // job (a socket closed with unread data resets), so it died before taking it.
    let mut first = true;
    let mut calls: u32 = 0;
    let mut llm_calls: u32 = 0;
    loop {
        let slice = Instant::now();
        let overall_left = overall_cap.saturating_sub(started.elapsed());
        let wait = interpreter_cap.saturating_sub(interpreter_time).min(overall_left);
        line.clear();
        let read = tokio::time::timeout(wait, (&mut worker.stdout).take(max_line).read_line(&mut line)).await;
        interpreter_time += slice.elapsed();
        let read = match read {
            Ok(Err(error)) if first && error.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(Ended::Stale);
            }
            Ok(read) => read.map_err(pipe_error)?,
            Err(_) if overall_left <= wait => return Err(overall_exceeded("while the program ran")),
            Err(_) => return Err(timed_out()),
        };
        if read == 0 {
            return Err(Ended::Died);
        }
        first = false;
        let mut message: Value = serde_json::from_str(&line).map_err(|error| {
            Ended::Error(ExecError::new(
                ExecErrorKind::WorkerCrashed,
                format!("the worker broke the protocol ({error}); this is a bug or an escape attempt"),
            ))
        })?;
        if let Some(done) = message.get_mut("done") {
            return protocol::outcome_from_json(done.take()).map_err(|error| {
                Ended::Error(ExecError::new(ExecErrorKind::WorkerCrashed, format!("bad outcome: {error}")))
            });
        }
        if let Some(fatal) = message.get("fatal") {
            return Err(Ended::Error(ExecError::new(
                ExecErrorKind::WorkerCrashed,
                format!("the worker failed: {}", fatal.as_str().unwrap_or_default()),
            )));
        }
        let Some(name) = message.get("call").and_then(Value::as_str).map(str::to_owned) else {
            return Err(Ended::Error(ExecError::new(
                ExecErrorKind::WorkerCrashed,
                "the worker sent an unknown message",
            )));
        };
        if name == LLM_CALL {
            let requests = message.get_mut("args").map(Value::take).unwrap_or(Value::Null);
            let requests: Vec<LlmRequest> = serde_json::from_value(requests).map_err(|error| {
                Ended::Error(ExecError::new(
                    ExecErrorKind::WorkerCrashed,
                    format!(
                        "the worker sent malformed LLM calls ({error}); this is a bug or an escape attempt"
                    ),
                ))
            })?;
            // As for tools: the worker counts, and a subverted one is stopped here.
            llm_calls = llm_calls.saturating_add(u32::try_from(requests.len()).unwrap_or(u32::MAX));
            if llm_calls > job.limits.max_llm_calls {
                return Err(Ended::Error(ExecError::new(
                    ExecErrorKind::WorkerCrashed,
                    "the worker asked for LLM calls past its max_llm_calls; it was killed",
                )));
            }
            let overall_left = overall_cap.saturating_sub(started.elapsed());
            let answers = match tokio::time::timeout(overall_left, tools.llm(requests)).await {
                Ok(answers) => answers,
                Err(_) => return Err(overall_exceeded("waiting for LLM calls")),
            };
            let answers: Vec<Value> = answers
                .into_iter()
                .map(|answer| match answer {
                    Ok(text) => json!({ "ok": text }),
                    Err(message) => json!({ "err": message }),
                })
                .collect();
            line.clear();
            line.push_str(&json!({ "ok": answers }).to_string());
            line.push('\n');
            worker.stdin.write_all(line.as_bytes()).await.map_err(pipe_error)?;
            worker.stdin.flush().await.map_err(pipe_error)?;
            continue;
        }
        // The worker checks grants and the budget; checking again here means a worker
        // whose interpreter was subverted still cannot reach an ungranted tool.
        calls += 1;
        if !job.tools.contains(&name) || calls > job.limits.max_tool_calls {
            return Err(Ended::Error(ExecError::new(
                ExecErrorKind::WorkerCrashed,
                format!("the worker asked for {name:?} past its grants or budget; it was killed"),
            )));
        }
        let args = message.get_mut("args").map(Value::take).unwrap_or(Value::Null);
        let overall_left = overall_cap.saturating_sub(started.elapsed());
        let reply = match tokio::time::timeout(overall_left, tools.call(&name, args)).await {
            Ok(Ok(value)) => json!({ "ok": value }),
            Ok(Err(message)) => json!({ "err": message }),
            Err(_) => return Err(overall_exceeded(&format!("waiting for tool {name:?}"))),
        };
        line.clear();
        line.push_str(&reply.to_string());
        line.push('\n');
        worker.stdin.write_all(line.as_bytes()).await.map_err(pipe_error)?;
        worker.stdin.flush().await.map_err(pipe_error)?;
    }
}

/// Describes a worker that died mid-job, from its exit status and stderr.
async fn crash_error(job: &Job, worker: &mut Worker) -> ExecError {
    let report = crash_report(worker).await;
    if report.contains("memory allocation of") {
        return ExecError::new(
            ExecErrorKind::Memory,
            format!(
                "the program needed more than its memory limit of {} bytes; use less memory or raise the limit \
                 ({report})",
                job.limits.memory_bytes
            ),
        );
    }
    if report.contains("SIGXCPU") {
        return ExecError::new(
            ExecErrorKind::Timeout,
            format!("the program used up its CPU time ({report})"),
        );
    }
    ExecError::new(
        ExecErrorKind::WorkerCrashed,
        format!("the interpreter worker died running the program ({report}); the pool replaced it"),
    )
}

/// The worker's exit status and the start of its stderr, once it has exited.
async fn crash_report(worker: &mut Worker) -> String {
    let mut raw = [0u8; 4];
    let status = match tokio::time::timeout(Duration::from_secs(2), worker.status.read_exact(&mut raw)).await
    {
        Ok(Ok(_)) => describe(ExitStatus::from_raw(i32::from_ne_bytes(raw))),
        Ok(Err(_)) => "its exit status was lost with the template".to_owned(),
        Err(_) => {
            worker.kill();
            "did not exit; killed".to_owned()
        }
    };
    let stderr = match tokio::time::timeout(Duration::from_millis(500), &mut worker.stderr).await {
        Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        _ => String::new(),
    };
    if stderr.is_empty() { status } else { format!("{status}; stderr: {stderr}") }
}

fn describe(status: ExitStatus) -> String {
    match status.signal() {
        Some(signal) => format!("killed by {}", signal_name(signal)),
        None => format!("exited with {}", status.code().unwrap_or(-1)),
    }
}

fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGSYS => "SIGSYS (a forbidden system call)",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGXCPU => "SIGXCPU",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}
