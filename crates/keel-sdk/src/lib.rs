//! Rust SDK for Keel agents: a blocking client of the syscall channel (JSON-RPC 2.0 over
//! the Unix socket in `KEEL_SOCKET`, one object per line, protocol 1).
//!
//! ```no_run
//! let mut keel = keel_sdk::Client::connect()?;
//! let state = keel.restore()?; // the last checkpoint, or null on a fresh start
//! let reply = keel.llm_chat(&[keel_sdk::user("Plan the first step")])?;
//! keel.checkpoint(&serde_json::json!({"plan": reply.message.content}))?;
//! keel.exit(&serde_json::json!({"ok": true}))?;
//! # Ok::<(), keel_sdk::Error>(())
//! ```
//!
//! Recovery re-runs the agent and answers its syscalls from the journal, so take time and
//! randomness from [`Client::now_ms`] and [`Client::random`], not from the OS.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use keel_protocol::rpc::{
    ChatMessage, ChatRole, HelloResult, IpcMessage, IpcPublishResult, IpcRecvManyResult, IpcRecvResult,
    IpcSendResult, LlmChatParams, LlmChatResult, MemDeleteResult, MemGetResult, MemSearchHit,
    MemSearchResult, MemThreadAppendResult, MemThreadReadResult, Response, RpcError, ThreadEntry, ToolSpec,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not running under Keel ({0} is not set): start this program with `keel run -- <command>`")]
    NotUnderKeel(&'static str),
    #[error("could not reach the kernel at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the connection to the kernel was lost: {0}")]
    ConnectionLost(#[source] std::io::Error),
    /// The kernel refused the call; `kind` is the stable machine-readable reason.
    #[error("{method} failed: {message} [{kind}, code {code}]")]
    Kernel { method: String, code: i64, kind: String, message: String },
    #[error("the kernel's reply to {method} is not what protocol 1 specifies: {detail}")]
    Protocol { method: String, detail: String },
}

/// A user message, the most common thing to send.
pub fn user(content: &str) -> ChatMessage {
    ChatMessage {
        role: ChatRole::User,
        content: Some(content.into()),
        tool_calls: None,
        tool_call_id: None,
        name: None,
        reasoning: None,
    }
}

/// A system message.
pub fn system(content: &str) -> ChatMessage {
    ChatMessage { role: ChatRole::System, ..user(content) }
}

/// A connection to the kernel. Calls are sequential on one client; open more clients for
/// concurrent calls from several threads.
pub struct Client {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    run_id: String,
}

impl Client {
    /// Connects with `KEEL_SOCKET` and `KEEL_RUN_TOKEN` and says hello.
    pub fn connect() -> Result<Client> {
        let socket = std::env::var("KEEL_SOCKET").map_err(|_| Error::NotUnderKeel("KEEL_SOCKET"))?;
        let token = std::env::var("KEEL_RUN_TOKEN").map_err(|_| Error::NotUnderKeel("KEEL_RUN_TOKEN"))?;
        Client::connect_to(&socket, &token)
    }

    pub fn connect_to(socket: &str, token: &str) -> Result<Client> {
        let stream =
            UnixStream::connect(socket).map_err(|source| Error::Connect { path: socket.into(), source })?;
        let reader = BufReader::new(stream.try_clone().map_err(Error::ConnectionLost)?);
        let mut client = Client { writer: stream, reader, next_id: 0, run_id: String::new() };
        let hello: HelloResult = client.call("hello", json!({ "token": token }))?;
        if hello.protocol != keel_protocol::PROTOCOL_VERSION {
            return Err(Error::Protocol {
                method: "hello".into(),
                detail: format!(
                    "kernel speaks protocol {}, this SDK {}",
                    hello.protocol,
                    keel_protocol::PROTOCOL_VERSION
                ),
            });
        }
        client.run_id = hello.run_id;
        Ok(client)
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Any syscall, with its result decoded as `T`.
    pub fn call<T: DeserializeOwned>(&mut self, method: &str, params: Value) -> Result<T> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
                .map_err(|e| Error::Protocol { method: method.into(), detail: e.to_string() })?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(Error::ConnectionLost)?;
        let mut reply = String::new();
        let read = self.reader.read_line(&mut reply).map_err(Error::ConnectionLost)?;
        if read == 0 {
            return Err(Error::ConnectionLost(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)));
        }
        let response: Response = serde_json::from_str(&reply)
            .map_err(|e| Error::Protocol { method: method.into(), detail: format!("{e}: {reply}") })?;
        if let Some(RpcError { code, message, data }) = response.error {
            let kind = data.as_ref().and_then(|d| d.get("kind")).and_then(Value::as_str).unwrap_or("unknown");
            return Err(Error::Kernel { method: method.into(), code, kind: kind.into(), message });
        }
        serde_json::from_value(response.result.unwrap_or(Value::Null))
            .map_err(|e| Error::Protocol { method: method.into(), detail: e.to_string() })
    }

    pub fn llm_chat(&mut self, messages: &[ChatMessage]) -> Result<LlmChatResult> {
        let params = LlmChatParams { messages: messages.to_vec(), ..LlmChatParams::default() };
        self.llm_chat_with(&params)
    }

    pub fn llm_chat_with(&mut self, params: &LlmChatParams) -> Result<LlmChatResult> {
        let params = serde_json::to_value(params)
            .map_err(|e| Error::Protocol { method: "llm.chat".into(), detail: e.to_string() })?;
        self.call("llm.chat", params)
    }

    /// Calls a granted tool; returns its `result`.
    pub fn tool(&mut self, name: &str, args: Value) -> Result<Value> {
        let reply: Value = self.call("tool.call", json!({ "name": name, "args": args }))?;
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }

    pub fn list_tools(&mut self) -> Result<Vec<ToolSpec>> {
        let reply: Value = self.call("tool.list", json!({}))?;
        serde_json::from_value(reply.get("tools").cloned().unwrap_or(Value::Null))
            .map_err(|e| Error::Protocol { method: "tool.list".into(), detail: e.to_string() })
    }

    /// Saves `state`; recovery resumes from the latest checkpoint. Returns its seq.
    pub fn checkpoint(&mut self, state: &Value) -> Result<u64> {
        let reply: Value = self.call("state.checkpoint", json!({ "state": state }))?;
        Ok(reply.get("seq").and_then(Value::as_u64).unwrap_or(0))
    }

    /// The latest checkpointed state, or null.
    pub fn restore(&mut self) -> Result<Value> {
        let reply: Value = self.call("state.restore", json!({}))?;
        Ok(reply.get("state").cloned().unwrap_or(Value::Null))
    }

    pub fn now_ms(&mut self) -> Result<u64> {
        let reply: Value = self.call("sys.now", json!({}))?;
        Ok(reply.get("unix_ms").and_then(Value::as_u64).unwrap_or(0))
    }

    pub fn random(&mut self) -> Result<u64> {
        let reply: Value = self.call("sys.random", json!({}))?;
        Ok(reply.get("value").and_then(Value::as_u64).unwrap_or(0))
    }

    /// Asks the operator; blocks (durably, across kernel restarts) until answered.
    pub fn ask(&mut self, question: &str) -> Result<String> {
        let reply: Value = self.call("human.ask", json!({ "question": question }))?;
        Ok(reply.get("answer").and_then(Value::as_str).unwrap_or_default().to_owned())
    }

    /// Asks the operator to fill in a form (`form`: a JSON schema of an object); blocks
    /// like [`Client::ask`] and returns the answer, valid against `form` (the kernel
    /// refuses an answer that is not).
    pub fn ask_form(&mut self, question: &str, form: &Value) -> Result<Value> {
        let reply: Value = self.call("human.ask", json!({ "question": question, "form": form }))?;
        Ok(reply.get("value").cloned().unwrap_or(Value::Null))
    }

    /// Shows `block` on the run's console page (`ui.show`), journaled: after a crash a
    /// replayed call does not show it twice. Returns the block's journal seq. The helpers
    /// below build each type of block.
    pub fn show(&mut self, block: &Value) -> Result<u64> {
        let reply: Value = self.call("ui.show", json!({ "block": block }))?;
        Ok(reply.get("seq").and_then(Value::as_u64).unwrap_or(0))
    }

    /// A table: one cell (string, number, bool or null) per column in each row.
    pub fn show_table(&mut self, columns: &[&str], rows: &[Vec<Value>], title: Option<&str>) -> Result<u64> {
        self.show(&titled(json!({ "type": "table", "columns": columns, "rows": rows }), title))
    }

    /// A `line` or `bar` chart: each series `(name, values)` has one value per label.
    pub fn show_chart(
        &mut self,
        kind: &str,
        labels: &[&str],
        series: &[(&str, Vec<f64>)],
        title: Option<&str>,
    ) -> Result<u64> {
        let series: Vec<Value> =
            series.iter().map(|(name, values)| json!({ "name": name, "values": values })).collect();
        self.show(&titled(
            json!({ "type": "chart", "kind": kind, "labels": labels, "series": series }),
            title,
        ))
    }

    pub fn show_markdown(&mut self, text: &str) -> Result<u64> {
        self.show(&json!({ "type": "markdown", "text": text }))
    }

    /// Progress from 0 to 1, with an optional label.
    pub fn show_progress(&mut self, value: f64, label: Option<&str>) -> Result<u64> {
        let mut block = json!({ "type": "progress", "value": value });
        if let Some(label) = label {
            block["label"] = json!(label);
        }
        self.show(&block)
    }

    /// A form (`schema`: a JSON schema of an object) the person fills in on the console;
    /// the submitted value arrives in the run's mailbox as an operator message
    /// `{"ui_form": id, "value": {...}}` ([`Client::recv`]).
    pub fn show_form(&mut self, id: &str, schema: &Value, title: Option<&str>) -> Result<u64> {
        self.show(&titled(json!({ "type": "form", "id": id, "schema": schema }), title))
    }

    pub fn emit(&mut self, event: &Value) -> Result<()> {
        self.call::<Value>("run.emit", json!({ "event": event })).map(drop)
    }

    /// Records the run's output; the process should exit afterwards.
    pub fn exit(&mut self, output: &Value) -> Result<()> {
        self.call::<Value>("run.exit", json!({ "output": output })).map(drop)
    }

    /// Appends a message to the conversation thread `thread` (shared by id between the
    /// tenant's runs); returns its index (0 for the first).
    pub fn thread_append(&mut self, thread: &str, role: &str, content: &str) -> Result<u64> {
        let params = json!({ "thread": thread, "message": { "role": role, "content": content } });
        Ok(self.call::<MemThreadAppendResult>("mem.thread.append", params)?.index)
    }

    /// The thread's messages, oldest first: the newest `last` and/or the newest that fit
    /// in `max_tokens` (estimated).
    pub fn thread_read(
        &mut self,
        thread: &str,
        last: Option<u64>,
        max_tokens: Option<u64>,
    ) -> Result<Vec<ThreadEntry>> {
        let mut params = json!({ "thread": thread });
        if let Some(last) = last {
            params["last"] = json!(last);
        }
        if let Some(max_tokens) = max_tokens {
            params["max_tokens"] = json!(max_tokens);
        }
        Ok(self.call::<MemThreadReadResult>("mem.thread.read", params)?.messages)
    }

    /// Stores `value` under `namespace`/`key`; `text` is what `mem_search` finds it by
    /// (default: the value itself if a string, else its JSON).
    pub fn mem_put(&mut self, namespace: &str, key: &str, value: &Value, text: Option<&str>) -> Result<()> {
        let mut params = json!({ "namespace": namespace, "key": key, "value": value });
        if let Some(text) = text {
            params["text"] = json!(text);
        }
        self.call::<Value>("mem.put", params).map(drop)
    }

    /// The value under `namespace`/`key`, or null.
    pub fn mem_get(&mut self, namespace: &str, key: &str) -> Result<Value> {
        Ok(self.call::<MemGetResult>("mem.get", json!({ "namespace": namespace, "key": key }))?.value)
    }

    /// Deletes a record; whether there was one.
    pub fn mem_delete(&mut self, namespace: &str, key: &str) -> Result<bool> {
        Ok(self.call::<MemDeleteResult>("mem.delete", json!({ "namespace": namespace, "key": key }))?.deleted)
    }

    /// Full-text search of a namespace, most relevant first (any word may match).
    pub fn mem_search(
        &mut self,
        namespace: &str,
        query: &str,
        limit: Option<u64>,
    ) -> Result<Vec<MemSearchHit>> {
        let mut params = json!({ "namespace": namespace, "query": query });
        if let Some(limit) = limit {
            params["limit"] = json!(limit);
        }
        Ok(self.call::<MemSearchResult>("mem.search", params)?.hits)
    }

    /// Puts `message` in the mailbox of run `to` (a run of the same tenant) and returns
    /// its seq there. When the mailbox is full this waits for room, or with `wait: false`
    /// fails with kind `would_block` (nothing was sent). Request/reply: send with a fresh
    /// `correlation_id`; the replier answers the request's `from` with the same id.
    pub fn send(
        &mut self,
        to: &str,
        message: &Value,
        correlation_id: Option<&str>,
        wait: bool,
    ) -> Result<u64> {
        let mut params = json!({ "to": to, "message": message });
        if let Some(correlation_id) = correlation_id {
            params["correlation_id"] = json!(correlation_id);
        }
        if !wait {
            params["wait"] = json!(false);
        }
        Ok(self.call::<IpcSendResult>("ipc.send", params)?.seq)
    }

    /// [`Client::send`], then [`Client::recv`], in one request: the next message of this
    /// run's mailbox after the send (its reply, when the peer answers at once), or `None`
    /// when `timeout_ms` passes first. Journaled and replayed as the two calls; the receive
    /// is on offer before the peer hears of the send, so the peer's reply completes it in
    /// the reply's own commit (a round trip of two commits; see the protocol's `ipc.send`).
    pub fn send_recv(
        &mut self,
        to: &str,
        message: &Value,
        correlation_id: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> Result<Option<IpcMessage>> {
        let mut params = json!({ "to": to, "message": message, "recv": {} });
        if let Some(correlation_id) = correlation_id {
            params["correlation_id"] = json!(correlation_id);
        }
        if let Some(timeout_ms) = timeout_ms {
            params["recv"]["timeout_ms"] = json!(timeout_ms);
        }
        Ok(self.call::<IpcRecvResult>("ipc.send", params)?.message)
    }

    /// The next message of this run's mailbox, waiting up to `timeout_ms` (forever when
    /// `None`); `None` on timeout. Each message is received once; a restarted run
    /// receives the same messages again from the journal.
    pub fn recv(&mut self, timeout_ms: Option<u64>) -> Result<Option<IpcMessage>> {
        let params = match timeout_ms {
            Some(timeout_ms) => json!({ "timeout_ms": timeout_ms }),
            None => json!({}),
        };
        Ok(self.call::<IpcRecvResult>("ipc.recv", params)?.message)
    }

    /// Up to `max` (1 to 1000) of the oldest messages of this run's mailbox, oldest first:
    /// at least one, waiting up to `timeout_ms` (forever when `None`) for the first; empty
    /// on timeout. Whatever is waiting is taken in one journaled step. Past the first
    /// message, a batch stops before the bodies exceed 1 MiB of JSON in all.
    pub fn recv_many(&mut self, max: u64, timeout_ms: Option<u64>) -> Result<Vec<IpcMessage>> {
        let mut params = json!({ "max": max });
        if let Some(timeout_ms) = timeout_ms {
            params["timeout_ms"] = json!(timeout_ms);
        }
        Ok(self.call::<IpcRecvManyResult>("ipc.recv", params)?.messages)
    }

    /// Delivers messages published on the tenant's `topic` to this run's mailbox from now
    /// on (received with `topic` set); `subscribe: false` stops it.
    pub fn subscribe(&mut self, topic: &str, subscribe: bool) -> Result<()> {
        let method = if subscribe { "ipc.subscribe" } else { "ipc.unsubscribe" };
        self.call::<Value>(method, json!({ "topic": topic })).map(drop)
    }

    /// Puts `message` in the mailbox of every run of the tenant subscribed to `topic` (all
    /// or nothing); returns how many got it. A full subscriber mailbox makes this wait, or
    /// with `wait: false` fail with kind `would_block`.
    pub fn publish(&mut self, topic: &str, message: &Value, wait: bool) -> Result<u64> {
        let mut params = json!({ "topic": topic, "message": message });
        if !wait {
            params["wait"] = json!(false);
        }
        Ok(self.call::<IpcPublishResult>("ipc.publish", params)?.delivered)
    }
}

/// `block` with its optional `title`.
fn titled(mut block: Value, title: Option<&str>) -> Value {
    if let Some(title) = title {
        block["title"] = json!(title);
    }
    block
}
