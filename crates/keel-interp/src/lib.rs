//! Programmatic tool calling: an agent's short Python or JavaScript program runs in a
//! confined, single-use worker process and calls the kernel's tools as ordinary functions.
//!
//! # Shape
//!
//! [`Pool::exec`] takes a [`Job`] (language, code, JSON inputs, granted tool names,
//! [`Limits`]) and a [`ToolHandler`], hands the job to a warm worker process over a pipe
//! and serves the worker's tool-call requests by awaiting [`ToolHandler::call`]. Each tool
//! call suspends the program; the reply resumes it with the value or raises the error.
//! [`run_in_process`] is the same two engines without a worker (the worker's body, and
//! what unit tests use); it must never run untrusted code in the kernel's own process.
//!
//! # Python (monty 0.0.23)
//!
//! The subset of Python 3 that [monty](https://crates.io/crates/monty) implements, with its
//! small standard library (`json`, `re` — a non-backtracking engine, so no ReDoS — `math`,
//! `datetime`, ...). There is no `eval`, `exec`, `compile`, `__import__` (`NameError`),
//! no `socket` or `subprocess` module, no dunder walk to host objects
//! (`().__class__.__subclasses__()` and `f.__globals__` raise `AttributeError`). monty's
//! `os`, `pathlib` and `open` exist but every operation suspends to the host as an OS
//! call, which the worker answers with `PermissionError("programs have no filesystem,
//! network or OS access; use the granted tools")`. Tools appear as:
//!
//! - `echo(x=1)`, `word_count(text="a b")`: a tool name without separators is a global
//!   function.
//! - `fs.read(path="a.txt")`, `mcp.fs.read_file(path="x")`: a dotted name is reached
//!   through namespace objects that the worker hands out lazily (monty's host-object
//!   attribute lookups). Segments are split on `.`, `:` and `/`, and `-` becomes `_`, as in
//!   JavaScript; a namespace can be passed around (`f = fs.read` works) but has no other
//!   attributes.
//! - `call_tool("fs.read", {"path": "a.txt"})` and `call_tool("fs.read", path="a.txt")`
//!   always work, with the tool's exact name.
//!
//! Arguments are keyword arguments or one positional dict; they become the tool's JSON
//! object (a positional non-dict is a `TypeError`). A tool error raises
//! `RuntimeError(<error text>)`; an ungranted tool (only reachable through `call_tool`,
//! since ungranted names are simply undefined) raises `PermissionError("tool \"x\" is not
//! granted ...")` without reaching the kernel. Both can be caught with `try`/`except`;
//! uncaught they end the job as `runtime` and `not_granted`. Inputs are global variables.
//! The result is the value of the last expression statement (no expression → `null`).
//! `print()` goes to `stdout`. `async` code is refused.
//!
//! # JavaScript (QuickJS via rquickjs 0.14)
//!
//! ES2023 in a plain global script: no modules, no `require` (a `ReferenceError`), dynamic
//! `import()` rejects (no loader), no `std`/`os` objects; `eval` and `Function` work but
//! reach only the same confined global object. Tools appear as `echo({x: 1})`,
//! `fs.read({path: "a.txt"})`, `mcp.fs.read_file({path: "x"})` (nested objects, segments
//! split on `.`, `:` and `/`, `-` → `_`) and `call_tool("fs.read", {path: "a.txt"})`. A
//! call blocks until the kernel answers and returns the value; a tool error throws an
//! `Error` whose message is the error text. The result is the script's completion value;
//! a `Promise` is resolved by running pending jobs (top-level `await` is not supported:
//! end with `(async () => { ... })()`). `console.log/info/warn/error` go to `stdout`.
//!
//! # Model calls
//!
//! Both languages (and the kernel's `cpython` harness) have `llm(prompt, system=None,
//! model=None, max_tokens=None)` → the model's text and `llm_batch(prompts, ...)` → the
//! texts in order (each prompt a string, or a dict / object with `prompt` and the same
//! options; the options given to `llm_batch` are the defaults). JavaScript takes the
//! options as an object: `llm(prompt, {system, model, max_tokens})`. One call or batch
//! suspends the program and goes to the host as one [`ToolHandler::llm`] (over the pipe:
//! a `call` of [`LLM_CALL`]); a failed call raises `RuntimeError` (JavaScript: `Error`)
//! with the host's message, a batch naming the first failed prompt. They are not tool
//! calls (no grant, not in `tool_calls`); `max_llm_calls` counts each prompt, and one
//! more than it ends the job with `llm_call_limit` (uncatchable), before any of that
//! batch reaches the host. `llm` and `llm_batch` win over tools of the same name
//! (`call_tool("llm", ...)` still reaches such a tool).
//!
//! # Results
//!
//! The result becomes JSON. Values with no JSON form become their string repr in Python
//! (tuples and sets become arrays, non-string dict keys their repr, non-finite floats
//! `null`); in JavaScript, `JSON.stringify` decides (`undefined`/functions → `null`,
//! `BigInt` or cycles → a `runtime` error). Values nested deeper than 128 levels are an
//! error in both.
//!
//! # Limits (see [`Limits`])
//!
//! - `timeout`: interpreter time, not counting time spent waiting for tools. Python checks
//!   it in the VM; JavaScript in QuickJS's interrupt handler (so a ReDoS regex stops too).
//!   The pool also SIGKILLs a worker whose interpreter time passes `timeout` + 250 ms, and
//!   caps the whole job, tool waits included, at `10 × timeout` (a tool that never returns
//!   cannot hold a worker forever). Both report `timeout`.
//! - `memory_bytes`: QuickJS's allocator limit (JavaScript), and for both languages the
//!   worker's `RLIMIT_AS`, set per job to the worker's address space at start plus
//!   `memory_bytes` plus 64 MiB of interpreter headroom. Monty has no allocator hook here,
//!   so a Python allocation past the limit aborts the worker, which the pool reports as
//!   `memory` (it recognises the allocator's message on the worker's stderr).
//! - `max_recursion`: Python's call depth (`RecursionError` → `recursion`); JavaScript's
//!   stack is capped at `max_recursion × 4 KiB`, clamped to 256 KiB..8 MiB, and its
//!   "Maximum call stack size exceeded" is `recursion`. A `max_recursion` above ~1500 lets
//!   QuickJS's cap exceed what the worker's 8 MiB main stack can hold: a deep JavaScript
//!   recursion then overflows the native stack and the job ends as `worker_crashed`.
//! - `max_output_bytes`: the captured stdout; passing it ends the job with `output_limit`.
//!   (In Python the overflowing `print` raises `MemoryError`, which a program could catch;
//!   the output stays bounded either way.)
//! - `max_tool_calls`: one more call ends the job with `tool_call_limit` (uncatchable).
//! - `max_llm_calls`: the same for model calls, `llm_call_limit`.
//! - Inputs are the job's data: the worker's `RLIMIT_AS` and QuickJS's heap limit grow by
//!   twice their size, so a 64 MiB input does not use up `memory_bytes`.
//!
//! # Isolation (the `interpreter` sandbox tier)
//!
//! The pool starts the worker program once, as the *template* (the `template` module), with
//! an environment holding only the pool's pid, a `SOCK_SEQPACKET` control socket as its
//! stdin, its stderr kept (bounded) and its own process group. The template's first act
//! is `PR_SET_PDEATHSIG(SIGKILL)` and a check that its parent is still the pool
//! (`worker::PARENT_ENV`); with no hook to run between fork and exec, the pool's spawn is
//! a `posix_spawn`, which does not copy the kernel's page tables. The template then warms
//! both interpreters up with fixed programs of its own and forks one worker per request,
//! handing the pool the worker's socket (its stdin and stdout), the read end of its
//! stderr, a pidfd (to kill it) and a pipe on which the template writes the worker's wait
//! status once it has reaped it. The template never runs a job's program.
//!
//! A forked worker takes its socket and stderr as fds 0-2 and closes every other
//! descriptor, sets its own death signal and checks that the template is still its
//! parent, and only then confines itself and says it is ready: `RLIMIT_CORE`,
//! `RLIMIT_FSIZE` and `RLIMIT_NPROC` to 0 and `RLIMIT_NOFILE` to 4, `PR_SET_NO_NEW_PRIVS`,
//! a Landlock ruleset that handles every filesystem and network right and grants none
//! (best effort: skipped on kernels without Landlock), and a seccomp allowlist ([`worker`]
//! module, `SECCOMP_POLICY`) whose default action kills the process: no `socket`,
//! `execve`, `fork`/`clone`, `kill` (only `tgkill` at itself, for `abort`). `openat` and
//! `sched_getaffinity` fail with an errno instead (`worker::SECCOMP_REFUSED`), because
//! std's `available_parallelism` tries them on ordinary paths and falls back. Just
//! before confining itself the worker copies the writable pages it shares with the
//! template, those the template had touched (`mincore`, then `MADV_POPULATE_WRITE`; not
//! memory the allocator mapped and never used), so that the job does not take those
//! copy-on-write faults one by one; confined, it creates its JavaScript engine. After
//! reading the job the worker lowers `RLIMIT_AS` and `RLIMIT_CPU` for that job (a fresh
//! worker per job makes per-job limits exact).
//!
//! Workers are copies of one process, so they share its address-space layout (as
//! Android's zygote children do): a program that learns an address learns it for every
//! worker, but it can reach no other process to use it on.
//!
//! # Wiring
//!
//! The `keel` binary calls [`worker_main`] first thing in `main` when `argv[1]` is
//! [`WORKER_ARG`], before any threads or runtime start, and builds the pool with
//! [`WorkerCommand::current_exe`]. `PR_SET_PDEATHSIG` fires when the *thread* that spawned
//! the template exits, so call [`Pool::exec`] from tokio worker threads (the normal case),
//! not from short-lived `spawn_blocking` threads.
//! A worker runs one job and exits; no state survives between jobs.

mod gate;
mod javascript;
mod pool;
mod protocol;
mod python;
mod sys;
mod template;
pub mod worker;

use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

use serde_json::Value;

pub use crate::{
    pool::{Pool, PoolStats},
    worker::{WORKER_ARG, worker_main},
};

/// The language of a job's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    Python,
    JavaScript,
}

impl Lang {
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::JavaScript => "javascript",
        }
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Lang {
    type Err = ExecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "python" | "py" => Ok(Lang::Python),
            "javascript" | "js" => Ok(Lang::JavaScript),
            other => Err(ExecError::new(
                ExecErrorKind::Invalid,
                format!("unknown language {other:?}; use \"python\" (\"py\") or \"javascript\" (\"js\")"),
            )),
        }
    }
}

/// Per-job resource limits. See the crate docs for how each is enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Interpreter time, excluding time spent waiting for tools.
    pub timeout: Duration,
    pub memory_bytes: u64,
    pub max_recursion: u32,
    pub max_output_bytes: usize,
    pub max_tool_calls: u32,
    /// Model calls (`llm`, and each prompt of `llm_batch`).
    pub max_llm_calls: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(5),
            memory_bytes: 64 << 20,
            max_recursion: 200,
            max_output_bytes: 1 << 20,
            max_tool_calls: 100,
            max_llm_calls: 50,
        }
    }
}

/// One program to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub lang: Lang,
    pub code: String,
    /// Bound as global variables; keys must be identifiers.
    pub inputs: serde_json::Map<String, Value>,
    /// The tool names the program may call, e.g. `fs.read`, `mcp:fs/read_file`.
    pub tools: Vec<String>,
    pub limits: Limits,
}

/// One tool call the program made, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    pub name: String,
    pub args: Value,
    pub ok: bool,
    /// Time the tool took, as seen by the interpreter.
    pub duration_us: u64,
}

/// Why a job failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecErrorKind {
    Syntax,
    Runtime,
    Timeout,
    Memory,
    Recursion,
    OutputLimit,
    ToolCallLimit,
    LlmCallLimit,
    NotGranted,
    WorkerCrashed,
    Invalid,
}

impl ExecErrorKind {
    pub const ALL: [ExecErrorKind; 11] = [
        ExecErrorKind::Syntax,
        ExecErrorKind::Runtime,
        ExecErrorKind::Timeout,
        ExecErrorKind::Memory,
        ExecErrorKind::Recursion,
        ExecErrorKind::OutputLimit,
        ExecErrorKind::ToolCallLimit,
        ExecErrorKind::LlmCallLimit,
        ExecErrorKind::NotGranted,
        ExecErrorKind::WorkerCrashed,
        ExecErrorKind::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecErrorKind::Syntax => "syntax",
            ExecErrorKind::Runtime => "runtime",
            ExecErrorKind::Timeout => "timeout",
            ExecErrorKind::Memory => "memory",
            ExecErrorKind::Recursion => "recursion",
            ExecErrorKind::OutputLimit => "output_limit",
            ExecErrorKind::ToolCallLimit => "tool_call_limit",
            ExecErrorKind::LlmCallLimit => "llm_call_limit",
            ExecErrorKind::NotGranted => "not_granted",
            ExecErrorKind::WorkerCrashed => "worker_crashed",
            ExecErrorKind::Invalid => "invalid",
        }
    }

    /// The inverse of [`as_str`](Self::as_str).
    pub fn parse(text: &str) -> Option<ExecErrorKind> {
        ExecErrorKind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl fmt::Display for ExecErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed job: the kind, and a message saying what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecError {
    pub kind: ExecErrorKind,
    pub message: String,
}

impl ExecError {
    pub fn new(kind: ExecErrorKind, message: impl Into<String>) -> Self {
        ExecError { kind, message: message.into() }
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ExecError {}

/// What a job came to. `stdout` and `tool_calls` are kept even when it failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutcome {
    pub result: Result<Value, ExecError>,
    pub stdout: String,
    pub tool_calls: Vec<ToolCallRecord>,
    /// Model calls the program made (`llm`, and each prompt of `llm_batch`).
    pub llm_calls: u32,
    /// Wall time of the whole job, tool waits included (through the pool: from claiming a
    /// worker to the outcome).
    pub duration: Duration,
}

impl ExecOutcome {
    pub(crate) fn failed(error: ExecError, duration: Duration) -> Self {
        ExecOutcome {
            result: Err(error),
            stdout: String::new(),
            tool_calls: Vec::new(),
            llm_calls: 0,
            duration,
        }
    }
}

/// Serves a program's tool calls.
///
/// Contract: `call` is awaited once per tool call, in program order, never concurrently
/// for one job, and only for names in the job's `tools`. If the job's future is dropped
/// or the job's overall cap passes, the `call` future is dropped too.
///
/// `llm` serves one `llm(...)` (one request) or one `llm_batch([...])` (several): the
/// answers come back in the requests' order, each the model's text or an error message
/// (raised in the program). It is awaited like `call`: in program order, never
/// concurrently with another call of the same job; the requests of one batch may run
/// concurrently inside it. The job's `max_llm_calls` has been checked before.
#[async_trait::async_trait]
pub trait ToolHandler: Send + Sync {
    async fn call(&self, name: &str, args: Value) -> Result<Value, String>;

    async fn llm(&self, requests: Vec<LlmRequest>) -> Vec<Result<String, String>> {
        requests.iter().map(|_| Err("this host serves no LLM calls".to_owned())).collect()
    }
}

/// The reserved name under which an engine hands a batch of model calls to its `call`
/// function (see [`run_in_process`]): the arguments are an array of [`LlmRequest`]s as
/// JSON, the answer an array of `{"ok": text}` / `{"err": message}`, in order. No tool
/// can have this name (tool names never start with `$`).
pub const LLM_CALL: &str = "$llm";

/// Most model calls of one `llm_batch` in flight at once; the host decides (see
/// [`ToolHandler::llm`]), this is what the kernel uses.
pub const LLM_BATCH_CONCURRENCY: usize = 8;

/// One model call a program asked for: `llm(prompt, system=None, model=None,
/// max_tokens=None)`, or one item of `llm_batch`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmRequest {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// How to start a worker process: a program that calls [`worker_main`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCommand {
    /// The running executable with [`WORKER_ARG`]: the `keel` binary's own wiring.
    pub fn current_exe() -> std::io::Result<WorkerCommand> {
        Ok(WorkerCommand { program: std::env::current_exe()?, args: vec![WORKER_ARG.to_owned()] })
    }
}

/// The pool's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub worker: WorkerCommand,
    /// Warm workers kept ready (default 2).
    pub size: usize,
}

impl PoolConfig {
    pub fn new(worker: WorkerCommand) -> PoolConfig {
        PoolConfig { worker, size: 2 }
    }
}

/// Runs a job in this process, calling `call` for each granted tool call.
///
/// This is the worker's body. It applies the interpreter-level limits only (no rlimits,
/// seccomp or process boundary), so it must not run untrusted code in the kernel.
pub fn run_in_process(job: Job, call: &mut dyn FnMut(&str, Value) -> Result<Value, String>) -> ExecOutcome {
    match job.lang {
        Lang::Python => python::run(job, call),
        Lang::JavaScript => javascript::run(job, call),
    }
}

/// About how many bytes the inputs take: their strings' lengths plus a little per value.
pub(crate) fn input_bytes(inputs: &serde_json::Map<String, Value>) -> usize {
    fn size(value: &Value) -> usize {
        match value {
            Value::String(text) => text.len() + 8,
            Value::Array(items) => items.iter().map(size).sum::<usize>() + 8,
            Value::Object(map) => map.iter().map(|(key, item)| key.len() + size(item)).sum::<usize>() + 8,
            _ => 8,
        }
    }
    inputs.iter().map(|(key, item)| key.len() + size(item)).sum()
}

/// Splits a tool name into the segments a program spells it with: `mcp:fs/read-file`
/// becomes `["mcp", "fs", "read_file"]`.
pub(crate) fn tool_path(name: &str) -> Vec<String> {
    name.split(['.', ':', '/']).map(|segment| segment.replace('-', "_")).collect()
}

#[cfg(test)]
mod tests;
