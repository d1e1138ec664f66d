//! A run's spec: what it was asked to run and how, validated from the wire
//! ([`CreateRun::validate`]), stored with the run and read back by the same type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_llm::ScriptedProvider;
use keel_protocol::api::CreateRunParams;
use keel_store::RunRecord;
use keel_types::RunId;
use serde_json::{Value, json};

use crate::{Error, Result};

/// A request to start a run, validated (see [`CreateRun::validate`]).
#[derive(Debug, Clone)]
pub struct CreateRun {
    pub command: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub llm_script: Option<Value>,
    pub tenant: String,
    pub stop_grace_secs: Option<u64>,
    pub model: Option<String>,
    pub fallback_models: Vec<String>,
    pub budget: Option<keel_protocol::api::BudgetParams>,
    pub loop_threshold: Option<u32>,
    /// The run's sandbox tier and profile; `None`: the kernel's default tier.
    pub sandbox: Option<Box<keel_protocol::api::SandboxParams>>,
    /// Tool patterns the run may call; `None`: the built-in tools.
    pub grant: Option<Vec<String>>,
    /// The agent's input (`KEEL_INPUT`).
    pub input: Option<Value>,
    /// The run that started this one (an agent called as a tool).
    pub parent: Option<RunId>,
    /// `high`, `normal` or `low` (default normal).
    pub priority: Option<String>,
}

impl CreateRun {
    /// Checks a request from the wire and says exactly what is wrong with it.
    pub fn validate(params: CreateRunParams) -> Result<CreateRun> {
        let bad = |msg: String| Err(Error::InvalidRequest(msg));
        if params.command.is_empty() || params.command[0].is_empty() {
            return bad(
                "`command` is empty; give the program to run, e.g. [\"python3\", \"agent.py\"]".into()
            );
        }
        if params.command.iter().any(|a| a.contains('\0')) {
            return bad("`command` contains a NUL byte".into());
        }
        let cwd = match params.cwd {
            Some(cwd) => PathBuf::from(cwd),
            None => std::env::current_dir().map_err(|e| {
                Error::InvalidRequest(format!("no `cwd` given and the kernel's own is unreadable: {e}"))
            })?,
        };
        if !cwd.is_absolute() {
            return bad(format!("`cwd` must be an absolute path, got {:?}", cwd));
        }
        if !cwd.is_dir() {
            return bad(format!("`cwd` {:?} is not a directory on the kernel's host", cwd));
        }
        for (name, value) in &params.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
                return bad(format!(
                    "environment variable {name:?} is not valid (names are non-empty, without '=' or NUL)"
                ));
            }
            if name.starts_with("KEEL_") {
                return bad(format!(
                    "environment variable {name} is reserved: the kernel sets KEEL_* itself"
                ));
            }
        }
        if let Some(script) = &params.llm_script {
            ScriptedProvider::from_value(script).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        }
        let tenant = params.tenant.unwrap_or_else(|| "default".into());
        if tenant.is_empty()
            || tenant.len() > 64
            || !tenant.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return bad(format!("tenant {tenant:?} is not valid: use 1-64 letters, digits, '-' or '_'"));
        }
        if let Some(budget) = &params.budget {
            crate::budget::validate(budget, "budget")?;
        }
        for model in params.model.iter().chain(&params.fallback_models) {
            if model.is_empty() || model.len() > 200 || model.chars().any(char::is_whitespace) {
                return bad(format!("model {model:?} is not a model name (e.g. openai/gpt-4o-mini)"));
            }
        }
        if params.stop_grace_secs.is_some_and(|s| s > 3600) {
            return bad("`stop_grace_secs` is at most 3600".into());
        }
        if let Some(sandbox) = &params.sandbox {
            crate::sandboxing::validate(sandbox)?;
        }
        if let Some(priority) = &params.priority
            && !matches!(priority.as_str(), "high" | "normal" | "low")
        {
            return bad(format!("priority {priority:?} is not known; use high, normal or low"));
        }
        if let Some(grant) = &params.grant {
            keel_tools::grant::Grant::parse(grant)
                .map_err(|e| Error::InvalidRequest(format!("grant: {e}")))?;
        }
        if let Some(input) = &params.input
            && serde_json::to_vec(input).map_or(0, |v| v.len()) > MAX_INPUT_BYTES
        {
            return bad(format!("`input` is over {MAX_INPUT_BYTES} bytes; pass large data through a volume"));
        }
        Ok(CreateRun {
            command: params.command,
            cwd,
            env: params.env,
            llm_script: params.llm_script,
            tenant,
            stop_grace_secs: params.stop_grace_secs,
            model: params.model,
            fallback_models: params.fallback_models,
            budget: params.budget,
            loop_threshold: params.loop_threshold,
            sandbox: params.sandbox.map(Box::new),
            grant: params.grant,
            input: params.input,
            parent: None,
            priority: params.priority,
        })
    }

    pub(crate) fn to_spec(&self) -> Value {
        json!({
            "command": self.command,
            "cwd": self.cwd,
            "env": self.env,
            "llm_script": self.llm_script,
            "stop_grace_secs": self.stop_grace_secs,
            "model": self.model,
            "fallback_models": self.fallback_models,
            "budget": self.budget,
            "loop_threshold": self.loop_threshold,
            "sandbox": self.sandbox,
            "grant": self.grant,
            "input": self.input,
            "parent": self.parent.as_ref().map(RunId::as_str),
            "priority": self.priority,
        })
    }
}

impl CreateRun {
    /// The child run of an agent called as a tool: the tool's command with the call's
    /// arguments as input, in the caller's tenant, working directory, sandbox and grant.
    pub(crate) fn for_agent_tool(
        parent: &RunRecord,
        tool: &keel_tools::AgentTool,
        args: Value,
    ) -> std::result::Result<CreateRun, String> {
        let spec = RunSpec::from_value(&parent.spec).map_err(|e| e.to_string())?;
        Ok(CreateRun {
            command: tool.command.clone(),
            cwd: spec.cwd,
            env: tool.env.clone(),
            llm_script: spec.llm_script,
            tenant: parent.tenant.clone(),
            stop_grace_secs: spec.stop_grace_secs,
            model: spec.model,
            fallback_models: spec.fallback_models,
            budget: None,
            loop_threshold: None,
            sandbox: spec.sandbox.map(Box::new),
            grant: spec.grant,
            input: Some(args),
            parent: Some(parent.id.clone()),
            priority: parent.spec.get("priority").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// A child run started by `proc.spawn`: `command` in the parent's tenant, working
    /// directory, sandbox, model and grant.
    pub(crate) fn child_of(
        parent: &RunRecord,
        command: Vec<String>,
        input: Option<Value>,
    ) -> std::result::Result<CreateRun, String> {
        let tool = keel_tools::AgentTool { command, env: BTreeMap::new() };
        let mut request = CreateRun::for_agent_tool(parent, &tool, Value::Null)?;
        request.input = input;
        Ok(request)
    }
}

/// The largest `input` a run may be given, in bytes of JSON (it travels in the
/// environment).
const MAX_INPUT_BYTES: usize = 120 * 1024;

/// The parts of a stored run spec the runtime uses.
pub(crate) struct RunSpec {
    pub(crate) model: Option<String>,
    pub(crate) fallback_models: Vec<String>,
    pub(crate) command: Vec<String>,
    pub(crate) cwd: PathBuf,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) llm_script: Option<Value>,
    pub(crate) stop_grace_secs: Option<u64>,
    pub(crate) sandbox: Option<keel_protocol::api::SandboxParams>,
    pub(crate) grant: Option<Vec<String>>,
    pub(crate) input: Option<Value>,
}

impl RunSpec {
    pub(crate) fn from_value(spec: &Value) -> Result<RunSpec> {
        let corrupt = |what: &str| Error::Store(keel_store::Error::Corrupt(format!("run spec: {what}")));
        let command = spec
            .get("command")
            .and_then(Value::as_array)
            .ok_or_else(|| corrupt("no command"))?
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| corrupt("command is not a list of strings")))
            .collect::<Result<Vec<_>>>()?;
        let cwd = PathBuf::from(spec.get("cwd").and_then(Value::as_str).ok_or_else(|| corrupt("no cwd"))?);
        let env = spec
            .get("env")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
            .unwrap_or_default();
        let llm_script = spec.get("llm_script").filter(|v| !v.is_null()).cloned();
        let stop_grace_secs = spec.get("stop_grace_secs").and_then(Value::as_u64);
        let model = spec.get("model").and_then(Value::as_str).map(str::to_owned);
        let fallback_models = spec
            .get("fallback_models")
            .and_then(Value::as_array)
            .map(|models| models.iter().filter_map(|m| m.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let sandbox = match spec.get("sandbox").filter(|v| !v.is_null()) {
            Some(value) => {
                Some(serde_json::from_value(value.clone()).map_err(|e| corrupt(&format!("sandbox: {e}")))?)
            }
            None => None,
        };
        let grant = match spec.get("grant").filter(|v| !v.is_null()) {
            Some(value) => {
                Some(serde_json::from_value(value.clone()).map_err(|e| corrupt(&format!("grant: {e}")))?)
            }
            None => None,
        };
        let input = spec.get("input").filter(|v| !v.is_null()).cloned();
        Ok(RunSpec {
            model,
            fallback_models,
            command,
            cwd,
            env,
            llm_script,
            stop_grace_secs,
            sandbox,
            grant,
            input,
        })
    }
}

pub(crate) fn command_of(spec: &Value) -> Vec<String> {
    RunSpec::from_value(spec).map(|s| s.command).unwrap_or_default()
}
