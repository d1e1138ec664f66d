//! The pure parts of telemetry: the `OTEL_*` settings checked, ids derived from run ids,
//! W3C trace context, and the names and attributes of spans and metric points, from a
//! run's record or a syscall's params and outcome. No IO, no exporter.

use std::borrow::Cow;
use std::time::Duration;

use keel_types::{RunId, Usage};
use opentelemetry::trace::{Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, KeyValue, StringValue, Value as OtelValue};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::syscall::SyscallError;

/// A bad `OTEL_*` setting, found when the kernel starts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{variable}={value:?} is not an OTLP/HTTP endpoint ({why}); set an http:// or https:// URL such as http://127.0.0.1:4318, or unset it to export nothing"
    )]
    Endpoint { variable: &'static str, value: String, why: String },
    #[error(
        "{variable}={value:?}: Keel exports OTLP over http/protobuf only; set it to http/protobuf (or unset it)"
    )]
    Protocol { variable: &'static str, value: String },
    #[error("{variable}: the entry {entry:?} is not key=value; write headers as key1=value1,key2=value2")]
    Headers { variable: &'static str, entry: String },
    #[error("{variable}={value:?} is not a number of milliseconds")]
    Timeout { variable: &'static str, value: String },
    #[error("could not set up the OTLP exporter: {0}")]
    Exporter(String),
}

/// The variable that lets prompts, completions and tool arguments into spans (the GenAI
/// conventions' own opt-in); anything but `true` keeps them out.
pub const CAPTURE_CONTENT: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// What the `OTEL_*` variables ask for, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    pub(crate) traces: bool,
    pub(crate) metrics: bool,
    pub(crate) capture_content: bool,
    pub(crate) timeout: Duration,
}

impl Config {
    /// Reads and checks the variables through `var`; `None` when nothing is to be
    /// exported (no endpoint set, or `OTEL_SDK_DISABLED=true`).
    pub(crate) fn read(var: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, Error> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        for variable in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ] {
            if let Some(value) = set(variable) {
                check_endpoint(variable, &value)?;
            }
        }
        for variable in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ] {
            if let Some(value) = set(variable)
                && value.trim() != "http/protobuf"
            {
                return Err(Error::Protocol { variable, value });
            }
        }
        for variable in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        ] {
            if let Some(value) = set(variable)
                && let Some(entry) = value.split(',').find(|e| !e.trim().is_empty() && !e.contains('='))
            {
                return Err(Error::Headers { variable, entry: entry.to_owned() });
            }
        }
        let timeout = match set("OTEL_EXPORTER_OTLP_TIMEOUT") {
            Some(value) => Duration::from_millis(
                value
                    .trim()
                    .parse()
                    .map_err(|_| Error::Timeout { variable: "OTEL_EXPORTER_OTLP_TIMEOUT", value })?,
            ),
            None => Duration::from_secs(10),
        };
        let general = set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let off = |name: &str| set(name).is_some_and(|v| v.trim() == "none");
        let traces =
            (general || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()) && !off("OTEL_TRACES_EXPORTER");
        let metrics = (general || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some())
            && !off("OTEL_METRICS_EXPORTER");
        if !traces && !metrics {
            return Ok(None);
        }
        let capture_content = set(CAPTURE_CONTENT).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Ok(Some(Config { traces, metrics, capture_content, timeout }))
    }
}

fn check_endpoint(variable: &'static str, value: &str) -> Result<(), Error> {
    let bad = |why: String| Error::Endpoint { variable, value: value.to_owned(), why };
    let url = reqwest::Url::parse(value.trim()).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!("the scheme is {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("it names no host".into()));
    }
    Ok(())
}

/// The trace of run `run`: the first 16 bytes of SHA-256 of its id. Every attempt of
/// the run, and anything that knows the run id, arrives at the same trace.
pub fn trace_id(run: &RunId) -> TraceId {
    let digest = Sha256::digest(format!("keel trace {run}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    TraceId::from_bytes(bytes)
}

/// The id of run `run`'s own span (`invoke_agent`), the root of its trace.
pub fn run_span_id(run: &RunId) -> SpanId {
    span_id_of(&format!("keel run span {run}"))
}

/// The id of the span of the syscall journaled at `seq` by the run's attempt `attempt`
/// (a replay in a later attempt is a span of its own).
pub(crate) fn syscall_span_id(run: &RunId, attempt: u32, seq: u64) -> SpanId {
    span_id_of(&format!("keel syscall span {run} {attempt} {seq}"))
}

pub(crate) fn span_id_of(seed: &str) -> SpanId {
    let digest = Sha256::digest(seed);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    if bytes == [0; 8] {
        bytes[7] = 1; // The all-zero id is invalid; a digest of zeros is not going to happen.
    }
    SpanId::from_bytes(bytes)
}

pub(crate) fn random_span_id() -> SpanId {
    let mut bytes = [0u8; 8];
    keel_types::fill_random(&mut bytes);
    bytes[0] |= 1;
    SpanId::from_bytes(bytes)
}

/// The W3C `traceparent` an agent of run `run` gets: its parent is the run span.
pub fn traceparent(run: &RunId) -> String {
    format!("00-{}-{}-01", trace_id(run), run_span_id(run))
}

/// Reads a W3C `traceparent` header: (trace id, span id), or `None` if it is not one
/// (any version but `ff`, 32 and 16 lowercase hex digits, neither all zeros).
pub fn parse_traceparent(header: &str) -> Option<(TraceId, SpanId)> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
    Some((trace, span))
}

/// The name an agent's run goes by in its spans: the program it runs (the script, for
/// an interpreter and its script), without its directory.
pub fn agent_name(command: &[String]) -> String {
    const INTERPRETERS: &[&str] = &[
        "python", "python3", "node", "sh", "bash", "deno", "bun", "ruby", "perl", "uv", "npx", "env", "tsx",
    ];
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    let Some(first) = command.first() else { return "agent".into() };
    let program = base(first);
    let interpreter = INTERPRETERS.iter().any(|i| {
        program == *i
            || program
                .strip_prefix("python")
                .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    });
    if interpreter && let Some(script) = command[1..].iter().find(|a| !a.starts_with('-') && !a.contains('='))
    {
        return base(script);
    }
    program
}

/// What the end of a run's span is made of (from its record and spec).
pub(crate) struct RunEnd<'a> {
    pub(crate) run: &'a RunId,
    pub(crate) tenant: &'a str,
    pub(crate) agent: String,
    pub(crate) parent: Option<&'a RunId>,
    pub(crate) state: &'a str,
    pub(crate) attempt: u32,
    pub(crate) created_at_ms: u64,
    pub(crate) ended_at_ms: u64,
    pub(crate) usage: Usage,
    pub(crate) exit_code: Option<i32>,
    pub(crate) error: Option<&'a str>,
}

type RunSpanParts = (SpanContext, Vec<KeyValue>, Status, Vec<Link>, String);

/// The run span's context, attributes, status, links and name (pure).
pub(crate) fn run_span_parts(run: &RunEnd<'_>) -> RunSpanParts {
    let context = SpanContext::new(
        trace_id(run.run),
        run_span_id(run.run),
        TraceFlags::SAMPLED,
        false,
        TraceState::NONE,
    );
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "invoke_agent"),
        KeyValue::new("gen_ai.agent.name", run.agent.clone()),
        KeyValue::new("gen_ai.agent.id", run.run.to_string()),
        KeyValue::new("keel.run_id", run.run.to_string()),
        KeyValue::new("keel.tenant", run.tenant.to_owned()),
        KeyValue::new("keel.state", run.state.to_owned()),
        KeyValue::new("keel.attempt", i64::from(run.attempt)),
        KeyValue::new("gen_ai.usage.input_tokens", run.usage.input_tokens as i64),
        KeyValue::new("gen_ai.usage.output_tokens", run.usage.output_tokens as i64),
        KeyValue::new("keel.cost_usd", run.usage.cost_micro_usd as f64 / 1_000_000.0),
    ];
    if let Some(code) = run.exit_code {
        attributes.push(KeyValue::new("keel.exit_code", i64::from(code)));
    }
    let status = match (run.state, run.error) {
        ("succeeded", _) => Status::Ok,
        (_, Some(error)) => {
            attributes.push(KeyValue::new("error.type", run.state.to_owned()));
            Status::error(error.to_owned())
        }
        ("failed", None) => Status::error("the run failed"),
        _ => Status::Unset,
    };
    let mut links = Vec::new();
    if let Some(parent) = run.parent {
        attributes.push(KeyValue::new("keel.parent_run_id", parent.to_string()));
        let parent_span = SpanContext::new(
            trace_id(parent),
            run_span_id(parent),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        );
        links.push(Link::new(parent_span, vec![KeyValue::new("keel.link", "parent_run")], 0));
    }
    (context, attributes, status, links, format!("invoke_agent {}", run.agent))
}

/// What a syscall's span says before its outcome is known (pure, from its params).
#[derive(Debug, Clone)]
pub(crate) struct SyscallFacts {
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: SpanKind,
    pub(crate) operation: Option<&'static str>,
    pub(crate) attributes: Vec<KeyValue>,
    /// The seq of the `code.exec` whose program made the call.
    pub(crate) exec: Option<u64>,
    pub(crate) request_model: Option<String>,
    pub(crate) method: String,
}

impl SyscallFacts {
    pub(crate) fn of(method: &str, params: &Value, capture_content: bool) -> SyscallFacts {
        let text = |key: &str| params.get(key).and_then(Value::as_str).map(str::to_owned);
        let mut attributes = vec![KeyValue::new("keel.syscall", method.to_owned())];
        let exec = params.get("exec").and_then(Value::as_u64);
        let (name, kind, operation, request_model): (Cow<'static, str>, _, _, _) = match method {
            "llm.chat" => {
                let model = text("model");
                attributes.push(KeyValue::new("gen_ai.operation.name", "chat"));
                if let Some(model) = &model {
                    attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
                }
                if let Some(max) = params.get("max_tokens").and_then(Value::as_i64) {
                    attributes.push(KeyValue::new("gen_ai.request.max_tokens", max));
                }
                if let Some(t) = params.get("temperature").and_then(Value::as_f64) {
                    attributes.push(KeyValue::new("gen_ai.request.temperature", t));
                }
                if capture_content && let Some(messages) = params.get("messages") {
                    attributes.push(KeyValue::new("gen_ai.input.messages", messages.to_string()));
                }
                (
                    format!("chat {}", model.as_deref().unwrap_or("default")).into(),
                    SpanKind::Client,
                    Some("chat"),
                    model,
                )
            }
            "llm.embed" => {
                let model = text("model");
                attributes.push(KeyValue::new("gen_ai.operation.name", "embeddings"));
                if let Some(model) = &model {
                    attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
                }
                (
                    format!("embeddings {}", model.as_deref().unwrap_or("default")).into(),
                    SpanKind::Client,
                    Some("embeddings"),
                    model,
                )
            }
            "tool.call" => {
                let tool = text("name").unwrap_or_default();
                attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
                attributes.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
                attributes.push(KeyValue::new("gen_ai.tool.type", "function"));
                if capture_content && let Some(args) = params.get("args") {
                    attributes.push(KeyValue::new("gen_ai.tool.call.arguments", args.to_string()));
                }
                (format!("execute_tool {tool}").into(), SpanKind::Internal, Some("execute_tool"), None)
            }
            "code.exec" => {
                if let Some(lang) = text("lang") {
                    attributes.push(KeyValue::new("keel.code.lang", lang));
                }
                ("code.exec".into(), SpanKind::Internal, None, None)
            }
            "human.ask" => {
                attributes.push(KeyValue::new("keel.wait", "human"));
                ("wait human".into(), SpanKind::Internal, None, None)
            }
            "ipc.recv" => {
                attributes.push(KeyValue::new("keel.wait", "message"));
                ("wait message".into(), SpanKind::Internal, None, None)
            }
            "proc.wait" => {
                attributes.push(KeyValue::new("keel.wait", "child"));
                ("wait child".into(), SpanKind::Internal, None, None)
            }
            "sys.sleep" => {
                attributes.push(KeyValue::new("keel.wait", "timer"));
                ("wait timer".into(), SpanKind::Internal, None, None)
            }
            "proc.spawn" => ("spawn child run".into(), SpanKind::Internal, None, None),
            other => (other.to_owned().into(), SpanKind::Internal, None, None),
        };
        SyscallFacts { name, kind, operation, attributes, exec, request_model, method: method.to_owned() }
    }
}

/// The outcome of a performed syscall, as its span reports it.
pub(crate) struct Outcome<'a> {
    pub(crate) seq: Option<u64>,
    /// What the journal kept as the call's result (a model call's: `response`, the
    /// provider's answer, and `provider`, who served it), or its reply where nothing was
    /// kept; or the error's kind and message.
    pub(crate) result: Result<&'a Value, (&'a str, &'a str)>,
    pub(crate) usage: Usage,
}

impl<'a> Outcome<'a> {
    pub(crate) fn of(seq: Option<u64>, result: Result<&'a Value, &'a SyscallError>, usage: Usage) -> Self {
        Outcome { seq, result: result.map_err(|e| (e.kind.as_str(), e.message.as_str())), usage }
    }

    /// The model that answered a model call of `method`, as the result names it.
    pub(crate) fn response_model(&self, method: &str) -> Option<&'a str> {
        let result = self.result.ok()?;
        let response = if method == "llm.chat" { result.get("response")? } else { result };
        response.get("model").and_then(Value::as_str)
    }
}

/// The attributes, status and metrics of a performed call's outcome (pure).
pub(crate) fn outcome_attributes(
    call: &SyscallFacts,
    outcome: &Outcome<'_>,
    capture_content: bool,
) -> (Vec<KeyValue>, Status, Option<MetricFacts>) {
    let mut attributes = Vec::new();
    if let Some(seq) = outcome.seq {
        attributes.push(KeyValue::new("keel.seq", seq as i64));
    }
    let mut metric = call.operation.filter(|op| *op != "execute_tool").map(|operation| MetricFacts {
        operation,
        provider: None,
        request_model: call.request_model.clone(),
        response_model: None,
        input_tokens: outcome.usage.input_tokens,
        output_tokens: outcome.usage.output_tokens,
        error: None,
    });
    let status = match outcome.result {
        Ok(result) => {
            match call.method.as_str() {
                "llm.chat" => {
                    let provider = result.pointer("/provider/provider").and_then(Value::as_str);
                    if let Some(provider) = provider {
                        attributes.push(KeyValue::new("gen_ai.provider.name", provider.to_owned()));
                    }
                    let response = result.get("response").unwrap_or(&Value::Null);
                    let model = outcome.response_model(&call.method);
                    if let Some(model) = model {
                        attributes.push(KeyValue::new("gen_ai.response.model", model.to_owned()));
                    }
                    if let Some(metric) = &mut metric {
                        metric.provider = provider.map(str::to_owned);
                        metric.response_model = model.map(str::to_owned);
                    }
                    if let Some(reason) = response.get("finish_reason").and_then(Value::as_str) {
                        attributes.push(KeyValue::new(
                            "gen_ai.response.finish_reasons",
                            OtelValue::Array(Array::String(vec![StringValue::from(reason.to_owned())])),
                        ));
                    }
                    if capture_content && let Some(message) = response.get("message") {
                        attributes.push(KeyValue::new("gen_ai.output.messages", message.to_string()));
                    }
                }
                "tool.call" if capture_content => {
                    if let Some(result) = result.get("result") {
                        attributes.push(KeyValue::new("gen_ai.tool.call.result", result.to_string()));
                    }
                }
                _ => {}
            }
            Status::Unset
        }
        Err((kind, message)) => {
            attributes.push(KeyValue::new("error.type", kind.to_owned()));
            if let Some(metric) = &mut metric {
                metric.error = Some(kind.to_owned());
            }
            Status::error(message.to_owned())
        }
    };
    if call.operation.is_some_and(|op| op != "execute_tool") {
        attributes.push(KeyValue::new("gen_ai.usage.input_tokens", outcome.usage.input_tokens as i64));
        if call.operation == Some("chat") {
            attributes.push(KeyValue::new("gen_ai.usage.output_tokens", outcome.usage.output_tokens as i64));
        }
        attributes.push(KeyValue::new("keel.cost_usd", outcome.usage.cost_micro_usd as f64 / 1_000_000.0));
    }
    (attributes, status, metric)
}

/// What the GenAI metrics record of one performed model call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MetricFacts {
    pub(crate) operation: &'static str,
    pub(crate) provider: Option<String>,
    pub(crate) request_model: Option<String>,
    pub(crate) response_model: Option<String>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) error: Option<String>,
}

impl MetricFacts {
    /// The conventions' attributes of both metrics.
    pub(crate) fn attributes(&self) -> Vec<KeyValue> {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", self.operation),
            KeyValue::new("gen_ai.provider.name", self.provider.clone().unwrap_or_else(|| "keel".into())),
        ];
        if let Some(model) = &self.request_model {
            attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        if let Some(model) = &self.response_model {
            attributes.push(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        if let Some(error) = &self.error {
            attributes.push(KeyValue::new("error.type", error.clone()));
        }
        attributes
    }
}

/// The parent of a syscall's span: its `code.exec`'s span for a program's call, the
/// span a gateway caller's `traceparent` named (remote), else the run span.
pub(crate) fn parent_of(
    run: &RunId,
    attempt: u32,
    call: &SyscallFacts,
    gateway: Option<SpanId>,
) -> (SpanId, bool) {
    match (call.exec, gateway) {
        (Some(exec), _) => (syscall_span_id(run, attempt, exec), false),
        (None, Some(span)) => (span, true),
        (None, None) => (run_span_id(run), false),
    }
}
