//! Mailbox decisions every backend makes the same way: who may reach a run, whether its
//! mailbox has room, what marks a message taken by a receive without a key, and how many
//! messages a receive of many takes. Pure; the backend reads the run's tenant, the
//! mailbox's length and its oldest messages in its transaction.

use keel_types::RunId;

use crate::{Error, MailboxMessage, RECEIVE_BATCH_BYTES, Result, Seq};

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

/// Cuts `oldest` (a mailbox's oldest undelivered messages, oldest first, read up to
/// `max`) to what a receive of up to `max` takes (see [`batch_len`]), measuring bodies
/// only when there are two or more.
pub fn fit_batch(oldest: &mut Vec<MailboxMessage>, max: usize) {
    if oldest.len() > 1 {
        let sizes: Vec<usize> = oldest.iter().map(|m| json_len(&m.message)).collect();
        oldest.truncate(batch_len(sizes, max, RECEIVE_BATCH_BYTES));
    }
}

/// The length of `value` as JSON text, counted without building the text.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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
    fn a_body_is_measured_as_its_json_text() {
        for value in [serde_json::json!("x"), serde_json::json!({"a": [1, "é"]}), serde_json::Value::Null] {
            assert_eq!(json_len(&value), value.to_string().len());
        }
    }

    #[test]
    fn delivered_markers_are_unique_and_unlike_keys() {
        assert_eq!(delivered_marker(7), "\u{1}delivered:7");
        assert_ne!(delivered_marker(1), delivered_marker(11));
    }
}
