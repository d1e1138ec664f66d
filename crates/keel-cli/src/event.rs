//! `keel event`: runs started when a run of an agent ends or a message is published on a
//! topic, durable in the store, fired by the daemon (`keel serve`) exactly once per
//! occasion.

use std::process::ExitCode;

use anyhow::Result;
use clap::{ArgGroup, Args, Subcommand};
use keel_protocol::triggers::{CreateEventTriggerParams, EventTriggerView};

use crate::commands::{Context, RunOptions, run_params};

#[derive(Debug, Args)]
pub struct EventArgs {
    #[command(subcommand)]
    command: EventCommand,
}

#[derive(Debug, Subcommand)]
enum EventCommand {
    /// Create an event trigger: CMD runs (with any `keel run` option) each time a run of
    /// AGENT ends (--after-run), or each time a message is published on TOPIC (--topic).
    #[command(
        group(ArgGroup::new("listens").required(true).args(["after_run", "topic"])),
        after_help = "Examples:\n  keel event create summarize --after-run fetch.py -- python3 summarize.py\n  keel event create alert --after-run '*' --on failed -- python3 page.py\n  keel event create triage --topic tickets -- python3 triage.py"
    )]
    Create {
        /// Letters, digits, '-', '_' or '.', at most 64.
        name: String,
        /// Fire when a run of this agent ends: the file name of its program, or of its
        /// script under an interpreter (fetch.py for `python3 jobs/fetch.py`); '*' for any.
        #[arg(long, value_name = "AGENT")]
        after_run: Option<String>,
        /// With --after-run: which ends fire it.
        #[arg(long, value_name = "END", value_parser = ["succeeded", "failed", "cancelled", "ended"])]
        on: Option<String>,
        /// Fire for each message a run publishes on this topic (in its tenant).
        #[arg(long, value_name = "TOPIC")]
        topic: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: Box<RunOptions>,
    },
    /// List event triggers.
    List {
        #[arg(long)]
        json: bool,
    },
    /// An event trigger with its last fires and their runs.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop firing until resumed (what happens meanwhile never fires).
    Pause { name: String },
    /// Fire again.
    Resume { name: String },
    /// Delete an event trigger (its runs stay).
    Delete { name: String },
}

pub async fn event(ctx: Context, args: EventArgs) -> Result<ExitCode> {
    let params = match &args.command {
        EventCommand::Create { name, after_run, on, topic, run, .. } => Some(CreateEventTriggerParams {
            name: name.clone(),
            after_run: after_run.clone(),
            on: on.clone(),
            topic: topic.clone(),
            run: run_params(run)?,
        }),
        _ => None,
    };
    let client = ctx.client().await?;
    let outcome = async {
        match args.command {
            EventCommand::Create { json, .. } => {
                let Some(params) = params else { unreachable!("made above for create") };
                let view = client.create_event_trigger(&params).await?;
                print(&view, json, "created")?;
            }
            EventCommand::List { json } => {
                let views = client.event_triggers().await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&views)?)?;
                } else {
                    crate::outln!("{:<20} {:<32} {:<8} {:<9} LAST FIRE", "NAME", "ON", "STATE", "TENANT")?;
                    for view in &views {
                        let last = view.last_fires.first().map_or("-".to_owned(), |fire| {
                            format!("{} {}", fire.outcome, fire.run_id.as_deref().unwrap_or("-"))
                        });
                        crate::outln!(
                            "{:<20} {:<32} {:<8} {:<9} {last}",
                            view.name,
                            listens(view),
                            if view.paused { "paused" } else { "active" },
                            view.tenant
                        )?;
                    }
                }
            }
            EventCommand::Show { name, json } => print(&client.event_trigger(&name).await?, json, "")?,
            EventCommand::Pause { name } => {
                client.event_trigger_action(&name, "pause").await?;
                crate::outln!("paused event trigger {name}")?;
            }
            EventCommand::Resume { name } => {
                client.event_trigger_action(&name, "resume").await?;
                crate::outln!("resumed event trigger {name}")?;
            }
            EventCommand::Delete { name } => {
                client.delete_event_trigger(&name).await?;
                crate::outln!("deleted event trigger {name}")?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
    .await;
    client.close().await;
    outcome
}

/// What the trigger listens for, in a few words.
fn listens(view: &EventTriggerView) -> String {
    match (&view.after_run, &view.topic) {
        (Some(agent), _) => format!("run of {agent} {}", view.on.as_deref().unwrap_or("succeeded")),
        (None, Some(topic)) => format!("topic {topic}"),
        (None, None) => "-".to_owned(),
    }
}

fn print(view: &EventTriggerView, json: bool, verb: &str) -> Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(view)?)?;
        return Ok(());
    }
    if !verb.is_empty() {
        crate::outln!("{verb} event trigger {}", view.name)?;
    }
    crate::outln!("{}", crate::render::trigger_name(&view.name, &view.tenant, view.declared))?;
    crate::outln!("on:        {}", listens(view))?;
    crate::outln!("state:     {}", if view.paused { "paused" } else { "active" })?;
    crate::outln!("command:   {}", view.command.join(" "))?;
    crate::outln!("last fires:")?;
    if view.last_fires.is_empty() {
        crate::outln!("  (none yet)")?;
    }
    for fire in &view.last_fires {
        let detail = fire.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        crate::outln!(
            "  {}  {:<40} {:<8} {}{detail}",
            crate::render::utc_time(fire.at),
            fire.occasion,
            fire.outcome,
            fire.run_id.as_deref().unwrap_or("-")
        )?;
    }
    Ok(())
}
