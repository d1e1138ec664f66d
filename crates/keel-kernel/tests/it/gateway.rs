//! The kernel side of the gateway's Responses API: a call's journal entry is named before
//! its answer and stays the same when the call is answered from the journal after a crash
//! (response ids are derived from it), and kept responses belong to the run's tenant.

use keel_kernel::{Kernel, Principal, RunHandle};
use keel_protocol::api::CreateTenantParams;
use keel_protocol::rpc::{LlmChatParams, LlmChatResult};
use keel_sdk::user;
use keel_types::RunId;
use serde_json::json;

use crate::harness::{TestKernel, wait_for};

/// The run's current agent as the gateway authenticates it (by its token).
fn handle(test: &TestKernel, run: &RunId) -> RunHandle {
    let record = test.wait_run(run, "its agent to be launched", |r| r.pid.is_some());
    let tokens = test.token_file(run);
    let token = wait_for("the run's token", || {
        let text = std::fs::read_to_string(&tokens).ok()?;
        text.lines().nth(record.attempt as usize - 1).map(str::to_owned)
    });
    test.on_kernel(|kernel| async move { kernel.authenticate(&token).await }).expect("a live run's token")
}

/// One gateway call: its result's text and the seq its entry was named by.
fn chat(test: &TestKernel, run: &RunHandle, text: &str) -> (String, Option<u64>) {
    let (run, request) =
        (run.clone(), LlmChatParams { messages: vec![user(text)], ..LlmChatParams::default() });
    test.on_kernel(|kernel: Kernel| async move {
        let (entry, named) = tokio::sync::oneshot::channel();
        let result = kernel.chat_with_entry(&run, request, None, entry).await.expect("the call");
        (result.message.content.unwrap_or_default(), named.await.ok())
    })
}

#[test]
fn a_replayed_call_names_the_same_journal_entry() {
    let mut test = TestKernel::start();
    let run =
        test.create_run(json!({ "llm_script": {"responses": [{"content": "one"}, {"content": "two"}]} }));
    let first = chat(&test, &handle(&test, &run), "a");
    assert_eq!(first.0, "one");
    let seq = first.1.expect("the entry is named");

    test.crash_and_restart();
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    let agent = handle(&test, &run);
    let replayed = chat(&test, &agent, "a");
    assert_eq!(replayed, ("one".to_owned(), Some(seq)), "answered from the journal, under the same entry");
    let live = chat(&test, &agent, "b");
    assert_eq!(live.0, "two");
    assert_ne!(live.1, Some(seq));
    assert_eq!(test.get(&run).provider_calls, 2, "the replayed call was not served again");
}

#[test]
fn a_live_call_answers_what_its_entry_journals_and_its_replay_answers() {
    // A live call hands the gateway its result typed rather than as the reply's JSON
    // (`Listener::result`): it must be what the journal holds, which is what the same
    // call answers from the journal after a crash, every field of it.
    let mut test = TestKernel::start();
    let tool_call =
        json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}});
    let script = json!({"responses": [
        {"content": "one", "tool_calls": [tool_call], "usage": {"input_tokens": 11, "output_tokens": 3}},
    ], "price": {"input_per_mtok": 0.7, "output_per_mtok": 2.9}});
    let run = test.create_run(json!({ "llm_script": script }));
    let call = |test: &TestKernel, agent: RunHandle| {
        let request = LlmChatParams { messages: vec![user("a")], ..LlmChatParams::default() };
        test.on_kernel(|kernel: Kernel| async move { kernel.chat(&agent, request, None).await })
            .expect("the call")
    };
    let live = call(&test, handle(&test, &run));
    assert_eq!(live.message.content.as_deref(), Some("one"));
    assert!(live.cost_usd > 0.0, "{live:?}");
    let journal = test.journal(&run);
    let entry = journal.iter().find(|e| e.method == "llm.chat").expect("the call's entry");
    let response = entry.result.as_ref().and_then(|r| r.get("response")).expect("the journaled response");
    let journaled: LlmChatResult = serde_json::from_value(response.clone()).expect("a chat result");
    assert_eq!(live, journaled, "the live answer is the journaled one");

    test.crash_and_restart();
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    let replayed = call(&test, handle(&test, &run));
    assert_eq!(replayed, live, "answered from the journal, the same");
    assert_eq!(test.get(&run).provider_calls, 1, "served once");
}

#[test]
fn a_call_refused_before_the_journal_names_no_entry() {
    let test = TestKernel::start();
    // A run with no provider: the call is refused before its intent is journaled.
    let run = test.create_run(json!({}));
    let agent = handle(&test, &run);
    let journal = test.journal(&run).len();
    let refused = test.on_kernel(|kernel: Kernel| async move {
        let (entry, named) = tokio::sync::oneshot::channel();
        let request = LlmChatParams { messages: vec![user("b")], ..LlmChatParams::default() };
        let result = kernel.chat_with_entry(&agent, request, None, entry).await;
        (result.map(|_| ()), named.await.ok())
    });
    let (result, named) = refused;
    assert!(result.is_err(), "no provider: {result:?}");
    assert_eq!(named, None);
    assert_eq!(test.journal(&run).len(), journal, "nothing was journaled");
}

#[test]
fn a_gateway_call_is_journaled_as_the_socket_would_journal_it() {
    // The gateway hands the kernel its request typed; the journal must hold the params the
    // socket's `llm.chat` would (the same JSON, hashed the same), so a call is matched on
    // replay whichever way the agent asks it.
    let test = TestKernel::start();
    let run = test.create_run(json!({ "llm_script": {"responses": [{"content": "one"}]} }));
    let agent = handle(&test, &run);
    let request = LlmChatParams {
        messages: vec![user("a"), user("b")],
        model: Some("scripted".into()),
        tools: Some(vec![json!({"type": "function", "function": {"name": "f", "parameters": {}}})]),
        max_tokens: Some(7),
        temperature: Some(0.25),
        stop: Some(vec!["END".into()]),
        ..LlmChatParams::default()
    };
    let sent = request.clone();
    test.on_kernel(|kernel: Kernel| async move { kernel.chat(&agent, sent, None).await }).expect("the call");
    let journal = test.journal(&run);
    let entry = journal.iter().rev().find(|e| e.method == "llm.chat").expect("the call's entry");
    assert_eq!(entry.params, serde_json::to_value(&request).unwrap(), "the socket's params for this request");
    assert_eq!(entry.params_hash, keel_core::replay::params_hash("llm.chat", &entry.params));
    let parsed: LlmChatParams = serde_json::from_value(entry.params.clone()).unwrap();
    assert_eq!(parsed, request, "the journaled params read back as the request");
}

#[test]
fn a_gateway_call_without_messages_is_refused_before_the_journal() {
    let test = TestKernel::start();
    let run = test.create_run(json!({ "llm_script": {"responses": [{"content": "one"}]} }));
    let agent = handle(&test, &run);
    let journal = test.journal(&run).len();
    let refused = test.on_kernel(|kernel: Kernel| async move {
        kernel.chat(&agent, LlmChatParams::default(), None).await.map(|_| ())
    });
    let err = refused.expect_err("no messages");
    assert!(err.message.contains("`messages` is empty"), "{err:?}");
    assert_eq!(test.journal(&run).len(), journal, "nothing was journaled");
    assert_eq!(test.get(&run).provider_calls, 0);
}

#[test]
fn kept_responses_belong_to_the_runs_tenant() {
    let test = TestKernel::start();
    for name in ["acme", "globex"] {
        let params = CreateTenantParams { name: name.into(), quota: None };
        test.on_kernel(|kernel: Kernel| async move { kernel.create_tenant(&Principal::Admin, params).await })
            .expect("the tenant");
    }
    let acme = handle(&test, &test.create_run(json!({ "tenant": "acme" })));
    let acme_too = handle(&test, &test.create_run(json!({ "tenant": "acme" })));
    let globex = handle(&test, &test.create_run(json!({ "tenant": "globex" })));
    let record = json!({ "input": [], "response": { "id": "resp_1" } });
    let kept = acme.clone();
    test.on_kernel(|kernel: Kernel| async move { kernel.keep_response(&kept, "resp_1", record).await })
        .expect("kept");
    let read = |run: RunHandle| {
        test.on_kernel(|kernel: Kernel| async move { kernel.response(&run, "resp_1").await }).expect("read")
    };
    assert_eq!(read(acme_too).unwrap()["response"]["id"], "resp_1", "another run of the tenant finds it");
    assert_eq!(read(globex.clone()), None, "another tenant's run does not");
    assert_eq!(read(acme.clone()).map(|r| r["input"].clone()), Some(json!([])));

    // A conversation continued from it is read back whole, newest first, in its tenant only.
    let next = json!({ "input": [], "response": { "id": "resp_2", "previous_response_id": "resp_1" } });
    let kept = acme.clone();
    test.on_kernel(|kernel: Kernel| async move { kernel.keep_response(&kept, "resp_2", next).await })
        .expect("kept");
    let chain = |run: RunHandle| {
        let ids = test
            .on_kernel(|kernel: Kernel| async move { kernel.response_chain(&run, "resp_2", 10).await })
            .expect("read");
        ids.iter().map(|record| record["response"]["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(chain(acme), ["resp_2", "resp_1"]);
    assert_eq!(chain(globex), Vec::<String>::new(), "another tenant's run finds none of it");
}
