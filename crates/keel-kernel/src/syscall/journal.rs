//! The journaling rule, in one place. A call with an outside effect has its intent made
//! durable before the effect and its result durable before the reply; a call without one
//! is performed and then journaled complete in one commit. Method families describe
//! their effect and say which rule applies ([`Journaling`]); only this module writes
//! journal entries for them, so no family can get the order wrong.

use std::future::Future;
use std::sync::Arc;

use keel_protocol::EventKind;
use keel_store::{Completion, NewEntry, Seq};
use keel_types::{EntryStatus, Usage};
use serde_json::{Value, json};

use super::{Reply, SyscallError, internal};
use crate::run::LiveRun;
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
    /// Entries journaled in the same group commit as this call's result (a `code.exec`
    /// program's reads).
    pub(crate) with: Vec<NewEntry>,
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

impl Kernel {
    /// Runs `effect` under the journaling rule `how`. The effect never touches the
    /// journal; it gets the seq of its intent (`None` for a call journaled after it).
    pub(crate) async fn journaled<F, Fut>(&self, call: Call<'_>, how: Journaling, effect: F) -> Journaled
    where
        F: FnOnce(Option<Seq>) -> Fut,
        Fut: Future<Output = Effect>,
    {
        let Call { live, method, params, hash, reuse } = call;
        if let Journaling::Complete { failures } = how {
            let done = effect(None).await;
            if done.reply.is_err() && !failures {
                return Journaled { reply: done.reply, seq: None };
            }
            let recorded =
                self.record_outcome(live, method, params, hash, &done.reply, done.usage, done.event).await;
            return match recorded {
                Ok(seq) => Journaled { reply: done.reply, seq: Some(seq) },
                Err(err) => Journaled { reply: Err(err), seq: None },
            };
        }
        let seq = match reuse {
            Some(seq) => seq,
            None => match self.intend(live, method, params, hash).await {
                Ok(seq) => seq,
                Err(err) => return Journaled { reply: Err(err), seq: None },
            },
        };
        let done = effect(Some(seq)).await;
        let cancelled = matches!(&done.reply, Err(err) if err.is(keel_protocol::rpc::ErrorKind::Cancelled));
        if how == Journaling::IntentAnsweredElsewhere || cancelled {
            return Journaled { reply: done.reply, seq: Some(seq) };
        }
        let Effect { reply, record, usage, served, event, with } = done;
        let record = record.unwrap_or_else(|| reply.clone().unwrap_or(Value::Null));
        // Entries that go with the result are submitted together with it, so the store's
        // group commit makes them durable in one go, before the reply.
        let appends = with.into_iter().map(|entry| self.store().append_entry(&live.id, entry));
        let (appended, completed) = tokio::join!(
            futures_util::future::join_all(appends),
            self.complete(live, seq, method, &reply, record, usage, served, event)
        );
        let written =
            completed.and_then(|()| appended.into_iter().try_for_each(|r| r.map(drop).map_err(internal)));
        match written {
            Ok(()) => Journaled { reply, seq: Some(seq) },
            Err(err) => Journaled { reply: Err(err), seq: Some(seq) },
        }
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
        let seq = self.store().append_entry(&live.id, entry).await.map_err(internal)?;
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
        self.store().append_entry(&live.id, entry).await.map_err(internal)
    }

    /// Records the outcome of a pending entry and reports it as a `syscall` event.
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
    ) -> Result<(), SyscallError> {
        let (status, result, error) = match outcome {
            Ok(_) => (EntryStatus::Ok, Some(record), None),
            Err(err) => {
                (EntryStatus::Error, None, Some(serde_json::to_value(err.to_rpc()).map_err(internal)?))
            }
        };
        let completion =
            Completion { status, result, error, finished_at_ms: now_ms(), usage, provider_served: served };
        self.store().complete_entry(&live.id, seq, completion).await.map_err(internal)?;
        self.emit_syscall(live, seq, method, status, extra);
        Ok(())
    }

    fn emit_syscall(&self, live: &LiveRun, seq: Seq, method: &str, status: EntryStatus, extra: Value) {
        let mut event = json!({ "seq": seq, "method": method, "status": status.as_str() });
        if let (Some(event), Value::Object(extra)) = (event.as_object_mut(), extra) {
            event.extend(extra);
        }
        self.emit(&live.id, EventKind::Syscall, event);
    }
}
