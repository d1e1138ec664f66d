//! `/v1/audit...`: the audit log as JSON pages, its verification, and an NDJSON export.
//! A tenant's token sees its tenant's entries, the operator's every tenant's; verifying
//! walks the whole chain (it is one chain over all tenants), so it is the operator's.

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use keel_protocol::api::{AuditEntryView, AuditVerifyView, ErrorBody};
use serde::Deserialize;

use keel_kernel::Principal;

use crate::{ApiError, AppState, run_id};

/// The most entries one page returns (and the default).
const MAX_PAGE: u32 = 10_000;

/// Entries per database read while exporting.
const EXPORT_PAGE: u32 = 1_000;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/audit", get(audit_list))
        .route("/v1/audit/verify", get(audit_verify))
        .route("/v1/audit/export", get(audit_export))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(audit_list, audit_verify, audit_export),
    components(schemas(AuditEntryView, AuditVerifyView))
)]
pub(crate) struct AuditApiDoc;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only this run's entries.
    #[param(pattern = "^run_[0-9a-z]{26}$")]
    run: Option<String>,
    /// Only entries after this seq (0 for all).
    after: Option<u64>,
    /// At most this many (1 to 10000; default 10000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
}

fn bad_query(rejection: QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", rejection.body_text())
}

/// The page a query asks for (the kernel keeps it within the principal's tenant).
fn filter(
    run: Option<&str>,
    after: Option<u64>,
    limit: Option<u32>,
) -> Result<keel_kernel::AuditQuery, ApiError> {
    let run_id = run.map(run_id).transpose()?;
    let limit = limit.unwrap_or(MAX_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`limit` must be between 1 and {MAX_PAGE}, not {limit}"),
        ));
    }
    Ok(keel_kernel::AuditQuery { run: run_id, after: after.unwrap_or(0), limit })
}

/// Audit entries in seq order; page with `after` (the last seq seen).
#[utoipa::path(get, path = "/v1/audit", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntryView>), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
async fn audit_list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<Vec<AuditEntryView>>, ApiError> {
    let Query(query) = query.map_err(bad_query)?;
    let filter = filter(query.run.as_deref(), query.after, query.limit)?;
    Ok(Json(state.kernel.audit_list(&principal, &filter).await?))
}

/// Recomputes every hash of the audit log; `ok` is false, with the first broken entry and
/// the reason, when it was tampered with.
#[utoipa::path(get, path = "/v1/audit/verify",
    responses((status = 200, body = AuditVerifyView),
        (status = 403, body = ErrorBody, description = "forbidden: verifying is the operator's (a tenant's token is refused)")),
    security(("bearer" = [])))]
async fn audit_verify(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<AuditVerifyView>, ApiError> {
    Ok(Json(state.kernel.audit_verify(&principal).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ExportQuery {
    /// Only this run's entries.
    #[param(pattern = "^run_[0-9a-z]{26}$")]
    run: Option<String>,
}

/// The audit log as NDJSON (`application/x-ndjson`): one `AuditEntryView` per line, in
/// seq order, streamed page by page.
#[utoipa::path(get, path = "/v1/audit/export", params(ExportQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = AuditEntryView),
        (status = 400, body = ErrorBody)), security(("bearer" = [])))]
async fn audit_export(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(bad_query)?;
    let first = filter(query.run.as_deref(), None, Some(EXPORT_PAGE))?;
    // The first page is read before answering, so a failure is still a proper error.
    let page = state.kernel.audit_list(&principal, &first).await?;
    let start = Some((state.kernel, principal, first, Ok(page)));
    let pages = futures_util::stream::unfold(start, |next| async move {
        let (kernel, principal, mut filter, page) = next?;
        let page = match page {
            Ok(page) => page,
            // The status line is already sent: failing the body aborts the transfer, so
            // the client sees an error rather than a silently short export.
            Err(err) => {
                return Some((Err(std::io::Error::other(format!("reading the audit log: {err}"))), None));
            }
        };
        let last = page.last()?.seq;
        let mut text = String::new();
        for entry in &page {
            // A view of strings, numbers and JSON values always serializes.
            text.push_str(&serde_json::to_string(entry).unwrap_or_default());
            text.push('\n');
        }
        let next = (page.len() >= EXPORT_PAGE as usize).then(|| {
            filter.after = last;
            filter
        });
        let next = match next {
            Some(filter) => {
                let page = kernel.audit_list(&principal, &filter).await;
                Some((kernel, principal, filter, page))
            }
            None => None,
        };
        Some((Ok(text), next))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(pages)).into_response())
}
