//! Governed tools end to end, with the real binary: grants (denied calls are audited),
//! schemas, approvals that survive a daemon kill, each crash-window policy (the daemon is
//! SIGKILLed while a command tool runs), programmatic tool calling with `keel exec` and
//! `code.exec` in all three languages (its finished tool calls are replayed, not redone,
//! after a kill), and the built-in file tools confined to the run's workspace.

use std::path::Path;

use serde_json::{Value, json};

use crate::harness::{Keel, agent, wait_for};

/// A keel.toml with three command tools around `marker_tool.py`, one per crash policy,
/// and `kv.put` requiring approval.
pub(crate) fn config(keel: &Keel, marker: &Path) -> String {
    let tool = agent("marker_tool.py");
    let marker = marker.display();
    let mut text = String::new();
    for (name, crash) in [("mark_retry", "retry"), ("mark_ask", "ask"), ("mark_fail", "fail")] {
        text.push_str(&format!(
            r#"
[[tools.command]]
name = "{name}"
description = "Appends the idempotency key to a marker file, then sleeps."
command = ["python3", "{tool}"]
env = {{ MARKER = "{marker}" }}
crash = "{crash}"
timeout_secs = 60
input_schema = {{ type = "object", properties = {{ sleep_ms = {{ type = "integer" }}, fail = {{ type = "boolean" }}, text = {{ type = "string" }} }}, additionalProperties = false }}
"#
        ));
    }
    text.push_str(
        r#"
[tools.policy."kv.put"]
requires_approval = true
"#,
    );
    std::fs::write(keel.data.path().join("keel.toml"), &text).unwrap();
    text
}

pub(crate) fn tools_run(keel: &Keel, grant: &[&str], calls: Value) -> String {
    let input = json!({ "calls": calls }).to_string();
    let mut args = vec!["--sandbox", "none", "--input", &input];
    for pattern in grant {
        args.extend(["--grant", pattern]);
    }
    let path = agent("tools_agent.py");
    args.extend(["--", "python3", &path]);
    keel.detach(&args)
}

pub(crate) fn results(done: &Value) -> Vec<Value> {
    assert_eq!(done["state"], "succeeded", "{done}");
    done["output"]["results"].as_array().expect("results").clone()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[test]
fn grants_schemas_and_denials_are_enforced_and_audited() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let run = tools_run(
        &keel,
        &["echo", "mark_*"],
        json!([
            {"tool": "echo", "args": {"a": 1}},
            {"tool": "kv.get", "args": {"key": "x"}},
            {"tool": "no.such.tool", "args": {}},
            {"tool": "mark_retry", "args": {"sleep_ms": "soon"}},
            {"tool": "mark_retry", "args": {"text": "hi"}},
            {"tool": "mark_retry", "args": {"fail": true}},
            {"list": true},
        ]),
    );
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0], json!({"ok": {"a": 1}}));
    assert_eq!(results[1]["error"], "denied", "{results:?}");
    assert!(results[1]["message"].as_str().unwrap().contains("--grant kv.get"), "{results:?}");
    // Outside the grant, an unknown tool is denied like a known one: nothing leaks.
    assert_eq!(results[2]["error"], "denied", "{results:?}");
    assert_eq!(results[3]["error"], "invalid_params", "{results:?}");
    assert!(results[3]["message"].as_str().unwrap().contains("sleep_ms"), "{results:?}");
    assert_eq!(results[4]["ok"]["text"], "hi", "{results:?}");
    assert_eq!(results[4]["ok"]["key"], format!("{run}:{}", journal_seq(&done, "mark_retry", 0)));
    assert_eq!(results[5]["error"], "tool_error", "{results:?}");
    assert!(results[5]["message"].as_str().unwrap().contains("the tool was asked to fail"), "{results:?}");
    assert_eq!(results[6]["ok"], json!(["echo", "mark_ask", "mark_fail", "mark_retry"]));
    // Refused calls leave no journal entry; the denied ones are in the audit log.
    let journal = done["journal"].as_array().unwrap();
    let tool_calls = journal.iter().filter(|e| e["method"] == "tool.call").count();
    assert_eq!(tool_calls, 3, "{journal:?}");
    let audit = keel.json(&["audit", &run, "--json"]);
    let entries = audit.as_array().expect("audit entries");
    let denied: Vec<&str> = entries
        .iter()
        .filter(|e| e["action"] == "tool.denied")
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert_eq!(denied, ["kv.get", "no.such.tool"], "{audit}");
    assert_eq!(entries.iter().filter(|e| e["action"] == "tool.call").count(), 3, "{audit}");
    assert!(keel.ok(&["audit", "verify"]).contains("intact"));
    let tools = keel.ok(&["tools"]);
    assert!(
        tools.contains("mark_fail") && tools.contains("fs.read") && tools.contains("http.fetch"),
        "{tools}"
    );
}

/// The seq of the `nth` journaled call of `tool`.
fn journal_seq(view: &Value, tool: &str, nth: usize) -> u64 {
    view["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "tool.call" && e["params"]["name"] == tool)
        .nth(nth)
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or_else(|| panic!("no call {nth} of {tool} in {view}"))
}

#[test]
fn approvals_park_the_call_survive_a_daemon_kill_and_deny_with_a_note() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let run = tools_run(
        &keel,
        &["kv.*"],
        json!([
            {"tool": "kv.put", "args": {"key": "a", "value": 1}},
            {"tool": "kv.put", "args": {"key": "b", "value": 2}},
            {"tool": "kv.get", "args": {"key": "a"}},
            {"tool": "kv.get", "args": {"key": "b"}},
        ]),
    );
    let waiting = wait_for("the first kv.put to wait for approval", || {
        let view = keel.inspect(&run);
        (view["wait_reason"] == "approval" && view["approvals"].as_array()?.len() == 1).then_some(view)
    });
    let first = waiting["approvals"][0]["call"].as_u64().unwrap();
    assert_eq!(waiting["approvals"][0]["tool"], "kv.put");
    assert!(
        waiting["reason"].as_str().unwrap().contains(&format!("keel approve {run} {first}")),
        "{waiting}"
    );
    // The wait is durable: the run comes back after a SIGKILL still waiting for the
    // same call, and the approval given now lets it go on.
    keel.kill_daemon();
    keel.start_daemon();
    wait_for("the recovered run to wait for the same call", || {
        let view = keel.inspect(&run);
        (view["approvals"][0]["call"].as_u64() == Some(first)).then_some(())
    });
    let approved = keel.run(&["approve", &run, "--note", "looks fine"]);
    let said = String::from_utf8_lossy(&approved.stderr);
    assert!(approved.status.success() && said.contains(&format!("call {first} of {run} approved")), "{said}");
    let second = wait_for("the second kv.put to wait", || {
        let view = keel.inspect(&run);
        view["approvals"][0]["call"].as_u64().filter(|call| *call != first)
    });
    let out = keel.run(&["deny", &run, &second.to_string(), "--note", "b is reserved"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0], json!({"ok": true}));
    assert_eq!(results[1]["error"], "denied");
    assert!(results[1]["message"].as_str().unwrap().contains("b is reserved"), "{results:?}");
    assert_eq!(results[2], json!({"ok": 1}));
    assert_eq!(results[3], json!({"ok": null}), "the denied put had no effect");
    let audit = keel.json(&["audit", &run, "--json"]);
    let actions: Vec<&str> =
        audit.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert!(actions.contains(&"approval.granted") && actions.contains(&"approval.denied"), "{actions:?}");
    // Deciding again, or a call that does not wait, is a clear error.
    let again = keel.run(&["approve", &run, &first.to_string()]);
    assert!(!again.status.success());
}

/// Starts a run calling `tool` (sleeping 30 s inside), kills the daemon while the tool
/// runs, and restarts it.
fn kill_inside(keel: &mut Keel, tool: &str, marker: &Path) -> String {
    let run = tools_run(keel, &[tool], json!([{"tool": tool, "args": {"sleep_ms": 30000}}]));
    wait_for("the tool to start", || (!lines(marker).is_empty()).then_some(()));
    keel.kill_daemon();
    keel.start_daemon();
    run
}

#[test]
fn crash_policy_retry_runs_the_tool_again_with_the_same_key() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let run = kill_inside(&mut keel, "mark_retry", &marker);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    let seen = lines(&marker);
    assert_eq!(seen.len(), 2, "ran once before the kill and once after: {seen:?}");
    assert_eq!(seen[0], seen[1], "the retry carries the first attempt's idempotency key");
    assert_eq!(results[0]["ok"]["key"], seen[0].as_str());
    let logs = keel.run(&["logs", &run]);
    let said = String::from_utf8_lossy(&logs.stderr);
    assert!(said.contains("was interrupted by a kernel crash; crash policy retry"), "{said}");
}

#[test]
fn crash_policy_ask_waits_for_an_operator_before_running_again() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let run = kill_inside(&mut keel, "mark_ask", &marker);
    // The approval is listed as soon as it is asked for; the run shows `waiting(approval)`
    // a moment later, once that state change is written.
    wait_for("the interrupted call to wait for an operator", || {
        let view = keel.inspect(&run);
        (view["approvals"][0]["kind"] == "retry_after_crash" && view["wait_reason"] == "approval")
            .then_some(view)
    });
    assert_eq!(lines(&marker).len(), 1, "not run again before the operator says so");
    keel.ok(&["approve", &run]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0]["ok"]["lines"], 2, "{results:?}");
}

#[test]
fn crash_policy_fail_reports_the_interruption_and_never_runs_again() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let run = kill_inside(&mut keel, "mark_fail", &marker);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0]["error"], "tool_error", "{results:?}");
    assert!(results[0]["message"].as_str().unwrap().contains("crash policy is `fail`"), "{results:?}");
    assert_eq!(lines(&marker).len(), 1);
}

const TEN_CALLS_PY: &str = "total = 0\nfor i in range(10):\n    total = total + echo(n=i)['n']\ntotal";
const TEN_CALLS_JS: &str = "let total = 0; for (let i = 0; i < 10; i++) { total += echo({n: i}).n; } total";

#[test]
fn keel_exec_runs_python_javascript_and_cpython_with_governed_tools() {
    let mut keel = Keel::new();
    keel.start_daemon();
    for (lang, code) in [("python", TEN_CALLS_PY), ("javascript", TEN_CALLS_JS), ("cpython", TEN_CALLS_PY)] {
        let out = keel.json(&["exec", "--lang", lang, "--grant", "echo", "-e", code, "--json"]);
        assert_eq!(out["ok"], true, "{lang}: {out}");
        assert_eq!(out["result"], 45, "{lang}: {out}");
        assert_eq!(out["tool_calls"].as_array().unwrap().len(), 10, "{lang}: {out}");
        // Journaled as a run: one code.exec and its ten calls, marked as its own.
        let view = keel.inspect(out["run_id"].as_str().unwrap());
        let journal = view["journal"].as_array().unwrap();
        let exec = journal.iter().find(|e| e["method"] == "code.exec").expect("code.exec entry");
        let nested = journal
            .iter()
            .filter(|e| e["method"] == "tool.call" && e["params"]["exec"] == exec["seq"])
            .count();
        assert_eq!(nested, 10, "{lang}: {journal:?}");
    }
    // Not granted: the program sees an error and the kernel stays up.
    let denied = keel.run(&["exec", "--grant", "echo", "-e", "call_tool('kv.get', key='a')", "--json"]);
    assert_eq!(denied.status.code(), Some(1));
    let out: Value = serde_json::from_slice(&denied.stdout).expect("exec --json prints JSON");
    assert_eq!(out["ok"], false, "{out}");
    assert_eq!(out["error"]["kind"], "not_granted", "{out}");
    let inputs = keel.json(&["exec", "-e", "x * 2", "--input", "x=21", "--json"]);
    assert_eq!(inputs["result"], 42, "{inputs}");
    let looping = keel.run(&["exec", "--lang", "javascript", "-e", "for(;;){}", "--timeout-ms", "300"]);
    assert_eq!(looping.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&looping.stderr).contains("timeout"), "{looping:?}");
    let after = keel.json(&["exec", "-e", "1 + 1", "--json"]);
    assert_eq!(after["result"], 2, "the worker pool recovered: {after}");
}

#[test]
fn a_code_exec_interrupted_by_a_crash_replays_its_finished_tool_calls() {
    let mut keel = Keel::new();
    let marker = keel.data.path().join("marker");
    config(&keel, &marker);
    keel.start_daemon();
    let code = "a = mark_retry(text='one')\nb = mark_retry(text='two')\nc = mark_retry(sleep_ms=30000)\nd = mark_retry(text='four')\n[a['lines'], b['lines'], c['lines'], d['lines']]";
    let run = tools_run(
        &keel,
        &["mark_retry"],
        json!([{"exec": code, "lang": "python", "limits": {"timeout_ms": 120000}}]),
    );
    wait_for("the third call to start", || (lines(&marker).len() == 3).then_some(()));
    keel.kill_daemon();
    keel.start_daemon();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    // The two finished calls were answered from the journal; the interrupted one ran
    // again (policy retry), then the fourth: 5 effects in all, not 7.
    assert_eq!(results[0]["ok"]["result"], json!([1, 2, 4, 5]), "{results:?}");
    assert_eq!(lines(&marker).len(), 5);
}

#[test]
fn file_tools_act_on_the_workspace_volume_and_cannot_leave_it() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let input = json!({ "calls": [
        {"tool": "fs.write", "args": {"path": "notes/a.txt", "content": "written by a tool", "create_dirs": true}},
        {"tool": "fs.read", "args": {"path": "notes/a.txt"}},
        {"read_file": "/workspace/notes/a.txt"},
        {"tool": "fs.list", "args": {"recursive": true}},
        {"tool": "fs.read", "args": {"path": "../../../../etc/passwd"}},
        {"tool": "fs.read", "args": {"path": "/etc/passwd"}},
        {"tool": "fs.read", "args": {"path": 7}},
    ]})
    .to_string();
    let run = keel.detach(&[
        "--volume",
        "ws:/workspace",
        "--input",
        &input,
        "--",
        "python3",
        &agent("tools_agent.py"),
    ]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0]["ok"]["bytes"], 17, "{results:?}");
    assert_eq!(results[1]["ok"]["content"], "written by a tool", "{results:?}");
    assert_eq!(results[2]["ok"], "written by a tool", "the agent sees the same workspace: {results:?}");
    assert!(results[3]["ok"].to_string().contains("notes/a.txt"), "{results:?}");
    assert_eq!(results[4]["error"], "tool_error", "{results:?}");
    assert_eq!(results[5]["error"], "tool_error", "{results:?}");
    assert_eq!(results[6]["error"], "invalid_params", "{results:?}");
    // The host side of the volume holds the file; nothing escaped it.
    let host = keel.data.path().join("volumes/ws/notes/a.txt");
    assert_eq!(std::fs::read_to_string(host).unwrap(), "written by a tool");

    // Without a workspace volume, the file tools say what to do.
    let input = json!({ "calls": [{"tool": "fs.list", "args": {}}] }).to_string();
    let run = keel.detach(&["--input", &input, "--", "python3", &agent("tools_agent.py")]);
    let results = self::results(&keel.wait_state(&run, &["succeeded", "failed"]));
    assert!(results[0]["message"].as_str().unwrap().contains("--volume NAME:/workspace"), "{results:?}");
}

/// A tiny HTTP server answering every request with `pong <path>`.
fn http_server() -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                    line.clear();
                }
                let path = first.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let body = format!("pong {path}");
                let mut stream = stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

#[test]
fn http_fetch_goes_through_the_runs_egress_allowlist() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let allowed = http_server();
    let other = http_server();
    let input = json!({ "calls": [
        {"tool": "http.fetch", "args": {"url": format!("http://127.0.0.1:{allowed}/hello")}},
        {"tool": "http.fetch", "args": {"url": format!("http://127.0.0.1:{other}/nope")}},
        {"tool": "http.fetch", "args": {"url": "file:///etc/passwd"}},
    ]})
    .to_string();
    let allow = format!("127.0.0.1:{allowed}");
    let run =
        keel.detach(&["--allow-host", &allow, "--input", &input, "--", "python3", &agent("tools_agent.py")]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    assert_eq!(results[0]["ok"]["status"], 200, "{results:?}");
    assert_eq!(results[0]["ok"]["body"], "pong /hello", "{results:?}");
    let refused = &results[1];
    assert!(refused["error"] == "tool_error" || refused["ok"]["status"] == 403, "{results:?}");
    assert!(!refused.to_string().contains("pong"), "{results:?}");
    assert_eq!(results[2]["error"], "tool_error", "{results:?}");
    // The proxy audited both attempts.
    let audit = keel.json(&["audit", &run, "--json"]);
    let egress: Vec<&Value> = audit.as_array().unwrap().iter().filter(|e| e["action"] == "egress").collect();
    assert_eq!(egress.len(), 2, "{audit}");
    assert_eq!(egress[0]["outcome"], "allowed");
    assert_eq!(egress[1]["outcome"], "denied");

    // A run without egress has no http.fetch to speak of.
    let input =
        json!({ "calls": [{"tool": "http.fetch", "args": {"url": "http://example.com/"}}] }).to_string();
    let run = keel.detach(&["--input", &input, "--", "python3", &agent("tools_agent.py")]);
    let results = self::results(&keel.wait_state(&run, &["succeeded", "failed"]));
    assert!(results[0]["message"].as_str().unwrap().contains("no network egress"), "{results:?}");
}

#[test]
fn an_agent_called_as_a_tool_runs_as_a_child_run() {
    let mut keel = Keel::new();
    let child = agent("child_agent.py");
    std::fs::write(
        keel.data.path().join("keel.toml"),
        format!(
            "[[tools.agent]]\nname = \"summarize\"\ndescription = \"Summarizes a text.\"\ncommand = [\"python3\", \"{child}\"]\n\
             input_schema = {{ type = \"object\", required = [\"text\"], properties = {{ text = {{ type = \"string\" }} }} }}\n\
             \n[tools.policy.\"echo\"]\nrate_limit = \"2/s\"\n"
        ),
    )
    .unwrap();
    keel.start_daemon();
    let run = tools_run(
        &keel,
        &["summarize", "echo"],
        json!([
            {"tool": "summarize", "args": {"text": "keel runs agents"}},
            {"tool": "summarize", "args": {}},
            {"tool": "echo", "args": {"n": 1}},
            {"tool": "echo", "args": {"n": 2}},
            {"tool": "echo", "args": {"n": 3}},
            {"tool": "echo", "args": {"n": 4}},
            {"tool": "echo", "args": {"n": 5}},
        ]),
    );
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let results = results(&done);
    let child_run = results[0]["ok"]["run_id"].as_str().expect("the child's run id").to_owned();
    assert_eq!(results[0]["ok"]["output"]["summary"], "KEEL RUNS AGENTS", "{results:?}");
    assert_eq!(results[0]["ok"]["output"]["child_of"], child_run.as_str());
    assert_eq!(results[1]["error"], "invalid_params", "{results:?}");
    let child = keel.inspect(&child_run);
    assert_eq!(child["state"], "succeeded", "{child}");
    // Five echoes under "2/s": two at once, then one every half second.
    let starts: Vec<u64> = done["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["params"]["name"] == "echo")
        .map(|e| e["started_at"].as_u64().unwrap())
        .collect();
    assert_eq!(starts.len(), 5);
    assert!(starts[4] - starts[0] >= 1400, "the rate limit spaced the calls: {starts:?}");
}
