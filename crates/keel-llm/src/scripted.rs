//! The scripted provider: replies come from a JSON document
//! `{"responses":[{"match"?, "content", "tool_calls"?, "usage"?}], "price"?}`.
//! Entries without `match` are served in order, once each; a `match` entry answers every
//! request whose last user message contains its text (matches are tried first, in order).
//! A streamed call sends the content as one delta, or as the entry's `chunks` (pieces
//! that concatenate to the content), so tests can watch text arrive in parts.

use std::sync::Mutex;

use async_trait::async_trait;
use keel_protocol::rpc::{AssistantMessage, ChatRole, LlmChatParams, LlmChatResult, TokenUsage};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Delta, DeltaSink, Error, Provider, Result, Served};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    responses: Vec<ScriptResponse>,
    #[serde(default)]
    price: Option<Price>,
    #[serde(default)]
    model: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptResponse {
    #[serde(default, rename = "match")]
    match_text: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    usage: Option<TokenUsage>,
    /// The deltas of a streamed call: pieces that concatenate to `content`.
    #[serde(default)]
    chunks: Option<Vec<String>>,
}

/// USD per million tokens, so scripted runs can show what a real model would cost.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct Price {
    input_per_mtok: f64,
    output_per_mtok: f64,
}

#[derive(Debug)]
pub struct ScriptedProvider {
    script: ScriptFile,
    /// Indices into `script.responses` of the entries without `match`, in order.
    ordered: Vec<usize>,
    /// How many ordered entries were served (the next one to serve).
    cursor: Mutex<usize>,
}

impl ScriptedProvider {
    /// Parses and validates a script document. Errors say where the document is wrong.
    pub fn from_value(document: &Value) -> Result<ScriptedProvider> {
        let script: ScriptFile = serde_json::from_value(document.clone()).map_err(|e| {
            Error::InvalidScript(format!("{e} (expected {{\"responses\":[{{\"content\":\"...\"}}]}})"))
        })?;
        if script.responses.is_empty() {
            return Err(Error::InvalidScript("`responses` is empty; add at least one response".into()));
        }
        for (i, response) in script.responses.iter().enumerate() {
            if response.content.is_none() && response.tool_calls.is_none() {
                return Err(Error::InvalidScript(format!(
                    "responses[{i}] has neither `content` nor `tool_calls`"
                )));
            }
            if let Some(chunks) = &response.chunks
                && response.content.as_deref() != Some(chunks.concat().as_str())
            {
                return Err(Error::InvalidScript(format!(
                    "responses[{i}].chunks do not concatenate to its `content`; make them its pieces, in order"
                )));
            }
            if response.match_text.as_deref() == Some("") {
                return Err(Error::InvalidScript(format!(
                    "responses[{i}] has an empty `match`, which would match everything; remove it to serve the response in order"
                )));
            }
        }
        if let Some(price) = script.price
            && !(price.input_per_mtok >= 0.0 && price.output_per_mtok >= 0.0)
        {
            return Err(Error::InvalidScript("`price` values must be non-negative numbers".into()));
        }
        let ordered = script
            .responses
            .iter()
            .enumerate()
            .filter(|(_, r)| r.match_text.is_none())
            .map(|(i, _)| i)
            .collect();
        Ok(ScriptedProvider { script, ordered, cursor: Mutex::new(0) })
    }

    /// Parses a script from JSON text (a file's contents).
    pub fn from_text(text: &str) -> Result<ScriptedProvider> {
        let document: Value =
            serde_json::from_str(text).map_err(|e| Error::InvalidScript(format!("not valid JSON: {e}")))?;
        Self::from_value(&document)
    }

    fn lock_cursor(&self) -> std::sync::MutexGuard<'_, usize> {
        // A poisoned lock only means another call panicked mid-update of a plain integer;
        // the integer itself is still meaningful.
        self.cursor.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn last_user_message(request: &LlmChatParams) -> &str {
    request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == ChatRole::User)
        .and_then(|m| m.content.as_deref())
        .unwrap_or("")
}

/// A rough token estimate (4 characters a token) for script entries without `usage`.
fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4).max(1)
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn chat(&self, request: &LlmChatParams, stream: Option<&DeltaSink>) -> Result<Served> {
        let last_user = last_user_message(request);
        let matched = self
            .script
            .responses
            .iter()
            .position(|r| r.match_text.as_deref().is_some_and(|text| last_user.contains(text)));
        let (index, ordered) = match matched {
            Some(index) => (index, false),
            None => {
                let mut cursor = self.lock_cursor();
                let Some(&index) = self.ordered.get(*cursor) else {
                    return Err(Error::NoScriptedResponse {
                        last_user: last_user.chars().take(200).collect(),
                        served: *cursor,
                    });
                };
                *cursor += 1;
                (index, true)
            }
        };
        let entry = &self.script.responses[index];
        let content = entry.content.clone();
        let usage = entry.usage.unwrap_or_else(|| {
            let input_chars: usize =
                request.messages.iter().map(|m| m.content.as_deref().map_or(0, str::len)).sum();
            TokenUsage {
                input_tokens: estimate_tokens(input_chars),
                output_tokens: estimate_tokens(content.as_deref().map_or(0, str::len)),
            }
        });
        let cost_usd = self.script.price.map_or(0.0, |p| {
            (usage.input_tokens as f64 * p.input_per_mtok + usage.output_tokens as f64 * p.output_per_mtok)
                / 1_000_000.0
        });
        let model = request
            .model
            .clone()
            .or_else(|| self.script.model.clone())
            .unwrap_or_else(|| "scripted".to_owned());
        if let Some(sink) = stream {
            // A script has no tokens to trickle: the whole reply is one delta, unless the
            // script cut it in chunks.
            match (&entry.chunks, &content) {
                (Some(chunks), _) => chunks.iter().for_each(|chunk| {
                    let _ = sink.send(Delta::Text(chunk.clone()));
                }),
                (None, Some(text)) => {
                    let _ = sink.send(Delta::Text(text.clone()));
                }
                (None, None) => {}
            }
            for (index, call) in entry.tool_calls.iter().flatten().enumerate() {
                let function = call.get("function");
                let _ = sink.send(Delta::ToolCall {
                    index: index as u32,
                    id: call.get("id").and_then(Value::as_str).map(str::to_owned),
                    name: function.and_then(|f| f.get("name")).and_then(Value::as_str).map(str::to_owned),
                    arguments: match function.and_then(|f| f.get("arguments")) {
                        Some(Value::String(text)) => text.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    },
                });
            }
        }
        Ok(Served {
            response: LlmChatResult {
                message: AssistantMessage {
                    role: ChatRole::Assistant,
                    content,
                    tool_calls: entry.tool_calls.clone(),
                    reasoning: None,
                },
                usage,
                cost_usd,
                model,
                finish_reason: Some(
                    if entry.tool_calls.is_some() { "tool_calls" } else { "stop" }.to_owned(),
                ),
            },
            meta: json!({ "provider": "scripted", "index": index, "ordered": ordered }),
        })
    }

    fn worst_case_cost_usd(&self, _model: Option<&str>, input_tokens: u64, max_output_tokens: u64) -> f64 {
        self.script.price.map_or(0.0, |p| {
            (input_tokens as f64 * p.input_per_mtok + max_output_tokens as f64 * p.output_per_mtok)
                / 1_000_000.0
        })
    }

    fn restore(&self, served: &[Value]) {
        let consumed =
            served.iter().filter(|meta| meta.get("ordered").and_then(Value::as_bool) == Some(true)).count();
        *self.lock_cursor() = consumed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::rpc::ChatMessage;

    fn ask(text: &str) -> LlmChatParams {
        LlmChatParams {
            messages: vec![ChatMessage {
                role: ChatRole::User,
                content: Some(text.into()),
                tool_calls: None,
                tool_call_id: None,
                name: None,
                reasoning: None,
            }],
            ..LlmChatParams::default()
        }
    }

    fn content(served: &Served) -> &str {
        served.response.message.content.as_deref().unwrap()
    }

    #[tokio::test]
    async fn ordered_then_match_then_exhausted() {
        let provider = ScriptedProvider::from_text(
            r#"{"responses":[{"content":"one"},{"match":"weather","content":"sunny"},{"content":"two","usage":{"input_tokens":5,"output_tokens":7}}]}"#,
        )
        .unwrap();
        assert_eq!(content(&provider.chat(&ask("hi"), None).await.unwrap()), "one");
        assert_eq!(content(&provider.chat(&ask("the weather?"), None).await.unwrap()), "sunny");
        assert_eq!(content(&provider.chat(&ask("weather again"), None).await.unwrap()), "sunny");
        let two = provider.chat(&ask("next"), None).await.unwrap();
        assert_eq!(content(&two), "two");
        assert_eq!(two.response.usage, TokenUsage { input_tokens: 5, output_tokens: 7 });
        let err = provider.chat(&ask("more please"), None).await.unwrap_err();
        assert!(err.to_string().contains("more please"), "{err}");
    }

    #[tokio::test]
    async fn restore_continues_the_ordered_cursor() {
        let provider =
            ScriptedProvider::from_text(r#"{"responses":[{"content":"a"},{"content":"b"}]}"#).unwrap();
        let first = provider.chat(&ask("x"), None).await.unwrap();
        let fresh =
            ScriptedProvider::from_text(r#"{"responses":[{"content":"a"},{"content":"b"}]}"#).unwrap();
        fresh.restore(&[first.meta]);
        assert_eq!(content(&fresh.chat(&ask("x"), None).await.unwrap()), "b");
    }

    #[tokio::test]
    async fn a_streamed_call_sends_its_chunks_and_returns_the_whole_content() {
        let provider =
            ScriptedProvider::from_text(r#"{"responses":[{"content":"Hello","chunks":["Hel","lo"]}]}"#)
                .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        assert_eq!(content(&provider.chat(&ask("x"), Some(&tx)).await.unwrap()), "Hello");
        assert_eq!(rx.recv().await, Some(Delta::Text("Hel".into())));
        assert_eq!(rx.recv().await, Some(Delta::Text("lo".into())));
    }

    #[test]
    fn malformed_scripts_are_explained() {
        for (text, needle) in [
            ("not json", "not valid JSON"),
            (r#"{"responses":[]}"#, "empty"),
            (r#"{"responses":[{"match":"x"}]}"#, "neither"),
            (r#"{"responses":[{"content":"x","colour":1}]}"#, "colour"),
            (r#"{"reponses":[]}"#, "reponses"),
            (r#"{"responses":[{"match":"","content":"x"}]}"#, "empty `match`"),
            (r#"{"responses":[{"content":"abc","chunks":["a","c"]}]}"#, "do not concatenate"),
        ] {
            let err = ScriptedProvider::from_text(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
