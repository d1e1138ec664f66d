//! The provider-compatible gateway with the official `openai` and `anthropic` Python
//! packages and an unmodified LangGraph agent, and the guarantee that provider keys never
//! reach an agent.

use serde_json::Value;

use crate::harness::{Keel, agent, journaled_llm_calls, wait_for};

fn stdout_json(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "agent failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line =
        stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {stdout}"));
    serde_json::from_str(line).expect("agent JSON")
}

#[test]
fn the_openai_sdk_runs_unmodified_and_every_call_is_journaled() {
    let keel = Keel::new();
    let script = agent("openai_script.json");
    let out =
        keel.run(&["run", "--quiet", "--llm-script", &script, "--", "python3", &agent("openai_agent.py")]);
    let seen = stdout_json(&out);
    assert_eq!(seen["plain"], "hello from the kernel");
    assert_eq!(seen["plain_usage"], serde_json::json!([9, 4]));
    assert_eq!(seen["streamed"], "roses are journaled, violets replayed");
    assert_eq!(seen["stream_usage"], serde_json::json!([10, 7]));
    assert_eq!(seen["tool_call"], serde_json::json!(["add", {"a": 2, "b": 3}]));
    assert_eq!(seen["finish_reasons"], serde_json::json!(["tool_calls", "stop"]));
    assert_eq!(seen["final"], "2 plus 3 is 5.");
    assert_eq!(seen["bad_key"], "AuthenticationError", "a key that is not a run token is refused with 401");
    let run = keel.json(&["ps", "--json"])[0].clone();
    assert_eq!(run["provider_calls"], 4);
    assert_eq!(run["usage"]["input_tokens"], 9 + 10 + 30 + 45);
}

#[test]
fn the_anthropic_sdk_runs_unmodified() {
    let keel = Keel::new();
    let script = agent("openai_script.json");
    let out =
        keel.run(&["run", "--quiet", "--llm-script", &script, "--", "python3", &agent("anthropic_agent.py")]);
    let seen = stdout_json(&out);
    assert_eq!(seen["plain"], "hello from the kernel");
    assert_eq!(seen["stop_reason"], "end_turn");
    assert_eq!(seen["usage"], serde_json::json!([9, 4]));
    assert_eq!(seen["streamed"], "roses are journaled, violets replayed");
    assert_eq!(seen["stream_stop_reason"], "end_turn");
    assert_eq!(keel.json(&["ps", "--json"])[0]["provider_calls"], 2);
}

#[test]
fn provider_keys_never_reach_the_agent() {
    let secrets = [
        ("OPENAI_API_KEY", "sk-real-openai-7d1f"),
        ("ANTHROPIC_API_KEY", "sk-ant-real-93ac"),
        ("GROQ_API_KEY", "gsk-real-51"),
    ];
    // Embedded kernel: the keys are in the environment of `keel run` itself.
    let keel = Keel::new();
    let out = keel
        .cmd()
        .args(["run", "--quiet", "--", "python3", &agent("env_agent.py")])
        .envs(secrets)
        .output()
        .unwrap();
    check_no_secrets(&stdout_json(&out), &secrets);
    // Daemon: the keys are in the kernel's environment.
    let mut keel = Keel::new();
    keel.daemon_env = secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("env_agent.py")]);
    keel.wait_state(&run, &["succeeded"]);
    let logs = keel.ok(&["logs", &run]);
    let line = logs.lines().find(|l| l.starts_with('{')).expect("agent output");
    check_no_secrets(&serde_json::from_str(line).unwrap(), &secrets);
}

fn check_no_secrets(seen: &Value, secrets: &[(&str, &str)]) {
    let text = seen.to_string();
    for (_, secret) in secrets {
        assert!(!text.contains(secret), "a provider key reached the agent: {secret}");
    }
    let env = &seen["env"];
    assert_eq!(env["OPENAI_API_KEY"], env["KEEL_RUN_TOKEN"], "the agent's API key is its run token");
    assert_eq!(env["ANTHROPIC_API_KEY"], env["KEEL_RUN_TOKEN"]);
    assert!(env["OPENAI_BASE_URL"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    assert!(env.get("GROQ_API_KEY").is_none());
}

/// The mock upstream's process, killed when the test ends, passed or failed (a failing
/// test used to leave it running).
pub(crate) struct Upstream(std::process::Child);

impl Upstream {
    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the mock OpenAI upstream; returns (process, port, counts file).
pub(crate) fn mock_upstream(keel: &Keel, script: &str) -> (Upstream, u16, std::path::PathBuf) {
    let port_file = keel.data.path().join("mock.port");
    let counts = keel.data.path().join("mock.counts");
    let child = std::process::Command::new("python3")
        .args([&agent("mock_upstream.py"), script, port_file.to_str().unwrap()])
        .env("MOCK_COUNTS", &counts)
        .spawn()
        .expect("start the mock upstream");
    let child = Upstream(child);
    let port =
        wait_for("the mock upstream", || std::fs::read_to_string(&port_file).ok()?.trim().parse().ok());
    (child, port, counts)
}

/// Points the daemon's OpenAI provider at the mock upstream on `port`: its Chat
/// Completions API, or with `responses` its Responses API (`api = "responses"` in
/// keel.toml).
pub(crate) fn use_upstream(keel: &mut Keel, port: u16, responses: bool) {
    keel.daemon_env = vec![("OPENAI_API_KEY".into(), "sk-upstream-test".into())];
    if responses {
        std::fs::write(
            keel.data.path().join("keel.toml"),
            format!(
                "[llm]\ndefault_model = \"openai/gpt-4o-mini\"\n\n[llm.providers.openai]\nbase_url = \
                 \"http://127.0.0.1:{port}/v1\"\napi = \"responses\"\n"
            ),
        )
        .expect("keel.toml");
    } else {
        keel.daemon_env.push(("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")));
    }
}

pub(crate) fn read_counts(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|_| "{}".into())).unwrap_or_default()
}

#[test]
fn langgraph_survives_a_daemon_kill_and_the_upstream_serves_each_call_once() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("langgraph_script.json"));
    use_upstream(&mut keel, port, false);
    keel.start_daemon();
    let run = keel.detach(&[
        "--env",
        "LANGGRAPH_TOOL_DELAY_MS=1500",
        "--",
        "python3",
        &agent("langgraph_agent.py"),
    ]);
    // Kill the daemon while the agent runs its first tool (after one LLM call).
    wait_for("the first LLM call to be journaled", || {
        let view = keel.inspect(&run);
        let llm = journaled_llm_calls(&view);
        (llm >= 1).then_some(())
    });
    keel.kill_daemon();
    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{logs}");
    assert!(logs.contains("(2 + 3) + 4 = 9"), "{logs}");
    assert!(done["attempt"].as_u64().unwrap() >= 2);
    let counts = read_counts(&counts);
    upstream.kill();
    assert_eq!(counts["errors"], serde_json::json!([]), "request invariants: {counts}");
    assert_eq!(counts["total"], 3, "three distinct calls, each served once: {counts}");
    assert!(counts["counts"].as_object().unwrap().values().all(|n| n == 1), "{counts}");
    assert_eq!(done["provider_calls"], 3);
}

#[test]
fn streamed_calls_replay_as_streams_after_a_daemon_kill() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let script = agent("openai_script.json");
    let run = keel.detach(&[
        "--llm-script",
        &script,
        "--env",
        "STREAM_AGENT_DELAY_MS=1500",
        "--",
        "python3",
        &agent("stream_crash_agent.py"),
    ]);
    wait_for("both streamed calls to be journaled", || {
        let view = keel.inspect(&run);
        let done = journaled_llm_calls(&view);
        (done >= 2).then_some(())
    });
    keel.kill_daemon();
    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{logs}");
    let line = logs.lines().find(|l| l.starts_with('{')).expect("agent output");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["first"], "hello from the kernel");
    assert_eq!(seen["second"], "roses are journaled, violets replayed");
    assert_eq!(seen["third"], "and one more after the crash");
    assert_eq!(done["provider_calls"], 3, "the two replayed streams were not served again");
}

#[test]
fn the_sdks_reach_real_providers_backed_by_a_mock_upstream() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("openai_script.json"));
    keel.daemon_env = vec![
        ("OPENAI_API_KEY".into(), "sk-upstream-test".into()),
        ("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-upstream-test".into()),
        ("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}")),
    ];
    keel.start_daemon();
    let mut outputs = Vec::new();
    for agent_file in ["openai_agent.py", "anthropic_agent.py"] {
        let run = keel.detach(&["--", "python3", &agent(agent_file)]);
        let done = keel.wait_state(&run, &["succeeded", "failed"]);
        let logs = keel.ok(&["logs", &run]);
        assert_eq!(done["state"], "succeeded", "{agent_file}: {logs}");
        let line = logs.lines().find(|l| l.starts_with('{')).expect("agent output").to_owned();
        outputs.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    upstream.kill();
    let (openai, anthropic) = (&outputs[0], &outputs[1]);
    assert_eq!(openai["plain"], "hello from the kernel");
    assert_eq!(openai["streamed"].as_str().unwrap().trim(), "roses are journaled, violets replayed");
    assert_eq!(openai["stream_usage"], serde_json::json!([10, 7]));
    assert_eq!(openai["tool_call"], serde_json::json!(["add", {"a": 2, "b": 3}]));
    assert_eq!(openai["final"], "2 plus 3 is 5.");
    assert_eq!(anthropic["plain"], "hello from the kernel");
    assert_eq!(anthropic["streamed"].as_str().unwrap().trim(), "roses are journaled, violets replayed");
    assert_eq!(anthropic["stop_reason"], "end_turn");
    let counts = read_counts(&counts);
    assert_eq!(counts["errors"], serde_json::json!([]), "request invariants at the upstream: {counts}");
    assert_eq!(counts["total"], 6, "4 OpenAI + 2 Anthropic calls, each served once: {counts}");
}

/// Issue 12: an SDK asking for what the gateway does not serve (before, the Responses
/// API, the default of the newest agent SDKs) got a 404 with an empty body. It now gets
/// an error in its own dialect naming the path and what is served (405 for a served path
/// asked with another method); and `GET /v1/models`, which some clients call first, lists
/// the run's models.
#[test]
fn what_the_gateway_does_not_serve_is_named_in_the_callers_dialect() {
    let keel = Keel::new();
    let script = agent("openai_script.json");
    let out = keel.run(&[
        "run",
        "--quiet",
        "--llm-script",
        &script,
        "--model",
        "openai/gpt-4o-mini",
        "--fallback-model",
        "anthropic/claude-haiku-4-5",
        "--",
        "python3",
        &agent("unserved_agent.py"),
    ]);
    let seen = stdout_json(&out);
    assert_eq!(seen["input_items"]["status"], 404, "{seen}");
    let message = seen["input_items"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GET /v1/responses/resp_1/input_items")
            && message.contains("POST /v1/responses")
            && message.contains("POST /v1/chat/completions"),
        "{message}"
    );
    assert_eq!(seen["delete"]["status"], 405, "a served path asked with another method: {seen}");
    let models = serde_json::json!(["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"]);
    assert_eq!((&seen["models"], &seen["anthropic_models"]), (&models, &models), "{seen}");
    assert_eq!(seen["files"]["status"], 404, "{seen}");
    assert!(seen["files"]["message"].as_str().unwrap_or_default().contains("GET /v1/files"), "{seen}");
    assert_eq!(seen["anthropic_files"]["status"], 404, "{seen}");
    assert_eq!(seen["anthropic_files"]["type"], "not_found_error", "{seen}");
}

/// Issue 12: with `api = "responses"` on the provider, an unmodified agent using the
/// official `openai` package's Chat Completions API gets every answer (plain, streamed,
/// a tool-call round trip) through the upstream's `POST /v1/responses`, which checks each
/// request (stateless, no chat fields, well-formed items, reasoning only as it sent it).
#[test]
fn a_chat_agent_is_served_through_an_upstream_responses_api() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("openai_script.json"));
    use_upstream(&mut keel, port, true);
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("openai_agent.py")]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    upstream.kill();
    assert_eq!(done["state"], "succeeded", "{logs}\n{done}");
    let line = logs.lines().find(|l| l.starts_with('{')).expect("agent output");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["plain"], "hello from the kernel");
    assert_eq!(seen["plain_usage"], serde_json::json!([9, 4]));
    assert_eq!(seen["streamed"].as_str().unwrap().trim(), "roses are journaled, violets replayed");
    assert_eq!(seen["stream_usage"], serde_json::json!([10, 7]));
    assert_eq!(seen["tool_call"], serde_json::json!(["add", {"a": 2, "b": 3}]));
    assert_eq!(seen["finish_reasons"], serde_json::json!(["tool_calls", "stop"]));
    assert_eq!(seen["final"], "2 plus 3 is 5.");
    let counts = read_counts(&counts);
    assert_eq!(counts["errors"], serde_json::json!([]), "request invariants at the upstream: {counts}");
    assert_eq!(
        counts["paths"],
        serde_json::json!({"/v1/responses": 4}),
        "every call went to /v1/responses, each once: {counts}"
    );
    assert_eq!(done["provider_calls"], 4);
    let journal = done["journal"].as_array().unwrap();
    let results: Vec<&Value> =
        journal.iter().filter(|e| e["method"] == "llm.chat").map(|e| &e["result"]).collect();
    assert_eq!(results.len(), 4, "{journal:?}");
    for result in results {
        assert_eq!(result["provider"]["api"], "responses", "{result}");
        // The upstream's reasoning is journaled with the answer, for a Responses client.
        assert_eq!(result["response"]["message"]["reasoning"][0]["type"], "reasoning", "{result}");
    }
}
