//! The syscall path: the socket agents speak JSON-RPC on (`socket`), dispatch (check,
//! then replay, then the call's effect: `dispatch`), the journaling rule in one place
//! (`journal`), and the typed error every method family returns (`error`).

mod dispatch;
mod error;
mod journal;
mod socket;

pub(crate) use dispatch::{ToolCall, parse};
pub(crate) use error::{Reply, SyscallError};
pub(crate) use journal::{Call as JournalCall, Effect, Journaling, completed_entry};
pub(crate) use socket::listen;

/// The kernel failed (the store, a lost task), not the caller.
pub(crate) fn internal(err: impl std::fmt::Display) -> SyscallError {
    SyscallError::internal(err)
}
