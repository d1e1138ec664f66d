//! Gateway overhead: the same OpenAI-shaped requests sent by one client straight to a mock
//! upstream, through the kernel's `/v1/chat/completions` and through its `/v1/responses`
//! (journaled, metered, budgeted; the Responses API converted to the same upstream chat
//! call), in the same run. Added p50/p99 latency (non-streaming), time to first token
//! (streaming), and requests/s with 64 requests in flight (chat). And a conversation of
//! `TURNS` turns on `/v1/responses`, continued with `previous_response_id` (the kernel
//! reads the kept responses back) against the same conversation sent whole each turn with
//! `store: false` (the client keeps it), in the same run.
//!
//! cargo bench -p keel-cli --bench gateway
//!
//! BENCH_STORE=postgres puts the daemon on Postgres (see `common.rs`); the commit floor is
//! then Postgres's. BENCH_LOAD_SECS (3) sets how long the throughput phase runs;
//! BENCH_LOAD_ONLY=1 runs only it (direct, then through Keel's chat completions), for a
//! profiler attached to the daemon to see that phase alone.
//!
//! The benchmark binary re-executes itself as the agent (`--sandbox none`, so it can also
//! reach the mock directly), which gives the load generator a real run token.
//!
//! A third sequential measure alternates, call by call, a chat call through Keel with a
//! journaled direct call (a raw fsync'd SQLite commit, the direct call, another commit):
//! the least any design keeping the same guarantees can take, met with the disk in the
//! same state as the call through Keel.

#[path = "common.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::routing::post;
use serde_json::{Value, json};

const SEQUENTIAL: usize = 2000;
const STREAMED: usize = 500;
const IN_FLIGHT: usize = 64;
const TURNS: usize = 200;

/// How long the throughput phase runs, in seconds (`BENCH_LOAD_SECS`, default 3).
fn load_secs() -> u64 {
    std::env::var("BENCH_LOAD_SECS")
        .ok()
        .map_or(3, |s| s.parse().expect("BENCH_LOAD_SECS: a number of seconds"))
}

/// Whether only the throughput phase runs (`BENCH_LOAD_ONLY=1`).
fn load_only() -> bool {
    std::env::var_os("BENCH_LOAD_ONLY").is_some_and(|v| v != "0")
}

/// The throughput row, direct against through Keel.
fn throughput_table(direct: &Value, kernel: &Value) -> String {
    format!(
        "| throughput, {IN_FLIGHT} in flight for {} s | direct | through Keel |\n|---|---:|---:|\n| requests/s | {} | {} |",
        load_secs(),
        direct["rps"],
        kernel["rps"]
    )
}

/// The mock upstream: a fixed completion, or a 5-chunk stream whose first chunk is sent
/// at once.
async fn mock(axum::Json(body): axum::Json<Value>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        return axum::Json(json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage,
        }))
        .into_response();
    }
    let mut events = String::new();
    for word in ["one ", "two ", "three ", "four ", "five"] {
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": null}]});
        events.push_str(&format!("data: {chunk}\n\n"));
    }
    let last = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let usage_chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": body["model"], "choices": [], "usage": usage});
    events.push_str(&format!("data: {last}\n\ndata: {usage_chunk}\n\ndata: [DONE]\n\n"));
    ([("content-type", "text/event-stream")], events).into_response()
}

fn stats(mut samples: Vec<f64>) -> Value {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return json!({"n": 0});
    }
    json!({"n": n, "p50_us": samples[n / 2].round(), "p99_us": samples[(n * 99 / 100).min(n - 1)].round()})
}

fn chat_request(i: usize, stream: bool) -> Value {
    let mut body = json!({"model": "gpt-4o-mini", "max_tokens": 16,
        "messages": [{"role": "user", "content": format!("benchmark request {i}")}]});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn responses_request(i: usize, stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "max_output_tokens": 16, "input": format!("benchmark request {i}"), "stream": stream})
}

/// The same, with `store: false`: the kernel does not keep the response (one durable
/// write less per request).
fn unstored_responses_request(i: usize, stream: bool) -> Value {
    let mut body = responses_request(i, stream);
    body["store"] = json!(false);
    body
}

/// One of the OpenAI APIs the gateway serves, as the benchmark asks it.
struct Api {
    path: &'static str,
    request: fn(usize, bool) -> Value,
    /// Text that marks the first streamed chunk carrying a token.
    first_token: &'static str,
}

const CHAT: Api = Api { path: "chat/completions", request: chat_request, first_token: "\"content\"" };
const RESPONSES: Api =
    Api { path: "responses", request: responses_request, first_token: "response.output_text.delta" };
const UNSTORED_RESPONSES: Api =
    Api { path: "responses", request: unstored_responses_request, first_token: "response.output_text.delta" };

/// Agent mode: measures `api` against `base` (direct or through the kernel) with `key`;
/// with `load`, also requests/s with `IN_FLIGHT` in flight.
async fn measure(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    offset: usize,
    api: &Api,
    load: bool,
) -> Value {
    let url = format!("{base}/{}", api.path);
    let (sequential, streamed) = if load_only() { (0, 0) } else { (SEQUENTIAL, STREAMED) };
    let mut latencies = Vec::with_capacity(sequential);
    for i in 0..sequential {
        latencies.push(timed_call(http, &url, key, &(api.request)(offset + i, false)).await);
    }
    let mut first_tokens = Vec::with_capacity(streamed);
    for i in 0..streamed {
        let started = Instant::now();
        let mut response = http
            .post(&url)
            .bearer_auth(key)
            .json(&(api.request)(offset + SEQUENTIAL + i, true))
            .send()
            .await
            .expect("send");
        let mut first = None;
        while let Some(chunk) = response.chunk().await.expect("chunk") {
            if first.is_none() && String::from_utf8_lossy(&chunk).contains(api.first_token) {
                first = Some(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        first_tokens.push(first.expect("a content chunk"));
    }
    if !load {
        return json!({ "latency": stats(latencies), "ttft": stats(first_tokens) });
    }
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(load_secs());
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|w| {
            let (http, url, key, done) = (http.clone(), url.clone(), key.to_owned(), done.clone());
            let request = api.request;
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < deadline {
                    let body = request(offset + 1_000_000 + w * 100_000 + i, false);
                    let response = http.post(&url).bearer_auth(&key).json(&body).send().await.expect("send");
                    assert!(response.status().is_success());
                    response.bytes().await.expect("body");
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    json!({
        "latency": stats(latencies),
        "ttft": stats(first_tokens),
        "rps": (done.load(Ordering::Relaxed) as f64 / load_secs() as f64).round(),
    })
}

/// One sequential call to `url`, its latency in µs.
async fn timed_call(http: &reqwest::Client, url: &str, key: &str, body: &Value) -> f64 {
    let started = Instant::now();
    let response = http.post(url).bearer_auth(key).json(body).send().await.expect("send");
    assert!(response.status().is_success(), "{}", response.text().await.unwrap_or_default());
    response.bytes().await.expect("body");
    started.elapsed().as_secs_f64() * 1e6
}

/// The least a journaled call can take, measured beside Keel's own calls: a durable
/// intent, the direct call, a durable result, each a raw fsync'd SQLite commit (WAL,
/// synchronous=FULL, as the daemon's store) in a file next to the daemon's. Alternated
/// call by call with chat calls through Keel, so that both meet the disk in the same
/// state: a flush here can take several times longer when flushes come spaced out, as a
/// gateway's are, than when they come back to back, as the raw commit floor's do.
async fn journaled_floor(http: &reqwest::Client, direct: &str, kernel: &str, key: &str, db: &str) -> Value {
    let store = rusqlite::Connection::open(db).expect("open the floor's database");
    store
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
        )
        .expect("set up the floor's database");
    let commit = |body: String| {
        store.execute_batch("BEGIN").expect("begin");
        store.execute("INSERT INTO m (body) VALUES (?1)", [body]).expect("insert");
        store.execute_batch("COMMIT").expect("commit");
    };
    let (direct, kernel) = (format!("{direct}/chat/completions"), format!("{kernel}/chat/completions"));
    let (mut floor, mut through) = (Vec::with_capacity(SEQUENTIAL), Vec::with_capacity(SEQUENTIAL));
    for i in 0..SEQUENTIAL {
        let started = Instant::now();
        commit(format!("{{\"op\":\"intent\",\"i\":{i}}}"));
        timed_call(http, &direct, "direct", &chat_request(40_000_000 + i, false)).await;
        commit(format!("{{\"op\":\"result\",\"i\":{i}}}"));
        floor.push(started.elapsed().as_secs_f64() * 1e6);
        through.push(timed_call(http, &kernel, key, &chat_request(50_000_000 + i, false)).await);
    }
    json!({"floor": stats(floor), "kernel": stats(through)})
}

/// A conversation of `TURNS` turns on `/v1/responses`: each turn a new user message,
/// either continuing the last response (`previous_response_id`) or sending every item so
/// far, the responses' output included, with `store: false`. Latencies of every turn and
/// of the last quarter, where the conversation is longest.
async fn conversation(http: &reqwest::Client, base: &str, key: &str, chained: bool) -> Value {
    let url = format!("{base}/responses");
    let (mut items, mut previous, mut latencies) = (Vec::new(), None::<String>, Vec::with_capacity(TURNS));
    for turn in 0..TURNS {
        let said = json!({"role": "user", "content": format!("turn {turn}: {}", "words ".repeat(30))});
        let mut body = json!({"model": "gpt-4o-mini", "max_output_tokens": 16});
        if chained {
            body["input"] = json!([said]);
            if let Some(previous) = &previous {
                body["previous_response_id"] = json!(previous);
            }
        } else {
            items.push(said);
            body["input"] = json!(items);
            body["store"] = json!(false);
        }
        let started = Instant::now();
        let response = http.post(&url).bearer_auth(key).json(&body).send().await.expect("send");
        assert!(response.status().is_success(), "{}", response.text().await.unwrap_or_default());
        let answer: Value = response.json().await.expect("a response object");
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
        previous = answer["id"].as_str().map(str::to_owned);
        items.extend(answer["output"].as_array().into_iter().flatten().cloned());
    }
    json!({"all": stats(latencies.clone()), "last": stats(latencies.split_off(TURNS * 3 / 4))})
}

async fn agent() {
    let http =
        reqwest::Client::builder().no_proxy().pool_max_idle_per_host(IN_FLIGHT).build().expect("client");
    let direct =
        measure(&http, &std::env::var("MOCK_URL").expect("MOCK_URL"), "direct", 0, &CHAT, true).await;
    let kernel_base = std::env::var("OPENAI_BASE_URL").expect("OPENAI_BASE_URL");
    let token = std::env::var("OPENAI_API_KEY").expect("OPENAI_API_KEY");
    let kernel = measure(&http, &kernel_base, &token, 10_000_000, &CHAT, true).await;
    if load_only() {
        println!("{}", json!({"direct": direct, "kernel": kernel}));
        return;
    }
    // Under Postgres the floor's commits would be Postgres's; only SQLite's is measured.
    let journaled = match std::env::var("FLOOR_DB") {
        Ok(db) if common::postgres_store().is_none() => {
            journaled_floor(&http, &std::env::var("MOCK_URL").expect("MOCK_URL"), &kernel_base, &token, &db)
                .await
        }
        _ => Value::Null,
    };
    let responses = measure(&http, &kernel_base, &token, 20_000_000, &RESPONSES, false).await;
    let unstored = measure(&http, &kernel_base, &token, 30_000_000, &UNSTORED_RESPONSES, false).await;
    let chained = conversation(&http, &kernel_base, &token, true).await;
    let whole = conversation(&http, &kernel_base, &token, false).await;
    println!(
        "{}",
        json!({"direct": direct, "kernel": kernel, "responses": responses, "unstored": unstored,
            "chained": chained, "whole": whole, "journaled": journaled})
    );
}

fn row(name: &str, direct: &Value, kernel: &Value) -> String {
    let d = |k: &str| direct[k].as_f64().unwrap_or(0.0);
    let k = |key: &str| kernel[key].as_f64().unwrap_or(0.0);
    format!(
        "| {name} | {} / {} | {} / {} | +{} / +{} |",
        d("p50_us"),
        d("p99_us"),
        k("p50_us"),
        k("p99_us"),
        k("p50_us") - d("p50_us"),
        k("p99_us") - d("p99_us")
    )
}

#[tokio::main]
async fn main() {
    if std::env::var_os("GATEWAY_BENCH_AGENT").is_some() {
        agent().await;
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
    let mock_addr = listener.local_addr().expect("mock addr");
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().route("/v1/chat/completions", post(mock)))
            .await
            .expect("mock");
    });
    let data = tempfile::tempdir().expect("tempdir");
    let mut daemon = common::Daemon::start_with_env(
        data,
        &[("OPENAI_BASE_URL", format!("http://{mock_addr}/v1")), ("OPENAI_API_KEY", "sk-bench".to_owned())],
    );
    let exe = std::env::current_exe().expect("own path").display().to_string();
    // The journaled floor's database: beside the daemon's, in the same file system.
    let floor_db = tempfile::tempdir().expect("tempdir");
    let out = daemon
        .keel()
        .args(["run", "--quiet", "--sandbox", "none", "--loop-threshold", "0"])
        .args([
            "--env",
            "GATEWAY_BENCH_AGENT=1",
            "--env",
            &format!("MOCK_URL=http://{mock_addr}/v1"),
            "--env",
            &format!("FLOOR_DB={}", floor_db.path().join("floor.db").display()),
            "--",
            &exe,
        ])
        .output()
        .expect("keel run");
    daemon.kill();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "agent failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("agent result");
    let (direct, kernel) = (&result["direct"], &result["kernel"]);
    if load_only() {
        println!(
            "cargo bench -p keel-cli --bench gateway (BENCH_LOAD_ONLY)\n\n{}\n\n{}",
            common::store_label(),
            throughput_table(direct, kernel)
        );
        return;
    }
    // The least a journaled call can add: its intent and its result each durable before
    // going on. Measured here as raw commits of the daemon's store: SQLite (WAL,
    // synchronous=FULL) in the same data directory's file system, or Postgres on the
    // same server.
    let (commit_what, commits) = common::commit_floor(daemon.data.path());
    let commit_p50 = commits["p50_us"].as_f64().unwrap_or_default();
    println!("cargo bench -p keel-cli --bench gateway\n\n{}\n", common::store_label());
    println!("| measure (µs) | direct p50 / p99 | through Keel p50 / p99 | added p50 / p99 |");
    println!("|---|---:|---:|---:|");
    for (api, through) in [
        ("chat/completions", kernel),
        ("responses", &result["responses"]),
        ("responses (store: false)", &result["unstored"]),
    ] {
        println!(
            "{}",
            row(
                &format!("/v1/{api}, non-streaming ({SEQUENTIAL} sequential)"),
                &direct["latency"],
                &through["latency"]
            )
        );
        println!(
            "{}",
            row(
                &format!("/v1/{api}, time to first token ({STREAMED} streamed)"),
                &direct["ttft"],
                &through["ttft"]
            )
        );
    }
    let added = kernel["latency"]["p50_us"].as_f64().unwrap_or_default()
        - direct["latency"]["p50_us"].as_f64().unwrap_or_default();
    println!(
        "\nFloor: {commit_what}, p50 {commit_p50:.0} µs; two of them (intent and result) \
         {:.0} µs. /v1/chat/completions adds {added:.0} µs p50: {:.0} µs beyond the two commits.",
        2.0 * commit_p50,
        added - 2.0 * commit_p50
    );
    let journaled = &result["journaled"];
    if journaled.is_null() {
        println!(
            "\nThe journaled direct call (alternated with calls through Keel) is measured on SQLite only."
        );
    } else {
        let at = |v: &Value, key: &str| v[key].as_f64().unwrap_or_default();
        let (floor, through) = (at(&journaled["floor"], "p50_us"), at(&journaled["kernel"], "p50_us"));
        println!(
            "\n| {SEQUENTIAL} of each, alternated call by call (µs) | p50 / p99 |\n|---|---:|\n\
             | a journaled direct call: fsync'd commit, the direct call, fsync'd commit | {} / {} |\n\
             | /v1/chat/completions through Keel | {} / {} |\n\
             | Keel beyond the journaled direct call, p50 | +{:.0} |\n\
             | the two commits in it, p50 (the journaled call less the direct call's p50 above) | {:.0} |",
            floor,
            at(&journaled["floor"], "p99_us"),
            through,
            at(&journaled["kernel"], "p99_us"),
            through - floor,
            floor - direct["latency"]["p50_us"].as_f64().unwrap_or_default(),
        );
    }
    println!("\n{}", throughput_table(direct, kernel));
    let turns = |which: &str, part: &str, key: &str| result[which][part][key].as_f64().unwrap_or_default();
    println!(
        "\n| a {TURNS}-turn conversation on /v1/responses, through Keel (µs) | continued with previous_response_id | sent whole, store: false |\n|---|---:|---:|"
    );
    for (part, what) in [("all", "every turn"), ("last", "the last quarter of the turns")] {
        println!(
            "| {what}, p50 / p99 | {} / {} | {} / {} |",
            turns("chained", part, "p50_us"),
            turns("chained", part, "p99_us"),
            turns("whole", part, "p50_us"),
            turns("whole", part, "p99_us")
        );
    }
}
