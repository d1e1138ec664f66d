//! The provider-compatible endpoints agents reach with unmodified SDKs:
//! `POST /v1/chat/completions` and `POST /v1/responses` (OpenAI; the Responses API and
//! `GET /v1/responses/{id}` are in `gateway/responses.rs`) and `POST /v1/messages`
//! (Anthropic), with and without streaming, and `POST /v1/embeddings` (OpenAI; one
//! journaled `llm.embed`). `GET /v1/models` lists the models a run may ask for by name.
//! Anything else is a 404 in the caller's dialect naming what is served. The API key is
//! the run's token. Each request becomes one journaled `llm.chat` of that run; a streamed
//! response is journaled whole and, when it is answered from the journal after a crash,
//! replayed as a stream.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use keel_kernel::{Kernel, RunHandle};
use keel_llm::{Delta, anthropic, openai};
use keel_protocol::rpc::{LlmChatParams, LlmChatResult, RpcError};
use serde_json::{Value, json};
use tokio::sync::mpsc;

mod responses;

/// The gateway's router; served on loopback for unsandboxed agents and on the data
/// directory's gateway socket for sandboxed ones.
pub fn router(kernel: Kernel) -> axum::Router {
    let mcp = keel_mcp::router(kernel.mcp_host());
    axum::Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/messages", post(messages))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", axum::routing::get(models))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", axum::routing::get(responses::get))
        .method_not_allowed_fallback(not_served)
        .with_state(kernel)
        .nest_service("/mcp", mcp)
        .fallback(not_served)
}

/// What the gateway serves, for the answer to anything else.
const SERVED: &str = "POST /v1/chat/completions, POST /v1/responses, GET /v1/responses/{id}, \
     POST /v1/messages, POST /v1/embeddings, GET /v1/models and /mcp";

/// Any other method or path: an error in the caller's dialect (an Anthropic SDK sends
/// `anthropic-version`) naming what was asked and what is served, never a bare 404 an SDK
/// reports with an empty body.
/// `GET /v1/models`: the models the run may ask for by name (its default and fallbacks,
/// then those routed in keel.toml), in OpenAI's list shape, or Anthropic's for a caller
/// that sends `anthropic-version`.
async fn models(State(kernel): State<Kernel>, headers: HeaderMap) -> Result<Json<Value>, GatewayError> {
    let dialect = Dialect::of(&headers);
    let run = authenticate(&kernel, &headers, dialect).await?;
    let models = kernel.models(&run);
    Ok(Json(match dialect {
        Dialect::OpenAi => {
            let data: Vec<Value> = models
                .iter()
                .map(|id| {
                    let owned_by = id.split_once('/').map_or("keel", |(provider, _)| provider);
                    json!({ "id": id, "object": "model", "created": 0, "owned_by": owned_by })
                })
                .collect();
            json!({ "object": "list", "data": data })
        }
        Dialect::Anthropic => {
            let data: Vec<Value> = models
                .iter()
                .map(|id| {
                    json!({ "type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z" })
                })
                .collect();
            json!({ "data": data, "has_more": false, "first_id": models.first(), "last_id": models.last() })
        }
    }))
}

async fn not_served(method: axum::http::Method, uri: axum::http::Uri, headers: HeaderMap) -> GatewayError {
    let dialect = Dialect::of(&headers);
    let path = uri.path();
    // A served path asked with another method is 405, anything else 404.
    let known = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/models"]
        .contains(&path)
        || responses::is_response_path(path);
    let (status, kind) = match (known, dialect) {
        (true, Dialect::OpenAi) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        (true, Dialect::Anthropic) => (StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"),
        (false, Dialect::OpenAi) => (StatusCode::NOT_FOUND, "not_found"),
        (false, Dialect::Anthropic) => (StatusCode::NOT_FOUND, "not_found_error"),
    };
    GatewayError::new(
        dialect,
        status,
        kind,
        format!("the Keel gateway does not serve {method} {path}; it serves {SERVED}."),
    )
}

#[derive(Clone, Copy)]
enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    /// The dialect of a request to a path both could use: an Anthropic SDK sends
    /// `anthropic-version` on every request.
    fn of(headers: &HeaderMap) -> Dialect {
        if headers.contains_key("anthropic-version") { Dialect::Anthropic } else { Dialect::OpenAi }
    }
}

/// An error answered in the dialect's own error shape.
struct GatewayError {
    dialect: Dialect,
    status: StatusCode,
    kind: String,
    message: String,
    /// The request field at fault (OpenAI's `param`).
    param: Option<String>,
}

impl GatewayError {
    fn new(dialect: Dialect, status: StatusCode, kind: &str, message: impl Into<String>) -> GatewayError {
        GatewayError { dialect, status, kind: kind.to_owned(), message: message.into(), param: None }
    }

    fn from_rpc(dialect: Dialect, error: &RpcError) -> GatewayError {
        let (status, kind) = status_of(error);
        GatewayError::new(dialect, status, &kind, error.message.clone())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let GatewayError { dialect, status, kind, message, param } = self;
        let body = match dialect {
            Dialect::OpenAi => {
                json!({ "error": { "message": message, "type": kind, "param": param, "code": kind } })
            }
            Dialect::Anthropic => json!({ "type": "error", "error": { "type": kind, "message": message } }),
        };
        (status, Json(body)).into_response()
    }
}

fn status_of(error: &RpcError) -> (StatusCode, String) {
    let kind = error
        .data
        .as_ref()
        .and_then(|d| d.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("internal")
        .to_owned();
    let status = match kind.as_str() {
        "invalid_params" | "invalid_request" | "no_provider" | "too_large" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "denied" => StatusCode::FORBIDDEN,
        "run_exited" | "cancelled" => StatusCode::CONFLICT,
        // A request whose input alone is over the run's whole budget can never succeed:
        // 400, so an SDK does not retry it as it would a 429.
        "budget_exhausted"
            if error.data.as_ref().and_then(|d| d.get("never_fits")).and_then(Value::as_bool)
                == Some(true) =>
        {
            StatusCode::BAD_REQUEST
        }
        "budget_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        // The upstream's own status class (429 with its retry-after, 401, 400...) when known.
        "provider_error" => error
            .data
            .as_ref()
            .and_then(|d| d.get("status"))
            .and_then(Value::as_u64)
            .and_then(|s| StatusCode::from_u16(s as u16).ok())
            .unwrap_or(StatusCode::BAD_GATEWAY),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, kind)
}

/// Finds the run from the API key the SDK sends (`Authorization: Bearer` for OpenAI,
/// `x-api-key` for Anthropic; either is accepted on both endpoints).
async fn authenticate(
    kernel: &Kernel,
    headers: &HeaderMap,
    dialect: Dialect,
) -> Result<RunHandle, GatewayError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let token = bearer.or(api_key).unwrap_or("");
    // A framework's own tracing sends W3C `traceparent`: the call's span nests under it.
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    kernel.authenticate(token).await.map(|run| run.traced(traceparent)).ok_or_else(|| {
        let kind = match dialect {
            Dialect::OpenAi => "invalid_api_key",
            Dialect::Anthropic => "authentication_error",
        };
        GatewayError::new(
            dialect,
            StatusCode::UNAUTHORIZED,
            kind,
            "this API key is not a live Keel run token; run the agent under `keel run`, which sets it",
        )
    })
}

fn parse_body(body: &[u8], dialect: Dialect) -> Result<Value, GatewayError> {
    serde_json::from_slice(body).map_err(|e| {
        GatewayError::new(
            dialect,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// A 200 answer of `body`'s JSON, as every call the gateway serves is answered: written
/// into one buffer, which becomes the response body as it is. (axum's `Json` writes
/// through `BytesMut`'s `io::Write`, growing it a piece at a time; on the answer to every
/// call that showed in the gateway's profile.)
fn json_response(body: &impl serde::Serialize, dialect: Dialect) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(err) => GatewayError::new(
            dialect,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the answer cannot be encoded: {err}"),
        )
        .into_response(),
    }
}

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn call_id(prefix: &str) -> String {
    format!("{prefix}{}", &keel_types::random_token()[..24])
}

/// OpenAI's `POST /v1/embeddings`: `input` is a string or a list of strings (token
/// arrays are refused), `encoding_format` `float` or `base64` (little-endian f32, what
/// the official SDKs ask for by default). The vectors come from the kernel's embedder,
/// whatever `model` says; the answer names the model that made them.
async fn embeddings(
    State(kernel): State<Kernel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    use base64::Engine as _;
    let dialect = Dialect::OpenAi;
    let run = authenticate(&kernel, &headers, dialect).await?;
    let raw = parse_body(&body, dialect)?;
    let invalid = |message: String| {
        GatewayError::new(dialect, StatusCode::BAD_REQUEST, "invalid_request_error", message)
    };
    let input = match raw.get("input") {
        Some(Value::String(text)) => vec![text.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| {
                invalid(
                    "`input` must be a string or a list of strings (token arrays are not supported)".into(),
                )
            })?,
        _ => return Err(invalid("`input` is required: a string or a list of strings".into())),
    };
    let base64 = match raw.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return Err(invalid(format!("encoding_format {other:?} is not one of float, base64"))),
    };
    let model = raw.get("model").and_then(Value::as_str).map(str::to_owned);
    let result = kernel
        .embed(&run, keel_protocol::rpc::LlmEmbedParams { input, model })
        .await
        .map_err(|err| GatewayError::from_rpc(dialect, &err))?;
    let data: Vec<Value> = result
        .embeddings
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let answer = json!({
        "object": "list",
        "data": data,
        "model": result.model,
        "usage": { "prompt_tokens": result.input_tokens, "total_tokens": result.input_tokens },
    });
    Ok(json_response(&answer, dialect))
}

async fn chat_completions(
    State(kernel): State<Kernel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    let dialect = Dialect::OpenAi;
    let run = authenticate(&kernel, &headers, dialect).await?;
    let raw = parse_body(&body, dialect)?;
    let include_usage =
        raw.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    let (request, stream) = openai::wire::chat_request_to_canonical(&raw).map_err(|err| {
        GatewayError::new(dialect, StatusCode::BAD_REQUEST, "invalid_request_error", err.to_string())
    })?;
    let id = call_id("chatcmpl-");
    let created = unix_secs();
    if !stream {
        let result =
            kernel.chat(&run, request, None).await.map_err(|err| GatewayError::from_rpc(dialect, &err))?;
        return Ok(json_response(
            &openai::wire::canonical_to_chat_completion(&result, &id, created),
            dialect,
        ));
    }
    let model = request.model.clone().unwrap_or_default();
    let events = live_stream(kernel, run, request, move |piece| match piece {
        Piece::Delta(delta) => vec![sse_data(&openai_delta_chunk(&delta, &id, created, &model))],
        Piece::Done { result, streamed } => {
            let mut chunks: Vec<Value> = if streamed {
                vec![json!({
                    "id": id, "object": "chat.completion.chunk", "created": created, "model": result.model,
                    "choices": [{ "index": 0, "delta": {}, "finish_reason": result.finish_reason.clone().unwrap_or_else(|| "stop".into()) }],
                })]
            } else {
                openai::wire::canonical_to_chunks(&result, &id, created)
                    .into_iter()
                    .filter(|chunk| !is_usage_chunk(chunk))
                    .collect()
            };
            if include_usage {
                chunks.push(json!({
                    "id": id, "object": "chat.completion.chunk", "created": created, "model": result.model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": result.usage.input_tokens,
                        "completion_tokens": result.usage.output_tokens,
                        "total_tokens": result.usage.input_tokens + result.usage.output_tokens,
                    },
                }));
            }
            let mut events: Vec<Event> = chunks.iter().map(sse_data).collect();
            events.push(Event::default().data("[DONE]"));
            events
        }
        Piece::Failed(err) => {
            let (_, kind) = status_of(&err);
            vec![
                sse_data(&json!({ "error": { "message": err.message, "type": kind, "code": kind } })),
                Event::default().data("[DONE]"),
            ]
        }
    });
    Ok(Sse::new(events).into_response())
}

fn is_usage_chunk(chunk: &Value) -> bool {
    chunk.get("usage").is_some_and(|u| !u.is_null())
        && chunk.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty)
}

fn openai_delta_chunk(delta: &Delta, id: &str, created: u64, model: &str) -> Value {
    let delta = match delta {
        Delta::Text(text) => json!({ "role": "assistant", "content": text }),
        Delta::ToolCall { index, id, name, arguments } => {
            let mut call = json!({ "index": index, "function": { "arguments": arguments } });
            if let Some(id) = id {
                call["id"] = json!(id);
                call["type"] = json!("function");
            }
            if let Some(name) = name {
                call["function"]["name"] = json!(name);
            }
            json!({ "role": "assistant", "tool_calls": [call] })
        }
    };
    json!({
        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": null }],
    })
}

fn sse_data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

async fn messages(
    State(kernel): State<Kernel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    let dialect = Dialect::Anthropic;
    let run = authenticate(&kernel, &headers, dialect).await?;
    let raw = parse_body(&body, dialect)?;
    let (request, stream) = anthropic::wire::messages_request_to_canonical(&raw).map_err(|err| {
        GatewayError::new(dialect, StatusCode::BAD_REQUEST, "invalid_request_error", err.to_string())
    })?;
    let id = call_id("msg_");
    if !stream {
        let result =
            kernel.chat(&run, request, None).await.map_err(|err| GatewayError::from_rpc(dialect, &err))?;
        return Ok(json_response(&anthropic::wire::canonical_to_messages_response(&result, &id), dialect));
    }
    // Live text deltas are forwarded as they arrive; the rest of the message (tool_use
    // blocks, stop reason, usage) is rendered from the complete result at the end.
    let model = request.model.clone().unwrap_or_default();
    let mut text_open = false;
    let events = live_stream(kernel, run, request, move |piece| match piece {
        Piece::Delta(Delta::Text(text)) => {
            let mut events = Vec::new();
            if !text_open {
                text_open = true;
                events.push(named("message_start", json!({ "type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": { "input_tokens": 0, "output_tokens": 0 } } })));
                events.push(named(
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": 0,
                    "content_block": { "type": "text", "text": "" } }),
                ));
            }
            events.push(named(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": 0,
                "delta": { "type": "text_delta", "text": text } }),
            ));
            events
        }
        Piece::Delta(Delta::ToolCall { .. }) => Vec::new(),
        Piece::Done { result, .. } => {
            let all = anthropic::wire::canonical_to_messages_stream_events(&result, &id);
            if !text_open {
                return all.into_iter().map(|(name, data)| named(&name, data)).collect();
            }
            // The message and its text block were already opened and streamed: close the
            // text block and send the remaining blocks, renumbered after it.
            let mut events =
                vec![named("content_block_stop", json!({ "type": "content_block_stop", "index": 0 }))];
            let mut skip_text_block = None;
            for (name, mut data) in all {
                let index = data.get("index").and_then(Value::as_u64);
                match name.as_str() {
                    "message_start" => continue,
                    "content_block_start" if data.pointer("/content_block/type") == Some(&json!("text")) => {
                        skip_text_block = index;
                        continue;
                    }
                    _ if index.is_some() && index == skip_text_block => continue,
                    _ => {}
                }
                if let (Some(index), Some(text_index)) = (index, skip_text_block) {
                    data["index"] = json!(if index > text_index { index } else { index + 1 });
                }
                events.push(named(&name, data));
            }
            events
        }
        Piece::Failed(err) => {
            let (_, kind) = status_of(&err);
            vec![named(
                "error",
                json!({ "type": "error", "error": { "type": kind, "message": err.message } }),
            )]
        }
    });
    Ok(Sse::new(events).into_response())
}

fn named(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// What the streaming renderers are given, in order.
enum Piece {
    Delta(Delta),
    /// The complete result; `streamed` tells whether deltas were forwarded before it.
    Done {
        result: LlmChatResult,
        streamed: bool,
    },
    Failed(RpcError),
}

/// Runs the call with a delta sink and turns everything it yields into SSE events with
/// `render`.
fn live_stream(
    kernel: Kernel,
    run: RunHandle,
    request: LlmChatParams,
    mut render: impl FnMut(Piece) -> Vec<Event> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    let (sink, deltas) = mpsc::unbounded_channel();
    let call = tokio::spawn(async move { kernel.chat(&run, request, Some(sink)).await });
    pieces(deltas, call).flat_map(move |piece| futures_util::stream::iter(render(piece).into_iter().map(Ok)))
}

/// A streamed call's call task, running on its own so a client that disconnects does not
/// cancel a journaled call half way.
type CallTask = tokio::task::JoinHandle<Result<LlmChatResult, RpcError>>;

/// What a streamed call yields, in order: its live deltas as they arrive, then how it
/// ended.
fn pieces(
    deltas: mpsc::UnboundedReceiver<Delta>,
    call: CallTask,
) -> impl futures_util::Stream<Item = Piece> + Send + 'static {
    let state = (deltas, Some(call), false);
    futures_util::stream::unfold(state, |(mut deltas, call, mut streamed)| async move {
        if let Some(delta) = deltas.recv().await {
            streamed = true;
            return Some((Piece::Delta(delta), (deltas, call, streamed)));
        }
        let call = call?;
        let piece = match call.await {
            Ok(Ok(result)) => Piece::Done { result, streamed },
            Ok(Err(err)) => Piece::Failed(err),
            Err(join) => Piece::Failed(
                keel_protocol::rpc::ErrorKind::Internal.error(format!("the call failed: {join}")),
            ),
        };
        Some((piece, (deltas, None, streamed)))
    })
}
