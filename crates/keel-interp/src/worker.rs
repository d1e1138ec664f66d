//! The worker program's entry ([`worker_main`], which becomes the [`crate::template`]) and
//! a worker's life after the template forked it: confinement (rlimits, no_new_privs,
//! Landlock, the seccomp allowlist) and the loop that runs one job, forwarding tool calls
//! to the pool over stdout/stdin.

use std::{
    collections::BTreeMap,
    io::{BufRead, Write},
    os::fd::OwnedFd,
};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};
use serde_json::{Value, json};

use crate::{Job, Lang, javascript::Engine, protocol, run_in_process, sys};

/// `argv[1]` that makes the `keel` binary run [`worker_main`].
pub const WORKER_ARG: &str = "__keel-interp-worker";

/// The environment variable through which the pool tells the worker program (the
/// template) its own pid. The template sets `PR_SET_PDEATHSIG(SIGKILL)` itself and then
/// checks that its parent is still that process: the pool spawns without a `pre_exec`
/// hook, so the standard library can use `posix_spawn` (a vfork) instead of copying the
/// whole kernel process with fork.
pub const PARENT_ENV: &str = "KEEL_INTERP_PARENT";

/// Address space allowed above the worker's own at start, besides the job's memory limit:
/// the interpreter's code paths, QuickJS's and monty's bookkeeping, and stacks.
pub const INTERPRETER_HEADROOM_BYTES: u64 = 64 << 20;

/// An argument condition on an allowed system call.
#[derive(Debug, Clone, Copy)]
pub enum ArgRule {
    /// Any arguments.
    Any,
    /// Argument `index` must equal `value`.
    Equals { index: u8, value: u64 },
    /// Argument `index` must equal the worker's own pid (filled in at install time).
    OwnPid { index: u8 },
}

/// One allowed system call and why the worker needs it.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    pub name: &'static str,
    pub number: libc::c_long,
    pub rule: ArgRule,
    pub reason: &'static str,
}

/// The worker's seccomp allowlist. Anything else kills the worker (`SIGSYS`).
pub const SECCOMP_POLICY: &[Allowed] = &[
    Allowed {
        name: "read",
        number: libc::SYS_read,
        rule: ArgRule::Any,
        reason: "the job and tool replies on stdin",
    },
    Allowed {
        name: "write",
        number: libc::SYS_write,
        rule: ArgRule::Any,
        reason: "tool calls and the outcome on stdout; panic and abort messages on stderr",
    },
    Allowed { name: "mmap", number: libc::SYS_mmap, rule: ArgRule::Any, reason: "the allocator" },
    Allowed { name: "munmap", number: libc::SYS_munmap, rule: ArgRule::Any, reason: "the allocator" },
    Allowed {
        name: "mremap",
        number: libc::SYS_mremap,
        rule: ArgRule::Any,
        reason: "the allocator (realloc)",
    },
    Allowed { name: "mprotect", number: libc::SYS_mprotect, rule: ArgRule::Any, reason: "the allocator" },
    Allowed { name: "brk", number: libc::SYS_brk, rule: ArgRule::Any, reason: "the allocator" },
    Allowed {
        name: "madvise",
        number: libc::SYS_madvise,
        rule: ArgRule::Any,
        reason: "the allocator returns pages",
    },
    Allowed { name: "futex", number: libc::SYS_futex, rule: ArgRule::Any, reason: "std's locks (stdout)" },
    Allowed {
        name: "clock_gettime",
        number: libc::SYS_clock_gettime,
        rule: ArgRule::Any,
        reason: "time limits",
    },
    Allowed {
        name: "rt_sigreturn",
        number: libc::SYS_rt_sigreturn,
        rule: ArgRule::Any,
        reason: "signal return",
    },
    Allowed {
        name: "rt_sigprocmask",
        number: libc::SYS_rt_sigprocmask,
        rule: ArgRule::Any,
        reason: "abort() blocks signals before raising SIGABRT",
    },
    Allowed {
        name: "rt_sigaction",
        number: libc::SYS_rt_sigaction,
        rule: ArgRule::Any,
        reason: "abort() resets the SIGABRT handler",
    },
    Allowed {
        name: "sigaltstack",
        number: libc::SYS_sigaltstack,
        rule: ArgRule::Any,
        reason: "std's stack-overflow handler",
    },
    Allowed { name: "getrandom", number: libc::SYS_getrandom, rule: ArgRule::Any, reason: "HashMap seeds" },
    Allowed { name: "exit", number: libc::SYS_exit, rule: ArgRule::Any, reason: "exit" },
    Allowed {
        name: "exit_group",
        number: libc::SYS_exit_group,
        rule: ArgRule::Any,
        reason: "exit after the job",
    },
    Allowed { name: "close", number: libc::SYS_close, rule: ArgRule::Any, reason: "closing inherited fds" },
    Allowed { name: "sched_yield", number: libc::SYS_sched_yield, rule: ArgRule::Any, reason: "spin locks" },
    Allowed {
        name: "getpid",
        number: libc::SYS_getpid,
        rule: ArgRule::Any,
        reason: "abort() signals itself",
    },
    Allowed {
        name: "gettid",
        number: libc::SYS_gettid,
        rule: ArgRule::Any,
        reason: "abort() signals itself",
    },
    Allowed {
        name: "tgkill",
        number: libc::SYS_tgkill,
        rule: ArgRule::OwnPid { index: 0 },
        reason: "abort() raises SIGABRT; only at itself",
    },
    Allowed {
        name: "prlimit64",
        number: libc::SYS_prlimit64,
        rule: ArgRule::Equals { index: 0, value: 0 },
        reason: "lowering RLIMIT_AS and RLIMIT_CPU for the job; only its own limits",
    },
];

/// A system call that fails with an errno instead of killing the worker, and why.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    pub name: &'static str,
    pub number: libc::c_long,
    pub errno: i32,
    pub reason: &'static str,
}

/// Calls that std makes on ordinary paths (so killing would crash honest programs) and
/// that have a fallback when refused. Landlock would refuse the opens anyway.
pub const SECCOMP_REFUSED: &[Refused] = &[
    Refused {
        name: "openat",
        number: libc::SYS_openat,
        errno: libc::EACCES,
        reason: "std::thread::available_parallelism reads /proc/self/cgroup (monty's `re`); it falls back",
    },
    Refused {
        name: "sched_getaffinity",
        number: libc::SYS_sched_getaffinity,
        errno: libc::EPERM,
        reason: "std::thread::available_parallelism; it falls back to 1",
    },
];

/// Builds the filter that makes [`SECCOMP_REFUSED`] calls fail with their errno and lets
/// everything else through to the allowlist (the kernel applies the stricter verdict).
pub fn seccomp_refusals() -> Result<Vec<BpfProgram>, String> {
    let arch =
        TargetArch::try_from(std::env::consts::ARCH).map_err(|error| format!("seccomp arch: {error}"))?;
    let mut programs = Vec::new();
    for refused in SECCOMP_REFUSED {
        let rules = BTreeMap::from([(refused.number, Vec::new())]);
        let errno = u32::try_from(refused.errno).unwrap_or(1);
        let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno), arch)
            .map_err(|error| format!("seccomp filter for {}: {error}", refused.name))?;
        programs.push(filter.try_into().map_err(|error| format!("seccomp compile: {error}"))?);
    }
    Ok(programs)
}

/// Builds the allowlist filter for the worker whose pid is `own_pid`.
pub fn seccomp_program(own_pid: u32) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for allowed in SECCOMP_POLICY {
        let condition = |index: u8, value: u64| {
            SeccompCondition::new(index, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, value)
                .and_then(|condition| SeccompRule::new(vec![condition]))
                .map_err(|error| format!("seccomp rule for {}: {error}", allowed.name))
        };
        let entry = rules.entry(allowed.number).or_default();
        match allowed.rule {
            ArgRule::Any => {}
            ArgRule::Equals { index, value } => entry.push(condition(index, value)?),
            ArgRule::OwnPid { index } => entry.push(condition(index, u64::from(own_pid))?),
        }
    }
    for refused in SECCOMP_REFUSED {
        // Let them through here; the refusal filter turns them into errors.
        rules.entry(refused.number).or_default();
    }
    let arch =
        TargetArch::try_from(std::env::consts::ARCH).map_err(|error| format!("seccomp arch: {error}"))?;
    let filter = SeccompFilter::new(rules, SeccompAction::KillProcess, SeccompAction::Allow, arch)
        .map_err(|error| format!("seccomp filter: {error}"))?;
    filter.try_into().map_err(|error| format!("seccomp compile: {error}"))
}

/// Confines the calling process for good: rlimits, no_new_privs, Landlock deny-all,
/// then the seccomp allowlist. The process must be single-threaded.
pub fn confine() -> Result<(), String> {
    sys::set_rlimit(libc::RLIMIT_CORE, 0)?;
    sys::set_rlimit(libc::RLIMIT_FSIZE, 0)?;
    sys::set_rlimit(libc::RLIMIT_NPROC, 0)?;
    sys::set_rlimit(libc::RLIMIT_NOFILE, 4)?;
    sys::no_new_privs()?;
    landlock_deny_all()?;
    let program = seccomp_program(std::process::id())?;
    let refusals = seccomp_refusals()?;
    // The refusals go first: once the allowlist is in, `seccomp` itself is forbidden.
    for refusal in &refusals {
        seccompiler::apply_filter(refusal).map_err(|error| format!("install seccomp: {error}"))?;
    }
    seccompiler::apply_filter(&program).map_err(|error| format!("install seccomp: {error}"))
}

/// Handles every filesystem and network right and grants none; scopes signals and
/// abstract sockets. Best effort: a kernel without Landlock leaves this a no-op.
fn landlock_deny_all() -> Result<(), String> {
    use landlock::{ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, Scope};
    let abi = ABI::V7;
    let error = |error: landlock::RulesetError| format!("Landlock: {error}");
    Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(error)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(error)?
        .scope(Scope::from_all(abi))
        .map_err(error)?
        .create()
        .map_err(error)?
        .restrict_self()
        .map_err(error)?;
    Ok(())
}

/// Sets the job's own limits, after confinement (lowering only).
fn apply_job_limits(job: &Job, base_address_space: u64) -> Result<(), String> {
    // The inputs are the job's data, not the program's allocations: the worker holds them
    // parsed and the interpreter holds its own copy, so they come on top of the limit.
    let inputs = (crate::input_bytes(&job.inputs) as u64).saturating_mul(2);
    let address_space = base_address_space
        .saturating_add(job.limits.memory_bytes)
        .saturating_add(INTERPRETER_HEADROOM_BYTES)
        .saturating_add(inputs);
    sys::set_rlimit(libc::RLIMIT_AS, address_space)?;
    // A CPU backstop behind the interpreters' own clocks and the pool's wall clock.
    let cpu_seconds = job.limits.timeout.as_secs().saturating_add(2);
    sys::set_rlimit(libc::RLIMIT_CPU, cpu_seconds)
}

/// Runs a trivial tool-calling program in each language once, in the template, so no job
/// pays for the interpreters' first-touch page faults and lazy set-up.
pub(crate) fn warm_up() {
    for (lang, code) in
        [(Lang::Python, "echo(x=1)\nprint(1)\n1"), (Lang::JavaScript, "echo({x: 1}); console.log(1); 1")]
    {
        let job = Job {
            lang,
            code: code.to_owned(),
            inputs: serde_json::Map::new(),
            tools: vec!["echo".to_owned()],
            limits: crate::Limits::default(),
        };
        let _ = run_in_process(job, &mut |_, args| Ok(args));
    }
}

/// The body of the worker program: it becomes the template that forks each worker
/// ([`crate::template`]). Call it first thing in `main`, before any thread starts.
pub fn worker_main() -> ! {
    // Dies with the pool that started it (see `PARENT_ENV`); before anything else, so a
    // template whose pool is already gone never gets as far as saying it is ready.
    let parent = std::env::var(PARENT_ENV).ok().and_then(|pid| pid.parse::<u32>().ok());
    if let Err(error) = sys::die_with_parent(parent) {
        eprintln!("keel interpreter template: not started: {error}");
        std::process::exit(3);
    }
    crate::template::serve()
}

/// A worker's life, in the child the template forked: take `io` as stdin and stdout and
/// `stderr` as stderr, die with the template, confine, say ready, run one job, exit.
pub(crate) fn run(template: u32, io: OwnedFd, stderr: OwnedFd, base_address_space: u64) -> ! {
    if sys::become_stdio(io, stderr).is_err() {
        std::process::exit(3);
    }
    let stdout = std::io::stdout();
    let fatal = |message: String| -> ! {
        let _ = writeln!(stdout.lock(), "{}", json!({ "fatal": message }));
        std::process::exit(3)
    };
    // Before confinement, so a worker whose template is gone never says it is ready.
    if let Err(error) = sys::die_with_parent(Some(template)) {
        fatal(error);
    }
    // The pages it shares with the template are copied now, while it waits, not by the
    // job's first writes (before confinement: it reads /proc/self/maps).
    sys::populate_writable(64 << 20);
    if let Err(error) = confine() {
        fatal(format!("could not confine the worker: {error}"));
    }
    // Created now, used by a JavaScript job, dropped unused by a Python one.
    let engine = Engine::new();
    let mut out = stdout.lock();
    let _ = writeln!(out, "{}", json!({ "ready": true }));
    let _ = out.flush();
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) | Err(_) => std::process::exit(0),
        Ok(_) => {}
    }
    let job = match serde_json::from_str::<Value>(&line)
        .map_err(|error| error.to_string())
        .and_then(protocol::job_from_json)
    {
        Ok(job) => job,
        Err(error) => {
            let _ = writeln!(out, "{}", json!({ "fatal": format!("bad job: {error}") }));
            std::process::exit(4);
        }
    };
    drop(line);
    if let Err(error) = apply_job_limits(&job, base_address_space) {
        let _ = writeln!(out, "{}", json!({ "fatal": format!("could not set the job's limits: {error}") }));
        std::process::exit(3);
    }
    let mut call = |name: &str, args: Value| -> Result<Value, String> {
        let request = json!({ "call": name, "args": args });
        writeln!(out, "{request}").and_then(|()| out.flush()).map_err(|error| format!("pipe: {error}"))?;
        let mut reply = String::new();
        match input.read_line(&mut reply) {
            Ok(0) => std::process::exit(0),
            Ok(_) => {}
            Err(error) => return Err(format!("pipe: {error}")),
        }
        let mut reply: Value =
            serde_json::from_str(&reply).map_err(|error| format!("bad tool reply: {error}"))?;
        if let Some(value) = reply.get_mut("ok") {
            return Ok(value.take());
        }
        Err(reply.get("err").and_then(Value::as_str).unwrap_or("the tool failed").to_owned())
    };
    let outcome = match job.lang {
        Lang::JavaScript => crate::javascript::run_on(engine, job, &mut call),
        Lang::Python => run_in_process(job, &mut call),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", protocol::outcome_to_json(&outcome));
    let _ = out.flush();
    std::process::exit(0)
}
