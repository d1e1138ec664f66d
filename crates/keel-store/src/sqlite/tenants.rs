//! Tenants and their API tokens on SQLite: the writes (run by the writer thread inside
//! its savepoint) and the reads.

use rusqlite::{Connection, Row, params};

use super::queries::{query_all, query_first, seq_param};
use super::writer::sql_error;
use crate::{ApiTokenRecord, Error, Result, TenantRecord};

pub(super) const TENANT_COLUMNS: &str = "name, created_at_ms, quota";
pub(super) const TOKEN_COLUMNS: &str = "hash, prefix, tenant, created_at_ms, label, revoked";

pub(super) fn create_tenant(connection: &Connection, tenant: &TenantRecord, quota: &str) -> Result<()> {
    let inserted = connection
        .prepare_cached(&format!(
            "INSERT INTO tenants ({TENANT_COLUMNS}) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING"
        ))
        .and_then(|mut statement| {
            statement.execute(params![tenant.name, seq_param(tenant.created_at_ms), quota])
        })
        .map_err(sql_error("inserting a tenant"))?;
    if inserted == 0 {
        return Err(Error::TenantExists(tenant.name.clone()));
    }
    Ok(())
}

pub(super) fn create_token(connection: &Connection, token: &ApiTokenRecord) -> Result<()> {
    if get_tenant(connection, &token.tenant)?.is_none() {
        return Err(Error::TenantNotFound(token.tenant.clone()));
    }
    connection
        .prepare_cached(&format!("INSERT INTO api_tokens ({TOKEN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"))
        .and_then(|mut statement| {
            statement.execute(params![
                token.hash,
                token.prefix,
                token.tenant,
                seq_param(token.created_at_ms),
                token.label,
                token.revoked,
            ])
        })
        .map_err(sql_error("inserting an API token"))?;
    Ok(())
}

pub(super) fn revoke_tokens(connection: &Connection, tenant: &str, prefix: &str) -> Result<u64> {
    let changed = connection
        .prepare_cached("UPDATE api_tokens SET revoked = 1 WHERE tenant = ?1 AND prefix = ?2 AND revoked = 0")
        .and_then(|mut statement| statement.execute(params![tenant, prefix]))
        .map_err(sql_error("revoking API tokens"))?;
    Ok(changed as u64)
}

pub(super) fn get_tenant(connection: &Connection, name: &str) -> Result<Option<TenantRecord>> {
    query_first(
        connection,
        "reading a tenant",
        &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
        params![name],
        decode_tenant,
    )
}

pub(super) fn list_tenants(connection: &Connection) -> Result<Vec<TenantRecord>> {
    query_all(
        connection,
        "listing tenants",
        &format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"),
        [],
        decode_tenant,
    )
}

pub(super) fn lookup_token(connection: &Connection, hash: &str) -> Result<Option<ApiTokenRecord>> {
    query_first(
        connection,
        "looking up an API token",
        &format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE hash = ?1"),
        params![hash],
        decode_token,
    )
}

pub(super) fn list_tokens(connection: &Connection, tenant: &str) -> Result<Vec<ApiTokenRecord>> {
    query_all(
        connection,
        "listing API tokens",
        &format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE tenant = ?1 ORDER BY created_at_ms, prefix"),
        params![tenant],
        decode_token,
    )
}

pub(super) fn decode_tenant(row: &Row<'_>) -> Result<TenantRecord> {
    let read = |error: rusqlite::Error| Error::Corrupt(format!("a tenant row: {error}"));
    let created_at_ms: i64 = row.get(1).map_err(read)?;
    let quota: String = row.get(2).map_err(read)?;
    Ok(TenantRecord {
        name: row.get(0).map_err(read)?,
        created_at_ms: u64::try_from(created_at_ms).unwrap_or(0),
        quota: serde_json::from_str(&quota)
            .map_err(|error| Error::Corrupt(format!("column quota of a tenant: {error}")))?,
    })
}

pub(super) fn decode_token(row: &Row<'_>) -> Result<ApiTokenRecord> {
    let read = |error: rusqlite::Error| Error::Corrupt(format!("an API token row: {error}"));
    let created_at_ms: i64 = row.get(3).map_err(read)?;
    Ok(ApiTokenRecord {
        hash: row.get(0).map_err(read)?,
        prefix: row.get(1).map_err(read)?,
        tenant: row.get(2).map_err(read)?,
        created_at_ms: u64::try_from(created_at_ms).unwrap_or(0),
        label: row.get(4).map_err(read)?,
        revoked: row.get(5).map_err(read)?,
    })
}
