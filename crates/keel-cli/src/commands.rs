//! One function per subcommand. Each parses its arguments into an API request, calls the
//! kernel through [`Client`], and renders the answer (text for people, `--json` for
//! scripts).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use keel_kernel::DataDir;
use keel_protocol::api::{CreateRunParams, EventView};

use crate::client::{self, Client};
use crate::render;

pub struct Context {
    pub data_dir: DataDir,
    pub addr: Option<String>,
}

impl Context {
    /// The daemon if one runs, else a kernel embedded in this process.
    async fn client(&self) -> Result<Client> {
        Client::find_or_embed(&self.data_dir, self.addr.as_deref()).await
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address for the HTTP API.
    #[arg(long, default_value = "127.0.0.1:7777", value_name = "HOST:PORT")]
    listen: String,
    /// The scripted LLM provider's script for runs that bring none.
    #[arg(long, env = "KEEL_LLM_SCRIPT", value_name = "FILE")]
    llm_script: Option<PathBuf>,
}

pub async fn serve(ctx: Context, args: ServeArgs) -> Result<ExitCode> {
    let token = client::api_token(&ctx.data_dir)?;
    let default_script = args.llm_script.as_ref().map(read_script).transpose()?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}; pick another with --listen HOST:PORT", args.listen))?;
    let kernel = client::start_kernel(ctx.data_dir.clone(), true, default_script).await?;
    let addr = listener.local_addr()?;
    client::write_info(&ctx.data_dir, &addr.to_string(), "daemon")?;
    eprintln!(
        "keel: kernel serving http://{addr} (data: {}, sandbox: {}, syscall socket: {})",
        ctx.data_dir.root().display(),
        kernel.sandbox_tier(),
        ctx.data_dir.syscall_socket().display()
    );
    let router = keel_server::router(kernel.clone(), token);
    let shutdown = async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    };
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await.context("serving the HTTP API")?;
    eprintln!("keel: shutting down; live runs will be recovered by the next `keel serve`");
    kernel.shutdown().await;
    let _ = std::fs::remove_file(ctx.data_dir.kernel_info());
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The scripted LLM provider's script: replies served to llm.chat, offline.
    #[arg(long, env = "KEEL_LLM_SCRIPT", value_name = "FILE")]
    llm_script: Option<PathBuf>,
    /// Extra environment for the agent: NAME=VALUE, or NAME to pass this shell's value.
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// Return at once and print the run id (needs a running `keel serve`).
    #[arg(long)]
    detach: bool,
    /// Machine-readable output: with --detach {"run_id":...}; otherwise one JSON event per line.
    #[arg(long)]
    json: bool,
    /// Only the agent's own output, no kernel lines.
    #[arg(long, short)]
    quiet: bool,
    /// Seconds between SIGTERM and SIGKILL when the run is stopped.
    #[arg(long, value_name = "SECS")]
    grace: Option<u64>,
    /// The agent's command, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_env(items: &[String]) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for item in items {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => {
                let value = std::env::var(item).with_context(|| {
                    format!("--env {item}: no such variable in this shell; use --env {item}=VALUE")
                })?;
                (item.clone(), value)
            }
        };
        if name.is_empty() {
            bail!("--env {item:?}: the variable name is empty");
        }
        env.insert(name, value);
    }
    Ok(env)
}

fn read_script(path: &PathBuf) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--llm-script {}: cannot read the file", path.display()))?;
    keel_llm::ScriptedProvider::from_text(&text)
        .with_context(|| format!("--llm-script {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("--llm-script {}", path.display()))
}

pub async fn run(ctx: Context, args: RunArgs) -> Result<ExitCode> {
    let llm_script = args.llm_script.as_ref().map(read_script).transpose()?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let params = CreateRunParams {
        command: args.command.clone(),
        cwd: Some(cwd.display().to_string()),
        env: parse_env(&args.env)?,
        llm_script,
        tenant: None,
        stop_grace_secs: args.grace,
    };
    let client = if args.detach {
        match Client::find(&ctx.data_dir, ctx.addr.as_deref()).await? {
            Some(client) => client,
            None => bail!(
                "--detach needs a running kernel, and none runs for {}: start one with `keel serve` (or drop --detach)",
                ctx.data_dir.root().display()
            ),
        }
    } else {
        ctx.client().await?
    };
    let started = Instant::now();
    let view = client.create_run(&params).await?;
    let run_id = view.run_id.clone();
    if args.detach {
        if args.json {
            println!("{}", serde_json::json!({ "run_id": run_id }));
        } else {
            println!("{run_id}");
        }
        client.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.quiet && !args.json {
        let mode = if client.is_embedded() { "embedded kernel" } else { "daemon" };
        render::kernel_line(&format!(
            "run {run_id} started ({mode}); `keel inspect {run_id}` shows its journal"
        ));
    }
    let follow = client.follow(&run_id, 0, |event| print_event(event, &run_id, args.json, args.quiet));
    let interrupted = tokio::select! {
        result = follow => { result?; false }
        _ = tokio::signal::ctrl_c() => true,
    };
    if interrupted {
        render::kernel_line(&format!("stopping run {run_id} (Ctrl-C again to leave it)"));
        client.stop(&run_id, None).await?;
        let follow = client.follow(&run_id, 0, |_| {});
        tokio::select! {
            result = follow => result?,
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    let view = client.inspect(&run_id).await?.run;
    if !args.quiet && !args.json {
        render::kernel_line(&render::summary(&view, started.elapsed()));
    }
    client.close().await;
    Ok(match view.state.as_str() {
        "succeeded" => ExitCode::SUCCESS,
        "cancelled" => ExitCode::from(130),
        _ => {
            ExitCode::from(view.exit_code.and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0).unwrap_or(1))
        }
    })
}

fn print_event(event: &EventView, run_id: &str, json: bool, quiet: bool) {
    if json {
        if let Ok(line) = serde_json::to_string(event) {
            println!("{line}");
        }
        return;
    }
    match event.kind.as_str() {
        "stdout" => {
            let line = event.data.get("line").and_then(|l| l.as_str()).unwrap_or_default();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        "stderr" => {
            let line = event.data.get("line").and_then(|l| l.as_str()).unwrap_or_default();
            eprintln!("{line}");
        }
        _ if quiet => {}
        _ => {
            if let Some(text) = render::describe_event(event, run_id) {
                render::kernel_line(&text);
            }
        }
    }
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Only runs in these states (comma-separated), e.g. running,waiting.
    #[arg(long, value_name = "STATES")]
    state: Option<String>,
    /// At most this many runs, newest first.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print a JSON array of runs.
    #[arg(long)]
    json: bool,
}

pub async fn ps(ctx: Context, args: PsArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let runs = client.list_runs(args.state.as_deref(), Some(args.limit)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    } else {
        print!("{}", render::runs_table(&runs, render::now_ms()));
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// Keep following until the run ends.
    #[arg(long, short)]
    follow: bool,
    /// One JSON event per line.
    #[arg(long)]
    json: bool,
}

pub async fn logs(ctx: Context, args: LogsArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    if args.follow {
        client.follow(&args.run, 0, |event| print_event(event, &args.run, args.json, false)).await?;
    } else {
        let mut after = 0;
        loop {
            let page = client.events(&args.run, after).await?;
            let Some(last) = page.events.last() else { break };
            after = last.seq;
            for event in &page.events {
                print_event(event, &args.run, args.json, false);
            }
        }
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// Print the run and its journal as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn inspect(ctx: Context, args: InspectArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let view = client.inspect(&args.run).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", render::inspect(&view, render::now_ms()));
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The one-line answer of the control commands: `RUN STATE`, or the run as JSON.
fn print_run(view: &keel_protocol::api::RunView, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(view)?);
    } else {
        println!("{} {}", view.run_id, view.state);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct RunRef {
    /// The run id (see `keel ps`).
    run: String,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    json: bool,
}

pub async fn control(ctx: Context, args: RunRef, action: &str) -> Result<ExitCode> {
    let client = ctx.client().await?;
    if action == "resume" && client.is_embedded() {
        client.close().await;
        bail!(
            "resuming needs a running kernel to host the run: start `keel serve`, then `keel resume {}`",
            args.run
        );
    }
    let view = client.action(&args.run, action).await?;
    print_run(&view, args.json)?;
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// Seconds between SIGTERM and SIGKILL (default: the run's, else 5).
    #[arg(long, value_name = "SECS")]
    grace: Option<u64>,
    /// Return at once instead of waiting for the run to end.
    #[arg(long)]
    no_wait: bool,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    json: bool,
}

pub async fn stop(ctx: Context, args: StopArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let mut view = client.stop(&args.run, args.grace).await?;
    if !args.no_wait {
        let deadline = Instant::now() + Duration::from_secs(args.grace.unwrap_or(5) + 30);
        while !client::is_terminal_state(&view.state) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            view = client.inspect(&args.run).await?.run;
        }
    }
    print_run(&view, args.json)?;
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// The answer.
    #[arg(long)]
    text: String,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    json: bool,
}

pub async fn answer(ctx: Context, args: AnswerArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let view = client.answer(&args.run, &args.text).await?;
    print_run(&view, args.json)?;
    client.close().await;
    Ok(ExitCode::SUCCESS)
}
