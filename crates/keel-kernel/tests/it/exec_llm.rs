//! Model calls from `code.exec` programs (`llm`, `llm_batch`): each is an `llm.chat` of
//! the run marked with the exec's seq, so it is budgeted, counted, journaled and, when the
//! program runs again after a crash, answered from the journal.

use keel_kernel::Command;
use keel_protocol::api::BudgetParams;
use keel_types::{EntryStatus, RunState, WaitReason};
use serde_json::{Value, json};

use crate::harness::{Setup, TestKernel, in_background, refusal};

fn kernel() -> TestKernel {
    TestKernel::start_with(|_| Setup { interp: true, ..Setup::default() })
}

/// Answers `answer-<i>` to a prompt containing `prompt-<i>` (for i below `n`), each with
/// 10 input and 20 output tokens.
fn script(n: usize) -> Value {
    let usage = json!({"input_tokens": 10, "output_tokens": 20});
    let responses: Vec<Value> = (0..n)
        .rev() // `prompt-1` is inside `prompt-10`: try the longer ones first.
        .map(|i| json!({"match": format!("prompt-{i}"), "content": format!("answer-{i}"), "usage": usage}))
        .collect();
    json!({ "responses": responses })
}

fn exec(agent: &mut keel_sdk::Client, lang: &str, code: &str, limits: Value) -> keel_sdk::Result<Value> {
    agent.call("code.exec", json!({ "lang": lang, "code": code, "limits": limits }))
}

/// The `llm.chat` entries of the journal made by the `code.exec` at `exec`.
fn llm_entries(test: &TestKernel, run: &keel_types::RunId, exec: u64) -> Vec<keel_store::JournalEntry> {
    test.journal(run)
        .into_iter()
        .filter(|e| e.method == "llm.chat" && e.params.get("exec") == Some(&json!(exec)))
        .collect()
}

#[test]
fn llm_in_each_language_is_an_llm_chat_of_the_run() {
    let test = kernel();
    let run = test.create_run(json!({ "llm_script": script(3) }));
    let mut agent = test.agent(&run);
    let programs = [
        ("python", "llm('say prompt-0', system='be brief', max_tokens=50)"),
        ("javascript", "llm('say prompt-1', {system: 'be brief', max_tokens: 50})"),
        ("cpython", "llm('say prompt-2', system='be brief', max_tokens=50)"),
    ];
    for (i, (lang, code)) in programs.into_iter().enumerate() {
        let out = exec(&mut agent, lang, code, json!({})).unwrap_or_else(|e| panic!("{lang}: {e}"));
        assert_eq!(out["result"], json!(format!("answer-{i}")), "{lang}");
        assert_eq!(out["llm_calls"], json!(1), "{lang}");
        assert_eq!(out["tool_calls"], json!([]), "{lang}: model calls are not tool calls");
        let exec_seq = test.journal(&run).iter().rev().find(|e| e.method == "code.exec").unwrap().seq;
        let calls = llm_entries(&test, &run, exec_seq);
        assert_eq!(calls.len(), 1, "{lang}: one llm.chat, marked with the exec's seq");
        assert_eq!(calls[0].status, EntryStatus::Ok);
        assert_eq!(calls[0].params["max_tokens"], json!(50));
        assert_eq!(
            calls[0].params["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": format!("say prompt-{i}")},
            ]),
            "{lang}"
        );
    }
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 3);
    assert_eq!(record.usage.llm_calls, 3, "counted in the run's usage");
    assert_eq!(record.usage.input_tokens, 30);
}

#[test]
fn llm_batch_answers_in_the_prompts_order_in_each_language() {
    let test = kernel();
    let run = test.create_run(json!({ "llm_script": script(12) }));
    let mut agent = test.agent(&run);
    let expected: Vec<String> = (0..12).map(|i| format!("answer-{i}")).collect();
    for (lang, code) in [
        ("python", "llm_batch(['prompt-' + str(i) for i in range(12)])"),
        ("javascript", "llm_batch(Array.from({length: 12}, (_, i) => 'prompt-' + i))"),
        ("cpython", "llm_batch(['prompt-' + str(i) for i in range(12)])"),
    ] {
        let out = exec(&mut agent, lang, code, json!({})).unwrap_or_else(|e| panic!("{lang}: {e}"));
        assert_eq!(out["result"], json!(expected), "{lang}");
        assert_eq!(out["llm_calls"], json!(12), "{lang}");
    }
    assert_eq!(test.get(&run).provider_calls, 36);
}

#[test]
fn max_llm_calls_stops_the_program_whatever_it_catches() {
    let test = kernel();
    let run = test.create_run(json!({ "llm_script": script(1) }));
    let mut agent = test.agent(&run);
    let looping =
        "for i in range(5):\n    try:\n        llm('prompt-0')\n    except Exception:\n        pass\n'done'";
    for (lang, code) in [
        ("python", looping),
        ("javascript", "for (let i = 0; i < 5; i++) { try { llm('prompt-0') } catch (e) {} } 'done'"),
        ("cpython", looping),
    ] {
        let (kind, _, message) = refusal(exec(&mut agent, lang, code, json!({"max_llm_calls": 2})));
        assert_eq!(kind, "tool_error", "{lang}");
        assert!(message.contains("llm_call_limit") && message.contains("max_llm_calls"), "{lang}: {message}");
        let exec_seq = test.journal(&run).iter().rev().find(|e| e.method == "code.exec").unwrap().seq;
        assert_eq!(llm_entries(&test, &run, exec_seq).len(), 2, "{lang}: nothing past the limit was asked");
    }
    let (_, _, message) = refusal(exec(&mut agent, "python", "1", json!({"max_llm_calls": 1_000_000})));
    assert!(message.contains("max_llm_calls") && message.contains("at most"), "{message}");
}

#[test]
fn a_prompt_bigger_than_the_whole_budget_is_refused_up_front_with_why() {
    let test = kernel();
    let run = test.create_run(json!({ "llm_script": script(1), "budget": {"tokens": 1000} }));
    let mut agent = test.agent(&run);
    // About 3400 input tokens by the kernel's estimate (3 bytes a token): never fits 1000.
    let code = "try:\n    llm('prompt-0 ' + 'x' * 10000)\nexcept RuntimeError as e:\n    r = str(e)\nr";
    for lang in ["python", "cpython"] {
        let out = exec(&mut agent, lang, code, json!({})).unwrap_or_else(|e| panic!("{lang}: {e}"));
        let message = out["result"].as_str().unwrap_or_default();
        assert!(message.contains("budget exhausted"), "{lang}: {message}");
        assert!(message.contains("more than the run's whole tokens budget of 1000"), "{lang}: {message}");
        assert!(message.contains("llm_batch()") && message.contains("--budget-tokens"), "{lang}: {message}");
    }
    let record = test.get(&run);
    assert_eq!(record.state, RunState::Running, "refused, not parked");
    assert_eq!(record.provider_calls, 0);
    assert!(test.journal(&run).iter().all(|e| e.method != "llm.chat"), "nothing journaled");
    // A prompt that fits still goes through.
    let out = exec(&mut agent, "python", "llm('prompt-0', max_tokens=100)", json!({})).unwrap();
    assert_eq!(out["result"], json!("answer-0"));
}

#[test]
fn a_program_run_again_after_a_crash_gets_its_finished_llm_calls_from_the_journal() {
    let mut test = kernel();
    // Each call reserves its input estimate plus 40 and spends 30 tokens: two fit in 100,
    // the third parks the run mid-program.
    let run = test.create_run(json!({ "llm_script": script(3), "budget": {"tokens": 100} }));
    let code =
        "[llm('prompt-0', max_tokens=40), llm('prompt-1', max_tokens=40), llm('prompt-2', max_tokens=40)]";
    let mut agent = test.agent(&run);
    let first = in_background(move || exec(&mut agent, "python", code, json!({})));
    test.wait_waiting(&run, WaitReason::Budget);
    assert_eq!(test.get(&run).provider_calls, 2);
    let exec_seq = test.journal(&run).iter().find(|e| e.method == "code.exec").unwrap().seq;
    assert_eq!(llm_entries(&test, &run, exec_seq).len(), 2);

    test.crash_and_restart();
    drop(first);
    test.wait_run(&run, "relaunched by replay", |r| r.attempt == 2 && r.pid.is_some());
    let mut agent = test.agent(&run);
    let again = in_background(move || exec(&mut agent, "python", code, json!({})));
    test.wait_waiting(&run, WaitReason::Budget);
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 2, "the finished calls were answered from the journal, not paid again");
    assert_eq!(llm_entries(&test, &run, exec_seq).len(), 2, "and not journaled again");

    let add = BudgetParams { tokens: Some(100), ..Default::default() };
    test.execute(Command::TopUp { run: run.clone(), add, continue_loop: false }).unwrap();
    let out = again.join().unwrap().unwrap();
    assert_eq!(out["result"], json!(["answer-0", "answer-1", "answer-2"]));
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 3, "only the new call was paid");
    assert_eq!(record.usage.input_tokens + record.usage.output_tokens, 90);
    let calls = llm_entries(&test, &run, exec_seq);
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[2].attempt, 2);
}

/// A `code.exec` may carry large inputs over the socket (its line may pass the 1 MiB
/// other requests are held to); any other request that long is refused and, as protocol
/// 1 says, the connection closed.
#[test]
fn a_code_exec_over_the_socket_may_carry_megabytes_of_input() {
    let test = kernel();
    let run = test.create_run(json!({ "llm_script": script(1) }));
    let mut agent = test.agent(&run);
    let log: String =
        (0..200_000).map(|i| if i % 1000 == 0 { "ERROR disk full\n" } else { "INFO ok.......\n" }).collect();
    assert!(log.len() > 2 << 20, "more than a normal line may hold");
    let code = "lines = [l for l in log.split('\\n') if l.startswith('ERROR')]\nllm('prompt-0: ' + lines[0]) + ' ' + str(len(lines))";
    let out: Value = agent
        .call("code.exec", json!({ "lang": "python", "code": code, "inputs": { "log": log } }))
        .expect("a large code.exec");
    assert_eq!(out["result"], json!("answer-0 200"));
    // Only the model's slice reached it.
    let journal = test.journal(&run);
    let call = journal.iter().find(|e| e.method == "llm.chat").expect("the call");
    assert_eq!(call.params["messages"][0]["content"], "prompt-0: ERROR disk full");

    let (kind, _, message) = refusal(agent.call::<Value>("run.emit", json!({ "event": log })));
    assert_eq!(kind, "too_large", "{message}");
    assert!(agent.call::<Value>("sys.now", json!({})).is_err(), "the connection is closed");
    let mut again = test.agent(&run);
    let now: Value = again.call("sys.now", json!({})).expect("a new connection is served");
    assert!(now["unix_ms"].is_u64());
}
