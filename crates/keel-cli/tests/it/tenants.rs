//! Tenants (issue 6): the operator creates tenants `acme` and `globex` and mints their
//! tokens; each token sees and controls only its tenant's runs, memory, mailboxes and
//! audit entries. Another tenant's run answers exactly like a missing one, a revoked
//! token is refused, `max_runs` answers 429 with `Retry-After`, and only the operator
//! manages tenants.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;

use serde_json::Value;

use crate::harness::{Keel, agent, wait_for};

/// `keel` acting with `token` (a tenant's) instead of the operator's.
fn run_as(keel: &Keel, token: &str, args: &[&str]) -> Output {
    keel.cmd().env("KEEL_API_TOKEN", token).args(args).output().expect("spawn keel")
}

fn ok_as(keel: &Keel, token: &str, args: &[&str]) -> String {
    let out = run_as(keel, token, args);
    assert!(
        out.status.success(),
        "keel {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn json_as(keel: &Keel, token: &str, args: &[&str]) -> Value {
    let text = ok_as(keel, token, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("keel {args:?} printed no JSON ({e}): {text}"))
}

/// Asserts the command fails saying the run does not exist.
fn refused_as_missing(keel: &Keel, token: &str, args: &[&str], run: &str) {
    let out = run_as(keel, token, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "keel {args:?} must fail for another tenant's run");
    assert!(stderr.contains(&format!("no run {run}")), "keel {args:?}: {stderr}");
}

/// One raw HTTP request; returns the status, the headers (lowercased names) and the body.
pub(crate) fn http(keel: &Keel, method: &str, path: &str, token: &str, body: &str) -> (u16, String, String) {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let mut stream = TcpStream::connect(info["addr"].as_str().unwrap()).expect("connect");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

pub(crate) fn admin_token(keel: &Keel) -> String {
    std::fs::read_to_string(keel.data.path().join("api-token")).unwrap().trim().to_owned()
}

fn run_ids(runs: &Value) -> Vec<String> {
    runs.as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn one_tenant_cannot_read_signal_or_spend_anothers_anything() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none"]);
    let admin = admin_token(&keel);
    keel.ok(&["tenant", "create", "acme", "--max-runs", "2", "--max-usd-per-run", "0.25"]);
    keel.ok(&["tenant", "create", "globex"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let globex_token = keel.json(&["tenant", "token", "globex", "--label", "ci", "--json"]);
    let globex = globex_token["token"].as_str().unwrap().to_owned();
    assert!(acme.starts_with("kt_") && globex.starts_with("kt_"), "{acme} {globex}");

    // Only the operator manages tenants.
    let (status, _, body) = http(&keel, "POST", "/v1/tenants", &acme, r#"{"name":"evil"}"#);
    assert_eq!(status, 403, "{body}");
    let out = run_as(&keel, &acme, &["tenant", "token", "globex"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("operator"));
    let (status, _, _) = http(&keel, "POST", "/v1/tenants", &admin, r#"{"name":"acme"}"#);
    assert_eq!(status, 409, "a tenant is created once");
    let listed = json_as(&keel, &acme, &["tenant", "list", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "a tenant lists itself only: {listed}");
    assert_eq!(listed[0]["quota"]["max_runs"], 2);

    // acme runs a program (its tool calls are audited) and starts a run that waits.
    let exec =
        json_as(&keel, &acme, &["exec", "--sandbox", "none", "--grant", "echo", "-e", "echo(n=1)", "--json"]);
    assert_eq!(exec["ok"], true, "{exec}");
    let exec_run = exec["run_id"].as_str().unwrap().to_owned();
    let ask = agent("ask_agent.py");
    let detached =
        json_as(&keel, &acme, &["run", "--detach", "--json", "--sandbox", "none", "--", "python3", &ask]);
    let run = detached["run_id"].as_str().unwrap().to_owned();
    wait_for("acme's run to wait", || {
        let view = json_as(&keel, &acme, &["inspect", &run, "--json"]);
        (view["state"] == "waiting").then_some(())
    });
    let view = json_as(&keel, &acme, &["inspect", &run, "--json"]);
    assert_eq!(view["tenant"], "acme", "{view}");
    assert_eq!(view["budget"]["limits"]["usd"], 0.25, "the tenant's default budget applies: {view}");

    // globex sees none of it: not in ps, and every command on it is "no such run".
    let globex_runs = run_ids(&json_as(&keel, &globex, &["ps", "--json"]));
    assert!(!globex_runs.contains(&run) && !globex_runs.contains(&exec_run), "{globex_runs:?}");
    for args in [
        vec!["inspect", &run],
        vec!["logs", &run],
        vec!["stop", &run],
        vec!["pause", &run],
        vec!["resume", &run],
        vec!["answer", &run, "--text", "hijacked"],
        vec!["budget", &run, "--add-usd", "5"],
        vec!["send", &run, "--json", "\"hi\""],
        vec!["approve", &run, "1"],
    ] {
        refused_as_missing(&keel, &globex, &args, &run);
    }
    // Over HTTP, another tenant's run and a missing one answer alike (no existence oracle).
    let missing = "run_00000000000000000000000000";
    for (method, suffix, body) in [
        ("GET", "", ""),
        ("GET", "/events", ""),
        ("POST", "/stop", ""),
        ("POST", "/answer", r#"{"text":"x"}"#),
        ("POST", "/budget", r#"{"add":{"usd":5}}"#),
        ("POST", "/messages", r#"{"message":"x"}"#),
        ("POST", "/approvals/1", r#"{"decision":"approve"}"#),
    ] {
        let (status, _, theirs) = http(&keel, method, &format!("/v1/runs/{run}{suffix}"), &globex, body);
        let (_, _, absent) = http(&keel, method, &format!("/v1/runs/{missing}{suffix}"), &globex, body);
        assert_eq!(status, 404, "{method} {suffix}: {theirs}");
        assert_eq!(theirs.replace(&run, "RUN"), absent.replace(missing, "RUN"), "{method} {suffix}");
    }
    // A tenant's token cannot create a run for another tenant.
    let cwd = crate::harness::repo_root().display().to_string();
    let create =
        format!(r#"{{"command":["true"],"cwd":"{cwd}","tenant":"acme","sandbox":{{"tier":"none"}}}}"#);
    let (status, _, body) = http(&keel, "POST", "/v1/runs", &globex, &create);
    assert_eq!(status, 403, "{body}");

    // Memory and audit are the tenant's own.
    ok_as(&keel, &acme, &["mem", "put", "notes", "plan", "\"acme secret\""]);
    assert!(ok_as(&keel, &acme, &["mem", "get", "notes", "plan"]).contains("acme secret"));
    for token in [&globex, &admin] {
        let out = run_as(&keel, token, &["mem", "get", "notes", "plan"]);
        assert!(!out.status.success(), "another tenant must not read acme's memory");
    }
    let (_, _, hits) = http(&keel, "GET", "/v1/memory/notes?q=secret", &globex, "");
    assert_eq!(serde_json::from_str::<Value>(&hits).unwrap()["hits"], serde_json::json!([]), "{hits}");
    let acme_audit = json_as(&keel, &acme, &["audit", &exec_run, "--json"]);
    assert!(!acme_audit.as_array().unwrap().is_empty(), "acme sees its audit entries: {acme_audit}");
    let globex_audit = json_as(&keel, &globex, &["audit", &exec_run, "--json"]);
    assert_eq!(globex_audit, serde_json::json!([]), "globex sees none of acme's audit entries");
    let (status, _, _) = http(&keel, "GET", "/v1/audit/verify", &globex, "");
    assert_eq!(status, 403, "verifying walks every tenant's entries: the operator's");

    // The operator sees every tenant's runs.
    let all = run_ids(&keel.json(&["ps", "--json"]));
    assert!(all.contains(&run) && all.contains(&exec_run), "{all:?}");
    let (_, _, only_globex) = http(&keel, "GET", "/v1/runs?tenant=globex", &admin, "");
    assert_eq!(only_globex, "[]");

    // max_runs: acme has one live run of two; a second is admitted, a third refused (429).
    let second =
        json_as(&keel, &acme, &["run", "--detach", "--json", "--sandbox", "none", "--", "python3", &ask]);
    let second = second["run_id"].as_str().unwrap().to_owned();
    let own = format!(r#"{{"command":["true"],"cwd":"{cwd}","sandbox":{{"tier":"none"}}}}"#);
    let (status, head, body) = http(&keel, "POST", "/v1/runs", &acme, &own);
    assert_eq!(status, 429, "{body}");
    assert!(head.contains("retry-after: "), "{head}");
    assert!(body.contains("max_runs 2"), "{body}");
    let out = run_as(&keel, &acme, &["run", "--detach", "--sandbox", "none", "--", "true"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("quota"));

    // acme's own controls work: answer one, stop the other.
    ok_as(&keel, &acme, &["answer", &run, "--text", "yes"]);
    ok_as(&keel, &acme, &["stop", &second]);
    wait_for("acme's runs to end", || {
        let a = json_as(&keel, &acme, &["inspect", &run, "--json"]);
        let b = json_as(&keel, &acme, &["inspect", &second, "--json"]);
        (a["state"] == "succeeded" && b["state"] == "cancelled").then_some(())
    });
    assert!(ok_as(&keel, &acme, &["logs", &run]).contains("yes"));

    // A revoked token is refused (401) from then on; the other tenant's still works.
    let prefix = globex_token["prefix"].as_str().unwrap();
    keel.ok(&["tenant", "revoke", "globex", prefix]);
    let (status, _, body) = http(&keel, "GET", "/v1/runs", &globex, "");
    assert_eq!(status, 401, "{body}");
    let listed = keel.json(&["tenant", "list", "--json"]);
    let globex_view = listed.as_array().unwrap().iter().find(|t| t["name"] == "globex").unwrap().clone();
    assert_eq!(globex_view["tokens"][0]["revoked"], true, "{globex_view}");
    ok_as(&keel, &acme, &["ps"]);
}
