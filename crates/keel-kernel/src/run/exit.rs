//! Watching an agent process: its output into the event log, and settling the run when
//! it exits (succeeded, failed with the reason, cancelled, or swapped out).

use keel_protocol::EventKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use keel_core::lifecycle::Command as Lifecycle;
use keel_sandbox::tree;
use keel_store::RunPatch;
use keel_types::RunId;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

use crate::run::LiveRun;
use crate::{Kernel, lock};

impl Kernel {
    /// Reads the agent's output into the event log and settles the run when it exits.
    pub(crate) fn watch(&self, live: Arc<LiveRun>, mut child: keel_sandbox::Child) {
        let stdout = child.stdout.take().map(|out| self.pump(&live.id, EventKind::Stdout, out));
        let stderr = child.stderr.take().map(|err| self.pump(&live.id, EventKind::Stderr, err));
        let kernel = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Whatever the agent left behind dies with it: the run is its whole tree. (A run
            // another node took over: only this node's group, see `Kernel::lose`.)
            if kernel.lost(&live) {
                tree::signal_group(live.pid, Signal::SIGKILL);
            } else {
                live.kill_tree();
            }
            for pump in [stdout, stderr].into_iter().flatten() {
                let _ = pump.await;
            }
            let ended_by = child.ended_by().map(str::to_owned);
            kernel.settle(&live, status, ended_by).await;
        });
    }

    fn pump(
        &self,
        run: &RunId,
        kind: EventKind,
        output: impl AsyncRead + Unpin + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let kernel = self.clone();
        let run = run.clone();
        tokio::spawn(async move {
            const MAX_LINE: usize = 64 * 1024;
            let mut reader = BufReader::new(output);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        let text = String::from_utf8_lossy(&line).into_owned();
                        kernel.emit(&run, kind, json!({ "line": text }));
                    }
                }
            }
        })
    }

    /// Records how the agent process ended.
    /// `ended_by` names the sandbox limit that ended the agent, if one did.
    pub(crate) async fn settle(
        &self,
        live: &Arc<LiveRun>,
        status: std::io::Result<std::process::ExitStatus>,
        ended_by: Option<String>,
    ) {
        lock(&self.inner.live).remove(&live.id);
        lock(&self.inner.tokens).retain(|_, run| !Arc::ptr_eq(run, live));
        live.ended.send_replace(true);
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return; // The next kernel recovers the run.
        }
        if live.lost.load(Ordering::SeqCst) {
            return; // Another node took the run over and brings it back by replay.
        }
        if live.swapping.load(Ordering::SeqCst)
            && !live.stopping.load(Ordering::SeqCst)
            && !live.exited.load(Ordering::SeqCst)
        {
            return self.settle_swapped(live).await;
        }
        self.abandon_replay_tail(live).await;
        use std::os::unix::process::ExitStatusExt;
        let (exit_code, signal) = match &status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        let exited = live.exited.load(Ordering::SeqCst);
        let (command, error) = if live.stopping.load(Ordering::SeqCst) {
            (Lifecycle::Cancel, None)
        } else if exited || exit_code == Some(0) {
            (Lifecycle::Exit { success: true }, None)
        } else {
            let why = match (exit_code, signal, &status) {
                (Some(code), _, _) => format!("the agent exited with status {code} without calling run.exit"),
                (None, Some(sig), _) => format!(
                    "the agent was killed by signal {sig} ({})",
                    Signal::try_from(sig).map_or("unknown", |s| s.as_str())
                ),
                (_, _, Err(err)) => format!("the agent's exit status could not be read: {err}"),
                _ => "the agent ended without an exit status".to_owned(),
            };
            let why = match ended_by {
                Some(limit) => format!("{limit}; {why}"),
                None => why,
            };
            (Lifecycle::Exit { success: false }, Some(why))
        };
        let patch = RunPatch {
            pid: Some(None),
            exit_code: Some(exit_code.or(signal.map(|s| 128 + s))),
            error: Some(error),
            ..RunPatch::default()
        };
        // An agent that ends while the store is away must not leave its run `running`
        // with nobody to end it: the end waits for the store, unless this kernel is
        // stopping (the next one recovers the run) or the run went to another node.
        let still_here =
            || !self.inner.shutting_down.load(Ordering::SeqCst) && !live.lost.load(Ordering::SeqCst);
        let ended = crate::outage::retry_while(&live.id, still_here, true, || {
            self.transition(&live.id, command, patch.clone())
        })
        .await;
        if let Err(err) = ended {
            tracing::warn!(run = %live.id, "could not record the end of the run: {err}");
        }
    }

    /// Marks the journal entries a recovered agent never asked for again as abandoned
    /// (kept for audit, never replayed).
    pub(crate) async fn abandon_replay_tail(&self, live: &Arc<LiveRun>) {
        let abandoned = live.replay.lock().await.matcher.abandon_remaining();
        if abandoned.is_empty() {
            return;
        }
        match self.inner.store.abandon_entries(&live.id, &abandoned).await {
            Ok(()) => self.emit(&live.id, EventKind::Replay, json!({ "abandoned": abandoned })),
            Err(err) => tracing::warn!(run = %live.id, "could not mark abandoned journal entries: {err}"),
        }
    }
}
