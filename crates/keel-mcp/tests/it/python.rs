//! A server written with the official Python SDK (FastMCP), over streamable HTTP and stdio.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_mcp::testing::python_with_mcp;
use keel_mcp::{Client, Error, ServerConfig, Transport};
use serde_json::json;

async fn python() -> String {
    tokio::task::spawn_blocking(python_with_mcp).await.unwrap().unwrap_or_else(|error| panic!("{error}"))
}

/// What both transports must do: list, call, a raising tool, a timeout that cancels and
/// leaves the connection usable.
async fn exercise(client: &Client) {
    let names: Vec<&str> = client.tools().iter().map(|tool| tool.name.as_str()).collect();
    for name in ["add", "echo", "fail", "sleep"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let add = client.tools().iter().find(|tool| tool.name == "add").unwrap();
    assert!(add.read_only);
    assert_eq!(add.description, "Add two integers.");
    assert_eq!(add.input_schema["properties"]["a"]["type"], "integer", "{}", add.input_schema);
    assert!(!client.tools().iter().find(|tool| tool.name == "echo").unwrap().read_only);

    let sum = client.call("add", json!({ "a": 2, "b": 3 })).await.unwrap();
    assert_eq!(sum["content"][0]["text"], "5", "{sum}");
    assert_eq!(sum["structuredContent"], json!({ "result": 5 }), "{sum}");

    let failure = client.call("fail", json!({ "message": "the disk is on fire" })).await.unwrap_err();
    let Error::ToolFailed(message) = &failure else { panic!("{failure:?}") };
    assert!(message.contains("the disk is on fire"), "{message}");

    let bad_args = client.call("add", json!({ "a": "two" })).await.unwrap_err();
    assert!(matches!(bad_args, Error::ToolFailed(_) | Error::Protocol(_)), "{bad_args:?}");

    let unknown = client.call("no_such_tool", json!({})).await.unwrap_err();
    assert!(unknown.to_string().contains("no_such_tool"), "{unknown}");

    let started = Instant::now();
    let slow = client.with_timeout(Duration::from_millis(800));
    let timeout = slow.call("sleep", json!({ "seconds": 30 })).await.unwrap_err();
    assert!(matches!(timeout, Error::Timeout(_)), "{timeout:?}");
    assert!(timeout.to_string().contains("sleep"), "{timeout}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    let echo = client.call("echo", json!({ "text": "still here" })).await.unwrap();
    assert_eq!(echo["content"][0]["text"], "still here", "{echo}");
    assert!(!client.is_closed());
}

#[tokio::test]
async fn fastmcp_server_over_streamable_http() {
    let python = python().await;
    let port = super::free_port();
    let mut server = tokio::process::Command::new(&python)
        .arg(super::fixture("fastmcp_server.py"))
        .args(["http", &port.to_string()])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    super::wait_for_port(port, Duration::from_secs(30)).await;
    let config = ServerConfig {
        name: "fastmcp-http".to_owned(),
        transport: Transport::Http { url: format!("http://127.0.0.1:{port}/mcp"), headers: BTreeMap::new() },
        timeout: Duration::from_secs(30),
    };
    let client = Client::connect(&config).await.unwrap();
    assert_eq!(client.process_id(), None);
    exercise(&client).await;
    client.close().await;
    server.kill().await.unwrap();
}

#[tokio::test]
async fn fastmcp_server_over_stdio_and_noticing_its_death() {
    let python = python().await;
    let config = ServerConfig {
        name: "fastmcp-stdio".to_owned(),
        transport: Transport::Stdio {
            command: vec![
                python,
                super::fixture("fastmcp_server.py").display().to_string(),
                "stdio".to_owned(),
            ],
            env: BTreeMap::new(),
            cwd: Some(std::env::temp_dir()),
        },
        timeout: Duration::from_secs(30),
    };
    let client = Client::connect(&config).await.unwrap();
    exercise(&client).await;

    // The server dies on its own: the client notices, and calls say so.
    let pid = client.process_id().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client.is_closed() {
        assert!(Instant::now() < deadline, "the client did not notice that its server died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let error = client.call("echo", json!({ "text": "anyone?" })).await.unwrap_err();
    assert!(matches!(error, Error::Closed(_)), "{error:?}");
    client.close().await;
}

#[tokio::test]
async fn close_also_ends_what_the_server_spawned() {
    let python = python().await;
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("grandchild.pid");
    // A wrapper (like `npx` or `uv run`) that leaves a process of its own behind.
    let script = format!(
        "sleep 1000 & echo $! > '{}'; exec '{python}' '{}' stdio",
        pid_file.display(),
        super::fixture("fastmcp_server.py").display()
    );
    let config = ServerConfig {
        name: "wrapped".to_owned(),
        transport: Transport::Stdio {
            command: vec!["sh".to_owned(), "-c".to_owned(), script],
            env: BTreeMap::new(),
            cwd: None,
        },
        timeout: Duration::from_secs(30),
    };
    let client = Client::connect(&config).await.unwrap();
    let grandchild: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let server = client.process_id().unwrap();
    client.close().await;
    assert!(super::process_gone(server, Duration::from_secs(10)).await, "server {server} survived close");
    assert!(
        super::process_gone(grandchild, Duration::from_secs(10)).await,
        "grandchild {grandchild} survived close"
    );
}
