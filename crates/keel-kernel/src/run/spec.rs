//! A run's spec: what it was asked to run and how, validated from the wire
//! ([`CreateRun::validate`]), stored with the run and read back by the same type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_core::sched::Priority;
use keel_llm::ScriptedProvider;
use keel_protocol::api::CreateRunParams;
use keel_protocol::api::{BudgetParams, SandboxParams};
use keel_store::RunRecord;
use keel_types::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// What started the run by itself (`schedule:NAME`); `None`: a caller.
    pub trigger: Option<String>,
    /// How many event-trigger fires led to the run (`keel_core::event_trigger`): one more
    /// than the run that fired it, or than its parent's for a child; 0 otherwise.
    pub event_depth: u32,
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
        crate::tenants::validate_name(&tenant)?;
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
            trigger: None,
            event_depth: 0,
        })
    }

    /// The spec to store with the run.
    pub(crate) fn spec(&self) -> RunSpec {
        RunSpec {
            version: SPEC_VERSION,
            command: self.command.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            llm_script: self.llm_script.clone(),
            stop_grace_secs: self.stop_grace_secs,
            model: self.model.clone(),
            fallback_models: self.fallback_models.clone(),
            budget: self.budget.clone(),
            loop_threshold: self.loop_threshold,
            sandbox: self.sandbox.as_deref().cloned(),
            grant: self.grant.clone(),
            input: self.input.clone(),
            parent: self.parent.clone(),
            priority: self.priority.clone(),
            trigger: self.trigger.clone(),
            event_depth: self.event_depth,
        }
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
        let spec = RunSpec::of(parent).map_err(|e| e.to_string())?;
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
            priority: spec.priority,
            trigger: None,
            // A child is as deep as its parent: a loop through spawned runs is bounded too.
            event_depth: spec.event_depth,
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
pub(crate) const MAX_INPUT_BYTES: usize = 120 * 1024;

/// The version of the stored spec format this kernel writes. Specs written before the
/// field existed have none and read as version 1 (the same fields).
pub(crate) const SPEC_VERSION: u32 = 1;

fn version_one() -> u32 {
    1
}

/// A run's spec as stored with the run: written once at creation by [`CreateRun::spec`],
/// read back by [`RunSpec::of`] with the same type, so no field can be written and then
/// forgotten (or read as "absent" because it failed to parse).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunSpec {
    #[serde(default = "version_one")]
    pub(crate) version: u32,
    pub(crate) command: Vec<String>,
    pub(crate) cwd: PathBuf,
    #[serde(default)]
    pub(crate) env: BTreeMap<String, String>,
    /// The scripted provider's script, copied in at creation so a later change of the
    /// kernel's configuration never changes what a recovering run replays against.
    #[serde(default)]
    pub(crate) llm_script: Option<Value>,
    #[serde(default)]
    pub(crate) stop_grace_secs: Option<u64>,
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default)]
    pub(crate) fallback_models: Vec<String>,
    /// The limits the run was created with (top-ups are kept apart, see `budget.rs`).
    #[serde(default)]
    pub(crate) budget: Option<BudgetParams>,
    #[serde(default)]
    pub(crate) loop_threshold: Option<u32>,
    #[serde(default)]
    pub(crate) sandbox: Option<SandboxParams>,
    #[serde(default)]
    pub(crate) grant: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) input: Option<Value>,
    /// The run that started this one (`proc.spawn`, an agent called as a tool).
    #[serde(default, with = "optional_run_id")]
    pub(crate) parent: Option<RunId>,
    /// `high`, `normal` or `low`; absent is normal.
    #[serde(default)]
    pub(crate) priority: Option<String>,
    /// What started the run by itself (`schedule:NAME`); absent: a caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trigger: Option<String>,
    /// How many event-trigger fires led to the run; absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) event_depth: u32,
}

fn is_zero(depth: &u32) -> bool {
    *depth == 0
}

impl RunSpec {
    /// Reads the spec stored with a run. A spec that does not parse, or that a newer
    /// kernel wrote, is an error naming the run, never a spec with fields missing.
    pub(crate) fn of(record: &RunRecord) -> Result<RunSpec> {
        let bad = |detail: String| Error::RunSpec { run: record.id.clone(), detail };
        // Straight from the stored text: no `Value` tree on the way (see `SpecJson`).
        let mut text = serde_json::Deserializer::from_str(record.spec.as_str());
        let spec: RunSpec = serde_path_to_error::deserialize(&mut text).map_err(|e| {
            let path = e.path().to_string();
            bad(format!("at `{path}`: {}", e.into_inner()))
        })?;
        if spec.version > SPEC_VERSION {
            return Err(bad(format!(
                "it is spec version {}, newer than this kernel's {SPEC_VERSION}; run a newer keel",
                spec.version
            )));
        }
        Ok(spec)
    }

    /// The spec as stored.
    pub(crate) fn to_value(&self) -> Value {
        // A struct of strings, numbers, paths and JSON values always serializes.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The run's priority class (a stored name this kernel does not know reads as normal).
    pub(crate) fn priority(&self) -> Priority {
        self.priority.as_deref().and_then(|p| p.parse().ok()).unwrap_or_default()
    }
}

/// `Option<RunId>` as an optional string.
mod optional_run_id {
    use keel_types::RunId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(id: &Option<RunId>, out: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => out.serialize_some(id.as_str()),
            None => out.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Option<RunId>, D::Error> {
        Option::<String>::deserialize(input)?
            .map(|text| RunId::parse(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(spec: Value) -> RunRecord {
        RunRecord {
            id: RunId::generate(1),
            tenant: "default".into(),
            spec: keel_store::SpecJson::from(&spec),
            state: keel_types::RunState::Created,
            wait_reason: None,
            attempt: 0,
            pid: None,
            exit_code: None,
            output: None,
            error: None,
            usage: Default::default(),
            provider_calls: 0,
            created_at_ms: 1,
            updated_at_ms: 1,
            ended_at_ms: None,
        }
    }

    #[test]
    fn a_spec_written_before_versions_reads_as_version_1_with_every_field() {
        // The shape kernels wrote before the spec was typed: every key, nulls included.
        let stored = serde_json::json!({
            "command": ["python3", "agent.py"], "cwd": "/tmp", "env": {"A": "1"},
            "llm_script": null, "stop_grace_secs": 3, "model": null, "fallback_models": [],
            "budget": {"usd": 1.5}, "loop_threshold": null, "sandbox": null, "grant": ["echo"],
            "input": null, "parent": "run_00000000000000000000000001", "priority": "high",
        });
        let spec = RunSpec::of(&record(stored)).unwrap();
        assert_eq!(spec.version, 1);
        assert_eq!(spec.command, ["python3", "agent.py"]);
        assert_eq!(spec.budget.as_ref().and_then(|b| b.usd), Some(1.5));
        assert_eq!(spec.parent.as_ref().map(RunId::as_str), Some("run_00000000000000000000000001"));
        assert_eq!(spec.priority(), Priority::High);
        assert_eq!(RunSpec::of(&record(spec.to_value())).unwrap(), spec, "written and read by one type");
        assert_eq!(spec.event_depth, 0, "a spec from before event triggers is no fires deep");
        let deep = RunSpec { event_depth: 3, trigger: Some("event:next".into()), ..spec };
        assert_eq!(deep.to_value()["event_depth"], 3);
        assert_eq!(RunSpec::of(&record(deep.to_value())).unwrap(), deep);
    }

    #[test]
    fn a_spec_that_does_not_parse_is_an_error_naming_the_run_not_missing_fields() {
        let bad_budget = serde_json::json!({"command": ["x"], "cwd": "/", "budget": {"usd": "lots"}});
        let err = RunSpec::of(&record(bad_budget)).unwrap_err().to_string();
        assert!(
            err.contains("stored spec of run") && err.contains("`budget.usd`"),
            "names run and field: {err}"
        );
        let newer = serde_json::json!({"version": 99, "command": ["x"], "cwd": "/"});
        let err = RunSpec::of(&record(newer)).unwrap_err().to_string();
        assert!(err.contains("99") && err.contains("newer"), "{err}");
        let no_command = serde_json::json!({"cwd": "/"});
        assert!(RunSpec::of(&record(no_command)).is_err());
    }
}
