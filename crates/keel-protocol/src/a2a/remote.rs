//! Reading what a remote A2A agent answers a client: its tasks (`GetTask`'s bare task,
//! the `task` of a `SendMessage` result, each of `ListTasks`' `tasks`), in either
//! version's spelling.
//!
//! A server writes fields at their default value as absent, or (`ListTasks` in the
//! Python SDK) as `""`, `[]` or null: all are read as absent. A history message or a
//! part Keel cannot read is left out rather than failing the whole task, since a client
//! needs the task's id, state and artifacts, not every detail of its past.

use serde_json::{Map, Value};

use super::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus, Version, parse_part};

fn text<'a>(object: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a str> {
    object.get(camel).or_else(|| object.get(snake)).and_then(Value::as_str).filter(|text| !text.is_empty())
}

fn list<'a>(object: &'a Map<String, Value>, key: &str) -> &'a [Value] {
    object.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

fn parts(object: &Map<String, Value>) -> Vec<Part> {
    list(object, "parts").iter().filter_map(|part| parse_part(part, "part").ok()).collect()
}

/// A message a remote wrote: lenient where [`super::parse_message`] (a request's
/// message) is strict. No role reads as the agent's.
fn message(value: &Value) -> Option<Message> {
    let object = value.as_object()?;
    let role = match object.get("role").and_then(Value::as_str) {
        Some("ROLE_USER" | "user") => Role::User,
        _ => Role::Agent,
    };
    Some(Message {
        message_id: text(object, "messageId", "message_id").unwrap_or_default().to_owned(),
        role,
        parts: parts(object),
        context_id: text(object, "contextId", "context_id").map(str::to_owned),
        task_id: text(object, "taskId", "task_id").map(str::to_owned),
        metadata: object.get("metadata").filter(|value| !value.is_null()).cloned(),
    })
}

/// RFC 3339 in UTC (`2026-11-27T02:30:22.294455Z`) as Unix milliseconds; anything else
/// is no timestamp.
fn timestamp_ms(text: &str) -> Option<u64> {
    let time = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    time.duration_since(std::time::UNIX_EPOCH).ok().map(|since| since.as_millis() as u64)
}

/// A task a remote agent answered. `version` is the one the call spoke: a 0.3 task may
/// carry `"kind": "task"` and nothing else. An error says what is missing.
pub fn parse_task(value: &Value, version: Version) -> Result<Task, String> {
    let Some(object) = value.as_object() else {
        return Err(format!("a task is a JSON object, not {value}"));
    };
    if version == Version::V03
        && let Some(kind) = object.get("kind").and_then(Value::as_str)
        && kind != "task"
    {
        return Err(format!("expected a task, got {kind:?}"));
    }
    let Some(id) = text(object, "id", "id") else {
        return Err("the task has no `id`".into());
    };
    let status = object.get("status").and_then(Value::as_object);
    let state = status.and_then(|status| status.get("state"));
    let state = match state {
        Some(Value::String(name)) => TaskState::parse(name)
            .ok_or_else(|| format!("task {id}: {name:?} is not a task state A2A defines"))?,
        Some(Value::Number(number)) => {
            // ProtoJSON also accepts the enum's number: TASK_STATE_SUBMITTED is 1.
            let names = [
                TaskState::Submitted,
                TaskState::Working,
                TaskState::Completed,
                TaskState::Failed,
                TaskState::Canceled,
                TaskState::InputRequired,
                TaskState::Rejected,
                TaskState::AuthRequired,
            ];
            number
                .as_u64()
                .and_then(|n| n.checked_sub(1))
                .and_then(|n| names.get(n as usize).copied())
                .ok_or_else(|| format!("task {id}: state {number} is not a task state A2A defines"))?
        }
        _ => return Err(format!("task {id} has no `status.state`")),
    };
    let artifacts = list(object, "artifacts")
        .iter()
        .filter_map(Value::as_object)
        .map(|artifact| Artifact {
            artifact_id: text(artifact, "artifactId", "artifact_id").unwrap_or_default().to_owned(),
            name: text(artifact, "name", "name").map(str::to_owned),
            parts: parts(artifact),
        })
        .collect();
    Ok(Task {
        id: id.to_owned(),
        context_id: text(object, "contextId", "context_id").unwrap_or_default().to_owned(),
        status: TaskStatus {
            state,
            message: status.and_then(|status| status.get("message")).and_then(message),
            timestamp_ms: status
                .and_then(|status| status.get("timestamp"))
                .and_then(Value::as_str)
                .and_then(timestamp_ms),
        },
        artifacts,
        history: list(object, "history").iter().filter_map(message).collect(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{send_result, task_json};
    use super::*;

    fn task() -> Task {
        Task {
            id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus {
                state: TaskState::InputRequired,
                message: Some(Message {
                    message_id: "q".into(),
                    role: Role::Agent,
                    parts: vec![Part::Text("which year?".into())],
                    context_id: Some("c".into()),
                    task_id: Some("t".into()),
                    metadata: None,
                }),
                timestamp_ms: Some(1_700_000_000_123),
            },
            artifacts: vec![Artifact {
                artifact_id: "a".into(),
                name: Some("answer".into()),
                parts: vec![Part::Text("42".into()), Part::Data(json!({"n": 42}))],
            }],
            history: vec![Message {
                message_id: "m".into(),
                role: Role::User,
                parts: vec![Part::Text("hi".into())],
                context_id: Some("c".into()),
                task_id: Some("t".into()),
                metadata: Some(json!({"skill": "s"})),
            }],
        }
    }

    #[test]
    fn a_task_round_trips_in_both_versions() {
        for version in [Version::V1, Version::V03] {
            let written = task_json(&task(), version, None);
            assert_eq!(parse_task(&written, version).unwrap(), task(), "{version:?}: {written}");
        }
        let wrapped = send_result(&task(), Version::V1, None);
        assert_eq!(parse_task(&wrapped["task"], Version::V1).unwrap(), task());
    }

    #[test]
    fn what_the_python_sdk_writes_is_read() {
        // A `ListTasks` entry as a2a-sdk 1.3.0 prints it: defaults written out.
        let listed = json!({
            "id": "7f11", "contextId": "ba92", "artifacts": [], "metadata": null,
            "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-11-27T02:30:22.294455Z", "message": null},
            "history": [{"messageId": "84e3", "contextId": "ba92", "taskId": "7f11", "role": "ROLE_USER",
                "parts": [{"text": "hello stream", "filename": "", "mediaType": ""}],
                "extensions": [], "referenceTaskIds": []}]
        });
        let task = parse_task(&listed, Version::V1).unwrap();
        assert_eq!(task.status.state, TaskState::Working);
        assert_eq!(task.status.message, None);
        assert!(task.status.timestamp_ms.is_some());
        assert_eq!(task.history[0].message_id, "84e3");
        assert_eq!(task.history[0].text(), "hello stream");
        // The enum's number, and a part Keel does not read, left out.
        let odd = json!({"id": "t", "status": {"state": 3}, "artifacts": [{"parts": [{"video": 1}, {"text": "x"}]}]});
        let task = parse_task(&odd, Version::V1).unwrap();
        assert_eq!(task.status.state, TaskState::Completed);
        assert_eq!(task.artifacts[0].parts, [Part::Text("x".into())]);
        assert_eq!(task.context_id, "");
    }

    #[test]
    fn what_is_not_a_task_says_why() {
        let cases = [
            (json!([1]), Version::V1, "JSON object"),
            (json!({"status": {"state": "completed"}}), Version::V1, "no `id`"),
            (json!({"id": "t"}), Version::V1, "no `status.state`"),
            (json!({"id": "t", "status": {"state": "done"}}), Version::V1, "not a task state"),
            (json!({"id": "t", "status": {"state": 99}}), Version::V1, "not a task state"),
            (json!({"kind": "message", "id": "t"}), Version::V03, "expected a task"),
        ];
        for (value, version, says) in cases {
            let error = parse_task(&value, version).unwrap_err();
            assert!(error.contains(says), "{value}: {error}");
        }
    }
}
