//! Creating and launching runs: admission, the sandbox check, starting the agent process
//! (its environment, with the kernel's provider secrets stripped) and registering it.

use keel_protocol::EventKind;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use keel_core::lifecycle::Command as Lifecycle;
use keel_core::replay::{RecordedCall, ReplayMatcher};
use keel_llm::{Provider, ScriptedProvider};
use keel_sandbox::{KeelResources, LaunchSpec};
use keel_store::{NewRun, RunPatch, RunRecord};
use keel_types::{EntryStatus, RunId, RunState};
use serde_json::{Value, json};

use crate::run::{CreateRun, Launching, LiveRun, Replay, RunSpec};
use crate::sandboxing::{EGRESS_PORT, GATEWAY_PORT};
use crate::{Error, Result};
use crate::{Kernel, lock, now_ms};
use keel_sandbox::egress::{Allowlist, Audit, EgressEvent, EgressProxy};
use keel_sandbox::{Bridge, Network, Profile, Sandbox};

impl Kernel {
    pub(crate) async fn create(&self, request: CreateRun) -> Result<RunRecord> {
        self.create_as(RunId::generate(now_ms()), request).await
    }

    /// Creates and launches a run under an id chosen before (an agent called as a tool
    /// records its child's id durably first, so a retried call finds the same child).
    pub(crate) async fn create_as(&self, id: RunId, mut request: CreateRun) -> Result<RunRecord> {
        if self.is_draining() {
            return Err(Error::Unavailable(
                "this node is draining (it hands its runs to the other nodes and stops): submit the run to \
                 another node (`keel nodes` lists them)"
                    .to_owned(),
            ));
        }
        if request.llm_script.is_none() {
            request.llm_script = self.inner.default_llm_script.clone();
        }
        // What the run's sandbox cannot enforce on this host is refused before the run
        // exists, with the missing control named (never run with weaker isolation).
        let sandbox = crate::sandboxing::backend(&self.inner.sandbox, request.sandbox.as_deref())?;
        sandbox
            .check(&crate::sandboxing::profile(request.sandbox.as_deref(), &self.inner.data_dir))
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let now = now_ms();
        let spec = request.spec();
        // A live slot now, a place in the queue, or a refusal (429) before the run exists.
        let start = self.admit(super::admission::ticket(&id, &request.tenant, &spec, now)).await?;
        let created = self
            .inner
            .store
            .create_run(NewRun {
                id: id.clone(),
                tenant: request.tenant.clone(),
                spec: spec.to_value(),
                state: RunState::Created,
                created_at_ms: now,
            })
            .await;
        let record = match created {
            Ok(record) => record,
            Err(err) => {
                // A run already under this id owns whatever slot the id holds (admitting
                // a live id takes no new one): give it back only if no live run has it.
                let owned = matches!(err, keel_store::Error::RunExists(_))
                    && matches!(self.inner.store.get_run(&id).await, Ok(Some(existing))
                        if !existing.state.is_terminal() && !crate::swap::is_swapped(&existing));
                if !owned {
                    self.release_slot(&id);
                }
                return Err(err.into());
            }
        };
        self.emit(&id, EventKind::State, json!({ "state": "created", "command": request.command }));
        let queued = self.transition(&id, Lifecycle::Enqueue, RunPatch::default()).await?;
        if !start {
            self.emit(&id, EventKind::Queued, json!({ "reason": self.queue_reason(&id) }));
            return Ok(queued);
        }
        self.launch(record, false).await
    }

    /// Asks for a queued run that got a slot to be launched.
    pub(crate) fn request_launch(&self, run: &RunId) {
        let _ = self.inner.launches.send(run.clone());
    }

    pub(crate) async fn launch_queued(&self, run: &RunId) {
        match self.get(run).await {
            Ok(record) if record.state == RunState::Queued => {
                if let Err(err) = Box::pin(self.launch(record, false)).await {
                    tracing::warn!(run = %run, "could not start the queued run: {err}");
                }
            }
            // A swapped-out run that waited for a slot to come back.
            Ok(record) if crate::swap::is_swapped(&record) => self.wake_swapped(run).await,
            // Stopped while queued, or started otherwise: give the slot back.
            Ok(record) if record.state.is_terminal() => self.release_slot(run),
            _ => {}
        }
    }

    /// Asks for a swapped-out run to be brought back (a no-op for any other run); among
    /// several nodes, its owner is told too, wherever it is.
    pub(crate) fn request_wake(&self, run: &RunId) {
        let _ = self.inner.wakeups.send(run.clone());
        self.tell_cluster(run);
    }

    /// Relaunches a run by replay; it is in `recovering`.
    pub(crate) async fn relaunch(&self, record: RunRecord) -> Result<RunRecord> {
        self.launch(record, true).await
    }

    /// Starts the agent process of `record`. With `recovering`, the run is already in
    /// `recovering` and its journal after the last checkpoint is loaded for replay.
    pub(crate) async fn launch(&self, record: RunRecord, recovering: bool) -> Result<RunRecord> {
        let id = record.id.clone();
        // Among several nodes, the agent starts only under this node's lease; a run
        // another live node holds is that node's to run.
        if !self.take_lease(&id).await? {
            tracing::info!(run = %id, "another node holds the run's lease; it runs there");
            self.release_slot(&id);
            return Ok(record);
        }
        match self.try_launch(&record, recovering).await {
            Ok(record) => Ok(record),
            Err(err) => {
                let message = format!("the agent could not be started: {err}");
                tracing::warn!(run = %id, "{message}");
                let patch = RunPatch { error: Some(Some(message)), pid: Some(None), ..RunPatch::default() };
                self.transition(&id, Lifecycle::Fail, patch).await
            }
        }
    }

    pub(crate) async fn try_launch(&self, record: &RunRecord, recovering: bool) -> Result<RunRecord> {
        let spec = RunSpec::of(record)?;
        let script = match &spec.llm_script {
            Some(script) => {
                Some(ScriptedProvider::from_value(script).map_err(|e| Error::InvalidRequest(e.to_string()))?)
            }
            None => None,
        };
        let router = self.inner.llm.for_run(script, spec.model.clone(), spec.fallback_models.clone());
        let provider: Option<Arc<dyn Provider>> =
            router.is_configured().then(|| Arc::new(router) as Arc<dyn Provider>);
        let replay = if recovering {
            self.load_replay(&record.id, provider.as_deref()).await?
        } else {
            Replay { matcher: ReplayMatcher::live(), recorded: HashMap::new() }
        };
        let budget = self.load_budget(record, &spec).await?;
        let token = keel_types::random_token();
        // The agent may say hello before its sandbox has reported the start (a cold
        // sandbox under load answers after the agent already runs): its token is known
        // as launching until the run is registered below, and hello waits for that.
        let (ready, _) = tokio::sync::watch::channel(None);
        let _launching = Launching::register(self, &token, ready.subscribe());
        // A new run is created as attempt 1; each relaunch by replay is one more.
        let attempt = if recovering { record.attempt + 1 } else { record.attempt.max(1) };
        let sandbox = crate::sandboxing::backend(&self.inner.sandbox, spec.sandbox.as_ref())?;
        let profile = crate::sandboxing::profile(spec.sandbox.as_ref(), &self.inner.data_dir);
        crate::sandboxing::prepare_volumes(&profile)?;
        let grant = match &spec.grant {
            Some(patterns) => keel_tools::grant::Grant::parse(patterns)
                .map_err(|e| Error::InvalidRequest(format!("grant: {e}")))?,
            None => keel_tools::grant::Grant::default_builtins(),
        };
        let workspace = crate::tools::workspace_of(&profile, sandbox.shares_host(), &spec.cwd);
        let (bridges, egress) =
            self.bridges(&record.id, sandbox.as_ref(), &profile, self.inner.gateway_addr.is_some())?;
        // Runs whose proxy may intercept TLS (to inject credentials) trust the Keel CA.
        let ca_bundle = egress.as_ref().and(self.inner.egress.ca_bundle()).map(std::path::Path::to_path_buf);
        let env =
            self.agent_env(&record.id, &token, &spec, sandbox.shares_host(), &bridges, ca_bundle.is_some());
        let data_dir = &self.inner.data_dir;
        let spawning = std::time::Instant::now();
        let launched = sandbox
            .launch(LaunchSpec {
                command: spec.command.clone(),
                cwd: spec.cwd.clone(),
                env,
                run_marker: record.id.to_string(),
                profile: profile.clone(),
                stdin: None,
                // Only a run an operator started: a child's command is its parent agent's
                // choice, and naming a host file must not get it bound.
                bind_argument_files: spec.parent.is_none(),
                keel: KeelResources {
                    syscall_socket: Some(data_dir.syscall_socket()),
                    python_sdk: Some(data_dir.python_sdk()),
                    node_sdk: Some(data_dir.node_sdk()),
                    ca_bundle,
                    secrets: vec![data_dir.root().to_path_buf()],
                },
                bridges,
            })
            .await
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        self.inner.metrics.sandbox_spawned(sandbox.tier(), launched.pooled, spawning.elapsed());
        let live = Arc::new(LiveRun {
            id: record.id.clone(),
            tenant: record.tenant.clone(),
            attempt,
            pid: launched.pid,
            provider,
            replay: tokio::sync::Mutex::new(replay),
            exited: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            ask: Mutex::new(None),
            budget,
            grant,
            priority: spec.priority(),
            approvals: Mutex::default(),
            exec_buffers: Mutex::default(),
            exec_llm_calls: Mutex::default(),
            workspace,
            sandbox: sandbox.clone(),
            profile,
            cwd: spec.cwd.clone(),
            fetcher: tokio::sync::OnceCell::new(),
            ended: tokio::sync::watch::Sender::new(false),
            inflight: Default::default(),
            waiting_calls: Default::default(),
            receives_wait: AtomicBool::new(true),
            held_answers: Default::default(),
            swapping: AtomicBool::new(false),
            greeted: tokio::sync::Notify::new(),
            lost: AtomicBool::new(false),
            _egress: egress,
        });
        lock(&self.inner.live).insert(record.id.clone(), live.clone());
        lock(&self.inner.tokens).insert(token, live.clone());
        ready.send_replace(Some(live.clone()));
        self.emit(&record.id, EventKind::Launch, json!({ "attempt": attempt, "pid": launched.pid, "sandbox": sandbox.tier(), "pooled": launched.pooled, "replaying": recovering }));
        let patch = RunPatch { attempt: Some(attempt), pid: Some(Some(launched.pid)), ..RunPatch::default() };
        let updated = if recovering {
            self.inner
                .store
                .update_run(&record.id, None, RunPatch { updated_at_ms: Some(now_ms()), ..patch })
                .await?
        } else {
            self.transition(&record.id, Lifecycle::Start, patch).await?
        };
        self.watch_wall_clock(live.clone());
        self.watch(live, launched.child);
        Ok(updated)
    }

    /// The journal after the last checkpoint, as the replay matcher wants it; also hands
    /// the provider what it served before, so it continues where it was.
    async fn load_replay(&self, run: &RunId, provider: Option<&dyn Provider>) -> Result<Replay> {
        let store = &self.inner.store;
        let entries = store.journal(run, 0).await?;
        // Replay starts after the newest completed checkpoint.
        let after = entries
            .iter()
            .rev()
            .find(|e| e.method == "state.checkpoint" && e.status == EntryStatus::Ok)
            .map_or(0, |e| e.seq);
        if let Some(provider) = provider {
            let served: Vec<Value> = entries
                .iter()
                .filter(|e| e.method == "llm.chat" && e.status == EntryStatus::Ok)
                .filter_map(|e| e.result.as_ref()?.get("provider").cloned())
                .collect();
            provider.restore(&served);
        }
        let mut recorded = HashMap::new();
        let mut calls = Vec::new();
        for entry in entries.into_iter().filter(|e| e.seq > after && e.status != EntryStatus::Abandoned) {
            calls.push(RecordedCall {
                seq: entry.seq,
                method: entry.method.clone(),
                params_hash: entry.params_hash.clone(),
                completed: matches!(entry.status, EntryStatus::Ok | EntryStatus::Error),
            });
            recorded.insert(entry.seq, entry);
        }
        Ok(Replay { matcher: ReplayMatcher::new(calls), recorded })
    }

    fn agent_env(
        &self,
        run: &RunId,
        token: &str,
        spec: &RunSpec,
        shares_host: bool,
        bridges: &[keel_sandbox::Bridge],
        ca_bundle: bool,
    ) -> Vec<(String, String)> {
        use keel_sandbox::plan::inside;
        // Tier `none` is for development: the agent sees the kernel's environment, like
        // any child process. Sandboxed tiers start from an empty one: only what Keel sets
        // and what the run passes with `--env`.
        // Provider credentials and A2A agents' tokens stay in the kernel: never
        // inherited, even by tier `none`.
        let mut env: BTreeMap<String, String> = if shares_host {
            std::env::vars()
                .filter(|(k, _)| {
                    !k.starts_with("KEEL_") && !is_provider_secret(k) && !self.inner.tools.holds_secret(k)
                })
                .collect()
        } else {
            [("HOME", inside::WORKSPACE), ("TMPDIR", inside::TMP), ("LANG", "C.UTF-8")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        env.extend(spec.env.clone());
        // What frameworks need beyond the gateway's variables (their telemetry off, ...),
        // unless the run's environment says otherwise.
        super::frameworks::add_framework_vars(&mut env);
        let sdk = if shares_host {
            self.inner.data_dir.python_sdk().display().to_string()
        } else {
            inside::PYTHON_SDK.to_owned()
        };
        let python_path = match env.get("PYTHONPATH") {
            Some(existing) if !existing.is_empty() => format!("{sdk}:{existing}"),
            _ => sdk,
        };
        env.insert("PYTHONPATH".into(), python_path);
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
        // The Node SDK: `require("keel")` resolves through NODE_PATH (a user's own
        // NODE_PATH still works, after it).
        let node_sdk = if shares_host {
            self.inner.data_dir.node_sdk().display().to_string()
        } else {
            inside::NODE_SDK.to_owned()
        };
        let node_path = match env.get("NODE_PATH") {
            Some(existing) if !existing.is_empty() => format!("{node_sdk}:{existing}"),
            _ => node_sdk,
        };
        env.insert("NODE_PATH".into(), node_path);
        let socket = if shares_host {
            self.inner.data_dir.syscall_socket().display().to_string()
        } else {
            inside::SYSCALL_SOCKET.to_owned()
        };
        env.insert("KEEL_SOCKET".into(), socket);
        env.insert("KEEL_RUN_TOKEN".into(), token.to_owned());
        env.insert("KEEL_RUN_ID".into(), run.to_string());
        // W3C trace context: an agent's own spans nest under its run's span.
        if self.inner.telemetry.tracing() {
            env.insert("TRACEPARENT".into(), crate::telemetry::traceparent(run));
        }
        if let Some(input) = &spec.input {
            env.insert("KEEL_INPUT".into(), input.to_string());
        }
        // In a sandbox the gateway is a bridge to its Unix socket on a loopback port.
        let gateway = if shares_host {
            self.inner.gateway_addr.map(|addr| format!("http://{addr}"))
        } else {
            bridges.iter().find(|b| b.port == crate::sandboxing::GATEWAY_PORT).map(keel_sandbox::Bridge::url)
        };
        if let Some(base) = gateway {
            // Unmodified OpenAI / Anthropic SDK programs talk to the kernel, which holds
            // the real keys; the run token is their "API key".
            env.insert("OPENAI_BASE_URL".into(), format!("{base}/v1"));
            env.insert("OPENAI_API_KEY".into(), token.to_owned());
            env.insert("ANTHROPIC_BASE_URL".into(), base.clone());
            env.insert("ANTHROPIC_API_KEY".into(), token.to_owned());
            // The run's granted tools as an MCP server (streamable HTTP; the token is
            // the bearer).
            env.insert("KEEL_MCP_URL".into(), format!("{base}/mcp"));
        }
        crate::sandboxing::bridge_env(bridges, ca_bundle, &mut env);
        env.into_iter().collect()
    }
}

/// Environment variables that carry provider credentials in the kernel's environment.
fn is_provider_secret(name: &str) -> bool {
    const PREFIXES: &[&str] =
        &["OPENAI_", "ANTHROPIC_", "AZURE_OPENAI_", "GROQ_", "TOGETHER_", "OPENROUTER_"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || name.ends_with("_API_KEY")
}

impl Kernel {
    /// The bridges of a run's sandbox (the LLM gateway when the kernel serves one; the
    /// egress proxy for `allowlist`), and the run's egress proxy, which audits every
    /// connection as an `egress` event and an `egress` audit record. Tier `none` gets
    /// none: it reaches the kernel directly.
    pub(crate) fn bridges(
        &self,
        run: &keel_types::RunId,
        sandbox: &dyn Sandbox,
        profile: &Profile,
        gateway: bool,
    ) -> Result<(Vec<Bridge>, Option<EgressProxy>)> {
        if sandbox.shares_host() {
            return Ok((Vec::new(), None));
        }
        let mut bridges = Vec::new();
        if gateway {
            bridges.push(Bridge { port: GATEWAY_PORT, host_socket: self.inner.data_dir.gateway_socket() });
        }
        let Network::Allowlist(hosts) = &profile.network else { return Ok((bridges, None)) };
        let allowlist = Allowlist::parse(hosts).map_err(Error::InvalidRequest)?;
        let kernel = self.clone();
        let id = run.clone();
        let audit: Audit = Arc::new(move |event: EgressEvent| {
            let mut data = json!({
                "allowed": event.allowed,
                "host": event.host,
                "port": event.port,
                "method": event.method,
            });
            if let Some(reason) = event.reason {
                data["reason"] = json!(reason);
            }
            // The header's name only: the value never leaves the proxy.
            if let Some(header) = event.credential {
                data["credential"] = json!(header);
            }
            let outcome = if event.allowed { "allowed" } else { "denied" };
            kernel.audit_run_any_tenant(&id, "agent", "egress", &event.host, outcome, data.clone());
            kernel.emit(&id, EventKind::Egress, data);
        });
        let path = self.inner.data_dir.egress_socket(run.as_str());
        let proxy = EgressProxy::start(&path, allowlist, self.inner.egress.clone(), audit)
            .map_err(|source| Error::DataDir { dir: path.display().to_string(), source })?;
        bridges.push(Bridge { port: EGRESS_PORT, host_socket: path });
        Ok((bridges, Some(proxy)))
    }
}
