//! `keel nodes` (the kernel nodes sharing this kernel's store) and `keel drain` (hand a
//! node's runs to the others and stop it).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use keel_protocol::api::NodesView;

use crate::client::Client;
use crate::commands::Context;

#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Machine-readable output (the `GET /v1/nodes` body).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Return once the node accepted the drain, without waiting for it to exit.
    #[arg(long)]
    no_wait: bool,
}

pub async fn nodes(ctx: Context, args: NodesArgs) -> Result<ExitCode> {
    let client = ctx.client().await?;
    let view = client.nodes().await?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&view)?)?;
    } else {
        crate::out!("{}", render(&view, crate::render::now_ms()))?;
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Asks the daemon to drain, then waits until it stops answering.
pub async fn drain(ctx: Context, args: DrainArgs) -> Result<ExitCode> {
    let Some(client) = Client::find(&ctx.data_dir, ctx.addr.as_deref()).await? else {
        bail!("no `keel serve` is running for this data directory (or at --addr): there is no node to drain");
    };
    let drained = client.drain().await?;
    eprintln!(
        "keel: node {} is draining: {} run(s) go to the other nodes by replay once their calls in flight finish",
        drained.node, drained.runs
    );
    if !args.no_wait {
        let deadline = Instant::now() + Duration::from_secs(600);
        while client.health().await.is_ok() {
            if Instant::now() > deadline {
                bail!("node {} still answers 10 minutes after it was asked to drain", drained.node);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("keel: node {} drained and stopped", drained.node);
    }
    Ok(ExitCode::SUCCESS)
}

fn render(view: &NodesView, now_ms: u64) -> String {
    let Some(this) = &view.this_node else {
        return format!(
            "this kernel is alone with its store ({}); `keel serve --store postgres://...` runs several nodes on \
             one database\n",
            view.store
        );
    };
    let mut out = format!(
        "{:<16} {:<22} {:<6} {:>5} {:>9} {:>8}  VERSION\n",
        "NODE", "ADDR", "STATE", "RUNS", "HEARTBEAT", "UP"
    );
    for node in &view.nodes {
        let state = match (node.live, node.draining) {
            (false, _) => "dead",
            (true, true) => "drain",
            (true, false) => "live",
        };
        let marker = if &node.id == this { "*" } else { "" };
        out.push_str(&format!(
            "{:<16} {:<22} {:<6} {:>5} {:>9} {:>8}  {}\n",
            format!("{}{marker}", node.id),
            node.addr,
            state,
            node.runs,
            format!("{} ago", crate::render::age(now_ms.saturating_sub(node.heartbeat_at_ms))),
            crate::render::age(now_ms.saturating_sub(node.started_at_ms)),
            node.version
        ));
    }
    out.push_str("(* the node that answered)\n");
    out
}

#[cfg(test)]
mod tests {
    use keel_protocol::api::{NodeView, NodesView};

    use super::render;

    fn node(id: &str, live: bool, draining: bool) -> NodeView {
        NodeView {
            id: id.to_owned(),
            addr: "10.0.0.1:7777".to_owned(),
            version: "0.1.0".to_owned(),
            started_at_ms: 1_000,
            heartbeat_at_ms: 58_000,
            live,
            draining,
            runs: 3,
        }
    }

    #[test]
    fn nodes_show_their_state_and_which_answered() {
        let view = NodesView {
            store: "postgres".to_owned(),
            this_node: Some("a".to_owned()),
            nodes: vec![node("a", true, false), node("b", true, true), node("c", false, false)],
        };
        let text = render(&view, 61_000);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("a* ") && lines[1].contains(" live ") && lines[1].contains("3s ago"),
            "{text}"
        );
        assert!(lines[2].contains(" drain "), "{text}");
        assert!(lines[3].contains(" dead "), "{text}");
    }

    #[test]
    fn a_kernel_alone_says_so() {
        let view = NodesView { store: "sqlite".to_owned(), this_node: None, nodes: Vec::new() };
        assert!(render(&view, 0).contains("alone with its store (sqlite)"));
    }
}
