//! What agent frameworks need in a run's environment beyond `OPENAI_BASE_URL` and
//! `OPENAI_API_KEY`, so that an unmodified framework finds the kernel and does not try to
//! reach the internet from a sandbox that has none: a small table, one reason per entry.
//!
//! Each entry is set only when the run's environment does not have it already, so a
//! user's own `--env NAME=VALUE` wins. The README's "Frameworks" section lists them; the
//! framework matrix (`keel-cli/tests/it/frameworks.rs`) runs each framework against them.

use std::collections::BTreeMap;

/// One variable `keel run` sets for agent frameworks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameworkVar {
    pub name: &'static str,
    pub value: &'static str,
    /// Which framework reads it, and why Keel sets it.
    pub why: &'static str,
}

/// The table. Only switches that turn off a framework's own calls home or point it at the
/// kernel: nothing here changes what an agent computes.
pub(crate) const FRAMEWORK_VARS: &[FrameworkVar] = &[
    FrameworkVar {
        name: "OPENAI_AGENTS_DISABLE_TRACING",
        value: "1",
        why: "the OpenAI Agents SDK exports a trace of every run to api.openai.com with \
              OPENAI_API_KEY as its key: that key is the run's token, which must not leave for \
              a third party, and a sandbox has no network (the exporter retries and prints \
              `[non-fatal] Tracing request failed`)",
    },
    FrameworkVar {
        name: "CREWAI_DISABLE_TELEMETRY",
        value: "true",
        why: "CrewAI sends OpenTelemetry spans to telemetry.crewai.com:4319 by default; in a \
              sandbox without network every export fails, and waiting for them adds seconds \
              to every run",
    },
    FrameworkVar {
        name: "LITELLM_LOCAL_MODEL_COST_MAP",
        value: "True",
        why: "LiteLLM (under CrewAI's non-native providers, smolagents' LiteLLMModel, the \
              Agents SDK's LitellmModel) downloads its model price map from GitHub when \
              imported; use the copy it ships. It finds the kernel through OPENAI_BASE_URL \
              and ANTHROPIC_BASE_URL, which it reads itself",
    },
];

/// Adds the table's variables that `env` does not set already.
pub(crate) fn add_framework_vars(env: &mut BTreeMap<String, String>) {
    for var in FRAMEWORK_VARS {
        env.entry(var.name.to_owned()).or_insert_with(|| var.value.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_is_set_with_a_reason_and_a_users_own_value_wins() {
        let mut env = BTreeMap::from([("CREWAI_DISABLE_TELEMETRY".to_owned(), "false".to_owned())]);
        add_framework_vars(&mut env);
        assert_eq!(env["CREWAI_DISABLE_TELEMETRY"], "false", "the user's --env wins");
        assert_eq!(env["OPENAI_AGENTS_DISABLE_TRACING"], "1");
        assert_eq!(env["LITELLM_LOCAL_MODEL_COST_MAP"], "True");
        assert_eq!(env.len(), FRAMEWORK_VARS.len());
        for var in FRAMEWORK_VARS {
            assert!(var.why.len() > 40, "{} needs its reason", var.name);
        }
    }
}
