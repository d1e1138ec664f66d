//! Schedules end to end: a schedule every two seconds fires once per tick across SIGKILLs
//! of the daemon (catch-up `all`: every tick missed while it was down fires after the
//! restart, none twice); bad cron expressions and zones are refused naming the position.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::harness::{Keel, wait_for};

/// Each run of the schedule as its agent recorded it: run id -> scheduled time (ms). A
/// run relaunched after a crash records itself again under the same id.
fn recorded(path: &std::path::Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs = BTreeMap::new();
    for line in text.lines() {
        let Some((run, input)) = line.split_once(' ') else { continue };
        let Ok(input) = serde_json::from_str::<Value>(input) else { continue };
        assert_eq!(input["schedule"], "tick", "{input}");
        let scheduled = input["scheduled_at_ms"].as_u64().expect("scheduled_at_ms");
        if let Some(before) = runs.insert(run.to_owned(), scheduled) {
            assert_eq!(before, scheduled, "one run, one scheduled time");
        }
    }
    runs
}

#[test]
fn a_two_second_schedule_fires_once_per_tick_across_sigkills() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let log = keel.data.path().join("fires.log");
    let script = format!("printf '%s %s\\n' \"$KEEL_RUN_ID\" \"$KEEL_INPUT\" >> {}", log.display());
    keel.ok(&[
        "schedule",
        "create",
        "tick",
        "--cron",
        "*/2 * * * * *",
        "--catch-up",
        "all",
        "--overlap",
        "allow",
        "--sandbox",
        "none",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let mut seen = 0;
    for round in 0..3 {
        let want = seen + 2;
        seen = wait_for(&format!("{want} fires before kill {round}"), || {
            let count = recorded(&log).len();
            (count >= want).then_some(count)
        });
        keel.kill_daemon();
        // Down for about two ticks, so catch-up has something to fire.
        std::thread::sleep(std::time::Duration::from_millis(4_100));
        keel.start_daemon();
    }
    wait_for("fires after the last restart", || (recorded(&log).len() >= seen + 3).then_some(()));
    keel.ok(&["schedule", "pause", "tick"]);
    // Let any fire in flight at the pause land.
    std::thread::sleep(std::time::Duration::from_millis(1_500));

    let runs = recorded(&log);
    let ticks: BTreeSet<u64> = runs.values().copied().collect();
    assert_eq!(ticks.len(), runs.len(), "no tick started two runs: {runs:?}");
    let first = *ticks.first().unwrap();
    let last = *ticks.last().unwrap();
    let expected: BTreeSet<u64> = (0..=(last - first) / 2_000).map(|i| first + i * 2_000).collect();
    assert_eq!(ticks, expected, "every tick from the first to the last fired, across three SIGKILLs");

    // Every run the schedule started says so, and is one of those the agent saw.
    let listed = keel.json(&["ps", "--json", "--limit", "1000"]);
    let started: BTreeSet<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|run| run["started_by"] == "schedule:tick")
        .map(|run| run["run_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(started, runs.keys().cloned().collect::<BTreeSet<_>>());
    let shown = keel.json(&["schedule", "show", "tick", "--json"]);
    assert_eq!(shown["paused"], true);
    assert_eq!(shown["last_fires"][0]["scheduled_at_ms"], last, "{shown}");
    assert!(shown["next_fires"].as_array().unwrap().is_empty(), "a paused schedule has no next fires");
    let text = keel.ok(&["schedule", "show", "tick"]);
    assert!(text.contains("last fires:") && text.contains("fired"), "{text}");
}

#[test]
fn bad_cron_zone_and_policies_are_refused_naming_what_is_wrong() {
    let keel = Keel::new();
    let refused = |args: &[&str], needle: &str| {
        let mut full = vec!["schedule", "create", "bad"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--", "true"]);
        let out = keel.run(&full);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(&["--cron", "0 9 32 * *"], "day-of-month field \"32\" at position 5");
    refused(&["--cron", "* * *"], "has 3 fields");
    refused(&["--cron", "0 9 * * *", "--tz", "Mars/Olympus"], "not an IANA zone");
    refused(&["--cron", "0 9 * * *", "--catch-up", "sometimes"], "catch-up \"sometimes\" is not known");
    refused(&["--cron", "0 9 * * *", "--overlap", "queue", "--catch-up", "none"], "overlap queue needs");
    let listed = keel.json(&["schedule", "list", "--json"]);
    assert_eq!(listed, Value::Array(vec![]), "nothing malformed was stored");
}
