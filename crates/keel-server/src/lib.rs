//! Keel's HTTP API. Handlers only parse requests into kernel commands and render kernel
//! records as `keel_protocol::api` views; every decision is the kernel's. All `/v1/runs`
//! routes need `Authorization: Bearer <token>`: the operator's token in the data
//! directory, or a tenant's token, which confines the request to that tenant (see
//! `keel_kernel::Principal`).

mod a2a;
mod agui;
mod audit;
mod cluster;
mod console;
mod event_triggers;
mod gateway;
mod hooks;
mod mcp;
mod metrics;
mod schedules;
mod shape;
mod tenants;

pub use gateway::router as gateway_router;
pub use metrics::router as metrics_router;

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use keel_kernel::{Answer, Command, Error as KernelError, Kernel, Principal, RunQuery, RunSort};
use keel_protocol::EventKinds;
use keel_protocol::api::{
    AnswerParams, BudgetParams, BudgetView, CreateRunParams, ErrorBody, ErrorDetail, EventView, EventsPage,
    HealthView, InspectView, JournalEntryView, MemoryDeleteView, MemoryHitView, MemoryPutBody,
    MemoryRecordView, MemorySearchView, MessageParams, MessageSentView, RunView, StatusView, StopParams,
    ThreadMessageView, ThreadView, TopUpParams, UsageView,
};
use keel_protocol::rpc::{ErrorKind, RpcError};
use keel_types::{RunId, RunState};
use serde::Deserialize;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Keel kernel API", description = "Start, inspect and control agent runs."),
    paths(health, status, create_run, list_runs, inspect_run, run_events, pause_run, resume_run, stop_run, answer_run, top_up_run,
        send_message, signal_run, decide_call, list_tools, exec_code, memory_get, memory_put, memory_delete, memory_search, thread_read),
    components(schemas(
        CreateRunParams, RunView, InspectView, JournalEntryView, UsageView, EventView, EventsPage,
        AnswerParams, StopParams, ErrorBody, ErrorDetail, HealthView, StatusView,
        keel_protocol::api::StatusWaitingView, keel_protocol::api::ProviderStatusView, keel_protocol::api::PoolStatusView,
        keel_protocol::api::StoreStatusView, keel_protocol::api::NodeView, BudgetParams, BudgetView, TopUpParams,
        MemoryPutBody, MemoryRecordView, MemoryDeleteView, MemoryHitView, MemorySearchView, ThreadMessageView,
        ThreadView, MessageParams, MessageSentView, keel_protocol::api::ApprovalView,
        keel_protocol::api::DecisionParams, keel_protocol::api::SignalParams, keel_protocol::api::ToolView, keel_protocol::api::ExecParams,
        keel_protocol::api::ExecView
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// The whole document `/openapi.json` serves: every route's, with the answers every
/// route can give ([`CommonResponses`]) listed on each, and unsigned integers described
/// as what the server reads ([`unsigned_integers`]).
pub fn openapi_doc() -> serde_json::Value {
    use utoipa::Modify as _;
    let mut doc = ApiDoc::openapi();
    doc.merge(<agui::AguiApiDoc as OpenApi>::openapi());
    doc.merge(<audit::AuditApiDoc as OpenApi>::openapi());
    doc.merge(<cluster::ClusterApiDoc as OpenApi>::openapi());
    doc.merge(<console::ConsoleApiDoc as OpenApi>::openapi());
    doc.merge(<tenants::TenantsApiDoc as OpenApi>::openapi());
    doc.merge(<schedules::SchedulesApiDoc as OpenApi>::openapi());
    doc.merge(<hooks::HooksApiDoc as OpenApi>::openapi());
    doc.merge(<event_triggers::EventTriggersApiDoc as OpenApi>::openapi());
    doc.merge(<metrics::MetricsApiDoc as OpenApi>::openapi());
    CommonResponses.modify(&mut doc);
    // An OpenApi document always serializes (strings, numbers and maps only).
    let mut json = serde_json::to_value(&doc).unwrap_or_default();
    unsigned_integers(&mut json);
    json
}

/// utoipa describes Rust's `u64` and `u32` as OpenAPI's signed `int64` and `int32` (with
/// `minimum: 0`), but the server reads the whole unsigned range: `2^63` is a valid `after`
/// and `2^31` a valid `max_runs`. A client trusting `int64` would call those invalid, and
/// a checker expects them refused. So every such integer is described as what it is:
/// format `uint64`/`uint32` with its real maximum (where no smaller one was given).
fn unsigned_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            // Non-negative by its own documented bounds (utoipa gives `minimum: 0`).
            let unsigned = map
                .get("minimum")
                .or_else(|| map.get("exclusiveMinimum"))
                .and_then(serde_json::Value::as_f64)
                .is_some_and(|min| min >= 0.0);
            let max = match map.get("format").and_then(serde_json::Value::as_str) {
                Some("int64") if unsigned => Some(("uint64", u64::MAX)),
                Some("int32") if unsigned => Some(("uint32", u64::from(u32::MAX))),
                _ => None,
            };
            if let Some((format, max)) = max {
                map.insert("format".into(), format.into());
                map.entry("maximum").or_insert(max.into());
            }
            map.values_mut().for_each(unsigned_integers);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(unsigned_integers),
        _ => {}
    }
}

/// The answers any route may give besides its own, added to every operation they apply
/// to, so the document lists every status the server sends (checked by Schemathesis in
/// `scripts/api-contract`): 401 on every route that needs a token (`require_token`), 400
/// wherever there is input to refuse, 415 where a JSON body is required without a JSON
/// `Content-Type` (`Body`), and 404 wherever a path names something (a run, a record, a
/// tenant) that may not exist.
struct CommonResponses;

impl utoipa::Modify for CommonResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{ContentBuilder, Ref, Required, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            let operations =
                [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                let parameters = operation.parameters.as_deref().unwrap_or_default();
                let names_something = parameters.iter().any(|p| p.parameter_in == ParameterIn::Path);
                let has_input = !parameters.is_empty() || operation.request_body.is_some();
                let json_body_required =
                    operation.request_body.as_ref().is_some_and(|body| body.required == Some(Required::True));
                let secured = operation.security.as_ref().is_some_and(|s| !s.is_empty());
                let mut add = |status: &str, description: &str| {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| error(description).into());
                };
                if secured {
                    add("401", "unauthenticated: the bearer token is missing, wrong or revoked");
                }
                if has_input {
                    add(
                        "400",
                        "invalid_request: a parameter or the body does not have the documented shape, or \
                         breaks a rule the message names",
                    );
                }
                if json_body_required {
                    add(
                        "415",
                        "invalid_request: the body must be sent with `Content-Type: application/json`",
                    );
                }
                if names_something {
                    add("404", "not_found: nothing by that name (another tenant's run answers the same)");
                }
                if secured {
                    add(
                        "503",
                        "unavailable: the store is out of reach, this node is draining, or the node that \
                         runs the run did not answer; retry, or ask another node",
                    );
                }
            }
        }
    }
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(Clone)]
struct AppState {
    kernel: Kernel,
    token: String,
    /// For requests forwarded to the node that owns a run (see `cluster.rs`).
    http: reqwest::Client,
}

/// The API's router. `token` is the operator's bearer token; tenants' tokens (minted
/// through `/v1/tenants`) are accepted too, each confined to its tenant.
pub fn router(kernel: Kernel, token: String) -> Router {
    let state = AppState { kernel, token, http: reqwest::Client::new() };
    let protected = Router::new()
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{id}", get(inspect_run))
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/runs/{id}/pause", post(pause_run))
        .route("/v1/runs/{id}/resume", post(resume_run))
        .route("/v1/runs/{id}/stop", post(stop_run))
        .route("/v1/runs/{id}/answer", post(answer_run))
        .route("/v1/runs/{id}/budget", post(top_up_run))
        .route("/v1/runs/{id}/messages", post(send_message))
        .route("/v1/runs/{id}/signal", post(signal_run))
        .route("/v1/runs/{id}/approvals/{call}", post(decide_call))
        .route("/v1/status", get(status))
        .route("/v1/tools", get(list_tools))
        .route("/v1/exec", post(exec_code).layer(axum::extract::DefaultBodyLimit::max(MAX_EXEC_BODY_BYTES)))
        .route("/v1/memory/{namespace}", get(memory_search))
        .route("/v1/memory/{namespace}/{key}", put(memory_put).get(memory_get).delete(memory_delete))
        .route("/v1/threads/{id}", get(thread_read))
        .merge(agui::routes())
        .merge(a2a::routes())
        .merge(audit::routes())
        .merge(tenants::routes())
        .merge(schedules::routes())
        .merge(hooks::routes())
        .merge(event_triggers::routes())
        .merge(cluster::routes())
        .merge(console::routes())
        .merge(metrics::routes())
        // Layers run outside in: the token first, then forwarding to a run's owner node.
        .route_layer(middleware::from_fn_with_state(state.clone(), cluster::forward_to_owner))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/v1/health", get(health))
        .route("/openapi.json", get(openapi))
        .merge(console::file_routes())
        // A delivery's signature is its proof: no token (the hooks' other routes take one).
        .merge(hooks::delivery_routes())
        // Agent cards are public: they say which token the JSON-RPC endpoints take.
        .merge(a2a::card_routes())
        .merge(protected)
        // Its own bearer-token check (MCP's 401 with `WWW-Authenticate`), then the same
        // principals as the routes above.
        .nest_service("/mcp", mcp::router(state.clone()))
        .fallback(not_found)
        .with_state(state)
}

/// An API error: a status and an [`ErrorBody`], and for a 429 the seconds to wait
/// (`Retry-After`).
pub struct ApiError(StatusCode, ErrorBody, Option<u64>);

impl ApiError {
    fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        ApiError(
            status,
            ErrorBody { error: ErrorDetail { kind: kind.into(), message: message.into() } },
            None,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self.2 {
            Some(secs) => (self.0, [(header::RETRY_AFTER, secs.to_string())], Json(self.1)).into_response(),
            None => (self.0, Json(self.1)).into_response(),
        }
    }
}

impl From<KernelError> for ApiError {
    fn from(err: KernelError) -> ApiError {
        let (status, kind) = match &err {
            KernelError::RunNotFound(_) | KernelError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            KernelError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            KernelError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            KernelError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            KernelError::QuotaExceeded { retry_after_secs, .. } => {
                let retry_after = Some(*retry_after_secs);
                let mut error =
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", err.to_string());
                error.2 = retry_after;
                return error;
            }
            KernelError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            KernelError::Conflict(_) | KernelError::IllegalTransition(_) => {
                (StatusCode::CONFLICT, "conflict")
            }
            _ if err.is_unavailable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("request failed: {err}");
        }
        ApiError::new(status, kind, err.to_string())
    }
}

/// The body of `POST /v1/exec`: its inputs may hold 64 MiB of text (the kernel checks
/// that), which JSON escaping can about double; other routes keep axum's 2 MB.
pub(crate) const MAX_EXEC_BODY_BYTES: usize = (2 << 26) + (1 << 20);

/// JSON bodies whose rejections are rendered as [`ErrorBody`] like every other error.
/// Every body of the API is a JSON object: serde would also read a struct from an array
/// (`[value, text]` for `{value, text}`), which the documented schema does not allow.
struct Body<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + utoipa::ToSchema> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request",
                "Expected request with `Content-Type: application/json`",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|rejection| {
            let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "the body is over this route's limit (2 MB; POST /v1/exec takes inputs of up to 64 MiB); \
                 send less, or pass large data to a program with `keel exec --input-file NAME=PATH`"
                    .to_owned()
            } else {
                rejection.body_text()
            };
            ApiError::new(rejection.status(), "invalid_request", message)
        })?;
        object_body(&bytes)?;
        documented_objects::<T>(&bytes)?;
        match Json::<T>::from_bytes(&bytes) {
            Ok(Json(value)) => Ok(Body(value)),
            Err(rejection) => {
                let status = match rejection {
                    JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    _ => StatusCode::BAD_REQUEST,
                };
                Err(ApiError::new(status, "invalid_request", rejection.body_text()))
            }
        }
    }
}

/// `application/json`, or a `+json` type, as axum's `Json` accepts.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Refuses a body that is not a JSON object (see [`Body`]); leaves the parsing to serde.
fn object_body(bytes: &[u8]) -> Result<(), ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the body must be a JSON object, e.g. {\"command\": [\"python3\", \"agent.py\"]}",
        )),
    }
}

/// Refuses a body with an array where its schema documents an object (see `shape`).
fn documented_objects<T: utoipa::ToSchema>(bytes: &[u8]) -> Result<(), ApiError> {
    // Bodies that are not JSON at all are left to serde, whose message says where.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(()) };
    shape::objects_where_documented(&value, &T::name()).map_err(|path| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("{path} must be a JSON object, as /openapi.json documents ({} schema)", T::name()),
        )
    })
}

/// An optional JSON object body (`stop`, minting a token): empty or `null` means the
/// defaults; anything else must be the object.
fn optional_body<T: serde::de::DeserializeOwned + Default + utoipa::ToSchema>(
    bytes: &[u8],
    what: &str,
) -> Result<T, ApiError> {
    let trimmed = bytes.trim_ascii();
    if trimmed.is_empty() || trimmed == b"null" {
        return Ok(T::default());
    }
    object_body(bytes)?;
    documented_objects::<T>(bytes)?;
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", format!("{what}: {e}")))
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))
}

/// Resolves the bearer token to a [`Principal`] (the operator's token, else a tenant's
/// live token) and hands it to the handler in the request's extensions.
async fn require_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let principal = match principal_of(&state, presented, &headers).await {
        Ok(principal) => principal,
        Err(err) => return err.into_response(),
    };
    if let Some(principal) = principal {
        request.extensions_mut().insert(principal);
        next.run(request).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "missing, wrong or revoked bearer token; the CLI reads it from KEEL_API_TOKEN, else \
             <data dir>/api-token",
        )
        .into_response()
    }
}

/// Who `presented` is: the operator, a principal another node of the cluster vouches
/// for, a tenant's live token, or nobody. The API's routes and `/mcp` both ask this.
async fn principal_of(
    state: &AppState,
    presented: &str,
    headers: &HeaderMap,
) -> Result<Option<Principal>, ApiError> {
    if constant_time_eq(presented.as_bytes(), state.token.as_bytes()) {
        return Ok(Some(Principal::Admin));
    }
    if let Some(principal) = cluster::forwarded_principal(state, presented, headers) {
        return Ok(Some(principal));
    }
    // The lookup is by sha256 of the token, so its timing says nothing about the stored
    // tokens.
    Ok(state.kernel.authenticate_api_token(presented).await?.map(Principal::Tenant))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; GET /openapi.json lists them")
}

async fn openapi() -> Json<serde_json::Value> {
    Json(openapi_doc())
}

/// Liveness, which kernel answers, and whether its store does.
#[utoipa::path(get, path = "/v1/health", responses((status = 200, body = HealthView)))]
async fn health(State(state): State<AppState>) -> Json<HealthView> {
    let store = match state.kernel.store_answers().await {
        Ok(()) => "ok".to_owned(),
        Err(cause) => format!("unreachable: {cause}"),
    };
    Json(HealthView {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        llm_providers: state.kernel.llm_provider_names(),
        store,
    })
}

/// What the kernel is doing now: live slots, queued and waiting runs, LLM provider
/// queues and rate limits, the sandbox pool, the nodes and the store (`keel top`'s
/// header). A tenant's token sees its own tenant's counts only, and no nodes.
#[utoipa::path(get, path = "/v1/status",
    responses((status = 200, body = StatusView)),
    security(("bearer" = [])))]
async fn status(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<StatusView>, ApiError> {
    Ok(Json(state.kernel.status(&principal).await?))
}

/// Start a run.
#[utoipa::path(post, path = "/v1/runs", request_body = CreateRunParams,
    responses((status = 201, body = RunView),
        (status = 400, body = ErrorBody, description = "invalid_request: the body breaks a rule its message names (e.g. `cwd` is not a directory on the kernel's host, a grant pattern or an LLM script does not parse)"),
        (status = 403, body = ErrorBody, description = "forbidden: a tenant's token asked for another tenant"),
        (status = 429, body = ErrorBody, description = "quota_exceeded: the tenant's live-run quota or the admission queue is full; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "seconds to wait")))),
    security(("bearer" = [])))]
async fn create_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(params): Body<CreateRunParams>,
) -> Result<(StatusCode, Json<RunView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.create_run_for(&principal, params).await?)))
}

/// The most runs one listing returns.
const MAX_LIST: usize = 10_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Comma-separated states to include, e.g. `running,waiting` (spaces around a state
    /// are allowed; empty: every state).
    #[param(
        pattern = "^( *(created|queued|running|paused|waiting|recovering|succeeded|failed|cancelled) *(, *(created|queued|running|paused|waiting|recovering|succeeded|failed|cancelled) *)*)?$"
    )]
    state: Option<String>,
    /// At most this many runs (1 to 10000; default all).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    /// Only this tenant's runs (the operator's token; a tenant's sees only its own).
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    tenant: Option<String>,
    /// Only runs whose id, tenant or command contains this text (ASCII letters in any
    /// case; `%` and `_` are plain characters). At most 200 characters, no control
    /// characters.
    #[param(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    q: Option<String>,
    /// `newest` (the default), `oldest`, `costliest` or `cheapest` (ties by age).
    #[param(pattern = "^(newest|oldest|costliest|cheapest)$")]
    sort: Option<String>,
    /// Skip this many runs of the order first: the next page is `offset=limit`.
    #[param(minimum = 0, maximum = 1000000000)]
    offset: Option<u64>,
}

/// The highest `offset` a listing takes.
const MAX_OFFSET: u64 = 1_000_000_000;

/// The most characters of a listing's `q`.
const MAX_QUERY_CHARS: usize = 200;

/// List runs: filtered by state, tenant and text, sorted by age or cost, a page at a
/// time (`limit` and `offset`); the filtering, order and paging happen in the store.
#[utoipa::path(get, path = "/v1/runs", params(ListQuery),
    responses((status = 200, body = Vec<RunView>),
        (status = 403, body = ErrorBody, description = "forbidden: a tenant's token asked for another tenant's runs")),
    security(("bearer" = [])))]
async fn list_runs(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<RunView>>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let query = run_query(query)?;
    Ok(Json(state.kernel.runs(&principal, &query).await?))
}

/// A listing's query, checked: the rules `GET /v1/runs` and the MCP tool `list_runs` share.
fn run_query(query: ListQuery) -> Result<RunQuery, ApiError> {
    if let Some(limit) = query.limit
        && !(1..=MAX_LIST).contains(&limit)
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`limit` must be between 1 and {MAX_LIST}, not {limit} (omit it for every run)"),
        ));
    }
    let states = match query.state.as_deref().filter(|s| !s.is_empty()) {
        Some(text) => text
            .split(',')
            // Spaces only, as the documented pattern says (not every Unicode space).
            .map(|s| s.trim_matches(' ').parse::<RunState>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))?,
        None => Vec::new(),
    };
    let text = match query.q {
        Some(text) if text.chars().count() > MAX_QUERY_CHARS => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("`q` is {} characters; search with at most {MAX_QUERY_CHARS}", text.chars().count()),
            ));
        }
        Some(text) if text.chars().any(|c| c.is_control()) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "`q` holds a control character; search for printable text",
            ));
        }
        text => text,
    };
    let sort = match query.sort.as_deref() {
        Some(text) => text.parse::<RunSort>()?,
        None => RunSort::default(),
    };
    let offset = query.offset.unwrap_or(0);
    if offset > MAX_OFFSET {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`offset` must be at most {MAX_OFFSET}, not {offset}"),
        ));
    }
    Ok(RunQuery {
        states,
        limit: query.limit,
        tenant: query.tenant,
        text,
        sort,
        offset: usize::try_from(offset).unwrap_or(usize::MAX),
    })
}

/// A run with its journal.
#[utoipa::path(get, path = "/v1/runs/{id}", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")),
    responses((status = 200, body = InspectView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
async fn inspect_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<InspectView>, ApiError> {
    let id = run_id(&id)?;
    Ok(Json(state.kernel.inspect(&principal, &id).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Return events after this seq (0 for all).
    after: Option<u64>,
    /// Stream as server-sent events until the run ends.
    follow: Option<bool>,
    /// Only events of these kinds, comma-separated (e.g. `stdout,stderr,state`); every
    /// kind when absent. A follower's stream still ends after the run's final state.
    #[param(
        pattern = "^(state|queued|launch|stdout|stderr|syscall|emit|replay|stop|question|answer|approval|decision|denied|interrupted|budget|swap|spawn|signal|egress|audit|ui)(,(state|queued|launch|stdout|stderr|syscall|emit|replay|stop|question|answer|approval|decision|denied|interrupted|budget|swap|spawn|signal|egress|audit|ui))*$"
    )]
    kinds: Option<String>,
}

/// The run's events: a page of JSON, or with `follow=true` a server-sent event stream
/// (each event's `data` is an `EventView`) that ends after the run's final state.
#[utoipa::path(get, path = "/v1/runs/{id}/events", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$"), EventsQuery),
    responses((status = 200, description = "a page of events (JSON), or with `follow=true` a stream of them",
        content((EventsPage = "application/json"), (String = "text/event-stream")))),
    security(("bearer" = [])))]
async fn run_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let id = run_id(&id)?;
    state.kernel.authorize(&principal, &id).await?;
    let after = query.after.unwrap_or(0);
    let kinds = match &query.kinds {
        Some(list) => EventKinds::parse(list)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e))?,
        None => EventKinds::ALL,
    };
    if !query.follow.unwrap_or(false) {
        return Ok(Json(state.kernel.events_page(&id, after, 10_000, kinds).await?).into_response());
    }
    let stream = state.kernel.events(&id, after, true, kinds).await?;
    let events = futures_util::stream::unfold(stream, |mut stream| async move {
        match stream.next().await {
            Ok(Some(view)) => {
                let event = Event::default()
                    .id(view.seq.to_string())
                    .event(view.kind.clone())
                    .json_data(&view)
                    .unwrap_or_default();
                Some((Ok::<_, Infallible>(event), stream))
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!("event stream failed: {err}");
                None
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}

/// The run named in the path, if the principal may act on it (another tenant's run is
/// 404 like a missing one).
async fn own_run(state: &AppState, principal: &Principal, id: &str) -> Result<keel_types::RunId, ApiError> {
    let id = run_id(id)?;
    state.kernel.authorize(principal, &id).await?;
    Ok(id)
}

async fn act(state: &AppState, command: Command) -> Result<Json<RunView>, ApiError> {
    Ok(Json(state.kernel.execute(command).await?))
}

/// Pause a run (its processes are frozen).
#[utoipa::path(post, path = "/v1/runs/{id}/pause", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")),
    responses((status = 200, body = RunView), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")), security(("bearer" = [])))]
async fn pause_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    act(&state, Command::Pause(own_run(&state, &principal, &id).await?)).await
}

/// Resume a paused run.
#[utoipa::path(post, path = "/v1/runs/{id}/resume", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")),
    responses((status = 200, body = RunView), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")), security(("bearer" = [])))]
async fn resume_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    act(&state, Command::Resume(own_run(&state, &principal, &id).await?)).await
}

/// Stop a run: SIGTERM to its process tree, SIGKILL after the grace period. Returns at
/// once; the run becomes `cancelled` when its processes are gone.
#[utoipa::path(post, path = "/v1/runs/{id}/stop", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")), request_body = Option<StopParams>,
    responses((status = 200, body = RunView), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")), security(("bearer" = [])))]
async fn stop_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<RunView>, ApiError> {
    let run = own_run(&state, &principal, &id).await?;
    // The body is optional: none (or null) means "the run's own grace period".
    let params: StopParams = optional_body(&body, "stop body")?;
    let grace = params.grace_secs.map(Duration::from_secs);
    act(&state, Command::Stop { run, grace }).await
}

/// Answer the run's open `human.ask`: `text`, or for a question with a form
/// (`question_form`) the structured `value`, validated against the form's schema. A
/// refused answer (both or neither field, a value that does not match, a value for a
/// plain question) is a 400 and records nothing.
#[utoipa::path(post, path = "/v1/runs/{id}/answer", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")), request_body = AnswerParams,
    responses((status = 200, body = RunView), (status = 400, body = ErrorBody, description = "the answer is refused: send exactly one of text and value, matching the question's form"), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")), security(("bearer" = [])))]
async fn answer_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Body(params): Body<AnswerParams>,
) -> Result<Json<RunView>, ApiError> {
    let answer = match params {
        AnswerParams { text: Some(text), value: None } => Answer::Text(text),
        AnswerParams { text: None, value: Some(value) } => Answer::Value(value),
        AnswerParams { text, .. } => {
            let which = if text.is_some() { "both" } else { "neither" };
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!(
                    "the answer has {which} of `text` and `value`; send exactly one: {{\"text\": \"...\"}} for a plain question, {{\"value\": {{...}}}} for a question with a form"
                ),
            ));
        }
    };
    act(&state, Command::Answer { run: own_run(&state, &principal, &id).await?, answer }).await
}

/// Approve or deny a tool call parked for approval (`keel approve` / `keel deny`). The
/// decision is stored durably and audited before the call goes on.
#[utoipa::path(post, path = "/v1/runs/{id}/approvals/{call}",
    params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$"), ("call" = u64, Path, description = "the call's journal seq")),
    request_body = keel_protocol::api::DecisionParams,
    responses((status = 200, body = RunView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")),
    security(("bearer" = [])))]
async fn decide_call(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((id, call)): Path<(String, String)>,
    Body(params): Body<keel_protocol::api::DecisionParams>,
) -> Result<Json<RunView>, ApiError> {
    let run = own_run(&state, &principal, &id).await?;
    let call: u64 = call.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("call {call:?} is not a journal seq (a number)"),
        )
    })?;
    let approve = match params.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("decision {other:?} is not known; send \"approve\" or \"deny\""),
            ));
        }
    };
    act(&state, Command::Decide { run, call, approve, note: params.note }).await
}

/// Every tool the kernel knows, with its policy (an MCP server's tools once it connected).
#[utoipa::path(get, path = "/v1/tools",
    responses((status = 200, body = Vec<keel_protocol::api::ToolView>)), security(("bearer" = [])))]
async fn list_tools(State(state): State<AppState>) -> Json<Vec<keel_protocol::api::ToolView>> {
    Json(state.kernel.tool_views().await)
}

/// Run a program whose tool calls go through the governed dispatch, as a run of its own;
/// answers when it ends.
#[utoipa::path(post, path = "/v1/exec", request_body = keel_protocol::api::ExecParams,
    responses((status = 200, body = keel_protocol::api::ExecView),
        (status = 400, body = ErrorBody, description = "invalid_request: the body breaks a rule its message names (an unknown `lang`, a limit out of range, a bad grant pattern)"),
        (status = 403, body = ErrorBody, description = "forbidden: a tenant's token asked for another tenant"),
        (status = 409, body = ErrorBody, description = "conflict: the exec run ended without an outcome (e.g. its sandbox could not start under the limits asked for); the message names the run, whose logs say why"),
        (status = 413, body = ErrorBody, description = "invalid_request: the body is over 129 MiB (inputs hold at most 64 MiB of text; over that, even a smaller body is a 400)"),
        (status = 429, body = ErrorBody, description = "quota_exceeded: the tenant's live-run quota or the admission queue is full; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "seconds to wait")))),
    security(("bearer" = [])))]
async fn exec_code(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(mut params): Body<keel_protocol::api::ExecParams>,
) -> Result<Json<keel_protocol::api::ExecView>, ApiError> {
    let tenant = principal.run_tenant(params.tenant.as_deref())?;
    state.kernel.admit_run(&tenant).await?;
    params.tenant = Some(tenant);
    Ok(Json(state.kernel.exec(params).await?))
}

/// Add to a run's budget (durably); parked calls try again at once. With `continue`, a run
/// parked by the loop detector goes on.
#[utoipa::path(post, path = "/v1/runs/{id}/budget", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")), request_body = TopUpParams,
    responses((status = 200, body = RunView), (status = 409, body = ErrorBody, description = "conflict: the run is not in a state that allows this (e.g. it has ended)")), security(("bearer" = [])))]
async fn top_up_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Body(params): Body<TopUpParams>,
) -> Result<Json<RunView>, ApiError> {
    let run = own_run(&state, &principal, &id).await?;
    act(&state, Command::TopUp { run, add: params.add, continue_loop: params.continue_loop }).await
}

/// Put a message in the run's mailbox, as a run's `ipc.send` does (from: null).
#[utoipa::path(post, path = "/v1/runs/{id}/messages", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")), request_body = MessageParams,
    responses((status = 200, body = MessageSentView), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("bearer" = [])))]
async fn send_message(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Body(params): Body<MessageParams>,
) -> Result<Json<MessageSentView>, ApiError> {
    let to = run_id(&id)?;
    let mut send = serde_json::json!({ "to": to.as_str(), "message": params.message, "wait": params.wait });
    if let Some(correlation_id) = params.correlation_id {
        send["correlation_id"] = serde_json::Value::String(correlation_id);
    }
    // The operator's message goes to any run (as the run's own tenant); a tenant's only to
    // its own runs (the store answers another tenant's run as missing).
    let tenant = match &principal {
        Principal::Admin => state.kernel.tenant_of(&to).await?,
        Principal::Tenant(name) => name.clone(),
    };
    let result = state.kernel.send_message(&tenant, send).await?;
    Ok(Json(MessageSentView { seq: result["seq"].as_u64().unwrap_or(0) }))
}

/// Send a run a named signal: an event it receives with `ipc.recv` (topic `signal`).
#[utoipa::path(post, path = "/v1/runs/{id}/signal", params(("id" = String, Path, description = "run id", pattern = "^run_[0-9a-z]{26}$")),
    request_body = keel_protocol::api::SignalParams,
    responses((status = 200, body = MessageSentView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn signal_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Body(params): Body<keel_protocol::api::SignalParams>,
) -> Result<Json<MessageSentView>, ApiError> {
    let to = run_id(&id)?;
    let tenant = match &principal {
        Principal::Admin => state.kernel.tenant_of(&to).await?,
        Principal::Tenant(name) => name.clone(),
    };
    let result =
        state.kernel.signal_run(&tenant, &to, &params.signal, params.data.unwrap_or_default()).await?;
    Ok(Json(MessageSentView { seq: result["seq"].as_u64().unwrap_or(0) }))
}

impl From<RpcError> for ApiError {
    fn from(err: RpcError) -> ApiError {
        let kind =
            err.data.as_ref().and_then(|d| d.get("kind")).and_then(|k| k.as_str()).unwrap_or("internal");
        if kind == ErrorKind::InvalidParams.as_str() {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", err.message);
        }
        if kind == ErrorKind::NotFound.as_str() {
            return ApiError::new(StatusCode::NOT_FOUND, "not_found", err.message);
        }
        if kind == ErrorKind::WouldBlock.as_str() {
            return ApiError::new(StatusCode::TOO_MANY_REQUESTS, "would_block", err.message);
        }
        tracing::error!("memory or message request failed: {}", err.message);
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", err.message)
    }
}

/// A long-term memory record of the token's tenant (`default` for the operator).
#[utoipa::path(get, path = "/v1/memory/{namespace}/{key}", params(("namespace" = String, Path, description = "1-256 bytes without control characters", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"), ("key" = String, Path, description = "1-512 bytes without control characters", min_length = 1, max_length = 512, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")),
    responses((status = 200, body = MemoryRecordView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
async fn memory_get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((namespace, key)): Path<(String, String)>,
) -> Result<Json<MemoryRecordView>, ApiError> {
    match state.kernel.memory_record(principal.tenant(), &namespace, &key).await? {
        Some(record) => Ok(Json(record)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no record {key:?} in memory namespace {namespace:?}"),
        )),
    }
}

/// Write (or overwrite) a long-term record, as `mem.put` does.
#[utoipa::path(put, path = "/v1/memory/{namespace}/{key}", params(("namespace" = String, Path, description = "1-256 bytes without control characters", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"), ("key" = String, Path, description = "1-512 bytes without control characters", min_length = 1, max_length = 512, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")),
    request_body = MemoryPutBody, responses((status = 200, body = MemoryRecordView), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
async fn memory_put(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((namespace, key)): Path<(String, String)>,
    Body(body): Body<MemoryPutBody>,
) -> Result<Json<MemoryRecordView>, ApiError> {
    let mut params = serde_json::json!({ "namespace": namespace, "key": key, "value": body.value });
    if let Some(text) = body.text {
        params["text"] = serde_json::Value::String(text);
    }
    state.kernel.memory(principal.tenant(), "mem.put", params).await?;
    memory_get(State(state), Extension(principal), Path((namespace, key))).await
}

/// Delete a long-term record.
#[utoipa::path(delete, path = "/v1/memory/{namespace}/{key}", params(("namespace" = String, Path, description = "1-256 bytes without control characters", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"), ("key" = String, Path, description = "1-512 bytes without control characters", min_length = 1, max_length = 512, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")),
    responses((status = 200, body = MemoryDeleteView)), security(("bearer" = [])))]
async fn memory_delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((namespace, key)): Path<(String, String)>,
) -> Result<Json<MemoryDeleteView>, ApiError> {
    let params = serde_json::json!({ "namespace": namespace, "key": key });
    let result = state.kernel.memory(principal.tenant(), "mem.delete", params).await?;
    Ok(Json(MemoryDeleteView { deleted: result["deleted"].as_bool().unwrap_or(false) }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct SearchQuery {
    /// Words to search for (any may match).
    q: String,
    /// At most this many hits (1 to 100; default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u64>,
    /// `text` (full-text, the default), `semantic` (embeddings) or `hybrid` (both, fused).
    #[param(pattern = "^(text|semantic|hybrid)$")]
    mode: Option<String>,
}

/// Search of a memory namespace: full-text, semantic or hybrid.
#[utoipa::path(get, path = "/v1/memory/{namespace}", params(("namespace" = String, Path, description = "1-256 bytes without control characters", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"), SearchQuery),
    responses((status = 200, body = MemorySearchView)), security(("bearer" = [])))]
async fn memory_search(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(namespace): Path<String>,
    query: Result<Query<SearchQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<MemorySearchView>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let mut params = serde_json::json!({ "namespace": namespace, "query": query.q });
    if let Some(limit) = query.limit {
        params["limit"] = serde_json::json!(limit);
    }
    if let Some(mode) = query.mode {
        params["mode"] = serde_json::json!(mode);
    }
    let result = state.kernel.memory(principal.tenant(), "mem.search", params).await?;
    serde_json::from_value(result)
        .map(Json)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ThreadQuery {
    /// Only the newest N messages.
    last: Option<u64>,
    /// Only the newest messages that fit in this many (estimated) tokens.
    max_tokens: Option<u64>,
}

/// A conversation thread, oldest first.
#[utoipa::path(get, path = "/v1/threads/{id}", params(("id" = String, Path, description = "the thread: 1-256 bytes without control characters", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"), ThreadQuery),
    responses((status = 200, body = ThreadView)), security(("bearer" = [])))]
async fn thread_read(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    query: Result<Query<ThreadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ThreadView>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let mut params = serde_json::json!({ "thread": id });
    if let Some(last) = query.last {
        params["last"] = serde_json::json!(last);
    }
    if let Some(max_tokens) = query.max_tokens {
        params["max_tokens"] = serde_json::json!(max_tokens);
    }
    let result = state.kernel.memory(principal.tenant(), "mem.thread.read", params).await?;
    let messages = serde_json::from_value(result["messages"].clone())
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(Json(ThreadView { thread: id, messages }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation of the served document, as (method path, operation).
    fn operations(doc: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, operation) in item.as_object().into_iter().flatten() {
                out.push((format!("{method} {path}"), operation.clone()));
            }
        }
        out
    }

    /// The `kinds` of a run's events: the pattern the document gives is the one
    /// `EventKinds::parse` takes, every kind there is and nothing else.
    #[test]
    fn the_event_kinds_pattern_names_every_kind() {
        let doc = openapi_doc();
        let parameters = doc["paths"]["/v1/runs/{id}/events"]["get"]["parameters"].as_array().unwrap();
        let kinds = parameters.iter().find(|p| p["name"] == "kinds").expect("a kinds parameter");
        assert_eq!(kinds["schema"]["pattern"].as_str(), Some(EventKinds::pattern().as_str()));
    }

    /// Issue 11: Schemathesis found every route's 401 and most 400/404/415 answers
    /// undocumented. `scripts/api-contract` checks the live server; this pins the rules.
    #[test]
    fn issue_11_every_answer_a_route_can_give_is_documented() {
        let doc = openapi_doc();
        let operations = operations(&doc);
        assert!(operations.len() > 20, "{}", operations.len());
        for (name, operation) in &operations {
            let responses = operation["responses"].as_object().expect("responses");
            let secured = operation["security"].as_array().is_some_and(|s| !s.is_empty());
            // A webhook delivery takes no token; its signature is its proof, and a 401 its refusal.
            let own_proof = name == "post /v1/hooks/{name}";
            assert_eq!(
                secured || own_proof,
                responses.contains_key("401"),
                "{name}: 401 documented iff a token (or a delivery's signature) is needed"
            );
            let parameters = operation["parameters"].as_array().cloned().unwrap_or_default();
            if !parameters.is_empty() || operation.get("requestBody").is_some() {
                assert!(responses.contains_key("400"), "{name}: input can be refused");
            }
            if parameters.iter().any(|p| p["in"] == "path") {
                assert!(responses.contains_key("404"), "{name}: what the path names may be missing");
            }
            if operation["requestBody"]["required"] == true {
                assert!(responses.contains_key("415"), "{name}: a JSON body needs its content type");
            }
            // Query structs are query parameters (a derive without `parameter_in` made them
            // path parameters), and never nullable.
            for parameter in &parameters {
                if parameter["in"] == "path" {
                    let placeholder = format!("{{{}}}", parameter["name"].as_str().unwrap_or_default());
                    assert!(name.contains(&placeholder), "{name}: {parameter} is not in the path");
                }
                assert!(!parameter["schema"].to_string().contains("\"null\""), "{name}: {parameter}");
            }
        }
        let has_patterned_id = |name: &str| {
            operations.iter().filter(|(n, _)| n.contains(name)).all(|(_, op)| {
                op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == "id" && p["schema"]["pattern"] == "^run_[0-9a-z]{26}$")
            })
        };
        assert!(has_patterned_id("/v1/runs/{id}"));
    }

    #[test]
    fn unsigned_integers_are_documented_with_their_real_range() {
        let doc = openapi_doc();
        let after = &doc["components"]["schemas"]["AuditEntryView"]["properties"]["seq"];
        assert_eq!(after["format"], "uint64", "{after}");
        assert_eq!(after["maximum"], u64::MAX, "{after}");
        let max_runs = &doc["components"]["schemas"]["QuotaParams"]["properties"]["max_runs"];
        assert_eq!(
            (max_runs["format"].clone(), max_runs["maximum"].clone()),
            ("uint32".into(), u32::MAX.into())
        );
        let grace = &doc["components"]["schemas"]["CreateRunParams"]["properties"]["stop_grace_secs"];
        assert_eq!(grace["maximum"], 3600, "a documented smaller maximum stays: {grace}");
        assert!(!doc.to_string().contains("\"int64\""), "no unsigned integer left as int64");
    }

    #[test]
    fn bodies_must_be_objects_and_optional_ones_may_be_empty_or_null() {
        assert!(object_body(b" {\"a\": 1}").is_ok());
        for bad in [&b"[null, null]"[..], b"null", b"3", b"\"x\""] {
            let err = object_body(bad).expect_err("refused");
            assert_eq!(err.0, StatusCode::BAD_REQUEST);
        }
        let empty: StopParams = optional_body(b"  ", "stop body").ok().expect("empty is the default");
        assert_eq!(empty.grace_secs, None);
        let null: StopParams = optional_body(b"null", "stop body").ok().expect("null is the default");
        assert_eq!(null.grace_secs, None);
        let given: StopParams = optional_body(b"{\"grace_secs\": 2}", "stop body").ok().expect("an object");
        assert_eq!(given.grace_secs, Some(2));
        assert!(optional_body::<StopParams>(b"[2]", "stop body").is_err(), "not an array");
        assert!(optional_body::<StopParams>(b"\xff\xfe", "stop body").is_err(), "not garbage");
    }
}
