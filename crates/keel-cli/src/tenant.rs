//! `keel tenant`: create tenants, list them, mint and revoke their API tokens. Managing
//! tenants needs the operator's token (the data directory's); a tenant's token
//! (`KEEL_API_TOKEN=kt_...`) makes every other command act as that tenant.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use keel_protocol::api::{CreateTenantParams, QuotaParams, TokenParams};

use crate::commands::Context;
use crate::render;

#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Create a tenant, with optional quotas.
    #[command(after_help = "Example:\n  keel tenant create acme --max-runs 10 --max-usd-per-run 0.50")]
    Create {
        /// 1-64 letters, digits, '-' or '_'.
        name: String,
        /// The most live runs the tenant may have at once (more are refused, HTTP 429).
        #[arg(long, value_name = "N")]
        max_runs: Option<u32>,
        /// The USD budget of a run of the tenant that brings none.
        #[arg(long, value_name = "USD")]
        max_usd_per_run: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// List tenants with their quotas and tokens (by prefix).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Mint an API token for a tenant. It is printed once; Keel keeps only its hash.
    #[command(after_help = "Example:\n  keel tenant token acme --label ci\n  KEEL_API_TOKEN=kt_... keel ps")]
    Token {
        name: String,
        /// A note to tell tokens apart in `keel tenant list`.
        #[arg(long)]
        label: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a tenant's token by its prefix (as `keel tenant list` shows it).
    #[command(after_help = "Example:\n  keel tenant revoke acme kt_3f9a1c0d")]
    Revoke { name: String, prefix: String },
}

pub async fn tenant(ctx: Context, args: TenantArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let outcome = async {
        match args.command {
            TenantCommand::Create { name, max_runs, max_usd_per_run, json } => {
                let quota = QuotaParams { max_runs, max_usd_per_run };
                let view = client.create_tenant(&CreateTenantParams { name, quota: Some(quota) }).await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
                } else {
                    crate::outln!("created tenant {} ({})", view.name, render::quota(&view.quota))?;
                    crate::outln!("mint a token for it with: keel tenant token {}", view.name)?;
                }
            }
            TenantCommand::List { json } => {
                let tenants = client.tenants().await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&tenants)?)?;
                } else {
                    crate::out!("{}", render::tenants_table(&tenants))?;
                }
            }
            TenantCommand::Token { name, label, json } => {
                let created = client.create_token(&name, &TokenParams { label }).await?;
                if json {
                    crate::outln!("{}", serde_json::to_string_pretty(&created)?)?;
                } else {
                    crate::outln!("{}", created.token)?;
                    eprintln!(
                        "keel: token {} of tenant {} (shown once; use it as KEEL_API_TOKEN)",
                        created.prefix, created.tenant
                    );
                }
            }
            TenantCommand::Revoke { name, prefix } => {
                let view = client.revoke_token(&name, &prefix).await?;
                if view.revoked == 0 {
                    crate::outln!("token {prefix} of tenant {name} was already revoked")?;
                } else {
                    crate::outln!("revoked token {prefix} of tenant {name}")?;
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
    .await;
    client.close().await;
    outcome
}
