//! The kernel side of the provider-compatible endpoints (`/v1/chat/completions`,
//! `/v1/messages`): a request authenticated by a run token becomes an `llm.chat` syscall
//! of that run, so it is journaled, replayed after a crash, metered and budgeted exactly
//! like a call through the SDK.

use std::sync::Arc;

use keel_llm::DeltaSink;
use keel_protocol::rpc::{ErrorKind, LlmChatParams, LlmChatResult, RpcError};
use keel_types::RunId;

use crate::Kernel;
use crate::runtime::LiveRun;

/// A live run, authenticated by its token.
#[derive(Clone)]
pub struct RunHandle(Arc<LiveRun>);

impl RunHandle {
    pub fn run_id(&self) -> &RunId {
        &self.0.id
    }
}

impl Kernel {
    /// The live run whose token this is. Tokens end with their run's process.
    pub fn authenticate(&self, token: &str) -> Option<RunHandle> {
        self.live_by_token(token).map(RunHandle)
    }

    /// One LLM call of `run`, through the journaled `llm.chat` path. With `stream`, live
    /// deltas are sent as they arrive (none when the call is answered from the journal).
    pub async fn chat(
        &self,
        run: &RunHandle,
        request: LlmChatParams,
        stream: Option<DeltaSink>,
    ) -> Result<LlmChatResult, RpcError> {
        let params = serde_json::to_value(&request)
            .map_err(|e| ErrorKind::InvalidParams.error(format!("the request cannot be encoded: {e}")))?;
        let result = self.syscall_streaming(&run.0, "llm.chat", params, stream).await?;
        serde_json::from_value(result)
            .map_err(|e| ErrorKind::Internal.error(format!("the journaled LLM response is unreadable: {e}")))
    }
}
