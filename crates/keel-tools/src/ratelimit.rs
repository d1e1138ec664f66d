//! Per-tool rate limits: a token bucket per key (a tool name), holding up to `calls`
//! tokens and refilled at `calls` per `per`. Kept as the generic cell rate algorithm (one
//! "theoretical arrival time" per key), which is the same bucket in exact integer time.
//! Pure apart from its lock: the caller passes the time and sleeps for the wait it gets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::RateLimit;

/// Token buckets by key. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Limiter {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The instant all stored times count from (the first call seen).
    epoch: Option<Instant>,
    /// Per key, the theoretical arrival time of the next call (since `epoch`): a call at
    /// `now` is allowed while `tat - now <= burst`.
    tats: HashMap<String, Duration>,
}

impl Limiter {
    pub fn new() -> Limiter {
        Limiter::default()
    }

    /// Takes one token of `key`'s bucket at `now`, or says how long to wait before
    /// trying again (then no token was taken). The bucket starts full, so `calls` calls
    /// pass at once; after that one per `per / calls`.
    pub fn acquire(&self, key: &str, limit: &RateLimit, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let start = *state.epoch.get_or_insert(now);
        // A time before the first call (clocks read out of order) counts as that call.
        let now = now.saturating_duration_since(start);
        let calls = limit.calls.max(1);
        let interval = limit.per / calls;
        let burst = interval * (calls - 1);
        let tat = state.tats.get(key).copied().unwrap_or(now).max(now);
        let ahead = tat - now;
        if ahead > burst {
            return Err(ahead - burst);
        }
        state.tats.insert(key.to_owned(), tat + interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str) -> RateLimit {
        text.parse().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_full_bucket_passes_its_burst_then_waits_one_interval() {
        let limiter = Limiter::new();
        let t0 = Instant::now();
        let l = limit("10/s");
        for _ in 0..10 {
            assert_eq!(limiter.acquire("t", &l, t0), Ok(()));
        }
        assert_eq!(limiter.acquire("t", &l, t0), Err(ms(100)));
        // A refused call takes nothing: the same wait again.
        assert_eq!(limiter.acquire("t", &l, t0), Err(ms(100)));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(40)), Err(ms(60)));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(100)), Ok(()));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(100)), Err(ms(100)));
    }

    #[test]
    fn waiting_the_returned_time_always_succeeds() {
        let limiter = Limiter::new();
        let l = limit("7/min");
        let mut now = Instant::now();
        let mut passed = 0;
        for _ in 0..50 {
            match limiter.acquire("t", &l, now) {
                Ok(()) => passed += 1,
                Err(wait) => {
                    now += wait;
                    assert_eq!(limiter.acquire("t", &l, now), Ok(()));
                    passed += 1;
                }
            }
        }
        assert_eq!(passed, 50);
    }

    #[test]
    fn the_bucket_refills_to_its_capacity_and_no_more() {
        let limiter = Limiter::new();
        let t0 = Instant::now();
        let l = limit("3/s");
        for _ in 0..3 {
            limiter.acquire("t", &l, t0).unwrap();
        }
        // An hour idle refills 3 tokens, not 10,800.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(limiter.acquire("t", &l, later), Ok(()));
        }
        assert!(limiter.acquire("t", &l, later).is_err());
        // Partial refill: one token after a third of a second.
        let third = later + Duration::from_secs(1) / 3;
        assert_eq!(limiter.acquire("t", &l, third), Ok(()));
        assert!(limiter.acquire("t", &l, third).is_err());
    }

    #[test]
    fn keys_have_separate_buckets() {
        let limiter = Limiter::new();
        let t0 = Instant::now();
        let l = limit("1/h");
        assert_eq!(limiter.acquire("a", &l, t0), Ok(()));
        assert_eq!(limiter.acquire("b", &l, t0), Ok(()));
        assert_eq!(limiter.acquire("a", &l, t0), Err(Duration::from_secs(3600)));
        assert_eq!(limiter.acquire("b", &l, t0 + Duration::from_secs(600)), Err(Duration::from_secs(3000)));
    }

    #[test]
    fn one_call_per_period_spaces_calls_evenly() {
        let limiter = Limiter::new();
        let t0 = Instant::now();
        let l = limit("1/s");
        assert_eq!(limiter.acquire("t", &l, t0), Ok(()));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(999)), Err(ms(1)));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(1000)), Ok(()));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(2500)), Ok(()));
        assert_eq!(limiter.acquire("t", &l, t0 + ms(2600)), Err(ms(900)));
    }

    #[test]
    fn time_before_the_first_call_does_not_panic_or_refill() {
        let limiter = Limiter::new();
        let t0 = Instant::now() + Duration::from_secs(10);
        let l = limit("1/s");
        assert_eq!(limiter.acquire("t", &l, t0), Ok(()));
        assert_eq!(limiter.acquire("t", &l, t0 - Duration::from_secs(5)), Err(Duration::from_secs(1)));
    }

    #[test]
    fn a_changed_limit_applies_from_the_next_call() {
        let limiter = Limiter::new();
        let t0 = Instant::now();
        limiter.acquire("t", &limit("1/s"), t0).unwrap();
        assert!(limiter.acquire("t", &limit("1/s"), t0).is_err());
        // A looser limit shortens the wait to what it allows.
        assert_eq!(limiter.acquire("t", &limit("100/s"), t0), Err(ms(10)));
        assert_eq!(limiter.acquire("t", &limit("100/s"), t0 + ms(10)), Ok(()));
    }
}
