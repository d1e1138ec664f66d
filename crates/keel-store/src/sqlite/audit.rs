//! The audit log on SQLite: appending to the hash chain (in the writer thread, which is
//! what makes the chain linear), listing, and verifying the chain against `audit_head`.

use keel_core::audit::{GENESIS, entry_hash};
use keel_types::RunId;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::queries::seq_param;
use super::writer::sql_error;
use crate::audit::AuditWalk;
use crate::{AuditEntry, AuditFilter, AuditRecord, AuditVerify, Error, Result, Seq};

/// An `AuditRecord` with its JSON prepared by the caller, so the writer thread only
/// hashes short strings and runs SQL.
pub(super) struct EncodedAudit {
    pub(super) record: AuditRecord,
    /// `record.detail` as JSON text.
    pub(super) detail: String,
    /// `record.canonical_json()`, what the hash covers.
    pub(super) canonical: String,
}

impl EncodedAudit {
    pub(super) fn of(record: AuditRecord) -> EncodedAudit {
        EncodedAudit { detail: record.detail.to_string(), canonical: record.canonical_json(), record }
    }
}

const COLUMNS: &str = "seq, tenant, run_id, at_ms, actor, action, subject, outcome, detail, prev_hash, hash";

/// The stored head: the last seq and its hash, `None` before the first append.
fn head(connection: &Connection) -> Result<Option<(Seq, String)>> {
    connection
        .prepare_cached("SELECT seq, hash FROM audit_head WHERE id = 0")
        .and_then(|mut statement| {
            statement.query_row([], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))).optional()
        })
        .map_err(sql_error("reading the audit head"))
        .map(|head| head.map(|(seq, hash)| (u64::try_from(seq).unwrap_or(0), hash)))
}

/// Appends `records` after the current head and moves the head, inside the caller's
/// transaction (the writer's savepoint). Only the writer thread calls it, so reading the
/// head and writing after it cannot race.
pub(super) fn append(connection: &Connection, records: Vec<EncodedAudit>) -> Result<Vec<Seq>> {
    let (mut seq, mut prev) = head(connection)?.unwrap_or((0, GENESIS.to_owned()));
    let mut seqs = Vec::with_capacity(records.len());
    if records.is_empty() {
        return Ok(seqs);
    }
    let mut insert = connection
        .prepare_cached(&format!(
            "INSERT INTO audit ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ))
        .map_err(sql_error("preparing an audit insert"))?;
    for encoded in records {
        seq += 1;
        let hash = entry_hash(&prev, seq, &encoded.canonical);
        let record = &encoded.record;
        insert
            .execute(params![
                seq_param(seq),
                record.tenant,
                record.run_id.as_ref().map(RunId::as_str),
                seq_param(record.at_ms),
                record.actor,
                record.action,
                record.subject,
                record.outcome,
                encoded.detail,
                prev,
                hash,
            ])
            .map_err(sql_error("inserting an audit entry"))?;
        seqs.push(seq);
        prev = hash;
    }
    set_head(connection, seq, &prev)?;
    Ok(seqs)
}

/// Moves the head to entry `seq` with hash `hash`, inside the caller's transaction.
pub(super) fn set_head(connection: &Connection, seq: Seq, hash: &str) -> Result<()> {
    connection
        .prepare_cached(
            "INSERT INTO audit_head (id, seq, hash) VALUES (0, ?1, ?2) \
             ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
        )
        .and_then(|mut statement| statement.execute(params![seq_param(seq), hash]))
        .map_err(sql_error("moving the audit head"))?;
    Ok(())
}

/// Inserts an entry of a dump as it is, hashes included (restore: the chain is copied,
/// not recomputed, so a copy verifies to the same head). The caller moves the head.
pub(super) fn insert_entry(connection: &Connection, entry: &AuditEntry) -> Result<()> {
    let record = &entry.record;
    connection
        .prepare_cached(&format!(
            "INSERT INTO audit ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ))
        .and_then(|mut statement| {
            statement.execute(params![
                seq_param(entry.seq),
                record.tenant,
                record.run_id.as_ref().map(RunId::as_str),
                seq_param(record.at_ms),
                record.actor,
                record.action,
                record.subject,
                record.outcome,
                record.detail.to_string(),
                entry.prev_hash,
                entry.hash,
            ])
        })
        .map_err(sql_error("restoring an audit entry"))?;
    Ok(())
}

pub(super) fn list(connection: &Connection, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    // SQLite reads a negative LIMIT as "no limit".
    let limit = filter.limit.map_or(-1, i64::from);
    let mut statement = connection
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM audit WHERE seq > ?1 AND (?2 IS NULL OR tenant = ?2) \
             AND (?3 IS NULL OR run_id = ?3) ORDER BY seq LIMIT ?4"
        ))
        .map_err(sql_error("listing audit entries"))?;
    let mut rows = statement
        .query(params![
            seq_param(filter.after_seq),
            filter.tenant,
            filter.run_id.as_ref().map(RunId::as_str),
            limit
        ])
        .map_err(sql_error("listing audit entries"))?;
    let mut entries = Vec::new();
    while let Some(row) = rows.next().map_err(sql_error("listing audit entries"))? {
        entries.push(decode(row).map_err(Error::Corrupt)?);
    }
    Ok(entries)
}

/// Walks the chain in seq order, one row at a time, and stops at the first break (the
/// checks are `crate::audit::AuditWalk`'s).
pub(super) fn verify(connection: &Connection) -> Result<AuditVerify> {
    let head = head(connection)?;
    let mut statement = connection
        .prepare_cached(&format!("SELECT {COLUMNS} FROM audit ORDER BY seq"))
        .map_err(sql_error("reading the audit log"))?;
    let mut rows = statement.query([]).map_err(sql_error("reading the audit log"))?;
    let mut walk = AuditWalk::default();
    while let Some(row) = rows.next().map_err(sql_error("reading the audit log"))? {
        let seq = row.get::<_, i64>("seq").map_err(sql_error("reading an audit seq"))?;
        if let Err(verdict) = walk.check(seq, || decode(row)) {
            return Ok(verdict);
        }
    }
    Ok(walk.finish(head))
}

/// Decodes a row; a value that cannot be read is described in words (corrupt data for
/// `list`, a break for `verify`).
fn decode(row: &Row<'_>) -> std::result::Result<AuditEntry, String> {
    fn get<T: rusqlite::types::FromSql>(row: &Row<'_>, name: &str) -> std::result::Result<T, String> {
        row.get(name).map_err(|error| format!("column {name} of an audit entry: {error}"))
    }
    let seq: i64 = get(row, "seq")?;
    let place =
        |name: &str, error: &dyn std::fmt::Display| format!("column {name} of audit entry {seq}: {error}");
    let run_id: Option<String> = get(row, "run_id")?;
    let run_id =
        run_id.map(|text| RunId::parse(&text).map_err(|error| place("run_id", &error))).transpose()?;
    let at_ms: i64 = get(row, "at_ms")?;
    let detail: String = get(row, "detail")?;
    Ok(AuditEntry {
        seq: u64::try_from(seq).map_err(|error| place("seq", &error))?,
        record: AuditRecord {
            tenant: get(row, "tenant")?,
            run_id,
            at_ms: u64::try_from(at_ms).map_err(|error| place("at_ms", &error))?,
            actor: get(row, "actor")?,
            action: get(row, "action")?,
            subject: get(row, "subject")?,
            outcome: get(row, "outcome")?,
            detail: serde_json::from_str(&detail).map_err(|error| place("detail", &error))?,
        },
        prev_hash: get(row, "prev_hash")?,
        hash: get(row, "hash")?,
    })
}
