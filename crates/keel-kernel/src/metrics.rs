//! Prometheus metrics (`GET /metrics`): the registry of instruments recorded where things
//! happen (dispatch, the journal, LLM calls, launches), and the gauges read at scrape time
//! from a [`Snapshot`] (runs by state from the store, queues, slots, the sandbox pool, the
//! audit writer). Rendered in the OpenMetrics text format through the Prometheus
//! project's own client crate (`prometheus-client`).
//!
//! Labels are low-cardinality by construction: tenants, providers, models, methods,
//! states, reasons and error classes, never a run id or a call id. A syscall method is a
//! label only if protocol 1 has it (anything else counts as `unknown`), so an agent
//! cannot grow the label space by calling made-up methods.
//!
//! Recording is cheap: a syscall looks its histogram up in a map built at start (no lock,
//! no allocation) and observes one value; counters are atomics. A served LLM call finds its
//! five series (calls, tokens both ways, cost, queue wait) with one lookup of its
//! `tenant/provider/model` in a map of handles filled on first use; only that first use
//! goes through the labelled families.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use keel_store::RunCount;
use keel_types::{RunState, Usage, WaitReason};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

/// The two text formats a scrape may ask for (by its `Accept` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 (what Prometheus asks for first): counters named without their
    /// `_total` in `TYPE` lines, `# UNIT` lines, and `# EOF` at the end.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (what other scrapers and parsers read): the same
    /// samples, counters typed under their `_total` name, no `UNIT` or `EOF` lines.
    Prometheus,
}

impl Format {
    /// OpenMetrics when `accept` (an HTTP `Accept` header) names it, else the Prometheus
    /// text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The Prometheus text format of an OpenMetrics exposition (see [`Format`]).
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match described {
            Some(renamed) => text.push_str(&renamed),
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

/// The method label of a syscall protocol 1 does not have.
const UNKNOWN_METHOD: &str = "unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LlmLabels {
    tenant: String,
    provider: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EmbeddingLabels {
    tenant: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    provider: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpawnLabels {
    tier: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    tenant: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Which journal write a commit latency is of.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JournalOp {
    /// An entry appended (an intent, or a call journaled complete).
    Append,
    /// A pending entry's result recorded.
    Complete,
}

/// Observes the time from its creation to its drop into a histogram.
pub(crate) struct Timer<'a> {
    histogram: &'a Histogram,
    started: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// What a scrape reads at the moment it is made (see [`Metrics::render`]).
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The store's run counts (`Store::count_runs`).
    pub(crate) runs: Vec<RunCount>,
    /// LLM calls waiting for their provider's capacity: (provider, model) of each.
    pub(crate) llm_waiting: Vec<(String, String)>,
    /// Runs holding a live slot of this kernel's admission control.
    pub(crate) live_slots_used: usize,
    /// The most live slots this kernel has, when a cap is set.
    pub(crate) live_slots_cap: Option<u32>,
    /// Runs waiting in this kernel's admission queue for a slot.
    pub(crate) admission_queue: usize,
    /// Ready-built sandboxes in the pool.
    pub(crate) sandbox_pool_ready: usize,
    /// Audit records queued but not yet written.
    pub(crate) audit_pending: u64,
    /// How long the oldest of them has waited.
    pub(crate) audit_oldest_pending: Option<Duration>,
}

/// The kernel's instruments (see the module doc). One per kernel, in `Inner`.
pub(crate) struct Metrics {
    registry: Registry,
    syscalls: HashMap<&'static str, Histogram>,
    unknown_syscall: Histogram,
    llm_calls: Family<LlmLabels, Counter>,
    llm_input_tokens: Family<LlmLabels, Counter>,
    llm_output_tokens: Family<LlmLabels, Counter>,
    llm_cost: Family<LlmLabels, Counter<f64, AtomicU64>>,
    llm_errors: Family<ClassLabels, Counter>,
    llm_queue_wait: Family<RouteLabels, Histogram>,
    /// The series of each `tenant/provider/model` served so far, by that key (neither a
    /// tenant nor a provider name has a `/`, so the key is unambiguous): one lookup a served
    /// call instead of five through the families, each hashing its labels' three strings
    /// (with the labels built, 1% of a gateway call's instructions).
    llm_series: RwLock<HashMap<String, LlmSeries>>,
    embedding_calls: Family<EmbeddingLabels, Counter>,
    embedding_input_tokens: Family<EmbeddingLabels, Counter>,
    journal_append: Histogram,
    journal_complete: Histogram,
    sandbox_spawn: Family<SpawnLabels, Histogram>,
    runs_recovered: Counter,
}

/// Handles to one (tenant, provider, model)'s series in the LLM families: clones share
/// the families' own values.
struct LlmSeries {
    calls: Counter,
    input_tokens: Counter,
    output_tokens: Counter,
    cost: Counter<f64, AtomicU64>,
    queue_wait: Histogram,
}

fn syscall_histogram() -> Histogram {
    // 0.25 ms to about 2 min: a ping to a human's answer.
    Histogram::new(exponential_buckets(0.00025, 2.5, 15))
}

fn commit_histogram() -> Histogram {
    // 50 µs to about 3 s: a group commit on a fast disk to a database under strain.
    Histogram::new(exponential_buckets(0.00005, 2.5, 13))
}

fn queue_wait_histogram() -> Histogram {
    // Zero (served at once) apart, then 5 ms to about 10 min.
    Histogram::new(std::iter::once(0.0).chain(exponential_buckets(0.005, 3.0, 12)))
}

fn spawn_histogram() -> Histogram {
    // 0.5 ms (a pooled claim) to about 8 s (a cold sandbox on a loaded host).
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::default();
        let syscall_family =
            Family::<MethodLabels, Histogram>::new_with_constructor(syscall_histogram as fn() -> Histogram);
        let methods = keel_protocol::rpc::METHODS.iter().copied();
        let syscalls: HashMap<&'static str, Histogram> = methods
            .map(|method| (method, syscall_family.get_or_create(&MethodLabels { method }).clone()))
            .collect();
        let unknown_syscall = syscall_family.get_or_create(&MethodLabels { method: UNKNOWN_METHOD }).clone();
        registry.register_with_unit(
            "keel_syscall_duration",
            "Time from a syscall's arrival to its reply, replayed calls included, by method (a method protocol 1 \
             does not have is `unknown`)",
            Unit::Seconds,
            syscall_family,
        );
        let llm_calls = Family::default();
        registry.register(
            "keel_llm_calls",
            "LLM calls a provider served (calls answered from the journal on replay are not counted), by tenant, \
             provider and model",
            llm_calls.clone(),
        );
        let llm_input_tokens = Family::default();
        registry.register(
            "keel_llm_input_tokens",
            "Input (prompt) tokens of the LLM calls a provider served, by tenant, provider and model",
            llm_input_tokens.clone(),
        );
        let llm_output_tokens = Family::default();
        registry.register(
            "keel_llm_output_tokens",
            "Output (completion) tokens of the LLM calls a provider served, by tenant, provider and model",
            llm_output_tokens.clone(),
        );
        let llm_cost = Family::default();
        registry.register(
            "keel_llm_cost_usd",
            "Cost in US dollars of the LLM calls a provider served (as charged to run budgets), by tenant, \
             provider and model",
            llm_cost.clone(),
        );
        let llm_errors = Family::default();
        registry.register(
            "keel_llm_errors",
            "LLM calls that failed after the router's retries and fallbacks, by the class of the last error \
             (rate_limited, server, timeout, auth, ...; no_route, script and config for failures before any \
             provider)",
            llm_errors.clone(),
        );
        let llm_queue_wait =
            Family::<RouteLabels, Histogram>::new_with_constructor(queue_wait_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "keel_llm_queue_wait",
            "Time a served LLM call waited in its model's queue for the provider's capacity (all attempts \
             together; 0 when it went at once), by provider and model",
            Unit::Seconds,
            llm_queue_wait.clone(),
        );
        let embedding_calls = Family::default();
        registry.register(
            "keel_embedding_calls",
            "Calls to the embedder (llm.embed and the gateway's /v1/embeddings, a memory put's text, a semantic \
             or hybrid search's query; replayed calls are not counted), by tenant and embedding model",
            embedding_calls.clone(),
        );
        let embedding_input_tokens = Family::default();
        registry.register(
            "keel_embedding_input_tokens",
            "Input tokens of the embedder's calls as its provider reported them (the offline hash embedder \
             reports none), by tenant and embedding model",
            embedding_input_tokens.clone(),
        );
        let journal =
            Family::<OpLabels, Histogram>::new_with_constructor(commit_histogram as fn() -> Histogram);
        let journal_append = journal.get_or_create(&OpLabels { op: "append" }).clone();
        let journal_complete = journal.get_or_create(&OpLabels { op: "complete" }).clone();
        registry.register_with_unit(
            "keel_journal_commit",
            "Time until a journal write is durable (op: append of an entry, complete of a pending one), waits \
             for an unreachable store included",
            Unit::Seconds,
            journal,
        );
        let sandbox_spawn =
            Family::<SpawnLabels, Histogram>::new_with_constructor(spawn_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "keel_sandbox_spawn",
            "Time to start an agent's process, by sandbox tier and kind (cold: built for the run; pooled: a \
             ready-built sandbox claimed)",
            Unit::Seconds,
            sandbox_spawn.clone(),
        );
        let runs_recovered = Counter::default();
        registry.register(
            "keel_runs_recovered",
            "Interrupted runs this kernel brought back to life since it started: agents relaunched after a \
             kernel restart or taken over from a failed node, and queued runs started, each counted once its \
             new process is recorded (swapped-out runs are not relaunched, so not counted)",
            runs_recovered.clone(),
        );
        Metrics {
            registry,
            syscalls,
            unknown_syscall,
            llm_calls,
            llm_input_tokens,
            llm_output_tokens,
            llm_cost,
            llm_errors,
            llm_queue_wait,
            llm_series: RwLock::default(),
            embedding_calls,
            embedding_input_tokens,
            journal_append,
            journal_complete,
            sandbox_spawn,
            runs_recovered,
        }
    }

    /// Times a syscall until the returned guard is dropped.
    pub(crate) fn syscall(&self, method: &str) -> Timer<'_> {
        let histogram = self.syscalls.get(method).unwrap_or(&self.unknown_syscall);
        Timer { histogram, started: Instant::now() }
    }

    /// Times a journal write until the returned guard is dropped.
    pub(crate) fn journal_commit(&self, op: JournalOp) -> Timer<'_> {
        let histogram = match op {
            JournalOp::Append => &self.journal_append,
            JournalOp::Complete => &self.journal_complete,
        };
        Timer { histogram, started: Instant::now() }
    }

    /// An LLM call a provider served: `meta` is the served call's (its `provider` and
    /// `model`), `usage` what it was charged, `queue_wait` how long it waited for capacity.
    pub(crate) fn llm_served(&self, tenant: &str, meta: &Value, usage: &Usage, queue_wait: Duration) {
        let provider = meta.get("provider").and_then(Value::as_str).unwrap_or("unknown");
        let route = meta.get("model").and_then(Value::as_str).unwrap_or("unknown");
        // The router names a route `provider/model`; the model label is the model alone.
        let model = route.strip_prefix(provider).and_then(|rest| rest.strip_prefix('/')).unwrap_or(route);
        let mut key = String::with_capacity(tenant.len() + provider.len() + model.len() + 2);
        for part in [tenant, "/", provider, "/", model] {
            key.push_str(part);
        }
        let record = |series: &LlmSeries| {
            series.calls.inc();
            series.input_tokens.inc_by(usage.input_tokens);
            series.output_tokens.inc_by(usage.output_tokens);
            series.cost.inc_by(usage.cost_micro_usd as f64 / 1_000_000.0);
            series.queue_wait.observe(queue_wait.as_secs_f64());
        };
        if let Some(series) = self.llm_series.read().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return record(series);
        }
        let labels =
            LlmLabels { tenant: tenant.to_owned(), provider: provider.to_owned(), model: model.to_owned() };
        let series = LlmSeries {
            calls: self.llm_calls.get_or_create(&labels).clone(),
            input_tokens: self.llm_input_tokens.get_or_create(&labels).clone(),
            output_tokens: self.llm_output_tokens.get_or_create(&labels).clone(),
            cost: self.llm_cost.get_or_create(&labels).clone(),
            queue_wait: self
                .llm_queue_wait
                .get_or_create(&RouteLabels { provider: labels.provider, model: labels.model })
                .clone(),
        };
        record(&series);
        self.llm_series.write().unwrap_or_else(PoisonError::into_inner).insert(key, series);
    }

    /// A memory call or `llm.embed` that asked the embedder `calls` times (none: nothing).
    pub(crate) fn embedded(&self, tenant: &str, model: &str, calls: u32, usage: &Usage) {
        if calls == 0 {
            return;
        }
        let labels = EmbeddingLabels { tenant: tenant.to_owned(), model: model.to_owned() };
        self.embedding_calls.get_or_create(&labels).inc_by(u64::from(calls));
        self.embedding_input_tokens.get_or_create(&labels).inc_by(usage.input_tokens);
    }

    /// An LLM call that failed for good.
    pub(crate) fn llm_failed(&self, error: &keel_llm::Error) {
        self.llm_errors.get_or_create(&ClassLabels { class: error_class(error) }).inc();
    }

    /// An agent's process started, `pooled` when a ready-built sandbox was claimed.
    pub(crate) fn sandbox_spawned(&self, tier: &'static str, pooled: bool, took: Duration) {
        let kind = if pooled { "pooled" } else { "cold" };
        self.sandbox_spawn.get_or_create(&SpawnLabels { tier, kind }).observe(took.as_secs_f64());
    }

    /// An interrupted run is live again: its relaunched agent's process is recorded.
    pub(crate) fn run_recovered(&self) {
        self.runs_recovered.inc();
    }

    /// The whole exposition: the recorded instruments, then the gauges of `snapshot`.
    pub(crate) fn render(&self, snapshot: &Snapshot, format: Format) -> String {
        let mut text = String::with_capacity(16 * 1024);
        let encoded = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry)
            .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut text, &gauges(snapshot)))
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text));
        // Proven invariant: writing to a `String` cannot fail, and the encoder fails only
        // when its writer does (every name, label and value here is encodable).
        encoded.expect("encoding metrics into a String cannot fail");
        match format {
            Format::OpenMetrics => text,
            Format::Prometheus => prometheus_text(&text),
        }
    }
}

/// The label of a failed call: its provider error's class, or what failed before any
/// provider was asked.
fn error_class(error: &keel_llm::Error) -> &'static str {
    use keel_llm::Error;
    if let Some(class) = error.class() {
        return class.as_str();
    }
    match error {
        Error::NoRoute(_) => "no_route",
        Error::NoScriptedResponse { .. } | Error::InvalidScript(_) => "script",
        Error::Config(_) => "config",
        _ => "other",
    }
}

/// A registry of the scrape-time gauges, filled from `snapshot`.
fn gauges(snapshot: &Snapshot) -> Registry {
    let mut registry = Registry::default();

    let runs = Family::<RunLabels, Gauge>::default();
    let waiting = Family::<ReasonLabels, Gauge>::default();
    let mut swapped = 0;
    for count in &snapshot.runs {
        // Every state of a tenant that has runs is shown, 0 included, so a state's series
        // does not vanish when its last run leaves it.
        for state in RunState::ALL {
            let _ = runs.get_or_create(&RunLabels { tenant: count.tenant.clone(), state: state.as_str() });
        }
        let n = i64::try_from(count.count).unwrap_or(i64::MAX);
        runs.get_or_create(&RunLabels { tenant: count.tenant.clone(), state: count.state.as_str() })
            .inc_by(n);
        if count.state == RunState::Waiting {
            let reason = count.wait_reason.map_or("unknown", WaitReason::as_str);
            waiting.get_or_create(&ReasonLabels { reason }).inc_by(n);
            if !count.has_pid && crate::swap::swappable(count.wait_reason) {
                swapped += n;
            }
        }
    }
    for reason in WaitReason::ALL {
        let _ = waiting.get_or_create(&ReasonLabels { reason: reason.as_str() });
    }
    registry.register(
        "keel_runs",
        "Runs in the store by tenant and state (the whole store: every node of a cluster reports the same)",
        runs,
    );
    registry.register("keel_runs_waiting", "Runs in `waiting` (parked) by what they wait for", waiting);
    registry.register(
        "keel_runs_swapped",
        "Waiting runs whose agent process was stopped until what they wait for happens (swapped out)",
        Gauge::<i64>::default().tap(swapped),
    );

    let depth = Family::<RouteLabels, Gauge>::default();
    for (provider, model) in &snapshot.llm_waiting {
        depth.get_or_create(&RouteLabels { provider: provider.clone(), model: model.clone() }).inc();
    }
    registry.register(
        "keel_llm_queue_depth",
        "LLM calls waiting for their provider's capacity now, by provider and model",
        depth,
    );

    let count = |n: usize| Gauge::<i64>::default().tap(i64::try_from(n).unwrap_or(i64::MAX));
    registry.register(
        "keel_live_slots_used",
        "Runs holding one of this kernel's live slots (admission control)",
        count(snapshot.live_slots_used),
    );
    if let Some(cap) = snapshot.live_slots_cap {
        registry.register(
            "keel_live_slots_capacity",
            "The most runs live on this kernel at once ([scheduler] max_live / max_live_per_node; absent \
             without a cap)",
            Gauge::<i64>::default().tap(i64::from(cap)),
        );
    }
    registry.register(
        "keel_admission_queue_runs",
        "Runs in `queued` waiting in this kernel's admission queue for a live slot",
        count(snapshot.admission_queue),
    );
    registry.register(
        "keel_sandbox_pool_ready",
        "Ready-built sandboxes in the pool, waiting to be claimed by a launch",
        count(snapshot.sandbox_pool_ready),
    );
    registry.register(
        "keel_audit_pending_records",
        "Audit records queued to the audit writer and not yet written to the store",
        Gauge::<i64>::default().tap(i64::try_from(snapshot.audit_pending).unwrap_or(i64::MAX)),
    );
    let age = Gauge::<f64, AtomicU64>::default();
    age.set(snapshot.audit_oldest_pending.map_or(0.0, |age| age.as_secs_f64()));
    registry.register_with_unit(
        "keel_audit_oldest_pending_age",
        "How long the oldest audit record not yet written has waited (0 when none waits)",
        Unit::Seconds,
        age,
    );
    registry
}

/// Sets a gauge in an expression.
trait Tap {
    fn tap(self, value: i64) -> Self;
}

impl Tap for Gauge<i64> {
    fn tap(self, value: i64) -> Self {
        self.set(value);
        self
    }
}

#[cfg(test)]
mod tests;
