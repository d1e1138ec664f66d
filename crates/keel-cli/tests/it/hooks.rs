//! Webhooks end to end: deliveries signed the GitHub, Stripe and generic HMAC ways by a
//! sender that computes its signatures with Python's own hmac module; a redelivery starts
//! nothing new; a bad, stale or missing signature is a 401 that starts nothing and is
//! audited; a body that is not JSON reaches the run as text; an oversized one is a 413.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Keel, agent, wait_for};

const GH_SECRET: &str = "It's a Secret to Everybody";
const STRIPE_SECRET: &str = "whsec_test_0123456789";
const CI_SECRET: &str = "ci-secret";

/// The runs the hooks' agent recorded: run id -> its input.
fn recorded(path: &std::path::Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (run, input) = line.split_once(' ')?;
            Some((run.to_owned(), serde_json::from_str(input).ok()?))
        })
        .collect()
}

struct Sender {
    addr: String,
}

impl Sender {
    fn send(&self, hook: &str, scheme: &str, secret: &str, body: &str, opts: &[&str]) -> (u64, Value) {
        let out = Command::new("python3")
            .arg(agent("hook_sender.py"))
            .args([&self.addr, hook, scheme, secret, body])
            .args(opts)
            .output()
            .expect("run hook_sender.py");
        assert!(out.status.success(), "hook_sender.py: {}", String::from_utf8_lossy(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).expect("hook_sender.py prints JSON");
        (answer["status"].as_u64().unwrap(), answer["body"].clone())
    }
}

#[test]
fn signed_deliveries_start_one_run_each_and_bad_ones_start_nothing() {
    let mut keel = Keel::new();
    keel.daemon_env = vec![
        ("GH_SECRET".into(), GH_SECRET.into()),
        ("STRIPE_SECRET".into(), STRIPE_SECRET.into()),
        ("CI_SECRET".into(), CI_SECRET.into()),
    ];
    keel.start_daemon();
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let sender = Sender { addr: info["addr"].as_str().unwrap().to_owned() };
    let log = keel.data.path().join("deliveries.log");
    let script = format!("printf '%s %s\\n' \"$KEEL_RUN_ID\" \"$KEEL_INPUT\" >> {}", log.display());
    let create = |name: &str, extra: &[&str]| {
        let mut args = vec!["hook", "create", name];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--sandbox", "none", "--", "sh", "-c", &script]);
        keel.ok(&args)
    };
    let created = create("pushes", &["--verify", "github", "--secret-env", "GH_SECRET"]);
    assert!(created.contains("POST /v1/hooks/pushes"), "{created}");
    create("payments", &["--verify", "stripe", "--secret-env", "STRIPE_SECRET"]);
    create("ci", &["--verify", "hmac-sha256", "--header", "X-Signature", "--secret-env", "CI_SECRET"]);

    // GitHub: a push, then GitHub's "redeliver" of the same delivery id.
    let push = r#"{"ref":"refs/heads/main","commits":[{"id":"abc"}]}"#;
    let (status, first) = sender.send("pushes", "github", GH_SECRET, push, &["delivery=d-1", "event=push"]);
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["duplicate"], false);
    let run = first["run_id"].as_str().unwrap().to_owned();
    let (status, again) = sender.send("pushes", "github", GH_SECRET, push, &["delivery=d-1", "event=push"]);
    assert_eq!(status, 200, "a redelivery is answered 2xx so the sender stops: {again}");
    assert_eq!((again["run_id"].as_str(), again["duplicate"].as_bool()), (Some(run.as_str()), Some(true)));

    // Stripe: signed now, then the same event's signature replayed long after.
    let event = r#"{"id":"evt_1","type":"charge.succeeded","data":{"object":{"amount":500}}}"#;
    let (status, paid) = sender.send("payments", "stripe", STRIPE_SECRET, event, &[]);
    assert_eq!(status, 202, "{paid}");
    assert_eq!(paid["delivery_id"], "evt_1", "a Stripe event's id names the delivery");
    let old = (keel_now_secs() - 3_600).to_string();
    let other = r#"{"id":"evt_2","type":"charge.succeeded"}"#;
    let (status, stale) = sender.send("payments", "stripe", STRIPE_SECRET, other, &[&format!("t={old}")]);
    assert_eq!(status, 401, "{stale}");
    assert!(stale["error"]["message"].as_str().unwrap().contains("outside the tolerance"), "{stale}");

    // Generic HMAC in a header of the hook's choosing, with a body that is not JSON.
    let (status, text) = sender.send(
        "ci",
        "hmac-sha256",
        CI_SECRET,
        "build 42 passed",
        &["header=X-Signature", "content_type=text/plain"],
    );
    assert_eq!(status, 202, "{text}");

    // Refused: a wrong secret, a body changed after signing, no signature at all, a
    // signature in the wrong header. None starts a run.
    for (hook, scheme, secret, opts, needle) in [
        ("pushes", "github", "not the secret", vec!["delivery=d-2"], "does not match"),
        ("pushes", "github", GH_SECRET, vec!["delivery=d-3", "tamper=1"], "does not match"),
        ("pushes", "none", "", vec![], "X-Hub-Signature-256 header is missing"),
        ("ci", "hmac-sha256", CI_SECRET, vec![], "X-Signature header is missing"),
    ] {
        let (status, refused) = sender.send(hook, scheme, secret, push, &opts);
        assert_eq!(status, 401, "{hook} {opts:?}: {refused}");
        assert_eq!(refused["error"]["kind"], "unauthorized");
        assert!(refused["error"]["message"].as_str().unwrap().contains(needle), "{refused}");
        assert!(!refused.to_string().contains(GH_SECRET), "the answer never holds the secret");
    }
    // Deliveries take no token, but reading or deleting a hook does.
    for request in ["GET /v1/hooks/pushes", "DELETE /v1/hooks/pushes", "GET /v1/hooks"] {
        let mut stream = std::net::TcpStream::connect(&sender.addr).unwrap();
        write!(stream, "{request} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 401") && answer.contains("unauthenticated"),
            "{request}: {answer}"
        );
    }
    let (status, missing) = sender.send("nobody", "github", GH_SECRET, push, &[]);
    assert_eq!(status, 404, "{missing}");
    let (status, big) = sender.send("pushes", "github", GH_SECRET, "", &["size=1100000", "delivery=d-big"]);
    assert_eq!(status, 413, "{big}");

    // Exactly the three accepted deliveries ran, each with its payload as input.
    let runs = wait_for("the three accepted deliveries' runs", || {
        let runs = recorded(&log);
        (runs.len() >= 3).then_some(runs)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let runs_now = recorded(&log);
    assert_eq!(runs_now.len(), 3, "no refused or repeated delivery started a run: {runs_now:?}");
    let input = &runs[&run];
    assert_eq!(
        (&input["trigger"], &input["hook"], &input["delivery_id"], &input["event"]),
        (&json!("hook"), &json!("pushes"), &json!("d-1"), &json!("push"))
    );
    assert_eq!(input["payload"], serde_json::from_str::<Value>(push).unwrap());
    let stripe_input = &runs[paid["run_id"].as_str().unwrap()];
    assert_eq!(stripe_input["event"], "charge.succeeded");
    assert_eq!(stripe_input["payload"]["data"]["object"]["amount"], 500);
    let text_input = &runs[text["run_id"].as_str().unwrap()];
    assert_eq!(text_input["payload"], "build 42 passed", "a body that is not JSON is passed as text");
    assert!(text_input["delivery_id"].as_str().unwrap().starts_with("keel-"), "{text_input}");

    // What started each run shows in `keel ps`; the hook shows its deliveries.
    let listed = keel.json(&["ps", "--json"]);
    let by: BTreeMap<String, String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (r["run_id"].as_str().unwrap().to_owned(), r["started_by"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    assert_eq!(by[&run], "hook:pushes");
    let shown = keel.json(&["hook", "show", "pushes", "--json"]);
    assert_eq!(shown["last_deliveries"].as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(shown["last_deliveries"][0]["delivery_id"], "d-1");
    assert_eq!(shown["secret_present"], true);
    let text = keel.ok(&["hook", "list"]);
    assert!(text.contains("pushes") && text.contains("payments") && text.contains("ci"), "{text}");

    // Every refusal is in the audit log, naming the hook and why.
    let audit = keel.ok(&["audit", "export"]);
    let refusals: Vec<Value> = audit
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry["action"] == "hook.refused")
        .collect();
    assert_eq!(refusals.len(), 5, "the stale Stripe event and the four refusals: {refusals:?}");
    assert!(refusals.iter().all(|e| e["outcome"] == "denied"));
    assert!(audit.contains("hook.delivery"), "accepted deliveries are audited too");

    // A redelivery after a daemon restart is still recognised.
    keel.kill_daemon();
    keel.start_daemon();
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let sender = Sender { addr: info["addr"].as_str().unwrap().to_owned() };
    let (status, after) = sender.send("pushes", "github", GH_SECRET, push, &["delivery=d-1"]);
    assert_eq!((status, after["run_id"].as_str()), (200, Some(run.as_str())), "{after}");

    // Deleting the hook ends its URL.
    keel.ok(&["hook", "delete", "pushes"]);
    let (status, _) = sender.send("pushes", "github", GH_SECRET, push, &["delivery=d-9"]);
    assert_eq!(status, 404);
}

#[test]
fn bad_hooks_are_refused_naming_what_is_wrong() {
    let keel = Keel::new();
    let refused = |args: &[&str], needle: &str| {
        let mut full = vec!["hook", "create"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--", "true"]);
        let out = keel.cmd().args(&full).env_remove("NO_SUCH_SECRET").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(
        &["h", "--verify", "md5", "--secret-env", "PATH"],
        "possible values: github, stripe, hmac-sha256",
    );
    refused(
        &["h", "--verify", "github", "--secret-env", "NO_SUCH_SECRET"],
        "environment has no NO_SUCH_SECRET",
    );
    refused(&["h", "--verify", "github", "--secret-env", "1BAD"], "not an environment variable name");
    refused(&["h/x", "--verify", "github", "--secret-env", "PATH"], "hook name \"h/x\" is not valid");
    refused(&["h", "--verify", "github", "--header", "X-A", "--secret-env", "PATH"], "only for hmac-sha256");
    refused(&["h", "--verify", "stripe", "--tolerance", "0", "--secret-env", "PATH"], "out of range");
    let listed = keel.json(&["hook", "list", "--json"]);
    assert_eq!(listed, Value::Array(vec![]), "nothing malformed was stored");
}

fn keel_now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}
