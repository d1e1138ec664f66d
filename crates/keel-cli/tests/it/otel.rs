//! OpenTelemetry end to end: `keel serve` with the standard `OTEL_*` variables exports a
//! run's spans and the GenAI metrics over OTLP/HTTP to a local collector
//! (`agents/otlp_receiver.py`, decoding with the official `opentelemetry-proto`
//! messages). The spans carry the GenAI conventions' attributes, nest under the run's
//! span in a trace derived from the run id, keep prompts out unless the operator opts in,
//! and after a SIGKILL and recovery the run has one run span and no second LLM span for
//! a call the journal answered.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::harness::{Keel, agent, wait_for};

/// The local OTLP/HTTP collector, a Python process that writes what it decodes.
pub(crate) struct Collector {
    dir: tempfile::TempDir,
    child: Child,
    pub(crate) endpoint: String,
}

impl Collector {
    pub(crate) fn start() -> Collector {
        let dir = tempfile::tempdir().expect("tempdir");
        let child = Command::new("python3")
            .arg(agent("otlp_receiver.py"))
            .arg(dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the OTLP receiver (python3 with opentelemetry-proto)");
        let port_file = dir.path().join("port");
        let port = wait_for("the OTLP receiver to listen", || std::fs::read_to_string(&port_file).ok());
        Collector { endpoint: format!("http://127.0.0.1:{port}"), dir, child }
    }

    fn lines(&self, name: &str) -> Vec<Value> {
        let path: PathBuf = self.dir.path().join(name);
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    fn spans(&self, trace: &str) -> Vec<Value> {
        self.lines("spans.jsonl").into_iter().filter(|s| s["trace_id"] == trace).collect()
    }

    /// Waits until the run's trace has its run span (emitted when the run ends).
    fn run_trace(&self, run: &str) -> Vec<Value> {
        let trace = trace_id(run);
        wait_for("the run's span at the collector", || {
            let spans = self.spans(&trace);
            spans.iter().any(|s| s["attributes"]["gen_ai.operation.name"] == "invoke_agent").then_some(spans)
        })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The trace of a run as the kernel derives it: the first 16 bytes of SHA-256.
fn trace_id(run: &str) -> String {
    keel_types::hex(&Sha256::digest(format!("keel trace {run}"))[..16])
}

fn run_span_id(run: &str) -> String {
    keel_types::hex(&Sha256::digest(format!("keel run span {run}"))[..8])
}

/// A daemon exporting to `collector` quickly (short batch delay and metric interval).
fn traced(collector: &Collector, extra: &[(&str, &str)]) -> Keel {
    traced_with(collector, extra, None)
}

/// `traced`, with a keel.toml in the data directory before the daemon starts.
fn traced_with(collector: &Collector, extra: &[(&str, &str)], keel_toml: Option<&str>) -> Keel {
    let mut keel = Keel::new();
    if let Some(text) = keel_toml {
        std::fs::write(keel.data.path().join("keel.toml"), text).expect("write keel.toml");
    }
    keel.daemon_env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=s3cret"),
        ("OTEL_SERVICE_NAME", "keel-under-test"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    keel.start_daemon();
    keel
}

fn otel_run(keel: &Keel, input: Value) -> String {
    let input = input.to_string();
    let script = agent("otel_script.json");
    let path = agent("otel_agent.py");
    keel.detach(&[
        "--sandbox",
        "none",
        "--llm-script",
        &script,
        "--grant",
        "echo",
        "--grant",
        "fs.*",
        "--input",
        &input,
        "--",
        "python3",
        &path,
    ])
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn live(spans: Vec<&Value>) -> Vec<&Value> {
    spans.into_iter().filter(|s| s["attributes"]["keel.replayed"] != true).collect()
}

const STATUS_ERROR: u64 = 2;
const KIND_INTERNAL: u64 = 1;
const KIND_CLIENT: u64 = 3;

#[test]
fn a_runs_spans_carry_the_genai_attributes_nest_under_the_run_and_leave_prompts_out() {
    let collector = Collector::start();
    let keel = traced(&collector, &[]);
    let run = otel_run(&keel, json!({}));
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    let output = &done["output"];
    assert_eq!(output["replies"], json!(["a plan", "gateway reply", "done"]));
    assert_eq!(output["tool_error"], "tool_error", "{output}");

    let spans = collector.run_trace(&run);
    let (trace, root) = (trace_id(&run), run_span_id(&run));
    // The agent's TRACEPARENT names the run span of the run's own trace.
    assert_eq!(output["traceparent"], format!("00-{trace}-{root}-01"));

    // One run span: the root, INTERNAL, with the run's facts.
    let runs = named(&spans, "invoke_agent otel_agent.py");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run_span = runs[0];
    assert_eq!(
        (run_span["span_id"].as_str(), run_span["parent_span_id"].as_str()),
        (Some(root.as_str()), Some(""))
    );
    assert_eq!(run_span["kind"], KIND_INTERNAL);
    let attributes = &run_span["attributes"];
    assert_eq!(attributes["gen_ai.agent.name"], "otel_agent.py");
    assert_eq!(attributes["keel.run_id"], run.as_str());
    assert_eq!(attributes["keel.tenant"], "default");
    assert_eq!(attributes["keel.state"], "succeeded");
    assert_eq!(attributes["keel.attempt"], 1);
    assert_eq!(attributes["gen_ai.usage.input_tokens"], 21 + 31 + 41);

    // The LLM calls: `chat {model}`, CLIENT, with the conventions' attributes and usage.
    let chats = named(&spans, "chat scripted-model");
    assert_eq!(chats.len(), 3, "{spans:#?}");
    let by_tokens: BTreeMap<i64, &Value> =
        chats.iter().map(|s| (s["attributes"]["gen_ai.usage.input_tokens"].as_i64().unwrap(), *s)).collect();
    assert_eq!(by_tokens.keys().copied().collect::<Vec<_>>(), [21, 31, 41]);
    for (input, output_tokens) in [(21, 4), (31, 5), (41, 6)] {
        let span = by_tokens[&input];
        let a = &span["attributes"];
        assert_eq!(span["kind"], KIND_CLIENT);
        assert_eq!(a["gen_ai.operation.name"], "chat");
        assert_eq!(a["gen_ai.provider.name"], "scripted");
        assert_eq!(a["gen_ai.response.model"], "scripted-model");
        assert_eq!(a["gen_ai.response.finish_reasons"], json!(["stop"]));
        assert_eq!(a["gen_ai.usage.output_tokens"], output_tokens);
        assert!(a["keel.cost_usd"].as_f64().unwrap() > 0.0, "{a}");
        assert!(a.get("keel.replayed").is_none());
    }
    assert_eq!(by_tokens[&21]["attributes"]["gen_ai.request.model"], "scripted-model");
    // The SDK's calls are children of the run span; the gateway call, of the span its
    // `traceparent` header named.
    assert_eq!(by_tokens[&21]["parent_span_id"], root.as_str());
    assert_eq!(by_tokens[&41]["parent_span_id"], root.as_str());
    assert_eq!(by_tokens[&31]["parent_span_id"], output["gateway_parent"]);

    // Tool calls: `execute_tool {tool}` with the call's id; a failure sets the status.
    let echo = named(&spans, "execute_tool echo");
    assert_eq!(echo.len(), 1, "{spans:#?}");
    let seq = echo[0]["attributes"]["keel.seq"].as_i64().unwrap();
    assert_eq!(echo[0]["attributes"]["gen_ai.tool.name"], "echo");
    assert_eq!(echo[0]["attributes"]["gen_ai.tool.call.id"], format!("{run}:{seq}"));
    assert_eq!(echo[0]["parent_span_id"], root.as_str());
    let failed = named(&spans, "execute_tool fs.read");
    assert_eq!(failed.len(), 1, "{spans:#?}");
    assert_eq!(failed[0]["status"]["code"], STATUS_ERROR);
    assert_eq!(failed[0]["attributes"]["error.type"], "tool_error");

    // Every span in the one trace, under the run's span, from the `keel` scope.
    let ids: Vec<&str> = spans.iter().map(|s| s["span_id"].as_str().unwrap()).collect();
    for span in &spans {
        let parent = span["parent_span_id"].as_str().unwrap();
        assert!(parent.is_empty() || ids.contains(&parent) || parent == output["gateway_parent"], "{span}");
        assert_eq!(span["scope"], "keel");
        assert_eq!(span["resource"]["service.name"], "keel-under-test");
        assert_eq!(span["resource"]["deployment.environment"], "test");
    }
    // No prompt or completion left the kernel.
    let everything = serde_json::to_string(&spans).unwrap();
    assert!(!everything.contains("secret-prompt-text") && !everything.contains("a plan"), "{everything}");
    assert!(!everything.contains("gen_ai.input.messages"));
    // The collector's header from OTEL_EXPORTER_OTLP_HEADERS was sent.
    let requests = collector.lines("requests.jsonl");
    assert!(requests.iter().all(|r| r["headers"]["x-collector-key"] == "s3cret"), "{requests:?}");

    // The GenAI metrics: token usage by type and the operation's duration in seconds.
    let tokens = wait_for("the token usage metric to count all three calls", || {
        let totals = metric_totals(&collector.lines("metrics.jsonl"), "gen_ai.client.token.usage");
        (totals.get("input") == Some(&93.0) && totals.get("output") == Some(&15.0)).then_some(totals)
    });
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    let points = collector.lines("metrics.jsonl");
    let duration = points.iter().find(|p| p["name"] == "gen_ai.client.operation.duration").expect("duration");
    assert_eq!(duration["unit"], "s");
    assert_eq!(duration["kind"], "histogram");
    assert_eq!(duration["attributes"]["gen_ai.operation.name"], "chat");
    assert_eq!(duration["attributes"]["gen_ai.provider.name"], "scripted");
}

/// The latest cumulative sum of `metric` per `gen_ai.token.type`, over its attribute sets.
fn metric_totals(points: &[Value], metric: &str) -> HashMap<String, f64> {
    let mut latest: HashMap<String, (String, f64)> = HashMap::new();
    for point in points.iter().filter(|p| p["name"] == metric) {
        let key = point["attributes"].to_string();
        let kind = point["attributes"]["gen_ai.token.type"].as_str().unwrap_or_default().to_owned();
        let sum = point["sum"].as_f64().unwrap_or_default();
        let entry = latest.entry(key).or_insert((kind, 0.0));
        entry.1 = entry.1.max(sum);
    }
    let mut totals = HashMap::new();
    for (kind, sum) in latest.into_values() {
        *totals.entry(kind).or_insert(0.0) += sum;
    }
    totals
}

#[test]
fn prompts_and_completions_are_exported_only_when_the_operator_opts_in() {
    let collector = Collector::start();
    let keel = traced(&collector, &[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")]);
    let run = otel_run(&keel, json!({}));
    assert_eq!(keel.wait_state(&run, &["succeeded", "failed"])["state"], "succeeded");
    let spans = collector.run_trace(&run);
    let plan = named(&spans, "chat scripted-model")
        .into_iter()
        .find(|s| s["attributes"]["gen_ai.usage.input_tokens"] == 21)
        .expect("the first chat span");
    let input = plan["attributes"]["gen_ai.input.messages"].as_str().expect("input messages");
    assert!(input.contains("secret-prompt-text"), "{input}");
    let output = plan["attributes"]["gen_ai.output.messages"].as_str().expect("output messages");
    assert!(output.contains("a plan"), "{output}");
    let echo = named(&spans, "execute_tool echo");
    assert!(echo[0]["attributes"]["gen_ai.tool.call.arguments"].as_str().unwrap().contains("hi"));
}

#[test]
fn a_recovered_run_continues_its_trace_with_one_run_span_and_no_second_llm_span() {
    let collector = Collector::start();
    let mut keel = traced(&collector, &[]);
    let run = otel_run(&keel, json!({ "ask": true }));
    let trace = trace_id(&run);
    let view = keel.wait_state(&run, &["waiting"]);
    // The first attempt's calls reached the collector before the crash.
    wait_for("the first attempt's chat spans", || {
        (named(&collector.spans(&trace), "chat scripted-model").len() == 2).then_some(())
    });
    keel.crash_daemon_under(&view);
    // The new kernel replays the calls and parks the run at its question again.
    wait_for("the run to be recovered and waiting", || {
        let view = keel.inspect(&run);
        (view["attempt"] == 2 && view["state"] == "waiting").then_some(())
    });
    keel.ok(&["answer", &run, "--text", "yes"]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["replies"], json!(["a plan", "gateway reply", "done"]));
    assert_eq!(done["provider_calls"], 3, "each call paid once");

    let spans = collector.run_trace(&run);
    // One run span whatever crashed, in the same trace, at the last attempt.
    let runs: Vec<&Value> =
        spans.iter().filter(|s| s["attributes"]["gen_ai.operation.name"] == "invoke_agent").collect();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["attributes"]["keel.attempt"], 2);
    assert_eq!(runs[0]["span_id"], run_span_id(&run));

    // Each LLM call has exactly one live span; what the journal answered after the crash
    // is marked replayed and carries no usage.
    let chats = named(&spans, "chat scripted-model");
    let live_chats = live(chats.clone());
    let mut served: Vec<i64> =
        live_chats.iter().map(|s| s["attributes"]["gen_ai.usage.input_tokens"].as_i64().unwrap()).collect();
    served.sort();
    assert_eq!(served, [21, 31, 41], "{chats:#?}");
    let replayed: Vec<&&Value> = chats.iter().filter(|s| s["attributes"]["keel.replayed"] == true).collect();
    assert_eq!(replayed.len(), 2, "the plan and the gateway call were replayed: {chats:#?}");
    for span in replayed {
        let a = span["attributes"].as_object().unwrap();
        assert!(a.keys().all(|k| !k.starts_with("gen_ai.usage")), "{span}");
    }
    // The replayed gateway call nests under the agent's span again.
    assert!(chats.iter().filter(|s| s["parent_span_id"] == "00f067aa0ba902b7").count() == 2, "{chats:#?}");
    // The question waited as a span of its own (the second attempt's, answered).
    let asks = named(&spans, "wait human");
    assert_eq!(asks.len(), 1, "{asks:#?}");
    assert_eq!(asks[0]["attributes"]["keel.wait"], "human");
}

#[test]
fn a_bad_endpoint_stops_the_start_and_an_unreachable_collector_fails_nothing() {
    let keel = Keel::new();
    for (variable, value) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://c:4317"),
    ] {
        let out = keel
            .cmd()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env(variable, value)
            .output()
            .expect("keel");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(variable) && stderr.contains("http://"), "{stderr}");
    }
    let out = keel
        .cmd()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .expect("keel");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("http/protobuf"));

    // Nothing listens on the collector's port: the run goes on as if untraced.
    let mut keel = Keel::new();
    keel.daemon_env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT".into(), "http://127.0.0.1:9".into())];
    keel.start_daemon();
    let run = otel_run(&keel, json!({}));
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["output"]["traceparent"].as_str().is_some_and(|t| t.contains(&trace_id(&run))));

    // And without any OTEL_* variable, the agent gets no TRACEPARENT.
    let mut plain = Keel::new();
    plain.start_daemon();
    let run = otel_run(&plain, json!({}));
    let done = plain.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["traceparent"], Value::Null);
}

#[test]
fn a_child_runs_trace_links_to_its_parents_run_span() {
    let collector = Collector::start();
    let keel = traced(&collector, &[]);
    let child = json!({"command": ["python3", agent("proc_agent.py")], "input": {}});
    let input = json!({"spawn": [child], "wait": true}).to_string();
    let parent =
        keel.detach(&["--sandbox", "none", "--input", &input, "--", "python3", &agent("proc_agent.py")]);
    let done = keel.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    let child = done["output"]["children"][0].as_str().expect("the child's id").to_owned();

    // The child is a trace of its own (derived from its own id), linked to the parent.
    let child_spans = collector.run_trace(&child);
    let child_run = child_spans
        .iter()
        .find(|s| s["attributes"]["gen_ai.operation.name"] == "invoke_agent")
        .expect("the child's run span");
    assert_eq!(child_run["span_id"], run_span_id(&child));
    assert_eq!(child_run["links"], json!([{"trace_id": trace_id(&parent), "span_id": run_span_id(&parent)}]));
    assert_eq!(child_run["attributes"]["keel.parent_run_id"], parent.as_str());

    // The parent's trace has the spawn and the wait for the child.
    let parent_spans = collector.run_trace(&parent);
    assert_eq!(named(&parent_spans, "spawn child run").len(), 1, "{parent_spans:#?}");
    let waits = named(&parent_spans, "wait child");
    assert_eq!(waits.len(), 1, "{parent_spans:#?}");
    assert_eq!(waits[0]["attributes"]["keel.wait"], "child");
    assert_eq!(waits[0]["parent_span_id"], run_span_id(&parent));
}

#[test]
fn waits_for_an_approval_a_message_and_a_budget_code_exec_and_embeddings_have_their_spans() {
    let collector = Collector::start();
    let keel = traced_with(&collector, &[], Some("[tools.policy.\"kv.put\"]\nrequires_approval = true\n"));
    let script = agent("otel_script.json");
    let path = agent("otel_waits_agent.py");
    let run = keel.detach(&[
        "--sandbox",
        "none",
        "--llm-script",
        &script,
        "--grant",
        "echo",
        "--grant",
        "kv.put",
        "--budget-llm-calls",
        "1",
        "--",
        "python3",
        &path,
    ]);
    // The operator's three answers, each once the run waits for it.
    let reason_of = |wanted: &str| {
        wait_for(&format!("the run to wait for {wanted}"), || {
            let view = keel.inspect(&run);
            let reason = view["reason"].as_str().unwrap_or_default().to_owned();
            (view["state"] == "waiting" && reason.contains(wanted)).then_some(reason)
        })
    };
    reason_of("keel approve");
    keel.ok(&["approve", &run]);
    wait_for("the run to wait for a message", || {
        (keel.inspect(&run)["wait_reason"] == "message").then_some(())
    });
    keel.ok(&["send", &run, "--json", r#"{"go": true}"#]);
    reason_of("--add-llm-calls");
    keel.ok(&["budget", &run, "--add-llm-calls", "1"]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["vectors"], 1);

    let spans = collector.run_trace(&run);
    let root = run_span_id(&run);
    for (name, wait) in
        [("wait approval", "approval"), ("wait message", "message"), ("wait budget", "budget")]
    {
        let found = named(&spans, name);
        assert_eq!(found.len(), 1, "{name}: {spans:#?}");
        assert_eq!(found[0]["attributes"]["keel.wait"], wait, "{name}");
        let (start, end) = (found[0]["start_ns"].as_u64().unwrap(), found[0]["end_ns"].as_u64().unwrap());
        assert!(end > start, "{name} lasts as long as the wait");
    }
    // The program's span, with its tool call as a child.
    let exec = named(&spans, "code.exec");
    assert_eq!(exec.len(), 1, "{spans:#?}");
    assert_eq!(exec[0]["parent_span_id"], root.as_str());
    let echo = named(&spans, "execute_tool echo");
    assert_eq!(echo.len(), 1, "{spans:#?}");
    assert_eq!(
        echo[0]["parent_span_id"], exec[0]["span_id"],
        "a program's tool call nests under its code.exec"
    );
    // The embedding: `embeddings {model}` with the operation's name.
    let embeds: Vec<&Value> =
        spans.iter().filter(|s| s["attributes"]["gen_ai.operation.name"] == "embeddings").collect();
    assert_eq!(embeds.len(), 1, "{spans:#?}");
    assert!(embeds[0]["name"].as_str().unwrap().starts_with("embeddings "), "{}", embeds[0]);
    assert_eq!(embeds[0]["kind"], KIND_CLIENT);
    // The approved tool call and both LLM calls, once each.
    assert_eq!(named(&spans, "execute_tool kv.put").len(), 1, "{spans:#?}");
    assert_eq!(live(named(&spans, "chat scripted-model")).len(), 2, "{spans:#?}");
}
