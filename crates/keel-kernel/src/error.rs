//! The kernel's error type. Each variant says what the caller did wrong or which step
//! failed; the HTTP layer maps them to status codes.

use keel_types::RunId;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no run {0}; `keel ps` lists the runs")]
    RunNotFound(RunId),
    /// The request is malformed; the message says how.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request is well-formed but the run's state does not allow it.
    #[error("{0}")]
    Conflict(String),
    /// A run's stored spec does not parse (another version of Keel wrote it, or it was
    /// damaged); the run cannot be launched or acted on as it says.
    #[error("the stored spec of run {run} cannot be read ({detail})")]
    RunSpec { run: RunId, detail: String },
    #[error(transparent)]
    IllegalTransition(#[from] keel_core::lifecycle::IllegalTransition),
    /// The caller's token may not do this (e.g. a tenant's token managing tenants).
    #[error("{0}")]
    Forbidden(String),
    /// Something other than a run does not exist (a tenant, a token); the message names it.
    #[error("{0}")]
    NotFound(String),
    /// A tenant's quota refuses the request for now; try again after `retry_after_secs`.
    #[error("{message}")]
    QuotaExceeded { message: String, retry_after_secs: u64 },
    #[error("another kernel is already using {dir}: {detail}")]
    DataDirLocked { dir: String, detail: String },
    #[error("could not prepare the data directory {dir}: {source}")]
    DataDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not listen on the syscall socket {path}: {source}")]
    SyscallSocket {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] keel_store::Error),
}
