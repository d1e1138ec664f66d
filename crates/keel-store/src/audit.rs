//! Verifying the audit log's hash chain, for every backend: a walk over the entries in
//! seq order that stops at the first one that does not hold, then compares the end with
//! the stored head. Pure; the backend streams the rows and reads the head.

use keel_core::audit::{GENESIS, entry_hash};

use crate::{AuditBreak, AuditEntry, AuditVerify, Seq};

/// The state of a verify walk: how many entries held and the hash of the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditWalk {
    checked: u64,
    prev: String,
}

impl Default for AuditWalk {
    fn default() -> AuditWalk {
        AuditWalk { checked: 0, prev: GENESIS.to_owned() }
    }
}

impl AuditWalk {
    /// Checks the next row in seq order: `seq` as stored (a signed integer column), and
    /// `decode` giving the entry or, in words, why it cannot be read (called only when the
    /// seq is the expected one). `Err` is the verdict on a broken chain: stop the walk.
    pub fn check(
        &mut self,
        seq: i64,
        decode: impl FnOnce() -> Result<AuditEntry, String>,
    ) -> Result<(), AuditVerify> {
        let expected = self.checked + 1;
        let expected_stored = i64::try_from(expected).unwrap_or(i64::MAX);
        let checked = self.checked;
        if seq != expected_stored {
            let reason = if seq > expected_stored {
                format!("entry {expected} is missing: the entry after {checked} is numbered {seq}")
            } else {
                format!("entry {seq} is out of place: expected entry {expected}")
            };
            return Err(self.broken(expected, reason));
        }
        let entry = match decode() {
            Ok(entry) => entry,
            Err(problem) => return Err(self.broken(expected, format!("unreadable: {problem}"))),
        };
        if entry.prev_hash != self.prev {
            let reason = format!(
                "entry {expected} does not link to the entry before it (its prev_hash is {}, the chain \
                 says {}): an entry was removed, inserted or reordered",
                entry.prev_hash, self.prev
            );
            return Err(self.broken(expected, reason));
        }
        let computed = entry_hash(&self.prev, expected, &entry.record.canonical_json());
        if computed != entry.hash {
            let reason = format!(
                "entry {expected} was modified: its content hashes to {computed}, not to its stored hash {}",
                entry.hash
            );
            return Err(self.broken(expected, reason));
        }
        self.checked = expected;
        self.prev = entry.hash;
        Ok(())
    }

    /// The verdict once every row held: the log's end must be the stored head (the last
    /// seq and its hash; `None` when the backend has none).
    pub fn finish(self, head: Option<(Seq, String)>) -> AuditVerify {
        let AuditWalk { checked, prev } = self;
        let reason = match head {
            None if checked == 0 => None,
            None => {
                Some((checked, format!("the audit head is missing although the log holds {checked} entries")))
            }
            Some((head_seq, _)) if head_seq > checked => Some((
                checked + 1,
                format!(
                    "entries {} to {head_seq} were removed: the log ends at entry {checked} but its head \
                     records {head_seq}",
                    checked + 1
                ),
            )),
            Some((head_seq, _)) if head_seq < checked => Some((
                head_seq + 1,
                format!("entries after {head_seq} were added outside Keel: the head records {head_seq}"),
            )),
            Some((_, head_hash)) if head_hash != prev => Some((
                checked,
                format!("entry {checked} does not match the head hash {head_hash}: the log was rewritten"),
            )),
            Some(_) => None,
        };
        AuditVerify {
            entries: checked,
            head_hash: prev,
            broken: reason.map(|(seq, reason)| AuditBreak { seq, reason }),
        }
    }

    fn broken(&self, seq: Seq, reason: String) -> AuditVerify {
        AuditVerify {
            entries: self.checked,
            head_hash: self.prev.clone(),
            broken: Some(AuditBreak { seq, reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::AuditRecord;

    /// A clean chain of `count` entries.
    fn chain(count: u64) -> Vec<AuditEntry> {
        let mut prev = GENESIS.to_owned();
        (1..=count)
            .map(|seq| {
                let record = AuditRecord {
                    tenant: "t".to_owned(),
                    run_id: None,
                    at_ms: seq,
                    actor: "kernel".to_owned(),
                    action: "egress".to_owned(),
                    subject: format!("host{seq}"),
                    outcome: "allowed".to_owned(),
                    detail: json!({"i": seq}),
                };
                let hash = entry_hash(&prev, seq, &record.canonical_json());
                let entry = AuditEntry { seq, record, prev_hash: prev.clone(), hash: hash.clone() };
                prev = hash;
                entry
            })
            .collect()
    }

    /// Walks rows given as (stored seq, entry) and finishes with `head`.
    fn verify(rows: &[(i64, AuditEntry)], head: Option<(Seq, String)>) -> AuditVerify {
        let mut walk = AuditWalk::default();
        for (seq, entry) in rows {
            if let Err(verdict) = walk.check(*seq, || Ok(entry.clone())) {
                return verdict;
            }
        }
        walk.finish(head)
    }

    fn rows(entries: &[AuditEntry]) -> Vec<(i64, AuditEntry)> {
        entries.iter().map(|entry| (entry.seq as i64, entry.clone())).collect()
    }

    fn head(entries: &[AuditEntry]) -> Option<(Seq, String)> {
        entries.last().map(|entry| (entry.seq, entry.hash.clone()))
    }

    #[track_caller]
    fn assert_broken_at(verdict: &AuditVerify, seq: Seq, words: &str) {
        let broken = verdict.broken.as_ref().unwrap_or_else(|| panic!("expected a break: {verdict:?}"));
        assert_eq!(broken.seq, seq, "{broken:?}");
        assert!(broken.reason.contains(words), "{:?} should say {words:?}", broken.reason);
    }

    #[test]
    fn an_intact_chain_verifies_with_its_last_hash_as_head() {
        let entries = chain(3);
        let verdict = verify(&rows(&entries), head(&entries));
        assert_eq!(verdict, AuditVerify { entries: 3, head_hash: entries[2].hash.clone(), broken: None });
        assert_eq!(
            verify(&[], None),
            AuditVerify { entries: 0, head_hash: GENESIS.to_owned(), broken: None }
        );
    }

    #[test]
    fn a_modified_record_breaks_at_it() {
        let entries = chain(3);
        let mut rows = rows(&entries);
        rows[1].1.record.subject = "elsewhere".to_owned();
        let verdict = verify(&rows, head(&entries));
        assert_broken_at(&verdict, 2, "was modified");
        assert_eq!((verdict.entries, &verdict.head_hash), (1, &entries[0].hash));
    }

    #[test]
    fn removed_reordered_and_unreadable_entries_break() {
        let entries = chain(4);
        let all = rows(&entries);
        let without_second: Vec<_> = [&all[..1], &all[2..]].concat();
        assert_broken_at(&verify(&without_second, head(&entries)), 2, "entry 2 is missing");
        let swapped = vec![all[0].clone(), all[2].clone(), all[1].clone()];
        assert_broken_at(&verify(&swapped, head(&entries)), 2, "missing");
        let behind = vec![all[0].clone(), (1, entries[1].clone())];
        assert_broken_at(&verify(&behind, head(&entries)), 2, "out of place");
        let mut relinked = all.clone();
        relinked[2].1.prev_hash = entries[0].hash.clone();
        assert_broken_at(&verify(&relinked, head(&entries)), 3, "does not link");
        let mut walk = AuditWalk::default();
        let unreadable = walk.check(1, || Err("bad column".to_owned())).unwrap_err();
        assert_broken_at(&unreadable, 1, "unreadable: bad column");
    }

    #[test]
    fn the_head_catches_what_the_chain_cannot() {
        let entries = chain(3);
        let all = rows(&entries);
        assert_broken_at(&verify(&all[..2], head(&entries)), 3, "entries 3 to 3 were removed");
        assert_broken_at(&verify(&all, Some((2, entries[1].hash.clone()))), 3, "added outside Keel");
        assert_broken_at(&verify(&all, Some((3, "other".to_owned()))), 3, "the log was rewritten");
        assert_broken_at(&verify(&all, None), 3, "head is missing");
    }
}
