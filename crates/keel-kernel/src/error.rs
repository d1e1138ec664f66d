//! The kernel's error types. [`Error`] is what the API answers: each variant says what
//! the caller did wrong or which step failed, and the HTTP layer maps them to status
//! codes. `SyscallError` is how a syscall fails inside the kernel (below).

use keel_protocol::rpc::{ErrorKind, RpcError};
use keel_types::RunId;
use serde_json::{Map, Value};

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
    /// A request that proves nothing about who sent it (a webhook delivery whose signature
    /// does not verify); the message says what was wrong, never the secret.
    #[error("{0}")]
    Unauthorized(String),
    /// A request body over the size the endpoint takes.
    #[error("{0}")]
    TooLarge(String),
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
    /// This node cannot serve the request now (it is draining, or its store is out of
    /// reach); another node, or a retry, can.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] keel_store::Error),
}

impl Error {
    /// Whether a retry (here or on another node) may succeed: the node is draining or the
    /// store is out of reach for now.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Store(keel_store::Error::Unavailable { .. }))
    }
}

/// [`SyscallError`]: how a syscall fails inside the kernel. Typed by its
/// [`ErrorKind`], so code asks `err.is(ErrorKind::Cancelled)` rather than comparing wire
/// codes (two kinds share -32600); it becomes the wire's [`RpcError`] only where it leaves
/// the kernel: the syscall socket, the journal, and the public API's answers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyscallError {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
    /// What the caller may act on beyond the message (a provider's class and status, a
    /// program's stdout); the wire's `data`, next to `kind`.
    pub(crate) detail: Map<String, Value>,
}

pub(crate) type Reply = Result<Value, SyscallError>;

impl SyscallError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> SyscallError {
        SyscallError { kind, message: message.into(), detail: Map::new() }
    }

    /// Adds one field to what the error carries.
    pub(crate) fn with(mut self, key: &str, value: impl Into<Value>) -> SyscallError {
        self.detail.insert(key.to_owned(), value.into());
        self
    }

    pub(crate) fn is(&self, kind: ErrorKind) -> bool {
        self.kind == kind
    }

    /// The wire form: `code`, `message`, and `data` = `{kind, ...detail}`.
    pub(crate) fn to_rpc(&self) -> RpcError {
        let mut error = self.kind.error(self.message.clone());
        if let Some(Value::Object(data)) = error.data.as_mut() {
            data.extend(self.detail.clone());
        }
        error
    }

    /// Back from the wire form (an error journaled by this or an earlier kernel). The kind
    /// comes from `data.kind`, else from the code; a code this kernel does not know reads
    /// as `internal`, keeping its message.
    pub(crate) fn from_rpc(error: RpcError) -> SyscallError {
        let mut detail = match error.data {
            Some(Value::Object(data)) => data,
            _ => Map::new(),
        };
        let named = detail.remove("kind").and_then(|kind| kind.as_str().and_then(kind_named));
        let kind = named.or_else(|| ErrorKind::ALL.into_iter().find(|k| k.code() == error.code));
        SyscallError { kind: kind.unwrap_or(ErrorKind::Internal), message: error.message, detail }
    }
}

/// A syscall failed because the kernel did (the store, a lost task), not the caller.
pub(crate) fn internal(err: impl std::fmt::Display) -> SyscallError {
    SyscallError::new(ErrorKind::Internal, format!("the kernel failed: {err}"))
}

fn kind_named(name: &str) -> Option<ErrorKind> {
    ErrorKind::ALL.into_iter().find(|kind| kind.as_str() == name)
}

impl From<SyscallError> for RpcError {
    fn from(error: SyscallError) -> RpcError {
        error.to_rpc()
    }
}

impl std::fmt::Display for SyscallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_round_trips_with_its_kind_and_detail() {
        for kind in ErrorKind::ALL {
            let error = SyscallError::new(kind, "it went wrong").with("status", 429);
            let wire = error.to_rpc();
            assert_eq!(wire.code, kind.code());
            assert_eq!(wire.data.as_ref().and_then(|d| d.get("kind")), Some(&Value::from(kind.as_str())));
            assert_eq!(SyscallError::from_rpc(wire), error);
        }
    }

    #[test]
    fn kinds_that_share_a_code_stay_apart() {
        let too_large = SyscallError::new(ErrorKind::TooLarge, "big").to_rpc();
        assert_eq!(too_large.code, ErrorKind::InvalidRequest.code());
        assert!(SyscallError::from_rpc(too_large).is(ErrorKind::TooLarge));
    }

    #[test]
    fn an_error_without_a_kind_reads_by_its_code() {
        let bare = RpcError { code: 1002, message: "gone".into(), data: None };
        assert!(SyscallError::from_rpc(bare).is(ErrorKind::NotFound));
        let unknown = RpcError { code: 77, message: "odd".into(), data: None };
        assert!(SyscallError::from_rpc(unknown).is(ErrorKind::Internal));
    }
}
