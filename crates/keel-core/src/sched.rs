//! Scheduling policy (DESIGN.md section 5) as pure bookkeeping: the [`Admitter`] decides
//! which submitted runs may go live under concurrency caps, and a [`CallQueue`] decides
//! which waiting LLM call a provider's rate limiter sends next.
//!
//! Both share one vocabulary. Three priority classes are served strictly in order, but a
//! waiting item gains one class per `aging_ms`, so a low-priority item that has waited
//! `2 * aging_ms` competes as high and nothing starves. Between tenants of the same
//! effective class, weights decide the split; within one tenant, order is first come,
//! first served. Time is always passed in as Unix milliseconds; nothing here reads a clock.
//!
//! The two structures measure fair share differently, on purpose:
//!
//! - Runs hold a slot for an unknown time, so the [`Admitter`] compares what tenants hold
//!   *now*: it starts the run of the tenant with the fewest live runs per unit of weight.
//!   Charging for past runs would reward tenants whose runs happen to be short.
//! - LLM calls are short and have a known estimated cost, so the [`CallQueue`] uses
//!   start-time fair queuing (SFQ) over that cost: each tenant carries a virtual finish
//!   tag that advances by `cost / weight` per call sent, a tenant returning from idle
//!   starts at the current virtual time (no banked credit), and the call with the smallest
//!   start tag goes first. A tenant flooding the queue only pushes its own tags forward.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::str::FromStr;

/// A priority class. Lower classes are served only when no higher class is waiting, after
/// aging (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// All classes, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The string form used on the wire and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// 0 for high, 2 for low: the number of aging steps to reach high.
    fn rank(self) -> u64 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority string that is none of `high`, `normal`, `low`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority {given:?}: expected one of \"high\", \"normal\", \"low\"")]
pub struct ParsePriorityError {
    pub given: String,
}

impl FromStr for Priority {
    type Err = ParsePriorityError;

    /// Parses exactly `high`, `normal` or `low` (lowercase, no surrounding spaces).
    fn from_str(s: &str) -> Result<Priority, ParsePriorityError> {
        match s {
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            other => Err(ParsePriorityError { given: other.to_owned() }),
        }
    }
}

/// The class an item of `base` class competes in after waiting since `since_ms`: one
/// class better per full `aging_ms` waited. `aging_ms == 0` turns aging off.
fn effective_rank(base: Priority, since_ms: u64, now_ms: u64, aging_ms: u64) -> u64 {
    if aging_ms == 0 {
        return base.rank();
    }
    let steps = now_ms.saturating_sub(since_ms) / aging_ms;
    base.rank().saturating_sub(steps)
}

/// Tenant weights for fair share. A tenant not in the map has weight 1; a weight of 0 is
/// treated as 1, so every tenant is always served eventually.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights(pub BTreeMap<String, u32>);

impl Weights {
    /// The weight used for `tenant`, at least 1.
    pub fn weight(&self, tenant: &str) -> u64 {
        u64::from(self.0.get(tenant).copied().unwrap_or(1).max(1))
    }
}

// ---------------------------------------------------------------------------------------
// Admission of runs
// ---------------------------------------------------------------------------------------

/// Concurrency caps on live runs; `None` means no cap at that level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Live runs in total.
    pub global: Option<u32>,
    /// Live runs of any one tenant.
    pub per_tenant: Option<u32>,
    /// Live runs of any one agent spec.
    pub per_agent: Option<u32>,
    /// Runs allowed to wait in `queued`; a submission beyond that is rejected.
    pub queue: u32,
}

/// A run asking for a live slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub run: String,
    pub tenant: String,
    /// The agent spec key the per-agent cap counts by (e.g. the command joined).
    pub agent: String,
    pub priority: Priority,
    /// When the run was submitted; aging counts from here.
    pub submitted_ms: u64,
}

/// The answer to [`Admitter::submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Start the run now; it already counts as live.
    Start,
    /// The run waits in `queued`; `position` 1 is next in line (see [`Admitter::queued`]).
    Queued { position: usize },
    /// The queue is full: answer HTTP 429 with `Retry-After` of `retry_after_ms`
    /// (rounded up to whole seconds by the caller). The run was not recorded.
    Rejected { retry_after_ms: u64, reason: String },
}

/// The floor of a `Retry-After` estimate: asking clients to come back sooner than this only
/// makes them spin.
pub const MIN_RETRY_AFTER_MS: u64 = 1_000;
/// The ceiling of a `Retry-After` estimate, so one pathological run length cannot tell
/// clients to go away for a day.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;
/// How many recent run durations the `Retry-After` estimate averages over.
const DURATION_SAMPLES: usize = 32;

#[derive(Debug, Clone)]
struct LiveRun {
    tenant: String,
    agent: String,
    /// When the admitter started it; `None` for runs restored after a restart, whose
    /// duration would be meaningless as a sample.
    started_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct WaitingRun {
    ticket: Ticket,
    seq: u64,
}

/// Admission control for runs: caps on live runs, a bounded wait queue, priorities with
/// aging and weighted fair share between tenants.
///
/// Contract: the admitter never makes a run live that would exceed a cap (only
/// [`Admitter::restore_live`] can, because those runs are already running), and after every
/// call no queued run could start under the caps: whenever a slot frees, every run that
/// can start is returned at once. The caller must report each live run's end with
/// [`Admitter::finish`] exactly once, or its slot stays taken.
#[derive(Debug, Clone)]
pub struct Admitter {
    caps: Caps,
    weights: Weights,
    aging_ms: u64,
    live: BTreeMap<String, LiveRun>,
    live_per_tenant: BTreeMap<String, u32>,
    live_per_agent: BTreeMap<String, u32>,
    /// In submission order.
    waiting: Vec<WaitingRun>,
    next_seq: u64,
    recent_durations_ms: VecDeque<u64>,
}

impl Admitter {
    /// `aging_ms`: a waiting run gains one priority class per `aging_ms` since it was
    /// submitted; 0 turns aging off.
    pub fn new(caps: Caps, weights: Weights, aging_ms: u64) -> Admitter {
        Admitter {
            caps,
            weights,
            aging_ms,
            live: BTreeMap::new(),
            live_per_tenant: BTreeMap::new(),
            live_per_agent: BTreeMap::new(),
            waiting: Vec::new(),
            next_seq: 0,
            recent_durations_ms: VecDeque::new(),
        }
    }

    /// A run asks to start. `Start` means it now counts as live. A run id already live or
    /// queued is not counted twice: the answer is its current state.
    pub fn submit(&mut self, ticket: Ticket, now_ms: u64) -> Admission {
        self.admit(ticket, now_ms, true)
    }

    /// A run that gave its slot back (it was swapped out) asks for one again because what
    /// it waited for happened: as [`Admitter::submit`], but never rejected, however long
    /// the queue is, since refusing it would strand a run whose wait is already over.
    pub fn resume(&mut self, ticket: Ticket, now_ms: u64) -> Admission {
        self.admit(ticket, now_ms, false)
    }

    fn admit(&mut self, ticket: Ticket, now_ms: u64, may_reject: bool) -> Admission {
        if self.live.contains_key(&ticket.run) {
            return Admission::Start;
        }
        if self.waiting.iter().any(|waiting| waiting.ticket.run == ticket.run) {
            let position = self.position_of(&ticket.run, now_ms).unwrap_or(1);
            return Admission::Queued { position };
        }
        // No queued run can start (the contract above), so a run that fits takes the slot
        // without jumping anyone who could have used it.
        if let Some(blocker) = self.blocker(&ticket.tenant, &ticket.agent) {
            if may_reject && self.waiting.len() >= self.caps.queue as usize {
                return Admission::Rejected {
                    retry_after_ms: self.retry_after_ms(),
                    reason: format!(
                        "the run queue is full ({} runs waiting) and {blocker}; retry later",
                        self.waiting.len()
                    ),
                };
            }
            let run = ticket.run.clone();
            self.waiting.push(WaitingRun { ticket, seq: self.next_seq });
            self.next_seq += 1;
            let position = self.position_of(&run, now_ms).unwrap_or(self.waiting.len());
            return Admission::Queued { position };
        }
        self.go_live(&ticket.run, &ticket.tenant, &ticket.agent, Some(now_ms));
        Admission::Start
    }

    /// A live run ended (any terminal state, or it was swapped out and gave its slot
    /// back). Returns the queued runs that now count as live, in the order to start them.
    /// A run that was queued rather than live is dropped from the queue as by
    /// [`Admitter::cancel`]; an unknown run changes nothing.
    pub fn finish(&mut self, run: &str, now_ms: u64) -> Vec<String> {
        match self.live.remove(run) {
            Some(ended) => {
                decrement(&mut self.live_per_tenant, &ended.tenant);
                decrement(&mut self.live_per_agent, &ended.agent);
                if let Some(started_ms) = ended.started_ms {
                    if self.recent_durations_ms.len() == DURATION_SAMPLES {
                        self.recent_durations_ms.pop_front();
                    }
                    self.recent_durations_ms.push_back(now_ms.saturating_sub(started_ms));
                }
            }
            None => {
                self.cancel(run);
                return Vec::new();
            }
        }
        self.start_ready(now_ms, usize::MAX, |_| true)
    }

    /// A queued run was stopped before it started. Returns whether it was queued.
    /// Removing a waiting run frees no live slot, so nothing else starts.
    pub fn cancel(&mut self, run: &str) -> bool {
        match self.waiting.iter().position(|waiting| waiting.ticket.run == run) {
            Some(index) => {
                self.waiting.remove(index);
                true
            }
            None => false,
        }
    }

    /// Recovery after a restart: `ticket`'s run is already live. It counts against the
    /// caps (possibly over them, in which case nothing new starts until enough runs end)
    /// and is never rejected. If it was queued, it leaves the queue.
    pub fn restore_live(&mut self, ticket: Ticket) {
        self.cancel(&ticket.run);
        if !self.live.contains_key(&ticket.run) {
            self.go_live(&ticket.run, &ticket.tenant, &ticket.agent, None);
        }
    }

    /// An admitter rebuilt from a ledger shared by several nodes: `live` runs count
    /// against the caps (over them if need be), `waiting` ones queue in the order given
    /// (submission order), whatever the caps say. Each run appears once in all.
    pub fn restored(
        caps: Caps,
        weights: Weights,
        aging_ms: u64,
        live: impl IntoIterator<Item = Ticket>,
        waiting: impl IntoIterator<Item = Ticket>,
    ) -> Admitter {
        let mut admitter = Admitter::new(caps, weights, aging_ms);
        for ticket in live {
            admitter.go_live(&ticket.run, &ticket.tenant, &ticket.agent, None);
        }
        for ticket in waiting {
            admitter.waiting.push(WaitingRun { ticket, seq: admitter.next_seq });
            admitter.next_seq += 1;
        }
        admitter
    }

    /// Starts the queued runs the caps allow now, best first, at most `limit` of them and
    /// only those `eligible` accepts (a node with `limit` free slots of its own, which may
    /// start only some of the runs). Returns them in the order to start them; they count as
    /// live. The others stay queued, so unlike [`Admitter::finish`] this does not leave
    /// the "no queued run could start" contract established when `limit` or `eligible`
    /// held a run back.
    pub fn start_ready(
        &mut self,
        now_ms: u64,
        limit: usize,
        eligible: impl Fn(&Ticket) -> bool,
    ) -> Vec<String> {
        let mut started = Vec::new();
        while started.len() < limit
            && let Some(index) = self.pick_startable(now_ms, &eligible)
        {
            let WaitingRun { ticket, .. } = self.waiting.remove(index);
            self.go_live(&ticket.run, &ticket.tenant, &ticket.agent, Some(now_ms));
            started.push(ticket.run);
        }
        started
    }

    /// Whether a run of `tenant` and `agent` could start now under the caps.
    pub fn fits(&self, tenant: &str, agent: &str) -> bool {
        self.blocker(tenant, agent).is_none()
    }

    /// Every queued run with its position in line, position 1 first. The line is the
    /// order in which the runs would start if slots freed one at a time now and no cap
    /// other than the global one applied; caps can let a later run start first.
    pub fn queued(&self) -> Vec<(String, usize)> {
        // Positions are a display hint; aging is evaluated at the newest submission time
        // seen, since this query is not given a clock.
        let now_ms = self.waiting.iter().map(|waiting| waiting.ticket.submitted_ms).max().unwrap_or(0);
        self.line(now_ms)
            .into_iter()
            .enumerate()
            .map(|(index, waiting)| (self.waiting[waiting].ticket.run.clone(), index + 1))
            .collect()
    }

    /// Runs counted as live.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Runs of `tenant` counted as live.
    pub fn live_count_of(&self, tenant: &str) -> usize {
        self.live_per_tenant.get(tenant).copied().unwrap_or(0) as usize
    }

    /// The caps this admitter applies.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Runs waiting in the queue (without working out their order, as [`Admitter::queued`]
    /// does).
    pub fn queued_count(&self) -> usize {
        self.waiting.len()
    }

    fn go_live(&mut self, run: &str, tenant: &str, agent: &str, started_ms: Option<u64>) {
        *self.live_per_tenant.entry(tenant.to_owned()).or_default() += 1;
        *self.live_per_agent.entry(agent.to_owned()).or_default() += 1;
        self.live.insert(
            run.to_owned(),
            LiveRun { tenant: tenant.to_owned(), agent: agent.to_owned(), started_ms },
        );
    }

    /// Why a run of `tenant` and `agent` cannot start now, or `None` if it can.
    fn blocker(&self, tenant: &str, agent: &str) -> Option<String> {
        let live = self.live.len() as u64;
        if let Some(cap) = self.caps.global
            && live >= u64::from(cap)
        {
            return Some(format!("all {cap} live run slots are taken"));
        }
        let tenant_live = self.live_per_tenant.get(tenant).copied().unwrap_or(0);
        if let Some(cap) = self.caps.per_tenant
            && tenant_live >= cap
        {
            return Some(format!("tenant {tenant:?} already has {tenant_live} of {cap} live runs"));
        }
        let agent_live = self.live_per_agent.get(agent).copied().unwrap_or(0);
        if let Some(cap) = self.caps.per_agent
            && agent_live >= cap
        {
            return Some(format!("agent {agent:?} already has {agent_live} of {cap} live runs"));
        }
        None
    }

    /// The index in `waiting` of the run to start next, among those the caps allow and
    /// `eligible` accepts.
    fn pick_startable(&self, now_ms: u64, eligible: &dyn Fn(&Ticket) -> bool) -> Option<usize> {
        let tenant_live = |tenant: &str| u64::from(self.live_per_tenant.get(tenant).copied().unwrap_or(0));
        (0..self.waiting.len())
            .filter(|&index| {
                let ticket = &self.waiting[index].ticket;
                eligible(ticket) && self.blocker(&ticket.tenant, &ticket.agent).is_none()
            })
            .min_by(|&a, &b| self.compare_waiting(a, b, now_ms, &tenant_live))
    }

    /// Preference between two waiting runs: effective priority, then the tenant holding
    /// fewer live runs per unit of weight, then submission order.
    fn compare_waiting(
        &self,
        a: usize,
        b: usize,
        now_ms: u64,
        tenant_live: &dyn Fn(&str) -> u64,
    ) -> Ordering {
        let (a, b) = (&self.waiting[a], &self.waiting[b]);
        let rank = |run: &WaitingRun| {
            effective_rank(run.ticket.priority, run.ticket.submitted_ms, now_ms, self.aging_ms)
        };
        // live_a / weight_a < live_b / weight_b, cross-multiplied to stay in integers.
        let share_a = tenant_live(&a.ticket.tenant) * self.weights.weight(&b.ticket.tenant);
        let share_b = tenant_live(&b.ticket.tenant) * self.weights.weight(&a.ticket.tenant);
        rank(a).cmp(&rank(b)).then(share_a.cmp(&share_b)).then(a.seq.cmp(&b.seq))
    }

    /// Indices into `waiting` in line order: repeatedly take the preferred run, counting
    /// each taken run as live for its tenant's share. One tenant's runs share a fair-share
    /// value, so only each tenant's best run (by effective priority, then submission) can
    /// be the overall best: sorting per tenant and comparing heads costs O(n log n + n·T)
    /// for n waiting runs of T tenants.
    fn line(&self, now_ms: u64) -> Vec<usize> {
        let rank = |index: usize| {
            let ticket = &self.waiting[index].ticket;
            (
                effective_rank(ticket.priority, ticket.submitted_ms, now_ms, self.aging_ms),
                self.waiting[index].seq,
            )
        };
        let mut per_tenant: BTreeMap<&str, VecDeque<usize>> = BTreeMap::new();
        for (index, waiting) in self.waiting.iter().enumerate() {
            per_tenant.entry(waiting.ticket.tenant.as_str()).or_default().push_back(index);
        }
        for indices in per_tenant.values_mut() {
            indices.make_contiguous().sort_by_key(|&index| rank(index));
        }
        let mut simulated_live: BTreeMap<&str, u64> = BTreeMap::new();
        let mut order = Vec::with_capacity(self.waiting.len());
        loop {
            let tenant_live = |tenant: &str| {
                u64::from(self.live_per_tenant.get(tenant).copied().unwrap_or(0))
                    + simulated_live.get(tenant).copied().unwrap_or(0)
            };
            let Some(tenant) = per_tenant
                .iter()
                .filter_map(|(tenant, indices)| indices.front().map(|&head| (*tenant, head)))
                .min_by(|(_, a), (_, b)| self.compare_waiting(*a, *b, now_ms, &tenant_live))
                .map(|(tenant, _)| tenant)
            else {
                break;
            };
            if let Some(index) = per_tenant.get_mut(tenant).and_then(VecDeque::pop_front) {
                *simulated_live.entry(tenant).or_default() += 1;
                order.push(index);
            }
        }
        order
    }

    fn position_of(&self, run: &str, now_ms: u64) -> Option<usize> {
        self.line(now_ms)
            .into_iter()
            .position(|index| self.waiting[index].ticket.run == run)
            .map(|position| position + 1)
    }

    /// How long a rejected client should wait: the time the queue needs to drain at the
    /// recent rate, i.e. mean recent run duration × runs waiting / live slots, clamped to
    /// [`MIN_RETRY_AFTER_MS`, `MAX_RETRY_AFTER_MS`]. Slots are the global cap, or the runs
    /// live now if there is none. Before any run has finished, runs are assumed to take
    /// [`MIN_RETRY_AFTER_MS`].
    fn retry_after_ms(&self) -> u64 {
        let samples = self.recent_durations_ms.len() as u64;
        let mean_ms = match samples {
            0 => MIN_RETRY_AFTER_MS,
            _ => self.recent_durations_ms.iter().sum::<u64>() / samples,
        };
        let slots = match self.caps.global {
            Some(cap) => u64::from(cap),
            None => self.live.len() as u64,
        }
        .max(1);
        let waiting = (self.waiting.len() as u64).max(1);
        mean_ms.saturating_mul(waiting).div_ceil(slots).clamp(MIN_RETRY_AFTER_MS, MAX_RETRY_AFTER_MS)
    }
}

fn decrement(counts: &mut BTreeMap<String, u32>, key: &str) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

// ---------------------------------------------------------------------------------------
// LLM call queue
// ---------------------------------------------------------------------------------------

/// An LLM call waiting for its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: u64,
    pub tenant: String,
    pub priority: Priority,
    /// When the call joined the queue; aging counts from here. Calls of one tenant are
    /// expected to be pushed in nondecreasing `enqueued_ms` order.
    pub enqueued_ms: u64,
    /// Estimated tokens; fair share is measured in this unit. 0 is treated as 1.
    pub cost: u64,
}

/// Virtual time units per unit of `cost / weight`, so that dividing by a weight keeps
/// precision; `u128` tags cannot overflow in any realistic lifetime.
const VIRTUAL_SCALE: u128 = 1 << 20;

#[derive(Debug, Clone)]
struct QueuedCall {
    call: Call,
    seq: u64,
}

#[derive(Debug, Clone, Default)]
struct TenantLanes {
    /// One FIFO per base class, indexed by `Priority::rank`.
    lanes: [VecDeque<QueuedCall>; 3],
    /// Virtual finish tag of the tenant's last call sent.
    finish: u128,
}

#[derive(Debug, Clone)]
struct FairQueue {
    weights: Weights,
    aging_ms: u64,
    tenant_index: BTreeMap<String, usize>,
    /// Tenant names stay here once seen so their finish tags survive idle spells; the set
    /// is bounded by the kernel's tenants.
    tenants: Vec<(String, TenantLanes)>,
    /// The start tag of the last call sent; never decreases.
    virtual_time: u128,
    next_seq: u64,
    len: usize,
}

#[derive(Debug, Clone)]
enum Policy {
    Fair(FairQueue),
    Fifo(VecDeque<Call>),
}

/// The per-provider LLM call queue: the kernel holds one per provider, and a call waits
/// here until the provider's rate limiter grants a slot, at which point the kernel sends
/// what [`CallQueue::pop`] returns.
///
/// Order ([`CallQueue::new`]): strict priority by effective class (base class improved by
/// one per `aging_ms` waited); within a class, start-time fair queuing across tenants by
/// `cost / weight` (module docs); within a tenant, push order. [`CallQueue::fifo`] is
/// plain push order, kept as the baseline the benchmark compares against.
///
/// Starvation bound: a call of base class `c` has waited at most `c.rank() * aging_ms` when
/// it reaches the top class; from then on only calls that are also in the top class and
/// either pushed before it by its own tenant or carrying a start tag no later than its own
/// can go first, which is a finite number (see the `low_priority_is_popped_within_*` tests).
#[derive(Debug, Clone)]
pub struct CallQueue {
    policy: Policy,
}

impl CallQueue {
    /// The fair, prioritized queue. `aging_ms == 0` turns aging off (strict priority).
    pub fn new(weights: Weights, aging_ms: u64) -> CallQueue {
        CallQueue {
            policy: Policy::Fair(FairQueue {
                weights,
                aging_ms,
                tenant_index: BTreeMap::new(),
                tenants: Vec::new(),
                virtual_time: 0,
                next_seq: 0,
                len: 0,
            }),
        }
    }

    /// Plain first-in first-out, ignoring priority and tenant: the baseline.
    pub fn fifo() -> CallQueue {
        CallQueue { policy: Policy::Fifo(VecDeque::new()) }
    }

    /// Adds a call at the back of its tenant's line for its class.
    pub fn push(&mut self, call: Call) {
        match &mut self.policy {
            Policy::Fifo(calls) => calls.push_back(call),
            Policy::Fair(fair) => fair.push(call),
        }
    }

    /// The call to send now that the provider has a slot, or `None` if none waits.
    pub fn pop(&mut self, now_ms: u64) -> Option<Call> {
        match &mut self.policy {
            Policy::Fifo(calls) => calls.pop_front(),
            Policy::Fair(fair) => fair.pop(now_ms),
        }
    }

    /// The call `pop` would return at `now_ms`, left in place.
    pub fn peek(&self, now_ms: u64) -> Option<&Call> {
        match &self.policy {
            Policy::Fifo(calls) => calls.front(),
            Policy::Fair(fair) => fair.peek(now_ms),
        }
    }

    /// Drops a waiting call (it was cancelled). Returns whether it was waiting. Linear in
    /// the queue length; cancellation is rare next to push and pop.
    pub fn remove(&mut self, id: u64) -> bool {
        match &mut self.policy {
            Policy::Fifo(calls) => match calls.iter().position(|call| call.id == id) {
                Some(index) => {
                    calls.remove(index);
                    true
                }
                None => false,
            },
            Policy::Fair(fair) => fair.remove(id),
        }
    }

    pub fn len(&self) -> usize {
        match &self.policy {
            Policy::Fifo(calls) => calls.len(),
            Policy::Fair(fair) => fair.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where call `id` stands: 1 means it is sent at the next slot, if nothing is pushed
    /// and no time passes in between. `None` if it is not waiting. For display
    /// ("3rd in line for openai"); it replays the pops on a copy, so it costs a full
    /// drain of the queue.
    pub fn position(&self, id: u64, now_ms: u64) -> Option<usize> {
        match &self.policy {
            Policy::Fifo(calls) => calls.iter().position(|call| call.id == id).map(|index| index + 1),
            Policy::Fair(fair) => {
                if !fair.contains(id) {
                    return None;
                }
                let mut copy = fair.clone();
                let mut position = 0;
                while let Some(call) = copy.pop(now_ms) {
                    position += 1;
                    if call.id == id {
                        return Some(position);
                    }
                }
                None
            }
        }
    }
}

impl FairQueue {
    fn push(&mut self, mut call: Call) {
        call.cost = call.cost.max(1);
        let index = match self.tenant_index.get(&call.tenant) {
            Some(&index) => index,
            None => {
                self.tenants.push((call.tenant.clone(), TenantLanes::default()));
                self.tenant_index.insert(call.tenant.clone(), self.tenants.len() - 1);
                self.tenants.len() - 1
            }
        };
        let lane = call.priority.rank() as usize;
        self.tenants[index].1.lanes[lane].push_back(QueuedCall { call, seq: self.next_seq });
        self.next_seq += 1;
        self.len += 1;
    }

    fn pop(&mut self, now_ms: u64) -> Option<Call> {
        let ((_, start, _), tenant, lane) = self.best(now_ms)?;
        let (name, lanes) = &mut self.tenants[tenant];
        let queued = lanes.lanes[lane].pop_front()?;
        let weight = self.weights.weight(name);
        lanes.finish = start + u128::from(queued.call.cost) * VIRTUAL_SCALE / u128::from(weight);
        self.virtual_time = start;
        self.len -= 1;
        Some(queued.call)
    }

    fn peek(&self, now_ms: u64) -> Option<&Call> {
        let (_, tenant, lane) = self.best(now_ms)?;
        self.tenants[tenant].1.lanes[lane].front().map(|queued| &queued.call)
    }

    /// The next call: (effective rank, start tag, seq) of the best candidate, with where
    /// it sits (tenant, lane).
    fn best(&self, now_ms: u64) -> Option<((u64, u128, u64), usize, usize)> {
        let mut best: Option<((u64, u128, u64), usize, usize)> = None;
        for (tenant, (_, lanes)) in self.tenants.iter().enumerate() {
            // The tenant's head of line: its best effective class, earliest pushed within.
            let mut head: Option<((u64, u64), usize)> = None;
            for (lane, calls) in lanes.lanes.iter().enumerate() {
                if let Some(front) = calls.front() {
                    let rank =
                        effective_rank(front.call.priority, front.call.enqueued_ms, now_ms, self.aging_ms);
                    let key = (rank, front.seq);
                    if head.is_none_or(|(best_key, _)| key < best_key) {
                        head = Some((key, lane));
                    }
                }
            }
            if let Some(((rank, seq), lane)) = head {
                let start = lanes.finish.max(self.virtual_time);
                let key = (rank, start, seq);
                if best.is_none_or(|(best_key, _, _)| key < best_key) {
                    best = Some((key, tenant, lane));
                }
            }
        }
        best
    }

    fn contains(&self, id: u64) -> bool {
        self.tenants.iter().any(|(_, lanes)| lanes.lanes.iter().flatten().any(|queued| queued.call.id == id))
    }

    fn remove(&mut self, id: u64) -> bool {
        for (_, lanes) in &mut self.tenants {
            for calls in &mut lanes.lanes {
                if let Some(index) = calls.iter().position(|queued| queued.call.id == id) {
                    calls.remove(index);
                    self.len -= 1;
                    return true;
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ticket(run: &str, tenant: &str, agent: &str, priority: Priority, submitted_ms: u64) -> Ticket {
        Ticket {
            run: run.to_owned(),
            tenant: tenant.to_owned(),
            agent: agent.to_owned(),
            priority,
            submitted_ms,
        }
    }

    fn call(id: u64, tenant: &str, priority: Priority, enqueued_ms: u64) -> Call {
        Call { id, tenant: tenant.to_owned(), priority, enqueued_ms, cost: 1 }
    }

    fn weights(pairs: &[(&str, u32)]) -> Weights {
        Weights(pairs.iter().map(|(tenant, weight)| (tenant.to_string(), *weight)).collect())
    }

    fn jain(shares: &[f64]) -> f64 {
        let sum: f64 = shares.iter().sum();
        let squares: f64 = shares.iter().map(|share| share * share).sum();
        sum * sum / (shares.len() as f64 * squares)
    }

    // ---- priorities -------------------------------------------------------------------

    #[test]
    fn priorities_round_trip_and_reject_unknown_strings_clearly() {
        for priority in Priority::ALL {
            assert_eq!(priority.as_str().parse::<Priority>(), Ok(priority));
            assert_eq!(priority.to_string(), priority.as_str());
        }
        assert_eq!(Priority::default(), Priority::Normal);
        for bad in ["", "High", " high", "urgent", "medium"] {
            let error = bad.parse::<Priority>().unwrap_err();
            assert_eq!(error.given, bad);
            assert_eq!(
                error.to_string(),
                format!("unknown priority {bad:?}: expected one of \"high\", \"normal\", \"low\"")
            );
        }
    }

    #[test]
    fn aging_gains_one_class_per_period_and_zero_turns_it_off() {
        assert_eq!(effective_rank(Priority::Low, 100, 100, 1000), 2);
        assert_eq!(effective_rank(Priority::Low, 100, 1099, 1000), 2);
        assert_eq!(effective_rank(Priority::Low, 100, 1100, 1000), 1);
        assert_eq!(effective_rank(Priority::Low, 100, 2100, 1000), 0);
        assert_eq!(effective_rank(Priority::Low, 100, 99_999, 1000), 0);
        assert_eq!(effective_rank(Priority::Low, 100, 99_999, 0), 2);
        // A clock that went backwards does not make anything worse than its base class.
        assert_eq!(effective_rank(Priority::Normal, 5000, 10, 1000), 1);
    }

    // ---- admission --------------------------------------------------------------------

    fn caps(global: Option<u32>, per_tenant: Option<u32>, per_agent: Option<u32>, queue: u32) -> Caps {
        Caps { global, per_tenant, per_agent, queue }
    }

    #[test]
    fn live_counts_per_tenant_follow_starts_and_ends() {
        let mut admitter = Admitter::new(caps(Some(2), None, None, 5), Weights::default(), 0);
        assert_eq!(admitter.caps(), caps(Some(2), None, None, 5));
        admitter.submit(ticket("a1", "acme", "x", Priority::Normal, 0), 0);
        admitter.submit(ticket("g1", "globex", "x", Priority::Normal, 0), 0);
        admitter.submit(ticket("a2", "acme", "x", Priority::Normal, 0), 0);
        assert_eq!((admitter.live_count_of("acme"), admitter.live_count_of("globex")), (1, 1));
        assert_eq!(admitter.live_count_of("nobody"), 0);
        // The queued acme run takes globex's slot when it ends.
        assert_eq!(admitter.finish("g1", 1), vec!["a2".to_owned()]);
        assert_eq!((admitter.live_count_of("acme"), admitter.live_count_of("globex")), (2, 0));
    }

    #[test]
    fn a_swapped_out_run_coming_back_queues_past_a_full_queue_and_starts_in_turn() {
        let mut admitter = Admitter::new(caps(Some(1), None, None, 1), Weights::default(), 0);
        assert_eq!(admitter.submit(ticket("parked", "t", "a", Priority::Normal, 0), 0), Admission::Start);
        // Swapped out: its slot goes to the next run.
        assert_eq!(admitter.finish("parked", 1), Vec::<String>::new());
        assert_eq!(admitter.submit(ticket("busy", "t", "a", Priority::Normal, 2), 2), Admission::Start);
        assert_eq!(
            admitter.submit(ticket("new", "t", "a", Priority::Normal, 3), 3),
            Admission::Queued { position: 1 }
        );
        // The queue is full, but its message came: it waits its turn, it is not refused.
        assert!(matches!(
            admitter.submit(ticket("other", "t", "a", Priority::Normal, 4), 4),
            Admission::Rejected { .. }
        ));
        assert_eq!(
            admitter.resume(ticket("parked", "t", "a", Priority::Normal, 5), 5),
            Admission::Queued { position: 2 }
        );
        assert_eq!(
            admitter.resume(ticket("parked", "t", "a", Priority::Normal, 6), 6),
            Admission::Queued { position: 2 }
        );
        assert_eq!(admitter.finish("busy", 7), vec!["new".to_owned()]);
        assert_eq!(admitter.finish("new", 8), vec!["parked".to_owned()]);
        assert_eq!(admitter.resume(ticket("parked", "t", "a", Priority::Normal, 9), 9), Admission::Start);
    }

    #[test]
    fn runs_start_until_a_cap_then_queue_then_are_rejected() {
        let mut admitter = Admitter::new(caps(Some(2), None, None, 1), Weights::default(), 0);
        assert_eq!(admitter.submit(ticket("r1", "t", "a", Priority::Normal, 0), 0), Admission::Start);
        assert_eq!(admitter.submit(ticket("r2", "t", "a", Priority::Normal, 0), 0), Admission::Start);
        assert_eq!(
            admitter.submit(ticket("r3", "t", "a", Priority::Normal, 0), 0),
            Admission::Queued { position: 1 }
        );
        let Admission::Rejected { retry_after_ms, reason } =
            admitter.submit(ticket("r4", "t", "a", Priority::Normal, 0), 0)
        else {
            panic!("a full queue must reject");
        };
        assert!(retry_after_ms >= MIN_RETRY_AFTER_MS);
        assert!(reason.contains("queue is full"), "{reason}");
        assert!(reason.contains("all 2 live run slots"), "{reason}");
        assert_eq!(admitter.live_count(), 2);
        assert_eq!(admitter.queued(), vec![("r3".to_owned(), 1)]);

        assert_eq!(admitter.finish("r1", 10), vec!["r3".to_owned()]);
        assert_eq!(admitter.live_count(), 2);
        assert!(admitter.queued().is_empty());
    }

    #[test]
    fn retry_after_follows_recent_run_durations_with_a_one_second_floor() {
        let mut admitter = Admitter::new(caps(Some(2), None, None, 2), Weights::default(), 0);
        // Two runs of 60 s each complete.
        for run in ["a", "b"] {
            admitter.submit(ticket(run, "t", "x", Priority::Normal, 0), 0);
        }
        admitter.finish("a", 60_000);
        admitter.finish("b", 60_000);
        for run in ["c", "d", "e", "f"] {
            admitter.submit(ticket(run, "t", "x", Priority::Normal, 60_000), 60_000);
        }
        // 2 waiting, 2 slots, 60 s per run: the queue drains in about 60 s.
        let Admission::Rejected { retry_after_ms, .. } =
            admitter.submit(ticket("g", "t", "x", Priority::Normal, 60_000), 60_000)
        else {
            panic!("a full queue must reject");
        };
        assert_eq!(retry_after_ms, 60_000);

        // No queue at all and no history: the floor.
        let mut admitter = Admitter::new(caps(Some(0), None, None, 0), Weights::default(), 0);
        let Admission::Rejected { retry_after_ms, .. } =
            admitter.submit(ticket("a", "t", "x", Priority::Normal, 0), 0)
        else {
            panic!("no slots and no queue must reject");
        };
        assert_eq!(retry_after_ms, MIN_RETRY_AFTER_MS);
    }

    #[test]
    fn per_tenant_and_per_agent_caps_let_others_through() {
        let mut admitter = Admitter::new(caps(Some(10), Some(1), Some(2), 10), Weights::default(), 0);
        assert_eq!(admitter.submit(ticket("a1", "alice", "x", Priority::Normal, 0), 0), Admission::Start);
        assert_eq!(
            admitter.submit(ticket("a2", "alice", "y", Priority::High, 0), 0),
            Admission::Queued { position: 1 }
        );
        assert_eq!(admitter.submit(ticket("b1", "bob", "x", Priority::Low, 0), 0), Admission::Start);
        // Agent x is at its cap of 2 even though carol has nothing live.
        assert!(matches!(
            admitter.submit(ticket("c1", "carol", "x", Priority::Normal, 0), 0),
            Admission::Queued { .. }
        ));
        assert_eq!(admitter.submit(ticket("d1", "dave", "z", Priority::Normal, 0), 0), Admission::Start);
        // b1 ends: x has a slot; c1 (carol, x) can start, a2 is still held by alice's cap.
        assert_eq!(admitter.finish("b1", 5), vec!["c1".to_owned()]);
        // a1 ends: a2 starts.
        assert_eq!(admitter.finish("a1", 6), vec!["a2".to_owned()]);
    }

    #[test]
    fn the_next_run_is_chosen_by_effective_priority_then_fair_share_then_order() {
        let aging_ms = 1000;
        let mut admitter = Admitter::new(caps(Some(1), None, None, 10), weights(&[("big", 3)]), aging_ms);
        admitter.submit(ticket("holder", "small", "x", Priority::Normal, 0), 0);
        admitter.submit(ticket("low-old", "small", "x", Priority::Low, 0), 0);
        admitter.submit(ticket("normal", "small", "x", Priority::Normal, 1500), 1500);
        admitter.submit(ticket("high-new", "small", "x", Priority::High, 1900), 1900);
        // At 1999 the low run has aged one class, to normal: high goes first.
        assert_eq!(admitter.finish("holder", 1999), vec!["high-new".to_owned()]);
        // At 2000 the low run has waited 2 * aging_ms and counts as high.
        admitter.submit(ticket("high-newer", "small", "x", Priority::High, 2000), 2000);
        assert_eq!(admitter.finish("high-new", 2000), vec!["low-old".to_owned()]);
        assert_eq!(admitter.finish("low-old", 2001), vec!["high-newer".to_owned()]);
        assert_eq!(admitter.finish("high-newer", 2002), vec!["normal".to_owned()]);

        // Fair share: with big (weight 3) holding 2 runs and small (weight 1) holding 1,
        // big's 2/3 < small's 1/1, so big's queued run goes first despite being later.
        let mut admitter = Admitter::new(caps(Some(4), None, None, 10), weights(&[("big", 3)]), 0);
        for (run, tenant) in [("b1", "big"), ("b2", "big"), ("s1", "small"), ("s2", "small")] {
            assert_eq!(admitter.submit(ticket(run, tenant, run, Priority::Normal, 0), 0), Admission::Start);
        }
        admitter.submit(ticket("s-wait", "small", "s", Priority::Normal, 1), 1);
        admitter.submit(ticket("b-wait", "big", "b", Priority::Normal, 2), 2);
        assert_eq!(admitter.queued(), vec![("b-wait".to_owned(), 1), ("s-wait".to_owned(), 2)]);
        assert_eq!(admitter.finish("s1", 3), vec!["b-wait".to_owned()]);
    }

    #[test]
    fn cancel_restore_and_duplicate_submissions() {
        let mut admitter = Admitter::new(caps(Some(1), None, None, 5), Weights::default(), 0);
        admitter.restore_live(ticket("old", "t", "x", Priority::Normal, 0));
        admitter.restore_live(ticket("older", "t", "x", Priority::Normal, 0));
        assert_eq!(admitter.live_count(), 2, "restored runs are never rejected, even over the cap");
        assert_eq!(
            admitter.submit(ticket("new", "t", "x", Priority::High, 0), 0),
            Admission::Queued { position: 1 }
        );
        assert_eq!(
            admitter.submit(ticket("new", "t", "x", Priority::High, 0), 0),
            Admission::Queued { position: 1 }
        );
        assert_eq!(admitter.queued().len(), 1);
        // One restored run ends: still at the cap of 1, nothing starts.
        assert!(admitter.finish("old", 10).is_empty());
        assert_eq!(admitter.finish("older", 11), vec!["new".to_owned()]);
        assert_eq!(admitter.submit(ticket("new", "t", "x", Priority::High, 0), 12), Admission::Start);
        assert_eq!(admitter.live_count(), 1);

        admitter.submit(ticket("gone", "t", "x", Priority::Normal, 0), 13);
        assert!(admitter.cancel("gone"));
        assert!(!admitter.cancel("gone"));
        assert!(admitter.finish("new", 14).is_empty());
        assert_eq!(admitter.live_count(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Submit { run: u8, tenant: u8, agent: u8, priority: Priority },
        Finish { run: u8 },
        Cancel { run: u8 },
        Wait { ms: u16 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let priority = prop_oneof![Just(Priority::High), Just(Priority::Normal), Just(Priority::Low)];
        prop_oneof![
            4 => (0u8..24, 0u8..3, 0u8..3, priority)
                .prop_map(|(run, tenant, agent, priority)| Op::Submit { run, tenant, agent, priority }),
            3 => (0u8..24).prop_map(|run| Op::Finish { run }),
            1 => (0u8..24).prop_map(|run| Op::Cancel { run }),
            1 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
        ]
    }

    fn opt_cap() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![Just(None), (0u32..5).prop_map(Some)]
    }

    proptest! {
        /// Model check: whatever the sequence of submit/finish/cancel, no cap is exceeded,
        /// the queue stays within its bound, every run is in at most one place, and no
        /// queued run could have started (the admitter is work-conserving).
        #[test]
        fn caps_are_never_exceeded(
            global in opt_cap(),
            per_tenant in opt_cap(),
            per_agent in opt_cap(),
            queue in 0u32..6,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let caps = Caps { global, per_tenant, per_agent, queue };
            let mut admitter = Admitter::new(caps, weights(&[("t0", 2)]), 1000);
            // The model: run -> (tenant, agent), for live and queued runs.
            let mut live: BTreeMap<String, (String, String)> = BTreeMap::new();
            let mut queued: BTreeMap<String, (String, String)> = BTreeMap::new();
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Submit { run, tenant, agent, priority } => {
                        let (run, tenant, agent) = (format!("r{run}"), format!("t{tenant}"), format!("a{agent}"));
                        let known = live.contains_key(&run) || queued.contains_key(&run);
                        let answer = admitter.submit(ticket(&run, &tenant, &agent, priority, now), now);
                        match answer {
                            Admission::Start => {
                                prop_assert!(!queued.contains_key(&run));
                                live.entry(run).or_insert((tenant, agent));
                            }
                            Admission::Queued { position } => {
                                prop_assert!(!live.contains_key(&run));
                                queued.entry(run).or_insert((tenant, agent));
                                prop_assert!(position >= 1 && position <= queued.len());
                            }
                            Admission::Rejected { retry_after_ms, .. } => {
                                prop_assert!(!known);
                                prop_assert!(retry_after_ms >= MIN_RETRY_AFTER_MS);
                                prop_assert_eq!(queued.len(), queue as usize);
                            }
                        }
                    }
                    Op::Finish { run } => {
                        let run = format!("r{run}");
                        let started = admitter.finish(&run, now);
                        if live.remove(&run).is_none() {
                            queued.remove(&run);
                            prop_assert!(started.is_empty());
                        }
                        for run in started {
                            let entry = queued.remove(&run);
                            prop_assert!(entry.is_some(), "{} started without being queued", run);
                            live.insert(run, entry.unwrap_or_default());
                        }
                    }
                    Op::Cancel { run } => {
                        let run = format!("r{run}");
                        prop_assert_eq!(admitter.cancel(&run), queued.remove(&run).is_some());
                    }
                    Op::Wait { ms } => now += u64::from(ms),
                }

                prop_assert_eq!(admitter.live_count(), live.len());
                prop_assert!(queued.len() <= queue as usize);
                let mut positions: Vec<(String, usize)> = admitter.queued();
                positions.sort();
                prop_assert_eq!(
                    positions.iter().map(|(run, _)| run.clone()).collect::<Vec<_>>(),
                    queued.keys().cloned().collect::<Vec<_>>()
                );
                let count = |pick: &dyn Fn(&(String, String)) -> &str, key: &str| {
                    live.values().filter(|entry| pick(entry) == key).count() as u32
                };
                let within = |cap: Option<u32>, value: u32| cap.is_none_or(|cap| value <= cap);
                let can_start = |tenant: &str, agent: &str| {
                    global.is_none_or(|cap| (live.len() as u32) < cap)
                        && per_tenant.is_none_or(|cap| count(&|entry| &entry.0, tenant) < cap)
                        && per_agent.is_none_or(|cap| count(&|entry| &entry.1, agent) < cap)
                };
                prop_assert!(within(global, live.len() as u32));
                for (tenant, agent) in live.values() {
                    prop_assert!(within(per_tenant, count(&|entry| &entry.0, tenant)));
                    prop_assert!(within(per_agent, count(&|entry| &entry.1, agent)));
                }
                for (run, (tenant, agent)) in &queued {
                    prop_assert!(!can_start(tenant, agent), "{} is queued but could start", run);
                }
            }
        }
    }

    // ---- call queue -------------------------------------------------------------------

    #[test]
    fn fifo_baseline_is_push_order_whatever_the_priority_or_tenant() {
        let mut queue = CallQueue::fifo();
        let priorities = [Priority::Low, Priority::High, Priority::Normal];
        for id in 0..30u64 {
            let tenant = if id % 4 == 0 { "heavy" } else { "light" };
            queue.push(Call { cost: id * 7 + 1, ..call(id, tenant, priorities[id as usize % 3], id) });
        }
        assert_eq!(queue.position(5, 100), Some(6));
        assert!(queue.remove(5));
        assert!(!queue.remove(5));
        assert_eq!(queue.len(), 29);
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop(1000)).map(|call| call.id).collect();
        let expected: Vec<u64> = (0..30).filter(|id| *id != 5).collect();
        assert_eq!(order, expected);
        assert!(queue.is_empty());
    }

    #[test]
    fn higher_classes_go_first_and_a_tenant_is_fifo_within_a_class() {
        let mut queue = CallQueue::new(Weights::default(), 0);
        queue.push(call(1, "a", Priority::Low, 0));
        queue.push(call(2, "a", Priority::Normal, 0));
        queue.push(call(3, "a", Priority::High, 0));
        queue.push(call(4, "a", Priority::High, 0));
        queue.push(call(5, "a", Priority::Normal, 0));
        assert_eq!(queue.position(1, 0), Some(5));
        assert_eq!(queue.position(3, 0), Some(1));
        assert_eq!(queue.position(99, 0), None);
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop(1_000_000)).map(|call| call.id).collect();
        assert_eq!(order, vec![3, 4, 2, 5, 1], "aging is off: low stays last forever");
    }

    #[test]
    fn remove_drops_a_waiting_call_and_keeps_the_rest_in_order() {
        let mut queue = CallQueue::new(Weights::default(), 1000);
        for id in 0..6 {
            queue.push(call(id, if id % 2 == 0 { "a" } else { "b" }, Priority::Normal, 0));
        }
        assert!(queue.remove(2));
        assert!(!queue.remove(2));
        assert_eq!(queue.len(), 5);
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop(0)).map(|call| call.id).collect();
        assert_eq!(order, vec![0, 1, 3, 4, 5]);
    }

    /// A steady stream of high-priority calls (two pushed per pop, so the queue is always
    /// saturated) and one low-priority call from a quiet tenant. Bound: the low call
    /// reaches the top class after exactly `2 * aging_ms`; from then on its tenant's start
    /// tag is the current virtual time, which no backlogged tenant's tag is below, and it
    /// was pushed before every call it ties with, so it goes at the first pop at or after
    /// `enqueued + 2 * aging_ms`. It is not sent earlier, because high calls are waiting.
    #[test]
    fn low_priority_is_popped_within_two_aging_periods_from_another_tenant() {
        for aging_ms in [100u64, 1000, 7000] {
            let pop_every_ms = 10;
            let enqueued_ms = 55;
            let mut queue = CallQueue::new(Weights::default(), aging_ms);
            let mut next_id = 1000;
            let mut popped_low_at = None;
            queue.push(call(1, "quiet", Priority::Low, enqueued_ms));
            let mut now = 0;
            while popped_low_at.is_none() {
                for _ in 0..2 {
                    queue.push(call(next_id, "hog", Priority::High, now));
                    next_id += 1;
                }
                if queue.pop(now).is_some_and(|call| call.id == 1) {
                    popped_low_at = Some(now);
                }
                now += pop_every_ms;
                assert!(now < 100 * aging_ms, "the low call starved");
            }
            let bound = (enqueued_ms + 2 * aging_ms).next_multiple_of(pop_every_ms);
            assert_eq!(popped_low_at, Some(bound), "aging_ms {aging_ms}");
        }
    }

    proptest! {
        /// The same bound for the hardest case: the low call's own tenant floods high calls
        /// too. Then it also waits for that tenant's high calls pushed before it (they are
        /// ahead in the same line), so the bound is: the first pop at or after
        /// `enqueued + 2 * aging_ms`, plus one pop per call that was ahead of it in the top
        /// class at that moment and pushed before it, plus one pop per other tenant
        /// (start-time fair queuing serves each other backlogged tenant at most once per
        /// unit of virtual time the low call's tenant is charged, with equal costs and
        /// weights).
        #[test]
        fn low_priority_is_popped_within_a_bound_derived_from_aging(
            aging_ms in 1u64..2000,
            pop_every_ms in 1u64..50,
            pushes_per_pop in 1usize..4,
            backlog_before in 0usize..40,
            tenants in 1usize..4,
        ) {
            let mut queue = CallQueue::new(Weights::default(), aging_ms);
            let mut next_id = 1000;
            let tenant_name = |index: usize| format!("t{index}");
            for index in 0..backlog_before {
                queue.push(call(next_id, &tenant_name(index % tenants), Priority::High, 0));
                next_id += 1;
            }
            let ahead_of_low = queue.len();
            queue.push(call(1, &tenant_name(0), Priority::Low, 0));
            let mut now = 0;
            let mut pops = 0u64;
            let mut pops_after_promotion = 0u64;
            loop {
                for index in 0..pushes_per_pop {
                    queue.push(call(next_id, &tenant_name(index % tenants), Priority::High, now));
                    next_id += 1;
                }
                let popped = queue.pop(now);
                pops += 1;
                if now >= 2 * aging_ms {
                    pops_after_promotion += 1;
                }
                if popped.is_some_and(|call| call.id == 1) {
                    break;
                }
                now += pop_every_ms;
                prop_assert!(pops < 1_000_000, "the low call starved");
            }
            prop_assert!(
                pops_after_promotion as usize <= 1 + ahead_of_low + tenants,
                "popped {} pops after promotion, bound {}",
                pops_after_promotion,
                1 + ahead_of_low + tenants
            );
        }
    }

    /// Pops `count` calls from a queue that every tenant keeps saturated, and returns the
    /// cost each tenant was served.
    fn saturated_service(
        weights: Weights,
        tenants: &[&str],
        cost_of: impl Fn(usize, u64) -> u64,
        count: usize,
    ) -> Vec<u64> {
        let mut queue = CallQueue::new(weights, 60_000);
        let mut served = vec![0u64; tenants.len()];
        let mut next_id = 0u64;
        let index_of: BTreeMap<&str, usize> =
            tenants.iter().enumerate().map(|(index, name)| (*name, index)).collect();
        // Deep backlogs: the first tenant floods 10x more calls than the others.
        for (index, tenant) in tenants.iter().enumerate() {
            let depth = if index == 0 { 10 * count } else { count };
            for _ in 0..depth {
                queue.push(Call {
                    cost: cost_of(index, next_id),
                    ..call(next_id, tenant, Priority::Normal, 0)
                });
                next_id += 1;
            }
        }
        for _ in 0..count {
            let call = queue.pop(1).expect("every tenant is backlogged");
            served[index_of[call.tenant.as_str()]] += call.cost;
        }
        served
    }

    #[test]
    fn equal_weights_share_equally_even_when_one_tenant_floods() {
        let tenants = ["flood", "b", "c"];
        // Costs vary per call (1..=1000 tokens) and differ per tenant.
        let cost = |index: usize, id: u64| 1 + (id * 7919 + index as u64 * 104_729) % 1000;
        let served = saturated_service(Weights::default(), &tenants, cost, 3000);
        let shares: Vec<f64> = served.iter().map(|&cost| cost as f64).collect();
        let index = jain(&shares);
        assert!(index >= 0.99, "Jain's index {index} for {served:?}");
        let total: u64 = served.iter().sum();
        for cost in &served {
            let share = *cost as f64 / total as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.02, "{served:?}");
        }
    }

    #[test]
    fn shares_follow_weights_one_two_three() {
        let tenants = ["one", "two", "three"];
        let weights = weights(&[("one", 1), ("two", 2), ("three", 3)]);
        let cost = |index: usize, id: u64| 1 + (id * 31 + index as u64 * 17) % 200;
        let served = saturated_service(weights, &tenants, cost, 6000);
        let total: u64 = served.iter().sum();
        for (index, cost) in served.iter().enumerate() {
            let share = *cost as f64 / total as f64;
            let expected = (index + 1) as f64 / 6.0;
            assert!((share - expected).abs() < 0.01, "{served:?}");
        }
        let normalized: Vec<f64> =
            served.iter().enumerate().map(|(index, cost)| *cost as f64 / (index + 1) as f64).collect();
        assert!(jain(&normalized) >= 0.999, "{served:?}");
    }

    #[test]
    fn a_tenant_returning_from_idle_gets_no_banked_credit() {
        let mut queue = CallQueue::new(Weights::default(), 0);
        for id in 0..100 {
            queue.push(call(id, "busy", Priority::Normal, 0));
        }
        for _ in 0..50 {
            queue.pop(0);
        }
        // "late" was idle while busy was served 50 times; it now alternates with busy
        // instead of getting 50 calls in a row.
        for id in 100..110 {
            queue.push(call(id, "late", Priority::Normal, 0));
        }
        let tenants: Vec<String> = (0..6).filter_map(|_| queue.pop(0)).map(|call| call.tenant).collect();
        assert_eq!(tenants, ["late", "busy", "late", "busy", "late", "busy"]);
    }
}
