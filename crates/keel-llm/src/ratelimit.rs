//! Rate limits, as pure clock-injected state: token buckets for requests and tokens per
//! minute for one provider/model, configured up front and then learned from what the
//! provider says (`x-ratelimit-*` from OpenAI-compatible servers, `anthropic-ratelimit-*`,
//! `Retry-After`). Every function takes `now` (monotonic) and, where a header holds a wall
//! clock time, `wall_now`; the async waiting lives in [`RateLimiter`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::HeaderMap;

/// What one response's headers say about the limits. Each field is `None` when absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateLimitInfo {
    pub requests: WindowInfo,
    pub tokens: WindowInfo,
    /// `retry-after-ms` / `Retry-After` (seconds or an HTTP date).
    pub retry_after: Option<Duration>,
}

/// One limit: its size, what is left, and when it is whole again (from now).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowInfo {
    pub limit: Option<f64>,
    pub remaining: Option<f64>,
    pub reset_in: Option<Duration>,
}

impl RateLimitInfo {
    /// Reads the rate-limit headers of either dialect (both may appear; OpenAI's win).
    pub fn from_headers(headers: &HeaderMap, wall_now: SystemTime) -> RateLimitInfo {
        // The rate-limit headers, found in one pass over the answer's: looking each of
        // the fifteen names up would hash and compare every one, on every call.
        let limits: Vec<(&str, &str)> = headers
            .iter()
            .filter(|(name, _)| {
                name.as_str().starts_with("x-ratelimit-") || name.as_str().starts_with("anthropic-ratelimit-")
            })
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?.trim())))
            .collect();
        if limits.is_empty() {
            return RateLimitInfo {
                retry_after: parse_retry_after(headers, wall_now),
                ..RateLimitInfo::default()
            };
        }
        // The first value of a repeated header, as `HeaderMap::get` answers.
        let text = |name: &str| limits.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let number = |name: &str| {
            text(name).and_then(|v| v.parse::<f64>().ok()).filter(|n| n.is_finite() && *n >= 0.0)
        };
        let go_duration = |name: &str| text(name).and_then(parse_go_duration);
        let instant = |name: &str| {
            text(name)
                .and_then(|v| humantime::parse_rfc3339_weak(v).ok())
                .map(|at| at.duration_since(wall_now).unwrap_or(Duration::ZERO))
        };
        let openai = |kind: &str| WindowInfo {
            limit: number(&format!("x-ratelimit-limit-{kind}")),
            remaining: number(&format!("x-ratelimit-remaining-{kind}")),
            reset_in: go_duration(&format!("x-ratelimit-reset-{kind}")),
        };
        // Anthropic's `tokens` headers give the most restrictive token limit in effect;
        // older answers only carry the input/output ones.
        let anthropic = |kinds: &[&str]| {
            kinds
                .iter()
                .map(|kind| WindowInfo {
                    limit: number(&format!("anthropic-ratelimit-{kind}-limit")),
                    remaining: number(&format!("anthropic-ratelimit-{kind}-remaining")),
                    reset_in: instant(&format!("anthropic-ratelimit-{kind}-reset")),
                })
                .find(|w| w.remaining.is_some() || w.reset_in.is_some())
                .unwrap_or_default()
        };
        let pick =
            |a: WindowInfo, b: WindowInfo| if a.remaining.is_some() || a.reset_in.is_some() { a } else { b };
        RateLimitInfo {
            requests: pick(openai("requests"), anthropic(&["requests"])),
            tokens: pick(openai("tokens"), anthropic(&["tokens", "input-tokens"])),
            retry_after: parse_retry_after(headers, wall_now),
        }
    }
}

/// `retry-after-ms` (milliseconds, OpenAI), else `Retry-After`: seconds, or an HTTP date.
pub fn parse_retry_after(headers: &HeaderMap, wall_now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) =
        text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = text("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(wall_now).unwrap_or(Duration::ZERO))
}

/// Parses a Go `time.Duration` string as OpenAI sends them: `6m0s`, `1s`, `20ms`,
/// `8.64s`, `1h2m3.5s`, `750us`.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if number_len == 0 {
            return None;
        }
        let value: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * seconds_per_unit;
    }
    total.is_finite().then(|| Duration::from_secs_f64(total))
}

/// A token bucket that refills continuously at `capacity` per minute and jumps back to
/// full at a reset time the provider announced.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// None: no limit known (yet); everything is allowed.
    pub capacity: Option<f64>,
    pub available: f64,
    pub updated: Instant,
    /// When the provider said the window is whole again.
    pub reset_at: Option<Instant>,
}

impl Bucket {
    pub fn unlimited(now: Instant) -> Bucket {
        Bucket { capacity: None, available: 0.0, updated: now, reset_at: None }
    }

    pub fn per_minute(limit: f64, now: Instant) -> Bucket {
        Bucket { capacity: Some(limit), available: limit, updated: now, reset_at: None }
    }

    fn refill(&mut self, now: Instant) {
        let Some(capacity) = self.capacity else { return };
        if now > self.updated {
            let refilled = capacity * (now - self.updated).as_secs_f64() / 60.0;
            self.available = (self.available + refilled).min(capacity);
            self.updated = now;
        }
        if self.reset_at.is_some_and(|at| at <= now) {
            self.available = capacity;
            self.reset_at = None;
        }
    }

    /// How long until `amount` is available (zero: now). An amount larger than the whole
    /// bucket waits for a full bucket rather than forever.
    pub fn wait_for(&mut self, now: Instant, amount: f64) -> Duration {
        self.refill(now);
        let Some(capacity) = self.capacity else { return Duration::ZERO };
        let amount = amount.min(capacity);
        // The tolerance absorbs float rounding in the refill arithmetic.
        if self.available >= amount - 1e-9 {
            return Duration::ZERO;
        }
        let by_refill = if capacity > 0.0 {
            Duration::from_secs_f64((amount - self.available) * 60.0 / capacity)
        } else {
            Duration::MAX
        };
        let by_reset = self.reset_at.map_or(Duration::MAX, |at| at.saturating_duration_since(now));
        by_refill.min(by_reset)
    }

    fn take(&mut self, amount: f64) {
        if let Some(capacity) = self.capacity {
            self.available -= amount.min(capacity);
        }
    }

    fn give_back(&mut self, amount: f64) {
        if let Some(capacity) = self.capacity {
            self.available = (self.available + amount).min(capacity);
        }
    }

    /// Takes what the provider reported. The provider is the authority on what is left;
    /// a configured limit stays an upper bound on the learned one.
    fn learn(&mut self, now: Instant, window: &WindowInfo, configured: Option<f64>) {
        self.refill(now);
        if let Some(limit) = window.limit {
            let capacity = configured.map_or(limit, |c| c.min(limit));
            if self.capacity.is_none() {
                self.available = capacity;
            }
            self.capacity = Some(capacity);
        }
        if let Some(remaining) = window.remaining {
            // Without a limit header, what is left now is the best guess at the size.
            let capacity = *self.capacity.get_or_insert(remaining.max(1.0));
            self.available = remaining.min(capacity);
            if let Some(reset_in) = window.reset_in {
                self.reset_at = Some(now + reset_in);
            }
        }
    }
}

/// Configured limits for one model (None: learn them from the provider).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

/// The limit state of one provider/model.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitState {
    pub configured: Limits,
    pub requests: Bucket,
    pub tokens: Bucket,
    /// No request before this (a 429's `Retry-After`).
    pub blocked_until: Option<Instant>,
}

impl LimitState {
    pub fn new(configured: Limits, now: Instant) -> LimitState {
        let bucket =
            |limit: Option<f64>| limit.map_or_else(|| Bucket::unlimited(now), |l| Bucket::per_minute(l, now));
        LimitState {
            configured,
            requests: bucket(configured.requests_per_minute.map(f64::from)),
            tokens: bucket(configured.tokens_per_minute.map(|t| t as f64)),
            blocked_until: None,
        }
    }

    /// Takes one request and `tokens` tokens if both are available now; otherwise says
    /// how long to wait (and takes nothing).
    pub fn try_acquire(&mut self, now: Instant, tokens: u64) -> Result<(), Duration> {
        let wait = self.wait_for(now, tokens);
        if wait > Duration::ZERO {
            return Err(wait);
        }
        self.blocked_until = None;
        self.requests.take(1.0);
        self.tokens.take(tokens as f64);
        Ok(())
    }

    /// How long until one request and `tokens` tokens are available (zero: now). Refills
    /// the buckets to `now` but takes nothing.
    pub fn wait_for(&mut self, now: Instant, tokens: u64) -> Duration {
        let blocked = self.blocked_until.map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        blocked.max(self.requests.wait_for(now, 1.0)).max(self.tokens.wait_for(now, tokens as f64))
    }

    /// A call that reserved `reserved` tokens used `used`: the difference goes back.
    pub fn settle(&mut self, reserved: u64, used: u64) {
        if used < reserved {
            self.tokens.give_back((reserved - used) as f64);
        } else {
            self.tokens.take((used - reserved) as f64);
        }
    }

    /// Learns from a response's headers (any status). A `retry_after` (from a 429 or 529)
    /// blocks every request to this model until it has passed.
    pub fn observe(&mut self, now: Instant, info: &RateLimitInfo, rate_limited: bool) {
        self.requests.learn(now, &info.requests, self.configured.requests_per_minute.map(f64::from));
        self.tokens.learn(now, &info.tokens, self.configured.tokens_per_minute.map(|t| t as f64));
        let retry_after = info.retry_after.or_else(|| {
            // A 429 without Retry-After: wait for the window that ran out.
            rate_limited
                .then(|| {
                    let exhausted =
                        |w: &WindowInfo| w.remaining.is_some_and(|r| r < 1.0).then_some(w.reset_in).flatten();
                    exhausted(&info.requests).into_iter().chain(exhausted(&info.tokens)).max()
                })
                .flatten()
        });
        if let Some(wait) = retry_after {
            let until = now + wait;
            self.blocked_until = Some(self.blocked_until.map_or(until, |b| b.max(until)));
        }
    }

    /// What keeps a call of `tokens` tokens from going now, the strongest reason first;
    /// `None` if it would fit. Refills the buckets to `now` like [`LimitState::try_acquire`]
    /// but takes nothing.
    pub fn blocked_by(&mut self, now: Instant, tokens: u64) -> Option<Blocker> {
        if self.blocked_until.is_some_and(|until| until > now) {
            Some(Blocker::RetryAfter)
        } else if self.requests.wait_for(now, 1.0) > Duration::ZERO {
            Some(Blocker::Requests)
        } else if self.tokens.wait_for(now, tokens as f64) > Duration::ZERO {
            Some(Blocker::Tokens)
        } else {
            None
        }
    }
}

/// Which limit holds a model's waiting calls back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocker {
    /// The provider answered 429 (or 529) with a `Retry-After` that has not passed.
    RetryAfter,
    /// The requests-per-minute bucket is empty.
    Requests,
    /// The tokens-per-minute bucket holds less than the next call needs.
    Tokens,
}

impl Blocker {
    /// In words, for `keel ps`.
    pub fn as_str(self) -> &'static str {
        match self {
            Blocker::RetryAfter => "provider's Retry-After",
            Blocker::Requests => "requests limit",
            Blocker::Tokens => "tokens limit",
        }
    }
}

/// An LLM call waiting for its provider's capacity, as [`RateLimiter::waiting`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingCall {
    /// The provider's name (the limiter is told it by its provider).
    pub provider: String,
    pub model: String,
    /// The run making the call ([`Caller::run`]), when the caller said.
    pub run: Option<String>,
    pub tenant: String,
    pub priority: keel_core::sched::Priority,
    /// Its place in the model's queue: 1 is sent at the next free slot, if no
    /// higher-priority call arrives first.
    pub position: usize,
    /// How many calls wait for the model, this one included.
    pub queue_len: usize,
    /// How long it has waited so far.
    pub waited_ms: u64,
    /// Which limit holds the queue back, when one does at the moment of the look (a call
    /// about to be granted has none).
    pub blocked_by: Option<Blocker>,
}

/// One model's queue and limits at one moment, as [`RateLimiter::status`] saw them (for
/// `GET /v1/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStatus {
    /// The provider's name (the limiter is told it by its provider).
    pub provider: String,
    pub model: String,
    /// Calls waiting in the model's queue (of the tenant asked about, if one was).
    pub waiting: usize,
    /// Calls granted capacity and not yet answered (of the tenant asked about, if one was).
    pub in_flight: usize,
    /// Which limit holds the next call back now, if one does.
    pub blocked_by: Option<Blocker>,
    /// How long until that limit lets the next call go (with `blocked_by`).
    pub reset_in: Option<Duration>,
}

/// Who is calling, for the order in which waiting calls get the provider's capacity:
/// the kernel sets it around each call (`CALLER.scope(...)`); calls without one are
/// treated as tenant `default`, priority normal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub priority: keel_core::sched::Priority,
    /// The run making the call, so [`RateLimiter::waiting`] can say whose call waits.
    pub run: Option<String>,
}

tokio::task_local! {
    /// The caller of the LLM call the current task is making.
    pub static CALLER: Caller;
}

tokio::task_local! {
    /// How long the LLM calls of the current task have waited in their models' queues, in
    /// total (every [`RateLimiter::acquire`] adds its wait, zero when it went at once):
    /// the kernel sets it around a call for its queue-wait metric.
    pub static QUEUE_WAIT: std::cell::Cell<Duration>;
}

/// How long a waiting call's priority takes to rise one class.
const CALL_AGING_MS: u64 = 30_000;

/// The calls of one model waiting for capacity, in `keel_core::sched::CallQueue` order:
/// priority (with aging), then fair share between tenants, then arrival.
#[derive(Debug)]
struct Waiting {
    queue: keel_core::sched::CallQueue,
    grants: HashMap<u64, tokio::sync::oneshot::Sender<()>>,
    /// The run of each waiting call that has one (for [`RateLimiter::waiting`]).
    runs: HashMap<u64, String>,
}

impl Default for Waiting {
    fn default() -> Waiting {
        // `KEEL_LLM_QUEUE=fifo` serves waiting calls first come, first served: the
        // baseline the scheduling benchmark compares against.
        let queue = match std::env::var("KEEL_LLM_QUEUE").as_deref() {
            Ok("fifo") => keel_core::sched::CallQueue::fifo(),
            _ => {
                keel_core::sched::CallQueue::new(keel_core::sched::Weights(Default::default()), CALL_AGING_MS)
            }
        };
        Waiting { queue, grants: HashMap::new(), runs: HashMap::new() }
    }
}

/// A call's place in a model's queue, held while [`RateLimiter::acquire`] waits. Dropped
/// unfinished (the caller's future was dropped: its run stopped, its agent went away), it
/// takes the call out of the queue, and gives the capacity back if a grant had already
/// arrived for it.
struct Ticket<'a> {
    limiter: &'a RateLimiter,
    model: &'a str,
    id: u64,
    cost: u64,
    granted: tokio::sync::oneshot::Receiver<()>,
    /// The call was granted or left the queue itself: nothing to undo.
    done: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.limiter.leave(self.model, self.id);
        if self.granted.try_recv().is_ok() {
            self.limiter.settle(self.model, self.cost, 0);
        }
    }
}

/// The shared limit state of every model of one provider, with the async wait.
#[derive(Debug, Default)]
pub struct RateLimiter {
    configured: HashMap<String, Limits>,
    states: Mutex<HashMap<String, LimitState>>,
    /// Calls waiting for capacity, per model (lock order: `waiting`, then `states`).
    waiting: Mutex<HashMap<String, Waiting>>,
    next_call: std::sync::atomic::AtomicU64,
    /// Calls sent upstream and not answered yet, per model and tenant (see
    /// [`RateLimiter::sending`]).
    in_flight: Mutex<HashMap<String, HashMap<String, usize>>>,
}

/// A call in flight to its provider, counted in [`RateLimiter::status`] while it lives:
/// dropped when the call is answered, fails, or is abandoned (its future dropped).
pub struct InFlight<'a> {
    limiter: &'a RateLimiter,
    model: String,
    tenant: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.limiter.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tenants) = in_flight.get_mut(&self.model) {
            if let Some(count) = tenants.get_mut(&self.tenant) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    tenants.remove(&self.tenant);
                }
            }
            if tenants.is_empty() {
                in_flight.remove(&self.model);
            }
        }
    }
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl RateLimiter {
    /// `configured` maps a model name to its limits; other models start unlimited and
    /// learn theirs from the provider.
    pub fn new(configured: HashMap<String, Limits>) -> RateLimiter {
        RateLimiter { configured, ..RateLimiter::default() }
    }

    fn with_state<T>(&self, model: &str, now: Instant, f: impl FnOnce(&mut LimitState) -> T) -> T {
        // A poisoned lock means a panic mid-update of plain numbers; they stay usable.
        let mut states = self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = states
            .entry(model.to_owned())
            .or_insert_with(|| LimitState::new(self.configured.get(model).copied().unwrap_or_default(), now));
        f(state)
    }

    /// Waits until one request and `tokens` tokens are available for `model` and takes
    /// them. Gives up, returning the wait it would need, if that wait would take the total
    /// past `max_wait`. While calls wait, capacity goes to them in priority and fair-share
    /// order (see [`CALLER`]), not to whoever polls first. Cancel-safe: a dropped call
    /// leaves the queue at once.
    pub async fn acquire(&self, model: &str, tokens: u64, max_wait: Duration) -> Result<(), Duration> {
        let started = Instant::now();
        let outcome = self.wait_turn(model, tokens, max_wait).await;
        let _ = QUEUE_WAIT.try_with(|total| total.set(total.get() + started.elapsed()));
        outcome
    }

    async fn wait_turn(&self, model: &str, tokens: u64, max_wait: Duration) -> Result<(), Duration> {
        let caller = CALLER.try_with(Clone::clone).ok();
        let mut ticket = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let line = waiting.entry(model.to_owned()).or_default();
            // Nobody waits: take it now if it fits.
            if line.queue.is_empty()
                && self.with_state(model, Instant::now(), |s| s.try_acquire(Instant::now(), tokens)).is_ok()
            {
                return Ok(());
            }
            let id = self.next_call.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (tx, rx) = tokio::sync::oneshot::channel();
            line.queue.push(keel_core::sched::Call {
                id,
                tenant: caller.as_ref().map_or_else(|| "default".to_owned(), |c| c.tenant.clone()),
                priority: caller.as_ref().map_or_else(Default::default, |c| c.priority),
                enqueued_ms: wall_ms(),
                cost: tokens.max(1),
            });
            line.grants.insert(id, tx);
            if let Some(run) = caller.and_then(|c| c.run) {
                line.runs.insert(id, run);
            }
            Ticket { limiter: self, model, id, cost: tokens.max(1), granted: rx, done: false }
        };
        let deadline = Instant::now() + max_wait;
        loop {
            let wait = self.pump(model);
            if ticket.granted.try_recv().is_ok() {
                ticket.done = true;
                return Ok(());
            }
            let now = Instant::now();
            let hint = wait.unwrap_or(Duration::from_millis(10));
            if now + hint > deadline && wait.is_some_and(|w| now + w > deadline) {
                self.leave(model, ticket.id);
                ticket.done = true;
                return if ticket.granted.try_recv().is_ok() { Ok(()) } else { Err(hint) };
            }
            let pause = hint.min(deadline.saturating_duration_since(now)).max(Duration::from_millis(1));
            let granted = tokio::select! {
                _ = &mut ticket.granted => true,
                _ = tokio::time::sleep(pause) => false,
            };
            if granted {
                ticket.done = true;
                return Ok(());
            }
        }
    }

    /// Gives capacity to waiting calls in order, as long as the next one fits; returns how
    /// long until it might (`None` when nothing waits).
    fn pump(&self, model: &str) -> Option<Duration> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let line = waiting.get_mut(model)?;
        loop {
            let now = wall_ms();
            let cost = line.queue.peek(now)?.cost;
            match self.with_state(model, Instant::now(), |s| s.try_acquire(Instant::now(), cost)) {
                Ok(()) => {
                    let call = line.queue.pop(now)?;
                    line.runs.remove(&call.id);
                    let delivered = line.grants.remove(&call.id).is_some_and(|tx| tx.send(()).is_ok());
                    if !delivered {
                        // Its caller gave up meanwhile: the capacity goes back.
                        self.with_state(model, Instant::now(), |s| s.settle(cost, 0));
                    }
                }
                Err(wait) => return Some(wait),
            }
        }
    }

    /// A waiting call gives up (timeout, or its future was dropped).
    fn leave(&self, model: &str, id: u64) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(line) = waiting.get_mut(model) {
            line.grants.remove(&id);
            line.runs.remove(&id);
            line.queue.remove(id);
        }
    }

    /// The calls waiting for capacity now, per model in the order they will be sent, with
    /// their place in line and what holds the line back (for `keel ps`). Copies the queues
    /// under the lock and works out the order after releasing it; with nothing waiting it
    /// only looks at an empty map.
    pub fn waiting(&self, provider: &str) -> Vec<WaitingCall> {
        let lines: Vec<(String, keel_core::sched::CallQueue, HashMap<u64, String>)> = {
            let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting
                .iter()
                .filter(|(_, line)| !line.queue.is_empty())
                .map(|(model, line)| (model.clone(), line.queue.clone(), line.runs.clone()))
                .collect()
        };
        if lines.is_empty() {
            return Vec::new();
        }
        let states: HashMap<String, LimitState> = {
            let states = self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            lines.iter().filter_map(|(model, ..)| Some((model.clone(), states.get(model)?.clone()))).collect()
        };
        let (now, now_ms) = (Instant::now(), wall_ms());
        let mut calls = Vec::new();
        for (model, mut queue, mut runs) in lines {
            let queue_len = queue.len();
            let mut blocked_by = None;
            let mut position = 0;
            // Popping a copy is the order `pump` will grant in, if nothing else arrives.
            while let Some(call) = queue.pop(now_ms) {
                position += 1;
                if position == 1 {
                    blocked_by =
                        states.get(&model).cloned().and_then(|mut state| state.blocked_by(now, call.cost));
                }
                calls.push(WaitingCall {
                    provider: provider.to_owned(),
                    model: model.clone(),
                    run: runs.remove(&call.id),
                    tenant: call.tenant,
                    priority: call.priority,
                    position,
                    queue_len,
                    waited_ms: now_ms.saturating_sub(call.enqueued_ms),
                    blocked_by,
                });
            }
        }
        calls
    }

    /// Counts a call to `model` as in flight (for [`CALLER`]'s tenant, `default` without
    /// one) until the returned guard is dropped. Providers hold it from the moment the
    /// limiter granted the call until its answer is read.
    pub fn sending(&self, model: &str) -> InFlight<'_> {
        let tenant = CALLER.try_with(|caller| caller.tenant.clone()).unwrap_or_else(|_| "default".to_owned());
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        *in_flight.entry(model.to_owned()).or_default().entry(tenant.clone()).or_default() += 1;
        InFlight { limiter: self, model: model.to_owned(), tenant }
    }

    /// Every model this limiter has seen (called, queued for, or configured), with its
    /// waiting and in-flight calls (only `tenant`'s when given) and the limit that holds
    /// its next call back, sorted by model. Takes the locks one at a time, briefly.
    pub fn status(&self, provider: &str, tenant: Option<&str>) -> Vec<ModelStatus> {
        let mine = |call_tenant: &str| tenant.is_none_or(|t| t == call_tenant);
        let mut models: std::collections::BTreeMap<String, ModelStatus> = std::collections::BTreeMap::new();
        let entry = |models: &mut std::collections::BTreeMap<String, ModelStatus>, model: &str| {
            models.entry(model.to_owned()).or_insert_with(|| ModelStatus {
                provider: provider.to_owned(),
                model: model.to_owned(),
                waiting: 0,
                in_flight: 0,
                blocked_by: None,
                reset_in: None,
            });
        };
        for model in self.configured.keys() {
            entry(&mut models, model);
        }
        // The cost of each model's next call, for the limit check below.
        let mut next_cost: HashMap<String, u64> = HashMap::new();
        {
            let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let now_ms = wall_ms();
            for (model, line) in waiting.iter().filter(|(_, line)| !line.queue.is_empty()) {
                entry(&mut models, model);
                if let Some(call) = line.queue.peek(now_ms) {
                    next_cost.insert(model.clone(), call.cost);
                }
                let mut queue = line.queue.clone();
                let mut count = 0;
                while let Some(call) = queue.pop(now_ms) {
                    count += usize::from(mine(&call.tenant));
                }
                if let Some(status) = models.get_mut(model) {
                    status.waiting = count;
                }
            }
        }
        {
            let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            for (model, tenants) in in_flight.iter() {
                entry(&mut models, model);
                let count = tenants.iter().filter(|(t, _)| mine(t)).map(|(_, n)| n).sum();
                if let Some(status) = models.get_mut(model) {
                    status.in_flight = count;
                }
            }
        }
        let now = Instant::now();
        let states = self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (model, state) in states.iter() {
            entry(&mut models, model);
            let cost = next_cost.get(model).copied().unwrap_or(1);
            let mut state = state.clone();
            if let (Some(status), Some(blocker)) = (models.get_mut(model), state.blocked_by(now, cost)) {
                status.blocked_by = Some(blocker);
                status.reset_in = Some(state.wait_for(now, cost));
            }
        }
        models.into_values().collect()
    }

    pub fn settle(&self, model: &str, reserved: u64, used: u64) {
        self.with_state(model, Instant::now(), |s| s.settle(reserved, used));
    }

    pub fn observe(&self, model: &str, info: &RateLimitInfo, rate_limited: bool) {
        self.with_state(model, Instant::now(), |s| s.observe(Instant::now(), info, rate_limited));
    }

    /// A copy of a model's state, for inspection and tests.
    pub fn snapshot(&self, model: &str) -> Option<LimitState> {
        self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(model).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn go_durations() {
        for (text, expected) in [
            ("6m0s", Some(secs(360.0))),
            ("1s", Some(secs(1.0))),
            ("20ms", Some(secs(0.02))),
            ("8.64s", Some(secs(8.64))),
            ("1h2m3.5s", Some(secs(3723.5))),
            ("750us", Some(secs(0.00075))),
            ("0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("s", None),
            ("5x", None),
            ("1.2.3s", None),
            ("-1s", None),
        ] {
            assert_eq!(parse_go_duration(text), expected, "{text:?}");
        }
    }

    #[test]
    fn retry_after_in_all_its_forms() {
        let wall = SystemTime::UNIX_EPOCH + secs(1_445_412_480.0); // 2015-10-21T07:28:00Z
        assert_eq!(parse_retry_after(&headers(&[("retry-after-ms", "1500")]), wall), Some(secs(1.5)));
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after-ms", "20"), ("retry-after", "9")]), wall),
            Some(secs(0.02)),
            "the millisecond header is more precise and wins"
        );
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "7")]), wall), Some(secs(7.0)));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "0.5")]), wall), Some(secs(0.5)));
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT")]), wall),
            Some(secs(30.0))
        );
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:27:00 GMT")]), wall),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "soon")]), wall), None);
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "-3")]), wall), None);
        assert_eq!(parse_retry_after(&HeaderMap::new(), wall), None);
    }

    #[test]
    fn openai_headers_are_read() {
        let info = RateLimitInfo::from_headers(
            &headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "499"),
                ("x-ratelimit-reset-requests", "120ms"),
                ("x-ratelimit-limit-tokens", "30000"),
                ("x-ratelimit-remaining-tokens", "29000"),
                ("x-ratelimit-reset-tokens", "2s"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(
            info.requests,
            WindowInfo { limit: Some(500.0), remaining: Some(499.0), reset_in: Some(secs(0.12)) }
        );
        assert_eq!(
            info.tokens,
            WindowInfo { limit: Some(30000.0), remaining: Some(29000.0), reset_in: Some(secs(2.0)) }
        );
        assert_eq!(info.retry_after, None);
    }

    #[test]
    fn anthropic_headers_are_read() {
        let wall = SystemTime::UNIX_EPOCH + secs(1_735_689_600.0); // 2025-01-01T00:00:00Z
        let info = RateLimitInfo::from_headers(
            &headers(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2025-01-01T00:00:12Z"),
                ("anthropic-ratelimit-input-tokens-limit", "40000"),
                ("anthropic-ratelimit-input-tokens-remaining", "39000"),
                ("anthropic-ratelimit-input-tokens-reset", "2025-01-01T00:00:01.5Z"),
                ("retry-after", "12"),
            ]),
            wall,
        );
        assert_eq!(
            info.requests,
            WindowInfo { limit: Some(50.0), remaining: Some(0.0), reset_in: Some(secs(12.0)) }
        );
        assert_eq!(
            info.tokens,
            WindowInfo { limit: Some(40000.0), remaining: Some(39000.0), reset_in: Some(secs(1.5)) }
        );
        assert_eq!(info.retry_after, Some(secs(12.0)));
    }

    #[test]
    fn a_configured_bucket_refills_per_minute() {
        let t0 = Instant::now();
        let mut state =
            LimitState::new(Limits { requests_per_minute: Some(60), tokens_per_minute: Some(600) }, t0);
        for _ in 0..6 {
            assert_eq!(state.try_acquire(t0, 100), Ok(()));
        }
        // Tokens are gone: 100 more take 10 s at 600/min.
        assert_eq!(state.try_acquire(t0, 100), Err(secs(10.0)));
        assert_eq!(state.try_acquire(t0 + secs(5.0), 100), Err(secs(5.0)));
        assert_eq!(state.try_acquire(t0 + secs(10.0), 100), Ok(()));
        // A request larger than the whole bucket waits for a full bucket, not forever.
        let mut state =
            LimitState::new(Limits { requests_per_minute: None, tokens_per_minute: Some(600) }, t0);
        assert_eq!(state.try_acquire(t0, 5000), Ok(()));
        assert_eq!(state.try_acquire(t0, 5000), Err(secs(60.0)));
    }

    #[test]
    fn requests_per_minute_bound_the_rate() {
        let t0 = Instant::now();
        let mut state = LimitState::new(Limits { requests_per_minute: Some(2), tokens_per_minute: None }, t0);
        assert_eq!(state.try_acquire(t0, 0), Ok(()));
        assert_eq!(state.try_acquire(t0, 0), Ok(()));
        assert_eq!(state.try_acquire(t0, 1_000_000), Err(secs(30.0)), "unknown token limits do not block");
        assert_eq!(state.try_acquire(t0 + secs(30.0), 0), Ok(()));
    }

    #[test]
    fn unlimited_until_learned_then_honours_the_reset() {
        let t0 = Instant::now();
        let mut state = LimitState::new(Limits::default(), t0);
        for _ in 0..1000 {
            assert_eq!(state.try_acquire(t0, 10_000), Ok(()));
        }
        let info = RateLimitInfo {
            requests: WindowInfo { limit: Some(100.0), remaining: Some(0.0), reset_in: Some(secs(0.5)) },
            tokens: WindowInfo { limit: Some(1000.0), remaining: Some(1000.0), reset_in: None },
            retry_after: None,
        };
        state.observe(t0, &info, false);
        assert_eq!(state.requests.capacity, Some(100.0));
        // Refill alone would take 0.6 s for one request; the announced reset comes first.
        assert_eq!(state.try_acquire(t0, 1), Err(secs(0.5)));
        assert_eq!(state.try_acquire(t0 + secs(0.5), 1), Ok(()));
        assert!(state.requests.available > 98.0, "the reset refilled the window");
    }

    #[test]
    fn learned_remaining_overrides_the_local_count_and_config_caps_the_limit() {
        let t0 = Instant::now();
        let mut state =
            LimitState::new(Limits { requests_per_minute: Some(10), tokens_per_minute: None }, t0);
        let info = RateLimitInfo {
            requests: WindowInfo { limit: Some(500.0), remaining: Some(3.0), reset_in: Some(secs(60.0)) },
            ..RateLimitInfo::default()
        };
        state.observe(t0, &info, false);
        assert_eq!(state.requests.capacity, Some(10.0), "the configured limit is a ceiling");
        assert_eq!(state.requests.available, 3.0);
        for _ in 0..3 {
            assert_eq!(state.try_acquire(t0, 0), Ok(()));
        }
        assert_eq!(state.try_acquire(t0, 0), Err(secs(6.0)));
    }

    #[test]
    fn retry_after_blocks_the_model() {
        let t0 = Instant::now();
        let mut state = LimitState::new(Limits::default(), t0);
        state.observe(t0, &RateLimitInfo { retry_after: Some(secs(2.0)), ..RateLimitInfo::default() }, true);
        assert_eq!(state.try_acquire(t0, 1), Err(secs(2.0)));
        assert_eq!(state.try_acquire(t0 + secs(1.5), 1), Err(secs(0.5)));
        // A shorter later Retry-After does not shorten the block.
        state.observe(
            t0 + secs(1.5),
            &RateLimitInfo { retry_after: Some(secs(0.1)), ..RateLimitInfo::default() },
            true,
        );
        assert_eq!(state.try_acquire(t0 + secs(1.6), 1), Err(secs(0.4)));
        assert_eq!(state.try_acquire(t0 + secs(2.0), 1), Ok(()));
        assert_eq!(state.blocked_until, None);
    }

    #[test]
    fn a_429_without_retry_after_waits_for_the_exhausted_window() {
        let t0 = Instant::now();
        let mut state = LimitState::new(Limits::default(), t0);
        let info = RateLimitInfo {
            tokens: WindowInfo { limit: Some(1000.0), remaining: Some(0.0), reset_in: Some(secs(3.0)) },
            requests: WindowInfo { limit: Some(10.0), remaining: Some(5.0), reset_in: Some(secs(9.0)) },
            retry_after: None,
        };
        state.observe(t0, &info, true);
        assert_eq!(state.blocked_until, Some(t0 + secs(3.0)));
    }

    #[test]
    fn settling_returns_unused_tokens() {
        let t0 = Instant::now();
        let mut state =
            LimitState::new(Limits { requests_per_minute: None, tokens_per_minute: Some(1000) }, t0);
        assert_eq!(state.try_acquire(t0, 800), Ok(()));
        state.settle(800, 100);
        assert_eq!(state.tokens.available, 900.0);
        state.settle(0, 50);
        assert_eq!(state.tokens.available, 850.0);
        state.settle(5000, 0);
        assert_eq!(state.tokens.available, 1000.0, "never above capacity");
    }

    #[tokio::test]
    async fn the_limiter_gives_up_past_max_wait() {
        let limiter = RateLimiter::new(HashMap::from([(
            "m".to_owned(),
            Limits { requests_per_minute: Some(1), tokens_per_minute: None },
        )]));
        assert_eq!(limiter.acquire("m", 0, Duration::ZERO).await, Ok(()));
        let wait = limiter.acquire("m", 0, Duration::from_millis(1)).await.unwrap_err();
        assert!(wait > Duration::from_secs(50), "{wait:?}");
        assert_eq!(limiter.acquire("other", 0, Duration::ZERO).await, Ok(()), "limits are per model");
    }

    /// Capacity goes to waiting calls by priority, not by who asked first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_calls_get_capacity_in_priority_order() {
        use keel_core::sched::Priority;
        let limiter = std::sync::Arc::new(RateLimiter::new(HashMap::from([(
            "m".to_owned(),
            Limits { requests_per_minute: Some(120), tokens_per_minute: None },
        )])));
        // Use up the burst.
        while limiter.acquire("m", 0, Duration::ZERO).await.is_ok() {}
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, priority) in [("low-1", Priority::Low), ("low-2", Priority::Low), ("high", Priority::High)]
        {
            let (limiter, order) = (limiter.clone(), order.clone());
            let caller = Caller { tenant: "t".into(), priority, run: None };
            tasks.push(tokio::spawn(CALLER.scope(caller, async move {
                limiter.acquire("m", 0, Duration::from_secs(30)).await.unwrap();
                order.lock().unwrap().push(name);
            })));
            // Queued one after another: the low calls ask first.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(order.lock().unwrap().first(), Some(&"high"), "{:?}", order.lock().unwrap());
    }

    #[test]
    fn blocked_by_names_the_limit_that_holds_calls_back() {
        let t0 = Instant::now();
        let limits = Limits { requests_per_minute: Some(2), tokens_per_minute: Some(600) };
        let mut state = LimitState::new(limits, t0);
        assert_eq!(state.blocked_by(t0, 100), None);
        assert_eq!(state.try_acquire(t0, 550), Ok(()));
        assert_eq!(state.blocked_by(t0, 100), Some(Blocker::Tokens), "more than is left");
        assert_eq!(state.try_acquire(t0, 0), Ok(()));
        assert_eq!(state.blocked_by(t0, 1), Some(Blocker::Requests), "no request left this minute");
        assert_eq!(state.blocked_by(t0 + secs(30.0), 1), None, "a request refilled; nothing was taken");
        state.observe(t0, &RateLimitInfo { retry_after: Some(secs(90.0)), ..RateLimitInfo::default() }, true);
        assert_eq!(state.blocked_by(t0 + secs(30.0), 1), Some(Blocker::RetryAfter), "the strongest reason");
        assert_eq!(state.blocked_by(t0 + secs(90.0), 1), None);
        assert_eq!(Blocker::Requests.as_str(), "requests limit");
    }

    /// Polls until `limiter` holds `count` waiting calls (the tasks queue asynchronously).
    async fn until_waiting(limiter: &RateLimiter, count: usize) -> Vec<WaitingCall> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let calls = limiter.waiting("p");
            if calls.len() == count {
                return calls;
            }
            assert!(Instant::now() < deadline, "expected {count} waiting calls, have {calls:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `waiting()` lists each waiting call with its run and its place in the order capacity
    /// will be granted (priority first, not arrival), and forgets a call once it leaves:
    /// when it times out, and when its future is dropped (its run was stopped).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_calls_show_their_place_and_leave_when_dropped_or_timed_out() {
        use keel_core::sched::Priority;
        let limiter = std::sync::Arc::new(RateLimiter::new(HashMap::from([(
            "m".to_owned(),
            Limits { requests_per_minute: Some(1), tokens_per_minute: None },
        )])));
        assert!(limiter.waiting("p").is_empty());
        // The one request of the minute goes at once; every later call waits ~60 s.
        assert_eq!(limiter.acquire("m", 0, Duration::ZERO).await, Ok(()));
        let mut tasks = Vec::new();
        for (run, priority) in
            [("run-low", Priority::Low), ("run-normal", Priority::Normal), ("run-high", Priority::High)]
        {
            let shared = limiter.clone();
            let caller = Caller { tenant: "t".into(), priority, run: Some(run.into()) };
            tasks.push(tokio::spawn(
                CALLER.scope(caller, async move { shared.acquire("m", 0, Duration::from_secs(600)).await }),
            ));
            until_waiting(&limiter, tasks.len()).await;
        }
        let calls = limiter.waiting("p");
        let places: Vec<(Option<&str>, usize, usize)> =
            calls.iter().map(|c| (c.run.as_deref(), c.position, c.queue_len)).collect();
        assert_eq!(
            places,
            [(Some("run-high"), 1, 3), (Some("run-normal"), 2, 3), (Some("run-low"), 3, 3)],
            "{calls:?}"
        );
        for call in &calls {
            assert_eq!((call.model.as_str(), call.tenant.as_str(), call.provider.as_str()), ("m", "t", "p"));
            assert_eq!(call.blocked_by, Some(Blocker::Requests));
            assert!(call.waited_ms < 60_000, "{call:?}");
        }
        assert_eq!(calls[0].priority, Priority::High);

        // A call that times out is gone, and was never listed past its wait.
        assert!(limiter.acquire("m", 0, Duration::from_millis(1)).await.is_err());
        assert_eq!(limiter.waiting("p").len(), 3);

        // The normal call's run is stopped: its future is dropped, and it leaves the line.
        let normal = tasks.remove(1);
        normal.abort();
        assert!(normal.await.unwrap_err().is_cancelled());
        let places: Vec<(Option<String>, usize, usize)> =
            limiter.waiting("p").into_iter().map(|c| (c.run, c.position, c.queue_len)).collect();
        assert_eq!(places, [(Some("run-high".to_owned()), 1, 2), (Some("run-low".to_owned()), 2, 2)]);
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        assert!(limiter.waiting("p").is_empty(), "dropped calls leave no trace");
    }

    /// `status()` counts each model's waiting and in-flight calls (per tenant when asked),
    /// names the limit that holds its next call back and how long until it lets go, and
    /// forgets an in-flight call when its guard is dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_counts_calls_per_tenant_and_names_the_limit() {
        use keel_core::sched::Priority;
        let limiter = std::sync::Arc::new(RateLimiter::new(HashMap::from([(
            "m".to_owned(),
            Limits { requests_per_minute: Some(1), tokens_per_minute: None },
        )])));
        let unused = ModelStatus {
            provider: "p".into(),
            model: "m".into(),
            waiting: 0,
            in_flight: 0,
            blocked_by: None,
            reset_in: None,
        };
        assert_eq!(limiter.status("p", None), [unused], "a configured model shows before any call");
        let caller = |tenant: &str| Caller { tenant: tenant.into(), priority: Priority::Normal, run: None };
        // acme's call takes the minute's one request and stays in flight.
        let sending = CALLER
            .scope(caller("acme"), async {
                limiter.acquire("m", 0, Duration::ZERO).await.unwrap();
                limiter.sending("m")
            })
            .await;
        // Two globex calls wait for the next minute.
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let shared = limiter.clone();
            tasks.push(tokio::spawn(CALLER.scope(caller("globex"), async move {
                shared.acquire("m", 0, Duration::from_secs(600)).await
            })));
            until_waiting(&limiter, tasks.len()).await;
        }
        let all = limiter.status("p", None);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!((all[0].waiting, all[0].in_flight), (2, 1));
        assert_eq!(all[0].blocked_by, Some(Blocker::Requests));
        let reset = all[0].reset_in.expect("a reset time with the limit");
        assert!(reset > Duration::from_secs(30) && reset <= Duration::from_secs(60), "{reset:?}");
        let acme = &limiter.status("p", Some("acme"))[0];
        assert_eq!((acme.waiting, acme.in_flight, acme.blocked_by), (0, 1, Some(Blocker::Requests)));
        let globex = &limiter.status("p", Some("globex"))[0];
        assert_eq!((globex.waiting, globex.in_flight), (2, 0));
        drop(sending);
        assert_eq!(limiter.status("p", Some("acme"))[0].in_flight, 0, "the answered call is not in flight");
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        let after = &limiter.status("p", None)[0];
        assert_eq!((after.waiting, after.in_flight), (0, 0));
        assert_eq!(after.blocked_by, Some(Blocker::Requests), "the minute's request is still spent");
    }
}
