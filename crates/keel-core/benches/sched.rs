//! `cargo bench -p keel-core --bench sched`: the fair call queue against plain FIFO in a
//! deterministic discrete-event simulation of one rate-limited provider, then the queue's
//! own cost per push + pop. Prints markdown.
//!
//! The simulation is pure and seeded: the same build prints the same first table every run.
//! Only the cost table reads a clock.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use keel_core::sched::{Call, CallQueue, Priority, Weights};

/// The provider's limit: requests per minute, granted one at a time at an even pace.
const REQUESTS_PER_MINUTE: u64 = 600;
const SLOT_EVERY_MS: u64 = 60_000 / REQUESTS_PER_MINUTE;
const SIMULATED_MS: u64 = 30 * 60_000;
const AGING_MS: u64 = 30_000;
/// Tenants and their share of the offered load: the heavy tenant asks 5x the others.
const TENANTS: [(&str, u64); 3] = [("heavy", 5), ("light-a", 1), ("light-b", 1)];
/// Priority mix of every tenant's calls, in percent.
const PRIORITY_MIX: [(Priority, u64); 3] =
    [(Priority::High, 20), (Priority::Normal, 50), (Priority::Low, 30)];

/// splitmix64: a tiny deterministic generator, enough for arrival times and costs.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

/// The offered calls: Poisson arrivals per tenant at `load` times the provider's capacity in
/// total, split by `TENANTS`, sorted by arrival.
fn workload(load: f64, seed: u64) -> Vec<Call> {
    let mut rng = Rng(seed);
    let capacity_per_ms = 1.0 / SLOT_EVERY_MS as f64;
    let total_parts: u64 = TENANTS.iter().map(|(_, parts)| parts).sum();
    let mut calls = Vec::new();
    for (tenant, parts) in TENANTS {
        let rate_per_ms = load * capacity_per_ms * parts as f64 / total_parts as f64;
        let mut at = 0.0;
        loop {
            at += -rng.unit().ln() / rate_per_ms;
            if at >= SIMULATED_MS as f64 {
                break;
            }
            let mut roll = rng.below(100);
            let mut priority = Priority::Low;
            for (class, percent) in PRIORITY_MIX {
                if roll < percent {
                    priority = class;
                    break;
                }
                roll -= percent;
            }
            let cost = 200 + rng.below(3800);
            calls.push(Call { id: 0, tenant: tenant.to_owned(), priority, enqueued_ms: at as u64, cost });
        }
    }
    calls.sort_by_key(|call| call.enqueued_ms);
    for (id, call) in calls.iter_mut().enumerate() {
        call.id = id as u64;
    }
    calls
}

#[derive(Default)]
struct TenantTally {
    offered_calls: u64,
    served_calls: u64,
}

struct Outcome {
    /// Waits in ms per class; calls still waiting at the end count with the time they had
    /// waited so far, so a policy cannot look good by never serving someone.
    /// Keyed by (the tenant is the heavy one, class).
    waits: BTreeMap<(bool, Priority), Vec<u64>>,
    tenants: BTreeMap<&'static str, TenantTally>,
}

fn simulate(mut queue: CallQueue, calls: &[Call]) -> Outcome {
    let mut waits: BTreeMap<(bool, Priority), Vec<u64>> = BTreeMap::new();
    let mut tenants: BTreeMap<&'static str, TenantTally> = BTreeMap::new();
    let name_of = |tenant: &str| TENANTS.iter().map(|(name, _)| *name).find(|name| *name == tenant);
    let mut pending: BTreeMap<u64, &Call> = BTreeMap::new();
    let mut next = 0;
    let mut now = 0;
    while now < SIMULATED_MS {
        while next < calls.len() && calls[next].enqueued_ms <= now {
            let call = &calls[next];
            if let Some(name) = name_of(&call.tenant) {
                tenants.entry(name).or_default().offered_calls += 1;
            }
            pending.insert(call.id, call);
            queue.push(call.clone());
            next += 1;
        }
        if let Some(call) = queue.pop(now) {
            pending.remove(&call.id);
            waits
                .entry((call.tenant == TENANTS[0].0, call.priority))
                .or_default()
                .push(now - call.enqueued_ms);
            if let Some(name) = name_of(&call.tenant) {
                tenants.entry(name).or_default().served_calls += 1;
            }
        }
        now += SLOT_EVERY_MS;
    }
    for call in pending.values() {
        waits
            .entry((call.tenant == TENANTS[0].0, call.priority))
            .or_default()
            .push(SIMULATED_MS - call.enqueued_ms);
    }
    Outcome { waits, tenants }
}

fn percentile(values: &mut [u64], fraction: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 * fraction).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

/// Max-min fair shares (equal weights) of `capacity` among `demands`: a tenant asking less
/// than an equal split gets what it asks, and the rest is split again among the others.
fn max_min_fair(demands: &[f64], capacity: f64) -> Vec<f64> {
    let mut fair = vec![0.0; demands.len()];
    let mut open: Vec<usize> = (0..demands.len()).collect();
    let mut remaining = capacity;
    loop {
        let split = remaining / open.len() as f64;
        let (satisfied, unsatisfied): (Vec<usize>, Vec<usize>) =
            open.iter().partition(|&&index| demands[index] <= split);
        if satisfied.is_empty() {
            for index in &unsatisfied {
                fair[*index] = split;
            }
            return fair;
        }
        for index in satisfied {
            fair[index] = demands[index];
            remaining -= demands[index];
        }
        if unsatisfied.is_empty() {
            return fair;
        }
        open = unsatisfied;
    }
}

fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|value| value * value).sum();
    sum * sum / (values.len() as f64 * squares)
}

fn seconds(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

fn simulation_table() {
    println!(
        "## Call queue vs FIFO: one provider at {REQUESTS_PER_MINUTE} requests/min, {} simulated minutes\n",
        SIMULATED_MS / 60_000
    );
    println!(
        "Tenants heavy : light-a : light-b offer 5 : 1 : 1 of the load, equal weights; every tenant's calls \
         are 20% high, 50% normal, 30% low; cost 200..4000 tokens; aging {} s. Waits in seconds; calls \
         still queued at the end count with the wait so far. Throughput in calls/min served. \
         Jain = (Σx)²/(n·Σx²) over x_i = served_i / fair_i, where fair_i is tenant i's max-min fair \
         share of the calls actually served given what each tenant offered (a tenant offering less than \
         an equal split is owed all of it): 1.0 means every tenant got its demand-capped fair share.\n",
        AGING_MS / 1000
    );
    println!(
        "| load | policy | high p50 / p99, all | high p50 / p99, light tenants | high p50 / p99, heavy tenant \
         | normal p99 | low p99 | heavy /min | light-a /min | light-b /min | Jain |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for load in [0.9, 1.2, 2.0] {
        let calls = workload(load, 0x6b65_656c);
        for (policy, queue) in
            [("fair", CallQueue::new(Weights::default(), AGING_MS)), ("fifo", CallQueue::fifo())]
        {
            let outcome = simulate(queue, &calls);
            // Percentile of the waits of `priority` calls from the heavy tenant, the light ones
            // (`Some(false)`) or all (`None`).
            let wait = |heavy: Option<bool>, priority: Priority, fraction: f64| {
                let mut values: Vec<u64> = outcome
                    .waits
                    .iter()
                    .filter(|((is_heavy, class), _)| {
                        *class == priority && heavy.is_none_or(|h| h == *is_heavy)
                    })
                    .flat_map(|(_, values)| values.iter().copied())
                    .collect();
                seconds(percentile(&mut values, fraction))
            };
            let high = [None, Some(false), Some(true)]
                .map(|group| {
                    format!("{} / {}", wait(group, Priority::High, 0.5), wait(group, Priority::High, 0.99))
                })
                .join(" | ");
            let (normal_p99, low_p99) = (wait(None, Priority::Normal, 0.99), wait(None, Priority::Low, 0.99));
            let minutes = SIMULATED_MS as f64 / 60_000.0;
            let tally: Vec<&TenantTally> = TENANTS.iter().map(|(name, _)| &outcome.tenants[name]).collect();
            let served: Vec<f64> = tally.iter().map(|tally| tally.served_calls as f64).collect();
            let offered: Vec<f64> = tally.iter().map(|tally| tally.offered_calls as f64).collect();
            let fair = max_min_fair(&offered, served.iter().sum());
            let normalized: Vec<f64> = served.iter().zip(&fair).map(|(served, fair)| served / fair).collect();
            println!(
                "| {:.0}% | {policy} | {high} | {normal_p99} | {low_p99} | {:.0} | {:.0} | {:.0} | {:.3} |",
                load * 100.0,
                served[0] / minutes,
                served[1] / minutes,
                served[2] / minutes,
                jain(&normalized),
            );
        }
    }
    println!();
}

/// Nanoseconds per push + pop with `size` calls waiting, over 3 tenants and mixed classes.
fn cost_ns(mut queue: CallQueue, size: usize) -> f64 {
    let mut rng = Rng(size as u64);
    let tenants = ["heavy", "light-a", "light-b"];
    let make = |id: u64, now: u64, rng: &mut Rng| Call {
        id,
        tenant: tenants[rng.below(3) as usize].to_owned(),
        priority: Priority::ALL[rng.below(3) as usize],
        enqueued_ms: now,
        cost: 1 + rng.below(4000),
    };
    for id in 0..size as u64 {
        queue.push(make(id, 0, &mut rng));
    }
    let rounds = 200_000u64;
    let calls: Vec<Call> = (0..rounds).map(|round| make(size as u64 + round, round, &mut rng)).collect();
    let started = Instant::now();
    for (round, call) in calls.into_iter().enumerate() {
        queue.push(call);
        black_box(queue.pop(round as u64));
    }
    started.elapsed().as_nanos() as f64 / rounds as f64
}

fn cost_table() {
    println!("## Scheduler cost: ns per push + pop (200k rounds, 3 tenants, aging {} s)\n", AGING_MS / 1000);
    println!("| queued | fair | fifo |");
    println!("|---|---|---|");
    for size in [10, 1_000, 100_000] {
        let fair = cost_ns(CallQueue::new(Weights::default(), AGING_MS), size);
        let fifo = cost_ns(CallQueue::fifo(), size);
        println!("| {size} | {fair:.0} | {fifo:.0} |");
    }
}

fn main() {
    simulation_table();
    cost_table();
}
