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
use keel_protocol::api::{AnswerParams, CreateRunParams, EventView};
use keel_protocol::{EventKind, EventKinds};

use crate::client::{self, Client};
use crate::render;

pub struct Context {
    pub data_dir: DataDir,
    pub addr: Option<String>,
}

impl Context {
    /// The daemon if one runs, else a kernel embedded in this process.
    pub(crate) async fn client(&self) -> Result<Client> {
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
    /// Default isolation of runs: `process` (Linux namespaces, Landlock, seccomp, limits)
    /// or `none` (plain child processes; only for trusted code).
    #[arg(long, default_value = "process", value_name = "TIER", value_parser = ["process", "none"])]
    sandbox: String,
    /// Ready-built sandboxes kept per recently used configuration, so starting a run
    /// only hands over the job (0: build each sandbox when its run starts).
    #[arg(long, default_value_t = 2, value_name = "N")]
    sandbox_pool: usize,
    /// Stop the agent process of a run that has waited this many seconds for something
    /// durable (an answer, a message, a child, an approval, a timer); it is relaunched by
    /// replay when the wait ends (0: never).
    #[arg(long, env = "KEEL_SWAP_AFTER_SECS", default_value_t = 60.0, value_name = "SECS")]
    swap_after: f64,
    /// Where the kernel keeps its state: `postgres://USER@HOST/DB` (shared by every node
    /// serving it) or `sqlite:PATH`. Default: keel.toml's `[store] url`, else the data
    /// directory's SQLite file.
    #[arg(long, env = "KEEL_STORE_URL", value_name = "URL")]
    store: Option<String>,
    /// This node's id among the nodes sharing a Postgres store (default: the host name
    /// and a digest of the data directory, the same at every restart).
    #[arg(long, env = "KEEL_NODE_ID", value_name = "ID")]
    node_id: Option<String>,
    /// The address other nodes reach this node's API at (default: --listen, when it names
    /// a specific address).
    #[arg(long, env = "KEEL_ADVERTISE", value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Seconds a node's heartbeat lasts: after this long without one, the other nodes
    /// take its runs over (renewed every third of it).
    #[arg(long, default_value_t = 10.0, value_name = "SECS", value_parser = parse_lease_ttl)]
    lease_ttl: f64,
    /// The most connections this node opens to a Postgres store (several nodes on one
    /// server share its `max_connections`).
    #[arg(long, env = "KEEL_STORE_POOL", default_value_t = keel_store::postgres::DEFAULT_POOL_SIZE as u64, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=1000))]
    store_pool: u64,
    /// On SIGTERM or `keel drain`, seconds to let LLM and tool calls in flight finish
    /// before the node's runs are handed to the other nodes.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    drain_grace: f64,
    /// The most runs live on this node at once (keel.toml's `[scheduler]
    /// max_live_per_node`). Among several nodes, a run beyond it waits in `queued` for a
    /// node with room; `[scheduler]`'s other caps count every node's runs.
    #[arg(long, env = "KEEL_MAX_LIVE", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_live: Option<u32>,
    /// Also serve `GET /metrics` (Prometheus) on this address without a token, e.g. a
    /// private interface a Prometheus server scrapes. The API's listener keeps serving it
    /// behind the operator's token either way.
    #[arg(long, env = "KEEL_METRICS_LISTEN", value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    metrics_listen: Option<std::net::SocketAddr>,
}

/// `--metrics-listen`: an address with a port (a host name resolves to its first address).
fn parse_listen_addr(text: &str) -> std::result::Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let help = "give HOST:PORT, e.g. 127.0.0.1:9464 (or [::1]:9464)";
    if text.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
        return Err(format!("{text:?} is not HOST:PORT with a port number; {help}"));
    }
    let mut addrs = text.to_socket_addrs().map_err(|e| format!("{text:?} does not resolve ({e}); {help}"))?;
    addrs.next().ok_or_else(|| format!("{text:?} resolves to no address; {help}"))
}

/// `--lease-ttl`: between 1 and 600 seconds.
fn parse_lease_ttl(text: &str) -> std::result::Result<f64, String> {
    let secs: f64 = text.parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(1.0..=600.0).contains(&secs) {
        return Err(format!(
            "{secs} s is outside 1..600: under a second, a busy database would see live nodes as dead; \
             over ten minutes, a dead node's runs wait that long"
        ));
    }
    Ok(secs)
}

pub async fn serve(ctx: Context, args: ServeArgs) -> Result<ExitCode> {
    let token = client::admin_token(&ctx.data_dir)?;
    let default_script = args.llm_script.as_ref().map(read_script).transpose()?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}; pick another with --listen HOST:PORT", args.listen))?;
    let sandbox = crate::doctor::sandbox_backend(&args.sandbox, args.sandbox_pool);
    let swap_after = (args.swap_after > 0.0).then(|| Duration::from_secs_f64(args.swap_after));
    let addr = listener.local_addr()?;
    let metrics_listener = match args.metrics_listen {
        Some(metrics_addr) => Some(tokio::net::TcpListener::bind(metrics_addr).await.with_context(|| {
            format!(
                "cannot listen on {metrics_addr} for metrics; pick another with --metrics-listen HOST:PORT"
            )
        })?),
        None => None,
    };
    let store = crate::store_url::StoreChoice {
        url: args.store.clone(),
        node_id: args.node_id.clone(),
        advertise: args.advertise.clone(),
        lease_ttl: Duration::from_secs_f64(args.lease_ttl),
        pool_size: args.store_pool as usize,
    };
    let kernel = client::start_kernel(
        ctx.data_dir.clone(),
        client::KernelStart {
            serving: true,
            default_llm_script: default_script,
            sandbox,
            swap_after,
            store,
            api_addr: Some(addr),
            max_live: args.max_live,
        },
    )
    .await?;
    client::write_info(&ctx.data_dir, &addr.to_string(), "daemon")?;
    eprintln!(
        "keel: kernel serving http://{addr} (data: {}, sandbox: {}, syscall socket: {})",
        ctx.data_dir.root().display(),
        kernel.sandbox_tier(),
        ctx.data_dir.syscall_socket().display()
    );
    if let Some(node) = kernel.node_id() {
        eprintln!(
            "keel: node {node} of the cluster on {}",
            args.store
                .as_deref()
                .map_or("keel.toml's [store] url".to_owned(), keel_store::postgres::redact_url)
        );
    }
    if let Some(metrics_listener) = metrics_listener {
        let metrics_addr = metrics_listener.local_addr()?;
        eprintln!("keel: metrics (Prometheus, no token) at http://{metrics_addr}/metrics");
        let router = keel_server::metrics_router(kernel.clone());
        tokio::spawn(async move {
            if let Err(err) = client::serve(metrics_listener, router).await {
                tracing::error!("the metrics listener stopped: {err}");
            }
        });
    }
    let router = keel_server::router(kernel.clone(), token);
    let drain_grace = Duration::from_secs_f64(args.drain_grace.max(0.0));
    let draining = kernel.clone();
    let shutdown = async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {}, () = draining.drain_requested() => {} }
        // A node of a cluster hands its runs over while its API still answers (requests
        // for its runs are forwarded here until the others hold them).
        if draining.node_id().is_some() {
            let runs = draining.drain(drain_grace).await;
            eprintln!("keel: drained; handing {runs} run(s) to the other nodes");
        }
    };
    client::serve(client::no_delay(listener), router)
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving the HTTP API")?;
    if kernel.node_id().is_none() {
        eprintln!("keel: shutting down; live runs will be recovered by the next `keel serve`");
    }
    kernel.shutdown().await;
    let _ = std::fs::remove_file(ctx.data_dir.kernel_info());
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    options: RunOptions,
    /// Return at once and print the run id (needs a running `keel serve`).
    #[arg(long)]
    detach: bool,
    /// Machine-readable output: with --detach {"run_id":...}; otherwise one JSON event per line.
    #[arg(long)]
    json: bool,
    /// Only the agent's own output, no kernel lines.
    #[arg(long, short)]
    quiet: bool,
}

/// How a run runs: `keel run`'s options, which `keel schedule create` takes too.
#[derive(Debug, Args)]
pub struct RunOptions {
    /// The scripted LLM provider's script: replies served to llm.chat, offline.
    #[arg(long, env = "KEEL_LLM_SCRIPT", value_name = "FILE")]
    llm_script: Option<PathBuf>,
    /// Extra environment for the agent: NAME=VALUE, or NAME to pass this shell's value.
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// Seconds between SIGTERM and SIGKILL when the run is stopped.
    #[arg(long, value_name = "SECS")]
    grace: Option<u64>,
    /// The model for LLM calls that name none, e.g. openai/gpt-4o-mini.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// A model to fall back to when a call's model fails for good (repeatable, in order).
    #[arg(long = "fallback-model", value_name = "MODEL")]
    fallback_models: Vec<String>,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Park the run when it sends the same LLM request this many times in a row (0: off).
    #[arg(long, value_name = "N")]
    loop_threshold: Option<u32>,
    /// Tools the run may call, by pattern (repeatable): `echo`, `fs.*`, `mcp:github/*`,
    /// `*`. Default: the built-in tools (echo, kv.*, fs.*, http.fetch).
    #[arg(long = "grant", value_name = "PATTERN")]
    grant: Vec<String>,
    /// Input for the agent, as JSON (it reads KEEL_INPUT, or keel.input() in Python).
    #[arg(long, value_name = "JSON")]
    input: Option<String>,
    /// The run's priority class.
    #[arg(long, value_name = "CLASS", value_parser = ["high", "normal", "low"])]
    priority: Option<String>,
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

/// The run `options` describe, in this directory.
pub(crate) fn run_params(args: &RunOptions) -> Result<CreateRunParams> {
    let llm_script = args.llm_script.as_ref().map(read_script).transpose()?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    Ok(CreateRunParams {
        command: args.command.clone(),
        cwd: Some(cwd.display().to_string()),
        env: parse_env(&args.env)?,
        llm_script,
        tenant: None,
        stop_grace_secs: args.grace,
        model: args.model.clone(),
        fallback_models: args.fallback_models.clone(),
        budget: args.budget.to_params()?,
        loop_threshold: args.loop_threshold,
        sandbox: args.sandbox.to_params(&cwd)?,
        grant: (!args.grant.is_empty()).then(|| args.grant.clone()),
        priority: args.priority.clone(),
        input: args
            .input
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .context("--input must be JSON, e.g. --input '{\"topic\":\"cats\"}'")?,
    })
}

pub async fn run(ctx: Context, args: RunArgs) -> Result<ExitCode> {
    let params = run_params(&args.options)?;
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
    if params.llm_script.is_none() && !args.quiet && client.health().await?.llm_providers.is_empty() {
        render::kernel_line(&format!("note: {}", keel_llm::router::NO_PROVIDER_HELP));
    }
    let started = Instant::now();
    let view = client.create_run(&params).await?;
    let run_id = view.run_id.clone();
    if args.detach {
        if args.json {
            crate::outln!("{}", serde_json::json!({ "run_id": run_id }))?;
        } else {
            crate::outln!("{run_id}")?;
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
    // Quiet, only the agent's output is shown: the kernel need not send the rest.
    let kinds = if args.quiet && !args.json {
        EventKinds::of(&[EventKind::Stdout, EventKind::Stderr, EventKind::State])
    } else {
        EventKinds::ALL
    };
    let follow = client.follow(&run_id, 0, kinds, |event| print_event(event, &run_id, args.json, args.quiet));
    let interrupted = tokio::select! {
        result = follow => { result?; false }
        _ = tokio::signal::ctrl_c() => true,
    };
    if interrupted {
        render::kernel_line(&format!("stopping run {run_id} (Ctrl-C again to leave it)"));
        client.stop(&run_id, None).await?;
        let follow = client.follow(&run_id, 0, EventKinds::of(&[EventKind::State]), |_| Ok(()));
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

/// Prints one event of a followed run. Fails only when stdout fails (a closed pipe ends
/// the command quietly, see `out`); a closed stderr loses the line.
fn print_event(event: &EventView, run_id: &str, json: bool, quiet: bool) -> Result<()> {
    if json {
        if let Ok(line) = serde_json::to_string(event) {
            crate::outln!("{line}")?;
        }
        return Ok(());
    }
    match event.kind.as_str() {
        "stdout" => {
            let line = event.data.get("line").and_then(|l| l.as_str()).unwrap_or_default();
            crate::outln!("{line}")?;
        }
        "stderr" => {
            let line = event.data.get("line").and_then(|l| l.as_str()).unwrap_or_default();
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        _ if quiet => {}
        _ => {
            if let Some(text) = render::describe_event(event, run_id) {
                render::kernel_line(&text);
            }
        }
    }
    Ok(())
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
    /// Show runs as trees: each child (proc.spawn, agents called as tools) under its parent.
    #[arg(long)]
    tree: bool,
}

pub async fn ps(ctx: Context, args: PsArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let runs = client.list_runs(args.state.as_deref(), Some(args.limit)).await?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&runs)?)?;
    } else if args.tree {
        crate::out!("{}", render::runs_tree(&runs, render::now_ms()))?;
    } else {
        crate::out!("{}", render::runs_table(&runs, render::now_ms()))?;
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
        client
            .follow(&args.run, 0, EventKinds::ALL, |event| print_event(event, &args.run, args.json, false))
            .await?;
    } else {
        let mut after = 0;
        loop {
            let page = client.events(&args.run, after).await?;
            let Some(last) = page.events.last() else { break };
            after = last.seq;
            for event in &page.events {
                print_event(event, &args.run, args.json, false)?;
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
        crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
    } else {
        crate::out!("{}", render::inspect(&view, render::now_ms()))?;
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The one-line answer of the control commands: `RUN STATE`, or the run as JSON.
fn print_run(view: &keel_protocol::api::RunView, json: bool) -> Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(view)?)?;
    } else {
        crate::outln!("{} {}", view.run_id, view.state)?;
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
#[command(group(clap::ArgGroup::new("answer").required(true).args(["text", "value"])))]
pub struct AnswerArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// The answer, as text (a plain question).
    #[arg(long)]
    text: Option<String>,
    /// The answer to a question with a form, as JSON matching its schema (`keel inspect`
    /// shows it); `@FILE` reads it from a file, `-` from stdin.
    #[arg(long = "json", value_name = "JSON", id = "value")]
    value: Option<String>,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    print_json: bool,
}

pub async fn answer(ctx: Context, args: AnswerArgs) -> Result<ExitCode> {
    let body = match (args.text, args.value) {
        (_, Some(json)) => AnswerParams { text: None, value: Some(answer_json(&json)?) },
        (text, None) => AnswerParams { text, value: None },
    };
    let client = ctx.client().await?;
    let outcome = client.answer(&args.run, &body).await;
    client.close().await;
    print_run(&outcome?, args.print_json)?;
    Ok(ExitCode::SUCCESS)
}

/// `--json`'s value: JSON text, `@FILE`, or `-` for stdin, parsed.
fn answer_json(arg: &str) -> Result<serde_json::Value> {
    let (text, from) = if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("could not read --json from stdin")?;
        (text, "stdin".to_owned())
    } else if let Some(path) = arg.strip_prefix('@') {
        let text = std::fs::read_to_string(path).with_context(|| format!("could not read --json @{path}"))?;
        (text, path.to_owned())
    } else {
        (arg.to_owned(), "--json".to_owned())
    };
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{from} is not JSON; give the form's answer as an object, e.g. --json '{{\"approve\": true}}'"
        )
    })
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// The message, as JSON (any JSON value).
    #[arg(long = "json", value_name = "JSON")]
    message: String,
    /// A correlation id the receiver echoes in its reply (request/reply convention).
    #[arg(long)]
    correlation_id: Option<String>,
    /// When the mailbox is full, wait for room instead of failing with would_block.
    #[arg(long)]
    wait: bool,
}

pub async fn send(ctx: Context, args: SendArgs) -> Result<ExitCode> {
    let message: serde_json::Value = serde_json::from_str(&args.message)
        .with_context(|| format!("--json {:?} is not JSON; quote strings, e.g. '\"hi\"'", args.message))?;
    let client = ctx.client().await?;
    let body =
        keel_protocol::api::MessageParams { message, correlation_id: args.correlation_id, wait: args.wait };
    let outcome = client.send_message(&args.run, &body).await;
    client.close().await;
    let sent = outcome?;
    crate::outln!("sent message {} to {}", sent.seq, args.run)?;
    Ok(ExitCode::SUCCESS)
}

/// Budget limits for a new run. Spend never exceeds them: each call reserves its worst
/// case first, and a call that does not fit parks the run until `keel budget` adds more.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// Most USD the run may spend on LLM calls, e.g. 0.50.
    #[arg(long, value_name = "USD")]
    budget_usd: Option<f64>,
    /// Most input+output tokens.
    #[arg(long, value_name = "N")]
    budget_tokens: Option<u64>,
    /// Most LLM calls.
    #[arg(long, value_name = "N")]
    budget_llm_calls: Option<u64>,
    /// Most tool calls.
    #[arg(long, value_name = "N")]
    budget_tool_calls: Option<u64>,
    /// Most wall-clock time, e.g. 90s, 10m, 2h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    budget_wall: Option<u64>,
}

impl BudgetArgs {
    fn to_params(&self) -> Result<Option<keel_protocol::api::BudgetParams>> {
        let params = keel_protocol::api::BudgetParams {
            usd: self.budget_usd,
            tokens: self.budget_tokens,
            llm_calls: self.budget_llm_calls,
            tool_calls: self.budget_tool_calls,
            wall_secs: self.budget_wall,
        };
        Ok((params != keel_protocol::api::BudgetParams::default()).then_some(params))
    }
}

/// Parses `90`, `90s`, `10m`, `2h` into seconds.
pub fn parse_duration_secs(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 90s, 10m or 2h"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{text:?}: the unit must be s, m or h")),
    };
    value.checked_mul(factor).ok_or_else(|| format!("{text:?} is too long"))
}

#[derive(Debug, Args)]
pub struct BudgetCmdArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// USD to add.
    #[arg(long, value_name = "USD")]
    add_usd: Option<f64>,
    /// Tokens to add.
    #[arg(long, value_name = "N")]
    add_tokens: Option<u64>,
    /// LLM calls to add.
    #[arg(long, value_name = "N")]
    add_llm_calls: Option<u64>,
    /// Tool calls to add.
    #[arg(long, value_name = "N")]
    add_tool_calls: Option<u64>,
    /// Wall-clock time to add, e.g. 10m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    add_wall: Option<u64>,
    /// Let a run parked by the loop detector go on.
    #[arg(long = "continue")]
    continue_loop: bool,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    json: bool,
}

/// `keel budget RUN`: shows the budget, or tops it up.
pub async fn budget(ctx: Context, args: BudgetCmdArgs) -> Result<ExitCode> {
    let add = keel_protocol::api::BudgetParams {
        usd: args.add_usd,
        tokens: args.add_tokens,
        llm_calls: args.add_llm_calls,
        tool_calls: args.add_tool_calls,
        wall_secs: args.add_wall,
    };
    let client = ctx.client().await?;
    let view = if add == keel_protocol::api::BudgetParams::default() && !args.continue_loop {
        client.inspect(&args.run).await?.run
    } else {
        let body = keel_protocol::api::TopUpParams { add, continue_loop: args.continue_loop };
        client.top_up(&args.run, &body).await?
    };
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
    } else {
        crate::out!("{}", render::budget(&view))?;
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The run's sandbox: tier and profile. Every limit is optional: an absent one takes the
/// kernel's default where the host can enforce one; an explicit one the host cannot
/// enforce makes the kernel refuse the run (see `keel doctor`).
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Isolation: `process` (the default) or `none` (no isolation; only for trusted code).
    #[arg(long, value_name = "TIER", value_parser = ["process", "none"])]
    sandbox: Option<String>,
    /// Memory of the whole sandbox, e.g. 512M, 2G.
    #[arg(long, value_name = "SIZE", value_parser = keel_sandbox::profile::parse_size)]
    memory: Option<u64>,
    /// CPU time per process, e.g. 60s, 5m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    cpu_time: Option<u64>,
    /// Wall-clock time before the sandbox is killed, e.g. 10m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    wall: Option<u64>,
    /// Processes and threads in the sandbox.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// Open files per process.
    #[arg(long, value_name = "N")]
    open_files: Option<u64>,
    /// Largest file the agent may write, e.g. 100M.
    #[arg(long, value_name = "SIZE", value_parser = keel_sandbox::profile::parse_size)]
    file_size: Option<u64>,
    /// Size of the scratch space (/tmp, and /workspace without a volume), e.g. 256M.
    #[arg(long, value_name = "SIZE", value_parser = keel_sandbox::profile::parse_size)]
    scratch: Option<u64>,
    /// `none` (loopback only; the default) or `allowlist` (HTTP(S) to --allow-host hosts
    /// through the kernel's egress proxy, every connection audited).
    #[arg(long, value_name = "POLICY", value_parser = ["none", "allowlist"])]
    network: Option<String>,
    /// A host the agent may reach (implies --network allowlist): api.example.com,
    /// *.example.com, optionally :PORT. Repeatable.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// A named volume kept across runs, mounted read-write: NAME:/PATH. Repeatable.
    #[arg(long = "volume", value_name = "NAME:/PATH")]
    volumes: Vec<String>,
    /// An extra host path visible read-only at the same path. Repeatable.
    #[arg(long = "ro-bind", value_name = "PATH")]
    ro_binds: Vec<PathBuf>,
    /// Make the working directory writable (it is read-only by default).
    #[arg(long)]
    writable_cwd: bool,
}

impl SandboxArgs {
    fn to_params(&self, cwd: &std::path::Path) -> Result<Option<keel_protocol::api::SandboxParams>> {
        let volumes = self
            .volumes
            .iter()
            .map(|spec| {
                let Some((name, path)) = spec.split_once(':') else {
                    bail!("--volume {spec:?}: use NAME:/PATH, e.g. --volume work:/workspace");
                };
                Ok(keel_protocol::api::VolumeParams { name: name.to_owned(), path: path.to_owned() })
            })
            .collect::<Result<Vec<_>>>()?;
        let network = match (&self.network, self.allow_hosts.is_empty()) {
            (None, false) => Some("allowlist".to_owned()),
            (network, _) => network.clone(),
        };
        let params = keel_protocol::api::SandboxParams {
            tier: self.sandbox.clone(),
            memory_bytes: self.memory,
            cpu_time_secs: self.cpu_time,
            wall_time_secs: self.wall,
            pids: self.pids,
            open_files: self.open_files,
            file_size_bytes: self.file_size,
            scratch_bytes: self.scratch,
            network,
            allow_hosts: self.allow_hosts.clone(),
            volumes,
            ro_binds: self.ro_binds.iter().map(|p| cwd.join(p).display().to_string()).collect(),
            writable_cwd: self.writable_cwd,
        };
        Ok((params != keel_protocol::api::SandboxParams::default()).then_some(params))
    }
}

#[derive(Debug, Args)]
pub struct MemArgs {
    #[command(subcommand)]
    command: MemCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MemCommand {
    /// Write a record. VALUE is JSON; text that is not JSON is stored as a string.
    Put {
        namespace: String,
        key: String,
        value: String,
        /// What search finds the record by (default: the value itself, or its JSON).
        #[arg(long)]
        text: Option<String>,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a record's value (with --json, the whole record). Fails if there is none.
    Get {
        namespace: String,
        key: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a record.
    Delete {
        namespace: String,
        key: String,
        #[arg(long)]
        json: bool,
    },
    /// Search a namespace, best hits first.
    Search {
        namespace: String,
        query: String,
        /// At most this many hits (1 to 100).
        #[arg(long)]
        limit: Option<u64>,
        /// text (full-text, the default), semantic (embeddings) or hybrid (both, fused).
        #[arg(long, value_parser = ["text", "semantic", "hybrid"])]
        mode: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print a conversation thread, oldest first.
    Thread {
        id: String,
        /// Only the newest N messages.
        #[arg(long)]
        last: Option<u64>,
        /// Only the newest messages that fit in N (estimated) tokens.
        #[arg(long, value_name = "N")]
        max_tokens: Option<u64>,
        #[arg(long)]
        json: bool,
    },
}

pub async fn mem(ctx: Context, args: MemArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let outcome = mem_command(&client, args.command).await;
    client.close().await;
    outcome
}

async fn mem_command(client: &Client, command: MemCommand) -> Result<ExitCode> {
    match command {
        MemCommand::Put { namespace, key, value, text, json } => {
            let value = serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value));
            let body = keel_protocol::api::MemoryPutBody { value, text };
            let record = client.memory_put(&namespace, &key, &body).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&record)?)?;
            } else {
                crate::outln!("stored {namespace}/{key}")?;
            }
        }
        MemCommand::Get { namespace, key, json } => {
            let record = client.memory_get(&namespace, &key).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&record)?)?;
            } else {
                crate::outln!("{}", serde_json::to_string_pretty(&record.value)?)?;
            }
        }
        MemCommand::Delete { namespace, key, json } => {
            let view = client.memory_delete(&namespace, &key).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
            } else if view.deleted {
                crate::outln!("deleted {namespace}/{key}")?;
            } else {
                crate::outln!("no record {namespace}/{key}")?;
            }
        }
        MemCommand::Search { namespace, query, limit, mode, json } => {
            let view = client.memory_search(&namespace, &query, limit, mode.as_deref()).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
            } else if view.hits.is_empty() {
                crate::outln!("no hits")?;
            } else {
                for hit in &view.hits {
                    crate::outln!("{:>8.3}  {}  {}", hit.score, hit.key, hit.snippet.replace('\n', " "))?;
                }
            }
        }
        MemCommand::Thread { id, last, max_tokens, json } => {
            let view = client.thread(&id, last, max_tokens).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
            } else if view.messages.is_empty() {
                crate::outln!("thread {id} is empty")?;
            } else {
                for message in &view.messages {
                    crate::outln!("{:>4} {}: {}", message.index, message.role, message.content)?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// The call's number (its journal seq, shown by `keel ps` and `keel inspect`). May be
    /// left out when exactly one call of the run waits.
    call: Option<u64>,
    /// Why; recorded in the audit log (and, for a denial, told to the agent).
    #[arg(long, alias = "reason", value_name = "TEXT")]
    note: Option<String>,
    /// Print the run as JSON afterwards.
    #[arg(long)]
    json: bool,
}

pub async fn decide(ctx: Context, args: DecideArgs, approve: bool) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let call = match args.call {
        Some(call) => call,
        None => {
            let view = client.inspect(&args.run).await?;
            match view.approvals.as_slice() {
                [one] => one.call,
                [] => bail!("run {} has no tool call waiting for approval", args.run),
                many => bail!(
                    "run {} has {} calls waiting ({}); name one: keel {} {} CALL",
                    args.run,
                    many.len(),
                    many.iter().map(|a| format!("{} ({})", a.call, a.tool)).collect::<Vec<_>>().join(", "),
                    if approve { "approve" } else { "deny" },
                    args.run
                ),
            }
        }
    };
    let view = client.decide(&args.run, call, approve, args.note.clone()).await?;
    if !args.json {
        render::kernel_line(&format!(
            "call {call} of {} {}",
            args.run,
            if approve { "approved" } else { "denied" }
        ));
    }
    print_run(&view, args.json)?;
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct ToolsArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub async fn tools(ctx: Context, args: ToolsArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let tools = client.tools().await?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&tools)?)?;
    } else {
        crate::out!("{}", render::tools(&tools))?;
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The language: python (the monty interpreter), javascript (QuickJS), or cpython
    /// (python3 in the process sandbox, with the standard library).
    #[arg(long, default_value = "python", value_parser = ["python", "py", "javascript", "js", "cpython"])]
    lang: String,
    /// The program, inline.
    #[arg(short = 'e', long = "eval", value_name = "CODE", conflicts_with = "file")]
    code: Option<String>,
    /// The program, from a file (`-` for stdin).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// An input bound as a global variable: NAME=JSON (repeatable).
    #[arg(long = "input", short = 'i', value_name = "NAME=JSON")]
    inputs: Vec<String>,
    /// Tools the program may call, by pattern (repeatable); default: the built-ins.
    #[arg(long = "grant", value_name = "PATTERN")]
    grant: Vec<String>,
    /// Wall-clock limit, milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// The most tool calls the program may make.
    #[arg(long, value_name = "N")]
    max_tool_calls: Option<u32>,
    /// Memory limit of the interpreter, bytes.
    #[arg(long, value_name = "BYTES")]
    memory_bytes: Option<u64>,
    /// A file's text bound as a global string variable: NAME=PATH (repeatable; up to
    /// 64 MiB in all, UTF-8). Stored once by the kernel; the program slices it and calls
    /// `llm()` on the pieces that matter.
    #[arg(long = "input-file", value_name = "NAME=PATH")]
    input_files: Vec<String>,
    /// The most LLM calls the program may make (`llm`, each prompt of `llm_batch`);
    /// default 50.
    #[arg(long, value_name = "N")]
    max_llm_calls: Option<u32>,
    /// The scripted LLM provider's script: replies served to the program's `llm` calls,
    /// offline.
    #[arg(long, env = "KEEL_LLM_SCRIPT", value_name = "FILE")]
    llm_script: Option<PathBuf>,
    /// The model for `llm` calls that name none, e.g. openai/gpt-4o-mini.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Print the whole outcome as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn exec(ctx: Context, args: ExecArgs) -> Result<ExitCode> {
    let code = match (&args.code, &args.file) {
        (Some(code), _) => code.clone(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut code = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut code)
                .context("reading the program from stdin")?;
            code
        }
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the program {}", path.display()))?,
        (None, None) => bail!("give the program with -e CODE or a FILE, e.g. keel exec -e '1 + 1'"),
    };
    let mut inputs = serde_json::Map::new();
    for item in &args.inputs {
        let Some((name, value)) = item.split_once('=') else {
            bail!("--input {item:?}: write NAME=JSON, e.g. --input n=3 or --input 'names=[\"a\"]'");
        };
        let value: serde_json::Value = serde_json::from_str(value)
            .with_context(|| format!("--input {name}: the value must be JSON (quote strings: '\"text\"')"))?;
        inputs.insert(name.to_owned(), value);
    }
    let mut file_bytes = 0u64;
    for item in &args.input_files {
        let (name, text) = read_input_file(item, &mut file_bytes)?;
        if inputs.insert(name.clone(), serde_json::Value::String(text)).is_some() {
            bail!("--input-file {item:?}: input {name:?} is given twice; give each name once");
        }
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let params = keel_protocol::api::ExecParams {
        lang: args.lang.clone(),
        code,
        inputs,
        grant: (!args.grant.is_empty()).then(|| args.grant.clone()),
        tenant: None,
        limits: serde_json::json!({
            "timeout_ms": args.timeout_ms,
            "max_tool_calls": args.max_tool_calls,
            "memory_bytes": args.memory_bytes,
            "max_llm_calls": args.max_llm_calls,
        }),
        sandbox: args.sandbox.to_params(&cwd)?,
        llm_script: args.llm_script.as_ref().map(read_script).transpose()?,
        model: args.model.clone(),
        budget: args.budget.to_params()?,
    };
    let client = ctx.client().await?;
    let outcome = client.exec(&params).await?;
    client.close().await;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&outcome)?)?;
    } else {
        if !outcome.stdout.is_empty() {
            crate::out!("{}", outcome.stdout)?;
            if !outcome.stdout.ends_with('\n') {
                crate::outln!()?;
            }
        }
        match (&outcome.result, &outcome.error) {
            (Some(result), _) if outcome.ok => crate::outln!("{}", serde_json::to_string_pretty(result)?)?,
            (_, Some(error)) => eprintln!(
                "keel: the program failed ({}): {}",
                error.get("kind").and_then(|k| k.as_str()).unwrap_or("error"),
                error.get("message").and_then(|m| m.as_str()).unwrap_or("")
            ),
            _ => crate::outln!("null")?,
        }
        render::kernel_line(&format!(
            "{} tool call(s), {} LLM call(s), {:.2} ms; run {}",
            outcome.tool_calls.len(),
            outcome.llm_calls,
            outcome.duration_us as f64 / 1000.0,
            outcome.run_id
        ));
    }
    Ok(if outcome.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The most text `--input-file` passes in all (the kernel's limit on `POST /v1/exec`).
const MAX_INPUT_FILE_BYTES: u64 = 64 << 20;

/// Reads one `--input-file NAME=PATH`: the name and the file's text. `total` adds up the
/// sizes so far, so the 64 MiB limit is checked before a file is read.
fn read_input_file(item: &str, total: &mut u64) -> Result<(String, String)> {
    let Some((name, path)) = item.split_once('=') else {
        bail!("--input-file {item:?}: write NAME=PATH, e.g. --input-file log=server.log");
    };
    let identifier = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        bail!(
            "--input-file {item:?}: the name {name:?} must be an identifier (letters, digits and _, not \
             starting with a digit): the program sees it as a variable"
        );
    }
    if path.is_empty() {
        bail!("--input-file {item:?}: the path is empty; write NAME=PATH");
    }
    let size =
        std::fs::metadata(path).with_context(|| format!("--input-file {name}: cannot read {path}"))?.len();
    *total += size;
    if *total > MAX_INPUT_FILE_BYTES {
        bail!(
            "--input-file {name}: {path} brings the inputs to {total} bytes, over the limit of \
             {MAX_INPUT_FILE_BYTES} (64 MiB); filter the file first (e.g. grep the lines that matter)"
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("--input-file {name}: cannot read {path}"))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "--input-file {name}: {path} is not UTF-8 text (invalid byte at offset {}); programs get inputs \
             as strings: convert the file (e.g. iconv), or base64-encode it and decode it in the program",
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok((name.to_owned(), text))
}

#[derive(Debug, Args)]
pub struct SignalArgs {
    /// The run id (see `keel ps`).
    run: String,
    /// The signal's name (custom; `keel pause`/`resume`/`stop` control the process).
    signal: String,
    /// Data that goes with it, as JSON.
    #[arg(long = "json", value_name = "JSON")]
    data: Option<String>,
}

pub async fn signal(ctx: Context, args: SignalArgs) -> Result<ExitCode> {
    let data = args
        .data
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .context("--json must be JSON, e.g. --json '{\"reason\":\"deploy\"}'")?;
    let client = ctx.client().await?;
    let body = keel_protocol::api::SignalParams { signal: args.signal.clone(), data };
    let sent = client.signal(&args.run, &body).await?;
    render::kernel_line(&format!("signal {} sent to {} (message {})", args.signal, args.run, sent.seq));
    client.close().await;
    Ok(ExitCode::SUCCESS)
}
