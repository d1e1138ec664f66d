//! Replay after a crash (DESIGN.md section 4): the canonical params hash that keys journal
//! entries, and the matcher that answers a restarted agent's syscalls from the journal
//! whenever the journal holds a matching call, and sends everything else live.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON text: object keys sorted (bytewise), no whitespace, strings escaped as
/// serde_json does, numbers as serde_json prints them. Arrays keep order.
///
/// Keys are sorted here rather than relying on `serde_json::Map`'s own order, because the
/// `preserve_order` feature (which any crate in the build may switch on) makes the map keep
/// insertion order, and the same params must hash the same however they were built.
pub fn canonical_json(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(&mut text, value);
    text
}

/// Hex sha256 of `method`, a '\n', and canonical_json(params). The replay key.
///
/// Canonical JSON never contains a raw newline (newlines inside strings are escaped), so
/// the text after the last '\n' is always the params and distinct (method, params) pairs
/// never hash the same input. The JSON is streamed into the hasher through a small
/// buffer instead of being built as a string first, since params may carry a whole
/// conversation on every call.
pub fn params_hash(method: &str, params: &Value) -> String {
    let mut sink = HashSink { hasher: Sha256::new(), buffer: Vec::with_capacity(HashSink::CAPACITY) };
    sink.write_text(method);
    sink.write_text("\n");
    write_canonical(&mut sink, params);
    sink.finish()
}

/// Where canonical JSON text goes: a string for `canonical_json`, a buffered hasher for
/// `params_hash`.
trait CanonicalSink {
    fn write_text(&mut self, text: &str);
}

impl CanonicalSink for String {
    fn write_text(&mut self, text: &str) {
        self.push_str(text);
    }
}

/// The hasher behind a buffer: canonical JSON comes in pieces of a few bytes (a brace, a
/// comma, a key), and each of the hasher's own updates costs more than copying them.
struct HashSink {
    hasher: Sha256,
    buffer: Vec<u8>,
}

impl HashSink {
    const CAPACITY: usize = 4096;

    /// The hex digest of everything written.
    fn finish(mut self) -> String {
        self.hasher.update(&self.buffer);
        keel_types::hex(&self.hasher.finalize())
    }
}

impl CanonicalSink for HashSink {
    fn write_text(&mut self, text: &str) {
        if self.buffer.len() + text.len() > Self::CAPACITY {
            self.hasher.update(&self.buffer);
            self.buffer.clear();
        }
        if text.len() > Self::CAPACITY {
            self.hasher.update(text.as_bytes());
        } else {
            self.buffer.extend_from_slice(text.as_bytes());
        }
    }
}

fn write_canonical<S: CanonicalSink>(sink: &mut S, value: &Value) {
    match value {
        Value::Null => sink.write_text("null"),
        Value::Bool(true) => sink.write_text("true"),
        Value::Bool(false) => sink.write_text("false"),
        // `Number`'s Display is the same formatting serde_json's serializer uses (itoa for
        // integers, ryu for floats), so numbers read back to the same value.
        Value::Number(number) => sink.write_text(&number.to_string()),
        Value::String(text) => write_string(sink, text),
        Value::Array(items) => {
            sink.write_text("[");
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    sink.write_text(",");
                }
                write_canonical(sink, item);
            }
            sink.write_text("]");
        }
        Value::Object(map) => {
            sink.write_text("{");
            // `str`'s ordering compares UTF-8 bytes, the bytewise order promised above. A
            // map without `preserve_order` iterates in that order already.
            if map.keys().is_sorted() {
                write_entries(sink, map.iter());
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                // Keys in a map are unique, so an unstable sort is deterministic.
                entries.sort_unstable_by_key(|(key, _)| *key);
                write_entries(sink, entries.into_iter());
            }
            sink.write_text("}");
        }
    }
}

/// An object's entries, in the order given, without the braces.
fn write_entries<'a, S: CanonicalSink>(sink: &mut S, entries: impl Iterator<Item = (&'a String, &'a Value)>) {
    for (index, (key, item)) in entries.enumerate() {
        if index > 0 {
            sink.write_text(",");
        }
        write_string(sink, key);
        sink.write_text(":");
        write_canonical(sink, item);
    }
}

/// Writes `text` as a JSON string with serde_json's escaping: `"` and `\` escaped, control
/// characters below U+0020 as their short form (`\n`, `\t`, ...) or `\u00XX` in lowercase
/// hex, and everything else (including non-ASCII and U+007F) written as is.
fn write_string<S: CanonicalSink>(sink: &mut S, text: &str) {
    const HEX_DIGITS: [&str; 16] =
        ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f"];
    sink.write_text("\"");
    // Copies runs of characters that need no escaping in one piece, passing over eight
    // bytes at a time while none of them needs it (a conversation is mostly such runs).
    // Every byte that needs escaping is ASCII, so `start` and `index` always fall on
    // character boundaries.
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut index = 0;
    while index < bytes.len() {
        if let Some(word) = bytes.get(index..index + 8).and_then(|chunk| chunk.try_into().ok())
            && !any_needs_escape(u64::from_le_bytes(word))
        {
            index += 8;
            continue;
        }
        let byte = bytes[index];
        let short_escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => {
                index += 1;
                continue;
            }
        };
        sink.write_text(&text[start..index]);
        if short_escape.is_empty() {
            sink.write_text("\\u00");
            sink.write_text(HEX_DIGITS[usize::from(byte >> 4)]);
            sink.write_text(HEX_DIGITS[usize::from(byte & 0x0f)]);
        } else {
            sink.write_text(short_escape);
        }
        index += 1;
        start = index;
    }
    sink.write_text(&text[start..]);
    sink.write_text("\"");
}

/// Whether any of the eight bytes of `word` needs escaping in a JSON string: a control
/// character (below 0x20), `"` or `\`. Exact: the classic zero-byte tests (a byte below
/// `n` sets its top bit in `x - n` while it was clear in `x`) have no false negatives, and
/// a false positive would only send the bytes through the byte-by-byte path.
fn any_needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    (below(word, 0x20)
        | below(word ^ (ONES * u64::from(b'"')), 1)
        | below(word ^ (ONES * u64::from(b'\\')), 1))
        != 0
}

/// One journaled syscall from after the last checkpoint, as the matcher needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    pub seq: u64,
    pub method: String,
    pub params_hash: String,
    /// Whether the result was journaled. `false` is an intent without a result: the crash
    /// hit between starting the effect and recording its outcome.
    pub completed: bool,
}

/// What to do with one syscall of a recovering run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer from the journal entry `seq` (it has a result).
    Replay { seq: u64 },
    /// Matched an intent whose result was never journaled (the crash window): the caller
    /// applies the effect's policy (retry/ask/fail) reusing `seq`.
    Reattach { seq: u64 },
    /// No journaled match: run this call live.
    ///
    /// `first` is true for exactly one call: the first live call of the matcher, i.e. the
    /// switch from replaying to live, whether because the agent diverged from the journal
    /// or ran past its end (and, for [`ReplayMatcher::live`] or an empty journal, the very
    /// first call). Later calls that still match a record are answered from it all the
    /// same (see [`ReplayMatcher`]); the records never asked for are collected with
    /// [`ReplayMatcher::abandon_remaining`].
    Live { first: bool },
}

/// The part of a recorded call the matcher keeps once it is filed under its key.
#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    completed: bool,
}

/// Matches a restarted agent's syscalls against the journal recorded after the last
/// checkpoint.
///
/// Key = (method, params_hash) plus occurrence: the n-th call with a key matches the n-th
/// recorded call with that key (so concurrent calls that arrive in another order still
/// replay correctly, and duplicates of the same request map one-to-one).
///
/// A call with no match left runs live (the first such call is reported with
/// `Decision::Live { first: true }`), but matching is lenient: the switch does not give up
/// on the journal. A later call that still matches an unmatched record (same key, by
/// occurrence) is answered from that record (`Replay`/`Reattach`), so a completed,
/// journaled effect is never repeated whatever the interleaving.
///
/// Why: with concurrent agent threads, arrival order after a restart is not the journal's
/// order. Thread A's brand-new call (past the journal) may arrive before thread B's call
/// that was already journaled. Giving up on the journal at A's call would run B's call
/// again and pay for its effect twice.
///
/// The records never asked for stay matchable until the caller ends replay with
/// [`ReplayMatcher::abandon_remaining`] (at the run's next live checkpoint, after which the
/// old tail can never be asked for again, and when the run ends); that returns them so they
/// can be marked abandoned for audit, and nothing matches after it.
#[derive(Debug, Clone, Default)]
pub struct ReplayMatcher {
    /// method -> params hash -> unmatched records with that key, oldest first. Two levels
    /// instead of a tuple key so that lookups borrow the caller's `&str`s.
    pending: HashMap<String, HashMap<String, VecDeque<Pending>>>,
    /// Number of records still in `pending`.
    remaining: usize,
    /// Whether the matcher was created with at least one record.
    had_records: bool,
    /// Whether a `Live` decision was returned (so the next one is not `first`).
    went_live: bool,
}

impl ReplayMatcher {
    /// `recorded` in seq order (abandoned entries already excluded by the caller).
    ///
    /// The records are sorted by seq again here, because occurrence matching depends on
    /// that order and sorting is cheaper than a wrong replay.
    pub fn new(mut recorded: Vec<RecordedCall>) -> Self {
        recorded.sort_by_key(|call| call.seq);
        let remaining = recorded.len();
        let mut pending: HashMap<String, HashMap<String, VecDeque<Pending>>> = HashMap::new();
        for call in recorded {
            pending
                .entry(call.method)
                .or_default()
                .entry(call.params_hash)
                .or_default()
                .push_back(Pending { seq: call.seq, completed: call.completed });
        }
        ReplayMatcher { pending, remaining, had_records: remaining > 0, went_live: false }
    }

    /// A matcher with nothing to replay: every call is live (the first one with
    /// `first: true`).
    pub fn live() -> Self {
        ReplayMatcher::default()
    }

    /// Decides how to answer the next syscall of the restarted agent: from the oldest
    /// unmatched record with the same key if there is one (even after calls went live),
    /// otherwise live.
    pub fn decide(&mut self, method: &str, params_hash: &str) -> Decision {
        let matched = self
            .pending
            .get_mut(method)
            .and_then(|by_hash| by_hash.get_mut(params_hash))
            .and_then(VecDeque::pop_front);
        match matched {
            Some(record) => {
                self.remaining -= 1;
                if record.completed {
                    Decision::Replay { seq: record.seq }
                } else {
                    Decision::Reattach { seq: record.seq }
                }
            }
            None => {
                let first = !self.went_live;
                self.went_live = true;
                Decision::Live { first }
            }
        }
    }

    /// Ends replay: returns the seqs of the records never matched, in seq order, and
    /// forgets them, so no later call matches anything. The kernel calls it once the old
    /// tail can no longer be asked for (the run reached its next live checkpoint, or the
    /// run ended) so that the tail can be marked abandoned for audit. Empty if called
    /// again. It does not by itself make [`ReplayMatcher::is_live`] true; the next
    /// `decide` does, with `Live { first }` set as usual.
    pub fn abandon_remaining(&mut self) -> Vec<u64> {
        let mut abandoned: Vec<u64> = self
            .pending
            .drain()
            .flat_map(|(_, by_hash)| by_hash.into_values())
            .flatten()
            .map(|record| record.seq)
            .collect();
        abandoned.sort_unstable();
        self.remaining = 0;
        abandoned
    }

    /// True once a `Live` decision has been returned, and from the start for
    /// [`ReplayMatcher::live`] or an empty journal.
    ///
    /// Not the same as "nothing left to replay": records may still match after the switch
    /// (see [`ReplayMatcher`]), and a matcher whose records were all matched (or abandoned)
    /// is not live until a call actually runs live. Use [`ReplayMatcher::remaining`] for
    /// whether anything can still be answered from the journal.
    pub fn is_live(&self) -> bool {
        self.went_live || !self.had_records
    }

    /// Recorded calls still matchable: not yet matched and not abandoned.
    pub fn remaining(&self) -> usize {
        self.remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::{BTreeMap, HashSet};

    fn record(seq: u64, method: &str, params: &Value, completed: bool) -> RecordedCall {
        RecordedCall { seq, method: method.to_owned(), params_hash: params_hash(method, params), completed }
    }

    fn call(matcher: &mut ReplayMatcher, method: &str, params: &Value) -> Decision {
        matcher.decide(method, &params_hash(method, params))
    }

    // canonical_json

    #[test]
    fn canonical_json_sorts_nested_keys_and_drops_whitespace() {
        let value: Value = serde_json::from_str(
            r#"{ "b": [3, {"z": 1, "a": null}], "a": {"y": true, "x": false}, "": "empty" }"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"":"empty","a":{"x":false,"y":true},"b":[3,{"a":null,"z":1}]}"#
        );
    }

    #[test]
    fn canonical_json_sorts_keys_by_bytes() {
        // Uppercase sorts before lowercase, and a multi-byte character after all ASCII.
        let value = json!({"é": 1, "b": 2, "B": 3, "a": 4, "aa": 5});
        assert_eq!(canonical_json(&value), r#"{"B":3,"a":4,"aa":5,"b":2,"é":1}"#);
    }

    #[test]
    fn canonical_json_keeps_unicode_as_is() {
        let value = json!({"text": "héllo 日本 🦀", "日本": "ok"});
        assert_eq!(canonical_json(&value), "{\"text\":\"héllo 日本 🦀\",\"日本\":\"ok\"}");
    }

    #[test]
    fn canonical_json_escapes_like_serde_json() {
        let text = "quote\" backslash\\ nl\n cr\r tab\t bs\u{8} ff\u{c} nul\u{0} us\u{1f} del\u{7f} /";
        let expected = r#""quote\" backslash\\ nl\n cr\r tab\t bs\b ff\f nul\u0000 us\u001f del/ /""#
            .replace("del/", "del\u{7f}");
        assert_eq!(canonical_json(&json!(text)), expected);
        assert_eq!(canonical_json(&json!(text)), serde_json::to_string(text).unwrap());
        assert_eq!(canonical_json(&json!({"k\"ey\n": 1})), r#"{"k\"ey\n":1}"#);
    }

    #[test]
    fn canonical_json_prints_numbers_like_serde_json() {
        let value = json!([0, -1, 42, u64::MAX, i64::MIN, 1.5, -0.25, 1.0, 0.1, 1e300, -0.0, 2.5e-8]);
        assert_eq!(
            canonical_json(&value),
            "[0,-1,42,18446744073709551615,-9223372036854775808,1.5,-0.25,1.0,0.1,1e+300,-0.0,2.5e-8]"
        );
        // An integer and the float of the same magnitude are different params.
        assert_ne!(canonical_json(&json!(1)), canonical_json(&json!(1.0)));
    }

    #[test]
    fn canonical_json_of_scalars_and_empties() {
        assert_eq!(canonical_json(&json!(null)), "null");
        assert_eq!(canonical_json(&json!(true)), "true");
        assert_eq!(canonical_json(&json!(false)), "false");
        assert_eq!(canonical_json(&json!("")), r#""""#);
        assert_eq!(canonical_json(&json!([])), "[]");
        assert_eq!(canonical_json(&json!({})), "{}");
        assert_eq!(canonical_json(&json!([[], {}, [{}]])), "[[],{},[{}]]");
    }

    #[test]
    fn params_hash_is_sha256_of_method_newline_canonical_params() {
        let params = json!({"b": 1, "a": [true]});
        let mut hasher = Sha256::new();
        hasher.update(b"llm.chat\n{\"a\":[true],\"b\":1}");
        assert_eq!(params_hash("llm.chat", &params), keel_types::hex(&hasher.finalize()));
        assert_eq!(params_hash("llm.chat", &params).len(), 64);
        assert_ne!(params_hash("llm.chat", &params), params_hash("tool.call", &params));
    }

    // ReplayMatcher

    #[test]
    fn exact_replay_in_order_then_live() {
        let recorded = vec![
            record(1, "llm.chat", &json!({"turn": 1}), true),
            record(2, "tool.call", &json!({"name": "ls"}), true),
            record(3, "llm.chat", &json!({"turn": 2}), true),
        ];
        let mut matcher = ReplayMatcher::new(recorded);
        assert!(!matcher.is_live());
        assert_eq!(matcher.remaining(), 3);
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 1})), Decision::Replay { seq: 1 });
        assert_eq!(call(&mut matcher, "tool.call", &json!({"name": "ls"})), Decision::Replay { seq: 2 });
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 2})), Decision::Replay { seq: 3 });
        assert_eq!(matcher.remaining(), 0);
        // Nothing went live yet.
        assert!(!matcher.is_live());
        // The agent ran past the journal: the switch to live.
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 3})), Decision::Live { first: true });
        assert!(matcher.is_live());
        // A repeat of an already replayed request is a new request now.
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 1})), Decision::Live { first: false });
        assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
    }

    #[test]
    fn divergence_goes_live_but_the_tail_still_matches_until_abandoned() {
        let recorded = (1..=5).map(|seq| record(seq, "llm.chat", &json!({"turn": seq}), true)).collect();
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 1})), Decision::Replay { seq: 1 });
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 2})), Decision::Replay { seq: 2 });
        // The third call asks for something else (the model answered differently).
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": "other"})), Decision::Live { first: true });
        assert!(matcher.is_live());
        assert_eq!(matcher.remaining(), 3);
        // A request the tail holds is still answered from it: never paid twice.
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 3})), Decision::Replay { seq: 3 });
        assert_eq!(
            call(&mut matcher, "llm.chat", &json!({"turn": "another"})),
            Decision::Live { first: false }
        );
        assert_eq!(matcher.remaining(), 2);
        assert_eq!(matcher.abandon_remaining(), vec![4, 5]);
        assert_eq!(matcher.remaining(), 0);
        assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
        // After abandoning, the tail is gone for good.
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 4})), Decision::Live { first: false });
    }

    #[test]
    fn concurrent_new_call_before_journaled_call_does_not_repay() {
        // Before the crash, thread B charged a card (journaled with its result) and thread
        // C started a deploy whose result was never journaled; seq 3 is a call of thread C
        // that the restarted run never asks for again.
        let charge = json!({"name": "charge", "amount": 100});
        let deploy = json!({"name": "deploy"});
        let recorded = vec![
            record(1, "tool.call", &charge, true),
            record(2, "tool.call", &deploy, false),
            record(3, "llm.chat", &json!({"thread": "C", "turn": 2}), true),
        ];
        let mut matcher = ReplayMatcher::new(recorded);
        // After the restart, thread A's brand-new call arrives first.
        assert_eq!(
            call(&mut matcher, "llm.chat", &json!({"thread": "A", "turn": 5})),
            Decision::Live { first: true }
        );
        assert!(matcher.is_live());
        // Thread B's journaled call is still answered from the journal, not paid again.
        assert_eq!(call(&mut matcher, "tool.call", &charge), Decision::Replay { seq: 1 });
        // Another new call of thread A, then thread C's intent is reattached.
        assert_eq!(
            call(&mut matcher, "llm.chat", &json!({"thread": "A", "turn": 6})),
            Decision::Live { first: false }
        );
        assert_eq!(call(&mut matcher, "tool.call", &deploy), Decision::Reattach { seq: 2 });
        assert_eq!(matcher.remaining(), 1);
        // Only the record nobody asked for is abandoned.
        assert_eq!(matcher.abandon_remaining(), vec![3]);
        // A second charge is a new request: it was journaled once, so it runs live.
        assert_eq!(call(&mut matcher, "tool.call", &charge), Decision::Live { first: false });
    }

    #[test]
    fn an_intent_without_a_result_is_reattached() {
        let recorded = vec![
            record(7, "llm.chat", &json!({"turn": 1}), true),
            record(8, "tool.call", &json!({"name": "deploy"}), false),
            record(9, "llm.chat", &json!({"turn": 2}), true),
        ];
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 1})), Decision::Replay { seq: 7 });
        assert_eq!(
            call(&mut matcher, "tool.call", &json!({"name": "deploy"})),
            Decision::Reattach { seq: 8 }
        );
        // Reattaching does not end replay: later records still answer.
        assert!(!matcher.is_live());
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 2})), Decision::Replay { seq: 9 });
    }

    #[test]
    fn duplicate_requests_match_records_one_to_one_by_occurrence() {
        let params = json!({"now": true});
        let recorded = vec![
            record(1, "time.now", &params, true),
            record(2, "time.now", &params, false),
            record(3, "time.now", &params, true),
        ];
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "time.now", &params), Decision::Replay { seq: 1 });
        assert_eq!(call(&mut matcher, "time.now", &params), Decision::Reattach { seq: 2 });
        assert_eq!(call(&mut matcher, "time.now", &params), Decision::Replay { seq: 3 });
        // A fourth occurrence was never recorded.
        assert_eq!(call(&mut matcher, "time.now", &params), Decision::Live { first: true });
        assert_eq!(call(&mut matcher, "time.now", &params), Decision::Live { first: false });
    }

    #[test]
    fn concurrent_calls_arriving_permuted_still_replay() {
        // The agent fired three tool calls at once; after the restart they arrive in
        // another order, with two identical ones among them.
        let a = json!({"name": "fetch", "url": "a"});
        let b = json!({"name": "fetch", "url": "b"});
        let recorded = vec![
            record(10, "tool.call", &a, true),
            record(11, "tool.call", &b, true),
            record(12, "tool.call", &a, true),
            record(13, "llm.chat", &json!({"turn": 2}), true),
        ];
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "tool.call", &b), Decision::Replay { seq: 11 });
        assert_eq!(call(&mut matcher, "tool.call", &a), Decision::Replay { seq: 10 });
        assert_eq!(call(&mut matcher, "tool.call", &a), Decision::Replay { seq: 12 });
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 2})), Decision::Replay { seq: 13 });
    }

    #[test]
    fn the_same_params_under_another_method_do_not_match() {
        let params = json!({"key": "x"});
        let mut matcher = ReplayMatcher::new(vec![RecordedCall {
            seq: 1,
            method: "kv.get".to_owned(),
            params_hash: params_hash("kv.get", &params),
            completed: true,
        }]);
        // Even if a caller hashed params under the wrong method, the method must match too.
        assert_eq!(matcher.decide("kv.put", &params_hash("kv.get", &params)), Decision::Live { first: true });
        assert_eq!(matcher.remaining(), 1);
        assert_eq!(matcher.abandon_remaining(), vec![1]);
    }

    #[test]
    fn records_given_out_of_order_are_matched_in_seq_order() {
        let params = json!({});
        let recorded = vec![record(5, "rand", &params, true), record(2, "rand", &params, true)];
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "rand", &params), Decision::Replay { seq: 2 });
        assert_eq!(call(&mut matcher, "rand", &params), Decision::Replay { seq: 5 });
    }

    #[test]
    fn empty_and_live_matchers_run_everything_live() {
        for mut matcher in [ReplayMatcher::live(), ReplayMatcher::new(vec![])] {
            assert!(matcher.is_live());
            assert_eq!(matcher.remaining(), 0);
            assert_eq!(call(&mut matcher, "llm.chat", &json!({})), Decision::Live { first: true });
            assert_eq!(call(&mut matcher, "llm.chat", &json!({})), Decision::Live { first: false });
            assert!(matcher.is_live());
            assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
        }
    }

    #[test]
    fn abandon_remaining_ends_replay_early() {
        let recorded = (1..=3).map(|seq| record(seq, "llm.chat", &json!({"turn": seq}), seq != 3)).collect();
        let mut matcher = ReplayMatcher::new(recorded);
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 1})), Decision::Replay { seq: 1 });
        assert_eq!(matcher.abandon_remaining(), vec![2, 3]);
        assert_eq!(matcher.remaining(), 0);
        // No call has gone live yet; the next unmatched one is the switch.
        assert!(!matcher.is_live());
        assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 2})), Decision::Live { first: true });
        assert!(matcher.is_live());
        assert_eq!(call(&mut matcher, "llm.chat", &json!({"turn": 3})), Decision::Live { first: false });
    }

    // Properties

    /// A recorded journal: calls drawn from a small key space so that duplicates are
    /// common, with increasing seqs that have gaps (abandoned entries were filtered out).
    fn journal() -> impl Strategy<Value = Vec<RecordedCall>> {
        prop::collection::vec((0..3u8, 0..3u8, any::<bool>(), 1..4u64), 0..24).prop_map(|calls| {
            let mut seq = 0;
            calls
                .into_iter()
                .map(|(method, param, completed, gap)| {
                    seq += gap;
                    let method = format!("method.{method}");
                    let params = json!({ "param": param });
                    record(seq, &method, &params, completed)
                })
                .collect()
        })
    }

    fn key(call: &RecordedCall) -> (String, String) {
        (call.method.clone(), call.params_hash.clone())
    }

    /// The decision a recorded call gets when it is matched to its own record.
    fn expected(call: &RecordedCall) -> Decision {
        if call.completed { Decision::Replay { seq: call.seq } } else { Decision::Reattach { seq: call.seq } }
    }

    /// One syscall of a restarted run: a call the journal holds, or a novel one.
    #[derive(Debug, Clone)]
    enum Arrival {
        Recorded(RecordedCall),
        Novel { method: String, params_hash: String },
    }

    /// A journal, and its calls arriving in a random order with novel calls inserted at
    /// random positions. Novel calls never match a record: `method.3` is never recorded,
    /// and params 3..6 never are under any method (which also exercises a known method
    /// with unknown params).
    fn interleaving() -> impl Strategy<Value = (Vec<RecordedCall>, Vec<Arrival>)> {
        journal()
            .prop_flat_map(|recorded| {
                let arrivals = Just(recorded.clone()).prop_shuffle();
                let novel = prop::collection::vec((any::<prop::sample::Index>(), 0..4u8, 3..6u8), 0..8);
                (Just(recorded), arrivals, novel)
            })
            .prop_map(|(recorded, arrivals, novel)| {
                let mut sequence: Vec<Arrival> = arrivals.into_iter().map(Arrival::Recorded).collect();
                for (position, method, param) in novel {
                    let at = position.index(sequence.len() + 1);
                    let method = format!("method.{method}");
                    let params_hash = params_hash(&method, &json!({ "param": param }));
                    sequence.insert(at, Arrival::Novel { method, params_hash });
                }
                (recorded, sequence)
            })
    }

    /// A JSON value with object entries in an explicit order, so the same value can be
    /// written out as text with its keys in different orders.
    #[derive(Debug, Clone)]
    enum Tree {
        Leaf(Value),
        Array(Vec<Tree>),
        Object(Vec<(String, Tree)>),
    }

    impl Tree {
        /// JSON text with object keys in stored order, or rotated by `rotation` at every
        /// object, and with some whitespace, as another producer might write it.
        fn to_text(&self, rotation: usize) -> String {
            match self {
                Tree::Leaf(value) => serde_json::to_string(value).unwrap(),
                Tree::Array(items) => {
                    let items: Vec<String> = items.iter().map(|item| item.to_text(rotation)).collect();
                    format!("[ {} ]", items.join(" , "))
                }
                Tree::Object(entries) => {
                    let mut entries: Vec<String> = entries
                        .iter()
                        .map(|(key, item)| {
                            format!("{} : {}", serde_json::to_string(key).unwrap(), item.to_text(rotation))
                        })
                        .collect();
                    if !entries.is_empty() {
                        let by = rotation % entries.len();
                        entries.rotate_left(by);
                    }
                    format!("{{\n {} }}", entries.join(",\n "))
                }
            }
        }

        fn reversed(&self) -> Tree {
            match self {
                Tree::Leaf(value) => Tree::Leaf(value.clone()),
                Tree::Array(items) => Tree::Array(items.iter().map(Tree::reversed).collect()),
                Tree::Object(entries) => Tree::Object(
                    entries.iter().rev().map(|(key, item)| (key.clone(), item.reversed())).collect(),
                ),
            }
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            // Short decimals: serde_json's default float parser (without the
            // `float_roundtrip` feature) may be one ulp off on long mantissas, which would
            // make a text round trip compare unequal for reasons unrelated to this crate.
            // `numbers_print_exactly_as_serde_json_does` covers arbitrary floats.
            (-1_000_000i64..1_000_000, 0..6i32)
                .prop_map(|(mantissa, exponent)| Value::from(mantissa as f64 / 10f64.powi(exponent))),
            any::<String>().prop_map(Value::String),
        ]
    }

    fn tree() -> impl Strategy<Value = Tree> {
        leaf().prop_map(Tree::Leaf).prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Tree::Array),
                // A BTreeMap makes the keys unique; the shuffle gives a random order.
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|entries| entries.into_iter().collect::<Vec<_>>())
                    .prop_shuffle()
                    .prop_map(Tree::Object),
            ]
        })
    }

    /// The same value rebuilt with keys inserted in sorted order, which serde_json then
    /// prints sorted whether or not `preserve_order` is on.
    fn sorted_copy(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(sorted_copy).collect()),
            Value::Object(map) => {
                let sorted: BTreeMap<&String, &Value> = map.iter().collect();
                Value::Object(
                    sorted.into_iter().map(|(key, item)| (key.clone(), sorted_copy(item))).collect(),
                )
            }
            other => other.clone(),
        }
    }

    /// Any JSON value: every kind, numbers of each representation, strings with escapes,
    /// non-ASCII and lengths past the hash's buffer.
    fn any_json() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            r#"[a-z"\\\n\t\x01\x7f\u{e9}\u{1F600}]{0,12}"#,
            // Escapes at every offset of a longer text, around the eight-byte steps.
            r#"[a-z "\\\n\x00\x1f\x20\x21\x23\x5b\x5d\x7f\u{e9}\u{1F600}]{0,200}"#,
            (0usize..3, 4000usize..9000).prop_map(|(kind, len)| ["x", "é", "\n"][kind].repeat(len)),
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z_é$]{0,6}", inner, 0..8)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        #[test]
        fn the_params_hash_is_sha256_of_the_canonical_text_and_that_is_serde_jsons_sorted_text(
            method in "[a-z.]{1,12}",
            params in any_json(),
        ) {
            let text = canonical_json(&params);
            // Without `preserve_order` a map is sorted already, so serde_json's compact
            // text is the canonical text: the same escaping and number formatting.
            prop_assert_eq!(&text, &serde_json::to_string(&params).unwrap());
            let mut hasher = Sha256::new();
            hasher.update(format!("{method}\n{text}").as_bytes());
            prop_assert_eq!(params_hash(&method, &params), keel_types::hex(&hasher.finalize()));
        }
    }

    proptest! {
        #[test]
        fn any_permutation_replays_every_call_exactly_once(
            (recorded, arrivals) in journal().prop_flat_map(|recorded| {
                let arrivals = Just(recorded.clone()).prop_shuffle();
                (Just(recorded), arrivals)
            })
        ) {
            let by_seq: HashMap<u64, &RecordedCall> =
                recorded.iter().map(|call| (call.seq, call)).collect();
            let mut matcher = ReplayMatcher::new(recorded.clone());
            let mut answered = HashSet::new();
            let mut last_seq_per_key: HashMap<(String, String), u64> = HashMap::new();
            for arrival in &arrivals {
                let seq = match matcher.decide(&arrival.method, &arrival.params_hash) {
                    Decision::Replay { seq } => {
                        prop_assert!(by_seq[&seq].completed);
                        seq
                    }
                    Decision::Reattach { seq } => {
                        prop_assert!(!by_seq[&seq].completed);
                        seq
                    }
                    live => {
                        return Err(TestCaseError::fail(format!("went live: {live:?}")));
                    }
                };
                prop_assert_eq!(key(by_seq[&seq]), key(arrival), "matched another key");
                prop_assert!(answered.insert(seq), "seq {} answered twice", seq);
                // Occurrence order: within a key, records are used oldest first.
                if let Some(previous) = last_seq_per_key.insert(key(arrival), seq) {
                    prop_assert!(previous < seq);
                }
            }
            prop_assert_eq!(answered.len(), recorded.len());
            prop_assert_eq!(matcher.remaining(), 0);
            // Nothing ran live, so only a matcher that never had records is live.
            prop_assert_eq!(matcher.is_live(), recorded.is_empty());
            // The next call is past the journal: the switch to live.
            let again = params_hash("method.0", &json!({ "param": 0 }));
            prop_assert_eq!(
                matcher.decide("method.0", &again),
                Decision::Live { first: true }
            );
            prop_assert!(matcher.is_live());
            prop_assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
        }

        #[test]
        fn a_novel_call_after_a_prefix_keeps_the_tail_until_abandoned(
            (recorded, prefix, asked) in journal()
                .prop_flat_map(|recorded| {
                    let len = recorded.len();
                    (Just(recorded), 0..=len)
                })
                .prop_flat_map(|(recorded, prefix)| {
                    let len = recorded.len();
                    (Just(recorded), Just(prefix), 0..=len - prefix)
                })
        ) {
            let mut matcher = ReplayMatcher::new(recorded.clone());
            for call in &recorded[..prefix] {
                prop_assert_eq!(
                    matcher.decide(&call.method, &call.params_hash),
                    expected(call)
                );
            }
            prop_assert_eq!(matcher.remaining(), recorded.len() - prefix);
            let novel_hash = params_hash("method.novel", &json!({}));
            prop_assert_eq!(
                matcher.decide("method.novel", &novel_hash),
                Decision::Live { first: true }
            );
            prop_assert!(matcher.is_live());
            // Going live abandons nothing by itself.
            prop_assert_eq!(matcher.remaining(), recorded.len() - prefix);
            // The tail still answers after the switch.
            for call in &recorded[prefix..prefix + asked] {
                prop_assert_eq!(
                    matcher.decide(&call.method, &call.params_hash),
                    expected(call)
                );
            }
            prop_assert_eq!(matcher.remaining(), recorded.len() - prefix - asked);
            let rest: Vec<u64> = recorded[prefix + asked..].iter().map(|call| call.seq).collect();
            prop_assert_eq!(matcher.abandon_remaining(), rest);
            prop_assert_eq!(matcher.remaining(), 0);
            prop_assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
            // After abandoning, nothing matches, and the switch is not reported again.
            for call in &recorded[prefix..] {
                prop_assert_eq!(
                    matcher.decide(&call.method, &call.params_hash),
                    Decision::Live { first: false }
                );
            }
            prop_assert!(matcher.is_live());
        }

        #[test]
        fn novel_calls_interleaved_never_make_a_recorded_call_repay(
            (recorded, arrivals) in interleaving()
        ) {
            let by_seq: HashMap<u64, &RecordedCall> =
                recorded.iter().map(|call| (call.seq, call)).collect();
            let mut matcher = ReplayMatcher::new(recorded.clone());
            let mut answered = HashSet::new();
            let mut last_seq_per_key: HashMap<(String, String), u64> = HashMap::new();
            let mut seen_novel = false;
            let mut firsts = 0;
            for arrival in &arrivals {
                prop_assert_eq!(matcher.is_live(), seen_novel || recorded.is_empty());
                match arrival {
                    Arrival::Recorded(call) => {
                        let seq = match matcher.decide(&call.method, &call.params_hash) {
                            Decision::Replay { seq } => {
                                prop_assert!(by_seq[&seq].completed);
                                seq
                            }
                            Decision::Reattach { seq } => {
                                prop_assert!(!by_seq[&seq].completed);
                                seq
                            }
                            live => {
                                return Err(TestCaseError::fail(format!(
                                    "recorded call {call:?} ran live: {live:?}"
                                )));
                            }
                        };
                        prop_assert_eq!(key(by_seq[&seq]), key(call), "matched another key");
                        prop_assert!(answered.insert(seq), "seq {} answered twice", seq);
                        if let Some(previous) = last_seq_per_key.insert(key(call), seq) {
                            prop_assert!(previous < seq);
                        }
                    }
                    Arrival::Novel { method, params_hash } => {
                        match matcher.decide(method, params_hash) {
                            Decision::Live { first } => {
                                // Only the first novel call is the switch.
                                prop_assert_eq!(first, !seen_novel);
                                if first {
                                    firsts += 1;
                                }
                            }
                            replayed => {
                                return Err(TestCaseError::fail(format!(
                                    "novel call {method} answered from the journal: {replayed:?}"
                                )));
                            }
                        }
                        seen_novel = true;
                    }
                }
            }
            prop_assert_eq!(firsts, usize::from(seen_novel));
            prop_assert_eq!(answered.len(), recorded.len());
            prop_assert_eq!(matcher.remaining(), 0);
            prop_assert_eq!(matcher.is_live(), seen_novel || recorded.is_empty());
            prop_assert_eq!(matcher.abandon_remaining(), Vec::<u64>::new());
        }

        #[test]
        fn canonical_json_ignores_key_order_and_formatting(tree in tree(), rotation in 0..8usize) {
            let original: Value = serde_json::from_str(&tree.to_text(0)).unwrap();
            let rotated: Value = serde_json::from_str(&tree.to_text(rotation)).unwrap();
            let reversed: Value = serde_json::from_str(&tree.reversed().to_text(0)).unwrap();
            let canonical = canonical_json(&original);
            prop_assert_eq!(&canonical_json(&rotated), &canonical);
            prop_assert_eq!(&canonical_json(&reversed), &canonical);
            prop_assert_eq!(params_hash("m", &rotated), params_hash("m", &original));
            prop_assert_eq!(params_hash("m", &reversed), params_hash("m", &original));
            // It is JSON for the same value, and a fixed point.
            let reparsed: Value = serde_json::from_str(&canonical).unwrap();
            prop_assert_eq!(&reparsed, &original);
            prop_assert_eq!(&canonical_json(&reparsed), &canonical);
            // And it is exactly what serde_json prints for the value with sorted keys.
            prop_assert_eq!(&canonical, &serde_json::to_string(&sorted_copy(&original)).unwrap());
        }

        #[test]
        fn params_hash_changes_when_a_value_changes(
            tree in tree(),
            left in leaf(),
            right in leaf(),
        ) {
            prop_assume!(left != right);
            let base: Value = serde_json::from_str(&tree.to_text(0)).unwrap();
            let with_left = json!({"base": base, "changed": left});
            let with_right = json!({"base": base, "changed": right});
            prop_assert_ne!(params_hash("m", &with_left), params_hash("m", &with_right));
            prop_assert_ne!(params_hash("m", &with_left), params_hash("n", &with_left));
        }

        #[test]
        fn numbers_print_exactly_as_serde_json_does(
            float in any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
            signed in any::<i64>(),
            unsigned in any::<u64>(),
        ) {
            for value in [Value::from(float), Value::from(signed), Value::from(unsigned)] {
                prop_assert_eq!(canonical_json(&value), serde_json::to_string(&value).unwrap());
            }
        }

        #[test]
        fn strings_are_escaped_exactly_as_serde_json_does(text in any::<String>()) {
            prop_assert_eq!(
                canonical_json(&Value::String(text.clone())),
                serde_json::to_string(&text).unwrap()
            );
        }
    }
}
