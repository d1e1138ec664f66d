//! Conversions from the kernel's records to the HTTP API's views (`keel_protocol::api`).

use keel_protocol::api::{EventView, JournalEntryView, RunView, UsageView};
use keel_protocol::rpc::HumanAskParams;
use keel_store::{EventRecord, JournalEntry, RunRecord};
use keel_types::Usage;

use crate::run::RunSpec;

pub fn usage(usage: &Usage) -> UsageView {
    UsageView {
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        llm_calls: usage.llm_calls,
        tool_calls: usage.tool_calls,
        cost_usd: usage.cost_usd(),
    }
}

pub fn run(record: &RunRecord, spec: Option<&RunSpec>, question: Option<HumanAskParams>) -> RunView {
    let (question, question_form) = match question {
        Some(ask) => (Some(ask.question), ask.form),
        None => (None, None),
    };
    RunView {
        run_id: record.id.to_string(),
        tenant: record.tenant.clone(),
        state: record.state.as_str().to_owned(),
        wait_reason: record.wait_reason.map(|r| r.as_str().to_owned()),
        command: spec.map(|spec| spec.command.clone()).unwrap_or_default(),
        created_at: record.created_at_ms,
        updated_at: record.updated_at_ms,
        ended_at: record.ended_at_ms,
        attempt: record.attempt,
        pid: record.pid,
        exit_code: record.exit_code,
        output: record.output.clone(),
        error: record.error.clone(),
        usage: usage(&record.usage),
        provider_calls: record.provider_calls,
        question,
        question_form,
        // Filled in by `Kernel::views`, which reads what they need for a whole listing at once.
        budget: None,
        reason: None,
        started_by: spec.and_then(|spec| spec.trigger.clone()),
        parent: spec.and_then(|spec| spec.parent.as_ref()).map(ToString::to_string),
        swapped: crate::swap::is_swapped(record),
    }
}

pub fn journal_entry(entry: &JournalEntry) -> JournalEntryView {
    JournalEntryView {
        seq: entry.seq,
        method: entry.method.clone(),
        status: entry.status.as_str().to_owned(),
        params_digest: entry.params_hash.chars().take(16).collect(),
        params: entry.params.clone(),
        result: entry.result.clone(),
        error: entry.error.clone(),
        attempt: entry.attempt,
        started_at: entry.started_at_ms,
        finished_at: entry.finished_at_ms,
        duration_ms: entry.finished_at_ms.map(|f| f.saturating_sub(entry.started_at_ms)),
        usage: usage(&entry.usage),
    }
}

pub fn event(record: EventRecord) -> EventView {
    EventView { seq: record.seq, ts: record.ts_ms, kind: record.kind, data: record.data }
}

pub fn audit_entry(entry: &keel_store::AuditEntry) -> keel_protocol::api::AuditEntryView {
    let record = &entry.record;
    keel_protocol::api::AuditEntryView {
        seq: entry.seq,
        at: record.at_ms,
        tenant: record.tenant.clone(),
        run_id: record.run_id.as_ref().map(ToString::to_string),
        actor: record.actor.clone(),
        action: record.action.clone(),
        subject: record.subject.clone(),
        outcome: record.outcome.clone(),
        detail: record.detail.clone(),
        prev_hash: entry.prev_hash.clone(),
        hash: entry.hash.clone(),
    }
}

pub fn audit_verify(verified: &keel_store::AuditVerify) -> keel_protocol::api::AuditVerifyView {
    keel_protocol::api::AuditVerifyView {
        ok: verified.broken.is_none(),
        entries: verified.entries,
        head_hash: verified.head_hash.clone(),
        broken_at: verified.broken.as_ref().map(|broken| broken.seq),
        reason: verified.broken.as_ref().map(|broken| broken.reason.clone()),
    }
}
