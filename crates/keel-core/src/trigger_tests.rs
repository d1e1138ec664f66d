//! The schedule computation, without IO: parsing and its errors, time zones and DST,
//! catch-up, overlap and jitter.

use super::*;

/// Unix ms of a UTC wall time.
fn at(text: &str) -> u64 {
    let time = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").unwrap();
    time.and_utc().timestamp_millis() as u64
}

fn ticks(expr: &str, zone: &str, from: &str, count: usize) -> Vec<String> {
    let schedule = CronSchedule::parse(expr, zone).unwrap();
    schedule.next_ticks(at(from), count).into_iter().map(|tick| schedule.local_time(tick)).collect()
}

fn policies(catch_up: CatchUp, overlap: Overlap) -> Policies {
    Policies::new(catch_up, overlap, 0).unwrap()
}

#[test]
fn five_fields_fire_on_minutes_and_six_on_seconds() {
    assert_eq!(
        ticks("0 9 * * MON-FRI", "UTC", "2025-01-03 10:00:00", 2),
        ["2025-01-06T09:00:00+00:00", "2025-01-07T09:00:00+00:00"]
    );
    assert_eq!(
        ticks("*/2 * * * * *", "UTC", "2025-01-01 00:00:00", 3),
        ["2025-01-01T00:00:02+00:00", "2025-01-01T00:00:04+00:00", "2025-01-01T00:00:06+00:00"]
    );
}

#[test]
fn a_time_zone_moves_the_ticks() {
    // 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    let schedule = CronSchedule::parse("0 9 * * *", "Europe/Paris").unwrap();
    assert_eq!(schedule.next_after(at("2025-01-10 00:00:00")), Some(at("2025-01-10 08:00:00")));
    assert_eq!(schedule.next_after(at("2025-07-10 00:00:00")), Some(at("2025-07-10 07:00:00")));
    let tokyo = CronSchedule::parse("0 9 * * *", "Asia/Tokyo").unwrap();
    assert_eq!(tokyo.next_after(at("2025-07-10 00:00:00")), Some(at("2025-07-11 00:00:00")));
}

#[test]
fn spring_forward_runs_a_fixed_time_job_right_after_the_gap() {
    // Paris, 2025-03-30: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    assert_eq!(
        ticks("30 2 * * *", "Europe/Paris", "2025-03-29 12:00:00", 3),
        ["2025-03-30T03:00:00+02:00", "2025-03-31T02:30:00+02:00", "2025-04-01T02:30:00+02:00"]
    );
}

#[test]
fn spring_forward_skips_interval_ticks_inside_the_gap() {
    assert_eq!(
        ticks("*/30 * * * *", "Europe/Paris", "2025-03-30 00:15:00", 3),
        ["2025-03-30T01:30:00+01:00", "2025-03-30T03:00:00+02:00", "2025-03-30T03:30:00+02:00"]
    );
}

#[test]
fn fall_back_runs_a_fixed_time_job_once() {
    // Paris, 2025-10-26: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    assert_eq!(
        ticks("30 2 * * *", "Europe/Paris", "2025-10-25 12:00:00", 2),
        ["2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"]
    );
}

#[test]
fn fall_back_runs_an_interval_job_on_both_passes() {
    assert_eq!(
        ticks("*/30 2 * * *", "Europe/Paris", "2025-10-25 23:00:00", 4),
        [
            "2025-10-26T02:00:00+02:00",
            "2025-10-26T02:30:00+02:00",
            "2025-10-26T02:00:00+01:00",
            "2025-10-26T02:30:00+01:00"
        ]
    );
}

#[test]
fn new_york_dst_both_ways() {
    // 2025-03-09 02:00 EST -> 03:00 EDT; 2025-11-02 02:00 EDT -> 01:00 EST.
    assert_eq!(
        ticks("15 2 * * *", "America/New_York", "2025-03-08 12:00:00", 1),
        ["2025-03-09T03:00:00-04:00"]
    );
    assert_eq!(
        ticks("15 1 * * *", "America/New_York", "2025-11-01 12:00:00", 2),
        ["2025-11-02T01:15:00-04:00", "2025-11-03T01:15:00-05:00"]
    );
}

#[test]
fn errors_name_the_field_and_its_position() {
    let error = CronSchedule::parse("0 9 32 * *", "UTC").unwrap_err();
    match &error {
        ScheduleError::Field { field, text, position, .. } => {
            assert_eq!((*field, text.as_str(), *position), ("day-of-month", "32", 5));
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    assert!(error.to_string().contains("position 5"), "{error}");
    let error = CronSchedule::parse("*/2  *  * * * FOO", "UTC").unwrap_err();
    assert!(matches!(&error, ScheduleError::Field { field: "day-of-week", position: 15, .. }), "{error:?}");
    let error = CronSchedule::parse("61 * * * * *", "UTC").unwrap_err();
    assert!(matches!(&error, ScheduleError::Field { field: "second", position: 1, .. }), "{error:?}");
}

#[test]
fn wrong_field_counts_zones_and_impossible_dates_are_refused() {
    assert!(matches!(CronSchedule::parse("* * *", "UTC"), Err(ScheduleError::FieldCount { found: 3, .. })));
    assert!(matches!(CronSchedule::parse("", "UTC"), Err(ScheduleError::FieldCount { found: 0, .. })));
    assert!(matches!(
        CronSchedule::parse("* * * * * * 2030", "UTC"),
        Err(ScheduleError::FieldCount { found: 7, .. })
    ));
    let zone = CronSchedule::parse("* * * * *", "Europe/Pariss").unwrap_err();
    assert_eq!(zone, ScheduleError::TimeZone { zone: "Europe/Pariss".into() });
    assert!(matches!(CronSchedule::parse("0 0 30 2 *", "UTC"), Err(ScheduleError::NeverFires { .. })));
    assert!(CronSchedule::parse("@daily", "UTC").is_ok());
}

#[test]
fn policies_parse_and_refuse_what_cannot_work() {
    assert_eq!("none".parse::<CatchUp>(), Ok(CatchUp::None));
    assert_eq!("latest".parse::<CatchUp>(), Ok(CatchUp::Latest));
    assert_eq!("all".parse::<CatchUp>(), Ok(CatchUp::All(DEFAULT_CATCH_UP_BOUND)));
    assert_eq!("all:7".parse::<CatchUp>(), Ok(CatchUp::All(7)));
    for bad in ["all:0", "all:x", "every", "all:10001"] {
        assert!(bad.parse::<CatchUp>().is_err(), "{bad}");
    }
    assert_eq!("queue".parse::<Overlap>(), Ok(Overlap::Queue));
    assert!("wait".parse::<Overlap>().is_err());
    assert!(Policies::new(CatchUp::None, Overlap::Queue, 0).is_err());
    assert!(Policies::new(CatchUp::Latest, Overlap::Skip, MAX_JITTER_MS + 1).is_err());
    for policy in [CatchUp::None, CatchUp::Latest, CatchUp::All(3)] {
        assert_eq!(policy.to_string().parse::<CatchUp>(), Ok(policy));
    }
}

#[test]
fn jitter_is_deterministic_and_bounded() {
    assert_eq!(jitter_ms("nightly", 1_000, 0), 0);
    let first = jitter_ms("nightly", 60_000, 30_000);
    assert_eq!(first, jitter_ms("nightly", 60_000, 30_000));
    let spread: std::collections::BTreeSet<u64> =
        (0..200).map(|tick| jitter_ms("nightly", tick * 60_000, 30_000)).collect();
    assert!(spread.iter().all(|delay| *delay < 30_000));
    assert!(spread.len() > 150, "jitter should spread ticks: {}", spread.len());
    assert_ne!(jitter_ms("a", 60_000, 1 << 40), jitter_ms("b", 60_000, 1 << 40));
}

fn every_2s() -> CronSchedule {
    CronSchedule::parse("*/2 * * * * *", "UTC").unwrap()
}

#[test]
fn a_tick_on_time_fires_once_and_the_next_plan_waits_for_the_next_tick() {
    let start = at("2025-01-01 00:00:00");
    let rules = policies(CatchUp::None, Overlap::Allow);
    let early = plan(&every_2s(), "s", &rules, start, start + 1_500, false);
    assert!(early.fire.is_empty());
    assert_eq!(early.next_check_ms, Some(start + 2_000));
    let due = plan(&every_2s(), "s", &rules, start, start + 2_010, false);
    assert_eq!(due.fire, [start + 2_000]);
    assert_eq!(due.settled_through, Some(start + 2_000));
    let again = plan(&every_2s(), "s", &rules, start + 2_000, start + 2_020, false);
    assert!(again.fire.is_empty() && again.settled_through.is_none());
}

#[test]
fn catch_up_after_downtime_follows_the_policy() {
    let start = at("2025-01-01 00:00:00");
    let now = start + 60_500; // 30 ticks missed, the newest 0.5 s ago
    let none = plan(&every_2s(), "s", &policies(CatchUp::None, Overlap::Allow), start, now, false);
    // Only ticks still within the grace are on time.
    assert_eq!(none.fire, [start + 56_000, start + 58_000, start + 60_000]);
    // An hourly schedule looked at ten minutes late with `none`: the tick is dropped.
    let hourly = CronSchedule::parse("0 * * * *", "UTC").unwrap();
    let late = start + 3 * 3_600_000 + 600_000;
    let old = plan(&hourly, "h", &policies(CatchUp::None, Overlap::Allow), start, late, false);
    assert!(old.fire.is_empty() && old.dropped);
    assert_eq!(old.settled_through, Some(start + 3 * 3_600_000));
    let caught = plan(&hourly, "h", &policies(CatchUp::Latest, Overlap::Allow), start, late, false);
    assert_eq!(caught.fire, [start + 3 * 3_600_000]);
    let latest = plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Allow), start, now, false);
    assert_eq!(latest.fire, [start + 60_000]);
    let all = plan(&every_2s(), "s", &policies(CatchUp::All(100), Overlap::Allow), start, now, false);
    assert_eq!(all.fire, (1..=30).map(|i| start + i * 2_000).collect::<Vec<_>>());
    let bounded = plan(&every_2s(), "s", &policies(CatchUp::All(4), Overlap::Allow), start, now, false);
    assert_eq!(bounded.fire, [start + 54_000, start + 56_000, start + 58_000, start + 60_000]);
    assert_eq!(bounded.settled_through, Some(start + 60_000));
}

#[test]
fn overlap_skips_queues_or_allows_when_the_previous_run_is_live() {
    let start = at("2025-01-01 00:00:00");
    let now = start + 2_001;
    let skip = plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Skip), start, now, true);
    assert_eq!((skip.fire.len(), skip.skip.clone()), (0, vec![start + 2_000]));
    assert_eq!(skip.settled_through, Some(start + 2_000));
    let queue = plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Queue), start, now, true);
    assert!(queue.waiting && queue.fire.is_empty() && queue.settled_through.is_none());
    // When the run ends, the tick that waited fires (late, but caught up).
    let later =
        plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Queue), start, start + 2_900, false);
    assert_eq!(later.fire, [start + 2_000]);
    let allow = plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Allow), start, now, true);
    assert_eq!(allow.fire, [start + 2_000]);
    let idle = plan(&every_2s(), "s", &policies(CatchUp::Latest, Overlap::Skip), start, now, false);
    assert_eq!(idle.fire, [start + 2_000]);
}

#[test]
fn a_jittered_tick_fires_after_its_delay_and_keeps_its_scheduled_time() {
    let schedule = CronSchedule::parse("0 * * * * *", "UTC").unwrap();
    let start = at("2025-01-01 00:00:00");
    let rules = Policies::new(CatchUp::None, Overlap::Allow, 30_000).unwrap();
    let tick = start + 60_000;
    let delay = jitter_ms("j", tick, 30_000);
    let before = plan(&schedule, "j", &rules, start, tick + delay - 1, false);
    assert!(before.fire.is_empty());
    assert_eq!(before.next_check_ms, Some(tick + delay));
    let after = plan(&schedule, "j", &rules, start, tick + delay, false);
    assert_eq!(after.fire, [tick]);
}
