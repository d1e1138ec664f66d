//! The OpenAI-compatible Chat Completions provider (OpenAI, vLLM, Ollama, LM Studio, Groq,
//! Together, OpenRouter): `POST {base_url}/chat/completions` with `Authorization: Bearer`,
//! JSON or `stream: true` server-sent events. One upstream attempt per call, under the
//! provider's rate limiter; retries and fallback are the router's.

pub mod responses;
pub mod responses_stream;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult, TokenUsage};
use serde_json::{Value, json};

use crate::config::{HttpConfig, ResolvedProvider};
use crate::error::{ErrorBody, ErrorClass, Result, UpstreamError, human, upstream_error};
use crate::http::{self, Endpoint, EventReader};
use crate::pricing::{DEFAULT_MAX_OUTPUT_TOKENS, PriceTable, estimate_input_tokens};
use crate::ratelimit::RateLimiter;
use crate::{DeltaSink, Error, Provider, Served};

pub struct OpenAiProvider {
    endpoint: Endpoint,
    limiter: Arc<RateLimiter>,
    prices: Arc<PriceTable>,
    max_queue_wait: Duration,
}

impl OpenAiProvider {
    /// A provider for `config` (kind `openai`). `max_queue_wait` bounds how long a call
    /// waits for its rate-limit bucket before failing as rate limited.
    pub fn new(
        config: &ResolvedProvider,
        http_config: &HttpConfig,
        prices: Arc<PriceTable>,
        max_queue_wait: Duration,
    ) -> Result<OpenAiProvider> {
        let client = http::build_client(http_config)?;
        let mut fixed = Vec::new();
        if let Some(key) = &config.api_key {
            fixed.push(("authorization".to_owned(), format!("Bearer {}", key.0)));
        }
        let endpoint = Endpoint::new(
            &config.name,
            format!("{}/chat/completions", config.base_url),
            client,
            fixed,
            &config.headers,
            config.key_source.clone(),
            Duration::from_millis(http_config.read_timeout_ms),
        )?;
        let limits = config.limits.iter().map(|(model, limits)| (model.clone(), *limits)).collect();
        Ok(OpenAiProvider { endpoint, limiter: Arc::new(RateLimiter::new(limits)), prices, max_queue_wait })
    }

    /// The provider's rate-limit state (shared by every call to it).
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    async fn call(
        &self,
        request: &LlmChatParams,
        model: &str,
        stream: Option<&DeltaSink>,
    ) -> Result<(wire::Parsed, bool), UpstreamError> {
        let body = wire::request_body(request, model, stream.is_some());
        let response = self.endpoint.post(&body, model, &self.limiter).await?;
        let Some(sink) = stream else {
            let value = self.endpoint.read_json(response).await?;
            return wire::parse_chat_completion(&value)
                .map(|p| (p, false))
                .map_err(|e| self.endpoint.invalid_response(e));
        };
        let mut reader = EventReader::new(response);
        let mut assembler = wire::ChunkAssembler::new();
        let mut done = false;
        while let Some(event) = reader.next(&self.endpoint).await? {
            let data = event.data.trim();
            if data == "[DONE]" {
                done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Value = serde_json::from_str(data).map_err(|e| {
                self.endpoint.invalid_response(format!("a stream chunk is not JSON ({e}): {data:.200}"))
            })?;
            match assembler.push(&chunk) {
                Ok(deltas) => {
                    for delta in deltas {
                        let _ = sink.send(delta);
                    }
                }
                Err(body) => return Err(stream_error(&self.endpoint, model, &body)),
            }
        }
        // Some servers end without `[DONE]`; a stated finish reason means the answer is whole.
        if !done && !assembler.finished() {
            return Err(http::truncated(&self.endpoint));
        }
        Ok((assembler.finish(), true))
    }
}

/// An error object inside a 200 stream: classified as if the provider had answered 500
/// unless its body says more.
pub(crate) fn stream_error(endpoint: &Endpoint, model: &str, body: &ErrorBody) -> UpstreamError {
    let mut error = upstream_error(endpoint.context(model), 500, body, None);
    error.status = None;
    error.message = format!("error in the response stream: {}", error.message.trim_start_matches("500 "));
    error
}

/// Turns what upstream said into the canonical result, estimating usage when the server
/// sent none (deliberately high: it settles a budget reservation).
pub(crate) struct Finished {
    pub response: LlmChatResult,
    pub id: Option<String>,
    pub usage_estimated: bool,
}

pub(crate) fn finish(
    provider: &str,
    request: &LlmChatParams,
    model: &str,
    parsed: wire::Parsed,
    prices: &PriceTable,
) -> Finished {
    let message = parsed.message;
    let usage_estimated = parsed.usage.is_none();
    let usage = parsed.usage.unwrap_or_else(|| {
        let output_chars = message.content.as_deref().map_or(0, str::len)
            + message.tool_calls.iter().flatten().map(|c| c.to_string().len()).sum::<usize>();
        TokenUsage {
            input_tokens: estimate_input_tokens(request),
            output_tokens: (output_chars as u64).div_ceil(3),
        }
    });
    let returned_model = parsed.model.unwrap_or_else(|| model.to_owned());
    // `provider/model` first: a route-specific price (say, OpenRouter's) beats the bare one.
    let price = prices.lookup(&format!("{provider}/{model}")).or_else(|| prices.lookup(&returned_model));
    let cost_usd = price.map_or(0.0, |p| p.cost(usage.input_tokens, usage.output_tokens));
    Finished {
        response: LlmChatResult {
            message,
            usage,
            cost_usd,
            model: returned_model,
            finish_reason: parsed.finish_reason,
        },
        id: parsed.id,
        usage_estimated,
    }
}

/// The `meta` of a served call.
pub(crate) fn served(provider: &str, finished: Finished, streamed: bool) -> Served {
    let mut meta =
        json!({ "provider": provider, "upstream_model": finished.response.model, "streamed": streamed });
    if let Some(id) = finished.id {
        meta["response_id"] = json!(id);
    }
    if finished.usage_estimated {
        meta["usage_estimated"] = json!(true);
    }
    Served { response: finished.response, meta }
}

pub(crate) fn model_of<'a>(provider: &str, request: &'a LlmChatParams) -> Result<&'a str> {
    request.model.as_deref().filter(|m| !m.is_empty()).ok_or_else(|| {
        Error::InvalidRequest(format!(
            "provider `{provider}` was called without a model; name one (e.g. `model`)"
        ))
    })
}

/// Waits for the rate limiter, or fails as rate limited (locally) when the wait is longer
/// than allowed.
pub(crate) async fn acquire(
    provider: &str,
    limiter: &RateLimiter,
    model: &str,
    tokens: u64,
    max_wait: Duration,
) -> Result<(), UpstreamError> {
    limiter.acquire(model, tokens, max_wait).await.map_err(|wait| UpstreamError {
        retry_after: Some(wait),
        ..UpstreamError::new(
            provider,
            ErrorClass::RateLimited,
            format!(
                "model {model:?} is at its rate limit for another {} (longer than the {} a call may queue); \
                 raise the limit with the provider or in [llm.models], or add a fallback model",
                human(wait),
                human(max_wait)
            ),
        )
    })
}

/// Tokens a call takes from the tokens-per-minute bucket: input estimate plus the output
/// limit (OpenAI counts `max_tokens` against the limit the same way).
pub(crate) fn reserved_tokens(request: &LlmChatParams) -> u64 {
    estimate_input_tokens(request) + request.max_tokens.map_or(DEFAULT_MAX_OUTPUT_TOKENS, u64::from)
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.endpoint.provider
    }

    fn waiting_calls(&self) -> Vec<crate::ratelimit::WaitingCall> {
        self.limiter.waiting(self.name())
    }

    async fn chat(&self, request: &LlmChatParams, stream: Option<&DeltaSink>) -> Result<Served> {
        let model = model_of(self.name(), request)?;
        let reserved = reserved_tokens(request);
        acquire(self.name(), &self.limiter, model, reserved, self.max_queue_wait).await?;
        let (parsed, streamed) = match self.call(request, model, stream).await {
            Ok(done) => done,
            Err(err) => {
                self.limiter.settle(model, reserved, 0);
                return Err(err.into());
            }
        };
        let finished = finish(self.name(), request, model, parsed, &self.prices);
        let usage = finished.response.usage;
        self.limiter.settle(model, reserved, usage.input_tokens + usage.output_tokens);
        Ok(served(self.name(), finished, streamed))
    }

    fn worst_case_cost_usd(&self, request: &LlmChatParams, input_tokens: u64, max_output_tokens: u64) -> f64 {
        request.model.as_deref().map_or(0.0, |m| {
            self.prices.worst_case_cost(&format!("{}/{m}", self.name()), input_tokens, max_output_tokens)
        })
    }
}
