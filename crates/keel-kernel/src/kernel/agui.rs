//! `Kernel::agui`: a run as a stream of AG-UI events (`GET /v1/runs/{id}/agui`, `POST
//! /v1/agui`). It reads the run's event log from the start, the journal entries its
//! syscall events name, and, while the run lives, the deltas of its LLM calls, and feeds
//! them to the pure mapper in `crate::agui`.

use std::collections::{HashMap, VecDeque};

use keel_protocol::agui::AguiEvent;
use keel_protocol::api::{EventView, JournalEntryView};
use keel_store::Seq;
use keel_types::RunId;
use tokio::sync::mpsc;

use crate::agui::{AguiMapper, Step, is_final_state, needs_entry};
use crate::deltas::LiveDelta;
use crate::events::EventStream;
use crate::{Kernel, Principal, Result};

/// AG-UI's names for a stream: the thread and run ids its `RUN_STARTED` and
/// `RUN_FINISHED` carry. `None` in [`Kernel::agui`]: both are the Keel run's id.
pub struct AguiIds {
    pub thread_id: String,
    pub run_id: String,
}

/// A run's AG-UI events, from `RUN_STARTED` to `RUN_FINISHED` or `RUN_ERROR`: a run
/// that has ended streams its whole history, then ends; a live one follows it live.
pub struct AguiStream {
    kernel: Kernel,
    run: RunId,
    events: EventStream,
    /// The run's live LLM deltas, while it lives (subscribed before the log is read, so
    /// no call can begin unseen between the two).
    deltas: Option<mpsc::UnboundedReceiver<LiveDelta>>,
    mapper: AguiMapper,
    /// Journal entries read so far, by seq.
    journal: HashMap<Seq, JournalEntryView>,
    out: VecDeque<AguiEvent>,
}

impl Kernel {
    /// The AG-UI stream of `run`, if `principal` may read it (another tenant's run is
    /// not found, like a missing one).
    pub async fn agui(&self, principal: &Principal, run: &RunId, ids: Option<AguiIds>) -> Result<AguiStream> {
        let record = self.run_for(principal, run).await?;
        let deltas = (!record.state.is_terminal()).then(|| self.inner.live_deltas.watch(run));
        let events = EventStream::new(self.inner.store.clone(), &self.inner.events, run.clone(), 0, true);
        let ids = ids.unwrap_or_else(|| AguiIds { thread_id: run.to_string(), run_id: run.to_string() });
        Ok(AguiStream {
            kernel: self.clone(),
            run: run.clone(),
            events,
            deltas,
            mapper: AguiMapper::new(ids.thread_id, ids.run_id, run.to_string()),
            journal: HashMap::new(),
            out: VecDeque::new(),
        })
    }
}

enum Next {
    Delta(LiveDelta),
    Event(Option<EventView>),
}

impl AguiStream {
    /// The next AG-UI event, or `None` after the run's last.
    pub async fn next(&mut self) -> Result<Option<AguiEvent>> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(Some(event));
            }
            if self.mapper.finished() {
                return Ok(None);
            }
            // Deltas already here go first: every delta of a call was sent before its
            // completion was stored, so none arrives after the event that ends it.
            if let Some(rx) = &mut self.deltas {
                while let Ok(delta) = rx.try_recv() {
                    live_step(&mut self.mapper, &mut self.out, &delta);
                }
                if !self.out.is_empty() {
                    continue;
                }
            }
            let next = match &mut self.deltas {
                Some(rx) => tokio::select! {
                    biased;
                    Some(delta) = rx.recv() => Next::Delta(delta),
                    event = self.events.next() => Next::Event(event?),
                },
                None => Next::Event(self.events.next().await?),
            };
            match next {
                Next::Delta(delta) => live_step(&mut self.mapper, &mut self.out, &delta),
                Next::Event(Some(event)) => self.stored(&event).await?,
                Next::Event(None) => self.out.extend(self.mapper.step(Step::Ended)),
            }
        }
    }

    async fn stored(&mut self, event: &EventView) -> Result<()> {
        let entry = match needs_entry(event) {
            Some(seq) => self.entry(seq).await?,
            None => None,
        };
        let output = if is_final_state(event) {
            self.kernel.inner.store.get_run(&self.run).await?.and_then(|run| run.output)
        } else {
            None
        };
        let step = Step::Event { event, entry: entry.as_ref(), output: output.as_ref() };
        self.out.extend(self.mapper.step(step));
        Ok(())
    }

    /// The journal entry `seq`, reading the journal from it on when it is not known
    /// finished yet (a live run's entries are read a few at a time, history's at once).
    async fn entry(&mut self, seq: Seq) -> Result<Option<JournalEntryView>> {
        if self.journal.get(&seq).is_none_or(|entry| entry.status == "pending") {
            let entries = self.kernel.inner.store.journal(&self.run, seq.saturating_sub(1)).await?;
            for entry in &entries {
                self.journal.insert(entry.seq, crate::views::journal_entry(entry));
            }
        }
        Ok(self.journal.get(&seq).cloned())
    }
}

fn live_step(mapper: &mut AguiMapper, out: &mut VecDeque<AguiEvent>, delta: &LiveDelta) {
    let events = match delta {
        LiveDelta::Begun(seq) => mapper.step(Step::CallBegun(*seq)),
        LiveDelta::Delta(seq, delta) => mapper.step(Step::Delta(*seq, delta)),
    };
    out.extend(events);
}
