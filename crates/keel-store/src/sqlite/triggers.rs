//! Triggers and their fires on SQLite (see `crate::triggers`): writes run by the writer
//! thread in a savepoint of their own (`writer::apply`), and the reads.

use keel_types::RunId;
use rusqlite::{Connection, Row, params};

use super::queries::{query_all, query_first, seq_param};
use super::writer::run_sql;
use crate::{Error, FireRecord, Result, TriggerRecord};

pub(super) const TRIGGER_COLUMNS: &str = "kind, name, tenant, spec, paused, since_ms, created_at_ms";
pub(super) const FIRE_COLUMNS: &str =
    "kind, trigger, occasion, tenant, at_ms, run_id, outcome, detail, fired_at_ms";

pub(super) fn create(connection: &Connection, trigger: &TriggerRecord) -> Result<()> {
    let inserted = run_sql(
        connection,
        "inserting a trigger",
        &format!(
            "INSERT INTO triggers ({TRIGGER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (kind, name) DO NOTHING"
        ),
        params![
            trigger.kind,
            trigger.name,
            trigger.tenant,
            trigger.spec.to_string(),
            trigger.paused,
            seq_param(trigger.since_ms),
            seq_param(trigger.created_at_ms),
        ],
    )?;
    if inserted == 0 {
        return Err(Error::TriggerExists { kind: trigger.kind.clone(), name: trigger.name.clone() });
    }
    Ok(())
}

pub(super) fn set_paused(
    connection: &Connection,
    kind: &str,
    name: &str,
    paused: bool,
    since: u64,
) -> Result<bool> {
    let changed = run_sql(
        connection,
        "pausing or resuming a trigger",
        "UPDATE triggers SET paused = ?3, since_ms = ?4 WHERE kind = ?1 AND name = ?2",
        params![kind, name, paused, seq_param(since)],
    )?;
    Ok(changed > 0)
}

pub(super) fn update(
    connection: &Connection,
    kind: &str,
    name: &str,
    tenant: &str,
    spec: &str,
) -> Result<bool> {
    let changed = run_sql(
        connection,
        "updating a trigger",
        "UPDATE triggers SET tenant = ?3, spec = ?4 WHERE kind = ?1 AND name = ?2",
        params![kind, name, tenant, spec],
    )?;
    Ok(changed > 0)
}

pub(super) fn delete(connection: &Connection, kind: &str, name: &str) -> Result<bool> {
    run_sql(
        connection,
        "deleting a trigger's fires",
        "DELETE FROM trigger_fires WHERE kind = ?1 AND trigger = ?2",
        params![kind, name],
    )?;
    let deleted = run_sql(
        connection,
        "deleting a trigger",
        "DELETE FROM triggers WHERE kind = ?1 AND name = ?2",
        params![kind, name],
    )?;
    Ok(deleted > 0)
}

pub(super) fn fire(connection: &Connection, fire: FireRecord) -> Result<(FireRecord, bool)> {
    let inserted = run_sql(
        connection,
        "recording a trigger's fire",
        &format!(
            "INSERT INTO trigger_fires ({FIRE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (kind, trigger, occasion) DO NOTHING"
        ),
        params![
            fire.kind,
            fire.trigger,
            fire.occasion,
            fire.tenant,
            seq_param(fire.at_ms),
            fire.run_id.as_ref().map(RunId::as_str),
            fire.outcome,
            fire.detail,
            seq_param(fire.fired_at_ms),
        ],
    )?;
    if inserted == 1 {
        return Ok((fire, true));
    }
    let stored = query_first(
        connection,
        "reading a recorded fire",
        &format!(
            "SELECT {FIRE_COLUMNS} FROM trigger_fires WHERE kind = ?1 AND trigger = ?2 AND occasion = ?3"
        ),
        params![fire.kind, fire.trigger, fire.occasion],
        decode_fire,
    )?
    .ok_or_else(|| Error::Corrupt("a fire that conflicted on insert cannot be read back".into()))?;
    Ok((stored, false))
}

pub(super) fn settle(
    connection: &Connection,
    kind: &str,
    trigger: &str,
    occasion: &str,
    outcome: &str,
    detail: Option<&str>,
) -> Result<()> {
    run_sql(
        connection,
        "settling a trigger's fire",
        "UPDATE trigger_fires SET outcome = ?4, detail = ?5 WHERE kind = ?1 AND trigger = ?2 AND occasion = ?3",
        params![kind, trigger, occasion, outcome, detail],
    )?;
    Ok(())
}

pub(super) fn get(connection: &Connection, kind: &str, name: &str) -> Result<Option<TriggerRecord>> {
    query_first(
        connection,
        "reading a trigger",
        &format!("SELECT {TRIGGER_COLUMNS} FROM triggers WHERE kind = ?1 AND name = ?2"),
        params![kind, name],
        decode_trigger,
    )
}

pub(super) fn list(connection: &Connection, kind: &str, tenant: Option<&str>) -> Result<Vec<TriggerRecord>> {
    query_all(
        connection,
        "listing triggers",
        &format!(
            "SELECT {TRIGGER_COLUMNS} FROM triggers WHERE kind = ?1 AND (?2 IS NULL OR tenant = ?2) ORDER BY name"
        ),
        params![kind, tenant],
        decode_trigger,
    )
}

pub(super) fn fires(
    connection: &Connection,
    kind: &str,
    trigger: &str,
    limit: usize,
) -> Result<Vec<FireRecord>> {
    query_all(
        connection,
        "listing a trigger's fires",
        &format!(
            "SELECT {FIRE_COLUMNS} FROM trigger_fires WHERE kind = ?1 AND trigger = ?2 \
             ORDER BY at_ms DESC, occasion DESC LIMIT ?3"
        ),
        params![kind, trigger, i64::try_from(limit).unwrap_or(i64::MAX)],
        decode_fire,
    )
}

pub(super) fn unstarted(connection: &Connection, kind: &str) -> Result<Vec<FireRecord>> {
    query_all(
        connection,
        "listing fires whose run was never created",
        "SELECT f.kind, f.trigger, f.occasion, f.tenant, f.at_ms, f.run_id, f.outcome, f.detail, f.fired_at_ms \
         FROM trigger_fires f LEFT JOIN runs r ON r.id = f.run_id \
         WHERE f.kind = ?1 AND f.outcome = 'fired' AND f.run_id IS NOT NULL AND r.id IS NULL \
         ORDER BY f.at_ms, f.occasion",
        params![kind],
        decode_fire,
    )
}

pub(super) fn decode_trigger(row: &Row<'_>) -> Result<TriggerRecord> {
    let read = |error: rusqlite::Error| Error::Corrupt(format!("a trigger row: {error}"));
    let spec: String = row.get(3).map_err(read)?;
    let since: i64 = row.get(5).map_err(read)?;
    let created: i64 = row.get(6).map_err(read)?;
    Ok(TriggerRecord {
        kind: row.get(0).map_err(read)?,
        name: row.get(1).map_err(read)?,
        tenant: row.get(2).map_err(read)?,
        spec: serde_json::from_str(&spec)
            .map_err(|error| Error::Corrupt(format!("column spec of a trigger: {error}")))?,
        paused: row.get(4).map_err(read)?,
        since_ms: u64::try_from(since).unwrap_or(0),
        created_at_ms: u64::try_from(created).unwrap_or(0),
    })
}

pub(super) fn decode_fire(row: &Row<'_>) -> Result<FireRecord> {
    let read = |error: rusqlite::Error| Error::Corrupt(format!("a trigger fire row: {error}"));
    let at: i64 = row.get(4).map_err(read)?;
    let fired: i64 = row.get(8).map_err(read)?;
    let run_id: Option<String> = row.get(5).map_err(read)?;
    Ok(FireRecord {
        kind: row.get(0).map_err(read)?,
        trigger: row.get(1).map_err(read)?,
        occasion: row.get(2).map_err(read)?,
        tenant: row.get(3).map_err(read)?,
        at_ms: u64::try_from(at).unwrap_or(0),
        run_id: run_id
            .map(|id| RunId::parse(&id).map_err(|error| Error::Corrupt(format!("run id of a fire: {error}"))))
            .transpose()?,
        outcome: row.get(6).map_err(read)?,
        detail: row.get(7).map_err(read)?,
        fired_at_ms: u64::try_from(fired).unwrap_or(0),
    })
}
