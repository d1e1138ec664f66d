//! The live runs of this kernel: each run's [`LiveRun`] (the agent process this kernel
//! started and has not seen exit), found by run id or by token, and tokens of agents still
//! being launched.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use keel_core::replay::ReplayMatcher;
use keel_llm::Provider;
use keel_sandbox::Sandbox;
use keel_store::{JournalEntry, Seq};
use keel_types::RunId;
use tokio::sync::oneshot;

use crate::Result;
use crate::{Kernel, lock};

/// A token registered as launching for as long as it lives (see `Kernel::try_launch`).
pub(crate) struct Launching<'a> {
    kernel: &'a Kernel,
    token: String,
}

impl<'a> Launching<'a> {
    pub(crate) fn register(
        kernel: &'a Kernel,
        token: &str,
        ready: tokio::sync::watch::Receiver<Option<Arc<LiveRun>>>,
    ) -> Launching<'a> {
        lock(&kernel.inner.launching).insert(token.to_owned(), ready);
        Launching { kernel, token: token.to_owned() }
    }
}

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        lock(&self.kernel.inner.launching).remove(&self.token);
    }
}

/// A run whose agent process this kernel started and has not yet seen exit.
pub(crate) struct LiveRun {
    pub(crate) id: RunId,
    /// The run's owner, fixed at creation (memory and mailboxes are scoped by it).
    pub(crate) tenant: String,
    pub(crate) attempt: u32,
    pub(crate) pid: u32,
    pub(crate) provider: Option<Arc<dyn Provider>>,
    pub(crate) replay: tokio::sync::Mutex<Replay>,
    /// Set by `run.exit`: later syscalls are refused.
    pub(crate) exited: AtomicBool,
    pub(crate) stopping: AtomicBool,
    pub(crate) ask: Mutex<Option<PendingAsk>>,
    pub(crate) budget: crate::budget::RunBudget,
    /// The tools the run may call.
    pub(crate) grant: keel_tools::grant::Grant,
    /// Its priority class (for the order of LLM calls waiting for a provider).
    pub(crate) priority: keel_core::sched::Priority,
    /// The read-only tool calls of running `code.exec`s (by the exec's seq), journaled
    /// together when it completes (see `exec.rs`).
    pub(crate) exec_buffers: Mutex<HashMap<Seq, Vec<BufferedRead>>>,
    /// The model calls of running `code.exec`s (by the exec's seq): made and allowed.
    pub(crate) exec_llm_calls: Mutex<HashMap<Seq, (u32, u32)>>,
    /// Tool calls parked until an operator decides, by seq.
    pub(crate) approvals: Mutex<BTreeMap<Seq, crate::approvals::PendingApproval>>,
    /// Where the `fs.*` tools act on the host: the volume mounted at `/workspace`, or the
    /// working directory of a `none`-tier run.
    pub(crate) workspace: Option<PathBuf>,
    /// The run's sandbox backend and profile, for the command tools it calls.
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) profile: keel_sandbox::Profile,
    pub(crate) cwd: PathBuf,
    /// `http.fetch`'s client: through the run's egress proxy, or none without egress.
    pub(crate) fetcher: tokio::sync::OnceCell<Result<crate::tools::Fetcher, String>>,
    /// Set when the agent is gone: syscalls still in flight are dropped (an LLM stream
    /// closes, a tool's process tree is killed, an MCP call is cancelled).
    pub(crate) ended: tokio::sync::watch::Sender<bool>,
    /// Syscalls in flight, and how many of them are durable waits (see `swap.rs`).
    pub(crate) inflight: std::sync::atomic::AtomicUsize,
    pub(crate) waiting_calls: std::sync::atomic::AtomicUsize,
    /// Whether the run's last `ipc.recv` found its mailbox empty: the next one offers
    /// itself to senders before it looks (see `syscall/ipc.rs`).
    pub(crate) receives_wait: AtomicBool,
    /// Answers to the run's sends' claims, held back while its `ipc.send` with `recv`
    /// has yet to offer its receive (see `syscall/ipc.rs`).
    pub(crate) held_answers: crate::mailboxes::HeldAnswers,
    /// Set when the kernel stops the agent to swap the run out.
    pub(crate) swapping: AtomicBool,
    /// Notified at the agent's first call to the kernel (`hello`, or a request to the
    /// gateway): a swapped-in agent's start is over (see `SwapIn`).
    pub(crate) greeted: tokio::sync::Notify,
    /// Set when another node took the run over (see `run/cluster.rs`): the agent is
    /// killed and nothing more is written for it from here.
    pub(crate) lost: AtomicBool,
    /// The run's egress proxy (`allowlist` runs); it stops when the run is dropped.
    pub(crate) _egress: Option<keel_sandbox::egress::EgressProxy>,
}

impl LiveRun {
    /// Waits for the agent's first call to the kernel (`greeted`), its end, or `within`,
    /// whichever comes first.
    pub(crate) async fn first_call_or_end(&self, within: std::time::Duration) {
        let mut ended = self.ended.subscribe();
        let started = async {
            tokio::select! {
                () = self.greeted.notified() => {}
                _ = ended.wait_for(|ended| *ended) => {}
            }
        };
        let _ = tokio::time::timeout(within, started).await;
    }

    /// SIGKILLs every process of the run, as its sandbox knows how
    /// ([`Sandbox::kill_tree`]).
    pub(crate) fn kill_tree(&self) {
        self.sandbox.kill_tree(self.pid, self.id.as_str());
    }
}

pub(crate) struct Replay {
    pub(crate) matcher: ReplayMatcher,
    /// The recorded entries the matcher may point at, by seq.
    pub(crate) recorded: HashMap<Seq, JournalEntry>,
}

pub(crate) struct PendingAsk {
    pub(crate) seq: Seq,
    pub(crate) question: keel_protocol::rpc::HumanAskParams,
    /// The result the agent receives: `{answer}`, or `{answer, value}` for a form.
    pub(crate) reply: oneshot::Sender<serde_json::Value>,
}

impl Kernel {
    /// Whether `live` is still the live attempt of its run (its agent has not exited and
    /// the run is not stopping), so a call waiting on its behalf should go on waiting.
    pub(crate) fn is_current(&self, live: &Arc<LiveRun>) -> bool {
        !live.stopping.load(Ordering::SeqCst)
            && !self.inner.shutting_down.load(Ordering::SeqCst)
            && lock(&self.inner.live).get(&live.id).is_some_and(|current| Arc::ptr_eq(current, live))
    }

    pub(crate) fn live(&self, run: &RunId) -> Option<Arc<LiveRun>> {
        lock(&self.inner.live).get(run).cloned()
    }

    fn live_by_token(&self, token: &str) -> Option<Arc<LiveRun>> {
        lock(&self.inner.tokens).get(token).cloned()
    }

    /// [`Kernel::live_by_token`], waiting for a run whose agent is still being launched
    /// (see `try_launch`); `None` for an unknown token or a launch that failed.
    pub(crate) async fn live_by_token_ready(&self, token: &str) -> Option<Arc<LiveRun>> {
        // Launching first: a launch registers the run before it stops being launching.
        let launching = lock(&self.inner.launching).get(token).cloned();
        let live = match launching {
            Some(mut ready) => ready.wait_for(Option::is_some).await.ok()?.clone(),
            None => self.live_by_token(token),
        };
        if let Some(live) = &live {
            live.greeted.notify_one();
        }
        live
    }

    /// Every run with an agent process of this kernel.
    pub(crate) fn live_runs(&self) -> Vec<Arc<LiveRun>> {
        lock(&self.inner.live).values().cloned().collect()
    }

    pub(crate) fn exec_by_token(&self, token: &str) -> Option<(Arc<LiveRun>, Seq)> {
        lock(&self.inner.exec_tokens).get(token).cloned()
    }
}

/// A call without an outside effect made by a running `code.exec` program, journaled with
/// the program's result (`syscall/journal.rs`): its entry and, when traces are exported,
/// its span with the reply it ends with once the entry has its seq.
pub(crate) struct BufferedRead {
    pub(crate) entry: keel_store::NewEntry,
    pub(crate) span: Option<(crate::telemetry::SyscallSpan, crate::error::Reply)>,
}
