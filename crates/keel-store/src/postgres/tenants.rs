//! Tenants and their API tokens on Postgres: each write is one statement (its own
//! transaction), so they need no locks beyond the primary keys.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::int;
use super::queries::{column, count, execute, json_column, query_opt, query_rows};
use crate::{ApiTokenRecord, Error, Result, TenantRecord};

pub(super) const TENANT_COLUMNS: &str = "name, created_at_ms, quota";
pub(super) const TOKEN_COLUMNS: &str = "hash, prefix, tenant, created_at_ms, label, revoked";

pub(super) async fn create_tenant(client: &impl GenericClient, tenant: &TenantRecord) -> Result<()> {
    let inserted = execute(
        client,
        "inserting a tenant",
        &format!("INSERT INTO tenants ({TENANT_COLUMNS}) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING"),
        &[&tenant.name, &int(tenant.created_at_ms), &tenant.quota.to_string()],
    )
    .await?;
    if inserted == 0 {
        return Err(Error::TenantExists(tenant.name.clone()));
    }
    Ok(())
}

/// Inserts the token only if its tenant exists, in one statement (the foreign key would
/// refuse it too, but as a `Backend` error rather than `TenantNotFound`). A hash already
/// stored fails on the primary key: a `Backend` error, as the contract says.
pub(super) async fn create_token(client: &impl GenericClient, token: &ApiTokenRecord) -> Result<()> {
    let inserted = execute(
        client,
        "inserting an API token",
        &format!(
            "INSERT INTO api_tokens ({TOKEN_COLUMNS}) SELECT $1, $2, $3, $4, $5, $6 \
             WHERE EXISTS (SELECT 1 FROM tenants WHERE name = $3)"
        ),
        &[&token.hash, &token.prefix, &token.tenant, &int(token.created_at_ms), &token.label, &token.revoked],
    )
    .await?;
    if inserted == 0 {
        return Err(Error::TenantNotFound(token.tenant.clone()));
    }
    Ok(())
}

pub(super) async fn revoke_tokens(client: &impl GenericClient, tenant: &str, prefix: &str) -> Result<u64> {
    execute(
        client,
        "revoking API tokens",
        "UPDATE api_tokens SET revoked = TRUE WHERE tenant = $1 AND prefix = $2 AND NOT revoked",
        &[&tenant, &prefix],
    )
    .await
}

pub(super) async fn get_tenant(client: &impl GenericClient, name: &str) -> Result<Option<TenantRecord>> {
    let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = $1");
    query_opt(client, "reading a tenant", &sql, &[&name]).await?.map(|row| decode_tenant(&row)).transpose()
}

pub(super) async fn list_tenants(client: &impl GenericClient) -> Result<Vec<TenantRecord>> {
    let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name");
    query_rows(client, "listing tenants", &sql, &[]).await?.iter().map(decode_tenant).collect()
}

pub(super) async fn lookup_token(client: &impl GenericClient, hash: &str) -> Result<Option<ApiTokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE hash = $1");
    query_opt(client, "looking up an API token", &sql, &[&hash])
        .await?
        .map(|row| decode_token(&row))
        .transpose()
}

pub(super) async fn list_tokens(client: &impl GenericClient, tenant: &str) -> Result<Vec<ApiTokenRecord>> {
    let sql =
        format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE tenant = $1 ORDER BY created_at_ms, prefix");
    query_rows(client, "listing API tokens", &sql, &[&tenant]).await?.iter().map(decode_token).collect()
}

pub(super) fn decode_tenant(row: &Row) -> Result<TenantRecord> {
    let name: String = column(row, "name", "a tenant")?;
    let place = format!("tenant {name:?}");
    Ok(TenantRecord {
        created_at_ms: count(row, "created_at_ms", &place)?,
        quota: json_column(row, "quota", &place)?,
        name,
    })
}

pub(super) fn decode_token(row: &Row) -> Result<ApiTokenRecord> {
    let prefix: String = column(row, "prefix", "an API token")?;
    let place = format!("API token {prefix}");
    Ok(ApiTokenRecord {
        hash: column(row, "hash", &place)?,
        tenant: column(row, "tenant", &place)?,
        created_at_ms: count(row, "created_at_ms", &place)?,
        label: column(row, "label", &place)?,
        revoked: column(row, "revoked", &place)?,
        prefix,
    })
}
