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
//! queue = 10000             # runs that may wait in `queued`; beyond: 429
//! aging_secs = 30           # a waiting run rises one priority class per 30 s
//! weights = { acme = 3, globex = 1 }
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;

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

    fn admitter(&self) -> Admitter {
        let caps = Caps {
            global: self.max_live,
            per_tenant: self.max_live_per_tenant,
            per_agent: self.max_live_per_agent,
            queue: self.queue,
        };
        Admitter::new(caps, Weights(self.weights.clone()), self.aging_secs * 1000)
    }
}

pub(crate) struct Admissions {
    admitter: Mutex<Admitter>,
}

impl Admissions {
    pub(crate) fn new(config: &SchedulerConfig) -> Admissions {
        Admissions { admitter: Mutex::new(config.admitter()) }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Admitter> {
        self.admitter.lock().unwrap_or_else(|p| p.into_inner())
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
