//! The run lifecycle (DESIGN.md section 2) as a pure state machine: `transition(state,
//! command)` returns the next state or an error that says why the command does not apply.
//!
//! The table test at the bottom of this file spells out the outcome of every command in
//! every state; it is the specification, and this code is one way of meeting it.

use keel_types::{RunState, WaitReason};

/// Something that happened to a run or that someone asked of it. The kernel turns operator
/// requests, agent syscalls and process events into one of these before it changes a run's
/// state, so every state change goes through [`transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Put a created run in line for a launch slot. Legal in `created`; leads to `queued`.
    Enqueue,
    /// The agent process was launched. Legal in `created` and `queued`; leads to `running`.
    Start,
    /// An operator froze the run. Legal in `queued`, `running`, `waiting` and
    /// `recovering`; leads to `paused`.
    Pause,
    /// An operator thawed a paused run. `waiting` says whether the run still has an open
    /// wait: if so it goes back to `waiting`, otherwise to `running`. Legal in `paused`.
    Resume { waiting: bool },
    /// The run blocked on something outside itself. Legal in `running`; leads to `waiting`.
    Park(WaitReason),
    /// What the run waited for arrived. Legal in `waiting`; leads to `running`.
    Wake,
    /// The kernel restarted while the run was live. Legal in `running`, `waiting` and
    /// `recovering` (a second restart during recovery); leads to `recovering`.
    KernelRestart,
    /// Replay finished and the process runs live again. Legal in `recovering`; leads to
    /// `running`.
    Recovered,
    /// The agent process ended, successfully or not. Legal wherever a process may exist:
    /// `running`, `waiting`, `recovering` and `paused`; leads to `succeeded` or `failed`.
    Exit { success: bool },
    /// The kernel could not go on with the run (launch error, lost sandbox, ...). Legal in
    /// every state that has not ended; leads to `failed`.
    Fail,
    /// An operator stopped the run. Legal in every state that has not ended; leads to
    /// `cancelled`.
    Cancel,
}

impl Command {
    /// The command as a verb for messages: "cannot {verb} a run that is {state}". Uses the
    /// operator's words where they differ from the variant name (`Cancel` is "stop").
    pub fn verb(self) -> &'static str {
        match self {
            Command::Enqueue => "enqueue",
            Command::Start => "start",
            Command::Pause => "pause",
            Command::Resume { .. } => "resume",
            Command::Park(_) => "park",
            Command::Wake => "wake",
            Command::KernelRestart => "recover",
            Command::Recovered => "finish recovering",
            Command::Exit { .. } => "finish",
            Command::Fail => "fail",
            Command::Cancel => "stop",
        }
    }
}

/// A command that does not apply to a run in its current state. The message names the
/// command and the state and says why, e.g. "cannot pause a run that is succeeded: it has
/// already ended".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {verb} a run that is {from}: {reason}", verb = .command.verb(), reason = refusal_reason(*.from, *.command))]
pub struct IllegalTransition {
    pub from: RunState,
    pub command: Command,
}

impl IllegalTransition {
    /// Why the command does not apply, phrased for the person who asked (the part of the
    /// message after the colon).
    pub fn reason(&self) -> &'static str {
        refusal_reason(self.from, self.command)
    }
}

/// Decides the state a run in `from` moves to when `command` happens, or refuses.
///
/// Terminal states accept nothing. Refusals are ordinary results, not bugs: an operator may
/// pause a run a moment after it ended, and the kernel reports the error to them.
pub fn transition(from: RunState, command: Command) -> Result<RunState, IllegalTransition> {
    use RunState as S;

    // Terminal states are checked first so that no arm below can accidentally revive an
    // ended run, whatever patterns are added to it later.
    if from.is_terminal() {
        return Err(IllegalTransition { from, command });
    }
    let next = match command {
        Command::Enqueue => match from {
            S::Created => Some(S::Queued),
            _ => None,
        },
        Command::Start => match from {
            S::Created | S::Queued => Some(S::Running),
            _ => None,
        },
        Command::Pause => match from {
            S::Queued | S::Running | S::Waiting | S::Recovering => Some(S::Paused),
            _ => None,
        },
        Command::Resume { waiting } => match from {
            S::Paused if waiting => Some(S::Waiting),
            S::Paused => Some(S::Running),
            _ => None,
        },
        Command::Park(_) => match from {
            S::Running => Some(S::Waiting),
            _ => None,
        },
        Command::Wake => match from {
            S::Waiting => Some(S::Running),
            _ => None,
        },
        Command::KernelRestart => match from {
            S::Running | S::Waiting | S::Recovering => Some(S::Recovering),
            _ => None,
        },
        Command::Recovered => match from {
            S::Recovering => Some(S::Running),
            _ => None,
        },
        Command::Exit { success } => match from {
            S::Running | S::Waiting | S::Recovering | S::Paused if success => Some(S::Succeeded),
            S::Running | S::Waiting | S::Recovering | S::Paused => Some(S::Failed),
            _ => None,
        },
        // Every non-terminal state may fail or be stopped; terminal ones returned above.
        Command::Fail => Some(S::Failed),
        Command::Cancel => Some(S::Cancelled),
    };
    next.ok_or(IllegalTransition { from, command })
}

/// The explanation for refusing `command` in `from`. Only called for refused pairs, but
/// total so that a message can never be missing.
fn refusal_reason(from: RunState, command: Command) -> &'static str {
    use RunState as S;

    if from.is_terminal() {
        return "it has already ended";
    }
    match command {
        Command::Enqueue if from == S::Queued => "it is already queued",
        Command::Enqueue => "only created runs can be queued",
        Command::Start if from == S::Running => "it is already running",
        Command::Start if from == S::Paused => {
            "only created or queued runs can be started; resume a paused run instead"
        }
        Command::Start => "only created or queued runs can be started",
        Command::Pause if from == S::Paused => "it is already paused",
        Command::Pause => "only queued, running, waiting or recovering runs can be paused",
        Command::Resume { .. } => "only paused runs can be resumed",
        Command::Park(_) if from == S::Waiting => "it is already waiting",
        Command::Park(_) => "only running runs can start waiting",
        Command::Wake => "only waiting runs can be woken",
        Command::KernelRestart if from == S::Paused => "a paused run stays paused across a kernel restart",
        Command::KernelRestart => {
            "only running, waiting or recovering runs are recovered after a kernel restart"
        }
        Command::Recovered => "only recovering runs can finish recovering",
        Command::Exit { .. } if matches!(from, S::Created | S::Queued) => {
            "its process has not been launched yet"
        }
        Command::Exit { .. } => {
            "only running, waiting, recovering or paused runs have a process that can exit"
        }
        // Fail and Cancel apply to every non-terminal state, so only the terminal case
        // above can refuse them.
        Command::Fail | Command::Cancel => "it has already ended",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunState::*;
    use proptest::prelude::*;

    /// Every command the table has a column for, in column order. `column_of` below is an
    /// exhaustive match, so adding a variant to `Command` fails to compile until the table
    /// grows a column for it.
    fn table_commands() -> Vec<Command> {
        let mut commands = vec![
            Command::Enqueue,
            Command::Start,
            Command::Pause,
            Command::Resume { waiting: false },
            Command::Resume { waiting: true },
        ];
        commands.extend(WaitReason::ALL.iter().map(|reason| Command::Park(*reason)));
        commands.extend([
            Command::Wake,
            Command::KernelRestart,
            Command::Recovered,
            Command::Exit { success: true },
            Command::Exit { success: false },
            Command::Fail,
            Command::Cancel,
        ]);
        commands
    }

    fn column_of(command: Command) -> usize {
        match command {
            Command::Enqueue => 0,
            Command::Start => 1,
            Command::Pause => 2,
            Command::Resume { waiting: false } => 3,
            Command::Resume { waiting: true } => 4,
            Command::Park(WaitReason::Human) => 5,
            Command::Park(WaitReason::Child) => 6,
            Command::Park(WaitReason::Message) => 7,
            Command::Park(WaitReason::Approval) => 8,
            Command::Park(WaitReason::Budget) => 9,
            Command::Park(WaitReason::Timer) => 10,
            Command::Wake => 11,
            Command::KernelRestart => 12,
            Command::Recovered => 13,
            Command::Exit { success: true } => 14,
            Command::Exit { success: false } => 15,
            Command::Fail => 16,
            Command::Cancel => 17,
        }
    }

    // Cell values: the state reached, or `___` for a refused command.
    const ___: Option<RunState> = None;
    const QUE: Option<RunState> = Some(Queued);
    const RUN: Option<RunState> = Some(Running);
    const PAU: Option<RunState> = Some(Paused);
    const WAI: Option<RunState> = Some(Waiting);
    const REC: Option<RunState> = Some(Recovering);
    const SUC: Option<RunState> = Some(Succeeded);
    const FAI: Option<RunState> = Some(Failed);
    const CAN: Option<RunState> = Some(Cancelled);

    /// The whole machine. Columns, in `table_commands` order:
    ///
    /// enq = Enqueue, sta = Start, pau = Pause, r-f / r-w = Resume{waiting: false / true},
    /// p-h p-c p-m p-a p-b p-t = Park(human / child / message / approval / budget / timer),
    /// wak = Wake, kre = KernelRestart, rcd = Recovered, e-s / e-f = Exit{success: true /
    /// false}, fai = Fail, can = Cancel.
    #[rustfmt::skip]
    const TABLE: &[(RunState, [Option<RunState>; 18])] = &[
        //            enq  sta  pau  r-f  r-w  p-h  p-c  p-m  p-a  p-b  p-t  wak  kre  rcd  e-s  e-f  fai  can
        (Created,    [QUE, RUN, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, FAI, CAN]),
        (Queued,     [___, RUN, PAU, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, FAI, CAN]),
        (Running,    [___, ___, PAU, ___, ___, WAI, WAI, WAI, WAI, WAI, WAI, ___, REC, ___, SUC, FAI, FAI, CAN]),
        (Paused,     [___, ___, ___, RUN, WAI, ___, ___, ___, ___, ___, ___, ___, ___, ___, SUC, FAI, FAI, CAN]),
        (Waiting,    [___, ___, PAU, ___, ___, ___, ___, ___, ___, ___, ___, RUN, REC, ___, SUC, FAI, FAI, CAN]),
        (Recovering, [___, ___, PAU, ___, ___, ___, ___, ___, ___, ___, ___, ___, REC, RUN, SUC, FAI, FAI, CAN]),
        (Succeeded,  [___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___]),
        (Failed,     [___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___]),
        (Cancelled,  [___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___, ___]),
    ];

    #[test]
    fn table_covers_every_state_and_command_once() {
        let states: Vec<RunState> = TABLE.iter().map(|(state, _)| *state).collect();
        assert_eq!(states, RunState::ALL, "one row per state, in RunState::ALL order");
        let commands = table_commands();
        assert_eq!(commands.len(), 18);
        for (index, command) in commands.iter().enumerate() {
            assert_eq!(column_of(*command), index, "{command:?} is in the wrong column");
        }
    }

    #[test]
    fn every_transition_matches_the_table() {
        let mut checked = 0;
        for (state, row) in TABLE {
            for command in table_commands() {
                let expected = row[column_of(command)];
                let actual = transition(*state, command);
                match expected {
                    Some(next) => assert_eq!(actual, Ok(next), "{state} + {command:?} should lead to {next}"),
                    None => assert_eq!(
                        actual,
                        Err(IllegalTransition { from: *state, command }),
                        "{state} + {command:?} should be refused"
                    ),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, RunState::ALL.len() * 18);
    }

    #[test]
    fn every_error_message_names_the_command_and_the_state() {
        for state in RunState::ALL {
            for command in table_commands() {
                if let Err(error) = transition(*state, command) {
                    let message = error.to_string();
                    assert!(
                        message.contains(command.verb()),
                        "{message:?} does not name the command {command:?}"
                    );
                    assert!(message.contains(state.as_str()), "{message:?} does not name the state {state}");
                    assert!(message.ends_with(error.reason()));
                }
            }
        }
    }

    #[test]
    fn messages_read_as_intended() {
        let message = |from, command| transition(from, command).unwrap_err().to_string();
        assert_eq!(
            message(Succeeded, Command::Pause),
            "cannot pause a run that is succeeded: it has already ended"
        );
        assert_eq!(
            message(Running, Command::Resume { waiting: false }),
            "cannot resume a run that is running: only paused runs can be resumed"
        );
        assert_eq!(
            message(Paused, Command::Pause),
            "cannot pause a run that is paused: it is already paused"
        );
        assert_eq!(
            message(Cancelled, Command::Cancel),
            "cannot stop a run that is cancelled: it has already ended"
        );
        assert_eq!(
            message(Queued, Command::Exit { success: true }),
            "cannot finish a run that is queued: its process has not been launched yet"
        );
    }

    fn any_command() -> impl Strategy<Value = Command> {
        prop::sample::select(table_commands())
    }

    proptest! {
        #[test]
        fn terminal_states_are_never_left(
            commands in prop::collection::vec(any_command(), 0..64)
        ) {
            let mut state = Created;
            let mut ended_in = None;
            for command in commands {
                if let Ok(next) = transition(state, command) {
                    state = next;
                }
                if let Some(terminal) = ended_in {
                    prop_assert_eq!(state, terminal);
                } else if state.is_terminal() {
                    ended_in = Some(state);
                }
            }
        }

        #[test]
        fn refusals_leave_the_run_where_it_was_and_explain_themselves(
            state in prop::sample::select(RunState::ALL),
            command in any_command(),
        ) {
            match transition(state, command) {
                Ok(next) => prop_assert!(!state.is_terminal(), "{state} moved to {next}"),
                Err(error) => {
                    prop_assert_eq!(error.from, state);
                    prop_assert_eq!(error.command, command);
                    prop_assert!(!error.reason().is_empty());
                }
            }
        }
    }
}
