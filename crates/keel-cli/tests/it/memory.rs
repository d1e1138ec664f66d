//! Memory end to end: a real Python agent (`tests/agents/memory_agent.py`) uses threads
//! and long-term records through the kernel; the CLI and the HTTP API see the same memory
//! (tenant `default`); a SIGKILLed daemon loses and duplicates no memory write; and a
//! 100-turn conversation that re-sends its history keeps the journal small.

use serde_json::{Value, json};

use crate::harness::{Keel, agent, alive, wait_for};

fn memory_agent(keel: &Keel, env: &[&str]) -> String {
    let mut args = vec!["--sandbox", "none"];
    for pair in env {
        args.extend(["--env", pair]);
    }
    let path = agent("memory_agent.py");
    args.extend(["--", "python3", &path]);
    keel.detach(&args)
}

fn thread_contents(keel: &Keel, thread: &str) -> Vec<(u64, String)> {
    let view = keel.json(&["mem", "thread", thread, "--json"]);
    view["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| (m["index"].as_u64().unwrap(), m["content"].as_str().unwrap().to_owned()))
        .collect()
}

fn expected_thread(turns: u64) -> Vec<(u64, String)> {
    (0..turns).map(|turn| (turn, format!("turn {turn}: note about topic{turn}"))).collect()
}

#[test]
fn an_agent_uses_memory_and_the_cli_and_api_see_it() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = memory_agent(&keel, &[]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["output"],
        json!({
            "indexes": [0, 1, 2, 3, 4, 5],
            "hits": ["turn-3"],
            "last2": ["turn 4: note about topic4", "turn 5: note about topic5"],
            // Each message is ~7 tokens of content plus 4 of framing.
            "fit30": 2,
            "turn1": {"turn": 1},
            "deleted": true,
            "turn0": null,
        })
    );
    // Every memory call is journaled: writes as intent + result, reads complete at once.
    let journal = done["journal"].as_array().unwrap();
    let count = |method: &str| journal.iter().filter(|e| e["method"] == method).count();
    assert_eq!((count("mem.thread.append"), count("mem.put"), count("mem.thread.read")), (6, 6, 2));
    assert!(journal.iter().all(|e| e["status"] == "ok"), "{journal:?}");

    // The CLI reads the same memory (tenant `default`).
    assert_eq!(thread_contents(&keel, "chat"), expected_thread(6));
    let record = keel.json(&["mem", "get", "notes", "turn-2", "--json"]);
    assert_eq!(
        (record["value"].clone(), record["text"].clone()),
        (json!({"turn": 2}), json!("note number 2 about topic2"))
    );
    let hits = keel.json(&["mem", "search", "notes", "topic4 topic5", "--json"]);
    let mut keys: Vec<&str> =
        hits["hits"].as_array().unwrap().iter().map(|h| h["key"].as_str().unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["turn-4", "turn-5"]);
    assert!(hits["hits"][0]["snippet"].as_str().unwrap().contains("[topic"), "{hits}");
    let out = keel.run(&["mem", "get", "notes", "turn-0"]);
    assert!(!out.status.success(), "a deleted record is not found");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no record"), "{out:?}");

    // The CLI writes; a second run shares the thread by id and reads what the CLI wrote.
    keel.ok(&["mem", "put", "notes", "from cli/with slash", "plain words", "--text", "operator note"]);
    assert_eq!(keel.json(&["mem", "get", "notes", "from cli/with slash", "--json"])["value"], "plain words");
    assert_eq!(keel.ok(&["mem", "get", "notes", "from cli/with slash"]).trim(), "\"plain words\"");
    let second = memory_agent(&keel, &["MEMORY_AGENT_TURNS=1"]);
    let second = keel.wait_state(&second, &["succeeded", "failed"]);
    assert_eq!(second["output"]["indexes"], json!([6]), "the thread is shared: {second}");
    assert_eq!(thread_contents(&keel, "chat").len(), 7);
    let human = keel.ok(&["mem", "thread", "chat", "--last", "1"]);
    assert_eq!(human.trim(), "6 user: turn 0: note about topic0");
    assert!(keel.ok(&["mem", "delete", "notes", "from cli/with slash"]).contains("deleted"));
    assert_eq!(keel.json(&["mem", "delete", "notes", "from cli/with slash", "--json"])["deleted"], false);

    // HTTP: the same bearer token as the rest of the API, 404 for a missing record,
    // 400 for bad params.
    assert_eq!(keel.http("GET", "/v1/memory/notes/turn-1", false).0, 401);
    assert_eq!(keel.http("GET", "/v1/threads/chat", false).0, 401);
    let (status, body) = keel.http("GET", "/v1/memory/notes/turn-1", true);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["value"], json!({"turn": 1}));
    assert_eq!(keel.http("GET", "/v1/memory/notes/nothing", true).0, 404);
    let (status, body) = keel.http("GET", "/v1/memory/notes?q=topic1&limit=0", true);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("limit"), "{body}");
    let (status, body) = keel.http("GET", "/v1/memory/notes?q=topic1", true);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["hits"][0]["key"], "turn-1");
    let (status, body) = keel.http("GET", "/v1/threads/chat?last=2&max_tokens=1000", true);
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((view["thread"].clone(), view["messages"].as_array().unwrap().len()), (json!("chat"), 2));
    assert_eq!(keel.http("DELETE", "/v1/memory/notes/turn-1", true).1, r#"{"deleted":true}"#);
}

#[test]
fn sigkill_mid_run_loses_and_duplicates_no_memory_write() {
    const TURNS: u64 = 8;
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = memory_agent(
        &keel,
        &["MEMORY_AGENT_TURNS=8", "MEMORY_AGENT_DELAY_MS=150", "MEMORY_AGENT_THREAD=crash"],
    );
    for kill_at in [4usize, 10] {
        let view = wait_for(&format!("{kill_at} journal entries"), || {
            let view = keel.inspect(&run);
            let len = view["journal"].as_array().map_or(0, Vec::len);
            (len >= kill_at || view["state"] == "succeeded").then_some(view)
        });
        assert_ne!(view["state"], "succeeded", "the run finished before kill point {kill_at}");
        keel.crash_daemon_under(&view);
    }
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 3, "relaunched after each kill: {}", done["attempt"]);
    // The agent saw each append's index once, in order, across every attempt...
    assert_eq!(done["output"]["indexes"], json!((0..TURNS).collect::<Vec<_>>()), "{done}");
    // ...and the thread holds each message exactly once.
    assert_eq!(thread_contents(&keel, "crash"), expected_thread(TURNS));
    for turn in 1..TURNS {
        let record = keel.json(&["mem", "get", "notes", &format!("turn-{turn}"), "--json"]);
        assert_eq!(record["value"], json!({"turn": turn}));
    }
    let journal = done["journal"].as_array().unwrap();
    let appends: Vec<&Value> = journal.iter().filter(|e| e["method"] == "mem.thread.append").collect();
    assert_eq!(appends.len() as u64, TURNS, "one journal entry per append");
    assert!(appends.iter().all(|e| e["status"] == "ok"), "{appends:?}");
}

/// Reads are journaled: after a crash the relaunched agent gets what it read the first
/// time, even though memory changed meanwhile.
#[test]
fn replayed_reads_answer_what_was_read_before_the_crash() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = memory_agent(&keel, &["MEMORY_AGENT_TURNS=2", "MEMORY_AGENT_FINAL_DELAY_MS=60000"]);
    let view = wait_for("the agent's reads", || {
        let view = keel.inspect(&run);
        let journal = view["journal"].as_array().cloned().unwrap_or_default();
        journal.iter().any(|e| e["method"] == "mem.get" && e["params"]["key"] == "turn-0").then_some(view)
    });
    let agent_pid = view["pid"].as_u64().map(|p| p as u32);
    keel.kill_daemon();
    if let Some(pid) = agent_pid {
        wait_for("the agent to die with the daemon", || (!alive(pid)).then_some(()));
    }
    // Memory changes while the kernel is down (the CLI embeds a kernel for this).
    keel.ok(&["mem", "put", "notes", "turn-1", "\"changed\""]);
    keel.ok(&["mem", "put", "notes", "turn-0", "\"back\""]);
    keel.ok(&["mem", "put", "notes", "turn-9", "about topic3"]);
    keel.start_daemon();
    // The relaunched agent sleeps again after its (replayed) reads; the output it would
    // exit with is not visible until then, so stop waiting: stop it and read the journal.
    wait_for("the relaunched agent's replayed reads", || {
        let (_, body) = keel.http("GET", &format!("/v1/runs/{run}/events"), true);
        let page: Value = serde_json::from_str(&body).ok()?;
        page["events"]
            .as_array()?
            .iter()
            .any(|e| {
                e["kind"] == "syscall" && e["data"]["method"] == "mem.delete" && e["data"]["replayed"] == true
            })
            .then_some(())
    });
    keel.ok(&["stop", &run, "--grace", "0"]);
    let done = keel.wait_state(&run, &["cancelled", "failed", "succeeded"]);
    let journal = done["journal"].as_array().unwrap();
    let reads: Vec<&Value> = journal.iter().filter(|e| e["method"] == "mem.get").collect();
    assert_eq!(reads.len(), 2, "replayed reads add no entries: {journal:?}");
    assert_eq!(reads[0]["result"], json!({"value": {"turn": 1}}));
    assert_eq!(reads[1]["result"], json!({"value": null}));
    let searches: Vec<&Value> = journal.iter().filter(|e| e["method"] == "mem.search").collect();
    assert_eq!(searches.len(), 1);
    assert_eq!(searches[0]["result"]["hits"], json!([]));
    // Memory itself has the new values.
    assert_eq!(keel.json(&["mem", "get", "notes", "turn-1", "--json"])["value"], "changed");
}

#[test]
fn a_100_turn_conversation_journals_within_3x_of_its_own_size() {
    const TURNS: usize = 100;
    let mut keel = Keel::new();
    // Replies the size of a short paragraph; the agent's user turns are ~330 bytes too.
    let responses: Vec<Value> = (0..TURNS)
        .map(|turn| json!({"content": format!("reply {turn}: {}", "Noted; here is a short answer. ".repeat(10))}))
        .collect();
    let script = keel.data.path().join("conversation_script.json");
    std::fs::write(&script, json!({ "responses": responses }).to_string()).unwrap();
    keel.start_daemon();
    let path = agent("conversation_agent.py");
    let run =
        keel.detach(&["--sandbox", "none", "--llm-script", script.to_str().unwrap(), "--", "python3", &path]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["provider_calls"], TURNS);
    let conversation_bytes = done["output"]["conversation_bytes"].as_u64().unwrap();
    // What storing every call's params whole would have cost: quadratic in the turns.
    let naive: u64 = done["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "llm.chat")
        .map(|e| e["params"].to_string().len() as u64)
        .sum();

    // The store's own accounting of everything stored for the run's payloads (the only
    // run in this data dir): journal params and results, message chain included.
    let db = keel.data.path().join("keel.db");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stats = runtime.block_on(async {
        use keel_store::Store;
        keel_store::SqliteStore::open(&db).unwrap().stats().await.unwrap()
    });
    let ratio = stats.blob_bytes as f64 / conversation_bytes as f64;
    eprintln!(
        "journal growth: {TURNS} turns, conversation {conversation_bytes} B, stored blobs {} B \
         ({ratio:.2}x), params stored whole would be {naive} B",
        stats.blob_bytes
    );
    assert!(
        ratio <= 3.0,
        "blob bytes {} are {ratio:.2}x the conversation's {conversation_bytes}",
        stats.blob_bytes
    );
    assert!(naive > 10 * stats.blob_bytes, "the test must re-send history: naive {naive} B");
}

fn semantic_agent(keel: &Keel, env: &[&str]) -> String {
    let mut args = vec!["--sandbox", "none"];
    for pair in env {
        args.extend(["--env", pair]);
    }
    let path = agent("semantic_agent.py");
    args.extend(["--", "python3", &path]);
    keel.detach(&args)
}

/// With no embedder configured, the offline hash embedder makes semantic search work: a
/// query that shares only word pieces with a record finds it, where full-text search
/// finds nothing. The CLI and HTTP API search the same way.
#[test]
fn semantic_search_finds_a_paraphrase_that_full_text_misses() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let run = semantic_agent(&keel, &[]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["output"]["text"], json!([]), "no word of the query is in any record: {done}");
    assert_eq!(done["output"]["semantic"][0], "cat", "{done}");
    assert_eq!(done["output"]["hybrid"][0], "cat", "{done}");
    let cli = keel.json(&["mem", "search", "facts", "kittens napping", "--mode", "semantic", "--json"]);
    assert_eq!(cli["hits"][0]["key"], "cat", "{cli}");
    assert!(cli["hits"][0]["snippet"].as_str().unwrap().starts_with("The kitten naps"), "{cli}");
    let (status, body) = keel.http("GET", "/v1/memory/facts?q=kitten%20windowsill&mode=hybrid&limit=2", true);
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["hits"][0]["key"], "cat", "{view}");
    let (status, body) = keel.http("GET", "/v1/memory/facts?q=x&mode=fuzzy", true);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown variant `fuzzy`"), "{body}");
}

/// With `[llm.embeddings]` pointing at an OpenAI-compatible upstream (the mock), each put
/// embeds its text there once; a daemon SIGKILL mid-run replays the journaled puts and
/// searches without calling the upstream again; the provider's tokens are metered into
/// the run's usage; and the official `openai` package gets embeddings through the gateway.
#[test]
fn embeddings_come_from_the_configured_upstream_once_per_put_across_a_crash() {
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = crate::gateway::mock_upstream(&keel, &agent("openai_script.json"));
    std::fs::write(
        keel.data.path().join("keel.toml"),
        "[llm.embeddings]\nprovider = \"openai\"\nmodel = \"text-embedding-3-small\"\n",
    )
    .unwrap();
    keel.daemon_env = vec![
        ("OPENAI_API_KEY".into(), "sk-upstream-test".into()),
        ("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")),
    ];
    keel.start_daemon();
    let run = semantic_agent(&keel, &["SEMANTIC_AGENT_DELAY_MS=700", "SEMANTIC_AGENT_OPENAI=1"]);
    let view = wait_for("two puts", || {
        let view = keel.inspect(&run);
        let puts = view["journal"]
            .as_array()?
            .iter()
            .filter(|e| e["method"] == "mem.put" && e["status"] == "ok")
            .count();
        (puts >= 2).then_some(view)
    });
    keel.crash_daemon_under(&view);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    upstream.kill();
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 2, "relaunched after the kill: {done}");
    assert_eq!(done["output"]["text"], json!([]), "{done}");
    assert_eq!(done["output"]["semantic"][0], "cat", "{done}");
    assert_eq!(
        done["output"]["gateway"],
        json!({"count": 2, "dims": 32, "model": "text-embedding-3-small", "tokens": 5, "float_dims": 32}),
        "{done}"
    );
    let counts = read_counts(&counts);
    assert_eq!(counts["errors"], json!([]), "request invariants at the upstream: {counts}");
    // Each put text and each gateway input was embedded exactly once across the crash;
    // the query twice (a semantic and a hybrid search, each one call; none replayed).
    let embedded = counts["counts"].as_object().unwrap();
    for text in [
        "The kitten naps on the windowsill every afternoon",
        "Quarterly tax filing is due at the end of the month",
        "Replace the bicycle chain before the spring ride",
        "The puppy chews the garden hose by the fence",
        "through the gateway",
        "second input",
        "one string",
    ] {
        assert_eq!(embedded[&format!("embed:{text}")], 1, "{text:?}: {counts}");
    }
    assert_eq!(embedded["embed:kittens napping near windows"], 2, "{counts}");
    let journal = done["journal"].as_array().unwrap();
    assert_eq!(journal.iter().filter(|e| e["method"] == "mem.put").count(), 4, "{journal:?}");
    assert_eq!(journal.iter().filter(|e| e["method"] == "llm.embed").count(), 2, "{journal:?}");
    assert!(done["usage"]["input_tokens"].as_u64().unwrap() > 0, "embedding tokens are metered: {done}");
}

use crate::gateway::read_counts;
