//! Mailbox wake-ups: who waits on which run's mailbox (a receiver for a message, senders
//! for room), so a send wakes that mailbox's receiver and a receive wakes one sender, with
//! no kernel-wide herd. The mailboxes themselves are in the store.

use keel_types::RunId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Wake-ups for the mailboxes somebody is waiting on, created on first wait and dropped
/// with the last waiter, so an idle or swapped-out run costs nothing here.
#[derive(Default)]
pub(crate) struct Mailboxes {
    waits: Mutex<HashMap<RunId, Arc<MailboxWaits>>>,
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

    /// A message was taken from `run`'s mailbox: room for one more.
    pub(crate) fn taken(&self, run: &RunId) {
        if let Some(waits) = crate::lock(&self.waits).get(run) {
            waits.room.notify_one();
        }
    }
}

#[derive(Default)]
pub(crate) struct MailboxWaits {
    /// Fired by every send to the mailbox: its receiver looks again.
    pub(crate) arrived: tokio::sync::Notify,
    /// Fired once per message taken: one sender waiting for room looks again.
    pub(crate) room: tokio::sync::Notify,
}

/// A waiter's hold on a mailbox's wake-ups; the last one to go removes the entry.
pub(crate) struct MailboxWait<'a> {
    mailboxes: &'a Mailboxes,
    pub(crate) run: RunId,
    pub(crate) waits: Arc<MailboxWaits>,
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
