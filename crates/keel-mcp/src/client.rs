//! The MCP client: connect to one server over stdio or streamable HTTP, list its tools, call
//! them with a timeout, and close it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use process_wrap::tokio::{CommandWrap, ProcessGroup};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, Tool,
};
use rmcp::service::{ClientInitializeError, Peer, RoleClient, RunningService, ServiceError, ServiceExt as _};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::ChildStderr;

use crate::{Error, Result};

/// The environment variables of the kernel a stdio server inherits; everything else must be
/// listed in [`Transport::Stdio::env`].
const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How many of the last stderr lines of a stdio server are quoted in a connect error.
const STDERR_TAIL_LINES: usize = 20;

/// One MCP server to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The server's name in Keel; every error message names it.
    pub name: String,
    /// How to reach the server.
    pub transport: Transport,
    /// Limit for the handshake (initialize + tools/list together) and for each tool call.
    pub timeout: Duration,
}

impl ServerConfig {
    /// The per-call timeout used unless the config says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// A config with [`Self::DEFAULT_TIMEOUT`].
    pub fn new(name: impl Into<String>, transport: Transport) -> Self {
        Self { name: name.into(), transport, timeout: Self::DEFAULT_TIMEOUT }
    }
}

/// How to reach an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Spawn `command` (program and arguments) and speak JSON-RPC over its stdin/stdout. The
    /// child inherits nothing of the kernel's environment except `PATH`, `HOME` and `LANG`,
    /// plus `env` (which wins).
    Stdio { command: Vec<String>, env: BTreeMap<String, String>, cwd: Option<PathBuf> },
    /// The streamable HTTP transport at `url`; `headers` go with every request.
    Http { url: String, headers: BTreeMap<String, String> },
}

/// A tool offered by a mounted server, as its `tools/list` described it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    pub name: String,
    /// Empty when the server gave none.
    pub description: String,
    /// The tool's `inputSchema` (a JSON Schema object).
    pub input_schema: Value,
    /// The server's `annotations.readOnlyHint` (false when absent). A hint from the server,
    /// not a guarantee: policy decides what to trust.
    pub read_only: bool,
}

/// One connected MCP server. Cheap to clone; all clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Per-call limit; see [`Client::with_timeout`].
    timeout: Duration,
}

struct Inner {
    name: String,
    /// The stdio child's process id (the leader of its process group).
    process_id: Option<u32>,
    tools: Vec<RemoteTool>,
    peer: Peer<RoleClient>,
    /// `None` once `close` took it. Dropping it (with the last clone) kills a stdio child.
    service: Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
}

impl Inner {
    /// Whether the connection is still up, i.e. the server (the process group leader) has not
    /// exited and been reaped, so its process group id cannot have been reused.
    fn is_running(&self) -> bool {
        let service_running = match self.service.lock() {
            Ok(service) => service.as_ref().is_some_and(|service| !service.is_closed()),
            Err(poisoned) => poisoned.into_inner().as_ref().is_some_and(|service| !service.is_closed()),
        };
        service_running && !self.peer.is_transport_closed()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.is_running() {
            kill_process_group(&self.name, self.process_id);
        }
    }
}

/// Kill what is left of a stdio server's process group. rmcp stops the server process itself
/// (gracefully if it can); processes the server started (a wrapper's real server, helpers)
/// would outlive it otherwise. Only call it while the group leader has not been reaped, or
/// right after rmcp reaped it: later its id could name someone else's process group.
fn kill_process_group(name: &str, process_id: Option<u32>) {
    let Some(process_id) = process_id.and_then(|id| i32::try_from(id).ok()) else {
        return;
    };
    use nix::sys::signal::{Signal, killpg};
    match killpg(nix::unistd::Pid::from_raw(process_id), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => tracing::warn!(server = %name, %error, "could not kill the MCP server's process group"),
    }
}

/// Kills a stdio server's process group when a connect attempt fails (dropped armed).
struct ProcessGroupGuard<'a> {
    name: &'a str,
    process_id: Option<u32>,
}

impl ProcessGroupGuard<'_> {
    fn disarm(mut self) -> Option<u32> {
        self.process_id.take()
    }
}

impl Drop for ProcessGroupGuard<'_> {
    fn drop(&mut self) {
        kill_process_group(self.name, self.process_id);
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Client")
            .field("name", &self.inner.name)
            .field("tools", &self.inner.tools.len())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Client {
    /// Start or reach the server, run the `initialize` handshake and list all its tools
    /// (following pagination). The whole sequence is limited by `config.timeout`.
    pub async fn connect(config: &ServerConfig) -> Result<Client> {
        let name = config.name.as_str();
        let client_config = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("keel", env!("CARGO_PKG_VERSION")),
        );
        let advice = match &config.transport {
            Transport::Stdio { command, .. } => format!(
                "check that `{}` starts an MCP server on stdio",
                command.first().map(String::as_str).unwrap_or_default()
            ),
            Transport::Http { url, .. } => format!("check that {url} is an MCP streamable HTTP endpoint"),
        };
        let (handshake, stderr_tail, process_id) = match &config.transport {
            Transport::Stdio { command, env, cwd } => {
                let (child, stderr) = spawn_child(name, command, env, cwd.as_ref())?;
                let process_id = child.id();
                let tail = StderrTail::follow(name, stderr);
                let handshake = tokio::time::timeout(config.timeout, client_config.serve(child)).await;
                (handshake, Some(tail), process_id)
            }
            Transport::Http { url, headers } => {
                let transport = http_transport(name, url, headers)?;
                let handshake = tokio::time::timeout(config.timeout, client_config.serve(transport)).await;
                (handshake, None, None)
            }
        };
        let process_group = ProcessGroupGuard { name, process_id };
        let service = match handshake {
            Ok(Ok(service)) => service,
            Ok(Err(error)) => {
                let failure = if error.is_authorization_required() {
                    "HTTP 401 Unauthorized; check the bearer token in the `Authorization` header".to_owned()
                } else {
                    format!("{}; {advice}", describe_initialize_error(&error))
                };
                return Err(Error::Connect(format!(
                    "`{name}`: the initialize handshake failed: {failure}{}",
                    StderrTail::describe(stderr_tail).await
                )));
            }
            Err(_elapsed) => {
                return Err(Error::Connect(format!(
                    "`{name}`: the initialize handshake timed out after {:?}; {advice} (or raise `timeout` if \
                     it starts slowly){}",
                    config.timeout,
                    StderrTail::describe(stderr_tail).await
                )));
            }
        };
        let peer = service.peer().clone();
        let tools = match tokio::time::timeout(config.timeout, peer.list_all_tools()).await {
            Ok(Ok(tools)) => tools.into_iter().map(remote_tool).collect(),
            Ok(Err(error)) => {
                return Err(Error::Connect(format!(
                    "`{name}`: tools/list failed: {}{}",
                    describe_service_error(&error),
                    StderrTail::describe(stderr_tail).await
                )));
            }
            Err(_elapsed) => {
                return Err(Error::Connect(format!(
                    "`{name}`: tools/list timed out after {:?}",
                    config.timeout
                )));
            }
        };
        Ok(Client {
            inner: Arc::new(Inner {
                name: config.name.clone(),
                process_id: process_group.disarm(),
                tools,
                peer,
                service: Mutex::new(Some(service)),
            }),
            timeout: config.timeout,
        })
    }

    /// A handle on the same connection whose calls time out after `timeout` instead (for a
    /// tool known to be slow, or a caller with less time left).
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client { inner: self.inner.clone(), timeout }
    }

    /// The process id of a stdio server (the leader of its process group); `None` for HTTP.
    pub fn process_id(&self) -> Option<u32> {
        self.inner.process_id
    }

    /// The server's name from its [`ServerConfig`].
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The tools the server listed at connect time.
    pub fn tools(&self) -> &[RemoteTool] {
        &self.inner.tools
    }

    /// Call `tool` with `args` (a JSON object, or `null` for none).
    ///
    /// Returns `{"content": [...]}` plus `"structuredContent"` when the server sent one.
    /// Dropping the returned future, or hitting the timeout, sends `notifications/cancelled`
    /// for the request.
    pub async fn call(&self, tool: &str, args: Value) -> Result<Value> {
        let name = &self.inner.name;
        if self.is_closed() {
            return Err(Error::Closed(format!("`{name}` is not running, so `{tool}` was not called")));
        }
        let arguments = match args {
            Value::Object(arguments) => Some(arguments),
            Value::Null => None,
            other => {
                return Err(Error::Protocol(format!(
                    "`{name}`: arguments for `{tool}` must be a JSON object, got {other}"
                )));
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let response = match tokio::time::timeout(self.timeout, self.inner.peer.call_tool_once(params)).await
        {
            Ok(response) => response,
            Err(_elapsed) => {
                return Err(Error::Timeout(format!(
                    "MCP server `{name}`: tool `{tool}` did not answer within {:?}",
                    self.timeout
                )));
            }
        };
        match response {
            Ok(CallToolResponse::Complete(result)) => call_result(name, tool, result),
            Ok(CallToolResponse::InputRequired(_)) => Err(Error::Protocol(format!(
                "`{name}`: tool `{tool}` asked the client for input (elicitation/sampling), which Keel does not support"
            ))),
            Ok(_task_or_newer) => Err(Error::Protocol(format!(
                "`{name}`: tool `{tool}` answered with a task or another deferred result, which Keel does not support"
            ))),
            Err(error) => Err(call_error(name, tool, self.timeout, error)),
        }
    }

    /// End the connection: for stdio, close the child's stdin, then `SIGTERM`, then kill its
    /// process group (at most ~6 s); for HTTP, end the session. Other clones see
    /// [`Self::is_closed`] afterwards.
    pub async fn close(self) {
        // A server that exited on its own was reaped long ago; its group id may be reused.
        let was_running = self.inner.is_running();
        let service = match self.inner.service.lock() {
            Ok(mut service) => service.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(mut service) = service
            && let Err(error) = service.close().await
        {
            tracing::warn!(server = %self.inner.name, %error, "closing the MCP client task failed");
        }
        if was_running {
            kill_process_group(&self.inner.name, self.inner.process_id);
        }
    }

    /// Whether the server went away (the child exited, the connection broke) or `close` ran.
    pub fn is_closed(&self) -> bool {
        !self.inner.is_running()
    }
}

fn spawn_child(
    name: &str,
    command: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&PathBuf>,
) -> Result<(TokioChildProcess, Option<ChildStderr>)> {
    let Some((program, args)) = command.split_first() else {
        return Err(Error::Connect(format!("`{name}`: the stdio command is empty; give the program to run")));
    };
    let mut child_command = tokio::process::Command::new(program);
    child_command.args(args).env_clear();
    for variable in INHERITED_ENV {
        if let Some(value) = std::env::var_os(variable) {
            child_command.env(variable, value);
        }
    }
    child_command.envs(env);
    if let Some(cwd) = cwd {
        child_command.current_dir(cwd);
    }
    // Its own process group, so that closing the server also ends what it spawned
    // (`npx` -> `node`, `uv run` -> `python`, ...).
    let mut wrapped = CommandWrap::from(child_command);
    wrapped.wrap(ProcessGroup::leader());
    TokioChildProcess::builder(wrapped).stderr(std::process::Stdio::piped()).spawn().map_err(|error| {
        let location = cwd.map(|cwd| format!(" in {}", cwd.display())).unwrap_or_default();
        Error::Connect(format!(
            "`{name}`: could not spawn `{program}`{location}: {error}; check that it is installed and on PATH"
        ))
    })
}

fn http_transport(
    name: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<StreamableHttpClientTransport<reqwest::Client>> {
    let mut custom_headers = HashMap::new();
    for (header, value) in headers {
        let header_name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|error| Error::Connect(format!("`{name}`: invalid header name `{header}`: {error}")))?;
        let header_value = HeaderValue::from_str(value).map_err(|error| {
            Error::Connect(format!("`{name}`: invalid value for header `{header}`: {error}"))
        })?;
        custom_headers.insert(header_name, header_value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).custom_headers(custom_headers);
    Ok(StreamableHttpClientTransport::from_config(config))
}

fn remote_tool(tool: Tool) -> RemoteTool {
    RemoteTool {
        read_only: tool
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.read_only_hint)
            .unwrap_or(false),
        description: tool.description.map(|description| description.into_owned()).unwrap_or_default(),
        input_schema: Value::Object((*tool.input_schema).clone()),
        name: tool.name.into_owned(),
    }
}

fn call_result(name: &str, tool: &str, result: CallToolResult) -> Result<Value> {
    if result.is_error == Some(true) {
        let text = content_text(&result.content);
        let text =
            if text.is_empty() { format!("`{tool}` on `{name}` failed without a message") } else { text };
        return Err(Error::ToolFailed(text));
    }
    let content = serde_json::to_value(&result.content).map_err(|error| {
        Error::Protocol(format!("`{name}`: the result of `{tool}` could not be re-encoded: {error}"))
    })?;
    let mut value = json!({ "content": content });
    if let Some(structured) = result.structured_content {
        value["structuredContent"] = structured;
    }
    Ok(value)
}

/// The text of a tool result, for error messages: text blocks as they are, other blocks as
/// JSON.
fn content_text(content: &[ContentBlock]) -> String {
    let parts: Vec<String> = content
        .iter()
        .map(|block| match serde_json::to_value(block) {
            Ok(Value::Object(object)) if object.get("type") == Some(&json!("text")) => {
                object.get("text").and_then(Value::as_str).unwrap_or_default().to_owned()
            }
            Ok(other) => other.to_string(),
            Err(error) => format!("<unencodable content: {error}>"),
        })
        .collect();
    parts.join("\n")
}

fn call_error(name: &str, tool: &str, timeout: Duration, error: ServiceError) -> Error {
    match error {
        ServiceError::McpError(error) => Error::Protocol(format!(
            "MCP server `{name}` rejected the call to `{tool}`: {} (JSON-RPC error {})",
            error.message, error.code.0
        )),
        ServiceError::Timeout { .. } => {
            Error::Timeout(format!("MCP server `{name}`: tool `{tool}` did not answer within {timeout:?}"))
        }
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => Error::Closed(format!(
            "MCP server `{name}` went away while calling `{tool}`: {}",
            error_chain(&error)
        )),
        other => {
            Error::Protocol(format!("MCP server `{name}`: calling `{tool}` failed: {}", error_chain(&other)))
        }
    }
}

fn describe_service_error(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => format!("{} (JSON-RPC error {})", error.message, error.code.0),
        other => error_chain(other),
    }
}

fn describe_initialize_error(error: &ClientInitializeError) -> String {
    match error {
        // The transport error's own Display names rmcp's transport types; the inner error and
        // the step are what a user can act on.
        ClientInitializeError::TransportError { error, context } => {
            let cause = error_chain(error.error.as_ref());
            let exited = if cause.contains("Broken pipe") { ", so the server probably exited" } else { "" };
            format!("{cause} (while trying to {context}){exited}")
        }
        ClientInitializeError::ConnectionClosed(step) => {
            format!("the server closed the connection before answering ({step}); it probably exited")
        }
        other => error_chain(other),
    }
}

/// `error` and its sources, joined with ": ", without repeating a source that the previous
/// message already contains.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(current) = source {
        let message = current.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = current.source();
    }
    text
}

/// The last lines a stdio server wrote to stderr; the lines also go to `tracing`.
struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl StderrTail {
    fn follow(name: &str, stderr: Option<ChildStderr>) -> Self {
        let lines: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let reader = stderr.map(|stderr| {
            let lines = lines.clone();
            let name = name.to_owned();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    tracing::debug!(target: "keel_mcp::stderr", server = %name, "{line}");
                    let mut lines = match lines.lock() {
                        Ok(lines) => lines,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    if lines.len() == STDERR_TAIL_LINES {
                        lines.pop_front();
                    }
                    lines.push_back(line);
                }
            })
        });
        StderrTail { lines, reader }
    }

    /// `"; its stderr ended with: ..."`, or nothing when there is no stderr to quote. Waits
    /// briefly for the last lines of a server that is exiting.
    async fn describe(tail: Option<StderrTail>) -> String {
        let Some(tail) = tail else { return String::new() };
        if let Some(reader) = tail.reader {
            let _ = tokio::time::timeout(Duration::from_millis(300), reader).await;
        }
        let lines = match tail.lines.lock() {
            Ok(lines) => lines.iter().cloned().collect::<Vec<_>>(),
            Err(poisoned) => poisoned.into_inner().iter().cloned().collect(),
        };
        if lines.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with:\n{}", lines.join("\n"))
        }
    }
}
