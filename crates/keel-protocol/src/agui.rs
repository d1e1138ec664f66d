//! AG-UI (the Agent User Interaction protocol, 1.0) wire shapes: the events a run is
//! streamed as (`GET /v1/runs/{id}/agui`, `POST /v1/agui`) and the `RunAgentInput` a
//! frontend starts a run with. Field names are AG-UI's own (camelCase) and `type` is its
//! SCREAMING_SNAKE_CASE event name; the `ag-ui-protocol` Python package's models are the
//! reference the end-to-end test validates every event against.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The AG-UI protocol version Keel speaks (`RUN_STARTED.protocolVersion`).
pub const AGUI_PROTOCOL_VERSION: &str = "1.0";

/// One AG-UI event: its kind and fields, and when it happened (Unix milliseconds) where
/// Keel knows (a stored event's time; a live delta has none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AguiEvent {
    #[serde(flatten)]
    pub body: AguiEventBody,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
}

/// The AG-UI events Keel sends. Optional fields are left out when empty, as AG-UI's
/// producers do (its consumers read an absent key, not `null`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", rename_all_fields = "camelCase")]
pub enum AguiEventBody {
    RunStarted {
        thread_id: String,
        run_id: String,
        protocol_version: String,
    },
    /// A run that ended without failing; `outcome` is `{"type": "cancelled"}` for a run
    /// an operator stopped (absent means success).
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<Value>,
    },
    RunError {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    TextMessageStart {
        message_id: String,
        role: String,
    },
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    TextMessageEnd {
        message_id: String,
    },
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
    },
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: String,
    },
    StateSnapshot {
        snapshot: Value,
    },
    /// Keel's own events (`keel.question`, `keel.answer`, `keel.approval`,
    /// `keel.decision`, `keel.ui`, `keel.emit`): `value` is the Keel event's data.
    Custom {
        name: String,
        value: Value,
    },
}

impl AguiEvent {
    pub fn new(body: AguiEventBody, timestamp: Option<u64>) -> AguiEvent {
        AguiEvent { body, timestamp }
    }

    /// The event's `type`, e.g. `TEXT_MESSAGE_CONTENT` (the SSE event name).
    pub fn kind(&self) -> &'static str {
        match self.body {
            AguiEventBody::RunStarted { .. } => "RUN_STARTED",
            AguiEventBody::RunFinished { .. } => "RUN_FINISHED",
            AguiEventBody::RunError { .. } => "RUN_ERROR",
            AguiEventBody::TextMessageStart { .. } => "TEXT_MESSAGE_START",
            AguiEventBody::TextMessageContent { .. } => "TEXT_MESSAGE_CONTENT",
            AguiEventBody::TextMessageEnd { .. } => "TEXT_MESSAGE_END",
            AguiEventBody::ToolCallStart { .. } => "TOOL_CALL_START",
            AguiEventBody::ToolCallArgs { .. } => "TOOL_CALL_ARGS",
            AguiEventBody::ToolCallEnd { .. } => "TOOL_CALL_END",
            AguiEventBody::ToolCallResult { .. } => "TOOL_CALL_RESULT",
            AguiEventBody::StateSnapshot { .. } => "STATE_SNAPSHOT",
            AguiEventBody::Custom { .. } => "CUSTOM",
        }
    }
}

/// One server-sent event of an AG-UI stream as an SSE parser reads it (for the OpenAPI
/// document): `data` is one [`AguiEvent`]'s JSON, e.g. `{"type": "RUN_STARTED", ...}`;
/// no event name is sent (a parser reports `message`), as AG-UI's own encoder does.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AguiSseEvent {
    /// One AG-UI event, as JSON text.
    pub data: String,
    /// Not sent: SSE parsers report `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// `POST /v1/agui`: AG-UI's request to run an agent. Keel starts the run that
/// `forwardedProps.keel` names (the body of `POST /v1/runs`, without `input`) and gives
/// the agent this whole object, less `forwardedProps.keel`, as its input (`KEEL_INPUT`).
/// Fields Keel does not know are kept and passed on, as AG-UI allows.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// The conversation this run belongs to (non-empty).
    #[schema(min_length = 1)]
    pub thread_id: String,
    /// The frontend's id for this run (non-empty); the stream's `RUN_STARTED` and
    /// `RUN_FINISHED` carry it, and the `X-Keel-Run-Id` header names Keel's run.
    #[schema(min_length = 1)]
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The state the run starts from (any JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub state: Option<Value>,
    /// The conversation so far: objects with a string `id` and a `role` (`developer`,
    /// `system`, `assistant`, `user`, `tool`, `activity` or `reasoning`).
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// Tools the frontend offers the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AguiTool>>,
    /// Ambient information for the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<AguiContext>>,
    /// Passed to the agent untouched, except `keel`: the run to start, as the body of
    /// `POST /v1/runs` without `input` (e.g. `{"keel": {"command": ["python3",
    /// "agent.py"]}}`). Required: without it there is nothing to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub forwarded_props: Option<Value>,
    /// Answers to the interrupts of an earlier run (passed to the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub resume: Option<Vec<Value>>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: serde_json::Map<String, Value>,
}

/// A tool a frontend offers (`RunAgentInput.tools`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AguiTool {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: serde_json::Map<String, Value>,
}

/// A named piece of ambient information (`RunAgentInput.context`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AguiContext {
    pub description: String,
    pub value: String,
}

/// The message roles AG-UI 1.0 defines.
pub const AGUI_ROLES: [&str; 7] =
    ["developer", "system", "assistant", "user", "tool", "activity", "reasoning"];

impl RunAgentInput {
    /// What serde does not check: non-empty ids, and every message an object with a
    /// string `id` and a known `role`. The error names the field and what to send.
    pub fn validate(&self) -> Result<(), String> {
        if self.thread_id.is_empty() {
            return Err("`threadId` is empty; name the conversation".into());
        }
        if self.run_id.is_empty() {
            return Err("`runId` is empty; give the run an id".into());
        }
        for (i, message) in self.messages.iter().enumerate() {
            let Some(object) = message.as_object() else {
                return Err(format!("messages[{i}] is not an object"));
            };
            if !object.get("id").is_some_and(Value::is_string) {
                return Err(format!("messages[{i}] has no string `id`"));
            }
            match object.get("role").and_then(Value::as_str) {
                Some(role) if AGUI_ROLES.contains(&role) => {}
                Some(role) => {
                    return Err(format!(
                        "messages[{i}].role {role:?} is not an AG-UI role (one of {})",
                        AGUI_ROLES.join(", ")
                    ));
                }
                None => return Err(format!("messages[{i}] has no string `role`")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_use_agui_names_and_camel_case_fields() {
        let event = AguiEvent::new(
            AguiEventBody::ToolCallStart {
                tool_call_id: "c1".into(),
                tool_call_name: "echo".into(),
                parent_message_id: None,
            },
            Some(7),
        );
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "echo", "timestamp": 7})
        );
        assert_eq!(event.kind(), "TOOL_CALL_START");
        let started = AguiEvent::new(
            AguiEventBody::RunStarted {
                thread_id: "t".into(),
                run_id: "r".into(),
                protocol_version: "1.0".into(),
            },
            None,
        );
        assert_eq!(
            serde_json::to_value(&started).unwrap(),
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r", "protocolVersion": "1.0"})
        );
    }

    #[test]
    fn run_agent_input_reads_camel_case_and_keeps_unknown_fields() {
        let input: RunAgentInput = serde_json::from_value(json!({
            "threadId": "t", "runId": "r", "messages": [{"id": "m1", "role": "user", "content": "hi"}],
            "tools": [{"name": "pick", "description": "pick one"}], "context": [],
            "forwardedProps": {"keel": {"command": ["true"]}}, "somethingNew": 1
        }))
        .unwrap();
        assert_eq!(input.validate(), Ok(()));
        assert_eq!(input.extra["somethingNew"], 1);
        let back = serde_json::to_value(&input).unwrap();
        assert_eq!(back["threadId"], "t");
        assert_eq!(back["somethingNew"], 1);
    }

    #[test]
    fn malformed_messages_are_named() {
        let input = |messages: Value| -> RunAgentInput {
            serde_json::from_value(json!({"threadId": "t", "runId": "r", "messages": messages})).unwrap()
        };
        assert!(input(json!([1])).validate().unwrap_err().contains("messages[0] is not an object"));
        assert!(input(json!([{"role": "user"}])).validate().unwrap_err().contains("no string `id`"));
        let err = input(json!([{"id": "a", "role": "robot"}])).validate().unwrap_err();
        assert!(err.contains("\"robot\" is not an AG-UI role"), "{err}");
        let empty: RunAgentInput =
            serde_json::from_value(json!({"threadId": "", "runId": "r", "messages": []})).unwrap();
        assert!(empty.validate().unwrap_err().contains("threadId"));
    }
}
