//! MCP end to end: the reference filesystem server from npm mounted as a tool provider,
//! with a grant that allows some of its tools and denies others; and a run's granted
//! tools served to the official Python `mcp` client as an MCP server.

use serde_json::{Value, json};

use crate::harness::{Keel, agent};

#[test]
fn a_registry_mcp_server_is_mounted_and_the_grant_splits_its_tools() {
    let entry = keel_mcp::testing::install_filesystem_server(&keel_mcp::testing::npm_prefix())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut keel = Keel::new();
    let files = keel.data.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("hello.txt"), "hello from the filesystem server").unwrap();
    let files = files.canonicalize().unwrap();
    let config = format!(
        "[[tools.mcp]]\nname = \"fs\"\ncommand = [\"node\", \"{}\", \"{}\"]\ntimeout_secs = 30\n",
        entry.display(),
        files.display()
    );
    std::fs::write(keel.data.path().join("keel.toml"), config).unwrap();
    keel.start_daemon();
    let hello = files.join("hello.txt").display().to_string();
    let input = json!({ "calls": [
        {"list": true},
        {"tool": "mcp:fs/read_text_file", "args": {"path": hello}},
        {"tool": "mcp:fs/list_directory", "args": {"path": files.display().to_string()}},
        {"tool": "mcp:fs/write_file", "args": {"path": hello, "content": "overwritten"}},
        {"tool": "mcp:fs/read_text_file", "args": {"path": "/etc/hostname"}},
        {"tool": "mcp:fs/read_text_file", "args": {}},
    ]})
    .to_string();
    let run = keel.detach(&[
        "--sandbox",
        "none",
        "--grant",
        "mcp:fs/read_*",
        "--grant",
        "mcp:fs/list_*",
        "--input",
        &input,
        "--",
        "python3",
        &agent("tools_agent.py"),
    ]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    let results = done["output"]["results"].as_array().unwrap();
    let listed: Vec<&str> =
        results[0]["ok"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(
        listed.contains(&"mcp:fs/read_text_file") && listed.contains(&"mcp:fs/list_directory"),
        "{listed:?}"
    );
    assert!(!listed.contains(&"mcp:fs/write_file"), "only granted tools are listed: {listed:?}");
    let text = results[1]["ok"].to_string();
    assert!(text.contains("hello from the filesystem server"), "{text}");
    assert!(results[2]["ok"].to_string().contains("hello.txt"), "{results:?}");
    assert_eq!(results[3]["error"], "denied", "{results:?}");
    assert_eq!(results[4]["error"], "tool_error", "the server refuses paths outside its root: {results:?}");
    assert_eq!(results[5]["error"], "invalid_params", "the server's schema is enforced: {results:?}");
    assert_eq!(
        std::fs::read_to_string(files.join("hello.txt")).unwrap(),
        "hello from the filesystem server",
        "the denied write never reached the server"
    );
    let tools = keel.ok(&["tools"]);
    assert!(tools.contains("mcp:fs/write_file"), "{tools}");
    let audit = keel.json(&["audit", &run, "--json"]);
    let denied: Vec<&Value> =
        audit.as_array().unwrap().iter().filter(|e| e["action"] == "tool.denied").collect();
    assert_eq!(denied.len(), 1, "{audit}");
    assert_eq!(denied[0]["subject"], "mcp:fs/write_file");
}

#[test]
fn a_run_gets_its_granted_tools_as_an_mcp_server() {
    keel_mcp::testing::python_with_mcp().unwrap_or_else(|e| panic!("{e}"));
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&[
        "--sandbox",
        "none",
        "--grant",
        "echo",
        "--grant",
        "kv.*",
        "--",
        "python3",
        &agent("mcp_client_agent.py"),
    ]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.run(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{done}\n{}", String::from_utf8_lossy(&logs.stderr));
    let report = &done["output"];
    assert_eq!(report["tools"], json!(["echo", "kv.get", "kv.put"]), "{report}");
    assert_eq!(report["ok"]["structuredContent"], json!({"hello": "mcp"}), "{report}");
    assert_eq!(report["denied"]["isError"], true, "{report}");
    assert!(report["denied"].to_string().contains("not granted"), "{report}");
    // The calls went through the governed path: journaled and audited like any.
    let journal = done["journal"].as_array().unwrap();
    assert!(
        journal.iter().any(|e| e["method"] == "tool.call" && e["params"]["name"] == "echo"),
        "{journal:?}"
    );
}
