//! The HTTP API as a client without the CLI sees it: auth, errors, OpenAPI.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::harness::Keel;

/// A minimal HTTP/1.1 exchange, so the test depends on no HTTP client crate.
fn http(addr: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[test]
fn api_requires_the_token_and_documents_itself() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let addr = info["addr"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(keel.data.path().join("api-token")).unwrap();

    let (status, body) = http(&addr, "GET /v1/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 401);
    assert!(body.contains("unauthenticated"), "{body}");

    let (status, body) = http(
        &addr,
        &format!(
            "GET /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            token.trim()
        ),
    );
    assert_eq!(status, 200, "{body}");

    let bad = "{\"command\": []}";
    let (status, body) = http(
        &addr,
        &format!(
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{bad}",
            token.trim(),
            bad.len()
        ),
    );
    assert_eq!(status, 400);
    assert!(body.contains("command"), "{body}");

    let (status, body) = http(&addr, "GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.contains("/v1/runs/{id}/events"), "{body}");
}

#[test]
fn an_answer_needs_exactly_one_of_text_and_value() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(keel.data.path().join("kernel.json")).unwrap())
            .unwrap();
    let addr = info["addr"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(keel.data.path().join("api-token")).unwrap();
    let answer = |body: &str| {
        http(
            &addr,
            &format!(
                "POST /v1/runs/run_00000000000000000000000000/answer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                token.trim(),
                body.len()
            ),
        )
    };
    for (body, which) in [(r#"{"text": "a", "value": {"b": 1}}"#, "both"), ("{}", "neither")] {
        let (status, reply) = answer(body);
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains(&format!("has {which} of `text` and `value`; send exactly one")), "{reply}");
    }
    // A well-formed answer reaches the run (here: none by that id), text or value.
    for body in [r#"{"text": "a"}"#, r#"{"value": null}"#] {
        let (status, reply) = answer(body);
        assert_eq!(status, 404, "{reply}");
    }
}
