//! The OpenAI-compatible embedder against a mock upstream speaking the real
//! `/v1/embeddings` wire format (every request checked: path, model, input list, auth).

use keel_llm::config::LlmConfig;
use keel_llm::{ErrorClass, Router};
use serde_json::{Value, json};

use crate::mock::{Dialect, Mock, Reply};

const KEY: &str = "sk-embed-789";

fn answer(vectors: &[&[f32]], tokens: u64) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| json!({"object": "embedding", "index": index, "embedding": v}))
        .collect();
    json!({"object": "list", "data": data, "model": "text-embedding-3-small",
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
}

fn router(mock: &Mock, extra: &str) -> Router {
    let toml = format!(
        "[llm.providers.openai]\nbase_url = \"{}\"\n[llm.embeddings]\nprovider = \"openai\"\n\
         model = \"text-embedding-3-small\"\n{extra}\n[llm.retry]\nmax_attempts = 3\n\
         initial_backoff_ms = 1\nmax_backoff_ms = 5\n",
        mock.base_url()
    );
    let config = LlmConfig::from_keel_toml(&toml).unwrap();
    Router::from_config_with_env(&config, |name| (name == "OPENAI_API_KEY").then(|| KEY.to_owned())).unwrap()
}

#[tokio::test]
async fn embeds_a_batch_in_order_with_usage() {
    let mock = Mock::start(
        Dialect::OpenAiEmbeddings,
        Some(KEY),
        vec![Reply::json(answer(&[&[1.0, 0.0], &[0.0, 1.0]], 9))],
    )
    .await;
    let embedder = router(&mock, "dimensions = 2").embedder();
    assert_eq!((embedder.model(), embedder.dimensions()), ("text-embedding-3-small", Some(2)));
    let embedded = embedder.embed(&["first text".into(), "".into()]).await.unwrap();
    assert_eq!(embedded.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    assert_eq!(embedded.input_tokens, Some(9));
    let requests = mock.requests();
    assert_eq!(requests.len(), 1, "one request for the batch");
    assert_eq!(requests[0].body["input"], json!(["first text", " "]));
    assert_eq!(requests[0].body["model"], "text-embedding-3-small");
    assert_eq!(requests[0].body["dimensions"], 2);
}

#[tokio::test]
async fn a_429_with_retry_after_and_a_500_are_retried() {
    let limited = Reply::status(429, json!({"error": {"message": "Rate limit reached", "type": "requests"}}))
        .with_headers(&[("retry-after-ms", "5")]);
    let broken = Reply::status(500, json!({"error": {"message": "oops"}}));
    let ok = Reply::json(answer(&[&[0.5, 0.5]], 2));
    let mock = Mock::start(Dialect::OpenAiEmbeddings, Some(KEY), vec![limited, broken, ok]).await;
    let embedded = router(&mock, "").embedder().embed(&["x".into()]).await.unwrap();
    assert_eq!(embedded.vectors, vec![vec![0.5, 0.5]]);
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn a_rejected_key_is_not_retried_and_says_which_variable_to_set() {
    let denied = Reply::status(401, json!({"error": {"message": "Incorrect API key provided"}}));
    let mock = Mock::start(Dialect::OpenAiEmbeddings, Some(KEY), vec![denied]).await;
    let err = router(&mock, "").embedder().embed(&["x".into()]).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth));
    assert!(err.to_string().contains("OPENAI_API_KEY"), "{err}");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_short_answer_is_an_invalid_response() {
    let short = Reply::json(answer(&[&[1.0]], 1));
    let mock = Mock::start(
        Dialect::OpenAiEmbeddings,
        Some(KEY),
        vec![short, Reply::json(answer(&[&[1.0]], 1)), Reply::json(answer(&[&[1.0]], 1))],
    )
    .await;
    let err = router(&mock, "").embedder().embed(&["a".into(), "b".into()]).await.unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::InvalidResponse));
    assert!(err.to_string().contains("1 embeddings for 2 inputs"), "{err}");
}
