//! Webhooks: the public API (`/v1/hooks`, `keel hook`) and deliveries (`POST
//! /v1/hooks/{name}`). Whether a delivery is signed, and which id names it, is
//! `keel_core::hook`; here are the secret, the store and the run.
//!
//! Exactly once per delivery id: the delivery is recorded as a fire of the hook (unique per
//! hook and delivery id) with the id of the run it starts, then the run is created under
//! that id, and only then is the sender answered 202. A redelivery of a recorded id starts
//! nothing: it is answered 200 with the run the first one started. A kernel that died
//! between recording and creating answered no 2xx, so the sender delivers again; that
//! redelivery finds the fire without its run and creates it from its own body (the same
//! delivery id carries the same payload).

use keel_core::hook::{Verify, delivery_id, verify};
use keel_protocol::api::CreateRunParams;
use keel_protocol::triggers::{CreateHookParams, DeliveryView, HookAccepted, HookView};
use keel_store::{AuditRecord, FireRecord, TriggerRecord};
use keel_types::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::triggers::{HOOK, is_declared, new_trigger, triggered_run, validate_name};
use crate::run::CreateRun;
use crate::{Error, Kernel, Principal, Result, now_ms};

const KIND: &str = HOOK.store;

/// The largest delivery body taken (GitHub caps its payloads at 25 MB, but events that
/// start agents are far smaller; Stripe's are a few KiB). Larger ones answer 413.
pub const MAX_HOOK_BODY: usize = 1 << 20;

/// How many last deliveries a view shows.
const SHOWN_DELIVERIES: usize = 10;

/// A hook as stored in its trigger's spec (the secret's variable, never the secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HookSpec {
    verify: String,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    tolerance_secs: Option<u64>,
    secret_env: String,
    run: CreateRunParams,
}

impl HookSpec {
    fn verify(&self) -> Result<Verify> {
        Verify::new(&self.verify, self.header.as_deref(), self.tolerance_secs).map_err(Error::InvalidRequest)
    }
}

fn spec_of(record: &TriggerRecord) -> Result<HookSpec> {
    serde_json::from_value(record.spec.clone()).map_err(|e| {
        Error::InvalidRequest(format!("the stored spec of hook {} cannot be read: {e}", record.name))
    })
}

fn validate_secret_env(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(Error::InvalidRequest(format!(
            "secret_env {name:?} is not an environment variable name: use letters, digits and '_', not starting with a digit"
        )));
    }
    if name.starts_with("KEEL_") {
        return Err(Error::InvalidRequest(format!(
            "secret_env {name} is reserved (KEEL_* are the kernel's own settings); name another variable"
        )));
    }
    Ok(())
}

/// The secret, read from the kernel's environment now (so a rotated secret takes effect
/// at the kernel's next start without touching the store).
fn secret(spec: &HookSpec, hook: &str) -> Result<String> {
    match std::env::var(&spec.secret_env) {
        Ok(secret) if !secret.is_empty() => Ok(secret),
        _ => Err(Error::Unavailable(format!(
            "hook {hook}: the kernel's environment has no {} (its secret); set it where `keel serve` starts",
            spec.secret_env
        ))),
    }
}

/// The body as the run's payload: JSON when it parses, else its text.
fn payload_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// The run a delivery starts: the hook's run with an input naming the hook and delivery.
fn delivery_request(
    hook: &str,
    spec: &HookSpec,
    tenant: &str,
    delivery: &str,
    header: &dyn Fn(&str) -> Option<String>,
    payload: Value,
) -> Result<CreateRun> {
    let event =
        header("X-GitHub-Event").or_else(|| payload.get("type").and_then(Value::as_str).map(str::to_owned));
    let input = json!({
        "trigger": "hook",
        "hook": hook,
        "delivery_id": delivery,
        "content_type": header("Content-Type"),
        "event": event,
        "payload": payload,
    });
    triggered_run(&spec.run, tenant, input, format!("hook:{hook}"))
}

/// A hook to store, checked whole (its name, scheme, the secret's variable, set in the
/// kernel's environment, and the run) for `principal`.
pub(super) fn hook_record(principal: &Principal, params: CreateHookParams) -> Result<TriggerRecord> {
    validate_name(HOOK, &params.name)?;
    validate_secret_env(&params.secret_env)?;
    let tenant = principal.run_tenant(params.run.tenant.as_deref())?;
    let spec = HookSpec {
        verify: params.verify,
        header: params.header,
        tolerance_secs: params.tolerance_secs,
        secret_env: params.secret_env,
        run: CreateRunParams { tenant: Some(tenant.clone()), ..params.run },
    };
    spec.verify()?;
    secret(&spec, &params.name).map_err(|_| {
        Error::InvalidRequest(format!(
            "the kernel's environment has no {}: set the hook's secret there (where `keel serve` starts) \
             first; it is read at each delivery and never stored",
            spec.secret_env
        ))
    })?;
    // The run is checked as a delivery would make it, so a bad run option fails now.
    delivery_request(&params.name, &spec, &tenant, "check", &|_| None, Value::Null)?;
    Ok(new_trigger(HOOK, params.name, tenant, &spec))
}

impl Kernel {
    /// `POST /v1/hooks`: checks the scheme, the secret's variable (set in the kernel's
    /// environment) and the run before anything is stored.
    pub async fn hook_create(&self, principal: &Principal, params: CreateHookParams) -> Result<HookView> {
        let record = hook_record(principal, params)?;
        self.trigger_store(HOOK, record.clone()).await?;
        self.hook_view(&record).await
    }

    /// `GET /v1/hooks`: the principal's hooks, by name.
    pub async fn hooks(&self, principal: &Principal) -> Result<Vec<HookView>> {
        self.trigger_views(HOOK, principal, |record| async move { self.hook_view(&record).await }).await
    }

    /// `GET /v1/hooks/{name}`.
    pub async fn hook(&self, principal: &Principal, name: &str) -> Result<HookView> {
        let record = self.trigger_for(HOOK, principal, name).await?;
        self.hook_view(&record).await
    }

    /// Deletes a hook and its history of deliveries (its runs stay); the hook as it was.
    /// One declared in keel.toml is refused (a conflict saying to remove it there).
    pub async fn hook_delete(&self, principal: &Principal, name: &str) -> Result<HookView> {
        let view = self.hook(principal, name).await?;
        self.trigger_delete(HOOK, principal, name).await?;
        Ok(view)
    }

    async fn hook_view(&self, record: &TriggerRecord) -> Result<HookView> {
        let spec = spec_of(record)?;
        let verify = spec.verify()?;
        let fires = self.store().trigger_fires(KIND, &record.name, SHOWN_DELIVERIES).await?;
        Ok(HookView {
            name: record.name.clone(),
            tenant: record.tenant.clone(),
            verify: verify.scheme().to_owned(),
            signature_header: verify.signature_header().to_owned(),
            secret_present: secret(&spec, &record.name).is_ok(),
            tolerance_secs: match verify {
                Verify::Stripe { tolerance_secs } => Some(tolerance_secs),
                _ => None,
            },
            secret_env: spec.secret_env.clone(),
            path: format!("/v1/hooks/{}", record.name),
            declared: is_declared(record),
            command: spec.run.command.clone(),
            created_at: record.created_at_ms,
            last_deliveries: fires
                .into_iter()
                .map(|fire| DeliveryView {
                    delivery_id: fire.occasion,
                    run_id: fire.run_id.map(|id| id.to_string()),
                    outcome: fire.outcome,
                    detail: fire.detail,
                    received_at: fire.at_ms,
                })
                .collect(),
        })
    }

    /// `POST /v1/hooks/{name}`: a delivery. `header` looks a request header up by name
    /// (case-insensitively). A delivery whose signature does not verify starts nothing
    /// and is audited; one whose id was seen answers that delivery's run.
    pub async fn hook_deliver(
        &self,
        name: &str,
        header: &(dyn Fn(&str) -> Option<String> + Sync),
        body: &[u8],
    ) -> Result<HookAccepted> {
        let Some(record) = self.store().trigger_get(KIND, name).await? else {
            return Err(Error::NotFound(format!("no hook {name}")));
        };
        let refuse = |reason: String| {
            self.audit(AuditRecord {
                tenant: record.tenant.clone(),
                run_id: None,
                at_ms: now_ms(),
                actor: "kernel".into(),
                action: "hook.refused".into(),
                subject: name.to_owned(),
                outcome: "denied".into(),
                detail: json!({ "reason": reason, "bytes": body.len() }),
            });
            reason
        };
        if body.len() > MAX_HOOK_BODY {
            let reason = refuse(format!(
                "hook {name}: the body is {} bytes, over the {MAX_HOOK_BODY}-byte limit of a delivery",
                body.len()
            ));
            return Err(Error::TooLarge(reason));
        }
        let spec = spec_of(&record)?;
        let scheme = spec.verify()?;
        let secret = secret(&spec, name).inspect_err(|e| {
            refuse(e.to_string());
        })?;
        let now_secs = now_ms() / 1000;
        if let Err(refusal) = verify(&scheme, secret.as_bytes(), header, body, now_secs) {
            return Err(Error::Unauthorized(refuse(format!("hook {name}: {refusal}"))));
        }
        let payload = payload_of(body);
        let given = delivery_id(&scheme, header, Some(&payload))
            .map_err(|e| Error::InvalidRequest(format!("hook {name}: {e}")))?;
        let now = now_ms();
        let run = RunId::generate(now);
        let delivery = given.unwrap_or_else(|| format!("keel-{run}"));
        let fire = FireRecord {
            kind: KIND.into(),
            trigger: name.to_owned(),
            occasion: delivery.clone(),
            tenant: record.tenant.clone(),
            at_ms: now,
            run_id: Some(run),
            outcome: "fired".into(),
            detail: None,
            fired_at_ms: now,
        };
        let (fire, wrote) = self.store().trigger_fire(fire).await?;
        let Some(run) = fire.run_id.clone() else {
            return Err(Error::Conflict(format!(
                "hook {name}: delivery {delivery} was recorded without a run"
            )));
        };
        if !wrote && self.get(&run).await.is_ok() {
            return Ok(HookAccepted { run_id: run.to_string(), delivery_id: delivery, duplicate: true });
        }
        // From here on the delivery is accepted for the first time: a new one, or a
        // recorded one whose run a dead kernel never created (its sender had no 2xx).
        let request = delivery_request(name, &spec, &record.tenant, &delivery, header, payload);
        self.start_fired(HOOK, &fire, request).await?;
        if !wrote && fire.outcome != "fired" {
            self.store().trigger_fire_settle(KIND, name, &delivery, "fired", None).await?;
        }
        self.audit_run(
            &run,
            &record.tenant,
            "kernel",
            "hook.delivery",
            name,
            "ok",
            json!({ "delivery_id": delivery }),
        );
        Ok(HookAccepted { run_id: run.to_string(), delivery_id: delivery, duplicate: false })
    }
}
