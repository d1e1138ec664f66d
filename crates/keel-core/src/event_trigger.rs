//! Event triggers as pure decisions: what a trigger listens for ([`Listen`]: a run of an
//! agent ending in some states, or a message published on a topic), whether it fires for
//! an occasion ([`decide`]), and the rules that keep chains of triggered runs finite.
//!
//! Loops: a run started by an event trigger never fires that same trigger (a trigger after
//! agent A whose own command is A would otherwise start itself for ever), and every run
//! carries its depth, the number of event fires that led to it: a run at
//! [`MAX_CHAIN_DEPTH`] fires nothing, so a loop through several triggers ends there.
//!
//! Times are Unix milliseconds passed in by the kernel; nothing here reads a clock.

use std::fmt;
use std::str::FromStr;

use keel_types::RunState;

/// The deepest a chain of event fires goes: a run that this many fires led to (a run
/// started by a trigger is one deeper than the run whose end or message fired it) fires
/// no event trigger. Sixteen leaves room for any pipeline a person writes (A, then B, then
/// C...) and stops a loop between triggers after sixteen runs, not sixteen thousand.
pub const MAX_CHAIN_DEPTH: u32 = 16;

/// The longest topic, as `ipc.publish` takes them.
pub const MAX_TOPIC_BYTES: usize = 256;

/// The longest agent name a trigger listens for.
pub const MAX_AGENT_BYTES: usize = 256;

/// What `--after-run AGENT` matches: the agent name of every run (`*`).
pub const ANY_AGENT: &str = "*";

/// Why an event trigger's definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error(
        "give exactly one of after_run (a run of an agent ends) and topic (a message is published on a topic)"
    )]
    OneOf,
    #[error("on {0:?} is not known; use succeeded, failed, cancelled or ended (any of them)")]
    UnknownEnd(String),
    #[error("on {0:?} applies to after_run only: a topic trigger fires on every message")]
    EndWithoutRun(String),
    #[error(
        "after_run {0:?} is not an agent name: give the file name of the agent's program or script \
         (report.py for `python3 jobs/report.py`, at most {MAX_AGENT_BYTES} bytes, no '/' or control \
         characters), or * for every agent"
    )]
    Agent(String),
    #[error("topic {0:?} is not a topic: use 1 to {MAX_TOPIC_BYTES} bytes without control characters")]
    Topic(String),
}

/// Which ends of a run fire a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedIn {
    Succeeded,
    Failed,
    Cancelled,
    /// Any end.
    Ended,
}

impl EndedIn {
    /// Whether a run ending in `state` is an end this listens for.
    pub fn matches(self, state: RunState) -> bool {
        match self {
            EndedIn::Succeeded => state == RunState::Succeeded,
            EndedIn::Failed => state == RunState::Failed,
            EndedIn::Cancelled => state == RunState::Cancelled,
            EndedIn::Ended => state.is_terminal(),
        }
    }
}

impl FromStr for EndedIn {
    type Err = EventError;
    fn from_str(text: &str) -> Result<EndedIn, EventError> {
        match text {
            "succeeded" => Ok(EndedIn::Succeeded),
            "failed" => Ok(EndedIn::Failed),
            "cancelled" => Ok(EndedIn::Cancelled),
            "ended" => Ok(EndedIn::Ended),
            _ => Err(EventError::UnknownEnd(text.to_owned())),
        }
    }
}

impl fmt::Display for EndedIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndedIn::Succeeded => "succeeded",
            EndedIn::Failed => "failed",
            EndedIn::Cancelled => "cancelled",
            EndedIn::Ended => "ended",
        })
    }
}

/// What an event trigger listens for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A run whose agent name is `agent` (or any, for [`ANY_AGENT`]) ends in `ended_in`.
    RunEnd { agent: String, ended_in: EndedIn },
    /// A message is published on `topic` in the trigger's tenant.
    Topic { topic: String },
}

impl Listen {
    /// From the API's fields: exactly one of `after_run` and `topic`; `on` (default
    /// `succeeded`) only with `after_run`.
    pub fn new(after_run: Option<&str>, on: Option<&str>, topic: Option<&str>) -> Result<Listen, EventError> {
        match (after_run, topic) {
            (Some(agent), None) => {
                let valid = agent == ANY_AGENT
                    || (!agent.is_empty()
                        && agent.len() <= MAX_AGENT_BYTES
                        && !agent.contains('/')
                        && !agent.chars().any(char::is_control));
                if !valid {
                    return Err(EventError::Agent(agent.to_owned()));
                }
                let ended_in = on.map_or(Ok(EndedIn::Succeeded), str::parse)?;
                Ok(Listen::RunEnd { agent: agent.to_owned(), ended_in })
            }
            (None, Some(topic)) => {
                if let Some(on) = on {
                    return Err(EventError::EndWithoutRun(on.to_owned()));
                }
                if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || topic.chars().any(char::is_control) {
                    return Err(EventError::Topic(topic.to_owned()));
                }
                Ok(Listen::Topic { topic: topic.to_owned() })
            }
            _ => Err(EventError::OneOf),
        }
    }
}

/// A trigger as the decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct Trigger<'a> {
    pub name: &'a str,
    pub listen: &'a Listen,
    pub paused: bool,
    /// Occasions at or before this time are settled (its creation, or its resumption):
    /// they do not fire.
    pub since_ms: u64,
}

/// The run behind an occasion: the run that ended, or the run that published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source<'a> {
    /// What started that run by itself (`event:NAME`, `schedule:NAME`...), if anything.
    pub started_by: Option<&'a str>,
    /// How many event fires led to that run (0 for a run started any other way).
    pub depth: u32,
}

/// Something that happened which an event trigger may fire for.
#[derive(Debug, Clone, Copy)]
pub enum Occasion<'a> {
    /// A run ended: its agent name, its end state, when.
    RunEnded { agent: &'a str, state: RunState, at_ms: u64, source: Source<'a> },
    /// A message was published on a topic; `source` is the publishing run (`None`: an
    /// operator).
    Published { topic: &'a str, at_ms: u64, source: Option<Source<'a>> },
}

/// Why a trigger does not fire for an occasion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The trigger is paused: occasions while paused are dropped.
    Paused,
    /// The occasion is not after the trigger's `since_ms` (before its creation or resumption).
    Settled,
    /// The trigger listens for something else (another agent, state or topic).
    NotListened,
    /// The run behind the occasion was started by this same trigger.
    SelfLoop,
    /// The run behind the occasion is [`MAX_CHAIN_DEPTH`] fires deep.
    ChainTooDeep,
}

impl Skip {
    /// Whether the skip is recorded as a fire of the trigger (so `show` says why a run did
    /// not start): only a chain cut short is; the other skips are the trigger's ordinary
    /// silence.
    pub fn is_recorded(self) -> bool {
        self == Skip::ChainTooDeep
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Paused => f.write_str("the trigger is paused"),
            Skip::Settled => f.write_str("it happened before the trigger was created or resumed"),
            Skip::NotListened => f.write_str("the trigger listens for something else"),
            Skip::SelfLoop => f.write_str("the run was started by this trigger (no self-loop)"),
            Skip::ChainTooDeep => write!(
                f,
                "the run is {MAX_CHAIN_DEPTH} event fires deep, the most a chain of triggered runs goes"
            ),
        }
    }
}

/// Whether a trigger fires for an occasion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It fires; the run it starts is `depth` fires deep.
    Fire {
        depth: u32,
    },
    Skip(Skip),
}

/// What a run started by the trigger `name` names as what started it.
pub fn started_by(name: &str) -> String {
    format!("event:{name}")
}

/// Whether `trigger` fires for `occasion`. The checks run in the order of the [`Skip`]
/// variants: a paused trigger is silent before anything else is asked.
pub fn decide(trigger: &Trigger<'_>, occasion: &Occasion<'_>) -> Decision {
    if trigger.paused {
        return Decision::Skip(Skip::Paused);
    }
    let (at_ms, source) = match (trigger.listen, occasion) {
        (Listen::RunEnd { agent, ended_in }, Occasion::RunEnded { agent: ended, state, at_ms, source }) => {
            if (agent != ANY_AGENT && agent != ended) || !ended_in.matches(*state) {
                return Decision::Skip(Skip::NotListened);
            }
            (*at_ms, Some(*source))
        }
        (Listen::Topic { topic }, Occasion::Published { topic: published, at_ms, source }) => {
            if topic != published {
                return Decision::Skip(Skip::NotListened);
            }
            (*at_ms, *source)
        }
        _ => return Decision::Skip(Skip::NotListened),
    };
    if at_ms <= trigger.since_ms {
        return Decision::Skip(Skip::Settled);
    }
    let Some(source) = source else { return Decision::Fire { depth: 1 } };
    if source.started_by == Some(started_by(trigger.name).as_str()) {
        return Decision::Skip(Skip::SelfLoop);
    }
    if source.depth >= MAX_CHAIN_DEPTH {
        return Decision::Skip(Skip::ChainTooDeep);
    }
    Decision::Fire { depth: source.depth + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(agent: &str, on: &str) -> Listen {
        Listen::new(Some(agent), Some(on), None).unwrap()
    }

    fn trigger<'a>(listen: &'a Listen) -> Trigger<'a> {
        Trigger { name: "next", listen, paused: false, since_ms: 1_000 }
    }

    const USER: Source<'static> = Source { started_by: None, depth: 0 };

    fn ended<'a>(agent: &'a str, state: RunState, source: Source<'a>) -> Occasion<'a> {
        Occasion::RunEnded { agent, state, at_ms: 2_000, source }
    }

    #[test]
    fn every_end_filter_against_every_state() {
        // (filter, the states it fires for): every other state is silent.
        let table = [
            ("succeeded", vec![RunState::Succeeded]),
            ("failed", vec![RunState::Failed]),
            ("cancelled", vec![RunState::Cancelled]),
            ("ended", vec![RunState::Succeeded, RunState::Failed, RunState::Cancelled]),
        ];
        for (on, firing) in table {
            let listen = after("a.py", on);
            for &state in RunState::ALL {
                let decided = decide(&trigger(&listen), &ended("a.py", state, USER));
                let expected = if firing.contains(&state) {
                    Decision::Fire { depth: 1 }
                } else {
                    Decision::Skip(Skip::NotListened)
                };
                assert_eq!(decided, expected, "on {on}, a run in {state}");
            }
        }
    }

    #[test]
    fn the_default_end_is_succeeded_and_names_round_trip() {
        let listen = Listen::new(Some("a.py"), None, None).unwrap();
        assert_eq!(listen, Listen::RunEnd { agent: "a.py".into(), ended_in: EndedIn::Succeeded });
        for on in ["succeeded", "failed", "cancelled", "ended"] {
            assert_eq!(on.parse::<EndedIn>().unwrap().to_string(), on);
        }
    }

    #[test]
    fn the_agent_must_match_unless_any() {
        let listen = after("a.py", "ended");
        let other = decide(&trigger(&listen), &ended("b.py", RunState::Succeeded, USER));
        assert_eq!(other, Decision::Skip(Skip::NotListened));
        let any = after(ANY_AGENT, "ended");
        let fired = decide(&trigger(&any), &ended("b.py", RunState::Succeeded, USER));
        assert_eq!(fired, Decision::Fire { depth: 1 });
    }

    #[test]
    fn a_topic_trigger_fires_for_its_topic_only_and_never_for_a_run_end() {
        let listen = Listen::new(None, None, Some("news")).unwrap();
        let published = |topic, source| Occasion::Published { topic, at_ms: 2_000, source };
        assert_eq!(decide(&trigger(&listen), &published("news", None)), Decision::Fire { depth: 1 });
        assert_eq!(decide(&trigger(&listen), &published("news", Some(USER))), Decision::Fire { depth: 1 });
        let deep = Source { started_by: Some("schedule:x"), depth: 3 };
        assert_eq!(decide(&trigger(&listen), &published("news", Some(deep))), Decision::Fire { depth: 4 });
        assert_eq!(decide(&trigger(&listen), &published("sports", None)), Decision::Skip(Skip::NotListened));
        assert_eq!(
            decide(&trigger(&listen), &ended("news", RunState::Succeeded, USER)),
            Decision::Skip(Skip::NotListened)
        );
        let run_end = after("a.py", "ended");
        assert_eq!(decide(&trigger(&run_end), &published("a.py", None)), Decision::Skip(Skip::NotListened));
    }

    #[test]
    fn paused_and_settled_occasions_do_not_fire() {
        let listen = after("a.py", "succeeded");
        let paused = Trigger { paused: true, ..trigger(&listen) };
        assert_eq!(decide(&paused, &ended("a.py", RunState::Succeeded, USER)), Decision::Skip(Skip::Paused));
        // Paused comes first, even for an occasion it would not listen to.
        assert_eq!(decide(&paused, &ended("b.py", RunState::Failed, USER)), Decision::Skip(Skip::Paused));
        for (at_ms, expected) in [
            (999, Decision::Skip(Skip::Settled)),
            (1_000, Decision::Skip(Skip::Settled)),
            (1_001, Decision::Fire { depth: 1 }),
        ] {
            let occasion =
                Occasion::RunEnded { agent: "a.py", state: RunState::Succeeded, at_ms, source: USER };
            assert_eq!(decide(&trigger(&listen), &occasion), expected, "ended at {at_ms}");
        }
    }

    #[test]
    fn a_run_started_by_a_trigger_does_not_fire_it_again() {
        let listen = after("a.py", "ended");
        let by_itself = Source { started_by: Some("event:next"), depth: 1 };
        assert_eq!(
            decide(&trigger(&listen), &ended("a.py", RunState::Succeeded, by_itself)),
            Decision::Skip(Skip::SelfLoop)
        );
        let by_another = Source { started_by: Some("event:other"), depth: 1 };
        assert_eq!(
            decide(&trigger(&listen), &ended("a.py", RunState::Succeeded, by_another)),
            Decision::Fire { depth: 2 }
        );
        // A schedule that happens to share the name is another trigger.
        let by_schedule = Source { started_by: Some("schedule:next"), depth: 0 };
        assert_eq!(
            decide(&trigger(&listen), &ended("a.py", RunState::Succeeded, by_schedule)),
            Decision::Fire { depth: 1 }
        );
        let topic = Listen::new(None, None, Some("news")).unwrap();
        let occasion = Occasion::Published { topic: "news", at_ms: 2_000, source: Some(by_itself) };
        assert_eq!(decide(&trigger(&topic), &occasion), Decision::Skip(Skip::SelfLoop));
    }

    #[test]
    fn chains_stop_at_the_deepest() {
        let listen = after("a.py", "ended");
        for depth in 0..=MAX_CHAIN_DEPTH + 1 {
            let source = Source { started_by: Some("event:other"), depth };
            let decided = decide(&trigger(&listen), &ended("a.py", RunState::Failed, source));
            if depth < MAX_CHAIN_DEPTH {
                assert_eq!(decided, Decision::Fire { depth: depth + 1 });
            } else {
                assert_eq!(decided, Decision::Skip(Skip::ChainTooDeep), "depth {depth}");
            }
        }
        // A chain of two triggers after each other's agents ends after MAX_CHAIN_DEPTH runs.
        let (first, second) = (after("a.py", "ended"), after("b.py", "ended"));
        let triggers = [
            Trigger { name: "to-b", listen: &first, paused: false, since_ms: 0 },
            Trigger { name: "to-a", listen: &second, paused: false, since_ms: 0 },
        ];
        let mut started = 0;
        let (mut by, mut depth, mut agent) = (None::<String>, 0, "a.py");
        loop {
            let source = Source { started_by: by.as_deref(), depth };
            let fired: Vec<_> = triggers
                .iter()
                .filter_map(|t| match decide(t, &ended(agent, RunState::Succeeded, source)) {
                    Decision::Fire { depth } => Some((t.name, depth)),
                    Decision::Skip(_) => None,
                })
                .collect();
            let Some(&(name, next)) = fired.first() else { break };
            assert_eq!(fired.len(), 1);
            started += 1;
            (by, depth) = (Some(started_by(name)), next);
            agent = if agent == "a.py" { "b.py" } else { "a.py" };
        }
        assert_eq!(started, MAX_CHAIN_DEPTH);
    }

    #[test]
    fn only_a_cut_chain_is_recorded() {
        for skip in [Skip::Paused, Skip::Settled, Skip::NotListened, Skip::SelfLoop, Skip::ChainTooDeep] {
            assert_eq!(skip.is_recorded(), skip == Skip::ChainTooDeep, "{skip}");
        }
    }

    #[test]
    fn bad_definitions_name_what_is_wrong() {
        fn refused(after_run: Option<&str>, on: Option<&str>, topic: Option<&str>) -> String {
            Listen::new(after_run, on, topic).unwrap_err().to_string()
        }
        assert!(refused(None, None, None).contains("exactly one of after_run"));
        assert!(refused(Some("a"), None, Some("t")).contains("exactly one of after_run"));
        assert!(refused(Some("a"), Some("done"), None).contains("on \"done\" is not known"));
        assert!(refused(None, Some("failed"), Some("t")).contains("applies to after_run only"));
        assert!(refused(Some("jobs/a.py"), None, None).contains("file name of the agent's program"));
        assert!(refused(Some(""), None, None).contains("not an agent name"));
        assert!(refused(Some("a\nb"), None, None).contains("not an agent name"));
        assert!(refused(Some(&"a".repeat(MAX_AGENT_BYTES + 1)), None, None).contains("not an agent name"));
        assert!(refused(None, None, Some("")).contains("1 to 256 bytes"));
        assert!(refused(None, None, Some(&"t".repeat(MAX_TOPIC_BYTES + 1))).contains("is not a topic"));
        assert!(refused(None, None, Some("a\tb")).contains("is not a topic"));
        assert!(Listen::new(Some(&"a".repeat(MAX_AGENT_BYTES)), None, None).is_ok());
        assert!(Listen::new(None, None, Some(&"t".repeat(MAX_TOPIC_BYTES))).is_ok());
    }
}
