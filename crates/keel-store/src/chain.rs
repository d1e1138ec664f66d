//! Content-addressed payloads and the message chain: how journal payloads are encoded for
//! storage, whatever the backend. Pure: the backend stores blobs and nodes and reads them
//! back; splitting params into a chain and joining them again happens here.
//!
//! A payload is stored as a [`Blob`]: its compact JSON bytes, keyed by their hex sha256,
//! so the same payload written many times is stored once. The `messages` array of journal
//! params (a conversation, re-sent whole on every LLM call) is stored one message blob per
//! node of a hash chain, node i = sha256(node i-1, ":", hash of message i) (node 0 after
//! the empty string), so equal prefixes share their nodes and a call that re-sends a
//! history stores only its new messages. The params blob then holds
//! `{"$keel_messages": {"fields": <params without messages>, "chain": <last node or null>}}`.
//! These hashes are part of every stored database: they never change.

use std::collections::HashMap;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// A payload ready to store: its JSON bytes and their content address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Hex sha256 of `bytes`.
    pub hash: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    /// The compact JSON of `value` and its hash.
    pub fn of(value: &(impl serde::Serialize + ?Sized)) -> Blob {
        // Serializing a `Value`, or a borrowed view of one, cannot fail: its keys are
        // strings.
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        let hash = keel_types::hex(&Sha256::digest(&bytes));
        Blob { hash, bytes }
    }
}

/// The key a params blob uses to stand for params whose `messages` live in the message
/// chain. Params that are themselves an object with this one key are always stored split
/// too (with `chain` null), so reading back is never ambiguous.
pub const SPLIT_KEY: &str = "$keel_messages";

/// One node of the message chain: message `message` after the prefix ending at `prev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainLink {
    pub hash: String,
    pub prev: Option<String>,
    pub message: Blob,
}

/// A node as a backend reads it back: the node before it and its message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainNode {
    pub prev: Option<String>,
    pub message: Value,
}

/// The hash of the node that puts the message hashed `message_hash` after the node
/// `prev` (`None` for the first message): sha256(prev or "", ":", message_hash), in hex.
pub fn node_hash(prev: Option<&str>, message_hash: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev.unwrap_or("").as_bytes());
    hasher.update(b":");
    hasher.update(message_hash.as_bytes());
    keel_types::hex(&hasher.finalize())
}

/// Encodes journal params: params without a non-empty `messages` array are one blob as
/// they are; otherwise the blob keeps the other fields and the hash of the last node, and
/// the returned links are the chain's nodes, first message first.
pub fn split_params(params: &Value) -> (Blob, Vec<ChainLink>) {
    let Some(object) = params.as_object() else {
        return (Blob::of(params), Vec::new());
    };
    // The conversation to chain, if there is one (an empty `messages` stays a field).
    let messages = object.get("messages").and_then(Value::as_array).filter(|messages| !messages.is_empty());
    let escaped = object.len() == 1 && object.contains_key(SPLIT_KEY);
    if messages.is_none() && !escaped {
        return (Blob::of(params), Vec::new());
    }
    let mut links = Vec::new();
    let mut prev: Option<String> = None;
    for message in messages.into_iter().flatten() {
        let message = Blob::of(message);
        let hash = node_hash(prev.as_deref(), &message.hash);
        links.push(ChainLink { hash: hash.clone(), prev: prev.replace(hash), message });
    }
    // The other fields, written from the params in place (nothing copied).
    let fields = Fields { object, without_messages: messages.is_some() };
    let manifest = Manifest { split: Split { chain: prev.as_deref(), fields } };
    (Blob::of(&manifest), links)
}

/// The params blob of split params: `{"$keel_messages": {"chain": ..., "fields": {...}}}`,
/// the keys in the order a `Map` without `preserve_order` writes them (the blob is read
/// back as JSON, so the order is not part of the format; it keeps the bytes, and so the
/// content address, of params stored before).
#[derive(serde::Serialize)]
struct Manifest<'a> {
    #[serde(rename = "$keel_messages")]
    split: Split<'a>,
}

#[derive(serde::Serialize)]
struct Split<'a> {
    chain: Option<&'a str>,
    fields: Fields<'a>,
}

/// The params' fields but `messages` (when those are chained).
struct Fields<'a> {
    object: &'a Map<String, Value>,
    without_messages: bool,
}

impl serde::Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.object {
            if !(self.without_messages && key == "messages") {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// The links a backend still has to store, given whether a node is stored already: a
/// stored node implies its whole prefix is (nodes are written prefix first), so the walk
/// from the end stops at the first stored node and a re-sent history costs one lookup.
pub fn unstored_links(
    links: &[ChainLink],
    mut is_stored: impl FnMut(&ChainLink) -> Result<bool>,
) -> Result<&[ChainLink]> {
    let mut missing = links.len();
    while missing > 0 && !is_stored(&links[missing - 1])? {
        missing -= 1;
    }
    Ok(&links[missing..])
}

/// The last node of the message chain that params read back from their blob refer to
/// (`None` for params not stored split, or split without messages). A backend that reads
/// many entries at once can fetch every chain they need in one query, then join them with
/// `ChainCache::join_params`.
pub fn chain_end(params: &Value) -> Option<&str> {
    params.as_object().filter(|o| o.len() == 1)?.get(SPLIT_KEY)?.get("chain")?.as_str()
}

/// Message chain nodes already read, by hash: one journal read walks each shared prefix
/// once, however many entries repeat it.
#[derive(Debug, Default)]
pub struct ChainCache {
    nodes: HashMap<String, ChainNode>,
}

impl ChainCache {
    /// Turns params read back from their blob into the params as written: params stored
    /// split get their `messages` back from the chain, others stay as they are. `place`
    /// names the payload in errors (called only for split params); `load` reads a node
    /// from the backend (`None` when it is missing), given the node's hash and the place.
    pub fn join_params(
        &mut self,
        params: &mut Value,
        place: impl FnOnce() -> String,
        mut load: impl FnMut(&str, &str) -> Result<Option<ChainNode>>,
    ) -> Result<()> {
        let Some(split) = params.as_object().filter(|o| o.len() == 1).and_then(|o| o.get(SPLIT_KEY)) else {
            return Ok(());
        };
        let place = place();
        let mut fields: Map<String, Value> = match split.get("fields") {
            Some(Value::Object(fields)) => fields.clone(),
            _ => return Err(Error::Corrupt(format!("{place}: a split payload without fields"))),
        };
        if let Some(last) = split.get("chain").and_then(Value::as_str) {
            let mut messages = Vec::new();
            let mut next = Some(last.to_owned());
            while let Some(hash) = next {
                if !self.nodes.contains_key(&hash) {
                    let node = load(&hash, &place)?.ok_or_else(|| {
                        Error::Corrupt(format!("{place}: message chain node {hash} is missing"))
                    })?;
                    self.nodes.insert(hash.clone(), node);
                }
                let node = &self.nodes[&hash];
                messages.push(node.message.clone());
                next = node.prev.clone();
            }
            messages.reverse();
            fields.insert("messages".to_owned(), Value::Array(messages));
        }
        *params = Value::Object(fields);
        Ok(())
    }
}

/// A journal entry with its payloads encoded, ready for any backend to write: done in
/// the caller's task, before a backend's writer thread or connection is involved.
pub(crate) struct EncodedEntry {
    pub(crate) method: String,
    pub(crate) params: Blob,
    /// The message chain `params` refers to, if it has one.
    pub(crate) params_chain: Vec<ChainLink>,
    pub(crate) params_hash: String,
    pub(crate) status: keel_types::EntryStatus,
    pub(crate) result: Option<Blob>,
    pub(crate) error: Option<Blob>,
    pub(crate) attempt: u32,
    pub(crate) started_at_ms: u64,
    pub(crate) finished_at_ms: Option<u64>,
    pub(crate) usage: keel_types::Usage,
}

impl EncodedEntry {
    pub(crate) fn of(entry: &crate::NewEntry) -> EncodedEntry {
        let (params, params_chain) = split_params(&entry.params);
        EncodedEntry {
            method: entry.method.clone(),
            params,
            params_chain,
            params_hash: entry.params_hash.clone(),
            status: entry.status,
            result: entry.result.as_ref().map(Blob::of),
            error: entry.error.as_ref().map(Blob::of),
            attempt: entry.attempt,
            started_at_ms: entry.started_at_ms,
            finished_at_ms: entry.finished_at_ms,
            usage: entry.usage,
        }
    }

    /// A recorded entry encoded as `append_entry` stores it (for `restore`).
    pub(crate) fn of_recorded(entry: &crate::JournalEntry) -> EncodedEntry {
        EncodedEntry::of(&crate::NewEntry {
            method: entry.method.clone(),
            params: entry.params.clone(),
            params_hash: entry.params_hash.clone(),
            status: entry.status,
            result: entry.result.clone(),
            error: entry.error.clone(),
            attempt: entry.attempt,
            started_at_ms: entry.started_at_ms,
            finished_at_ms: entry.finished_at_ms,
            usage: entry.usage,
        })
    }
}

/// A `Completion` with its payloads encoded.
pub(crate) struct EncodedCompletion {
    pub(crate) status: keel_types::EntryStatus,
    pub(crate) result: Option<Blob>,
    pub(crate) error: Option<Blob>,
    pub(crate) finished_at_ms: u64,
    pub(crate) usage: keel_types::Usage,
    pub(crate) provider_served: bool,
}

impl EncodedCompletion {
    pub(crate) fn of(completion: &crate::Completion) -> EncodedCompletion {
        EncodedCompletion {
            status: completion.status,
            result: completion.result.as_ref().map(Blob::of),
            error: completion.error.as_ref().map(Blob::of),
            finished_at_ms: completion.finished_at_ms,
            usage: completion.usage,
            provider_served: completion.provider_served,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// A backend in a map: blobs by hash, nodes by hash.
    #[derive(Default)]
    struct MapStore {
        blobs: HashMap<String, Vec<u8>>,
        nodes: HashMap<String, (Option<String>, String)>,
    }

    impl MapStore {
        /// Stores params as a backend does and returns the hash of their blob.
        fn put(&mut self, params: &Value) -> String {
            let (blob, links) = split_params(params);
            let unstored = unstored_links(&links, |link| Ok(self.nodes.contains_key(&link.hash))).unwrap();
            for link in unstored {
                self.blobs.insert(link.message.hash.clone(), link.message.bytes.clone());
                self.nodes.insert(link.hash.clone(), (link.prev.clone(), link.message.hash.clone()));
            }
            self.blobs.insert(blob.hash.clone(), blob.bytes);
            blob.hash
        }

        fn get(&self, hash: &str) -> Result<Value> {
            let mut params: Value = serde_json::from_slice(&self.blobs[hash]).unwrap();
            ChainCache::default().join_params(
                &mut params,
                || "the params".to_owned(),
                |hash, _| {
                    Ok(self.nodes.get(hash).map(|(prev, message)| ChainNode {
                        prev: prev.clone(),
                        message: serde_json::from_slice(&self.blobs[message]).unwrap(),
                    }))
                },
            )?;
            Ok(params)
        }
    }

    /// The hashes are stored in every database: pin them to values computed apart from
    /// this code (Python's hashlib).
    #[test]
    fn node_hashes_are_the_stored_ones() {
        let hello = Blob::of(&json!("hello"));
        assert_eq!(hello.bytes, b"\"hello\"");
        assert_eq!(hello.hash, "5aa762ae383fbb727af3c7a36d4940a5b8c40a989452d2304fc958ff3f354e7a");
        let first = node_hash(None, &hello.hash);
        assert_eq!(first, "2614388b3e84e8d8d5dbf7b71eed4330c945b8c00661c8f0404754d86583a02f");
        let world = Blob::of(&json!("world"));
        assert_eq!(
            node_hash(Some(&first), &world.hash),
            "7dcf949ee31ca7cc9a466ff50309281b9a4b5acff2f9eb134c9e0e96b6f281f3"
        );
    }

    #[test]
    fn params_without_messages_are_one_blob_as_they_are() {
        for params in [json!(null), json!([1, 2]), json!({"model": "m"}), json!({"messages": []})] {
            let (blob, links) = split_params(&params);
            assert_eq!(blob, Blob::of(&params));
            assert!(links.is_empty(), "{params}");
        }
    }

    #[test]
    fn messages_become_a_chain_and_the_blob_names_its_end() {
        let (blob, links) = split_params(&json!({"model": "m", "messages": ["hello", "world"]}));
        assert_eq!(links.len(), 2);
        assert_eq!(links[0].prev, None);
        assert_eq!(links[1].prev.as_deref(), Some(links[0].hash.as_str()));
        assert_eq!(links[1].message, Blob::of(&json!("world")));
        let manifest: Value = serde_json::from_slice(&blob.bytes).unwrap();
        assert_eq!(manifest, json!({SPLIT_KEY: {"fields": {"model": "m"}, "chain": links[1].hash}}));
    }

    /// The manifest is written from the params in place; its bytes (its content address)
    /// are those of the manifest built as a `Value`, as before.
    #[test]
    fn the_manifest_is_the_bytes_of_the_manifest_as_a_value() {
        for params in [
            json!({"model": "m", "max_tokens": 16, "temperature": 0.5, "messages": [{"role": "user", "content": "hi"}], "z": null}),
            json!({"messages": ["a"]}),
            json!({SPLIT_KEY: {"fields": {}, "chain": "not a node"}}),
        ] {
            let (blob, links) = split_params(&params);
            let mut fields = params.as_object().unwrap().clone();
            if !links.is_empty() {
                fields.remove("messages");
            }
            let chain = links.last().map(|link| link.hash.clone());
            assert_eq!(
                blob,
                Blob::of(&json!({ SPLIT_KEY: { "fields": fields, "chain": chain } })),
                "{params}"
            );
        }
    }

    #[test]
    fn chain_end_names_the_last_node_of_split_params_only() {
        let (blob, links) = split_params(&json!({"messages": ["a", "b"]}));
        let stored: Value = serde_json::from_slice(&blob.bytes).unwrap();
        assert_eq!(chain_end(&stored), Some(links[1].hash.as_str()));
        assert_eq!(chain_end(&json!({"messages": ["a"]})), None, "params as written are not split");
        assert_eq!(chain_end(&json!({SPLIT_KEY: {"fields": {}, "chain": null}})), None);
    }

    #[test]
    fn params_shaped_like_a_split_blob_are_escaped() {
        let params = json!({SPLIT_KEY: {"fields": {}, "chain": "not a node"}});
        let (blob, links) = split_params(&params);
        assert!(links.is_empty());
        let manifest: Value = serde_json::from_slice(&blob.bytes).unwrap();
        assert_eq!(manifest, json!({SPLIT_KEY: {"fields": params, "chain": null}}));
        let mut store = MapStore::default();
        let hash = store.put(&params);
        assert_eq!(store.get(&hash).unwrap(), params);
    }

    #[test]
    fn a_longer_conversation_stores_only_its_new_messages() {
        let mut store = MapStore::default();
        store.put(&json!({"messages": ["a", "b", "c"]}));
        let nodes = store.nodes.len();
        let (_, links) = split_params(&json!({"messages": ["a", "b", "c", "d"]}));
        let unstored = unstored_links(&links, |link| Ok(store.nodes.contains_key(&link.hash))).unwrap();
        assert_eq!(unstored, &links[3..]);
        assert_eq!(nodes, 3);
    }

    #[test]
    fn missing_node_and_fields_are_corrupt() {
        let mut params = json!({SPLIT_KEY: {"fields": {}, "chain": "abc"}});
        let missing = ChainCache::default().join_params(&mut params, || "here".to_owned(), |_, _| Ok(None));
        assert!(
            matches!(&missing, Err(Error::Corrupt(m)) if m == "here: message chain node abc is missing"),
            "{missing:?}"
        );
        let mut params = json!({SPLIT_KEY: {"chain": null}});
        let no_fields = ChainCache::default().join_params(&mut params, || "here".to_owned(), |_, _| Ok(None));
        assert!(
            matches!(&no_fields, Err(Error::Corrupt(m)) if m == "here: a split payload without fields"),
            "{no_fields:?}"
        );
    }

    /// JSON without floats (whose text form need not read back bit-exact), with the keys
    /// this encoding treats specially among the others.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z$:\" ]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}|messages|\\$keel_messages|fields|chain", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_params_read_back_exactly(params in json_value(), messages in prop::collection::vec(json_value(), 0..5)) {
            let mut store = MapStore::default();
            let with_messages = match params.clone() {
                Value::Object(mut object) => {
                    object.insert("messages".to_owned(), Value::Array(messages));
                    Value::Object(object)
                }
                other => other,
            };
            for params in [params, with_messages] {
                let hash = store.put(&params);
                prop_assert_eq!(&store.get(&hash).unwrap(), &params);
                // Split params: the manifest's bytes are those of the manifest as a `Value`.
                let (blob, links) = split_params(&params);
                let split = params.as_object().filter(|object| {
                    let escaped = object.len() == 1 && object.contains_key(SPLIT_KEY);
                    escaped || object.get("messages").and_then(Value::as_array).is_some_and(|m| !m.is_empty())
                });
                if let Some(object) = split {
                    let mut fields = object.clone();
                    if !links.is_empty() {
                        fields.remove("messages");
                    }
                    let chain = links.last().map(|link| link.hash.clone());
                    prop_assert_eq!(blob, Blob::of(&json!({ SPLIT_KEY: { "fields": fields, "chain": chain } })));
                }
            }
        }

        #[test]
        fn conversations_share_their_prefix_nodes(messages in prop::collection::vec(json_value(), 1..6), cut in 0usize..6) {
            let cut = cut.min(messages.len());
            let (_, whole) = split_params(&json!({"messages": messages}));
            let (_, prefix) = split_params(&json!({"messages": messages[..cut]}));
            prop_assert_eq!(&whole[..cut], &prefix[..]);
        }
    }
}
