//! The Anthropic Messages API provider: `POST {base_url}/v1/messages` with `x-api-key`
//! and `anthropic-version`, JSON or `stream: true` server-sent events, converted to and
//! from the canonical (OpenAI-shaped) request and result by [`wire`]. One upstream attempt
//! per call, under the provider's rate limiter; retries and fallback are the router's.

pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_protocol::rpc::LlmChatParams;
use serde_json::{Value, json};

use crate::config::{HttpConfig, ResolvedProvider};
use crate::error::{Result, UpstreamError};
use crate::http::{self, Endpoint, EventReader};
use crate::openai::{acquire, finish, model_of, reserved_tokens, served, stream_error};
use crate::pricing::PriceTable;
use crate::ratelimit::RateLimiter;
use crate::{DeltaSink, Provider, Served};

pub struct AnthropicProvider {
    endpoint: Endpoint,
    limiter: Arc<RateLimiter>,
    prices: Arc<PriceTable>,
    max_queue_wait: Duration,
}

impl AnthropicProvider {
    /// A provider for `config` (kind `anthropic`). `max_queue_wait` bounds how long a
    /// call waits for its rate-limit bucket before failing as rate limited.
    pub fn new(
        config: &ResolvedProvider,
        http_config: &HttpConfig,
        prices: Arc<PriceTable>,
        max_queue_wait: Duration,
    ) -> Result<AnthropicProvider> {
        let client = http::build_client(http_config)?;
        let mut fixed = vec![("anthropic-version".to_owned(), wire::API_VERSION.to_owned())];
        if let Some(key) = &config.api_key {
            fixed.push(("x-api-key".to_owned(), key.0.clone()));
        }
        let endpoint = Endpoint::new(
            &config.name,
            format!("{}/v1/messages", config.base_url),
            client,
            fixed,
            &config.headers,
            config.key_source.clone(),
            Duration::from_millis(http_config.read_timeout_ms),
        )?;
        let limits = config.limits.iter().map(|(model, limits)| (model.clone(), *limits)).collect();
        Ok(AnthropicProvider {
            endpoint,
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
        body: &Value,
        model: &str,
        stream: Option<&DeltaSink>,
    ) -> Result<crate::openai::wire::Parsed, UpstreamError> {
        let response = self.endpoint.post(body, model, &self.limiter).await?;
        let Some(sink) = stream else {
            let value = self.endpoint.read_json(response).await?;
            return wire::parse_message(&value).map_err(|e| self.endpoint.invalid_response(e));
        };
        let mut reader = EventReader::new(response);
        let mut assembler = wire::EventAssembler::new();
        while let Some(event) = reader.next(&self.endpoint).await? {
            let data = event.data.trim();
            if data.is_empty() {
                continue;
            }
            let mut value: Value = serde_json::from_str(data).map_err(|e| {
                self.endpoint.invalid_response(format!("a stream event is not JSON ({e}): {data:.200}"))
            })?;
            // The data's `type` names the event; fall back to the SSE event name.
            if value.get("type").is_none()
                && let (Some(name), Some(object)) = (event.event, value.as_object_mut())
            {
                object.insert("type".into(), json!(name));
            }
            match assembler.push(&value) {
                Ok(deltas) => {
                    for delta in deltas {
                        let _ = sink.send(delta);
                    }
                }
                Err(body) => return Err(stream_error(&self.endpoint, model, &body)),
            }
            if assembler.stopped() {
                break;
            }
        }
        if !assembler.stopped() {
            return Err(http::truncated(&self.endpoint));
        }
        Ok(assembler.finish())
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
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
        let body = wire::request_body(request, model, stream.is_some())?;
        let reserved = reserved_tokens(request);
        acquire(self.name(), &self.limiter, model, reserved, self.max_queue_wait).await?;
        let _in_flight = self.limiter.sending(model);
        let parsed = match self.call(&body, model, stream).await {
            Ok(parsed) => parsed,
            Err(err) => {
                self.limiter.settle(model, reserved, 0);
                return Err(err.into());
            }
        };
        let finished = finish(self.name(), request, model, parsed, &self.prices);
        let usage = finished.response.usage;
        self.limiter.settle(model, reserved, usage.input_tokens + usage.output_tokens);
        Ok(served(self.name(), finished, stream.is_some()))
    }

    fn worst_case_cost_usd(&self, model: Option<&str>, input_tokens: u64, max_output_tokens: u64) -> f64 {
        model.map_or(0.0, |m| self.prices.worst_case_cost(self.name(), m, input_tokens, max_output_tokens))
    }
}
