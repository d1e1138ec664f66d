//! The `[tools]` table of keel.toml: command tools, MCP servers, agents as tools, remote
//! A2A agents, and policy overrides by tool name or pattern. Other tables of the file are ignored. Every
//! entry is checked when the file is loaded; an error names the entry and the field and
//! says what to write instead.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::a2a::A2aAgentDef;
use crate::grant::Pattern;
use crate::{AgentTool, BUILTIN_NAMES, CommandTool, CrashPolicy, Policy, RateLimit, ToolDef, ToolKind};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not TOML, or a field has the wrong type or name (the message has the
    /// line and the field).
    #[error("keel.toml: {0}")]
    Parse(String),
    /// An entry is well-formed TOML but not a valid tool.
    #[error("keel.toml {entry}: {message}")]
    Invalid { entry: String, message: String },
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// Overrides of a tool's policy; unset fields keep the tool's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    pub requires_approval: Option<bool>,
    pub crash: Option<CrashPolicy>,
    pub read_only: Option<bool>,
    pub rate_limit: Option<RateLimit>,
    pub timeout_secs: Option<u64>,
}

impl PolicyOverride {
    pub fn apply(&self, policy: &mut Policy) {
        if let Some(value) = self.requires_approval {
            policy.requires_approval = value;
        }
        if let Some(value) = self.crash {
            policy.crash = value;
        }
        if let Some(value) = self.read_only {
            policy.read_only = value;
        }
        if let Some(value) = self.rate_limit {
            policy.rate_limit = Some(value);
        }
        if let Some(secs) = self.timeout_secs {
            policy.timeout = Duration::from_secs(secs);
        }
    }
}

/// An MCP server whose tools appear as `mcp:<name>/<tool>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerDef {
    pub name: String,
    /// Started as a child speaking MCP over stdio; exactly one of `command` and `url`.
    pub command: Option<Vec<String>>,
    /// Streamable HTTP endpoint.
    pub url: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// Patterns over the server's own tool names (`write_*`) whose calls need approval;
    /// `["*"]` for all.
    pub requires_approval: Vec<String>,
    pub crash: CrashPolicy,
    /// Per tool of this server.
    pub rate_limit: Option<RateLimit>,
    pub timeout: Duration,
    pub cwd: Option<String>,
}

impl McpServerDef {
    /// The policy of this server's tool `tool` (before `[tools.policy]` overrides).
    pub fn policy_for(&self, tool: &str) -> Policy {
        Policy {
            requires_approval: self.requires_approval.iter().any(|p| crate::grant::matches(p, tool)),
            crash: self.crash,
            read_only: false,
            rate_limit: self.rate_limit,
            timeout: self.timeout,
        }
    }

    /// The name agents see for the server's tool `tool`.
    pub fn tool_name(&self, tool: &str) -> String {
        format!("mcp:{}/{tool}", self.name)
    }
}

/// The `[tools]` table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsConfig {
    pub commands: Vec<ToolDef>,
    pub mcp: Vec<McpServerDef>,
    pub agents: Vec<ToolDef>,
    /// `[[tools.a2a]]`: remote A2A agents whose skills are tools.
    pub a2a: Vec<A2aAgentDef>,
    /// `[tools.policy."<pattern>"]` in file order; later ones win.
    pub policies: Vec<(String, PolicyOverride)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    name: String,
    description: String,
    command: Vec<String>,
    input_schema: Option<toml::Value>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    #[serde(default)]
    requires_approval: bool,
    #[serde(default)]
    crash: CrashPolicy,
    #[serde(default)]
    read_only: bool,
    rate_limit: Option<RateLimit>,
    timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: String,
    description: String,
    command: Vec<String>,
    input_schema: Option<toml::Value>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    requires_approval: bool,
    #[serde(default)]
    crash: CrashPolicy,
    #[serde(default)]
    read_only: bool,
    rate_limit: Option<RateLimit>,
    timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Approval {
    All(bool),
    Patterns(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcp {
    name: String,
    command: Option<Vec<String>>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    requires_approval: Option<Approval>,
    #[serde(default)]
    crash: CrashPolicy,
    rate_limit: Option<RateLimit>,
    timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawA2a {
    name: String,
    url: String,
    card_url: Option<String>,
    token_env: Option<String>,
    requires_approval: Option<Approval>,
    #[serde(default)]
    crash: CrashPolicy,
    rate_limit: Option<RateLimit>,
    timeout_secs: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTools {
    #[serde(default)]
    command: Vec<RawCommand>,
    #[serde(default)]
    mcp: Vec<RawMcp>,
    #[serde(default)]
    agent: Vec<RawAgent>,
    #[serde(default)]
    a2a: Vec<RawA2a>,
    /// A TOML table keeps its keys sorted; file order comes from the text (see
    /// [`policy_order`]).
    #[serde(default)]
    policy: toml::Table,
}

/// The longest timeout a tool may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;

fn invalid(entry: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { entry: entry.into(), message: message.into() }
}

fn check_name(entry: &str, name: &str, dots: bool) -> Result<()> {
    let allowed =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' || (dots && c == '.');
    let chars = if dots { "a-z 0-9 _ . -" } else { "a-z 0-9 _ -" };
    if name.starts_with("mcp:") {
        return Err(invalid(
            entry,
            format!(
                "name {name:?}: names starting with `mcp:` are reserved for MCP servers' tools; declare the server under [[tools.mcp]]"
            ),
        ));
    }
    if name.is_empty() || name.len() > 64 || !name.chars().all(allowed) {
        return Err(invalid(
            entry,
            format!("name {name:?} must be 1 to 64 characters of {chars}, e.g. \"word_count\""),
        ));
    }
    Ok(())
}

fn check_command(entry: &str, command: &[String]) -> Result<()> {
    if command.is_empty() || command[0].trim().is_empty() {
        return Err(invalid(
            entry,
            "command is empty; give the program and its arguments, e.g. command = [\"python3\", \"/opt/tools/wc.py\"]",
        ));
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(invalid(entry, "command contains a NUL byte"));
    }
    Ok(())
}

fn check_env(entry: &str, env: &BTreeMap<String, String>) -> Result<()> {
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(invalid(entry, format!("env: {key:?} is not a valid variable name (no `=` or NUL)")));
        }
        if key.starts_with("KEEL_") {
            return Err(invalid(
                entry,
                format!("env: {key:?}: KEEL_* variables are set by Keel; pick another name"),
            ));
        }
    }
    Ok(())
}

fn check_url(entry: &str, field: &str, url: &str) -> Result<()> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') && !url.contains(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(invalid(
            entry,
            format!(
                "{field} {url:?} must be an http:// or https:// URL, e.g. {field} = \"http://127.0.0.1:9999/\""
            ),
        )),
    }
}

/// A variable of the kernel's environment holding a secret: a plain name, not Keel's own.
fn check_token_env(entry: &str, name: &str) -> Result<()> {
    let plain = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(invalid(
            entry,
            format!(
                "token_env {name:?} is not an environment variable name: use letters, digits and '_', not starting with a digit, e.g. token_env = \"RESEARCH_TOKEN\""
            ),
        ));
    }
    if name.starts_with("KEEL_") {
        return Err(invalid(
            entry,
            format!(
                "token_env {name}: KEEL_* variables are the kernel's own settings; name another variable"
            ),
        ));
    }
    Ok(())
}

fn timeout(entry: &str, secs: Option<u64>) -> Result<Duration> {
    match secs {
        None => Ok(crate::DEFAULT_TIMEOUT),
        Some(secs) if (1..=MAX_TIMEOUT_SECS).contains(&secs) => Ok(Duration::from_secs(secs)),
        Some(secs) => {
            Err(invalid(entry, format!("timeout_secs = {secs}: give 1 to {MAX_TIMEOUT_SECS} seconds")))
        }
    }
}

fn input_schema(entry: &str, raw: Option<toml::Value>) -> Result<Value> {
    let schema = match raw {
        None => serde_json::json!({"type": "object"}),
        Some(raw) => serde_json::to_value(raw).map_err(|e| invalid(entry, format!("input_schema: {e}")))?,
    };
    crate::schema::check_schema(&schema).map_err(|e| invalid(entry, e))?;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid(
            entry,
            "input_schema must describe an object (tool arguments are a JSON object): add type = \"object\"",
        ));
    }
    Ok(schema)
}

/// The `[tools.policy."..."]` keys in the order the file has them (a TOML table does not
/// keep it): found by scanning the text for each key's header.
fn policy_order(text: &str, keys: Vec<String>) -> Vec<String> {
    let position = |key: &str| {
        let quoted = format!("[tools.policy.{}]", Value::String(key.to_owned()));
        let bare = format!("[tools.policy.{key}]");
        let squeezed: String = text.chars().filter(|c| !matches!(c, ' ' | '\t')).collect();
        [quoted, bare].iter().filter_map(|header| squeezed.find(header.as_str())).min().unwrap_or(usize::MAX)
    };
    let mut keys: Vec<(usize, String)> = keys.into_iter().map(|k| (position(&k), k)).collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

impl ToolsConfig {
    /// The `[tools]` table of keel.toml (`text` is the whole file); an absent table is an
    /// empty config.
    pub fn from_keel_toml(text: &str) -> Result<ToolsConfig> {
        #[derive(Deserialize)]
        struct KeelToml {
            #[serde(default)]
            tools: RawTools,
        }
        let parsed: KeelToml = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let raw = parsed.tools;
        let mut config = ToolsConfig::default();
        let mut names: HashSet<String> = BUILTIN_NAMES.iter().map(|n| (*n).to_owned()).collect();
        let mut claim = |entry: &str, name: &str| -> Result<()> {
            if BUILTIN_NAMES.contains(&name) {
                return Err(invalid(
                    entry,
                    format!(
                        "name {name:?} is a built-in tool's; pick another name (override its policy under [tools.policy.\"{name}\"] instead)"
                    ),
                ));
            }
            if !names.insert(name.to_owned()) {
                return Err(invalid(
                    entry,
                    format!("name {name:?} is used by another tool; names must be unique"),
                ));
            }
            Ok(())
        };
        // Command tools and agents as tools are both a program with a policy; an agent
        // entry is checked as one (it has no `cwd`), then becomes an agent.
        let mut program = |entry: &str, what: &str, raw: RawCommand| -> Result<ToolDef> {
            check_name(entry, &raw.name, true)?;
            claim(entry, &raw.name)?;
            check_command(entry, &raw.command)?;
            check_env(entry, &raw.env)?;
            if raw.description.trim().is_empty() {
                return Err(invalid(
                    entry,
                    format!("description is empty; say what the {what} does, for the model"),
                ));
            }
            Ok(ToolDef {
                input_schema: input_schema(entry, raw.input_schema)?,
                policy: Policy {
                    requires_approval: raw.requires_approval,
                    crash: raw.crash,
                    read_only: raw.read_only,
                    rate_limit: raw.rate_limit,
                    timeout: timeout(entry, raw.timeout_secs)?,
                },
                name: raw.name,
                description: raw.description,
                kind: ToolKind::Command(CommandTool { command: raw.command, env: raw.env, cwd: raw.cwd }),
            })
        };
        for (index, raw) in raw.command.into_iter().enumerate() {
            let entry = format!("[[tools.command]] #{} ({:?})", index + 1, raw.name);
            config.commands.push(program(&entry, "tool", raw)?);
        }
        for (index, raw) in raw.agent.into_iter().enumerate() {
            let entry = format!("[[tools.agent]] #{} ({:?})", index + 1, raw.name);
            let RawAgent {
                name,
                description,
                command,
                input_schema,
                env,
                requires_approval,
                crash,
                read_only,
                rate_limit,
                timeout_secs,
            } = raw;
            let as_program = RawCommand {
                name,
                description,
                command,
                input_schema,
                env,
                cwd: None,
                requires_approval,
                crash,
                read_only,
                rate_limit,
                timeout_secs,
            };
            let mut def = program(&entry, "agent", as_program)?;
            if let ToolKind::Command(CommandTool { command, env, .. }) = def.kind {
                def.kind = ToolKind::Agent(AgentTool { command, env });
            }
            config.agents.push(def);
        }
        let mut servers = HashSet::new();
        for (index, raw) in raw.mcp.into_iter().enumerate() {
            let entry = format!("[[tools.mcp]] #{} ({:?})", index + 1, raw.name);
            check_name(&entry, &raw.name, false)?;
            if !servers.insert(raw.name.clone()) {
                return Err(invalid(
                    &entry,
                    format!("server name {:?} is used twice; names must be unique", raw.name),
                ));
            }
            match (&raw.command, &raw.url) {
                (Some(command), None) => check_command(&entry, command)?,
                (None, Some(url)) => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(invalid(
                            &entry,
                            format!("url {url:?} must start with http:// or https://"),
                        ));
                    }
                }
                _ => {
                    return Err(invalid(
                        &entry,
                        "give exactly one of command (a stdio server, e.g. command = [\"node\", \"server.js\"]) and url (streamable HTTP, e.g. url = \"http://127.0.0.1:8000/mcp\")",
                    ));
                }
            }
            if raw.command.is_none() && !raw.env.is_empty() {
                return Err(invalid(
                    &entry,
                    "env applies to a server started with command; an HTTP server takes headers",
                ));
            }
            if raw.url.is_none() && !raw.headers.is_empty() {
                return Err(invalid(
                    &entry,
                    "headers apply to an HTTP server (url); a stdio server takes env",
                ));
            }
            check_env(&entry, &raw.env)?;
            let requires_approval = match raw.requires_approval {
                None | Some(Approval::All(false)) => Vec::new(),
                Some(Approval::All(true)) => vec!["*".to_owned()],
                Some(Approval::Patterns(patterns)) => {
                    for pattern in &patterns {
                        Pattern::parse(pattern)
                            .map_err(|e| invalid(&entry, format!("requires_approval: {e}")))?;
                    }
                    patterns
                }
            };
            config.mcp.push(McpServerDef {
                timeout: timeout(&entry, raw.timeout_secs)?,
                name: raw.name,
                command: raw.command,
                url: raw.url,
                headers: raw.headers,
                env: raw.env,
                requires_approval,
                crash: raw.crash,
                rate_limit: raw.rate_limit,
                cwd: raw.cwd,
            });
        }
        let mut agents = HashSet::new();
        for (index, raw) in raw.a2a.into_iter().enumerate() {
            let entry = format!("[[tools.a2a]] #{} ({:?})", index + 1, raw.name);
            check_name(&entry, &raw.name, false)?;
            if !agents.insert(raw.name.clone()) {
                return Err(invalid(
                    &entry,
                    format!("agent name {:?} is used twice; names must be unique", raw.name),
                ));
            }
            let requires_approval = match raw.requires_approval {
                None | Some(Approval::All(false)) => Vec::new(),
                Some(Approval::All(true)) => vec!["*".to_owned()],
                Some(Approval::Patterns(patterns)) => {
                    for pattern in &patterns {
                        Pattern::parse(pattern)
                            .map_err(|e| invalid(&entry, format!("requires_approval: {e}")))?;
                    }
                    patterns
                }
            };
            check_url(&entry, "url", &raw.url)?;
            let card_url = match raw.card_url {
                Some(card_url) => {
                    check_url(&entry, "card_url", &card_url)?;
                    card_url
                }
                None => crate::a2a::card_url(&raw.url),
            };
            if let Some(name) = &raw.token_env {
                check_token_env(&entry, name)?;
            }
            config.a2a.push(A2aAgentDef {
                timeout: timeout(&entry, raw.timeout_secs)?,
                name: raw.name,
                url: raw.url,
                card_url,
                token_env: raw.token_env,
                requires_approval,
                crash: raw.crash,
                rate_limit: raw.rate_limit,
            });
        }
        let keys = policy_order(text, raw.policy.keys().cloned().collect());
        for key in keys {
            let entry = format!("[tools.policy.{:?}]", key);
            Pattern::parse(&key).map_err(|e| invalid(&entry, e))?;
            let value = raw.policy.get(&key).cloned().unwrap_or(toml::Value::Table(toml::Table::new()));
            let override_: PolicyOverride =
                value.try_into().map_err(|e: toml::de::Error| invalid(&entry, e.to_string()))?;
            if let Some(secs) = override_.timeout_secs {
                timeout(&entry, Some(secs))?;
            }
            config.policies.push((key, override_));
        }
        Ok(config)
    }

    /// Applies every `[tools.policy]` override whose pattern matches `def`'s name, in
    /// file order (later ones win field by field).
    pub fn apply_policies(&self, def: &mut ToolDef) {
        for (pattern, override_) in &self.policies {
            if crate::grant::matches(pattern, &def.name) {
                override_.apply(&mut def.policy);
            }
        }
    }

    /// Every tool this config defines directly (command tools and agents; MCP tools and
    /// A2A skills are known once their servers answer), with policy overrides applied, after the
    /// built-ins (overrides applied too).
    pub fn tools(&self) -> Vec<ToolDef> {
        let mut tools = crate::builtins();
        tools.extend(self.commands.iter().cloned());
        tools.extend(self.agents.iter().cloned());
        for tool in &mut tools {
            self.apply_policies(tool);
        }
        tools
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const FULL: &str = r#"
[llm]
default_model = "x"

[[tools.command]]
name = "word_count"
description = "Counts the words of a text."
command = ["python3", "/opt/tools/wc.py"]
input_schema = { type = "object", required = ["text"], properties = { text = { type = "string" } } }
env = { LANG = "C.UTF-8" }
requires_approval = false
crash = "retry"
read_only = false
rate_limit = "10/s"
timeout_secs = 30

[[tools.mcp]]
name = "fs"
command = ["node", "server.js", "/srv"]
env = {}
requires_approval = ["write_*"]
crash = "ask"
rate_limit = "5/s"
timeout_secs = 60

[[tools.mcp]]
name = "remote"
url = "http://127.0.0.1:8000/mcp"
headers = { Authorization = "Bearer x" }
requires_approval = true

[[tools.agent]]
name = "summarize"
description = "Summarizes."
command = ["python3", "summarize.py"]
input_schema = { type = "object" }

[tools.policy."fs.write"]
requires_approval = true
rate_limit = "5/min"
crash = "fail"

[tools.policy."word_*"]
timeout_secs = 5
read_only = true

[tools.policy."*"]
timeout_secs = 7
"#;

    #[test]
    fn the_full_example_parses() {
        let config = ToolsConfig::from_keel_toml(FULL).unwrap();
        assert_eq!(config.commands.len(), 1);
        let wc = &config.commands[0];
        assert_eq!(wc.name, "word_count");
        assert_eq!(
            wc.input_schema,
            json!({"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
        );
        let ToolKind::Command(command) = &wc.kind else { panic!("{:?}", wc.kind) };
        assert_eq!(command.command, ["python3", "/opt/tools/wc.py"]);
        assert_eq!(command.env.get("LANG").map(String::as_str), Some("C.UTF-8"));
        assert_eq!(
            wc.policy,
            Policy {
                requires_approval: false,
                crash: CrashPolicy::Retry,
                read_only: false,
                rate_limit: Some("10/s".parse().unwrap()),
                timeout: Duration::from_secs(30),
            }
        );
        let fs = &config.mcp[0];
        assert_eq!(fs.command.as_deref(), Some(&["node".to_owned(), "server.js".into(), "/srv".into()][..]));
        assert_eq!(fs.requires_approval, ["write_*"]);
        assert_eq!(fs.crash, CrashPolicy::Ask);
        assert!(fs.policy_for("write_file").requires_approval);
        assert!(!fs.policy_for("read_file").requires_approval);
        assert_eq!(fs.tool_name("read_file"), "mcp:fs/read_file");
        let remote = &config.mcp[1];
        assert_eq!(remote.url.as_deref(), Some("http://127.0.0.1:8000/mcp"));
        assert_eq!(remote.requires_approval, ["*"]);
        assert!(remote.policy_for("anything").requires_approval);
        assert_eq!(remote.timeout, crate::DEFAULT_TIMEOUT);
        assert_eq!(config.agents[0].name, "summarize");
        assert!(matches!(config.agents[0].kind, ToolKind::Agent(_)));
        let keys: Vec<&str> = config.policies.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["fs.write", "word_*", "*"], "file order, not sorted order");
    }

    #[test]
    fn policies_apply_by_pattern_and_later_ones_win() {
        let config = ToolsConfig::from_keel_toml(FULL).unwrap();
        let tools = config.tools();
        let find = |name: &str| tools.iter().find(|t| t.name == name).unwrap().policy.clone();
        let write = find("fs.write");
        assert!(write.requires_approval);
        assert_eq!(write.crash, CrashPolicy::Fail);
        assert_eq!(write.rate_limit, Some("5/min".parse().unwrap()));
        assert_eq!(write.timeout, Duration::from_secs(7), "`*` comes last and wins");
        let wc = find("word_count");
        assert!(wc.read_only);
        assert_eq!(wc.timeout, Duration::from_secs(7));
        assert!(!find("fs.read").requires_approval);
        let mut mcp_tool = ToolDef {
            name: "mcp:fs/x".into(),
            description: String::new(),
            input_schema: json!({}),
            kind: ToolKind::Mcp { server: "fs".into(), tool: "x".into() },
            policy: config.mcp[0].policy_for("x"),
        };
        config.apply_policies(&mut mcp_tool);
        assert_eq!(mcp_tool.policy.timeout, Duration::from_secs(7));
        assert_eq!(mcp_tool.policy.crash, CrashPolicy::Ask);
    }

    #[test]
    fn no_tools_table_is_an_empty_config() {
        assert_eq!(ToolsConfig::from_keel_toml("[llm]\nx = 1\n").unwrap(), ToolsConfig::default());
        assert_eq!(ToolsConfig::from_keel_toml("").unwrap(), ToolsConfig::default());
    }

    fn error(text: &str) -> String {
        ToolsConfig::from_keel_toml(text).unwrap_err().to_string()
    }

    const CMD: &str = "[[tools.command]]\nname = \"wc\"\ndescription = \"d\"\ncommand = [\"wc\"]\n";

    #[test]
    fn a2a_agents_parse_with_their_card_url_token_and_policy() {
        let text = r#"
[[tools.a2a]]
name = "research"
url = "http://127.0.0.1:9999/"
token_env = "RESEARCH_TOKEN"
timeout_secs = 120
requires_approval = ["*"]
rate_limit = "2/s"

[[tools.a2a]]
name = "notes"
url = "https://notes.example/a2a"
card_url = "https://notes.example/card.json"
requires_approval = ["write_*"]
crash = "fail"

[tools.policy."a2a:notes/*"]
timeout_secs = 9
"#;
        let config = ToolsConfig::from_keel_toml(text).unwrap();
        let research = &config.a2a[0];
        assert_eq!(research.card_url, "http://127.0.0.1:9999/.well-known/agent-card.json");
        assert_eq!(research.token_env.as_deref(), Some("RESEARCH_TOKEN"));
        assert_eq!(
            research.policy_for("anything"),
            Policy {
                requires_approval: true,
                crash: CrashPolicy::Retry,
                read_only: false,
                rate_limit: Some("2/s".parse().unwrap()),
                timeout: Duration::from_secs(120),
            }
        );
        assert_eq!(research.tool_name("echo"), "a2a:research/echo");
        let notes = &config.a2a[1];
        assert_eq!(notes.card_url, "https://notes.example/card.json");
        assert_eq!((notes.token_env.as_deref(), notes.crash), (None, CrashPolicy::Fail));
        assert!(notes.policy_for("write_note").requires_approval);
        assert!(!notes.policy_for("read_note").requires_approval);
        assert_eq!(notes.timeout, crate::DEFAULT_TIMEOUT);
        let mut tool = ToolDef {
            name: notes.tool_name("read_note"),
            description: String::new(),
            input_schema: json!({}),
            kind: ToolKind::A2a { agent: "notes".into(), skill: "read_note".into() },
            policy: notes.policy_for("read_note"),
        };
        config.apply_policies(&mut tool);
        assert_eq!(tool.policy.timeout, Duration::from_secs(9));
        // An A2A agent may share a name with an MCP server: the prefixes keep them apart.
        let both = "[[tools.mcp]]\nname = \"x\"\nurl = \"http://h\"\n[[tools.a2a]]\nname = \"x\"\nurl = \"http://h\"\n";
        assert_eq!(ToolsConfig::from_keel_toml(both).unwrap().a2a[0].name, "x");
    }

    #[test]
    fn bad_a2a_entries_name_the_entry_and_what_to_write() {
        let a2a = |extra: &str| format!("[[tools.a2a]]\nname = \"research\"\nurl = \"http://h:1/\"\n{extra}");
        let cases: &[(String, &[&str])] = &[
            ("[[tools.a2a]]\nname = \"research\"\n".into(), &["missing field `url`"]),
            (a2a("colour = 1\n"), &["unknown field `colour`"]),
            (a2a("read_only = true\n"), &["unknown field `read_only`"]),
            (
                a2a("").replace("http://h:1/", "h:1"),
                &["[[tools.a2a]] #1 (\"research\")", "url \"h:1\"", "http://"],
            ),
            (a2a("").replace("http://h:1/", "http://"), &["#1 (\"research\")", "url \"http://\""]),
            (a2a("card_url = \"/card.json\"\n"), &["#1 (\"research\")", "card_url", "http://"]),
            (
                a2a("token_env = \"MY-TOKEN\"\n"),
                &["#1 (\"research\")", "token_env \"MY-TOKEN\"", "RESEARCH_TOKEN"],
            ),
            (a2a("token_env = \"1TOKEN\"\n"), &["not an environment variable name"]),
            (a2a("token_env = \"KEEL_API_TOKEN\"\n"), &["KEEL_API_TOKEN", "kernel's own"]),
            (a2a("timeout_secs = 0\n"), &["#1 (\"research\")", "timeout_secs = 0", "1 to"]),
            (
                a2a("requires_approval = [\"bad pattern\"]\n"),
                &["#1 (\"research\")", "requires_approval", "whitespace"],
            ),
            (a2a("crash = \"sometimes\"\n"), &["unknown variant `sometimes`"]),
            (a2a("rate_limit = \"fast\"\n"), &["rate limit \"fast\""]),
            (
                a2a("").replace("\"research\"", "\"Re search\""),
                &["[[tools.a2a]] #1 (\"Re search\")", "a-z 0-9 _ -"],
            ),
            (format!("{}{}", a2a(""), a2a("")), &["[[tools.a2a]] #2 (\"research\")", "used twice"]),
        ];
        for (text, says) in cases {
            let message = error(text);
            for part in *says {
                assert!(message.contains(part), "{text}\n--> {message}\n(wanted {part:?})");
            }
        }
    }

    #[test]
    fn bad_entries_say_which_and_what_to_write() {
        let cases: &[(String, &[&str])] = &[
            (format!("{CMD}colour = 1\n"), &["unknown field `colour`"]),
            (format!("{CMD}crash = \"maybe\"\n"), &["unknown variant `maybe`", "retry"]),
            (format!("{CMD}rate_limit = \"10\"\n"), &["has no `/`", "\"10/s\""]),
            (format!("{CMD}timeout_secs = 0\n"), &["#1 (\"wc\")", "timeout_secs = 0", "1 to"]),
            (CMD.replace("\"wc\"\nd", "\"Word Count\"\nd"), &["\"Word Count\"", "a-z 0-9"]),
            (CMD.replace("name = \"wc\"", "name = \"echo\""), &["built-in", "[tools.policy.\"echo\"]"]),
            (CMD.replace("name = \"wc\"", "name = \"mcp:x\""), &["reserved", "[[tools.mcp]]"]),
            (format!("{CMD}{CMD}"), &["#2", "used by another tool"]),
            (CMD.replace("[\"wc\"]", "[]"), &["command is empty", "command = ["]),
            (CMD.replace("\"d\"", "\"  \""), &["description is empty"]),
            (format!("{CMD}input_schema = {{ type = \"array\" }}\n"), &["add type = \"object\""]),
            (format!("{CMD}input_schema = {{ type = \"obj\" }}\n"), &["input_schema.type", "not a type"]),
            (format!("{CMD}env = {{ KEEL_X = \"1\" }}\n"), &["KEEL_X", "set by Keel"]),
            (CMD.replace("description = \"d\"\n", ""), &["missing field `description`"]),
            ("[[tools.mcp]]\nname = \"fs\"\n".into(), &["exactly one of command", "url ="]),
            (
                "[[tools.mcp]]\nname = \"fs\"\ncommand = [\"x\"]\nurl = \"http://h\"\n".into(),
                &["exactly one of command"],
            ),
            ("[[tools.mcp]]\nname = \"fs\"\nurl = \"ftp://h\"\n".into(), &["http:// or https://"]),
            ("[[tools.mcp]]\nname = \"f.s\"\nurl = \"http://h\"\n".into(), &["a-z 0-9 _ -"]),
            (
                "[[tools.mcp]]\nname = \"fs\"\nurl = \"http://h\"\nrequires_approval = [\"bad pattern\"]\n".into(),
                &["requires_approval", "whitespace"],
            ),
            (
                "[[tools.mcp]]\nname = \"fs\"\nurl = \"http://h\"\nenv = { A = \"1\" }\n".into(),
                &["takes headers", "HTTP"],
            ),
            (
                "[[tools.mcp]]\nname = \"fs\"\nurl = \"http://h\"\n[[tools.mcp]]\nname = \"fs\"\nurl = \"http://h\"\n"
                    .into(),
                &["#2", "used twice"],
            ),
            ("[tools.policy.\"f s\"]\ncrash = \"ask\"\n".into(), &["[tools.policy.\"f s\"]", "whitespace"]),
            ("[tools.policy.\"fs.*\"]\nrequires_approval = \"yes\"\n".into(), &["[tools.policy.\"fs.*\"]"]),
            ("[tools.policy.\"fs.*\"]\nlimit = 1\n".into(), &["unknown field `limit`"]),
            ("[tools]\nfoo = 1\n".into(), &["unknown field `foo`"]),
        ];
        for (text, says) in cases {
            let message = error(text);
            for part in *says {
                assert!(message.contains(part), "{text}\n--> {message}\n(wanted {part:?})");
            }
        }
    }
}
