//! Runs: their spec, the live-run registry, lifecycle transitions, launching, exit,
//! operator commands and recovery. Each file is one concern of the run's life.

mod admission;
mod approvals;
mod budget;
mod cluster;
mod control;
mod exit;
mod frameworks;
mod launch;
mod lifecycle;
mod recovery;
mod registry;
mod spec;
mod swap;

pub use control::{Answer, Command};
pub(crate) use registry::{BufferedRead, Launching, LiveRun, PendingAsk, Replay};
pub use spec::CreateRun;
pub(crate) use spec::{MAX_INPUT_BYTES, RunSpec};
