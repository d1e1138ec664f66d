//! `ipc.recv`'s wait: its own take of the oldest message, or, while the mailbox is empty,
//! its receive on offer to senders (`crate::mailboxes`): the first send completes it in its
//! own commit and answers here.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_protocol::rpc::ErrorKind;
use keel_store::{MailboxDone, MailboxOp, MailboxResult};
use serde_json::{Value, json};

use super::{PARK_AFTER, POLL, mailbox_many_result, mailbox_result};
use crate::Kernel;
use crate::mailboxes::{Hold, HoldFn};
use crate::run::LiveRun;
use crate::syscall::{InStore, SyscallError, internal};

/// How a receive takes its message.
#[derive(Clone, Copy)]
pub(super) enum Take<'a> {
    /// Marked with the key of its journaled intent (a receive retried after a crash).
    Keyed(&'a str),
    /// In the same commit as the call's journal entry.
    Journaled(&'a InStore<'a>),
}

/// A call in flight of a run that is no durable wait, counted while it lives: no swap-out
/// of the run begins under it (see `run/swap.rs`).
struct InFlight(Arc<LiveRun>);

impl InFlight {
    /// Counts a call in flight unless a swap-out of the run has begun. Counted before the
    /// swap-out is looked for, as the swapper sets its flag before it counts the calls, so
    /// one of the two always sees the other.
    fn unless_swapping(live: &Arc<LiveRun>) -> Option<InFlight> {
        live.inflight.fetch_add(1, Ordering::SeqCst);
        let held = InFlight(live.clone());
        (!live.swapping.load(Ordering::SeqCst)).then_some(held)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Kernel {
    /// Takes the run's next message (with `max`, up to that many of its oldest messages),
    /// waiting up to `timeout_ms` (forever when `None`) for one.
    pub(super) async fn mailbox_recv(
        &self,
        live: &Arc<LiveRun>,
        timeout_ms: Option<u64>,
        max: Option<usize>,
        take: Take<'_>,
    ) -> Result<Value, SyscallError> {
        let result_of: MailboxResult = if max.is_some() { mailbox_many_result } else { mailbox_result };
        let deadline = timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        let _waiting = crate::swap::Busy::new(&live.waiting_calls);
        // A wait that lasts shows as `waiting(message)` (and may be swapped out); a quick
        // exchange changes no state (each change is a durable write).
        let long = timeout_ms.is_none_or(|ms| ms >= 1000);
        let park_after = tokio::time::Instant::now() + PARK_AFTER;
        let mut parked = false;
        let mailbox = self.inner.mailboxes.wait(&live.id);
        let journaled = match take {
            Take::Journaled(journal) if self.store().completes_waiting_receives() => Some(journal),
            _ => None,
        };
        let mut first = true;
        loop {
            let mut notified = pin!(mailbox.waits.arrived.notified());
            notified.as_mut().enable();
            // While the mailbox is empty, a journaled receive is on offer to senders: the
            // first send completes it in its own commit and answers here (see `Mailboxes`).
            // A run whose receives wait offers first and looks with a read (which does not
            // queue behind commits in flight, as a take would, while senders cannot see
            // the offer); one that finds messages waiting takes first. A message sent
            // before the offer is seen by the look or the take; one sent after either,
            // without the offer, wakes `notified`.
            let offer = || {
                let entry = journaled?.entry();
                let offered = mailbox.offer(entry.clone(), result_of, self.receiver_hold(live));
                // Answers held back for this receive (`ipc.send` with `recv`) go out now
                // that a reply can complete it.
                live.held_answers.release();
                offered.map(|offer| (entry, offer))
            };
            let mut offered = None;
            let mut received = None;
            let offer_first = first && live.receives_wait.load(Ordering::Relaxed);
            first = false;
            if let (true, Some(journal)) = (offer_first, journaled)
                && let Some((entry, on_offer)) = offer()
            {
                if self.store().mailbox_len(&live.id).await.is_ok_and(|n| n == 0) {
                    offered = Some((entry, on_offer));
                } else if let Some(handed) = on_offer.wait_then_withdraw(std::future::ready(())).await {
                    received = journal.handed(&entry, handed).await.map_err(internal)?;
                }
            }
            if received.is_none() && offered.is_none() {
                received = self.take_message(live, take, max, result_of).await?;
                if received.is_none() {
                    offered = offer();
                }
            }
            live.receives_wait.store(received.is_none(), Ordering::Relaxed);
            // Nor are they held while this receive waits without an offer (another receive
            // of the run's is on offer) or once it has a message.
            live.held_answers.release();
            if received.is_none() && long && !parked && tokio::time::Instant::now() >= park_after {
                self.park_run(live, keel_types::WaitReason::Message).await;
                parked = true;
            }
            if let Some(received) = received {
                return Ok(self.received(live, parked, received).await);
            }
            let now = tokio::time::Instant::now();
            let mut wake = now + POLL;
            if long && !parked {
                wake = wake.min(park_after);
            }
            let stop = if !self.is_current(live) {
                Some(Err(SyscallError::new(
                    ErrorKind::Cancelled,
                    "ipc.recv: the run is ending; no message will come",
                )))
            } else if deadline.is_some_and(|deadline| now >= deadline) {
                Some(Ok(match max {
                    Some(_) => json!({ "messages": [] }),
                    None => json!({ "message": null }),
                }))
            } else {
                None
            };
            wake = deadline.map_or(wake, |deadline| wake.min(deadline));
            let wait = async {
                if stop.is_none() {
                    let _ = tokio::time::timeout_at(wake, notified).await;
                }
            };
            // An offer is withdrawn before the receive ends: one a sender claimed is
            // answered with what the send took, which its journal now holds.
            match (offered, journaled) {
                (Some((entry, offer)), Some(journal)) => {
                    if let Some(handed) = offer.wait_then_withdraw(wait).await
                        && let Some(received) = journal.handed(&entry, handed).await.map_err(internal)?
                    {
                        return Ok(self.received(live, parked, received).await);
                    }
                }
                _ => wait.await,
            }
            if let Some(stop) = stop {
                if parked && stop.is_ok() {
                    self.wake_run(live, keel_types::WaitReason::Message).await;
                }
                return stop;
            }
        }
    }

    /// When a send may claim the run's offered receive (see `Mailboxes::claim`): while the
    /// run is current and not being swapped out or taken over. The claim then counts as a
    /// call of the run in flight ([`InFlight`]), so no swap-out begins under it.
    fn receiver_hold(&self, live: &Arc<LiveRun>) -> HoldFn {
        let (kernel, live) = (self.clone(), live.clone());
        Box::new(move || {
            let held = InFlight::unless_swapping(&live)?;
            let usable = kernel.is_current(&live) && !live.lost.load(Ordering::SeqCst);
            usable.then(|| Box::new(held) as Hold)
        })
    }

    /// A receive's own take of its oldest message (up to `max` of them), if there is one;
    /// its result made by `result_of`.
    async fn take_message(
        &self,
        live: &Arc<LiveRun>,
        take: Take<'_>,
        max: Option<usize>,
        result_of: MailboxResult,
    ) -> Result<Option<Value>, SyscallError> {
        Ok(match take {
            // A receive whose intent a crash left pending (only a kernel before the
            // one-commit rule wrote those, and none with `max`): one message, by its key.
            Take::Keyed(key) => self
                .store()
                .mailbox_receive(&live.id, Some(key))
                .await
                .map_err(internal)?
                .map(|message| result_of(&MailboxDone::Received(vec![message]))),
            Take::Journaled(journal) => {
                // Counted as a send's claim is (`receiver_hold`): no swap-out begins while
                // the take may commit, so a run is never swapped out as waiting for a
                // message its journal already holds (with nothing left in its mailbox to
                // wake it). One already begun takes nothing. (A run that is stopping still
                // takes: its agent receives the stop signal in its grace period.)
                let Some(_held) = InFlight::unless_swapping(live) else { return Ok(None) };
                journal
                    .write(MailboxOp::Receive { max: max.unwrap_or(1) }, None, result_of)
                    .await
                    .map_err(internal)?
                    .map(|(_, r)| r)
            }
        })
    }

    /// A receive's messages taken: the run waits no more, and as many senders waiting for
    /// room in its mailbox wake (one on another node finds the room at its next poll: a
    /// notice per message received would cost a database round trip on every receive).
    async fn received(&self, live: &Arc<LiveRun>, parked: bool, received: Value) -> Value {
        if parked {
            self.wake_run(live, keel_types::WaitReason::Message).await;
        }
        let count = received.get("messages").and_then(Value::as_array).map_or(1, Vec::len);
        self.inner.mailboxes.taken(&live.id, count);
        received
    }
}
