//! Governed tool calls (DESIGN section 7). Before anything is journaled a call must be
//! granted to the run (else it is denied and audited), name a known tool and carry
//! arguments valid against the tool's JSON schema. Then: its rate limit, a worst-case
//! budget reservation, the journaled intent, approval when the tool requires it, and the
//! tool's crash-window policy when the intent was left without a result by a crash
//! (`retry` with the same idempotency key, `ask` an operator, or `fail`). Read-only tools
//! have no effect to protect, so they are journaled complete at once, in one commit.

use keel_protocol::EventKind;
use std::sync::Arc;
use std::time::Instant;

use keel_protocol::rpc::{ErrorKind, ToolCallParams};
use keel_store::Seq;
use keel_tools::CrashPolicy;
use keel_types::Usage;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Kernel;
use crate::approvals::ApprovalKind;
use crate::run::LiveRun;
use crate::syscall::{Effect, JournalCall, Journaling, Reply, SyscallError, ToolCall};

/// Arguments larger than this are audited by digest, not in full.
const AUDIT_ARGS_BYTES: usize = 4096;

fn audit_args(args: &Value) -> Value {
    let text = args.to_string();
    if text.len() <= AUDIT_ARGS_BYTES {
        return args.clone();
    }
    use sha2::Digest;
    json!({ "sha256": keel_types::hex(&sha2::Sha256::digest(text.as_bytes())), "bytes": text.len() })
}

fn tool_error(name: &str, err: String) -> SyscallError {
    SyscallError::new(ErrorKind::ToolError, format!("tool {name} failed: {err}"))
}

impl Kernel {
    /// Grant, existence and schema: a call that fails any is refused before it is
    /// journaled (a denial is audited).
    pub(crate) async fn govern(&self, live: &Arc<LiveRun>, params: &Value) -> Result<ToolCall, SyscallError> {
        let p = ToolCallParams::deserialize(params).map_err(|e| {
            SyscallError::new(
                ErrorKind::InvalidParams,
                format!("tool.call: {e}; expected params {{\"name\":\"echo\",\"args\":{{...}}}}"),
            )
        })?;
        if !p.args.is_object() {
            return Err(SyscallError::new(
                ErrorKind::InvalidParams,
                format!("tool.call: `args` of {} must be a JSON object", p.name),
            ));
        }
        // The grant is checked before the name is looked up, so a run learns nothing of
        // the tools outside its grant.
        if !live.grant.allows(&p.name) {
            self.audit_run(
                &live.id,
                &live.tenant,
                "agent",
                "tool.denied",
                &p.name,
                "denied",
                json!({ "args": audit_args(&p.args), "exec": p.exec, "grant": live.grant.patterns() }),
            );
            self.emit(&live.id, EventKind::Denied, json!({ "tool": p.name }));
            return Err(SyscallError::new(
                ErrorKind::Denied,
                format!(
                    "tool {} is not granted to this run (its grant: {}); an operator can start the run with `--grant {}`",
                    p.name,
                    live.grant.patterns().join(", "),
                    p.name
                ),
            ));
        }
        let def = self.inner.tools.resolve(&p.name).await.map_err(|e| {
            SyscallError::new(
                ErrorKind::NotFound,
                format!("{e}; `tool.list` shows the tools this run may call"),
            )
        })?;
        keel_tools::schema::validate(&def.input_schema, &p.args)
            .map_err(|e| SyscallError::new(ErrorKind::InvalidParams, format!("{}: {e}", p.name)))?;
        Ok(ToolCall { def, args: p.args, exec: p.exec })
    }

    /// A governed call: its rate limit, a budget reservation, then journaled by its
    /// policy: a read-only tool without approval is run and journaled complete at once
    /// (a failed read is replayed as the same failure); any other gets its intent
    /// journaled, waits for approval and the crash-window policy (`gate`), then runs.
    pub(crate) async fn perform_tool(
        &self,
        journal: JournalCall<'_>,
        how: Journaling,
        call: ToolCall,
    ) -> Reply {
        let live = journal.live;
        let ToolCall { def, args, exec } = call;
        let name = def.name.clone();
        if journal.reuse.is_none() {
            self.inner
                .tools
                .rate_limit(&def)
                .await
                .map_err(|e| SyscallError::new(ErrorKind::ToolError, e))?;
        }
        let usage = Usage { tool_calls: 1, ..Usage::default() };
        let reservation = self.reserve(live, usage).await?;
        let started = Instant::now();
        if let Journaling::Complete { .. } = how {
            // No effect to protect: run it, then journal what it answered.
            let key = format!("{}:read", live.id);
            // A program's read is journaled with the program's result: its span starts now.
            let span = exec.and_then(|_| {
                self.inner.telemetry.syscall(&live.id, live.attempt, journal.method, &journal.params)
            });
            let outcome = self
                .run_tool(live, &def, args.clone(), &key, false)
                .await
                .map(|r| json!({ "result": r }))
                .map_err(|e| tool_error(&name, e));
            self.settle_budget(live, reservation, usage);
            if let Some(exec) = exec
                && self.buffer_exec_read(
                    live,
                    exec,
                    journal.method,
                    &journal.params,
                    &journal.hash,
                    &outcome,
                    usage,
                    span,
                )
            {
                self.audit_call(live, 0, &name, &args, Some(exec), &outcome, started);
                return outcome;
            }
            let event = json!({ "tool": name, "duration_ms": started.elapsed().as_millis() as u64 });
            let effect = Effect::reply(outcome).usage(usage).event(event);
            let done = self.journaled(journal, how, |_| async { effect }).await;
            if let Some(seq) = done.seq {
                self.audit_call(live, seq, &name, &args, exec, &done.reply, started);
            }
            return done.reply;
        }
        let retried = journal.reuse.is_some();
        let (def, args) = (&def, &args);
        let effect = |seq: Option<Seq>| async move {
            let seq = seq.unwrap_or_default();
            let reply = match self.gate(live, def, args, seq, retried).await {
                Ok(recovering) => {
                    // The key ties the effect to this journal entry: a retry after a crash
                    // passes the same one, so a tool can make its effect happen once.
                    let key = format!("{}:{seq}", live.id);
                    self.run_tool(live, def, args.clone(), &key, recovering)
                        .await
                        .map(|r| json!({ "result": r }))
                        .map_err(|e| tool_error(&name, e))
                }
                Err(err) if err.is(ErrorKind::Cancelled) => {
                    // The run is ending while the call waited for an operator: the intent
                    // stays pending; a relaunched agent asking again waits again.
                    self.release_budget(live, reservation);
                    return Effect::reply(Err(err));
                }
                Err(err) => Err(err),
            };
            self.settle_budget(live, reservation, usage);
            let event = json!({ "tool": name, "duration_ms": started.elapsed().as_millis() as u64 });
            Effect::reply(reply).usage(usage).event(event)
        };
        let done = self.journaled(journal, how, effect).await;
        match done.seq {
            None => self.release_budget(live, reservation), // The intent failed: never ran.
            Some(seq) if !matches!(&done.reply, Err(err) if err.is(ErrorKind::Cancelled)) => {
                self.audit_call(live, seq, &def.name, args, exec, &done.reply, started);
            }
            Some(_) => {}
        }
        done.reply
    }

    /// A read-only call made by a running `code.exec` program is journaled with the
    /// `code.exec`'s result, in the same commit: until then nothing depends on it (a
    /// crash makes the `code.exec` run again, and a read is safe to redo). False when the
    /// exec has no buffer (its program runs outside this kernel's workers).
    #[allow(clippy::too_many_arguments, reason = "the parts of one journal entry")]
    fn buffer_exec_read(
        &self,
        live: &Arc<LiveRun>,
        exec: u64,
        method: &str,
        params: &Value,
        hash: &str,
        outcome: &Reply,
        usage: Usage,
        span: Option<crate::telemetry::SyscallSpan>,
    ) -> bool {
        let mut buffers = live.exec_buffers.lock().unwrap_or_else(|p| p.into_inner());
        let Some(buffer) = buffers.get_mut(&exec) else { return false };
        buffer.push(crate::run::BufferedRead {
            entry: crate::syscall::completed_entry(
                live.attempt,
                method,
                params.clone(),
                hash.to_owned(),
                outcome,
                usage,
            ),
            span: span.map(|span| (span, outcome.clone())),
        });
        true
    }

    /// Approval, and after a crash the tool's crash-window policy. `Ok` means: run it;
    /// `Ok(true)` that this runs a call a crash cut off (a tool that can ask its remote
    /// what the first attempt did, an A2A agent, asks before doing it again).
    async fn gate(
        &self,
        live: &Arc<LiveRun>,
        def: &keel_tools::ToolDef,
        args: &Value,
        seq: Seq,
        retried: bool,
    ) -> Result<bool, SyscallError> {
        let name = &def.name;
        if def.policy.requires_approval {
            // Decided before the crash: the tool may have started. Decided only now: it
            // never ran, so there is no crash window to resolve.
            let decided_before = self.stored_decision(&live.id, seq, ApprovalKind::Required).await?.is_some();
            let decision = self.await_approval(live, seq, name, args, ApprovalKind::Required).await?;
            if !decision.approve {
                return Err(SyscallError::new(
                    ErrorKind::Denied,
                    format!(
                        "tool {name} (call {seq}) was denied by an operator{}",
                        decision.note.map(|n| format!(": {n}")).unwrap_or_default()
                    ),
                ));
            }
            if !(retried && decided_before) {
                return Ok(false);
            }
        } else if !retried {
            return Ok(false);
        }
        self.emit(
            &live.id,
            EventKind::Interrupted,
            json!({ "call": seq, "tool": name, "policy": def.policy.crash.as_str() }),
        );
        match def.policy.crash {
            CrashPolicy::Retry => Ok(true),
            CrashPolicy::Ask => {
                let decision =
                    self.await_approval(live, seq, name, args, ApprovalKind::RetryAfterCrash).await?;
                if decision.approve {
                    Ok(true)
                } else {
                    Err(SyscallError::new(
                        ErrorKind::ToolError,
                        format!(
                            "tool {name} (call {seq}) was interrupted by a kernel crash and an operator chose not to run it again{}",
                            decision.note.map(|n| format!(": {n}")).unwrap_or_default()
                        ),
                    ))
                }
            }
            CrashPolicy::Fail => Err(SyscallError::new(
                ErrorKind::ToolError,
                format!(
                    "tool {name} (call {seq}) was interrupted by a kernel crash and its crash policy is `fail`: its effect is unknown, so it is not run again"
                ),
            )),
        }
    }

    #[allow(clippy::too_many_arguments, reason = "the parts of one audited call")]
    fn audit_call(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        name: &str,
        args: &Value,
        exec: Option<u64>,
        outcome: &Reply,
        started: Instant,
    ) {
        let mut detail = json!({
            "call": seq,
            "args": audit_args(args),
            "duration_us": started.elapsed().as_micros() as u64,
        });
        if let Some(exec) = exec {
            detail["exec"] = json!(exec);
        }
        let result = match outcome {
            Ok(_) => "ok",
            Err(err) => {
                detail["error"] = json!(err.message);
                if err.is(ErrorKind::Denied) { "denied" } else { "error" }
            }
        };
        self.audit_run(&live.id, &live.tenant, "agent", "tool.call", name, result, detail);
    }
}
