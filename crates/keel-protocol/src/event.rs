//! The kinds of record in a run's event log (`GET /v1/runs/{id}/events`, `keel events`):
//! every kind the kernel emits is a variant here, with what its `data` holds.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What an event records. The wire form is the snake_case name (`"state"`, `"syscall"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A lifecycle change: `{state, from?, wait_reason?, error?, exit_code?}`; the first
    /// one (`created`) carries the `command`.
    State,
    /// The run waits for a live slot: `{reason}`.
    Queued,
    /// An agent process was started: `{attempt, pid, sandbox, pooled, replaying}`.
    Launch,
    /// A line the agent wrote to stdout: `{line}`.
    Stdout,
    /// A line the agent wrote to stderr: `{line}`.
    Stderr,
    /// A journaled syscall finished: `{seq, method, status, replayed?, ...}` (tokens,
    /// tool, duration).
    Syscall,
    /// The agent's own event (`run.emit`); `data` is what it sent.
    Emit,
    /// Journal entries a recovered agent never asked for again: `{abandoned: [seq]}`.
    Replay,
    /// An operator stopped the run: `{grace_secs}`.
    Stop,
    /// The agent asked a human: `{seq, question, form?}` (`form`: the answer's schema).
    Question,
    /// A human answered: `{seq, text, value?}` (`value`: a form question's answer).
    Answer,
    /// A tool call waits for an operator: `{call, tool, args, kind}`.
    Approval,
    /// An operator decided a parked call: `{call, approve, note}`.
    Decision,
    /// A tool call was refused by the run's grant: `{tool}`.
    Denied,
    /// A tool call was cut off by a kernel crash: `{call, tool, policy}`.
    Interrupted,
    /// Budget parking and top-ups: `{parked, reason?}` or `{top_up, continue}`.
    Budget,
    /// The run was swapped out or back in: `{out, wait_reason?}`.
    Swap,
    /// The run started a child (`proc.spawn`): `{child}`.
    Spawn,
    /// A signal was delivered to the run's mailbox: `{signal, from}`.
    Signal,
    /// The egress proxy allowed or refused a request: `{allowed, host, port, method,
    /// reason?, credential?}` (`credential` names the injected header, never its value).
    Egress,
    /// An audit record about this run: `{actor, action, subject, outcome, detail}`.
    Audit,
    /// The agent showed a block (`ui.show`): `{seq, block}`, in journal order; a replayed
    /// call does not show it again.
    Ui,
}

impl EventKind {
    pub const ALL: [EventKind; 22] = [
        EventKind::State,
        EventKind::Queued,
        EventKind::Launch,
        EventKind::Stdout,
        EventKind::Stderr,
        EventKind::Syscall,
        EventKind::Emit,
        EventKind::Replay,
        EventKind::Stop,
        EventKind::Question,
        EventKind::Answer,
        EventKind::Approval,
        EventKind::Decision,
        EventKind::Denied,
        EventKind::Interrupted,
        EventKind::Budget,
        EventKind::Swap,
        EventKind::Spawn,
        EventKind::Signal,
        EventKind::Egress,
        EventKind::Audit,
        EventKind::Ui,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::State => "state",
            EventKind::Queued => "queued",
            EventKind::Launch => "launch",
            EventKind::Stdout => "stdout",
            EventKind::Stderr => "stderr",
            EventKind::Syscall => "syscall",
            EventKind::Emit => "emit",
            EventKind::Replay => "replay",
            EventKind::Stop => "stop",
            EventKind::Question => "question",
            EventKind::Answer => "answer",
            EventKind::Approval => "approval",
            EventKind::Decision => "decision",
            EventKind::Denied => "denied",
            EventKind::Interrupted => "interrupted",
            EventKind::Budget => "budget",
            EventKind::Swap => "swap",
            EventKind::Spawn => "spawn",
            EventKind::Signal => "signal",
            EventKind::Egress => "egress",
            EventKind::Audit => "audit",
            EventKind::Ui => "ui",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<EventKind, String> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| format!("unknown event kind {s:?}"))
    }
}

/// Which kinds of event a reader of a run's events wants (`kinds=stdout,stderr,state` on
/// `GET /v1/runs/{id}/events`): a follower that shows only the agent's output need not be
/// sent, nor parse, an event for every syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKinds(u32);

impl EventKinds {
    pub const ALL: EventKinds = EventKinds((1 << EventKind::ALL.len()) - 1);

    /// The set of `kinds`.
    pub fn of(kinds: &[EventKind]) -> EventKinds {
        EventKinds(kinds.iter().fold(0, |set, kind| set | EventKinds::bit(*kind)))
    }

    /// A kind's bit: its place in the declaration (`ALL` lists the kinds in that order).
    fn bit(kind: EventKind) -> u32 {
        1 << kind as u32
    }

    pub fn contains(self, kind: EventKind) -> bool {
        self.0 & EventKinds::bit(kind) != 0
    }

    /// Whether an event stored with the wire name `kind` is wanted (a name this build
    /// does not know is wanted only by a reader of every kind).
    /// Every follower calls this for every event: a reader of every kind parses no name.
    pub fn contains_name(self, kind: &str) -> bool {
        self == EventKinds::ALL || kind.parse::<EventKind>().is_ok_and(|kind| self.contains(kind))
    }

    /// A comma-separated list of wire names, no spaces (`stdout,stderr,state`); an
    /// unknown or empty one is refused, naming it and the kinds there are.
    pub fn parse(list: &str) -> Result<EventKinds, String> {
        let kinds = list
            .split(',')
            .map(|name| {
                name.parse::<EventKind>().map_err(|_| {
                    let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                    let what = if name.is_empty() {
                        "an empty event kind".to_owned()
                    } else {
                        format!("unknown event kind {name:?}")
                    };
                    format!("{what} in `kinds`; give a comma-separated list of: {}", known.join(", "))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EventKinds::of(&kinds))
    }

    /// The regular expression of what `parse` takes (the API document's).
    pub fn pattern() -> String {
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        let any = names.join("|");
        format!("^({any})(,({any}))*$")
    }

    /// The comma-separated wire names of the set (what `parse` reads back).
    pub fn names(self) -> String {
        let names: Vec<&str> =
            EventKind::ALL.iter().filter(|k| self.contains(**k)).map(|k| k.as_str()).collect();
        names.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_wire_name() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()));
        }
        assert!("nope".parse::<EventKind>().is_err());
    }

    #[test]
    fn a_set_of_kinds_parses_from_its_names_and_refuses_an_unknown_one() {
        let set = EventKinds::parse("stdout,stderr,state").unwrap();
        assert!(set.contains(EventKind::Stdout) && set.contains(EventKind::State));
        assert!(!set.contains(EventKind::Syscall));
        assert!(set.contains_name("stderr") && !set.contains_name("syscall") && !set.contains_name("future"));
        assert!(EventKinds::ALL.contains_name("future"), "a reader of every kind gets one it cannot name");
        assert_eq!(EventKinds::parse(&set.names()), Ok(set));
        assert_eq!(EventKinds::parse(&EventKinds::ALL.names()), Ok(EventKinds::ALL));
        for (place, kind) in EventKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, place, "ALL lists the kinds in their declared order");
            assert!(EventKinds::ALL.contains(kind));
            assert_eq!(EventKinds::of(&[kind]).names(), kind.as_str());
        }
        let err = EventKinds::parse("stdout,nope").unwrap_err();
        assert!(err.contains("\"nope\"") && err.contains("syscall"), "{err}");
        assert!(EventKinds::parse("stdout,").unwrap_err().contains("an empty event kind"));
        assert!(EventKinds::parse("stdout, state").is_err(), "the wire form has no spaces");
    }
}
