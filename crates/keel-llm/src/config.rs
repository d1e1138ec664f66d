//! The `[llm]` section of `keel.toml`: providers (kind, base URL, where the key comes
//! from), per-model rate limits and routing, price overrides, the default model and
//! fallback chain, retry and HTTP timing. With no file, [`LlmConfig::from_env`] sets up
//! `openai` and `anthropic` from the variables those providers' own SDKs read.
//!
//! ```toml
//! [llm]
//! default_model = "openai/gpt-4o-mini"
//! fallback = ["anthropic/claude-haiku-4-5"]
//!
//! [llm.providers.openai]               # kind defaults from the name for openai/anthropic
//! api_key_env = "OPENAI_API_KEY"       # the default for `openai`
//!
//! [llm.providers.local]
//! kind = "openai"                      # any OpenAI-compatible server: vLLM, Ollama, ...
//! base_url = "http://localhost:11434/v1"
//!
//! [llm.models."openai/gpt-4o-mini"]
//! requests_per_minute = 500
//! tokens_per_minute = 200000
//!
//! [llm.models."openai/gpt-5"]
//! api = "responses"                    # POST {base_url}/responses: reasoning items round-trip
//!
//! [llm.models."llama3.1"]
//! provider = "local"                   # bare `llama3.1` goes to `local`
//!
//! [llm.prices."llama3.1"]
//! input_per_mtok = 0.0
//! output_per_mtok = 0.0
//!
//! [llm.retry]
//! max_attempts = 4
//! initial_backoff_ms = 500
//!
//! [llm.embeddings]                     # semantic memory; the offline hash embedder when absent
//! provider = "openai"
//! model = "text-embedding-3-small"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, KeySource, Result};
use crate::pricing::ModelPrice;
use crate::ratelimit::Limits;
use crate::retry::RetryPolicy;

pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The model calls use when neither the request, the run nor the config names one.
pub const OPENAI_DEFAULT_MODEL: &str = "gpt-4o-mini";
pub const ANTHROPIC_DEFAULT_MODEL: &str = "claude-haiku-4-5";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions and compatible servers (vLLM, Ollama, LM Studio, Groq,
    /// Together, OpenRouter).
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// Which API a kind-`openai` provider calls upstream (`api = "chat" | "responses"` on
/// `[llm.providers.<name>]` or `[llm.models."<route or model>"]`; a model's setting wins).
/// Chat Completions is what every OpenAI-compatible server speaks; the Responses API is
/// OpenAI's newer one, the only one that returns reasoning items (with their
/// `encrypted_content`) for the next turn to send back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OpenAiApi {
    /// `POST {base_url}/chat/completions`.
    #[default]
    Chat,
    /// `POST {base_url}/responses` (see [`crate::openai::upstream_responses`]).
    Responses,
}

impl OpenAiApi {
    pub fn as_str(self) -> &'static str {
        match self {
            OpenAiApi::Chat => "chat",
            OpenAiApi::Responses => "responses",
        }
    }
}

impl<'de> Deserialize<'de> for OpenAiApi {
    /// By hand so that a wrong value names the field and both allowed values.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<OpenAiApi, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "chat" => Ok(OpenAiApi::Chat),
            "responses" => Ok(OpenAiApi::Responses),
            other => Err(serde::de::Error::custom(format!(
                "`api` is {other:?}; allowed values are \"chat\" (Chat Completions, the default) and \"responses\" \
                 (the OpenAI Responses API)"
            ))),
        }
    }
}

/// An API key that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Defaults to the provider's name when that is `openai` or `anthropic`.
    #[serde(default)]
    pub kind: Option<ProviderKind>,
    /// `https://api.openai.com/v1` (requests go to `{base_url}/chat/completions`) or
    /// `https://api.anthropic.com` (requests go to `{base_url}/v1/messages`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The kernel environment variable holding the key; defaults to `OPENAI_API_KEY` /
    /// `ANTHROPIC_API_KEY` for providers named `openai` / `anthropic`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The key itself (prefer `api_key_env`: keel.toml is easy to leak).
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Extra headers on every request (e.g. `OpenAI-Organization`, OpenRouter's `HTTP-Referer`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Kind `openai` only: the upstream API for this provider's models (Chat Completions
    /// when unset); `[llm.models]` may choose otherwise per model.
    #[serde(default)]
    pub api: Option<OpenAiApi>,
}

/// Per-model settings, keyed by route (`openai/gpt-4o-mini`) or bare model name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Sends the bare model name to this provider.
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// The upstream API for this model when its provider is kind `openai` (wins over the
    /// provider's `api`).
    #[serde(default)]
    pub api: Option<OpenAiApi>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub max_retry_after_ms: u64,
    pub max_queue_wait_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> RetryConfig {
        let policy = RetryPolicy::default();
        RetryConfig {
            max_attempts: policy.max_attempts,
            initial_backoff_ms: policy.initial_backoff.as_millis() as u64,
            max_backoff_ms: policy.max_backoff.as_millis() as u64,
            max_retry_after_ms: policy.max_retry_after.as_millis() as u64,
            max_queue_wait_ms: policy.max_queue_wait.as_millis() as u64,
        }
    }
}

impl RetryConfig {
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            initial_backoff: Duration::from_millis(self.initial_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
            max_retry_after: Duration::from_millis(self.max_retry_after_ms),
            max_queue_wait: Duration::from_millis(self.max_queue_wait_ms),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub connect_timeout_ms: u64,
    /// The longest wait for the next byte of a response (so long streams are fine, a
    /// stalled one is not).
    pub read_timeout_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig { connect_timeout_ms: 10_000, read_timeout_ms: 600_000 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The model for calls that name none (`openai/gpt-4o-mini`, or a bare name).
    #[serde(default)]
    pub default_model: Option<String>,
    /// Models tried in order after the call's own model fails for good.
    #[serde(default)]
    pub fallback: Vec<String>,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    /// Overrides of (and additions to) the shipped default price table.
    #[serde(default)]
    pub prices: BTreeMap<String, ModelPrice>,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub http: HttpConfig,
    /// `[llm.embeddings]`: the embedder for semantic memory search (the offline hash
    /// embedder when absent); see [`crate::embed`].
    #[serde(default)]
    pub embeddings: Option<crate::embed::EmbeddingsConfig>,
}

/// A provider with everything resolved: kind, URL and the key itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedProvider {
    pub name: String,
    pub kind: ProviderKind,
    /// Without a trailing `/`.
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub key_source: KeySource,
    pub headers: BTreeMap<String, String>,
    /// Configured limits of this provider's models, by bare model name.
    pub limits: BTreeMap<String, Limits>,
    /// The upstream API of this provider's models that set none in `[llm.models]`.
    pub api: OpenAiApi,
    /// Models whose `[llm.models]` entry sets `api`, by bare model name (an entry keyed by
    /// the route, `provider/model`, wins over one keyed by the bare name).
    pub model_apis: BTreeMap<String, OpenAiApi>,
}

impl ResolvedProvider {
    /// The API a call to `model` (a bare name, as the router sends it) goes through.
    pub fn api_for(&self, model: &str) -> OpenAiApi {
        self.model_apis.get(model).copied().unwrap_or(self.api)
    }
}

impl LlmConfig {
    /// Parses the `[llm]` table of a keel.toml document (other tables belong to others
    /// and are ignored; a missing `[llm]` is an empty config).
    pub fn from_keel_toml(text: &str) -> Result<LlmConfig> {
        #[derive(Deserialize)]
        struct KeelToml {
            #[serde(default)]
            llm: LlmConfig,
        }
        let parsed: KeelToml = toml::from_str(text).map_err(|e| Error::Config(format!("keel.toml: {e}")))?;
        parsed.llm.validate()?;
        Ok(parsed.llm)
    }

    /// What the kernel runs with: the `[llm]` table of keel.toml when there is one
    /// (`keel_toml` is the file's text), and providers from the kernel's environment (see
    /// [`LlmConfig::from_env_with`]) when the file configures none, so a keel.toml that only
    /// sets prices or limits still finds `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`.
    pub fn load(keel_toml: Option<&str>) -> Result<LlmConfig> {
        Self::load_with_env(keel_toml, |name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`LlmConfig::load`] with the environment injected.
    pub fn load_with_env(keel_toml: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<LlmConfig> {
        let mut config = match keel_toml {
            Some(text) => Self::from_keel_toml(text)?,
            None => LlmConfig::default(),
        };
        if config.providers.is_empty() {
            let from_env = Self::from_env_with(env);
            config.providers = from_env.providers;
            if config.default_model.is_none() {
                config.default_model = from_env.default_model;
            }
            config.validate()?;
        }
        Ok(config)
    }

    /// The config for a kernel with no keel.toml, from its own environment.
    pub fn from_env() -> LlmConfig {
        Self::from_env_with(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`LlmConfig::from_env`] with the environment injected: an `openai` provider when
    /// `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set (a local server needs no key), an
    /// `anthropic` provider when `ANTHROPIC_API_KEY` or `ANTHROPIC_BASE_URL` is set.
    /// The default model is OpenAI's when both are there.
    pub fn from_env_with(env: impl Fn(&str) -> Option<String>) -> LlmConfig {
        let mut config = LlmConfig::default();
        for (name, key_var, url_var, model) in [
            ("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", OPENAI_DEFAULT_MODEL),
            ("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", ANTHROPIC_DEFAULT_MODEL),
        ] {
            let base_url = env(url_var);
            if env(key_var).is_none() && base_url.is_none() {
                continue;
            }
            config.providers.insert(
                name.to_owned(),
                ProviderConfig {
                    base_url,
                    api_key_env: Some(key_var.to_owned()),
                    ..ProviderConfig::default()
                },
            );
            config.default_model.get_or_insert_with(|| format!("{name}/{model}"));
        }
        config
    }

    /// Checks what can be checked without the environment: kinds, URLs, and that the
    /// default and fallback models name configured providers.
    pub fn validate(&self) -> Result<()> {
        for (name, provider) in &self.providers {
            let kind = kind_of(name, provider)?;
            if let Some(api) = provider.api
                && kind != ProviderKind::Openai
            {
                return Err(Error::Config(format!(
                    "provider `{name}` is kind {}, but `api = \"{}\"` applies to kind openai only (it picks Chat \
                     Completions or the Responses API); remove `api` from [llm.providers.{name}]",
                    kind.as_str(),
                    api.as_str()
                )));
            }
            if name.is_empty() || name.contains('/') {
                return Err(Error::Config(format!(
                    "provider name {name:?} must be non-empty and contain no '/'"
                )));
            }
            if let Some(url) = &provider.base_url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(Error::Config(format!(
                    "provider `{name}`: base_url {url:?} must start with https:// (or http:// for a local server)"
                )));
            }
        }
        for model in self.default_model.iter().chain(&self.fallback) {
            if let Some((provider, rest)) = model.split_once('/')
                && !self.providers.contains_key(provider)
                && !rest.is_empty()
                && (provider == "openai" || provider == "anthropic")
            {
                return Err(Error::Config(format!(
                    "model {model:?} names provider `{provider}`, which is not configured; add [llm.providers.{provider}]"
                )));
            }
        }
        for (model, settings) in &self.models {
            if let Some(provider) = &settings.provider
                && !self.providers.contains_key(provider)
            {
                return Err(Error::Config(format!(
                    "[llm.models.{model:?}] routes to provider `{provider}`, which is not configured"
                )));
            }
            // Where the entry names its provider (by route or `provider =`), an `api` on a
            // model of a non-openai provider is a mistake worth saying; a bare name with
            // no provider applies to whichever openai provider serves it.
            let named = model.split_once('/').map(|(p, _)| p).or(settings.provider.as_deref());
            if let (Some(api), Some(provider)) = (settings.api, named)
                && let Some(config) = self.providers.get(provider)
                && let Ok(kind) = kind_of(provider, config)
                && kind != ProviderKind::Openai
            {
                return Err(Error::Config(format!(
                    "[llm.models.{model:?}] sets `api = \"{}\"`, but its provider `{provider}` is kind {}; `api` \
                     applies to kind openai only: remove it",
                    api.as_str(),
                    kind.as_str()
                )));
            }
        }
        for (model, price) in &self.prices {
            if !(price.input_per_mtok >= 0.0 && price.output_per_mtok >= 0.0) {
                return Err(Error::Config(format!(
                    "[llm.prices.{model:?}]: prices must be non-negative numbers"
                )));
            }
        }
        Ok(())
    }

    /// Resolves every provider's kind, URL and key, reading key variables with `env`.
    /// A missing key is not an error here (local servers need none; a real provider will
    /// answer 401, and the error says which variable to set).
    pub fn resolve_providers(&self, env: impl Fn(&str) -> Option<String>) -> Result<Vec<ResolvedProvider>> {
        self.validate()?;
        self.providers
            .iter()
            .map(|(name, provider)| {
                let kind = kind_of(name, provider)?;
                let default_env = match name.as_str() {
                    "openai" => Some("OPENAI_API_KEY"),
                    "anthropic" => Some("ANTHROPIC_API_KEY"),
                    _ => None,
                };
                let key_env = provider.api_key_env.clone().or(default_env.map(str::to_owned));
                let (api_key, key_source) = match (&provider.api_key, &key_env) {
                    (Some(key), _) => (Some(key.clone()), KeySource::Inline),
                    (None, Some(var)) => {
                        (env(var).filter(|v| !v.is_empty()).map(Secret), KeySource::Env(var.clone()))
                    }
                    (None, None) => (None, KeySource::None),
                };
                let default_url = match kind {
                    ProviderKind::Openai => OPENAI_DEFAULT_BASE_URL,
                    ProviderKind::Anthropic => ANTHROPIC_DEFAULT_BASE_URL,
                };
                let base_url =
                    provider.base_url.as_deref().unwrap_or(default_url).trim_end_matches('/').to_owned();
                let limits = self
                    .models
                    .iter()
                    .filter_map(|(model, settings)| {
                        let bare = model_of_provider(name, model, settings)?;
                        let limits = Limits {
                            requests_per_minute: settings.requests_per_minute,
                            tokens_per_minute: settings.tokens_per_minute,
                        };
                        (limits != Limits::default()).then(|| (bare.to_owned(), limits))
                    })
                    .collect();
                let mut model_apis = BTreeMap::new();
                // Bare-keyed entries first, so that a route-keyed one overwrites them.
                for by_route in [false, true] {
                    for (model, settings) in &self.models {
                        if model.contains('/') == by_route
                            && let Some(api) = settings.api
                            && let Some(bare) = model_of_provider(name, model, settings)
                        {
                            model_apis.insert(bare.to_owned(), api);
                        }
                    }
                }
                Ok(ResolvedProvider {
                    name: name.clone(),
                    kind,
                    base_url,
                    api_key,
                    key_source,
                    headers: provider.headers.clone(),
                    limits,
                    api: provider.api.unwrap_or_default(),
                    model_apis,
                })
            })
            .collect()
    }
}

/// The bare model name an `[llm.models]` entry keyed `model` configures on provider
/// `name`, if it is one of that provider's: `name/bare`, or a bare name routed to `name`
/// (or to no provider in particular).
fn model_of_provider<'a>(name: &str, model: &'a str, settings: &ModelConfig) -> Option<&'a str> {
    match model.split_once('/') {
        Some((p, bare)) if p == name => Some(bare),
        Some(_) => None,
        None if settings.provider.as_deref().is_none_or(|p| p == name) => Some(model),
        None => None,
    }
}

fn kind_of(name: &str, provider: &ProviderConfig) -> Result<ProviderKind> {
    match (provider.kind, name) {
        (Some(kind), _) => Ok(kind),
        (None, "openai") => Ok(ProviderKind::Openai),
        (None, "anthropic") => Ok(ProviderKind::Anthropic),
        (None, _) => Err(Error::Config(format!(
            "provider `{name}` needs `kind = \"openai\"` (any OpenAI-compatible server) or `kind = \"anthropic\"`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        [server]
        listen = "127.0.0.1:7777"   # someone else's section

        [llm]
        default_model = "openai/gpt-4o-mini"
        fallback = ["anthropic/claude-haiku-4-5", "local/llama3.1"]

        [llm.providers.openai]
        headers = { "OpenAI-Organization" = "org-1" }

        [llm.providers.anthropic]
        base_url = "https://proxy.example/anthropic/"
        api_key = "sk-ant-inline"

        [llm.providers.local]
        kind = "openai"
        base_url = "http://localhost:11434/v1"

        [llm.models."openai/gpt-4o-mini"]
        requests_per_minute = 500
        tokens_per_minute = 200000

        [llm.models."llama3.1"]
        provider = "local"
        requests_per_minute = 30

        [llm.prices."llama3.1"]
        input_per_mtok = 0.0
        output_per_mtok = 0.0

        [llm.retry]
        max_attempts = 2
        initial_backoff_ms = 1

        [llm.http]
        read_timeout_ms = 5000
    "#;

    #[test]
    fn a_full_config_parses_and_resolves() {
        let config = LlmConfig::from_keel_toml(FULL).unwrap();
        assert_eq!(config.default_model.as_deref(), Some("openai/gpt-4o-mini"));
        assert_eq!(config.fallback.len(), 2);
        assert_eq!(config.retry.policy().max_attempts, 2);
        assert_eq!(config.retry.policy().initial_backoff, Duration::from_millis(1));
        assert_eq!(
            config.retry.max_backoff_ms,
            RetryConfig::default().max_backoff_ms,
            "unset fields keep defaults"
        );
        assert_eq!(config.http, HttpConfig { connect_timeout_ms: 10_000, read_timeout_ms: 5000 });
        let providers =
            config.resolve_providers(|var| (var == "OPENAI_API_KEY").then(|| "sk-env".to_owned())).unwrap();
        let names: Vec<_> = providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["anthropic", "local", "openai"]);
        let [anthropic, local, openai] = &providers[..] else { unreachable!() };
        assert_eq!(anthropic.kind, ProviderKind::Anthropic);
        assert_eq!(anthropic.base_url, "https://proxy.example/anthropic");
        assert_eq!(anthropic.key_source, KeySource::Inline);
        assert_eq!(anthropic.api_key, Some(Secret("sk-ant-inline".into())));
        assert_eq!(local.kind, ProviderKind::Openai);
        assert_eq!(local.api_key, None);
        assert_eq!(local.key_source, KeySource::None);
        assert_eq!(local.limits["llama3.1"].requests_per_minute, Some(30));
        assert_eq!(openai.base_url, OPENAI_DEFAULT_BASE_URL);
        assert_eq!(openai.api_key, Some(Secret("sk-env".into())));
        assert_eq!(openai.key_source, KeySource::Env("OPENAI_API_KEY".into()));
        assert_eq!(openai.headers["OpenAI-Organization"], "org-1");
        assert_eq!(
            openai.limits["gpt-4o-mini"],
            Limits { requests_per_minute: Some(500), tokens_per_minute: Some(200_000) }
        );
        assert!(!openai.limits.contains_key("llama3.1"), "routed to another provider");
    }

    #[test]
    fn the_upstream_api_is_chosen_per_provider_and_per_model() {
        let config = LlmConfig::from_keel_toml(
            r#"
            [llm.providers.openai]
            api = "responses"

            [llm.providers.local]
            kind = "openai"
            base_url = "http://localhost:8000/v1"

            [llm.models."gpt-4o-mini"]
            api = "chat"                 # bare: any openai provider serving it

            [llm.models."gpt-4.1"]
            api = "chat"

            [llm.models."openai/gpt-4.1"]
            api = "responses"            # the route wins over the bare name

            [llm.models."local/qwen3"]
            api = "responses"

            [llm.models."o3"]
            provider = "local"
            api = "chat"
            "#,
        )
        .unwrap();
        let providers = config.resolve_providers(|_| None).unwrap();
        let [local, openai] = &providers[..] else { unreachable!() };
        assert_eq!(openai.api, OpenAiApi::Responses);
        assert_eq!(openai.api_for("gpt-5"), OpenAiApi::Responses, "the provider's default");
        assert_eq!(openai.api_for("gpt-4o-mini"), OpenAiApi::Chat, "a model's setting wins");
        assert_eq!(openai.api_for("gpt-4.1"), OpenAiApi::Responses);
        assert_eq!(openai.api_for("o3"), OpenAiApi::Responses, "o3's entry is local's");
        assert_eq!(local.api, OpenAiApi::Chat, "chat by default");
        assert_eq!(local.api_for("qwen3"), OpenAiApi::Responses);
        assert_eq!(local.api_for("gpt-4.1"), OpenAiApi::Chat);
        assert_eq!(local.api_for("o3"), OpenAiApi::Chat);
        assert_eq!(local.api_for("anything"), OpenAiApi::Chat);
    }

    #[test]
    fn api_mistakes_name_the_field_the_values_and_the_provider() {
        for (text, needles) in [
            (
                "[llm.providers.openai]\napi = \"completions\"",
                &["`api`", "\"completions\"", "\"chat\"", "\"responses\""][..],
            ),
            ("[llm.models.m]\napi = \"Responses\"", &["`api`", "\"chat\"", "\"responses\""]),
            ("[llm.providers.openai]\napi = 1", &["api"]),
            (
                "[llm.providers.claude]\nkind = \"anthropic\"\napi = \"responses\"",
                &["provider `claude`", "kind anthropic", "remove `api`"],
            ),
            ("[llm.providers.anthropic]\napi = \"chat\"", &["provider `anthropic`", "kind openai only"]),
            (
                "[llm.providers.anthropic]\n[llm.models.\"anthropic/claude-haiku-4-5\"]\napi = \"responses\"",
                &["[llm.models.\"anthropic/claude-haiku-4-5\"]", "provider `anthropic`", "kind anthropic"],
            ),
            (
                "[llm.providers.c]\nkind = \"anthropic\"\n[llm.models.sonnet]\nprovider = \"c\"\napi = \"chat\"",
                &["[llm.models.\"sonnet\"]", "provider `c`"],
            ),
        ] {
            let err = LlmConfig::from_keel_toml(text).unwrap_err().to_string();
            for needle in needles {
                assert!(err.contains(needle), "{text:?}: {err} (wanted {needle:?})");
            }
        }
        // A bare name with no provider may be served by an openai provider: not an error.
        LlmConfig::from_keel_toml("[llm.providers.anthropic]\n[llm.models.m]\napi = \"responses\"").unwrap();
    }

    #[test]
    fn keys_never_print() {
        let config = LlmConfig::from_keel_toml(FULL).unwrap();
        let text = format!("{config:?}");
        assert!(!text.contains("sk-ant-inline"), "{text}");
        assert!(text.contains("<redacted>"));
    }

    #[test]
    fn no_llm_table_is_an_empty_config() {
        assert_eq!(LlmConfig::from_keel_toml("[server]\nx = 1\n").unwrap(), LlmConfig::default());
        assert_eq!(LlmConfig::from_keel_toml("").unwrap(), LlmConfig::default());
    }

    #[test]
    fn mistakes_are_explained() {
        for (text, needle) in [
            ("[llm]\ndefault_modle = \"x\"", "default_modle"),
            ("[llm.providers.groq]\nbase_url = \"https://api.groq.com/openai/v1\"", "needs `kind"),
            ("[llm.providers.x]\nkind = \"gemini\"", "gemini"),
            ("[llm.providers.openai]\nbase_url = \"api.openai.com\"", "must start with https://"),
            ("[llm]\ndefault_model = \"anthropic/claude-haiku-4-5\"", "add [llm.providers.anthropic]"),
            ("[llm.models.m]\nprovider = \"nowhere\"", "nowhere"),
            ("[llm.prices.m]\ninput_per_mtok = -1\noutput_per_mtok = 1", "non-negative"),
            ("[llm.prices.m]\ninput_per_mtok = 1", "output_per_mtok"),
            ("[llm\n", "keel.toml"),
        ] {
            let err = LlmConfig::from_keel_toml(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn load_takes_providers_from_the_environment_only_when_the_file_has_none() {
        let env = |name: &str| (name == "ANTHROPIC_API_KEY").then(|| "sk-2".to_owned());
        let prices_only = "[llm.prices.\"m\"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n";
        let config = LlmConfig::load_with_env(Some(prices_only), env).unwrap();
        assert_eq!(config.providers.keys().collect::<Vec<_>>(), ["anthropic"]);
        assert_eq!(config.default_model.as_deref(), Some("anthropic/claude-haiku-4-5"));
        assert_eq!(config.prices.len(), 1);

        let own = "[llm]\ndefault_model = \"local/m\"\n[llm.providers.local]\nkind = \"openai\"\n";
        let config = LlmConfig::load_with_env(Some(own), env).unwrap();
        assert_eq!(
            config.providers.keys().collect::<Vec<_>>(),
            ["local"],
            "the file's providers are the whole list"
        );

        let no_file = LlmConfig::load_with_env(None, env).unwrap();
        assert_eq!(no_file, LlmConfig::from_env_with(env));
        assert!(LlmConfig::load_with_env(Some("[llm\n"), env).is_err());
    }

    #[test]
    fn from_env_sets_up_what_the_sdks_would() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(LlmConfig::from_env_with(env(&[])), LlmConfig::default());

        let both =
            LlmConfig::from_env_with(env(&[("OPENAI_API_KEY", "sk-1"), ("ANTHROPIC_API_KEY", "sk-2")]));
        assert_eq!(both.default_model.as_deref(), Some("openai/gpt-4o-mini"));
        let resolved = both
            .resolve_providers(env(&[("OPENAI_API_KEY", "sk-1"), ("ANTHROPIC_API_KEY", "sk-2")]))
            .unwrap();
        assert_eq!(resolved[0].name, "anthropic");
        assert_eq!(resolved[0].api_key, Some(Secret("sk-2".into())));
        assert_eq!(resolved[0].base_url, ANTHROPIC_DEFAULT_BASE_URL);
        assert_eq!(resolved[1].api_key, Some(Secret("sk-1".into())));

        let anthropic_only = LlmConfig::from_env_with(env(&[("ANTHROPIC_API_KEY", "sk-2")]));
        assert_eq!(anthropic_only.default_model.as_deref(), Some("anthropic/claude-haiku-4-5"));
        assert_eq!(anthropic_only.providers.len(), 1);

        let local = LlmConfig::from_env_with(env(&[("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/")]));
        let resolved = local.resolve_providers(env(&[])).unwrap();
        assert_eq!(resolved[0].base_url, "http://127.0.0.1:8000/v1");
        assert_eq!(resolved[0].api_key, None);
        assert_eq!(resolved[0].key_source, KeySource::Env("OPENAI_API_KEY".into()));
    }
}
