//! Triggers declared in keel.toml (`[[triggers.schedule]]`, `[[triggers.hook]]`,
//! `[[triggers.event]]`): read and checked whole ([`DeclaredTriggers::from_keel_toml`],
//! then each entry as the API checks a request), and made true in the store when the
//! daemon starts ([`Kernel::declare_triggers`]): a declared trigger that is missing is
//! created, one whose declaration changed is updated (its fires, pause and history kept),
//! one no longer declared is deleted; triggers created through the API are left alone.
//! Declared triggers carry a mark in their stored spec, so the API refuses to delete one
//! (it would come back at the next start) and says to remove it from keel.toml instead.

use std::collections::BTreeSet;
use std::path::Path;

use keel_protocol::api::CreateRunParams;
use keel_protocol::triggers::{CreateEventTriggerParams, CreateHookParams, CreateScheduleParams};
use keel_store::TriggerRecord;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::event_triggers::event_record;
use super::hooks::hook_record;
use super::schedules::schedule_record;
use super::triggers::{EVENT, HOOK, Kind, SCHEDULE, is_declared, mark_declared};
use crate::{Error, Kernel, Principal, Result};

/// A schedule's own keys in its table (every other key is a run option).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleEntry {
    name: String,
    cron: String,
    #[serde(default)]
    tz: Option<String>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    catch_up: Option<String>,
    /// Seconds, as `keel schedule create --jitter`.
    #[serde(default)]
    jitter: Option<u64>,
}
const SCHEDULE_KEYS: &[&str] = &["name", "cron", "tz", "overlap", "catch_up", "jitter"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HookEntry {
    name: String,
    verify: String,
    secret_env: String,
    #[serde(default)]
    header: Option<String>,
    /// Seconds, as `keel hook create --tolerance`.
    #[serde(default)]
    tolerance: Option<u64>,
}
const HOOK_KEYS: &[&str] = &["name", "verify", "secret_env", "header", "tolerance"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventEntry {
    name: String,
    #[serde(default)]
    after_run: Option<String>,
    #[serde(default)]
    on: Option<String>,
    #[serde(default)]
    topic: Option<String>,
}
const EVENT_KEYS: &[&str] = &["name", "after_run", "on", "topic"];

/// One declaration, checked as the API checks a request: the record to store.
struct Declared {
    kind: Kind,
    /// `[[triggers.schedule]] #2 ("report")`, for messages.
    label: String,
    record: TriggerRecord,
}

/// The triggers keel.toml declares, each checked.
pub struct DeclaredTriggers {
    entries: Vec<Declared>,
}

/// What making the store match keel.toml did, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeclaredChanges {
    pub created: Vec<String>,
    pub updated: Vec<String>,
    pub deleted: Vec<String>,
}

impl DeclaredTriggers {
    /// The `[triggers]` tables of a keel.toml document (other tables are others'). `base`
    /// is keel.toml's directory: a relative `cwd` or `llm_script` is read from there. Every
    /// entry is checked now (a cron expression, a hook's secret in this environment, the
    /// run's options); the first that is wrong is the error, naming its table and entry.
    pub fn from_keel_toml(text: &str, base: &Path) -> std::result::Result<DeclaredTriggers, String> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            triggers: Option<toml::Value>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Tables {
            #[serde(default)]
            schedule: Vec<toml::Table>,
            #[serde(default)]
            hook: Vec<toml::Table>,
            #[serde(default)]
            event: Vec<toml::Table>,
        }
        let doc: Doc = toml::from_str(text).map_err(|e| format!("keel.toml: {e}"))?;
        let Some(tables) = doc.triggers else { return Ok(DeclaredTriggers { entries: Vec::new() }) };
        let tables: Tables = tables.try_into().map_err(|e| {
            format!(
                "keel.toml [triggers]: {e} (declare [[triggers.schedule]], [[triggers.hook]] or \
                 [[triggers.event]] tables)"
            )
        })?;
        let admin = Principal::Admin;
        let mut entries =
            declare(SCHEDULE, SCHEDULE_KEYS, tables.schedule, base, |own: ScheduleEntry, run| {
                let params = CreateScheduleParams {
                    name: own.name,
                    cron: own.cron,
                    tz: own.tz,
                    overlap: own.overlap,
                    catch_up: own.catch_up,
                    jitter_secs: own.jitter,
                    run,
                };
                schedule_record(&admin, params)
            })?;
        entries.extend(declare(HOOK, HOOK_KEYS, tables.hook, base, |own: HookEntry, run| {
            let params = CreateHookParams {
                name: own.name,
                verify: own.verify,
                secret_env: own.secret_env,
                header: own.header,
                tolerance_secs: own.tolerance,
                run,
            };
            hook_record(&admin, params)
        })?);
        entries.extend(declare(EVENT, EVENT_KEYS, tables.event, base, |own: EventEntry, run| {
            let params = CreateEventTriggerParams {
                name: own.name,
                after_run: own.after_run,
                on: own.on,
                topic: own.topic,
                run,
            };
            event_record(&admin, params)
        })?);
        let mut seen = BTreeSet::new();
        for entry in &entries {
            if !seen.insert((entry.kind.store, entry.record.name.as_str())) {
                return Err(format!(
                    "keel.toml {}: another [[triggers.{}]] entry has the name {:?}; names are unique",
                    entry.label, entry.kind.store, entry.record.name
                ));
            }
        }
        Ok(DeclaredTriggers { entries })
    }
}

/// `[[triggers.KIND]] #N ("name")`, 1-based, the name when the entry has one.
fn label(kind: &str, index: usize, table: &toml::Table) -> String {
    match table.get("name").and_then(toml::Value::as_str) {
        Some(name) => format!("[[triggers.{kind}]] #{} ({name:?})", index + 1),
        None => format!("[[triggers.{kind}]] #{}", index + 1),
    }
}

fn message(error: &Error) -> String {
    match error {
        Error::InvalidRequest(message) | Error::Forbidden(message) => message.clone(),
        other => other.to_string(),
    }
}

/// The entries of one kind's tables (`[[triggers.KIND]]`), each split into the trigger's
/// own keys (`own`, read as `T`) and its run, and checked by `record` as the API checks a
/// request.
fn declare<T: DeserializeOwned>(
    kind: Kind,
    own: &[&str],
    tables: Vec<toml::Table>,
    base: &Path,
    record: impl Fn(T, CreateRunParams) -> Result<TriggerRecord>,
) -> std::result::Result<Vec<Declared>, String> {
    let mut declared = Vec::new();
    for (index, table) in tables.into_iter().enumerate() {
        let label = label(kind.store, index, &table);
        let checked =
            split::<T>(table, own, base).and_then(|(own, run)| record(own, run).map_err(|e| message(&e)));
        let mut record = checked.map_err(|e| format!("keel.toml {label}: {e}"))?;
        mark_declared(&mut record.spec);
        declared.push(Declared { kind, label, record });
    }
    Ok(declared)
}

/// A trigger's table split into its own keys (`own`) and the run's options (every other
/// key: `command`, `cwd`, `env`, `tenant`, `model`, `budget`, `sandbox`, `grant`,
/// `priority`, `input`... as `POST /v1/runs` takes them). A relative `cwd` is resolved
/// against `base`; `llm_script` given as a path is read from there.
fn split<T: DeserializeOwned>(
    table: toml::Table,
    own: &[&str],
    base: &Path,
) -> std::result::Result<(T, CreateRunParams), String> {
    let (mine, rest): (toml::Table, toml::Table) =
        table.into_iter().partition(|(key, _)| own.contains(&key.as_str()));
    let mine: T = toml::Value::Table(mine).try_into().map_err(|e| e.to_string())?;
    let mut run = serde_json::to_value(&rest).map_err(|e| e.to_string())?;
    if let Some(Value::String(cwd)) = run.get("cwd") {
        run["cwd"] = Value::String(base.join(cwd).display().to_string());
    }
    if let Some(Value::String(script)) = run.get("llm_script") {
        let path = base.join(script);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("llm_script {}: cannot read the file: {e}", path.display()))?;
        run["llm_script"] = serde_json::from_str(&text)
            .map_err(|e| format!("llm_script {}: not JSON: {e}", path.display()))?;
    }
    if run.get("command").is_none() {
        return Err("`command` is missing: the agent's program and arguments, e.g. \
                    command = [\"python3\", \"agent.py\"]"
            .into());
    }
    let run: CreateRunParams = serde_json::from_value(run).map_err(|e| {
        format!(
            "{e} (a trigger's keys: {}; any other key is a run option, as POST /v1/runs takes them)",
            own.join(", ")
        )
    })?;
    Ok((mine, run))
}

impl Kernel {
    /// Makes the store's triggers match keel.toml's declarations: creates the missing,
    /// updates the changed (keeping their fires and pause), deletes the declared ones no
    /// longer declared; triggers created through the API are left alone, and a declaration
    /// whose name one of them holds is refused (nothing is written then).
    pub async fn declare_triggers(&self, declared: &DeclaredTriggers) -> Result<DeclaredChanges> {
        let mut changes = DeclaredChanges::default();
        let mut current = Vec::new();
        for entry in &declared.entries {
            let stored = self.store().trigger_get(entry.kind.store, &entry.record.name).await?;
            if let Some(stored) = &stored
                && !is_declared(stored)
            {
                return Err(Error::Conflict(format!(
                    "keel.toml {}: {} named {} was created through the API; `{} delete {}` it first, or \
                     rename this one",
                    entry.label, entry.kind.a_noun, entry.record.name, entry.kind.command, entry.record.name
                )));
            }
            current.push(stored);
        }
        for (entry, stored) in declared.entries.iter().zip(current) {
            let record = &entry.record;
            match stored {
                None => match self.store().trigger_create(record.clone()).await {
                    Ok(()) => changes.created.push(format!("{} {}", entry.kind.store, record.name)),
                    // Another node sharing the store, starting at the same time, made it.
                    Err(keel_store::Error::TriggerExists { .. }) => {}
                    Err(error) => return Err(error.into()),
                },
                Some(stored) if stored.spec == record.spec && stored.tenant == record.tenant => {}
                Some(_) => {
                    self.store()
                        .trigger_update(entry.kind.store, &record.name, &record.tenant, &record.spec)
                        .await?;
                    changes.updated.push(format!("{} {}", entry.kind.store, record.name));
                }
            }
        }
        for kind in [SCHEDULE, HOOK, EVENT] {
            for stored in self.store().trigger_list(kind.store, None).await? {
                let still = declared
                    .entries
                    .iter()
                    .any(|e| e.kind.store == kind.store && e.record.name == stored.name);
                if is_declared(&stored) && !still {
                    self.store().trigger_delete(kind.store, &stored.name).await?;
                    changes.deleted.push(format!("{} {}", kind.store, stored.name));
                }
            }
        }
        self.inner.schedules_changed.notify_one();
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> std::result::Result<DeclaredTriggers, String> {
        DeclaredTriggers::from_keel_toml(text, Path::new("/tmp"))
    }

    #[test]
    fn every_kind_is_read_checked_and_marked() {
        let declared = read(
            r#"
            [scheduler]
            max_live = 3

            [[triggers.schedule]]
            name = "report"
            cron = "0 9 * * MON-FRI"
            tz = "Europe/Paris"
            jitter = 5
            command = ["python3", "report.py"]
            cwd = "."
            budget = { usd = 0.5 }

            [[triggers.hook]]
            name = "pushes"
            verify = "github"
            secret_env = "PATH"
            command = ["python3", "triage.py"]

            [[triggers.event]]
            name = "after"
            after_run = "report.py"
            on = "failed"
            command = ["python3", "page.py"]
            tenant = "acme"
            "#,
        )
        .unwrap();
        let names: Vec<_> = declared.entries.iter().map(|e| (e.kind.store, e.record.name.as_str())).collect();
        assert_eq!(names, [("schedule", "report"), ("hook", "pushes"), ("event", "after")]);
        assert!(declared.entries.iter().all(|e| is_declared(&e.record)));
        let schedule = &declared.entries[0].record.spec;
        assert_eq!(
            (schedule["jitter_ms"].clone(), schedule["tz"].clone()),
            (5000.into(), "Europe/Paris".into())
        );
        assert_eq!(schedule["run"]["cwd"], "/tmp/.", "a relative cwd is keel.toml's directory's");
        assert_eq!(schedule["run"]["budget"]["usd"], 0.5);
        assert_eq!(declared.entries[2].record.tenant, "acme");
        assert_eq!(declared.entries[2].label, "[[triggers.event]] #1 (\"after\")");
        assert!(read("").unwrap().entries.is_empty());
        assert!(read("[scheduler]\nmax_live = 1\n").unwrap().entries.is_empty());
    }

    #[test]
    fn a_bad_entry_is_named_with_what_is_wrong() {
        let refused = |text: &str| read(text).err().expect("refused");
        let event = |extra: &str| format!("[[triggers.event]]\nname = \"e\"\ntopic = \"t\"\n{extra}");
        let error = refused(&event(""));
        assert!(
            error.starts_with("keel.toml [[triggers.event]] #1 (\"e\"): `command` is missing"),
            "{error}"
        );
        let error = refused(&event("command = [\"true\"]\nmodle = \"x\""));
        assert!(
            error.contains("unknown field `modle`") && error.contains("name, after_run, on, topic"),
            "{error}"
        );
        let error = refused(&event("command = [\"true\"]\non = \"failed\""));
        assert!(error.contains("applies to after_run only"), "{error}");
        let error = refused("[[triggers.event]]\ntopic = \"t\"\ncommand = [\"true\"]\n");
        assert!(error.starts_with("keel.toml [[triggers.event]] #1: missing field `name`"), "{error}");
        let error = refused(
            "[[triggers.schedule]]\nname = \"a\"\ncron = \"* * * * *\"\ncommand = [\"true\"]\n\
             [[triggers.schedule]]\nname = \"b\"\ncron = \"* * *\"\ncommand = [\"true\"]\n",
        );
        assert!(error.starts_with("keel.toml [[triggers.schedule]] #2 (\"b\"): cron expression"), "{error}");
        let error = refused(
            "[[triggers.hook]]\nname = \"h\"\nverify = \"github\"\nsecret_env = \"KEEL_DECLARED_UNSET\"\n\
             command = [\"true\"]\n",
        );
        assert!(error.contains("[[triggers.hook]] #1 (\"h\")") && error.contains("reserved"), "{error}");
        let twice = event("command = [\"true\"]\n") + "\n" + &event("command = [\"true\"]\n");
        assert!(refused(&twice).contains("#2 (\"e\"): another [[triggers.event]] entry has the name"));
        assert!(refused("[[triggers.cron]]\nname = \"x\"\n").contains("unknown field `cron`"));
        assert!(refused("triggers = 3\n").contains("keel.toml [triggers]"));
        let error = refused(&event("command = [\"true\"]\nllm_script = \"missing.json\""));
        assert!(error.contains("llm_script /tmp/missing.json: cannot read the file"), "{error}");
    }
}
