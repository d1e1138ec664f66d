//! What schedules and webhooks share: their names, storing and finding one for a
//! principal, and which failures a fire may get past later. Both are triggers in the
//! store (`Store::trigger_*`), told apart by kind.

use keel_store::TriggerRecord;

use crate::{Error, Kernel, Principal, Result};

/// A trigger's kind as the store keys it, and as the API and CLI name it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kind {
    /// `schedule` or `hook`.
    pub(super) store: &'static str,
    /// `keel schedule` or `keel hook`.
    pub(super) command: &'static str,
}

pub(super) const SCHEDULE: Kind = Kind { store: "schedule", command: "keel schedule" };
pub(super) const HOOK: Kind = Kind { store: "hook", command: "keel hook" };

/// A trigger's name: it is a path segment of the API.
pub(super) fn validate_name(kind: Kind, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Error::InvalidRequest(format!(
            "{} name {name:?} is not valid: use 1-64 letters, digits, '-', '_' or '.'",
            kind.store
        )));
    }
    Ok(())
}

/// A failure the same fire may get past later (the store out of reach, or a write whose
/// outcome is unknown: recording a fire and creating its run are both idempotent).
pub(super) fn retry_later(error: &Error) -> bool {
    error.is_unavailable() || matches!(error, Error::Store(keel_store::Error::OutcomeUnknown { .. }))
}

impl Kernel {
    /// Stores a new trigger; a taken name is a conflict saying what to do.
    pub(super) async fn trigger_store(&self, kind: Kind, record: TriggerRecord) -> Result<()> {
        match self.store().trigger_create(record).await {
            Err(keel_store::Error::TriggerExists { name, .. }) => Err(Error::Conflict(format!(
                "a {} named {name} already exists; `{} delete {name}` first, or pick another name",
                kind.store, kind.command
            ))),
            other => Ok(other?),
        }
    }

    /// The principal's triggers of a kind (every tenant's for the operator), by name.
    pub(super) async fn trigger_listing(
        &self,
        kind: Kind,
        principal: &Principal,
    ) -> Result<Vec<TriggerRecord>> {
        let tenant = principal.listing(None)?;
        Ok(self.store().trigger_list(kind.store, tenant.as_deref()).await?)
    }

    /// A trigger the principal may see; another tenant's answers as if it did not exist.
    pub(super) async fn trigger_for(
        &self,
        kind: Kind,
        principal: &Principal,
        name: &str,
    ) -> Result<TriggerRecord> {
        match self.store().trigger_get(kind.store, name).await? {
            Some(record) if principal.is_admin() || principal.tenant() == record.tenant => Ok(record),
            _ => {
                Err(Error::NotFound(format!("no {} {name}; `{} list` lists them", kind.store, kind.command)))
            }
        }
    }
}
