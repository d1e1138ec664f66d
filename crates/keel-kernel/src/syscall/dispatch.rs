//! Syscall dispatch. Every journaled syscall is first matched against the replay journal
//! (after a restart); a live call journals its intent durably before the effect and its
//! result durably before the reply, so a crash at any instant loses no answered step and
//! repeats no completed effect.

use keel_protocol::EventKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use keel_core::lifecycle::Command as Lifecycle;
use keel_core::replay::{Decision, params_hash};
use keel_llm::DeltaSink;
use keel_protocol::rpc::{
    CodeExecParams, ErrorKind, HumanAskParams, LlmChatParams, LlmChatResult, RunEmitParams, RunExitParams,
    StateCheckpointParams, UiShowParams,
};
use keel_store::{JournalEntry, RunPatch, Seq};
use keel_types::{EntryStatus, RunState};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Kernel;
use crate::lock;
use crate::now_ms;
use crate::run::LiveRun;
use crate::syscall::ipc::{self, IpcCall};
use crate::syscall::memory;
use crate::syscall::ui;

use super::journal::{self, Effect, Journaling};
use super::{Reply, SyscallError, internal};

/// A syscall whose params were checked: what the journal records and replays.
enum Call {
    LlmChat(LlmChatParams),
    Tool(ToolCall),
    Exec(CodeExecParams),
    Checkpoint,
    Now,
    Random,
    Ask(HumanAskParams),
    Emit(Value),
    Ui(Value),
    Exit(Value),
    Mem(memory::MemCall),
    Ipc(IpcCall),
    Proc(crate::syscall::procs::ProcCall),
}

pub(crate) fn parse<T: DeserializeOwned>(
    method: &str,
    params: &Value,
    shape: &str,
) -> Result<T, SyscallError> {
    // Read from the borrowed tree: params may carry a whole conversation, and a copy of
    // it only to be taken apart again costs an allocation per node.
    T::deserialize(params).map_err(|e| {
        SyscallError::new(ErrorKind::InvalidParams, format!("{method}: {e}; expected params {shape}"))
    })
}

impl Call {
    /// The journaling rule of every method, in one table. (`state.restore`, `tool.list`
    /// and `sys.ping` are answered before a call is checked, and never journaled.)
    fn journaling(&self) -> Journaling {
        use crate::syscall::procs::ProcCall;
        // Performed, then journaled complete; a failure is performed again on replay.
        const COMPLETE: Journaling = Journaling::Complete { failures: false };
        match self {
            // Reads of the clock and randomness, and calls without an outside effect.
            Call::Now | Call::Random | Call::Emit(_) | Call::Exit(_) | Call::Checkpoint => COMPLETE,
            // A block shown is a record, not an effect: its event follows the commit.
            Call::Ui(_) => COMPLETE,
            // A provider call costs money and a program has effects: intent first.
            Call::LlmChat(_) | Call::Exec(_) => Journaling::IntentThenResult,
            // The operator's answer is journaled by `keel answer`.
            Call::Ask(_) => Journaling::IntentAnsweredElsewhere,
            // A read-only tool without approval has no effect to protect; a failed read is
            // replayed as the same failure.
            Call::Tool(call) if call.def.policy.read_only && !call.def.policy.requires_approval => {
                Journaling::Complete { failures: true }
            }
            Call::Tool(_) => Journaling::IntentThenResult,
            Call::Mem(call) if call.is_write() => Journaling::IntentThenResult,
            // A read journals what it read, so replay answers it however memory changed.
            Call::Mem(_) => COMPLETE,
            // A send or receive (not retrying an intent) is journaled in the same commit
            // as its mailbox write (`Kernel::journaled_in_store`, in `perform_ipc`).
            Call::Ipc(call) if call.has_intent() => Journaling::IntentThenResult,
            // Naming and subscribing are idempotent on their own.
            Call::Ipc(_) => COMPLETE,
            // Stop, pause and resume are idempotent: journaled once done.
            Call::Proc(ProcCall::Signal { .. }) => COMPLETE,
            Call::Proc(_) => Journaling::IntentThenResult,
        }
    }
}

/// A tool call that passed governance: granted, known, arguments valid.
pub(crate) struct ToolCall {
    pub(crate) def: keel_tools::ToolDef,
    pub(crate) args: Value,
    /// The seq of the `code.exec` whose program made the call.
    pub(crate) exec: Option<u64>,
}

/// The largest program `code.exec` takes, in bytes.
const MAX_CODE_BYTES: usize = 256 * 1024;

/// Checks params before anything is journaled, so a bad call leaves no trace to replay.
/// Tool calls are governed later, in [`Kernel::govern`].
fn check(method: &str, params: &Value) -> Result<Call, SyscallError> {
    let empty = |m: &str| -> Result<(), SyscallError> {
        match params.as_object() {
            Some(map) if map.is_empty() => Ok(()),
            _ => Err(SyscallError::new(ErrorKind::InvalidParams, format!("{m} takes no params; send {{}}"))),
        }
    };
    Ok(match method {
        "llm.chat" => {
            check_chat(parse(method, params, "{\"messages\":[{\"role\":\"user\",\"content\":\"...\"}]}")?)?
        }
        "code.exec" => {
            let p: CodeExecParams = parse(
                method,
                params,
                "{\"lang\":\"python\",\"code\":\"...\",\"inputs\":{...},\"limits\":{...}}",
            )?;
            if !matches!(p.lang.as_str(), "python" | "py" | "javascript" | "js" | "cpython") {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!(
                        "code.exec: language {:?} is not supported; use python, javascript or cpython",
                        p.lang
                    ),
                ));
            }
            if p.code.len() > MAX_CODE_BYTES {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!("code.exec: the program is over {MAX_CODE_BYTES} bytes"),
                ));
            }
            crate::syscall::exec::limits(&p.limits)
                .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, e))?;
            Call::Exec(p)
        }
        "state.checkpoint" => {
            parse::<StateCheckpointParams>(method, params, "{\"state\": <any JSON>}")?;
            Call::Checkpoint
        }
        "sys.now" => {
            empty(method)?;
            Call::Now
        }
        "sys.random" => {
            empty(method)?;
            Call::Random
        }
        "human.ask" => {
            let ask: HumanAskParams =
                parse(method, params, "{\"question\":\"...\", \"form\"?: <JSON schema of an object>}")?;
            if let Some(form) = &ask.form {
                ui::check_form_schema(form, "form")
                    .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("human.ask: {e}")))?;
            }
            Call::Ask(ask)
        }
        "ui.show" => {
            let show: UiShowParams = parse(
                method,
                params,
                "{\"block\": {\"type\": \"table\"|\"chart\"|\"markdown\"|\"progress\"|\"form\", ...}}",
            )?;
            ui::check_block(&show.block)?;
            Call::Ui(show.block)
        }
        "run.emit" => Call::Emit(parse::<RunEmitParams>(method, params, "{\"event\": <any JSON>}")?.event),
        "run.exit" => Call::Exit(parse::<RunExitParams>(method, params, "{\"output\": <any JSON>}")?.output),
        m if memory::is_memory_method(m) && keel_protocol::rpc::METHODS.contains(&m) => {
            Call::Mem(memory::check(method, params)?)
        }
        m if ipc::is_ipc_method(m) && keel_protocol::rpc::METHODS.contains(&m) => {
            Call::Ipc(ipc::check(method, params)?)
        }
        m if crate::syscall::procs::is_proc_method(m) => {
            Call::Proc(crate::syscall::procs::check(method, params)?)
        }
        other => {
            return Err(SyscallError::new(
                ErrorKind::UnknownMethod,
                format!(
                    "unknown method {other:?}; protocol 1 has: {}",
                    keel_protocol::rpc::METHODS.join(", ")
                ),
            ));
        }
    })
}

/// An `llm.chat` request, however it came (the socket's params, or the gateway's typed
/// request): refused before anything is journaled unless it has a message.
fn check_chat(request: LlmChatParams) -> Result<Call, SyscallError> {
    if request.messages.is_empty() {
        return Err(SyscallError::new(
            ErrorKind::InvalidParams,
            "llm.chat: `messages` is empty; send at least one message",
        ));
    }
    Ok(Call::LlmChat(request))
}

/// The reply a journal entry stands for (the same bytes, live or replayed).
fn reply_of(entry: &JournalEntry) -> Reply {
    match entry.status {
        EntryStatus::Ok => Ok(match entry.method.as_str() {
            "llm.chat" => {
                entry.result.as_ref().and_then(|r| r.get("response")).cloned().unwrap_or(Value::Null)
            }
            "state.checkpoint" | "ui.show" => json!({ "seq": entry.seq }),
            _ => entry.result.clone().unwrap_or(Value::Null),
        }),
        _ => Err(entry
            .error
            .clone()
            .and_then(|e| serde_json::from_value(e).ok())
            .map(SyscallError::from_rpc)
            .unwrap_or_else(|| SyscallError::new(ErrorKind::Internal, "the journaled call failed"))),
    }
}

/// What the caller of a syscall hears besides its reply (the gateway does; the socket
/// hears nothing): the deltas of a live streamed LLM call, and the seq of an `llm.chat`'s
/// journal entry as soon as it has one (its intent durable, or its entry found on
/// replay), before any delta, so the caller can name what it answers after the entry.
/// With `result`, a live `llm.chat` hands its result over typed, as the provider gave it,
/// and its reply is `null`: the gateway renders the result without the JSON tree the
/// socket's reply would be, a copy of it and a parse back. It is sent before the result
/// is durable, so the caller takes it only once the reply is `Ok` (the result then is);
/// a call answered from the journal sends nothing and replies with the journaled JSON.
#[derive(Default)]
pub(crate) struct Listener {
    pub(crate) deltas: Option<DeltaSink>,
    pub(crate) entry: Option<tokio::sync::oneshot::Sender<Seq>>,
    pub(crate) result: Option<tokio::sync::oneshot::Sender<LlmChatResult>>,
}

impl Listener {
    pub(super) fn journaled(&mut self, seq: Seq) {
        if let Some(entry) = self.entry.take() {
            let _ = entry.send(seq);
        }
    }
}

impl Kernel {
    pub(crate) async fn syscall(&self, live: &Arc<LiveRun>, method: &str, params: Value) -> Reply {
        self.syscall_streaming(live, method, params, Listener::default()).await
    }

    /// Puts `run.exit`'s output on the run, after the call is journaled (live, or answered
    /// from the journal on replay). Written while the agent waits for the reply, so a store
    /// outage delays the exit rather than lose the output.
    async fn keep_exit_output(&self, live: &Arc<LiveRun>, output: Value) -> Result<(), SyscallError> {
        let patch = RunPatch { output: Some(Some(output)), ..RunPatch::default() };
        self.while_current_idempotent(live, || self.store().update_run(&live.id, None, patch.clone()))
            .await
            .map_err(internal)?;
        Ok(())
    }

    /// A syscall whose caller hears more than its result (see [`Listener`]). A replayed
    /// call sends no deltas: the caller renders the journaled result instead.
    pub(crate) async fn syscall_streaming(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        listener: Listener,
    ) -> Reply {
        self.serve(live, method, params, None, listener).await
    }

    /// `llm.chat` for a caller that already holds the request typed (the gateway): its
    /// params are the request's JSON, journaled and hashed as the socket's would be, and
    /// it is checked as itself instead of being parsed back from them.
    pub(crate) async fn chat_streaming(
        &self,
        live: &Arc<LiveRun>,
        request: LlmChatParams,
        listener: Listener,
    ) -> Reply {
        let params = serde_json::to_value(&request).map_err(|e| {
            SyscallError::new(ErrorKind::InvalidParams, format!("the request cannot be encoded: {e}"))
        })?;
        self.serve(live, "llm.chat", params, Some(check_chat(request)?), listener).await
    }

    /// Serves one syscall; `checked` is its call when the caller checked it already.
    async fn serve(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        checked: Option<Call>,
        mut listener: Listener,
    ) -> Reply {
        // A draining node lets the calls in flight finish and starts no new one: the
        // agent is handed to another node, which answers this call after replay.
        if self.inner.draining.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let _busy = crate::swap::Busy::new(&live.inflight);
        if method == "ipc.send" && params.get("recv").is_some() {
            // Two calls in one request, each journaled as itself.
            return Box::pin(self.send_then_recv(live, params)).await;
        }
        let _timer = self.inner.metrics.syscall(method);
        if live.exited.load(Ordering::SeqCst) {
            return Err(SyscallError::new(
                ErrorKind::RunExited,
                format!("{method}: this run already called run.exit; the agent should end its process now"),
            ));
        }
        match method {
            "state.restore" => return self.restore(live).await,
            "tool.list" => {
                let tools: Vec<_> = self.granted_tools(live).await.iter().map(crate::tools::spec).collect();
                return Ok(json!({ "tools": tools }));
            }
            // A no-op for liveness checks and for measuring the channel; not journaled.
            "sys.ping" => return Ok(json!({})),
            _ => {}
        }
        let call = match (checked, method) {
            (Some(call), _) => call,
            // Governed: granted, known, arguments valid against the tool's schema.
            (None, "tool.call") => Call::Tool(Box::pin(self.govern(live, &params)).await?),
            (None, _) => check(method, &params)?,
        };
        let hash = params_hash(method, &params);
        let (decision, recorded) = {
            let mut replay = live.replay.lock().await;
            let decision = replay.matcher.decide(method, &hash);
            let recorded = match &decision {
                Decision::Replay { seq } | Decision::Reattach { seq } => replay.recorded.get(seq).cloned(),
                Decision::Live { .. } => None,
            };
            (decision, recorded)
        };
        match decision {
            Decision::Replay { seq } => {
                let entry = recorded.ok_or_else(|| internal(format!("journal entry {seq} vanished")))?;
                if let Call::Exit(output) = &call {
                    live.exited.store(true, Ordering::SeqCst);
                    // A crash after `run.exit` was journaled and before its output was on
                    // the run leaves the run without it: written again, the same value.
                    Box::pin(self.keep_exit_output(live, output.clone())).await?;
                }
                self.emit(&live.id, EventKind::Syscall, json!({ "seq": seq, "method": method, "status": entry.status.as_str(), "replayed": true }));
                self.inner.telemetry.replayed(
                    &live.id,
                    live.attempt,
                    method,
                    &params,
                    seq,
                    entry.status != EntryStatus::Ok,
                );
                listener.journaled(seq);
                reply_of(&entry)
            }
            Decision::Reattach { seq } => {
                // The crash window: the intent is journaled, the result is not. Reread it
                // (an operator may have answered meanwhile), else apply the call's policy;
                // every call of protocol 1 is safe to retry (built-in tools are idempotent
                // and get the key run_id:seq; a scripted LLM call has no outside effect).
                let current = Box::pin(self.store().journal(&live.id, seq - 1)).await.map_err(internal)?;
                if let Some(entry) =
                    current.into_iter().find(|e| e.seq == seq && e.status != EntryStatus::Pending)
                {
                    self.inner.telemetry.replayed(
                        &live.id,
                        live.attempt,
                        method,
                        &params,
                        seq,
                        entry.status != EntryStatus::Ok,
                    );
                    listener.journaled(seq);
                    return reply_of(&entry);
                }
                self.perform(live, method, call, params, hash, Some(seq), listener).await
            }
            Decision::Live { first } => {
                if first {
                    Box::pin(self.go_live(live)).await;
                }
                self.perform(live, method, call, params, hash, None, listener).await
            }
        }
    }

    /// The first call without a journaled match ends replay: `recovering` becomes `running`.
    async fn go_live(&self, live: &Arc<LiveRun>) {
        if let Ok(record) = self.get(&live.id).await
            && record.state == RunState::Recovering
            && let Err(err) = self.transition(&live.id, Lifecycle::Recovered, RunPatch::default()).await
        {
            tracing::warn!(run = %live.id, "could not mark the run recovered: {err}");
        }
    }

    async fn restore(&self, live: &Arc<LiveRun>) -> Reply {
        let checkpoint = self.store().latest_entry(&live.id, "state.checkpoint").await.map_err(internal)?;
        let state = checkpoint.and_then(|e| e.params.get("state").cloned()).unwrap_or(Value::Null);
        Ok(json!({ "state": state }))
    }

    /// Performs a checked call under its journaling rule (see `journal.rs`). Every family
    /// with a large future is awaited boxed, `llm.chat` too: a future is as large as its
    /// largest state, and nesting one in another's state roughly doubles it at each level
    /// (the callee's arguments are kept beside its future), so a gateway call's whole
    /// future was 16.5 KB, and copied at each level on every call. With the
    /// boxes (`serve` boxes what it awaits off the usual path the same way), `llm.chat`'s
    /// future is 3.3 KB and the whole call's 6.4 KB (sizes printed with `size_of_val` in a
    /// release build, not kept).
    #[allow(clippy::too_many_arguments, reason = "the parts of one checked call")]
    async fn perform(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        call: Call,
        params: Value,
        hash: String,
        reuse: Option<Seq>,
        listener: Listener,
    ) -> Reply {
        let journal = journal::Call { live, method, params, hash, reuse };
        let how = call.journaling();
        match call {
            Call::Now => {
                let now = json!({ "unix_ms": now_ms() });
                self.journaled(journal, how, |_| async { Effect::reply(Ok(now)) }).await.reply
            }
            Call::Random => {
                let mut bytes = [0u8; 8];
                keel_types::fill_random(&mut bytes);
                let value = json!({ "value": u64::from_le_bytes(bytes) });
                self.journaled(journal, how, |_| async { Effect::reply(Ok(value)) }).await.reply
            }
            Call::Emit(event) => {
                let reply = self.journaled(journal, how, |_| async { Effect::reply(Ok(json!({}))) }).await;
                if reply.reply.is_ok() {
                    self.emit(&live.id, EventKind::Emit, event);
                }
                reply.reply
            }
            Call::Ui(block) => {
                let done = self.journaled(journal, how, |_| async { Effect::reply(Ok(Value::Null)) }).await;
                done.reply?;
                let seq = done.seq.ok_or_else(|| internal("ui.show was journaled without a seq"))?;
                // After the commit, so a block is shown once: a replayed call is answered
                // from the journal above and emits nothing.
                self.emit(&live.id, EventKind::Ui, json!({ "seq": seq, "block": block }));
                Ok(json!({ "seq": seq }))
            }
            Call::Exit(output) => {
                self.journaled(journal, how, |_| async { Effect::reply(Ok(json!({}))) }).await.reply?;
                live.exited.store(true, Ordering::SeqCst);
                self.keep_exit_output(live, output).await?;
                Ok(json!({}))
            }
            Call::Checkpoint => {
                let done = self.journaled(journal, how, |_| async { Effect::reply(Ok(Value::Null)) }).await;
                done.reply?;
                // Replay now starts from this checkpoint, so a journal tail the restarted
                // agent never asked for again can no longer be asked for.
                self.abandon_replay_tail(live).await;
                Ok(json!({ "seq": done.seq }))
            }
            Call::LlmChat(request) => Box::pin(self.llm_chat(journal, how, request, listener)).await,
            Call::Tool(call) => Box::pin(self.perform_tool(journal, how, call)).await,
            Call::Proc(crate::syscall::procs::ProcCall::Signal { child, signal }) => {
                let signalled = self.proc_signal(live, &child, &signal).await;
                self.journaled(journal, how, |_| async { Effect::reply(signalled) }).await.reply
            }
            Call::Proc(call) => {
                // A timer runs from its journaled intent's start, across crashes.
                let started = match reuse {
                    Some(seq) => live.replay.lock().await.recorded.get(&seq).map(|e| e.started_at_ms),
                    None => None,
                }
                .unwrap_or_else(now_ms);
                let effect = |seq: Option<Seq>| async move {
                    let key = format!("{}:{}", live.id, seq.unwrap_or_default());
                    Effect::reply(match call {
                        crate::syscall::procs::ProcCall::Spawn(spawn) => {
                            self.proc_spawn(live, spawn, &key).await
                        }
                        crate::syscall::procs::ProcCall::Wait { child, timeout_ms } => {
                            self.proc_wait(live, &child, timeout_ms).await
                        }
                        crate::syscall::procs::ProcCall::Sleep { ms } => {
                            self.sys_sleep(live, ms, started).await
                        }
                        crate::syscall::procs::ProcCall::Signal { .. } => {
                            Err(internal("signal is handled above"))
                        }
                    })
                };
                Box::pin(self.journaled(journal, how, effect)).await.reply
            }
            Call::Exec(exec) => {
                let effect = |seq: Option<Seq>| async move {
                    let seq = seq.unwrap_or_default();
                    let started = std::time::Instant::now();
                    lock(&live.exec_buffers).insert(seq, Vec::new());
                    let reply = self.exec_code(live, seq, exec).await;
                    // The program's reads are journaled with its result, in one commit.
                    let reads = lock(&live.exec_buffers).remove(&seq).unwrap_or_default();
                    let mut effect = Effect::reply(reply)
                        .event(json!({ "duration_ms": started.elapsed().as_millis() as u64 }));
                    effect.with = reads;
                    effect
                };
                Box::pin(self.journaled(journal, how, effect)).await.reply
            }
            Call::Mem(call) => {
                let tenant = live.tenant.clone();
                let embedder = self.embedder();
                // A read has no effect to protect; journaling what it read makes the
                // replay answer the same however memory changed since (and never embeds
                // a query again). A read that failed leaves nothing to replay. A write's
                // key ties it to its journal entry: retried after a crash, an append or
                // delete answers what it answered the first time.
                let effect = |seq: Option<Seq>| async move {
                    let key = seq.map(|seq| format!("{}:{seq}", live.id));
                    let performed = memory::perform(
                        self.store().as_ref(),
                        embedder.as_ref(),
                        &tenant,
                        call,
                        key.as_deref(),
                    )
                    .await;
                    if let Ok(p) = &performed {
                        self.inner.metrics.embedded(&tenant, embedder.model(), p.embed_calls, &p.usage);
                    }
                    let usage = performed.as_ref().map(|p| p.usage).unwrap_or_default();
                    Effect::reply(performed.map(|p| p.result)).usage(usage)
                };
                Box::pin(self.journaled(journal, how, effect)).await.reply
            }
            Call::Ipc(call) => Box::pin(self.perform_ipc(journal, how, call)).await,
            Call::Ask(question) => {
                let effect = |seq: Option<Seq>| async move {
                    let seq = seq.unwrap_or_default();
                    let answer = match self.park_for_answer(live, seq, question).await {
                        Ok(answer) => answer,
                        Err(err) => return Effect::reply(Err(internal(err))),
                    };
                    let _waiting = crate::swap::Busy::new(&live.waiting_calls);
                    Effect::reply(match answer.await {
                        Ok(result) => Ok(result),
                        Err(_) => Err(SyscallError::new(
                            ErrorKind::Cancelled,
                            "human.ask: the run is ending; no answer will come",
                        )),
                    })
                };
                Box::pin(self.journaled(journal, how, effect)).await.reply
            }
        }
    }
}
