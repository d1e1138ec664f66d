//! `/v1/event-triggers...`: runs started when a run of an agent ends or a message is
//! published on a topic. A tenant's token sees and manages its own event triggers; the
//! operator's, every tenant's.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use keel_kernel::Principal;
use keel_protocol::api::ErrorBody;
use keel_protocol::triggers::{CreateEventTriggerParams, EventFireView, EventTriggerView};

use crate::{ApiError, AppState, Body};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/event-triggers", post(create_event_trigger).get(list_event_triggers))
        .route("/v1/event-triggers/{name}", get(show_event_trigger).delete(delete_event_trigger))
        .route("/v1/event-triggers/{name}/pause", post(pause_event_trigger))
        .route("/v1/event-triggers/{name}/resume", post(resume_event_trigger))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        create_event_trigger,
        list_event_triggers,
        show_event_trigger,
        delete_event_trigger,
        pause_event_trigger,
        resume_event_trigger
    ),
    components(schemas(CreateEventTriggerParams, EventTriggerView, EventFireView))
)]
pub(crate) struct EventTriggersApiDoc;

/// Create an event trigger: a run starts each time a run of the agent `after_run` ends
/// (in the states `on` names), or each time a message is published on `topic`. Both or
/// neither, an unknown `on`, or a bad run option is a 400 naming it; nothing is stored.
#[utoipa::path(post, path = "/v1/event-triggers", request_body = CreateEventTriggerParams,
    responses((status = 201, body = EventTriggerView), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_event_trigger(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(params): Body<CreateEventTriggerParams>,
) -> Result<(StatusCode, Json<EventTriggerView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.event_trigger_create(&principal, params).await?)))
}

/// The caller's event triggers with their last fires, by name.
#[utoipa::path(get, path = "/v1/event-triggers", responses((status = 200, body = Vec<EventTriggerView>)),
    security(("bearer" = [])))]
async fn list_event_triggers(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<EventTriggerView>>, ApiError> {
    Ok(Json(state.kernel.event_triggers(&principal).await?))
}

/// An event trigger with its last fires and the runs they started.
#[utoipa::path(get, path = "/v1/event-triggers/{name}", params(("name" = String, Path)),
    responses((status = 200, body = EventTriggerView)), security(("bearer" = [])))]
async fn show_event_trigger(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<EventTriggerView>, ApiError> {
    Ok(Json(state.kernel.event_trigger(&principal, &name).await?))
}

/// Delete an event trigger and its history of fires (its runs stay); answers the trigger
/// as it was. One declared in keel.toml is a 409: remove it there.
#[utoipa::path(delete, path = "/v1/event-triggers/{name}", params(("name" = String, Path)),
    responses((status = 200, body = EventTriggerView), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn delete_event_trigger(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<EventTriggerView>, ApiError> {
    Ok(Json(state.kernel.event_trigger_delete(&principal, &name).await?))
}

/// Pause an event trigger: what happens while it is paused fires nothing, then or later.
#[utoipa::path(post, path = "/v1/event-triggers/{name}/pause", params(("name" = String, Path)),
    responses((status = 200, body = EventTriggerView)), security(("bearer" = [])))]
async fn pause_event_trigger(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<EventTriggerView>, ApiError> {
    Ok(Json(state.kernel.event_trigger_pause(&principal, &name, true).await?))
}

/// Resume an event trigger; what happened while it was paused does not fire.
#[utoipa::path(post, path = "/v1/event-triggers/{name}/resume", params(("name" = String, Path)),
    responses((status = 200, body = EventTriggerView)), security(("bearer" = [])))]
async fn resume_event_trigger(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<EventTriggerView>, ApiError> {
    Ok(Json(state.kernel.event_trigger_pause(&principal, &name, false).await?))
}
