//! The tool registry and the tools' executors. The registry holds every tool the kernel
//! knows: the built-ins (`echo`, `kv.*`, `fs.*`, `http.fetch`), command tools and agents
//! as tools from the `[tools]` table of keel.toml, and the tools of mounted MCP servers
//! (`mcp:<server>/<tool>`, listed when the server is first needed), and the skills of
//! remote A2A agents (`a2a:<agent>/<skill>`, listed when the agent's card is first
//! read). Governance (grants,
//! schemas, rate limits, approvals, crash policies, audit) is in `dispatch.rs`; here is
//! what a tool is and how each kind runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_protocol::api::ToolView;
use keel_protocol::rpc::ToolSpec;
use keel_sandbox::plan::inside;
use keel_tools::a2a::A2aAgentDef;
use keel_tools::config::{McpServerDef, ToolsConfig};
use keel_tools::{Policy, ToolDef, ToolKind};
use serde_json::json;

use crate::lock;

/// `http.fetch`'s client for a run, with the loopback bridge to its egress proxy.
pub(crate) type Fetcher = (keel_tools::http::Fetcher, Option<crate::sandboxing::LoopbackBridge>);

/// How long connecting to an MCP server (spawn + initialize + tools/list) may take.
const MCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Registry {
    /// Built-ins, command tools and agents as tools: fixed for the kernel's life.
    fixed: BTreeMap<String, ToolDef>,
    /// Mounted MCP servers by name.
    pub(crate) mcp: BTreeMap<String, Arc<McpMount>>,
    /// Remote A2A agents by name.
    pub(crate) a2a: BTreeMap<String, Arc<A2aMount>>,
    config: ToolsConfig,
    limiter: keel_tools::ratelimit::Limiter,
}

/// One MCP server: connected on first use, reconnected when it went away.
pub(crate) struct McpMount {
    def: McpServerDef,
    client: tokio::sync::Mutex<Option<Arc<keel_mcp::Client>>>,
    /// Its tools as of the last connection.
    tools: RwLock<BTreeMap<String, ToolDef>>,
    /// `connected`, `not connected yet`, or why the last attempt failed.
    status: Mutex<String>,
}

/// One remote A2A agent: its card read on first use, read again while that fails.
pub(crate) struct A2aMount {
    def: A2aAgentDef,
    client: tokio::sync::Mutex<Option<Arc<keel_tools::a2a::Client>>>,
    /// Its skills as tools, from the card.
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
        let a2a = config
            .a2a
            .iter()
            .map(|def| {
                let mount = A2aMount {
                    def: def.clone(),
                    client: tokio::sync::Mutex::new(None),
                    tools: RwLock::default(),
                    status: Mutex::new("not connected yet".into()),
                };
                (def.name.clone(), Arc::new(mount))
            })
            .collect();
        Registry { fixed, mcp, a2a, config, limiter: keel_tools::ratelimit::Limiter::new() }
    }

    /// The policy of a tool the registry has seen (MCP tools once listed).
    pub(crate) fn policy_of(&self, name: &str) -> Option<Policy> {
        if let Some(def) = self.fixed.get(name) {
            return Some(def.policy.clone());
        }
        if let Some((agent, skill)) = keel_tools::a2a::split_name(name) {
            let tools = self.a2a.get(agent)?.tools.read().unwrap_or_else(|p| p.into_inner());
            return tools.get(skill).map(|d| d.policy.clone());
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
        if let Some((agent, skill)) = keel_tools::a2a::split_name(name) {
            return self.resolve_a2a(agent, skill).await;
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
    pub(crate) async fn connect(&self, mount: &McpMount) -> Result<Arc<keel_mcp::Client>, String> {
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

    async fn resolve_a2a(&self, agent: &str, skill: &str) -> Result<ToolDef, String> {
        let Some(mount) = self.a2a.get(agent) else {
            let agents: Vec<&str> = self.a2a.keys().map(String::as_str).collect();
            return Err(format!(
                "no A2A agent {agent:?} is configured (configured: {}); add it under [[tools.a2a]] in keel.toml",
                if agents.is_empty() { "none".to_owned() } else { agents.join(", ") }
            ));
        };
        self.connect_a2a(mount).await?;
        let tools = mount.tools.read().unwrap_or_else(|p| p.into_inner());
        tools.get(skill).cloned().ok_or_else(|| {
            let known: Vec<&str> = tools.keys().map(String::as_str).collect();
            format!("A2A agent {agent:?} has no skill {skill:?}; its card lists: {}", known.join(", "))
        })
    }

    /// The client of an A2A agent, reading its card first if that has not succeeded yet.
    /// A card once read is kept for the kernel's life.
    pub(crate) async fn connect_a2a(&self, mount: &A2aMount) -> Result<Arc<keel_tools::a2a::Client>, String> {
        let mut client = mount.client.lock().await;
        if let Some(existing) = client.as_ref() {
            return Ok(existing.clone());
        }
        let (connected, card) = match keel_tools::a2a::Client::connect(&mount.def).await {
            Ok(connected) => connected,
            Err(message) => {
                *lock(&mount.status) = message.clone();
                return Err(message);
            }
        };
        let mut tools = BTreeMap::new();
        for mut def in keel_tools::a2a::tools(&mount.def, &card) {
            self.config.apply_policies(&mut def);
            if let ToolKind::A2a { skill, .. } = &def.kind {
                tools.insert(skill.clone(), def);
            }
        }
        *mount.tools.write().unwrap_or_else(|p| p.into_inner()) = tools;
        *lock(&mount.status) = "connected".into();
        let connected = Arc::new(connected);
        *client = Some(connected.clone());
        Ok(connected)
    }

    /// The variables of the kernel's environment that hold A2A agents' tokens: never
    /// handed to an agent process.
    pub(crate) fn holds_secret(&self, variable: &str) -> bool {
        self.a2a.values().any(|mount| mount.def.token_env.as_deref() == Some(variable))
    }

    /// Every tool, connecting the MCP servers and reading the A2A cards that are not yet
    /// (those that fail are left out, their status says why).
    pub(crate) async fn all(&self) -> Vec<ToolDef> {
        let mut defs: Vec<ToolDef> = self.fixed.values().cloned().collect();
        let connects = self.mcp.values().map(|mount| async move {
            let _ = self.connect(mount).await;
        });
        let reads = self.a2a.values().map(|mount| async move {
            let _ = self.connect_a2a(mount).await;
        });
        futures_util::future::join(
            futures_util::future::join_all(connects),
            futures_util::future::join_all(reads),
        )
        .await;
        for mount in self.mcp.values() {
            defs.extend(mount.tools.read().unwrap_or_else(|p| p.into_inner()).values().cloned());
        }
        for mount in self.a2a.values() {
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
        for (name, mount) in &self.a2a {
            let status = lock(&mount.status).clone();
            let prefix = format!("a2a:{name}/");
            for view in views.iter_mut().filter(|v| v.name.starts_with(&prefix)) {
                view.status = Some(status.clone());
            }
            if status != "connected" {
                views.push(ToolView {
                    name: format!("a2a:{name}/*"),
                    kind: "a2a".into(),
                    description: format!("the skills of A2A agent {name:?} ({})", mount.def.url),
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
        ToolKind::A2a { .. } => "a2a",
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
