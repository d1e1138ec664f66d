//! The router: the one [`Provider`] the kernel calls. It owns the configured providers,
//! resolves a model name to one of them (`openai/gpt-4o-mini`, `anthropic/claude-...`, or
//! a bare name), retries retryable failures with jittered exponential backoff (honouring
//! `Retry-After`), and walks the fallback chain when a model fails for good, recording
//! every attempt in the served call's `meta`.
//!
//! A `Router` is cheap to clone: providers and their rate-limit state are shared, so one
//! router built at kernel start serves every run, and [`Router::for_run`] derives a run's
//! view (its script, default model and fallback chain) without new connections or limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use keel_protocol::rpc::LlmChatParams;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::anthropic::AnthropicProvider;
use crate::config::{LlmConfig, ProviderKind};
use crate::error::{Error, Result};
use crate::openai::OpenAiProvider;
use crate::pricing::PriceTable;
use crate::retry::{RetryDecision, RetryPolicy, jitter};
use crate::scripted::ScriptedProvider;
use crate::{DeltaSink, Provider, Served};

/// What to tell a person when no provider can serve a call.
pub const NO_PROVIDER_HELP: &str = "no LLM provider is configured: set OPENAI_API_KEY (and OPENAI_BASE_URL for a \
     compatible server) or ANTHROPIC_API_KEY in the kernel's environment, add [llm.providers] to keel.toml, or run \
     with `keel run --llm-script FILE`";

/// A model name resolved to a provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The configured provider's name.
    pub provider: String,
    /// The model name the provider is sent.
    pub model: String,
}

impl Route {
    /// `provider/model`, as journaled and as accepted back by [`Router::resolve`].
    pub fn label(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

#[derive(Clone)]
struct Entry {
    kind: Option<ProviderKind>,
    provider: Arc<dyn Provider>,
}

#[derive(Clone)]
struct Shared {
    providers: BTreeMap<String, Entry>,
    /// Bare model name → provider, from `[llm.models."name"] provider = ...`.
    model_routes: BTreeMap<String, String>,
    policy: RetryPolicy,
    /// The embedder of `[llm.embeddings]` (the offline hash embedder by default).
    embedder: Arc<dyn crate::embed::Embedder>,
}

#[derive(Clone)]
pub struct Router {
    shared: Arc<Shared>,
    script: Option<Arc<ScriptedProvider>>,
    default_model: Option<String>,
    fallback: Vec<String>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("providers", &self.shared.providers.keys().collect::<Vec<_>>())
            .field("scripted", &self.script.is_some())
            .field("default_model", &self.default_model)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Router {
    /// Builds the providers of `config`, reading API keys from the kernel's environment.
    pub fn from_config(config: &LlmConfig) -> Result<Router> {
        Self::from_config_with_env(config, |name| std::env::var(name).ok())
    }

    /// [`Router::from_config`] with the environment injected.
    pub fn from_config_with_env(config: &LlmConfig, env: impl Fn(&str) -> Option<String>) -> Result<Router> {
        let prices = Arc::new(PriceTable::with_overrides(&config.prices));
        let policy = config.retry.policy();
        let mut providers = BTreeMap::new();
        for resolved in config.resolve_providers(&env)? {
            let provider: Arc<dyn Provider> = match resolved.kind {
                ProviderKind::Openai => Arc::new(OpenAiProvider::new(
                    &resolved,
                    &config.http,
                    prices.clone(),
                    policy.max_queue_wait,
                )?),
                ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(
                    &resolved,
                    &config.http,
                    prices.clone(),
                    policy.max_queue_wait,
                )?),
            };
            providers.insert(resolved.name.clone(), Entry { kind: Some(resolved.kind), provider });
        }
        let embedder = crate::embed::from_config(config, &env)?;
        let model_routes = config
            .models
            .iter()
            .filter_map(|(model, settings)| Some((model.clone(), settings.provider.clone()?)))
            .collect();
        Ok(Router {
            shared: Arc::new(Shared { providers, model_routes, policy, embedder }),
            script: None,
            default_model: config.default_model.clone(),
            fallback: config.fallback.clone(),
        })
    }

    /// A router with no providers (every call fails with [`NO_PROVIDER_HELP`] unless a run
    /// brings a script).
    pub fn empty() -> Router {
        Router {
            shared: Arc::new(Shared {
                providers: BTreeMap::new(),
                model_routes: BTreeMap::new(),
                policy: RetryPolicy::default(),
                embedder: Arc::new(crate::embed::HashEmbedder),
            }),
            script: None,
            default_model: None,
            fallback: Vec::new(),
        }
    }

    /// Adds (or replaces) a provider under `name`. `kind` lets bare model names of that
    /// family (`gpt-*`, `claude-*`) find it.
    pub fn with_provider(
        mut self,
        name: &str,
        kind: Option<ProviderKind>,
        provider: Arc<dyn Provider>,
    ) -> Router {
        Arc::make_mut(&mut self.shared).providers.insert(name.to_owned(), Entry { kind, provider });
        self
    }

    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Router {
        Arc::make_mut(&mut self.shared).policy = policy;
        self
    }

    /// One run's view of this router: the same providers and rate limits, plus the run's
    /// own script (which then answers every call of the run), default model (`keel run
    /// --model`) and fallback chain (replacing the config's when not empty).
    pub fn for_run(
        &self,
        script: Option<ScriptedProvider>,
        model: Option<String>,
        fallback: Vec<String>,
    ) -> Router {
        Router {
            shared: self.shared.clone(),
            script: script.map(Arc::new),
            default_model: model.or_else(|| self.default_model.clone()),
            fallback: if fallback.is_empty() { self.fallback.clone() } else { fallback },
        }
    }

    /// The embedder for semantic memory search, shared by every run.
    pub fn embedder(&self) -> Arc<dyn crate::embed::Embedder> {
        self.shared.embedder.clone()
    }

    /// Whether any call can be served at all (a script, or at least one provider).
    pub fn is_configured(&self) -> bool {
        self.script.is_some() || !self.shared.providers.is_empty()
    }

    /// Names of the configured providers.
    pub fn provider_names(&self) -> Vec<String> {
        self.shared.providers.keys().cloned().collect()
    }

    /// The default model for calls that name none, if any.
    pub fn default_model(&self) -> Option<&str> {
        self.default_model.as_deref()
    }

    /// The models a call tries, in order: its own (or the default), then the fallbacks.
    pub fn chain(&self, request: &LlmChatParams) -> Vec<String> {
        self.chain_of(request.model.as_deref())
    }

    /// [`Router::chain`] of a request asking for `model`.
    fn chain_of(&self, model: Option<&str>) -> Vec<String> {
        let mut chain: Vec<String> = Vec::new();
        let first = model.filter(|m| !m.is_empty()).map(str::to_owned).or_else(|| self.default_model.clone());
        for model in first.into_iter().chain(self.fallback.iter().cloned()) {
            if !chain.contains(&model) {
                chain.push(model);
            }
        }
        chain
    }

    /// Which provider serves `model`, and under which name:
    /// 1. `provider/model` when `provider` is configured (the rest may contain `/`, as
    ///    OpenRouter's `openrouter/openai/gpt-4o` does);
    /// 2. a bare name routed in `[llm.models]`;
    /// 3. `claude-*` to the `anthropic` provider (else the first of kind anthropic),
    ///    `gpt-*`, `o1`/`o3`/`o4*`, `chatgpt-*` to the `openai` provider;
    /// 4. the provider of the default model, or the only provider.
    pub fn resolve(&self, model: &str) -> Result<Route> {
        let providers = &self.shared.providers;
        let route =
            |provider: &str, model: &str| Route { provider: provider.to_owned(), model: model.to_owned() };
        if let Some((provider, rest)) = model.split_once('/')
            && !rest.is_empty()
        {
            if providers.contains_key(provider) {
                return Ok(route(provider, rest));
            }
            if let Some(var) = match provider {
                "openai" => Some("OPENAI_API_KEY"),
                "anthropic" => Some("ANTHROPIC_API_KEY"),
                _ => None,
            } {
                return Err(Error::NoRoute(format!(
                    "model {model:?} needs provider `{provider}`, which is not configured: set {var} in the kernel's \
                     environment or add [llm.providers.{provider}] to keel.toml"
                )));
            }
        }
        if let Some(provider) = self.shared.model_routes.get(model)
            && providers.contains_key(provider)
        {
            return Ok(route(provider, model));
        }
        let family = if model.starts_with("claude") {
            Some(ProviderKind::Anthropic)
        } else if ["gpt-", "chatgpt-", "o1", "o3", "o4", "ft:gpt-"].iter().any(|p| model.starts_with(p)) {
            Some(ProviderKind::Openai)
        } else {
            None
        };
        if let Some(kind) = family {
            if let Some(entry) = providers.get(kind.as_str())
                && entry.kind.is_none_or(|k| k == kind)
            {
                return Ok(route(kind.as_str(), model));
            }
            if kind == ProviderKind::Anthropic
                && let Some((name, _)) = providers.iter().find(|(_, e)| e.kind == Some(kind))
            {
                return Ok(route(name, model));
            }
        }
        let default_provider = self
            .default_model
            .as_deref()
            .and_then(|m| m.split_once('/'))
            .map(|(p, _)| p)
            .filter(|p| providers.contains_key(*p))
            .or_else(|| {
                (providers.len() == 1).then(|| providers.keys().next().map(String::as_str)).flatten()
            });
        if let Some(provider) = default_provider {
            return Ok(route(provider, model));
        }
        if providers.is_empty() {
            return Err(Error::NoRoute(NO_PROVIDER_HELP.to_owned()));
        }
        Err(Error::NoRoute(format!(
            "model {model:?} names no configured provider; write it as provider/model (providers: {}) or route it \
             with [llm.models.{model:?}] provider = \"...\" in keel.toml",
            providers.keys().cloned().collect::<Vec<_>>().join(", ")
        )))
    }

    fn provider(&self, route: &Route) -> Result<Arc<dyn Provider>> {
        self.shared
            .providers
            .get(&route.provider)
            .map(|entry| entry.provider.clone())
            .ok_or_else(|| Error::NoRoute(format!("provider `{}` is not configured", route.provider)))
    }

    async fn serve_scripted(
        &self,
        script: &ScriptedProvider,
        request: &LlmChatParams,
        stream: Option<&DeltaSink>,
    ) -> Result<Served> {
        let mut served = script.chat(request, stream).await?;
        if let Some(meta) = served.meta.as_object_mut() {
            meta.insert("model".into(), json!(served.response.model));
            meta.insert(
                "attempts".into(),
                json!([{ "model": served.response.model, "attempt": 1, "outcome": "ok" }]),
            );
        }
        Ok(served)
    }
}

/// One attempt, forwarding its deltas to `outer`; also says whether any delta reached it
/// (after which the call cannot be retried without the listener seeing text twice).
async fn attempt(
    provider: &dyn Provider,
    request: &LlmChatParams,
    outer: Option<&DeltaSink>,
) -> (Result<Served>, bool) {
    let Some(outer) = outer else {
        return (provider.chat(request, None).await, false);
    };
    let (sink, mut deltas) = mpsc::unbounded_channel();
    let call = async move {
        let result = provider.chat(request, Some(&sink)).await;
        drop(sink);
        result
    };
    let forward = async {
        let mut forwarded = false;
        while let Some(delta) = deltas.recv().await {
            forwarded = true;
            let _ = outer.send(delta);
        }
        forwarded
    };
    tokio::join!(call, forward)
}

fn failure_record(model: &str, attempt: u32, error: &Error) -> Value {
    let mut record =
        json!({ "model": model, "attempt": attempt, "outcome": "error", "error": error.to_string() });
    if let Some(class) = error.class() {
        record["class"] = json!(class.as_str());
    }
    if let Error::Upstream(upstream) = error
        && let Some(status) = upstream.status
    {
        record["status"] = json!(status);
    }
    record
}

#[async_trait]
impl Provider for Router {
    fn name(&self) -> &str {
        if self.script.is_some() { "scripted" } else { "router" }
    }

    /// The run's default model and fallbacks, then the models routed in `[llm.models]`,
    /// each once; `scripted` for a run whose script answers whatever it is asked.
    fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = Vec::new();
        let named = self.default_model.iter().chain(&self.fallback).chain(self.shared.model_routes.keys());
        for model in named {
            if !models.contains(model) {
                models.push(model.clone());
            }
        }
        if models.is_empty() && self.script.is_some() {
            models.push("scripted".to_owned());
        }
        models
    }

    /// The waiting calls of every configured provider, named as routes name them (the
    /// provider's key in `[llm.providers]`), whether or not this run has a script.
    fn waiting_calls(&self) -> Vec<crate::ratelimit::WaitingCall> {
        self.shared
            .providers
            .iter()
            .flat_map(|(name, entry)| {
                entry
                    .provider
                    .waiting_calls()
                    .into_iter()
                    .map(|call| crate::ratelimit::WaitingCall { provider: name.clone(), ..call })
            })
            .collect()
    }

    /// Every configured provider's models with their queues and limits, named as routes
    /// name them (see [`Router::waiting_calls`]), sorted by provider then model.
    fn model_status(&self, tenant: Option<&str>) -> Vec<crate::ratelimit::ModelStatus> {
        self.shared
            .providers
            .iter()
            .flat_map(|(name, entry)| {
                entry
                    .provider
                    .model_status(tenant)
                    .into_iter()
                    .map(|model| crate::ratelimit::ModelStatus { provider: name.clone(), ..model })
            })
            .collect()
    }

    /// Serves the call from the run's script if it has one; otherwise walks the chain
    /// (see [`Router::chain`]): each model is tried up to `max_attempts` times while its
    /// failures are retryable, then the next model. A streamed call whose deltas already
    /// reached the listener is not retried (the listener would see text twice): its error
    /// is returned as is.
    async fn chat(&self, request: &LlmChatParams, stream: Option<&DeltaSink>) -> Result<Served> {
        if let Some(script) = &self.script {
            return self.serve_scripted(script, request, stream).await;
        }
        let chain = self.chain(request);
        if chain.is_empty() {
            return Err(Error::NoRoute(if self.shared.providers.is_empty() {
                NO_PROVIDER_HELP.to_owned()
            } else {
                format!(
                    "the call names no model and no default is set: pass `model`, run with `keel run --model \
                     PROVIDER/MODEL`, or set [llm] default_model in keel.toml (providers: {})",
                    self.provider_names().join(", ")
                )
            }));
        }
        let policy = self.shared.policy;
        let mut attempts: Vec<Value> = Vec::new();
        let mut tried = Vec::new();
        let mut last_error = None;
        for model in &chain {
            tried.push(model.clone());
            let (route, provider) =
                match self.resolve(model).and_then(|route| Ok((route.clone(), self.provider(&route)?))) {
                    Ok(found) => found,
                    Err(err) => {
                        attempts.push(failure_record(model, 0, &err));
                        last_error = Some(err);
                        continue;
                    }
                };
            let label = route.label();
            let routed = LlmChatParams { model: Some(route.model.clone()), ..request.clone() };
            let mut number = 1;
            loop {
                let (outcome, forwarded) = attempt(provider.as_ref(), &routed, stream).await;
                match outcome {
                    Ok(mut served) => {
                        attempts.push(json!({ "model": label, "attempt": number, "outcome": "ok" }));
                        let meta = served.meta.as_object_mut();
                        match meta {
                            Some(meta) => {
                                meta.insert("model".into(), json!(label));
                                meta.insert("attempts".into(), Value::Array(attempts));
                            }
                            None => {
                                served.meta = json!({ "provider": route.provider, "model": label, "attempts": attempts, "provider_meta": served.meta });
                            }
                        }
                        return Ok(served);
                    }
                    Err(err) => {
                        attempts.push(failure_record(&label, number, &err));
                        if forwarded {
                            return Err(err);
                        }
                        match policy.decide(number, &err, jitter()) {
                            RetryDecision::RetryAfter(pause) => {
                                tracing::info!(model = %label, attempt = number, ?pause, error = %err, "retrying LLM call");
                                tokio::time::sleep(pause).await;
                                number += 1;
                            }
                            RetryDecision::GiveUp => {
                                tracing::warn!(model = %label, attempt = number, error = %err, "LLM model failed");
                                last_error = Some(err);
                                break;
                            }
                        }
                    }
                }
            }
        }
        let last = last_error.unwrap_or_else(|| Error::NoRoute(NO_PROVIDER_HELP.to_owned()));
        if tried.len() == 1 {
            return Err(last);
        }
        Err(Error::FallbackExhausted { tried, last: Box::new(last) })
    }

    fn restore(&self, served: &[Value]) {
        if let Some(script) = &self.script {
            script.restore(served);
            return;
        }
        for (name, entry) in &self.shared.providers {
            let own: Vec<Value> = served
                .iter()
                .filter(|meta| meta.get("provider").and_then(Value::as_str) == Some(name))
                .cloned()
                .collect();
            if !own.is_empty() {
                entry.provider.restore(&own);
            }
        }
    }

    /// The worst case over the call's whole chain: a fallback may be pricier than the
    /// model asked for.
    fn worst_case_cost_usd(&self, model: Option<&str>, input_tokens: u64, max_output_tokens: u64) -> f64 {
        if let Some(script) = &self.script {
            return script.worst_case_cost_usd(model, input_tokens, max_output_tokens);
        }
        self.chain_of(model)
            .iter()
            .filter_map(|model| {
                let route = self.resolve(model).ok()?;
                let provider = self.provider(&route).ok()?;
                Some(provider.worst_case_cost_usd(Some(&route.model), input_tokens, max_output_tokens))
            })
            .fold(0.0, f64::max)
    }
}
