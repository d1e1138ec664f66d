//! What a run's LLM calls wait for: their place in a provider's call queue, in words for
//! `keel ps` and `keel inspect` (`llm queue: openai/gpt-4o, 3 of 12 waiting for 14s
//! (requests limit)`). The queues are the providers' rate limiters (`keel_llm::ratelimit`);
//! the kernel tags each call with its run when it makes it (`dispatch.rs`).

use keel_llm::ratelimit::WaitingCall;
use keel_types::RunId;

/// Every call waiting for a provider at one moment: one look at the queues answers for a
/// whole page of runs.
#[derive(Debug, Clone, Default)]
pub struct LlmQueues {
    calls: Vec<WaitingCall>,
}

impl LlmQueues {
    pub fn new(calls: Vec<WaitingCall>) -> LlmQueues {
        LlmQueues { calls }
    }

    /// Where `run`'s waiting LLM call stands, if it has one; a run with several waiting
    /// calls is described by the one nearest the front.
    pub fn reason(&self, run: &RunId) -> Option<String> {
        let mut mine = self.calls.iter().filter(|call| call.run.as_deref() == Some(run.as_str()));
        let first = mine.next()?;
        let others: Vec<&WaitingCall> = mine.collect();
        let nearest = others.iter().copied().fold(first, |best, call| {
            if (call.position, call.queue_len) < (best.position, best.queue_len) { call } else { best }
        });
        let mut text = format!(
            "llm queue: {}/{}, {} of {} waiting for {}",
            nearest.provider,
            nearest.model,
            nearest.position,
            nearest.queue_len,
            waited(nearest.waited_ms)
        );
        if let Some(blocker) = nearest.blocked_by {
            text.push_str(&format!(" ({})", blocker.as_str()));
        }
        match others.len() {
            0 => {}
            1 => text.push_str("; 1 more call of this run waits"),
            more => text.push_str(&format!("; {more} more calls of this run wait")),
        }
        Some(text)
    }
}

/// A short duration: `850ms`, `14s`, `2m05s`.
fn waited(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{}s", ms / 1000),
        _ => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
    }
}

#[cfg(test)]
mod tests {
    use keel_core::sched::Priority;
    use keel_llm::ratelimit::Blocker;

    use super::*;

    fn call(run: &str, position: usize, queue_len: usize) -> WaitingCall {
        WaitingCall {
            provider: "openai".into(),
            model: "gpt-4o".into(),
            run: Some(run.into()),
            tenant: "default".into(),
            priority: Priority::Normal,
            position,
            queue_len,
            waited_ms: 14_200,
            blocked_by: Some(Blocker::Requests),
        }
    }

    #[test]
    fn a_waiting_call_reads_as_its_place_in_line() {
        let a = RunId::generate(1);
        let b = RunId::generate(1);
        let queues = LlmQueues::new(vec![call(b.as_str(), 1, 12), call(a.as_str(), 3, 12)]);
        assert_eq!(
            queues.reason(&a).as_deref(),
            Some("llm queue: openai/gpt-4o, 3 of 12 waiting for 14s (requests limit)")
        );
        assert_eq!(queues.reason(&RunId::generate(1)), None, "a run with no waiting call");
        assert_eq!(LlmQueues::default().reason(&a), None);
    }

    #[test]
    fn several_calls_of_one_run_are_described_by_the_nearest() {
        let run = RunId::generate(1);
        let mut far = call(run.as_str(), 9, 12);
        far.blocked_by = None;
        let mut near = call(run.as_str(), 2, 12);
        near.blocked_by = Some(Blocker::RetryAfter);
        near.waited_ms = 125_000;
        let queues = LlmQueues::new(vec![far, near, call(run.as_str(), 5, 12)]);
        assert_eq!(
            queues.reason(&run).as_deref(),
            Some(
                "llm queue: openai/gpt-4o, 2 of 12 waiting for 2m05s (provider's Retry-After); 2 more calls of \
                 this run wait"
            )
        );
    }

    #[test]
    fn waits_are_short() {
        assert_eq!(
            [waited(850), waited(14_999), waited(60_000), waited(3_725_000)],
            ["850ms", "14s", "1m00s", "62m05s"]
        );
    }
}
