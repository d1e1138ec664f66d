//! Conformance checks of what the web console asks of a store: runs listed by cost and
//! age, searched by text and paged (`RunFilter`), and LLM usage summed per time bucket,
//! tenant and model (`cost_summary`).

use keel_types::{EntryStatus, RunId, RunState, Usage};
use serde_json::json;

use super::{Must, complete_entry, new_run, now_ms, ok_completion, pending_entry};
use crate::{CostBucket, CostFilter, NewRun, RunFilter, RunOrder, Store};

/// A tenant no other check or earlier suite run uses.
fn fresh_tenant(what: &str) -> String {
    format!("{what}-{}", RunId::generate(now_ms()).as_str().trim_start_matches("run_"))
}

async fn ids(store: &dyn Store, filter: &RunFilter, what: &str) -> Vec<RunId> {
    store.list_runs(filter).await.must(what).into_iter().map(|run| run.id).collect()
}

/// `RunFilter`'s order, offset and text: each order sorts (ties broken by age), an offset
/// pages down the same order, and the text matches id, tenant or command, ASCII case
/// aside, as typed (`%` is no wildcard); all combine with the tenant and state filters.
pub async fn runs_list_sorted_searched_and_paged(store: &dyn Store) {
    let tenant = fresh_tenant("console");
    let start = now_ms();
    // (command, cost in micro-USD, state): created in this order, one ms apart. The ended
    // ones get an end time, so that a backend indexing ended and live runs apart must
    // merge them (b and d cost the same, one ended and one live).
    let plan = [
        (["python3", "Alpha.py"], 300, RunState::Running),
        (["python3", "beta.py"], 100, RunState::Succeeded),
        (["node", "gamma_100%.js"], 500, RunState::Failed),
        (["python3", "delta.py"], 100, RunState::Running),
        (["python3", "alphabet.py"], 0, RunState::Running),
    ];
    let mut runs = Vec::new();
    for (i, (command, cost, state)) in plan.iter().enumerate() {
        let created = start + i as u64;
        let run = NewRun {
            tenant: tenant.clone(),
            spec: json!({"command": command, "env": {"SECRET_WORD": "zebra"}}),
            ..new_run(created, *state)
        };
        let id = store.create_run(run).await.must("create_run").id;
        if *cost > 0 {
            let usage = Usage { llm_calls: 1, cost_micro_usd: *cost, ..Usage::default() };
            let entry = complete_entry("llm.chat", json!({"i": i}), EntryStatus::Ok, usage);
            store.append_entry(&id, &entry).await.must("append_entry with a cost");
        }
        if state.is_terminal() {
            let ended =
                crate::RunPatch { ended_at_ms: Some(Some(created + 10)), ..crate::RunPatch::default() };
            store.update_run(&id, None, ended).await.must("update_run ending a run");
        }
        runs.push(id);
    }
    let [a, b, c, d, e] = [&runs[0], &runs[1], &runs[2], &runs[3], &runs[4]].map(Clone::clone);
    let mine = |order| RunFilter { tenant: Some(tenant.clone()), order, ..RunFilter::default() };

    let newest = ids(store, &mine(RunOrder::NewestFirst), "list_runs newest first").await;
    assert_eq!(
        newest,
        [e.clone(), d.clone(), c.clone(), b.clone(), a.clone()],
        "store conformance: NewestFirst orders by creation, newest first"
    );
    let oldest = ids(store, &mine(RunOrder::OldestFirst), "list_runs oldest first").await;
    assert_eq!(
        oldest,
        [a.clone(), b.clone(), c.clone(), d.clone(), e.clone()],
        "store conformance: OldestFirst orders by creation, oldest first"
    );
    let costliest = ids(store, &mine(RunOrder::CostliestFirst), "list_runs costliest first").await;
    assert_eq!(
        costliest,
        [c.clone(), a.clone(), d.clone(), b.clone(), e.clone()],
        "store conformance: CostliestFirst orders by cost, equal costs newest first"
    );
    let cheapest = ids(store, &mine(RunOrder::CheapestFirst), "list_runs cheapest first").await;
    assert_eq!(
        cheapest,
        [e.clone(), b.clone(), d.clone(), a.clone(), c.clone()],
        "store conformance: CheapestFirst orders by cost, equal costs oldest first"
    );

    // Pages of two down the costliest-first order cover it exactly once.
    let mut paged = Vec::new();
    for offset in [0, 2, 4, 6] {
        let page = RunFilter { limit: Some(2), offset, ..mine(RunOrder::CostliestFirst) };
        let page = ids(store, &page, "list_runs with an offset").await;
        assert!(page.len() <= 2, "store conformance: a page holds at most its limit");
        paged.extend(page);
    }
    assert_eq!(
        paged, costliest,
        "store conformance: offset pages walk the same order without gaps or repeats"
    );

    let search = |text: &str| RunFilter { text: Some(text.to_owned()), ..mine(RunOrder::NewestFirst) };
    assert_eq!(
        ids(store, &search("ALPHA"), "list_runs by text").await,
        [e.clone(), a.clone()],
        "store conformance: text matches the command, ASCII case aside"
    );
    assert_eq!(
        ids(store, &search("100%"), "list_runs by text with %").await,
        std::slice::from_ref(&c),
        "store conformance: `%` in the text is matched as typed, not a wildcard"
    );
    assert!(
        ids(store, &search("a%a"), "list_runs by text with %").await.is_empty(),
        "store conformance: `%` in the text is no wildcard"
    );
    assert!(
        ids(store, &search("al_ha"), "list_runs by text with _").await.is_empty(),
        "store conformance: `_` in the text is no wildcard"
    );
    let by_id = &b.as_str()[b.as_str().len() - 10..];
    assert_eq!(
        ids(store, &search(by_id), "list_runs by id text").await,
        std::slice::from_ref(&b),
        "store conformance: text matches the id"
    );
    assert!(
        ids(store, &search("zebra"), "list_runs by env text").await.is_empty(),
        "store conformance: text is not matched against the rest of the spec (its env)"
    );
    let everyone = RunFilter { text: Some(tenant.to_uppercase()), ..RunFilter::default() };
    assert_eq!(
        ids(store, &everyone, "list_runs by tenant text").await.len(),
        5,
        "store conformance: text matches the tenant"
    );
    let running = RunFilter { states: vec![RunState::Running], limit: Some(1), offset: 1, ..search("alpha") };
    assert_eq!(
        ids(store, &running, "list_runs by text, state, limit and offset").await,
        std::slice::from_ref(&a),
        "store conformance: text, state, tenant, limit and offset combine"
    );
    assert!(
        ids(store, &RunFilter { offset: 5, ..mine(RunOrder::NewestFirst) }, "list_runs past the end")
            .await
            .is_empty(),
        "store conformance: an offset past the end lists nothing"
    );
}

/// `cost_summary` sums completed `llm.chat` entries per (bucket, tenant, model): the
/// model from the result, else the params; entries before `since_ms`, pending ones and
/// other methods are left out; the tenant filter confines it.
pub async fn costs_summed_by_bucket_tenant_and_model(store: &dyn Store) {
    let hour = 3_600_000;
    // A whole hour, so buckets of an hour start exactly here.
    let base = 1_000 * hour;
    let (one, two) = (fresh_tenant("costs-a"), fresh_tenant("costs-b"));
    let run_of = |tenant: &String| NewRun { tenant: tenant.clone(), ..new_run(now_ms(), RunState::Running) };
    let first = store.create_run(run_of(&one)).await.must("create_run").id;
    let second = store.create_run(run_of(&one)).await.must("create_run").id;
    let other = store.create_run(run_of(&two)).await.must("create_run").id;
    let usage = |input, output, cost| Usage {
        input_tokens: input,
        output_tokens: output,
        llm_calls: 1,
        tool_calls: 0,
        cost_micro_usd: cost,
    };
    // (run, started at, model asked, model answered, usage)
    let calls = [
        (&first, base - 1, "gpt-old", None, usage(1, 1, 1_000)), // before `since`
        (&first, base + 10, "alias", Some("gpt-x"), usage(10, 5, 100)),
        (&second, base + hour - 1, "alias", Some("gpt-x"), usage(20, 5, 200)),
        (&first, base + 20, "claude-y", None, usage(1, 2, 30)),
        (&first, base + hour, "alias", Some("gpt-x"), usage(3, 4, 50)),
        (&other, base + 5, "alias", Some("gpt-x"), usage(7, 7, 70)),
    ];
    for (run, started_at_ms, asked, answered, usage) in calls {
        let entry =
            complete_entry("llm.chat", json!({"model": asked, "n": started_at_ms}), EntryStatus::Ok, usage);
        let mut entry = crate::NewEntry { started_at_ms, ..entry };
        entry.result = Some(match answered {
            // As the kernel journals an llm.chat: the provider's answer under `response`.
            Some(model) => {
                json!({"response": {"model": model, "message": {"role": "assistant", "content": "hi"}}})
            }
            None => json!({"message": {"role": "assistant", "content": "hi"}}),
        });
        store.append_entry(run, &entry).await.must("append_entry of an llm.chat");
    }
    // Left out: a tool call with a cost, a pending call, a call that failed.
    let tool = complete_entry("tool.call", json!({"tool": "t"}), EntryStatus::Ok, usage(0, 0, 9_000));
    store
        .append_entry(&first, &crate::NewEntry { started_at_ms: base + 1, ..tool })
        .await
        .must("append_entry");
    let pending =
        crate::NewEntry { started_at_ms: base + 2, ..pending_entry("llm.chat", json!({"model": "gpt-x"})) };
    store.append_entry(&first, &pending).await.must("append_entry (pending)");
    let failed =
        complete_entry("llm.chat", json!({"model": "gpt-x", "f": 1}), EntryStatus::Error, usage(1, 1, 1));
    store
        .append_entry(&first, &crate::NewEntry { started_at_ms: base + 3, ..failed })
        .await
        .must("append_entry");
    let seq = store
        .append_entry(
            &second,
            &crate::NewEntry { started_at_ms: base + 4, ..pending_entry("llm.chat", json!({"p": 2})) },
        )
        .await
        .must("append_entry (pending, completed below)");
    store
        .complete_entry(&second, seq, &ok_completion(json!({"model": "gpt-z"}), usage(2, 2, 2), true))
        .await
        .must("complete_entry of an llm.chat");

    let bucket = |start, tenant: &String, model: &str, calls, input, output, cost| CostBucket {
        bucket_start_ms: start,
        tenant: tenant.clone(),
        model: model.to_owned(),
        calls,
        input_tokens: input,
        output_tokens: output,
        cost_micro_usd: cost,
    };
    let filter = CostFilter { since_ms: base, bucket_ms: hour, tenant: Some(one.clone()) };
    let summary = store.cost_summary(&filter).await.must("cost_summary of one tenant");
    assert_eq!(
        summary,
        vec![
            bucket(base, &one, "claude-y", 1, 1, 2, 30),
            bucket(base, &one, "gpt-x", 2, 30, 10, 300),
            bucket(base, &one, "gpt-z", 1, 2, 2, 2),
            bucket(base + hour, &one, "gpt-x", 1, 3, 4, 50),
        ],
        "store conformance: cost_summary sums completed llm.chat entries per bucket, tenant and model"
    );
    let daily = CostFilter { since_ms: base - 1, bucket_ms: 24 * hour, tenant: Some(one.clone()) };
    let days = store.cost_summary(&daily).await.must("cost_summary in days");
    let day = (base - 1) / (24 * hour) * (24 * hour);
    assert_eq!(
        days,
        vec![
            bucket(day, &one, "claude-y", 1, 1, 2, 30),
            bucket(day, &one, "gpt-old", 1, 1, 1, 1_000),
            bucket(day, &one, "gpt-x", 3, 33, 14, 350),
            bucket(day, &one, "gpt-z", 1, 2, 2, 2),
        ],
        "store conformance: bucket starts are multiples of bucket_ms, and since_ms is inclusive"
    );
    let everyone = CostFilter { since_ms: base, bucket_ms: hour, tenant: None };
    let all = store.cost_summary(&everyone).await.must("cost_summary of every tenant");
    assert!(
        all.contains(&bucket(base, &two, "gpt-x", 1, 7, 7, 70))
            && all.contains(&bucket(base, &one, "gpt-z", 1, 2, 2, 2)),
        "store conformance: without a tenant, cost_summary covers every tenant: {all:?}"
    );
    let theirs = CostFilter { tenant: Some(two.clone()), ..everyone };
    assert_eq!(
        store.cost_summary(&theirs).await.must("cost_summary of another tenant"),
        vec![bucket(base, &two, "gpt-x", 1, 7, 7, 70)],
        "store conformance: the tenant filter confines cost_summary"
    );
}
