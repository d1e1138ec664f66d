//! The kernel as an MCP server (issue 15): `keel serve`'s `/mcp` driven by the official
//! `mcp` Python client, the pinned 1.x (scripts/test-requirements.txt) and the current 2.x
//! (its own virtualenv, scripts/frameworks/mcp-v2.txt). A tenant's token lists the
//! kernel's tools, starts a run through `run_agent`, reads it back as a tool result and as
//! resources; another tenant's token sees none of it; bad arguments are refused as tool
//! errors naming the argument; and closing the session logs no "Session termination
//! failed".

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::frameworks::environment;
use crate::harness::{Keel, agent};
use crate::tenants::http;

/// The endpoint of the daemon's API listener.
fn mcp_url(keel: &Keel) -> String {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    format!("http://{}/mcp", info["addr"].as_str().unwrap())
}

/// Runs `tests/agents/mcp_api_client.py` under `python`; returns its report.
fn drive(python: &Path, keel: &Keel, owner: &str, other: &str) -> Value {
    let out = Command::new(python)
        .arg(agent("mcp_api_client.py"))
        .args([&mcp_url(keel), owner, other, &agent("echo_agent.py")])
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "the MCP client failed ({}):\n{}\ndaemon log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(keel.data.path().join("daemon.log")).unwrap_or_default()
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// A daemon with tenants `acme` and `globex`; their tokens.
fn daemon_with_tenants() -> (Keel, String, String) {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none"]);
    keel.ok(&["tenant", "create", "acme"]);
    keel.ok(&["tenant", "create", "globex"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let globex = keel.ok(&["tenant", "token", "globex"]).trim().to_owned();
    (keel, acme, globex)
}

/// What both SDK generations must see.
fn check(report: &Value, keel: &Keel) {
    assert_eq!(report["server"], "keel", "{report}");
    assert!(report["capabilities"].as_array().unwrap().contains(&json!("resources")), "{report}");
    assert!(report["instructions"].as_str().unwrap().contains("run_agent"), "{report}");
    let tools: Vec<&str> =
        report["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        tools,
        [
            "run_agent",
            "list_runs",
            "get_run",
            "get_run_logs",
            "stop_run",
            "pause_run",
            "resume_run",
            "answer",
            "approve",
            "deny",
            "send_message",
            "search_memory",
            "exec_code"
        ]
    );
    let run_agent = &report["tools"][0]["inputSchema"];
    assert_eq!(run_agent["properties"]["command"]["minItems"], 1, "{run_agent}");
    assert!(run_agent["required"].as_array().unwrap().contains(&json!("command")), "{run_agent}");
    assert_eq!(report["templates"], json!(["keel://runs/{id}", "keel://runs/{id}/journal"]));

    // Bad arguments: a tool error naming what was wrong; nothing started.
    let error_text = |name: &str| {
        let result = &report[name];
        assert_eq!(result["isError"], true, "{name}: {result}");
        result["content"][0]["text"].as_str().unwrap().to_owned()
    };
    let bad_get = error_text("bad_get");
    assert!(bad_get.contains("invalid arguments") && bad_get.contains("run_id"), "{bad_get}");
    let bad_run = error_text("bad_run");
    assert!(bad_run.contains("command"), "{bad_run}");
    assert!(error_text("bad_id").contains("run_nope"));

    // The run started through run_agent, as the token's tenant, and read back.
    let run_id = report["run_id"].as_str().unwrap();
    let started = &report["started"]["structuredContent"];
    assert_eq!(started["tenant"], "acme", "{started}");
    let got = &report["got"]["structuredContent"];
    assert_eq!(got["state"], "succeeded", "{got}");
    assert_eq!(got["output"], json!({"message": "hello", "n": 1}), "{got}");
    let logs = report["logs"]["structuredContent"].to_string();
    assert!(logs.contains("hello from agent"), "{logs}");
    let listed = &report["listed"]["structuredContent"]["runs"];
    assert!(listed.as_array().unwrap().iter().any(|r| r["run_id"] == run_id), "{listed}");
    let resource = &report["resource"]["contents"][0];
    assert_eq!(resource["uri"], format!("keel://runs/{run_id}"));
    assert_eq!(resource["mimeType"], "application/json");
    let read: Value = serde_json::from_str(resource["text"].as_str().unwrap()).unwrap();
    assert_eq!((read["run_id"].as_str(), read["state"].as_str()), (Some(run_id), Some("succeeded")));
    let journal: Value =
        serde_json::from_str(report["journal"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert!(
        journal["journal"].as_array().unwrap().iter().any(|e| e["method"] == "tool.call"),
        "the echo call is journaled: {journal}"
    );
    assert!(report["resources"].as_array().unwrap().contains(&json!(format!("keel://runs/{run_id}"))));
    assert_eq!(report["unknown_resource"], -32002, "MCP's resource-not-found code");

    // The other tenant: the run answers as missing, nothing of it is listed, and the stop
    // was refused (the run is as it was).
    let other_get = &report["other_get"];
    assert_eq!(other_get["isError"], true, "{other_get}");
    assert!(other_get.to_string().contains(&format!("no run {run_id}")), "{other_get}");
    assert_eq!(report["other_stop"]["isError"], true, "{}", report["other_stop"]);
    assert_eq!(report["other_list"]["structuredContent"]["runs"], json!([]));
    assert_eq!(report["other_resources"], json!([]));
    assert_eq!(report["other_resource"], -32002);
    assert_eq!(keel.inspect(run_id)["state"], "succeeded");

    // Sessions ended cleanly: the DELETE was answered as the spec says.
    assert_eq!(report["warnings"], json!([]), "{report}");
}

#[test]
fn the_official_mcp_1x_client_drives_the_kernel_within_its_tenant() {
    let python = keel_mcp::testing::python_with_mcp().unwrap_or_else(|e| panic!("{e}"));
    let (keel, acme, globex) = daemon_with_tenants();
    let report = drive(Path::new(&python), &keel, &acme, &globex);
    assert!(report["sdk"].as_str().unwrap().starts_with("1."), "{report}");
    check(&report, &keel);
}

#[test]
fn the_official_mcp_2x_client_drives_the_kernel_and_ends_its_session_cleanly() {
    let env = environment("mcp-v2");
    let (keel, acme, globex) = daemon_with_tenants();
    let report = drive(&env.join("bin/python"), &keel, &acme, &globex);
    assert!(report["sdk"].as_str().unwrap().starts_with("2."), "{report}");
    check(&report, &keel);
}

#[test]
fn the_endpoint_needs_an_api_token_and_answers_a_session_delete_with_204() {
    let (keel, acme, _) = daemon_with_tenants();
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    })
    .to_string();
    let (status, head, _) = http(&keel, "POST", "/mcp", "not-a-token", &initialize);
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    // An empty one neither.
    let (status, _, _) = http(&keel, "POST", "/mcp", "", &initialize);
    assert_eq!(status, 401);
    let session = mcp_session(&keel, &acme, &initialize);
    let (status, head, _) = raw(&keel, "DELETE", &acme, &[("Mcp-Session-Id", &session)], "");
    assert_eq!(status, 204, "{head}");
    // The session is gone: a request in it is a 404, which tells a client to start anew.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let (status, head, _) = raw(&keel, "POST", &acme, &[("Mcp-Session-Id", &session)], &list);
    assert_eq!(status, 404, "{head}");
}

/// Initializes a session with a raw request; returns its id.
fn mcp_session(keel: &Keel, token: &str, initialize: &str) -> String {
    let (status, head, body) = raw(keel, "POST", token, &[], initialize);
    assert_eq!(status, 200, "{head}\n{body}");
    head.lines()
        .find_map(|line| line.strip_prefix("mcp-session-id: "))
        .unwrap_or_else(|| panic!("no session id in {head}"))
        .trim()
        .to_owned()
}

/// One request to `/mcp` with the headers MCP asks for; (status, lowercased head, body).
fn raw(keel: &Keel, method: &str, token: &str, extra: &[(&str, &str)], body: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let addr = mcp_url(keel).trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let mut request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    // An SSE answer stays open after its one event: read what arrives until the server
    // closes it or the event is in.
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                response.push_str(&String::from_utf8_lossy(&buf[..n]));
                if response.contains("\"result\"") || (method == "DELETE" && response.contains("\r\n\r\n")) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}
