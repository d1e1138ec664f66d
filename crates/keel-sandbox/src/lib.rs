//! The Sandbox API: how the kernel starts an agent process and controls its whole process
//! tree. Backends:
//!
//! - `process` ([`ProcessSandbox`], Linux): user, mount, PID, IPC, UTS and network
//!   namespaces; `pivot_root` into a minimal root built from a pure mount plan;
//!   no_new_privs, Landlock, a reviewed seccomp policy, rlimits, cgroup memory and pids
//!   limits, a wall clock; a pool of pre-built sandboxes. Its jailer is the zygote
//!   (`keel` re-executed with a hidden argument, see [`zygote::run_if_requested`]).
//! - `none` ([`NoSandbox`]): a plain child process in its own process group; explicit,
//!   for development.
//!
//! Also here: `tree` (signal a run's processes), `egress` (the allowlisting HTTP(S)
//! proxy the kernel serves to `allowlist` sandboxes) and `host` (what this host can
//! enforce, for refusals and `keel doctor`).

pub mod cgroup;
pub mod egress;
pub mod egress_auth;
pub mod host;
mod init;
pub mod none;
mod output;
pub mod plan;
mod pool;
pub mod process;
pub mod profile;
pub mod resolve;
pub mod seccomp;
mod spawner;
mod sys;
/// For the kernel: after many runs are swapped out, their memory goes back to the system.
pub use sys::{release_free_heap, set_heap_release};
/// The raw process and descriptor calls `keel-interp`'s template shares with the sandbox's
/// zygote and init: forking, reaping, pipes, standard descriptors, `SCM_RIGHTS`.
pub mod unix {
    pub use crate::sys::{
        Forked, close_from_except, dup2, fork, kill, pipe, reap, receive_with_fds, send_with_fds, try_reap,
    };
}
pub mod tree;
pub mod wire;
pub mod zygote;

use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitStatus;

use async_trait::async_trait;
use tokio::io::AsyncRead;

pub use none::NoSandbox;
pub use process::{ProcessConfig, ProcessSandbox};
pub use profile::{Network, Profile, Volume};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the agent command is empty; give a program to run, e.g. `keel run -- python3 agent.py`")]
    EmptyCommand,
    #[error("could not start {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start {program:?}: {reason}")]
    NotFound { program: String, reason: String },
    #[error("the working directory {0:?} does not exist or is not a directory")]
    BadWorkingDir(PathBuf),
    /// The host lacks a control the run needs; the message names it and the way to get
    /// it, and points at `keel doctor`.
    #[error("{0}")]
    Unenforceable(String),
    /// The tier cannot honor the profile at all (tier `none` enforces no limits).
    #[error("{0}")]
    Unsupported(String),
    #[error("the sandbox cannot be built: {0}")]
    Plan(#[from] plan::PlanError),
    /// The sandbox's init failed at the step it names.
    #[error("the sandbox could not be set up: {0}")]
    Setup(String),
    #[error("the sandbox helper (zygote) failed: {0}")]
    Zygote(#[source] std::io::Error),
    #[error("could not create the sandbox's cgroup: {0}")]
    Cgroup(#[source] std::io::Error),
}

/// Kernel resources an agent reaches. Sandboxed tiers bind them at the fixed paths of
/// [`plan::inside`]; tier `none` leaves them where they are.
#[derive(Debug, Clone, Default)]
pub struct KeelResources {
    pub syscall_socket: Option<PathBuf>,
    pub python_sdk: Option<PathBuf>,
    /// The directory holding the Node SDK's package `keel` (bound at
    /// `plan::inside::NODE_SDK`, which `NODE_PATH` names).
    pub node_sdk: Option<PathBuf>,
    /// The CA bundle that trusts the egress proxy's CA (`allowlist` runs with injected
    /// credentials); bound read-only at `plan::inside::CA_BUNDLE`.
    pub ca_bundle: Option<PathBuf>,
    /// Host paths that must never be visible to the agent (the kernel's data directory);
    /// masked if a bind would expose them.
    pub secrets: Vec<PathBuf>,
}

/// A loopback TCP port inside the sandbox that leads to a Unix socket of the kernel (the
/// LLM gateway, the egress proxy), so HTTP clients work while the network is absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    pub port: u16,
    pub host_socket: PathBuf,
}

impl Bridge {
    /// The base URL an agent uses for this bridge.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    /// Program and arguments; the program is looked up on `PATH` like a shell would.
    pub command: Vec<String>,
    pub cwd: PathBuf,
    /// The complete environment of the agent (backends do not add host variables; a
    /// sandboxed tier adds `PATH` when it is absent, naming where the program's
    /// interpreter is inside).
    pub env: Vec<(String, String)>,
    /// A value unique to the run, placed in the agent's environment as `KEEL_RUN_ID`; used
    /// to find every process of the run, even ones that left its process group.
    pub run_marker: String,
    /// What the run may use; see [`Profile`].
    pub profile: Profile,
    pub keel: KeelResources,
    pub bridges: Vec<Bridge>,
    /// Bytes for the agent's stdin: when set, stdin is a pipe that receives them and is
    /// then closed (written in the background, so a program that reads little does not
    /// hold up the launch); when `None`, stdin is closed (`/dev/null`).
    pub stdin: Option<Vec<u8>>,
    /// Bind the host files the command's arguments name (`python3 /elsewhere/agent.py`)
    /// read-only at their paths. Only for a command an operator wrote (`keel run`, a
    /// command tool in keel.toml): a command an agent chose (`proc.spawn`) must not get
    /// host files bound by naming them.
    pub bind_argument_files: bool,
}

/// An agent's output stream.
pub type Output = Pin<Box<dyn AsyncRead + Send>>;

/// A started agent. stdout and stderr are streams the kernel reads; stdin is
/// [`LaunchSpec::stdin`] or closed.
pub struct Child {
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    waiter: Waiter,
    ended_by: Option<String>,
}

enum Waiter {
    Reaped(none::Reaped),
    Sandboxed(Box<process::SandboxWaiter>),
}

impl Child {
    /// Waits until the agent has ended and its sandbox is gone; returns the agent's
    /// exit status (a killed sandbox reports SIGKILL).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match &mut self.waiter {
            Waiter::Reaped(child) => child.wait().await,
            Waiter::Sandboxed(waiter) => {
                let (status, ended_by) = waiter.wait().await;
                self.ended_by = ended_by;
                Ok(status)
            }
        }
    }

    /// When a sandbox limit ended the agent (wall clock, memory, CPU time), which one,
    /// in words. Known after [`Child::wait`].
    pub fn ended_by(&self) -> Option<&str> {
        self.ended_by.as_deref()
    }
}

/// A started agent and where to find it.
pub struct Launched {
    pub child: Child,
    /// The pid (in the kernel's PID namespace) of the run's top process, which is also
    /// its process group id: the agent itself for `none`, the sandbox's init for
    /// `process` (signalling it reaches the agent; killing it ends the sandbox).
    pub pid: u32,
    /// Whether a ready-built sandbox from the pool was claimed.
    pub pooled: bool,
}

/// A sandbox pool at one moment ([`Sandbox::pool_status`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// Sandboxes built and ready to be claimed.
    pub warm: usize,
    /// How many the pool aims to keep ready.
    pub target: usize,
}

/// A way to start agents. `launch` returns once the agent's process exists with its job:
/// for a cold start, once its program was exec'd (a failure is `launch`'s error); for a
/// sandbox claimed from a pool, once the job was handed to its waiting process (an exec
/// failure then ends the child, and [`Child::wait`] / [`Child::ended_by`] say why). The
/// caller owns the agent's lifetime and must end the whole tree with [`tree::kill_tree`]
/// when the run ends, and call [`Sandbox::shutdown`] when the kernel stops.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The tier name shown to users: `none`, `process`, ...
    fn tier(&self) -> &'static str;

    /// Whether the agent shares the host's view (file system, environment). When false,
    /// the kernel names its resources by their [`plan::inside`] paths and gives the
    /// agent a clean environment.
    fn shares_host(&self) -> bool {
        false
    }

    /// SIGKILLs every process of an agent this sandbox launched: `pid` is its
    /// [`Launched::pid`] (also its process group), `marker` its `run_marker`. Without a
    /// sandbox that contains them, that is the group and every process carrying the
    /// marker ([`tree::kill_tree`], which reads every process's environment).
    fn kill_tree(&self, pid: u32, marker: &str) {
        tree::kill_tree(Some(pid), marker);
    }

    /// Refuses a profile this tier cannot enforce here, with a message naming what is
    /// missing. The kernel calls it before it creates a run.
    fn check(&self, profile: &Profile) -> Result<()>;

    async fn launch(&self, spec: LaunchSpec) -> Result<Launched>;

    /// The pool of pre-built sandboxes now (`GET /v1/status`); a tier without a pool has
    /// none ready and none to keep.
    fn pool_status(&self) -> PoolStatus {
        PoolStatus::default()
    }

    /// The kernel is stopping and has killed every run's tree: release what the backend
    /// holds on the host (cgroups...). Returns within about a second.
    async fn shutdown(&self) {}
}
