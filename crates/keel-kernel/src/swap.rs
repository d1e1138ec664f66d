//! Parking and swapping (DESIGN section 5). A run that has waited longer than the swap
//! threshold (`keel serve --swap-after SECS`, `KEEL_SWAP_AFTER_SECS`, default 60) for
//! something durable (a human answer, a message, a child, an approval, a timer) has its
//! agent process stopped: the wait itself is a pending journal entry, so nothing is lost.
//! Such a run stays `waiting` with no process ("swapped out"); when what it waits for
//! happens, it is relaunched by replay from its last checkpoint and asks again, which
//! now answers at once. Only runs whose every call in flight is such a wait are swapped,
//! so no LLM or tool call is ever interrupted (and paid twice) by swapping.

use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_store::RunRecord;
use keel_types::{RunState, WaitReason};

/// How swapped-out runs come back when many wake at once (a message to each, timers due
/// together): at most `at_once` of their agents are starting at the same time. An agent
/// counts as starting from its relaunch until its first call to the kernel (`hello`, or a
/// gateway request), its end, or `hold`, whichever comes first; the others wait their
/// turn, in the order they woke, still `recovering`. Interpreters started all at once
/// share two cores' caches and each one runs slower: 500 Python starts at once took 1.28x
/// the CPU each of the same starts eight at a time (BENCHMARKS.md, "woken runs start a few
/// at a time"), so the whole wake ended later than it does a few at a time.
#[derive(Clone, Copy, Debug)]
pub struct SwapIn {
    pub at_once: usize,
    pub hold: Duration,
}

impl Default for SwapIn {
    /// Two starts per core, each counted for at most 2 s (an agent importing a large
    /// framework takes longer to say hello; after 2 s the next one starts beside it).
    fn default() -> SwapIn {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        SwapIn { at_once: 2 * cores, hold: Duration::from_secs(2) }
    }
}

/// The waits a swapped-out run can be woken from.
pub(crate) fn swappable(reason: Option<WaitReason>) -> bool {
    matches!(
        reason,
        Some(
            WaitReason::Human
                | WaitReason::Message
                | WaitReason::Child
                | WaitReason::Approval
                | WaitReason::Timer
        )
    )
}

/// A swapped-out run: waiting, with no agent process.
pub(crate) fn is_swapped(record: &RunRecord) -> bool {
    record.state == RunState::Waiting && record.pid.is_none() && swappable(record.wait_reason)
}

/// Counts a call for as long as it lives (`LiveRun::inflight`, `LiveRun::waiting_calls`).
pub(crate) struct Busy<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Busy<'a> {
    pub(crate) fn new(counter: &'a std::sync::atomic::AtomicUsize) -> Busy<'a> {
        counter.fetch_add(1, Ordering::SeqCst);
        Busy(counter)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
