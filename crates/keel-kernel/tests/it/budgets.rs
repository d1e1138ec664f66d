//! Budgets: a call whose worst case would overshoot the budget parks the run as
//! `waiting(budget)` before it is journaled or sent; a top-up lets it go on; spend never
//! exceeds the budget.

use keel_kernel::{Command, Principal};
use keel_protocol::api::BudgetParams;
use keel_protocol::rpc::LlmChatParams;
use keel_types::{RunState, WaitReason};
use serde_json::{Value, json};

use crate::harness::{TestKernel, in_background, wait_for};

/// Each reply uses 30 tokens; at 1000 USD per million tokens that is $0.03. A call with
/// `max_tokens: 40` reserves its input estimate (9 tokens for one short message) plus 40.
fn priced_script() -> Value {
    let usage = json!({"input_tokens": 10, "output_tokens": 20});
    json!({
        "responses": [
            {"content": "one", "usage": usage},
            {"content": "two", "usage": usage},
            {"content": "three", "usage": usage},
        ],
        "price": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0},
    })
}

fn ask(agent: &mut keel_sdk::Client, text: &str) -> keel_sdk::Result<String> {
    let params =
        LlmChatParams { messages: vec![keel_sdk::user(text)], max_tokens: Some(40), ..Default::default() };
    Ok(agent.llm_chat_with(&params)?.message.content.unwrap_or_default())
}

/// Two calls fit in `budget`; the third's worst case does not: it parks until `top_up`.
/// `spent` reads the limited quantity off the run's usage.
fn parks_then_goes_on_after_a_top_up(
    budget: Value,
    top_up: BudgetParams,
    spent: fn(&keel_types::Usage) -> u64,
    limit: u64,
) {
    let test = TestKernel::start();
    let run = test.create_run(json!({ "llm_script": priced_script(), "budget": budget }));
    let mut agent = test.agent(&run);
    assert_eq!(ask(&mut agent, "q1").unwrap(), "one");
    assert_eq!(ask(&mut agent, "q2").unwrap(), "two");
    let third = in_background(move || ask(&mut agent, "q3"));

    let parked = test.wait_waiting(&run, WaitReason::Budget);
    assert_eq!(parked.provider_calls, 2, "the call that would overshoot was not sent");
    assert!(spent(&parked.usage) <= limit, "spend within the budget");
    assert_eq!(test.journal(&run).len(), 2, "nor journaled: it is reserved before its intent");
    let reason = test.view(&run).reason.expect("a reason while parked");
    assert!(!reason.is_empty());

    test.execute(Command::TopUp { run: run.clone(), add: top_up, continue_loop: false }).unwrap();
    assert_eq!(third.join().unwrap().unwrap(), "three");
    let record = test.get(&run);
    assert_eq!(record.provider_calls, 3);
    assert_eq!(record.state, RunState::Running);
    assert_eq!(spent(&record.usage), 3 * spent(&parked.usage) / 2);
    assert!(test.view(&run).reason.is_none());
}

#[test]
fn a_usd_budget_parks_the_call_that_would_overshoot_until_a_top_up() {
    let add = BudgetParams { usd: Some(0.1), ..Default::default() };
    parks_then_goes_on_after_a_top_up(json!({"usd": 0.1}), add, |u| u.cost_micro_usd, 100_000);
}

#[test]
fn a_token_budget_parks_the_call_that_would_overshoot_until_a_top_up() {
    let add = BudgetParams { tokens: Some(100), ..Default::default() };
    parks_then_goes_on_after_a_top_up(json!({"tokens": 100}), add, |u| u.input_tokens + u.output_tokens, 100);
}

/// A listing reads every run's top-ups in one store read: each view must still show its
/// own run's limits, top-ups included (a run created without a budget has one once topped
/// up), before and after a restart relaunches the runs with those limits.
#[test]
fn a_listing_shows_each_runs_own_budget_with_its_top_ups() {
    let mut test = TestKernel::start();
    let tokens = test.create_run(json!({ "llm_script": priced_script(), "budget": {"tokens": 100} }));
    let none = test.create_run(json!({}));
    let usd = test.create_run(json!({ "budget": {"usd": 1.0} }));
    let topped = test.create_run(json!({}));
    for (run, add) in [(&tokens, 50), (&topped, 7)] {
        let add = BudgetParams { tokens: Some(add), ..Default::default() };
        test.execute(Command::TopUp { run: run.clone(), add, continue_loop: false }).unwrap();
    }
    let expected = |budgets: &std::collections::HashMap<String, Option<BudgetParams>>| {
        assert_eq!(budgets[tokens.as_str()], Some(BudgetParams { tokens: Some(150), ..Default::default() }));
        assert_eq!(budgets[none.as_str()], None, "no budget and no top-up: no budget shown");
        assert_eq!(budgets[usd.as_str()], Some(BudgetParams { usd: Some(1.0), ..Default::default() }));
        assert_eq!(budgets[topped.as_str()], Some(BudgetParams { tokens: Some(7), ..Default::default() }));
    };
    let listed = |test: &TestKernel| {
        let views = test.on_kernel(|kernel| async move {
            kernel.runs(&Principal::Admin, &keel_kernel::RunQuery::default()).await
        });
        let budgets: std::collections::HashMap<_, _> = views
            .expect("the listing")
            .into_iter()
            .map(|view| (view.run_id, view.budget.map(|budget| budget.limits)))
            .collect();
        assert_eq!(budgets.len(), 4);
        budgets
    };
    expected(&listed(&test));
    assert_eq!(
        test.view(&tokens).budget.map(|b| b.remaining.tokens),
        Some(Some(150)),
        "a single run's view reads the same"
    );

    test.crash_and_restart();
    for run in [&tokens, &none, &usd, &topped] {
        test.wait_run(run, "relaunched", |record| record.attempt == 2 && record.pid.is_some());
    }
    expected(&listed(&test));
    // The relaunched agent's account has the top-up: a third call reserves 60 spent + 49
    // and parks under the 100 it was created with, not under 150.
    let mut agent = test.agent(&tokens);
    let asks = in_background(move || ["q1", "q2", "q3"].map(|q| ask(&mut agent, q).expect("an answer")));
    let parked = wait_for("the three calls answered, or the run parked", || {
        if asks.is_finished() {
            return Some(false);
        }
        (test.get(&tokens).wait_reason == Some(WaitReason::Budget)).then_some(true)
    });
    assert!(!parked, "the relaunched run parked under the budget it was created with: its top-up was lost");
    assert_eq!(asks.join().unwrap(), ["one", "two", "three"]);
}
