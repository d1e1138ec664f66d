//! What schedules, webhooks and event triggers share: their names, storing and finding
//! one for a principal, the mark of one declared in keel.toml, the run a fire starts
//! (recorded first, then created under the recorded id), and which failures a fire may
//! get past later. All are triggers in the store (`Store::trigger_*`), told apart by kind.

use std::future::Future;

use keel_protocol::api::CreateRunParams;
use keel_store::{FireRecord, TriggerRecord};
use keel_types::RunId;
use serde_json::Value;

use crate::run::CreateRun;
use crate::{Error, Kernel, Principal, Result, now_ms};

/// A trigger's kind as the store keys it, and as the API and CLI name it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kind {
    /// `schedule`, `hook` or `event`.
    pub(super) store: &'static str,
    /// `keel schedule` or `keel hook`.
    pub(super) command: &'static str,
    /// What people call it, and with its article: `event trigger`, `an event trigger`.
    pub(super) noun: &'static str,
    pub(super) a_noun: &'static str,
    /// Whether it can be paused (a webhook cannot: its sender would get errors).
    pub(super) pausable: bool,
}

pub(super) const SCHEDULE: Kind = Kind {
    store: "schedule",
    command: "keel schedule",
    noun: "schedule",
    a_noun: "a schedule",
    pausable: true,
};
pub(super) const HOOK: Kind =
    Kind { store: "hook", command: "keel hook", noun: "hook", a_noun: "a hook", pausable: false };
pub(super) const EVENT: Kind = Kind {
    store: "event",
    command: "keel event",
    noun: "event trigger",
    a_noun: "an event trigger",
    pausable: true,
};

/// The key of a stored spec that marks a trigger declared in keel.toml (see
/// `declared.rs`); each kind's spec type ignores it.
const DECLARED: &str = "declared";

/// Whether a trigger was declared in keel.toml (rather than created through the API).
pub(super) fn is_declared(record: &TriggerRecord) -> bool {
    record.spec.get(DECLARED) == Some(&Value::Bool(true))
}

/// Marks a spec about to be stored as declared in keel.toml.
pub(super) fn mark_declared(spec: &mut Value) {
    if let Value::Object(map) = spec {
        map.insert(DECLARED.into(), Value::Bool(true));
    }
}

/// The run a trigger's fire starts: the trigger's run, in its tenant, with `input` (what
/// fired it) holding the run's own `--input` as its `input`, marked as started by
/// `started_by` (`schedule:NAME`, as `keel ps` shows it).
pub(super) fn triggered_run(
    run: &CreateRunParams,
    tenant: &str,
    mut input: Value,
    started_by: String,
) -> Result<CreateRun> {
    let mut params = run.clone();
    if let Some(given) = params.input.take() {
        input["input"] = given;
    }
    params.input = Some(input);
    params.tenant = Some(tenant.to_owned());
    let mut request = CreateRun::validate(params)?;
    request.trigger = Some(started_by);
    Ok(request)
}

/// A new trigger of `kind`, created now (what fires after now is its to fire).
pub(super) fn new_trigger(
    kind: Kind,
    name: String,
    tenant: String,
    spec: &impl serde::Serialize,
) -> TriggerRecord {
    let now = now_ms();
    TriggerRecord {
        kind: kind.store.into(),
        name,
        tenant,
        // Specs are plain structs of strings, numbers and JSON values: they serialize.
        spec: serde_json::to_value(spec).unwrap_or(Value::Null),
        paused: false,
        since_ms: now,
        created_at_ms: now,
    }
}

/// A fire of `trigger` for `occasion` (at `at_ms`), with the id of the run it will start.
pub(super) fn new_fire(kind: Kind, trigger: &TriggerRecord, occasion: String, at_ms: u64) -> FireRecord {
    let now = now_ms();
    FireRecord {
        kind: kind.store.into(),
        trigger: trigger.name.clone(),
        occasion,
        tenant: trigger.tenant.clone(),
        at_ms,
        run_id: Some(RunId::generate(now)),
        outcome: "fired".into(),
        detail: None,
        fired_at_ms: now,
    }
}

/// A trigger's name: it is a path segment of the API.
pub(super) fn validate_name(kind: Kind, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Error::InvalidRequest(format!(
            "{} name {name:?} is not valid: use 1-64 letters, digits, '-', '_' or '.'",
            kind.noun
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
    /// Records `fire` (unless its occasion is recorded already) and creates its run from
    /// `request`; the run id, or `None` when the occasion had fired before.
    pub(super) async fn fire_and_start(
        &self,
        kind: Kind,
        fire: FireRecord,
        request: impl FnOnce(&FireRecord) -> Result<CreateRun>,
    ) -> Result<Option<RunId>> {
        let (fire, wrote) = self.store().trigger_fire(fire).await?;
        if !wrote {
            return Ok(None);
        }
        self.start_fired(kind, &fire, request(&fire)).await
    }

    /// Creates the run a recorded fire names (idempotent: an existing run is left alone).
    /// A run that cannot be created for good settles the fire as `failed` with why; a
    /// failure the same fire may get past later is returned as it is.
    pub(super) async fn start_fired(
        &self,
        kind: Kind,
        fire: &FireRecord,
        request: Result<CreateRun>,
    ) -> Result<Option<RunId>> {
        let Some(run) = fire.run_id.clone() else { return Ok(None) };
        let created = match request {
            Ok(request) => self.create_as(run.clone(), request).await.map(drop),
            Err(error) => Err(error),
        };
        match created {
            Ok(()) | Err(Error::Store(keel_store::Error::RunExists(_))) => Ok(Some(run)),
            Err(error) if retry_later(&error) => Err(error),
            Err(error) => {
                let detail = error.to_string();
                tracing::warn!(
                    "{} {} could not start its run for {}: {detail}",
                    kind.noun,
                    fire.trigger,
                    fire.occasion
                );
                self.store()
                    .trigger_fire_settle(kind.store, &fire.trigger, &fire.occasion, "failed", Some(&detail))
                    .await?;
                Err(error)
            }
        }
    }

    /// Deletes a trigger the principal may see, unless keel.toml declares it (the daemon
    /// would make it again at its next start); the trigger as it was.
    pub(super) async fn trigger_delete(
        &self,
        kind: Kind,
        principal: &Principal,
        name: &str,
    ) -> Result<TriggerRecord> {
        let record = self.trigger_for(kind, principal, name).await?;
        if is_declared(&record) {
            let pause = if kind.pausable {
                format!(", or `{} pause {name}` to stop it now", kind.command)
            } else {
                String::new()
            };
            return Err(Error::Conflict(format!(
                "{} {name} is declared in keel.toml: remove it there and restart `keel serve`, which \
                 deletes it{pause}",
                kind.noun
            )));
        }
        self.store().trigger_delete(kind.store, name).await?;
        Ok(record)
    }

    /// Stores a new trigger; a taken name is a conflict saying what to do.
    pub(super) async fn trigger_store(&self, kind: Kind, record: TriggerRecord) -> Result<()> {
        match self.store().trigger_create(record).await {
            Err(keel_store::Error::TriggerExists { name, .. }) => Err(Error::Conflict(format!(
                "{} named {name} already exists; `{} delete {name}` first, or pick another name",
                kind.a_noun, kind.command
            ))),
            other => Ok(other?),
        }
    }

    /// Each of the principal's triggers of a kind (every tenant's for the operator), by
    /// name, as `view` shows it.
    pub(super) async fn trigger_views<V, Shown>(
        &self,
        kind: Kind,
        principal: &Principal,
        view: impl Fn(TriggerRecord) -> Shown,
    ) -> Result<Vec<V>>
    where
        Shown: Future<Output = Result<V>>,
    {
        let tenant = principal.listing(None)?;
        let mut views = Vec::new();
        for record in self.store().trigger_list(kind.store, tenant.as_deref()).await? {
            views.push(view(record).await?);
        }
        Ok(views)
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
            _ => Err(Error::NotFound(format!("no {} {name}; `{} list` lists them", kind.noun, kind.command))),
        }
    }
}
