//! Unit tests of the metrics: labels, both text formats, the snapshot's gauges.

use super::*;

fn render(metrics: &Metrics, snapshot: &Snapshot) -> String {
    metrics.render(snapshot, Format::OpenMetrics)
}

#[test]
fn the_prometheus_format_types_counters_under_their_total_name() {
    let metrics = Metrics::new();
    drop(metrics.syscall("sys.now"));
    metrics.llm_failed(&keel_llm::Error::NoRoute("x".into()));
    let text = metrics.render(&Snapshot::default(), Format::Prometheus);
    assert!(text.contains("# TYPE keel_llm_errors_total counter\n"), "{text}");
    assert!(text.contains("# HELP keel_llm_errors_total LLM calls"), "{text}");
    assert!(text.contains("keel_llm_errors_total{class=\"no_route\"} 1\n"), "{text}");
    assert!(text.contains("# TYPE keel_syscall_duration_seconds histogram\n"), "{text}");
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")),
        Format::OpenMetrics
    );
    assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
    assert_eq!(Format::negotiate(None), Format::Prometheus);
}

#[test]
fn unknown_methods_share_one_label_and_known_ones_have_their_own() {
    let metrics = Metrics::new();
    drop(metrics.syscall("llm.chat"));
    drop(metrics.syscall("made.up.1"));
    drop(metrics.syscall("made.up.2"));
    let text = render(&metrics, &Snapshot::default());
    assert!(text.contains("keel_syscall_duration_seconds_count{method=\"llm.chat\"} 1"), "{text}");
    assert!(text.contains("keel_syscall_duration_seconds_count{method=\"unknown\"} 2"), "{text}");
    assert!(!text.contains("made.up"), "{text}");
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn embedder_calls_are_counted_by_tenant_and_model() {
    let metrics = Metrics::new();
    let usage = Usage { input_tokens: 7, ..Usage::default() };
    metrics.embedded("acme", "text-embedding-3-small", 2, &usage);
    metrics.embedded("acme", "text-embedding-3-small", 0, &usage); // a text search: no call
    let text = render(&metrics, &Snapshot::default());
    let labels = "{tenant=\"acme\",model=\"text-embedding-3-small\"}";
    assert!(text.contains(&format!("keel_embedding_calls_total{labels} 2")), "{text}");
    assert!(text.contains(&format!("keel_embedding_input_tokens_total{labels} 7")), "{text}");
}

#[test]
fn each_tenant_and_route_has_its_own_series_and_routes_share_their_queue_wait() {
    let metrics = Metrics::new();
    let usage = Usage { input_tokens: 3, output_tokens: 1, llm_calls: 1, tool_calls: 0, cost_micro_usd: 0 };
    // A model with a `/` of its own, as a gateway provider's models have.
    let routed = serde_json::json!({ "provider": "openrouter", "model": "openrouter/anthropic/claude-x" });
    let other = serde_json::json!({ "provider": "openrouter", "model": "openrouter/anthropic" });
    for (tenant, meta) in [("acme", &routed), ("beta", &routed), ("acme", &routed), ("acme", &other)] {
        metrics.llm_served(tenant, meta, &usage, Duration::ZERO);
    }
    let text = render(&metrics, &Snapshot::default());
    let calls = |tenant: &str, model: &str| {
        format!("keel_llm_calls_total{{tenant=\"{tenant}\",provider=\"openrouter\",model=\"{model}\"}}")
    };
    assert!(text.contains(&format!("{} 2", calls("acme", "anthropic/claude-x"))), "{text}");
    assert!(text.contains(&format!("{} 1", calls("beta", "anthropic/claude-x"))), "{text}");
    assert!(text.contains(&format!("{} 1", calls("acme", "anthropic"))), "{text}");
    assert!(
        text.contains(
            "keel_llm_queue_wait_seconds_count{provider=\"openrouter\",model=\"anthropic/claude-x\"} 3"
        ),
        "{text}"
    );
}

#[test]
fn served_calls_are_labelled_by_model_without_the_provider_prefix() {
    let metrics = Metrics::new();
    let usage =
        Usage { input_tokens: 10, output_tokens: 5, llm_calls: 1, tool_calls: 0, cost_micro_usd: 1500 };
    let meta = serde_json::json!({ "provider": "openai", "model": "openai/gpt-4o-mini" });
    metrics.llm_served("acme", &meta, &usage, Duration::ZERO);
    metrics.llm_served("acme", &meta, &usage, Duration::from_millis(20));
    let text = render(&metrics, &Snapshot::default());
    let labels = "{tenant=\"acme\",provider=\"openai\",model=\"gpt-4o-mini\"}";
    assert!(text.contains(&format!("keel_llm_calls_total{labels} 2")), "{text}");
    assert!(text.contains(&format!("keel_llm_input_tokens_total{labels} 20")), "{text}");
    assert!(text.contains(&format!("keel_llm_cost_usd_total{labels} 0.003")), "{text}");
    assert!(
        text.contains(
            "keel_llm_queue_wait_seconds_bucket{le=\"0.0\",provider=\"openai\",model=\"gpt-4o-mini\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn runs_by_state_show_every_state_of_a_tenant_and_count_parked_runs() {
    let metrics = Metrics::new();
    let count = |state, wait_reason, has_pid, count| RunCount {
        tenant: "acme".into(),
        state,
        wait_reason,
        has_pid,
        count,
    };
    let snapshot = Snapshot {
        runs: vec![
            count(RunState::Running, None, true, 3),
            count(RunState::Waiting, Some(WaitReason::Human), false, 2),
            count(RunState::Waiting, Some(WaitReason::Human), true, 1),
            count(RunState::Waiting, Some(WaitReason::Budget), false, 4),
        ],
        live_slots_cap: Some(8),
        ..Snapshot::default()
    };
    let text = render(&metrics, &snapshot);
    for expected in [
        "keel_runs{tenant=\"acme\",state=\"running\"} 3",
        "keel_runs{tenant=\"acme\",state=\"waiting\"} 7",
        "keel_runs{tenant=\"acme\",state=\"failed\"} 0",
        "keel_runs_waiting{reason=\"human\"} 3",
        "keel_runs_waiting{reason=\"budget\"} 4",
        "keel_runs_waiting{reason=\"timer\"} 0",
        // A budget wait is not swappable: only the two human waits without a process.
        "keel_runs_swapped 2",
        "keel_live_slots_capacity 8",
    ] {
        assert!(text.contains(expected), "{expected} in {text}");
    }
}
