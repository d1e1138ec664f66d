//! Recovery by replay after a simulated crash: completed calls are answered from the
//! journal (nothing is paid twice), the first new call goes live, a call caught in the
//! crash window follows its tool's crash policy, and a divergent tail is abandoned.

use keel_sdk::{system, user};
use keel_types::{EntryStatus, RunState};
use serde_json::json;

use crate::harness::{TestKernel, methods};

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
