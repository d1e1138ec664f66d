//! Programmatic tool calling: `code.exec` runs a short program in an interpreter worker
//! (monty for Python, QuickJS for JavaScript; `keel-interp`), or `python3` in the run's
//! process sandbox (`cpython`). Every tool the program calls goes through the governed,
//! journaled dispatch as a `tool.call` of the run, marked with the `code.exec`'s seq, so
//! a `code.exec` retried after a crash has its finished tool calls answered from the
//! journal and only the result goes back to the agent. Its model calls (`llm`,
//! `llm_batch`) are `llm.chat`s of the run in the same way: budgeted, queued, counted,
//! journaled with the exec's seq in their params, and answered from the journal on a
//! re-run.

use std::sync::Arc;
use std::time::Duration;

use keel_protocol::rpc::{CodeExecParams, ErrorKind, ExecLimits, ExecToolCall};
use keel_store::Seq;
use serde_json::{Value, json};

use crate::Kernel;
use crate::lock;
use crate::run::LiveRun;
use crate::syscall::Reply;
use crate::syscall::SyscallError;

/// The most a program may ask for; its own limits may be lower.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_MEMORY_BYTES: u64 = 4 << 30;
const MAX_TOOL_CALLS: u32 = 10_000;
const MAX_OUTPUT_BYTES: u64 = 16 << 20;
const MAX_RECURSION: u32 = 10_000;
const MAX_LLM_CALLS: u32 = 10_000;

/// The limits of one execution: the defaults, lowered or raised within the maxima.
pub(crate) fn limits(params: &ExecLimits) -> Result<keel_interp::Limits, String> {
    let mut limits = keel_interp::Limits::default();
    let over = |what: &str, max: String| Err(format!("code.exec: `limits.{what}` is at most {max}"));
    let zero = |what: &str| Err(format!("code.exec: `limits.{what}` must be more than 0"));
    if let Some(ms) = params.timeout_ms {
        if ms == 0 {
            return zero("timeout_ms");
        }
        if Duration::from_millis(ms) > MAX_TIMEOUT {
            return over("timeout_ms", MAX_TIMEOUT.as_millis().to_string());
        }
        limits.timeout = Duration::from_millis(ms);
    }
    if let Some(bytes) = params.memory_bytes {
        if bytes < 1 << 20 {
            return Err("code.exec: `limits.memory_bytes` must be at least 1048576 (1 MiB)".into());
        }
        if bytes > MAX_MEMORY_BYTES {
            return over("memory_bytes", MAX_MEMORY_BYTES.to_string());
        }
        limits.memory_bytes = bytes;
    }
    if let Some(calls) = params.max_tool_calls {
        if calls > MAX_TOOL_CALLS {
            return over("max_tool_calls", MAX_TOOL_CALLS.to_string());
        }
        limits.max_tool_calls = calls;
    }
    if let Some(bytes) = params.max_output_bytes {
        if bytes > MAX_OUTPUT_BYTES {
            return over("max_output_bytes", MAX_OUTPUT_BYTES.to_string());
        }
        limits.max_output_bytes = bytes as usize;
    }
    if let Some(depth) = params.max_recursion {
        if depth == 0 {
            return zero("max_recursion");
        }
        if depth > MAX_RECURSION {
            return over("max_recursion", MAX_RECURSION.to_string());
        }
        limits.max_recursion = depth;
    }
    if let Some(calls) = params.max_llm_calls {
        if calls > MAX_LLM_CALLS {
            return over("max_llm_calls", MAX_LLM_CALLS.to_string());
        }
        limits.max_llm_calls = calls;
    }
    Ok(limits)
}

/// The program's tools: each call is a governed `tool.call` of the run.
struct NestedTools {
    kernel: Kernel,
    live: Arc<LiveRun>,
    exec: Seq,
}

#[async_trait::async_trait]
impl keel_interp::ToolHandler for NestedTools {
    async fn call(&self, name: &str, args: Value) -> Result<Value, String> {
        let params = json!({ "name": name, "args": args, "exec": self.exec });
        let reply = Box::pin(self.kernel.syscall(&self.live, "tool.call", params)).await;
        match reply {
            Ok(result) => Ok(result.get("result").cloned().unwrap_or(Value::Null)),
            Err(err) => Err(err.message),
        }
    }

    async fn llm(&self, requests: Vec<keel_interp::LlmRequest>) -> Vec<Result<String, String>> {
        use futures_util::StreamExt;
        // `buffered` keeps the answers in the requests' order while up to the bound run.
        futures_util::stream::iter(requests)
            .map(|request| self.kernel.exec_llm_chat(&self.live, self.exec, chat_params(request, self.exec)))
            .buffered(keel_interp::LLM_BATCH_CONCURRENCY)
            .map(|reply| reply.map(|response| answer_text(&response)).map_err(|err| err.message))
            .collect()
            .await
    }
}

/// The `llm.chat` params of a program's model call, marked with its `code.exec`'s seq:
/// the mark keeps them apart from the agent's own calls with the same messages, and is
/// the same on a re-run, so replay matches them to their journal entries.
fn chat_params(request: keel_interp::LlmRequest, exec: Seq) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = request.system {
        messages.push(json!({ "role": "system", "content": system }));
    }
    messages.push(json!({ "role": "user", "content": request.prompt }));
    let mut params = json!({ "messages": messages, "exec": exec });
    if let Some(model) = request.model {
        params["model"] = json!(model);
    }
    if let Some(tokens) = request.max_tokens {
        params["max_tokens"] = json!(tokens);
    }
    params
}

/// The text of an `llm.chat` reply (an answer with tool calls but no text is "").
fn answer_text(response: &Value) -> String {
    response.pointer("/message/content").and_then(Value::as_str).unwrap_or_default().to_owned()
}

impl Kernel {
    /// One model call of the `code.exec` `exec`: counted against the program's
    /// `max_llm_calls` (kept per exec while it runs), then an `llm.chat` of the run.
    /// `params` carry `"exec": exec` (see [`chat_params`]).
    pub(crate) async fn exec_llm_chat(&self, live: &Arc<LiveRun>, exec: Seq, params: Value) -> Reply {
        {
            let mut calls = lock(&live.exec_llm_calls);
            let Some((made, allowed)) = calls.get_mut(&exec) else {
                return Err(SyscallError::new(
                    ErrorKind::Denied,
                    "llm.chat: the code.exec of this program has ended; its model calls end with it",
                ));
            };
            if *made >= *allowed {
                return Err(SyscallError::new(
                    ErrorKind::Denied,
                    format!(
                        "llm_call_limit: the program asked for more than {allowed} LLM calls; filter or chunk \
                         the input into fewer calls, or raise max_llm_calls (--max-llm-calls)"
                    ),
                ));
            }
            *made += 1;
        }
        Box::pin(self.syscall(live, "llm.chat", params)).await
    }

    /// How many model calls the `code.exec` `exec` made.
    fn exec_llm_made(&self, live: &Arc<LiveRun>, exec: Seq) -> u32 {
        lock(&live.exec_llm_calls).get(&exec).map_or(0, |(made, _)| *made)
    }
}

/// Forgets a `code.exec`'s model-call count when it ends, however it ends.
struct LlmCallsGuard {
    live: Arc<LiveRun>,
    exec: Seq,
}

impl LlmCallsGuard {
    fn new(live: &Arc<LiveRun>, exec: Seq, allowed: u32) -> Self {
        lock(&live.exec_llm_calls).insert(exec, (0, allowed));
        LlmCallsGuard { live: live.clone(), exec }
    }
}

impl Drop for LlmCallsGuard {
    fn drop(&mut self) {
        lock(&self.live.exec_llm_calls).remove(&self.exec);
    }
}

/// The inputs of one `POST /v1/exec`, at most, in all (a string counts its text).
pub(crate) const MAX_INPUT_BYTES: usize = 64 << 20;
/// An input larger than this is stored and named by its hash instead of riding inline in
/// the exec run's input and its `code.exec` params (and so in the journal).
const INLINE_INPUT_BYTES: usize = 4096;

/// How much of the inputs' limit a value takes: a string its text, anything else its JSON.
fn input_size(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        other => other.to_string().len(),
    }
}

/// Where a tenant's stored inputs live in the store's key-value space, by `sha256:<hex>`
/// of their JSON: content-addressed (the same input sent again is the same row) and
/// scoped to the tenant (a run names only its own tenant's inputs).
fn input_scope(tenant: &str) -> String {
    format!("exec-inputs:{tenant}")
}

fn input_hash(value: &Value) -> String {
    use sha2::Digest;
    format!("sha256:{}", keel_types::hex(&sha2::Sha256::digest(value.to_string().as_bytes())))
}

impl Kernel {
    /// The program's inputs: the inline ones and those its `input_refs` name, read from
    /// the store (never from the journal, which holds only their hashes).
    async fn exec_inputs(
        &self,
        live: &Arc<LiveRun>,
        mut inputs: serde_json::Map<String, Value>,
        refs: std::collections::BTreeMap<String, String>,
    ) -> Result<serde_json::Map<String, Value>, SyscallError> {
        let scope = input_scope(&live.tenant);
        for (name, hash) in refs {
            if inputs.contains_key(&name) {
                return Err(SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!(
                        "code.exec: input {name:?} is given both in `inputs` and in `input_refs`; give it once"
                    ),
                ));
            }
            let value = self.store().kv_get(&scope, &hash).await.map_err(crate::syscall::internal)?;
            let value = value.ok_or_else(|| {
                SyscallError::new(
                    ErrorKind::InvalidParams,
                    format!(
                        "code.exec: input {name:?} names {hash}, which is not an input stored for tenant {}; \
                         large inputs are stored by POST /v1/exec (keel exec --input-file NAME=PATH)",
                        live.tenant
                    ),
                )
            })?;
            inputs.insert(name, value);
        }
        Ok(inputs)
    }

    pub(crate) async fn exec_code(&self, live: &Arc<LiveRun>, seq: Seq, mut params: CodeExecParams) -> Reply {
        let limits = limits(&params.limits).map_err(|e| SyscallError::new(ErrorKind::InvalidParams, e))?;
        let refs = std::mem::take(&mut params.input_refs);
        params.inputs = self.exec_inputs(live, std::mem::take(&mut params.inputs), refs).await?;
        let tools: Vec<String> = self.granted_tools(live).await.into_iter().map(|d| d.name).collect();
        let _llm_calls = LlmCallsGuard::new(live, seq, limits.max_llm_calls);
        if params.lang == "cpython" {
            return self.exec_cpython(live, seq, params, tools, limits).await;
        }
        let lang: keel_interp::Lang = params.lang.parse().map_err(|_| {
            SyscallError::new(
                ErrorKind::InvalidParams,
                format!("code.exec: unknown language {:?}", params.lang),
            )
        })?;
        let pool = self.inner.interp.as_ref().ok_or_else(|| {
            SyscallError::new(ErrorKind::ToolError, "code.exec: this kernel has no interpreter workers (it was embedded without the keel binary); use lang cpython")
        })?;
        let job = keel_interp::Job { lang, code: params.code, inputs: params.inputs, tools, limits };
        let handler = NestedTools { kernel: self.clone(), live: live.clone(), exec: seq };
        let outcome = pool.exec(job, &handler).await;
        let tool_calls: Vec<ExecToolCall> = outcome
            .tool_calls
            .into_iter()
            .map(|c| ExecToolCall { name: c.name, args: c.args, ok: c.ok, duration_us: c.duration_us })
            .collect();
        let duration_us = outcome.duration.as_micros() as u64;
        self.audit_run(
            &live.id,
            &live.tenant,
            "agent",
            "code.exec",
            lang.as_str(),
            if outcome.result.is_ok() { "ok" } else { "error" },
            json!({
                "call": seq, "tool_calls": tool_calls.len(), "llm_calls": outcome.llm_calls,
                "duration_us": duration_us,
            }),
        );
        match outcome.result {
            Ok(result) => Ok(json!({
                "result": result,
                "stdout": outcome.stdout,
                "tool_calls": tool_calls,
                "llm_calls": outcome.llm_calls,
                "duration_us": duration_us,
            })),
            Err(err) => Err(exec_error(err.kind.as_str(), &err.message, outcome.stdout, &tool_calls)
                .with("llm_calls", outcome.llm_calls)),
        }
    }
}

pub(crate) fn exec_error(
    kind: &str,
    message: &str,
    stdout: String,
    tool_calls: &[ExecToolCall],
) -> SyscallError {
    SyscallError::new(ErrorKind::ToolError, format!("code.exec: {kind}: {message}"))
        .with("exec_error", kind)
        .with("stdout", stdout)
        .with("tool_calls", json!(tool_calls))
}

/// The wrapper that runs a `cpython` program (see the file).
const CPYTHON_WRAPPER: &str = include_str!("exec_cpython.py");

impl Kernel {
    /// `--lang cpython`: `python3` in the run's own sandbox, with a `keel_tools` module
    /// whose functions call back over the syscall socket with a token that only
    /// allows tool calls, each journaled as this `code.exec`'s.
    async fn exec_cpython(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        params: CodeExecParams,
        tools: Vec<String>,
        limits: keel_interp::Limits,
    ) -> Reply {
        use tokio::io::AsyncReadExt;
        let started = std::time::Instant::now();
        let token = keel_types::random_token();
        let marker = format!("\u{1e}KEEL-EXEC-{}:", keel_types::random_token());
        let socket = if live.sandbox.shares_host() {
            self.inner.data_dir.syscall_socket().display().to_string()
        } else {
            keel_sandbox::plan::inside::SYSCALL_SOCKET.to_owned()
        };
        let request = json!({
            "code": params.code,
            "inputs": params.inputs,
            "tools": tools,
            "max_tool_calls": limits.max_tool_calls,
            "max_llm_calls": limits.max_llm_calls,
        });
        let env = vec![
            ("KEEL_SOCKET".to_owned(), socket),
            ("KEEL_EXEC_TOKEN".to_owned(), token.clone()),
            ("KEEL_EXEC_MARKER".to_owned(), marker.clone()),
            ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
            ("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ];
        let marker_id = format!("{}-exec{seq}", live.id);
        let mut profile = live.profile.clone();
        if !live.sandbox.shares_host() {
            // python3 itself needs some 10 MB; the program's limit comes on top.
            let cap = limits.memory_bytes + (32 << 20);
            profile.memory_bytes = Some(profile.memory_bytes.map_or(cap, |m| m.min(cap)));
        }
        let data_dir = &self.inner.data_dir;
        lock(&self.inner.exec_tokens).insert(token.clone(), (live.clone(), seq));
        let _forget = TokenGuard { kernel: self.clone(), token };
        let launched = live
            .sandbox
            .launch(keel_sandbox::LaunchSpec {
                command: vec!["python3".into(), "-I".into(), "-c".into(), CPYTHON_WRAPPER.into()],
                cwd: live.cwd.clone(),
                env,
                run_marker: marker_id.clone(),
                profile,
                stdin: Some(request.to_string().into_bytes()),
                bind_argument_files: false,
                keel: keel_sandbox::KeelResources {
                    syscall_socket: Some(data_dir.syscall_socket()),
                    python_sdk: None,
                    node_sdk: None,
                    ca_bundle: None,
                    secrets: vec![data_dir.root().to_path_buf()],
                },
                bridges: Vec::new(),
            })
            .await
            .map_err(|e| {
                exec_error(
                    "worker_crashed",
                    &format!("python3 could not be started: {e}"),
                    String::new(),
                    &[],
                )
            })?;
        let mut child = launched.child;
        let pid = launched.pid;
        let max_output = limits.max_output_bytes;
        let mut stdout = child.stdout.take();
        let read = async {
            let mut out = Vec::new();
            if let Some(stream) = stdout.as_mut() {
                // One byte more than allowed (plus the outcome line) tells truncation.
                let cap = (max_output + 64 * 1024 + 1) as u64;
                let _ = stream.take(cap).read_to_end(&mut out).await;
            }
            let _ = child.wait().await;
            out
        };
        let out = match tokio::time::timeout(limits.timeout, read).await {
            Ok(out) => out,
            Err(_) => {
                live.sandbox.kill_tree(pid, &marker_id);
                return Err(exec_error(
                    "timeout",
                    &format!("the program did not finish within {} ms", limits.timeout.as_millis()),
                    String::new(),
                    &[],
                ));
            }
        };
        live.sandbox.kill_tree(pid, &marker_id);
        let text = String::from_utf8_lossy(&out);
        let Some((printed, outcome)) = text.rsplit_once(marker.as_str()) else {
            let tail: String = text.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(exec_error(
                "worker_crashed",
                "python3 ended without an outcome (killed, or out of memory)",
                tail,
                &[],
            ));
        };
        let printed = printed.strip_suffix('\n').unwrap_or(printed).to_owned();
        if printed.len() > max_output {
            return Err(exec_error(
                "output_limit",
                &format!("the program printed more than {max_output} bytes"),
                String::new(),
                &[],
            ));
        }
        let outcome: Value = serde_json::from_str(outcome.trim()).unwrap_or(Value::Null);
        let duration_us = started.elapsed().as_micros() as u64;
        let tool_calls = self.exec_calls(live, seq).await;
        match outcome.get("error") {
            Some(error) => Err(exec_error(
                error.get("kind").and_then(Value::as_str).unwrap_or("runtime"),
                error.get("message").and_then(Value::as_str).unwrap_or("the program failed"),
                printed,
                &tool_calls,
            )),
            None => Ok(json!({
                "result": outcome.get("result").cloned().unwrap_or(Value::Null),
                "stdout": printed,
                "tool_calls": tool_calls,
                "llm_calls": self.exec_llm_made(live, seq),
                "duration_us": duration_us,
            })),
        }
    }

    /// The tool calls a `code.exec` made, from the journal and from its reads not yet
    /// journaled (by when they started).
    async fn exec_calls(&self, live: &Arc<LiveRun>, seq: Seq) -> Vec<ExecToolCall> {
        let mut entries: Vec<(u64, Value, keel_types::EntryStatus, u64)> = self
            .store()
            .journal(&live.id, seq)
            .await
            .unwrap_or_default()
            .into_iter()
            // The program's model calls carry its seq too; they are not tool calls.
            .filter(|e| e.method == "tool.call")
            .map(|e| (e.started_at_ms, e.params, e.status, e.finished_at_ms.unwrap_or(e.started_at_ms)))
            .collect();
        if let Some(reads) = lock(&live.exec_buffers).get(&seq) {
            entries.extend(
                reads
                    .iter()
                    .map(|read| &read.entry)
                    .map(|e| (e.started_at_ms, e.params.clone(), e.status, e.finished_at_ms.unwrap_or(0))),
            );
        }
        entries.sort_by_key(|e| e.0);
        entries
            .into_iter()
            .filter(|(_, params, _, _)| params.get("exec").and_then(Value::as_u64) == Some(seq))
            .map(|(started, params, status, finished)| ExecToolCall {
                name: params.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                args: params.get("args").cloned().unwrap_or(Value::Null),
                ok: status == keel_types::EntryStatus::Ok,
                duration_us: finished.saturating_sub(started) * 1000,
            })
            .collect()
    }
}

/// Forgets a `cpython` program's token when its execution ends, however it ends.
struct TokenGuard {
    kernel: Kernel,
    token: String,
}

impl Drop for TokenGuard {
    fn drop(&mut self) {
        lock(&self.kernel.inner.exec_tokens).remove(&self.token);
    }
}

/// The agent of a `POST /v1/exec` run: one `code.exec`, its outcome as the run's output.
const EXEC_AGENT: &str = r#"
import json, os, keel
request = json.loads(os.environ["KEEL_INPUT"])
client = keel.connect()
try:
    out = client.call("code.exec", request)
    client.exit({"ok": True, **out})
except keel.KeelError as err:
    data = err.data if isinstance(err.data, dict) else {}
    client.exit({"ok": False, "error": {"kind": data.get("exec_error", err.kind), "message": err.message},
                 "stdout": data.get("stdout", ""), "tool_calls": data.get("tool_calls", []),
                 "llm_calls": data.get("llm_calls", 0)})
"#;

impl Kernel {
    /// `POST /v1/exec` / `keel exec`: one program, run as a run of its own (so its tool
    /// calls are journaled, budgeted and audited like any), answered when it ends.
    pub(crate) async fn exec_program(
        &self,
        params: keel_protocol::api::ExecParams,
    ) -> crate::Result<keel_protocol::api::ExecView> {
        use crate::Error;
        let asked: ExecLimits = if params.limits.is_null() {
            ExecLimits::default()
        } else {
            serde_json::from_value(params.limits.clone())
                .map_err(|e| Error::InvalidRequest(format!("limits: {e}")))?
        };
        limits(&asked).map_err(Error::InvalidRequest)?;
        if !matches!(params.lang.as_str(), "python" | "py" | "javascript" | "js" | "cpython") {
            return Err(Error::InvalidRequest(format!(
                "language {:?} is not supported; use python, javascript or cpython",
                params.lang
            )));
        }
        let total: usize = params.inputs.values().map(input_size).sum();
        if total > MAX_INPUT_BYTES {
            return Err(Error::InvalidRequest(format!(
                "the inputs are {total} bytes in all, over the limit of {MAX_INPUT_BYTES} (64 MiB); filter the \
                 input before sending it, or split the work over several execs"
            )));
        }
        let mut create = json!({
            "command": ["python3", "-c", EXEC_AGENT],
            "tenant": params.tenant,
            "grant": params.grant,
            "sandbox": params.sandbox,
            "llm_script": params.llm_script,
            "model": params.model,
            "budget": params.budget,
        });
        let validate = |create: &Value| {
            let create: keel_protocol::api::CreateRunParams =
                serde_json::from_value(create.clone()).map_err(|e| Error::InvalidRequest(e.to_string()))?;
            crate::CreateRun::validate(create)
        };
        // Checked before anything is stored, so a bad request stores nothing.
        let tenant = validate(&create)?.tenant;
        // Large inputs are stored once, before the run exists, and named by hash: the run's
        // input, its code.exec params and the journal stay small whatever the input's size.
        let scope = input_scope(&tenant);
        let mut inline = serde_json::Map::new();
        let mut refs = std::collections::BTreeMap::new();
        for (name, value) in params.inputs {
            if input_size(&value) <= INLINE_INPUT_BYTES {
                inline.insert(name, value);
                continue;
            }
            let hash = input_hash(&value);
            self.store().kv_put(&scope, &hash, value).await?;
            refs.insert(name, hash);
        }
        let input = json!({
            "lang": params.lang, "code": params.code, "inputs": inline, "input_refs": refs, "limits": asked,
        });
        create["input"] = input;
        let request = validate(&create)?;
        let mut record = self.act(crate::Command::Create(request)).await?;
        // An exec answers when it ends: one whose budget ran out would wait for a top-up
        // nobody is asked for, so it is stopped, and the answer (after the stop is
        // written: an embedded kernel ends with it) says why.
        let mut out_of_budget = None;
        while !record.state.is_terminal() {
            if out_of_budget.is_none() && record.wait_reason == Some(keel_types::WaitReason::Budget) {
                let view = self.run(&crate::Principal::Admin, &record.id).await?;
                // The reason up to its operator hint (`keel budget ...`): the run is stopped.
                let why = view.reason.unwrap_or_default();
                out_of_budget = Some(why.split(';').next().unwrap_or_default().trim().to_owned());
                let stop = crate::Command::Stop { run: record.id.clone(), grace: Some(Duration::ZERO) };
                let _ = self.act(stop).await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            record = self.get(&record.id).await?;
        }
        if let Some(why) = out_of_budget {
            return Err(Error::Conflict(format!(
                "the exec run {} ran out of its budget ({why}) and was stopped; give it a larger budget",
                record.id
            )));
        }
        let output = record.output.clone().unwrap_or(Value::Null);
        let Some(ok) = output.get("ok").and_then(Value::as_bool) else {
            return Err(Error::Conflict(format!(
                "the exec run {} ended {} without an outcome{}; `keel logs {}` shows why",
                record.id,
                record.state,
                record.error.map(|e| format!(": {e}")).unwrap_or_default(),
                record.id
            )));
        };
        Ok(keel_protocol::api::ExecView {
            run_id: record.id.to_string(),
            ok,
            result: if ok { output.get("result").cloned() } else { None },
            error: output.get("error").cloned(),
            stdout: output.get("stdout").and_then(Value::as_str).unwrap_or_default().to_owned(),
            tool_calls: output.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default(),
            llm_calls: output.get("llm_calls").and_then(Value::as_u64).map_or(0, |n| n as u32),
            duration_us: output.get("duration_us").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}
