//! Memory search, the parts every backend shares: the words of a text query, how
//! embeddings are stored (f32 little-endian), cosine similarity, the best-k of a
//! brute-force scan, snippets of semantic hits, and reciprocal rank fusion for hybrid
//! search. Pure; the backend runs its own full-text index and reads the vectors.

use std::collections::HashMap;

use crate::{Error, MemoryHit, Result};

/// The reciprocal rank fusion constant (the usual 60: a hit's weight fades slowly with
/// its rank, so agreement between the rankings counts more than either's top).
pub const RRF_K: f64 = 60.0;

/// How deep each ranking goes before fusion, at least.
pub const FUSION_DEPTH: usize = 50;

/// How deep each ranking of a hybrid search asking for `limit` hits goes.
pub fn fusion_depth(limit: usize) -> usize {
    limit.max(FUSION_DEPTH)
}

/// The words of a text query: its runs of alphanumeric characters. Everything else
/// (punctuation, operators of any full-text syntax) only separates words, so no user text
/// is ever read as syntax; a query without words has no hits.
pub fn query_words(query: &str) -> Vec<&str> {
    query.split(|c: char| !c.is_alphanumeric()).filter(|word| !word.is_empty()).collect()
}

/// Reciprocal rank fusion of rankings (each best first): a key's score is the sum over
/// the rankings that have it of 1 / (RRF_K + rank), rank 1-based; ties by key. The
/// snippet is the first ranking's that has one.
pub fn fuse(rankings: &[Vec<MemoryHit>], limit: usize) -> Vec<MemoryHit> {
    let mut fused: Vec<MemoryHit> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    for ranking in rankings {
        for (rank, hit) in ranking.iter().enumerate() {
            let score = 1.0 / (RRF_K + rank as f64 + 1.0);
            match position.get(&hit.key) {
                Some(&at) => fused[at].score += score,
                None => {
                    position.insert(hit.key.clone(), fused.len());
                    fused.push(MemoryHit { key: hit.key.clone(), score, snippet: hit.snippet.clone() });
                }
            }
        }
    }
    fused.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.key.cmp(&b.key)));
    fused.truncate(limit);
    fused
}

/// An embedding as stored: its f32 values, little-endian, 4 bytes each.
pub fn vector_to_bytes(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An embedding read back from `vector_to_bytes`; `None` when the length is not a
/// multiple of 4.
pub fn vector_from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    bytes.len().is_multiple_of(4).then(|| {
        bytes
            .chunks_exact(4)
            .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            .collect()
    })
}

/// A query embedding ready to compare with stored ones.
#[derive(Debug, Clone, Copy)]
pub struct CosineQuery<'a> {
    vector: &'a [f32],
    norm: f32,
}

impl<'a> CosineQuery<'a> {
    /// `None` for a zero vector, which is similar to nothing.
    pub fn new(vector: &'a [f32]) -> Option<CosineQuery<'a>> {
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        (norm != 0.0).then_some(CosineQuery { vector, norm })
    }

    /// How many bytes a stored embedding of the query's length has.
    pub fn stored_len(&self) -> usize {
        self.vector.len() * 4
    }

    /// The cosine similarity of a stored embedding (as `vector_to_bytes` wrote it, of
    /// `stored_len()` bytes: the caller checks) to the query, read straight from its bytes;
    /// `None` for a zero vector.
    pub fn similarity(&self, stored: &[u8]) -> Option<f32> {
        let (mut dot, mut norm) = (0f32, 0f32);
        for (chunk, q) in stored.chunks_exact(4).zip(self.vector) {
            let x = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            dot += x * q;
            norm += x * x;
        }
        (norm != 0.0).then(|| dot / (norm.sqrt() * self.norm))
    }
}

/// The best `limit` hits of a brute-force scan, kept sorted (best first, ties by key)
/// as candidates arrive, so a small limit keeps the scan cheap.
#[derive(Debug)]
pub struct BestHits {
    limit: usize,
    /// (score, key, text), best first.
    best: Vec<(f32, String, String)>,
}

impl BestHits {
    pub fn new(limit: usize) -> BestHits {
        BestHits { limit, best: Vec::new() }
    }

    /// Whether a candidate with this score could enter: lets the scan skip reading the
    /// key and text of one that cannot. Once `limit` hits are kept, a candidate that only
    /// ties the worst of them does not enter, whatever its key: at the cut, ties go to
    /// the one scanned first.
    pub fn admits(&self, score: f32) -> bool {
        !(self.best.len() == self.limit && self.best.last().is_some_and(|worst| worst.0 >= score))
    }

    /// Offers a candidate; it is kept if it is among the best `limit` so far.
    pub fn offer(&mut self, score: f32, key: String, text: String) {
        if !self.admits(score) {
            return;
        }
        let at = self
            .best
            .binary_search_by(|probe| score.total_cmp(&probe.0).then_with(|| probe.1.cmp(&key)))
            .unwrap_or_else(|at| at);
        self.best.insert(at, (score, key, text));
        self.best.truncate(self.limit);
    }

    /// Offers an embedding a brute-force scan read (as `vector_to_bytes` wrote it):
    /// compared with `query`, and kept with the record's key and text (read by `record`
    /// only when the score can enter). A stored vector of the wrong length is corrupt
    /// data of `namespace`; a zero vector is similar to nothing.
    pub fn offer_stored(
        &mut self,
        query: &CosineQuery<'_>,
        stored: &[u8],
        namespace: &str,
        record: impl FnOnce() -> Result<(String, String)>,
    ) -> Result<()> {
        if stored.len() != query.stored_len() {
            return Err(Error::Corrupt(format!(
                "a memory embedding of namespace {namespace:?} has {} bytes, not {}",
                stored.len(),
                query.stored_len()
            )));
        }
        let Some(score) = query.similarity(stored) else {
            return Ok(());
        };
        if self.admits(score) {
            let (key, text) = record()?;
            self.offer(score, key, text);
        }
        Ok(())
    }

    /// The hits, best first, each with the start of its text as snippet.
    pub fn into_hits(self) -> Vec<MemoryHit> {
        self.best
            .into_iter()
            .map(|(score, key, text)| MemoryHit {
                key,
                score: f64::from(score),
                snippet: leading_snippet(&text),
            })
            .collect()
    }
}

/// The snippet of a semantic hit: the start of the text (there are no terms to mark).
pub fn leading_snippet(text: &str) -> String {
    const MAX_CHARS: usize = 96;
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX_CHARS).collect();
    if chars.next().is_some() { format!("{head}...") } else { head }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hit(key: &str) -> MemoryHit {
        MemoryHit { key: key.to_owned(), score: 0.0, snippet: format!("about {key}") }
    }

    #[test]
    fn query_words_drop_punctuation_and_syntax() {
        assert_eq!(query_words("rust, \"tokio\" OR-async*"), ["rust", "tokio", "OR", "async"]);
        assert_eq!(query_words("naïve café"), ["naïve", "café"]);
        assert!(query_words("  ()*:^ ").is_empty());
    }

    #[test]
    fn fusion_scores_are_reciprocal_ranks_summed() {
        let fused = fuse(&[vec![hit("a"), hit("b")], vec![hit("b"), hit("c")]], 10);
        let keys: Vec<&str> = fused.iter().map(|hit| hit.key.as_str()).collect();
        assert_eq!(keys, ["b", "a", "c"], "b is in both rankings");
        assert_eq!(fused[0].score, 1.0 / 62.0 + 1.0 / 61.0);
        assert_eq!(fused[1].score, 1.0 / 61.0);
        assert_eq!(fused[2].score, 1.0 / 62.0);
        assert_eq!(fused[0].snippet, "about b");
    }

    #[test]
    fn fusion_ties_go_by_key_and_limit_cuts() {
        let fused = fuse(&[vec![hit("z")], vec![hit("a")]], 1);
        assert_eq!(fused.len(), 1);
        assert_eq!(fused[0].key, "a");
        assert!(fuse(&[], 5).is_empty());
    }

    #[test]
    fn fusion_depth_is_at_least_fifty() {
        assert_eq!(fusion_depth(3), 50);
        assert_eq!(fusion_depth(80), 80);
    }

    #[test]
    fn vectors_are_stored_little_endian() {
        assert_eq!(vector_to_bytes(&[1.0, -2.5]), [0, 0, 128, 63, 0, 0, 32, 192]);
        assert_eq!(vector_from_bytes(&[0, 0, 128]), None);
    }

    #[test]
    fn cosine_similarity() {
        let query = CosineQuery::new(&[1.0, 0.0]).unwrap();
        assert_eq!(query.stored_len(), 8);
        assert_eq!(query.similarity(&vector_to_bytes(&[3.0, 0.0])), Some(1.0));
        assert_eq!(query.similarity(&vector_to_bytes(&[0.0, 2.0])), Some(0.0));
        assert_eq!(query.similarity(&vector_to_bytes(&[-1.0, 0.0])), Some(-1.0));
        assert_eq!(
            query.similarity(&vector_to_bytes(&[0.0, 0.0])),
            None,
            "a zero vector is similar to nothing"
        );
        assert!(CosineQuery::new(&[0.0, 0.0]).is_none());
    }

    #[test]
    fn best_hits_keep_the_best_sorted_ties_by_key() {
        let mut best = BestHits::new(3);
        best.offer(0.5, "b".to_owned(), "text b".to_owned());
        best.offer(0.9, "c".to_owned(), "text c".to_owned());
        best.offer(0.5, "a".to_owned(), "text a".to_owned());
        assert!(!best.admits(0.4), "full, and 0.4 is below the worst kept");
        assert!(!best.admits(0.5), "full: a tie with the worst kept does not enter");
        best.offer(0.5, "0".to_owned(), "text 0".to_owned());
        best.offer(0.7, "d".to_owned(), "text d".to_owned());
        let hits = best.into_hits();
        let keys: Vec<&str> = hits.iter().map(|hit| hit.key.as_str()).collect();
        assert_eq!(keys, ["c", "d", "a"], "equal scores by key; the worst cut");
        assert_eq!(hits[2].snippet, "text a");
        assert!(BestHits::new(0).into_hits().is_empty());
    }

    #[test]
    fn leading_snippets_cut_long_text() {
        assert_eq!(leading_snippet("short"), "short");
        let long = "é".repeat(100);
        assert_eq!(leading_snippet(&long), format!("{}...", "é".repeat(96)));
        assert_eq!(leading_snippet(&"x".repeat(96)), "x".repeat(96));
    }

    proptest! {
        #[test]
        fn vectors_round_trip(vector in prop::collection::vec(any::<f32>(), 0..64)) {
            let bytes = vector_to_bytes(&vector);
            prop_assert_eq!(bytes.len(), vector.len() * 4);
            let back = vector_from_bytes(&bytes).unwrap();
            // Bit-exact, NaNs included.
            prop_assert_eq!(
                back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                vector.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }

        #[test]
        fn similarity_is_bounded_and_ignores_scale(
            pair in prop::collection::vec((-100f32..100f32, -100f32..100f32), 1..16),
            scale in 0.01f32..100f32,
        ) {
            let (query, stored): (Vec<f32>, Vec<f32>) = pair.into_iter().unzip();
            let Some(cosine) = CosineQuery::new(&query) else { return Ok(()) };
            let Some(score) = cosine.similarity(&vector_to_bytes(&stored)) else { return Ok(()) };
            prop_assert!((-1.001..=1.001).contains(&score), "{score}");
            let scaled: Vec<f32> = stored.iter().map(|x| x * scale).collect();
            if let Some(scaled_score) = cosine.similarity(&vector_to_bytes(&scaled)) {
                prop_assert!((score - scaled_score).abs() < 1e-3, "{score} vs {scaled_score}");
            }
        }

        #[test]
        fn fused_hits_are_sorted_unique_and_limited(
            rankings in prop::collection::vec(prop::collection::vec("[a-e]", 0..6), 0..4),
            limit in 0usize..8,
        ) {
            let rankings: Vec<Vec<MemoryHit>> =
                rankings.iter().map(|keys| keys.iter().map(|key| hit(key)).collect()).collect();
            let fused = fuse(&rankings, limit);
            prop_assert!(fused.len() <= limit);
            for pair in fused.windows(2) {
                prop_assert!(pair[0].score > pair[1].score || (pair[0].score == pair[1].score && pair[0].key < pair[1].key));
            }
        }
    }
}
