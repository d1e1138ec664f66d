//! The syscall path: the socket agents speak JSON-RPC on (`socket`), dispatch (check,
//! then replay, then the call's effect: `dispatch`), the journaling rule in one place
//! (`journal`), and one module per method family.

mod dispatch;
pub(crate) mod exec;
mod gateway;
mod governance;
pub(crate) mod ipc;
mod journal;
mod llm;
pub(crate) mod memory;
pub(crate) mod procs;
mod socket;
mod tools;
mod ui;

pub use gateway::RunHandle;
pub(crate) use gateway::mcp_host;

pub(crate) use crate::error::{Reply, SyscallError, internal};
pub(crate) use dispatch::{Listener, ToolCall, parse};
pub(crate) use journal::{Call as JournalCall, Effect, InStore, Journaling, completed_entry};
pub(crate) use socket::listen;
