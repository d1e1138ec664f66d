//! The Store conformance suite: backend-independent checks of the `Store` contract, run
//! by every backend's tests through `run_all`. A violated property panics with a message
//! that names it.
//!
//! Every check makes its own runs (`RunId::generate`) and kv scopes, so the checks can
//! share one store, and a store that already holds data (an earlier suite run, other
//! tests) does not disturb them. The blob-size check reads global `stats()`, so the suite
//! expects no other writer to be storing payloads at the same moment.
//!
//! The suite needs a tokio runtime (the concurrency checks spawn tasks); any flavor works.
//!
//! It is compiled only with the `conformance` feature, so product builds do not carry it;
//! keel-store's own tests turn the feature on through a dev-dependency on the crate itself.
//! The checks live in one module per concern; this one runs them all and holds the
//! helpers they share.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use keel_types::{EntryStatus, RunId, RunState, Usage};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::{Completion, NewEntry, NewRun, Result, RunRecord, Store};

/// Panics naming the operation unless the result is `Err` matching the pattern.
macro_rules! expect_error {
    ($result:expr, $pattern:pat $(if $guard:expr)?, $what:expr $(,)?) => {
        match $result {
            Err($pattern) $(if $guard)? => {}
            other => panic!(
                "store conformance: {}: expected Err({}), got {:?}",
                $what,
                stringify!($pattern),
                other
            ),
        }
    };
}

// Declared after `expect_error!`, so that the macro is in scope in each of them.
mod audit;
mod console;
mod dump;
mod journal;
mod mailboxes;
mod memory;
mod payloads;
mod runs;
mod tenants;
mod triggers;

pub use audit::*;
pub use console::*;
pub use dump::*;
pub use journal::*;
pub use mailboxes::*;
pub use memory::*;
pub use payloads::*;
pub use runs::*;
pub use tenants::*;
pub use triggers::*;

/// Runs every check of one store, one after the other, against `store`. The check of
/// two stores, `dump_and_restore`, is run apart: it needs an empty target.
pub async fn run_all(store: Arc<dyn Store>) {
    runs_create_get_list(&*store).await;
    runs_reject_duplicate_ids(&*store).await;
    runs_update_patches_every_field(&*store).await;
    runs_compare_and_set(&*store).await;
    journal_append_and_complete(&*store).await;
    journal_usage_totals(&*store).await;
    journal_complete_with_entries(&*store).await;
    journal_abandon_entries(&*store).await;
    journal_paging(&*store).await;
    journal_latest_entry(&*store).await;
    blobs_store_each_payload_once(&*store).await;
    blobs_store_each_message_once(&*store).await;
    params_read_back_exactly(&*store).await;
    events_append_and_page(&*store).await;
    kv_put_get_and_scopes(&*store).await;
    kv_put_unflushed_reads_back_like_kv_put(&*store).await;
    kv_chain_follows_links_in_one_scope(&*store).await;
    kv_get_many_answers_each_pair_in_order(&*store).await;
    unknown_runs_are_errors(&*store).await;
    threads_append_read_and_window(&*store).await;
    threads_idempotent_append_and_blobs(&*store).await;
    memory_put_get_delete_and_scopes(&*store).await;
    memory_search_ranks_and_scopes(&*store).await;
    memory_semantic_and_hybrid_search(&*store).await;
    mailbox_send_receive_in_order(&*store).await;
    mailbox_is_bounded(&*store).await;
    mailbox_idempotent_send_and_receive(&*store).await;
    mailbox_is_tenant_scoped(&*store).await;
    mailbox_writes_journaled_with_their_entry(&*store).await;
    mailbox_receive_takes_many(&*store).await;
    mailbox_send_completes_a_waiting_receive(&*store).await;
    topics_publish_to_live_subscribers_all_or_nothing(&*store).await;
    audit_append_list_filter_and_verify(&*store).await;
    concurrent_audit_appends_form_one_chain(Arc::clone(&store)).await;
    tenants_create_get_list(&*store).await;
    tokens_create_lookup_list_revoke(&*store).await;
    runs_list_by_tenant(&*store).await;
    triggers_create_list_pause_delete(&*store).await;
    trigger_fires_are_recorded_once(Arc::clone(&store)).await;
    triggers_update_keeps_fires_and_pause(&*store).await;
    runs_ended_after_pages_in_end_order(&*store).await;
    runs_list_sorted_searched_and_paged(&*store).await;
    costs_summed_by_bucket_tenant_and_model(&*store).await;
    runs_counted_by_tenant_and_state(&*store).await;
    concurrent_thread_appends(Arc::clone(&store)).await;
    concurrent_mailbox_receives(Arc::clone(&store)).await;
    concurrent_appends_to_one_run(Arc::clone(&store)).await;
    concurrent_appends_to_many_runs(Arc::clone(&store)).await;
    failed_writes_do_not_disturb_concurrent_ones(Arc::clone(&store)).await;
}

/// `Ok` or a panic naming the operation: the suite's way to say "this must succeed".
trait Must<T> {
    fn must(self, what: &str) -> T;
}

impl<T> Must<T> for Result<T> {
    #[track_caller]
    fn must(self, what: &str) -> T {
        match self {
            Ok(value) => value,
            Err(error) => panic!("store conformance: {what} failed: {error}"),
        }
    }
}

trait ExpectRun {
    fn expect_run(self, id: &RunId) -> RunRecord;
}

impl ExpectRun for Option<RunRecord> {
    #[track_caller]
    fn expect_run(self, id: &RunId) -> RunRecord {
        self.unwrap_or_else(|| panic!("store conformance: run {id} was written but get_run finds nothing"))
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

fn new_run(created_at_ms: u64, state: RunState) -> NewRun {
    NewRun {
        id: RunId::generate(created_at_ms),
        tenant: "conformance".to_owned(),
        spec: json!({"command": ["python3", "agent.py"], "env": {"MODE": "test"}}),
        state,
        created_at_ms,
    }
}

async fn fresh_run(store: &dyn Store) -> RunId {
    store.create_run(new_run(now_ms(), RunState::Created)).await.must("create_run").id
}

fn usage(
    input_tokens: u64,
    output_tokens: u64,
    llm_calls: u64,
    tool_calls: u64,
    cost_micro_usd: u64,
) -> Usage {
    Usage { input_tokens, output_tokens, llm_calls, tool_calls, cost_micro_usd }
}

/// An intent: the entry written before an effect.
fn pending_entry(method: &str, params: Value) -> NewEntry {
    NewEntry {
        method: method.to_owned(),
        params_hash: format!("{method}:{params}"),
        params,
        status: EntryStatus::Pending,
        result: None,
        error: None,
        attempt: 1,
        started_at_ms: 1_700_000_000_000,
        finished_at_ms: None,
        usage: Usage::default(),
    }
}

/// An entry complete at once, ok (with a result) or error (with an error).
fn complete_entry(method: &str, params: Value, status: EntryStatus, usage: Usage) -> NewEntry {
    let outcome = json!({"for": method});
    NewEntry {
        result: (status == EntryStatus::Ok).then(|| outcome.clone()),
        error: (status == EntryStatus::Error).then_some(outcome),
        finished_at_ms: Some(1_700_000_000_002),
        usage,
        status,
        attempt: 2,
        ..pending_entry(method, params)
    }
}

fn ok_completion(result: Value, usage: Usage, provider_served: bool) -> Completion {
    Completion {
        status: EntryStatus::Ok,
        result: Some(result),
        error: None,
        finished_at_ms: 1_700_000_000_001,
        usage,
        provider_served,
    }
}

/// Awaits every task in order, re-raising a task's panic so its message reaches the test.
async fn join_all<T: Debug>(tasks: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        match task.await {
            Ok(output) => outputs.push(output),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("store conformance: a spawned task was cancelled: {error}"),
        }
    }
    outputs
}
