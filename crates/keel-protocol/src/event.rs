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
}
