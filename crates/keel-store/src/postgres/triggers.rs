//! Triggers and their fires on Postgres (see `crate::triggers`): each write is one
//! statement, so the primary keys are all the locking it needs.

use deadpool_postgres::GenericClient;
use keel_types::RunId;
use tokio_postgres::Row;

use super::int;
use super::queries::{column, count, execute, json_column, query_opt, query_rows};
use crate::{Error, FireRecord, Result, TriggerRecord};

pub(super) const TRIGGER_COLUMNS: &str = "kind, name, tenant, spec, paused, since_ms, created_at_ms";
pub(super) const FIRE_COLUMNS: &str =
    "kind, trigger, occasion, tenant, at_ms, run_id, outcome, detail, fired_at_ms";

pub(super) async fn create(client: &impl GenericClient, trigger: &TriggerRecord) -> Result<()> {
    let inserted = execute(
        client,
        "inserting a trigger",
        &format!(
            "INSERT INTO triggers ({TRIGGER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (kind, name) DO NOTHING"
        ),
        &[
            &trigger.kind,
            &trigger.name,
            &trigger.tenant,
            &trigger.spec.to_string(),
            &trigger.paused,
            &int(trigger.since_ms),
            &int(trigger.created_at_ms),
        ],
    )
    .await?;
    if inserted == 0 {
        return Err(Error::TriggerExists { kind: trigger.kind.clone(), name: trigger.name.clone() });
    }
    Ok(())
}

pub(super) async fn set_paused(
    client: &impl GenericClient,
    kind: &str,
    name: &str,
    paused: bool,
    since_ms: u64,
) -> Result<bool> {
    let changed = execute(
        client,
        "pausing or resuming a trigger",
        "UPDATE triggers SET paused = $3, since_ms = $4 WHERE kind = $1 AND name = $2",
        &[&kind, &name, &paused, &int(since_ms)],
    )
    .await?;
    Ok(changed > 0)
}

pub(super) async fn update(
    client: &impl GenericClient,
    kind: &str,
    name: &str,
    tenant: &str,
    spec: &str,
) -> Result<bool> {
    let changed = execute(
        client,
        "updating a trigger",
        "UPDATE triggers SET tenant = $3, spec = $4 WHERE kind = $1 AND name = $2",
        &[&kind, &name, &tenant, &spec],
    )
    .await?;
    Ok(changed > 0)
}

pub(super) async fn delete(client: &impl GenericClient, kind: &str, name: &str) -> Result<bool> {
    let deleted = execute(
        client,
        "deleting a trigger and its fires",
        "WITH fires AS (DELETE FROM trigger_fires WHERE kind = $1 AND trigger = $2) \
         DELETE FROM triggers WHERE kind = $1 AND name = $2",
        &[&kind, &name],
    )
    .await?;
    Ok(deleted > 0)
}

pub(super) async fn fire(client: &impl GenericClient, fire: FireRecord) -> Result<(FireRecord, bool)> {
    let inserted = execute(
        client,
        "recording a trigger's fire",
        &format!(
            "INSERT INTO trigger_fires ({FIRE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (kind, trigger, occasion) DO NOTHING"
        ),
        &[
            &fire.kind,
            &fire.trigger,
            &fire.occasion,
            &fire.tenant,
            &int(fire.at_ms),
            &fire.run_id.as_ref().map(RunId::as_str),
            &fire.outcome,
            &fire.detail,
            &int(fire.fired_at_ms),
        ],
    )
    .await?;
    if inserted == 1 {
        return Ok((fire, true));
    }
    let sql = format!(
        "SELECT {FIRE_COLUMNS} FROM trigger_fires WHERE kind = $1 AND trigger = $2 AND occasion = $3"
    );
    let row =
        query_opt(client, "reading a recorded fire", &sql, &[&fire.kind, &fire.trigger, &fire.occasion])
            .await?
            .ok_or_else(|| Error::Corrupt("a fire that conflicted on insert cannot be read back".into()))?;
    Ok((decode_fire(&row)?, false))
}

pub(super) async fn settle(
    client: &impl GenericClient,
    kind: &str,
    trigger: &str,
    occasion: &str,
    outcome: &str,
    detail: Option<&str>,
) -> Result<()> {
    execute(
        client,
        "settling a trigger's fire",
        "UPDATE trigger_fires SET outcome = $4, detail = $5 WHERE kind = $1 AND trigger = $2 AND occasion = $3",
        &[&kind, &trigger, &occasion, &outcome, &detail],
    )
    .await?;
    Ok(())
}

pub(super) async fn get(
    client: &impl GenericClient,
    kind: &str,
    name: &str,
) -> Result<Option<TriggerRecord>> {
    let sql = format!("SELECT {TRIGGER_COLUMNS} FROM triggers WHERE kind = $1 AND name = $2");
    query_opt(client, "reading a trigger", &sql, &[&kind, &name])
        .await?
        .map(|row| decode_trigger(&row))
        .transpose()
}

pub(super) async fn list(
    client: &impl GenericClient,
    kind: &str,
    tenant: Option<&str>,
) -> Result<Vec<TriggerRecord>> {
    let sql = format!(
        "SELECT {TRIGGER_COLUMNS} FROM triggers WHERE kind = $1 AND ($2::TEXT IS NULL OR tenant = $2) ORDER BY name"
    );
    query_rows(client, "listing triggers", &sql, &[&kind, &tenant])
        .await?
        .iter()
        .map(decode_trigger)
        .collect()
}

pub(super) async fn fires(
    client: &impl GenericClient,
    kind: &str,
    trigger: &str,
    limit: usize,
) -> Result<Vec<FireRecord>> {
    let sql = format!(
        "SELECT {FIRE_COLUMNS} FROM trigger_fires WHERE kind = $1 AND trigger = $2 \
         ORDER BY at_ms DESC, occasion DESC LIMIT $3"
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    query_rows(client, "listing a trigger's fires", &sql, &[&kind, &trigger, &limit])
        .await?
        .iter()
        .map(decode_fire)
        .collect()
}

pub(super) async fn unstarted(client: &impl GenericClient, kind: &str) -> Result<Vec<FireRecord>> {
    let sql = "SELECT f.kind, f.trigger, f.occasion, f.tenant, f.at_ms, f.run_id, f.outcome, f.detail, \
               f.fired_at_ms FROM trigger_fires f LEFT JOIN runs r ON r.id = f.run_id \
               WHERE f.kind = $1 AND f.outcome = 'fired' AND f.run_id IS NOT NULL AND r.id IS NULL \
               ORDER BY f.at_ms, f.occasion";
    query_rows(client, "listing fires whose run was never created", sql, &[&kind])
        .await?
        .iter()
        .map(decode_fire)
        .collect()
}

pub(super) fn decode_trigger(row: &Row) -> Result<TriggerRecord> {
    let name: String = column(row, "name", "a trigger")?;
    let place = format!("trigger {name:?}");
    Ok(TriggerRecord {
        kind: column(row, "kind", &place)?,
        tenant: column(row, "tenant", &place)?,
        spec: json_column(row, "spec", &place)?,
        paused: column(row, "paused", &place)?,
        since_ms: count(row, "since_ms", &place)?,
        created_at_ms: count(row, "created_at_ms", &place)?,
        name,
    })
}

pub(super) fn decode_fire(row: &Row) -> Result<FireRecord> {
    let trigger: String = column(row, "trigger", "a trigger fire")?;
    let place = format!("a fire of trigger {trigger:?}");
    let run_id: Option<String> = column(row, "run_id", &place)?;
    Ok(FireRecord {
        kind: column(row, "kind", &place)?,
        occasion: column(row, "occasion", &place)?,
        tenant: column(row, "tenant", &place)?,
        at_ms: count(row, "at_ms", &place)?,
        run_id: run_id
            .map(|id| {
                RunId::parse(&id).map_err(|error| Error::Corrupt(format!("run id of {place}: {error}")))
            })
            .transpose()?,
        outcome: column(row, "outcome", &place)?,
        detail: column(row, "detail", &place)?,
        fired_at_ms: count(row, "fired_at_ms", &place)?,
        trigger,
    })
}
