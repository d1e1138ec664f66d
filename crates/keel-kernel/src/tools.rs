//! The tool registry and the tools' executors. The registry holds every tool the kernel
//! knows: the built-ins (`echo`, `kv.*`, `fs.*`, `http.fetch`), command tools and agents
//! as tools from the `[tools]` table of keel.toml, and the tools of mounted MCP servers
//! (`mcp:<server>/<tool>`, listed when the server is first needed). Governance (grants,
//! schemas, rate limits, approvals, crash policies, audit) is in `dispatch.rs`; here is
//! what a tool is and how each kind runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_protocol::api::ToolView;
use keel_protocol::rpc::ToolSpec;
use keel_sandbox::plan::inside;
use keel_store::Store;
use keel_tools::config::{McpServerDef, ToolsConfig};
use keel_tools::{Policy, ToolDef, ToolKind};
use keel_types::RunId;
use serde_json::{Value, json};

use crate::Kernel;
use crate::lock;
use crate::run::LiveRun;

/// `http.fetch`'s client for a run, with the loopback bridge to its egress proxy.
pub(crate) type Fetcher = (keel_tools::http::Fetcher, Option<crate::sandboxing::LoopbackBridge>);

/// How long connecting to an MCP server (spawn + initialize + tools/list) may take.
const MCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Registry {
    /// Built-ins, command tools and agents as tools: fixed for the kernel's life.
    fixed: BTreeMap<String, ToolDef>,
    /// Mounted MCP servers by name.
    mcp: BTreeMap<String, Arc<McpMount>>,
    config: ToolsConfig,
    limiter: keel_tools::ratelimit::Limiter,
}

/// One MCP server: connected on first use, reconnected when it went away.
struct McpMount {
    def: McpServerDef,
    client: tokio::sync::Mutex<Option<Arc<keel_mcp::Client>>>,
    /// Its tools as of the last connection.
    tools: RwLock<BTreeMap<String, ToolDef>>,
    /// `connected`, `not connected yet`, or why the last attempt failed.
    status: Mutex<String>,
}

/// Splits `mcp:<server>/<tool>`.
pub(crate) fn split_mcp(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("mcp:")?.split_once('/')
}

impl Registry {
    pub(crate) fn new(config: ToolsConfig) -> Registry {
        let mut fixed = BTreeMap::new();
        for mut def in
            keel_tools::builtins().into_iter().chain(config.commands.clone()).chain(config.agents.clone())
        {
            config.apply_policies(&mut def);
            fixed.insert(def.name.clone(), def);
        }
        let mcp = config
            .mcp
            .iter()
            .map(|def| {
                let mount = McpMount {
                    def: def.clone(),
                    client: tokio::sync::Mutex::new(None),
                    tools: RwLock::default(),
                    status: Mutex::new("not connected yet".into()),
                };
                (def.name.clone(), Arc::new(mount))
            })
            .collect();
        Registry { fixed, mcp, config, limiter: keel_tools::ratelimit::Limiter::new() }
    }

    /// The policy of a tool the registry has seen (MCP tools once listed).
    pub(crate) fn policy_of(&self, name: &str) -> Option<Policy> {
        if let Some(def) = self.fixed.get(name) {
            return Some(def.policy.clone());
        }
        let (server, tool) = split_mcp(name)?;
        let mount = self.mcp.get(server)?;
        let tools = mount.tools.read().unwrap_or_else(|p| p.into_inner());
        tools.get(tool).map(|d| d.policy.clone())
    }

    /// Finds a tool by name, connecting its MCP server first if need be. `Err` says why
    /// there is no such tool.
    pub(crate) async fn resolve(&self, name: &str) -> Result<ToolDef, String> {
        if let Some(def) = self.fixed.get(name) {
            return Ok(def.clone());
        }
        let Some((server, tool)) = split_mcp(name) else {
            return Err(format!("no tool {name:?}"));
        };
        let Some(mount) = self.mcp.get(server) else {
            let servers: Vec<&str> = self.mcp.keys().map(String::as_str).collect();
            return Err(format!(
                "no MCP server {server:?} is mounted (mounted: {}); add it under [[tools.mcp]] in keel.toml",
                if servers.is_empty() { "none".to_owned() } else { servers.join(", ") }
            ));
        };
        self.connect(mount).await?;
        let tools = mount.tools.read().unwrap_or_else(|p| p.into_inner());
        tools.get(tool).cloned().ok_or_else(|| {
            let known: Vec<&str> = tools.keys().map(String::as_str).collect();
            format!("MCP server {server:?} has no tool {tool:?}; it has: {}", known.join(", "))
        })
    }

    /// The connected client of a mount (connecting, or reconnecting after the server
    /// went away).
    async fn connect(&self, mount: &McpMount) -> Result<Arc<keel_mcp::Client>, String> {
        let mut client = mount.client.lock().await;
        if let Some(existing) = client.as_ref()
            && !existing.is_closed()
        {
            return Ok(existing.clone());
        }
        let config = mcp_config(&mount.def);
        let connected =
            match tokio::time::timeout(MCP_CONNECT_TIMEOUT, keel_mcp::Client::connect(&config)).await {
                Ok(Ok(connected)) => connected,
                Ok(Err(err)) => {
                    let message = format!("MCP server {:?} is not available: {err}", mount.def.name);
                    *lock(&mount.status) = message.clone();
                    return Err(message);
                }
                Err(_) => {
                    let message = format!(
                        "MCP server {:?} did not finish connecting within {} s",
                        mount.def.name,
                        MCP_CONNECT_TIMEOUT.as_secs()
                    );
                    *lock(&mount.status) = message.clone();
                    return Err(message);
                }
            };
        let mut tools = BTreeMap::new();
        for remote in connected.tools() {
            let name = format!("mcp:{}/{}", mount.def.name, remote.name);
            let requires_approval =
                mount.def.requires_approval.iter().any(|p| keel_tools::grant::matches(p, &remote.name));
            let mut def = ToolDef {
                name,
                description: remote.description.clone(),
                input_schema: remote.input_schema.clone(),
                kind: ToolKind::Mcp { server: mount.def.name.clone(), tool: remote.name.clone() },
                policy: Policy {
                    requires_approval,
                    crash: mount.def.crash,
                    read_only: remote.read_only,
                    rate_limit: mount.def.rate_limit,
                    timeout: mount.def.timeout,
                },
            };
            self.config.apply_policies(&mut def);
            tools.insert(remote.name.clone(), def);
        }
        *mount.tools.write().unwrap_or_else(|p| p.into_inner()) = tools;
        *lock(&mount.status) = "connected".into();
        let connected = Arc::new(connected);
        *client = Some(connected.clone());
        Ok(connected)
    }

    /// Every tool, connecting the MCP servers that are not yet (those that fail are
    /// left out, their status says why).
    pub(crate) async fn all(&self) -> Vec<ToolDef> {
        let mut defs: Vec<ToolDef> = self.fixed.values().cloned().collect();
        let connects = self.mcp.values().map(|mount| async move {
            let _ = self.connect(mount).await;
        });
        futures_util::future::join_all(connects).await;
        for mount in self.mcp.values() {
            defs.extend(mount.tools.read().unwrap_or_else(|p| p.into_inner()).values().cloned());
        }
        defs
    }

    /// The registry as `keel tools` shows it.
    pub(crate) async fn views(&self) -> Vec<ToolView> {
        let mut views: Vec<ToolView> = self.all().await.iter().map(|def| view(def, None)).collect();
        for (name, mount) in &self.mcp {
            let status = lock(&mount.status).clone();
            for view in views.iter_mut().filter(|v| split_mcp(&v.name).is_some_and(|(s, _)| s == name)) {
                view.status = Some(status.clone());
            }
            if status != "connected" {
                views.push(ToolView {
                    name: format!("mcp:{name}/*"),
                    kind: "mcp".into(),
                    description: format!("the tools of MCP server {name:?}"),
                    input_schema: json!({}),
                    requires_approval: !mount.def.requires_approval.is_empty(),
                    crash: mount.def.crash.as_str().into(),
                    read_only: false,
                    rate_limit: mount.def.rate_limit.as_ref().map(ToString::to_string),
                    status: Some(status),
                });
            }
        }
        views
    }

    /// Waits until a call of `def` fits its rate limit; `Err` when it would wait longer
    /// than the tool's timeout.
    pub(crate) async fn rate_limit(&self, def: &ToolDef) -> Result<(), String> {
        let Some(limit) = &def.policy.rate_limit else { return Ok(()) };
        let deadline = Instant::now() + def.policy.timeout;
        loop {
            match self.limiter.acquire(&def.name, limit, Instant::now()) {
                Ok(()) => return Ok(()),
                Err(wait) if Instant::now() + wait <= deadline => tokio::time::sleep(wait).await,
                Err(wait) => {
                    return Err(format!(
                        "tool {} is rate limited to {limit}; the next call is allowed in {:.1} s, past its timeout",
                        def.name,
                        wait.as_secs_f64()
                    ));
                }
            }
        }
    }

    /// Closes every MCP connection (the kernel is stopping).
    pub(crate) async fn close(&self) {
        for mount in self.mcp.values() {
            if let Some(client) = mount.client.lock().await.take()
                && let Ok(client) = Arc::try_unwrap(client)
            {
                client.close().await;
            }
        }
    }
}

fn mcp_config(def: &McpServerDef) -> keel_mcp::ServerConfig {
    let transport = match (&def.command, &def.url) {
        (Some(command), _) => keel_mcp::Transport::Stdio {
            command: command.clone(),
            env: def.env.clone(),
            cwd: def.cwd.as_ref().map(PathBuf::from),
        },
        (None, Some(url)) => keel_mcp::Transport::Http { url: url.clone(), headers: def.headers.clone() },
        (None, None) => keel_mcp::Transport::Http { url: String::new(), headers: BTreeMap::new() },
    };
    keel_mcp::ServerConfig { name: def.name.clone(), transport, timeout: def.timeout }
}

pub(crate) fn kind_name(kind: &ToolKind) -> &'static str {
    match kind {
        ToolKind::Builtin => "builtin",
        ToolKind::Command(_) => "command",
        ToolKind::Mcp { .. } => "mcp",
        ToolKind::Agent(_) => "agent",
    }
}

fn view(def: &ToolDef, status: Option<String>) -> ToolView {
    ToolView {
        name: def.name.clone(),
        kind: kind_name(&def.kind).into(),
        description: def.description.clone(),
        input_schema: def.input_schema.clone(),
        requires_approval: def.policy.requires_approval,
        crash: def.policy.crash.as_str().into(),
        read_only: def.policy.read_only,
        rate_limit: def.policy.rate_limit.as_ref().map(ToString::to_string),
        status,
    }
}

pub(crate) fn spec(def: &ToolDef) -> ToolSpec {
    ToolSpec {
        name: def.name.clone(),
        description: def.description.clone(),
        input_schema: def.input_schema.clone(),
    }
}

/// Where a run's `fs.*` tools act on the host: the volume mounted at `/workspace`, or,
/// for a run that shares the host (tier `none`), its working directory.
pub(crate) fn workspace_of(
    profile: &keel_sandbox::Profile,
    shares_host: bool,
    cwd: &Path,
) -> Option<PathBuf> {
    if shares_host {
        return Some(cwd.to_path_buf());
    }
    profile.volumes.iter().find(|v| v.target == Path::new(inside::WORKSPACE)).map(|v| v.host.clone())
}

impl Kernel {
    /// The tools a run may call, as `tool.list` answers.
    pub(crate) async fn granted_tools(&self, live: &LiveRun) -> Vec<ToolDef> {
        self.inner.tools.all().await.into_iter().filter(|def| live.grant.allows(&def.name)).collect()
    }

    /// `GET /v1/tools`.
    pub async fn tool_views(&self) -> Vec<ToolView> {
        self.inner.tools.views().await
    }

    /// Runs one tool call whose governance passed. `key` is the call's idempotency key
    /// (`run_id:seq`), handed to tools that can use it.
    pub(crate) async fn run_tool(
        &self,
        live: &Arc<LiveRun>,
        def: &ToolDef,
        args: Value,
        key: &str,
    ) -> Result<Value, String> {
        let work = self.run_tool_untimed(live, def, args, key);
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
