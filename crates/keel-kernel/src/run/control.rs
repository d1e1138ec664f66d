//! Operator commands on a run ([`Command`]): pause, resume, stop, answer, and the
//! `human.ask` question they answer.

use keel_protocol::EventKind;
use keel_protocol::rpc::HumanAskParams;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_core::lifecycle::{self, Command as Lifecycle};
use keel_sandbox::tree;
use keel_store::{Completion, RunPatch, RunRecord, Seq};
use keel_types::{EntryStatus, RunId, RunState, WaitReason};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::run::{CreateRun, LiveRun, PendingAsk, RunSpec};
use crate::{Error, Result};
use crate::{Kernel, lock, now_ms};

/// Operator commands, from the HTTP API or the CLI. Each documents when it is legal.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "one command per API request; boxing buys nothing")]
pub enum Command {
    /// Start a new run. Always legal for a valid request.
    Create(CreateRun),
    /// Freeze a running, waiting or recovering run's processes (SIGSTOP).
    Pause(RunId),
    /// Continue a paused run (relaunched by replay if its process is gone).
    Resume(RunId),
    /// End a run that has not ended: SIGTERM, then SIGKILL after the grace period.
    Stop { run: RunId, grace: Option<Duration> },
    /// Answer the run's open `human.ask`: text for a plain question; for a question with a
    /// form, a value valid against its schema (or text holding one as JSON).
    Answer { run: RunId, answer: Answer },
    /// Add to a run that has not ended's budget; with `continue_loop`, let a run parked
    /// by the loop detector go on.
    TopUp { run: RunId, add: keel_protocol::api::BudgetParams, continue_loop: bool },
    /// Approve or deny a tool call parked for approval (`call` is its journal seq).
    Decide { run: RunId, call: Seq, approve: bool, note: Option<String> },
}

/// An operator's answer to a `human.ask` (`POST /v1/runs/{id}/answer`'s `text` or `value`).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Text(String),
    Value(Value),
}

/// What the agent receives for `answer` to a question asked with `form` (`None`: a plain
/// question), or why the answer is refused (nothing is recorded then). A plain question
/// gets `{answer}`; a form question `{answer: <the value as JSON text>, value}`.
fn answer_result(run: &RunId, form: Option<&Value>, answer: Answer) -> Result<Value> {
    let Some(schema) = form else {
        return match answer {
            Answer::Text(text) => Ok(json!({ "answer": text })),
            Answer::Value(_) => Err(Error::InvalidRequest(format!(
                "run {run}'s question has no form, so it takes a text answer: send {{\"text\": \"...\"}} (keel answer {run} --text \"...\")"
            ))),
        };
    };
    let value = match answer {
        Answer::Value(value) => value,
        Answer::Text(text) => serde_json::from_str(&text).map_err(|e| {
            Error::InvalidRequest(format!(
                "run {run}'s question has a form, and the text answer is not JSON ({e}); send the form's value as {{\"value\": {{...}}}} or as JSON text (keel answer {run} --json '{{...}}')"
            ))
        })?,
    };
    keel_tools::schema::validate_at(schema, &value, "value").map_err(|e| {
        Error::InvalidRequest(format!(
            "the answer does not match the question's form: {e}; `keel inspect {run}` shows the form"
        ))
    })?;
    Ok(json!({ "answer": value.to_string(), "value": value }))
}

impl Kernel {
    /// Tells the agent, as an event it receives with `ipc.recv`, that an operator paused,
    /// resumed or stopped it (best effort: a full mailbox skips the event, not the action).
    async fn control_event(&self, record: &RunRecord, signal: &str) {
        let _ = self.deliver_signal(&record.tenant, None, &record.id, signal, Value::Null, None).await;
    }

    pub(crate) async fn pause(&self, run: &RunId) -> Result<RunRecord> {
        let record = self.get(run).await?;
        lifecycle::transition(record.state, Lifecycle::Pause)?;
        self.control_event(&record, "pause").await;
        if let Some(live) = self.live(run) {
            tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGSTOP);
        }
        self.transition(run, Lifecycle::Pause, RunPatch::default()).await
    }

    pub(crate) async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let record = self.get(run).await?;
        let Some(live) = self.live(run) else {
            // The process is gone (the kernel restarted while the run was paused): resume
            // it by replay, like any interrupted run.
            let waiting = self.pending_ask_entry(run).await?.is_some();
            self.transition(run, Lifecycle::Resume { waiting }, RunPatch::default()).await?;
            let record = self.transition(run, Lifecycle::KernelRestart, RunPatch::default()).await?;
            return self.launch(record, true).await;
        };
        let waiting = lock(&live.ask).is_some();
        lifecycle::transition(record.state, Lifecycle::Resume { waiting })?;
        let updated = self.transition(run, Lifecycle::Resume { waiting }, RunPatch::default()).await?;
        self.control_event(&record, "resume").await;
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGCONT);
        Ok(updated)
    }

    pub(crate) async fn stop(&self, run: &RunId, grace: Option<Duration>) -> Result<RunRecord> {
        let record = self.get(run).await?;
        lifecycle::transition(record.state, Lifecycle::Cancel)?;
        // Descendants go too (in the background: each has its own grace period).
        let _ = self.inner.stop_trees.send((run.clone(), grace));
        let Some(live) = self.live(run) else {
            return self
                .transition(run, Lifecycle::Cancel, RunPatch { pid: Some(None), ..RunPatch::default() })
                .await;
        };
        if live.stopping.swap(true, Ordering::SeqCst) {
            return Ok(record); // Already stopping.
        }
        let grace = grace
            .or_else(|| RunSpec::of(&record).ok()?.stop_grace_secs.map(Duration::from_secs))
            .unwrap_or(self.inner.default_stop_grace);
        self.emit(run, EventKind::Stop, json!({ "grace_secs": grace.as_secs_f64() }));
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGTERM);
        // A stopped (paused) process only sees SIGTERM once it runs again.
        tree::signal_tree(Some(live.pid), run.as_str(), Signal::SIGCONT);
        let kernel = self.clone();
        let dying = live.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if kernel.live(&dying.id).is_some_and(|current| Arc::ptr_eq(&current, &dying)) {
                dying.kill_tree();
            }
        });
        // The agent can see why it got SIGTERM and use its grace period to wrap up. Best
        // effort, and after the signals, so nothing can hold the stop back.
        self.control_event(&record, "stop").await;
        Ok(record)
    }

    pub(crate) async fn answer(&self, run: &RunId, answer: Answer) -> Result<RunRecord> {
        let record = self.get(run).await?;
        if record.state.is_terminal() {
            return Err(Error::Conflict(format!(
                "run {run} has ended ({}); there is nothing to answer",
                record.state
            )));
        }
        let live = self.live(run);
        let pending = live.as_ref().and_then(|l| lock(&l.ask).take());
        let (seq, form) = match &pending {
            Some(ask) => (ask.seq, ask.question.form.clone()),
            None => match self.pending_ask_entry(run).await? {
                Some((seq, question)) => (seq, question.form),
                None => {
                    return Err(Error::Conflict(format!(
                        "run {run} is {} and has no open question; answer only runs waiting for a human (`keel ps` shows them as waiting)",
                        record.state
                    )));
                }
            },
        };
        // A refused answer records nothing and leaves the question open.
        let result = match answer_result(run, form.as_ref(), answer) {
            Ok(result) => result,
            Err(err) => {
                if let (Some(live), Some(ask)) = (&live, pending) {
                    *lock(&live.ask) = Some(ask);
                }
                return Err(err);
            }
        };
        let completion = Completion {
            status: EntryStatus::Ok,
            result: Some(result.clone()),
            error: None,
            finished_at_ms: now_ms(),
            usage: Default::default(),
            provider_served: false,
        };
        self.inner.store.complete_entry(run, seq, &completion).await?;
        let mut event = json!({ "seq": seq, "text": result["answer"] });
        if let Some(value) = result.get("value") {
            event["value"] = value.clone();
        }
        self.emit(run, EventKind::Answer, event);
        match pending {
            Some(ask) => {
                let _ = ask.reply.send(result);
            }
            // Swapped out (or not relaunched yet): the answer brings it back by replay,
            // which moves it on; there is no process here to wake.
            None => {
                self.request_wake(run);
                return self.get(run).await;
            }
        }
        match self.get(run).await?.state {
            RunState::Waiting => self.transition(run, Lifecycle::Wake, RunPatch::default()).await,
            _ => self.get(run).await,
        }
    }

    /// The newest `human.ask` intent without a result, from the store.
    pub(crate) async fn pending_ask_entry(&self, run: &RunId) -> Result<Option<(Seq, HumanAskParams)>> {
        let entries = self.inner.store.journal(run, 0).await?;
        Ok(entries
            .into_iter()
            .rev()
            .find(|e| e.method == "human.ask" && e.status == EntryStatus::Pending)
            .map(|e| {
                // Checked before it was journaled; a damaged entry still reads as a question.
                let question = serde_json::from_value(e.params.clone()).unwrap_or_else(|_| HumanAskParams {
                    question: e.params.get("question").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    form: None,
                });
                (e.seq, question)
            }))
    }

    /// Registers an open question of a live run and parks it; resolves with the answer.
    pub(crate) async fn park_for_answer(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        question: HumanAskParams,
    ) -> Result<oneshot::Receiver<Value>> {
        let (tx, rx) = oneshot::channel();
        let mut event = json!({ "seq": seq, "question": question.question });
        if let Some(form) = &question.form {
            event["form"] = form.clone();
        }
        *lock(&live.ask) = Some(PendingAsk { seq, question, reply: tx });
        let state = self.get(&live.id).await?.state;
        if state == RunState::Recovering {
            self.transition(&live.id, Lifecycle::Recovered, RunPatch::default()).await?;
        }
        if state != RunState::Paused {
            self.transition(&live.id, Lifecycle::Park(WaitReason::Human), RunPatch::default()).await?;
        }
        self.emit(&live.id, EventKind::Question, event);
        Ok(rx)
    }
}
