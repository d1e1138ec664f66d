//! OpenAI's Responses API on the gateway: `POST /v1/responses` (JSON or the typed event
//! stream) and `GET /v1/responses/{id}`. A request is checked and converted to one
//! canonical `llm.chat` of the run (`keel_llm::openai::responses`), so it is budgeted,
//! queued, journaled and replayed like every other LLM call and works over any provider.
//!
//! The kernel keeps each response for the run's tenant (unless the request says
//! `store: false`): this request's input items and the response object, whose
//! `previous_response_id` links it to the one before. A follow-up naming
//! `previous_response_id` continues the conversation from those items. A response's id
//! is derived from its `llm.chat` journal entry, so after a crash the replayed call gets
//! the same id and the agent's next `previous_response_id` still finds it.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use keel_kernel::{Kernel, RunHandle};
use keel_llm::openai::responses::{self, RequestError, ResponsesRequest};
use keel_llm::openai::responses_stream::{ResponseStream, StreamEvent};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::{Dialect, GatewayError, Piece, authenticate, parse_body, pieces, status_of, unix_secs};

/// The most responses one `previous_response_id` may chain back through.
const MAX_CHAIN: usize = 10_000;

/// Whether `path` is `/v1/responses/{id}` (for the 405 a wrong method gets).
pub(super) fn is_response_path(path: &str) -> bool {
    path.strip_prefix("/v1/responses/").is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

fn refused(err: RequestError) -> GatewayError {
    let mut error =
        GatewayError::new(Dialect::OpenAi, StatusCode::BAD_REQUEST, "invalid_request_error", err.message);
    error.param = err.param;
    error
}

/// A kernel call's error, in OpenAI's shape.
fn kernel_error(err: keel_protocol::rpc::RpcError) -> GatewayError {
    GatewayError::from_rpc(Dialect::OpenAi, &err)
}

fn internal(message: impl Into<String>) -> GatewayError {
    GatewayError::new(Dialect::OpenAi, StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
}

fn not_found(id: &str, param: Option<&str>) -> GatewayError {
    let mut error = GatewayError::new(
        Dialect::OpenAi,
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "no response with id {id:?} is kept for this run's tenant (an id from another tenant, or \
             from a request with `store: false`, is not found)"
        ),
    );
    error.param = param.map(str::to_owned);
    error
}

/// `POST /v1/responses`.
pub(super) async fn create(
    State(kernel): State<Kernel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    let dialect = Dialect::OpenAi;
    let run = authenticate(&kernel, &headers, dialect).await?;
    let raw = parse_body(&body, dialect)?;
    let mut request = responses::parse_request(&raw).map_err(refused)?;
    resolve_references(&kernel, &run, &mut request).await?;
    let history = match &request.previous_response_id {
        Some(id) => history(&kernel, &run, id).await?,
        None => Vec::new(),
    };
    // Everything is checked before the call: a refused request journals nothing.
    let params = responses::conversation(&history, &request).map_err(refused)?;
    let created = unix_secs();
    let model = params.model.clone().unwrap_or_default();
    let (entry, journaled) = oneshot::channel();
    if !request.stream {
        let result = kernel.chat_with_entry(&run, params, None, entry).await.map_err(kernel_error)?;
        let seq = journaled.await.map_err(|_| internal("the call answered without a journal entry"))?;
        let id = response_id(&run, seq);
        let response = responses::response_object(&id, created, &request, &result);
        keep(&kernel, &run, &request, &id, &response).await?;
        return Ok(super::json_response(&response, super::Dialect::OpenAi));
    }
    let (sink, deltas) = mpsc::unbounded_channel();
    // The call runs in its own task, so a client that disconnects does not cancel a
    // journaled call half way.
    let call = tokio::spawn({
        let (kernel, run) = (kernel.clone(), run.clone());
        async move { kernel.chat_with_entry(&run, params, Some(sink), entry).await }
    });
    // Until the call has a journal entry nothing is sent, so a call refused before it
    // (no budget, a loop) is an HTTP error the client raises, not a broken stream.
    let Ok(seq) = journaled.await else {
        return Err(match call.await {
            Ok(Err(err)) => kernel_error(err),
            Ok(Ok(_)) => internal("the call answered without a journal entry"),
            Err(join) => internal(format!("the call failed: {join}")),
        });
    };
    let id = response_id(&run, seq);
    let mut renderer = ResponseStream::new(&id, responses::response_skeleton(&id, created, &model, &request));
    let start = renderer.start();
    let stream = Streaming { kernel, run, request, id, renderer, pieces: Box::pin(pieces(deltas, call)) };
    let events = futures_util::stream::iter(start.into_iter().map(sse))
        .chain(futures_util::stream::unfold(stream, Streaming::next).flat_map(futures_util::stream::iter))
        .map(Ok::<_, std::convert::Infallible>);
    Ok(Sse::new(events).into_response())
}

/// A streamed response after `response.created`: live deltas, then the end.
struct Streaming {
    kernel: Kernel,
    run: RunHandle,
    request: ResponsesRequest,
    id: String,
    renderer: ResponseStream,
    pieces: std::pin::Pin<Box<dyn futures_util::Stream<Item = Piece> + Send>>,
}

impl Streaming {
    async fn next(mut self) -> Option<(Vec<Event>, Streaming)> {
        let events = match self.pieces.next().await? {
            Piece::Delta(delta) => self.renderer.delta(&delta),
            Piece::Done { result, .. } => {
                let (events, response) = self.renderer.finish(&result);
                // Kept before `response.completed` is sent: a client that continues from
                // it finds it.
                match keep(&self.kernel, &self.run, &self.request, &self.id, &response).await {
                    Ok(()) => events,
                    Err(err) => self.renderer.failed(&err.kind, &err.message),
                }
            }
            Piece::Failed(err) => {
                let (_, kind) = status_of(&err);
                self.renderer.failed(&kind, &err.message)
            }
        };
        Some((events.into_iter().map(sse).collect(), self))
    }
}

fn sse((name, data): StreamEvent) -> Event {
    Event::default().event(name).data(data.to_string())
}

fn response_id(run: &RunHandle, seq: u64) -> String {
    responses::response_id(&format!("{}:{seq}", run.run_id()))
}

/// Keeps the response for the tenant unless the request said `store: false`.
async fn keep(
    kernel: &Kernel,
    run: &RunHandle,
    request: &ResponsesRequest,
    id: &str,
    response: &Value,
) -> Result<(), GatewayError> {
    if !request.store {
        return Ok(());
    }
    let record = json!({ "input": request.input, "response": response });
    kernel.keep_response(run, id, record).await.map_err(kernel_error)
}

/// The items of the conversation `id` ends, oldest first: each kept response's input
/// items, then its output.
async fn history(kernel: &Kernel, run: &RunHandle, id: &str) -> Result<Vec<Value>, GatewayError> {
    // One read for the whole chain, one more than allowed to tell a chain too long.
    let chain = kernel.response_chain(run, id, MAX_CHAIN + 1).await.map_err(kernel_error)?;
    if chain.len() > MAX_CHAIN {
        return Err(refused(RequestError {
            param: Some("previous_response_id".into()),
            message: format!(
                "the conversation chains back through more than {MAX_CHAIN} responses; start a new one with the items you need as `input`"
            ),
        }));
    }
    let Some(oldest) = chain.last() else {
        return Err(not_found(id, Some("previous_response_id")));
    };
    // A chain that stops at a response continuing another stopped before one not kept.
    if let Some(missing) = oldest.pointer("/response/previous_response_id").and_then(Value::as_str) {
        return Err(not_found(missing, Some("previous_response_id")));
    }
    // Taken out of the records, not copied: a long conversation is most of the work.
    let mut items = Vec::new();
    for mut record in chain.into_iter().rev() {
        for key in ["/input", "/response/output"] {
            if let Some(Value::Array(part)) = record.pointer_mut(key).map(Value::take) {
                items.extend(part);
            }
        }
    }
    Ok(items)
}

/// Replaces the request's `item_reference`s (the Vercel AI SDK sends earlier output by
/// reference) with the items of the kept responses they name.
async fn resolve_references(
    kernel: &Kernel,
    run: &RunHandle,
    request: &mut ResponsesRequest,
) -> Result<(), GatewayError> {
    let mut outputs = std::collections::HashMap::new();
    for item in &request.input {
        if item.get("type").and_then(Value::as_str) != Some("item_reference") {
            continue;
        }
        let Some(response) = item.get("id").and_then(Value::as_str).and_then(responses::response_of_item)
        else {
            continue;
        };
        if outputs.contains_key(&response) {
            continue;
        }
        let record = kernel.response(run, &response).await.map_err(kernel_error)?;
        let output = record.and_then(|r| r.pointer("/response/output").and_then(Value::as_array).cloned());
        outputs.insert(response, output);
    }
    responses::resolve_references(&mut request.input, |response| outputs.get(response).cloned().flatten());
    Ok(())
}

/// `GET /v1/responses/{id}`: a response kept for the run's tenant.
pub(super) async fn get(
    State(kernel): State<Kernel>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, GatewayError> {
    let run = authenticate(&kernel, &headers, Dialect::OpenAi).await?;
    let record =
        kernel.response(&run, &id).await.map_err(kernel_error)?.ok_or_else(|| not_found(&id, None))?;
    Ok(Json(record.get("response").cloned().unwrap_or(Value::Null)).into_response())
}
