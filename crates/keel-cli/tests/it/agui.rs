//! AG-UI end to end: a Python agent under the real daemon asks a question, makes a
//! streamed LLM call (the scripted provider, its text in two chunks) that proposes a tool
//! call, makes that call and checkpoints. `tests/agents/agui_client.py` reads its AG-UI
//! stream, validating every event with the pinned `ag-ui-protocol` package's models and
//! the sequence rules, and answers the question from the stream. Live, the text arrives
//! as the provider's deltas; read again after the end, the same run streams its history
//! with the text whole. `POST /v1/agui` starts the agent from a `RunAgentInput`; bad
//! input is refused and starts nothing.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Keel, agent, agents};

/// Runs the AG-UI client with `config` (plus the daemon's address and token); returns
/// what it printed: `{run, events, texts}`.
fn client(keel: &Keel, token: Option<&str>, mut config: Value) -> Value {
    let (base, operator) = keel.api();
    config["base"] = json!(base);
    config["token"] = json!(token.unwrap_or(&operator));
    let out = Command::new("python3")
        .arg(agents().join("agui_client.py"))
        .arg(config.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "agui_client failed:\n{}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(keel.data.path().join("daemon.log")).unwrap_or_default()
    );
    serde_json::from_slice(out.stdout.trim_ascii()).unwrap()
}

fn of_type<'a>(streamed: &'a Value, kind: &str) -> Vec<&'a Value> {
    streamed["events"].as_array().unwrap().iter().filter(|e| e["type"] == kind).collect()
}

fn script() -> Value {
    serde_json::from_str(&std::fs::read_to_string(agents().join("agui_script.json")).unwrap()).unwrap()
}

/// What every stream of the agent's run shows, live or replayed.
fn assert_the_agents_run(streamed: &Value, thread_id: &str, run_id: &str) {
    let started = of_type(streamed, "RUN_STARTED");
    assert_eq!(
        (started[0]["threadId"].as_str(), started[0]["runId"].as_str()),
        (Some(thread_id), Some(run_id))
    );
    let texts: Vec<&str> =
        streamed["texts"].as_object().unwrap().values().filter_map(Value::as_str).collect();
    assert_eq!(texts, ["Checking the weather."], "{streamed}");
    let start = of_type(streamed, "TOOL_CALL_START");
    assert_eq!(start.len(), 1, "the proposed call and the agent's call are one: {streamed}");
    assert_eq!(
        (start[0]["toolCallId"].as_str(), start[0]["toolCallName"].as_str()),
        (Some("call_weather"), Some("echo"))
    );
    let args: String =
        of_type(streamed, "TOOL_CALL_ARGS").iter().map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), json!({"city": "Paris"}));
    let results = of_type(streamed, "TOOL_CALL_RESULT");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["toolCallId"], "call_weather");
    assert_eq!(
        serde_json::from_str::<Value>(results[0]["content"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    let snapshots = of_type(streamed, "STATE_SNAPSHOT");
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0]["snapshot"], json!({"step": "checked", "answer": "go"}));
    let customs: Vec<&str> =
        of_type(streamed, "CUSTOM").iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(customs, ["keel.question", "keel.answer"]);
    assert_eq!(of_type(streamed, "CUSTOM")[0]["value"]["question"], "Go ahead?");
    let finished = of_type(streamed, "RUN_FINISHED");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["result"]["answer"], "go");
    assert_eq!(finished[0]["result"]["reply"], "Checking the weather.");
    assert_eq!(
        (finished[0]["threadId"].as_str(), finished[0]["runId"].as_str()),
        (Some(thread_id), Some(run_id))
    );
    assert!(of_type(streamed, "RUN_ERROR").is_empty());
}

#[test]
fn a_run_streams_as_agui_events_live_then_as_history() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let script = agents().join("agui_script.json");
    let run =
        keel.detach(&["--llm-script", script.to_str().unwrap(), "--", "python3", &agent("agui_agent.py")]);
    keel.wait_state(&run, &["waiting"]);

    let live = client(&keel, None, json!({"run": run, "answer": "go"}));
    assert_the_agents_run(&live, &run, &run);
    // Watched live, the model's text came as the provider streamed it: two chunks.
    let chunks: Vec<&str> =
        of_type(&live, "TEXT_MESSAGE_CONTENT").iter().map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(chunks, ["Checking ", "the weather."]);
    keel.wait_state(&run, &["succeeded"]);

    // The ended run streams its history, then the stream ends: the text is whole.
    let history = client(&keel, None, json!({"run": run}));
    assert_the_agents_run(&history, &run, &run);
    let chunks: Vec<&str> =
        of_type(&history, "TEXT_MESSAGE_CONTENT").iter().map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(chunks, ["Checking the weather."]);
    let kinds = |s: &Value| -> Vec<String> {
        s["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect()
    };
    // Live and history tell the same story. (Keel's own events, here the answer, are
    // stored in batches a few milliseconds late, so live deltas may overtake them.)
    let story = |s: &Value| -> Vec<String> {
        kinds(s).into_iter().filter(|k| k != "TEXT_MESSAGE_CONTENT" && k != "CUSTOM").collect()
    };
    assert_eq!(story(&live), story(&history));

    // A tenant's token does not see the operator's run: the same 404 as a missing one.
    keel.ok(&["tenant", "create", "acme"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let (base, _) = keel.api();
    let out = curl(&base, &acme, "GET", &format!("/v1/runs/{run}/agui"), None);
    assert!(out.starts_with("404"), "{out}");
}

/// `curl` a route: `"<status> <body>"`.
fn curl(base: &str, token: &str, method: &str, path: &str, body: Option<&Value>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("{base}{path}"));
    if let Some(body) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary"]).arg(body.to_string());
    }
    let out = cmd.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or((&text, ""));
    format!("{status} {body}")
}

fn run_agent_input(forwarded: Value) -> Value {
    json!({
        "threadId": "thread-7", "runId": "frontend-run-1",
        "messages": [{"id": "m1", "role": "user", "content": "weather in Paris?"}],
        "tools": [], "context": [{"description": "units", "value": "metric"}],
        "state": {}, "forwardedProps": forwarded
    })
}

#[test]
fn post_agui_starts_a_run_from_a_run_agent_input_and_refuses_bad_input() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let (base, token) = keel.api();
    let command = json!(["python3", agent("agui_agent.py")]);

    // Bad input answers 400 saying what is wrong, and starts nothing.
    let cases = [
        (run_agent_input(json!({"theme": "dark"})), "`forwardedProps.keel` is missing"),
        (run_agent_input(json!({"keel": {"command": command, "colour": 1}})), "unknown field `colour`"),
        (run_agent_input(json!({"keel": {"command": command, "input": 1}})), "input` is not allowed"),
        (
            json!({"threadId": "t", "messages": [], "forwardedProps": {"keel": {"command": command}}}),
            "missing field `runId`",
        ),
        (
            json!({"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "robot"}], "forwardedProps": {"keel": {"command": command}}}),
            "messages[0].role \\\"robot\\\" is not an AG-UI role",
        ),
        (
            json!({"threadId": "t", "runId": "r", "messages": "hi", "forwardedProps": {"keel": {"command": command}}}),
            "messages",
        ),
    ];
    for (body, needle) in cases {
        let out = curl(&base, &token, "POST", "/v1/agui", Some(&body));
        assert!(out.starts_with("400 ") && out.contains(needle), "{body}: {out}");
    }
    let not_json = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["--data-binary", "{}"])
        .arg(format!("{base}/v1/agui"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&not_json.stdout), "415");
    assert_eq!(keel.json(&["ps", "--json"]), json!([]), "nothing malformed started a run");

    let input =
        run_agent_input(json!({"keel": {"command": command, "llm_script": script()}, "theme": "dark"}));
    let streamed = client(&keel, None, json!({"input": input, "answer": "go"}));
    assert_the_agents_run(&streamed, "thread-7", "frontend-run-1");
    let finished = of_type(&streamed, "RUN_FINISHED");
    assert_eq!(finished[0]["result"]["thread"], "thread-7", "the agent read the RunAgentInput");
    let run = streamed["run"].as_str().unwrap();
    let view = keel.inspect(run);
    assert_eq!(view["state"], "succeeded");
    // The model was asked the frontend's message.
    let llm = view["journal"].as_array().unwrap().iter().find(|e| e["method"] == "llm.chat").unwrap();
    assert_eq!(llm["params"]["messages"][0]["content"], "weather in Paris?");
}
