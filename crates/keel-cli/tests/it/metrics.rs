//! Prometheus metrics (issue 14): `GET /metrics` scraped over real HTTP and parsed by the
//! Prometheus project's Python client (`tests/agents/scrape_metrics.py`), with the values
//! checked against what the runs did as `keel inspect` reports it: LLM calls, tokens and
//! cost per tenant, runs by state, failed calls by class, syscalls by method. Only the
//! operator's token reads it on the API's listener; `--metrics-listen` serves it without
//! one; a bad `--metrics-listen` is refused saying why; and after a SIGKILL the calls
//! replayed from the journal are not counted again.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use crate::harness::{Keel, agent, wait_for};

/// A parsed scrape: the families by name.
struct Scrape {
    status: u16,
    content_type: String,
    /// The content type and family names of the OpenMetrics scrape.
    openmetrics: Value,
    body: String,
    families: BTreeMap<String, Value>,
}

impl Scrape {
    /// The value of the sample `name` whose labels include `labels` (0 when absent).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name, labels).iter().map(|s| s["value"].as_f64().unwrap()).sum()
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<Value> {
        self.families
            .values()
            .flat_map(|family| family["samples"].as_array().cloned().unwrap_or_default())
            .filter(|sample| sample["name"] == name)
            .filter(|sample| labels.iter().all(|(k, v)| sample["labels"][*k] == *v))
            .collect()
    }
}

fn scrape(url: &str, token: Option<&str>) -> Scrape {
    let mut cmd = Command::new("python3");
    cmd.arg(crate::harness::agents().join("scrape_metrics.py")).arg(url);
    if let Some(token) = token {
        cmd.arg(token);
    }
    let out = cmd.output().expect("run scrape_metrics.py");
    assert!(
        out.status.success(),
        "scrape_metrics.py failed (is prometheus_client installed? scripts/test-requirements.txt):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("scrape_metrics.py prints JSON");
    Scrape {
        status: parsed["status"].as_u64().unwrap() as u16,
        content_type: parsed["content_type"].as_str().unwrap_or_default().to_owned(),
        openmetrics: parsed["openmetrics"].clone(),
        body: parsed["body"].as_str().unwrap_or_default().to_owned(),
        families: parsed["families"]
            .as_array()
            .unwrap()
            .iter()
            .map(|family| (family["name"].as_str().unwrap().to_owned(), family.clone()))
            .collect(),
    }
}

fn api_url(keel: &Keel) -> String {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    format!("http://{}/metrics", info["addr"].as_str().unwrap())
}

/// The address `keel serve --metrics-listen` announced in the daemon's log.
fn metrics_listen_url(keel: &Keel) -> String {
    wait_for("the metrics listener's address in the daemon log", || {
        let log = std::fs::read_to_string(keel.data.path().join("daemon.log")).ok()?;
        let line = log.lines().rev().find(|l| l.contains("metrics (Prometheus, no token) at "))?;
        Some(line.rsplit(' ').next()?.to_owned())
    })
}

fn admin_token(keel: &Keel) -> String {
    std::fs::read_to_string(keel.data.path().join("api-token")).unwrap().trim().to_owned()
}

fn detach_as(keel: &Keel, token: &str, args: &[&str]) -> String {
    let out = keel
        .cmd()
        .env("KEEL_API_TOKEN", token)
        .args(["run", "--detach", "--json"])
        .args(args)
        .output()
        .expect("spawn keel");
    assert!(out.status.success(), "keel run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value["run_id"].as_str().unwrap().to_owned()
}

/// Usage summed over runs as `keel inspect` reports it: (llm calls served, input tokens,
/// output tokens, cost in USD).
fn usage_of(views: &[&Value]) -> (f64, f64, f64, f64) {
    views.iter().fold((0.0, 0.0, 0.0, 0.0), |acc, view| {
        let usage = &view["usage"];
        (
            acc.0 + view["provider_calls"].as_f64().unwrap(),
            acc.1 + usage["input_tokens"].as_f64().unwrap(),
            acc.2 + usage["output_tokens"].as_f64().unwrap(),
            acc.3 + usage["cost_usd"].as_f64().unwrap(),
        )
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn metrics_match_what_the_runs_did() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none", "--metrics-listen", "127.0.0.1:0"]);
    let admin = admin_token(&keel);
    keel.ok(&["tenant", "create", "acme"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let script = agent("metrics_script.json");
    let empty_script = keel.data.path().join("empty_script.json");
    // Only a `match` entry that the call never matches: the call finds no response.
    std::fs::write(&empty_script, r#"{"responses": [{"match": "never asked", "content": "x"}]}"#).unwrap();

    // The operator's runs: twelve LLM calls; a tool call; an agent that fails; an LLM
    // call the script cannot answer (a failed call, then a failed run).
    let llm = keel.detach(&["--llm-script", &script, "--", "python3", &agent("crash_agent.py")]);
    let tool = keel.detach(&["--", "python3", &agent("echo_agent.py")]);
    let failing = keel.detach(&["--", "python3", &agent("fail_agent.py")]);
    let unanswered = keel.detach(&[
        "--llm-script",
        empty_script.to_str().unwrap(),
        "--",
        "python3",
        &agent("llm_once_agent.py"),
    ]);
    // A tenant's run: one LLM call.
    let tenant_run =
        detach_as(&keel, &acme, &["--llm-script", &script, "--", "python3", &agent("llm_once_agent.py")]);

    let llm = keel.wait_state(&llm, &["succeeded"]);
    let tool = keel.wait_state(&tool, &["succeeded"]);
    keel.wait_state(&failing, &["failed"]);
    keel.wait_state(&unanswered, &["failed"]);
    let tenant_run = keel.wait_state(&tenant_run, &["succeeded"]);

    // The operator's memory: a put embeds its text, a semantic search its query, a text
    // search nothing.
    keel.ok(&["mem", "put", "notes", "a", "hello", "--text", "hello metrics"]);
    keel.ok(&["mem", "search", "notes", "hello", "--mode", "semantic"]);
    keel.ok(&["mem", "search", "notes", "hello"]);

    let scraped = scrape(&api_url(&keel), Some(&admin));
    assert_eq!(scraped.status, 200, "{}", scraped.body);
    assert_eq!(scraped.content_type, "text/plain; version=0.0.4; charset=utf-8");
    let openmetrics_type = scraped.openmetrics["content_type"].as_str().unwrap();
    assert!(
        openmetrics_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{openmetrics_type}"
    );
    // Both formats carry the same families (the strict OpenMetrics parser read them all).
    let openmetrics_names: Vec<&str> =
        scraped.openmetrics["families"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    for name in scraped.families.keys() {
        let bare = name.strip_suffix("_total").unwrap_or(name);
        assert!(openmetrics_names.contains(&bare), "{name} is in the OpenMetrics scrape too");
    }
    // Counters are typed as counters (not `unknown`), histograms as histograms.
    assert_eq!(scraped.families["keel_llm_calls"]["type"], "counter");
    assert_eq!(scraped.families["keel_syscall_duration_seconds"]["type"], "histogram");

    // LLM calls, tokens and cost per tenant equal `keel inspect`'s usage of its runs.
    for (tenant, views) in [("default", vec![&llm, &tool]), ("acme", vec![&tenant_run])] {
        let (calls, input, output, cost) = usage_of(&views);
        let labels = [("tenant", tenant), ("provider", "scripted"), ("model", "mock-large")];
        assert!(calls > 0.0 && cost > 0.0, "{tenant}: the runs made priced calls");
        assert_eq!(scraped.value("keel_llm_calls_total", &labels), calls, "{tenant}: calls");
        assert_eq!(scraped.value("keel_llm_input_tokens_total", &labels), input, "{tenant}: input tokens");
        assert_eq!(scraped.value("keel_llm_output_tokens_total", &labels), output, "{tenant}: output tokens");
        let counted = scraped.value("keel_llm_cost_usd_total", &labels);
        assert!(close(counted, cost), "{tenant}: cost {counted} vs inspect's {cost}");
    }
    assert_eq!(scraped.value("keel_llm_calls_total", &[]), 13.0, "12 + 1 served calls, nothing else");
    let embedder = [("tenant", "default"), ("model", "keel-hash-256")];
    assert_eq!(
        scraped.value("keel_embedding_calls_total", &embedder),
        2.0,
        "the put and the semantic search"
    );
    // The unanswerable call failed before any provider: class `script`.
    assert_eq!(scraped.value("keel_llm_errors_total", &[("class", "script")]), 1.0);

    // Runs by tenant and state, from the store.
    let runs =
        |tenant: &str, state: &str| scraped.value("keel_runs", &[("tenant", tenant), ("state", state)]);
    assert_eq!(runs("default", "succeeded"), 2.0);
    assert_eq!(runs("default", "failed"), 2.0);
    assert_eq!(runs("default", "running"), 0.0, "every state of a tenant is shown, 0 included");
    assert_eq!(runs("acme", "succeeded"), 1.0);
    assert_eq!(scraped.value("keel_runs", &[]), 5.0);

    // Syscalls by method: every llm.chat (13 served, 1 failed) and the tool call.
    let syscalls = |method: &str| scraped.value("keel_syscall_duration_seconds_count", &[("method", method)]);
    assert_eq!(syscalls("llm.chat"), 14.0);
    assert_eq!(syscalls("tool.call"), 1.0);
    assert_eq!(syscalls("run.exit"), 3.0, "the LLM run, the tool run and the tenant's run exited by call");
    assert!(scraped.value("keel_journal_commit_seconds_count", &[("op", "append")]) >= 14.0);
    assert!(scraped.value("keel_journal_commit_seconds_count", &[("op", "complete")]) >= 13.0);
    // Five agents started, each cold (the none tier has no pool).
    assert_eq!(scraped.value("keel_sandbox_spawn_seconds_count", &[("tier", "none"), ("kind", "cold")]), 5.0);
    assert_eq!(scraped.value("keel_live_slots_used", &[]), 0.0);
    assert_eq!(scraped.value("keel_llm_queue_wait_seconds_count", &[]), 13.0, "one per served call");

    // Every family has help text and a keel_ name; no label carries a run id.
    let run_ids = [&llm["run_id"], &tool["run_id"], &tenant_run["run_id"]];
    for (name, family) in &scraped.families {
        assert!(name.starts_with("keel_"), "{name}");
        assert!(!family["help"].as_str().unwrap_or_default().is_empty(), "{name} has HELP text");
        for sample in family["samples"].as_array().unwrap() {
            for (label, value) in sample["labels"].as_object().unwrap() {
                assert!(!label.contains("run") && !label.contains("call_id"), "{name}: label {label}");
                assert!(
                    run_ids.iter().all(|id| value != *id) && !value.as_str().unwrap().starts_with("run_")
                );
            }
        }
    }

    // Only the operator: a tenant's token is refused, no token is unauthenticated.
    let refused = scrape(&api_url(&keel), Some(&acme));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("operator"), "{}", refused.body);
    assert_eq!(scrape(&api_url(&keel), None).status, 401);

    // `--metrics-listen`: the same metrics without a token, and nothing else there.
    let open = scrape(&metrics_listen_url(&keel), None);
    assert_eq!(open.status, 200, "{}", open.body);
    assert_eq!(open.value("keel_llm_calls_total", &[]), 13.0);
    let elsewhere = metrics_listen_url(&keel).replace("/metrics", "/v1/runs");
    let other = scrape(&elsewhere, None);
    assert_eq!(other.status, 404, "{}", other.body);
}

#[test]
fn a_bad_metrics_listen_address_is_refused_saying_why() {
    let keel = Keel::new();
    for (bad, says) in [("nonsense", "HOST:PORT"), ("127.0.0.1:99999", "HOST:PORT"), (":9464", "HOST:PORT")] {
        let out = keel.run(&["serve", "--listen", "127.0.0.1:0", "--metrics-listen", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} must be refused");
        assert!(stderr.contains("--metrics-listen") && stderr.contains(says), "{bad}: {stderr}");
    }
    // An address in use: the bind fails, naming the address and the flag.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = keel.run(&["serve", "--listen", "127.0.0.1:0", "--metrics-listen", &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&addr) && stderr.contains("--metrics-listen"), "{stderr}");
}

/// The LLM calls a run's store record says were served (`provider_calls`), read straight
/// from the SQLite file while no kernel runs.
fn provider_calls_in_store(keel: &Keel, run: &str) -> u64 {
    let code = "import sqlite3, sys\n\
                db = sqlite3.connect(sys.argv[1])\n\
                print(db.execute('SELECT provider_calls FROM runs WHERE id = ?', (sys.argv[2],)).fetchone()[0])";
    let out = Command::new("python3")
        .args(["-c", code])
        .arg(keel.data.path().join("keel.db"))
        .arg(run)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn replayed_llm_calls_are_not_counted_again_after_a_crash() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none"]);
    let script = agent("metrics_script.json");
    let run = keel.detach(&[
        "--llm-script",
        &script,
        "--env",
        "CRASH_AGENT_DELAY_MS=150",
        "--",
        "python3",
        &agent("crash_agent.py"),
    ]);
    let view = wait_for("eight LLM calls journaled", || {
        let view = keel.inspect(&run);
        (crate::harness::journaled_llm_calls(&view) >= 8 || view["state"] == "succeeded").then_some(view)
    });
    assert_ne!(view["state"], "succeeded", "the run finished before the kill; slow it down");
    let agent_pid = view["pid"].as_u64().map(|p| p as u32);
    keel.kill_daemon();
    if let Some(pid) = agent_pid {
        wait_for("the agent to die with the daemon", || (!crate::harness::alive(pid)).then_some(()));
    }
    let served_before = provider_calls_in_store(&keel, &run);
    assert!((8..12).contains(&served_before), "{served_before} calls served before the kill");

    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded"]);
    assert_eq!(done["provider_calls"], 12, "every call served once across the crash");

    let scraped = scrape(&api_url(&keel), Some(&admin_token(&keel)));
    assert_eq!(scraped.status, 200, "{}", scraped.body);
    // The new daemon counts only what a provider served since it started: the calls
    // after the crash, not the ones the journal answered.
    let labels = [("tenant", "default"), ("provider", "scripted"), ("model", "mock-large")];
    assert_eq!(scraped.value("keel_llm_calls_total", &labels), (12 - served_before) as f64);
    // Replayed syscalls are still syscalls: the relaunched agent restored its checkpoint
    // (after step 5) and asked steps 6 to 12 again, the first ones answered by replay.
    assert_eq!(scraped.value("keel_syscall_duration_seconds_count", &[("method", "llm.chat")]), 7.0);
    // The one interrupted run was brought back once.
    assert_eq!(scraped.value("keel_runs_recovered_total", &[]), 1.0);
}
