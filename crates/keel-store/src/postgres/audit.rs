//! The audit log on Postgres: appending to the hash chain under the `audit_head` row lock
//! (which is what makes the chain linear when appends race), listing, and verifying the
//! chain against the head in one snapshot.

use deadpool_postgres::{GenericClient, Object, Transaction};
use keel_core::audit::{GENESIS, entry_hash};
use keel_types::RunId;
use tokio_postgres::{IsolationLevel, Row};

use super::queries::{count, execute, query_opt, query_rows};
use super::{int, pg_error};
use crate::audit::AuditWalk;
use crate::{AuditEntry, AuditFilter, AuditRecord, AuditVerify, Error, Result, Seq};

pub(super) const COLUMNS: &str =
    "seq, tenant, run_id, at_ms, actor, action, subject, outcome, detail, prev_hash, hash";

/// How many rows a verify reads per round trip: the walk streams, it never holds the log.
const VERIFY_PAGE: i32 = 1000;

/// Appends `records` after the current head and moves the head, in the caller's
/// transaction. The head row is locked (`FOR UPDATE`) before it is read, so a concurrent
/// append waits until this one commits and then chains after it: seqs stay dense and each
/// entry links to the one before.
pub(super) async fn append(transaction: &Transaction<'_>, records: &[AuditRecord]) -> Result<Vec<Seq>> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    // The head row exists from the first append on; creating it first means there is
    // always a row to lock. The same statement sets the transaction to commit without
    // waiting for the flush, as events do (`Store::audit_append`): no round trip of its own.
    execute(
        transaction,
        "creating the audit head",
        "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true)) \
         INSERT INTO audit_head (id, seq, hash) SELECT 0, 0, $1 FROM unflushed ON CONFLICT (id) DO NOTHING",
        &[&GENESIS],
    )
    .await?;
    let head = query_opt(
        transaction,
        "locking the audit head",
        "SELECT seq, hash FROM audit_head WHERE id = 0 FOR UPDATE",
        &[],
    )
    .await?
    .ok_or_else(|| Error::Corrupt("the audit head vanished while it was locked".to_owned()))?;
    let mut seq = count(&head, "seq", "the audit head")?;
    let mut prev: String = super::queries::column(&head, "hash", "the audit head")?;
    let mut columns = AuditColumns::default();
    let mut seqs = Vec::with_capacity(records.len());
    for record in records {
        seq += 1;
        let hash = entry_hash(&prev, seq, &record.canonical_json());
        columns.push(seq, record, &prev, &hash);
        seqs.push(seq);
        prev = hash;
    }
    columns.insert(transaction).await?;
    execute(
        transaction,
        "moving the audit head",
        "UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 0",
        &[&int(seq), &prev],
    )
    .await?;
    Ok(seqs)
}

/// Audit entries as columns, to insert many in one statement.
#[derive(Default)]
pub(super) struct AuditColumns {
    seq: Vec<i64>,
    tenant: Vec<String>,
    run_id: Vec<Option<String>>,
    at_ms: Vec<i64>,
    actor: Vec<String>,
    action: Vec<String>,
    subject: Vec<String>,
    outcome: Vec<String>,
    detail: Vec<String>,
    prev_hash: Vec<String>,
    hash: Vec<String>,
}

impl AuditColumns {
    pub(super) fn push(&mut self, seq: Seq, record: &AuditRecord, prev_hash: &str, hash: &str) {
        self.seq.push(int(seq));
        self.tenant.push(record.tenant.clone());
        self.run_id.push(record.run_id.as_ref().map(|run| run.as_str().to_owned()));
        self.at_ms.push(int(record.at_ms));
        self.actor.push(record.actor.clone());
        self.action.push(record.action.clone());
        self.subject.push(record.subject.clone());
        self.outcome.push(record.outcome.clone());
        self.detail.push(record.detail.to_string());
        self.prev_hash.push(prev_hash.to_owned());
        self.hash.push(hash.to_owned());
    }

    pub(super) async fn insert(&self, client: &impl GenericClient) -> Result<()> {
        if self.seq.is_empty() {
            return Ok(());
        }
        execute(
            client,
            "inserting audit entries",
            &format!(
                "INSERT INTO audit ({COLUMNS}) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], \
                 $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[])"
            ),
            &[
                &self.seq,
                &self.tenant,
                &self.run_id,
                &self.at_ms,
                &self.actor,
                &self.action,
                &self.subject,
                &self.outcome,
                &self.detail,
                &self.prev_hash,
                &self.hash,
            ],
        )
        .await?;
        Ok(())
    }
}

pub(super) async fn list(client: &impl GenericClient, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let rows = query_rows(
        client,
        "listing audit entries",
        &format!(
            "SELECT {COLUMNS} FROM audit WHERE seq > $1 AND ($2::text IS NULL OR tenant = $2) \
             AND ($3::text IS NULL OR run_id = $3) ORDER BY seq LIMIT $4"
        ),
        &[
            &int(filter.after_seq),
            &filter.tenant,
            &filter.run_id.as_ref().map(RunId::as_str),
            &filter.limit.map(i64::from),
        ],
    )
    .await?;
    rows.iter().map(|row| decode(row).map_err(Error::Corrupt)).collect()
}

/// Walks the chain in seq order, a page at a time through a portal, inside one
/// repeatable-read transaction: the rows and the head are one snapshot, so an append
/// committed meanwhile is not taken for tampering.
pub(super) async fn verify(client: &mut Object) -> Result<AuditVerify> {
    let transaction = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_error("beginning a read of the audit log"))?;
    let head = query_opt(
        &transaction,
        "reading the audit head",
        "SELECT seq, hash FROM audit_head WHERE id = 0",
        &[],
    )
    .await?
    .map(|row| -> Result<(Seq, String)> {
        Ok((count(&row, "seq", "the audit head")?, super::queries::column(&row, "hash", "the audit head")?))
    })
    .transpose()?;
    let statement = transaction
        .prepare_cached(&format!("SELECT {COLUMNS} FROM audit ORDER BY seq"))
        .await
        .map_err(pg_error("reading the audit log"))?;
    let portal = transaction.bind(&statement, &[]).await.map_err(pg_error("reading the audit log"))?;
    let mut walk = AuditWalk::default();
    loop {
        let rows = transaction
            .query_portal(&portal, VERIFY_PAGE)
            .await
            .map_err(pg_error("reading the audit log"))?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let seq: i64 = row.try_get("seq").map_err(pg_error("reading an audit seq"))?;
            if let Err(verdict) = walk.check(seq, || decode(row)) {
                return Ok(verdict);
            }
        }
    }
    Ok(walk.finish(head))
}

/// Decodes a row; a value that cannot be read is described in words (corrupt data for
/// `list`, a break for `verify`).
pub(super) fn decode(row: &Row) -> std::result::Result<AuditEntry, String> {
    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        row: &'a Row,
        name: &str,
    ) -> std::result::Result<T, String> {
        row.try_get(name).map_err(|error| format!("column {name} of an audit entry: {error}"))
    }
    let seq: i64 = get(row, "seq")?;
    let place =
        |name: &str, error: &dyn std::fmt::Display| format!("column {name} of audit entry {seq}: {error}");
    let run_id: Option<&str> = get(row, "run_id")?;
    let run_id =
        run_id.map(|text| RunId::parse(text).map_err(|error| place("run_id", &error))).transpose()?;
    let at_ms: i64 = get(row, "at_ms")?;
    let detail: &str = get(row, "detail")?;
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
            detail: serde_json::from_str(detail).map_err(|error| place("detail", &error))?,
        },
        prev_hash: get(row, "prev_hash")?,
        hash: get(row, "hash")?,
    })
}
