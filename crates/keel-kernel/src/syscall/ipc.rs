//! IPC syscalls (`ipc.send`, `ipc.recv`, and pub/sub: `ipc.subscribe`, `ipc.unsubscribe`,
//! `ipc.publish`): a durable, bounded mailbox per run, scoped by tenant; a published
//! message goes to the mailbox of every subscriber of the tenant's topic. Params are
//! checked here before anything is journaled.
//!
//! A send and a receive are one commit each: the mailbox write and the call's complete
//! journal entry are one store transaction (`Store::journal_mailbox`), so a crash leaves
//! both or neither, and no intent is needed. Replay answers the entry without touching
//! the mailbox, so every message reaches the receiver's journal exactly once.
//!
//! A publish (which also records event-trigger fires) is journaled as intent, then
//! result, as is a send or receive whose intent a crash left pending (written by a kernel
//! before the one-commit rule). The journal entry's key `run_id:seq` is then the store's
//! idempotency key: a send retried in the crash window writes nothing new and answers the
//! first seq (a publish, the first deliveries); a receive answers the message the first
//! attempt took.
//!
//! Waiting is per mailbox ([`Mailboxes`]): a receiver waits for a send to its own
//! mailbox, and a sender waiting for room in a full mailbox is woken, one per message
//! taken, by receives from that mailbox (so a receive wakes one sender, not every sender
//! of the kernel). A slow poll is the backstop; a waiter whose agent is gone stops waiting.

use keel_protocol::EventKind;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::rpc::{
    ErrorKind, IpcMessage, IpcPublishParams, IpcRecvParams, IpcRegisterParams, IpcSendParams, IpcTopicParams,
    MAX_RECV_MESSAGES,
};
use keel_store::{Error as StoreError, MailboxDone, MailboxOp, NewMessage, Seq};
use keel_types::RunId;
use serde_json::{Value, json};

use crate::Kernel;
use crate::mailboxes::MailboxWait;
use crate::now_ms;
use crate::run::LiveRun;
use crate::syscall::{InStore, Reply, SyscallError, internal, parse};

mod recv;
use recv::Take;

const MAX_CORRELATION_ID_BYTES: usize = 256;
const MAX_TOPIC_BYTES: usize = 256;
/// How long a receive waits before the run shows as `waiting(message)`.
const PARK_AFTER: Duration = Duration::from_millis(200);
/// How often a waiter looks again even without a notification (a backstop).
const POLL: Duration = Duration::from_millis(500);

/// An IPC call whose params were checked.
#[derive(Debug, Clone, PartialEq)]
pub enum IpcCall {
    Send {
        to: RunId,
        message: Value,
        correlation_id: Option<String>,
        wait: bool,
    },
    /// A send to a name a run registered (resolved to that run before it is journaled).
    SendNamed {
        name: String,
        message: Value,
        correlation_id: Option<String>,
        wait: bool,
    },
    /// `ipc.register {name}`: the caller takes a name other runs of its tenant send to.
    Register {
        name: String,
    },
    /// `max`: a receive of up to that many messages (answering a list), not of one.
    Recv {
        timeout_ms: Option<u64>,
        max: Option<usize>,
    },
    Subscribe {
        topic: String,
        subscribe: bool,
    },
    Publish {
        topic: String,
        message: Value,
        wait: bool,
    },
}

impl IpcCall {
    /// Whether the call is journaled as intent, then result (it waits, or its effect is
    /// not idempotent on its own); a (un)subscribe is journaled complete after its effect.
    pub fn has_intent(&self) -> bool {
        !matches!(self, IpcCall::Subscribe { .. } | IpcCall::Register { .. })
    }
}

const MAX_NAME_BYTES: usize = 64;

/// A run name: 1-64 of letters, digits, `-`, `_`, `.`, not shaped like a run id.
fn name(method: &str, name: &str) -> Result<String, SyscallError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with("run_");
    if !valid {
        return Err(bad(format!(
            "{method}: {name:?} is neither a run id (run_...) nor a name (1-{MAX_NAME_BYTES} letters, digits, '-', '_', '.', not starting with run_)"
        )));
    }
    Ok(name.to_owned())
}

fn topic(method: &str, topic: String) -> Result<String, SyscallError> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || topic.chars().any(char::is_control) {
        return Err(bad(format!(
            "{method}: `topic` must be 1 to {MAX_TOPIC_BYTES} bytes without control characters"
        )));
    }
    Ok(topic)
}

fn bad(message: String) -> SyscallError {
    SyscallError::new(ErrorKind::InvalidParams, message)
}

/// Whether `method` is an IPC syscall.
pub fn is_ipc_method(method: &str) -> bool {
    method.starts_with("ipc.")
}

/// Checks an IPC call's params.
pub fn check(method: &str, params: &Value) -> Result<IpcCall, SyscallError> {
    Ok(match method {
        "ipc.send" => {
            let p: IpcSendParams = parse(
                method,
                params,
                "{\"to\":\"run_...\",\"message\":<any JSON>,\"correlation_id\":\"optional\",\"wait\":true}",
            )?;
            let to = RunId::parse(&p.to).ok();
            let named = match &to {
                Some(_) => None,
                None => Some(name(method, &p.to)?),
            };
            if let Some(id) = &p.correlation_id
                && (id.is_empty() || id.len() > MAX_CORRELATION_ID_BYTES || id.chars().any(char::is_control))
            {
                return Err(bad(format!(
                    "{method}: `correlation_id` must be 1 to {MAX_CORRELATION_ID_BYTES} bytes without control characters"
                )));
            }
            if p.recv.is_some() {
                // A run's own send with `recv` is split before it is checked
                // (`Kernel::send_then_recv`); an operator has no mailbox to receive from.
                return Err(bad(format!("{method}: `recv` is for a run's own send (to receive its answer)")));
            }
            let wait = p.wait.unwrap_or(true);
            match (to, named) {
                (Some(to), _) => {
                    IpcCall::Send { to, message: p.message, correlation_id: p.correlation_id, wait }
                }
                (None, Some(name)) => {
                    IpcCall::SendNamed { name, message: p.message, correlation_id: p.correlation_id, wait }
                }
                (None, None) => return Err(bad(format!("{method}: `to` is missing"))),
            }
        }
        "ipc.register" => {
            let p: IpcRegisterParams = parse(method, params, "{\"name\":\"planner\"}")?;
            IpcCall::Register { name: name(method, &p.name)? }
        }
        "ipc.recv" => {
            let p: IpcRecvParams = parse(method, params, "{\"timeout_ms\":1000, \"max\":100} or {}")?;
            if let Some(max) = p.max
                && !(1..=MAX_RECV_MESSAGES).contains(&max)
            {
                return Err(bad(format!(
                    "{method}: `max` must be 1 to {MAX_RECV_MESSAGES} (the most messages to take at once), not {max}"
                )));
            }
            IpcCall::Recv { timeout_ms: p.timeout_ms, max: p.max.map(|max| max as usize) }
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
        other => {
            return Err(SyscallError::new(ErrorKind::UnknownMethod, format!("unknown ipc method {other:?}")));
        }
    })
}

/// What a send or receive answers, and its journal keeps: a send its message's seq in
/// the receiver's mailbox, a receive the message.
fn mailbox_result(done: &MailboxDone) -> Value {
    match done {
        MailboxDone::Sent(seq) | MailboxDone::SentAndTaken { seq, .. } => json!({ "seq": seq }),
        MailboxDone::Received(taken) => json!({ "message": taken.first().map(wire_message) }),
    }
}

/// What a receive of many (`ipc.recv` with `max`) answers, and its journal keeps: the
/// messages taken, oldest first.
fn mailbox_many_result(done: &MailboxDone) -> Value {
    match done {
        MailboxDone::Received(taken) => {
            json!({ "messages": taken.iter().map(wire_message).collect::<Vec<_>>() })
        }
        sent => mailbox_result(sent),
    }
}

fn wire_message(message: &keel_store::MailboxMessage) -> IpcMessage {
    IpcMessage {
        from: message.from.as_ref().map(|id| id.as_str().to_owned()),
        seq: message.seq,
        message: message.message.clone(),
        correlation_id: message.correlation_id.clone(),
        topic: message.topic.clone(),
    }
}

fn not_found(to: &RunId) -> SyscallError {
    SyscallError::new(ErrorKind::NotFound, format!("ipc.send: no run {to} (of this tenant)"))
}

impl Kernel {
    /// Sends a message for `tenant`, from run `from` (or an operator when `None`), waiting
    /// for room if the mailbox is full and `wait` is set (else `would_block`). `still_wanted`
    /// ends a wait whose caller is gone (answering `cancelled`).
    async fn mailbox_send(
        &self,
        tenant: &str,
        from: Option<&RunId>,
        call: IpcCall,
        idempotency_key: Option<String>,
        journal: Option<&InStore<'_>>,
        still_wanted: impl Fn() -> bool,
    ) -> Result<Value, SyscallError> {
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
        // The mailbox last found full, whose room this sender waits for.
        let mut full: Option<MailboxWait<'_>> = None;
        loop {
            let found_full = {
                let mut notified = pin!(full.as_ref().map(|wait| wait.waits.room.notified()));
                if let Some(notified) = notified.as_mut().as_pin_mut() {
                    notified.enable();
                }
                let outcome = match (&to, &topic, journal) {
                    (Some(to), _, Some(journal)) => {
                        // A receive waiting on the target's mailbox completes in this
                        // send's commit: one commit for both runs' steps.
                        let claim = self.inner.mailboxes.claim(to);
                        let send = MailboxOp::Send { to: to.clone(), message: new.clone(), receive: None };
                        journal.write(send, claim, mailbox_result).await.and_then(|written| match written {
                            Some((_, result)) => Ok((result, vec![to.clone()])),
                            None => Err(keel_store::Error::Corrupt("a send wrote nothing".to_owned())),
                        })
                    }
                    (Some(to), _, None) => self
                        .store()
                        .mailbox_send(to, new.clone())
                        .await
                        .map(|seq| (json!({ "seq": seq }), vec![to.clone()])),
                    (None, Some(topic), _) => {
                        self.store().topic_publish(topic, new.clone()).await.map(|delivered| {
                            let receivers = delivered.iter().map(|(run, _)| run.clone()).collect();
                            (json!({ "delivered": delivered.len() }), receivers)
                        })
                    }
                    (None, None, _) => return Err(internal("a send without a target")),
                };
                match outcome {
                    Ok((result, receivers)) => {
                        for run in &receivers {
                            self.inner.mailboxes.arrived(run);
                            // A receiver swapped out while waiting comes back for it.
                            self.request_wake(run);
                        }
                        // A run's publish fires the event triggers on its topic, recorded
                        // before its result is journaled (keyed by the publish's key).
                        if let (Some(topic), Some(from), Some(key)) = (&topic, from, &new.idempotency_key) {
                            self.event_published(tenant, from, topic, &new.message, key).await;
                        }
                        return Ok(result);
                    }
                    Err(StoreError::RunNotFound(run)) => return Err(not_found(&run)),
                    Err(StoreError::MailboxFull { capacity, run }) => {
                        if !wait {
                            return Err(SyscallError::new(
                                ErrorKind::WouldBlock,
                                format!(
                                    "{method}: the mailbox of run {run} is full ({capacity} undelivered messages); \
                                 nothing was sent. Retry later, or send with wait: true to wait for room"
                                ),
                            ));
                        }
                        if !still_wanted() {
                            return Err(SyscallError::new(
                                ErrorKind::Cancelled,
                                format!("{method}: the run is ending"),
                            ));
                        }
                        match notified.as_mut().as_pin_mut() {
                            Some(notified) if full.as_ref().is_some_and(|wait| wait.run == run) => {
                                let _ = tokio::time::timeout(POLL, notified).await;
                                None
                            }
                            // Found full for the first time (or another mailbox now):
                            // register for its room, then look again at once.
                            _ => Some(run),
                        }
                    }
                    Err(err) => return Err(internal(err)),
                }
            };
            if let Some(run) = found_full {
                full = Some(self.inner.mailboxes.wait(&run));
            }
        }
    }

    /// Subscribes (or unsubscribes) the run to the tenant's topic.
    pub(crate) async fn subscribe(
        &self,
        tenant: &str,
        run: &RunId,
        call: IpcCall,
    ) -> Result<Value, SyscallError> {
        let IpcCall::Subscribe { topic, subscribe } = call else {
            return Err(internal("subscribe called with another call"));
        };
        self.store().topic_subscribe(tenant, &topic, run, subscribe).await.map_err(internal)?;
        Ok(json!({}))
    }

    /// A named signal, delivered as an event the agent receives with `ipc.recv`:
    /// `{"topic": "signal", "message": {"signal": NAME, "data": ...}}` (`from`: the
    /// signalling run, or null for an operator). Durable and ordered with its messages; a
    /// full mailbox refuses it (`would_block`) rather than dropping it.
    pub(crate) async fn deliver_signal(
        &self,
        tenant: &str,
        from: Option<&RunId>,
        to: &RunId,
        signal: &str,
        data: Value,
        idempotency_key: Option<String>,
    ) -> Result<Value, SyscallError> {
        let message = NewMessage {
            tenant: tenant.to_owned(),
            from: from.cloned(),
            message: json!({ "signal": signal, "data": data }),
            correlation_id: None,
            topic: Some("signal".to_owned()),
            capacity: self.inner.mailbox_capacity,
            idempotency_key,
            sent_at_ms: now_ms(),
        };
        match self.store().mailbox_send(to, message).await {
            Ok(seq) => {
                self.inner.mailboxes.arrived(to);
                if signal != "pause" && signal != "resume" && signal != "stop" {
                    self.request_wake(to);
                } else {
                    self.tell_cluster(to);
                }
                self.emit(
                    to,
                    EventKind::Signal,
                    json!({ "signal": signal, "from": from.map(RunId::as_str) }),
                );
                Ok(json!({ "seq": seq }))
            }
            Err(StoreError::RunNotFound(run)) => Err(not_found(&run)),
            Err(StoreError::MailboxFull { capacity, run }) => Err(SyscallError::new(
                ErrorKind::WouldBlock,
                format!(
                    "signal {signal}: the mailbox of run {run} is full ({capacity} undelivered messages); nothing was sent"
                ),
            )),
            Err(err) => Err(internal(err)),
        }
    }

    /// [`Kernel::signal_run`], failing as a syscall does.
    pub(crate) async fn signal_run_syscall(
        &self,
        tenant: &str,
        run: &RunId,
        signal: &str,
        data: Value,
    ) -> Result<Value, SyscallError> {
        if matches!(signal, "stop" | "pause" | "resume") {
            return Err(bad(format!("`{signal}` controls the process: use `keel {signal} {run}`")));
        }
        if !crate::syscall::procs::valid_signal(signal) {
            return Err(bad(format!(
                "signal {signal:?} is not a name: use 1-64 letters, digits, '-', '_' or '.'"
            )));
        }
        self.deliver_signal(tenant, None, run, signal, data, None).await
    }

    /// The run registered as `name` in `tenant` (and not ended), for `ipc.send`.
    async fn resolve_name(&self, tenant: &str, name: &str) -> Result<RunId, SyscallError> {
        let missing = || {
            SyscallError::new(
                ErrorKind::NotFound,
                format!("ipc.send: no run of this tenant is registered as {name:?}"),
            )
        };
        let scope = format!("names:{tenant}");
        let Some(Value::String(id)) = self.store().kv_get(&scope, name).await.map_err(internal)? else {
            return Err(missing());
        };
        let run = RunId::parse(&id).map_err(internal)?;
        match self.store().get_run(&run).await.map_err(internal)? {
            Some(record) if !record.state.is_terminal() && record.tenant == tenant => Ok(run),
            _ => Err(missing()),
        }
    }

    /// `ipc.register`: the name is the caller's while it lives (a name held by a run that
    /// ended is free again); registering again is a no-op.
    async fn register_name(&self, tenant: &str, run: &RunId, name: &str) -> Result<Value, SyscallError> {
        if let Ok(holder) = self.resolve_name(tenant, name).await
            && &holder != run
        {
            return Err(SyscallError::new(
                ErrorKind::Denied,
                format!("ipc.register: the name {name:?} is taken by run {holder}, which has not ended"),
            ));
        }
        self.store().kv_put(&format!("names:{tenant}"), name, json!(run.as_str())).await.map_err(internal)?;
        Ok(json!({}))
    }

    /// Replaces a send to a name by a send to the run that holds it.
    async fn resolve_send(&self, tenant: &str, call: IpcCall) -> Result<IpcCall, SyscallError> {
        match call {
            IpcCall::SendNamed { name, message, correlation_id, wait } => {
                let to = self.resolve_name(tenant, &name).await?;
                Ok(IpcCall::Send { to, message, correlation_id, wait })
            }
            other => Ok(other),
        }
    }

    /// [`Kernel::send_message`], failing as a syscall does.
    pub(crate) async fn send_message_syscall(
        &self,
        tenant: &str,
        params: Value,
    ) -> Result<Value, SyscallError> {
        let call = check("ipc.send", &params)?;
        let call = self.resolve_send(tenant, call).await?;
        self.mailbox_send(tenant, None, call, None, None, || true).await
    }
}

impl Kernel {
    /// `ipc.send` with `recv`: the send, then the receive, each checked, journaled and
    /// replayed as the call it is (`ipc.send` without `recv`, then `ipc.recv` with its
    /// params), so neither the journal nor a replay can tell them from two requests made
    /// one after the other. Made in one request, the receive is on offer to senders
    /// (`crate::mailboxes`) as soon as the send is durable, before the peer the send woke
    /// can answer: the answer completes it in its own commit, and a request/reply round
    /// trip is two commits, however quick the peer: the send's answer to the peer's own
    /// receive is held back until this receive is on offer. Two requests race the peer
    /// instead (the agent's `ipc.recv` must reach the kernel before the answer does), and
    /// a lost race costs the receive a commit of its own.
    ///
    /// Nothing is sent unless both params are valid; a send refused receives nothing; a
    /// receive that fails after the send names the send's seq (`data.sent_seq`).
    pub(crate) async fn send_then_recv(&self, live: &Arc<LiveRun>, mut params: Value) -> Reply {
        let recv = params.as_object_mut().and_then(|params| params.remove("recv")).unwrap_or(Value::Null);
        if !recv.is_object() {
            return Err(bad(
                "ipc.send: `recv` must be an object, {} or {\"timeout_ms\":1000,\"max\":100}".to_owned()
            ));
        }
        // The send's params are checked by its own call, before it sends anything.
        check("ipc.recv", &recv)?;
        // The peer the send wakes hears of it once the receive is on offer (or the call
        // ends).
        let _holding = live.held_answers.hold();
        let sent = Box::pin(self.syscall(live, "ipc.send", params)).await?;
        let seq = sent.get("seq").cloned().unwrap_or(Value::Null);
        match Box::pin(self.syscall(live, "ipc.recv", recv)).await {
            Ok(Value::Object(mut received)) => {
                received.insert("seq".to_owned(), seq);
                Ok(Value::Object(received))
            }
            Ok(other) => Err(internal(format!("ipc.recv answered {other}"))),
            Err(mut err) => {
                err.message = format!("{} (the message was sent first: seq {seq})", err.message);
                Err(err.with("sent_seq", seq))
            }
        }
    }
}

impl Kernel {
    /// The `ipc.*` syscalls under their journaling rules: naming and subscribing are
    /// idempotent and journaled once done; sends, receives and publishes journal their
    /// intent first, and their key `run_id:seq` makes a retry after a crash answer what
    /// the first attempt did (a send its first seq, a receive the message it took).
    pub(crate) async fn perform_ipc(
        &self,
        journal: crate::syscall::JournalCall<'_>,
        how: crate::syscall::Journaling,
        call: IpcCall,
    ) -> Reply {
        use crate::syscall::Effect;
        let live = journal.live;
        let tenant = live.tenant.clone();
        // A name resolves to the run holding it now; the journal keeps the name.
        let call = self.resolve_send(&tenant, call).await?;
        if let IpcCall::Register { name } = &call {
            let registered = self.register_name(&tenant, &live.id, name).await;
            return self.journaled(journal, how, |_| async { Effect::reply(registered) }).await.reply;
        }
        let fresh = journal.reuse.is_none();
        if let IpcCall::Send { to, .. } = &call
            && !fresh
        {
            // An unknown target (or another tenant's run) leaves nothing to replay. (A
            // fresh send is refused so by the store, in its write: see below.)
            let target = self.store().get_run(to).await.map_err(internal)?;
            if target.is_none_or(|run| run.tenant != tenant) {
                return Err(SyscallError::new(
                    ErrorKind::NotFound,
                    format!("ipc.send: no run {to} (of this tenant)"),
                ));
            }
        }
        if fresh && matches!(call, IpcCall::Send { .. } | IpcCall::Recv { .. }) {
            // The mailbox write and the call's journal entry are one commit. A send to an
            // unknown target (or another tenant's run) is `RunNotFound`, which writes and
            // journals nothing.
            return self
                .journaled_in_store(journal, async |in_store| match call {
                    IpcCall::Recv { timeout_ms, max } => {
                        self.mailbox_recv(live, timeout_ms, max, Take::Journaled(in_store)).await
                    }
                    send => {
                        let still_wanted = || self.is_current(live);
                        self.mailbox_send(&tenant, Some(&live.id), send, None, Some(in_store), still_wanted)
                            .await
                    }
                })
                .await;
        }
        if !call.has_intent() {
            // Idempotent on its own: a crash before the entry is journaled makes the
            // replayed agent do it again, to the same effect.
            let subscribed = self.subscribe(&tenant, &live.id, call).await;
            return self.journaled(journal, how, |_| async { Effect::reply(subscribed) }).await.reply;
        }
        let effect = |seq: Option<Seq>| async move {
            let key = format!("{}:{}", live.id, seq.unwrap_or_default());
            Effect::reply(match call {
                IpcCall::Recv { timeout_ms, max } => {
                    self.mailbox_recv(live, timeout_ms, max, Take::Keyed(&key)).await
                }
                subscribe @ IpcCall::Subscribe { .. } => self.subscribe(&tenant, &live.id, subscribe).await,
                send @ (IpcCall::Send { .. } | IpcCall::Publish { .. }) => {
                    let still_wanted = || self.is_current(live);
                    self.mailbox_send(&tenant, Some(&live.id), send, Some(key), None, still_wanted).await
                }
                IpcCall::SendNamed { .. } | IpcCall::Register { .. } => {
                    Err(internal("names are resolved above"))
                }
            })
        };
        self.journaled(journal, how, effect).await.reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_what_is_wrong() {
        let err = check("ipc.send", &json!({"to": "no pe!", "message": 1})).unwrap_err();
        assert!(err.message.contains("neither a run id"), "{}", err.message);
        let err = check("ipc.send", &json!({"to": "run_nope", "message": 1})).unwrap_err();
        assert!(err.message.contains("neither a run id"), "{}", err.message);
        let call = check("ipc.send", &json!({"to": "planner", "message": 1})).unwrap();
        assert!(matches!(call, IpcCall::SendNamed { ref name, .. } if name == "planner"));
        let err = check("ipc.register", &json!({"name": ""})).unwrap_err();
        assert!(err.message.contains("neither a run id"), "{}", err.message);
        let err = check("ipc.send", &json!({"to": "run_00000000000000000000000001"})).unwrap_err();
        assert!(err.message.contains("missing field `message`"), "{}", err.message);
        let to = "run_00000000000000000000000001";
        let err = check("ipc.send", &json!({"to": to, "message": 1, "correlation_id": ""})).unwrap_err();
        assert!(err.message.contains("correlation_id"), "{}", err.message);
        let err = check("ipc.recv", &json!({"timeout": 1})).unwrap_err();
        assert!(err.message.contains("unknown field"), "{}", err.message);
        let call = check("ipc.send", &json!({"to": to, "message": {"a": 1}})).unwrap();
        assert!(matches!(call, IpcCall::Send { wait: true, .. }));
        assert_eq!(check("ipc.recv", &json!({})).unwrap(), IpcCall::Recv { timeout_ms: None, max: None });
        assert_eq!(
            check("ipc.recv", &json!({"max": 1000, "timeout_ms": 5})).unwrap(),
            IpcCall::Recv { timeout_ms: Some(5), max: Some(1000) }
        );
        for max in [json!(0), json!(1001)] {
            let err = check("ipc.recv", &json!({ "max": max })).unwrap_err();
            assert!(err.message.contains("`max` must be 1 to 1000"), "{}", err.message);
        }
        let err = check("ipc.recv", &json!({"max": -1})).unwrap_err();
        assert!(err.message.contains("max"), "{}", err.message);
        let err = check("ipc.subscribe", &json!({"topic": ""})).unwrap_err();
        assert!(err.message.contains("`topic`"), "{}", err.message);
        let call = check("ipc.unsubscribe", &json!({"topic": "news"})).unwrap();
        assert_eq!(call, IpcCall::Subscribe { topic: "news".into(), subscribe: false });
        assert!(!call.has_intent());
        let call = check("ipc.publish", &json!({"topic": "news", "message": 1, "wait": false})).unwrap();
        assert!(matches!(call, IpcCall::Publish { wait: false, .. }) && call.has_intent());
    }
}
