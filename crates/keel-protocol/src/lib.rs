//! Keel's wire types. `rpc` is the syscall channel (JSON-RPC 2.0 over a Unix socket,
//! protocol 1, DESIGN section 3), `api` the HTTP API's bodies. Field names are snake_case;
//! every timestamp is Unix milliseconds (`*_at`, `ts`, `unix_ms`). `agui` holds the AG-UI
//! protocol's shapes, which keep that protocol's own camelCase names; `a2a` the A2A
//! protocol's (1.0, and the 0.3 spellings), likewise.

pub mod a2a;
pub mod agui;
pub mod api;
pub mod event;
pub mod rpc;
pub mod triggers;

pub use event::{EventKind, EventKinds};

/// The syscall protocol version this kernel speaks.
pub const PROTOCOL_VERSION: u32 = 1;
