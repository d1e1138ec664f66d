//! Running a governed tool for a run: the granted set, each kind's executor (built-ins,
//! command tools in the run's sandbox, MCP calls, agents as tools, remote A2A agents'
//! skills), `http.fetch`'s client through the run's egress proxy.

use crate::Kernel;
use crate::run::LiveRun;
use crate::tools::Fetcher;
use keel_store::Store;
use keel_tools::{ToolDef, ToolKind};
use keel_types::RunId;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

impl Kernel {
    /// The tools a run may call, as `tool.list` answers.
    pub(crate) async fn granted_tools(&self, live: &LiveRun) -> Vec<ToolDef> {
        self.inner.tools.all().await.into_iter().filter(|def| live.grant.allows(&def.name)).collect()
    }

    /// Runs one tool call whose governance passed. `key` is the call's idempotency key
    /// (`run_id:seq`), handed to tools that can use it; `recovering` says the call was
    /// cut off by a crash and runs again (an A2A call looks up what the remote has first).
    pub(crate) async fn run_tool(
        &self,
        live: &Arc<LiveRun>,
        def: &ToolDef,
        args: Value,
        key: &str,
        recovering: bool,
    ) -> Result<Value, String> {
        let work = self.run_tool_untimed(live, def, args, key, recovering);
        match tokio::time::timeout(def.policy.timeout, work).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "tool {} did not finish within its timeout of {} s",
                def.name,
                def.policy.timeout.as_secs_f64()
            )),
        }
    }

    async fn run_tool_untimed(
        &self,
        live: &Arc<LiveRun>,
        def: &ToolDef,
        args: Value,
        key: &str,
        recovering: bool,
    ) -> Result<Value, String> {
        match &def.kind {
            ToolKind::Builtin => self.run_builtin(live, &def.name, args).await,
            ToolKind::Command(tool) => {
                let input = json!({ "args": args, "idempotency_key": key, "run_id": live.id.as_str(), "tool": def.name });
                let mut env = vec![
                    ("KEEL_IDEMPOTENCY_KEY".to_owned(), key.to_owned()),
                    ("KEEL_TOOL".to_owned(), def.name.clone()),
                ];
                if live.sandbox.shares_host()
                    && let Ok(path) = std::env::var("PATH")
                {
                    env.push(("PATH".to_owned(), path));
                }
                let ctx = keel_tools::command::CommandContext {
                    cwd: live.cwd.clone(),
                    profile: live.profile.clone(),
                    keel: keel_sandbox::KeelResources::default(),
                    bridges: Vec::new(),
                    // Its own marker: a timeout kills the tool's tree, not the agent.
                    run_marker: format!("{}/tool/{key}", live.id),
                    env,
                    timeout: def.policy.timeout,
                };
                keel_tools::command::run(live.sandbox.as_ref(), tool, &input, ctx).await
            }
            ToolKind::Mcp { server, tool } => {
                let mount =
                    self.inner.tools.mcp.get(server).ok_or_else(|| format!("no MCP server {server:?}"))?;
                let client = self.inner.tools.connect(mount).await?;
                client.call(tool, args).await.map_err(|e| e.to_string())
            }
            ToolKind::Agent(tool) => self.run_agent_tool(live, &def.name, tool, args, key).await,
            ToolKind::A2a { agent, skill } => {
                let mount =
                    self.inner.tools.a2a.get(agent).ok_or_else(|| format!("no A2A agent {agent:?}"))?;
                let client = self.inner.tools.connect_a2a(mount).await?;
                client.call(skill, &args, key, recovering).await
            }
        }
    }

    async fn run_builtin(&self, live: &Arc<LiveRun>, name: &str, args: Value) -> Result<Value, String> {
        let store: &dyn Store = self.store().as_ref();
        let scope = format!("run:{}", live.id);
        let key = || args.get("key").and_then(Value::as_str).unwrap_or_default().to_owned();
        let workspace = || {
            live.workspace.clone().ok_or_else(|| {
                format!(
                    "{name}: this run has no workspace on the host; mount a volume at /workspace (`keel run --volume NAME:/workspace ...`)"
                )
            })
        };
        match name {
            "echo" => Ok(args),
            "kv.put" => {
                let value = args.get("value").cloned().unwrap_or(Value::Null);
                store.kv_put(&scope, &key(), value).await.map_err(|e| e.to_string())?;
                Ok(Value::Bool(true))
            }
            "kv.get" => {
                Ok(store.kv_get(&scope, &key()).await.map_err(|e| e.to_string())?.unwrap_or(Value::Null))
            }
            "fs.read" => keel_tools::fs::read(&workspace()?, &args).await,
            "fs.write" => keel_tools::fs::write(&workspace()?, &args).await,
            "fs.list" => keel_tools::fs::list(&workspace()?, &args).await,
            "http.fetch" => {
                let (fetcher, _bridge) = live
                    .fetcher
                    .get_or_init(|| async { self.fetcher_for(live).await })
                    .await
                    .as_ref()
                    .map_err(Clone::clone)?;
                fetcher.fetch(&args).await
            }
            other => Err(format!("the built-in tool {other} has no implementation in this kernel")),
        }
    }

    /// `http.fetch` goes through the run's egress proxy (its allowlist, injected
    /// credentials and audit), reached through a loopback port of the kernel's own.
    async fn fetcher_for(&self, live: &Arc<LiveRun>) -> Result<Fetcher, String> {
        let (proxy, bridge) = match &live.profile.network {
            keel_sandbox::Network::Allowlist(_) => {
                let socket = self.inner.data_dir.egress_socket(live.id.as_str());
                let bridge =
                    crate::sandboxing::LoopbackBridge::start(socket).await.map_err(|e| e.to_string())?;
                (Some(bridge.url()), Some(bridge))
            }
            _ => (None, None),
        };
        let ca = match self.inner.egress.ca_bundle() {
            Some(path) => Some(std::fs::read(path).map_err(|e| format!("reading the Keel CA: {e}"))?),
            None => None,
        };
        Ok((keel_tools::http::Fetcher::new(proxy, ca)?, bridge))
    }

    /// An agent called as a tool: a child run with the call's arguments as its input;
    /// its `run.exit` output is the result. The child's id is stored under the call's
    /// key before the child starts, so a retry after a crash waits for the same child.
    async fn run_agent_tool(
        &self,
        live: &Arc<LiveRun>,
        name: &str,
        tool: &keel_tools::AgentTool,
        args: Value,
        key: &str,
    ) -> Result<Value, String> {
        let store = self.store();
        let scope = format!("agent-tools:{}", live.id);
        let child = match store.kv_get(&scope, key).await.map_err(|e| e.to_string())? {
            Some(Value::String(id)) => RunId::parse(&id).map_err(|e| e.to_string())?,
            _ => {
                let id = RunId::generate(crate::now_ms());
                store.kv_put(&scope, key, json!(id.as_str())).await.map_err(|e| e.to_string())?;
                let parent = self.get(&live.id).await.map_err(|e| e.to_string())?;
                let request = crate::run::CreateRun::for_agent_tool(&parent, tool, args)?;
                self.create_as(id.clone(), request).await.map_err(|e| format!("{name}: {e}"))?;
                id
            }
        };
        loop {
            let record = match self.get(&child).await {
                Ok(record) => record,
                Err(crate::Error::RunNotFound(_)) => {
                    // Recorded but never created (the kernel died in between): start over.
                    store.kv_put(&scope, key, Value::Null).await.map_err(|e| e.to_string())?;
                    return Err(format!("{name}: the child run was lost in a crash; call the tool again"));
                }
                Err(err) => return Err(err.to_string()),
            };
            if record.state.is_terminal() {
                return match record.state {
                    keel_types::RunState::Succeeded => Ok(
                        json!({ "run_id": child.as_str(), "output": record.output.unwrap_or(Value::Null) }),
                    ),
                    state => Err(format!(
                        "{name}: the child run {child} ended {state}{}",
                        record.error.map(|e| format!(": {e}")).unwrap_or_default()
                    )),
                };
            }
            if live.exited.load(std::sync::atomic::Ordering::SeqCst) || !self.is_current(live) {
                return Err(format!("{name}: the calling run is ending"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
