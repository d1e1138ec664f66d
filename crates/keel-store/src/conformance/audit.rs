//! Conformance checks of the audit log: appends form one hash chain, list filters, and
//! verify finds the chain intact.

use std::sync::Arc;

use keel_types::RunId;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{Must, fresh_run, join_all, now_ms};
use crate::{AuditFilter, AuditRecord, Seq, Store};

fn audit_record(
    tenant: &str,
    run: Option<&RunId>,
    action: &str,
    outcome: &str,
    detail: Value,
) -> AuditRecord {
    AuditRecord {
        tenant: tenant.to_owned(),
        run_id: run.cloned(),
        at_ms: now_ms(),
        actor: "kernel".to_owned(),
        action: action.to_owned(),
        subject: "example.com".to_owned(),
        outcome: outcome.to_owned(),
        detail,
    }
}

/// Audit appends get dense seqs in order, each entry links to the one before it with the
/// documented hash, list filters by tenant, run, seq and limit, reads back every field
/// exactly, and verify finds the chain intact with the last entry's hash as its head.
pub async fn audit_append_list_filter_and_verify(store: &dyn Store) {
    let tenant = format!("audit-{}", RunId::generate(now_ms()));
    let run = fresh_run(store).await;
    let other_run = RunId::generate(now_ms());
    let records = vec![
        audit_record(&tenant, Some(&run), "egress", "allowed", json!({"port": 443, "n": 1.5})),
        audit_record(&tenant, Some(&run), "egress", "denied", json!({"reason": "not allowed"})),
        audit_record(&tenant, Some(&other_run), "tool.call", "ok", json!(null)),
        audit_record(
            &tenant,
            None,
            "approval.granted",
            "allowed",
            json!({"nested": {"b": [1, 2], "a": "x"}}),
        ),
    ];
    let seqs = store.audit_append(records.clone()).await.must("audit_append");
    assert_eq!(seqs.len(), 4, "store conformance: audit_append returns one seq per record");
    assert!(
        seqs.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "store conformance: one append's seqs are dense: {seqs:?}"
    );
    assert!(store.audit_append(Vec::new()).await.must("audit_append (none)").is_empty());
    let more = store
        .audit_append(vec![audit_record("other-tenant", Some(&run), "egress", "allowed", json!({}))])
        .await
        .must("audit_append (another tenant)");
    assert_eq!(more, vec![seqs[3] + 1], "store conformance: a later append continues the seqs");

    let filter = AuditFilter { tenant: Some(tenant.clone()), ..AuditFilter::default() };
    let listed = store.audit_list(&filter).await.must("audit_list by tenant");
    assert_eq!(listed.len(), 4, "store conformance: audit_list by tenant");
    for (entry, (record, seq)) in listed.iter().zip(records.iter().zip(&seqs)) {
        assert_eq!(entry.seq, *seq, "store conformance: audit entry seq");
        assert_eq!(&entry.record, record, "store conformance: an audit record reads back exactly");
        let expected = keel_core::audit::entry_hash(&entry.prev_hash, entry.seq, &record.canonical_json());
        assert_eq!(entry.hash, expected, "store conformance: an audit hash covers prev, seq and record");
    }
    for pair in listed.windows(2) {
        assert_eq!(
            pair[1].prev_hash, pair[0].hash,
            "store conformance: each audit entry links to the previous"
        );
    }

    let by_run = AuditFilter { run_id: Some(run.clone()), ..AuditFilter::default() };
    let by_run: Vec<Seq> =
        store.audit_list(&by_run).await.must("audit_list by run").iter().map(|entry| entry.seq).collect();
    assert_eq!(by_run, vec![seqs[0], seqs[1], more[0]], "store conformance: audit_list by run, all tenants");
    let paged =
        AuditFilter { tenant: Some(tenant.clone()), after_seq: seqs[0], limit: Some(2), run_id: None };
    let paged: Vec<Seq> =
        store.audit_list(&paged).await.must("audit_list paged").iter().map(|entry| entry.seq).collect();
    assert_eq!(paged, vec![seqs[1], seqs[2]], "store conformance: audit_list after a seq, limited");

    let verified = store.audit_verify().await.must("audit_verify");
    assert_eq!(verified.broken, None, "store conformance: a clean audit chain verifies");
    assert!(verified.entries >= more[0], "store conformance: verify checks every entry");
    let everything = AuditFilter { after_seq: verified.entries - 1, ..AuditFilter::default() };
    let last = store.audit_list(&everything).await.must("audit_list (last)");
    assert_eq!(
        Some(&verified.head_hash),
        last.last().map(|entry| &entry.hash),
        "store conformance: verify reports the last entry's hash as the head"
    );
}

/// Appends racing from many tasks still form one linear chain.
pub async fn concurrent_audit_appends_form_one_chain(store: Arc<dyn Store>) {
    let tenant = format!("audit-race-{}", RunId::generate(now_ms()));
    let tasks: Vec<JoinHandle<Vec<Seq>>> = (0..16)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenant = tenant.clone();
            tokio::spawn(async move {
                let records =
                    (0..3).map(|j| audit_record(&tenant, None, "egress", "allowed", json!([i, j]))).collect();
                store.audit_append(records).await.must("audit_append (concurrent)")
            })
        })
        .collect();
    let mut seqs: Vec<Seq> = join_all(tasks).await.into_iter().flatten().collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 48, "store conformance: concurrent audit appends get distinct seqs");
    let verified = store.audit_verify().await.must("audit_verify (after concurrent appends)");
    assert_eq!(verified.broken, None, "store conformance: concurrent audit appends form one chain");
}
