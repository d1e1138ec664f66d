//! Keel as an A2A server, end to end: an agent declared in keel.toml with `a2a = true` is
//! published (its card at `/.well-known/agent-card.json`), and the official `a2a-sdk`
//! client (pinned; `tests/agents/a2a_client.py`) drives it through the real daemon: a
//! blocking send, a retried message, data parts and a context, the input-required round
//! trip (the agent's `human.ask`), a failure, cancel, list, streaming, subscribe and a
//! push notification, then 0.3's method names and bad requests. Each task is a run,
//! visible to `keel ps` as started by `a2a:echo`.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Keel, a2a_python, agent, agents};

/// A daemon serving the `echo` agent (and one that is not published).
fn serving() -> Keel {
    let mut keel = Keel::new();
    let config = format!(
        r#"
[[agents]]
name = "echo"
description = "Repeats what it is told; asks a question when told to ask."
a2a = true
command = ["python3", "{agent}"]
sandbox = {{ tier = "none" }}
[[agents.skills]]
id = "echo"
name = "Echo"
description = "Echoes the text back."
tags = ["demo"]
examples = ["hello"]

[[agents]]
name = "hidden"
description = "Declared, not published."
command = ["true"]
"#,
        agent = agent("a2a_agent.py"),
    );
    std::fs::write(keel.data.path().join("keel.toml"), config).unwrap();
    keel.start_daemon();
    keel
}

#[test]
fn the_official_a2a_client_drives_a_published_agent() {
    let keel = serving();
    let (base, token) = keel.api();
    keel.ok(&["tenant", "create", "other"]);
    let tenant_token = keel.ok(&["tenant", "token", "other"]).trim().to_owned();
    let config = json!({ "base": base, "token": token, "tenant_token": tenant_token });
    let out = Command::new(a2a_python())
        .arg(agents().join("a2a_client.py"))
        .arg(config.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a2a_client failed:\n{}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(keel.data.path().join("daemon.log")).unwrap_or_default()
    );
    let summary: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();

    // Each task is a run of the declared command, started by the agent's endpoint.
    let completed = summary["completed"].as_str().unwrap();
    let view = keel.inspect(completed);
    assert_eq!(view["state"], "succeeded");
    assert_eq!(view["output"], "echo: hello");
    assert_eq!(view["started_by"], "a2a:echo");
    let asked = keel.inspect(summary["input_required"].as_str().unwrap());
    assert_eq!(asked["output"], "got: Paris");
    assert!(
        asked["journal"].as_array().unwrap().iter().any(|entry| entry["method"] == "human.ask"),
        "the question was the agent's human.ask: {asked}"
    );
    assert_eq!(keel.inspect(summary["canceled"].as_str().unwrap())["state"], "cancelled");
    // The retried message started one run: the ps listing holds it once.
    let runs = keel.json(&["ps", "--json"]);
    let retried = summary["retried"].as_str().unwrap();
    let listed = runs.as_array().unwrap().iter().filter(|run| run["run_id"] == retried).count();
    assert_eq!(listed, 1, "{runs}");
    let a2a_runs = runs.as_array().unwrap().iter().filter(|run| run["started_by"] == "a2a:echo").count();
    assert!(a2a_runs >= 9, "every task is a run started by a2a:echo: {runs}");
    assert!(summary["pushes"].as_u64().unwrap() >= 1, "{summary}");
}

#[test]
fn a_bad_agent_declaration_stops_the_start_naming_the_entry() {
    let keel = Keel::new();
    std::fs::write(
        keel.data.path().join("keel.toml"),
        "[[agents]]\nname = \"echo\"\ndescription = \"d\"\na2a = true\ncommand = []\n",
    )
    .unwrap();
    let out = keel.cmd().args(["serve", "--listen", "127.0.0.1:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("[[agents]] #1 (\"echo\")") && stderr.contains("`command` is empty"), "{stderr}");
}
