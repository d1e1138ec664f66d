//! Mailbox wake-ups: who waits on which run's mailbox (a receiver for a message, senders
//! for room), so a send wakes that mailbox's receiver and a receive wakes one sender, with
//! no kernel-wide herd. The mailboxes themselves are in the store.
//!
//! A receiver waiting on an empty mailbox also offers its receive to senders
//! ([`MailboxWait::offer`]): a send that claims it ([`Mailboxes::claim`]) completes the
//! receive in its own commit, journaling both runs' steps at once, and tells the receiver
//! what it took. A claimed receive is the sender's until the sender settles it: the
//! receiver waits for that answer, however long its own timeout, so the message a send
//! wrote into the receiver's journal is the one the receiver answers with.

use keel_store::{MailboxResult, NewEntry, Seq};
use keel_types::RunId;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Wake-ups for the mailboxes somebody is waiting on, created on first wait and dropped
/// with the last waiter, so an idle or swapped-out run costs nothing here.
#[derive(Default)]
pub(crate) struct Mailboxes {
    waits: Mutex<HashMap<RunId, Arc<MailboxWaits>>>,
    /// Numbers offers, so a receiver withdraws only its own.
    offers: AtomicU64,
}

impl Mailboxes {
    pub(crate) fn wait(&self, run: &RunId) -> MailboxWait<'_> {
        let waits = crate::lock(&self.waits).entry(run.clone()).or_default().clone();
        MailboxWait { mailboxes: self, run: run.clone(), waits }
    }

    /// A message was put in `run`'s mailbox.
    pub(crate) fn arrived(&self, run: &RunId) {
        if let Some(waits) = crate::lock(&self.waits).get(run) {
            waits.arrived.notify_waiters();
        }
    }

    /// `count` messages were taken from `run`'s mailbox: room for as many more, so as
    /// many senders waiting for room wake.
    pub(crate) fn taken(&self, run: &RunId, count: usize) {
        if let Some(waits) = crate::lock(&self.waits).get(run) {
            for _ in 0..count {
                waits.room.notify_one();
            }
        }
    }

    /// Whether a receive waits on `run`'s mailbox on offer to senders.
    pub(crate) fn on_offer(&self, run: &RunId) -> bool {
        let waits = crate::lock(&self.waits).get(run).cloned();
        waits.is_some_and(|waits| crate::lock(&waits.offered).is_some())
    }

    /// Takes over the receive waiting on `run`'s mailbox, if one is offered and its run can
    /// take a message now (its offer's `hold`, called with the offer held: no other sender
    /// can claim it meanwhile). The claim must be settled with what the send came to.
    pub(crate) fn claim(&self, run: &RunId) -> Option<Claim> {
        let waits = crate::lock(&self.waits).get(run)?.clone();
        let mut offered = crate::lock(&waits.offered);
        let hold = (offered.as_ref()?.hold)()?;
        offered.take().map(|offer| Claim { offer: Some(offer), _hold: hold })
    }
}

/// What keeps a receiving run from moving on (being swapped out, say) while a send's
/// claim of its receive is out; dropped once the claim is settled.
pub(crate) type Hold = Box<dyn Send>;

/// Whether an offered receive's run can take a message now, and if so its [`Hold`].
pub(crate) type HoldFn = Box<dyn Fn() -> Option<Hold> + Send>;

/// A receive on offer to senders (see the module doc).
pub(crate) struct OfferedReceive {
    id: u64,
    /// The receive's journal entry, complete but for its result.
    pub(crate) entry: NewEntry,
    /// How its result is made from what a send took for it.
    pub(crate) result_of: MailboxResult,
    hold: HoldFn,
    answer: oneshot::Sender<Handed>,
}

/// What became of a claimed receive.
#[derive(Debug)]
pub(crate) enum Handed {
    /// The send's commit completed it: its entry's seq, and its result.
    Taken(Seq, Value),
    /// The send took nothing for it (refused, or it made the send alone): the receive
    /// goes on as if it had not been offered.
    NotTaken,
    /// The send's commit was cut off (or its task failed): whether the receive's entry
    /// landed must be read back from the journal.
    Unknown,
}

/// A sender's hold on a claimed receive; dropped unsettled, it answers `Unknown`.
pub(crate) struct Claim {
    offer: Option<OfferedReceive>,
    _hold: Hold,
}

impl Claim {
    pub(crate) fn offered(&self) -> &OfferedReceive {
        self.offer.as_ref().expect("a claim holds its offer until settled")
    }

    pub(crate) fn settle(mut self, handed: Handed) {
        self.answer(handed);
    }

    fn answer(&mut self, handed: Handed) {
        if let Some(offer) = self.offer.take() {
            let _ = offer.answer.send(handed);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.answer(Handed::Unknown);
    }
}

/// The answers to a run's claims held back until the run's own receive is on offer
/// (`ipc.send` with `recv`): the peer the send woke hears of it only once its answer can
/// complete that receive, however quick the peer.
#[derive(Default)]
pub(crate) struct HeldAnswers(Mutex<Option<Vec<(Claim, Handed)>>>);

impl HeldAnswers {
    /// Holds back the answers of claims settled from now until [`HeldAnswers::release`],
    /// called at the latest when the guard drops.
    pub(crate) fn hold(&self) -> Holding<'_> {
        crate::lock(&self.0).get_or_insert_with(Vec::new);
        Holding(self)
    }

    /// Settles `claim` with `handed`: at once, unless answers are held back.
    pub(crate) fn settle(&self, claim: Claim, handed: Handed) {
        let mut held = crate::lock(&self.0);
        match held.as_mut() {
            Some(held) => held.push((claim, handed)),
            None => {
                drop(held);
                claim.settle(handed);
            }
        }
    }

    /// Settles every answer held back, and holds no more.
    pub(crate) fn release(&self) {
        let held = crate::lock(&self.0).take();
        for (claim, handed) in held.into_iter().flatten() {
            claim.settle(handed);
        }
    }
}

/// Answers held back while it lives (see [`HeldAnswers::hold`]).
pub(crate) struct Holding<'a>(&'a HeldAnswers);

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A receiver's offer (see [`MailboxWait::offer`]); dropped, it is withdrawn if unclaimed.
pub(crate) struct Offer {
    id: u64,
    waits: Arc<MailboxWaits>,
    answer: oneshot::Receiver<Handed>,
}

impl Offer {
    /// Waits for `wake` (a message's notification, the poll's timeout) or a sender's
    /// answer, then withdraws the offer: `None` if no sender claimed it, else what the
    /// claiming send came to (waited for, however long `wake` was).
    pub(crate) async fn wait_then_withdraw(mut self, wake: impl Future) -> Option<Handed> {
        tokio::select! {
            answer = &mut self.answer => return Some(answer.unwrap_or(Handed::Unknown)),
            _ = wake => {}
        }
        if self.take_back() {
            return None;
        }
        Some((&mut self.answer).await.unwrap_or(Handed::Unknown))
    }

    fn take_back(&self) -> bool {
        let mut offered = crate::lock(&self.waits.offered);
        if offered.as_ref().is_some_and(|offer| offer.id == self.id) {
            *offered = None;
            return true;
        }
        false
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        self.take_back();
    }
}

#[derive(Default)]
pub(crate) struct MailboxWaits {
    /// Fired by every send to the mailbox: its receiver looks again.
    pub(crate) arrived: tokio::sync::Notify,
    /// Fired once per message taken: one sender waiting for room looks again.
    pub(crate) room: tokio::sync::Notify,
    /// The receive waiting here that a send may complete (at most one at a time).
    offered: Mutex<Option<OfferedReceive>>,
}

/// A waiter's hold on a mailbox's wake-ups; the last one to go removes the entry.
pub(crate) struct MailboxWait<'a> {
    mailboxes: &'a Mailboxes,
    pub(crate) run: RunId,
    pub(crate) waits: Arc<MailboxWaits>,
}

impl MailboxWait<'_> {
    /// Offers a receive (`entry`, its journal entry but for the result, which `result_of`
    /// makes) to senders, `hold` saying when its run can take a message; `None` when
    /// another receive of the mailbox is on offer already.
    pub(crate) fn offer(&self, entry: NewEntry, result_of: MailboxResult, hold: HoldFn) -> Option<Offer> {
        let mut offered = crate::lock(&self.waits.offered);
        if offered.is_some() {
            return None;
        }
        let id = self.mailboxes.offers.fetch_add(1, Ordering::Relaxed);
        let (answer, receiver) = oneshot::channel();
        *offered = Some(OfferedReceive { id, entry, result_of, hold, answer });
        Some(Offer { id, waits: self.waits.clone(), answer: receiver })
    }
}

impl Drop for MailboxWait<'_> {
    fn drop(&mut self) {
        let mut waits = crate::lock(&self.mailboxes.waits);
        // The map's reference and this one: nobody else waits on this mailbox.
        if Arc::strong_count(&self.waits) == 2 {
            waits.remove(&self.run);
        }
    }
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

/// The most undelivered messages a mailbox holds unless `KEEL_MAILBOX_CAPACITY` says
/// otherwise.
pub const DEFAULT_MAILBOX_CAPACITY: u64 = 1000;

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{EntryStatus, Usage};
    use std::sync::atomic::AtomicBool;

    fn entry() -> NewEntry {
        NewEntry {
            method: "ipc.recv".to_owned(),
            params: serde_json::json!({}),
            params_hash: "h".to_owned(),
            status: EntryStatus::Ok,
            result: None,
            error: None,
            attempt: 1,
            started_at_ms: 1,
            finished_at_ms: Some(1),
            usage: Usage::default(),
        }
    }

    fn no_result(_: &keel_store::MailboxDone) -> Value {
        Value::Null
    }

    /// A hold that counts how many claims are out, as a run's calls in flight are counted.
    fn counted(out: &Arc<AtomicU64>, usable: &Arc<AtomicBool>) -> HoldFn {
        struct Held(Arc<AtomicU64>);
        impl Drop for Held {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let (out, usable) = (out.clone(), usable.clone());
        Box::new(move || {
            out.fetch_add(1, Ordering::SeqCst);
            let held = Held(out.clone());
            usable.load(Ordering::SeqCst).then(|| Box::new(held) as Hold)
        })
    }

    /// A receive that took three messages wakes three senders waiting for room (and a
    /// fourth only with a fourth message taken).
    #[test]
    fn senders_waiting_for_room_wake_one_per_message_taken() {
        use futures_util::FutureExt;
        let mailboxes = Mailboxes::default();
        let run = RunId::generate(1);
        let waits: Vec<_> = (0..4).map(|_| mailboxes.wait(&run)).collect();
        let mut senders: Vec<_> = waits.iter().map(|wait| Box::pin(wait.waits.room.notified())).collect();
        for sender in &mut senders {
            sender.as_mut().enable();
        }
        mailboxes.taken(&run, 3);
        let woken: Vec<bool> =
            senders.iter_mut().map(|sender| sender.as_mut().now_or_never().is_some()).collect();
        assert_eq!(woken, [true, true, true, false]);
        mailboxes.taken(&run, 1);
        assert!(senders[3].as_mut().now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_claimed_offer_is_answered_by_its_sender_and_held_until_settled() {
        let mailboxes = Mailboxes::default();
        let run = RunId::generate(1);
        let mailbox = mailboxes.wait(&run);
        let (out, usable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(true)));
        let offer = mailbox.offer(entry(), no_result, counted(&out, &usable)).expect("offered");
        assert!(
            mailbox.offer(entry(), no_result, counted(&out, &usable)).is_none(),
            "one receive on offer at a time"
        );
        assert!(mailboxes.on_offer(&run));
        let claim = mailboxes.claim(&run).expect("claimed");
        assert_eq!(claim.offered().entry.method, "ipc.recv");
        assert!(!mailboxes.on_offer(&run) && mailboxes.claim(&run).is_none(), "claimed once");
        assert_eq!(out.load(Ordering::SeqCst), 1, "the claim holds its run");
        // The receiver's own wake-up comes first: it still waits for the sender's answer.
        let answered = tokio::spawn(offer.wait_then_withdraw(std::future::ready(())));
        tokio::task::yield_now().await;
        claim.settle(Handed::Taken(7, serde_json::json!({"message": "m"})));
        assert!(matches!(answered.await.unwrap(), Some(Handed::Taken(7, _))));
        assert_eq!(out.load(Ordering::SeqCst), 0, "released once settled");
    }

    #[tokio::test]
    async fn an_unclaimed_offer_is_withdrawn_and_an_unusable_run_is_not_claimed() {
        let mailboxes = Mailboxes::default();
        let run = RunId::generate(1);
        let mailbox = mailboxes.wait(&run);
        let (out, usable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let offer = mailbox.offer(entry(), no_result, counted(&out, &usable)).expect("offered");
        assert!(mailboxes.claim(&run).is_none(), "a run that cannot take a message now");
        assert_eq!(out.load(Ordering::SeqCst), 0, "and nothing held for it");
        assert!(mailboxes.on_offer(&run), "the offer stays");
        assert!(offer.wait_then_withdraw(std::future::ready(())).await.is_none());
        assert!(!mailboxes.on_offer(&run), "withdrawn");
        usable.store(true, Ordering::SeqCst);
        assert!(mailboxes.claim(&run).is_none(), "nothing to claim");
        // A dropped offer is withdrawn too.
        drop(mailbox.offer(entry(), no_result, counted(&out, &usable)));
        assert!(!mailboxes.on_offer(&run));
    }

    /// While a run's answers are held (its `ipc.send` with `recv` has yet to offer its
    /// receive), a claim it settles answers its receiver only on release, or when the
    /// hold's guard drops; otherwise at once.
    #[tokio::test]
    async fn held_answers_go_out_on_release_or_when_the_hold_ends() {
        use futures_util::FutureExt;
        let mailboxes = Mailboxes::default();
        let (out, usable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(true)));
        let held = HeldAnswers::default();
        let offered = |run: &RunId| {
            let mailbox = mailboxes.wait(run);
            let offer = mailbox.offer(entry(), no_result, counted(&out, &usable)).expect("offered");
            (mailbox, offer, mailboxes.claim(run).expect("claimed"))
        };
        let taken = || Handed::Taken(1, serde_json::json!({"message": "m"}));

        let (run, other) = (RunId::generate(1), RunId::generate(1));
        let (_mailbox, offer, claim) = offered(&run);
        let (_other_mailbox, other_offer, other_claim) = offered(&other);
        let mut answer = Box::pin(offer.wait_then_withdraw(std::future::pending::<()>()));
        let mut other_answer = Box::pin(other_offer.wait_then_withdraw(std::future::pending::<()>()));
        let holding = held.hold();
        held.settle(claim, taken());
        held.settle(other_claim, taken());
        assert!(answer.as_mut().now_or_never().is_none(), "held back");
        assert_eq!(out.load(Ordering::SeqCst), 2, "the claims still hold their runs");
        held.release();
        assert!(matches!(answer.await, Some(Handed::Taken(1, _))));
        assert!(matches!(other_answer.as_mut().now_or_never(), Some(Some(Handed::Taken(1, _)))));
        assert_eq!(out.load(Ordering::SeqCst), 0);

        // Released, the hold holds nothing more: an answer goes out at once.
        let (_mailbox, offer, claim) = offered(&run);
        held.settle(claim, taken());
        assert!(matches!(
            offer.wait_then_withdraw(std::future::pending::<()>()).await,
            Some(Handed::Taken(..))
        ));
        drop(holding);

        // A hold that ends unreleased (its call dropped midway) lets its answers go.
        let (_mailbox, offer, claim) = offered(&run);
        let holding = held.hold();
        held.settle(claim, Handed::NotTaken);
        drop(holding);
        assert!(matches!(
            offer.wait_then_withdraw(std::future::pending::<()>()).await,
            Some(Handed::NotTaken)
        ));
    }

    #[tokio::test]
    async fn a_claim_dropped_unsettled_answers_unknown() {
        let mailboxes = Mailboxes::default();
        let run = RunId::generate(1);
        let mailbox = mailboxes.wait(&run);
        let (out, usable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(true)));
        let offer = mailbox.offer(entry(), no_result, counted(&out, &usable)).expect("offered");
        drop(mailboxes.claim(&run).expect("claimed"));
        assert!(matches!(
            offer.wait_then_withdraw(std::future::pending::<()>()).await,
            Some(Handed::Unknown)
        ));
        assert_eq!(out.load(Ordering::SeqCst), 0);
    }
}
