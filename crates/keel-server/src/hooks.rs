//! `/v1/hooks...`: runs started by signed webhook deliveries. Managing hooks takes a
//! token (a tenant's sees its own); a delivery to `POST /v1/hooks/{name}` takes none: its
//! signature, checked with the hook's secret, is its proof.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use keel_kernel::{MAX_HOOK_BODY, Principal};
use keel_protocol::api::ErrorBody;
use keel_protocol::triggers::{CreateHookParams, DeliveryView, HookAccepted, HookView};

use crate::{ApiError, AppState, Body};

/// The routes that take a token (`require_token` is layered on by the caller).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/hooks", post(create_hook).get(list_hooks))
        .route("/v1/hooks/{name}", get(show_hook).delete(delete_hook))
}

/// The delivery route: no token, a bounded body (a bigger one is a 413 naming the limit).
pub(crate) fn delivery_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/hooks/{name}", post(deliver).layer(axum::extract::DefaultBodyLimit::max(MAX_HOOK_BODY)))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(create_hook, list_hooks, show_hook, delete_hook, deliver),
    components(schemas(CreateHookParams, HookView, DeliveryView, HookAccepted))
)]
pub(crate) struct HooksApiDoc;

/// Create a webhook. An unknown scheme, a secret variable the kernel's environment does
/// not hold, or a bad run option is a 400 naming it; nothing is stored.
#[utoipa::path(post, path = "/v1/hooks", request_body = CreateHookParams,
    responses((status = 201, body = HookView), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_hook(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(params): Body<CreateHookParams>,
) -> Result<(StatusCode, Json<HookView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.hook_create(&principal, params).await?)))
}

/// The caller's webhooks with their last deliveries, by name.
#[utoipa::path(get, path = "/v1/hooks", responses((status = 200, body = Vec<HookView>)),
    security(("bearer" = [])))]
async fn list_hooks(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<HookView>>, ApiError> {
    Ok(Json(state.kernel.hooks(&principal).await?))
}

/// A webhook with its last deliveries.
#[utoipa::path(get, path = "/v1/hooks/{name}", params(("name" = String, Path)),
    responses((status = 200, body = HookView)), security(("bearer" = [])))]
async fn show_hook(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<HookView>, ApiError> {
    Ok(Json(state.kernel.hook(&principal, &name).await?))
}

/// Delete a webhook and its history of deliveries (its runs stay); answers the hook as it
/// was. Deliveries to it answer 404 from then on. One declared in keel.toml is a 409:
/// remove it there.
#[utoipa::path(delete, path = "/v1/hooks/{name}", params(("name" = String, Path)),
    responses((status = 200, body = HookView), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
async fn delete_hook(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<HookView>, ApiError> {
    Ok(Json(state.kernel.hook_delete(&principal, &name).await?))
}

/// A delivery: its signature is checked in constant time with the hook's secret (401 and
/// audited when it does not verify, starting nothing), a delivery id seen before answers
/// 200 with the run it started, else a run starts with the body as its payload (JSON, or
/// text when it is not JSON) and the answer is 202 with its id. Bodies over 1 MiB are 413.
#[utoipa::path(post, path = "/v1/hooks/{name}", params(("name" = String, Path)),
    request_body(content = String, description = "The sender's payload, any content type",
        content_type = "application/octet-stream"),
    responses(
        (status = 202, description = "a run started", body = HookAccepted),
        (status = 200, description = "a delivery id seen before: the run it started", body = HookAccepted),
        (status = 401, description = "unauthorized: the signature is missing, malformed, stale or wrong", body = ErrorBody),
        (status = 413, description = "too_large: the body is over 1 MiB", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the run queue is full; deliver again later", body = ErrorBody),
        (status = 503, description = "unavailable: the kernel lacks the hook's secret, or its store is out of reach", body = ErrorBody)))]
async fn deliver(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<HookAccepted>), ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("hook {name}: the body is over the {MAX_HOOK_BODY}-byte limit of a delivery"),
            )
        } else {
            ApiError::new(rejection.status(), "invalid_request", rejection.body_text())
        }
    })?;
    let header = |wanted: &str| headers.get(wanted).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let accepted = state.kernel.hook_deliver(&name, &header, &body).await?;
    let status = if accepted.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(accepted)))
}
