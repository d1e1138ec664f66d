//! Event triggers end to end (issue 15): a run of an agent ends and the trigger's run
//! starts once with its output; `--on failed`; a topic message a run publishes starts a
//! run with the message; a paused trigger fires nothing, then or later; a trigger after
//! its own agent does not loop, and a loop through two triggers stops at the deepest chain;
//! a run that ended with no daemon to fire for it, and SIGKILLs of the daemon right after
//! runs end, neither lose nor duplicate a fire; bad definitions are refused naming why;
//! triggers declared in keel.toml are made at `keel serve`'s start, and a bad declaration
//! stops the start naming its entry.
//!
//! The agent is `tests/agents/event_agent.py`, copied as `a.py` and `b.py` so that runs of
//! it have two agent names.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Keel, agent, wait_for};

/// The agent copied into the test's directory as `name` (its agent name).
fn agent_as(keel: &Keel, name: &str) -> String {
    let path = keel.data.path().join(name);
    std::fs::copy(agent("event_agent.py"), &path).expect("copy event_agent.py");
    path.display().to_string()
}

fn log_path(keel: &Keel) -> PathBuf {
    keel.data.path().join("events.log")
}

/// The runs the agent recorded: run id -> its input.
fn recorded(keel: &Keel) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(log_path(keel)).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (run, input) = line.split_once(' ')?;
            Some((run.to_owned(), serde_json::from_str(input).ok()?))
        })
        .collect()
}

/// The recorded runs a trigger started (their input names it).
fn fired_by(keel: &Keel, trigger: &str) -> BTreeMap<String, Value> {
    recorded(keel).into_iter().filter(|(_, input)| input["event"] == trigger).collect()
}

/// Waits until `trigger` has started `count` runs (as the agent recorded them), then a
/// little longer to see that no more come; the runs.
fn settle(keel: &Keel, trigger: &str, count: usize) -> BTreeMap<String, Value> {
    wait_for(&format!("{count} runs started by {trigger}"), || {
        (fired_by(keel, trigger).len() >= count).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1_500));
    let runs = fired_by(keel, trigger);
    assert_eq!(runs.len(), count, "{trigger} started exactly {count} runs: {runs:?}");
    runs
}

/// `keel event create NAME ARGS... --sandbox none --env EVENT_LOG=... -- python3 AGENT`.
fn create(keel: &Keel, name: &str, args: &[&str], agent: &str) -> String {
    let log = format!("EVENT_LOG={}", log_path(keel).display());
    let mut full = vec!["event", "create", name];
    full.extend_from_slice(args);
    full.extend_from_slice(&["--sandbox", "none", "--env", &log, "--", "python3", agent]);
    keel.ok(&full)
}

/// Starts `agent` detached with `env` (and the log), waits for it to end; its view.
fn run_to_end(keel: &Keel, agent: &str, env: &[&str]) -> Value {
    let log = format!("EVENT_LOG={}", log_path(keel).display());
    let mut args = vec!["--sandbox", "none", "--env", &log];
    for pair in env {
        args.extend(["--env", pair]);
    }
    args.extend(["--", "python3", agent]);
    let run = keel.detach(&args);
    keel.wait_state(&run, &["succeeded", "failed", "cancelled"])
}

#[test]
fn a_run_end_starts_the_trigger_s_run_once_with_its_output() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    let created = create(&keel, "after-a", &["--after-run", "a.py", "--input", r#"{"k": 1}"#], &b);
    assert!(
        created.contains("created event trigger after-a") && created.contains("run of a.py succeeded"),
        "{created}"
    );
    create(&keel, "a-failed", &["--after-run", "a.py", "--on", "failed"], &b);

    let ended = run_to_end(&keel, &a, &["EVENT_VALUE=42"]);
    assert_eq!(ended["state"], "succeeded", "{ended}");
    let a_run = ended["run_id"].as_str().unwrap().to_owned();
    let runs = settle(&keel, "after-a", 1);
    let (b_run, input) = runs.iter().next().unwrap();
    assert_eq!(
        *input,
        json!({
            "trigger": "event", "event": "after-a", "on": "run_end", "agent": "a.py",
            "run_id": a_run, "state": "succeeded", "output": {"from": "a.py", "value": "42"},
            "error": null, "input": {"k": 1},
        })
    );
    assert!(fired_by(&keel, "a-failed").is_empty(), "a succeeded run does not fire --on failed");
    let shown = keel.json(&["event", "show", "after-a", "--json"]);
    assert_eq!(shown["last_fires"][0]["occasion"], a_run.as_str(), "{shown}");
    assert_eq!(shown["last_fires"][0]["run_id"], b_run.as_str(), "{shown}");
    assert_eq!(shown["last_fires"][0]["outcome"], "fired", "{shown}");
    let text = keel.ok(&["event", "show", "after-a"]);
    assert!(text.contains("last fires:") && text.contains(b_run), "{text}");
    let ps = keel.ok(&["ps"]);
    assert!(ps.contains("[event:after-a]"), "{ps}");
    let listed = keel.json(&["ps", "--json", "--limit", "100"]);
    let started: Vec<&Value> =
        listed.as_array().unwrap().iter().filter(|run| run["started_by"] == "event:after-a").collect();
    assert_eq!(started.len(), 1, "{listed}");

    // A failed run fires `--on failed`, with its error, and not the default (succeeded).
    let failed = run_to_end(&keel, &a, &["EVENT_MODE=fail"]);
    assert_eq!(failed["state"], "failed", "{failed}");
    let runs = settle(&keel, "a-failed", 1);
    let input = runs.values().next().unwrap();
    assert_eq!(input["run_id"], failed["run_id"], "{input}");
    assert_eq!(input["state"], "failed", "{input}");
    assert!(input["error"].as_str().is_some_and(|e| !e.is_empty()), "{input}");
    assert_eq!(input["output"], Value::Null, "{input}");
    settle(&keel, "after-a", 1);
    let listed = keel.json(&["event", "list", "--json"]);
    let names: Vec<_> = listed.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a-failed", "after-a"]);
}

#[test]
fn a_topic_message_starts_a_run_with_the_message() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    create(&keel, "triage", &["--topic", "tickets"], &b);
    create(&keel, "other-topic", &["--topic", "sports"], &b);
    let publisher = run_to_end(&keel, &a, &["EVENT_MODE=publish", "EVENT_TOPIC=tickets", "EVENT_VALUE=t-1"]);
    assert_eq!(publisher["state"], "succeeded", "{publisher}");
    let runs = settle(&keel, "triage", 1);
    let input = runs.values().next().unwrap();
    assert_eq!(
        *input,
        json!({
            "trigger": "event", "event": "triage", "on": "topic", "topic": "tickets",
            "message": {"hello": "t-1"}, "from": publisher["run_id"],
        })
    );
    assert!(fired_by(&keel, "other-topic").is_empty());
    let shown = keel.json(&["event", "show", "triage", "--json"]);
    let occasion = shown["last_fires"][0]["occasion"].as_str().unwrap();
    assert!(occasion.starts_with(publisher["run_id"].as_str().unwrap()), "keyed by the publish: {shown}");
}

#[test]
fn a_paused_trigger_fires_nothing_then_or_later() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    create(&keel, "after-a", &["--after-run", "a.py"], &b);
    keel.ok(&["event", "pause", "after-a"]);
    assert_eq!(keel.json(&["event", "show", "after-a", "--json"])["paused"], true);
    run_to_end(&keel, &a, &[]);
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(fired_by(&keel, "after-a").is_empty(), "a paused trigger fires nothing");
    // Neither at resumption nor at the daemon's next start (its sweep).
    keel.ok(&["event", "resume", "after-a"]);
    keel.kill_daemon();
    keel.start_daemon();
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(fired_by(&keel, "after-a").is_empty(), "what ended while paused never fires");
    let ended = run_to_end(&keel, &a, &[]);
    let runs = settle(&keel, "after-a", 1);
    assert_eq!(runs.values().next().unwrap()["run_id"], ended["run_id"]);
}

#[test]
fn a_trigger_after_its_own_agent_does_not_loop_and_chains_stop_at_sixteen() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    // Its run is a run of a.py too, and must not fire it again.
    create(&keel, "again", &["--after-run", "a.py"], &a);
    run_to_end(&keel, &a, &[]);
    settle(&keel, "again", 1);
    keel.ok(&["event", "delete", "again"]);

    // a.py -> ping -> b.py -> pong -> a.py ...: sixteen triggered runs, then no more.
    create(&keel, "ping", &["--after-run", "a.py"], &b);
    create(&keel, "pong", &["--after-run", "b.py"], &a);
    run_to_end(&keel, &a, &[]);
    wait_for("a chain of sixteen triggered runs", || {
        let count = fired_by(&keel, "ping").len() + fired_by(&keel, "pong").len();
        (count >= 16).then_some(())
    });
    // The sixteenth run is a.py's (started by pong): its end would fire ping, and is
    // recorded as a skipped fire instead once that run has ended.
    let shown = wait_for("ping's skipped fire", || {
        let shown = keel.json(&["event", "show", "ping", "--json"]);
        (shown["last_fires"][0]["outcome"] == "skipped").then_some(shown)
    });
    let skipped = shown["last_fires"][0].clone();
    assert!(skipped["detail"].as_str().unwrap().contains("16 event fires deep"), "{shown}");
    std::thread::sleep(Duration::from_millis(1_000));
    let (ping, pong) = (fired_by(&keel, "ping").len(), fired_by(&keel, "pong").len());
    assert_eq!((ping, pong), (8, 8), "the chain stops after sixteen runs");
}

#[test]
fn runs_that_ended_without_their_fire_fire_after_a_restart_once() {
    let mut keel = Keel::new();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    // No daemon: the trigger is stored through an embedded kernel, and a run of a.py ends
    // in another one, which fires nothing (as a daemon SIGKILLed right after the end).
    create(&keel, "after-a", &["--after-run", "a.py"], &b);
    let log = format!("EVENT_LOG={}", log_path(&keel).display());
    keel.ok(&["run", "--sandbox", "none", "--env", &log, "--", "python3", &a]);
    let first = keel.json(&["ps", "--json"])[0].clone();
    assert_eq!(first["state"], "succeeded", "{first}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(fired_by(&keel, "after-a").is_empty(), "no daemon, no fire yet");
    keel.start_daemon();
    let runs = settle(&keel, "after-a", 1);
    assert_eq!(runs.values().next().unwrap()["run_id"], first["run_id"]);

    // SIGKILL the daemon as soon as each run is seen ended (before, during or after its
    // fire), then restart: every run fires once.
    let mut ended = vec![runs.values().next().unwrap()["run_id"].as_str().unwrap().to_owned()];
    for _ in 0..3 {
        let run = keel.detach(&["--sandbox", "none", "--env", &log, "--", "python3", &a]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while keel.inspect(&run)["state"] != "succeeded" {
            assert!(Instant::now() < deadline, "run {run} did not end");
        }
        keel.kill_daemon();
        keel.start_daemon();
        ended.push(run);
    }
    let runs = settle(&keel, "after-a", ended.len());
    let mut fired_for: Vec<String> =
        runs.values().map(|input| input["run_id"].as_str().unwrap().to_owned()).collect();
    fired_for.sort();
    ended.sort();
    assert_eq!(fired_for, ended, "each ended run fired once");
}

#[test]
fn bad_definitions_are_refused_naming_why() {
    let mut keel = Keel::new();
    let refused = |args: &[&str], needle: &str| {
        let mut full = vec!["event", "create"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--", "true"]);
        let out = keel.run(&full);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(&["x"], "--after-run");
    refused(&["x", "--after-run", "a.py", "--topic", "t"], "cannot be used with");
    refused(&["x", "--after-run", "a.py", "--on", "done"], "invalid value 'done'");
    refused(&["x", "--topic", "t", "--on", "failed"], "applies to after_run only");
    refused(&["x", "--after-run", "jobs/a.py"], "the file name of the agent's program");
    refused(&["bad name", "--after-run", "a.py"], "event trigger name \"bad name\" is not valid");
    refused(&["x", "--topic", &"t".repeat(300)], "is not a topic");
    assert_eq!(keel.json(&["event", "list", "--json"]), json!([]), "nothing was stored");
    keel.ok(&["event", "create", "x", "--after-run", "a.py", "--", "true"]);
    refused(&["x", "--after-run", "a.py"], "an event trigger named x already exists");

    // Over HTTP, both or neither is a 400; a tenant sees only its own triggers.
    keel.start_daemon();
    let (status, body) = post(
        &keel,
        "/v1/event-triggers",
        r#"{"name":"y","after_run":"a.py","topic":"t","run":{"command":["true"]}}"#,
        None,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("exactly one of after_run"), "{body}");
    keel.ok(&["tenant", "create", "acme"]);
    let token = keel.ok(&["tenant", "token", "acme"]).trim().lines().last().unwrap().trim().to_owned();
    let mine = r#"{"name":"acme-t","topic":"t","run":{"command":["true"]}}"#;
    let (status, body) = post(&keel, "/v1/event-triggers", mine, Some(&token));
    assert_eq!(status, 201, "{body}");
    let tenant_view =
        keel.cmd().args(["event", "list", "--json"]).env("KEEL_API_TOKEN", &token).output().unwrap();
    let listed: Value = serde_json::from_slice(&tenant_view.stdout).unwrap();
    let names: Vec<_> = listed.as_array().unwrap().iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, [json!("acme-t")], "a tenant sees its own only");
    let all = keel.json(&["event", "list", "--json"]);
    assert_eq!(all.as_array().unwrap().len(), 2, "the operator sees every tenant's");
}

#[test]
fn triggers_declared_in_keel_toml_are_made_at_start_and_bad_ones_stop_it() {
    let mut keel = Keel::new();
    let a = agent_as(&keel, "a.py");
    let b = agent_as(&keel, "b.py");
    let log = log_path(&keel).display().to_string();
    let toml = |command: &str| {
        format!(
            r#"
[[triggers.schedule]]
name = "report"
cron = "0 9 * * MON-FRI"
tz = "Europe/Paris"
jitter = 5
command = ["{command}", "report"]
sandbox = {{ tier = "none" }}

[[triggers.event]]
name = "after-a"
after_run = "a.py"
command = ["python3", "{b}"]
sandbox = {{ tier = "none" }}
env = {{ EVENT_LOG = "{log}" }}
input = {{ from = "keel.toml" }}
"#
        )
    };
    let config = keel.data.path().join("keel.toml");
    std::fs::write(&config, toml("echo")).unwrap();
    keel.start_daemon();
    let schedules = keel.json(&["schedule", "list", "--json"]);
    assert_eq!(schedules[0]["name"], "report", "{schedules}");
    assert_eq!(
        (schedules[0]["declared"].clone(), schedules[0]["tz"].clone()),
        (json!(true), json!("Europe/Paris"))
    );
    let events = keel.json(&["event", "list", "--json"]);
    assert_eq!(
        (events[0]["name"].clone(), events[0]["declared"].clone()),
        (json!("after-a"), json!(true)),
        "{events}"
    );
    let out = keel.run(&["schedule", "delete", "report"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("declared in keel.toml"), "{stderr}");
    // An API-made trigger is left alone by the next start.
    keel.ok(&["event", "create", "mine", "--topic", "t", "--", "true"]);

    // The declared event trigger fires.
    let ended = run_to_end(&keel, &a, &[]);
    let runs = settle(&keel, "after-a", 1);
    let input = runs.values().next().unwrap();
    assert_eq!(
        (input["run_id"].clone(), input["input"].clone()),
        (ended["run_id"].clone(), json!({"from": "keel.toml"}))
    );

    // A changed declaration is updated in place (its fires kept); a removed one deleted.
    keel.kill_daemon();
    std::fs::write(&config, toml("printf")).unwrap();
    keel.start_daemon();
    let schedule = keel.json(&["schedule", "show", "report", "--json"]);
    assert_eq!(schedule["command"], json!(["printf", "report"]), "{schedule}");
    let event = keel.json(&["event", "show", "after-a", "--json"]);
    assert_eq!(event["last_fires"].as_array().unwrap().len(), 1, "fires kept: {event}");
    keel.kill_daemon();
    std::fs::write(&config, "").unwrap();
    keel.start_daemon();
    assert_eq!(keel.json(&["schedule", "list", "--json"]), json!([]));
    let names: Vec<Value> = keel
        .json(&["event", "list", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, [json!("mine")], "the API's trigger stays");
    keel.kill_daemon();

    // A bad declaration stops the start, naming its table, entry and field.
    let bad = |text: &str, needle: &str| {
        std::fs::write(&config, text).unwrap();
        let mut child = keel
            .cmd()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("keel serve started with a bad keel.toml: {text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle), "{text}\n{stderr}");
    };
    bad(
        "[[triggers.schedule]]\nname = \"ok\"\ncron = \"* * * * *\"\ncommand = [\"true\"]\n\n\
         [[triggers.schedule]]\nname = \"report\"\ncron = \"0 9 32 * *\"\ncommand = [\"true\"]\n",
        "[[triggers.schedule]] #2 (\"report\"): cron expression \"0 9 32 * *\": the day-of-month field",
    );
    bad(
        "[[triggers.event]]\nname = \"e\"\nafter_run = \"a.py\"\ntopic = \"t\"\ncommand = [\"true\"]\n",
        "[[triggers.event]] #1 (\"e\"): give exactly one of after_run",
    );
    bad("[[triggers.event]]\nname = \"e\"\ntopic = \"t\"\n", "`command` is missing");
    bad(
        "[[triggers.event]]\nname = \"e\"\ntopic = \"t\"\ncommand = [\"true\"]\nmodle = \"x\"\n",
        "unknown field `modle`",
    );
    bad(
        "[[triggers.hook]]\nname = \"h\"\nverify = \"github\"\nsecret_env = \"KEEL_TEST_UNSET_SECRET\"\ncommand = [\"true\"]\n",
        "[[triggers.hook]] #1 (\"h\")",
    );
    bad("[[triggers.cron]]\nname = \"x\"\n", "unknown field `cron`");
    // The API-made trigger named like a declaration is a conflict that stops the start.
    bad(
        "[[triggers.event]]\nname = \"mine\"\ntopic = \"t\"\ncommand = [\"true\"]\n",
        "an event trigger named mine was created through the API",
    );
}

/// POSTs `body` to the daemon at `path` with the operator's token (or `token`); the status
/// and body.
fn post(keel: &Keel, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let addr = info["addr"].as_str().unwrap().to_owned();
    let operator = std::fs::read_to_string(keel.data.path().join("api-token")).unwrap();
    let token = token.map_or_else(|| operator.trim().to_owned(), str::to_owned);
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}
