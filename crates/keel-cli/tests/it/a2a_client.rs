//! The A2A client end to end: a remote agent served by the official `a2a-sdk` 1.3.0
//! (`tests/fixtures/a2a_remote.py`), mounted with `[[tools.a2a]]`, its skills called by
//! runs as governed tools: the artifact comes back, the token from the kernel's
//! environment reaches the remote and never the agent, a grant that leaves the tool out
//! is denied, and a call cut off by a daemon SIGKILL is found at the remote after the
//! restart instead of being sent a second time. An agent whose card offers only A2A 0.3
//! is called in 0.3, and a call of it cut off by a kill is an error, never a second
//! message (0.3 cannot list a context's tasks).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::harness::{Keel, a2a_python, wait_for};
use crate::tools::{results, tools_run};

const TOKEN: &str = "a2a-test-token-7f3e";

/// The remote agent, killed when dropped.
struct Remote {
    child: Child,
    state: tempfile::TempDir,
    url: String,
}

impl Remote {
    /// `v03`: its card offers A2A 0.3 only.
    fn start(token: Option<&str>, v03: bool) -> Remote {
        let python = a2a_python();
        let state = tempfile::tempdir().expect("tempdir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/a2a_remote.py");
        let log = std::fs::File::create(state.path().join("server.log")).expect("server log");
        let child = Command::new(python)
            .arg(&script)
            .args(v03.then_some("--v03"))
            .arg(state.path())
            .args(token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the A2A remote");
        let port =
            wait_for("the A2A remote to listen", || std::fs::read_to_string(state.path().join("port")).ok());
        Remote { child, url: format!("http://127.0.0.1:{}/", port.trim()), state }
    }

    fn lines(&self, name: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.state.path().join(name)).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
    }

    /// The messages its agent received.
    fn received(&self) -> Vec<Value> {
        self.lines("received.jsonl")
    }

    /// Every HTTP request: `{method, authorization}`.
    fn requests(&self) -> Vec<Value> {
        self.lines("requests.jsonl")
    }

    fn count(&self, method: &str) -> usize {
        self.requests().iter().filter(|r| r["method"] == method).count()
    }

    /// Lets a `slow` task finish.
    fn release(&self) {
        std::fs::write(self.state.path().join("release"), "").expect("release");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// keel.toml mounting `remote` (its token in the daemon's environment as
/// REMOTE_A2A_TOKEN) and `down`, an agent nobody serves.
fn configure(keel: &mut Keel, remote: &Remote) -> PathBuf {
    let config = format!(
        r#"
[[tools.a2a]]
name = "remote"
url = "{}"
token_env = "REMOTE_A2A_TOKEN"
timeout_secs = 60

[[tools.a2a]]
name = "down"
url = "http://127.0.0.1:1/"
"#,
        remote.url
    );
    let path = keel.data.path().join("keel.toml");
    std::fs::write(&path, config).unwrap();
    keel.daemon_env.push(("REMOTE_A2A_TOKEN".into(), TOKEN.into()));
    path
}

/// The seq of the `nth` journaled call of `tool`.
fn call_seq(view: &Value, tool: &str, nth: usize) -> u64 {
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
fn a_remote_agents_skills_are_governed_tools_with_the_kernels_token() {
    let remote = Remote::start(Some(TOKEN), false);
    let mut keel = Keel::new();
    configure(&mut keel, &remote);
    keel.start_daemon();
    let run = tools_run(
        &keel,
        &["a2a:*"],
        json!([
            {"list": true},
            {"tool": "a2a:remote/echo", "args": {"text": "hello", "data": {"n": 1}}},
            {"tool": "a2a:remote/ask", "args": {"text": "plan a trip"}},
            {"tool": "a2a:remote/fail", "args": {"text": "try"}},
            {"tool": "a2a:remote/echo", "args": {"txt": "a typo"}},
            {"tool": "a2a:remote/nope", "args": {"text": "x"}},
            {"tool": "a2a:down/echo", "args": {"text": "x"}},
            {"read_file": "/proc/self/environ"},
        ]),
    );
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let got = results(&done);
    let listed = got[0]["ok"].as_array().unwrap();
    assert_eq!(
        listed,
        &[
            json!("a2a:remote/ask"),
            json!("a2a:remote/echo"),
            json!("a2a:remote/fail"),
            json!("a2a:remote/slow")
        ],
        "one tool per skill; the agent nobody serves is left out"
    );
    let echo = &got[1]["ok"];
    assert_eq!(echo["state"], "completed", "{got:?}");
    assert_eq!(echo["text"], "echo: hello", "{got:?}");
    assert_eq!(echo["artifacts"][0]["name"], "echo");
    assert_eq!(echo["artifacts"][0]["parts"][1]["data"], json!({"n": 1.0}), "{echo}");
    let seq = call_seq(&done, "a2a:remote/echo", 0);
    let id = format!("keel-{run}-{seq}");
    assert_eq!(echo["context_id"], id.as_str(), "the call's context comes from its journal entry");
    let asked = &got[2]["ok"];
    assert_eq!(
        (asked["state"].as_str(), asked["question"].as_str()),
        (Some("input-required"), Some("Which year?"))
    );
    assert_eq!(got[3]["error"], "tool_error", "{got:?}");
    assert!(got[3]["message"].as_str().unwrap().contains("the remote failed on purpose"), "{got:?}");
    assert_eq!(got[4]["error"], "invalid_params", "{got:?}");
    assert_eq!(got[5]["error"], "not_found", "{got:?}");
    assert!(got[5]["message"].as_str().unwrap().contains("has no skill \"nope\""), "{got:?}");
    assert_eq!(got[6]["error"], "not_found", "{got:?}");
    let down = got[6]["message"].as_str().unwrap();
    assert!(down.contains("A2A agent \"down\" ([[tools.a2a]] in keel.toml) is not available"), "{down}");
    // The token is the kernel's: the agent's own environment does not have it.
    let environ = got[7]["ok"].as_str().unwrap();
    assert!(environ.contains("KEEL_RUN_ID="), "the agent's environment was read");
    assert!(!environ.contains("REMOTE_A2A_TOKEN") && !environ.contains(TOKEN), "the token leaked: {environ}");

    // An answer to the question goes to the same task, from another run.
    let task_id = asked["task_id"].as_str().unwrap();
    let answer = tools_run(
        &keel,
        &["a2a:remote/ask"],
        json!([{"tool": "a2a:remote/ask", "args": {"text": "1999", "task_id": task_id}}]),
    );
    let answered = results(&keel.wait_state(&answer, &["succeeded", "failed"]));
    assert_eq!(answered[0]["ok"]["state"], "completed", "{answered:?}");
    assert_eq!(answered[0]["ok"]["text"], "got: 1999", "{answered:?}");
    assert_eq!(answered[0]["ok"]["task_id"], task_id);

    // A grant that leaves the tool out: denied, audited, and nothing reaches the remote.
    let before = remote.received().len();
    let denied = tools_run(&keel, &["echo"], json!([{"tool": "a2a:remote/echo", "args": {"text": "no"}}]));
    let refused = results(&keel.wait_state(&denied, &["succeeded", "failed"]));
    assert_eq!(refused[0]["error"], "denied", "{refused:?}");
    assert_eq!(remote.received().len(), before, "a denied call never reaches the remote");
    let audit = keel.json(&["audit", &denied, "--json"]);
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "tool.denied" && e["subject"] == "a2a:remote/echo"),
        "{audit}"
    );

    // What the remote saw: each message once, with the call's ids, its skill and its
    // data; every request with the kernel's token.
    let received = remote.received();
    let texts: Vec<&str> = received.iter().map(|m| m["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["hello", "plan a trip", "try", "1999"], "{received:?}");
    assert_eq!(received[0]["messageId"], id.as_str());
    assert_eq!(received[0]["contextId"], id.as_str());
    assert_eq!(received[0]["skill"], "echo");
    assert_eq!(received[0]["data"], json!({"n": 1.0}));
    assert_eq!(received[3]["taskId"], task_id);
    let requests = remote.requests();
    assert!(requests.iter().any(|r| r["method"] == "GET"), "the card was read: {requests:?}");
    for request in &requests {
        assert_eq!(request["authorization"], format!("Bearer {TOKEN}"), "{requests:?}");
    }
    let tools = keel.ok(&["tools"]);
    assert!(tools.contains("a2a:remote/echo") && tools.contains("a2a:down/*"), "{tools}");
}

#[test]
fn a_call_cut_off_by_a_daemon_kill_is_found_at_the_remote_and_never_sent_twice() {
    let remote = Remote::start(Some(TOKEN), false);
    let mut keel = Keel::new();
    configure(&mut keel, &remote);
    keel.start_daemon();
    let ask =
        tools_run(&keel, &["a2a:remote/ask"], json!([{"tool": "a2a:remote/ask", "args": {"text": "plan"}}]));
    let asked = results(&keel.wait_state(&ask, &["succeeded", "failed"]));
    let task_id = asked[0]["ok"]["task_id"].as_str().expect("an input-required task").to_owned();
    // Two calls in flight at the kill: a new task, and an answer to the asking one.
    let run = tools_run(
        &keel,
        &["a2a:remote/*"],
        json!([
            {"tool": "a2a:remote/slow", "args": {"text": "exactly once"}},
            {"tool": "a2a:remote/echo", "args": {"text": "after"}},
        ]),
    );
    let answer = tools_run(
        &keel,
        &["a2a:remote/ask"],
        json!([{"tool": "a2a:remote/ask", "args": {"text": "wait, 1999", "task_id": task_id}}]),
    );
    // The remote has both messages and works on them; the kernel waits for the answers.
    wait_for("the remote to receive both calls", || (remote.received().len() == 3).then_some(()));
    let view = keel.inspect(&run);
    keel.crash_daemon_under(&view);
    // The recovered new-task call looks the task up in its context rather than sending
    // it again; only then is the remote let go.
    wait_for("the recovered call to look the task up", || (remote.count("ListTasks") >= 1).then_some(()));
    remote.release();
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let got = results(&done);
    let slow = &got[0]["ok"];
    assert_eq!(slow["state"], "completed", "{got:?}\n{}", remote.log());
    assert_eq!(slow["text"], "slow: exactly once", "{got:?}");
    assert_eq!(got[1]["ok"]["text"], "echo: after", "{got:?}");
    let answered = results(&keel.wait_state(&answer, &["succeeded", "failed"]));
    assert_eq!(answered[0]["ok"]["state"], "completed", "{answered:?}");
    assert_eq!(answered[0]["ok"]["text"], "got: wait, 1999", "{answered:?}");
    assert_eq!(answered[0]["ok"]["task_id"], task_id.as_str());
    let received = remote.received();
    let mut texts: Vec<&str> = received.iter().map(|m| m["text"].as_str().unwrap()).collect();
    texts.sort();
    assert_eq!(
        texts,
        ["after", "exactly once", "plan", "wait, 1999"],
        "each message reached the remote once"
    );
    assert_eq!(remote.count("SendMessage"), 4, "{:?}", remote.requests());
    let seq = call_seq(&done, "a2a:remote/slow", 0);
    let first = received.iter().find(|m| m["text"] == "exactly once").unwrap();
    assert_eq!(first["messageId"], format!("keel-{run}-{seq}"));
    assert_eq!(slow["context_id"], format!("keel-{run}-{seq}"));
    for run in [&run, &answer] {
        let logs = keel.run(&["logs", run]);
        let said = String::from_utf8_lossy(&logs.stderr);
        assert!(said.contains("was interrupted by a kernel crash"), "{said}");
    }
}

#[test]
fn a_03_agent_is_called_in_03_and_a_cut_off_call_to_it_is_not_sent_again() {
    let remote = Remote::start(None, true);
    let mut keel = Keel::new();
    configure(&mut keel, &remote);
    keel.start_daemon();
    let run = tools_run(
        &keel,
        &["a2a:remote/*"],
        json!([
            {"tool": "a2a:remote/echo", "args": {"text": "hello 0.3", "data": {"n": 2}}},
            {"tool": "a2a:remote/ask", "args": {"text": "plan"}},
            {"tool": "a2a:remote/slow", "args": {"text": "cut off"}},
        ]),
    );
    wait_for("the remote to receive the slow call", || (remote.received().len() == 3).then_some(()));
    let view = keel.inspect(&run);
    keel.crash_daemon_under(&view);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    remote.release();
    let got = results(&done);
    assert_eq!(got[0]["ok"]["text"], "echo: hello 0.3", "{got:?}\n{}", remote.log());
    assert_eq!(got[0]["ok"]["artifacts"][0]["parts"][1]["data"], json!({"n": 2.0}), "{got:?}");
    assert_eq!(got[1]["ok"]["question"], "Which year?", "{got:?}");
    assert_eq!(got[2]["error"], "tool_error", "{got:?}");
    let said = got[2]["message"].as_str().unwrap();
    assert!(said.contains("may have reached A2A agent \"remote\"") && said.contains("0.3"), "{said}");
    assert_eq!(remote.received().len(), 3, "the cut-off call was not sent again");
    assert_eq!(remote.count("message/send"), 3, "{:?}", remote.requests());
    assert_eq!(remote.count("SendMessage"), 0, "{:?}", remote.requests());
}
