//! Crash recovery: SIGKILL the daemon (and with it the agent) at several points of a run
//! that makes 12 journaled LLM calls and a checkpoint; after each restart the run goes on
//! from its journal. It must end with the same output as an uncrashed run, and the
//! provider must have served each call exactly once in total.

use serde_json::Value;

use crate::harness::{Keel, agent, wait_for};

fn journal_len(view: &Value) -> usize {
    view["journal"].as_array().map_or(0, Vec::len)
}

fn llm_replies(view: &Value) -> Vec<String> {
    view["output"]["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn sigkill_at_several_points_loses_nothing_and_pays_nothing_twice() {
    let script = agent("crash_script.json");

    // The reference: the same agent, never interrupted.
    let mut keel = Keel::new();
    keel.start_daemon();
    let reference = keel.detach(&["--llm-script", &script, "--", "python3", &agent("crash_agent.py")]);
    let reference = keel.wait_state(&reference, &["succeeded"]);
    assert_eq!(reference["provider_calls"], 12);

    let run = keel.detach(&[
        "--llm-script",
        &script,
        "--env",
        "CRASH_AGENT_DELAY_MS=120",
        "--",
        "python3",
        &agent("crash_agent.py"),
    ]);
    // Kill points by journal length: before the checkpoint, just after it, and late.
    for kill_at in [3usize, 8, 13] {
        let view = wait_for(&format!("{kill_at} journal entries"), || {
            let view = keel.inspect(&run);
            (journal_len(&view) >= kill_at || view["state"] == "succeeded").then_some(view)
        });
        assert_ne!(view["state"], "succeeded", "the run finished before kill point {kill_at}; slow it down");
        keel.crash_daemon_under(&view);
    }
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 4, "relaunched after each kill: {}", done["attempt"]);
    assert_eq!(llm_replies(&done), llm_replies(&reference), "same output as the uncrashed run");

    // Exactly once: 12 calls served in total across every attempt, and 12 llm.chat entries
    // completed in the journal, none abandoned or repeated.
    assert_eq!(done["provider_calls"], 12, "{}", done["provider_calls"]);
    let journal = done["journal"].as_array().unwrap();
    let llm: Vec<&Value> = journal.iter().filter(|e| e["method"] == "llm.chat").collect();
    assert_eq!(llm.len(), 12);
    assert!(llm.iter().all(|e| e["status"] == "ok"), "{llm:?}");
    assert_eq!(done["usage"]["llm_calls"], 12);

    // sys.now and sys.random were journaled once, and the final output carries the
    // values of the first attempt: replay returned them, not fresh ones.
    let now: Vec<&Value> = journal.iter().filter(|e| e["method"] == "sys.now").collect();
    let random: Vec<&Value> = journal.iter().filter(|e| e["method"] == "sys.random").collect();
    assert_eq!((now.len(), random.len()), (1, 1));
    assert_eq!(done["output"]["now"], now[0]["result"]["unix_ms"]);
    assert_eq!(done["output"]["random"], random[0]["result"]["value"]);
    assert_eq!(now[0]["attempt"], 1);
}
