//! A run's task as it changes: the stream behind `SendStreamingMessage`,
//! `SubscribeToTask`, a blocking send's wait and push notifications. It follows the run's
//! event log and, at each event that may change the task's state, reads the run again and
//! sends what changed (the output as an artifact just before the end).

use std::collections::VecDeque;

use keel_protocol::a2a::{self as wire, StreamEvent, TaskState};
use keel_protocol::api::RunView;
use keel_types::RunId;
use serde_json::Value;

use super::rpc_error;
use crate::a2a as map;
use crate::events::EventStream;
use crate::{Kernel, Result};

/// Run events after which a task's state may have changed.
const STATE_EVENTS: [&str; 4] = ["state", "question", "answer", "stop"];

/// A run's task as it changes, for a stream, a blocking send and push notifications.
pub struct A2aStream {
    pub(super) kernel: Kernel,
    pub(super) run: RunId,
    pub(super) input: Option<Value>,
    pub(super) version: wire::Version,
    pub(super) request_id: Value,
    pub(super) events: EventStream,
    /// What the last status sent said: its state, and for a question which one.
    pub(super) last: Option<(TaskState, u64)>,
    /// End at an interrupted state reached after the start (a send); else only at an end.
    pub(super) stop_at_interrupt: bool,
    pub(super) out: VecDeque<StreamEvent>,
    pub(super) done: bool,
}

pub(super) fn key(view: &RunView, state: TaskState) -> (TaskState, u64) {
    (state, if state == TaskState::InputRequired { view.updated_at } else { 0 })
}

impl A2aStream {
    /// The next JSON-RPC response to send (an SSE `data`), or `None` after the last. A
    /// failure mid-stream is sent as an error response, which ends the stream.
    pub async fn next(&mut self) -> Option<Value> {
        match self.next_event().await {
            Ok(Some(event)) => {
                let result = wire::stream_event_json(&event, self.version);
                Some(wire::response(&self.request_id, Ok(result), self.version))
            }
            Ok(None) => None,
            Err(error) => {
                self.done = true;
                Some(wire::response(&self.request_id, Err(rpc_error(error)), self.version))
            }
        }
    }

    pub(super) async fn next_event(&mut self) -> Result<Option<StreamEvent>> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            match self.events.next().await? {
                None => {
                    self.refresh().await?;
                    self.done = true;
                }
                Some(event) if STATE_EVENTS.contains(&event.kind.as_str()) => self.refresh().await?,
                Some(_) => {}
            }
        }
    }

    /// Reads the run and queues what changed since the last status.
    async fn refresh(&mut self) -> Result<()> {
        let view = self.kernel.a2a_view(&self.run).await?;
        let task = map::task(&view, self.input.as_ref(), &[]);
        let state = task.status.state;
        let now = key(&view, state);
        if self.last == Some(now) {
            return Ok(());
        }
        self.last = Some(now);
        if state.is_terminal() {
            for artifact in task.artifacts {
                let (task_id, context_id) = (task.id.clone(), task.context_id.clone());
                self.out.push_back(StreamEvent::Artifact { task_id, context_id, artifact });
            }
        }
        self.out.push_back(StreamEvent::Status {
            task_id: task.id,
            context_id: task.context_id,
            status: task.status,
        });
        if state.is_terminal() || (self.stop_at_interrupt && state.is_interrupted()) {
            self.done = true;
        }
        Ok(())
    }

    /// Runs the stream to its end, dropping what it says (a blocking send).
    pub(super) async fn finish(&mut self) -> Result<()> {
        while self.next_event().await?.is_some() {}
        Ok(())
    }
}
