//! Syscall dispatch. Every journaled syscall is first matched against the replay journal
//! (after a restart); a live call journals its intent durably before the effect and its
//! result durably before the reply, so a crash at any instant loses no answered step and
//! repeats no completed effect.

use keel_protocol::EventKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use keel_core::lifecycle::Command as Lifecycle;
use keel_core::replay::{Decision, params_hash};
use keel_llm::{DeltaSink, Provider};
use keel_protocol::rpc::{
    CodeExecParams, ErrorKind, HumanAskParams, LlmChatParams, RpcError, RunEmitParams, RunExitParams,
    StateCheckpointParams,
};
use keel_store::{Completion, JournalEntry, NewEntry, RunPatch, Seq};
use keel_types::{EntryStatus, RunState, Usage};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Kernel;
use crate::ipc::{self, IpcCall};
use crate::lock;
use crate::memory;
use crate::now_ms;
use crate::run::LiveRun;

pub(crate) type Reply = Result<Value, RpcError>;

/// A syscall whose params were checked: what the journal records and replays.
enum Call {
    LlmChat(LlmChatParams),
    Tool(ToolCall),
    Exec(CodeExecParams),
    Checkpoint,
    Now,
    Random,
    Ask(String),
    Emit(Value),
    Exit(Value),
    Mem(memory::MemCall),
    Ipc(IpcCall),
    Proc(crate::procs::ProcCall),
}

/// A journal entry complete at once: the call's outcome as it came out.
pub(crate) fn completed_entry(
    attempt: u32,
    method: &str,
    params: Value,
    hash: String,
    outcome: &Reply,
    usage: Usage,
) -> NewEntry {
    let now = now_ms();
    let (status, result, error) = match outcome {
        Ok(result) => (EntryStatus::Ok, Some(result.clone()), None),
        Err(err) => (EntryStatus::Error, None, serde_json::to_value(err).ok()),
    };
    NewEntry {
        method: method.to_owned(),
        params,
        params_hash: hash,
        status,
        result,
        error,
        attempt,
        started_at_ms: now,
        finished_at_ms: Some(now),
        usage,
    }
}

pub(crate) fn internal(err: impl std::fmt::Display) -> RpcError {
    ErrorKind::Internal.error(format!("the kernel failed: {err}"))
}

pub(crate) fn parse<T: DeserializeOwned>(method: &str, params: &Value, shape: &str) -> Result<T, RpcError> {
    serde_json::from_value(params.clone())
        .map_err(|e| ErrorKind::InvalidParams.error(format!("{method}: {e}; expected params {shape}")))
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
fn check(method: &str, params: &Value) -> Result<Call, RpcError> {
    let empty = |m: &str| -> Result<(), RpcError> {
        match params.as_object() {
            Some(map) if map.is_empty() => Ok(()),
            _ => Err(ErrorKind::InvalidParams.error(format!("{m} takes no params; send {{}}"))),
        }
    };
    Ok(match method {
        "llm.chat" => {
            let p: LlmChatParams =
                parse(method, params, "{\"messages\":[{\"role\":\"user\",\"content\":\"...\"}]}")?;
            if p.messages.is_empty() {
                return Err(ErrorKind::InvalidParams
                    .error("llm.chat: `messages` is empty; send at least one message"));
            }
            Call::LlmChat(p)
        }
        "code.exec" => {
            let p: CodeExecParams = parse(
                method,
                params,
                "{\"lang\":\"python\",\"code\":\"...\",\"inputs\":{...},\"limits\":{...}}",
            )?;
            if !matches!(p.lang.as_str(), "python" | "py" | "javascript" | "js" | "cpython") {
                return Err(ErrorKind::InvalidParams.error(format!(
                    "code.exec: language {:?} is not supported; use python, javascript or cpython",
                    p.lang
                )));
            }
            if p.code.len() > MAX_CODE_BYTES {
                return Err(ErrorKind::InvalidParams
                    .error(format!("code.exec: the program is over {MAX_CODE_BYTES} bytes")));
            }
            crate::exec::limits(&p.limits).map_err(|e| ErrorKind::InvalidParams.error(e))?;
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
        "human.ask" => Call::Ask(parse::<HumanAskParams>(method, params, "{\"question\":\"...\"}")?.question),
        "run.emit" => Call::Emit(parse::<RunEmitParams>(method, params, "{\"event\": <any JSON>}")?.event),
        "run.exit" => Call::Exit(parse::<RunExitParams>(method, params, "{\"output\": <any JSON>}")?.output),
        m if memory::is_memory_method(m) && keel_protocol::rpc::METHODS.contains(&m) => {
            Call::Mem(memory::check(method, params)?)
        }
        m if ipc::is_ipc_method(m) && keel_protocol::rpc::METHODS.contains(&m) => {
            Call::Ipc(ipc::check(method, params)?)
        }
        m if crate::procs::is_proc_method(m) => Call::Proc(crate::procs::check(method, params)?),
        other => {
            return Err(ErrorKind::UnknownMethod.error(format!(
                "unknown method {other:?}; protocol 1 has: {}",
                keel_protocol::rpc::METHODS.join(", ")
            )));
        }
    })
}

/// A provider failure as the agent sees it; `data` carries the class, the upstream status
/// and any retry-after, so the compatibility endpoints can answer with the right status.
fn provider_error(err: &keel_llm::Error) -> RpcError {
    let mut error = ErrorKind::ProviderError.error(err.to_string());
    if let Some(data) = error.data.as_mut() {
        if let Some(class) = err.class() {
            data["class"] = json!(class.as_str());
            data["status"] = json!(class.http_status());
        }
        if let Some(after) = err.retry_after() {
            data["retry_after_ms"] = json!(after.as_millis() as u64);
        }
    }
    error
}

/// The reply a journal entry stands for (the same bytes, live or replayed).
fn reply_of(entry: &JournalEntry) -> Reply {
    match entry.status {
        EntryStatus::Ok => Ok(match entry.method.as_str() {
            "llm.chat" => {
                entry.result.as_ref().and_then(|r| r.get("response")).cloned().unwrap_or(Value::Null)
            }
            "state.checkpoint" => json!({ "seq": entry.seq }),
            _ => entry.result.clone().unwrap_or(Value::Null),
        }),
        _ => Err(entry
            .error
            .clone()
            .and_then(|e| serde_json::from_value(e).ok())
            .unwrap_or_else(|| ErrorKind::Internal.error("the journaled call failed"))),
    }
}

impl Kernel {
    pub(crate) async fn syscall(&self, live: &Arc<LiveRun>, method: &str, params: Value) -> Reply {
        self.syscall_streaming(live, method, params, None).await
    }

    /// A syscall whose LLM deltas, if it makes a live streamed call, go to `stream`. A
    /// replayed call sends no deltas: the caller renders the journaled result instead.
    pub(crate) async fn syscall_streaming(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        stream: Option<DeltaSink>,
    ) -> Reply {
        let _busy = crate::swap::Busy::new(&live.inflight);
        if live.exited.load(Ordering::SeqCst) {
            return Err(ErrorKind::RunExited.error(format!(
                "{method}: this run already called run.exit; the agent should end its process now"
            )));
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
        let call = match method {
            // Governed: granted, known, arguments valid against the tool's schema.
            "tool.call" => Call::Tool(self.govern(live, &params).await?),
            _ => check(method, &params)?,
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
                if method == "run.exit" {
                    live.exited.store(true, Ordering::SeqCst);
                }
                self.emit(&live.id, EventKind::Syscall, json!({ "seq": seq, "method": method, "status": entry.status.as_str(), "replayed": true }));
                reply_of(&entry)
            }
            Decision::Reattach { seq } => {
                // The crash window: the intent is journaled, the result is not. Reread it
                // (an operator may have answered meanwhile), else apply the call's policy;
                // every call of protocol 1 is safe to retry (built-in tools are idempotent
                // and get the key run_id:seq; a scripted LLM call has no outside effect).
                let current = self.store().journal(&live.id, seq - 1).await.map_err(internal)?;
                if let Some(entry) =
                    current.into_iter().find(|e| e.seq == seq && e.status != EntryStatus::Pending)
                {
                    return reply_of(&entry);
                }
                self.perform(live, method, call, params, Some(seq), stream).await
            }
            Decision::Live { first } => {
                if first {
                    self.go_live(live).await;
                }
                self.perform(live, method, call, params, None, stream).await
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

    /// Journals a call without an outside effect (a read-only tool) complete at once, as
    /// it came out: a failed read is replayed as the same failure.
    #[allow(clippy::too_many_arguments, reason = "the parts of one journal entry")]
    pub(crate) async fn record_outcome(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
        outcome: &Reply,
        usage: Usage,
        extra: Value,
    ) -> Result<Seq, RpcError> {
        let entry = completed_entry(live.attempt, method, params, hash, outcome, usage);
        let status = entry.status;
        let seq = self.store().append_entry(&live.id, entry).await.map_err(internal)?;
        let mut event = json!({ "seq": seq, "method": method, "status": status.as_str() });
        if let (Some(event), Value::Object(extra)) = (event.as_object_mut(), extra) {
            event.extend(extra);
        }
        self.emit(&live.id, EventKind::Syscall, event);
        Ok(seq)
    }

    /// Journals an entry that is complete at once (no outside effect to wait for).
    async fn record(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
        result: Value,
    ) -> Result<Seq, RpcError> {
        self.record_with_usage(live, method, params, hash, result, Usage::default()).await
    }

    /// [`Kernel::record`] for a read that used something (a memory search's embedding).
    pub(crate) async fn record_with_usage(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
        result: Value,
        usage: Usage,
    ) -> Result<Seq, RpcError> {
        self.record_outcome(live, method, params, hash, &Ok(result), usage, json!({})).await
    }

    /// The seq of a call with an outside effect: the journaled intent being retried after
    /// a crash (`reuse`), else a newly journaled intent.
    pub(crate) async fn intend_unless_retry(
        &self,
        live: &Arc<LiveRun>,
        reuse: Option<Seq>,
        method: &str,
        params: Value,
        hash: String,
    ) -> Result<Seq, RpcError> {
        match reuse {
            Some(seq) => Ok(seq),
            None => self.intend(live, method, params, hash).await,
        }
    }

    /// Journals the intent of a call with an outside effect; returns its seq.
    async fn intend(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
    ) -> Result<Seq, RpcError> {
        let entry = NewEntry {
            method: method.to_owned(),
            params,
            params_hash: hash,
            status: EntryStatus::Pending,
            result: None,
            error: None,
            attempt: live.attempt,
            started_at_ms: now_ms(),
            finished_at_ms: None,
            usage: Usage::default(),
        };
        self.store().append_entry(&live.id, entry).await.map_err(internal)
    }

    /// Records the outcome of a pending entry and reports it as a `syscall` event, with
    /// `extra` fields (tokens, tool name...) merged in.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site per effectful syscall, each passing its own parts"
    )]
    pub(crate) async fn complete(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        method: &str,
        outcome: &Reply,
        record: Value,
        usage: Usage,
        served: bool,
        extra: Value,
    ) -> Result<(), RpcError> {
        let (status, result, error) = match outcome {
            Ok(_) => (EntryStatus::Ok, Some(record), None),
            Err(err) => (EntryStatus::Error, None, Some(serde_json::to_value(err).map_err(internal)?)),
        };
        let completion =
            Completion { status, result, error, finished_at_ms: now_ms(), usage, provider_served: served };
        self.store().complete_entry(&live.id, seq, completion).await.map_err(internal)?;
        let mut event =
            json!({ "seq": seq, "method": method, "status": if outcome.is_ok() { "ok" } else { "error" } });
        if let (Some(event), Value::Object(extra)) = (event.as_object_mut(), extra) {
            event.extend(extra);
        }
        self.emit(&live.id, EventKind::Syscall, event);
        Ok(())
    }

    async fn perform(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        call: Call,
        params: Value,
        reuse: Option<Seq>,
        stream: Option<DeltaSink>,
    ) -> Reply {
        let hash = params_hash(method, &params);
        match call {
            Call::Now => {
                let result = json!({ "unix_ms": now_ms() });
                self.record(live, method, params, hash, result.clone()).await?;
                Ok(result)
            }
            Call::Random => {
                let mut bytes = [0u8; 8];
                keel_types::fill_random(&mut bytes);
                let result = json!({ "value": u64::from_le_bytes(bytes) });
                self.record(live, method, params, hash, result.clone()).await?;
                Ok(result)
            }
            Call::Emit(event) => {
                self.record(live, method, params, hash, json!({})).await?;
                self.emit(&live.id, EventKind::Emit, event);
                Ok(json!({}))
            }
            Call::Exit(output) => {
                self.record(live, method, params, hash, json!({})).await?;
                live.exited.store(true, Ordering::SeqCst);
                let patch = RunPatch { output: Some(Some(output)), ..RunPatch::default() };
                self.store().update_run(&live.id, None, patch).await.map_err(internal)?;
                Ok(json!({}))
            }
            Call::Checkpoint => {
                let seq = self.record(live, method, params, hash, Value::Null).await?;
                // Replay now starts from this checkpoint, so a journal tail the restarted
                // agent never asked for again can no longer be asked for.
                self.abandon_replay_tail(live).await;
                Ok(json!({ "seq": seq }))
            }
            Call::LlmChat(request) => {
                let provider: Arc<dyn Provider> = live
                    .provider
                    .clone()
                    .ok_or_else(|| ErrorKind::NoProvider.error(keel_llm::router::NO_PROVIDER_HELP))?;
                if reuse.is_none() {
                    self.check_loop(live, &hash).await?;
                }
                // Reserve the worst case before the call is journaled or sent, so spend
                // never exceeds the budget however many calls are in flight.
                let input = keel_llm::estimate_input_tokens(&request);
                let max_output = request.max_tokens.map_or(keel_llm::DEFAULT_MAX_OUTPUT_TOKENS, u64::from);
                let worst = Usage {
                    input_tokens: input,
                    output_tokens: max_output,
                    llm_calls: 1,
                    tool_calls: 0,
                    cost_micro_usd: (provider.worst_case_cost_usd(&request, input, max_output) * 1_000_000.0)
                        .ceil() as u64,
                };
                let reservation = self.reserve(live, worst).await?;
                let seq = self
                    .intend_unless_retry(live, reuse, method, params, hash)
                    .await
                    .inspect_err(|_| self.release_budget(live, reservation))?;
                let started = std::time::Instant::now();
                // Calls waiting for the provider's capacity go in priority and fair-share
                // order between tenants; the run shows its place in `keel ps`.
                let caller = keel_llm::ratelimit::Caller {
                    tenant: live.tenant.clone(),
                    priority: live.priority,
                    run: Some(live.id.to_string()),
                };
                let chat = provider.chat(&request, stream.as_ref());
                let (outcome, record, usage, served) =
                    match keel_llm::ratelimit::CALLER.scope(caller, chat).await {
                        Ok(served) => {
                            let response = serde_json::to_value(&served.response).map_err(internal)?;
                            let usage = Usage {
                                input_tokens: served.response.usage.input_tokens,
                                output_tokens: served.response.usage.output_tokens,
                                llm_calls: 1,
                                tool_calls: 0,
                                cost_micro_usd: (served.response.cost_usd * 1_000_000.0).round() as u64,
                            };
                            let record = json!({ "response": response, "provider": served.meta });
                            (Ok(response), record, usage, true)
                        }
                        Err(err) => (
                            Err(provider_error(&err)),
                            Value::Null,
                            Usage { llm_calls: 1, ..Usage::default() },
                            false,
                        ),
                    };
                self.settle_budget(live, reservation, usage);
                let extra = json!({
                    "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                    "duration_ms": started.elapsed().as_millis() as u64,
                });
                self.complete(live, seq, method, &outcome, record, usage, served, extra).await?;
                outcome
            }
            Call::Tool(call) => self.perform_tool(live, method, call, params, hash, reuse).await,
            Call::Proc(crate::procs::ProcCall::Signal { child, signal }) => {
                // Stop, pause and resume are idempotent: journaled once done.
                let result = self.proc_signal(live, &child, &signal).await?;
                self.record(live, method, params, hash, result.clone()).await?;
                Ok(result)
            }
            Call::Proc(call) => {
                let started = match reuse {
                    Some(seq) => live.replay.lock().await.recorded.get(&seq).map(|e| e.started_at_ms),
                    None => None,
                }
                .unwrap_or_else(now_ms);
                let seq = self.intend_unless_retry(live, reuse, method, params, hash).await?;
                let key = format!("{}:{seq}", live.id);
                let outcome = match call {
                    crate::procs::ProcCall::Spawn(spawn) => self.proc_spawn(live, spawn, &key).await,
                    crate::procs::ProcCall::Wait { child, timeout_ms } => {
                        self.proc_wait(live, &child, timeout_ms).await
                    }
                    crate::procs::ProcCall::Sleep { ms } => self.sys_sleep(live, ms, started).await,
                    crate::procs::ProcCall::Signal { .. } => Err(internal("signal is handled above")),
                };
                if matches!(&outcome, Err(err) if err.code == ErrorKind::Cancelled.code()) {
                    return outcome; // Left pending: a relaunched agent asking again waits again.
                }
                let record = outcome.clone().unwrap_or(Value::Null);
                self.complete(live, seq, method, &outcome, record, Usage::default(), false, json!({}))
                    .await?;
                outcome
            }
            Call::Exec(exec) => {
                let seq = self.intend_unless_retry(live, reuse, method, params, hash).await?;
                let started = std::time::Instant::now();
                lock(&live.exec_buffers).insert(seq, Vec::new());
                let outcome = self.exec_code(live, seq, exec).await;
                let reads = lock(&live.exec_buffers).remove(&seq).unwrap_or_default();
                if matches!(&outcome, Err(err) if err.code == ErrorKind::Cancelled.code()) {
                    return outcome; // Left pending: a relaunched agent asking again runs it again.
                }
                let record = outcome.clone().unwrap_or(Value::Null);
                let extra = json!({ "duration_ms": started.elapsed().as_millis() as u64 });
                // The program's reads and its result, submitted together so the store's
                // group commit makes them durable in one go, before the reply.
                let appends = reads.into_iter().map(|entry| self.store().append_entry(&live.id, entry));
                let (appended, completed) = tokio::join!(
                    futures_util::future::join_all(appends),
                    self.complete(live, seq, method, &outcome, record, Usage::default(), false, extra)
                );
                completed?;
                for seq in appended {
                    seq.map_err(internal)?;
                }
                outcome
            }
            Call::Mem(call) => {
                let tenant = live.tenant.clone();
                let embedder = self.embedder();
                if !call.is_write() {
                    // A read has no effect to protect; journaling what it read makes the
                    // replay answer the same however memory changed since (and never
                    // embeds a query again). A read that failed left nothing to replay.
                    let performed =
                        memory::perform(self.store().as_ref(), embedder.as_ref(), &tenant, call, None)
                            .await?;
                    let result = performed.result;
                    self.record_with_usage(live, method, params, hash, result.clone(), performed.usage)
                        .await?;
                    return Ok(result);
                }
                let seq = self.intend_unless_retry(live, reuse, method, params, hash).await?;
                // The key ties the write to its journal entry: retried after a crash
                // (`reuse`), an append or delete answers what it answered the first time.
                let key = format!("{}:{seq}", live.id);
                let performed =
                    memory::perform(self.store().as_ref(), embedder.as_ref(), &tenant, call, Some(&key))
                        .await;
                let usage = performed.as_ref().map(|p| p.usage).unwrap_or_default();
                let outcome = performed.map(|p| p.result);
                let record = outcome.clone().unwrap_or(Value::Null);
                self.complete(live, seq, method, &outcome, record, usage, false, json!({})).await?;
                outcome
            }
            Call::Ipc(call) => {
                let tenant = live.tenant.clone();
                // A name resolves to the run holding it now; the journal keeps the name.
                let call = self.resolve_send(&tenant, call).await?;
                if let IpcCall::Register { name } = &call {
                    let result = self.register_name(&tenant, &live.id, name).await?;
                    self.record(live, method, params, hash, result.clone()).await?;
                    return Ok(result);
                }
                if let IpcCall::Send { to, .. } = &call {
                    // An unknown target (or another tenant's run) leaves nothing to replay.
                    let target = self.store().get_run(to).await.map_err(internal)?;
                    if target.is_none_or(|run| run.tenant != tenant) {
                        return Err(
                            ErrorKind::NotFound.error(format!("ipc.send: no run {to} (of this tenant)"))
                        );
                    }
                }
                if !call.has_intent() {
                    // Idempotent on its own: a crash before the entry is journaled makes
                    // the replayed agent do it again, to the same effect.
                    let result = self.subscribe(&tenant, &live.id, call).await?;
                    self.record(live, method, params, hash, result.clone()).await?;
                    return Ok(result);
                }
                let seq = self.intend_unless_retry(live, reuse, method, params, hash).await?;
                // The key ties the mailbox write to this journal entry: retried after a
                // crash (`reuse`), a send answers its first seq and a receive the message
                // it first took.
                let key = format!("{}:{seq}", live.id);
                let outcome = match call {
                    IpcCall::Recv { timeout_ms } => self.mailbox_recv(live, timeout_ms, &key).await,
                    subscribe @ IpcCall::Subscribe { .. } => {
                        self.subscribe(&tenant, &live.id, subscribe).await
                    }
                    send @ (IpcCall::Send { .. } | IpcCall::Publish { .. }) => {
                        self.mailbox_send(&tenant, Some(&live.id), send, Some(key), || self.is_current(live))
                            .await
                    }
                    IpcCall::SendNamed { .. } | IpcCall::Register { .. } => {
                        Err(internal("names are resolved above"))
                    }
                };
                if matches!(&outcome, Err(err) if err.code == ErrorKind::Cancelled.code()) {
                    // The agent is gone: leave the intent pending, so a relaunched agent
                    // asking again retries it under the same key.
                    return outcome;
                }
                let record = outcome.clone().unwrap_or(Value::Null);
                self.complete(live, seq, method, &outcome, record, Usage::default(), false, json!({}))
                    .await?;
                outcome
            }
            Call::Ask(question) => {
                let seq = self.intend_unless_retry(live, reuse, method, params, hash).await?;
                let answer = self.park_for_answer(live, seq, question).await.map_err(internal)?;
                let _waiting = crate::swap::Busy::new(&live.waiting_calls);
                match answer.await {
                    Ok(text) => Ok(json!({ "answer": text })),
                    Err(_) => {
                        Err(ErrorKind::Cancelled.error("human.ask: the run is ending; no answer will come"))
                    }
                }
            }
        }
    }
}
