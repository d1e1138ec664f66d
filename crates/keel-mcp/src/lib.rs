//! Keel's MCP adapter: mount Model Context Protocol servers as tool providers ([`Client`]),
//! and serve a run's governed tools as an MCP endpoint ([`router`]).
//!
//! Built on the official Rust SDK, [`rmcp`]. The client uses only the *tools* part of MCP;
//! the server serves tools, and resources when its [`ToolHost`] offers any.
//!
//! # Client ([`Client`])
//!
//! - **Transports.** [`Transport::Stdio`] spawns the server as a child process in its own
//!   process group, with a scrubbed environment: only `PATH`, `HOME` and `LANG` of the kernel
//!   are passed on, plus the configured `env`. Its stderr is read into `tracing` (target
//!   `keel_mcp::stderr`) and its last lines are quoted in connect errors.
//!   [`Transport::Http`] speaks the streamable HTTP transport (with or without a session;
//!   `headers` are sent on every request, e.g. `Authorization: Bearer ...`).
//! - **Handshake.** [`Client::connect`] runs `initialize` (the lifecycle of protocol versions
//!   up to 2025-11-25, which the official SDKs and the reference servers speak) and then
//!   `tools/list`, following `nextCursor` until the last page. Each of the two must finish
//!   within [`ServerConfig::timeout`].
//! - **Calls.** [`Client::call`] sends `tools/call` and waits at most
//!   [`ServerConfig::timeout`]. A result with `isError: true` becomes [`Error::ToolFailed`].
//!   A timed-out call, and a call whose future is dropped, sends
//!   `notifications/cancelled` for the request (rmcp does this when the request future is
//!   dropped), so the server can stop working on it; the connection stays usable.
//! - **Lifecycle.** [`Client::close`] closes the child's stdin, waits up to 3 s, sends
//!   `SIGTERM`, waits again, kills it, and then kills what is left of its process group (so
//!   `npx`/`uv run` wrappers do not leave the real server behind); for HTTP it ends the
//!   session with `DELETE`. Dropping the last clone of a running `Client`, or a failed
//!   connect, kills the process group at once. [`Client::is_closed`] turns true when the
//!   server went away (the child exited) or `close` was called. A server is never
//!   restarted here: reconnecting is the caller's decision.
//! - **Extras.** [`Client::with_timeout`] gives a handle with another per-call timeout on the
//!   same connection; [`Client::process_id`] is the stdio child's pid.
//!
//! Not supported: resources, prompts, sampling, elicitation (a server that asks for input
//! mid-call gets a protocol error), roots, logging and `listChanged` notifications (the tool
//! list is read once, at connect), MCP's OAuth flow (pass a bearer token in `headers`).
//!
//! # Server ([`router`])
//!
//! [`router`] returns an axum [`Router`](axum::Router) that serves a [`ToolHost`] over the
//! streamable HTTP transport at `/` (the kernel nests it at `/mcp`). Sessions are stateful
//! (rmcp's in-memory `LocalSessionManager`; responses are SSE streams), which is what the
//! official Python and TypeScript clients expect by default.
//!
//! - **Auth.** Every request (POST, GET and DELETE) must carry `Authorization: Bearer
//!   <token>`; [`ToolHost::authenticate`] decides, *before* any MCP processing, and a refusal
//!   is an HTTP 401 with `WWW-Authenticate: Bearer`. The token of each request is the one
//!   handed to [`ToolHost::list`] and [`ToolHost::call`]; a session carries no authority.
//!   Because of the token, the DNS-rebinding `Host` allowlist of rmcp is switched off (the
//!   kernel is reached under names we cannot know here, e.g. from inside a sandbox).
//! - **Results.** `Ok(value)` becomes one text content block holding the value as JSON, plus
//!   `structuredContent` when the value is an object. [`HostError::Failed`], `Denied`,
//!   `NotFound` and `InvalidParams` become a result with `isError: true` whose text is the
//!   error's `Display` (`msg`, `denied: msg`, `no such tool: msg`, `invalid arguments:
//!   msg`; MCP tool errors are results, so the model can read them). A served name that
//!   [`kernel_name`] cannot map back is `no such tool`. `Unauthorized` during a call
//!   becomes a JSON-RPC error (the HTTP status is already sent by then).
//! - **Cancellation.** When the client sends `notifications/cancelled`, the future returned
//!   by [`ToolHost::call`] is dropped.
//! - **Resources.** A host whose [`ToolHost::resource_templates`] is not empty announces
//!   the `resources` capability and answers `resources/list`, `resources/templates/list`
//!   and `resources/read` (one text content). A read the host answers
//!   [`HostError::NotFound`] is JSON-RPC `-32002` (MCP's "resource not found"),
//!   [`HostError::InvalidParams`] `-32602`.
//! - **Session end.** A client's `DELETE` of its session is answered `204 No Content`
//!   (rmcp says `202`, which the spec's clients take as a failed termination).
//! - **Limits.** No pagination of `tools/list` (one page with every tool), no
//!   `listChanged` notifications; sessions live in memory until the client deletes them or
//!   has been idle for 5 minutes (rmcp's default), and do not survive a kernel restart.
//!
//! # Tool names
//!
//! MCP (2025-06-18 / 2025-11-25) says tool names SHOULD be 1 to 128 characters of
//! `[A-Za-z0-9_.-]`. Kernel tool names such as `fs.read` or `kv.get` are therefore served
//! unchanged. Any other character, and the escape character `-` itself, is escaped, so the
//! mapping is reversible: `-` becomes `--`, and every other byte outside the set becomes
//! `-` plus two upper-case hex digits (`mcp:search` -> `mcp-3Asearch`, `a/b` -> `a-2Fb`,
//! `web-search` -> `web--search`). See [`served_name`] and [`kernel_name`]. Names of
//! *mounted* servers' tools are not rewritten by this crate.

mod client;
mod names;
mod server;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{Client, RemoteTool, ServerConfig, Transport};
pub use names::{kernel_name, served_name};
pub use server::{HostError, ResourceInfo, ResourceTemplateInfo, ResourceText, ToolHost, ToolInfo, router};

/// What went wrong talking to an MCP server. Every message names the server (or tool) and the
/// step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Spawning the server, the HTTP connection, the `initialize` handshake or `tools/list`
    /// failed.
    #[error("could not connect to MCP server {0}")]
    Connect(String),
    /// The server did not answer within the configured timeout; the request was cancelled.
    #[error("{0} (the request was cancelled; raise the server's `timeout` if the tool is just slow)")]
    Timeout(String),
    /// The tool ran and reported an error (`isError: true`); the text is the tool's own.
    #[error("tool failed: {0}")]
    ToolFailed(String),
    /// The server refused the request at the protocol level (unknown tool, invalid arguments)
    /// or sent something this client does not understand.
    #[error("MCP protocol error: {0}")]
    Protocol(String),
    /// The connection is gone (the child exited, the HTTP session ended, or `close` was
    /// called); connect again to keep using the server.
    #[error("MCP server connection closed: {0} (connect again to keep using this server)")]
    Closed(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
