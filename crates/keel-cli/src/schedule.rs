//! `keel schedule`: runs started on a cron schedule, durable in the store, fired by the
//! daemon (`keel serve`) exactly once per tick.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use keel_protocol::api::RunView;
use keel_protocol::triggers::{CreateScheduleParams, ScheduleView};

use crate::commands::{Context, RunOptions, run_params};

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Create a schedule: CMD runs (with any `keel run` option) at every tick of --cron.
    #[command(
        after_help = "Examples:\n  keel schedule create report --cron '0 9 * * MON-FRI' --tz Europe/Paris -- python3 report.py\n  keel schedule create poll --cron '*/30 * * * * *' --overlap skip --catch-up none -- python3 poll.py"
    )]
    Create {
        /// Letters, digits, '-', '_' or '.', at most 64.
        name: String,
        /// 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.
        #[arg(long)]
        cron: String,
        /// An IANA time zone (default UTC).
        #[arg(long, value_name = "ZONE")]
        tz: Option<String>,
        /// While the previous run is live: skip the tick (default), queue it, or allow another run.
        #[arg(long, value_name = "POLICY", value_parser = ["skip", "queue", "allow"])]
        overlap: Option<String>,
        /// Ticks missed while the kernel was down: none, latest (default), all, or all:N.
        #[arg(long, value_name = "POLICY")]
        catch_up: Option<String>,
        /// Delay each fire by up to this many seconds (the same delay for a tick every time).
        #[arg(long, value_name = "SECS")]
        jitter: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: Box<RunOptions>,
    },
    /// List schedules with their next fire.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A schedule with its last and next fires.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop firing until resumed.
    Pause { name: String },
    /// Fire again; ticks of the pause do not fire as missed.
    Resume { name: String },
    /// Delete a schedule (its runs stay).
    Delete { name: String },
    /// Start the schedule's run now; prints the run id.
    RunNow { name: String },
}

pub async fn schedule(ctx: Context, args: ScheduleArgs) -> Result<ExitCode> {
    let params = match &args.command {
        ScheduleCommand::Create { name, cron, tz, overlap, catch_up, jitter, run, .. } => {
            Some(CreateScheduleParams {
                name: name.clone(),
                cron: cron.clone(),
                tz: tz.clone(),
                overlap: overlap.clone(),
                catch_up: catch_up.clone(),
                jitter_secs: *jitter,
                run: run_params(run)?,
            })
        }
        _ => None,
    };
    let client = ctx.client().await?;
    let outcome = async {
        match args.command {
            ScheduleCommand::Create { json, .. } => {
                let Some(params) = params else { unreachable!("made above for create") };
                let view = client.create_schedule(&params).await?;
                print(&view, json, "created")?;
            }
            ScheduleCommand::List { json } => {
                let views = client.schedules().await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&views)?)?;
                } else {
                    crate::outln!("{:<20} {:<22} {:<14} {:<8} NEXT", "NAME", "CRON", "TZ", "STATE")?;
                    for view in &views {
                        crate::outln!(
                            "{:<20} {:<22} {:<14} {:<8} {}",
                            view.name,
                            view.cron,
                            view.tz,
                            if view.paused { "paused" } else { "active" },
                            view.next_fires.first().map_or("-", String::as_str)
                        )?;
                    }
                }
            }
            ScheduleCommand::Show { name, json } => print(&client.schedule(&name).await?, json, "")?,
            ScheduleCommand::Pause { name } => {
                client.schedule_action::<ScheduleView>(&name, "pause").await?;
                crate::outln!("paused schedule {name}")?;
            }
            ScheduleCommand::Resume { name } => {
                client.schedule_action::<ScheduleView>(&name, "resume").await?;
                crate::outln!("resumed schedule {name}")?;
            }
            ScheduleCommand::Delete { name } => {
                client.delete_schedule(&name).await?;
                crate::outln!("deleted schedule {name}")?;
            }
            ScheduleCommand::RunNow { name } => {
                let run: RunView = client.run_schedule_now(&name).await?;
                crate::outln!("{}", run.run_id)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
    .await;
    client.close().await;
    outcome
}

fn print(view: &ScheduleView, json: bool, verb: &str) -> Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(view)?)?;
        return Ok(());
    }
    if !verb.is_empty() {
        crate::outln!("{verb} schedule {}", view.name)?;
    }
    crate::outln!("{}", crate::render::trigger_name(&view.name, &view.tenant, view.declared))?;
    crate::outln!("cron:      {} in {}", view.cron, view.tz)?;
    crate::outln!(
        "policies:  overlap {}, catch-up {}, jitter {}s",
        view.overlap,
        view.catch_up,
        view.jitter_secs
    )?;
    crate::outln!("state:     {}", if view.paused { "paused" } else { "active" })?;
    crate::outln!("command:   {}", view.command.join(" "))?;
    crate::outln!("last fires:")?;
    if view.last_fires.is_empty() {
        crate::outln!("  (none yet)")?;
    }
    for fire in &view.last_fires {
        let detail = fire.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        crate::outln!(
            "  {}  {:<8} {}{detail}",
            fire.scheduled_at,
            fire.outcome,
            fire.run_id.as_deref().unwrap_or("-")
        )?;
    }
    crate::outln!("next fires:")?;
    for next in &view.next_fires {
        crate::outln!("  {next}")?;
    }
    Ok(())
}
