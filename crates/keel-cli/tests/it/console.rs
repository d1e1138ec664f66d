//! The web console (`/ui`) in a real browser: Debian's `chromium` driven by
//! `playwright-core` from npm (pinned, installed into `target/console-npm`), against a real
//! daemon whose runs are started with the real `keel` binary. The browser steps are in
//! `tests/console/console.mjs`, one scenario per test; each saves screenshots of the
//! pages it visits into `target/console-artifacts/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::harness::{Keel, agents, repo_root};

/// The `playwright-core` the scenarios run, pinned so a new release cannot change them.
const PLAYWRIGHT_CORE: &str = "playwright-core@1.65.1";

fn target_dir() -> PathBuf {
    keel_mcp::testing::target_dir()
}

/// `target/console-npm/node_modules/playwright-core`, installed with npm unless that
/// version is there.
fn playwright() -> PathBuf {
    let prefix = target_dir().join("console-npm");
    let package = prefix.join("node_modules/playwright-core");
    let version = std::fs::read_to_string(package.join("package.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|manifest| manifest["version"].as_str().map(str::to_owned));
    let wanted = PLAYWRIGHT_CORE.rsplit('@').next().unwrap_or_default();
    if version.as_deref() != Some(wanted) {
        std::fs::create_dir_all(&prefix).expect("create target/console-npm");
        let out = Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&prefix)
            .args(["--no-audit", "--no-fund", "--loglevel=error", PLAYWRIGHT_CORE])
            .output()
            .expect("run npm (the console tests need Node.js 20+ with npm)");
        assert!(
            out.status.success(),
            "npm install {PLAYWRIGHT_CORE} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        Path::new("/usr/bin/chromium").is_file(),
        "the console tests drive Debian's chromium: apt-get install chromium"
    );
    package
}

/// Runs `console.mjs <scenario>` against the daemon; returns the JSON it printed.
fn scenario(keel: &Keel, name: &str, extra: Value) -> Value {
    let (base, token) = keel.api();
    let artifacts = target_dir().join("console-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let mut config = json!({
        "base": base,
        "token": token,
        "keel": env!("CARGO_BIN_EXE_keel"),
        "data_dir": keel.data.path(),
        "repo": repo_root(),
        "agents": agents(),
        "artifacts": artifacts,
        "playwright": playwright(),
    });
    config.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/console.mjs");
    let out = Command::new("node")
        .arg(&script)
        .arg(name)
        .env("CONSOLE_TEST", config.to_string())
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(keel.data.path().join("daemon.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "console scenario {name} failed ({}):\n{}\n{stdout}\ndaemon log (end):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("scenario {name} printed no JSON ({e}): {stdout}"))
}

/// A daemon with the console agent's LLM script and `kv.put` needing approval.
fn console_daemon() -> Keel {
    let mut keel = Keel::new();
    std::fs::write(
        keel.data.path().join("keel.toml"),
        "[tools.policy.\"kv.put\"]\nrequires_approval = true\n",
    )
    .unwrap();
    let script = agents().join("console_script.json");
    keel.start_daemon_with(&["--llm-script", script.to_str().unwrap()]);
    keel
}

/// Logs in (a bad token shows the API's message); a run started from the CLI appears in
/// the open list live; its timeline shows its syscalls and a bar its params and result;
/// answering its question in the page finishes it; a call parked for approval is
/// approved in the inbox with a note and the run goes on; the cost and health pages show
/// what happened. No script error or CSP violation on any page.
#[test]
fn the_console_lists_live_shows_the_timeline_and_answers_and_approves_in_place() {
    let keel = console_daemon();
    let result = scenario(&keel, "main", json!({}));
    let answered = result["answered"].as_str().unwrap();
    let view = keel.inspect(answered);
    assert_eq!(view["output"]["answer"], "ship it", "{view}");
    assert_eq!(view["provider_calls"], 1);
    let approved = keel.inspect(result["approved"].as_str().unwrap());
    assert_eq!(approved["state"], "succeeded", "{approved}");
}

/// Every action, clicked in the page: a child nested under its parent, pause and resume,
/// a message, a budget top-up and a loop let go on from the inbox, a denial with a note,
/// and a stop after the page's confirmation.
#[test]
fn every_action_of_the_run_page_and_the_inbox_works_in_the_browser() {
    let keel = console_daemon();
    let result = scenario(&keel, "actions", json!({}));
    let view = keel.inspect(result["topped_up"].as_str().unwrap());
    assert_eq!(view["provider_calls"], 2, "{view}");
}

/// A tenant's token sees only its tenant: the list, a search, a filter naming another
/// tenant (refused with the API's message), the live stream, a direct link, the inbox
/// and costs.
#[test]
fn a_tenants_token_sees_only_its_tenant_in_the_console() {
    let keel = console_daemon();
    keel.ok(&["tenant", "create", "acme"]);
    keel.ok(&["tenant", "create", "globex"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let globex = keel.ok(&["tenant", "token", "globex"]).trim().to_owned();
    let start = |token: &str| {
        let out = keel
            .cmd()
            .env("KEEL_API_TOKEN", token)
            .args(["run", "--detach", "--json", "--sandbox", "none", "--", "sleep", "60"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let view: Value = serde_json::from_slice(&out.stdout).unwrap();
        view["run_id"].as_str().unwrap().to_owned()
    };
    let own = start(&acme);
    let other = start(&globex);
    let result = scenario(
        &keel,
        "tenant",
        json!({"tenant_token": acme, "tenant": "acme", "own_run": own, "other_run": other,
               "other_tenant": "globex", "other_token": globex}),
    );
    assert_eq!(result["own"], own.as_str());
}

/// A question with a form (`human.ask` with a JSON schema): the console renders the form
/// and the agent's UI blocks in order (its markdown rendered, its HTML as text), checks
/// required fields and bounds in the page, and the agent receives the structured value.
#[test]
fn a_form_question_is_answered_through_the_rendered_form() {
    let keel = console_daemon();
    let result = scenario(&keel, "form", json!({}));
    let view = keel.inspect(result["run"].as_str().unwrap());
    assert_eq!(view["output"]["answer"], json!({"region": "eu", "replicas": 3, "canary": true}), "{view}");
}

/// The benchmark "console list with 10,000 runs": 10,000 runs written straight into the
/// store, then the time from navigation to the first rendered row (5 rounds; printed and
/// saved to `target/console-artifacts/bench.json`, no timing asserted), a search among
/// them and the costliest first, each answered by the store's query.
#[test]
fn the_console_lists_10000_runs_a_page_at_a_time() {
    let mut keel = Keel::new();
    let costliest = fill_store(&keel.data.path().join("keel.db"), 10_000);
    keel.start_daemon();
    let result =
        scenario(&keel, "bench", json!({"rounds": 5, "needle": "agent-7777.py", "costliest": costliest}));
    eprintln!("console with 10,000 runs: {result}");
    let times = result["first_row_ms"].as_array().unwrap();
    assert_eq!(times.len(), 5, "{result}");
}

/// Writes `count` finished runs of tenant `bench` (commands `agent-<i>.py`), one of them
/// with an LLM call that cost $1.23; returns that run's id.
fn fill_store(path: &Path, count: usize) -> String {
    use keel_store::{NewEntry, NewRun, SqliteStore, Store};
    use keel_types::{EntryStatus, RunId, RunState, Usage};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).expect("open the store"));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        let mut ids = Vec::with_capacity(count);
        for chunk in (0..count).collect::<Vec<_>>().chunks(500) {
            let writes = chunk.iter().map(|&i| {
                let store = store.clone();
                let created = now - (count - i) as u64 * 1000;
                let run = NewRun {
                    id: RunId::generate(created),
                    tenant: "bench".to_owned(),
                    spec: json!({"version": 1, "command": ["python3", format!("agent-{i}.py")], "cwd": "/tmp"}),
                    state: RunState::Succeeded,
                    created_at_ms: created,
                };
                async move { store.create_run(run).await.expect("create_run").id }
            });
            ids.extend(futures_util::future::join_all(writes).await);
        }
        let costliest = ids[1234].clone();
        let usage = Usage { input_tokens: 1000, output_tokens: 100, llm_calls: 1, tool_calls: 0, cost_micro_usd: 1_230_000 };
        let entry = NewEntry {
            method: "llm.chat".to_owned(),
            params: json!({"model": "gpt-bench"}),
            params_hash: "bench".to_owned(),
            status: EntryStatus::Ok,
            result: Some(json!({"model": "gpt-bench"})),
            error: None,
            attempt: 1,
            started_at_ms: now - 1000,
            finished_at_ms: Some(now - 900),
            usage,
        };
        store.append_entry(&costliest, &entry).await.expect("append_entry");
        costliest.to_string()
    })
}
