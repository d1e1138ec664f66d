//! AG-UI over HTTP: `GET /v1/runs/{id}/agui` streams a run as AG-UI events, and `POST
//! /v1/agui` starts a run from an AG-UI `RunAgentInput` and streams it, so a
//! CopilotKit-style frontend drives a Keel agent directly. The events are the kernel's
//! (`Kernel::agui`); this module parses requests and writes server-sent events the way
//! AG-UI's own encoder does: one `data:` line of JSON per event, no event name.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use keel_kernel::{AguiIds, AguiStream, Principal};
use keel_protocol::agui::{AguiSseEvent, RunAgentInput};
use keel_protocol::api::{CreateRunParams, ErrorBody};
use serde_json::Value;

use crate::{ApiError, AppState, Body, own_run};

/// The header of `POST /v1/agui`'s answer naming the Keel run it started.
pub(crate) const RUN_ID_HEADER: &str = "x-keel-run-id";

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/v1/runs/{id}/agui", get(run_agui)).route("/v1/agui", post(start_agui))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(run_agui, start_agui),
    components(schemas(
        RunAgentInput,
        AguiSseEvent,
        keel_protocol::agui::AguiTool,
        keel_protocol::agui::AguiContext
    ))
)]
pub(crate) struct AguiApiDoc;

/// A run as AG-UI events (server-sent events, each `data` one AG-UI event's JSON):
/// `RUN_STARTED`; `TEXT_MESSAGE_START`/`CONTENT`/`END` for the model's text (streamed
/// from the provider while the stream watches the call, else whole from the journal);
/// `TOOL_CALL_START`/`ARGS`/`END`/`RESULT` for tool calls; `STATE_SNAPSHOT` for each
/// `state.checkpoint`; `CUSTOM` (`keel.question`, `keel.answer`, `keel.approval`,
/// `keel.decision`, `keel.ui`, `keel.emit`) for Keel's own events; then `RUN_FINISHED`
/// (the output as `result`; a stopped run has the `cancelled` outcome) or `RUN_ERROR`.
/// A run that ended streams its whole history and the stream ends; a live one is
/// followed until it ends. `threadId` and `runId` are the Keel run's id.
#[utoipa::path(get, path = "/v1/runs/{id}/agui",
    params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")),
    responses((status = 200, description = "the run's AG-UI events, until its end", content_type = "text/event-stream", body = AguiSseEvent)),
    security(("bearer" = [])))]
async fn run_agui(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = own_run(&state, &principal, &id).await?;
    let stream = state.kernel.agui(&principal, &run, None).await?;
    Ok(sse(stream))
}

/// Start a run from an AG-UI `RunAgentInput` and stream it as `GET
/// /v1/runs/{id}/agui` does, with the input's `threadId` and `runId` in `RUN_STARTED`
/// and `RUN_FINISHED`. The run is `forwardedProps.keel`: the body of `POST /v1/runs`
/// without `input` (e.g. `{"command": ["python3", "agent.py"]}`); the agent's input
/// (`KEEL_INPUT`) is the whole `RunAgentInput` less `forwardedProps.keel`. The
/// `X-Keel-Run-Id` header names the run (answer its questions, approve its calls, stop
/// it with the run routes). Nothing malformed starts a run: the body, the messages and
/// the run's options are all checked first.
#[utoipa::path(post, path = "/v1/agui", request_body = RunAgentInput,
    responses((status = 200, description = "the run's AG-UI events, until its end", content_type = "text/event-stream", body = AguiSseEvent,
            headers(("X-Keel-Run-Id" = String, description = "the Keel run started"))),
        (status = 400, body = ErrorBody, description = "invalid_request: the body is not a RunAgentInput, a message has no id or an unknown role, `forwardedProps.keel` is missing or is not a valid run (the message names what)"),
        (status = 403, body = ErrorBody, description = "forbidden: a tenant's token asked for another tenant"),
        (status = 429, body = ErrorBody, description = "quota_exceeded: the tenant's live-run quota or the admission queue is full; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "seconds to wait")))),
    security(("bearer" = [])))]
async fn start_agui(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(input): Body<RunAgentInput>,
) -> Result<Response, ApiError> {
    let (params, ids) = run_params(input)
        .map_err(|message| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message))?;
    let view = state.kernel.create_run_for(&principal, params).await?;
    let run = crate::run_id(&view.run_id)?;
    let stream = state.kernel.agui(&principal, &run, Some(ids)).await?;
    let mut response = sse(stream);
    if let Ok(value) = HeaderValue::from_str(&view.run_id) {
        response.headers_mut().insert(RUN_ID_HEADER, value);
    }
    Ok(response)
}

/// The run a `RunAgentInput` asks for: its `forwardedProps.keel` as `POST /v1/runs`'s
/// body, with the input (less that) as the agent's input; or what is wrong with it.
pub(crate) fn run_params(input: RunAgentInput) -> Result<(CreateRunParams, AguiIds), String> {
    input.validate()?;
    let missing = "`forwardedProps.keel` is missing: name the run to start there, as the body of POST /v1/runs \
                   without `input`, e.g. {\"forwardedProps\": {\"keel\": {\"command\": [\"python3\", \"agent.py\"]}}}";
    let run = match input.forwarded_props.as_ref() {
        Some(Value::Object(props)) => props.get("keel").cloned().ok_or(missing)?,
        Some(_) => return Err(format!("`forwardedProps` is not an object; {missing}")),
        None => return Err(missing.into()),
    };
    if !run.is_object() {
        return Err("`forwardedProps.keel` must be an object, the body of POST /v1/runs (e.g. {\"command\": [\"python3\", \"agent.py\"]})".into());
    }
    if run.get("input").is_some() {
        return Err(
            "`forwardedProps.keel.input` is not allowed: the agent's input is the RunAgentInput itself"
                .into(),
        );
    }
    crate::shape::objects_where_documented(&run, "CreateRunParams").map_err(|path| {
        format!("`forwardedProps.keel`: {path} must be a JSON object, as /openapi.json documents")
    })?;
    let mut params: CreateRunParams =
        serde_json::from_value(run).map_err(|e| format!("`forwardedProps.keel` is not a valid run: {e}"))?;
    let ids = AguiIds { thread_id: input.thread_id.clone(), run_id: input.run_id.clone() };
    let mut agent_input =
        serde_json::to_value(&input).map_err(|e| format!("the input does not serialize: {e}"))?;
    if let Some(Value::Object(props)) = agent_input.get_mut("forwardedProps") {
        props.remove("keel");
    }
    params.input = Some(agent_input);
    Ok((params, ids))
}

/// The stream as server-sent events, as AG-UI's encoder writes them.
fn sse(stream: AguiStream) -> Response {
    let events = futures_util::stream::unfold(stream, |mut stream| async move {
        match stream.next().await {
            Ok(Some(event)) => {
                let event = Event::default().json_data(&event).unwrap_or_default();
                Some((Ok::<_, Infallible>(event), stream))
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!("AG-UI stream failed: {err}");
                None
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(forwarded: Value) -> RunAgentInput {
        serde_json::from_value(json!({
            "threadId": "t1", "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "hi"}],
            "state": {"n": 1}, "forwardedProps": forwarded
        }))
        .unwrap()
    }

    #[test]
    fn the_run_is_forwarded_props_keel_and_the_agent_gets_the_rest() {
        let (params, ids) = run_params(input(
            json!({"keel": {"command": ["python3", "a.py"], "model": "m"}, "theme": "dark"}),
        ))
        .unwrap();
        assert_eq!(params.command, ["python3", "a.py"]);
        assert_eq!(params.model.as_deref(), Some("m"));
        assert_eq!((ids.thread_id.as_str(), ids.run_id.as_str()), ("t1", "r1"));
        let agent = params.input.unwrap();
        assert_eq!(agent["forwardedProps"], json!({"theme": "dark"}));
        assert_eq!(agent["messages"][0]["content"], "hi");
        assert_eq!(agent["state"], json!({"n": 1}));
        assert_eq!(agent["threadId"], "t1");
    }

    #[test]
    fn a_missing_or_malformed_run_is_refused_saying_what_to_send() {
        let err = |forwarded: Value| run_params(input(forwarded)).err().unwrap();
        assert!(err(json!({})).contains("`forwardedProps.keel` is missing"));
        assert!(err(Value::Null).contains("`forwardedProps.keel` is missing"));
        assert!(err(json!([1])).contains("`forwardedProps` is not an object"));
        assert!(err(json!({"keel": ["python3"]})).contains("must be an object"));
        assert!(err(json!({"keel": {"command": ["x"], "input": 1}})).contains("input` is not allowed"));
        assert!(err(json!({"keel": {"command": ["x"], "colour": 1}})).contains("unknown field `colour`"));
        assert!(err(json!({"keel": {}})).contains("missing field `command`"));
        assert!(
            err(json!({"keel": {"command": ["x"], "sandbox": [null]}})).contains("must be a JSON object")
        );
    }
}
