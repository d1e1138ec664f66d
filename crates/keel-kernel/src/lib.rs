//! The Keel kernel: starts agents behind a [`keel_sandbox::Sandbox`], serves their
//! syscalls over a Unix socket, journals every syscall durably before answering, and
//! after a restart brings live runs back by relaunching the agent and answering its
//! syscalls from the journal until it asks something new.
//!
//! Everything that acts on a run enters through [`Kernel::execute`] as a [`Command`]
//! (HTTP and CLI parse into it) or through the syscall socket; queries are plain methods.

mod a2a;
mod admission;
mod agents;
mod agui;
mod approvals;
mod audit;
mod budget;
mod deltas;

mod error;
mod events;
mod kernel;
mod llmqueue;
mod mailboxes;
mod metrics;
mod outage;
mod paths;
mod run;
mod sandboxing;
mod sdk;
mod swap;
mod syscall;
mod telemetry;
mod tenants;
mod tools;
mod views;

pub use admission::SchedulerConfig;
pub use agents::{AgentDecl, AgentsConfig, Skill};

/// Now, in Unix milliseconds (0 if the clock is before 1970).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Locks a std mutex. The state behind the kernel's mutexes (maps with single inserts and
/// removes, plain numbers) stays consistent across a panic, so a poisoned lock is still
/// safe to use.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
pub use error::{Error, Result};
pub use events::EventStream;
pub use kernel::{
    A2aAnswer, A2aStream, AguiIds, AguiStream, AuditQuery, ClusterMember, DeclaredChanges, DeclaredTriggers,
    Kernel, KernelOptions, MAX_HOOK_BODY, RunChange, RunChanges, RunQuery, RunSort,
};
pub use metrics::Format as MetricsFormat;
pub use paths::{DataDir, LockedDataDir};
pub use run::{Answer, Command, CreateRun};
pub use swap::SwapIn;
pub use syscall::RunHandle;
pub use telemetry::{Error as TelemetryError, Telemetry};
pub use tenants::{DEFAULT_TENANT, Principal};
