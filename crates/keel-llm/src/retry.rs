//! Retry policy: which failures are tried again on the same model, and after how long.
//! Pure: the jitter is an argument, so the schedule is tested exactly.

use std::time::Duration;

use crate::error::Error;

/// How the router retries one model before it moves down the fallback chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per model, the first included (1 = no retries).
    pub max_attempts: u32,
    /// The pause before the first retry; it doubles each time.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// A provider asking for a longer wait than this is not waited for: the router moves
    /// to the next model instead.
    pub max_retry_after: Duration,
    /// The longest a call waits for its rate-limit bucket before it is treated as rate
    /// limited (and the next model is tried).
    pub max_queue_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(60),
            max_queue_wait: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try the same model again after this pause.
    RetryAfter(Duration),
    /// Move on (to the next model, or fail).
    GiveUp,
}

impl RetryPolicy {
    /// The pause before retry number `retry` (1 = the first retry): exponential, capped,
    /// with "equal jitter" (half fixed, half random), `jitter` drawn uniformly from [0, 1).
    pub fn backoff(&self, retry: u32, jitter: f64) -> Duration {
        let doubling = 2f64.powi(retry.saturating_sub(1).min(30) as i32);
        let base = (self.initial_backoff.as_secs_f64() * doubling).min(self.max_backoff.as_secs_f64());
        Duration::from_secs_f64(base / 2.0 + base / 2.0 * jitter.clamp(0.0, 1.0))
    }

    /// After `attempt` attempts (1-based) ended in `error`: retry, and when? A provider's
    /// `Retry-After` is honoured exactly (it is never shortened), unless it is longer than
    /// `max_retry_after`.
    pub fn decide(&self, attempt: u32, error: &Error, jitter: f64) -> RetryDecision {
        if attempt >= self.max_attempts || !error.is_retryable() {
            return RetryDecision::GiveUp;
        }
        match error.retry_after() {
            Some(wait) if wait > self.max_retry_after => RetryDecision::GiveUp,
            Some(wait) => RetryDecision::RetryAfter(wait),
            None => RetryDecision::RetryAfter(self.backoff(attempt, jitter)),
        }
    }
}

/// A uniform draw from [0, 1) for jitter.
pub fn jitter() -> f64 {
    let mut bytes = [0u8; 8];
    // Without OS randomness the jitter is merely fixed; retries still work.
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorClass, UpstreamError};

    fn upstream(class: ErrorClass, retry_after: Option<Duration>) -> Error {
        Error::Upstream(UpstreamError { retry_after, ..UpstreamError::new("p", class, "m") })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: ms(100),
            max_backoff: ms(1000),
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn backoff_doubles_caps_and_jitters_within_half() {
        let p = policy();
        let schedule: Vec<_> = (1..=6).map(|retry| p.backoff(retry, 0.0)).collect();
        assert_eq!(schedule, [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500)]);
        let top: Vec<_> = (1..=6).map(|retry| p.backoff(retry, 1.0)).collect();
        assert_eq!(top, [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]);
        assert_eq!(p.backoff(1, 0.5), ms(75));
        assert_eq!(p.backoff(u32::MAX, 1.0), ms(1000), "no overflow on absurd retry counts");
    }

    #[test]
    fn decisions() {
        let p = policy();
        let server = upstream(ErrorClass::Server, None);
        assert_eq!(p.decide(1, &server, 0.0), RetryDecision::RetryAfter(ms(50)));
        assert_eq!(p.decide(4, &server, 0.0), RetryDecision::RetryAfter(ms(400)));
        assert_eq!(p.decide(5, &server, 0.0), RetryDecision::GiveUp, "attempts are bounded");
        assert_eq!(p.decide(1, &upstream(ErrorClass::BadRequest, None), 0.0), RetryDecision::GiveUp);
        assert_eq!(p.decide(1, &upstream(ErrorClass::Auth, None), 0.0), RetryDecision::GiveUp);
        assert_eq!(
            p.decide(1, &upstream(ErrorClass::QuotaExceeded, Some(ms(10))), 0.0),
            RetryDecision::GiveUp
        );
        assert_eq!(
            p.decide(1, &upstream(ErrorClass::RateLimited, Some(ms(3000))), 0.9),
            RetryDecision::RetryAfter(ms(3000)),
            "Retry-After is honoured exactly, even above max_backoff"
        );
        assert_eq!(
            p.decide(1, &upstream(ErrorClass::RateLimited, Some(Duration::from_secs(61))), 0.0),
            RetryDecision::GiveUp,
            "too long a wait moves on to the next model"
        );
        assert_eq!(p.decide(1, &Error::InvalidRequest("x".into()), 0.0), RetryDecision::GiveUp);
        assert_eq!(p.decide(1, &Error::NoRoute("x".into()), 0.0), RetryDecision::GiveUp);
        let one = RetryPolicy { max_attempts: 1, ..policy() };
        assert_eq!(one.decide(1, &server, 0.0), RetryDecision::GiveUp);
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }
}
