//! `/v1/schedules...`: runs started on a cron schedule. A tenant's token sees and manages
//! its own schedules; the operator's, every tenant's.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use keel_kernel::Principal;
use keel_protocol::api::{ErrorBody, RunView};
use keel_protocol::triggers::{CreateScheduleParams, FireView, ScheduleView};

use crate::{ApiError, AppState, Body};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/schedules", post(create_schedule).get(list_schedules))
        .route("/v1/schedules/{name}", get(show_schedule).delete(delete_schedule))
        .route("/v1/schedules/{name}/pause", post(pause_schedule))
        .route("/v1/schedules/{name}/resume", post(resume_schedule))
        .route("/v1/schedules/{name}/run", post(run_schedule_now))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        create_schedule,
        list_schedules,
        show_schedule,
        delete_schedule,
        pause_schedule,
        resume_schedule,
        run_schedule_now
    ),
    components(schemas(CreateScheduleParams, ScheduleView, FireView))
)]
pub(crate) struct SchedulesApiDoc;

/// Create a schedule. A cron expression, time zone or policy that is not valid is a 400
/// naming the field and its position; nothing is stored.
#[utoipa::path(post, path = "/v1/schedules", request_body = CreateScheduleParams,
    responses((status = 201, body = ScheduleView), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_schedule(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(params): Body<CreateScheduleParams>,
) -> Result<(StatusCode, Json<ScheduleView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.schedule_create(&principal, params).await?)))
}

/// The caller's schedules with their last and next fires, by name.
#[utoipa::path(get, path = "/v1/schedules", responses((status = 200, body = Vec<ScheduleView>)),
    security(("bearer" = [])))]
async fn list_schedules(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    Ok(Json(state.kernel.schedules(&principal).await?))
}

/// A schedule with its last and next fires.
#[utoipa::path(get, path = "/v1/schedules/{name}", params(("name" = String, Path)),
    responses((status = 200, body = ScheduleView)), security(("bearer" = [])))]
async fn show_schedule(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.kernel.schedule(&principal, &name).await?))
}

/// Delete a schedule and its history of fires (its runs stay); answers the schedule as
/// it was. One declared in keel.toml is a 409: remove it there.
#[utoipa::path(delete, path = "/v1/schedules/{name}", params(("name" = String, Path)),
    responses((status = 200, body = ScheduleView), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
async fn delete_schedule(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.kernel.schedule_delete(&principal, &name).await?))
}

/// Pause a schedule: no tick fires until it is resumed.
#[utoipa::path(post, path = "/v1/schedules/{name}/pause", params(("name" = String, Path)),
    responses((status = 200, body = ScheduleView)), security(("bearer" = [])))]
async fn pause_schedule(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.kernel.schedule_pause(&principal, &name, true).await?))
}

/// Resume a schedule; the ticks of the pause do not fire as missed.
#[utoipa::path(post, path = "/v1/schedules/{name}/resume", params(("name" = String, Path)),
    responses((status = 200, body = ScheduleView)), security(("bearer" = [])))]
async fn resume_schedule(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.kernel.schedule_pause(&principal, &name, false).await?))
}

/// Start the schedule's run now (recorded as a fire at this moment).
#[utoipa::path(post, path = "/v1/schedules/{name}/run", params(("name" = String, Path)),
    responses((status = 201, body = RunView), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
async fn run_schedule_now(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<RunView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.schedule_run_now(&principal, &name).await?)))
}
