//! The kernel side of the provider-compatible endpoints (`/v1/chat/completions`,
//! `/v1/messages`, `/v1/embeddings`): a request authenticated by a run token becomes an
//! `llm.chat` (or `llm.embed`) syscall of that run, so it is journaled, replayed after a crash, metered and budgeted exactly
//! like a call through the SDK.

use std::sync::Arc;

use keel_protocol::rpc::{ErrorKind, LlmChatParams, LlmChatResult, LlmEmbedParams, LlmEmbedResult};
use keel_types::RunId;
use serde_json::Value;

use crate::Kernel;
use crate::run::LiveRun;
use crate::syscall::{Listener, SyscallError};

/// A live run, authenticated by its token; with the `traceparent` its caller sent.
#[derive(Clone)]
pub struct RunHandle(Arc<LiveRun>, Option<String>);

impl RunHandle {
    /// The same run, for a request that sent a W3C `traceparent` header: the spans of
    /// its calls nest under the span it names when that span is in the run's trace.
    pub fn traced(self, traceparent: Option<&str>) -> RunHandle {
        RunHandle(self.0, traceparent.map(str::to_owned))
    }

    /// The models the run may ask for by name (see `Provider::models`).
    pub(crate) fn models(&self) -> Vec<String> {
        self.0.provider.as_ref().map(|provider| provider.models()).unwrap_or_default()
    }

    pub(crate) fn new(live: Arc<LiveRun>) -> RunHandle {
        RunHandle(live, None)
    }

    pub fn run_id(&self) -> &RunId {
        &self.0.id
    }
}

impl Kernel {
    /// [`Kernel::chat`], failing as a syscall does.
    pub(crate) async fn chat_syscall(
        &self,
        run: &RunHandle,
        request: LlmChatParams,
        listener: Listener,
    ) -> Result<LlmChatResult, SyscallError> {
        // The HTTP request may outlive the agent (its task is detached from the
        // connection): when the agent is gone, the call is dropped and its upstream
        // stream closed, like a syscall on the socket.
        let mut ended = run.0.ended.subscribe();
        // A live call's result comes back typed; one answered from the journal is its JSON.
        let (typed, mut live_result) = tokio::sync::oneshot::channel();
        let listener = Listener { result: Some(typed), ..listener };
        // Boxed: the syscall's future is large (6.4 KB; see `Kernel::perform` for why not
        // more), and each future wrapping it (the trace scope, this select, the HTTP
        // handler's) would otherwise copy it whole when it is moved.
        let call = Box::pin(self.chat_streaming(&run.0, request, listener));
        let result = tokio::select! {
            result = crate::telemetry::with_traceparent(&run.0.id, run.1.as_deref(), call) => result?,
            _ = ended.wait_for(|ended| *ended) => {
                return Err(SyscallError::new(ErrorKind::Cancelled, "llm.chat: the run's agent is gone; the call was dropped"));
            }
        };
        // The reply is `Ok`, so a live result handed over is durable.
        if let Ok(result) = live_result.try_recv() {
            return Ok(result);
        }
        serde_json::from_value(result).map_err(|e| {
            SyscallError::new(ErrorKind::Internal, format!("the journaled LLM response is unreadable: {e}"))
        })
    }

    /// A response the run's tenant keeps (the gateway's Responses API), if there is one.
    pub(crate) async fn kept_response(
        &self,
        run: &RunHandle,
        id: &str,
    ) -> Result<Option<Value>, SyscallError> {
        self.store().kv_get(&responses_scope(&run.0.tenant), id).await.map_err(crate::syscall::internal)
    }

    /// The kept responses of the conversation `id` ends, newest first: each one's
    /// `previous_response_id` names the next, at most `limit` (see `Store::kv_chain`).
    pub(crate) async fn kept_response_chain(
        &self,
        run: &RunHandle,
        id: &str,
        limit: usize,
    ) -> Result<Vec<Value>, SyscallError> {
        self.store()
            .kv_chain(&responses_scope(&run.0.tenant), id, &["response", "previous_response_id"], limit)
            .await
            .map_err(crate::syscall::internal)
    }

    /// Keeps a response for the run's tenant under `id`: every reader sees it on return,
    /// and the next durable write flushes it (`Store::kv_put_unflushed`).
    pub(crate) async fn keep_response_record(
        &self,
        run: &RunHandle,
        id: &str,
        record: Value,
    ) -> Result<(), SyscallError> {
        // Unflushed: the journal holds the call durably, and a power cut that loses the
        // record leaves the run to be relaunched, whose replay of the call keeps it again.
        self.store()
            .kv_put_unflushed(&responses_scope(&run.0.tenant), id, record)
            .await
            .map_err(crate::syscall::internal)
    }

    /// [`Kernel::embed`], failing as a syscall does.
    pub(crate) async fn embed_syscall(
        &self,
        run: &RunHandle,
        request: LlmEmbedParams,
    ) -> Result<LlmEmbedResult, SyscallError> {
        let params = serde_json::to_value(&request).map_err(|e| {
            SyscallError::new(ErrorKind::InvalidParams, format!("the request cannot be encoded: {e}"))
        })?;
        let embed = self.syscall(&run.0, "llm.embed", params);
        let result = crate::telemetry::with_traceparent(&run.0.id, run.1.as_deref(), embed).await?;
        serde_json::from_value(result).map_err(|e| {
            SyscallError::new(ErrorKind::Internal, format!("the journaled embeddings are unreadable: {e}"))
        })
    }
}

/// Where a tenant's Responses API responses are kept (the store's key-value table).
fn responses_scope(tenant: &str) -> String {
    format!("responses/{tenant}")
}

/// The run's granted tools as an MCP server (streamable HTTP at `/mcp` of the gateway,
/// bridged into sandboxes at `http://127.0.0.1:9100/mcp`): the bearer token is the run
/// token, and every call is the run's governed `tool.call`.
struct McpHost(Kernel);

#[async_trait::async_trait]
impl keel_mcp::ToolHost for McpHost {
    async fn authenticate(&self, token: &str) -> Result<(), keel_mcp::HostError> {
        self.0.live_by_token_ready(token).await.map(|_| ()).ok_or_else(unauthorized)
    }

    async fn list(&self, token: &str) -> Result<Vec<keel_mcp::ToolInfo>, keel_mcp::HostError> {
        let live = self.0.live_by_token_ready(token).await.ok_or_else(unauthorized)?;
        Ok(self
            .0
            .granted_tools(&live)
            .await
            .into_iter()
            .map(|def| keel_mcp::ToolInfo {
                name: def.name,
                description: def.description,
                input_schema: def.input_schema,
            })
            .collect())
    }

    async fn call(
        &self,
        token: &str,
        name: &str,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, keel_mcp::HostError> {
        let live = self.0.live_by_token_ready(token).await.ok_or_else(unauthorized)?;
        let params = serde_json::json!({ "name": name, "args": args });
        match self.0.syscall(&live, "tool.call", params).await {
            Ok(reply) => Ok(reply.get("result").cloned().unwrap_or(serde_json::Value::Null)),
            Err(err) if err.is(ErrorKind::Denied) => Err(keel_mcp::HostError::Denied(err.message)),
            Err(err) if err.is(ErrorKind::NotFound) => Err(keel_mcp::HostError::NotFound(err.message)),
            Err(err) => Err(keel_mcp::HostError::Failed(err.message)),
        }
    }
}

fn unauthorized() -> keel_mcp::HostError {
    keel_mcp::HostError::Unauthorized(
        "unknown run token: use the run's KEEL_RUN_TOKEN (tokens end with their run)".into(),
    )
}

/// What the MCP endpoint serving each run its granted tools asks (see `Kernel::mcp_host`).
pub(crate) fn mcp_host(kernel: Kernel) -> Arc<dyn keel_mcp::ToolHost> {
    Arc::new(McpHost(kernel))
}
