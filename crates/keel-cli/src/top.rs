//! `keel top`: a live terminal view of a running kernel, refreshed from `/v1/status` and
//! `/v1/runs` every `--interval`, with keys to pause, resume, stop and follow a run's logs.
//! The view and the keys are pure (`top/view.rs`); here are the terminal, the HTTP calls
//! and the loop. The terminal is restored however the command ends: `q`, an error, a
//! panic (ratatui's panic hook), or SIGINT/SIGTERM/SIGHUP.

mod view;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use tokio::signal::unix::{SignalKind, signal};

use crate::client::Client;
use crate::commands::Context;
use view::{Action, App, Mode};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes (fractions allowed, at least 0.1).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    interval: f64,
    /// At most this many runs listed, live ones first.
    #[arg(long, default_value_t = 200)]
    limit: usize,
}

/// The most pages of a followed run's events read per refresh (a run that prints faster
/// than that is caught up over the next refreshes).
const LOG_PAGES_PER_REFRESH: usize = 20;

pub async fn top(ctx: Context, args: TopArgs) -> Result<ExitCode> {
    if !args.interval.is_finite() || args.interval < 0.1 {
        return Err(anyhow!("--interval must be at least 0.1 seconds (got {})", args.interval));
    }
    let interval = Duration::from_secs_f64(args.interval);
    let client = Client::find(&ctx.data_dir, ctx.addr.as_deref()).await?.ok_or_else(|| {
        anyhow!(
            "no Keel daemon is running for {}; start one with `keel serve` (keel top watches a running kernel), \
             or point at one with --addr",
            ctx.data_dir.root().display()
        )
    })?;
    // The first snapshot before the terminal is taken over, so an error (a wrong token)
    // prints as any command's would.
    let mut app = App::new();
    refresh(&client, &mut app, args.limit).await?;
    let mut terminal = ratatui::try_init().context("taking over the terminal (keel top needs a terminal)")?;
    let outcome = run(&mut terminal, &client, app, interval, args.limit).await;
    ratatui::restore();
    outcome.map(|()| ExitCode::SUCCESS)
}

async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    client: &Client,
    mut app: App,
    interval: Duration,
    limit: usize,
) -> Result<()> {
    let mut keys = key_events();
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        terminal.draw(|frame| view::draw(frame, &app)).context("drawing")?;
        tokio::select! {
            _ = ticks.tick() => {
                if let Err(err) = refresh(client, &mut app, limit).await {
                    app.message = Some(format!("the kernel did not answer: {err:#}"));
                }
            }
            key = keys.recv() => {
                let Some(key) = key else { return Err(anyhow!("the terminal's input ended")) };
                match app.key(key) {
                    Some(Action::Quit) => return Ok(()),
                    Some(action) => {
                        act(client, &mut app, action).await;
                        let _ = refresh(client, &mut app, limit).await;
                    }
                    None => {}
                }
            }
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        }
    }
}

/// Key presses, read on a thread of their own (crossterm's reads block) until the
/// receiver is dropped.
fn key_events() -> tokio::sync::mpsc::UnboundedReceiver<ratatui::crossterm::event::KeyEvent> {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while !sender.is_closed() {
            match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(_) => return,
            }
            match event::read() {
                Ok(Event::Key(key)) if key.kind == KeyEventKind::Press => {
                    if sender.send(key).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    receiver
}

/// A new snapshot of the kernel, and the new lines of a followed run's logs.
async fn refresh(client: &Client, app: &mut App, limit: usize) -> Result<()> {
    let (status, runs) = tokio::try_join!(client.status(), client.list_runs(None, Some(limit)))?;
    app.update(status, runs, crate::render::now_ms());
    if let Mode::Logs(run) = app.mode.clone() {
        for _ in 0..LOG_PAGES_PER_REFRESH {
            let page = client.events(&run, app.logs_after).await?;
            if page.events.is_empty() {
                break;
            }
            app.add_events(&page.events);
        }
    }
    if app.message.as_deref().is_some_and(|m| m.starts_with("the kernel did not answer")) {
        app.message = None;
    }
    Ok(())
}

/// Performs what a key asked for; the outcome goes to the message line.
async fn act(client: &Client, app: &mut App, action: Action) {
    let outcome = match &action {
        Action::Pause(run) => {
            client.action(run, "pause").await.map(|view| format!("paused {run} ({})", view.state))
        }
        Action::Resume(run) => {
            client.action(run, "resume").await.map(|view| format!("resumed {run} ({})", view.state))
        }
        Action::Stop(run) => {
            client.stop(run, None).await.map(|view| format!("stopped {run} ({})", view.state))
        }
        // The pane fills at the refresh that follows.
        Action::OpenLogs(_) | Action::Quit => return,
    };
    app.message = Some(match outcome {
        Ok(done) => done,
        Err(err) => format!("{err:#}"),
    });
}
