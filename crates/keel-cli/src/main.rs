//! The `keel` command: a thin client of the kernel's HTTP API, plus `serve` (the daemon)
//! and an embedded kernel for `keel run` when no daemon is running.

// Stdout is written through `out!`/`outln!` only, so a closed pipe ends a command quietly
// instead of panicking (see `out`).
#![deny(clippy::print_stdout)]

/// jemalloc, not glibc's malloc, in every process this binary runs as (the daemon, the
/// sandbox zygote and inits, the interpreter workers). With 64 gateway calls in flight
/// glibc's allocator was a fifth of the runtime thread's CPU (its slow paths, and frees of
/// memory another thread allocated, which take that arena's lock); with jemalloc the
/// daemon serves 16-27% more calls a second (BENCHMARKS.md, "jemalloc as the
/// allocator"). Its free pages go back to the system when runs park (`purge_jemalloc`).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod audit;
mod client;
mod commands;
mod doctor;
mod event;
mod hook;
mod migrate;
mod nodes;
mod out;
mod render;
mod schedule;
mod store_url;
mod tenant;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "keel",
    version,
    about = "Keel, the agent kernel: runs agents as sandboxed, journaled, resumable processes.",
    after_help = "Start here:\n  keel run --llm-script examples/quickstart/script.json -- python3 examples/quickstart/agent.py\n  keel ps\n  keel inspect RUN"
)]
struct Cli {
    /// Where Keel keeps its database and sockets [default: $XDG_DATA_HOME/keel or ~/.local/share/keel]
    #[arg(long, global = true, env = "KEEL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// Address of a running kernel's HTTP API (default: found through the data dir)
    #[arg(long, global = true, env = "KEEL_ADDR", value_name = "HOST:PORT")]
    addr: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the kernel as a daemon (HTTP API + syscall socket); recovers interrupted runs.
    #[command(after_help = "Example:\n  keel serve --listen 127.0.0.1:7777")]
    Serve(commands::ServeArgs),
    /// Start an agent and follow it (or --detach).
    #[command(
        after_help = "Examples:\n  keel run --llm-script examples/quickstart/script.json -- python3 examples/quickstart/agent.py\n  keel run --detach --json -- python3 agent.py"
    )]
    Run(Box<commands::RunArgs>),
    /// List runs with their state, age, LLM calls, tokens and cost.
    #[command(after_help = "Examples:\n  keel ps\n  keel ps --state running,waiting --json")]
    Ps(commands::PsArgs),
    /// Print a run's events and its agent's stdout/stderr.
    #[command(after_help = "Example:\n  keel logs run_01jd... -f")]
    Logs(commands::LogsArgs),
    /// Show a run: state, usage, output, and its journal (every syscall).
    #[command(after_help = "Example:\n  keel inspect run_01jd... --json")]
    Inspect(commands::InspectArgs),
    /// Freeze a run's processes.
    #[command(after_help = "Example:\n  keel pause run_01jd...")]
    Pause(commands::RunRef),
    /// Continue a paused run.
    #[command(after_help = "Example:\n  keel resume run_01jd...")]
    Resume(commands::RunRef),
    /// Stop a run: SIGTERM to its whole process tree, SIGKILL after the grace period.
    #[command(after_help = "Example:\n  keel stop run_01jd... --grace 2")]
    Stop(commands::StopArgs),
    /// Show a run's budget, or add to it (a parked run continues at once).
    #[command(
        after_help = "Examples:\n  keel budget run_01jd...\n  keel budget run_01jd... --add-usd 1.00\n  keel budget run_01jd... --continue"
    )]
    Budget(commands::BudgetCmdArgs),
    /// Check what this host can enforce: sandbox controls, and each profile's limits.
    #[command(after_help = "Examples:\n  keel doctor\n  keel doctor --json")]
    Doctor(doctor::DoctorArgs),
    /// Answer a run's open question (human.ask).
    #[command(after_help = "Example:\n  keel answer run_01jd... --text \"yes, go ahead\"")]
    Answer(commands::AnswerArgs),
    /// Long-term memory and conversation threads (the token's tenant; `default` for the
    /// operator).
    #[command(
        after_help = "Examples:\n  keel mem put notes cat '{\"name\":\"Tom\"}' --text \"the cat is called Tom\"\n  keel mem get notes cat\n  keel mem search notes \"cat name\"\n  keel mem delete notes cat\n  keel mem thread chat-42 --last 10"
    )]
    Mem(commands::MemArgs),
    /// Approve a tool call parked for approval (the run continues with the call).
    #[command(
        after_help = "Examples:\n  keel approve run_01jd... 7\n  keel approve run_01jd... --note \"checked the path\""
    )]
    Approve(commands::DecideArgs),
    /// Deny a tool call parked for approval (the agent gets a `denied` error).
    #[command(after_help = "Example:\n  keel deny run_01jd... 7 --note \"not in production\"")]
    Deny(commands::DecideArgs),
    /// List the tools the kernel knows: built-ins, keel.toml's command and agent tools,
    /// and the tools of mounted MCP servers, with their policies.
    #[command(after_help = "Examples:\n  keel tools\n  keel tools --json")]
    Tools(commands::ToolsArgs),
    /// Run a program whose tool calls go through Keel's governed dispatch; tools are
    /// functions (`fs.read(path="a.txt")` in Python, `fs.read({path: "a.txt"})` in JS).
    #[command(
        after_help = "Examples:\n  keel exec -e 'sum(len(echo(i=i)) for i in range(10))'\n  keel exec --lang javascript -e 'kv.put({key: \"a\", value: 1}); kv.get({key: \"a\"})'\n  keel exec --lang cpython --grant 'kv.*' script.py --input n=3\n  keel exec --input-file log=app.log --llm-script replies.json -e 'llm(\"Summarise:\\n\" + log[:4000])'"
    )]
    Exec(Box<commands::ExecArgs>),
    /// Put a message in a run's mailbox (the run reads it with ipc.recv; from is null).
    #[command(
        after_help = "Examples:\n  keel send run_01jd... --json '{\"task\":\"summarise\"}'\n  keel send run_01jd... --json '\"hi\"' --correlation-id req-1 --wait"
    )]
    Send(commands::SendArgs),
    /// Send a run a named signal: an event it receives with ipc.recv (topic "signal").
    #[command(
        after_help = "Examples:\n  keel signal run_01jd... reload\n  keel signal run_01jd... checkpoint-now --json '{\"why\":\"deploy\"}'"
    )]
    Signal(commands::SignalArgs),
    /// The audit log: a run's entries, verification of the hash chain, export as JSONL.
    /// `keel audit verify` exits 0 when the log is intact, 3 when it was tampered with.
    #[command(
        after_help = "Examples:\n  keel audit run_01jd...\n  keel audit run_01jd... --json\n  keel audit verify\n  keel audit export --run run_01jd... -o audit.jsonl\n\nExit codes of `keel audit verify`: 0 intact, 3 tampered with, 1 could not check."
    )]
    Audit(audit::AuditArgs),
    /// Tenants and their API tokens: a tenant's token sees and controls only its own
    /// runs, memory, mailboxes and audit entries.
    #[command(
        after_help = "Examples:\n  keel tenant create acme --max-runs 10 --max-usd-per-run 0.50\n  keel tenant token acme --label ci\n  KEEL_API_TOKEN=kt_... keel ps\n  keel tenant list\n  keel tenant revoke acme kt_3f9a1c0d"
    )]
    Tenant(tenant::TenantArgs),
    /// Runs started on a cron schedule (with time zones, DST, catch-up, overlap and jitter),
    /// fired by `keel serve` exactly once per tick.
    #[command(
        after_help = "Examples:\n  keel schedule create report --cron '0 9 * * MON-FRI' --tz Europe/Paris -- python3 report.py\n  keel schedule list\n  keel schedule show report\n  keel schedule pause report\n  keel schedule run-now report"
    )]
    Schedule(schedule::ScheduleArgs),
    /// Runs started by signed webhook deliveries to `POST /v1/hooks/NAME` (GitHub, Stripe
    /// or a generic HMAC-SHA256 signature), once per delivery id.
    #[command(
        after_help = "Examples:\n  keel hook create pushes --verify github --secret-env GITHUB_HOOK_SECRET -- python3 triage.py\n  keel hook list\n  keel hook show pushes\n  keel hook delete pushes"
    )]
    Hook(hook::HookArgs),
    /// Runs started when a run of an agent ends (--after-run) or a message is published
    /// on a topic (--topic), fired by `keel serve` once per occasion.
    #[command(
        after_help = "Examples:\n  keel event create summarize --after-run fetch.py -- python3 summarize.py\n  keel event create triage --topic tickets -- python3 triage.py\n  keel event list\n  keel event show summarize\n  keel event pause summarize"
    )]
    Event(event::EventArgs),
    /// A live view of the running kernel: runs with their state, cost rate, tokens/s and
    /// what each waits for; live slots, the queue and LLM queues. Keys pause, resume,
    /// stop (after a y/n) and follow a run's logs.
    #[command(
        after_help = "Keys: up/down or j/k select, p pause, r resume, s stop (y to confirm), l or Enter logs (Esc back), / filter, q quit.\n\nExamples:\n  keel top\n  keel top --interval 5\n  KEEL_API_TOKEN=kt_... keel top"
    )]
    Top(top::TopArgs),
    /// The kernel nodes sharing this kernel's store (`keel serve --store postgres://...`):
    /// their address, heartbeat and runs.
    #[command(after_help = "Examples:\n  keel nodes\n  keel nodes --json")]
    Nodes(nodes::NodesArgs),
    /// Drain the running node: it takes no new runs, lets calls in flight finish, hands
    /// its runs to the other nodes (they continue by replay) and exits.
    #[command(after_help = "Example:\n  keel drain --addr 10.0.0.2:7777")]
    Drain(nodes::DrainArgs),
    /// Copy a store into another (a new SQLite file, or Postgres) and verify the copy
    /// item by item before it may be used.
    #[command(
        after_help = "Examples:\n  keel migrate --from sqlite:$HOME/.local/share/keel/keel.db --to sqlite:/srv/keel/keel.db\n  keel migrate --from sqlite:/srv/keel/keel.db --to postgres://keel@db.internal/keel\n\nStop the kernel using the source first. The target must be empty. A copy that does not\nverify is marked so, and a kernel refuses to start on it."
    )]
    Migrate(migrate::MigrateArgs),
}

/// The async runtime: one worker thread fewer than the machine has cores (at least one),
/// unless `TOKIO_WORKER_THREADS` says otherwise. The kernel's other busy threads (the
/// SQLite writer, the blocking pool's reads) and the agents themselves need a core too;
/// with a worker on every core, each call also woke idle workers to look for work. On a
/// 2-core machine one worker took a gateway call from 13 context switches to 8 and the
/// daemon's CPU per call down by a sixth or more, at the same throughput (BENCHMARKS.md,
/// "one worker thread fewer than cores").
fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        builder.worker_threads(cores.saturating_sub(1).max(1));
    }
    builder
}

/// Gives every jemalloc arena's free pages back at once, rather than over its decay time
/// (10 s of dirty pages, kept per arena): what the kernel's swapper calls after runs swap
/// out (`keel_sandbox::release_free_heap`). Without it a parked run cost twice the memory
/// it does with glibc's `malloc_trim`.
fn purge_jemalloc() {
    // MALLCTL_ARENAS_ALL (4096): every arena.
    let name = c"arena.4096.purge";
    // SAFETY: a "purge" mallctl takes and returns nothing (null pointers, zero length).
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
}

fn main() -> ExitCode {
    // A sandbox zygote is this binary started with a hidden argument; it must take over
    // before any thread or runtime exists.
    keel_sandbox::zygote::run_if_requested();
    // So is an interpreter worker for `code.exec` (it confines itself before any job).
    if std::env::args_os().nth(1).is_some_and(|a| a == keel_interp::WORKER_ARG) {
        keel_interp::worker_main();
    }
    keel_sandbox::set_heap_release(purge_jemalloc);
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let runtime = match runtime_builder().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("keel: could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let data_dir = keel_kernel::DataDir::resolve(cli.data_dir);
    let addr = cli.addr.filter(|a| !a.is_empty());
    let result = runtime.block_on(async {
        let ctx = commands::Context { data_dir, addr };
        match cli.command {
            Command::Serve(args) => commands::serve(ctx, args).await,
            Command::Run(args) => commands::run(ctx, *args).await,
            Command::Ps(args) => commands::ps(ctx, args).await,
            Command::Logs(args) => commands::logs(ctx, args).await,
            Command::Inspect(args) => commands::inspect(ctx, args).await,
            Command::Pause(args) => commands::control(ctx, args, "pause").await,
            Command::Resume(args) => commands::control(ctx, args, "resume").await,
            Command::Stop(args) => commands::stop(ctx, args).await,
            Command::Answer(args) => commands::answer(ctx, args).await,
            Command::Budget(args) => commands::budget(ctx, args).await,
            Command::Mem(args) => commands::mem(ctx, args).await,
            Command::Send(args) => commands::send(ctx, args).await,
            Command::Signal(args) => commands::signal(ctx, args).await,
            Command::Audit(args) => audit::audit(ctx, args).await,
            Command::Tenant(args) => tenant::tenant(ctx, args).await,
            Command::Schedule(args) => schedule::schedule(ctx, args).await,
            Command::Hook(args) => hook::hook(ctx, args).await,
            Command::Event(args) => event::event(ctx, args).await,
            Command::Top(args) => top::top(ctx, args).await,
            Command::Nodes(args) => nodes::nodes(ctx, args).await,
            Command::Drain(args) => nodes::drain(ctx, args).await,
            Command::Approve(args) => commands::decide(ctx, args, true).await,
            Command::Deny(args) => commands::decide(ctx, args, false).await,
            Command::Tools(args) => commands::tools(ctx, args).await,
            Command::Exec(args) => commands::exec(ctx, *args).await,
            Command::Doctor(args) => doctor::doctor(&ctx.data_dir, args).await,
            Command::Migrate(args) => migrate::migrate(args).await,
        }
    });
    // Agents and their pipes may hold blocking threads; do not wait for them.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(code) => code,
        // The reader of stdout went away (`keel ps | head -1`): nobody wants more output,
        // so end quietly and successfully, as ripgrep does. Not 141 (128 + SIGPIPE): that
        // status would make `set -o pipefail` scripts fail on a pipeline that did what it
        // was asked, and we did not die of a signal.
        Err(err) if out::is_stdout_closed(&err) => ExitCode::SUCCESS,
        Err(err) => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "keel: {err:#}");
            ExitCode::FAILURE
        }
    }
}
