//! Node agents on the TypeScript SDK, with the real binary: `require("keel")` resolves
//! through the NODE_PATH `keel run` sets (in the default sandbox and in tier `none`, a
//! user's NODE_PATH kept after it); `tests/agents/ts_agent.js` calls the scripted LLM,
//! tools (two in flight at once), checkpoints, emits and exits with output; and a run of
//! it survives daemon SIGKILLs with the same output, each LLM call paid once, and its u64
//! from `sys.random` carried exactly through the checkpoint as a bigint.

use serde_json::Value;

use crate::harness::{Keel, agent, wait_for};

fn journal(view: &Value) -> &Vec<Value> {
    view["journal"].as_array().expect("journal")
}

fn calls<'a>(view: &'a Value, method: &str) -> Vec<&'a Value> {
    journal(view).iter().filter(|e| e["method"] == method).collect()
}

fn expected_replies(steps: usize) -> Value {
    (1..=steps).map(|n| Value::from(format!("reply {n}"))).collect()
}

/// What every finished run of `ts_agent.js` must hold, whatever happened on the way.
fn assert_finished(done: &Value) {
    assert_eq!(done["state"], "succeeded", "{done}");
    let output = &done["output"];
    assert_eq!(output["replies"], expected_replies(6), "{output}");
    assert_eq!(output["echoed"], serde_json::json!([{"part": 1}, {"part": 2}]));
    let tools = output["tools"].as_array().expect("tools");
    assert!(tools.contains(&Value::from("echo")) && tools.contains(&Value::from("kv.put")), "{output}");
    // Exactly once: six calls served in total, six llm.chat entries, all ok.
    assert_eq!(done["provider_calls"], 6);
    let llm = calls(done, "llm.chat");
    assert_eq!(llm.len(), 6);
    assert!(llm.iter().all(|e| e["status"] == "ok"), "{llm:?}");
    // The u64 the kernel journaled is the one in the output, to the last digit: the SDK
    // read it as a bigint and wrote it back as a JSON integer (a double would round it).
    let random = calls(done, "sys.random");
    assert_eq!(random.len(), 1);
    assert!(output["random"].is_u64(), "{output}");
    assert_eq!(output["random"], random[0]["result"]["value"]);
    let now = calls(done, "sys.now");
    assert_eq!(now.len(), 1);
    assert_eq!(output["now"], now[0]["result"]["unix_ms"]);
    let puts = calls(done, "tool.call");
    assert_eq!(puts.len(), 3, "kv.put and two echoes: {puts:?}");
    assert_eq!(calls(done, "state.checkpoint").len(), 1);
}

#[test]
fn a_node_agent_runs_in_the_default_sandbox_on_the_typescript_sdk() {
    let keel = Keel::new();
    let script = agent("crash_script.json");
    let path = agent("ts_agent.js");
    let out =
        keel.run(&["run", "--llm-script", &script, "--env", "NODE_PATH=/opt/mine", "--", "node", &path]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ts_agent: done after 6 steps"), "{stdout}");
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().expect("run id").to_owned();
    let done = keel.inspect(&run);
    assert_finished(&done);
    // The SDK's directory inside the sandbox comes first; the user's NODE_PATH is kept.
    assert_eq!(done["output"]["node_path"], "/run/keel/node:/opt/mine");
    let logs = keel.ok(&["logs", &run, "--json"]);
    assert!(logs.contains(r#""sandbox":"process""#), "{logs}");
    for step in 1..=6 {
        assert!(
            logs.contains(&format!(r#"{{"reply":"reply {step}","step":{step}}}"#)),
            "emitted step {step}: {logs}"
        );
    }
}

#[test]
fn tier_none_puts_the_unpacked_sdk_on_node_path_and_esm_agents_load_it() {
    let keel = Keel::new();
    // ESM ignores NODE_PATH; `createRequire` honours it, as the SDK's README says.
    let program = r#"
        import { createRequire } from "node:module";
        const require = createRequire(import.meta.url);
        const keel = require("keel");
        const k = await keel.connect();
        await k.exit({ resolved: require.resolve("keel"), node_path: process.env.NODE_PATH, run: k.runId });
    "#;
    let out = keel
        .cmd()
        .args(["run", "--quiet", "--sandbox", "none", "--", "node", "--input-type=module", "-e", program])
        .env("NODE_PATH", "/opt/mine")
        .output()
        .expect("spawn keel");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = keel.json(&["ps", "--json"])[0].clone();
    let output = &run["output"];
    let sdk = keel.data.path().join("sdk/node");
    assert_eq!(output["run"], run["run_id"]);
    assert_eq!(output["node_path"], format!("{}:/opt/mine", sdk.display()), "{output}");
    assert_eq!(output["resolved"], sdk.join("keel/dist/index.js").display().to_string(), "{output}");
}

#[test]
fn a_node_agent_survives_daemon_sigkills_and_pays_each_call_once() {
    let script = agent("crash_script.json");
    let path = agent("ts_agent.js");
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = keel.detach(&["--llm-script", &script, "--env", "TS_AGENT_DELAY_MS=250", "--", "node", &path]);
    // Kill points by journal length: before the checkpoint (sys.now, sys.random, then an
    // llm.chat and an emit per step) and after it (kv.put and the checkpoint at 9, 10).
    for kill_at in [4usize, 13] {
        let view = wait_for(&format!("{kill_at} journal entries"), || {
            let view = keel.inspect(&run);
            (journal(&view).len() >= kill_at || view["state"] == "succeeded").then_some(view)
        });
        assert_ne!(view["state"], "succeeded", "the run finished before kill point {kill_at}; slow it down");
        keel.crash_daemon_under(&view);
    }
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_finished(&done);
    assert!(done["attempt"].as_u64().unwrap() >= 3, "relaunched after each kill: {}", done["attempt"]);
    assert_eq!(calls(&done, "sys.random")[0]["attempt"], 1, "replay answered the first attempt's value");
}
