//! The embedder seam: the [`Embedder`] trait that turns texts into vectors for semantic
//! memory search, the OpenAI-compatible client (`POST {base_url}/embeddings`, batched,
//! with the chat providers' error classes and retries), and [`HashEmbedder`], the offline
//! default: feature hashing of words, word pairs and character trigrams. The hash
//! embedder is lexical-ish (it finds "kittens napping" from "the kitten naps" because they
//! share trigrams, not because it knows what a kitten is); it is not a model.
//!
//! ```toml
//! [llm.embeddings]
//! provider = "openai"                # a provider of [llm.providers] (kind openai), or "hash"
//! model = "text-embedding-3-small"
//! dimensions = 512                   # optional: asks the model for shorter vectors
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{HttpConfig, LlmConfig, ProviderKind, ResolvedProvider};
use crate::error::{Error, Result};
use crate::http::{self, Endpoint};
use crate::ratelimit::RateLimiter;
use crate::retry::{self, RetryDecision, RetryPolicy};

/// The model name of [`HashEmbedder`] vectors (stored with each record's embedding, so a
/// search never compares vectors of different models).
pub const HASH_MODEL: &str = "keel-hash-256";
/// The length of [`HashEmbedder`] vectors.
pub const HASH_DIMENSIONS: usize = 256;
/// OpenAI accepts at most 2048 inputs per request; longer lists are sent in batches.
const MAX_BATCH: usize = 2048;

/// Vectors for a list of texts, in the order given, plus what the provider billed.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens as reported by the provider (`usage.prompt_tokens`); `None` when it
    /// reported none (the offline embedder never does).
    pub input_tokens: Option<u64>,
}

/// Turns texts into vectors. Contract: `embed` returns exactly one vector per text, in
/// order, all of the same length, deterministic for a given model as far as the provider
/// is. It has no side effect other than the provider's bill, so a caller may retry it.
/// Cancel-safe: dropping the future abandons the call.
#[async_trait]
pub trait Embedder: Send + Sync {
    async fn embed(&self, texts: &[String]) -> Result<Embedded>;

    /// The model name stored with each vector (e.g. `text-embedding-3-small`).
    fn model(&self) -> &str;

    /// The vector length, when known before the first call.
    fn dimensions(&self) -> Option<usize>;
}

/// The `[llm.embeddings]` table of keel.toml.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// A provider of `[llm.providers]` (of kind `openai`), or `hash` for the offline one.
    pub provider: String,
    /// The model; required unless the provider is `hash`.
    #[serde(default)]
    pub model: Option<String>,
    /// Asks the model for vectors of this length (`dimensions` in the request).
    #[serde(default)]
    pub dimensions: Option<usize>,
}

/// The embedder `config` asks for: the offline [`HashEmbedder`] when it configures none
/// (or `provider = "hash"`), else an [`OpenAiEmbedder`] with the named provider's base URL
/// and key (resolved with `env`).
pub fn from_config(config: &LlmConfig, env: impl Fn(&str) -> Option<String>) -> Result<Arc<dyn Embedder>> {
    let Some(settings) = &config.embeddings else {
        return Ok(Arc::new(HashEmbedder));
    };
    if settings.provider == "hash" {
        return Ok(Arc::new(HashEmbedder));
    }
    let model = settings.model.clone().ok_or_else(|| {
        Error::Config(format!(
            "[llm.embeddings]: provider `{}` needs `model`, e.g. \"text-embedding-3-small\"",
            settings.provider
        ))
    })?;
    let provider =
        config.resolve_providers(env)?.into_iter().find(|p| p.name == settings.provider).ok_or_else(
            || {
                Error::Config(format!(
                    "[llm.embeddings] names provider `{}`, which is not configured; add [llm.providers.{}] \
                 (or set OPENAI_API_KEY / OPENAI_BASE_URL for `openai`), or use provider = \"hash\"",
                    settings.provider, settings.provider
                ))
            },
        )?;
    if provider.kind != ProviderKind::Openai {
        return Err(Error::Config(format!(
            "[llm.embeddings]: provider `{}` is of kind {}; embeddings need an OpenAI-compatible provider",
            provider.name,
            provider.kind.as_str()
        )));
    }
    Ok(Arc::new(OpenAiEmbedder::new(
        &provider,
        &config.http,
        config.retry.policy(),
        model,
        settings.dimensions,
    )?))
}

/// An OpenAI-compatible embeddings client: `POST {base_url}/embeddings` with
/// `{"model", "input": [...]}` (plus `dimensions` when configured). Retries rate limits
/// (honouring `Retry-After`) and server errors with the router's policy.
pub struct OpenAiEmbedder {
    endpoint: Endpoint,
    limiter: RateLimiter,
    policy: RetryPolicy,
    model: String,
    dimensions: Option<usize>,
}

impl OpenAiEmbedder {
    pub fn new(
        provider: &ResolvedProvider,
        http_config: &HttpConfig,
        policy: RetryPolicy,
        model: String,
        dimensions: Option<usize>,
    ) -> Result<OpenAiEmbedder> {
        let client = http::build_client(http_config)?;
        let mut fixed = Vec::new();
        if let Some(key) = &provider.api_key {
            fixed.push(("authorization".to_owned(), format!("Bearer {}", key.0)));
        }
        let endpoint = Endpoint::new(
            &provider.name,
            format!("{}/embeddings", provider.base_url),
            client,
            fixed,
            &provider.headers,
            provider.key_source.clone(),
            Duration::from_millis(http_config.read_timeout_ms),
        )?;
        let limits = provider.limits.iter().map(|(model, limits)| (model.clone(), *limits)).collect();
        Ok(OpenAiEmbedder { endpoint, limiter: RateLimiter::new(limits), policy, model, dimensions })
    }

    async fn attempt(&self, body: &Value, count: usize) -> Result<Embedded> {
        let response = self.endpoint.post(body, &self.model, &self.limiter).await?;
        let value = self.endpoint.read_json(response).await?;
        parse_embeddings(&value, count).map_err(|e| Error::Upstream(self.endpoint.invalid_response(e)))
    }

    async fn batch(&self, texts: &[String]) -> Result<Embedded> {
        // OpenAI refuses an empty input string; a space embeds to the same "nothing".
        let input: Vec<&str> = texts.iter().map(|t| if t.is_empty() { " " } else { t.as_str() }).collect();
        let mut body = json!({ "model": self.model, "input": input, "encoding_format": "float" });
        if let Some(dimensions) = self.dimensions {
            body["dimensions"] = json!(dimensions);
        }
        let mut attempt = 1;
        loop {
            match self.attempt(&body, texts.len()).await {
                Ok(embedded) => return Ok(embedded),
                Err(err) => match self.policy.decide(attempt, &err, retry::jitter()) {
                    RetryDecision::RetryAfter(wait) => {
                        tracing::debug!(provider = %self.endpoint.provider, attempt, "embeddings retry: {err}");
                        tokio::time::sleep(wait).await;
                        attempt += 1;
                    }
                    RetryDecision::GiveUp => return Err(err),
                },
            }
        }
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    async fn embed(&self, texts: &[String]) -> Result<Embedded> {
        let mut all = Embedded { vectors: Vec::with_capacity(texts.len()), input_tokens: None };
        for chunk in texts.chunks(MAX_BATCH) {
            let embedded = self.batch(chunk).await?;
            all.vectors.extend(embedded.vectors);
            if let Some(tokens) = embedded.input_tokens {
                all.input_tokens = Some(all.input_tokens.unwrap_or(0) + tokens);
            }
        }
        Ok(all)
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn dimensions(&self) -> Option<usize> {
        self.dimensions
    }
}

/// Parses an embeddings answer `{"data":[{"index","embedding":[...]}], "usage":{...}}`
/// holding `count` vectors: ordered by `index` (servers may answer out of order), all of
/// one length. Pure.
pub fn parse_embeddings(value: &Value, count: usize) -> Result<Embedded, String> {
    let data = value.get("data").and_then(Value::as_array).ok_or("no `data` array")?;
    if data.len() != count {
        return Err(format!("{} embeddings for {count} inputs", data.len()));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; count];
    for (position, item) in data.iter().enumerate() {
        let index = match item.get("index") {
            Some(index) => index.as_u64().ok_or("an `index` is not a number")? as usize,
            None => position,
        };
        let numbers = item.get("embedding").and_then(Value::as_array).ok_or_else(|| {
            format!("item {index} has no `embedding` array (base64 encoding is not supported)")
        })?;
        let vector = numbers
            .iter()
            .map(|n| n.as_f64().map(|n| n as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| format!("embedding {index} holds something other than numbers"))?;
        let slot = vectors.get_mut(index).ok_or_else(|| format!("index {index} is out of range"))?;
        if slot.replace(vector).is_some() {
            return Err(format!("index {index} appears twice"));
        }
    }
    let vectors: Vec<Vec<f32>> = vectors.into_iter().map(Option::unwrap_or_default).collect();
    if let Some(first) = vectors.first()
        && (first.is_empty() || vectors.iter().any(|v| v.len() != first.len()))
    {
        return Err("the embeddings are empty or of different lengths".to_owned());
    }
    let input_tokens = value.pointer("/usage/prompt_tokens").and_then(Value::as_u64);
    Ok(Embedded { vectors, input_tokens })
}

/// The offline embedder: feature hashing (FNV-1a) of lowercased words (weight 1), adjacent
/// word pairs (0.5) and the character trigrams of each word padded with `#` (0.5) into
/// [`HASH_DIMENSIONS`] signed buckets, L2-normalized. Deterministic across builds and
/// machines. Lexical-ish: texts that share words or word pieces come out close; synonyms
/// without shared letters do not. Not a real model.
#[derive(Debug, Clone, Copy, Default)]
pub struct HashEmbedder;

impl HashEmbedder {
    pub fn vector(text: &str) -> Vec<f32> {
        let mut vector = vec![0f32; HASH_DIMENSIONS];
        let mut add = |feature: &str, weight: f32| {
            let hash = fnv1a(feature.as_bytes());
            let bucket = (hash % HASH_DIMENSIONS as u64) as usize;
            let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
            vector[bucket] += sign * weight;
        };
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        for (i, word) in words.iter().enumerate() {
            add(&format!("w:{word}"), 1.0);
            if let Some(next) = words.get(i + 1) {
                add(&format!("b:{word} {next}"), 0.5);
            }
            let padded: Vec<char> = format!("#{word}#").chars().collect();
            for trigram in padded.windows(3) {
                add(&format!("t:{}", trigram.iter().collect::<String>()), 0.5);
            }
        }
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            vector.iter_mut().for_each(|x| *x /= norm);
        }
        vector
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

#[async_trait]
impl Embedder for HashEmbedder {
    async fn embed(&self, texts: &[String]) -> Result<Embedded> {
        Ok(Embedded { vectors: texts.iter().map(|t| HashEmbedder::vector(t)).collect(), input_tokens: None })
    }

    fn model(&self) -> &str {
        HASH_MODEL
    }

    fn dimensions(&self) -> Option<usize> {
        Some(HASH_DIMENSIONS)
    }
}

/// Cosine similarity; 0 when either vector is all zeros or the lengths differ. Pure.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f32, 0f32, 0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na.sqrt() * nb.sqrt()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_vectors_are_normalized_deterministic_and_lexical() {
        let a = HashEmbedder::vector("The kitten naps on the windowsill");
        assert_eq!(a.len(), HASH_DIMENSIONS);
        assert!((a.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(a, HashEmbedder::vector("the KITTEN naps, on the windowsill!"));
        let paraphrase = HashEmbedder::vector("kittens napping by windows");
        let unrelated = HashEmbedder::vector("quarterly tax filing deadline");
        assert!(cosine(&a, &paraphrase) > cosine(&a, &unrelated) + 0.2);
        assert_eq!(HashEmbedder::vector(""), vec![0.0; HASH_DIMENSIONS]);
        // Pinned: stored vectors must not change meaning between builds.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn embeddings_answers_parse_in_index_order() {
        let value = json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
                {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}
            ],
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": 7, "total_tokens": 7}
        });
        let parsed = parse_embeddings(&value, 2).unwrap();
        assert_eq!(parsed.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(parsed.input_tokens, Some(7));
        assert!(parse_embeddings(&value, 3).unwrap_err().contains("2 embeddings for 3"));
        let ragged =
            json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]});
        assert!(parse_embeddings(&ragged, 2).unwrap_err().contains("different lengths"));
        let twice = json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]});
        assert!(parse_embeddings(&twice, 2).unwrap_err().contains("twice"));
        let base64 = json!({"data": [{"index": 0, "embedding": "AAAA"}]});
        assert!(parse_embeddings(&base64, 1).unwrap_err().contains("base64"));
    }

    #[test]
    fn cosine_of_edge_cases() {
        assert_eq!(cosine(&[1.0, 0.0], &[1.0, 0.0]), 1.0);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    }

    #[test]
    fn config_picks_the_embedder() {
        let none = LlmConfig::default();
        assert_eq!(from_config(&none, |_| None).unwrap().model(), HASH_MODEL);
        let config = LlmConfig::from_keel_toml(
            "[llm.providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             [llm.embeddings]\nprovider = \"local\"\nmodel = \"nomic-embed-text\"\ndimensions = 64\n",
        )
        .unwrap();
        let embedder = from_config(&config, |_| None).unwrap();
        assert_eq!((embedder.model(), embedder.dimensions()), ("nomic-embed-text", Some(64)));
        let missing =
            LlmConfig::from_keel_toml("[llm.embeddings]\nprovider = \"openai\"\nmodel = \"m\"\n").unwrap();
        let err = from_config(&missing, |_| None).err().unwrap().to_string();
        assert!(err.contains("not configured"), "{err}");
        let no_model = LlmConfig::from_keel_toml("[llm.embeddings]\nprovider = \"openai\"\n").unwrap();
        assert!(from_config(&no_model, |_| None).err().unwrap().to_string().contains("needs `model`"));
    }
}
