//! OpenTelemetry: a run's trace (spans under the GenAI semantic conventions) and the
//! GenAI client metrics, exported over OTLP/HTTP (protobuf) when the standard `OTEL_*`
//! variables ask for it. [`Telemetry`] is a cheap handle that does nothing, and builds
//! nothing, when no endpoint is set.
//!
//! Replay-honest by construction: a run's trace id and its run span's id are derived from
//! the run id ([`trace_id`], [`run_span_id`]), so every attempt of a run (a recovery
//! after a crash) adds to the same trace, and the run span itself is emitted once, when
//! the run ends, from its record (start = `created_at`). A syscall span's id is derived
//! from (run, attempt, seq), so a `code.exec`'s program calls can name their `code.exec`
//! as parent while it is still open. A call answered from the journal gets a span marked
//! `keel.replayed = true` with no usage, and is not counted in the metrics.
//!
//! Spans are built here as finished [`SpanData`] (no tracer: the ids and times are ours)
//! and handed to the SDK's batch processor, whose bounded queue drops (and counts, and
//! logs) spans when the collector falls behind: a run never waits for its telemetry. The
//! HTTP client is the workspace's `reqwest`, driven on the kernel's runtime.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_types::RunId;
use opentelemetry::metrics::{Histogram, MeterProvider};
use opentelemetry::trace::{Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor,
};
use serde_json::Value;

mod facts;
#[cfg(test)]
mod tests;

pub(crate) use facts::{
    Config, Outcome, RunEnd, SyscallFacts, outcome_attributes, parent_of, random_span_id, run_span_parts,
    syscall_span_id,
};
pub use facts::{Error, agent_name, parse_traceparent, run_span_id, trace_id, traceparent};

/// The kernel's telemetry: a no-op unless the `OTEL_*` variables name an endpoint.
#[derive(Clone, Default)]
pub struct Telemetry {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    spans: Option<BatchSpanProcessor>,
    meters: Option<SdkMeterProvider>,
    token_usage: Option<Histogram<u64>>,
    duration: Option<Histogram<f64>>,
    capture_content: bool,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").field("enabled", &self.exporting.is_some()).finish()
    }
}

/// The exporter's HTTP client: the workspace's `reqwest`, each request driven on the
/// kernel's Tokio runtime (the SDK's batch processor and metric reader export from
/// threads of their own, where an async client has no reactor).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<opentelemetry_http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move { client.send_bytes(request).await });
        sent.await.map_err(|e| Box::new(e) as opentelemetry_http::HttpError)?
    }
}

impl Telemetry {
    /// Telemetry that exports nothing.
    pub fn disabled() -> Telemetry {
        Telemetry::default()
    }

    /// Telemetry as the process's `OTEL_*` variables say: nothing unless an endpoint is
    /// set; a bad setting is an error naming the variable. Call it inside the kernel's
    /// Tokio runtime (exports are driven on it).
    pub fn from_env() -> Result<Telemetry, Error> {
        let Some(config) = Config::read(|name| std::env::var(name).ok())? else {
            return Ok(Telemetry::disabled());
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| Error::Exporter(format!("no Tokio runtime to export on: {e}")))?;
        let client = || -> Result<OnRuntime, Error> {
            let client = reqwest::Client::builder()
                .timeout(config.timeout)
                .build()
                .map_err(|e| Error::Exporter(e.to_string()))?;
            Ok(OnRuntime { client, runtime: runtime.clone() })
        };
        let resource = resource();
        use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
        let spans = if config.traces {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_http_client(client()?)
                .build()
                .map_err(|e| Error::Exporter(e.to_string()))?;
            // The queue and batch sizes and the delay come from `OTEL_BSP_*`.
            let mut processor = BatchSpanProcessor::builder(exporter)
                .with_batch_config(BatchConfigBuilder::default().build())
                .build();
            processor.set_resource(&resource);
            Some(processor)
        } else {
            None
        };
        let meters = if config.metrics {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_http_client(client()?)
                .build()
                .map_err(|e| Error::Exporter(e.to_string()))?;
            // The interval comes from `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default).
            let reader = PeriodicReader::builder(exporter).build();
            Some(SdkMeterProvider::builder().with_reader(reader).with_resource(resource).build())
        } else {
            None
        };
        let (token_usage, duration) = match &meters {
            Some(provider) => {
                let meter = provider.meter("keel");
                let tokens = meter
                    .u64_histogram("gen_ai.client.token.usage")
                    .with_unit("{token}")
                    .with_description("Number of input and output tokens used.")
                    .with_boundaries(vec![
                        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
                        4194304.0, 16777216.0, 67108864.0,
                    ])
                    .build();
                let duration = meter
                    .f64_histogram("gen_ai.client.operation.duration")
                    .with_unit("s")
                    .with_description("GenAI operation duration.")
                    .with_boundaries(vec![
                        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                        81.92,
                    ])
                    .build();
                (Some(tokens), Some(duration))
            }
            None => (None, None),
        };
        tracing::info!(
            traces = config.traces,
            metrics = config.metrics,
            capture_content = config.capture_content,
            "exporting OpenTelemetry over OTLP/HTTP"
        );
        Ok(Telemetry {
            exporting: Some(Arc::new(Exporting {
                spans,
                meters,
                token_usage,
                duration,
                capture_content: config.capture_content,
                scope: InstrumentationScope::builder("keel").with_version(env!("CARGO_PKG_VERSION")).build(),
            })),
        })
    }

    /// Whether anything is exported.
    pub fn enabled(&self) -> bool {
        self.exporting.is_some()
    }

    /// Whether spans are exported (an agent then gets `TRACEPARENT`).
    pub(crate) fn tracing(&self) -> bool {
        self.exporting.as_ref().is_some_and(|e| e.spans.is_some())
    }

    /// Exports what is queued and stops the exporters; waits at most a few seconds.
    pub async fn shutdown(&self) {
        let Some(exporting) = self.exporting.clone() else { return };
        // The exporters' threads drive their requests on this runtime: wait off it.
        let flushed = tokio::task::spawn_blocking(move || {
            if let Some(spans) = &exporting.spans {
                let _ = spans.force_flush();
                let _ = spans.shutdown_with_timeout(Duration::from_secs(5));
            }
            if let Some(meters) = &exporting.meters {
                let _ = meters.force_flush();
                let _ = meters.shutdown();
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(10), flushed).await;
    }

    /// The span of a syscall about to be performed (`None`, at no cost, when spans are
    /// not exported). End it with [`SyscallSpan::end`].
    pub(crate) fn syscall(
        &self,
        run: &RunId,
        attempt: u32,
        method: &str,
        params: &Value,
    ) -> Option<SyscallSpan> {
        let exporting = self.exporting.as_ref()?;
        Some(SyscallSpan {
            exporting: exporting.clone(),
            call: SyscallFacts::of(method, params, exporting.capture_content),
            run: run.clone(),
            attempt,
            parent: GATEWAY_PARENT.try_with(|p| *p).ok().flatten(),
            started: SystemTime::now(),
        })
    }

    /// A call answered from the journal: a span marked `keel.replayed`, without usage,
    /// and nothing counted in the metrics.
    pub(crate) fn replayed(
        &self,
        run: &RunId,
        attempt: u32,
        method: &str,
        params: &Value,
        seq: u64,
        failed: bool,
    ) {
        let Some(exporting) = &self.exporting else { return };
        let Some(spans) = &exporting.spans else { return };
        let now = SystemTime::now();
        let call = SyscallFacts::of(method, params, false);
        let parent = GATEWAY_PARENT.try_with(|p| *p).ok().flatten();
        let mut attributes = call.attributes.clone();
        attributes.push(KeyValue::new("keel.replayed", true));
        attributes.push(KeyValue::new("keel.seq", seq as i64));
        let status = if failed { Status::error("the journaled call failed") } else { Status::Unset };
        spans.on_end(span_data(
            exporting,
            SpanContext::new(trace_id(run), random_span_id(), TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_of(run, attempt, &call, parent),
            call.kind,
            call.name,
            (now, now),
            attributes,
            status,
            Vec::new(),
        ));
    }

    /// Run `record` ended: its `invoke_agent` span, once, from `created_at` to its end.
    /// A child run's span links to its parent run's span (each run is its own trace, see
    /// the module doc of ARCHITECTURE.md's "Traces").
    pub(crate) fn run_ended(&self, record: &keel_store::RunRecord) {
        let Some(exporting) = &self.exporting else { return };
        let Some(spans) = &exporting.spans else { return };
        // A spec that does not parse still gets its run's span, without name or parent.
        let spec = crate::run::RunSpec::of(record).ok();
        let run = RunEnd {
            run: &record.id,
            tenant: &record.tenant,
            agent: spec.as_ref().map_or_else(|| "agent".into(), |spec| agent_name(&spec.command)),
            parent: spec.as_ref().and_then(|spec| spec.parent.as_ref()),
            state: record.state.as_str(),
            attempt: record.attempt,
            created_at_ms: record.created_at_ms,
            ended_at_ms: record.ended_at_ms.unwrap_or(record.updated_at_ms),
            usage: record.usage,
            exit_code: record.exit_code,
            error: record.error.as_deref(),
        };
        let (context, attributes, status, links, name) = run_span_parts(&run);
        let start = UNIX_EPOCH + Duration::from_millis(run.created_at_ms);
        let end = UNIX_EPOCH + Duration::from_millis(run.ended_at_ms.max(run.created_at_ms));
        spans.on_end(span_data(
            exporting,
            context,
            (SpanId::INVALID, false),
            SpanKind::Internal,
            name.into(),
            (start, end),
            attributes,
            status,
            links,
        ));
    }
}

/// A run waiting for something outside a syscall's own span (an operator's approval, a
/// budget top-up): its span is emitted when this is dropped, however the wait ended.
pub(crate) struct WaitSpan {
    exporting: Arc<Exporting>,
    run: RunId,
    parent: SpanId,
    what: &'static str,
    started: SystemTime,
}

impl Telemetry {
    /// A `wait {what}` span from now until the result is dropped; its parent is the
    /// span of the call `seq` of this attempt, or the run span.
    pub(crate) fn wait(
        &self,
        run: &RunId,
        attempt: u32,
        what: &'static str,
        seq: Option<u64>,
    ) -> Option<WaitSpan> {
        let exporting = self.exporting.as_ref().filter(|e| e.spans.is_some())?;
        Some(WaitSpan {
            exporting: exporting.clone(),
            run: run.clone(),
            parent: seq.map_or_else(|| run_span_id(run), |seq| syscall_span_id(run, attempt, seq)),
            what,
            started: SystemTime::now(),
        })
    }
}

impl Drop for WaitSpan {
    fn drop(&mut self) {
        let Some(spans) = &self.exporting.spans else { return };
        spans.on_end(span_data(
            &self.exporting,
            SpanContext::new(
                trace_id(&self.run),
                random_span_id(),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            (self.parent, false),
            SpanKind::Internal,
            format!("wait {}", self.what).into(),
            (self.started, SystemTime::now()),
            vec![KeyValue::new("keel.wait", self.what)],
            Status::Unset,
            Vec::new(),
        ));
    }
}

tokio::task_local! {
    /// The span a gateway caller's `traceparent` names, when it is in the run's trace:
    /// the parent of the spans of the calls the request makes.
    static GATEWAY_PARENT: Option<SpanId>;
}

/// Runs `call` (a gateway request of run `run`) with the span its `traceparent` header
/// names as the parent of its syscalls' spans, when the header belongs to the run's
/// trace (anything else is ignored: a span of another trace cannot be this call's parent).
pub(crate) async fn with_traceparent<F: std::future::Future>(
    run: &RunId,
    header: Option<&str>,
    call: F,
) -> F::Output {
    let parent =
        header.and_then(parse_traceparent).filter(|(trace, _)| *trace == trace_id(run)).map(|(_, span)| span);
    GATEWAY_PARENT.scope(parent, call).await
}

/// A syscall's span while the call runs.
pub(crate) struct SyscallSpan {
    exporting: Arc<Exporting>,
    call: SyscallFacts,
    run: RunId,
    attempt: u32,
    parent: Option<SpanId>,
    started: SystemTime,
}

impl SyscallSpan {
    /// The call came out as `outcome`: its span is queued for export, and a model call
    /// is counted in the GenAI metrics.
    pub(crate) fn end(self, outcome: Outcome<'_>) {
        let ended = SystemTime::now();
        let exporting = &self.exporting;
        let (more, status, metric) = outcome_attributes(&self.call, &outcome, exporting.capture_content);
        if let Some(metric) = metric {
            let attributes = metric.attributes();
            if let Some(histogram) = &exporting.duration {
                let seconds = ended.duration_since(self.started).unwrap_or_default().as_secs_f64();
                histogram.record(seconds, &attributes);
            }
            if let Some(histogram) = &exporting.token_usage
                && metric.error.is_none()
            {
                let mut input = attributes.clone();
                input.push(KeyValue::new("gen_ai.token.type", "input"));
                histogram.record(metric.input_tokens, &input);
                if metric.operation == "chat" {
                    let mut output = attributes;
                    output.push(KeyValue::new("gen_ai.token.type", "output"));
                    histogram.record(metric.output_tokens, &output);
                }
            }
        }
        let Some(spans) = &exporting.spans else { return };
        let id = match outcome.seq {
            Some(seq) => syscall_span_id(&self.run, self.attempt, seq),
            None => random_span_id(),
        };
        let mut attributes = self.call.attributes.clone();
        attributes.extend(more);
        if self.call.method == "tool.call" {
            let call_id = match outcome.seq {
                Some(seq) => format!("{}:{seq}", self.run),
                None => format!("{}:unjournaled", self.run),
            };
            attributes.push(KeyValue::new("gen_ai.tool.call.id", call_id));
        }
        let parent = parent_of(&self.run, self.attempt, &self.call, self.parent);
        // A call that named no model is named after the model that answered.
        let name = match (&self.call.request_model, self.call.operation) {
            (None, Some(operation @ ("chat" | "embeddings"))) => {
                match outcome.response_model(&self.call.method) {
                    Some(model) => format!("{operation} {model}").into(),
                    None => self.call.name.clone(),
                }
            }
            _ => self.call.name.clone(),
        };
        spans.on_end(span_data(
            exporting,
            SpanContext::new(trace_id(&self.run), id, TraceFlags::SAMPLED, false, TraceState::NONE),
            parent,
            self.call.kind.clone(),
            name,
            (self.started, ended),
            attributes,
            status,
            Vec::new(),
        ));
    }
}

#[allow(clippy::too_many_arguments, reason = "the parts of one span")]
fn span_data(
    exporting: &Exporting,
    context: SpanContext,
    (parent_span_id, parent_span_is_remote): (SpanId, bool),
    span_kind: SpanKind,
    name: Cow<'static, str>,
    (start_time, end_time): (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
    links: Vec<Link>,
) -> SpanData {
    let mut span_links = SpanLinks::default();
    span_links.links = links;
    SpanData {
        span_context: context,
        parent_span_id,
        parent_span_is_remote,
        span_kind,
        name,
        start_time,
        end_time,
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: span_links,
        status,
        instrumentation_scope: exporting.scope.clone(),
    }
}

/// The resource: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, with `keel` as the
/// service name when neither names one.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named { builder.build() } else { builder.with_service_name("keel").build() }
}
