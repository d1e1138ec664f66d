//! Schedules as pure decisions: a cron expression in a time zone ([`CronSchedule`]), the
//! catch-up and overlap policies, deterministic jitter, and [`plan`]: which ticks fire,
//! which are skipped, and when to look again, given what the store says fired last.
//!
//! Times are Unix milliseconds. The kernel reads the clock and the store and passes both
//! in; nothing here does either. DST follows croner's documented rules (the Open Cron
//! Pattern Specification): in a spring-forward gap a fixed-time job runs at the first
//! valid time after the gap, wildcard ticks inside the gap do not exist; in a fall-back
//! overlap a fixed-time job runs once (the first pass), a wildcard job on each pass.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use sha2::{Digest, Sha256};

/// Why an expression, zone or policy was refused, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "cron expression {expr:?} has {found} fields; give 5 (minute hour day-of-month month day-of-week) \
         or 6 (a seconds field first), e.g. '0 9 * * MON-FRI'"
    )]
    FieldCount { expr: String, found: usize },
    #[error(
        "cron expression {expr:?}: the {field} field {text:?} at position {position} is not valid ({reason})"
    )]
    Field { expr: String, field: &'static str, text: String, position: usize, reason: String },
    #[error("cron expression {expr:?} is not valid: {reason}")]
    Expression { expr: String, reason: String },
    #[error("cron expression {expr:?} never matches a time (e.g. the 30th of February)")]
    NeverFires { expr: String },
    #[error("time zone {zone:?} is not an IANA zone name; use e.g. UTC, Europe/Paris, America/New_York")]
    TimeZone { zone: String },
    #[error("{0}")]
    Policy(String),
}

/// A parsed cron expression (5 fields, or 6 with seconds first) in an IANA time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    cron: Cron,
    zone: Tz,
    expr: String,
}

const FIELDS_5: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];
const FIELDS_6: [&str; 6] = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"];

fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build()
}

impl CronSchedule {
    /// Parses `expr` in `zone`. An error names the field and its position (1-based
    /// character offset in `expr`).
    pub fn parse(expr: &str, zone: &str) -> Result<CronSchedule, ScheduleError> {
        let zone = Tz::from_str(zone).map_err(|_| ScheduleError::TimeZone { zone: zone.to_owned() })?;
        let fields: Vec<(usize, &str)> = field_positions(expr);
        let nickname = fields.len() == 1 && expr.trim_start().starts_with('@');
        if !nickname && fields.len() != 5 && fields.len() != 6 {
            return Err(ScheduleError::FieldCount { expr: expr.to_owned(), found: fields.len() });
        }
        match parser().parse(expr) {
            Ok(cron) => {
                let schedule = CronSchedule { cron, zone, expr: expr.to_owned() };
                // A pattern that matches no date (Feb 30) is refused now, not at fire time.
                if schedule.next_after(0).is_none() {
                    return Err(ScheduleError::NeverFires { expr: expr.to_owned() });
                }
                Ok(schedule)
            }
            Err(whole) => Err(locate(expr, &fields)
                .unwrap_or(ScheduleError::Expression { expr: expr.to_owned(), reason: whole.to_string() })),
        }
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn zone(&self) -> &str {
        self.zone.name()
    }

    /// The first tick strictly after `after_ms`.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let start = self.zone.from_utc_datetime(&utc(after_ms)?.naive_utc());
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok()
    }

    /// The last tick strictly before `before_ms`.
    pub fn previous_before(&self, before_ms: u64) -> Option<u64> {
        let start = self.zone.from_utc_datetime(&utc(before_ms)?.naive_utc());
        let previous = self.cron.find_previous_occurrence(&start, false).ok()?;
        u64::try_from(previous.timestamp_millis()).ok()
    }

    /// Up to `limit` ticks after `after_ms`, in order.
    pub fn next_ticks(&self, after_ms: u64, limit: usize) -> Vec<u64> {
        let mut ticks = Vec::with_capacity(limit);
        let mut cursor = after_ms;
        while ticks.len() < limit {
            match self.next_after(cursor) {
                Some(tick) => {
                    ticks.push(tick);
                    cursor = tick;
                }
                None => break,
            }
        }
        ticks
    }

    /// A tick as an RFC 3339 time in the schedule's zone (what a run's input names).
    pub fn local_time(&self, tick_ms: u64) -> String {
        match utc(tick_ms) {
            Some(time) => self.zone.from_utc_datetime(&time.naive_utc()).to_rfc3339(),
            None => tick_ms.to_string(),
        }
    }
}

fn utc(ms: u64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
}

/// Each whitespace-separated field with its 1-based character position.
fn field_positions(expr: &str) -> Vec<(usize, &str)> {
    let mut fields = Vec::new();
    let mut start = None;
    for (index, ch) in expr.char_indices().chain([(expr.len(), ' ')]) {
        match (ch.is_whitespace(), start) {
            (false, None) => start = Some(index),
            (true, Some(begin)) => {
                fields.push((expr[..begin].chars().count() + 1, &expr[begin..index]));
                start = None;
            }
            _ => {}
        }
    }
    fields
}

/// Finds the first field that is wrong on its own: each field is tried in an expression
/// whose other fields are `*`.
fn locate(expr: &str, fields: &[(usize, &str)]) -> Option<ScheduleError> {
    let names: &[&'static str] = if fields.len() == 6 { &FIELDS_6 } else { &FIELDS_5 };
    for (index, (position, text)) in fields.iter().enumerate() {
        let probe: Vec<&str> = (0..fields.len()).map(|i| if i == index { *text } else { "*" }).collect();
        if let Err(error) = parser().parse(&probe.join(" ")) {
            return Some(ScheduleError::Field {
                expr: expr.to_owned(),
                field: names[index],
                text: (*text).to_owned(),
                position: *position,
                reason: error.to_string(),
            });
        }
    }
    None
}

/// What happens to ticks that passed while the kernel was down (or the schedule was
/// due but not yet looked at): `None` fires only ticks still on time, `Latest` the
/// newest missed one, `All(n)` every missed one up to the newest `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    None,
    Latest,
    All(u32),
}

/// The bound of `all` when none is given.
pub const DEFAULT_CATCH_UP_BOUND: u32 = 100;
/// The largest bound `all:N` takes.
pub const MAX_CATCH_UP_BOUND: u32 = 10_000;

impl FromStr for CatchUp {
    type Err = ScheduleError;
    fn from_str(text: &str) -> Result<CatchUp, ScheduleError> {
        let bad = || {
            ScheduleError::Policy(format!(
                "catch-up {text:?} is not known; use none, latest, all or all:N (N from 1 to {MAX_CATCH_UP_BOUND})"
            ))
        };
        match text {
            "none" => Ok(CatchUp::None),
            "latest" => Ok(CatchUp::Latest),
            "all" => Ok(CatchUp::All(DEFAULT_CATCH_UP_BOUND)),
            _ => {
                let bound: u32 = text.strip_prefix("all:").ok_or_else(bad)?.parse().map_err(|_| bad())?;
                if bound == 0 || bound > MAX_CATCH_UP_BOUND {
                    return Err(bad());
                }
                Ok(CatchUp::All(bound))
            }
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatchUp::None => f.write_str("none"),
            CatchUp::Latest => f.write_str("latest"),
            CatchUp::All(bound) => write!(f, "all:{bound}"),
        }
    }
}

/// What a tick does when the run of the previous fire is still live: `Skip` records the
/// tick as skipped, `Queue` holds it until that run ends, `Allow` starts another run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    Skip,
    Queue,
    Allow,
}

impl FromStr for Overlap {
    type Err = ScheduleError;
    fn from_str(text: &str) -> Result<Overlap, ScheduleError> {
        match text {
            "skip" => Ok(Overlap::Skip),
            "queue" => Ok(Overlap::Queue),
            "allow" => Ok(Overlap::Allow),
            _ => {
                Err(ScheduleError::Policy(format!("overlap {text:?} is not known; use skip, queue or allow")))
            }
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
            Overlap::Allow => "allow",
        })
    }
}

/// The policies of one schedule, checked together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policies {
    pub catch_up: CatchUp,
    pub overlap: Overlap,
    /// The most a fire is delayed past its tick (0: no jitter).
    pub jitter_ms: u64,
}

/// The largest jitter: an hour.
pub const MAX_JITTER_MS: u64 = 3_600_000;

impl Policies {
    pub fn new(catch_up: CatchUp, overlap: Overlap, jitter_ms: u64) -> Result<Policies, ScheduleError> {
        if overlap == Overlap::Queue && catch_up == CatchUp::None {
            return Err(ScheduleError::Policy(
                "overlap queue needs catch-up latest or all: with none, a tick that waited for the previous \
                 run would be dropped as late"
                    .into(),
            ));
        }
        if jitter_ms > MAX_JITTER_MS {
            return Err(ScheduleError::Policy(format!(
                "jitter {jitter_ms} ms is over the largest, {MAX_JITTER_MS} ms (an hour)"
            )));
        }
        Ok(Policies { catch_up, overlap, jitter_ms })
    }
}

/// The delay of a tick's fire, in `[0, max_ms)`: a hash of the schedule's name and the
/// tick, so every node and every restart picks the same one.
pub fn jitter_ms(schedule: &str, tick_ms: u64, max_ms: u64) -> u64 {
    if max_ms == 0 {
        return 0;
    }
    let digest =
        Sha256::new().chain_update(schedule.as_bytes()).chain_update(tick_ms.to_be_bytes()).finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(head) % max_ms
}

/// How late a tick may be looked at and still count as on time (not missed).
pub const ON_TIME_GRACE_MS: u64 = 5_000;

/// What the kernel does now for one schedule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Ticks to fire now, oldest first.
    pub fire: Vec<u64>,
    /// Ticks to record as skipped (the previous run is live and the overlap is `skip`).
    pub skip: Vec<u64>,
    /// Whether every due tick was passed over (missed beyond the catch-up policy);
    /// nothing is recorded for them.
    pub dropped: bool,
    /// Whether due ticks wait for the previous run to end (`queue`).
    pub waiting: bool,
    /// The newest tick this plan settles (fired, skipped or dropped): the next plan
    /// starts after it. `None`: nothing was due.
    pub settled_through: Option<u64>,
    /// When to plan again at the latest (the next tick plus its jitter).
    pub next_check_ms: Option<u64>,
}

/// Decides what to do at `now_ms` for a schedule whose ticks up to `since_ms` are
/// settled (its last fire, or its creation or resumption), with the run of its last fire
/// live or not.
pub fn plan(
    schedule: &CronSchedule,
    name: &str,
    policies: &Policies,
    since_ms: u64,
    now_ms: u64,
    previous_live: bool,
) -> Plan {
    let due = |tick: u64| tick.saturating_add(jitter_ms(name, tick, policies.jitter_ms)) <= now_ms;
    // Walk back from now, newest tick first, only as far as the policy can use.
    let keep = match policies.catch_up {
        CatchUp::None | CatchUp::Latest => 1,
        CatchUp::All(bound) => bound as usize,
    };
    let horizon = match policies.catch_up {
        CatchUp::None => now_ms.saturating_sub(ON_TIME_GRACE_MS + policies.jitter_ms),
        _ => 0,
    };
    let mut candidates = Vec::new();
    let mut newest_due = None;
    // Cron has whole seconds: start at the next second so a tick at `now` is seen.
    let mut cursor = (now_ms / 1000 + 1) * 1000;
    let mut earliest_pending: Option<u64> = None;
    while let Some(tick) = schedule.previous_before(cursor) {
        if tick <= since_ms {
            break;
        }
        cursor = tick;
        if !due(tick) {
            earliest_pending = Some(tick);
            continue;
        }
        newest_due.get_or_insert(tick);
        let on_time = now_ms - tick <= ON_TIME_GRACE_MS + policies.jitter_ms;
        let wanted = match policies.catch_up {
            CatchUp::None => on_time,
            CatchUp::Latest | CatchUp::All(_) => candidates.len() < keep,
        };
        if wanted {
            candidates.push(tick);
        } else if tick < horizon || candidates.len() >= keep {
            break;
        }
    }
    candidates.reverse();
    let next_check_ms = earliest_pending
        .or_else(|| schedule.next_after(now_ms))
        .map(|tick| tick.saturating_add(jitter_ms(name, tick, policies.jitter_ms)));
    let mut plan = Plan { next_check_ms, ..Plan::default() };
    let Some(newest) = newest_due else { return plan };
    if candidates.is_empty() {
        plan.dropped = true;
        plan.settled_through = Some(newest);
        return plan;
    }
    match (previous_live, policies.overlap) {
        (true, Overlap::Queue) => {
            plan.waiting = true;
            return plan;
        }
        (true, Overlap::Skip) => plan.skip = candidates,
        _ => plan.fire = candidates,
    }
    plan.settled_through = Some(newest);
    plan
}

#[cfg(test)]
#[path = "trigger_tests.rs"]
mod tests;
