//! Keel's pure decisions: the run lifecycle state machine, the replay matcher, budget
//! accounting, scheduling policy (admission and LLM call order), the audit log's hash
//! chain, schedules (`trigger`: cron ticks in a time zone, catch-up, overlap, jitter),
//! webhooks (`hook`: the senders' signatures and delivery ids) and event triggers
//! (`event_trigger`: which trigger fires for an ended run or a published message, and
//! the rules that keep chains of triggered runs finite).
//!
//! Nothing in this crate does IO, awaits, reads a clock or draws randomness. Every function
//! maps (state, event) to a new state or a decision, so the kernel's effectful loop stays
//! thin and these rules can be tested densely and exhaustively (STYLE.md habit 2).

pub mod audit;
pub mod budget;
pub mod event_trigger;
pub mod hook;
pub mod lifecycle;
pub mod placement;
pub mod replay;
pub mod sched;
pub mod trigger;
