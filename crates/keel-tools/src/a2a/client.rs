//! The HTTP side of an A2A agent: its card fetched, and JSON-RPC requests to the
//! endpoint the card names (`SendMessage`, `GetTask`, `ListTasks`, or 0.3's names), with
//! `A2A-Version` and the bearer token from the kernel's environment. [`Client::call`] is
//! one tool call, including the look-up that recovers a call a crash cut off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use keel_protocol::a2a::{Message, RpcError, Task, Version, message_json, parse_task};
use serde_json::{Value, json};

use super::{
    A2aAgentDef, Answer, Card, Endpoint, message_for, message_result, parse_card, parse_send_result,
    task_result,
};

/// The longest a card may take to arrive.
const CARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request failed.
#[derive(Debug, Clone, PartialEq)]
enum Failure {
    /// The agent answered with a JSON-RPC error.
    Rpc(RpcError),
    /// No answer, or not one JSON-RPC allows.
    Transport(String),
}

impl Failure {
    fn describe(&self) -> String {
        match self {
            Failure::Rpc(error) => format!("error {}: {}", error.code, error.message),
            Failure::Transport(why) => why.clone(),
        }
    }
}

/// A connection to one agent: its endpoint, as its card named it.
#[derive(Debug)]
pub struct Client {
    def: A2aAgentDef,
    http: reqwest::Client,
    endpoint: Endpoint,
    next_id: AtomicU64,
}

fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("could not make the HTTP client: {e}"))
}

/// The full chain of an error (reqwest's own message rarely says why).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn excerpt(body: &str) -> &str {
    let end = body.char_indices().nth(300).map(|(at, _)| at).unwrap_or(body.len());
    body[..end].trim()
}

impl Client {
    /// Reads the agent's card (sending `A2A-Version: 1.0` and its token) and connects to
    /// the interface it picks. The error names the agent and what failed.
    pub async fn connect(def: &A2aAgentDef) -> Result<(Client, Card), String> {
        let unavailable = |why: String| {
            format!(
                "A2A agent {:?} ([[tools.a2a]] in keel.toml) is not available: its card {}: {why}",
                def.name, def.card_url
            )
        };
        let http = http_client()?;
        let mut request = http
            .get(&def.card_url)
            .header("A2A-Version", Version::V1.as_str())
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(def.timeout.min(CARD_TIMEOUT));
        if let Some(token) = def.token()? {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| unavailable(chain(&e)))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| unavailable(chain(&e)))?;
        if !status.is_success() {
            return Err(unavailable(format!("HTTP {status}: {}", excerpt(&body))));
        }
        let value: Value = serde_json::from_str(&body)
            .map_err(|e| unavailable(format!("not JSON ({e}): {}", excerpt(&body))))?;
        let card = parse_card(&value, &def.card_url).map_err(unavailable)?;
        let client =
            Client { def: def.clone(), http, endpoint: card.endpoint.clone(), next_id: AtomicU64::new(1) };
        Ok((client, card))
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// One JSON-RPC request, `method` in the endpoint's version's name.
    async fn rpc(&self, method: &str, mut params: Value) -> Result<Value, Failure> {
        if let (Some(tenant), Version::V1) = (&self.endpoint.tenant, self.endpoint.version) {
            params["tenant"] = json!(tenant);
        }
        let id = format!("keel-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let mut request = self
            .http
            .post(&self.endpoint.url)
            .header("A2A-Version", self.endpoint.version.as_str())
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.def.timeout)
            .json(&body);
        if let Some(token) = self.def.token().map_err(Failure::Transport)? {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Transport(format!("{method} to {}: {}", self.endpoint.url, chain(&e))))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| Failure::Transport(chain(&e)))?;
        if !status.is_success() {
            return Err(Failure::Transport(format!("{method}: HTTP {status}: {}", excerpt(&text))));
        }
        let mut answer: Value = serde_json::from_str(&text).map_err(|e| {
            Failure::Transport(format!("{method}: the answer is not JSON ({e}): {}", excerpt(&text)))
        })?;
        if let Some(error) = answer.get("error").filter(|error| !error.is_null()) {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(RpcError::INTERNAL);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("no message");
            return Err(Failure::Rpc(RpcError::new(code, message)));
        }
        match answer.get_mut("result") {
            Some(result) => Ok(result.take()),
            None => Err(Failure::Transport(format!("{method}: the answer has neither `result` nor `error`"))),
        }
    }

    fn failed(&self, method: &str, failure: Failure) -> String {
        format!("A2A agent {:?} answered {method} with {}", self.def.name, failure.describe())
    }

    async fn send(&self, message: &Message) -> Result<Answer, String> {
        let version = self.endpoint.version;
        let (method, params) = match version {
            Version::V1 => {
                ("SendMessage", json!({ "message": message_json(message, version), "configuration": {} }))
            }
            Version::V03 => (
                "message/send",
                json!({ "message": message_json(message, version), "configuration": { "blocking": true } }),
            ),
        };
        let result = self.rpc(method, params).await.map_err(|failure| self.failed(method, failure))?;
        parse_send_result(&result, version)
            .map_err(|e| format!("A2A agent {:?} answered {method} with something else: {e}", self.def.name))
    }

    /// The task `id` (`None` when the agent has no such task).
    async fn get_task(&self, id: &str) -> Result<Option<Task>, String> {
        let method = match self.endpoint.version {
            Version::V1 => "GetTask",
            Version::V03 => "tasks/get",
        };
        match self.rpc(method, json!({ "id": id })).await {
            Ok(task) => parse_task(&task, self.endpoint.version).map(Some).map_err(|e| {
                format!("A2A agent {:?} answered {method} with something else: {e}", self.def.name)
            }),
            Err(Failure::Rpc(error)) if error.code == RpcError::TASK_NOT_FOUND => Ok(None),
            Err(failure) => Err(self.failed(method, failure)),
        }
    }

    /// Waits until `task` is done or waits for its caller, asking for it again and again.
    async fn settle(&self, mut task: Task) -> Result<Task, String> {
        let mut pause = Duration::from_millis(100);
        while !task.status.state.is_interrupted() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            task = self.get_task(&task.id).await?.ok_or_else(|| {
                format!("A2A agent {:?} no longer knows its task {}", self.def.name, task.id)
            })?;
        }
        Ok(task)
    }

    /// Why a recovered call cannot be resolved: it is not sent again.
    fn uncertain(&self, why: &str) -> String {
        format!(
            "this call was cut off by a kernel crash after it may have reached A2A agent {:?}, and {why}; it is not sent again (call the tool anew to send it)",
            self.def.name
        )
    }

    /// What the remote holds of a call cut off by a crash: the task the message made,
    /// `None` when it has no trace of it. `Err` when it cannot be asked.
    async fn find(&self, message: &Message) -> Result<Option<Task>, String> {
        if let Some(task_id) = &message.task_id {
            // An answer to a task: the task's history has it once the agent received it.
            let task = self
                .get_task(task_id)
                .await
                .map_err(|e| self.uncertain(&format!("looking it up failed: {e}")))?;
            return Ok(task.filter(|task| task.history.iter().any(|m| m.message_id == message.message_id)));
        }
        let context = message.context_id.as_deref().unwrap_or_default();
        if self.endpoint.version == Version::V03 {
            return Err(self.uncertain("it speaks A2A 0.3, which has no way to list the tasks of a context"));
        }
        let params = json!({ "contextId": context, "includeArtifacts": true });
        let listed = match self.rpc("ListTasks", params).await {
            Ok(listed) => listed,
            Err(Failure::Rpc(error))
                if matches!(error.code, RpcError::METHOD_NOT_FOUND | RpcError::UNSUPPORTED_OPERATION) =>
            {
                return Err(self.uncertain(&format!("it does not answer ListTasks ({})", error.message)));
            }
            Err(failure) => {
                return Err(
                    self.uncertain(&format!("looking it up failed: {}", self.failed("ListTasks", failure)))
                );
            }
        };
        let tasks = listed.get("tasks").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for task in tasks {
            let task = parse_task(task, Version::V1)
                .map_err(|e| self.uncertain(&format!("its ListTasks answer: {e}")))?;
            // Checked here too: a remote that ignores the filter lists other tasks.
            if task.context_id == context {
                return Ok(Some(task));
            }
        }
        Ok(None)
    }

    /// Calls `skill` with `args`; `key` is the call's idempotency key. With `recovering`
    /// (the call's journal entry was left without a result by a crash) the remote is
    /// asked first and what it already has is waited for; see the module doc.
    pub async fn call(
        &self,
        skill: &str,
        args: &Value,
        key: &str,
        recovering: bool,
    ) -> Result<Value, String> {
        let message = message_for(skill, args, key)?;
        if recovering && let Some(task) = self.find(&message).await? {
            return task_result(&self.settle(task).await?);
        }
        match self.send(&message).await? {
            Answer::Task(task) => task_result(&self.settle(task).await?),
            Answer::Message(reply) => Ok(message_result(&reply)),
        }
    }
}
