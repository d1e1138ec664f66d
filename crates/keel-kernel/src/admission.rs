//! Admission control: how many runs are live at once (globally, per tenant, per agent
//! spec), in which order queued runs start (priority with aging, weighted fair share
//! between tenants), and when submission is refused (a full queue answers 429 with
//! `Retry-After`). The policy is `keel_core::sched::Admitter`; here is its state in the
//! kernel and the `[scheduler]` table of keel.toml:
//!
//! ```toml
//! [scheduler]
//! max_live = 200            # live runs in all (absent: no cap)
//! max_live_per_tenant = 50
//! max_live_per_agent = 20   # per agent spec (its command)
//! max_live_per_node = 100   # live runs on this node (`keel serve --max-live`)
//! queue = 10000             # runs that may wait in `queued`; beyond: 429
//! aging_secs = 30           # a waiting run rises one priority class per 30 s
//! weights = { acme = 3, globex = 1 }
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;

use keel_core::placement::Placement;
use keel_core::sched::{Admitter, Caps, Weights};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(default)]
    pub max_live: Option<u32>,
    #[serde(default)]
    pub max_live_per_tenant: Option<u32>,
    #[serde(default)]
    pub max_live_per_agent: Option<u32>,
    /// Live runs on this node alone (`keel serve --max-live` sets it). Among several
    /// nodes the other caps count every node's runs, and a queued run starts on a node
    /// with room; a kernel on its own takes the smaller of this and `max_live`.
    #[serde(default)]
    pub max_live_per_node: Option<u32>,
    #[serde(default = "default_queue")]
    pub queue: u32,
    #[serde(default = "default_aging")]
    pub aging_secs: u64,
    #[serde(default)]
    pub weights: BTreeMap<String, u32>,
}

impl Default for SchedulerConfig {
    /// No caps (every run starts at once), a queue of 10,000, aging every 30 s.
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            max_live: None,
            max_live_per_tenant: None,
            max_live_per_agent: None,
            max_live_per_node: None,
            queue: default_queue(),
            aging_secs: default_aging(),
            weights: BTreeMap::new(),
        }
    }
}

fn default_queue() -> u32 {
    10_000
}

fn default_aging() -> u64 {
    30
}

impl SchedulerConfig {
    /// The `[scheduler]` table of a keel.toml document (other tables are others').
    pub fn from_keel_toml(text: &str) -> std::result::Result<SchedulerConfig, String> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            scheduler: Option<toml::Value>,
        }
        let doc: Doc = toml::from_str(text).map_err(|e| format!("keel.toml: {e}"))?;
        let Some(table) = doc.scheduler else { return Ok(SchedulerConfig::default()) };
        let config: SchedulerConfig = table.try_into().map_err(|e| format!("keel.toml [scheduler]: {e}"))?;
        for (name, cap) in [
            ("max_live", config.max_live),
            ("max_live_per_tenant", config.max_live_per_tenant),
            ("max_live_per_agent", config.max_live_per_agent),
            ("max_live_per_node", config.max_live_per_node),
        ] {
            if cap == Some(0) {
                return Err(format!(
                    "keel.toml [scheduler]: `{name}` must be at least 1 (leave it out for no cap)"
                ));
            }
        }
        if config.weights.values().any(|w| *w == 0) {
            return Err("keel.toml [scheduler]: weights must be at least 1".into());
        }
        Ok(config)
    }

    /// Whether any cap applies: without one every run starts at once, and nodes of a
    /// cluster need not agree on anything.
    fn has_caps(&self) -> bool {
        self.max_live.is_some()
            || self.max_live_per_tenant.is_some()
            || self.max_live_per_agent.is_some()
            || self.max_live_per_node.is_some()
    }

    fn caps(&self) -> Caps {
        Caps {
            global: self.max_live,
            per_tenant: self.max_live_per_tenant,
            per_agent: self.max_live_per_agent,
            queue: self.queue,
        }
    }

    /// The policy of a kernel alone: this node is the whole cluster.
    fn admitter(&self) -> Admitter {
        let mut caps = self.caps();
        caps.global = match (caps.global, self.max_live_per_node) {
            (Some(global), Some(node)) => Some(global.min(node)),
            (global, node) => global.or(node),
        };
        Admitter::new(caps, Weights(self.weights.clone()), self.aging_secs * 1000)
    }

    /// The policy of one node among several.
    fn placement(&self) -> Placement {
        Placement {
            caps: self.caps(),
            weights: Weights(self.weights.clone()),
            aging_ms: self.aging_secs * 1000,
            node_cap: self.max_live_per_node,
        }
    }
}

/// Where admission is decided: in this kernel's memory (a kernel alone, or nodes with no
/// caps to agree on), or on the cluster's ledger in the shared store.
pub(crate) struct Admissions {
    admitter: Mutex<Admitter>,
    /// Among several nodes with caps: the policy every decision on the ledger applies.
    /// `admitter` then holds the ledger as last seen, for `keel ps`'s queue positions.
    shared: Option<Placement>,
}

impl Admissions {
    pub(crate) fn new(config: &SchedulerConfig, clustered: bool) -> Admissions {
        let shared = (clustered && config.has_caps()).then(|| config.placement());
        Admissions { admitter: Mutex::new(config.admitter()), shared }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Admitter> {
        self.admitter.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn shared(&self) -> Option<&Placement> {
        self.shared.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheduler_table_parses_and_refuses_nonsense() {
        let config = SchedulerConfig::from_keel_toml(
            "[llm]\n[scheduler]\nmax_live = 2\nqueue = 5\naging_secs = 10\nweights = { acme = 3 }\n",
        )
        .unwrap();
        assert_eq!((config.max_live, config.queue, config.aging_secs), (Some(2), 5, 10));
        assert_eq!(config.weights["acme"], 3);
        let defaults = SchedulerConfig::from_keel_toml("").unwrap();
        assert_eq!((defaults.max_live, defaults.queue, defaults.aging_secs), (None, 10_000, 30));
        assert!(
            SchedulerConfig::from_keel_toml("[scheduler]\nmax_live = 0\n").unwrap_err().contains("max_live")
        );
        assert!(
            SchedulerConfig::from_keel_toml("[scheduler]\nmax_lives = 1\n")
                .unwrap_err()
                .contains("max_lives")
        );
        assert!(SchedulerConfig::from_keel_toml("[scheduler]\nweights = { a = 0 }\n").is_err());
    }
}
