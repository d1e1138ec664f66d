//! The framework matrix (issue 12): each agent framework, unmodified and with its default
//! settings, as an agent under `keel serve` in the default sandbox, against the mock
//! upstream (OpenAI chat, or its Responses API for one row; it counts what it serves).
//! Per row: a one-tool round trip (the
//! model asks for `add`, the framework runs it, the model answers) with a SIGKILL of the
//! daemon while the tool runs, between the two LLM calls; then the same with two tools
//! and the kill before the third call. The run must complete, its replayed calls must
//! match their journal entries, and the upstream must have served each distinct call
//! exactly once.
//!
//! The frameworks come from the registries at pinned versions (`scripts/frameworks/`),
//! each in an environment of its own under `target/framework-envs/` built by
//! `scripts/framework-envs` (the tests run it; it does nothing when the pins have not
//! changed). How each reaches the sandbox is what a user does: a Python framework by
//! running its virtualenv's interpreter (the sandbox binds the interpreter's installation,
//! so the venv needs no flag, from any working directory); a Node framework by running
//! `node agent.mjs` in its project directory, whose `node_modules` is then visible.
//!
//! Rows on the Responses API need the gateway's `POST /v1/responses`; on a kernel without
//! it their failure says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::gateway::{mock_upstream, read_counts, use_upstream};
use crate::harness::{Keel, agent, journaled_llm_calls, repo_root, wait_for};

/// How long the agents' `add` tool sleeps: the window in which the test kills the daemon,
/// after an LLM call is journaled and before the next is asked.
const TOOL_DELAY_MS: &str = "3000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Responses,
    Messages,
}

impl Api {
    /// The agents' `AGENT_API` value.
    fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }
}

/// One row of the matrix: the environment, the agent program and the API it uses.
struct Row {
    /// The environment's name in `scripts/frameworks/` (`node` for the npm project).
    env: &'static str,
    /// The program in `tests/agents/frameworks/`.
    agent: &'static str,
    api: Api,
    /// The mock upstream's scripts in `tests/agents/frameworks/`: one tool call then the
    /// answer, and two tool calls then the answer.
    scripts: [&'static str; 2],
    /// What the framework must not print (the noise of a call home Keel turns off).
    quiet: &'static [&'static str],
    /// The API the kernel's provider calls at the mock upstream: chat, or `responses`
    /// (`api = "responses"` in keel.toml).
    upstream: Api,
}

fn framework_file(name: &str) -> String {
    agent(&format!("frameworks/{name}"))
}

/// The directory of the pinned environment `name`, built on first use by
/// `scripts/framework-envs` (under a lock: tests running at once wait for one build).
pub(crate) fn environment(name: &str) -> PathBuf {
    let script = repo_root().join("scripts/framework-envs");
    let out = Command::new(&script)
        .arg(name)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "`scripts/framework-envs {name}` could not build the {name} environment ({}); it needs python3 \
         with venv and pip that reach PyPI (npm and the npm registry for node):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        stdout.lines().last().unwrap_or_else(|| panic!("scripts/framework-envs {name} named no directory")),
    )
}

/// The command that runs `row`'s agent, and the directory to run it from.
fn command_of(row: &Row, scratch: &Path) -> (Vec<String>, PathBuf) {
    let env = environment(row.env);
    if row.env == "node" {
        // A Node project: the agent next to its node_modules, run from there. Written
        // to a file of its own and renamed, since tests may copy it at once.
        let source = std::fs::read(framework_file(row.agent)).expect("read the agent");
        let mut temporary = tempfile::NamedTempFile::new_in(&env).expect("a file in the npm project");
        std::io::Write::write_all(&mut temporary, &source).expect("write the agent");
        temporary.persist(env.join(row.agent)).expect("move the agent into place");
        (vec!["node".into(), row.agent.into()], env)
    } else {
        // The venv's interpreter, from a directory that holds neither the venv nor the
        // agent: the sandbox binds both by itself.
        let python = env.join("bin/python").display().to_string();
        (vec![python, framework_file(row.agent)], scratch.to_path_buf())
    }
}

/// The agent's JSON line in a run's logs.
fn agent_output(logs: &str) -> Option<Value> {
    let line = logs.lines().rev().find(|l| l.starts_with('{') && l.contains("\"framework\""))?;
    serde_json::from_str(line).ok()
}

/// What a failure of a Responses row means while the gateway lacks the route.
fn responses_note(row: &Row, logs: &str) -> &'static str {
    if row.api == Api::Responses && logs.contains("does not serve POST /v1/responses") {
        "this row needs the gateway's POST /v1/responses (issue 12), which answered 404: "
    } else {
        ""
    }
}

/// Both conversations of a row, each with a SIGKILL: between the two LLM calls of a
/// one-tool round trip (the replay answers a request that holds only the prompt), and
/// between the second and third calls of a two-tool one (the replayed second request
/// carries the first answer, as the gateway rendered it from the journal, so its ids must
/// come out the same).
fn row_survives_daemon_kills(row: Row) {
    survives_a_daemon_kill(&row, 1);
    survives_a_daemon_kill(&row, 2);
}

fn survives_a_daemon_kill(row: &Row, tools: usize) {
    let (answer, results) = match tools {
        1 => ("2 + 3 = 5", serde_json::json!([5])),
        _ => ("(2 + 3) + 4 = 9", serde_json::json!([5, 9])),
    };
    let calls = tools + 1;
    let scratch = tempfile::tempdir().expect("a working directory");
    let (command, cwd) = command_of(row, scratch.path());
    let mut keel = Keel::new();
    let (mut upstream, port, counts) = mock_upstream(&keel, &framework_file(row.scripts[tools - 1]));
    use_upstream(&mut keel, port, row.upstream == Api::Responses);
    keel.start_daemon();
    let agent_api = format!("AGENT_API={}", row.api.name());
    let delay = format!("AGENT_TOOL_DELAY_MS={TOOL_DELAY_MS}");
    let mut args = vec!["run", "--detach", "--json", "--env", &agent_api, "--env", &delay, "--"];
    args.extend(command.iter().map(String::as_str));
    let out = keel.cmd().current_dir(&cwd).args(&args).output().expect("spawn keel run");
    assert!(out.status.success(), "keel run: {}", String::from_utf8_lossy(&out.stderr));
    let run = serde_json::from_slice::<Value>(&out.stdout).expect("keel run --json")["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();

    // Kill the daemon while the agent runs its last tool: every call but the answer
    // journaled, the answer to come.
    let journaled =
        wait_for("the LLM calls before the last tool to be journaled (or the run to end)", || {
            let view = keel.inspect(&run);
            let done = journaled_llm_calls(&view);
            let ended =
                ["succeeded", "failed", "cancelled"].contains(&view["state"].as_str().unwrap_or_default());
            (done >= tools || ended).then_some(done)
        });
    if journaled < tools {
        let logs = keel.ok(&["logs", &run]);
        panic!(
            "{}the run ended after {journaled} LLM calls, before the kill:\n{logs}",
            responses_note(row, &logs)
        );
    }
    assert_eq!(
        journaled, tools,
        "the kill must fall before the last LLM call; the tool's delay was too short"
    );
    keel.kill_daemon();
    keel.start_daemon();

    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    assert_eq!(done["state"], "succeeded", "{}{logs}", responses_note(row, &logs));
    let seen = agent_output(&logs).unwrap_or_else(|| panic!("no JSON from the agent in:\n{logs}"));
    assert_eq!(seen["answer"].as_str().map(str::trim), Some(answer), "{logs}");
    assert_eq!(seen["tool_results"], results, "the relaunched agent ran each tool once: {logs}");
    assert_eq!(seen["api"], row.api.name(), "{logs}");
    assert!(done["attempt"].as_u64().unwrap_or_default() >= 2, "the run was relaunched: {done}");
    for noise in row.quiet {
        assert!(!logs.contains(noise), "the framework printed {noise:?}, which keel run turns off:\n{logs}");
    }
    let counts = read_counts(&counts);
    upstream.kill();
    assert_eq!(counts["errors"], serde_json::json!([]), "request invariants at the upstream: {counts}");
    assert!(
        counts["counts"].as_object().is_some_and(|c| c.values().all(|n| n == 1)),
        "a call was served twice, so its replayed request differed from the journaled one: {counts}"
    );
    assert_eq!(counts["total"], calls, "{calls} distinct calls, each served once: {counts}");
    assert_eq!(done["provider_calls"], calls, "{done}");
    // A replayed call whose request differed would have gone live as an extra entry.
    let llm_entries: Vec<&Value> =
        done["journal"].as_array().into_iter().flatten().filter(|e| e["method"] == "llm.chat").collect();
    assert_eq!(llm_entries.len(), calls, "the replayed calls matched their journal entries: {llm_entries:?}");
}

const SCRIPTS: [&str; 2] = ["script.json", "two_tools_script.json"];
/// The Vercel AI SDK on Responses sends earlier text by reference (see the last test).
const SCRIPTS_WITHOUT_TEXT: [&str; 2] = ["script.json", "two_tools_without_text_script.json"];

#[test]
fn openai_agents_sdk_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "openai-agents",
        agent: "openai_agents_agent.py",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &["Tracing request failed"],
        upstream: Api::Chat,
    });
}

#[test]
fn openai_agents_sdk_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "openai-agents",
        agent: "openai_agents_agent.py",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &["Tracing request failed"],
        upstream: Api::Chat,
    });
}

/// The Responses API end to end: the Agents SDK's default, through the kernel, to an
/// upstream that speaks the Responses API too.
#[test]
fn openai_agents_sdk_over_a_responses_upstream_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "openai-agents",
        agent: "openai_agents_agent.py",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &["Tracing request failed"],
        upstream: Api::Responses,
    });
}

#[test]
fn pydantic_ai_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "pydantic-ai",
        agent: "pydantic_ai_agent.py",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn pydantic_ai_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "pydantic-ai",
        agent: "pydantic_ai_agent.py",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn langgraph_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "langgraph",
        agent: "langgraph_agent.py",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn langgraph_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "langgraph",
        agent: "langgraph_agent.py",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn crewai_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "crewai",
        agent: "crewai_agent.py",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn smolagents_survives_a_daemon_kill() {
    // smolagents ends with a call of its own `final_answer` tool, so its script does too.
    row_survives_daemon_kills(Row {
        env: "smolagents",
        agent: "smolagents_agent.py",
        api: Api::Chat,
        scripts: ["smolagents_script.json", "smolagents_two_tools_script.json"],
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_openai_python_package_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "official-sdks",
        agent: "official_sdk_agent.py",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_openai_python_package_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "official-sdks",
        agent: "official_sdk_agent.py",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_anthropic_python_package_on_the_messages_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "official-sdks",
        agent: "official_sdk_agent.py",
        api: Api::Messages,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_openai_npm_package_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "node",
        agent: "openai_npm_agent.mjs",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_openai_npm_package_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "node",
        agent: "openai_npm_agent.mjs",
        api: Api::Responses,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_vercel_ai_sdk_on_the_responses_api_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "node",
        agent: "vercel_ai_agent.mjs",
        api: Api::Responses,
        scripts: SCRIPTS_WITHOUT_TEXT,
        quiet: &[],
        upstream: Api::Chat,
    });
}

#[test]
fn the_vercel_ai_sdk_on_chat_completions_survives_a_daemon_kill() {
    row_survives_daemon_kills(Row {
        env: "node",
        agent: "vercel_ai_agent.mjs",
        api: Api::Chat,
        scripts: SCRIPTS,
        quiet: &[],
        upstream: Api::Chat,
    });
}

/// `keel run` sets what the frameworks need (their calls home off) inside the default
/// sandbox, and a user's own `--env` wins over it.
#[test]
fn frameworks_get_their_settings_and_a_users_env_wins() {
    let keel = Keel::new();
    let out = keel.run(&[
        "run",
        "--quiet",
        "--env",
        "CREWAI_DISABLE_TELEMETRY=false",
        "--",
        "python3",
        &agent("env_agent.py"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with('{')).expect("agent output");
    let env = &serde_json::from_str::<Value>(line).expect("agent JSON")["env"];
    assert_eq!(env["OPENAI_AGENTS_DISABLE_TRACING"], "1", "{env}");
    assert_eq!(env["LITELLM_LOCAL_MODEL_COST_MAP"], "True", "{env}");
    assert_eq!(env["CREWAI_DISABLE_TELEMETRY"], "false", "the user's --env wins: {env}");
}

/// The Vercel AI SDK's Responses provider keeps `store: true` by default and then sends
/// an earlier step's output back as `item_reference`s to its ids (a step with only tool
/// calls, as in the row above, sends none; a step with text before its tool call does).
/// The gateway resolves them from the responses it keeps, so that works unmodified; the
/// provider's documented `store: false` sends the items themselves. Before, the
/// references were refused with a 400.
#[test]
fn the_vercel_ai_sdk_sends_earlier_steps_by_reference_and_the_gateway_resolves_them() {
    let row = Row {
        env: "node",
        agent: "vercel_ai_agent.mjs",
        api: Api::Responses,
        scripts: ["text_then_tool_script.json"; 2],
        quiet: &[],
        upstream: Api::Chat,
    };
    let scratch = tempfile::tempdir().expect("a working directory");
    let (command, cwd) = command_of(&row, scratch.path());
    let keel = Keel::new();
    let script = framework_file(row.scripts[0]);
    for store in ["true", "false"] {
        let store_env = format!("AGENT_OPENAI_STORE={store}");
        let mut args = vec!["run", "--quiet", "--llm-script", &script, "--env", &store_env, "--"];
        args.extend(command.iter().map(String::as_str));
        let out = keel.cmd().current_dir(&cwd).args(&args).output().expect("spawn keel run");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "store: {store}\n{text}");
        let seen = agent_output(&text).unwrap_or_else(|| panic!("no JSON from the agent in:\n{text}"));
        assert_eq!(seen["answer"], "2 + 3 = 5", "store: {store}\n{text}");
    }
    // Both runs' second calls carried the first step whole: its text and its tool call.
    for run in keel.json(&["ps", "--json"]).as_array().expect("runs") {
        let view = keel.inspect(run["run_id"].as_str().expect("an id"));
        let calls: Vec<&Value> = view["journal"]
            .as_array()
            .expect("a journal")
            .iter()
            .filter(|e| e["method"] == "llm.chat")
            .collect();
        assert_eq!(calls.len(), 2, "{view}");
        let messages = calls[1]["params"]["messages"].as_array().expect("messages");
        let step = messages.iter().find(|m| m["role"] == "assistant").expect("the first step");
        assert_eq!(step["content"], "Let me add them.", "{messages:?}");
        assert_eq!(step["tool_calls"][0]["id"], "call_1", "{messages:?}");
    }
}
