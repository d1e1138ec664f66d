//! A2A over HTTP: the agent cards (`GET /.well-known/agent-card.json` for the first agent
//! published, `GET /a2a/{name}/.well-known/agent-card.json` for each) and each agent's
//! JSON-RPC endpoint (`POST /a2a/{name}`, with an API token as bearer; a tenant's token
//! acts within its tenant). The methods are the kernel's (`Kernel::a2a`); this module
//! reads the request and writes JSON, or server-sent events for the streaming methods,
//! each `data` one JSON-RPC response, the stream closing once the task is interrupted.
//!
//! Like `/mcp`, these routes are their protocol's, described by the agent card rather
//! than `/openapi.json`.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use keel_kernel::{A2aAnswer, A2aStream, Principal};

use crate::{ApiError, AppState};

/// The largest JSON-RPC request taken (a message with its parts).
const MAX_A2A_BODY: usize = 4 << 20;

/// The JSON-RPC endpoints (behind the API token).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/a2a/{name}", post(call).layer(axum::extract::DefaultBodyLimit::max(MAX_A2A_BODY)))
        .route("/a2a/{name}/", post(call).layer(axum::extract::DefaultBodyLimit::max(MAX_A2A_BODY)))
}

/// The agent cards: public, as A2A discovery expects (they say which token to bring).
pub(crate) fn card_routes() -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent-card.json", get(first_card))
        .route("/a2a/{name}/.well-known/agent-card.json", get(agent_card))
}

/// Where the client reached us: `X-Forwarded-Proto`/`-Host` when a proxy says so, else
/// `Host` over plain HTTP (the kernel serves no TLS itself).
fn base_url(headers: &HeaderMap) -> String {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let scheme = text("x-forwarded-proto").unwrap_or_else(|| "http".to_owned());
    let host = text("x-forwarded-host")
        .or_else(|| text(header::HOST.as_str()))
        .unwrap_or_else(|| "localhost".into());
    format!("{scheme}://{host}")
}

async fn first_card(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    match state.kernel.a2a_card(None, &base_url(&headers)) {
        Some(card) => Ok(Json(card).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no agent is published over A2A: declare one in keel.toml under [[agents]] with a2a = true",
        )),
    }
}

async fn agent_card(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    match state.kernel.a2a_card(Some(&name), &base_url(&headers)) {
        Some(card) => Ok(Json(card).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no agent {name} is published over A2A; published: {:?}", state.kernel.a2a_agents()),
        )),
    }
}

async fn call(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    match state.kernel.a2a(&principal, &name, &body).await? {
        A2aAnswer::Json(answer) => Ok(Json(answer).into_response()),
        A2aAnswer::Stream(stream) => Ok(sse(stream)),
    }
}

fn sse(stream: Box<A2aStream>) -> Response {
    let events = futures_util::stream::unfold(stream, |mut stream| async move {
        let answer = stream.next().await?;
        let event = Event::default().json_data(&answer).unwrap_or_default();
        Some((Ok::<_, Infallible>(event), stream))
    });
    let mut response =
        Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_is_where_the_client_reached_us() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:7777".parse().unwrap());
        assert_eq!(base_url(&headers), "http://127.0.0.1:7777");
        headers.insert("x-forwarded-proto", "https".parse().unwrap());
        headers.insert("x-forwarded-host", "agents.example.com".parse().unwrap());
        assert_eq!(base_url(&headers), "https://agents.example.com");
    }
}
