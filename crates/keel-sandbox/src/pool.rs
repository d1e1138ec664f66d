//! The pool of pre-built sandboxes: per configuration key (see `process::Prepared`), up
//! to `size` sandboxes whose init has built the root and waits for a job. A launch with a
//! matching key takes one (a claim: hand over the job, wait for exec); the pool refills
//! in the background. Only the most recently used configurations are kept, and a
//! sandbox idle for too long is discarded (its view of the host was taken when built).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use crate::process::Built;

/// Configurations kept warm at once.
const MAX_KEYS: usize = 8;
/// A pooled sandbox older than this is discarded instead of claimed.
const MAX_IDLE: Duration = Duration::from_secs(120);

pub(crate) struct Pool {
    size: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    idle: HashMap<String, VecDeque<Built>>,
    /// Keys in order of last use, oldest first.
    recent: VecDeque<String>,
    refilling: HashSet<String>,
}

impl Pool {
    pub(crate) fn new(size: usize) -> Pool {
        Pool { size, state: Mutex::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Single inserts and removes: consistent even after a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ready sandbox for `key`, if one is fresh enough.
    pub(crate) fn take(&self, key: &str) -> Option<Built> {
        let mut state = self.state();
        touch(&mut state, key);
        let queue = state.idle.get_mut(key)?;
        while let Some(built) = queue.pop_front() {
            if built.built_at.elapsed() < MAX_IDLE {
                return Some(built);
            }
        }
        None
    }

    pub(crate) fn ready(&self, key: &str) -> usize {
        self.state().idle.get(key).map_or(0, VecDeque::len)
    }

    /// Whether `key` has fewer ready sandboxes than the pool size.
    pub(crate) fn wants(&self, key: &str) -> bool {
        self.size > 0 && self.ready(key) < self.size
    }

    pub(crate) fn put(&self, key: &str, built: Built) {
        let evicted = {
            let mut state = self.state();
            touch(&mut state, key);
            state.idle.entry(key.to_owned()).or_default().push_back(built);
            let mut evicted = Vec::new();
            while state.recent.len() > MAX_KEYS {
                if let Some(old) = state.recent.pop_front()
                    && let Some(queue) = state.idle.remove(&old)
                {
                    evicted.extend(queue);
                }
            }
            evicted
        };
        drop(evicted); // Outside the lock: dropping ends those sandboxes.
    }

    /// Ready sandboxes (fresh enough to be claimed) across every configuration, and how
    /// many the pool aims to keep: its size for each configuration kept warm.
    pub(crate) fn status(&self) -> crate::PoolStatus {
        let state = self.state();
        let warm = state.idle.values().flatten().filter(|built| built.built_at.elapsed() < MAX_IDLE).count();
        crate::PoolStatus { warm, target: self.size * state.recent.len() }
    }

    /// Takes every ready sandbox out (dropping them ends them).
    pub(crate) fn drain(&self) -> Vec<Built> {
        let mut state = self.state();
        state.idle.drain().flat_map(|(_, queue)| queue).collect()
    }

    /// Marks `key` as being refilled; false if it already is.
    pub(crate) fn start_refill(&self, key: &str) -> bool {
        self.state().refilling.insert(key.to_owned())
    }

    pub(crate) fn end_refill(&self, key: &str) {
        self.state().refilling.remove(key);
    }
}

fn touch(state: &mut State, key: &str) {
    state.recent.retain(|k| k != key);
    state.recent.push_back(key.to_owned());
}
