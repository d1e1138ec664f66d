//! The web console: its files at `/ui` (embedded in the binary, served with their content
//! types, a strict Content-Security-Policy and revalidation by ETag), and the API routes
//! it needs beyond the rest: the live stream of changed runs (`GET /v1/runs/changes`),
//! the inbox (`GET /v1/inbox`) and costs (`GET /v1/costs`). Every answer is confined to
//! the token's tenant by the kernel.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use keel_kernel::{Principal, RunChange};
use keel_protocol::api::{CostBucketView, CostsView, ErrorBody, InboxItemView, InboxView};
use serde::Deserialize;

use crate::{ApiError, AppState};

/// The console's files, embedded at build time: (path under `/ui/`, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../console/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../console/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_bytes!("../console/api.js")),
    ("render.js", "text/javascript; charset=utf-8", include_bytes!("../console/render.js")),
    ("forms.js", "text/javascript; charset=utf-8", include_bytes!("../console/forms.js")),
    ("charts.js", "text/javascript; charset=utf-8", include_bytes!("../console/charts.js")),
    ("markdown.js", "text/javascript; charset=utf-8", include_bytes!("../console/markdown.js")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("../console/style.css")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../console/favicon.svg")),
];

/// Only the console's own files, no inline script or style, no framing, no plugins; the
/// API is called on the same origin. `style-src` allows no inline `style` attributes:
/// the console sets styles through the DOM (`element.style`), which the policy permits.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The public routes (the files; the page asks for a token itself).
pub(crate) fn file_routes() -> Router<AppState> {
    Router::new().route("/ui", get(index)).route("/ui/", get(index)).route("/ui/{*path}", get(file))
}

/// The API routes, behind the token.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/runs/changes", get(run_changes))
        .route("/v1/inbox", get(inbox))
        .route("/v1/costs", get(costs))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(index, file, run_changes, inbox, costs),
    components(schemas(InboxView, InboxItemView, CostsView, CostBucketView))
)]
pub(crate) struct ConsoleApiDoc;

/// The console's page.
#[utoipa::path(get, path = "/ui",
    responses((status = 200, description = "the console's page", content_type = "text/html"),
        (status = 304, description = "not modified: the `If-None-Match` ETag is current")))]
async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// A file of the console (its scripts, style sheet, icon).
#[utoipa::path(get, path = "/ui/{path}", params(("path" = String, Path, description = "a file of the console, e.g. `app.js`")),
    responses((status = 200, description = "the file, with its content type",
            content(("text/javascript"), ("text/css"), ("text/html"), ("image/svg+xml"))),
        (status = 304, description = "not modified: the `If-None-Match` ETag is current"),
        (status = 404, body = ErrorBody, description = "not_found: the console has no such file")))]
async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    if path.is_empty() {
        return serve("index.html", &headers);
    }
    serve(&path, &headers)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some((_, content_type, bytes)) = FILES.iter().find(|(name, _, _)| *name == path) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no file {path:?}; open /ui"),
        )
        .into_response();
    };
    let etag = etag(bytes);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == etag || tag.trim() == "*"));
    let mut response =
        if fresh { StatusCode::NOT_MODIFIED.into_response() } else { (*bytes).into_response() };
    let out = response.headers_mut();
    if !fresh {
        out.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    // The files change with the binary: a browser keeps them but asks each time whether
    // they are still current (a 304 costs no body).
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        out.insert(header::ETAG, value);
    }
    out.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    out.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    out.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    out.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// A strong ETag from the file's bytes and this build's version (FNV-1a, 64 bits: a
/// change detector, not a security measure).
fn etag(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in env!("CARGO_PKG_VERSION").as_bytes().iter().chain(bytes) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

/// Runs as they change, as server-sent events: `run` events whose `data` is the run's
/// `RunView` (created, a state change, usage, a wait begun or ended), and a `resync`
/// event when this follower fell behind and should list the runs afresh. Only runs of
/// the token's tenant (every tenant's for the operator) and served by this node.
#[utoipa::path(get, path = "/v1/runs/changes",
    responses((status = 200, description = "a stream of `run` events (data: a RunView) and `resync` events",
        content((String = "text/event-stream")))),
    security(("bearer" = [])))]
async fn run_changes(State(state): State<AppState>, Extension(principal): Extension<Principal>) -> Response {
    let changes = state.kernel.run_changes(&principal);
    let events = futures_util::stream::unfold(changes, |mut changes| async move {
        match changes.next().await {
            Ok(Some(RunChange::Run(view))) => {
                let event = Event::default().event("run").json_data(&*view).unwrap_or_default();
                Some((Ok::<_, Infallible>(event), changes))
            }
            Ok(Some(RunChange::Lagged)) => {
                Some((Ok(Event::default().event("resync").data("fell behind: list the runs again")), changes))
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!("the stream of changed runs failed: {err}");
                None
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// Everything waiting for a person, oldest wait first: questions, calls to approve,
/// budgets that ran out, loops (at most 1000).
#[utoipa::path(get, path = "/v1/inbox", responses((status = 200, body = InboxView)), security(("bearer" = [])))]
async fn inbox(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<InboxView>, ApiError> {
    Ok(Json(state.kernel.inbox(&principal).await?))
}

/// The widest bucket `GET /v1/costs` takes: 31 days.
const MAX_BUCKET_MS: u64 = 31 * 24 * 3_600_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct CostsQuery {
    /// Unix milliseconds: sum the calls started at or after this (default: 24 hours ago).
    since: Option<u64>,
    /// Bucket width: a number with `m` (minutes), `h` (hours) or `d` (days), e.g. `15m`,
    /// `1h`, `1d` (default `1h`; 1 minute to 31 days).
    #[param(pattern = "^[0-9]{1,6}[mhd]$")]
    bucket: Option<String>,
    /// Only this tenant (the operator's token; a tenant's sees only its own).
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    tenant: Option<String>,
}

/// LLM usage summed in the store per time bucket, tenant and model, and the costliest
/// runs: the console's cost page.
#[utoipa::path(get, path = "/v1/costs", params(CostsQuery),
    responses((status = 200, body = CostsView),
        (status = 403, body = ErrorBody, description = "forbidden: a tenant's token asked for another tenant's costs")),
    security(("bearer" = [])))]
async fn costs(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<CostsQuery>, QueryRejection>,
) -> Result<Json<CostsView>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let bucket_ms = match query.bucket.as_deref() {
        Some(text) => bucket_ms(text)?,
        None => 3_600_000,
    };
    let since = query.since.unwrap_or_else(|| now_ms().saturating_sub(24 * 3_600_000));
    Ok(Json(state.kernel.costs(&principal, query.tenant.as_deref(), since, bucket_ms).await?))
}

/// `15m`, `1h`, `1d` as milliseconds, within 1 minute and 31 days.
fn bucket_ms(text: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("bucket {text:?} is not a width like 15m, 1h or 1d (1 minute to 31 days)"),
        )
    };
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    if number.is_empty() || number.len() > 6 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 24 * 3_600_000,
        _ => return Err(bad()),
    };
    let ms = number.checked_mul(unit_ms).ok_or_else(bad)?;
    if !(60_000..=MAX_BUCKET_MS).contains(&ms) {
        return Err(bad());
    }
    Ok(ms)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_widths_parse_within_their_range() {
        assert_eq!(bucket_ms("15m").ok(), Some(900_000));
        assert_eq!(bucket_ms("1h").ok(), Some(3_600_000));
        assert_eq!(bucket_ms("31d").ok(), Some(MAX_BUCKET_MS));
        for bad in ["", "m", "0m", "32d", "1w", "1.5h", "-1h", "1234567h", "h1"] {
            assert!(bucket_ms(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn every_console_file_is_served_with_its_type_and_policy() {
        for (name, content_type, _) in FILES {
            let response = serve(name, &HeaderMap::new());
            assert_eq!(response.status(), StatusCode::OK, "{name}");
            assert_eq!(response.headers()[header::CONTENT_TYPE], *content_type, "{name}");
            assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], CSP, "{name}");
            let etag = response.headers()[header::ETAG].clone();
            let mut again = HeaderMap::new();
            again.insert(header::IF_NONE_MATCH, etag);
            assert_eq!(serve(name, &again).status(), StatusCode::NOT_MODIFIED, "{name}");
        }
        assert_eq!(serve("../Cargo.toml", &HeaderMap::new()).status(), StatusCode::NOT_FOUND);
    }
}
