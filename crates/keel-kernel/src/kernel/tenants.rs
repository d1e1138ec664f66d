//! Tenants and their tokens as the kernel manages them: authentication of API tokens,
//! creating tenants and tokens, the run of a principal, and run creation under a tenant's
//! quotas (`max_runs` checked and created under one admission lock).

use crate::tenants::{
    ADMISSION, LIVE_STATES, Principal, QUOTA_RETRY_AFTER_SECS, mint_token, now_ms, quota_of, tenant_view,
    token_hash, valid_prefix, validate_name, validate_quota,
};
use crate::{CreateRun, Error, Kernel, Result};
use keel_protocol::api::{CreateRunParams, CreateTenantParams, QuotaParams, TenantView, TokenCreatedView};
use keel_store::{ApiTokenRecord, RunFilter, RunRecord, TenantRecord};
use keel_types::RunId;
use serde_json::Value;

impl Kernel {
    /// The tenant of a live (not revoked) tenant token; `None` for any other string.
    pub async fn authenticate_api_token(&self, token: &str) -> Result<Option<String>> {
        if token.is_empty() {
            return Ok(None);
        }
        let found = self.store().token_lookup(&token_hash(token)).await?;
        Ok(found.filter(|record| !record.revoked).map(|record| record.tenant))
    }

    /// Creates a tenant (operator only).
    pub async fn create_tenant(
        &self,
        principal: &Principal,
        params: CreateTenantParams,
    ) -> Result<TenantView> {
        principal.require_admin("creating a tenant")?;
        validate_name(&params.name)?;
        let quota = params.quota.unwrap_or_default();
        validate_quota(&quota)?;
        let record = TenantRecord {
            name: params.name,
            created_at_ms: now_ms(),
            quota: serde_json::to_value(&quota).unwrap_or(Value::Null),
        };
        match self.store().tenant_create(record.clone()).await {
            Ok(()) => Ok(tenant_view(&record, &[])),
            Err(keel_store::Error::TenantExists(name)) => {
                Err(Error::Conflict(format!("tenant {name} already exists; `keel tenant list` shows it")))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// The tenants the principal may see (the operator: all; a tenant: itself), with
    /// their tokens' prefixes.
    pub async fn tenants(&self, principal: &Principal) -> Result<Vec<TenantView>> {
        let records = match principal {
            Principal::Admin => self.store().tenant_list().await?,
            Principal::Tenant(name) => self.store().tenant_get(name).await?.into_iter().collect(),
        };
        let mut views = Vec::with_capacity(records.len());
        for record in &records {
            let tokens = self.store().token_list(&record.name).await?;
            views.push(tenant_view(record, &tokens));
        }
        Ok(views)
    }

    /// Mints a token for a tenant (operator only); the only time the token is shown.
    pub async fn create_token(
        &self,
        principal: &Principal,
        tenant: &str,
        label: Option<String>,
    ) -> Result<TokenCreatedView> {
        principal.require_admin("minting a token")?;
        validate_name(tenant)?;
        if let Some(label) = &label
            && (label.len() > 200 || label.chars().any(char::is_control))
        {
            return Err(Error::InvalidRequest("a token label is at most 200 printable characters".into()));
        }
        let (token, prefix) = mint_token();
        let record = ApiTokenRecord {
            hash: token_hash(&token),
            prefix: prefix.clone(),
            tenant: tenant.to_owned(),
            created_at_ms: now_ms(),
            label,
            revoked: false,
        };
        match self.store().token_create(record).await {
            Ok(()) => Ok(TokenCreatedView { tenant: tenant.to_owned(), prefix, token }),
            Err(keel_store::Error::TenantNotFound(name)) => Err(Error::NotFound(format!(
                "no tenant {name}; create it first with `keel tenant create {name}`"
            ))),
            Err(err) => Err(err.into()),
        }
    }

    /// Revokes the tenant's token with this prefix (operator only); how many were.
    pub async fn revoke_token(&self, principal: &Principal, tenant: &str, prefix: &str) -> Result<u64> {
        principal.require_admin("revoking a token")?;
        validate_name(tenant)?;
        if !valid_prefix(prefix) {
            return Err(Error::InvalidRequest(format!(
                "{prefix:?} is not a token prefix (kt_ and 8 hex digits, as `keel tenant list` shows)"
            )));
        }
        let revoked = self.store().token_revoke(tenant, prefix).await?;
        if revoked == 0 && !self.store().token_list(tenant).await?.iter().any(|t| t.prefix == prefix) {
            return Err(Error::NotFound(format!("tenant {tenant} has no token {prefix}")));
        }
        Ok(revoked)
    }

    /// The run, if the principal may see it; another tenant's run is `RunNotFound`,
    /// exactly like a missing one.
    pub(crate) async fn run_for(&self, principal: &Principal, run: &RunId) -> Result<RunRecord> {
        let record = self.get(run).await?;
        if principal.owns(&record) { Ok(record) } else { Err(Error::RunNotFound(run.clone())) }
    }

    /// Creates a run for the principal: the tenant is the token's (a tenant token naming
    /// another is `Forbidden`), the tenant's `max_usd_per_run` is the budget of a run that
    /// brings none, and `max_runs` is enforced (`QuotaExceeded`).
    pub(crate) async fn create_within_quota(
        &self,
        principal: &Principal,
        params: CreateRunParams,
    ) -> Result<RunRecord> {
        self.create_within_quota_as(principal, RunId::generate(crate::now_ms()), params, None).await
    }

    /// `create_within_quota` under an id chosen before (recorded elsewhere first, so a
    /// retry finds the same run), naming what started it (`a2a:NAME`).
    pub(crate) async fn create_within_quota_as(
        &self,
        principal: &Principal,
        id: RunId,
        mut params: CreateRunParams,
        trigger: Option<String>,
    ) -> Result<RunRecord> {
        let tenant = principal.run_tenant(params.tenant.as_deref())?;
        params.tenant = Some(tenant.clone());
        let quota = self.quota(&tenant).await?;
        if let Some(usd) = quota.max_usd_per_run
            && params.budget.as_ref().is_none_or(|budget| budget.usd.is_none())
        {
            params.budget.get_or_insert_with(Default::default).usd = Some(usd);
        }
        let mut request = CreateRun::validate(params)?;
        request.trigger = trigger;
        let _admission = ADMISSION.lock().await;
        self.check_run_quota(&tenant, &quota).await?;
        self.create_as(id, request).await
    }

    /// Refuses a new run of `tenant` when it already has `max_runs` live runs.
    pub async fn admit_run(&self, tenant: &str) -> Result<()> {
        let quota = self.quota(tenant).await?;
        self.check_run_quota(tenant, &quota).await
    }

    pub(crate) async fn quota(&self, tenant: &str) -> Result<QuotaParams> {
        Ok(self.store().tenant_get(tenant).await?.as_ref().map(quota_of).unwrap_or_default())
    }

    async fn check_run_quota(&self, tenant: &str, quota: &QuotaParams) -> Result<()> {
        let Some(max_runs) = quota.max_runs else { return Ok(()) };
        let filter = RunFilter {
            states: LIVE_STATES.to_vec(),
            limit: Some(max_runs as usize),
            tenant: Some(tenant.to_owned()),
            ..RunFilter::default()
        };
        let live = self.store().list_runs(&filter).await?.len();
        if live >= max_runs as usize {
            return Err(Error::QuotaExceeded {
                message: format!(
                    "tenant {tenant} already has {live} live runs, its quota (max_runs {max_runs}); \
                     wait for one to end or stop one, then try again"
                ),
                retry_after_secs: QUOTA_RETRY_AFTER_SECS,
            });
        }
        Ok(())
    }
}
