//! The provider seam: the one trait through which the kernel reaches a model, its
//! implementations (OpenAI-compatible Chat Completions, the Anthropic Messages API, and the
//! scripted provider that answers from a JSON script offline), and the [`Router`] that owns
//! them: model resolution, per-model rate limits, retries with backoff, fallback chains,
//! prices.
//!
//! Pure decisions (wire conversions, error classification, rate-limit buckets, backoff,
//! prices, config parsing) live in their own modules with dense unit tests; HTTP happens
//! only in `http`, `openai::OpenAiProvider`, `anthropic::AnthropicProvider` and the router.

pub mod anthropic;
pub mod config;
pub mod embed;
pub mod error;
mod fields;
mod http;
pub mod openai;
pub mod pricing;
pub mod ratelimit;
pub mod retry;
pub mod router;
pub mod scripted;
pub mod sse;

use async_trait::async_trait;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult};
use serde_json::Value;

pub use anthropic::AnthropicProvider;
pub use config::{LlmConfig, ProviderKind};
pub use embed::{Embedded, Embedder, HashEmbedder, OpenAiEmbedder};
pub use error::{Error, ErrorClass, Result, UpstreamError};
pub use openai::OpenAiProvider;
pub use pricing::{DEFAULT_MAX_OUTPUT_TOKENS, ModelPrice, PriceTable, estimate_input_tokens};
pub use router::Router;
pub use scripted::ScriptedProvider;

/// A piece of a streamed response, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Text(String),
    /// A fragment of tool call `index` (the position among the response's tool calls).
    /// `id` and `name` come with the first fragment of a call; `arguments` is a fragment
    /// of its JSON text (the fragments concatenated are the whole arguments).
    ToolCall {
        index: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// Where a streaming call sends its deltas.
pub type DeltaSink = tokio::sync::mpsc::UnboundedSender<Delta>;

/// A call served by a provider: what the agent gets back, plus provider bookkeeping the
/// kernel journals with it and hands back through [`Provider::restore`] after a restart.
/// `meta` always has `provider` (the provider's name); providers reached through the
/// [`Router`] also get `model` (the route, e.g. `openai/gpt-4o-mini`) and `attempts`.
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

    /// Serves one call. With `stream`, the provider asks upstream for a streamed response
    /// and sends each delta to the sink as it arrives, in order; it still returns the
    /// complete response, which the kernel journals whole. A send to a closed sink is not
    /// an error (the listener went away; the call still completes and is journaled).
    /// HTTP providers make exactly one upstream attempt; retries and fallback are the
    /// [`Router`]'s.
    async fn chat(&self, request: &LlmChatParams, stream: Option<&DeltaSink>) -> Result<Served>;

    /// Called once before the first live call of a recovered run with the `meta` of every
    /// call this provider served earlier in the run, oldest first, so a stateful provider
    /// (the scripted one keeps a cursor) continues where it was.
    fn restore(&self, served: &[Value]) {
        let _ = served;
    }

    /// The most a call asking for `model` (a request's `model`) can cost in USD, for
    /// budget reservations: `input_tokens` plus `max_output_tokens` at this provider's
    /// price for the model (the most expensive model of the fallback chain, for the
    /// router). A provider that knows no price for the model returns 0 (token and call
    /// limits still hold). It takes the model alone so that nobody copies a request's
    /// messages to ask.
    fn worst_case_cost_usd(&self, model: Option<&str>, input_tokens: u64, max_output_tokens: u64) -> f64 {
        let _ = (model, input_tokens, max_output_tokens);
        0.0
    }

    /// The calls waiting for this provider's capacity now (its rate limiter's queues, see
    /// [`ratelimit::RateLimiter::waiting`]), each with `provider` set to this provider's
    /// name, for `keel ps`. Cheap: a copy taken under a short lock. A provider that never
    /// queues calls has none.
    fn waiting_calls(&self) -> Vec<ratelimit::WaitingCall> {
        Vec::new()
    }

    /// Each model's queue and limits now (its rate limiter's [`ratelimit::RateLimiter::status`]),
    /// counting only `tenant`'s calls when given, for `GET /v1/status`. A provider without
    /// a rate limiter has none.
    fn model_status(&self, tenant: Option<&str>) -> Vec<ratelimit::ModelStatus> {
        let _ = tenant;
        Vec::new()
    }

    /// The model names a call may ask for by name (a gateway's `GET /v1/models`): what
    /// is configured, not a provider's whole catalogue. Empty when nothing is named.
    fn models(&self) -> Vec<String> {
        Vec::new()
    }
}
