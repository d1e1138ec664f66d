//! The provider seam: the one trait through which the kernel reaches a model, and the
//! scripted provider, which answers from a JSON script so that runs, demos and tests work
//! offline and deterministically.

pub mod scripted;

use async_trait::async_trait;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult};
use serde_json::Value;

pub use scripted::ScriptedProvider;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The script has no answer for this request.
    #[error(
        "the LLM script has no response for this request (last user message: {last_user:?}); \
         {served} ordered responses were already served. Add a response, or a `match` entry \
         whose text occurs in that message"
    )]
    NoScriptedResponse { last_user: String, served: usize },
    /// The script document itself is malformed.
    #[error("invalid LLM script: {0}")]
    InvalidScript(String),
}

/// A call served by a provider: what the agent gets back, plus provider bookkeeping the
/// kernel journals with it and hands back through [`Provider::restore`] after a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub response: LlmChatResult,
    pub meta: Value,
}

/// A model provider. Implementations must be cancel-safe: dropping the future abandons
/// the call (the kernel journals the intent first, so an abandoned call is visible).
#[async_trait]
pub trait Provider: Send + Sync {
    /// Short name for journals and errors, e.g. `scripted`, `openai`.
    fn name(&self) -> &str;

    async fn chat(&self, request: &LlmChatParams) -> Result<Served>;

    /// Called once before the first live call of a recovered run with the `meta` of every
    /// call this provider served earlier in the run, oldest first, so a stateful provider
    /// (the scripted one keeps a cursor) continues where it was.
    fn restore(&self, served: &[Value]) {
        let _ = served;
    }
}
