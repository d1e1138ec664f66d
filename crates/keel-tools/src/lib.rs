//! Keel's governed tools, apart from the kernel that dispatches them: what a tool is
//! ([`ToolDef`], its [`Policy`]), the built-ins' definitions, and the pure parts and
//! executors the kernel calls:
//!
//! - `config`: the `[tools]` table of keel.toml (command, MCP and agent tools, policy
//!   overrides), validated with errors that name the entry and what to write instead;
//! - `grant`: patterns over tool names (`echo`, `fs.*`, `mcp:github/*`, `*`);
//! - `schema`: JSON Schema checks of a call's arguments, with the failing path named;
//! - `ratelimit`: token buckets per tool, pure with injected time;
//! - `fs`: the workspace file tools, confined beneath a root with `openat2`;
//! - `http`: `http.fetch` through the run's egress proxy (and nowhere without one);
//! - `command`: a command tool run in Keel's process sandbox, JSON in and out;
//! - `a2a`: a remote A2A agent's skills as tools: its card read, a call sent, and a call
//!   cut off by a crash looked up at the remote rather than sent twice.
//!
//! Nothing here journals, budgets or asks for approval: the kernel does, around these.

pub mod a2a;
pub mod command;
pub mod config;
pub mod fs;
pub mod grant;
pub mod http;
pub mod ratelimit;
pub mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

/// What the kernel does with a tool call whose intent was journaled but whose result
/// was not (the kernel crashed in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrashPolicy {
    /// Run it again (the tool is idempotent, or gets an idempotency key and honors it).
    #[default]
    Retry,
    /// Park the run and ask a human whether to run it again.
    Ask,
    /// Record the call as failed; the agent decides.
    Fail,
}

impl CrashPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPolicy::Retry => "retry",
            CrashPolicy::Ask => "ask",
            CrashPolicy::Fail => "fail",
        }
    }
}

/// At most `calls` calls per `per`, e.g. `10/s`, `60/min`, `1000/h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub calls: u32,
    pub per: Duration,
}

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<RateLimit, String> {
        let hint = "write it as CALLS/UNIT, e.g. \"10/s\", \"60/min\" or \"1000/h\"";
        let Some((calls, unit)) = text.trim().split_once('/') else {
            return Err(format!("rate limit {text:?} has no `/`; {hint}"));
        };
        let calls: u32 = calls.trim().parse().map_err(|_| {
            format!("rate limit {text:?}: {:?} is not a whole number of calls; {hint}", calls.trim())
        })?;
        if calls == 0 {
            return Err(format!(
                "rate limit {text:?} allows no calls; {hint} (or leave it out for no limit)"
            ));
        }
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => {
                return Err(format!(
                    "rate limit {text:?}: unknown unit {other:?} (use s, min, h or d); {hint}"
                ));
            }
        };
        Ok(RateLimit { calls, per })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s".to_owned(),
            60 => "min".to_owned(),
            3600 => "h".to_owned(),
            86_400 => "d".to_owned(),
            secs => return write!(f, "{}/{secs}s", self.calls),
        };
        write!(f, "{}/{unit}", self.calls)
    }
}

impl Serialize for RateLimit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RateLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RateLimit, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The default time a tool call may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How the kernel governs calls of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Park each call until a human approves it.
    pub requires_approval: bool,
    pub crash: CrashPolicy,
    /// The tool changes nothing (reads may be answered again freely).
    pub read_only: bool,
    pub rate_limit: Option<RateLimit>,
    pub timeout: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            requires_approval: false,
            crash: CrashPolicy::Retry,
            read_only: false,
            rate_limit: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A tool run as a program in a sandbox: JSON on stdin, JSON on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandTool {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

/// An agent offered as a tool: each call is a child run of `command`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentTool {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// Where a tool's calls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolKind {
    /// Served by the kernel itself (see [`builtins`]).
    Builtin,
    Command(CommandTool),
    /// The tool `tool` of the MCP server named `server` (shown as `mcp:<server>/<tool>`).
    Mcp {
        server: String,
        tool: String,
    },
    Agent(AgentTool),
    /// The skill `skill` of the remote A2A agent named `agent` (shown as
    /// `a2a:<agent>/<skill>`).
    A2a {
        agent: String,
        skill: String,
    },
}

/// A tool as agents see it (name, description, input schema) and as the kernel runs and
/// governs it (kind, policy).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub kind: ToolKind,
    pub policy: Policy,
}

/// The names of the built-in tools.
pub const BUILTIN_NAMES: &[&str] =
    &["echo", "kv.put", "kv.get", "fs.read", "fs.write", "fs.list", "http.fetch"];

fn builtin(name: &str, description: &str, input_schema: Value, read_only: bool) -> ToolDef {
    ToolDef {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema,
        kind: ToolKind::Builtin,
        policy: Policy { read_only, ..Policy::default() },
    }
}

/// The built-in tools with their default policies.
pub fn builtins() -> Vec<ToolDef> {
    vec![
        builtin("echo", "Returns its arguments unchanged.", json!({"type": "object"}), true),
        builtin(
            "kv.put",
            "Stores a JSON value under a key in the run's key-value space.",
            json!({"type": "object", "required": ["key", "value"],
                "properties": {"key": {"type": "string"}, "value": {}}}),
            false,
        ),
        builtin(
            "kv.get",
            "Returns the value stored under a key in the run's key-value space, or null.",
            json!({"type": "object", "required": ["key"],
                "properties": {"key": {"type": "string"}}}),
            true,
        ),
        builtin(
            "fs.read",
            "Reads a file of the run's workspace. Returns {content, bytes, truncated}; content is UTF-8 text, or base64 with encoding \"base64\" when the file is not text.",
            json!({"type": "object", "required": ["path"], "additionalProperties": false,
            "properties": {
                "path": {"type": "string", "minLength": 1, "description": "Path relative to the workspace."},
                "offset": {"type": "integer", "minimum": 0, "description": "Byte offset to start at."},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": fs::MAX_BYTES,
                    "description": "At most this many bytes (default 1 MiB)."}
            }}),
            true,
        ),
        builtin(
            "fs.write",
            "Writes a file of the run's workspace (replacing it atomically, or appending). Returns {bytes}.",
            json!({"type": "object", "required": ["path", "content"], "additionalProperties": false,
            "properties": {
                "path": {"type": "string", "minLength": 1, "description": "Path relative to the workspace."},
                "content": {"type": "string"},
                "encoding": {"enum": ["utf8", "base64"], "description": "How content is encoded (default utf8)."},
                "append": {"type": "boolean"},
                "create_dirs": {"type": "boolean", "description": "Create missing parent directories."}
            }}),
            false,
        ),
        builtin(
            "fs.list",
            "Lists a directory of the run's workspace. Returns {entries: [{path, kind, bytes}], truncated}.",
            json!({"type": "object", "additionalProperties": false,
            "properties": {
                "path": {"type": "string", "description": "Directory relative to the workspace (default \".\")."},
                "recursive": {"type": "boolean"},
                "max_entries": {"type": "integer", "minimum": 1, "maximum": fs::MAX_ENTRIES}
            }}),
            true,
        ),
        builtin(
            "http.fetch",
            "Fetches a URL through the run's egress policy. Returns {status, headers, body, truncated}; body is text, or base64 with encoding \"base64\".",
            json!({"type": "object", "required": ["url"], "additionalProperties": false,
            "properties": {
                "url": {"type": "string", "minLength": 1},
                "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {"type": "string"},
                "timeout_secs": {"type": "number", "minimum": 0, "maximum": http::MAX_TIMEOUT_SECS},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": http::MAX_BYTES}
            }}),
            false,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_and_print() {
        for (text, calls, secs, shown) in [
            ("10/s", 10, 1, "10/s"),
            ("60/min", 60, 60, "60/min"),
            ("1000/h", 1000, 3600, "1000/h"),
            (" 5 / m ", 5, 60, "5/min"),
            ("7/d", 7, 86_400, "7/d"),
        ] {
            let limit: RateLimit = text.parse().unwrap();
            assert_eq!(limit, RateLimit { calls, per: Duration::from_secs(secs) }, "{text}");
            assert_eq!(limit.to_string(), shown);
        }
        for (text, says) in [
            ("10", "has no `/`"),
            ("x/s", "not a whole number"),
            ("-1/s", "not a whole number"),
            ("0/s", "allows no calls"),
            ("10/fortnight", "unknown unit"),
        ] {
            let err = text.parse::<RateLimit>().unwrap_err();
            assert!(err.contains(says) && err.contains("e.g. \"10/s\""), "{text}: {err}");
        }
    }

    #[test]
    fn rate_limits_and_crash_policies_use_their_string_forms_in_serde() {
        let limit: RateLimit = serde_json::from_value(json!("60/min")).unwrap();
        assert_eq!(serde_json::to_value(limit).unwrap(), json!("60/min"));
        assert!(serde_json::from_value::<RateLimit>(json!("60")).is_err());
        for crash in [CrashPolicy::Retry, CrashPolicy::Ask, CrashPolicy::Fail] {
            assert_eq!(serde_json::to_value(crash).unwrap(), json!(crash.as_str()));
        }
        assert_eq!(CrashPolicy::default(), CrashPolicy::Retry);
    }

    #[test]
    fn builtins_have_valid_schemas_and_the_expected_policies() {
        let tools = builtins();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, BUILTIN_NAMES);
        for tool in &tools {
            schema::check_schema(&tool.input_schema).unwrap_or_else(|e| panic!("{}: {e}", tool.name));
            assert_eq!(tool.kind, ToolKind::Builtin);
            assert_eq!(tool.policy.timeout, DEFAULT_TIMEOUT);
            let read_only = matches!(tool.name.as_str(), "echo" | "kv.get" | "fs.read" | "fs.list");
            assert_eq!(tool.policy.read_only, read_only, "{}", tool.name);
        }
    }
}
