//! Mailbox decisions every backend makes the same way: who may reach a run, whether its
//! mailbox has room, and what marks a message taken by a receive without a key. Pure;
//! the backend reads the run's tenant and the mailbox's length in its transaction.

use keel_types::RunId;

use crate::{Error, Result, Seq};

/// A run may be reached (sent to, subscribed) only by its own tenant. Another tenant's
/// run answers exactly as a missing one (`owner` `None`): `RunNotFound`, so a tenant
/// cannot learn that another tenant's run exists.
pub fn check_owner(run: &RunId, owner: Option<&str>, tenant: &str) -> Result<()> {
    if owner != Some(tenant) {
        return Err(Error::RunNotFound(run.clone()));
    }
    Ok(())
}

/// A send finds room only while the mailbox holds fewer than `capacity` undelivered
/// messages; otherwise `MailboxFull`, and the backend writes nothing.
pub fn check_room(run: &RunId, undelivered: u64, capacity: u64) -> Result<()> {
    if undelivered >= capacity {
        return Err(Error::MailboxFull { run: run.clone(), capacity });
    }
    Ok(())
}

/// The receive key stored on a message taken by a receive without a key: unique per
/// message, and no caller's key can equal it (keys never start with U+0001).
pub fn delivered_marker(seq: Seq) -> String {
    format!("\u{1}delivered:{seq}")
}

/// How many of the oldest undelivered messages, whose bodies are `sizes` bytes of JSON
/// text (oldest first), a receive of up to `max` takes: the first always, then each
/// next while the bodies past the first come to at most `max_bytes` in all.
pub fn batch_len(sizes: impl IntoIterator<Item = usize>, max: usize, max_bytes: usize) -> usize {
    let mut taken = 0;
    let mut bytes = 0usize;
    for size in sizes.into_iter().take(max.max(1)) {
        if taken > 0 {
            bytes = bytes.saturating_add(size);
            if bytes > max_bytes {
                break;
            }
        }
        taken += 1;
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        RunId::parse("run_00000000000000000000000001").unwrap()
    }

    #[test]
    fn another_tenants_run_is_as_missing_as_no_run() {
        assert!(check_owner(&run(), Some("a"), "a").is_ok());
        assert!(matches!(check_owner(&run(), Some("b"), "a"), Err(Error::RunNotFound(id)) if id == run()));
        assert!(matches!(check_owner(&run(), None, "a"), Err(Error::RunNotFound(id)) if id == run()));
    }

    #[test]
    fn a_mailbox_is_full_at_its_capacity() {
        assert!(check_room(&run(), 1, 2).is_ok());
        assert!(matches!(check_room(&run(), 2, 2), Err(Error::MailboxFull { capacity: 2, .. })));
        assert!(matches!(check_room(&run(), 0, 0), Err(Error::MailboxFull { capacity: 0, .. })));
    }

    #[test]
    fn a_batch_takes_its_first_message_whatever_its_size_then_what_fits() {
        assert_eq!(batch_len([], 5, 10), 0);
        assert_eq!(batch_len([100], 5, 10), 1);
        assert_eq!(batch_len([100, 4, 6, 1], 5, 10), 3);
        assert_eq!(batch_len([1, 1, 1, 1, 1, 1], 4, 100), 4);
        assert_eq!(batch_len([1, 1], 0, 100), 1, "a receive takes one at least");
        assert_eq!(batch_len([1, usize::MAX, 1], 3, 10), 1);
    }

    #[test]
    fn delivered_markers_are_unique_and_unlike_keys() {
        assert_eq!(delivered_marker(7), "\u{1}delivered:7");
        assert_ne!(delivered_marker(1), delivered_marker(11));
    }
}
