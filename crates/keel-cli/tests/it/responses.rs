//! The OpenAI Responses API on the gateway (issue 12), with the official `openai` package
//! as an unmodified agent in the default sandbox: plain, streamed, a tool round trip
//! continued with `previous_response_id`, reading a response back, refusals that name the
//! field and journal nothing, and a conversation that survives a daemon SIGKILL with the
//! upstream serving each call once.

use serde_json::{Value, json};

use crate::gateway::{mock_upstream, read_counts, use_upstream};
use crate::harness::{Keel, agent, journaled_llm_calls, sql, wait_for};

fn llm_entries(view: &Value) -> Vec<Value> {
    view["journal"].as_array().into_iter().flatten().filter(|e| e["method"] == "llm.chat").cloned().collect()
}

#[test]
fn the_openai_sdk_speaks_the_responses_api_unmodified() {
    let keel = Keel::new();
    let script = agent("responses_script.json");
    let out =
        keel.run(&["run", "--quiet", "--llm-script", &script, "--", "python3", &agent("responses_agent.py")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "agent failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).expect("the agent's JSON line");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["plain"], "hello from the responses api");
    assert_eq!(seen["plain_usage"], json!([9, 4]));
    assert_eq!(seen["plain_status"], "completed");
    assert_eq!(seen["streamed"], "roses are journaled, violets replayed");
    assert_eq!(seen["stream_final"], seen["streamed"]);
    assert_eq!(seen["stream_first_last"], json!(["response.created", "response.completed"]));
    for event in [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.output_item.done",
    ] {
        assert!(seen["stream_events"].as_array().unwrap().contains(&json!(event)), "{event} in {seen}");
    }
    assert_eq!(seen["tool_call"], json!(["add", {"a": 2, "b": 3}]));
    assert_eq!(seen["final"], "2 plus 3 is 5.");
    assert_eq!(seen["final_previous"], true);
    assert_eq!(seen["retrieved"], true);
    assert_eq!(seen["unknown_call_id"], json!([400, "input[0].call_id"]));
    assert_eq!(seen["web_search"], json!([400, "tools[0].type"]));
    assert_eq!(seen["image"], json!([400, "input[0].content[0].type"]));
    assert_eq!(seen["unknown_previous"], json!([404, "previous_response_id"]));
    assert_eq!(seen["retrieve_unknown"], 404);
    let run = keel.json(&["ps", "--json"])[0].clone();
    assert_eq!(run["provider_calls"], 4);
    let view = keel.inspect(run["run_id"].as_str().unwrap());
    assert_eq!(llm_entries(&view).len(), 4, "the refused requests journaled nothing");
    // The follow-up carried the whole conversation: the question, the call, its output.
    let follow_up = &llm_entries(&view)[3]["params"]["messages"];
    let roles: Vec<&str> =
        follow_up.as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "{follow_up}");
}

/// The kernel is killed between the two calls, and the kept responses are taken out of
/// its database before the restart, as a power cut would take a kept response (they are
/// written without a flush of their own): the follow-up still finds the first response,
/// which the replay of its call kept again.
#[test]
fn a_responses_conversation_survives_a_daemon_kill_and_the_upstream_serves_each_call_once() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("responses_crash_script.json"));
    use_upstream(&mut keel, port, false);
    keel.start_daemon();
    let run = keel.detach(&[
        "--env",
        "RESPONSES_TOOL_DELAY_MS=1500",
        "--",
        "python3",
        &agent("responses_crash_agent.py"),
    ]);
    wait_for("the first call to be journaled", || {
        (journaled_llm_calls(&keel.inspect(&run)) >= 1).then_some(())
    });
    keel.kill_daemon();
    sql(&keel.data.path().join("keel.db"), "DELETE FROM kv WHERE scope LIKE 'responses/%';");
    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{logs}");
    assert!(done["attempt"].as_u64().unwrap() >= 2, "the agent ran again after the kill");
    let line = logs.lines().rev().find(|l| l.starts_with('{')).expect("agent output");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["final"], "2 plus 3 is 5.");
    let events = seen["events"].as_array().unwrap();
    assert_eq!(events.first(), Some(&json!("response.created")));
    assert_eq!(events.last(), Some(&json!("response.completed")));
    assert!(
        events.contains(&json!("response.function_call_arguments.done")),
        "replayed as a stream: {events:?}"
    );
    let counts = read_counts(&counts);
    upstream.kill();
    assert_eq!(counts["errors"], json!([]), "request invariants: {counts}");
    assert_eq!(counts["total"], 2, "two distinct calls, each served once: {counts}");
    assert!(counts["counts"].as_object().unwrap().values().all(|n| n == 1), "{counts}");
    assert_eq!(done["provider_calls"], 2);
}

/// Responses in, Responses out: with `api = "responses"` upstream, the reasoning the
/// upstream sent with the first answer reaches the agent as an output item, is kept with
/// the response, and goes back upstream unchanged when the follow-up continues with
/// `previous_response_id` (the mock refuses a reasoning item it did not send, or one
/// changed in any byte).
#[test]
fn reasoning_round_trips_through_the_gateway_to_a_responses_upstream() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("responses_crash_script.json"));
    use_upstream(&mut keel, port, true);
    keel.start_daemon();
    let run = keel.detach(&["--", "python3", &agent("responses_crash_agent.py")]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    let counts = read_counts(&counts);
    upstream.kill();
    assert_eq!(done["state"], "succeeded", "{logs}");
    let line = logs.lines().rev().find(|l| l.starts_with('{')).expect("agent output");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["final"], "2 plus 3 is 5.");
    assert_eq!(counts["errors"], json!([]), "request invariants at the upstream: {counts}");
    assert_eq!(counts["paths"], json!({"/v1/responses": 2}), "{counts}");
    // The follow-up's canonical messages carried the first answer's reasoning.
    let entries = llm_entries(&keel.inspect(&run));
    let assistant = &entries[1]["params"]["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["reasoning"][0]["type"], "reasoning", "{assistant}");
}

/// A request whose input alone is more than the run's whole budget can never succeed: it
/// is a 400 naming why (not a 429 an SDK would retry), on both OpenAI APIs, and nothing
/// is journaled or paid.
#[test]
fn a_request_that_can_never_fit_the_budget_is_a_400_saying_why() {
    let keel = Keel::new();
    let script = agent("responses_script.json");
    let out = keel.run(&[
        "run",
        "--quiet",
        "--llm-script",
        &script,
        "--budget-tokens",
        "1000",
        "--",
        "python3",
        &agent("over_budget_agent.py"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "agent failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value =
        serde_json::from_str(stdout.lines().rev().find(|l| l.starts_with('{')).unwrap()).unwrap();
    for api in ["responses", "chat"] {
        assert_eq!(seen[api]["status"], 400, "{api}: {seen}");
        assert!(seen[api]["message"].as_str().unwrap().contains("1000"), "{api} names the budget: {seen}");
    }
    let run = keel.json(&["ps", "--json"])[0].clone();
    assert_eq!(run["provider_calls"], 0);
    assert!(llm_entries(&keel.inspect(run["run_id"].as_str().unwrap())).is_empty(), "nothing journaled");
}

/// Issue 12 says the Responses API works over every provider: here an Anthropic upstream
/// serves it (plain and streamed), and `store: false` keeps nothing: reading the response
/// back or continuing from it is a 404.
#[test]
fn an_anthropic_upstream_serves_the_responses_api_and_store_false_keeps_nothing() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &agent("openai_script.json"));
    keel.daemon_env = vec![
        ("ANTHROPIC_API_KEY".into(), "sk-ant-upstream-test".into()),
        ("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}")),
    ];
    keel.start_daemon();
    let run = keel.detach(&[
        "--model",
        "anthropic/claude-haiku-4-5",
        "--",
        "python3",
        &agent("responses_unstored_agent.py"),
    ]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    let counts = read_counts(&counts);
    upstream.kill();
    assert_eq!(done["state"], "succeeded", "{logs}");
    let line = logs.lines().rev().find(|l| l.starts_with('{')).expect("agent output");
    let seen: Value = serde_json::from_str(line).unwrap();
    assert_eq!(seen["plain"], "hello from the kernel");
    assert_eq!(seen["streamed"], "roses are journaled, violets replayed");
    assert_eq!(seen["unstored_text"], "and one more after the crash");
    assert_eq!(seen["unstored_retrieve"], 404);
    assert_eq!(seen["unstored_continue"], json!([404, "previous_response_id"]));
    assert_eq!(seen["stored_retrieve"], "hello from the kernel");
    assert_eq!(counts["errors"], json!([]), "request invariants at the upstream: {counts}");
    assert_eq!(counts["paths"], json!({"/v1/messages": 3}), "every call went to Anthropic: {counts}");
}
