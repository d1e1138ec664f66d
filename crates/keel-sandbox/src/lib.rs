//! The Sandbox API: how the kernel starts an agent process and controls its whole process
//! tree. Backends: `none` (a plain child process in its own process group; explicit,
//! for development). The Linux process sandbox tier plugs in behind the same trait.

pub mod none;
pub mod tree;

use std::path::PathBuf;

use async_trait::async_trait;

pub use none::NoSandbox;

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
    #[error("the working directory {0:?} does not exist or is not a directory")]
    BadWorkingDir(PathBuf),
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Program and arguments; the program is looked up on `PATH` like a shell would.
    pub command: Vec<String>,
    pub cwd: PathBuf,
    /// The complete environment of the agent (backends do not add host variables).
    pub env: Vec<(String, String)>,
    /// A value unique to the run, placed in the agent's environment as `KEEL_RUN_ID`; used
    /// to find every process of the run, even ones that left its process group.
    pub run_marker: String,
}

/// A started agent. stdout and stderr are pipes the kernel reads; stdin is closed.
pub struct Launched {
    pub child: tokio::process::Child,
    /// The agent's pid, which is also its process group id.
    pub pid: u32,
}

/// A way to start agents. `launch` returns once the process exists; the caller owns its
/// lifetime and must end the whole tree with [`tree::kill_tree`] when the run ends.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The tier name shown to users: `none`, `process`, ...
    fn tier(&self) -> &'static str;

    async fn launch(&self, spec: LaunchSpec) -> Result<Launched>;
}
