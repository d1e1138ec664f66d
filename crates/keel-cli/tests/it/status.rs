//! `GET /v1/status` (issue 14) against a daemon running a known set of runs: live slots
//! against the cap, the queue, waiting runs by reason, a provider's queue and learned
//! limit, the pool and the store; and a tenant's token sees its own tenant's counts only.

use serde_json::{Value, json};

use crate::gateway::mock_upstream;
use crate::harness::{Keel, agent, wait_for};
use crate::tenants::{admin_token, http, json_as};

fn status(keel: &Keel, token: &str) -> Value {
    let (code, _, body) = http(keel, "GET", "/v1/status", token, "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/v1/status is not JSON ({e}): {body}"))
}

#[test]
fn status_counts_what_the_daemon_runs_and_a_tenant_sees_only_its_own() {
    let mut keel = Keel::new();
    let script = keel.data.path().join("always_ok.json");
    std::fs::write(&script, r#"{"responses": [{"match": "", "content": "ok"}]}"#).unwrap();
    let (upstream, port, _) = mock_upstream(&keel, script.to_str().unwrap());
    let _upstream = upstream; // Killed when the test ends.
    std::fs::write(
        keel.data.path().join("keel.toml"),
        "[scheduler]\nmax_live = 3\n[llm.models.\"openai/m\"]\nrequests_per_minute = 1\n[llm.retry]\n\
         max_queue_wait_ms = 600000\n",
    )
    .unwrap();
    keel.daemon_env = vec![
        ("OPENAI_API_KEY".into(), "sk-upstream-test".into()),
        ("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")),
    ];
    keel.start_daemon_with(&["--sandbox", "none"]);
    let admin = admin_token(&keel);
    keel.ok(&["tenant", "create", "acme"]);
    keel.ok(&["tenant", "create", "globex"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let globex = keel.ok(&["tenant", "token", "globex"]).trim().to_owned();

    let (code, _, _) = http(&keel, "GET", "/v1/status", "wrong", "");
    assert_eq!(code, 401, "the status needs a token");
    let idle = status(&keel, &admin);
    assert_eq!(idle["live"], 0, "{idle}");
    assert_eq!(idle["queued"], 0, "{idle}");

    let llm_run = |prompt: &str| {
        let input = json!({ "prompt": prompt }).to_string();
        keel.detach(&[
            "--sandbox",
            "none",
            "--model",
            "openai/m",
            "--input",
            &input,
            "--",
            "python3",
            &agent("llm_once_agent.py"),
        ])
    };
    let receiver = ["--sandbox", "none", "--input", r#"{"recv": true}"#, "--", "python3"];
    // The minute's one request: the next call of the model waits in its queue.
    let first = llm_run("first");
    assert_eq!(keel.wait_state(&first, &["succeeded", "failed"])["state"], "succeeded");
    // The operator's (tenant `default`) run waiting for a message...
    let mut args = receiver.to_vec();
    let proc_agent = agent("proc_agent.py");
    args.push(&proc_agent);
    let waits_for_message = keel.detach(&args);
    keel.wait_state(&waits_for_message, &["waiting"]);
    // ...acme's run waiting for an answer...
    let ask = agent("ask_agent.py");
    let asked =
        json_as(&keel, &acme, &["run", "--detach", "--json", "--sandbox", "none", "--", "python3", &ask]);
    let asked = asked["run_id"].as_str().unwrap().to_owned();
    keel.wait_state(&asked, &["waiting"]);
    // ...a run whose LLM call waits for the provider's limit (the third live slot)...
    let in_llm_queue = llm_run("second");
    wait_for("the call to wait in the provider's queue", || {
        keel.inspect(&in_llm_queue)["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("llm queue:"))
            .then_some(())
    });
    // ...and acme's run queued for a live slot.
    let mut queued_args = vec!["run", "--detach", "--json"];
    queued_args.extend_from_slice(&args);
    let queued = json_as(&keel, &acme, &queued_args);
    let queued = queued["run_id"].as_str().unwrap().to_owned();
    assert_eq!(keel.inspect(&queued)["state"], "queued");

    let all = status(&keel, &admin);
    assert_eq!(all["node"], Value::Null, "no node id on SQLite: {all}");
    assert_eq!(
        (all["live"].as_u64(), all["max_live"].as_u64(), all["queued"].as_u64()),
        (Some(3), Some(3), Some(1))
    );
    assert_eq!(all["waiting"], json!({"human": 1, "approval": 0, "budget": 0, "message": 1, "child": 0}));
    assert_eq!(all["swapped"], 0);
    let providers = all["providers"].as_array().unwrap();
    assert_eq!(providers.len(), 1, "{all}");
    let model = &providers[0];
    assert_eq!(
        (&model["provider"], &model["model"], &model["waiting"], &model["in_flight"], &model["limited"]),
        (&json!("openai"), &json!("m"), &json!(1), &json!(0), &json!(true)),
        "{model}"
    );
    assert_eq!(model["reason"], "requests limit");
    let reset = model["reset_in_ms"].as_u64().unwrap();
    assert!(reset > 0 && reset <= 60_000, "the minute's request comes back within a minute: {model}");
    assert_eq!(all["pool"], json!({"tier": "none", "warm": 0, "target": 0}));
    assert_eq!(all["nodes"], json!([]));
    assert_eq!(all["store"], json!({"backend": "sqlite", "ok": true}));

    // acme: its live run, its queued run, its question; the provider's limit but none of
    // the operator's calls.
    let mine = status(&keel, &acme);
    assert_eq!(
        (mine["live"].as_u64(), mine["max_live"].as_u64(), mine["queued"].as_u64()),
        (Some(1), Some(3), Some(1))
    );
    assert_eq!(mine["waiting"], json!({"human": 1, "approval": 0, "budget": 0, "message": 0, "child": 0}));
    let model = &mine["providers"][0];
    assert_eq!((&model["waiting"], &model["limited"]), (&json!(0), &json!(true)), "{mine}");
    assert_eq!(mine["nodes"], json!([]));
    // globex has nothing running, and learns nothing of the others.
    let theirs = status(&keel, &globex);
    assert_eq!((theirs["live"].as_u64(), theirs["queued"].as_u64()), (Some(0), Some(0)), "{theirs}");
    assert_eq!(theirs["waiting"], json!({"human": 0, "approval": 0, "budget": 0, "message": 0, "child": 0}));
    assert_eq!(theirs["providers"][0]["waiting"], 0, "{theirs}");
    let text = theirs.to_string();
    for other in ["acme", "default", &asked, &queued, &waits_for_message] {
        assert!(!text.contains(other), "globex's status names {other}: {text}");
    }

    // The operator's waiting run is stopped: acme's queued run takes its slot and waits
    // for a message in turn.
    keel.ok(&["stop", &waits_for_message]);
    keel.wait_state(&queued, &["waiting"]);
    let after = status(&keel, &admin);
    assert_eq!((after["live"].as_u64(), after["queued"].as_u64()), (Some(3), Some(0)), "{after}");
    assert_eq!(after["waiting"]["message"], 1, "{after}");
    let mine = status(&keel, &acme);
    assert_eq!((mine["live"].as_u64(), mine["queued"].as_u64()), (Some(2), Some(0)), "{mine}");
    assert_eq!(mine["waiting"], json!({"human": 1, "approval": 0, "budget": 0, "message": 1, "child": 0}));
}
