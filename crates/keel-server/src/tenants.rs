//! `/v1/tenants...`: tenants and their API tokens. Creating tenants and minting or
//! revoking tokens needs the operator's token; a tenant's token lists only itself.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Extension, Json, Router};
use keel_kernel::Principal;
use keel_protocol::api::{
    CreateTenantParams, ErrorBody, QuotaParams, TenantView, TokenCreatedView, TokenParams, TokenRevokedView,
    TokenView,
};

use crate::{ApiError, AppState, Body};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{name}/tokens", post(create_token))
        .route("/v1/tenants/{name}/tokens/{prefix}", delete(revoke_token))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(create_tenant, list_tenants, create_token, revoke_token),
    components(schemas(
        CreateTenantParams,
        QuotaParams,
        TenantView,
        TokenView,
        TokenParams,
        TokenCreatedView,
        TokenRevokedView
    ))
)]
pub(crate) struct TenantsApiDoc;

/// Create a tenant (operator only).
#[utoipa::path(post, path = "/v1/tenants", request_body = CreateTenantParams,
    responses((status = 201, body = TenantView), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_tenant(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(params): Body<CreateTenantParams>,
) -> Result<(StatusCode, Json<TenantView>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.kernel.create_tenant(&principal, params).await?)))
}

/// Every tenant with its quota and tokens (a tenant's token: itself only).
#[utoipa::path(get, path = "/v1/tenants", responses((status = 200, body = Vec<TenantView>)),
    security(("bearer" = [])))]
async fn list_tenants(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<TenantView>>, ApiError> {
    Ok(Json(state.kernel.tenants(&principal).await?))
}

/// Mint an API token for the tenant (operator only). The token is in this answer only;
/// the kernel keeps its sha256.
#[utoipa::path(post, path = "/v1/tenants/{name}/tokens", params(("name" = String, Path, description = "the tenant: 1-64 letters, digits, '-' or '_'", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    request_body = Option<TokenParams>,
    responses((status = 201, body = TokenCreatedView), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<TokenCreatedView>), ApiError> {
    // The body is optional: none (or null) mints a token without a label.
    let params: TokenParams = crate::optional_body(&body, "token body")?;
    let created = state.kernel.create_token(&principal, &name, params.label).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revoke the tenant's token with this prefix (operator only); it answers 401 from then on.
#[utoipa::path(delete, path = "/v1/tenants/{name}/tokens/{prefix}",
    params(("name" = String, Path, description = "the tenant: 1-64 letters, digits, '-' or '_'", pattern = "^[A-Za-z0-9_-]{1,64}$"), ("prefix" = String, Path, description = "the token's prefix, kt_ and 8 hex digits", pattern = "^kt_[0-9A-Fa-f]{8}$")),
    responses((status = 200, body = TokenRevokedView), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revoke_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((name, prefix)): Path<(String, String)>,
) -> Result<Json<TokenRevokedView>, ApiError> {
    let revoked = state.kernel.revoke_token(&principal, &name, &prefix).await?;
    Ok(Json(TokenRevokedView { revoked }))
}
