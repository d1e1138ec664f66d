//! The A2A server: agents declared with `a2a = true` (`crate::agents`) answer A2A's
//! JSON-RPC methods (1.0, and 0.3's names) at `/a2a/{name}`, each task being one run
//! (`crate::a2a` maps a run to a task). The HTTP side is keel-server's `a2a.rs`.
//!
//! - A new message starts a run whose input is the message. The message id is recorded
//!   first, as a fire of the agent (kind `a2a`, keyed by the tenant, the agent and the
//!   message id) with the id of the run it starts, so a client that sends the same
//!   message again (a retry after a timeout or a dropped connection) gets the same task
//!   instead of a second run.
//! - A message naming a task answers the run's open `human.ask` when it waits on one
//!   (`input-required`), and otherwise goes to the run's mailbox.
//! - Sends block until the task is interrupted (ended, or waiting for input), as A2A
//!   asks; streams and push notifications follow the run's event log.

use std::collections::VecDeque;

use keel_protocol::a2a::{
    self as wire, Method, PushConfig, Request, Role, RpcError, StreamEvent, Task, TaskState,
};
use keel_protocol::api::RunView;
use keel_store::{FireRecord, RunRecord};
use keel_types::RunId;
use serde_json::{Map, Value, json};

use crate::a2a::{self as map, Exchange};
use crate::agents::AgentDecl;
use crate::events::EventStream;
use crate::run::RunSpec;
use crate::{Answer, Command, Error, Kernel, Principal, Result, now_ms};

/// The store kind of an A2A message's record (see the module doc).
const KIND: &str = "a2a";

/// The most tasks of an agent `ListTasks` looks through (the newest).
const LIST_WINDOW: usize = 1000;

mod push;
mod stream;

pub use stream::A2aStream;
use stream::key;

/// What a JSON-RPC call answers: one JSON-RPC response, or a stream of them.
pub enum A2aAnswer {
    Json(Value),
    Stream(Box<A2aStream>),
}

/// What a method produced, before it is wrapped in a JSON-RPC response.
enum Reply {
    Value(Value),
    Stream(Box<A2aStream>),
}

/// A kernel error as A2A tells it.
pub(super) fn rpc_error(error: Error) -> RpcError {
    match error {
        Error::RunNotFound(run) => RpcError::new(RpcError::TASK_NOT_FOUND, format!("no task {run}")),
        Error::NotFound(message) => RpcError::new(RpcError::TASK_NOT_FOUND, message),
        Error::InvalidRequest(message) => RpcError::invalid_params(message),
        Error::Conflict(message) => RpcError::new(RpcError::UNSUPPORTED_OPERATION, message),
        other => RpcError::new(RpcError::INTERNAL, other.to_string()),
    }
}

fn task_not_found(id: &str) -> RpcError {
    RpcError::new(RpcError::TASK_NOT_FOUND, format!("no task {id}"))
}

fn object<'a>(
    params: &'a Map<String, Value>,
    key: &str,
) -> std::result::Result<Option<&'a Map<String, Value>>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object)),
        Some(_) => Err(RpcError::invalid_params(format!("`params.{key}` must be an object"))),
    }
}

impl Kernel {
    /// The names of the agents published over A2A, in keel.toml's order.
    pub fn a2a_agents(&self) -> Vec<String> {
        self.inner.agents.a2a().map(|agent| agent.name.clone()).collect()
    }

    /// The agent card of `agent` (`None`: the first one published), served from
    /// `base_url` (`http://host:port`, no trailing slash); `None` when there is no such agent.
    pub fn a2a_card(&self, agent: Option<&str>, base_url: &str) -> Option<Value> {
        let agent = match agent {
            Some(name) => self.inner.agents.a2a_agent(name)?,
            None => self.inner.agents.a2a().next()?,
        };
        Some(card(agent, base_url))
    }

    /// One JSON-RPC call to `agent` by `principal`. `Err` only when no such agent is
    /// published; everything else is answered in JSON-RPC's own shapes.
    pub async fn a2a(&self, principal: &Principal, agent: &str, body: &[u8]) -> Result<A2aAnswer> {
        let Some(decl) = self.inner.agents.a2a_agent(agent).cloned() else {
            return Err(Error::NotFound(format!(
                "no agent {agent} is published over A2A (keel.toml's [[agents]] with a2a = true)"
            )));
        };
        let request = match wire::parse_request(body) {
            Ok(request) => request,
            Err((id, error, version)) => {
                return Ok(A2aAnswer::Json(wire::response(&id, Err(error), version)));
            }
        };
        let (id, version) = (request.id.clone(), request.version);
        Ok(match self.a2a_method(principal, &decl, request).await {
            Ok(Reply::Value(result)) => A2aAnswer::Json(wire::response(&id, Ok(result), version)),
            Ok(Reply::Stream(stream)) => A2aAnswer::Stream(stream),
            Err(error) => A2aAnswer::Json(wire::response(&id, Err(error), version)),
        })
    }

    async fn a2a_method(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        request: Request,
    ) -> std::result::Result<Reply, RpcError> {
        let params = &request.params;
        let version = request.version;
        match request.method {
            Method::SendMessage | Method::SendStreamingMessage => {
                self.a2a_send(principal, agent, request).await
            }
            Method::GetTask => {
                let history = wire::count_field(params, "historyLength", "history_length", "params")?;
                let (_, record) = self.a2a_named(principal, agent, params).await?;
                let task = self.a2a_task(&record).await.map_err(rpc_error)?;
                Ok(Reply::Value(wire::task_json(&task, version, history.map(|n| n as usize))))
            }
            Method::ListTasks => self.a2a_list(principal, agent, params, version).await.map(Reply::Value),
            Method::CancelTask => {
                let not_cancelable =
                    (RpcError::TASK_NOT_CANCELABLE, "only a task that has not can be canceled");
                let record = self.a2a_live(principal, agent, params, not_cancelable).await?;
                self.execute(Command::Stop { run: record.id.clone(), grace: None })
                    .await
                    .map_err(rpc_error)?;
                let mut stream = self.a2a_stream(&record, version, Value::Null, None, false);
                stream.finish().await.map_err(rpc_error)?;
                let ended = self.get(&record.id).await.map_err(rpc_error)?;
                let task = self.a2a_task(&ended).await.map_err(rpc_error)?;
                Ok(Reply::Value(wire::task_json(&task, version, None)))
            }
            Method::SubscribeToTask => {
                let nothing_to_follow =
                    (RpcError::UNSUPPORTED_OPERATION, "there is nothing to follow; GetTask reads it");
                let record = self.a2a_live(principal, agent, params, nothing_to_follow).await?;
                let (task, now) = self.a2a_snapshot(&record).await.map_err(rpc_error)?;
                let mut stream = self.a2a_stream(&record, version, request.id.clone(), None, true);
                stream.last = Some(now);
                stream.out.push_back(StreamEvent::Task(task));
                Ok(Reply::Stream(Box::new(stream)))
            }
            Method::CreatePushConfig => {
                let task_id = wire::required_string(params, "taskId", "task_id", "params")?;
                let record = self.a2a_run(principal, agent, &task_id).await?;
                let config = wire::parse_push_config(params, Some(&task_id), &task_id)?;
                self.a2a_push_add(&record, config.clone()).await.map_err(rpc_error)?;
                Ok(Reply::Value(wire::push_config_json(&config, version)))
            }
            Method::GetPushConfig | Method::DeletePushConfig | Method::ListPushConfigs => {
                // 1.0 names the task `taskId` and the config `id`; 0.3 the task `id` and
                // the config `pushNotificationConfigId`.
                let (task_id, config_id) = match version {
                    wire::Version::V1 => (
                        wire::required_string(params, "taskId", "task_id", "params")?,
                        wire::string_field(params, "id", "id", "params")?,
                    ),
                    wire::Version::V03 => (
                        wire::required_string(params, "id", "id", "params")?,
                        wire::string_field(
                            params,
                            "pushNotificationConfigId",
                            "push_notification_config_id",
                            "params",
                        )?,
                    ),
                };
                let record = self.a2a_run(principal, agent, &task_id).await?;
                let configs = self.a2a_push_configs(&record.id).await.map_err(rpc_error)?;
                match request.method {
                    Method::ListPushConfigs => {
                        let listed: Vec<Value> =
                            configs.iter().map(|c| wire::push_config_json(c, version)).collect();
                        Ok(Reply::Value(match version {
                            wire::Version::V1 => json!({ "configs": listed }),
                            wire::Version::V03 => Value::Array(listed),
                        }))
                    }
                    method => {
                        let config_id = config_id.unwrap_or_else(|| task_id.clone());
                        let Some(config) = configs.iter().find(|c| c.id == config_id) else {
                            return Err(RpcError::new(
                                RpcError::TASK_NOT_FOUND,
                                format!("task {task_id} has no push notification config {config_id}"),
                            ));
                        };
                        if method == Method::GetPushConfig {
                            return Ok(Reply::Value(wire::push_config_json(config, version)));
                        }
                        let kept: Vec<PushConfig> =
                            configs.iter().filter(|c| c.id != config_id).cloned().collect();
                        self.a2a_push_store(&record.id, &kept).await.map_err(rpc_error)?;
                        Ok(Reply::Value(Value::Null))
                    }
                }
            }
            Method::GetExtendedCard => Err(RpcError::new(
                RpcError::UNSUPPORTED_OPERATION,
                "Keel's agents have no extended card: the public card is the whole card",
            )),
        }
    }

    /// `SendMessage` / `SendStreamingMessage` (and 0.3's `message/send`, `message/stream`).
    async fn a2a_send(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        request: Request,
    ) -> std::result::Result<Reply, RpcError> {
        let params = &request.params;
        let version = request.version;
        let streaming = request.method == Method::SendStreamingMessage;
        let message = wire::parse_message(params.get("message"))?;
        if message.role != Role::User {
            return Err(RpcError::invalid_params(
                "`message.role` must be the user's (ROLE_USER): the agent is Keel's",
            ));
        }
        let configuration = object(params, "configuration")?.cloned().unwrap_or_default();
        let history = wire::count_field(&configuration, "historyLength", "history_length", "configuration")?
            .map(|n| n as usize);
        // 1.0 blocks unless `returnImmediately`; 0.3 blocks only with `blocking: true`.
        let immediately = match version {
            wire::Version::V1 => {
                wire::bool_field(&configuration, "returnImmediately", "return_immediately", "configuration")?
            }
            wire::Version::V03 => !wire::bool_field(&configuration, "blocking", "blocking", "configuration")?,
        };
        let inline_push = ["taskPushNotificationConfig", "pushNotificationConfig"]
            .into_iter()
            .find_map(|name| configuration.get(name).filter(|value| !value.is_null()));
        let (record, baseline, new) = match message.task_id.clone() {
            None => (self.a2a_start(principal, agent, &message).await?, None, true),
            Some(task_id) => {
                let (record, baseline) = self.a2a_continue(principal, agent, &task_id, &message).await?;
                (record, Some(baseline), false)
            }
        };
        if let Some(push) = inline_push {
            let Value::Object(push) = push else {
                return Err(RpcError::invalid_params(
                    "`configuration.taskPushNotificationConfig` must be an object",
                ));
            };
            let task = record.id.to_string();
            let config = wire::parse_push_config(push, Some(&task), &task)?;
            self.a2a_push_add(&record, config).await.map_err(rpc_error)?;
        }
        let mut stream = self.a2a_stream(&record, version, request.id.clone(), baseline, true);
        if streaming {
            if new {
                // A new task's stream opens with the task, as it is now.
                let (task, now) = self.a2a_snapshot(&record).await.map_err(rpc_error)?;
                stream.last = Some(now);
                stream.done = task.status.state.is_interrupted();
                stream.out.push_back(StreamEvent::Task(task));
            }
            return Ok(Reply::Stream(Box::new(stream)));
        }
        if !immediately {
            stream.finish().await.map_err(rpc_error)?;
        }
        let now = self.get(&record.id).await.map_err(rpc_error)?;
        let task = self.a2a_task(&now).await.map_err(rpc_error)?;
        Ok(Reply::Value(wire::send_result(&task, version, history)))
    }

    /// Starts the run of a new task, once per message id (see the module doc).
    async fn a2a_start(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        message: &wire::Message,
    ) -> std::result::Result<RunRecord, RpcError> {
        let tenant = principal.run_tenant(None).map_err(rpc_error)?;
        let now = now_ms();
        let fire = FireRecord {
            kind: KIND.into(),
            trigger: format!("{tenant}/{}", agent.name),
            occasion: message.message_id.clone(),
            tenant: tenant.clone(),
            at_ms: now,
            run_id: Some(RunId::generate(now)),
            outcome: "fired".into(),
            detail: None,
            fired_at_ms: now,
        };
        let (fire, _) = self.store().trigger_fire(fire).await.map_err(|e| rpc_error(e.into()))?;
        let Some(run) = fire.run_id else {
            return Err(RpcError::new(RpcError::INTERNAL, "the message was recorded without its task"));
        };
        if let Ok(record) = self.get(&run).await {
            // The same message again: its task, not a second one.
            return Ok(record);
        }
        let context = message.context_id.clone().unwrap_or_else(|| format!("ctx_{run}"));
        let mut params = agent.run.clone();
        params.tenant = None;
        params.input = Some(map::task_input(&agent.name, run.as_str(), &context, message));
        match self
            .create_within_quota_as(principal, run.clone(), params, Some(map::trigger_of(&agent.name)))
            .await
        {
            Ok(record) => Ok(record),
            Err(Error::Store(keel_store::Error::RunExists(_))) => self.get(&run).await.map_err(rpc_error),
            Err(error) => Err(rpc_error(error)),
        }
    }

    /// Hands a message to a task's run: the answer to its open question, or a message for
    /// its mailbox. Returns the run and what its task said before.
    async fn a2a_continue(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        task_id: &str,
        message: &wire::Message,
    ) -> std::result::Result<(RunRecord, (TaskState, u64)), RpcError> {
        let record = self.a2a_run(principal, agent, task_id).await?;
        let spec = RunSpec::of(&record).map_err(rpc_error)?;
        let context = map::context_of(task_id, spec.input.as_ref());
        if let Some(given) = &message.context_id
            && *given != context
        {
            return Err(RpcError::invalid_params(format!(
                "context {given} does not match context {context} of task {task_id}"
            )));
        }
        if record.state.is_terminal() {
            return Err(RpcError::new(
                RpcError::UNSUPPORTED_OPERATION,
                format!(
                    "task {task_id} has ended ({}); send the message without a taskId to start a new task",
                    record.state
                ),
            ));
        }
        let view = self.view(&record).await.map_err(rpc_error)?;
        let state = map::task_state(&view.state, view.wait_reason.as_deref());
        let baseline = key(&view, state);
        if state == TaskState::InputRequired {
            let answer = match (view.question_form.is_some(), message.data()) {
                (true, Some(data)) => Answer::Value(data.clone()),
                _ => Answer::Text(message.text()),
            };
            self.execute(Command::Answer { run: record.id.clone(), answer }).await.map_err(rpc_error)?;
        } else {
            let send = json!({
                "to": record.id.as_str(),
                "message": { "a2a": wire::message_to_input(message), "text": message.text() },
            });
            self.send_message(&record.tenant, send)
                .await
                .map_err(|error| RpcError::new(RpcError::INTERNAL, error.message))?;
        }
        Ok((record, baseline))
    }

    /// `ListTasks`: the agent's tasks of the principal's tenant, newest first.
    async fn a2a_list(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        params: &Map<String, Value>,
        version: wire::Version,
    ) -> std::result::Result<Value, RpcError> {
        let context = wire::string_field(params, "contextId", "context_id", "params")?;
        let status = match wire::string_field(params, "status", "status", "params")? {
            None => None,
            Some(text) if text.is_empty() || text == "TASK_STATE_UNSPECIFIED" => None,
            Some(text) => Some(TaskState::parse(&text).ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "`status` {text:?} is not a task state (e.g. TASK_STATE_COMPLETED)"
                ))
            })?),
        };
        let page_size = wire::count_field(params, "pageSize", "page_size", "params")?.unwrap_or(50);
        if !(1..=100).contains(&page_size) {
            return Err(RpcError::invalid_params("`pageSize` must be 1 to 100"));
        }
        let offset = match wire::string_field(params, "pageToken", "page_token", "params")? {
            None => 0,
            Some(token) if token.is_empty() => 0,
            Some(token) => token.parse::<usize>().map_err(|_| {
                RpcError::invalid_params(
                    "`pageToken` is not one this server gave: pass the last answer's nextPageToken",
                )
            })?,
        };
        let history =
            wire::count_field(params, "historyLength", "history_length", "params")?.map(|n| n as usize);
        let artifacts = wire::bool_field(params, "includeArtifacts", "include_artifacts", "params")?;
        let tenant = principal.run_tenant(None).map_err(rpc_error)?;
        let fires = self
            .store()
            .trigger_fires(KIND, &format!("{tenant}/{}", agent.name), LIST_WINDOW)
            .await
            .map_err(|e| rpc_error(e.into()))?;
        let mut matching = Vec::new();
        for fire in fires {
            let Some(run) = fire.run_id else { continue };
            let Ok(record) = self.get(&run).await else { continue };
            let input = RunSpec::of(&record).ok().and_then(|spec| spec.input);
            if context
                .as_ref()
                .is_some_and(|context| *context != map::context_of(run.as_str(), input.as_ref()))
            {
                continue;
            }
            if let Some(wanted) = status {
                let wait = record.wait_reason.map(|reason| reason.as_str());
                if map::task_state(record.state.as_str(), wait) != wanted {
                    continue;
                }
            }
            matching.push(record);
        }
        let total = matching.len();
        let page_size = page_size as usize;
        let mut tasks = Vec::new();
        for record in matching.iter().skip(offset).take(page_size) {
            let mut task = self.a2a_task(record).await.map_err(rpc_error)?;
            if !artifacts {
                task.artifacts.clear();
            }
            tasks.push(wire::task_json(&task, version, history));
        }
        let next = if offset + page_size < total { (offset + page_size).to_string() } else { String::new() };
        Ok(json!({ "tasks": tasks, "nextPageToken": next, "pageSize": page_size, "totalSize": total }))
    }

    /// The task `params.id` names, and its run.
    async fn a2a_named(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        params: &Map<String, Value>,
    ) -> std::result::Result<(String, RunRecord), RpcError> {
        let id = wire::required_string(params, "id", "id", "params")?;
        let record = self.a2a_run(principal, agent, &id).await?;
        Ok((id, record))
    }

    /// The run of the task `params.id` names, unless the task has ended: then the error
    /// `refusal` gives (its code, and what to say after the task's state).
    async fn a2a_live(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        params: &Map<String, Value>,
        (code, why): (i64, &str),
    ) -> std::result::Result<RunRecord, RpcError> {
        let (id, record) = self.a2a_named(principal, agent, params).await?;
        if record.state.is_terminal() {
            return Err(RpcError::new(code, format!("task {id} has ended ({}): {why}", record.state)));
        }
        Ok(record)
    }

    /// The run of task `id`, if it is one of `agent`'s that `principal` may see.
    async fn a2a_run(
        &self,
        principal: &Principal,
        agent: &AgentDecl,
        id: &str,
    ) -> std::result::Result<RunRecord, RpcError> {
        let run = RunId::parse(id).map_err(|_| task_not_found(id))?;
        let record = self.run_for(principal, &run).await.map_err(|_| task_not_found(id))?;
        let spec = RunSpec::of(&record).map_err(rpc_error)?;
        if spec.trigger.as_deref() != Some(map::trigger_of(&agent.name).as_str()) {
            return Err(task_not_found(id));
        }
        Ok(record)
    }

    async fn a2a_view(&self, run: &RunId) -> Result<RunView> {
        let record = self.get(run).await?;
        self.view(&record).await
    }

    /// The whole task a run is, with its history (the journal's answered questions).
    async fn a2a_task(&self, record: &RunRecord) -> Result<Task> {
        Ok(self.a2a_snapshot(record).await?.0)
    }

    /// The task a run is, and the key a stream compares its later states with, from one
    /// view of the run.
    async fn a2a_snapshot(&self, record: &RunRecord) -> Result<(Task, (TaskState, u64))> {
        let view = self.view(record).await?;
        let input = RunSpec::of(record).ok().and_then(|spec| spec.input);
        let exchanges: Vec<Exchange> = self
            .store()
            .journal(&record.id, 0)
            .await?
            .iter()
            .filter_map(|entry| map::exchange(&entry.method, entry.seq, &entry.params, entry.result.as_ref()))
            .collect();
        let task = map::task(&view, input.as_ref(), &exchanges);
        let now = key(&view, task.status.state);
        Ok((task, now))
    }

    fn a2a_stream(
        &self,
        record: &RunRecord,
        version: wire::Version,
        request_id: Value,
        baseline: Option<(TaskState, u64)>,
        stop_at_interrupt: bool,
    ) -> A2aStream {
        A2aStream {
            kernel: self.clone(),
            run: record.id.clone(),
            input: RunSpec::of(record).ok().and_then(|spec| spec.input),
            version,
            request_id,
            events: EventStream::new(self.store().clone(), &self.inner.events, record.id.clone(), 0, true),
            last: baseline,
            stop_at_interrupt,
            out: VecDeque::new(),
            done: false,
        }
    }
}

/// An agent's card: 1.0's fields, and 0.3's beside them for older clients (both served
/// at the same URL, told apart by method name).
fn card(agent: &AgentDecl, base_url: &str) -> Value {
    let url = format!("{base_url}/a2a/{}", agent.name);
    let skills: Vec<Value> = agent
        .skills
        .iter()
        .map(|skill| {
            json!({
                "id": skill.id, "name": skill.name, "description": skill.description,
                "tags": skill.tags, "examples": skill.examples,
            })
        })
        .collect();
    json!({
        "name": agent.name,
        "description": agent.description,
        "version": agent.version,
        "supportedInterfaces": [
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0" },
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3" },
        ],
        "provider": { "organization": "Keel", "url": base_url },
        "capabilities": { "streaming": true, "pushNotifications": true, "extendedAgentCard": false },
        "securitySchemes": {
            "bearer": {
                "httpAuthSecurityScheme": { "scheme": "Bearer", "bearerFormat": "Keel API token" },
                "type": "http", "scheme": "bearer", "bearerFormat": "Keel API token",
            }
        },
        "securityRequirements": [ { "schemes": { "bearer": {} } } ],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
        // 0.3's names for the same things.
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "security": [ { "bearer": [] } ],
    })
}
