//! The audit log's hash chain: what each entry's hash covers. Pure, so every backend and
//! the verifier compute the same digest.
//!
//! Entry `seq` (from 1) has `hash = entry_hash(prev_hash, seq, canonical_json(record))`,
//! where `prev_hash` is the hash of entry `seq - 1` (`GENESIS` for the first). Changing a
//! record, a hash, a seq or the order of entries breaks the chain from that entry on.

use sha2::{Digest, Sha256};

/// The `prev_hash` of the first entry: 64 zeros, the width of a hex sha256.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The tag that opens every hashed input, so an audit hash can never equal the hash of
/// some other Keel structure (a blob, a replay key) over the same bytes.
const DOMAIN: &[u8] = b"keel.audit.v1\n";

/// Hex sha256 of the domain tag, then `prev_hash` with its length, `seq` in decimal and
/// the record's canonical JSON (`keel_core::replay::canonical_json`), each field ended by
/// a newline. The length prefix keeps the split unambiguous whatever `prev_hash` holds
/// (a tampered row can hold anything); canonical JSON never contains a raw newline.
pub fn entry_hash(prev_hash: &str, seq: u64, record_json_canonical: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(DOMAIN);
    hasher.update(format!("{}:", prev_hash.len()).as_bytes());
    hasher.update(prev_hash.as_bytes());
    hasher.update(b"\n");
    hasher.update(seq.to_string().as_bytes());
    hasher.update(b"\n");
    hasher.update(record_json_canonical.as_bytes());
    hasher.update(b"\n");
    keel_types::hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::replay::canonical_json;

    #[test]
    fn genesis_is_64_zeros() {
        assert_eq!(GENESIS.len(), 64);
        assert!(GENESIS.bytes().all(|b| b == b'0'));
    }

    /// sha256("keel.audit.v1\n64:" + GENESIS + "\n1\n" + `{"a":"x","b":1}` + "\n"), computed
    /// independently (Python's hashlib).
    const PINNED: &str = "8855d1c3bc1c7b734cbd98af7d46b291893ebdb5062926898fdd1c0be225a3ed";

    #[test]
    fn hash_is_hex_sha256_and_stable() {
        let record = canonical_json(&json!({"b": 1, "a": "x"}));
        let hash = entry_hash(GENESIS, 1, &record);
        assert_eq!(hash.len(), 64);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        // Pinned: a change of the encoding would orphan every stored chain.
        assert_eq!(hash, entry_hash(GENESIS, 1, r#"{"a":"x","b":1}"#));
        assert_eq!(hash, PINNED);
    }

    #[test]
    fn every_input_changes_the_hash() {
        let record = canonical_json(&json!({"action": "egress"}));
        let base = entry_hash(GENESIS, 1, &record);
        assert_ne!(base, entry_hash(&"1".repeat(64), 1, &record), "prev");
        assert_ne!(base, entry_hash(GENESIS, 2, &record), "seq");
        assert_ne!(base, entry_hash(GENESIS, 1, &canonical_json(&json!({"action": "tool"}))), "record");
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        // Moving a digit from the seq into prev (or text between fields) must not collide.
        assert_ne!(entry_hash("a", 12, "{}"), entry_hash("a1", 2, "{}"));
        assert_ne!(entry_hash("a\n1", 2, "{}"), entry_hash("a", 12, "{}"));
        assert_ne!(entry_hash("", 1, "2\n{}"), entry_hash("", 12, "{}"));
    }

    #[test]
    fn chaining_links_each_entry_to_the_previous() {
        let records: Vec<String> = (0..3).map(|i| canonical_json(&json!({"i": i}))).collect();
        let mut prev = GENESIS.to_owned();
        let mut hashes = Vec::new();
        for (index, record) in records.iter().enumerate() {
            prev = entry_hash(&prev, index as u64 + 1, record);
            hashes.push(prev.clone());
        }
        // Recomputing with entry 2 removed does not reach the same head.
        let without_second = entry_hash(&hashes[0], 2, &records[2]);
        assert_ne!(without_second, hashes[2]);
    }
}
