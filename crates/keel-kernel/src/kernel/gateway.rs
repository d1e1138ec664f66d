//! The kernel's public side for agents that reach it over HTTP: the provider-compatible
//! gateway and the MCP endpoint (each call a syscall of the run whose token it carries).

use std::sync::Arc;

use keel_llm::DeltaSink;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult, LlmEmbedParams, LlmEmbedResult};

use crate::syscall::RunHandle;
use crate::{Kernel, Result};

/// Agents reaching the kernel over HTTP: the provider-compatible gateway and the MCP
/// endpoint. Each call is a syscall of the run whose token it carries.
impl Kernel {
    /// The live run whose token this is (waiting for one still being launched). Tokens
    /// end with their run's process.
    pub async fn authenticate(&self, token: &str) -> Option<RunHandle> {
        self.live_by_token_ready(token).await.map(RunHandle::new)
    }

    /// One LLM call of `run`, through the journaled `llm.chat` path. With `stream`, live
    /// deltas are sent as they arrive (none when the call is answered from the journal).
    pub async fn chat(
        &self,
        run: &RunHandle,
        request: LlmChatParams,
        stream: Option<DeltaSink>,
    ) -> Result<LlmChatResult, keel_protocol::rpc::RpcError> {
        let listener = crate::syscall::Listener { deltas: stream, ..Default::default() };
        self.chat_syscall(run, request, listener).await.map_err(Into::into)
    }

    /// [`Kernel::chat`] for a caller that names its answer after the call's journal
    /// entry (the gateway's Responses API derives response ids from it, so a call
    /// answered from the journal after a crash gets the same id): `entry` gets the seq of
    /// the run's `llm.chat` entry as soon as it exists (its intent durable, or the entry
    /// found on replay), before any delta. A call refused before it was journaled (bad
    /// params, no budget) drops `entry` unsent.
    pub async fn chat_with_entry(
        &self,
        run: &RunHandle,
        request: LlmChatParams,
        stream: Option<DeltaSink>,
        entry: tokio::sync::oneshot::Sender<u64>,
    ) -> Result<LlmChatResult, keel_protocol::rpc::RpcError> {
        let listener = crate::syscall::Listener { deltas: stream, entry: Some(entry), ..Default::default() };
        self.chat_syscall(run, request, listener).await.map_err(Into::into)
    }

    /// A Responses API response kept for `run`'s tenant (see [`Kernel::keep_response`]).
    pub async fn response(
        &self,
        run: &RunHandle,
        id: &str,
    ) -> Result<Option<serde_json::Value>, keel_protocol::rpc::RpcError> {
        self.kept_response(run, id).await.map_err(Into::into)
    }

    /// The kept Responses API responses of the conversation `id` ends, newest first, in
    /// one read: each one's `previous_response_id` names the next. At most `limit`; the
    /// chain stops early at a response that does not continue another, or before one
    /// that is not kept (the last one's `previous_response_id` names it). None when `id`
    /// itself is not kept.
    pub async fn response_chain(
        &self,
        run: &RunHandle,
        id: &str,
        limit: usize,
    ) -> Result<Vec<serde_json::Value>, keel_protocol::rpc::RpcError> {
        self.kept_response_chain(run, id, limit).await.map_err(Into::into)
    }

    /// Keeps a Responses API response for `run`'s tenant under `id`, committed before it
    /// returns, so a later request of any run of the tenant can continue it
    /// (`previous_response_id`) or read it. It is not flushed on its own: the next
    /// durable write flushes it with everything before it, and a power cut before then,
    /// which loses it, leaves the run to be relaunched, whose replay of the call keeps it
    /// again (a kill of the kernel loses nothing). Writing the same id again replaces it
    /// (a call answered from the journal writes it again).
    pub async fn keep_response(
        &self,
        run: &RunHandle,
        id: &str,
        record: serde_json::Value,
    ) -> Result<(), keel_protocol::rpc::RpcError> {
        self.keep_response_record(run, id, record).await.map_err(Into::into)
    }

    /// Embeddings for `run` (the gateway's `/v1/embeddings`), through the journaled
    /// `llm.embed` syscall: metered into the run's usage, answered from the journal on replay.
    pub async fn embed(
        &self,
        run: &RunHandle,
        request: LlmEmbedParams,
    ) -> Result<LlmEmbedResult, keel_protocol::rpc::RpcError> {
        self.embed_syscall(run, request).await.map_err(Into::into)
    }

    /// The models `run` may ask for by name (the gateway's `GET /v1/models`).
    pub fn models(&self, run: &RunHandle) -> Vec<String> {
        run.models()
    }

    /// What the MCP endpoint serving each run its granted tools asks; the gateway mounts
    /// it at `/mcp`.
    pub fn mcp_host(&self) -> Arc<dyn keel_mcp::ToolHost> {
        crate::syscall::mcp_host(self.clone())
    }
}
