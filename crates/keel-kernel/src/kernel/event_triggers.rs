//! Event triggers: the public API (`/v1/event-triggers`, `keel event`) and their fires,
//! when a run of an agent ends or a message is published on a topic. Which trigger fires
//! for what, and the rules that keep chains of triggered runs finite, are
//! `keel_core::event_trigger`; here are the store, the runs and when to look.
//!
//! Exactly once, as for schedules: a fire is recorded (unique per trigger and occasion:
//! the ended run's id, or the publish's `RUN:SEQ`, its run and journal entry) with the id
//! of the run it starts before that run is created under the id; a kernel killed in
//! between creates the runs of recorded fires without one when it starts.
//!
//! Run ends: the end of a run is written first (`write_transition`), then a task of its
//! own fires for it, off the run's path. A kernel killed between the two leaves an ended
//! run whose fires were never recorded, so a sweep (when the daemon starts, then every
//! minute) reads the runs of each tenant with event triggers that ended after its mark,
//! and records what was not (recording is idempotent). The mark moves to `SWEEP_LAG`
//! before the sweep began, and never past a fire still in flight here, so a fire in flight
//! on another node of a cluster is looked at again too. Runs ended by a kernel embedded in
//! `keel run` (no daemon) fire at the daemon's next sweep.
//!
//! Topic messages: a publish's fires are recorded inside its effect, after the message is
//! stored and before the publish's result is journaled; a kernel killed in between
//! publishes again on replay (answered the first deliveries, by its idempotency key) and
//! finds the fires recorded. Their runs are created by a task of their own (by the daemon;
//! an embedded kernel leaves them to the daemon's next start).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keel_core::event_trigger::{Decision, Listen, Occasion, Source, Trigger, decide, started_by};
use keel_protocol::api::CreateRunParams;
use keel_protocol::triggers::{CreateEventTriggerParams, EventFireView, EventTriggerView};
use keel_store::{FireRecord, RunRecord, TriggerRecord};
use keel_types::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::triggers::{EVENT, is_declared, new_fire, new_trigger, retry_later, triggered_run, validate_name};
use crate::run::{CreateRun, MAX_INPUT_BYTES, RunSpec};
use crate::telemetry::agent_name;
use crate::{Error, Kernel, Principal, Result, lock, now_ms};

const KIND: &str = EVENT.store;

/// How many last fires a view shows.
const SHOWN_FIRES: usize = 10;

/// How often the daemon sweeps for ended runs whose fires were not recorded.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How far behind the sweep's start its mark stays: a run that ended in the last minute
/// is looked at again by the next sweep (its fire may be in flight on another node).
const SWEEP_LAG_MS: u64 = 60_000;

/// How many ended runs a sweep reads at once.
const SWEEP_PAGE: usize = 500;

/// Where the sweep keeps its mark (`Store::kv_*`): every run that ended at or before it
/// has had its fires recorded.
const MARK_SCOPE: &str = "triggers";
const MARK_KEY: &str = "event.swept_through_ms";

/// An event trigger as stored in its trigger's spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EventSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<String>,
    run: CreateRunParams,
}

/// A trigger with its spec read.
struct Armed {
    record: TriggerRecord,
    listen: Listen,
    spec: EventSpec,
}

fn listen_of(spec: &EventSpec) -> Result<Listen> {
    Listen::new(spec.after_run.as_deref(), spec.on.as_deref(), spec.topic.as_deref())
        .map_err(|e| Error::InvalidRequest(e.to_string()))
}

fn armed(record: TriggerRecord) -> Result<Armed> {
    let spec: EventSpec = serde_json::from_value(record.spec.clone()).map_err(|e| {
        Error::InvalidRequest(format!("the stored spec of event trigger {} cannot be read: {e}", record.name))
    })?;
    let listen = listen_of(&spec)?;
    Ok(Armed { record, listen, spec })
}

/// What fired a trigger, as its run's input tells it.
enum Happened<'a> {
    RunEnd { run: &'a RunRecord, agent: &'a str },
    Published { topic: &'a str, message: &'a Value, from: &'a RunId },
}

impl Happened<'_> {
    /// The input of the run a fire of `trigger` starts (before the trigger's own `input`
    /// is added). A large output or message that would not fit in a run's input is left
    /// out, saying so and where to read it.
    fn input(&self, trigger: &str) -> Value {
        let (mut input, field, source) = match self {
            Happened::RunEnd { run, agent } => (
                json!({
                    "trigger": "event",
                    "event": trigger,
                    "on": "run_end",
                    "agent": agent,
                    "run_id": run.id.as_str(),
                    "state": run.state.as_str(),
                    "output": run.output,
                    "error": run.error,
                }),
                "output",
                &run.id,
            ),
            Happened::Published { topic, message, from } => (
                json!({
                    "trigger": "event",
                    "event": trigger,
                    "on": "topic",
                    "topic": topic,
                    "message": message,
                    "from": from.as_str(),
                }),
                "message",
                *from,
            ),
        };
        // Room for the trigger's own input (`CreateRun::validate` checks the whole).
        let size = |value: &Value| serde_json::to_vec(value).map_or(0, |bytes| bytes.len());
        if size(&input) > MAX_INPUT_BYTES / 2 {
            let bytes = size(&input[field]);
            input[field] = Value::Null;
            input["omitted"] = json!(format!(
                "the {field} ({bytes} bytes of JSON) is more than a run's input holds; read it with \
                 `keel inspect {source} --json`"
            ));
        }
        input
    }
}

/// The run a fire of `armed` starts, `depth` event fires deep.
fn fire_request(armed: &Armed, happened: &Happened<'_>, depth: u32) -> Result<CreateRun> {
    let name = &armed.record.name;
    let mut request =
        triggered_run(&armed.spec.run, &armed.record.tenant, happened.input(name), started_by(name))?;
    request.event_depth = depth;
    Ok(request)
}

/// An event trigger to store, checked whole (what it listens for, the run) for `principal`.
pub(super) fn event_record(principal: &Principal, params: CreateEventTriggerParams) -> Result<TriggerRecord> {
    validate_name(EVENT, &params.name)?;
    let tenant = principal.run_tenant(params.run.tenant.as_deref())?;
    let spec = EventSpec {
        after_run: params.after_run,
        on: params.on,
        topic: params.topic,
        run: CreateRunParams { tenant: Some(tenant.clone()), ..params.run },
    };
    let listen = listen_of(&spec)?;
    let record = new_trigger(EVENT, params.name, tenant, &spec);
    // The run is checked as a fire would make it, so a bad run option fails now.
    let armed = Armed { record, listen, spec };
    let check =
        Happened::Published { topic: "check", message: &Value::Null, from: &RunId::generate(now_ms()) };
    fire_request(&armed, &check, 1)?;
    Ok(armed.record)
}

/// The kernel's part in firing event triggers, in memory.
#[derive(Default)]
pub(crate) struct EventFiring {
    /// Set when the daemon starts firing (`start_event_triggers`): a kernel embedded in a
    /// command starts no triggered run (the daemon's next start does).
    serving: AtomicBool,
    /// End times of runs whose fires are in flight here, with how many at each: the
    /// sweep's mark never passes the oldest.
    in_flight: Mutex<BTreeMap<u64, usize>>,
}

/// A run end whose fires are in flight (see [`EventFiring::in_flight`]), until dropped.
struct InFlight {
    kernel: Kernel,
    at_ms: u64,
}

impl InFlight {
    fn new(kernel: &Kernel, at_ms: u64) -> InFlight {
        *lock(&kernel.inner.event_firing.in_flight).entry(at_ms).or_default() += 1;
        InFlight { kernel: kernel.clone(), at_ms }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.kernel.inner.event_firing.in_flight);
        if let Some(count) = in_flight.get_mut(&self.at_ms) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.at_ms);
            }
        }
    }
}

impl Kernel {
    /// `POST /v1/event-triggers`: checks everything (what it listens for, the run) before
    /// anything is stored.
    pub async fn event_trigger_create(
        &self,
        principal: &Principal,
        params: CreateEventTriggerParams,
    ) -> Result<EventTriggerView> {
        let record = event_record(principal, params)?;
        self.trigger_store(EVENT, record.clone()).await?;
        self.event_trigger_view(&record).await
    }

    /// `GET /v1/event-triggers`: the principal's event triggers, by name.
    pub async fn event_triggers(&self, principal: &Principal) -> Result<Vec<EventTriggerView>> {
        self.trigger_views(EVENT, principal, |record| async move { self.event_trigger_view(&record).await })
            .await
    }

    /// `GET /v1/event-triggers/{name}`.
    pub async fn event_trigger(&self, principal: &Principal, name: &str) -> Result<EventTriggerView> {
        let record = self.trigger_for(EVENT, principal, name).await?;
        self.event_trigger_view(&record).await
    }

    /// Pauses or resumes an event trigger. What happens while it is paused fires nothing,
    /// then or later.
    pub async fn event_trigger_pause(
        &self,
        principal: &Principal,
        name: &str,
        paused: bool,
    ) -> Result<EventTriggerView> {
        self.trigger_for(EVENT, principal, name).await?;
        self.store().trigger_set_paused(KIND, name, paused, now_ms()).await?;
        self.event_trigger(principal, name).await
    }

    /// Deletes an event trigger and its history of fires (its runs stay); the trigger as
    /// it was. One declared in keel.toml is refused (a conflict saying to remove it there).
    pub async fn event_trigger_delete(&self, principal: &Principal, name: &str) -> Result<EventTriggerView> {
        let view = self.event_trigger(principal, name).await?;
        self.trigger_delete(EVENT, principal, name).await?;
        Ok(view)
    }

    async fn event_trigger_view(&self, record: &TriggerRecord) -> Result<EventTriggerView> {
        let armed = armed(record.clone())?;
        let fires = self.store().trigger_fires(KIND, &record.name, SHOWN_FIRES).await?;
        let (after_run, on, topic) = match &armed.listen {
            Listen::RunEnd { agent, ended_in } => (Some(agent.clone()), Some(ended_in.to_string()), None),
            Listen::Topic { topic } => (None, None, Some(topic.clone())),
        };
        Ok(EventTriggerView {
            name: record.name.clone(),
            tenant: record.tenant.clone(),
            after_run,
            on,
            topic,
            paused: record.paused,
            declared: is_declared(record),
            command: armed.spec.run.command.clone(),
            created_at: record.created_at_ms,
            last_fires: fires
                .into_iter()
                .map(|fire| EventFireView {
                    occasion: fire.occasion,
                    at: fire.at_ms,
                    run_id: fire.run_id.map(|id| id.to_string()),
                    outcome: fire.outcome,
                    detail: fire.detail,
                    fired_at: fire.fired_at_ms,
                })
                .collect(),
        })
    }

    /// The event triggers (of one tenant, or all) listening for what `wanted` says.
    async fn armed_triggers(
        &self,
        tenant: Option<&str>,
        wanted: impl Fn(&Listen) -> bool,
    ) -> Result<Vec<Armed>> {
        let mut found = Vec::new();
        for record in self.store().trigger_list(KIND, tenant).await? {
            match armed(record) {
                Ok(armed) if wanted(&armed.listen) => found.push(armed),
                Ok(_) => {}
                Err(error) => tracing::warn!("{error}"),
            }
        }
        Ok(found)
    }

    /// Called once a run's end is written: fires the event triggers after it, in a task
    /// of its own (the daemon only; see the module doc for a kernel that dies first).
    pub(crate) fn event_run_ended(&self, ended: &RunRecord) {
        let Some(at_ms) = ended.ended_at_ms else { return };
        if !self.inner.event_firing.serving.load(Ordering::SeqCst) {
            return;
        }
        let in_flight = InFlight::new(self, at_ms);
        let ended = ended.clone();
        tokio::spawn(async move {
            let kernel = in_flight.kernel.clone();
            let fired = async {
                let triggers = kernel
                    .armed_triggers(Some(&ended.tenant), |l| matches!(l, Listen::RunEnd { .. }))
                    .await?;
                kernel.fire_after_run(&ended, &triggers).await
            };
            if let Err(error) = fired.await {
                tracing::warn!(
                    run = %ended.id,
                    "event triggers after the run did not all fire (the sweep tries again): {error}"
                );
            }
            drop(in_flight);
        });
    }

    /// Records and starts the fires of `triggers` (listening for run ends) for `ended`.
    async fn fire_after_run(&self, ended: &RunRecord, triggers: &[Armed]) -> Result<()> {
        let Some(at_ms) = ended.ended_at_ms else { return Ok(()) };
        if triggers.is_empty() {
            return Ok(());
        }
        let spec = RunSpec::of(ended)?;
        let agent = agent_name(&spec.command);
        let source = Source { started_by: spec.trigger.as_deref(), depth: spec.event_depth };
        let occasion = Occasion::RunEnded { agent: &agent, state: ended.state, at_ms, source };
        let happened = Happened::RunEnd { run: ended, agent: &agent };
        let mut failed = None;
        for armed in triggers {
            let Some((fire, depth)) = event_fire(armed, &occasion, ended.id.to_string(), at_ms) else {
                continue;
            };
            let fired = match depth {
                Some(depth) => {
                    let request = |_: &FireRecord| fire_request(armed, &happened, depth);
                    self.fire_and_start(EVENT, fire, request).await.map(drop)
                }
                None => self.store().trigger_fire(fire).await.map(drop).map_err(Error::from),
            };
            if let Err(error) = fired {
                failed.get_or_insert(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Called once a run's publish on `topic` is stored, before its result is journaled:
    /// records the fires of the tenant's triggers on the topic (waiting out a store out of
    /// reach), and starts their runs in a task of their own.
    pub(crate) async fn event_published(
        &self,
        tenant: &str,
        from: &RunId,
        topic: &str,
        message: &Value,
        key: &str,
    ) {
        let found = async {
            let wanted = |l: &Listen| matches!(l, Listen::Topic { topic: t } if t == topic);
            let triggers = self.armed_triggers(Some(tenant), wanted).await?;
            if triggers.is_empty() {
                return Ok(None);
            }
            Ok::<_, Error>(Some((triggers, RunSpec::of(&self.get(from).await?)?)))
        };
        let (triggers, publisher) = match found.await {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(run = %from, "the publish on {topic} fires no event trigger: {error}");
                return;
            }
        };
        let at_ms = now_ms();
        let source = Source { started_by: publisher.trigger.as_deref(), depth: publisher.event_depth };
        let occasion = Occasion::Published { topic, at_ms, source: Some(source) };
        for armed in triggers {
            let Some((fire, depth)) = event_fire(&armed, &occasion, key.to_owned(), at_ms) else { continue };
            let recorded =
                crate::outage::retry_while(from, || true, true, || self.store().trigger_fire(fire.clone()))
                    .await;
            match (recorded, depth) {
                (Ok((fire, true)), Some(depth)) if self.inner.event_firing.serving.load(Ordering::SeqCst) => {
                    let request = fire_request(&armed, &Happened::Published { topic, message, from }, depth);
                    let kernel = self.clone();
                    tokio::spawn(async move {
                        if let Err(error) = kernel.start_fired(EVENT, &fire, request).await {
                            tracing::warn!("event trigger {} did not start its run: {error}", fire.trigger);
                        }
                    });
                }
                (Ok(_), _) => {}
                (Err(error), _) => tracing::error!(
                    run = %from,
                    "event trigger {}: the fire for publish {key} was not recorded: {error}",
                    armed.record.name
                ),
            }
        }
    }

    /// Starts firing event triggers (the daemon does; an embedded kernel does not): the
    /// runs of fires recorded without one, then a sweep now and every minute.
    pub fn start_event_triggers(&self) {
        self.inner.event_firing.serving.store(true, Ordering::SeqCst);
        let kernel = self.clone();
        tokio::spawn(async move {
            if let Err(error) = kernel.start_unstarted_events().await {
                tracing::error!("could not start the runs of recorded event fires: {error}");
            }
            loop {
                if kernel.inner.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                if let Err(error) = kernel.event_sweep().await {
                    tracing::warn!(
                        "a sweep for ended runs' event triggers failed (the next one tries again): {error}"
                    );
                }
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        });
    }

    /// Creates the runs of recorded fires whose run does not exist (the kernel died
    /// between recording and creating), from what fired them.
    async fn start_unstarted_events(&self) -> Result<()> {
        for fire in self.store().trigger_fires_unstarted(KIND).await? {
            let Some(record) = self.store().trigger_get(KIND, &fire.trigger).await? else { continue };
            let armed = armed(record)?;
            let started = match self.refire_request(&armed, &fire).await {
                Ok(request) => self.start_fired(EVENT, &fire, Ok(request)).await.map(drop),
                Err(error) if retry_later(&error) => Err(error),
                Err(error) => self.start_fired(EVENT, &fire, Err(error)).await.map(drop),
            };
            if let Err(error) = started {
                tracing::warn!(
                    "the recorded fire {} of event trigger {} did not start: {error}",
                    fire.occasion,
                    fire.trigger
                );
            }
        }
        Ok(())
    }

    /// The run a recorded fire starts, from what fired it: the ended run, or the publish
    /// in its run's journal.
    async fn refire_request(&self, armed: &Armed, fire: &FireRecord) -> Result<CreateRun> {
        if let Ok(ended) = RunId::parse(&fire.occasion) {
            let run = self.get(&ended).await?;
            let spec = RunSpec::of(&run)?;
            let agent = agent_name(&spec.command);
            return fire_request(armed, &Happened::RunEnd { run: &run, agent: &agent }, spec.event_depth + 1);
        }
        let missing = || {
            Error::NotFound(format!(
                "the publish {} that fired it is not in its run's journal",
                fire.occasion
            ))
        };
        let (from, seq) = fire.occasion.rsplit_once(':').ok_or_else(missing)?;
        let (from, seq) =
            (RunId::parse(from).map_err(|_| missing())?, seq.parse::<u64>().map_err(|_| missing())?);
        let entry =
            self.store().journal(&from, seq.saturating_sub(1)).await?.into_iter().find(|e| e.seq == seq);
        let params = entry.map(|e| e.params).ok_or_else(missing)?;
        let topic = params["topic"].as_str().ok_or_else(missing)?;
        let publisher = RunSpec::of(&self.get(&from).await?)?;
        let happened = Happened::Published { topic, message: &params["message"], from: &from };
        fire_request(armed, &happened, publisher.event_depth + 1)
    }

    /// One sweep: the runs of each tenant with triggers after runs that ended since the
    /// mark, fired for (what was recorded already is not again); then the mark moves on.
    async fn event_sweep(&self) -> Result<()> {
        let began = now_ms();
        let mark = self.store().kv_get(MARK_SCOPE, MARK_KEY).await?.and_then(|v| v.as_u64()).unwrap_or(0);
        let mut by_tenant: HashMap<String, Vec<Armed>> = HashMap::new();
        for armed in self.armed_triggers(None, |l| matches!(l, Listen::RunEnd { .. })).await? {
            if !armed.record.paused {
                by_tenant.entry(armed.record.tenant.clone()).or_default().push(armed);
            }
        }
        for (tenant, triggers) in &by_tenant {
            let since = triggers.iter().map(|armed| armed.record.since_ms).min().unwrap_or(0);
            let mut after = (mark.max(since), None::<RunId>);
            loop {
                let page =
                    self.store().runs_ended_after(tenant, after.0, after.1.as_ref(), SWEEP_PAGE).await?;
                for run in &page {
                    match self.fire_after_run(run, triggers).await {
                        Err(error) if retry_later(&error) => return Err(error),
                        Err(error) => tracing::warn!(run = %run.id, "event triggers after the run: {error}"),
                        Ok(()) => {}
                    }
                }
                match page.last() {
                    Some(last) if page.len() == SWEEP_PAGE => {
                        after = (last.ended_at_ms.unwrap_or(after.0), Some(last.id.clone()));
                    }
                    _ => break,
                }
            }
        }
        let oldest_in_flight = lock(&self.inner.event_firing.in_flight).keys().next().copied();
        let moved = began
            .saturating_sub(SWEEP_LAG_MS)
            .min(oldest_in_flight.map_or(u64::MAX, |at| at.saturating_sub(1)))
            .max(mark);
        if moved > mark {
            self.store().kv_put(MARK_SCOPE, MARK_KEY, json!(moved)).await?;
        }
        Ok(())
    }
}

/// The fire `armed` records for `occasion` (keyed `key`, at `at_ms`) with the depth of the
/// run it starts, a skip recorded without a run (`None` depth), or nothing.
fn event_fire(
    armed: &Armed,
    occasion: &Occasion<'_>,
    key: String,
    at_ms: u64,
) -> Option<(FireRecord, Option<u32>)> {
    let trigger = Trigger {
        name: &armed.record.name,
        listen: &armed.listen,
        paused: armed.record.paused,
        since_ms: armed.record.since_ms,
    };
    match decide(&trigger, occasion) {
        Decision::Fire { depth } => Some((new_fire(EVENT, &armed.record, key, at_ms), Some(depth))),
        Decision::Skip(skip) if skip.is_recorded() => {
            let fire = FireRecord {
                run_id: None,
                outcome: "skipped".into(),
                detail: Some(skip.to_string()),
                ..new_fire(EVENT, &armed.record, key, at_ms)
            };
            Some((fire, None))
        }
        Decision::Skip(_) => None,
    }
}
