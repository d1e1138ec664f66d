//! A run as an A2A task: pure functions from what the kernel knows of a run (its view,
//! its input, its `human.ask` exchanges) to `keel_protocol::a2a`'s model. The IO (the
//! store, streams, push notifications) is `kernel/a2a.rs`.
//!
//! A task is one run: the task id is the run id, the task's state follows the run's
//! (`waiting` on a human is `input-required`, and the question is the status message),
//! the run's output is the task's one artifact, and its history is the message that
//! started it followed by each question the agent asked and the answer it got.

use keel_protocol::a2a::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};
use keel_protocol::api::RunView;
use serde_json::{Value, json};

/// The state of the task a run in `state` (waiting for `wait_reason`) is.
pub(crate) fn task_state(state: &str, wait_reason: Option<&str>) -> TaskState {
    match state {
        "created" | "queued" => TaskState::Submitted,
        "waiting" if wait_reason == Some("human") => TaskState::InputRequired,
        "succeeded" => TaskState::Completed,
        "failed" => TaskState::Failed,
        "cancelled" => TaskState::Canceled,
        // running, paused, recovering, and waiting for anything but a person.
        _ => TaskState::Working,
    }
}

/// What `trigger` a run started by agent `name`'s A2A endpoint carries.
pub(crate) fn trigger_of(agent: &str) -> String {
    format!("a2a:{agent}")
}

/// The run's input for a new task: the message as it came (1.0's spelling), its text and
/// first data part for convenience, and the ids the task answers to.
pub(crate) fn task_input(agent: &str, task_id: &str, context_id: &str, message: &Message) -> Value {
    let mut message = message.clone();
    message.task_id = Some(task_id.to_owned());
    message.context_id = Some(context_id.to_owned());
    let skill = message.metadata.as_ref().and_then(|metadata| metadata.get("skill")).cloned();
    json!({
        "trigger": "a2a",
        "agent": agent,
        "task_id": task_id,
        "context_id": context_id,
        "text": message.text(),
        "data": message.data(),
        "skill": skill,
        "message": keel_protocol::a2a::message_to_input(&message),
    })
}

/// A task's context id, from its run's input (the run id when the input names none).
pub(crate) fn context_of(task_id: &str, input: Option<&Value>) -> String {
    input
        .and_then(|input| input.get("context_id"))
        .and_then(Value::as_str)
        .map_or_else(|| task_id.to_owned(), str::to_owned)
}

/// One `human.ask` that was answered: the question's journal seq, its text and the answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exchange {
    pub(crate) seq: u64,
    pub(crate) question: String,
    pub(crate) answer: String,
}

/// An exchange from a journal entry, if it is an answered `human.ask`.
pub(crate) fn exchange(method: &str, seq: u64, params: &Value, result: Option<&Value>) -> Option<Exchange> {
    if method != "human.ask" {
        return None;
    }
    let answer = result?.get("answer")?;
    let answer = answer.as_str().map_or_else(|| answer.to_string(), str::to_owned);
    let question = params.get("question").and_then(Value::as_str).unwrap_or_default().to_owned();
    Some(Exchange { seq, question, answer })
}

/// The parts an output becomes: text stays text, anything else is data.
pub(crate) fn output_parts(output: &Value) -> Vec<Part> {
    match output {
        Value::String(text) => vec![Part::Text(text.clone())],
        other => vec![Part::Data(other.clone())],
    }
}

fn agent_message(id: String, task: &str, context: &str, text: String) -> Message {
    Message {
        message_id: id,
        role: Role::Agent,
        parts: vec![Part::Text(text)],
        context_id: Some(context.to_owned()),
        task_id: Some(task.to_owned()),
        metadata: None,
    }
}

/// The task `run` is, with its history.
pub(crate) fn task(run: &RunView, input: Option<&Value>, exchanges: &[Exchange]) -> Task {
    let id = run.run_id.clone();
    let context = context_of(&id, input);
    let state = task_state(&run.state, run.wait_reason.as_deref());
    let message = match state {
        TaskState::InputRequired => run.question.clone().map(|question| {
            agent_message(format!("{id}-question-{}", run.updated_at), &id, &context, question)
        }),
        TaskState::Failed => {
            let error = run.error.clone().unwrap_or_else(|| "the agent failed".to_owned());
            Some(agent_message(format!("{id}-error"), &id, &context, error))
        }
        _ => None,
    };
    let artifacts = run
        .output
        .as_ref()
        .filter(|output| !output.is_null())
        .map(|output| Artifact {
            artifact_id: format!("{id}-output"),
            name: Some("output".to_owned()),
            parts: output_parts(output),
        })
        .into_iter()
        .collect();
    let mut history = Vec::new();
    if let Some(first) =
        input.and_then(|input| input.get("message")).and_then(keel_protocol::a2a::message_from_input)
    {
        history.push(first);
    }
    for exchange in exchanges {
        let asked = format!("{id}-question-{}", exchange.seq);
        history.push(agent_message(asked, &id, &context, exchange.question.clone()));
        let mut answer =
            agent_message(format!("{id}-answer-{}", exchange.seq), &id, &context, exchange.answer.clone());
        answer.role = Role::User;
        history.push(answer);
    }
    Task {
        id,
        context_id: context,
        status: TaskStatus { state, message, timestamp_ms: Some(run.ended_at.unwrap_or(run.updated_at)) },
        artifacts,
        history,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: &str, wait: Option<&str>) -> RunView {
        serde_json::from_value(json!({
            "run_id": "run_1", "tenant": "default", "state": state, "wait_reason": wait,
            "command": ["x"], "created_at": 1, "updated_at": 2, "attempt": 1,
            "usage": {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0, "tool_calls": 0, "cost_usd": 0.0},
            "provider_calls": 0, "question": wait.map(|_| "Which city?"), "swapped": false
        }))
        .expect("a run view")
    }

    #[test]
    fn every_run_state_maps_to_a_task_state() {
        let cases = [
            ("created", None, TaskState::Submitted),
            ("queued", None, TaskState::Submitted),
            ("running", None, TaskState::Working),
            ("paused", None, TaskState::Working),
            ("recovering", None, TaskState::Working),
            ("waiting", Some("human"), TaskState::InputRequired),
            ("waiting", Some("approval"), TaskState::Working),
            ("waiting", Some("message"), TaskState::Working),
            ("succeeded", None, TaskState::Completed),
            ("failed", None, TaskState::Failed),
            ("cancelled", None, TaskState::Canceled),
        ];
        for (state, wait, expected) in cases {
            assert_eq!(task_state(state, wait), expected, "{state} {wait:?}");
        }
    }

    #[test]
    fn a_waiting_run_asks_its_question_and_history_keeps_the_exchanges() {
        let first = Message {
            message_id: "m1".into(),
            role: Role::User,
            parts: vec![Part::Text("weather?".into())],
            context_id: None,
            task_id: None,
            metadata: Some(json!({"skill": "forecast"})),
        };
        let input = task_input("echo", "run_1", "ctx", &first);
        assert_eq!(input["text"], "weather?");
        assert_eq!(input["skill"], "forecast");
        let exchanges = [Exchange { seq: 3, question: "Country?".into(), answer: "France".into() }];
        let task = task(&view("waiting", Some("human")), Some(&input), &exchanges);
        assert_eq!(task.context_id, "ctx");
        assert_eq!(task.status.state, TaskState::InputRequired);
        assert_eq!(task.status.message.as_ref().unwrap().text(), "Which city?");
        let texts: Vec<String> = task.history.iter().map(Message::text).collect();
        assert_eq!(texts, ["weather?", "Country?", "France"]);
        assert_eq!(task.history[0].task_id.as_deref(), Some("run_1"));
        assert_eq!(task.history[2].role, Role::User);
    }

    #[test]
    fn the_output_is_the_artifact_and_a_failure_says_why() {
        let mut done = view("succeeded", None);
        done.output = Some(json!("echo: hi"));
        let task = task(&done, None, &[]);
        assert_eq!(task.context_id, "run_1", "no input: the run id is the context");
        assert_eq!(task.artifacts[0].parts, [Part::Text("echo: hi".into())]);
        done.output = Some(json!({"n": 1}));
        assert_eq!(super::task(&done, None, &[]).artifacts[0].parts, [Part::Data(json!({"n": 1}))]);
        let mut failed = view("failed", None);
        failed.error = Some("exit 3".into());
        assert_eq!(super::task(&failed, None, &[]).status.message.unwrap().text(), "exit 3");
        assert_eq!(
            exchange("human.ask", 4, &json!({"question": "q"}), Some(&json!({"answer": "a"})))
                .unwrap()
                .answer,
            "a"
        );
        assert!(
            exchange("human.ask", 4, &json!({}), None).is_none(),
            "an unanswered question is no exchange"
        );
        assert!(exchange("llm.chat", 4, &json!({}), Some(&json!({}))).is_none());
    }
}
