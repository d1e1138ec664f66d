//! `GET /metrics`: the kernel's Prometheus metrics in the OpenMetrics text format. On
//! the API's listener it needs the operator's token (a tenant's token is refused: the
//! numbers span every tenant); `keel serve --metrics-listen ADDR` also serves it on a
//! listener of its own without a token, for a Prometheus that scrapes a private address.

use axum::Extension;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use keel_kernel::{Kernel, MetricsFormat, Principal};
use keel_protocol::api::ErrorBody;

use crate::{ApiError, AppState};

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(metrics))]
pub(crate) struct MetricsApiDoc;

/// The kernel's metrics for Prometheus (operator only): runs by state and tenant, LLM
/// calls, tokens and cost, provider errors, queues, syscall and journal latencies, the
/// sandbox pool, live slots and the audit writer. README "Metrics" lists every family.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "the metrics: OpenMetrics 1.0 when `Accept` names \
            application/openmetrics-text (as Prometheus does), else the Prometheus text format 0.0.4", 
            content((String = "text/plain"), (String = "application/openmetrics-text"))),
        (status = 403, body = ErrorBody, description = "forbidden: metrics are the operator's (a tenant's token is refused)")),
    security(("bearer" = [])))]
async fn metrics(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
) -> Response {
    exposition(&state.kernel, &principal, &headers).await
}

/// The metrics in the format the scraper's `Accept` header asks for: OpenMetrics if it
/// names it (as Prometheus does), else the Prometheus text format 0.0.4.
async fn exposition(kernel: &Kernel, principal: &Principal, headers: &HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|value| value.to_str().ok());
    let format = MetricsFormat::negotiate(accept);
    match kernel.metrics(principal, format).await {
        Ok(text) => ([(header::CONTENT_TYPE, format.content_type())], text).into_response(),
        Err(err) => ApiError::from(err).into_response(),
    }
}

/// The router of `keel serve --metrics-listen`: `GET /metrics` without a token, and
/// nothing else.
pub fn router(kernel: Kernel) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(kernel): State<Kernel>, headers: HeaderMap| async move {
                exposition(&kernel, &Principal::Admin, &headers).await
            }),
        )
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "this listener serves only GET /metrics")
        })
        .with_state(kernel)
}
