//! Many nodes behind one API: `GET /v1/nodes`, and the forwarding of a run's requests to
//! the node that owns it, so any node answers for any run.
//!
//! A request under `/v1/runs/{id}/...` (or `GET /v1/runs/{id}`) for a run whose lease a
//! live other node holds is sent on to that node's advertised address, body and all, and
//! its answer (an SSE stream included) is streamed back. The forwarding node has already
//! authenticated the caller; it tells the owner who the caller is in `x-keel-principal`,
//! vouched for by the cluster's shared secret as the bearer token. The owner serves a
//! forwarded request itself, never forwarding it again.

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_kernel::Principal;
use keel_protocol::api::{DrainView, ErrorBody, NodeView, NodesView};
use keel_types::RunId;

use crate::{ApiError, AppState};

/// Set on a forwarded request: the node that forwarded it.
pub(crate) const FORWARDED_BY: &str = "x-keel-forwarded-by";
/// Set on a forwarded request: who the forwarding node authenticated (`admin` or
/// `tenant:<name>`).
pub(crate) const FORWARDED_PRINCIPAL: &str = "x-keel-principal";

/// The largest body forwarded (the largest any route takes: `POST /v1/exec`'s).
const MAX_FORWARDED_BODY: usize = crate::MAX_EXEC_BODY_BYTES;

/// How long the owner node has to start answering a forwarded read before this node
/// answers it from the database; a forwarded command waits as long as the owner lives,
/// checking that it does this often.
const OWNER_ANSWERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Response headers passed back from the owner node.
const PASSED_BACK: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::RETRY_AFTER, header::CACHE_CONTROL];

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/v1/nodes", get(list_nodes)).route("/v1/drain", post(drain_node))
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(list_nodes, drain_node), components(schemas(NodesView, NodeView, DrainView)))]
pub(crate) struct ClusterApiDoc;

/// Drains the node that answers: it takes no new runs, lets the calls in flight finish,
/// hands its runs to the other nodes (which replay them) and exits.
#[utoipa::path(post, path = "/v1/drain",
    responses((status = 202, body = DrainView),
        (status = 403, body = ErrorBody, description = "forbidden: draining is the operator's (a tenant's token is refused)"),
        (status = 409, body = ErrorBody, description = "conflict: the kernel is alone with its store (SQLite), with no node to hand runs to")),
    security(("bearer" = [])))]
async fn drain_node(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<(StatusCode, Json<DrainView>), ApiError> {
    let runs = state.kernel.request_drain(&principal)?;
    let node = state.kernel.node_id().unwrap_or_default().to_owned();
    Ok((StatusCode::ACCEPTED, Json(DrainView { node, runs: runs as u64 })))
}

/// The kernel nodes sharing this node's store, with their heartbeat and how many runs
/// each holds (empty for a kernel alone with SQLite).
#[utoipa::path(get, path = "/v1/nodes",
    responses((status = 200, body = NodesView),
        (status = 403, body = ErrorBody, description = "forbidden: the cluster is the operator's (a tenant's token is refused)")),
    security(("bearer" = [])))]
async fn list_nodes(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<NodesView>, ApiError> {
    Ok(Json(state.kernel.nodes(&principal).await?))
}

/// The principal a forwarded request carries, when its bearer token is the cluster's
/// secret; `None` for any other request.
pub(crate) fn forwarded_principal(
    state: &AppState,
    presented: &str,
    headers: &HeaderMap,
) -> Option<Principal> {
    let secret = state.kernel.cluster_secret()?;
    if !crate::constant_time_eq(presented.as_bytes(), secret.as_bytes()) {
        return None;
    }
    match headers.get(FORWARDED_PRINCIPAL).and_then(|v| v.to_str().ok())? {
        "admin" => Some(Principal::Admin),
        other => other.strip_prefix("tenant:").map(|tenant| Principal::Tenant(tenant.to_owned())),
    }
}

/// Sends a request for a run owned by another live node to that node (see the module
/// doc); any other request goes on to its handler here.
pub(crate) async fn forward_to_owner(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(run) = run_of(request.uri().path()) else { return next.run(request).await };
    if request.headers().contains_key(FORWARDED_BY) {
        return next.run(request).await;
    }
    match state.kernel.owner_elsewhere(&run).await {
        Ok(Some(addr)) => {
            forward(&state, &run, &addr, request, next).await.unwrap_or_else(IntoResponse::into_response)
        }
        Ok(None) => next.run(request).await,
        Err(err) => ApiError::from(err).into_response(),
    }
}

/// The run a path under `/v1/runs/{id}` names (a malformed id is the handler's to refuse).
fn run_of(path: &str) -> Option<RunId> {
    let rest = path.strip_prefix("/v1/runs/")?;
    let id = rest.split('/').next()?;
    RunId::parse(id).ok()
}

/// Forwards the request to the owner at `addr`. A read the owner does not answer (it
/// just died, and its lease has not lapsed yet) is answered here from the database; a
/// command is refused (503) until another node holds the run.
async fn forward(
    state: &AppState,
    run: &RunId,
    addr: &str,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let unavailable = |what: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", what);
    let (Some(secret), Some(node)) = (state.kernel.cluster_secret(), state.kernel.node_id()) else {
        return Err(unavailable("this node is not in a cluster".to_owned()));
    };
    let principal = match request.extensions().get::<Principal>() {
        Some(Principal::Admin) => "admin".to_owned(),
        Some(Principal::Tenant(tenant)) => format!("tenant:{tenant}"),
        None => return Err(unavailable("the request was not authenticated before forwarding".to_owned())),
    };
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_FORWARDED_BODY).await.map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", format!("reading the body: {e}"))
    })?;
    let mut outgoing = state
        .http
        .request(parts.method.clone(), format!("http://{addr}{path}"))
        .bearer_auth(secret)
        .header(FORWARDED_BY, node)
        .header(FORWARDED_PRINCIPAL, principal)
        .body(body.clone());
    for name in [header::CONTENT_TYPE, header::ACCEPT, header::HeaderName::from_static("last-event-id")] {
        if let Some(value) = parts.headers.get(&name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let send = outgoing.send();
    tokio::pin!(send);
    let answer = if parts.method == axum::http::Method::GET {
        // A read the owner does not answer quickly is answered here, from the database.
        match tokio::time::timeout(OWNER_ANSWERS_WITHIN, send).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => return Ok(next.run(Request::from_parts(parts, Body::from(body))).await),
        }
    } else {
        // A command may already be under way on the owner: giving up while the owner
        // lives would leave the caller guessing whether it took effect (and a retry of
        // `approve` could approve the next call). So it is waited for as long as the
        // owner's heartbeat is current; a node that is paused or cut off accepts the
        // connection and never answers, and its heartbeat lapses within the lease ttl.
        loop {
            match tokio::time::timeout(OWNER_ANSWERS_WITHIN, &mut send).await {
                Ok(Ok(answer)) => break answer,
                Ok(Err(err)) => {
                    return Err(unavailable(format!(
                        "run {run} is run by the node at {addr}, which did not answer ({err}); if that node \
                         is gone, another takes the run over when its heartbeat lapses: retry in a few seconds"
                    )));
                }
                Err(_) => match state.kernel.owner_elsewhere(run).await {
                    Ok(Some(still)) if still == addr => continue,
                    _ => {
                        return Err(unavailable(format!(
                            "run {run} was run by the node at {addr}, which stopped answering while it had \
                             this request; the request may or may not have taken effect there: look at the \
                             run (`keel inspect {run}`) before you retry"
                        )));
                    }
                },
            }
        }
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for name in PASSED_BACK {
        if let Some(value) =
            answer.headers().get(&name).and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}
