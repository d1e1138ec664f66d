//! Who watches a run's LLM calls live: the AG-UI streams of a run subscribe here, and an
//! `llm.chat` of a watched run asks its provider for a streamed response whose deltas go
//! to every watcher, tagged with the call's journal seq. An unwatched run's calls are not
//! streamed (a provider answers them whole, as before). Deltas are never stored: a
//! stream that was not watching renders the call from its journaled result instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_llm::{Delta, DeltaSink};
use keel_store::Seq;
use keel_types::RunId;
use tokio::sync::mpsc;

/// What a watcher hears of a live call: that it began (journaled, going to the provider),
/// then its deltas, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LiveDelta {
    Begun(Seq),
    Delta(Seq, Delta),
}

/// The watchers of each run. Unbounded per watcher: one call's deltas add up to its
/// response, which the kernel holds whole anyway, and a lagging watcher must not lose
/// any (it would show a message with a hole in it).
#[derive(Default)]
pub(crate) struct LiveDeltas {
    watchers: Mutex<HashMap<RunId, Vec<mpsc::UnboundedSender<LiveDelta>>>>,
}

impl LiveDeltas {
    /// Watches `run`'s calls from now on, until the receiver is dropped.
    pub(crate) fn watch(&self, run: &RunId) -> mpsc::UnboundedReceiver<LiveDelta> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        watchers.entry(run.clone()).or_default().push(tx);
        rx
    }

    /// Sends to `run`'s watchers, forgetting those gone; false when none is left.
    fn send(&self, run: &RunId, delta: LiveDelta) -> bool {
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = watchers.get_mut(run) else { return false };
        list.retain(|tx| tx.send(delta.clone()).is_ok());
        if list.is_empty() {
            watchers.remove(run);
            return false;
        }
        true
    }

    /// The sink for the `llm.chat` at `seq` (its journal entry) of `run`: when the run is
    /// watched, one that tells the watchers the call began and passes them each delta
    /// (and on to `outer`, the gateway caller's own sink, if any). Unwatched: `outer`.
    pub(crate) fn sink(
        self: &Arc<Self>,
        run: &RunId,
        seq: Option<Seq>,
        outer: Option<DeltaSink>,
    ) -> CallSink {
        let Some(seq) = seq.filter(|seq| self.send(run, LiveDelta::Begun(*seq))) else {
            return CallSink { sink: outer, forwarding: None };
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Delta>();
        let (deltas, run) = (self.clone(), run.clone());
        let forwarding = tokio::spawn(async move {
            while let Some(delta) = rx.recv().await {
                if let Some(outer) = &outer {
                    let _ = outer.send(delta.clone());
                }
                deltas.send(&run, LiveDelta::Delta(seq, delta));
            }
        });
        CallSink { sink: Some(tx), forwarding: Some(forwarding) }
    }
}

/// Where one LLM call's deltas go (see [`LiveDeltas::sink`]).
pub(crate) struct CallSink {
    sink: Option<DeltaSink>,
    forwarding: Option<tokio::task::JoinHandle<()>>,
}

impl CallSink {
    /// The sink to give the provider, if the call is to be streamed.
    pub(crate) fn sink(&self) -> Option<&DeltaSink> {
        self.sink.as_ref()
    }

    /// After the call: waits until every delta is out to the watchers, so none reaches
    /// them after the call's completion is journaled (and announced).
    pub(crate) async fn finish(self) {
        drop(self.sink);
        if let Some(forwarding) = self.forwarding {
            let _ = forwarding.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watched_call_reaches_every_watcher_and_the_outer_sink() {
        let deltas = Arc::new(LiveDeltas::default());
        let run = RunId::generate(1);
        assert!(deltas.sink(&run, Some(1), None).sink().is_none(), "nobody watches: no streaming");
        let mut first = deltas.watch(&run);
        let mut second = deltas.watch(&run);
        let (outer_tx, mut outer_rx) = mpsc::unbounded_channel();
        let call = deltas.sink(&run, Some(2), Some(outer_tx));
        call.sink().unwrap().send(Delta::Text("hi".into())).unwrap();
        call.finish().await;
        for rx in [&mut first, &mut second] {
            assert_eq!(rx.recv().await, Some(LiveDelta::Begun(2)));
            assert_eq!(rx.recv().await, Some(LiveDelta::Delta(2, Delta::Text("hi".into()))));
        }
        assert_eq!(outer_rx.recv().await, Some(Delta::Text("hi".into())));
        drop((first, second));
        assert!(!deltas.send(&run, LiveDelta::Begun(3)), "watchers gone are forgotten");
        assert!(deltas.watchers.lock().unwrap().is_empty());
    }
}
