//! Tenants: who a request acts for, the tenants and API tokens the operator manages, and
//! the quotas checked when a tenant's run is created.
//!
//! The operator's token (`<data dir>/api-token`) is the `Admin` principal: it acts on
//! every tenant and manages tenants. Every other token belongs to one tenant and is
//! stored as its sha256 only, so the database never holds a usable token. A tenant sees
//! and controls only its own runs; another tenant's run answers exactly like a missing
//! one (`RunNotFound`), so a tenant cannot learn that it exists.
//!
//! The `max_runs` check lives here, not in the scheduler, until runs queue: a run over
//! the quota is refused with `QuotaExceeded` (HTTP 429 with `Retry-After`).

use keel_protocol::api::{QuotaParams, TenantView, TokenView};
use keel_store::{ApiTokenRecord, RunRecord, TenantRecord};
use keel_types::RunState;
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The tenant of the operator's own requests (memory, threads, mailboxes) and of runs
/// created without one.
pub const DEFAULT_TENANT: &str = "default";

/// How long a client refused by `max_runs` is told to wait before trying again.
pub const QUOTA_RETRY_AFTER_SECS: u64 = 5;

/// Who a request acts for, resolved from its bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator (the data directory's token): every tenant, and tenant management.
    Admin,
    /// A tenant's token: only that tenant's runs, memory, mailboxes and audit.
    Tenant(String),
}

impl Principal {
    /// The tenant whose memory, threads and mailboxes the request uses: its own, or
    /// `default` for the operator.
    pub fn tenant(&self) -> &str {
        match self {
            Principal::Admin => DEFAULT_TENANT,
            Principal::Tenant(name) => name,
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Principal::Admin)
    }

    /// Whether the principal may see and control `run`.
    pub fn owns(&self, run: &RunRecord) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Tenant(name) => run.tenant == *name,
        }
    }

    /// The tenant a listing is limited to: the tenant's own, or for the operator the one
    /// asked for (every tenant when none). A tenant asking for another is refused.
    pub fn listing(&self, asked: Option<&str>) -> Result<Option<String>> {
        match (self, asked) {
            (Principal::Admin, asked) => Ok(asked.map(str::to_owned)),
            (Principal::Tenant(name), Some(asked)) if asked != name => Err(forbidden_other(name, asked)),
            (Principal::Tenant(name), _) => Ok(Some(name.clone())),
        }
    }

    /// The tenant a new run (or exec) gets: a tenant's token always creates its own; the
    /// operator may name any (default `default`).
    pub fn run_tenant(&self, asked: Option<&str>) -> Result<String> {
        match self {
            Principal::Admin => Ok(asked.unwrap_or(DEFAULT_TENANT).to_owned()),
            Principal::Tenant(name) => match asked {
                Some(asked) if asked != name => Err(forbidden_other(name, asked)),
                _ => Ok(name.clone()),
            },
        }
    }

    /// Refuses anything but the operator.
    pub fn require_admin(&self, what: &str) -> Result<()> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(name) => Err(Error::Forbidden(format!(
                "{what} needs the operator's token (<data dir>/api-token); this token belongs to tenant {name}"
            ))),
        }
    }
}

fn forbidden_other(own: &str, asked: &str) -> Error {
    Error::Forbidden(format!("this token belongs to tenant {own}; it cannot act for tenant {asked}"))
}

/// Checks a tenant name: 1-64 of `[A-Za-z0-9_-]`, like a run's tenant.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::InvalidRequest(format!(
            "tenant {name:?} is not valid: use 1-64 letters, digits, '-' or '_'"
        )));
    }
    Ok(())
}

pub(crate) fn validate_quota(quota: &QuotaParams) -> Result<()> {
    if quota.max_runs == Some(0) {
        return Err(Error::InvalidRequest(
            "quota `max_runs` must be at least 1 (omit it for no limit)".into(),
        ));
    }
    if let Some(usd) = quota.max_usd_per_run
        && !(usd.is_finite() && usd > 0.0)
    {
        return Err(Error::InvalidRequest(format!(
            "quota `max_usd_per_run` must be a positive number of dollars, not {usd}"
        )));
    }
    Ok(())
}

/// The stored form of a token: hex sha256 of its bytes.
pub fn token_hash(token: &str) -> String {
    keel_types::hex(&Sha256::digest(token.as_bytes()))
}

/// A new token and its public prefix: `kt_<8 hex>_<64 hex>`, the prefix being
/// `kt_<8 hex>`. The prefix names the token in listings and revocations and carries no
/// secret; the 256 random bits after it are the secret.
pub(crate) fn mint_token() -> (String, String) {
    let mut id = [0u8; 4];
    keel_types::fill_random(&mut id);
    let prefix = format!("kt_{}", keel_types::hex(&id));
    let token = format!("{prefix}_{}", keel_types::random_token());
    (token, prefix)
}

/// Whether the prefix has the shape `mint_token` gives (so a revoke of something else is
/// a clear 400, not a silent "0 revoked").
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    prefix.strip_prefix("kt_").is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(crate) fn quota_of(record: &TenantRecord) -> QuotaParams {
    serde_json::from_value(record.quota.clone()).unwrap_or_default()
}

pub(crate) fn tenant_view(record: &TenantRecord, tokens: &[ApiTokenRecord]) -> TenantView {
    TenantView {
        name: record.name.clone(),
        created_at: record.created_at_ms,
        quota: quota_of(record),
        tokens: tokens
            .iter()
            .map(|token| TokenView {
                prefix: token.prefix.clone(),
                label: token.label.clone(),
                created_at: token.created_at_ms,
                revoked: token.revoked,
            })
            .collect(),
    }
}

/// The states of a run that has not ended (it counts against `max_runs`, and stopping a
/// parent stops its children in these).
pub(crate) const LIVE_STATES: [RunState; 6] = [
    RunState::Created,
    RunState::Queued,
    RunState::Running,
    RunState::Paused,
    RunState::Waiting,
    RunState::Recovering,
];

/// Serializes quota check and creation, so two requests racing for a tenant's last run
/// slot cannot both pass the check. One lock for the process: creation is cheap next to
/// what a run costs, and there is one kernel per process.
pub(crate) static ADMISSION: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_acts_only_for_itself() {
        let acme = Principal::Tenant("acme".into());
        assert_eq!(acme.run_tenant(None).unwrap(), "acme");
        assert_eq!(acme.run_tenant(Some("acme")).unwrap(), "acme");
        assert!(matches!(acme.run_tenant(Some("globex")), Err(Error::Forbidden(_))));
        assert_eq!(acme.listing(None).unwrap().as_deref(), Some("acme"));
        assert!(matches!(acme.listing(Some("globex")), Err(Error::Forbidden(_))));
        assert!(matches!(acme.require_admin("x"), Err(Error::Forbidden(_))));
        assert_eq!(acme.tenant(), "acme");
    }

    #[test]
    fn the_operator_acts_for_any_tenant() {
        let admin = Principal::Admin;
        assert_eq!(admin.run_tenant(None).unwrap(), DEFAULT_TENANT);
        assert_eq!(admin.run_tenant(Some("globex")).unwrap(), "globex");
        assert_eq!(admin.listing(None).unwrap(), None);
        assert_eq!(admin.listing(Some("acme")).unwrap().as_deref(), Some("acme"));
        assert!(admin.require_admin("x").is_ok());
    }

    #[test]
    fn minted_tokens_have_a_public_prefix_and_a_secret() {
        let (token, prefix) = mint_token();
        assert!(valid_prefix(&prefix), "{prefix}");
        assert!(token.starts_with(&format!("{prefix}_")));
        assert_eq!(token.len(), prefix.len() + 1 + 64);
        assert_ne!(mint_token().0, token);
        assert_eq!(token_hash(&token).len(), 64);
        assert!(!valid_prefix("kt_xyz"));
    }

    #[test]
    fn names_and_quotas_are_checked() {
        assert!(validate_name("acme-1_x").is_ok());
        for bad in ["", "a b", "x/y", &"a".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_quota(&QuotaParams { max_runs: Some(0), max_usd_per_run: None }).is_err());
        assert!(validate_quota(&QuotaParams { max_runs: None, max_usd_per_run: Some(-1.0) }).is_err());
        assert!(validate_quota(&QuotaParams { max_runs: Some(3), max_usd_per_run: Some(0.5) }).is_ok());
    }
}
