//! `keel hook`: runs started by signed webhook deliveries (`POST /v1/hooks/NAME` on the
//! daemon's API address), exactly once per delivery id.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use keel_protocol::triggers::{CreateHookParams, HookView};

use crate::commands::{Context, RunOptions, run_params};

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    command: HookCommand,
}

#[derive(Debug, Subcommand)]
enum HookCommand {
    /// Create a webhook: each delivery to POST /v1/hooks/NAME whose signature verifies
    /// starts CMD (with any `keel run` option), its body as the run's input payload.
    #[command(
        after_help = "Examples:\n  GITHUB_HOOK_SECRET=... keel serve &\n  keel hook create pushes --verify github --secret-env GITHUB_HOOK_SECRET -- python3 triage.py\n  keel hook create payments --verify stripe --secret-env STRIPE_WHSEC -- python3 refund.py\n  keel hook create ci --verify hmac-sha256 --header X-Signature --secret-env CI_SECRET -- python3 ci.py"
    )]
    Create {
        /// Letters, digits, '-', '_' or '.', at most 64: the URL is /v1/hooks/NAME.
        name: String,
        /// How deliveries are signed: github (X-Hub-Signature-256), stripe (Stripe-Signature)
        /// or hmac-sha256 (the hex HMAC of the body in --header).
        #[arg(long, value_name = "SCHEME", value_parser = ["github", "stripe", "hmac-sha256"])]
        verify: String,
        /// The variable of the kernel's environment holding the shared secret (read at
        /// each delivery, never stored).
        #[arg(long, value_name = "VAR")]
        secret_env: String,
        /// hmac-sha256 only: the header carrying the signature (default X-Keel-Signature).
        #[arg(long, value_name = "NAME")]
        header: Option<String>,
        /// stripe only: how far the signed timestamp may be from now (default 300 s).
        #[arg(long, value_name = "SECS")]
        tolerance: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: Box<RunOptions>,
    },
    /// List webhooks.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A webhook with its last deliveries.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a webhook (its runs stay); deliveries to it answer 404 from then on.
    Delete { name: String },
}

pub async fn hook(ctx: Context, args: HookArgs) -> Result<ExitCode> {
    let params = match &args.command {
        HookCommand::Create { name, verify, secret_env, header, tolerance, run, .. } => {
            Some(CreateHookParams {
                name: name.clone(),
                verify: verify.clone(),
                secret_env: secret_env.clone(),
                header: header.clone(),
                tolerance_secs: *tolerance,
                run: run_params(run)?,
            })
        }
        _ => None,
    };
    let client = ctx.client().await?;
    let outcome = async {
        match args.command {
            HookCommand::Create { json, .. } => {
                let Some(params) = params else { unreachable!("made above for create") };
                let view = client.create_hook(&params).await?;
                print(&view, json, "created")?;
            }
            HookCommand::List { json } => {
                let views = client.hooks().await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&views)?)?;
                } else {
                    crate::outln!(
                        "{:<20} {:<12} {:<24} {:<9} LAST DELIVERY",
                        "NAME",
                        "VERIFY",
                        "SECRET",
                        "TENANT"
                    )?;
                    for view in &views {
                        let secret = if view.secret_present {
                            view.secret_env.clone()
                        } else {
                            format!("{} (unset!)", view.secret_env)
                        };
                        let last = view.last_deliveries.first().map_or("-".to_owned(), |d| {
                            format!("{} {}", d.outcome, d.run_id.as_deref().unwrap_or("-"))
                        });
                        crate::outln!(
                            "{:<20} {:<12} {:<24} {:<9} {last}",
                            view.name,
                            view.verify,
                            secret,
                            view.tenant
                        )?;
                    }
                }
            }
            HookCommand::Show { name, json } => print(&client.hook(&name).await?, json, "")?,
            HookCommand::Delete { name } => {
                client.delete_hook(&name).await?;
                crate::outln!("deleted hook {name}")?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
    .await;
    client.close().await;
    outcome
}

fn print(view: &HookView, json: bool, verb: &str) -> Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(view)?)?;
        return Ok(());
    }
    if !verb.is_empty() {
        crate::outln!("{verb} hook {}", view.name)?;
    }
    crate::outln!("{}", crate::render::trigger_name(&view.name, &view.tenant, view.declared))?;
    crate::outln!("url:       POST {}", view.path)?;
    let tolerance = view.tolerance_secs.map(|t| format!(", tolerance {t}s")).unwrap_or_default();
    crate::outln!("verify:    {} in {}{tolerance}", view.verify, view.signature_header)?;
    let missing =
        if view.secret_present { "" } else { " (not in the kernel's environment: deliveries answer 503)" };
    crate::outln!("secret:    ${}{missing}", view.secret_env)?;
    crate::outln!("command:   {}", view.command.join(" "))?;
    crate::outln!("last deliveries:")?;
    if view.last_deliveries.is_empty() {
        crate::outln!("  (none yet)")?;
    }
    for delivery in &view.last_deliveries {
        let detail = delivery.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        crate::outln!(
            "  {}  {:<40} {:<7} {}{detail}",
            crate::render::utc_time(delivery.received_at),
            delivery.delivery_id,
            delivery.outcome,
            delivery.run_id.as_deref().unwrap_or("-")
        )?;
    }
    Ok(())
}
