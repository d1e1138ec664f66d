//! The tools of the kernel's MCP endpoint: each one's name, description and JSON input
//! schema, and the typed arguments a call is read into after its schema accepted it.
//! `run_agent` and `exec_code` take exactly the bodies of `POST /v1/runs` and `POST
//! /v1/exec`: their schemas are the OpenAPI document's, with every `$ref` inlined.

use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::{Value, json};

/// One tool as the endpoint lists it.
pub(super) struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: Value,
}

/// The run id property every run tool takes.
fn run_id() -> Value {
    json!({
        "type": "string",
        "pattern": "^run_[0-9a-z]{26}$",
        "description": "The run's id, e.g. from run_agent or list_runs."
    })
}

/// An object schema with these properties, `required` ones, and nothing else.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

/// Every tool, in the order they are listed.
pub(super) fn specs() -> &'static [ToolSpec] {
    static SPECS: OnceLock<Vec<ToolSpec>> = OnceLock::new();
    SPECS.get_or_init(build)
}

/// The spec of the tool `name`.
pub(super) fn spec(name: &str) -> Option<&'static ToolSpec> {
    specs().iter().find(|spec| spec.name == name)
}

fn build() -> Vec<ToolSpec> {
    let doc = crate::openapi_doc();
    let body = |name: &str| inline_refs(&doc["components"]["schemas"][name], &doc["components"]["schemas"]);
    let run_only = || object(json!({ "run_id": run_id() }), &["run_id"]);
    vec![
        ToolSpec {
            name: "run_agent",
            description: "Start an agent run: `command` is the program and its arguments (e.g. [\"python3\", \
                          \"agent.py\"]), run on the kernel's host under its sandbox; `input` is the JSON the \
                          agent reads. The same body as POST /v1/runs. Answers the new run at once (state \
                          `created` or `queued`); follow it with get_run and get_run_logs.",
            schema: body("CreateRunParams"),
        },
        ToolSpec {
            name: "list_runs",
            description: "List runs newest first (default 50): filter by state (comma-separated, e.g. \
                          `running,waiting`), tenant (the operator's token only) and text in the id, tenant \
                          or command; sort and page with `sort`, `limit` and `offset`.",
            schema: object(
                json!({
                    "state": { "type": "string", "description": "Comma-separated states: created, queued, running, paused, waiting, recovering, succeeded, failed, cancelled." },
                    "limit": { "type": "integer", "minimum": 1, "maximum": 1000, "default": 50 },
                    "offset": { "type": "integer", "minimum": 0, "maximum": 1_000_000_000u64 },
                    "tenant": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$" },
                    "q": { "type": "string", "maxLength": 200, "description": "Text in the run's id, tenant or command." },
                    "sort": { "type": "string", "enum": ["newest", "oldest", "costliest", "cheapest"] }
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "get_run",
            description: "A run: its state, why it waits (an open question, an approval, a budget), its \
                          output, usage and cost; with `journal: true` also every syscall it made and the \
                          tool calls waiting for approval.",
            schema: object(
                json!({
                    "run_id": run_id(),
                    "journal": { "type": "boolean", "default": false, "description": "Include the journal and pending approvals." }
                }),
                &["run_id"],
            ),
        },
        ToolSpec {
            name: "get_run_logs",
            description: "A run's events in order: its stdout and stderr lines (`kind` `stdout`/`stderr`, the \
                          line in `data.line`), state changes and syscalls. Page with `after` (the last \
                          `seq` seen); `complete` is true once the run ended and every event was returned.",
            schema: object(
                json!({
                    "run_id": run_id(),
                    "after": { "type": "integer", "minimum": 0, "default": 0, "description": "Only events after this seq." },
                    "limit": { "type": "integer", "minimum": 1, "maximum": 10000, "default": 1000 }
                }),
                &["run_id"],
            ),
        },
        ToolSpec {
            name: "stop_run",
            description: "Stop a run: SIGTERM to its processes, SIGKILL after the grace period. The run \
                          becomes `cancelled` once they are gone.",
            schema: object(
                json!({
                    "run_id": run_id(),
                    "grace_secs": { "type": "integer", "minimum": 0, "maximum": 3600, "description": "Seconds between SIGTERM and SIGKILL; the run's own setting when absent." }
                }),
                &["run_id"],
            ),
        },
        ToolSpec {
            name: "pause_run",
            description: "Pause a running or waiting run (its processes are frozen).",
            schema: run_only(),
        },
        ToolSpec { name: "resume_run", description: "Resume a paused run.", schema: run_only() },
        ToolSpec {
            name: "answer",
            description: "Answer the run's open question (get_run shows it in `question`): `text` for a \
                          plain question, `value` (matching `question_form`) for a question with a form. \
                          Exactly one of the two.",
            schema: json!({
                "type": "object",
                "properties": {
                    "run_id": run_id(),
                    "text": { "type": "string" },
                    "value": { "description": "The structured answer to a form question." }
                },
                "required": ["run_id"],
                "additionalProperties": false,
                "anyOf": [{ "required": ["text"] }, { "required": ["value"] }]
            }),
        },
        ToolSpec {
            name: "approve",
            description: "Approve a tool call parked for approval (get_run with `journal: true` lists them \
                          in `approvals`; `call` is its journal seq). The decision is durable and audited.",
            schema: decision(),
        },
        ToolSpec {
            name: "deny",
            description: "Deny a tool call parked for approval; the agent gets a `denied` error for it. \
                          The decision is durable and audited.",
            schema: decision(),
        },
        ToolSpec {
            name: "send_message",
            description: "Put a message in the run's mailbox, as a run's `ipc.send` does; the agent \
                          receives it with `ipc.recv`.",
            schema: object(
                json!({
                    "run_id": run_id(),
                    "message": { "description": "Any JSON value." },
                    "correlation_id": { "type": "string", "minLength": 1, "maxLength": 256 },
                    "wait": { "type": "boolean", "default": false, "description": "Wait for room when the mailbox is full instead of failing." }
                }),
                &["run_id", "message"],
            ),
        },
        ToolSpec {
            name: "search_memory",
            description: "Search a namespace of the tenant's long-term memory: full-text (the default), \
                          semantic (embeddings) or hybrid.",
            schema: object(
                json!({
                    "namespace": { "type": "string", "minLength": 1, "maxLength": 256 },
                    "query": { "type": "string", "minLength": 1, "description": "Words to search for (any may match)." },
                    "limit": { "type": "integer", "minimum": 1, "maximum": 100, "default": 10 },
                    "mode": { "type": "string", "enum": ["text", "semantic", "hybrid"] }
                }),
                &["namespace", "query"],
            ),
        },
        ToolSpec {
            name: "exec_code",
            description: "Run a program (`python`, `javascript` or `cpython`) whose tool and model calls \
                          go through the governed dispatch, as a run of its own; answers its result when \
                          it ends. The same body as POST /v1/exec.",
            schema: body("ExecParams"),
        },
    ]
}

fn decision() -> Value {
    object(
        json!({
            "run_id": run_id(),
            "call": { "type": "integer", "minimum": 1, "description": "The parked call's journal seq." },
            "note": { "type": "string", "maxLength": 1000, "description": "Why; kept in the audit log." }
        }),
        &["run_id", "call"],
    )
}

/// `schema` with every `{"$ref": "#/components/schemas/X"}` replaced by X (recursively),
/// so an MCP client needs no document around it. The API's schemas are not recursive.
fn inline_refs(schema: &Value, components: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            if let Some(name) = map.get("$ref").and_then(Value::as_str)
                && let Some(name) = name.strip_prefix("#/components/schemas/")
            {
                return inline_refs(&components[name], components);
            }
            Value::Object(map.iter().map(|(k, v)| (k.clone(), inline_refs(v, components))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| inline_refs(v, components)).collect()),
        other => other.clone(),
    }
}

// The arguments of each tool, read after the schema accepted them (so serde's messages are
// the rare second line of defence).

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunArgs {
    pub run_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListArgs {
    pub state: Option<String>,
    pub limit: Option<usize>,
    pub offset: Option<u64>,
    pub tenant: Option<String>,
    pub q: Option<String>,
    pub sort: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GetArgs {
    pub run_id: String,
    #[serde(default)]
    pub journal: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsArgs {
    pub run_id: String,
    #[serde(default)]
    pub after: u64,
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StopArgs {
    pub run_id: String,
    pub grace_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AnswerArgs {
    pub run_id: String,
    pub text: Option<String>,
    /// `null` counts as sent (a form may accept it), as for `POST /v1/runs/{id}/answer`.
    #[serde(default, deserialize_with = "present")]
    pub value: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DecisionArgs {
    pub run_id: String,
    pub call: u64,
    pub note: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageArgs {
    pub run_id: String,
    pub message: Value,
    pub correlation_id: Option<String>,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SearchArgs {
    pub namespace: String,
    pub query: String,
    pub limit: Option<u64>,
    pub mode: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_a_closed_object_the_validator_can_read() {
        let names: Vec<&str> = specs().iter().map(|spec| spec.name).collect();
        assert_eq!(
            names,
            [
                "run_agent",
                "list_runs",
                "get_run",
                "get_run_logs",
                "stop_run",
                "pause_run",
                "resume_run",
                "answer",
                "approve",
                "deny",
                "send_message",
                "search_memory",
                "exec_code"
            ]
        );
        for spec in specs() {
            assert_eq!(spec.schema["type"], "object", "{}", spec.name);
            assert!(!spec.schema.to_string().contains("$ref"), "{}: refs are inlined", spec.name);
            assert!(!spec.description.is_empty());
        }
        // The API bodies keep their constraints: a run needs a command.
        let run = &spec("run_agent").unwrap().schema;
        assert!(run["required"].as_array().unwrap().contains(&json!("command")), "{run}");
        assert_eq!(run["properties"]["command"]["minItems"], 1, "{run}");
        assert!(run["properties"]["budget"].to_string().contains("llm_calls"), "budget inlined: {run}");
    }

    #[test]
    fn the_schemas_refuse_what_the_tools_cannot_take() {
        let check =
            |name: &str, args: Value| keel_tools::schema::validate(&spec(name).unwrap().schema, &args);
        assert!(check("get_run", json!({ "run_id": "run_00000000000000000000000000" })).is_ok());
        let missing = check("get_run", json!({})).unwrap_err();
        assert!(missing.contains("run_id"), "{missing}");
        let extra = check("pause_run", json!({ "run_id": "run_00000000000000000000000000", "x": 1 }));
        assert!(extra.unwrap_err().contains('x'));
        let limit = check("list_runs", json!({ "limit": 0 })).unwrap_err();
        assert!(limit.contains("limit"), "{limit}");
        let neither = check("answer", json!({ "run_id": "run_00000000000000000000000000" }));
        assert!(neither.is_err(), "answer needs text or value");
        let command = check("run_agent", json!({ "command": [] })).unwrap_err();
        assert!(command.contains("command"), "{command}");
        let mode = check("search_memory", json!({ "namespace": "n", "query": "q", "mode": "fuzzy" }));
        assert!(mode.unwrap_err().contains("mode"));
    }
}
