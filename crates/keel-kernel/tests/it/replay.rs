//! Recovery by replay after a simulated crash: completed calls are answered from the
//! journal (nothing is paid twice), the first new call goes live, a call caught in the
//! crash window follows its tool's crash policy, and a divergent tail is abandoned.

use std::path::Path;

use keel_kernel::Command;
use keel_sdk::{system, user};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use serde_json::json;

use crate::harness::{Setup, TestKernel, in_background, methods, refusal, wait_for, with_deadline};

fn script() -> serde_json::Value {
    json!({"responses": [{"content": "one"}, {"content": "two"}, {"content": "three"}]})
}

#[test]
fn a_relaunched_agent_is_answered_from_the_journal_and_pays_nothing_twice() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({ "llm_script": script() }));
    let mut agent = test.agent(&run);
    assert_eq!(agent.restore().unwrap(), json!(null));
    let first = agent.llm_chat(&[system("be brief"), user("a")]).unwrap();
    assert_eq!(first.message.content.as_deref(), Some("one"));
    assert_eq!(agent.tool("echo", json!({"x": 1})).unwrap(), json!({"x": 1}));
    agent.tool("kv.put", json!({"key": "k", "value": 1})).unwrap();
    agent.checkpoint(&json!({"step": 1})).unwrap();
    let second = agent.llm_chat(&[user("b")]).unwrap();
    assert_eq!(second.message.content.as_deref(), Some("two"));
    let random = agent.random().unwrap();
    assert_eq!(test.get(&run).provider_calls, 2);
    let before = test.journal(&run);

    test.crash_and_restart();
    let record = test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    assert_eq!(record.state, RunState::Recovering);
    let mut agent = test.agent(&run);
    assert_eq!(agent.restore().unwrap(), json!({"step": 1}), "the agent resumes from its checkpoint");
    let replayed = agent.llm_chat(&[user("b")]).unwrap();
    assert_eq!(replayed, second, "the journal answers with the same reply");
    assert_eq!(agent.random().unwrap(), random, "and the same randomness");
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 2, "a replayed call is not paid again");
    assert_eq!(record.state, RunState::Recovering, "still replaying");
    assert_eq!(test.journal(&run), before, "replay writes nothing");

    let third = agent.llm_chat(&[user("c")]).unwrap();
    assert_eq!(third.message.content.as_deref(), Some("three"), "the script continues where it was");
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 3, "the first new call executes live");
    assert_eq!(record.state, RunState::Running);
    let journal = test.journal(&run);
    let last = journal.last().unwrap();
    assert_eq!((last.method.as_str(), last.status, last.attempt), ("llm.chat", EntryStatus::Ok, 2));
    test.wait_event(&run, "syscall", json!({"method": "llm.chat", "replayed": true}));
}

/// Regression: a crash after `run.exit` was journaled and before its output was on the
/// run (a node killed in the cluster test) left the relaunched run to end `succeeded`
/// without output: the replayed call was answered from the journal and wrote nothing.
#[test]
fn a_run_exit_replayed_after_a_crash_puts_its_output_on_the_run() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({}));
    let output = json!({"answer": 42});
    test.agent(&run).exit(&output).unwrap();
    assert_eq!(test.get(&run).output, Some(output.clone()));
    // The crash window: the journal holds `run.exit`; the run does not hold its output yet.
    let (store, id) = (test.store(), run.clone());
    let cleared = keel_store::RunPatch { output: Some(None), ..keel_store::RunPatch::default() };
    test.on_kernel(|_| async move { store.update_run(&id, None, cleared).await }).unwrap();
    test.crash_and_restart();
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());

    let before = test.journal(&run);
    test.agent(&run).exit(&output).unwrap();
    assert_eq!(test.journal(&run), before, "answered from the journal");
    assert_eq!(test.get(&run).output, Some(output.clone()), "and the output is on the run again");
    test.kill_agent(&run);
    assert_eq!(test.wait_state(&run, RunState::Succeeded).output, Some(output));
}

#[test]
fn after_a_divergent_call_the_unasked_tail_is_abandoned_at_the_next_checkpoint() {
    let mut test = TestKernel::start();
    let run = test.create_run(json!({ "llm_script": script() }));
    let mut agent = test.agent(&run);
    agent.checkpoint(&json!({"step": 0})).unwrap();
    agent.llm_chat(&[user("a")]).unwrap();
    agent.tool("echo", json!({"n": 1})).unwrap();

    test.crash_and_restart();
    test.wait_run(&run, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    let mut agent = test.agent(&run);
    let reply = agent.llm_chat(&[user("something else")]).unwrap();
    assert_eq!(reply.message.content.as_deref(), Some("two"), "a divergent call goes live");
    assert_eq!(test.get(&run).state, RunState::Running);
    // Lenient matching: a later call the journal holds is still answered from it.
    assert_eq!(agent.tool("echo", json!({"n": 1})).unwrap(), json!({"n": 1}));
    let echoes = test.journal(&run).iter().filter(|e| e.method == "tool.call").count();
    assert_eq!(echoes, 1, "the echo was answered from the journal");
    agent.checkpoint(&json!({"step": 1})).unwrap();

    let journal = test.journal(&run);
    assert_eq!(
        methods(&journal),
        [
            ("state.checkpoint", EntryStatus::Ok),
            ("llm.chat", EntryStatus::Abandoned),
            ("tool.call", EntryStatus::Ok),
            ("llm.chat", EntryStatus::Ok),
            ("state.checkpoint", EntryStatus::Ok),
        ]
    );
    assert_eq!(test.get(&run).provider_calls, 2);
    test.wait_event(&run, "replay", json!({"abandoned": [journal[1].seq]}));
}

/// Command tools that record each start (with its idempotency key) in `calls`, then wait
/// for the file `go`: a call can be caught between its intent and its result.
fn slow_tools(scratch: &Path) -> Setup {
    let script = r#"cat > /dev/null; echo "$KEEL_IDEMPOTENCY_KEY" >> "$0/calls"; while [ ! -e "$0/go" ]; do sleep 0.01; done; echo '{"done": true}'"#;
    let mut keel_toml = String::new();
    for crash in ["retry", "ask", "fail"] {
        keel_toml += &format!(
            "[[tools.command]]\nname = \"slow_{crash}\"\ndescription = \"waits for go\"\ncommand = [\"/bin/sh\", \"-c\", '''{script}''', '{}']\ncrash = \"{crash}\"\n\n",
            scratch.display()
        );
    }
    Setup { keel_toml, ..Setup::default() }
}

/// Starts `tool` from an agent, crashes the kernel while the call runs (its intent is
/// journaled, its result is not), restarts, and returns the relaunched agent.
fn crash_during(test: &mut TestKernel, run: &RunId, tool: &str) -> keel_sdk::Client {
    let mut agent = test.agent(run);
    let tool_name = tool.to_owned();
    let call = in_background(move || agent.tool(&tool_name, json!({})));
    let calls = test.scratch().join("calls");
    wait_for("the tool to start", || std::fs::read_to_string(&calls).ok().filter(|c| !c.is_empty()));
    assert_eq!(methods(&test.journal(run)), [("tool.call", EntryStatus::Pending)]);
    test.crash_and_restart();
    assert!(call.join().unwrap().is_err(), "the agent lost its kernel");
    test.wait_run(run, "relaunched", |r| r.attempt == 2 && r.pid.is_some());
    test.agent(run)
}

fn starts(test: &TestKernel) -> Vec<String> {
    let calls = std::fs::read_to_string(test.scratch().join("calls")).unwrap_or_default();
    calls.lines().map(str::to_owned).collect()
}

#[test]
fn a_call_interrupted_by_a_crash_with_policy_retry_runs_again_with_the_same_key() {
    let mut test = TestKernel::start_with(slow_tools);
    let run = test.create_run(json!({ "grant": ["slow_*"] }));
    let mut agent = crash_during(&mut test, &run, "slow_retry");
    std::fs::write(test.scratch().join("go"), "").unwrap();
    assert_eq!(agent.tool("slow_retry", json!({})).unwrap(), json!({"done": true}));
    let starts = starts(&test);
    assert_eq!(starts.len(), 2, "run again");
    assert_eq!(starts[0], starts[1], "with the idempotency key of its journal entry");
    assert_eq!(starts[0], format!("{run}:1"));
    assert_eq!(methods(&test.journal(&run)), [("tool.call", EntryStatus::Ok)]);
    test.wait_event(&run, "interrupted", json!({"call": 1, "policy": "retry"}));
}

#[test]
fn a_call_interrupted_by_a_crash_with_policy_fail_is_not_run_again() {
    let mut test = TestKernel::start_with(slow_tools);
    let run = test.create_run(json!({ "grant": ["slow_*"] }));
    let mut agent = crash_during(&mut test, &run, "slow_fail");
    std::fs::write(test.scratch().join("go"), "").unwrap();
    let (kind, code, message) = refusal(agent.tool("slow_fail", json!({})));
    assert_eq!((kind.as_str(), code), ("tool_error", 1006));
    assert!(message.contains("crash policy is `fail`"), "{message}");
    assert_eq!(starts(&test).len(), 1, "not run again");
    assert_eq!(methods(&test.journal(&run)), [("tool.call", EntryStatus::Error)]);
    test.wait_event(&run, "interrupted", json!({"call": 1, "policy": "fail"}));
}

#[test]
fn a_call_interrupted_by_a_crash_with_policy_ask_waits_for_an_operator() {
    let mut test = TestKernel::start_with(slow_tools);
    let run = test.create_run(json!({ "grant": ["slow_*"] }));
    let mut agent = crash_during(&mut test, &run, "slow_ask");
    std::fs::write(test.scratch().join("go"), "").unwrap();
    let call = in_background(move || agent.tool("slow_ask", json!({})));
    // The run is parked before its call is listed as waiting: wait for the call.
    let pending = wait_for("the call to wait for approval", || {
        Some(test.pending_approvals(&run)).filter(|p| !p.is_empty())
    });
    assert_eq!(pending.len(), 1);
    let record = test.get(&run);
    assert_eq!((record.state, record.wait_reason), (RunState::Waiting, Some(WaitReason::Approval)));
    assert_eq!((pending[0].call, pending[0].kind.as_str()), (1, "retry_after_crash"));
    assert_eq!(starts(&test).len(), 1, "nothing runs before the decision");
    test.execute(Command::Decide { run: run.clone(), call: 1, approve: true, note: None }).unwrap();
    assert_eq!(call.join().unwrap().unwrap(), json!({"done": true}));
    assert_eq!(starts(&test).len(), 2);
    assert_eq!(test.get(&run).state, RunState::Running);
}

/// Regression: recovery listed the interrupted runs in the background after it was
/// started, and a run created before that listing was taken for an interrupted
/// one: its agent was SIGKILLed and another launched (or it was relaunched as attempt 2),
/// and a syscall of the first agent was never answered.
#[test]
fn a_run_created_while_recovery_starts_is_not_taken_for_an_interrupted_one() {
    let mut test = TestKernel::start();
    let interrupted = test.create_run(json!({}));
    test.crash_and_restart();
    let runs: Vec<RunId> = (0..8).map(|_| test.create_run(json!({}))).collect();
    test.wait_run(&interrupted, "recovered", |r| r.attempt == 2 && r.pid.is_some());
    for run in &runs {
        let mut agent = test.agent(run);
        let pinged = with_deadline("a call of the run's first agent", move || {
            agent.call::<serde_json::Value>("sys.ping", json!({}))
        });
        assert_eq!(pinged.unwrap(), json!({}));
    }
    for run in &runs {
        let record = test.get(run);
        assert_eq!((record.state, record.attempt), (RunState::Running, 1), "{run} was left alone");
        test.wait_event(run, "launch", json!({"attempt": 1}));
        let launches = test.events(run).iter().filter(|e| e.kind == "launch").count();
        assert_eq!(launches, 1, "{run} was launched once");
    }
}

/// The kernel's `keel_runs_recovered` counter, as a scrape of `GET /metrics` shows it.
fn runs_recovered(test: &TestKernel) -> u64 {
    let text = test.on_kernel(|kernel| async move {
        kernel.metrics(&keel_kernel::Principal::Admin, keel_kernel::MetricsFormat::Prometheus).await
    });
    let text = text.expect("an operator may read the metrics");
    let value = text.lines().find_map(|line| line.strip_prefix("keel_runs_recovered_total "));
    value.expect("the counter is exposed from the start").parse().expect("a count")
}

#[test]
fn a_restarted_kernel_counts_the_runs_it_brought_back() {
    let mut test = TestKernel::start();
    let runs = [test.create_run(json!({})), test.create_run(json!({}))];
    assert_eq!(runs_recovered(&test), 0, "a kernel's first start recovers nothing");

    test.crash_and_restart();
    for run in &runs {
        test.wait_run(run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    }
    wait_for("both relaunches counted", || (runs_recovered(&test) == 2).then_some(()));
    let fresh = test.create_run(json!({}));
    let mut agent = test.agent(&fresh);
    agent.call::<serde_json::Value>("sys.ping", json!({})).unwrap();
    assert_eq!(runs_recovered(&test), 2, "a run started afresh is not a recovered one");

    // The next kernel counts from zero: what it brought back, all three runs.
    test.crash_and_restart();
    test.wait_run(&fresh, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    for run in &runs {
        test.wait_run(run, "relaunched again", |r| r.attempt == 3 && r.pid.is_some());
    }
    wait_for("three relaunches counted", || (runs_recovered(&test) == 3).then_some(()));
}
