//! IPC syscalls (`ipc.send`, `ipc.recv`, and pub/sub: `ipc.subscribe`, `ipc.unsubscribe`,
//! `ipc.publish`): a durable, bounded mailbox per run, scoped by tenant; a published
//! message goes to the mailbox of every subscriber of the tenant's topic. Params are
//! checked here before anything is journaled.
//!
//! Send, receive and publish are journaled as intent, then result. The journal entry's key `run_id:seq`
//! is the store's idempotency key: a send retried in the crash window writes nothing new
//! and answers the first seq (a publish, the first deliveries); a receive retried in the crash window answers the message
//! the first attempt took. Once the result is journaled, replay answers it without
//! touching the mailbox, so every message reaches the receiver's journal exactly once.
//!
//! Waiting (a full mailbox for a waiting sender, an empty one for a receiver) listens on
//! one kernel-wide notification that every send and receive fires, with a slow poll as a
//! backstop; a waiter whose agent is gone stops waiting.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::rpc::{
    ErrorKind, IpcMessage, IpcPublishParams, IpcRecvParams, IpcSendParams, IpcTopicParams, RpcError,
};
use keel_store::{Error as StoreError, NewMessage};
use keel_types::RunId;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Kernel;
use crate::runtime::{LiveRun, now_ms};

/// The most undelivered messages a mailbox holds unless `KEEL_MAILBOX_CAPACITY` says
/// otherwise.
pub const DEFAULT_MAILBOX_CAPACITY: u64 = 1000;
const MAX_CORRELATION_ID_BYTES: usize = 256;
const MAX_TOPIC_BYTES: usize = 256;
/// How often a waiter looks again even without a notification (a backstop).
const POLL: Duration = Duration::from_millis(500);

/// An IPC call whose params were checked.
#[derive(Debug, Clone, PartialEq)]
pub enum IpcCall {
    Send { to: RunId, message: Value, correlation_id: Option<String>, wait: bool },
    Recv { timeout_ms: Option<u64> },
    Subscribe { topic: String, subscribe: bool },
    Publish { topic: String, message: Value, wait: bool },
}

impl IpcCall {
    /// Whether the call is journaled as intent, then result (it waits, or its effect is
    /// not idempotent on its own); a (un)subscribe is journaled complete after its effect.
    pub fn has_intent(&self) -> bool {
        !matches!(self, IpcCall::Subscribe { .. })
    }
}

fn topic(method: &str, topic: String) -> Result<String, RpcError> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || topic.chars().any(char::is_control) {
        return Err(bad(format!(
            "{method}: `topic` must be 1 to {MAX_TOPIC_BYTES} bytes without control characters"
        )));
    }
    Ok(topic)
}

fn bad(message: String) -> RpcError {
    ErrorKind::InvalidParams.error(message)
}

fn parse<T: DeserializeOwned>(method: &str, params: &Value, shape: &str) -> Result<T, RpcError> {
    serde_json::from_value(params.clone()).map_err(|e| bad(format!("{method}: {e}; expected params {shape}")))
}

fn internal(err: impl std::fmt::Display) -> RpcError {
    ErrorKind::Internal.error(format!("the kernel failed: {err}"))
}

/// Whether `method` is an IPC syscall.
pub fn is_ipc_method(method: &str) -> bool {
    method.starts_with("ipc.")
}

/// The mailbox capacity from `KEEL_MAILBOX_CAPACITY` (a positive integer), else the
/// default.
pub fn capacity_from_env() -> u64 {
    std::env::var("KEEL_MAILBOX_CAPACITY")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_MAILBOX_CAPACITY)
}

/// Checks an IPC call's params.
pub fn check(method: &str, params: &Value) -> Result<IpcCall, RpcError> {
    Ok(match method {
        "ipc.send" => {
            let p: IpcSendParams = parse(
                method,
                params,
                "{\"to\":\"run_...\",\"message\":<any JSON>,\"correlation_id\":\"optional\",\"wait\":true}",
            )?;
            let Ok(to) = RunId::parse(&p.to) else {
                return Err(bad(format!("{method}: `to` {:?} is not a run id (run_...)", p.to)));
            };
            if let Some(id) = &p.correlation_id
                && (id.is_empty() || id.len() > MAX_CORRELATION_ID_BYTES || id.chars().any(char::is_control))
            {
                return Err(bad(format!(
                    "{method}: `correlation_id` must be 1 to {MAX_CORRELATION_ID_BYTES} bytes without control characters"
                )));
            }
            IpcCall::Send {
                to,
                message: p.message,
                correlation_id: p.correlation_id,
                wait: p.wait.unwrap_or(true),
            }
        }
        "ipc.recv" => {
            let p: IpcRecvParams = parse(method, params, "{\"timeout_ms\":1000} or {}")?;
            IpcCall::Recv { timeout_ms: p.timeout_ms }
        }
        "ipc.subscribe" | "ipc.unsubscribe" => {
            let p: IpcTopicParams = parse(method, params, "{\"topic\":\"...\"}")?;
            IpcCall::Subscribe { topic: topic(method, p.topic)?, subscribe: method == "ipc.subscribe" }
        }
        "ipc.publish" => {
            let p: IpcPublishParams =
                parse(method, params, "{\"topic\":\"...\",\"message\":<any JSON>,\"wait\":true}")?;
            IpcCall::Publish {
                topic: topic(method, p.topic)?,
                message: p.message,
                wait: p.wait.unwrap_or(true),
            }
        }
        other => return Err(ErrorKind::UnknownMethod.error(format!("unknown ipc method {other:?}"))),
    })
}

fn not_found(to: &RunId) -> RpcError {
    ErrorKind::NotFound.error(format!("ipc.send: no run {to} (of this tenant)"))
}

impl Kernel {
    /// Sends a message for `tenant`, from run `from` (or an operator when `None`), waiting
    /// for room if the mailbox is full and `wait` is set (else `would_block`). `still_wanted`
    /// ends a wait whose caller is gone (answering `cancelled`).
    pub(crate) async fn mailbox_send(
        &self,
        tenant: &str,
        from: Option<&RunId>,
        call: IpcCall,
        idempotency_key: Option<String>,
        still_wanted: impl Fn() -> bool,
    ) -> Result<Value, RpcError> {
        let (to, topic, message, correlation_id, wait) = match call {
            IpcCall::Send { to, message, correlation_id, wait } => {
                (Some(to), None, message, correlation_id, wait)
            }
            IpcCall::Publish { topic, message, wait } => (None, Some(topic), message, None, wait),
            _ => return Err(internal("mailbox_send called with another call")),
        };
        let method = if to.is_some() { "ipc.send" } else { "ipc.publish" };
        let new = NewMessage {
            tenant: tenant.to_owned(),
            from: from.cloned(),
            message,
            correlation_id,
            topic: None,
            capacity: self.inner.mailbox_capacity,
            idempotency_key,
            sent_at_ms: now_ms(),
        };
        loop {
            let mut notified = pin!(self.inner.mail.notified());
            notified.as_mut().enable();
            let outcome = match (&to, &topic) {
                (Some(to), _) => self
                    .store()
                    .mailbox_send(to, new.clone())
                    .await
                    .map(|seq| (json!({ "seq": seq }), vec![to.clone()])),
                (None, Some(topic)) => {
                    self.store().topic_publish(topic, new.clone()).await.map(|delivered| {
                        let receivers = delivered.iter().map(|(run, _)| run.clone()).collect();
                        (json!({ "delivered": delivered.len() }), receivers)
                    })
                }
                (None, None) => return Err(internal("a send without a target")),
            };
            match outcome {
                Ok((result, receivers)) => {
                    self.inner.mail.notify_waiters();
                    // A receiver swapped out while waiting comes back for it.
                    for run in &receivers {
                        self.request_wake(run);
                    }
                    return Ok(result);
                }
                Err(StoreError::RunNotFound(run)) => return Err(not_found(&run)),
                Err(StoreError::MailboxFull { capacity, run }) => {
                    if !wait {
                        return Err(ErrorKind::WouldBlock.error(format!(
                            "{method}: the mailbox of run {run} is full ({capacity} undelivered messages); \
                             nothing was sent. Retry later, or send with wait: true to wait for room"
                        )));
                    }
                    if !still_wanted() {
                        return Err(ErrorKind::Cancelled.error(format!("{method}: the run is ending")));
                    }
                    let _ = tokio::time::timeout(POLL, notified).await;
                }
                Err(err) => return Err(internal(err)),
            }
        }
    }

    /// Takes the run's next message, waiting up to `timeout_ms` (forever when `None`).
    pub(crate) async fn mailbox_recv(
        &self,
        live: &Arc<LiveRun>,
        timeout_ms: Option<u64>,
        idempotency_key: &str,
    ) -> Result<Value, RpcError> {
        let deadline = timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        let _waiting = crate::swap::Busy::new(&live.waiting_calls);
        // A long wait shows as `waiting(message)` (and may be swapped out).
        let long = timeout_ms.is_none_or(|ms| ms >= 1000);
        let mut parked = false;
        loop {
            let mut notified = pin!(self.inner.mail.notified());
            notified.as_mut().enable();
            let received =
                self.store().mailbox_receive(&live.id, Some(idempotency_key)).await.map_err(internal)?;
            if received.is_some() || !long || parked {
                if parked && received.is_some() {
                    self.wake_run(live, keel_types::WaitReason::Message).await;
                }
            } else {
                self.park_run(live, keel_types::WaitReason::Message).await;
                parked = true;
            }
            if let Some(message) = received {
                self.inner.mail.notify_waiters();
                let message = IpcMessage {
                    from: message.from.map(|id| id.as_str().to_owned()),
                    seq: message.seq,
                    message: message.message,
                    correlation_id: message.correlation_id,
                    topic: message.topic,
                };
                return Ok(json!({ "message": message }));
            }
            if !self.is_current(live) {
                return Err(ErrorKind::Cancelled.error("ipc.recv: the run is ending; no message will come"));
            }
            let mut wake = tokio::time::Instant::now() + POLL;
            if let Some(deadline) = deadline {
                if tokio::time::Instant::now() >= deadline {
                    if parked {
                        self.wake_run(live, keel_types::WaitReason::Message).await;
                    }
                    return Ok(json!({ "message": null }));
                }
                wake = wake.min(deadline);
            }
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// Subscribes (or unsubscribes) the run to the tenant's topic.
    pub(crate) async fn subscribe(
        &self,
        tenant: &str,
        run: &RunId,
        call: IpcCall,
    ) -> Result<Value, RpcError> {
        let IpcCall::Subscribe { topic, subscribe } = call else {
            return Err(internal("subscribe called with another call"));
        };
        self.store().topic_subscribe(tenant, &topic, run, subscribe).await.map_err(internal)?;
        Ok(json!({}))
    }

    /// An operator's message to a run (the HTTP API and `keel send`), with the checks of
    /// `ipc.send`; not journaled (there is no sending run). Answers `{"seq": n}`.
    pub async fn send_message(&self, tenant: &str, params: Value) -> Result<Value, RpcError> {
        let call = check("ipc.send", &params)?;
        self.mailbox_send(tenant, None, call, None, || true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_what_is_wrong() {
        let err = check("ipc.send", &json!({"to": "nope", "message": 1})).unwrap_err();
        assert!(err.message.contains("not a run id"), "{}", err.message);
        let err = check("ipc.send", &json!({"to": "run_00000000000000000000000001"})).unwrap_err();
        assert!(err.message.contains("missing field `message`"), "{}", err.message);
        let to = "run_00000000000000000000000001";
        let err = check("ipc.send", &json!({"to": to, "message": 1, "correlation_id": ""})).unwrap_err();
        assert!(err.message.contains("correlation_id"), "{}", err.message);
        let err = check("ipc.recv", &json!({"timeout": 1})).unwrap_err();
        assert!(err.message.contains("unknown field"), "{}", err.message);
        let call = check("ipc.send", &json!({"to": to, "message": {"a": 1}})).unwrap();
        assert!(matches!(call, IpcCall::Send { wait: true, .. }));
        assert_eq!(check("ipc.recv", &json!({})).unwrap(), IpcCall::Recv { timeout_ms: None });
        let err = check("ipc.subscribe", &json!({"topic": ""})).unwrap_err();
        assert!(err.message.contains("`topic`"), "{}", err.message);
        let call = check("ipc.unsubscribe", &json!({"topic": "news"})).unwrap();
        assert_eq!(call, IpcCall::Subscribe { topic: "news".into(), subscribe: false });
        assert!(!call.has_intent());
        let call = check("ipc.publish", &json!({"topic": "news", "message": 1, "wait": false})).unwrap();
        assert!(matches!(call, IpcCall::Publish { wait: false, .. }) && call.has_intent());
    }
}
