//! Waiting out a store that cannot be reached (a Postgres server restarting): the one
//! retry loop every kernel write that must not fail goes through (journal writes, a run's
//! output, its end, its events).

use std::future::Future;
use std::time::Duration;

/// The first wait before a journal write that found the store unreachable is tried
/// again; each further wait doubles, up to `MAX_BACKOFF`, so a long outage costs a retry
/// every few seconds per waiting call rather than a busy loop.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A store failure that wrote nothing because the store could not be reached, so the
/// same write may be tried again (see `retry_while`).
pub(crate) trait Unreachable {
    fn unreachable(&self) -> bool;
    /// The write may or may not have taken effect (`keel_store::Error::OutcomeUnknown`).
    fn outcome_unknown(&self) -> bool;
}

impl Unreachable for keel_store::Error {
    fn unreachable(&self) -> bool {
        matches!(self, keel_store::Error::Unavailable { .. })
    }

    fn outcome_unknown(&self) -> bool {
        matches!(self, keel_store::Error::OutcomeUnknown { .. })
    }
}

impl Unreachable for crate::Error {
    fn unreachable(&self) -> bool {
        matches!(self, crate::Error::Store(store) if store.unreachable())
    }

    fn outcome_unknown(&self) -> bool {
        matches!(self, crate::Error::Store(store) if store.outcome_unknown())
    }
}

/// Runs the store write `write` for `run` until the store can be reached: while it
/// fails because the store is unreachable (which promises nothing was written) and
/// `still_wanted()`, it waits with exponential backoff and tries again. Any other
/// outcome is returned, as is the last failure once the write is no longer wanted.
/// With `idempotent`, a write whose commit was cut off (outcome unknown) is made again
/// too: only for writes that may safely be made twice.
pub(crate) async fn retry_while<T, E, F, Fut>(
    run: &keel_types::RunId,
    still_wanted: impl Fn() -> bool,
    idempotent: bool,
    mut write: F,
) -> Result<T, E>
where
    E: Unreachable + std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut warned = false;
    loop {
        match write().await {
            Err(err) if (err.unreachable() || (idempotent && err.outcome_unknown())) && still_wanted() => {
                if !warned {
                    tracing::warn!(run = %run, "{err}; the write waits until the store answers");
                    warned = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            outcome => {
                if warned && outcome.is_ok() {
                    tracing::info!(run = %run, "the store answers again; the waiting write went through");
                }
                return outcome;
            }
        }
    }
}
