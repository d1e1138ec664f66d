//! `router`: serving a ToolHost to the official Python client and to our own Client.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_mcp::testing::python_with_mcp;
use keel_mcp::{Client, Error, HostError, ServerConfig, ToolHost, ToolInfo, Transport, router, served_name};
use serde_json::{Value, json};

const TOKEN: &str = "run-7-token";

#[derive(Default)]
struct TestHost {
    /// Set when the future of a `slow.wait` call is dropped before it finished.
    slow_call_cancelled: Arc<AtomicBool>,
}

/// Sets its flag when dropped unless disarmed: tells whether a call future was abandoned.
struct DropFlag(Option<Arc<AtomicBool>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl ToolHost for TestHost {
    async fn list(&self, token: &str) -> Result<Vec<ToolInfo>, HostError> {
        if token != TOKEN {
            return Err(HostError::Unauthorized("unknown token".to_owned()));
        }
        let object = json!({ "type": "object", "properties": { "path": { "type": "string" } } });
        Ok(vec![
            ToolInfo {
                name: "fs.read".to_owned(),
                description: "Read a file.".to_owned(),
                input_schema: object,
            },
            ToolInfo {
                name: "kv.get".to_owned(),
                description: "Get a key.".to_owned(),
                input_schema: json!({}),
            },
            ToolInfo {
                name: "srv:find".to_owned(),
                description: "Mounted.".to_owned(),
                input_schema: json!({}),
            },
            ToolInfo {
                name: "fail.tool".to_owned(),
                description: "Fails.".to_owned(),
                input_schema: json!({}),
            },
            ToolInfo {
                name: "slow.wait".to_owned(),
                description: "Hangs.".to_owned(),
                input_schema: json!({}),
            },
        ])
    }

    async fn call(&self, token: &str, name: &str, args: Value) -> Result<Value, HostError> {
        assert_eq!(token, TOKEN);
        match name {
            "fs.read" => Ok(json!({ "path": args["path"], "text": "hi there" })),
            "kv.get" => Ok(json!("plain string")),
            "srv:find" => Ok(json!(["found", args])),
            "fail.tool" => Err(HostError::Failed("the disk is on fire".to_owned())),
            "slow.wait" => {
                let mut flag = DropFlag(Some(self.slow_call_cancelled.clone()));
                tokio::time::sleep(Duration::from_secs(30)).await;
                flag.0 = None;
                Ok(json!("woke"))
            }
            other => Err(HostError::NotFound(other.to_owned())),
        }
    }
}

/// The HTTP requests an endpoint saw, as `"METHOD status"`.
type RequestLog = Arc<Mutex<Vec<String>>>;

/// Serve `router(host)` nested at `/mcp`, as the kernel does; returns the endpoint URL.
async fn serve(host: Arc<TestHost>) -> (String, RequestLog) {
    let log = RequestLog::default();
    let recorder = log.clone();
    let app = axum::Router::new().nest("/mcp", router(host)).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let recorder = recorder.clone();
            async move {
                let method = request.method().clone();
                let response = next.run(request).await;
                recorder.lock().unwrap().push(format!("{method} {}", response.status().as_u16()));
                response
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/mcp"), log)
}

#[tokio::test]
async fn official_python_client_lists_and_calls_served_tools_and_needs_the_token() {
    let python =
        tokio::task::spawn_blocking(python_with_mcp).await.unwrap().unwrap_or_else(|error| panic!("{error}"));
    let (url, _log) = serve(Arc::new(TestHost::default())).await;
    let output = tokio::process::Command::new(python)
        .arg(super::fixture("python_client.py"))
        .args([&url, TOKEN, "fs.read", r#"{"path": "a.txt"}"#, "fail.tool", "{}"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "python client failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();

    assert_eq!(report["server_name"], "keel");
    let names: Vec<&str> =
        report["tools"].as_array().unwrap().iter().map(|tool| tool["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fs.read", "kv.get", "srv-3Afind", "fail.tool", "slow.wait"]);
    assert_eq!(served_name("srv:find"), "srv-3Afind");
    assert_eq!(report["tools"][0]["description"], "Read a file.");
    assert_eq!(report["tools"][0]["inputSchema"]["properties"]["path"]["type"], "string");

    let expected = json!({ "path": "a.txt", "text": "hi there" });
    let ok = &report["ok"];
    assert_ne!(ok["isError"], true, "{ok}");
    assert_eq!(serde_json::from_str::<Value>(ok["content"][0]["text"].as_str().unwrap()).unwrap(), expected);
    assert_eq!(ok["structuredContent"], expected);

    let failed = &report["failed"];
    assert_eq!(failed["isError"], true, "{failed}");
    assert_eq!(failed["content"][0]["text"], "the disk is on fire", "{failed}");

    assert_eq!(report["status_without_token"], 401);
    assert_eq!(report["status_with_wrong_token"], 401);
    assert_eq!(report["www_authenticate"], "Bearer");
}

fn http_config(url: &str, token: &str, timeout: Duration) -> ServerConfig {
    let headers = BTreeMap::from([("Authorization".to_owned(), format!("Bearer {token}"))]);
    ServerConfig {
        name: "keel-self".to_owned(),
        transport: Transport::Http { url: url.to_owned(), headers },
        timeout,
    }
}

#[tokio::test]
async fn our_client_against_our_router() {
    let host = Arc::new(TestHost::default());
    let (url, log) = serve(host.clone()).await;
    let client = Client::connect(&http_config(&url, TOKEN, Duration::from_secs(10))).await.unwrap();

    let names: Vec<&str> = client.tools().iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["fs.read", "kv.get", "srv-3Afind", "fail.tool", "slow.wait"]);
    // A schema without `type` is served with `"type": "object"`.
    assert_eq!(client.tools()[1].input_schema, json!({ "type": "object" }));

    let read = client.call("fs.read", json!({ "path": "b.txt" })).await.unwrap();
    assert_eq!(read["structuredContent"], json!({ "path": "b.txt", "text": "hi there" }));
    let string = client.call("kv.get", json!({})).await.unwrap();
    assert_eq!(string["content"][0]["text"], r#""plain string""#);
    assert!(string.get("structuredContent").is_none(), "{string}");
    let mapped = client.call("srv-3Afind", json!({ "q": 1 })).await.unwrap();
    assert_eq!(mapped["content"][0]["text"], r#"["found",{"q":1}]"#);

    let failed = client.call("fail.tool", Value::Null).await.unwrap_err();
    assert!(matches!(&failed, Error::ToolFailed(message) if message == "the disk is on fire"), "{failed:?}");
    let missing = client.call("nope", json!({})).await.unwrap_err();
    assert!(matches!(&missing, Error::ToolFailed(message) if message.contains("nope")), "{missing:?}");

    // A timed-out call is cancelled on the server: the host's call future is dropped.
    let timeout =
        client.with_timeout(Duration::from_millis(500)).call("slow.wait", json!({})).await.unwrap_err();
    assert!(matches!(timeout, Error::Timeout(_)), "{timeout:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !host.slow_call_cancelled.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the server never saw the cancellation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = client.call("kv.get", json!({})).await.unwrap();
    assert_eq!(again["content"][0]["text"], r#""plain string""#);
    client.close().await;
    // Closing ends the HTTP session.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !log.lock().unwrap().iter().any(|request| request == "DELETE 204") {
        assert!(Instant::now() < deadline, "no DELETE of the session in {:?}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn our_client_with_a_wrong_token_gets_a_clear_401() {
    let (url, log) = serve(Arc::new(TestHost::default())).await;
    let error = Client::connect(&http_config(&url, "stolen", Duration::from_secs(10))).await.unwrap_err();
    let Error::Connect(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("keel-self") && message.contains("401"), "{message}");
    assert_eq!(*log.lock().unwrap(), ["POST 401"]);
}
