//! `command::run` with real command tools (small Python scripts) in the `none` tier and
//! in the process sandbox.

use std::time::Duration;

use keel_sandbox::{NoSandbox, ProcessConfig, ProcessSandbox, Profile, Sandbox};
use keel_tools::CommandTool;
use keel_tools::command::{CommandContext, run};
use serde_json::{Value, json};

use crate::Test;

pub const TESTS: &[Test] = &[
    ("command_tool_round_trips_json_without_a_sandbox", || Box::pin(round_trip(Tier::None))),
    ("command_tool_round_trips_json_in_the_process_sandbox", || Box::pin(round_trip(Tier::Process))),
    ("command_tool_failures_carry_status_and_stderr_without_a_sandbox", || Box::pin(failures(Tier::None))),
    ("command_tool_failures_carry_status_and_stderr_in_the_process_sandbox", || {
        Box::pin(failures(Tier::Process))
    }),
    ("command_tool_timeout_kills_the_tree_without_a_sandbox", || Box::pin(timeout(Tier::None))),
    ("command_tool_timeout_kills_the_tree_in_the_process_sandbox", || Box::pin(timeout(Tier::Process))),
    ("command_tool_cancelled_call_kills_the_tree_without_a_sandbox", || Box::pin(cancelled(Tier::None))),
    ("command_tool_cancelled_call_kills_the_tree_in_the_process_sandbox", || {
        Box::pin(cancelled(Tier::Process))
    }),
    ("command_tool_large_stdin_is_delivered_in_the_process_sandbox", || Box::pin(large_input(Tier::Process))),
    ("command_tool_large_stdin_is_delivered_without_a_sandbox", || Box::pin(large_input(Tier::None))),
];

#[derive(Clone, Copy, Debug)]
enum Tier {
    None,
    Process,
}

const ECHO: &str = r#"
import json, os, sys
call = json.load(sys.stdin)
print(json.dumps({"call": call, "key": os.environ.get("KEEL_IDEMPOTENCY_KEY"),
                  "lang": os.environ.get("LANG"), "marker": os.environ.get("KEEL_RUN_ID"),
                  "cwd": os.getcwd()}))
"#;

struct Setup {
    sandbox: Box<dyn Sandbox>,
    dir: tempfile::TempDir,
    marker: String,
}

/// The sandbox for `tier`, or `None` (after saying why) when this host cannot run it.
fn setup(tier: Tier, name: &str) -> Option<Setup> {
    let sandbox: Box<dyn Sandbox> = match tier {
        Tier::None => Box::new(NoSandbox),
        Tier::Process => Box::new(ProcessSandbox::new(ProcessConfig::default())),
    };
    if let Err(err) = sandbox.check(&Profile::default()) {
        println!("skipped: this host cannot run the {tier:?} tier: {err}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let marker = format!("keel-tools-test-{name}-{}-{nanos}", std::process::id());
    Some(Setup { sandbox, dir, marker })
}

impl Setup {
    fn script(&self, name: &str, text: &str) -> CommandTool {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        CommandTool {
            command: vec!["python3".into(), path.display().to_string()],
            env: [("LANG".to_owned(), "C.UTF-8".to_owned())].into(),
            cwd: None,
        }
    }

    fn context(&self, timeout: Duration) -> CommandContext {
        CommandContext {
            cwd: self.dir.path().to_path_buf(),
            run_marker: self.marker.clone(),
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            timeout,
            ..CommandContext::default()
        }
    }
}

fn input(args: Value) -> Value {
    json!({"args": args, "idempotency_key": "run1:7", "run_id": "run1", "tool": "echo_tool"})
}

async fn round_trip(tier: Tier) {
    let Some(setup) = setup(tier, "round") else { return };
    let tool = setup.script("echo.py", ECHO);
    let call = input(json!({"text": "hello \u{e9}", "n": [1, 2]}));
    let out =
        run(setup.sandbox.as_ref(), &tool, &call, setup.context(Duration::from_secs(30))).await.unwrap();
    assert_eq!(out["call"], call);
    assert_eq!(out["key"], "run1:7");
    assert_eq!(out["lang"], "C.UTF-8");
    assert_eq!(out["marker"], setup.marker.as_str());
    assert_eq!(out["cwd"], setup.dir.path().display().to_string());
}

async fn failures(tier: Tier) {
    let Some(setup) = setup(tier, "fail") else { return };
    let ctx = || setup.context(Duration::from_secs(30));
    let sandbox = setup.sandbox.as_ref();
    let tool = setup
        .script("fail.py", "import sys\nsys.stderr.write('x' * 10000 + 'the real reason')\nsys.exit(3)\n");
    let message = run(sandbox, &tool, &input(json!({})), ctx()).await.unwrap_err();
    assert!(message.starts_with("echo_tool: exited with exit status: 3"), "{message}");
    assert!(message.ends_with("the real reason"), "{message}");
    assert!(message.len() < 5000, "only the tail of stderr: {} bytes", message.len());

    let tool = setup.script("text.py", "print('not json')\n");
    let message = run(sandbox, &tool, &input(json!({})), ctx()).await.unwrap_err();
    assert!(message.contains("stdout is not JSON") && message.contains("not json"), "{message}");

    let tool = setup.script("silent.py", "pass\n");
    let message = run(sandbox, &tool, &input(json!({})), ctx()).await.unwrap_err();
    assert!(message.contains("printed nothing"), "{message}");

    let tool = setup.script("flood.py", "import sys\nsys.stdout.write('[' + '1,' * 1000000 + '1]')\n");
    let message = run(sandbox, &tool, &input(json!({})), ctx()).await.unwrap_err();
    assert!(message.contains("printed more than 1 MiB on stdout"), "{message}");

    let missing = CommandTool { command: vec!["/nonexistent/tool".into()], ..CommandTool::default() };
    let message = run(sandbox, &missing, &input(json!({})), ctx()).await.unwrap_err();
    assert!(message.starts_with("echo_tool:") && message.contains("/nonexistent/tool"), "{message}");
}

/// Processes whose environment carries the marker.
fn alive(marker: &str) -> Vec<u32> {
    keel_sandbox::tree::processes_with_marker(marker)
}

async fn timeout(tier: Tier) {
    let Some(setup) = setup(tier, "slow") else { return };
    // The tool starts a child that leaves its process group, then both sleep.
    let tool =
        setup.script("slow.py", "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n");
    let started = std::time::Instant::now();
    let message =
        run(setup.sandbox.as_ref(), &tool, &input(json!({})), setup.context(Duration::from_secs(2)))
            .await
            .unwrap_err();
    assert!(message.contains("timed out after 2 s"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !alive(&setup.marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(alive(&setup.marker), Vec::<u32>::new(), "every process of the call is gone");
}

async fn large_input(tier: Tier) {
    let Some(setup) = setup(tier, "large") else { return };
    let tool = setup.script(
        "size.py",
        "import json, sys\ncall = json.load(sys.stdin)\nprint(json.dumps({'length': len(call['args']['text'])}))\n",
    );
    // Far more than a pipe buffer holds.
    let text = "y".repeat(3 << 20);
    let out = run(
        setup.sandbox.as_ref(),
        &tool,
        &input(json!({"text": text})),
        setup.context(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(out["length"], 3 << 20);
}

/// A call whose future is dropped (the kernel cancelled it) leaves nothing running.
async fn cancelled(tier: Tier) {
    let Some(setup) = setup(tier, "cancel") else { return };
    let tool = setup.script("sleepy.py", "import time\nprint('{}', flush=True)\ntime.sleep(60)\n");
    let call_input = input(json!({}));
    let call = run(setup.sandbox.as_ref(), &tool, &call_input, setup.context(Duration::from_secs(60)));
    assert!(tokio::time::timeout(Duration::from_millis(1500), call).await.is_err(), "still running");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !alive(&setup.marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(alive(&setup.marker), Vec::<u32>::new(), "every process of the call is gone");
}
