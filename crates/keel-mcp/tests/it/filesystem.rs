//! The reference filesystem server from npm (`@modelcontextprotocol/server-filesystem`),
//! mounted over stdio.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_mcp::testing::{install_filesystem_server, npm_prefix};
use keel_mcp::{Client, Error, ServerConfig, Transport};
use serde_json::json;

#[tokio::test]
async fn reference_filesystem_server_lists_reads_refuses_and_closes() {
    let entry = tokio::task::spawn_blocking(|| install_filesystem_server(&npm_prefix()))
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("{error}"));
    let root_dir = tempfile::tempdir().unwrap();
    // The server resolves symlinks in its allowed roots; compare against the real path.
    let root = root_dir.path().canonicalize().unwrap();
    std::fs::write(root.join("hello.txt"), "hello from keel\n").unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    let command = vec!["node".to_owned(), entry.display().to_string(), root.display().to_string()];
    let config =
        ServerConfig::new("filesystem", Transport::Stdio { command, env: BTreeMap::new(), cwd: None });

    let client = Client::connect(&config).await.unwrap();

    let tool = |name: &str| {
        client.tools().iter().find(|tool| tool.name == name).unwrap_or_else(|| {
            panic!("no `{name}` in {:?}", client.tools().iter().map(|tool| &tool.name).collect::<Vec<_>>())
        })
    };
    for name in ["read_text_file", "write_file", "list_directory", "create_directory"] {
        let tool = tool(name);
        assert!(!tool.description.is_empty(), "{name} has no description");
        assert_eq!(tool.input_schema["type"], "object", "{name}: {}", tool.input_schema);
        assert!(tool.input_schema["properties"]["path"].is_object(), "{name}: {}", tool.input_schema);
    }
    assert!(tool("read_text_file").read_only);
    assert!(tool("list_directory").read_only);
    assert!(!tool("write_file").read_only);

    let read = client.call("read_text_file", json!({ "path": root.join("hello.txt") })).await.unwrap();
    assert_eq!(read["content"][0]["type"], "text", "{read}");
    assert_eq!(read["content"][0]["text"], "hello from keel\n", "{read}");

    let listing = client.call("list_directory", json!({ "path": root })).await.unwrap();
    let text = listing["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("[FILE] hello.txt") && text.contains("[DIR] sub"), "{text}");

    let bad_args = client.call("read_text_file", json!({ "nope": 1 })).await.unwrap_err();
    assert!(matches!(bad_args, Error::ToolFailed(_) | Error::Protocol(_)), "{bad_args:?}");
    assert!(bad_args.to_string().contains("path"), "{bad_args}");

    let outside = client.call("read_text_file", json!({ "path": "/etc/hostname" })).await.unwrap_err();
    let Error::ToolFailed(message) = &outside else { panic!("{outside:?}") };
    assert!(message.contains("denied") && message.contains("outside"), "{message}");

    let pid = client.process_id().unwrap();
    assert!(!client.is_closed());
    let other_handle = client.clone();
    client.close().await;
    assert!(super::process_gone(pid, Duration::from_secs(10)).await, "server {pid} still runs after close");
    assert!(other_handle.is_closed());
    let after_close = other_handle.call("list_directory", json!({ "path": root })).await.unwrap_err();
    assert!(matches!(after_close, Error::Closed(_)), "{after_close:?}");
}
