//! The Rust SDK against a real kernel: the test binary re-executes itself as the agent
//! (selected by an environment variable), so the SDK runs in a real agent process.

use std::sync::Arc;
use std::time::Duration;

use keel_kernel::{Command, CreateRun, DataDir, Kernel, KernelOptions};
use keel_protocol::api::CreateRunParams;
use serde_json::json;

const AGENT_MODE: &str = "SDK_TEST_AGENT_MODE";

/// The agent's body, run in the child process.
fn agent() -> keel_sdk::Result<()> {
    let mut keel = keel_sdk::Client::connect()?;
    assert!(keel.run_id().starts_with("run_"));
    assert_eq!(keel.restore()?, serde_json::Value::Null);
    let reply = keel.llm_chat(&[keel_sdk::system("be brief"), keel_sdk::user("hello")])?;
    assert_eq!(reply.message.content.as_deref(), Some("hi from the script"));
    assert_eq!(keel.tool("echo", json!({"x": 1}))?, json!({"x": 1}));
    assert!(keel.list_tools()?.iter().any(|t| t.name == "kv.get"));
    let seq = keel.checkpoint(&json!({"step": 1}))?;
    assert!(seq > 0);
    assert_eq!(keel.restore()?, json!({"step": 1}));
    assert!(keel.now_ms()? > 0);
    keel.random()?;
    // Within the grant (the default grants `kv.*`) but not a tool: not_found. Outside the
    // grant every name is `denied`, so a run learns nothing of tools it may not call.
    match keel.tool("kv.nope", json!({})) {
        Err(keel_sdk::Error::Kernel { kind, code, .. }) => {
            assert_eq!((kind.as_str(), code), ("not_found", 1002))
        }
        other => panic!("expected not_found, got {other:?}"),
    }
    assert_eq!(keel.thread_append("sdk-thread", "user", "hello thread")?, 0);
    assert_eq!(keel.thread_append("sdk-thread", "assistant", "hello back")?, 1);
    let tail = keel.thread_read("sdk-thread", Some(1), None)?;
    assert_eq!((tail.len(), tail[0].index, tail[0].content.as_str()), (1, 1, "hello back"));
    assert_eq!(keel.thread_read("sdk-thread", None, Some(1))?.len(), 0, "nothing fits in 1 token");
    keel.mem_put("notes", "pets", &json!({"cat": "Tom"}), Some("the cat is called Tom"))?;
    assert_eq!(keel.mem_get("notes", "pets")?, json!({"cat": "Tom"}));
    let hits = keel.mem_search("notes", "cat", Some(5))?;
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].key, "pets");
    assert!(keel.mem_delete("notes", "pets")?);
    assert_eq!(keel.mem_get("notes", "pets")?, serde_json::Value::Null);
    match keel.mem_put("", "k", &json!(1), None) {
        Err(keel_sdk::Error::Kernel { kind, message, .. }) => {
            assert_eq!(kind, "invalid_params");
            assert!(message.contains("namespace"), "{message}");
        }
        other => panic!("expected invalid_params, got {other:?}"),
    }
    let me = keel.run_id().to_owned();
    assert_eq!(keel.recv(Some(10))?, None, "an empty mailbox times out with None");
    assert_eq!(keel.send(&me, &json!({"q": 1}), Some("req-1"), true)?, 1);
    assert_eq!(keel.send(&me, &json!("second"), None, false)?, 2);
    let got = keel.recv(None)?.expect("the first message");
    assert_eq!((got.seq, got.message, got.correlation_id.as_deref()), (1, json!({"q": 1}), Some("req-1")));
    assert_eq!(got.from.as_deref(), Some(me.as_str()));
    assert_eq!(keel.recv(Some(10))?.map(|m| m.message), Some(json!("second")));
    assert_eq!(keel.publish("sdk-news", &json!("nobody listens"), true)?, 0);
    keel.subscribe("sdk-news", true)?;
    keel.subscribe("sdk-news", true)?;
    assert_eq!(keel.publish("sdk-news", &json!({"h": 1}), false)?, 1, "subscribed once");
    let got = keel.recv(Some(1000))?.expect("the published message");
    assert_eq!((got.topic.as_deref(), got.message), (Some("sdk-news"), json!({"h": 1})));
    keel.subscribe("sdk-news", false)?;
    assert_eq!(keel.publish("sdk-news", &json!(2), true)?, 0);
    match keel.send("run_00000000000000000000000001", &json!(1), None, true) {
        Err(keel_sdk::Error::Kernel { kind, code, .. }) => {
            assert_eq!((kind.as_str(), code), ("not_found", 1002))
        }
        other => panic!("expected not_found, got {other:?}"),
    }
    keel.emit(&json!({"progress": 1}))?;
    keel.exit(&json!({"done": true}))?;
    match keel.now_ms() {
        Err(keel_sdk::Error::Kernel { kind, .. }) => assert_eq!(kind, "run_exited"),
        other => panic!("expected run_exited, got {other:?}"),
    }
    Ok(())
}

#[test]
fn sdk_speaks_protocol_1_to_a_real_kernel() {
    if std::env::var_os(AGENT_MODE).is_some() {
        agent().expect("agent failed");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let data = tempfile::tempdir().unwrap();
        let dir = DataDir::new(data.path());
        let locked = dir.lock().unwrap();
        let kernel = Kernel::start(KernelOptions {
            data_dir: locked,
            store: Arc::new(keel_store::SqliteStore::open(&dir.database()).unwrap()),
            sandbox: Arc::new(keel_sandbox::NoSandbox),
            default_stop_grace: Duration::from_secs(1),
            default_llm_script: None,
            gateway_addr: None,
            llm: keel_llm::Router::empty(),
            egress: Default::default(),
            tools: Default::default(),
            agents: Default::default(),
            interp_worker: None,
            swap_after: None,
            swap_in: Default::default(),
            scheduler: Default::default(),
            cluster: None,
            telemetry: keel_kernel::Telemetry::disabled(),
        })
        .await
        .unwrap();
        let exe = std::env::current_exe().unwrap();
        let params = CreateRunParams {
            command: vec![
                exe.display().to_string(),
                "--exact".into(),
                "sdk_speaks_protocol_1_to_a_real_kernel".into(),
                "--nocapture".into(),
            ],
            cwd: Some(data.path().display().to_string()),
            env: [(AGENT_MODE.to_owned(), "1".to_owned())].into(),
            llm_script: Some(json!({"responses": [{"content": "hi from the script"}]})),
            tenant: None,
            stop_grace_secs: None,
            model: None,
            fallback_models: Vec::new(),
            budget: None,
            loop_threshold: None,
            sandbox: None,
            grant: None,
            input: None,
            priority: None,
        };
        let run = kernel.execute(Command::Create(CreateRun::validate(params).unwrap())).await.unwrap();
        let id = keel_types::RunId::parse(&run.run_id).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let record = loop {
            let record = kernel.run(&keel_kernel::Principal::Admin, &id).await.unwrap();
            if record.state.parse::<keel_types::RunState>().unwrap().is_terminal() {
                break record;
            }
            assert!(std::time::Instant::now() < deadline, "the agent did not finish");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let logs = kernel.events_page(&id, 0, 1000, keel_protocol::EventKinds::ALL).await.unwrap();
        assert_eq!(record.state, "succeeded", "agent failed: {logs:#?}");
        assert_eq!(record.output, Some(json!({"done": true})));
        assert_eq!(record.provider_calls, 1);
        kernel.shutdown().await;
    });
}
