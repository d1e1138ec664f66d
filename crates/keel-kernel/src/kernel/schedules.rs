//! Schedules: the public API (`/v1/schedules`, `keel schedule`) and the loop that fires
//! them. What fires when is `keel_core::trigger::plan`; here are the store and the clock.
//!
//! Exactly once: a tick is recorded in the store with the id of the run it starts before
//! the run is created (`Store::trigger_fire`, unique per schedule and scheduled time), and
//! the run is created under that id. A kernel killed between the two finds the fire
//! without its run at its next start (`Store::trigger_fires_unstarted`) and creates it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;

use keel_core::trigger::{CatchUp, CronSchedule, Overlap, Policies, plan};
use keel_protocol::api::{CreateRunParams, RunView};
use keel_protocol::triggers::{CreateScheduleParams, FireView, ScheduleView};
use keel_store::{FireRecord, TriggerRecord};
use keel_types::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::triggers::{
    SCHEDULE, is_declared, new_fire, new_trigger, retry_later, triggered_run, validate_name,
};
use crate::run::CreateRun;
use crate::{Error, Kernel, Principal, Result, now_ms};

const KIND: &str = SCHEDULE.store;

/// How many last fires and next ticks a view shows.
const SHOWN_FIRES: usize = 5;

/// The longest the loop sleeps without looking (a schedule created by another node).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// How many schedules fire at once in a pass.
const FIRING_AT_ONCE: usize = 32;

/// A schedule as stored in its trigger's spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ScheduleSpec {
    cron: String,
    tz: String,
    overlap: String,
    catch_up: String,
    jitter_ms: u64,
    run: CreateRunParams,
}

struct Parsed {
    schedule: CronSchedule,
    policies: Policies,
    spec: ScheduleSpec,
}

fn parse(spec: ScheduleSpec) -> Result<Parsed> {
    let invalid = |e: keel_core::trigger::ScheduleError| Error::InvalidRequest(e.to_string());
    let schedule = CronSchedule::parse(&spec.cron, &spec.tz).map_err(invalid)?;
    let catch_up: CatchUp = spec.catch_up.parse().map_err(invalid)?;
    let overlap: Overlap = spec.overlap.parse().map_err(invalid)?;
    let policies = Policies::new(catch_up, overlap, spec.jitter_ms).map_err(invalid)?;
    Ok(Parsed { schedule, policies, spec })
}

fn parse_record(record: &TriggerRecord) -> Result<Parsed> {
    let spec: ScheduleSpec = serde_json::from_value(record.spec.clone()).map_err(|e| {
        Error::InvalidRequest(format!("the stored spec of schedule {} cannot be read: {e}", record.name))
    })?;
    parse(spec)
}

/// The schedules the loop has parsed, kept while their stored spec is the same: a pass
/// over a thousand schedules does not parse a thousand cron expressions again.
#[derive(Default)]
struct Parsings(HashMap<String, (Value, Arc<Parsed>)>);

impl Parsings {
    fn of(&mut self, record: &TriggerRecord) -> Result<Arc<Parsed>> {
        if let Some((spec, parsed)) = self.0.get(&record.name)
            && *spec == record.spec
        {
            return Ok(parsed.clone());
        }
        let parsed = Arc::new(parse_record(record)?);
        self.0.insert(record.name.clone(), (record.spec.clone(), parsed.clone()));
        Ok(parsed)
    }
}

/// The run a fire starts: the schedule's run with an input naming the schedule and tick.
fn fire_request(name: &str, parsed: &Parsed, tick_ms: u64, tenant: &str) -> Result<CreateRun> {
    let input = json!({
        "trigger": "schedule",
        "schedule": name,
        "scheduled_at": parsed.schedule.local_time(tick_ms),
        "scheduled_at_ms": tick_ms,
    });
    triggered_run(&parsed.spec.run, tenant, input, format!("schedule:{name}"))
}

/// A schedule to store, checked whole (cron, zone, policies, the run) for `principal`.
pub(super) fn schedule_record(principal: &Principal, params: CreateScheduleParams) -> Result<TriggerRecord> {
    validate_name(SCHEDULE, &params.name)?;
    let tenant = principal.run_tenant(params.run.tenant.as_deref())?;
    let jitter_secs = params.jitter_secs.unwrap_or(0);
    let spec = ScheduleSpec {
        cron: params.cron.clone(),
        tz: params.tz.clone().unwrap_or_else(|| "UTC".into()),
        overlap: params.overlap.clone().unwrap_or_else(|| "skip".into()),
        catch_up: params.catch_up.clone().unwrap_or_else(|| "latest".into()),
        jitter_ms: jitter_secs.saturating_mul(1000),
        run: CreateRunParams { tenant: Some(tenant.clone()), ..params.run },
    };
    let parsed = parse(spec)?;
    // The run is checked as a fire would make it, so a bad run option fails now.
    fire_request(&params.name, &parsed, 0, &tenant)?;
    Ok(new_trigger(SCHEDULE, params.name, tenant, &parsed.spec))
}

impl Kernel {
    /// `POST /v1/schedules`: checks everything (cron, zone, policies, the run) before
    /// anything is stored.
    pub async fn schedule_create(
        &self,
        principal: &Principal,
        params: CreateScheduleParams,
    ) -> Result<ScheduleView> {
        let record = schedule_record(principal, params)?;
        self.trigger_store(SCHEDULE, record.clone()).await?;
        self.inner.schedules_changed.notify_one();
        self.schedule_view(&record).await
    }

    /// `GET /v1/schedules`: the principal's schedules, by name.
    pub async fn schedules(&self, principal: &Principal) -> Result<Vec<ScheduleView>> {
        self.trigger_views(SCHEDULE, principal, |record| async move { self.schedule_view(&record).await })
            .await
    }

    /// `GET /v1/schedules/{name}`.
    pub async fn schedule(&self, principal: &Principal, name: &str) -> Result<ScheduleView> {
        let record = self.schedule_for(principal, name).await?;
        self.schedule_view(&record).await
    }

    /// Pauses or resumes a schedule. Resuming settles the ticks of the pause: they do not
    /// fire as missed.
    pub async fn schedule_pause(
        &self,
        principal: &Principal,
        name: &str,
        paused: bool,
    ) -> Result<ScheduleView> {
        self.schedule_for(principal, name).await?;
        self.store().trigger_set_paused(KIND, name, paused, now_ms()).await?;
        self.inner.schedules_changed.notify_one();
        self.schedule(principal, name).await
    }

    /// Deletes a schedule and its history of fires (its runs stay); the schedule as it was.
    /// One declared in keel.toml is refused (a conflict saying to remove it there).
    pub async fn schedule_delete(&self, principal: &Principal, name: &str) -> Result<ScheduleView> {
        let view = self.schedule(principal, name).await?;
        self.trigger_delete(SCHEDULE, principal, name).await?;
        Ok(view)
    }

    /// Starts the schedule's run now, as a fire at this moment (recorded like a tick).
    pub async fn schedule_run_now(&self, principal: &Principal, name: &str) -> Result<RunView> {
        let record = self.schedule_for(principal, name).await?;
        let parsed = parse_record(&record)?;
        let now = now_ms();
        let run = self.fire_tick(&record, &parsed, now, format!("now-{now}")).await?;
        let run =
            run.ok_or_else(|| Error::Conflict(format!("schedule {name} already fired at this moment")))?;
        let record = self.get(&run).await?;
        self.view(&record).await
    }

    async fn schedule_for(&self, principal: &Principal, name: &str) -> Result<TriggerRecord> {
        self.trigger_for(SCHEDULE, principal, name).await
    }

    async fn schedule_view(&self, record: &TriggerRecord) -> Result<ScheduleView> {
        let parsed = parse_record(record)?;
        let fires = self.store().trigger_fires(KIND, &record.name, SHOWN_FIRES).await?;
        let next_fires = if record.paused {
            Vec::new()
        } else {
            parsed
                .schedule
                .next_ticks(now_ms(), SHOWN_FIRES)
                .into_iter()
                .map(|t| parsed.schedule.local_time(t))
                .collect()
        };
        Ok(ScheduleView {
            name: record.name.clone(),
            tenant: record.tenant.clone(),
            cron: parsed.spec.cron.clone(),
            tz: parsed.spec.tz.clone(),
            overlap: parsed.policies.overlap.to_string(),
            catch_up: parsed.policies.catch_up.to_string(),
            jitter_secs: parsed.spec.jitter_ms / 1000,
            paused: record.paused,
            declared: is_declared(record),
            command: parsed.spec.run.command.clone(),
            created_at: record.created_at_ms,
            last_fires: fires
                .iter()
                .map(|fire| FireView {
                    scheduled_at: parsed.schedule.local_time(fire.at_ms),
                    scheduled_at_ms: fire.at_ms,
                    run_id: fire.run_id.as_ref().map(|id| id.to_string()),
                    outcome: fire.outcome.clone(),
                    detail: fire.detail.clone(),
                    fired_at: fire.fired_at_ms,
                })
                .collect(),
            next_fires,
        })
    }

    /// Records the fire of `occasion` (at `tick_ms`) and creates its run; the run id, or
    /// `None` when the occasion had fired already.
    async fn fire_tick(
        &self,
        record: &TriggerRecord,
        parsed: &Parsed,
        tick_ms: u64,
        occasion: String,
    ) -> Result<Option<RunId>> {
        let fire = new_fire(SCHEDULE, record, occasion, tick_ms);
        self.fire_and_start(SCHEDULE, fire, |fire| {
            fire_request(&fire.trigger, parsed, fire.at_ms, &fire.tenant)
        })
        .await
    }

    /// Starts the loop that fires schedules (the daemon does; an embedded kernel does not).
    pub fn start_schedules(&self) {
        let kernel = self.clone();
        tokio::spawn(async move { kernel.schedule_loop().await });
    }

    async fn schedule_loop(&self) {
        if let Err(error) = self.start_unstarted_fires().await {
            tracing::error!("could not start the runs of recorded fires: {error}");
        }
        let mut settled: HashMap<String, (u64, Option<RunId>)> = HashMap::new();
        let mut parsed = Parsings::default();
        loop {
            if self.inner.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let wake_at = match self.schedule_pass(&mut settled, &mut parsed).await {
                Ok(wake) => wake,
                Err(error) => {
                    tracing::warn!("a pass over the schedules failed: {error}");
                    None
                }
            };
            let sleep = wake_at
                .map(|at| Duration::from_millis(at.saturating_sub(now_ms())))
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = self.inner.schedules_changed.notified() => {}
                () = self.inner.run_ended.notified() => {}
            }
        }
    }

    async fn start_unstarted_fires(&self) -> Result<()> {
        for fire in self.store().trigger_fires_unstarted(KIND).await? {
            let Some(record) = self.store().trigger_get(KIND, &fire.trigger).await? else { continue };
            let parsed = parse_record(&record)?;
            let request = fire_request(&fire.trigger, &parsed, fire.at_ms, &fire.tenant);
            if let Err(error) = self.start_fired(SCHEDULE, &fire, request).await {
                tracing::warn!(
                    "the recorded fire {} of {} did not start: {error}",
                    fire.occasion,
                    fire.trigger
                );
            }
        }
        Ok(())
    }

    /// One look at every schedule: fires what is due; when to look again.
    async fn schedule_pass(
        &self,
        settled: &mut HashMap<String, (u64, Option<RunId>)>,
        parsings: &mut Parsings,
    ) -> Result<Option<u64>> {
        let mut listed = std::collections::HashSet::new();
        let mut wake_at: Option<u64> = None;
        let mut due = Vec::new();
        for record in self.store().trigger_list(KIND, None).await? {
            listed.insert(record.name.clone());
            if record.paused {
                settled.remove(&record.name);
                continue;
            }
            let parsed = match parsings.of(&record) {
                Ok(parsed) => parsed,
                Err(error) => {
                    tracing::warn!("{error}");
                    continue;
                }
            };
            let (since, last_run) = match settled.get(&record.name) {
                Some((since, run)) if *since >= record.since_ms => (*since, run.clone()),
                _ => {
                    let last = self.store().trigger_fires(KIND, &record.name, 1).await?;
                    let last = last.into_iter().find(|fire| fire.occasion.parse::<u64>().is_ok());
                    let since = last.as_ref().map_or(0, |fire| fire.at_ms).max(record.since_ms);
                    (since, last.and_then(|fire| fire.run_id))
                }
            };
            let now = now_ms();
            let planned = |live| plan(&parsed.schedule, &record.name, &parsed.policies, since, now, live);
            // Whether the last run is live matters only when a tick is due to fire: the
            // store is asked then, not for every schedule at every pass.
            let mut decided = planned(false);
            if let (false, Some(run), Overlap::Skip | Overlap::Queue) =
                (decided.fire.is_empty(), &last_run, parsed.policies.overlap)
                && self.get(run).await.is_ok_and(|record| !record.state.is_terminal())
            {
                decided = planned(true);
            }
            for tick in &decided.skip {
                let fire = FireRecord {
                    kind: KIND.into(),
                    trigger: record.name.clone(),
                    occasion: tick.to_string(),
                    tenant: record.tenant.clone(),
                    at_ms: *tick,
                    run_id: None,
                    outcome: "skipped".into(),
                    detail: Some("the previous run was still live (overlap skip)".into()),
                    fired_at_ms: now,
                };
                self.store().trigger_fire(fire).await?;
            }
            settled.insert(record.name.clone(), (decided.settled_through.unwrap_or(since), last_run));
            if let Some(next) = decided.next_check_ms {
                wake_at = Some(wake_at.map_or(next, |at| at.min(next)));
            }
            if !decided.fire.is_empty() {
                due.push((record, parsed, decided.fire));
            }
        }
        parsings.0.retain(|name, _| listed.contains(name));
        // The due schedules fire side by side (their store writes share commits, their
        // runs start in parallel), each one's ticks in order: a thousand schedules due at
        // the same second are not a thousand fires in a row.
        let fired: Vec<_> = futures_util::stream::iter(due)
            .map(|(record, parsed, ticks)| async move {
                let mut last = None;
                for tick in ticks {
                    match self.fire_tick(&record, &parsed, tick, tick.to_string()).await {
                        Ok(Some(run)) => last = Some(run),
                        Ok(None) => {}
                        Err(error) if retry_later(&error) => return (record.name, last, Err(error)),
                        Err(_) => {}
                    }
                }
                (record.name, last, Ok(()))
            })
            .buffer_unordered(FIRING_AT_ONCE)
            .collect()
            .await;
        let mut retry = None;
        for (name, last, outcome) in fired {
            match outcome {
                // Not settled: the next pass reads where it stands from the store (a tick
                // recorded already is not fired twice).
                Err(error) => {
                    settled.remove(&name);
                    retry.get_or_insert(error);
                }
                Ok(()) => {
                    if let (Some(run), Some(entry)) = (last, settled.get_mut(&name)) {
                        entry.1 = Some(run);
                    }
                }
            }
        }
        match retry {
            Some(error) => Err(error),
            None => Ok(wake_at),
        }
    }
}
