//! The journaling rule, in one place. A call with an outside effect has its intent made
//! durable before the effect and its result durable before the reply; a call without one
//! is performed and then journaled complete in one commit. Method families describe
//! their effect and say which rule applies ([`Journaling`]); only this module writes
//! journal entries for them, so no family can get the order wrong.
//!
//! A store that cannot be reached (a Postgres server restarting) makes these writes wait
//! and retry with backoff ([`crate::outage::retry_while`]) rather than fail the call: the
//! store promises that an `Unavailable` write wrote nothing, so trying again cannot
//! journal twice, and the agent sees a slow syscall instead of an error it cannot act on.
//! A commit cut off by the outage (`OutcomeUnknown`) is resolved by reading back: an
//! append found in the journal, or a completion found done, is not written again.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use keel_protocol::EventKind;
use keel_store::{Completion, JournalEntry, MailboxDone, MailboxOp, MailboxResult, NewEntry, Seq};
use keel_types::{EntryStatus, Usage};
use serde_json::{Value, json};

use super::{Reply, SyscallError, internal};
use crate::mailboxes::{Claim, Handed};
use crate::run::{BufferedRead, LiveRun};
use crate::telemetry::{Outcome, SyscallSpan};
use crate::{Kernel, now_ms};

/// How a call is journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Journaling {
    /// No outside effect: performed, then journaled complete in one commit. With
    /// `failures`, a failed call is journaled too and replayed as the same failure;
    /// without, a failure is answered unjournaled and performed again after a crash.
    Complete { failures: bool },
    /// An outside effect: the intent is durable before it runs and the result before the
    /// reply. The effect gets the intent's seq for its idempotency key (`run_id:seq`). A
    /// call cut off because its agent went away (`cancelled`) leaves the intent pending,
    /// so a relaunched agent asking again retries it under the same key.
    IntentThenResult,
    /// The intent is durable before the call waits; the result is journaled by whoever
    /// answers (an operator answering `human.ask`), not by the call.
    IntentAnsweredElsewhere,
}

/// A checked call on its way to the journal.
pub(crate) struct Call<'a> {
    pub(crate) live: &'a Arc<LiveRun>,
    pub(crate) method: &'a str,
    pub(crate) params: Value,
    pub(crate) hash: String,
    /// The seq of a journaled intent being retried after a crash.
    pub(crate) reuse: Option<Seq>,
}

/// What a call's effect came to.
pub(crate) struct Effect {
    pub(crate) reply: Reply,
    /// What the journal keeps as the result when it is not the reply itself.
    pub(crate) record: Option<Value>,
    pub(crate) usage: Usage,
    /// A provider served the call (`provider_calls` counts it, in the same commit).
    pub(crate) served: bool,
    /// Fields added to the call's `syscall` event.
    pub(crate) event: Value,
    /// Entries journaled in the same commit as this call's result (a `code.exec`
    /// program's reads; `Store::complete_entry_with`).
    pub(crate) with: Vec<BufferedRead>,
}

impl Effect {
    pub(crate) fn reply(reply: Reply) -> Effect {
        Effect {
            reply,
            record: None,
            usage: Usage::default(),
            served: false,
            event: json!({}),
            with: Vec::new(),
        }
    }

    pub(crate) fn usage(mut self, usage: Usage) -> Effect {
        self.usage = usage;
        self
    }

    pub(crate) fn event(mut self, event: Value) -> Effect {
        self.event = event;
        self
    }
}

/// A journaled call's reply, and the seq of its entry when one was written.
pub(crate) struct Journaled {
    pub(crate) reply: Reply,
    pub(crate) seq: Option<Seq>,
}

/// A journal entry complete at once: the call's outcome as it came out.
pub(crate) fn completed_entry(
    attempt: u32,
    method: &str,
    params: Value,
    hash: String,
    outcome: &Reply,
    usage: Usage,
) -> NewEntry {
    let now = now_ms();
    let (status, result, error) = match outcome {
        Ok(result) => (EntryStatus::Ok, Some(result.clone()), None),
        Err(err) => (EntryStatus::Error, None, serde_json::to_value(err.to_rpc()).ok()),
    };
    NewEntry {
        method: method.to_owned(),
        params,
        params_hash: hash,
        status,
        result,
        error,
        attempt,
        started_at_ms: now,
        finished_at_ms: Some(now),
        usage,
    }
}

/// `done`, its call's span ended (if it has one) with its reply.
fn ended(span: Option<SyscallSpan>, done: Journaled, usage: Usage) -> Journaled {
    if let Some(span) = span {
        span.end(Outcome::of(done.seq, done.reply.as_ref(), usage));
    }
    done
}

impl Kernel {
    /// Runs `effect` under the journaling rule `how`. The effect never touches the
    /// journal; it gets the seq of its intent (`None` for a call journaled after it). The
    /// call's span reports what the journal kept as its result (a model call's: the
    /// provider's response and meta), or the reply where nothing was kept.
    pub(crate) async fn journaled<F, Fut>(&self, call: Call<'_>, how: Journaling, effect: F) -> Journaled
    where
        F: FnOnce(Option<Seq>) -> Fut,
        Fut: Future<Output = Effect>,
    {
        let Call { live, method, params, hash, reuse } = call;
        let span = self.inner.telemetry.syscall(&live.id, live.attempt, method, &params);
        if let Journaling::Complete { failures } = how {
            let done = effect(None).await;
            let journaled = if done.reply.is_err() && !failures {
                Journaled { reply: done.reply, seq: None }
            } else {
                match self
                    .record_outcome(live, method, params, hash, &done.reply, done.usage, done.event)
                    .await
                {
                    Ok(seq) => Journaled { reply: done.reply, seq: Some(seq) },
                    Err(err) => Journaled { reply: Err(err), seq: None },
                }
            };
            return ended(span, journaled, done.usage);
        }
        let seq = match reuse {
            Some(seq) => seq,
            None => match self.intend(live, method, params, hash).await {
                Ok(seq) => seq,
                Err(err) => return ended(span, Journaled { reply: Err(err), seq: None }, Usage::default()),
            },
        };
        let done = effect(Some(seq)).await;
        let cancelled = matches!(&done.reply, Err(err) if err.is(keel_protocol::rpc::ErrorKind::Cancelled));
        if how == Journaling::IntentAnsweredElsewhere || cancelled {
            return ended(span, Journaled { reply: done.reply, seq: Some(seq) }, done.usage);
        }
        let Effect { reply, record, usage, served, event, with } = done;
        let record = record.unwrap_or_else(|| reply.clone().unwrap_or(Value::Null));
        // Entries that go with the result are written in its commit, durable in one go
        // before the reply.
        let (reply, result) =
            match self.complete(live, seq, method, &reply, record, usage, served, event, with).await {
                Ok(result) => (reply, result),
                Err(err) => (Err(err), None),
            };
        if let Some(span) = span {
            span.end(Outcome::of(Some(seq), result.as_ref().map_or(reply.as_ref(), Ok), usage));
        }
        Journaled { reply, seq: Some(seq) }
    }

    /// Runs `perform` under the rule for a call whose effect is a write to the store
    /// itself (a mailbox send or receive): `perform` makes the write with
    /// [`InStore::write`], which journals the call complete in the same commit
    /// ([`keel_store::Store::journal_mailbox`]), so neither is ever durable without the
    /// other and no intent is needed. An answer made without a write (a receive that timed
    /// out empty, a full mailbox answered `would_block`) is journaled complete after it;
    /// one that leaves nothing to replay (an unknown target, a call cut off) is not.
    pub(crate) async fn journaled_in_store(
        &self,
        call: Call<'_>,
        perform: impl AsyncFnOnce(&InStore<'_>) -> Reply,
    ) -> Reply {
        let Call { live, method, params, hash, reuse: _ } = call;
        let span = self.inner.telemetry.syscall(&live.id, live.attempt, method, &params);
        let in_store = InStore {
            kernel: self,
            live,
            method,
            params: params.clone(),
            hash: hash.clone(),
            written: AtomicU64::new(0),
        };
        let reply = perform(&in_store).await;
        let written = Some(in_store.written.load(Ordering::SeqCst)).filter(|&seq| seq != 0);
        let recorded = match written {
            Some(seq) => {
                self.emit_syscall(live, seq, method, EntryStatus::Ok, json!({}));
                Ok(Some(seq))
            }
            None if journals_outcome(&reply) => self
                .record_outcome(live, method, params, hash, &reply, Usage::default(), json!({}))
                .await
                .map(Some),
            None => Ok(None),
        };
        let (reply, seq) = match recorded {
            Ok(seq) => (reply, seq),
            Err(err) => (Err(err), None),
        };
        if let Some(span) = span {
            span.end(Outcome::of(seq, reply.as_ref(), Usage::default()));
        }
        reply
    }

    /// Journals a call without an outside effect complete at once, as it came out, and
    /// reports it as a `syscall` event with `extra` fields merged in.
    #[allow(clippy::too_many_arguments, reason = "the parts of one journal entry")]
    async fn record_outcome(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
        outcome: &Reply,
        usage: Usage,
        extra: Value,
    ) -> Result<Seq, SyscallError> {
        let entry = completed_entry(live.attempt, method, params, hash, outcome, usage);
        let status = entry.status;
        let seq = self.append(live, entry).await.map_err(internal)?;
        self.emit_syscall(live, seq, method, status, extra);
        Ok(seq)
    }

    /// Journals the intent of a call with an outside effect; returns its seq.
    async fn intend(
        &self,
        live: &Arc<LiveRun>,
        method: &str,
        params: Value,
        hash: String,
    ) -> Result<Seq, SyscallError> {
        let entry = NewEntry {
            method: method.to_owned(),
            params,
            params_hash: hash,
            status: EntryStatus::Pending,
            result: None,
            error: None,
            attempt: live.attempt,
            started_at_ms: now_ms(),
            finished_at_ms: None,
            usage: Usage::default(),
        };
        self.append(live, entry).await.map_err(internal)
    }

    /// Appends `entry` to `live`'s journal, waiting out a store outage. A commit whose
    /// outcome is unknown (the connection lost under it) is resolved by reading the
    /// journal back: the entry is there (this attempt's, same method, params and start
    /// time), or the append is made again; never twice.
    async fn append(&self, live: &Arc<LiveRun>, entry: NewEntry) -> keel_store::Result<Seq> {
        let _timer = self.inner.metrics.journal_commit(crate::metrics::JournalOp::Append);
        loop {
            match self.while_current(live, || self.store().append_entry(&live.id, &entry)).await {
                Err(keel_store::Error::OutcomeUnknown { .. }) if self.is_current(live) => {
                    if let Some(landed) = self.landed(live, &entry).await? {
                        return Ok(landed.seq);
                    }
                    tracing::info!(run = %live.id, "a journal append whose commit was cut off did not land; writing it again");
                }
                outcome => return outcome,
            }
        }
    }

    /// The entry of an append whose commit was cut off, if it landed: this attempt's, with
    /// the same method, params and start time, read back from the journal.
    async fn landed(
        &self,
        live: &Arc<LiveRun>,
        entry: &NewEntry,
    ) -> keel_store::Result<Option<JournalEntry>> {
        let journal = self.while_current(live, || self.store().journal(&live.id, 0)).await?;
        Ok(journal.into_iter().rev().find(|e| {
            e.attempt == entry.attempt
                && e.method == entry.method
                && e.params_hash == entry.params_hash
                && e.started_at_ms == entry.started_at_ms
        }))
    }

    /// Records the outcome of a pending entry, with the entries of `with` after it in the
    /// same commit, and reports it as a `syscall` event. Answers the result it recorded
    /// (`record`, for a call that succeeded).
    #[allow(clippy::too_many_arguments, reason = "the parts of one completion")]
    async fn complete(
        &self,
        live: &Arc<LiveRun>,
        seq: Seq,
        method: &str,
        outcome: &Reply,
        record: Value,
        usage: Usage,
        served: bool,
        extra: Value,
        with: Vec<BufferedRead>,
    ) -> Result<Option<Value>, SyscallError> {
        let (status, result, error) = match outcome {
            Ok(_) => (EntryStatus::Ok, Some(record), None),
            Err(err) => {
                (EntryStatus::Error, None, Some(serde_json::to_value(err.to_rpc()).map_err(internal)?))
            }
        };
        let completion =
            Completion { status, result, error, finished_at_ms: now_ms(), usage, provider_served: served };
        let (entries, spans): (Vec<NewEntry>, Vec<_>) = with.into_iter().map(|r| (r.entry, r.span)).unzip();
        let timer = self.inner.metrics.journal_commit(crate::metrics::JournalOp::Complete);
        // The seqs the entries got; unknown when a cut-off commit is found to have landed.
        let appended = loop {
            let written = self
                .while_current(live, || {
                    self.store().complete_entry_with(&live.id, seq, &completion, &entries)
                })
                .await;
            match written {
                // Cut off while committing: done if the entry is no longer pending (the
                // entries written with it landed in the same commit).
                Err(keel_store::Error::OutcomeUnknown { .. }) if self.is_current(live) => {
                    let journal = self.while_current(live, || self.store().journal(&live.id, seq - 1)).await;
                    let journal = journal.map_err(internal)?;
                    if journal.first().is_some_and(|e| e.seq == seq && e.status != EntryStatus::Pending) {
                        break Vec::new();
                    }
                }
                outcome => break outcome.map_err(internal)?,
            }
        };
        drop(timer);
        for (index, (entry, span)) in entries.iter().zip(spans).enumerate() {
            if let Some((span, reply)) = span {
                span.end(Outcome::of(appended.get(index).copied(), reply.as_ref(), entry.usage));
            }
        }
        self.emit_syscall(live, seq, method, status, extra);
        Ok(completion.result)
    }

    /// Runs the journal write `write` for `live` until the store can be reached (see
    /// [`crate::outage::retry_while`]), for as long as `live` is the run's current attempt
    /// here: a stopped, ended or lost run's call does not wait forever.
    pub(crate) async fn while_current<T, F, Fut>(
        &self,
        live: &Arc<LiveRun>,
        write: F,
    ) -> keel_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = keel_store::Result<T>>,
    {
        self.retry_current(live, false, write).await
    }

    /// [`Kernel::while_current`] for a write that may safely be made twice (a patch of
    /// fields, a compare-and-set of the state): one whose commit was cut off is simply
    /// made again.
    pub(crate) async fn while_current_idempotent<T, F, Fut>(
        &self,
        live: &Arc<LiveRun>,
        write: F,
    ) -> keel_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = keel_store::Result<T>>,
    {
        self.retry_current(live, true, write).await
    }

    async fn retry_current<T, F, Fut>(
        &self,
        live: &Arc<LiveRun>,
        idempotent: bool,
        write: F,
    ) -> keel_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = keel_store::Result<T>>,
    {
        let current = || self.is_current(live) && !live.lost.load(std::sync::atomic::Ordering::SeqCst);
        crate::outage::retry_while(&live.id, current, idempotent, write).await
    }

    fn emit_syscall(&self, live: &LiveRun, seq: Seq, method: &str, status: EntryStatus, extra: Value) {
        let mut event = json!({ "seq": seq, "method": method, "status": status.as_str() });
        if let (Some(event), Value::Object(extra)) = (event.as_object_mut(), extra) {
            event.extend(extra);
        }
        self.emit(&live.id, EventKind::Syscall, event);
    }
}

/// A send (`op`) that completes the receive it claimed in its own commit (the op's
/// `receive`), then tells the receiver what it took. Spawned: the
/// receiver must hear back once the commit is made, whoever stops waiting for it. The
/// answer goes through the sender's `held_answers`, which keep it back while the sender's
/// `ipc.send` with `recv` has yet to offer its own receive.
async fn send_to_receiver(
    store: Arc<dyn keel_store::Store>,
    sender: Arc<LiveRun>,
    entry: NewEntry,
    op: MailboxOp,
    claim: Claim,
    result_of: MailboxResult,
) -> keel_store::Result<Option<(Seq, MailboxDone)>> {
    let task = tokio::spawn(async move {
        let receive_result = claim.offered().result_of;
        let written = store.journal_mailbox(&sender.id, entry, op, result_of).await;
        let handed = match &written {
            Ok(Some((_, MailboxDone::SentAndTaken { receive_seq, message, .. }))) => {
                Handed::Taken(*receive_seq, receive_result(&MailboxDone::Received(vec![message.clone()])))
            }
            Err(keel_store::Error::OutcomeUnknown { .. }) => Handed::Unknown,
            _ => Handed::NotTaken,
        };
        sender.held_answers.settle(claim, handed);
        written
    });
    task.await.unwrap_or_else(|failed| {
        Err(keel_store::Error::OutcomeUnknown {
            step: "sending to a waiting receiver",
            source: Box::new(failed),
        })
    })
}

impl InStore<'_> {
    /// Completes this receive with what a sender's claim of it came to (see
    /// `mailboxes.rs`): `Some(result)` when the send's commit journaled it (`entry` is the
    /// entry offered), `None` when the receive must go on. A commit whose outcome is
    /// unknown is read back from the journal.
    pub(crate) async fn handed(&self, entry: &NewEntry, handed: Handed) -> keel_store::Result<Option<Value>> {
        let (seq, result) = match handed {
            Handed::Taken(seq, result) => (seq, result),
            Handed::NotTaken => return Ok(None),
            Handed::Unknown => match self.kernel.landed(self.live, entry).await? {
                Some(landed) => (landed.seq, landed.result.unwrap_or(Value::Null)),
                None => return Ok(None),
            },
        };
        self.written.store(seq, Ordering::SeqCst);
        Ok(Some(result))
    }
}

/// Whether an answer made without a store write is journaled (see
/// [`Kernel::journaled_in_store`]): a result, and a refusal the agent must see again on
/// replay (`would_block`). Not an unknown target (nothing to replay), nor a call cut off.
fn journals_outcome(reply: &Reply) -> bool {
    match reply {
        Ok(_) => true,
        Err(err) => err.is(keel_protocol::rpc::ErrorKind::WouldBlock),
    }
}

/// A call whose effect is a store write, on its way to the journal with it (see
/// [`Kernel::journaled_in_store`]).
pub(crate) struct InStore<'a> {
    kernel: &'a Kernel,
    pub(crate) live: &'a Arc<LiveRun>,
    method: &'a str,
    params: Value,
    hash: String,
    /// The seq of the entry written with the call's effect (0: none yet).
    written: AtomicU64,
}

impl InStore<'_> {
    /// The call's journal entry, complete but for its result.
    pub(crate) fn entry(&self) -> NewEntry {
        completed_entry(
            self.live.attempt,
            self.method,
            self.params.clone(),
            self.hash.clone(),
            &Ok(Value::Null),
            Usage::default(),
        )
    }

    /// Makes the mailbox write `op` and journals the call complete in the same commit,
    /// its result `result_of` the outcome: the entry's seq and that result. `None` when a
    /// receive found nothing (nothing written); a refusal (`MailboxFull`, `RunNotFound`)
    /// wrote nothing either. Waits out a store outage; a commit cut off (`OutcomeUnknown`)
    /// is resolved by reading the journal back, and made again only if it did not land
    /// (then neither the entry nor the write did: they are one transaction).
    ///
    /// With `claim`, a send (`op`) also completes the receive it claimed, in its first
    /// attempt's commit, and settles the claim with what that came to (see `mailboxes.rs`).
    /// That commit is made by a task of its own, so that the receiver hears what became of
    /// its receive even when this call is dropped midway.
    pub(crate) async fn write(
        &self,
        op: MailboxOp,
        claim: Option<Claim>,
        result_of: MailboxResult,
    ) -> keel_store::Result<Option<(Seq, Value)>> {
        let (kernel, live) = (self.kernel, self.live);
        let entry = self.entry();
        let _timer = kernel.inner.metrics.journal_commit(crate::metrics::JournalOp::Append);
        let claim = std::sync::Mutex::new(claim);
        loop {
            let written = kernel
                .while_current(live, || {
                    let store = kernel.store().clone();
                    let (sender, entry, op, claim) =
                        (live.clone(), entry.clone(), op.clone(), crate::lock(&claim).take());
                    async move {
                        match (claim, op) {
                            (Some(claim), MailboxOp::Send { to, message, .. }) => {
                                let offered = claim.offered();
                                let receive = Some(Box::new(keel_store::WaitingReceive {
                                    entry: offered.entry.clone(),
                                    result_of: offered.result_of,
                                }));
                                let op = MailboxOp::Send { to, message, receive };
                                send_to_receiver(store, sender, entry, op, claim, result_of).await
                            }
                            (_, op) => store.journal_mailbox(&sender.id, entry, op, result_of).await,
                        }
                    }
                })
                .await;
            match written {
                Err(keel_store::Error::OutcomeUnknown { .. }) if kernel.is_current(live) => {
                    if let Some(landed) = kernel.landed(live, &entry).await? {
                        self.written.store(landed.seq, Ordering::SeqCst);
                        return Ok(Some((landed.seq, landed.result.unwrap_or(Value::Null))));
                    }
                    tracing::info!(run = %live.id, "a mailbox write whose commit was cut off did not land; writing it again");
                }
                Ok(Some((seq, done))) => {
                    self.written.store(seq, Ordering::SeqCst);
                    return Ok(Some((seq, result_of(&done))));
                }
                other => return other.map(|_| None),
            }
        }
    }
}
