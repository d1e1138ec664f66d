//! The OpenAI-compatible provider (OpenAI, vLLM, Ollama, LM Studio, Groq, Together,
//! OpenRouter): `POST {base_url}/chat/completions` with `Authorization: Bearer`, JSON or
//! `stream: true` server-sent events; or, for a model configured with `api = "responses"`,
//! OpenAI's `POST {base_url}/responses` (see [`upstream_responses`]). Each call picks its
//! API by its model, so one provider serves both. One upstream attempt per call, under the
//! provider's rate limiter; retries and fallback are the router's.

pub mod responses;
pub mod responses_stream;
pub mod upstream_responses;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult, TokenUsage};
use serde_json::{Value, json};

use crate::config::{HttpConfig, OpenAiApi, ResolvedProvider};
use crate::error::{ErrorBody, ErrorClass, Result, UpstreamError, human, upstream_error};
use crate::http::{self, Endpoint, EventReader};
use crate::pricing::{DEFAULT_MAX_OUTPUT_TOKENS, PriceTable, estimate_input_tokens};
use crate::ratelimit::RateLimiter;
use crate::{DeltaSink, Error, Provider, Served};

pub struct OpenAiProvider {
    endpoint: Endpoint,
    /// The same provider's `{base_url}/responses`, for models whose API is `responses`.
    responses: Endpoint,
    /// The provider's API, and the models that choose otherwise (bare names).
    api: OpenAiApi,
    model_apis: BTreeMap<String, OpenAiApi>,
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
        let endpoint_for = |path: &str| {
            Endpoint::new(
                &config.name,
                format!("{}/{path}", config.base_url),
                client.clone(),
                fixed.clone(),
                &config.headers,
                config.key_source.clone(),
                Duration::from_millis(http_config.read_timeout_ms),
            )
        };
        let endpoint = endpoint_for("chat/completions")?;
        let responses = endpoint_for("responses")?;
        let limits = config.limits.iter().map(|(model, limits)| (model.clone(), *limits)).collect();
        Ok(OpenAiProvider {
            endpoint,
            responses,
            api: config.api,
            model_apis: config.model_apis.clone(),
            limiter: Arc::new(RateLimiter::new(limits)),
            prices,
            max_queue_wait,
        })
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
            let body = self.endpoint.read_body(response).await?;
            return wire::parse_chat_completion_bytes(&body)
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

    /// One call through the Responses API: the same rate limiter and error handling as
    /// Chat Completions, a different body and answer (`body` is already built, so a
    /// request the API cannot express failed before any wait).
    async fn call_responses(
        &self,
        body: &Value,
        model: &str,
        stream: Option<&DeltaSink>,
    ) -> Result<(wire::Parsed, bool), UpstreamError> {
        let endpoint = &self.responses;
        let response = endpoint.post(body, model, &self.limiter).await?;
        let failed = |failure| responses_failure(endpoint, model, failure);
        let Some(sink) = stream else {
            let value = endpoint.read_json(response).await?;
            return upstream_responses::parse_response(&value).map(|p| (p, false)).map_err(failed);
        };
        let mut reader = EventReader::new(response);
        let mut assembler = upstream_responses::EventAssembler::new();
        while let Some(event) = reader.next(endpoint).await? {
            let data = event.data.trim();
            // Some servers end with chat's `[DONE]`; the terminal event already came.
            if data.is_empty() || data == "[DONE]" {
                continue;
            }
            let value: Value = serde_json::from_str(data).map_err(|e| {
                endpoint.invalid_response(format!("a stream event is not JSON ({e}): {data:.200}"))
            })?;
            for delta in assembler.push(&value).map_err(failed)? {
                let _ = sink.send(delta);
            }
            if assembler.finished() {
                break;
            }
        }
        if !assembler.finished() {
            return Err(http::truncated(endpoint));
        }
        assembler.finish().map(|p| (p, true)).map_err(failed)
    }
}

/// A Responses failure as an upstream error: a failed response is classified by the
/// status its error code implies (a rate limit is retried like a 429), but has none.
fn responses_failure(
    endpoint: &Endpoint,
    model: &str,
    failure: upstream_responses::Failure,
) -> UpstreamError {
    match failure {
        upstream_responses::Failure::Invalid(detail) => endpoint.invalid_response(detail),
        upstream_responses::Failure::Upstream(body) => {
            let status = upstream_responses::failure_status(&body);
            let mut error = upstream_error(endpoint.context(model), status, &body, None);
            error.status = None;
            error.message =
                format!("the response failed: {}", error.message.trim_start_matches(&format!("{status} ")));
            error
        }
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
    let price = prices.routed(provider, model).or_else(|| prices.lookup(&returned_model));
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

    fn model_status(&self, tenant: Option<&str>) -> Vec<crate::ratelimit::ModelStatus> {
        self.limiter.status(self.name(), tenant)
    }

    async fn chat(&self, request: &LlmChatParams, stream: Option<&DeltaSink>) -> Result<Served> {
        let model = model_of(self.name(), request)?;
        let api = self.model_apis.get(model).copied().unwrap_or(self.api);
        let responses_body = match api {
            OpenAiApi::Chat => None,
            OpenAiApi::Responses => Some(
                upstream_responses::request_body(request, model, stream.is_some())
                    .map_err(Error::InvalidRequest)?,
            ),
        };
        let reserved = reserved_tokens(request);
        acquire(self.name(), &self.limiter, model, reserved, self.max_queue_wait).await?;
        let _in_flight = self.limiter.sending(model);
        let outcome = match &responses_body {
            None => self.call(request, model, stream).await,
            Some(body) => self.call_responses(body, model, stream).await,
        };
        let (parsed, streamed) = match outcome {
            Ok(done) => done,
            Err(err) => {
                self.limiter.settle(model, reserved, 0);
                return Err(err.into());
            }
        };
        let finished = finish(self.name(), request, model, parsed, &self.prices);
        let usage = finished.response.usage;
        self.limiter.settle(model, reserved, usage.input_tokens + usage.output_tokens);
        let mut served = served(self.name(), finished, streamed);
        if api == OpenAiApi::Responses {
            served.meta["api"] = json!(api.as_str());
        }
        Ok(served)
    }

    fn worst_case_cost_usd(&self, model: Option<&str>, input_tokens: u64, max_output_tokens: u64) -> f64 {
        model.map_or(0.0, |m| self.prices.worst_case_cost(self.name(), m, input_tokens, max_output_tokens))
    }
}
