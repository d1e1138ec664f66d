//! Conformance checks of tenants and their API tokens.

use keel_types::RunId;
use serde_json::json;

use super::{Must, now_ms};
use crate::{Error, Store};

/// Tenants are created once (a second create is `TenantExists`), read back exactly, and
/// listed by name.
pub async fn tenants_create_get_list(store: &dyn Store) {
    let name = format!("tenant-{}", RunId::generate(now_ms()));
    let tenant = crate::TenantRecord {
        name: name.clone(),
        created_at_ms: 7,
        quota: json!({"max_runs": 2, "max_usd_per_run": 0.5}),
    };
    store.tenant_create(tenant.clone()).await.must("tenant_create");
    expect_error!(
        store.tenant_create(tenant.clone()).await,
        Error::TenantExists(taken) if taken == name,
        "tenant_create of a taken name"
    );
    assert_eq!(
        store.tenant_get(&name).await.must("tenant_get"),
        Some(tenant.clone()),
        "store conformance: a tenant reads back exactly"
    );
    assert_eq!(store.tenant_get("no-such-tenant").await.must("tenant_get (unknown)"), None);
    let listed = store.tenant_list().await.must("tenant_list");
    assert!(listed.contains(&tenant), "store conformance: tenant_list includes a created tenant");
    assert!(
        listed.windows(2).all(|pair| pair[0].name < pair[1].name),
        "store conformance: tenant_list is ordered by name"
    );
}

/// Tokens are stored by hash for an existing tenant only, looked up by hash, listed per
/// tenant, and revoked by prefix within their tenant only.
pub async fn tokens_create_lookup_list_revoke(store: &dyn Store) {
    let name = format!("tokens-{}", RunId::generate(now_ms()));
    let other = format!("tokens-other-{}", RunId::generate(now_ms()));
    for tenant in [&name, &other] {
        let record = crate::TenantRecord { name: tenant.clone(), created_at_ms: 1, quota: json!({}) };
        store.tenant_create(record).await.must("tenant_create");
    }
    let token = |hash: &str, prefix: &str, tenant: &str, label: Option<&str>| crate::ApiTokenRecord {
        hash: hash.to_owned(),
        prefix: prefix.to_owned(),
        tenant: tenant.to_owned(),
        created_at_ms: 3,
        label: label.map(str::to_owned),
        revoked: false,
    };
    let first = token(&format!("{name}-h1"), "kt_aaaa", &name, Some("ci"));
    let second = token(&format!("{name}-h2"), "kt_bbbb", &name, None);
    let foreign = token(&format!("{name}-h3"), "kt_aaaa", &other, None);
    for record in [&first, &second, &foreign] {
        store.token_create(record.clone()).await.must("token_create");
    }
    expect_error!(
        store.token_create(token("orphan-hash", "kt_cccc", "no-such-tenant", None)).await,
        Error::TenantNotFound(_),
        "token_create for an unknown tenant"
    );
    assert_eq!(store.token_lookup(&first.hash).await.must("token_lookup"), Some(first.clone()));
    assert_eq!(store.token_lookup("unknown").await.must("token_lookup (unknown)"), None);
    assert_eq!(
        store.token_list(&name).await.must("token_list"),
        vec![first.clone(), second.clone()],
        "store conformance: token_list lists the tenant's tokens only"
    );

    assert_eq!(store.token_revoke(&name, "kt_aaaa").await.must("token_revoke"), 1);
    assert_eq!(store.token_revoke(&name, "kt_aaaa").await.must("token_revoke (again)"), 0);
    assert_eq!(store.token_revoke(&name, "kt_none").await.must("token_revoke (unknown)"), 0);
    let revoked = store.token_lookup(&first.hash).await.must("token_lookup (revoked)");
    assert_eq!(revoked.map(|t| t.revoked), Some(true), "store conformance: a revoked token reads as revoked");
    let untouched = store.token_lookup(&foreign.hash).await.must("token_lookup (other tenant)");
    assert_eq!(
        untouched.map(|t| t.revoked),
        Some(false),
        "store conformance: revoking by prefix touches only the named tenant's tokens"
    );
}
