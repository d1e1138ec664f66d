//! Text output for people: tables, the inspect view, one-line event descriptions. Pure
//! functions of the API's views, so they are easy to test.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

use keel_protocol::api::{EventView, InspectView, RunView};
use serde_json::Value;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Prints a kernel line on stderr, dimmed on a terminal, so it stands apart from the
/// agent's own output.
pub fn kernel_line(text: &str) {
    use std::io::Write as _;
    // A closed stderr must not panic (`keel run 2>&1 | head -1`); the line is lost either way.
    let mut err = std::io::stderr().lock();
    let _ = if err.is_terminal() {
        writeln!(err, "\x1b[2mkeel ▸ {text}\x1b[0m")
    } else {
        writeln!(err, "keel ▸ {text}")
    };
}

pub fn age(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m", secs / 60),
        3600..=86_399 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

fn tokens(view: &RunView) -> u64 {
    view.usage.input_tokens + view.usage.output_tokens
}

pub fn summary(view: &RunView, elapsed: Duration) -> String {
    let mut text = format!(
        "run {} {} in {:.1}s · {} llm calls · {} tokens · ${:.4}",
        view.run_id,
        view.state,
        elapsed.as_secs_f64(),
        view.usage.llm_calls,
        tokens(view),
        view.usage.cost_usd
    );
    if let Some(error) = &view.error {
        let _ = write!(text, " · {error}");
    }
    text
}

fn short(value: &Value, max: usize) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max).collect::<String>())
    } else {
        text
    }
}

/// One line for a kernel event, or `None` for events not worth a line.
pub fn describe_event(event: &EventView, run_id: &str) -> Option<String> {
    let data = &event.data;
    let get = |key: &str| data.get(key).cloned().unwrap_or(Value::Null);
    Some(match event.kind.as_str() {
        "state" => {
            let state = get("state");
            let state = state.as_str().unwrap_or("?");
            match state {
                "created" | "queued" => return None,
                _ => {
                    let mut line = format!("state → {state}");
                    if let Some(reason) = data.get("wait_reason").and_then(Value::as_str) {
                        let _ = write!(line, " ({reason})");
                    }
                    if let Some(error) = data.get("error").and_then(Value::as_str) {
                        let _ = write!(line, ": {error}");
                    }
                    line
                }
            }
        }
        "launch" => format!(
            "agent started (pid {}, attempt {}, sandbox {}{})",
            get("pid"),
            get("attempt"),
            short(&get("sandbox"), 20),
            if get("replaying") == Value::Bool(true) { ", replaying its journal" } else { "" }
        ),
        "syscall" => {
            let method = get("method");
            let method = method.as_str().unwrap_or("?");
            let mut line = format!("#{} {method}", get("seq"));
            if let Some(tool) = data.get("tool").and_then(Value::as_str) {
                let _ = write!(line, " {tool}");
            }
            if data.get("input_tokens").is_some() {
                let _ = write!(line, " · {} in / {} out tokens", get("input_tokens"), get("output_tokens"));
            }
            if let Some(ms) = data.get("duration_ms").and_then(Value::as_u64) {
                let _ = write!(line, " · {ms} ms");
            }
            let status = get("status");
            if status.as_str() != Some("ok") {
                let _ = write!(line, " · {}", short(&status, 20));
            }
            if data.get("replayed") == Some(&Value::Bool(true)) {
                line.push_str(" · replayed from the journal");
            } else {
                line.push_str(" · journaled");
            }
            line
        }
        "question" => match data.get("form") {
            Some(form) => format!(
                "waiting for a human: {}  ({})  → keel answer {run_id} --json '{{...}}'",
                short(&get("question"), 200),
                form_fields(form)
            ),
            None => format!(
                "waiting for a human: {}  → keel answer {run_id} --text \"...\"",
                short(&get("question"), 200)
            ),
        },
        "ui" => {
            let block = data.get("block").cloned().unwrap_or(Value::Null);
            let field = |name: &str| block.get(name).cloned().unwrap_or(Value::Null);
            let title = block.get("title").map(|t| format!(" {}", short(t, 60))).unwrap_or_default();
            let count = |name: &str| field(name).as_array().map_or(0, Vec::len);
            match block.get("type").and_then(Value::as_str).unwrap_or_default() {
                "table" => format!("ui table{title}: {} columns, {} rows", count("columns"), count("rows")),
                "chart" => format!(
                    "ui {} chart{title}: {} series over {} labels",
                    short(&field("kind"), 10),
                    count("series"),
                    count("labels")
                ),
                "markdown" => format!("ui markdown: {}", short(&field("text"), 200)),
                "progress" => format!(
                    "ui progress {:.0}%{}",
                    field("value").as_f64().unwrap_or_default() * 100.0,
                    block.get("label").map(|l| format!(" {}", short(l, 60))).unwrap_or_default()
                ),
                "form" => format!(
                    "ui form {}{title} ({}): submit with keel send {run_id} --json '{{\"ui_form\": {}, \"value\": {{...}}}}'",
                    short(&field("id"), 60),
                    form_fields(&field("schema")),
                    field("id")
                ),
                other => format!("ui {other}"),
            }
        }
        "answer" => format!("answered: {}", short(&get("text"), 200)),
        "approval" => format!(
            "tool {} (call {}) waits for approval ({}): keel approve {run_id} {} / keel deny {run_id} {}",
            short(&get("tool"), 60),
            get("call"),
            short(&get("kind"), 30),
            get("call"),
            get("call")
        ),
        "decision" => format!(
            "call {} {}",
            get("call"),
            if get("approve") == Value::Bool(true) { "approved" } else { "denied" }
        ),
        "denied" => format!("tool {} denied: not granted to this run", short(&get("tool"), 60)),
        "interrupted" => format!(
            "tool {} (call {}) was interrupted by a kernel crash; crash policy {}",
            short(&get("tool"), 60),
            get("call"),
            short(&get("policy"), 10)
        ),
        "emit" => format!("event: {}", short(data, 200)),
        "stop" => format!("stopping (SIGTERM, SIGKILL after {}s)", get("grace_secs")),
        "replay" => {
            format!("replay diverged; journal entries {} kept as abandoned", short(&get("abandoned"), 80))
        }
        _ => return None,
    })
}

fn budget_part(value: Option<f64>, unit: &str) -> Option<String> {
    value.map(|v| if unit == "$" { format!("${v:.4}") } else { format!("{v} {unit}") })
}

/// The budget lines of a run: limits, what is left, and why it is parked.
pub fn budget(view: &RunView) -> String {
    let mut out = String::new();
    match &view.budget {
        None => {
            let _ = writeln!(out, "run {} has no budget (unlimited)", view.run_id);
        }
        Some(budget) => {
            let line = |p: &keel_protocol::api::BudgetParams| {
                [
                    budget_part(p.usd, "$"),
                    budget_part(p.tokens.map(|t| t as f64), "tokens"),
                    budget_part(p.llm_calls.map(|t| t as f64), "LLM calls"),
                    budget_part(p.tool_calls.map(|t| t as f64), "tool calls"),
                    budget_part(p.wall_secs.map(|t| t as f64), "s wall"),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" · ")
            };
            let _ = writeln!(out, "budget    {}", line(&budget.limits));
            let _ = writeln!(out, "remaining {}", line(&budget.remaining));
        }
    }
    if let Some(reason) = &view.reason {
        let _ = writeln!(out, "parked    {reason}");
    }
    out
}

/// The line under a run in `keel ps` saying what it waits for (its LLM call's place in a
/// provider's queue, its place in the admission queue, a budget, an approval), indented
/// by `indent` columns to sit under the run's id.
fn reason_line(out: &mut String, run: &RunView, indent: usize) {
    if let Some(reason) = &run.reason {
        let _ = writeln!(out, "{:indent$}  ↳ {reason}", "");
    }
    if let (Some(question), Some(form)) = (&run.question, &run.question_form) {
        let _ = writeln!(
            out,
            "{:indent$}  ↳ question with a form ({}): {}  → keel answer {} --json '{{...}}'",
            "",
            form_fields(form),
            short(&Value::String(question.clone()), 60),
            run.run_id
        );
    }
}

/// A form's fields in words: `fields name*, age` (`*`: required), from its schema.
pub fn form_fields(form: &Value) -> String {
    let required: Vec<&str> = form
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let fields: Vec<String> = form
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, _)| if required.contains(&name.as_str()) { format!("{name}*") } else { name.clone() })
        .collect();
    if fields.is_empty() { "no fields".to_owned() } else { format!("fields {}", fields.join(", ")) }
}

/// `keel ps --tree`: the table, with each run's children indented under it (a child whose
/// parent is not listed starts a tree of its own).
pub fn runs_tree(runs: &[RunView], now: u64) -> String {
    if runs.is_empty() {
        return runs_table(runs, now);
    }
    let listed: std::collections::HashSet<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    let mut children: std::collections::HashMap<&str, Vec<&RunView>> = std::collections::HashMap::new();
    let mut roots = Vec::new();
    // Oldest first within a tree reads like a process listing.
    let mut ordered: Vec<&RunView> = runs.iter().collect();
    ordered.sort_by_key(|r| (r.created_at, r.run_id.clone()));
    for run in ordered {
        match run.parent.as_deref().filter(|p| listed.contains(p)) {
            Some(parent) => children.entry(parent).or_default().push(run),
            None => roots.push(run),
        }
    }
    let mut out =
        format!("{:<40} {:<14} {:>5} {:>4} {:>8}  {}\n", "RUN", "STATE", "AGE", "LLM", "TOKENS", "COMMAND");
    fn walk<'a>(
        out: &mut String,
        run: &'a RunView,
        depth: usize,
        children: &std::collections::HashMap<&str, Vec<&'a RunView>>,
        now: u64,
    ) {
        let state = match &run.wait_reason {
            Some(reason) if run.state == "waiting" && run.swapped => format!("swapped:{reason}"),
            Some(reason) if run.state == "waiting" => format!("waiting:{reason}"),
            _ => run.state.clone(),
        };
        let name = if depth == 0 {
            run.run_id.clone()
        } else {
            format!("{}└─ {}", "   ".repeat(depth - 1), run.run_id)
        };
        let _ = writeln!(
            out,
            "{:<40} {:<14} {:>5} {:>4} {:>8}  {}",
            name,
            state,
            age(now.saturating_sub(run.created_at)),
            run.usage.llm_calls,
            tokens(run),
            short(&Value::String(run.command.join(" ")), 50)
        );
        reason_line(out, run, 3 * depth);
        for child in children.get(run.run_id.as_str()).into_iter().flatten() {
            walk(out, child, depth + 1, children, now);
        }
    }
    for root in roots {
        walk(&mut out, root, 0, &children, now);
    }
    out
}

pub fn runs_table(runs: &[RunView], now: u64) -> String {
    if runs.is_empty() {
        return "no runs yet; start one with `keel run -- COMMAND`\n".into();
    }
    let mut out = format!(
        "{:<30} {:<14} {:>5} {:>4} {:>8} {:>9}  {}\n",
        "RUN", "STATE", "AGE", "LLM", "TOKENS", "COST", "COMMAND"
    );
    for run in runs {
        let state = match &run.wait_reason {
            Some(reason) if run.state == "waiting" && run.swapped => format!("swapped:{reason}"),
            Some(reason) if run.state == "waiting" => format!("waiting:{reason}"),
            _ => run.state.clone(),
        };
        let _ = writeln!(
            out,
            "{:<30} {:<14} {:>5} {:>4} {:>8} {:>9}  {}",
            run.run_id,
            state,
            age(now.saturating_sub(run.created_at)),
            run.usage.llm_calls,
            tokens(run),
            match run.budget.as_ref().and_then(|b| b.limits.usd) {
                Some(limit) => format!("${:.2}/{limit:.2}", run.usage.cost_usd),
                None => format!("${:.4}", run.usage.cost_usd),
            },
            started_by(run) + &short(&Value::String(run.command.join(" ")), 60)
        );
        reason_line(&mut out, run, 0);
    }
    out
}

/// What started a run by itself, as a prefix of its command (`[schedule:nightly] `).
fn started_by(run: &RunView) -> String {
    run.started_by.as_deref().map(|by| format!("[{by}] ")).unwrap_or_default()
}

pub fn inspect(view: &InspectView, now: u64) -> String {
    let run = &view.run;
    let mut out = String::new();
    let _ = writeln!(out, "run       {}", run.run_id);
    let _ = writeln!(
        out,
        "state     {}{}",
        run.state,
        run.wait_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
    );
    let _ = writeln!(out, "command   {}", run.command.join(" "));
    let _ = writeln!(out, "age       {} (attempt {})", age(now.saturating_sub(run.created_at)), run.attempt);
    let _ = writeln!(
        out,
        "usage     {} llm calls ({} served by the provider) · {} in / {} out tokens · {} tool calls · ${:.4}",
        run.usage.llm_calls,
        run.provider_calls,
        run.usage.input_tokens,
        run.usage.output_tokens,
        run.usage.tool_calls,
        run.usage.cost_usd
    );
    if run.budget.is_some() || run.reason.is_some() {
        out.push_str(&budget(run));
    }
    match (&run.question, &run.question_form) {
        (Some(question), Some(form)) => {
            let _ = writeln!(
                out,
                "question  {question}  ({}; * required)  → keel answer {} --json '{{...}}'",
                form_fields(form),
                run.run_id
            );
            let _ = writeln!(out, "form      {}", short(form, 400));
        }
        (Some(question), None) => {
            let _ = writeln!(out, "question  {question}  → keel answer {} --text \"...\"", run.run_id);
        }
        _ => {}
    }
    if let Some(code) = run.exit_code {
        let _ = writeln!(out, "exit code {code}");
    }
    if let Some(error) = &run.error {
        let _ = writeln!(out, "error     {error}");
    }
    if let Some(output) = &run.output {
        let _ = writeln!(out, "output    {}", short(output, 400));
    }
    for approval in &view.approvals {
        let _ = writeln!(
            out,
            "approval  call {} · {} {} ({})  → keel approve {} {} / keel deny {} {}",
            approval.call,
            approval.tool,
            short(&approval.args, 80),
            approval.kind,
            run.run_id,
            approval.call,
            run.run_id,
            approval.call
        );
    }
    let _ = writeln!(out, "\njournal ({} entries)", view.journal.len());
    let _ = writeln!(
        out,
        "{:>5}  {:<17} {:<9} {:<16} {:>7}  DETAIL",
        "SEQ", "METHOD", "STATUS", "PARAMS", "TIME"
    );
    for entry in &view.journal {
        let detail = match entry.method.as_str() {
            "llm.chat" => {
                format!("{} in / {} out tokens", entry.usage.input_tokens, entry.usage.output_tokens)
            }
            "tool.call" => {
                let name = short(&entry.params.get("name").cloned().unwrap_or(Value::Null), 40);
                match entry.params.get("exec").and_then(Value::as_u64) {
                    Some(exec) => format!("{name} (from code.exec #{exec})"),
                    None => name,
                }
            }
            "code.exec" => short(&entry.params.get("lang").cloned().unwrap_or(Value::Null), 20),
            "human.ask" => short(&entry.params.get("question").cloned().unwrap_or(Value::Null), 60),
            "run.exit" => short(&entry.params.get("output").cloned().unwrap_or(Value::Null), 60),
            "run.emit" => short(&entry.params.get("event").cloned().unwrap_or(Value::Null), 60),
            _ => entry.result.as_ref().map(|r| short(r, 60)).unwrap_or_default(),
        };
        let time = entry.duration_ms.map(|d| format!("{d}ms")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:>5}  {:<17} {:<9} {:<16} {:>7}  {}",
            entry.seq, entry.method, entry.status, entry.params_digest, time, detail
        );
    }
    out
}

/// `keel audit RUN`: one line per entry, the detail cut short.
pub fn audit_table(run: &str, entries: &[keel_protocol::api::AuditEntryView]) -> String {
    if entries.is_empty() {
        return format!("no audit entries for run {run}\n");
    }
    let mut out = format!(
        "{:>6}  {:<20}  {:<8}  {:<18}  {:<24}  {:<8}  {}\n",
        "SEQ", "TIME (UTC)", "ACTOR", "ACTION", "SUBJECT", "OUTCOME", "DETAIL"
    );
    for entry in entries {
        let _ = writeln!(
            out,
            "{:>6}  {:<20}  {:<8}  {:<18}  {:<24}  {:<8}  {}",
            entry.seq,
            utc_time(entry.at),
            entry.actor,
            entry.action,
            short(&Value::String(entry.subject.clone()), 24),
            entry.outcome,
            short(&entry.detail, 60)
        );
    }
    out
}

/// A trigger's name line in `keel schedule|hook|event show`: its tenant, and whether
/// keel.toml declares it.
pub fn trigger_name(name: &str, tenant: &str, declared: bool) -> String {
    let declared = if declared { " (declared in keel.toml)" } else { "" };
    format!("name:      {name} (tenant {tenant}){declared}")
}

/// Unix milliseconds as `2026-11-21T10:00:00Z`.
pub fn utc_time(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `keel tools`: one line per tool.
pub fn tools(tools: &[keel_protocol::api::ToolView]) -> String {
    let mut out =
        format!("{:<32} {:<8} {:<9} {:<6} {:<10} DESCRIPTION\n", "TOOL", "KIND", "APPROVAL", "CRASH", "RATE");
    for tool in tools {
        let mut description = tool.description.clone();
        if let Some(status) = tool.status.as_deref().filter(|s| *s != "connected") {
            description = format!("[{status}] {description}");
        }
        let description: String = description.chars().take(70).collect();
        let _ = writeln!(
            out,
            "{:<32} {:<8} {:<9} {:<6} {:<10} {}",
            tool.name,
            tool.kind,
            if tool.requires_approval { "required" } else { "-" },
            tool.crash,
            tool.rate_limit.as_deref().unwrap_or("-"),
            description
        );
    }
    out
}

/// A tenant's quotas in words.
pub fn quota(quota: &keel_protocol::api::QuotaParams) -> String {
    let runs = quota.max_runs.map_or("no run limit".to_owned(), |n| format!("at most {n} live runs"));
    let usd =
        quota.max_usd_per_run.map_or("no default budget".to_owned(), |usd| format!("${usd:.2} per run"));
    format!("{runs}, {usd}")
}

/// `keel tenant list`: one line per tenant, then its tokens indented.
pub fn tenants_table(tenants: &[keel_protocol::api::TenantView]) -> String {
    if tenants.is_empty() {
        return "no tenants; create one with `keel tenant create NAME`\n".to_owned();
    }
    let mut out = String::new();
    for tenant in tenants {
        out.push_str(&format!("{}  ({})\n", tenant.name, quota(&tenant.quota)));
        for token in &tenant.tokens {
            let state = if token.revoked { "revoked" } else { "active" };
            let label = token.label.as_deref().map(|l| format!("  {l}")).unwrap_or_default();
            out.push_str(&format!(
                "  {}  {state}  {}{label}\n",
                token.prefix,
                age(now_ms().saturating_sub(token.created_at))
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use keel_protocol::api::UsageView;
    use serde_json::json;

    use super::*;

    fn run(state: &str, wait_reason: Option<&str>) -> RunView {
        RunView {
            run_id: "run_01m7yg8vmfwnsqddwp8gr8ey2p".into(),
            tenant: "default".into(),
            state: state.into(),
            wait_reason: wait_reason.map(str::to_owned),
            command: vec!["python3".into(), "agent.py".into()],
            created_at: 1_000,
            updated_at: 2_000,
            ended_at: None,
            attempt: 1,
            pid: Some(42),
            exit_code: None,
            output: None,
            error: None,
            usage: UsageView {
                input_tokens: 300,
                output_tokens: 135,
                llm_calls: 5,
                tool_calls: 3,
                cost_usd: 0.0123,
            },
            provider_calls: 5,
            question: None,
            question_form: None,
            budget: None,
            reason: None,
            parent: None,
            started_by: None,
            swapped: false,
        }
    }

    #[test]
    fn ps_table_is_aligned_and_shows_why_a_run_waits() {
        let table = runs_table(&[run("waiting", Some("human")), run("succeeded", None)], 125_000);
        let expected = "\
RUN                            STATE            AGE  LLM   TOKENS      COST  COMMAND
run_01m7yg8vmfwnsqddwp8gr8ey2p waiting:human     2m    5      435   $0.0123  python3 agent.py
run_01m7yg8vmfwnsqddwp8gr8ey2p succeeded         2m    5      435   $0.0123  python3 agent.py
";
        assert_eq!(table, expected);
        assert!(runs_table(&[], 0).contains("keel run"), "an empty table says how to start");
    }

    fn with_reason(mut view: RunView, id: &str, reason: Option<&str>) -> RunView {
        view.run_id = id.into();
        view.reason = reason.map(str::to_owned);
        view
    }

    #[test]
    fn ps_table_says_under_a_run_what_it_waits_for() {
        let llm = "llm queue: openai/gpt-4o, 3 of 12 waiting for 14s (requests limit)";
        let runs = [
            with_reason(run("running", None), "run_01m7yg8vmfwnsqddwp8gr8ey2a", Some(llm)),
            with_reason(
                run("queued", None),
                "run_01m7yg8vmfwnsqddwp8gr8ey2b",
                Some("queued: 1 of 2 waiting"),
            ),
            run("succeeded", None),
        ];
        let expected = "\
RUN                            STATE            AGE  LLM   TOKENS      COST  COMMAND
run_01m7yg8vmfwnsqddwp8gr8ey2a running           2m    5      435   $0.0123  python3 agent.py
  ↳ llm queue: openai/gpt-4o, 3 of 12 waiting for 14s (requests limit)
run_01m7yg8vmfwnsqddwp8gr8ey2b queued            2m    5      435   $0.0123  python3 agent.py
  ↳ queued: 1 of 2 waiting
run_01m7yg8vmfwnsqddwp8gr8ey2p succeeded         2m    5      435   $0.0123  python3 agent.py
";
        assert_eq!(runs_table(&runs, 125_000), expected);
    }

    #[test]
    fn ps_tree_puts_children_under_parents_and_reasons_under_runs() {
        let parent = with_reason(run("waiting", Some("proc")), "run_01m7yg8vmfwnsqddwp8gr8ey2a", None);
        let mut child = with_reason(
            run("running", None),
            "run_01m7yg8vmfwnsqddwp8gr8ey2b",
            Some("llm queue: openai/m, 2 of 2 waiting for 1m00s (requests limit)"),
        );
        child.parent = Some(parent.run_id.clone());
        child.created_at = 2_000;
        let tree = runs_tree(&[child, parent], 125_000);
        let expected = "\
RUN                                      STATE            AGE  LLM   TOKENS  COMMAND
run_01m7yg8vmfwnsqddwp8gr8ey2a           waiting:proc      2m    5      435  python3 agent.py
└─ run_01m7yg8vmfwnsqddwp8gr8ey2b        running           2m    5      435  python3 agent.py
     ↳ llm queue: openai/m, 2 of 2 waiting for 1m00s (requests limit)
";
        assert_eq!(tree, expected);
    }

    #[test]
    fn events_read_as_one_line_each() {
        let event = |kind: &str, data: Value| EventView { seq: 1, ts: 0, kind: kind.into(), data };
        let id = "run_x";
        assert_eq!(
            describe_event(&event("syscall", json!({"seq": 4, "method": "llm.chat", "status": "ok", "input_tokens": 41, "output_tokens": 27, "duration_ms": 3})), id).unwrap(),
            "#4 llm.chat · 41 in / 27 out tokens · 3 ms · journaled"
        );
        assert_eq!(
            describe_event(
                &event(
                    "syscall",
                    json!({"seq": 5, "method": "tool.call", "tool": "echo", "status": "ok", "replayed": true})
                ),
                id
            )
            .unwrap(),
            "#5 tool.call echo · replayed from the journal"
        );
        assert_eq!(
            describe_event(&event("state", json!({"state": "waiting", "wait_reason": "human"})), id).unwrap(),
            "state → waiting (human)"
        );
        assert_eq!(
            describe_event(&event("question", json!({"question": "ok?"})), id).unwrap(),
            "waiting for a human: ok?  → keel answer run_x --text \"...\""
        );
        assert!(describe_event(&event("state", json!({"state": "queued"})), id).is_none());
    }

    #[test]
    fn ui_blocks_and_form_questions_get_a_line_each() {
        let id = "run_x";
        let form = json!({"type": "object", "properties": {"amount": {}, "ok": {}}, "required": ["ok"]});
        let line = |kind: &str, data: Value| {
            describe_event(&EventView { seq: 1, ts: 0, kind: kind.into(), data }, id).unwrap()
        };
        assert_eq!(
            line("question", json!({"question": "ok?", "form": form})),
            "waiting for a human: ok?  (fields amount, ok*)  → keel answer run_x --json '{...}'"
        );
        let block = |block: Value| line("ui", json!({"seq": 1, "block": block}));
        assert_eq!(
            block(json!({"type": "table", "title": "T", "columns": ["a"], "rows": [[1], [2]]})),
            "ui table T: 1 columns, 2 rows"
        );
        assert_eq!(
            block(
                json!({"type": "chart", "kind": "bar", "labels": ["x"], "series": [{"name": "s", "values": [1]}]})
            ),
            "ui bar chart: 1 series over 1 labels"
        );
        assert_eq!(block(json!({"type": "markdown", "text": "# hi"})), "ui markdown: # hi");
        assert_eq!(block(json!({"type": "progress", "value": 0.25, "label": "q"})), "ui progress 25% q");
        assert_eq!(
            block(json!({"type": "form", "id": "f", "schema": form})),
            "ui form f (fields amount, ok*): submit with keel send run_x --json '{\"ui_form\": \"f\", \"value\": {...}}'"
        );
    }

    #[test]
    fn ages_are_short() {
        assert_eq!([age(0), age(61_000), age(7_200_000), age(200_000_000)], ["0s", "1m", "2h", "2d"]);
    }
}
