//! `keel audit`: a run's audit entries, verification of the whole hash chain, and an
//! export as JSON lines. Talks to the kernel through `/v1/audit...` like every command.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};

use crate::client::Client;
use crate::commands::Context;
use crate::render;

/// The exit code of `keel audit verify` when the log was tampered with (1 means the check
/// itself could not be made: no kernel, a bad data directory...).
pub const TAMPERED_EXIT_CODE: u8 = 3;

/// Entries per request when listing.
const PAGE: u32 = 1_000;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_precedence_over_arg = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: Option<AuditCommand>,
    /// The run whose entries to list (same as `keel audit show RUN`).
    #[arg(value_name = "RUN")]
    run: Option<String>,
    /// Print the entries as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// List a run's audit entries, oldest first.
    #[command(after_help = "Example:\n  keel audit show run_01jd... --json")]
    Show {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Recompute every hash of the audit log. Exit 0 when intact, 3 when tampered with,
    /// 1 when the check could not be made.
    #[command(
        after_help = "Example:\n  keel audit verify\n\nExit codes: 0 intact, 3 tampered with, 1 could not check.\n\
        Keep the printed head hash elsewhere: a later head that does not extend it means the\n\
        whole log was rewritten, which the chain alone cannot show."
    )]
    Verify {
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the audit log as JSON lines (one entry per line, oldest first).
    #[command(
        after_help = "Examples:\n  keel audit export -o audit.jsonl\n  keel audit export --run run_01jd..."
    )]
    Export {
        /// Only this run's entries.
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
        /// Write to FILE instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

pub async fn audit(ctx: Context, args: AuditArgs) -> Result<ExitCode> {
    let command = match (args.command, args.run) {
        (Some(command), _) => command,
        (None, Some(run)) => AuditCommand::Show { run, json: args.json },
        (None, None) => {
            bail!("say which run: `keel audit RUN`, or `keel audit verify` / `keel audit export`")
        }
    };
    let client = Client::find_or_embed(&ctx.data_dir, ctx.addr.as_deref()).await?;
    let outcome = audit_command(&client, command).await;
    client.close().await;
    outcome
}

async fn audit_command(client: &Client, command: AuditCommand) -> Result<ExitCode> {
    match command {
        AuditCommand::Show { run, json } => {
            let mut entries = Vec::new();
            loop {
                let after = entries.last().map_or(0, |entry: &keel_protocol::api::AuditEntryView| entry.seq);
                let page = client.audit_list(Some(&run), after, PAGE).await?;
                let full = page.len() >= PAGE as usize;
                entries.extend(page);
                if !full {
                    break;
                }
            }
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&entries)?)?;
            } else {
                crate::out!("{}", render::audit_table(&run, &entries))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify { json } => {
            let view = client.audit_verify().await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
            } else if view.ok {
                crate::outln!("audit log intact: {} entries, head {}", view.entries, view.head_hash)?;
            } else {
                crate::outln!(
                    "audit log TAMPERED at entry {}: {}",
                    view.broken_at.unwrap_or(0),
                    view.reason.as_deref().unwrap_or("unknown reason")
                )?;
            }
            Ok(if view.ok { ExitCode::SUCCESS } else { ExitCode::from(TAMPERED_EXIT_CODE) })
        }
        AuditCommand::Export { run, output } => {
            let mut response = client.audit_export(run.as_deref()).await?;
            let mut out: Box<dyn Write> = match &output {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path)
                        .with_context(|| format!("cannot create {}", path.display()))?,
                )),
                None => Box::new(crate::out::Stdout::lock()),
            };
            let mut lines = 0usize;
            while let Some(chunk) = response.chunk().await.context("reading the audit export")? {
                lines += chunk.iter().filter(|&&byte| byte == b'\n').count();
                out.write_all(&chunk).context("writing the audit export")?;
            }
            out.flush().context("writing the audit export")?;
            if let Some(path) = output {
                eprintln!("wrote {lines} audit entries to {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use keel_protocol::api::AuditEntryView;
    use serde_json::json;

    use crate::render;

    fn entry(seq: u64, outcome: &str, detail: serde_json::Value) -> AuditEntryView {
        AuditEntryView {
            seq,
            at: 1_795_780_800_000 + seq * 1_000,
            tenant: "default".into(),
            run_id: Some("run_01".into()),
            actor: "agent".into(),
            action: "egress".into(),
            subject: "api.example.com".into(),
            outcome: outcome.into(),
            detail,
            prev_hash: "0".repeat(64),
            hash: "1".repeat(64),
        }
    }

    #[test]
    fn the_table_has_one_line_per_entry_with_utc_times_and_short_details() {
        let long = json!({"reason": "x".repeat(200)});
        let table = render::audit_table(
            "run_01",
            &[entry(1, "allowed", json!({"port": 443})), entry(2, "denied", long)],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("   SEQ  TIME (UTC)"), "{table}");
        assert_eq!(
            lines[1],
            "     1  2026-11-27T12:00:01Z  agent     egress              api.example.com           allowed   {\"port\":443}"
        );
        assert!(
            lines[2].contains("denied") && lines[2].ends_with('…') && lines[2].chars().count() < 160,
            "{table}"
        );
    }

    #[test]
    fn an_empty_run_says_so() {
        assert_eq!(render::audit_table("run_01", &[]), "no audit entries for run run_01\n");
    }
}
