//! The audit log end to end: a sandboxed run's egress decisions are audited, `keel audit`
//! lists them, `keel audit verify` finds the chain intact, `keel audit export` writes
//! JSON lines, and after the database file is tampered with (triggers dropped, a detail
//! changed, as an attacker with the file would) `keel audit verify` names the entry.

use serde_json::Value;

use crate::harness::{Keel, agents, sql};

/// Serves an echo on a loopback port (a host the allowlist can name).
fn echo_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut reader, mut writer) = (stream.try_clone().unwrap(), stream);
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    port
}

#[test]
fn egress_decisions_are_audited_verified_exported_and_tampering_is_caught() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let (allowed, denied) = (format!("127.0.0.1:{}", echo_server()), format!("127.0.0.1:{}", echo_server()));
    let program = agents().join("escape/escape.py").display().to_string();
    keel.ok(&[
        "run",
        "--quiet",
        "--allow-host",
        &allowed,
        "--",
        "python3",
        &program,
        "allowlist",
        &allowed,
        &denied,
    ]);
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().unwrap().to_owned();

    // The proxy's two decisions, in order, as the run's audit entries.
    let entries = keel.json(&["audit", &run, "--json"]);
    let entries = entries.as_array().unwrap();
    let summary: Vec<(u64, &str, &str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["actor"].as_str().unwrap(),
                e["action"].as_str().unwrap(),
                e["subject"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![(1, "agent", "egress", "127.0.0.1", "allowed"), (2, "agent", "egress", "127.0.0.1", "denied")],
        "{entries:?}"
    );
    assert_eq!(entries[0]["run_id"], run.as_str());
    assert_eq!(entries[0]["tenant"], "default", "the tenant comes from the run's record");
    assert_eq!(entries[1]["prev_hash"], entries[0]["hash"]);
    assert_eq!(entries[1]["detail"]["port"].as_u64(), denied.rsplit(':').next().unwrap().parse().ok());

    let table = keel.ok(&["audit", &run]);
    assert!(table.contains("SEQ") && table.contains("denied") && table.contains("egress"), "{table}");
    assert_eq!(keel.ok(&["audit", "show", &run]), table, "`keel audit show RUN` is `keel audit RUN`");

    let head = entries[1]["hash"].as_str().unwrap();
    let verified = keel.ok(&["audit", "verify"]);
    assert_eq!(verified.trim(), format!("audit log intact: 2 entries, head {head}"));

    let export = keel.data.path().join("audit.jsonl");
    keel.ok(&["audit", "export", "--run", &run, "-o", export.to_str().unwrap()]);
    let lines: Vec<Value> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    assert_eq!(lines.iter().collect::<Vec<_>>(), entries.iter().collect::<Vec<_>>(), "export = list");

    // A bad run id is refused by the API (400) with a message that names it.
    let bad = keel.run(&["audit", "not-a-run"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not-a-run"), "{bad:?}");

    // Tamper with the stopped kernel's database: the triggers refuse the UPDATE, so drop
    // them first, then soften the denial's detail.
    keel.kill_daemon();
    let db = keel.data.path().join("keel.db");
    sql(
        &db,
        "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete; \
         UPDATE audit SET detail = '{\"allowed\": true}' WHERE seq = 2;",
    );

    let out = keel.run(&["audit", "verify"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "tampering exits 3: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("audit log TAMPERED at entry 2: entry 2 was modified"), "{stdout}");
    let json = keel.run(&["audit", "verify", "--json"]);
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        (json["ok"].clone(), json["broken_at"].clone(), json["entries"].clone()),
        (false.into(), 2.into(), 1.into())
    );
}

/// A minimal HTTP/1.1 exchange: (status, head, body).
fn http(addr: &str, path: &str, token: Option<&str>) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status, head.to_owned(), body.to_owned())
}

/// Bad query values are 400s in the API's error shape, the routes need the token, and
/// the OpenAPI document lists them.
#[test]
fn audit_api_checks_its_queries_and_documents_itself() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let addr = info["addr"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(keel.data.path().join("api-token")).unwrap();
    let token = Some(token.trim());

    assert_eq!(http(&addr, "/v1/audit", None).0, 401);
    let (status, _, body) = http(&addr, "/v1/audit", token);
    assert_eq!((status, body.as_str()), (200, "[]"));
    for (query, words) in [
        ("limit=0", "`limit` must be between 1 and 10000"),
        ("limit=x", "limit"),
        ("after=-1", "after"),
        ("run=run_nope", "run_nope"),
    ] {
        let (status, _, body) = http(&addr, &format!("/v1/audit?{query}"), token);
        assert_eq!(status, 400, "{query}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{query}: {e}: {body}"));
        assert_eq!(body["error"]["kind"], "invalid_request", "{query}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(words), "{query}: {body}");
    }
    let (status, _, body) = http(&addr, "/v1/audit/verify", token);
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((body["ok"].clone(), body["entries"].clone()), (true.into(), 0.into()));
    let (status, head, _) = http(&addr, "/v1/audit/export", token);
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("content-type: application/x-ndjson"), "{head}");
    assert_eq!(http(&addr, "/v1/audit/export?run=x", token).0, 400);

    let (_, _, doc) = http(&addr, "/openapi.json", None);
    for path in
        ["\"/v1/audit\"", "\"/v1/audit/verify\"", "\"/v1/audit/export\"", "AuditEntryView", "AuditVerifyView"]
    {
        assert!(doc.contains(path), "the OpenAPI document lacks {path}");
    }
}
