//! Issue 11: a closed stdout ends every `keel` command quietly (`keel ps --json | head -1`
//! panicked with "failed printing to stdout: Broken pipe" and a backtrace).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Keel, wait_for};

/// An agent that prints `lines` numbered lines of 100 bytes (forever when 0), 20 ms apart
/// when `pace` is set.
fn printer(lines: u32, pace: bool) -> Vec<String> {
    let script = format!(
        "import itertools, sys, time\n\
         for i in (itertools.count() if {lines} == 0 else range({lines})):\n\
         \x20   print(f'line {{i:06}} ' + 'x' * 88, flush=True)\n\
         \x20   if {pace}: time.sleep(0.02)\n",
        pace = if pace { "True" } else { "False" }
    );
    vec!["python3".into(), "-c".into(), script]
}

/// Waits for `child` (whose stdout reader is gone) to exit and asserts it ended as a
/// Unix tool does on a closed pipe: status 0, nothing about it on stderr.
fn assert_quiet_exit(what: &str, mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for keel") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{what}: keel kept running after its stdout was closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).expect("read stderr");
    }
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe") && !stderr.contains("keel:"),
        "{what}: keel complained about the closed pipe:\n{stderr}"
    );
    assert!(status.success(), "{what}: a closed stdout is a quiet, successful end; got {status}\n{stderr}");
}

/// Starts `keel args` with stdout and stderr piped.
fn spawn(keel: &Keel, args: &[&str]) -> Child {
    keel.cmd().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn keel")
}

/// Reads one line of `child`'s stdout, then closes the read end.
fn read_one_line_and_close(child: &mut Child) -> String {
    let mut reader = BufReader::new(child.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("read a line");
    line
}

#[test]
fn issue_11_a_closed_stdout_ends_listings_and_logs_quietly() {
    let mut keel = Keel::new();
    keel.start_daemon();
    // 3000 lines of 100 bytes: far more than a pipe holds, so the writes after the
    // reader has gone fail for sure.
    let mut args = vec!["run", "--detach", "--json", "--sandbox", "none", "--"];
    let command = printer(3000, false);
    args.extend(command.iter().map(String::as_str));
    let run = keel.json(&args)["run_id"].as_str().expect("run_id").to_owned();
    keel.wait_state(&run, &["succeeded"]);
    for _ in 0..3 {
        keel.detach(&["--sandbox", "none", "--", "true"]);
    }

    // The read end closed before keel writes anything.
    for args in [
        vec!["ps", "--json"],
        vec!["ps"],
        vec!["inspect", run.as_str(), "--json"],
        vec!["logs", run.as_str()],
        vec!["tools"],
        vec!["audit", "export"],
    ] {
        let mut child = spawn(&keel, &args);
        drop(child.stdout.take());
        assert_quiet_exit(&format!("keel {}", args.join(" ")), child);
    }

    // `keel logs RUN | head -1`: one line read, then the reader goes away mid-listing.
    for args in [vec!["logs", run.as_str()], vec!["logs", run.as_str(), "--json"]] {
        let mut child = spawn(&keel, &args);
        let line = read_one_line_and_close(&mut child);
        assert!(!line.is_empty(), "keel {args:?} printed nothing");
        assert_quiet_exit(&format!("keel {}", args.join(" ")), child);
    }
}

#[test]
fn issue_11_a_closed_stdout_ends_following_quietly() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let command = printer(0, true);
    let mut args = vec!["run", "--detach", "--json", "--sandbox", "none", "--"];
    args.extend(command.iter().map(String::as_str));
    let run = keel.json(&args)["run_id"].as_str().expect("run_id").to_owned();

    // `keel logs -f RUN | head -1` on a run that prints forever.
    let mut child = spawn(&keel, &["logs", &run, "--follow"]);
    let line = read_one_line_and_close(&mut child);
    assert!(line.starts_with("line 0"), "{line}");
    assert_quiet_exit("keel logs --follow", child);

    // `keel run -- agent | head -1` in the foreground (against the daemon, which keeps
    // the run; the closed pipe ends only the follower).
    let mut args = vec!["run", "--sandbox", "none", "--"];
    args.extend(command.iter().map(String::as_str));
    let mut child = spawn(&keel, &args);
    let line = read_one_line_and_close(&mut child);
    assert!(line.starts_with("line 0"), "{line}");
    assert_quiet_exit("keel run (foreground)", child);

    for view in keel.json(&["ps", "--json"]).as_array().expect("runs") {
        let id = view["run_id"].as_str().expect("run_id");
        keel.ok(&["stop", id, "--grace", "0"]);
    }
    wait_for("every run to end", || {
        let runs = keel.json(&["ps", "--json"]);
        runs.as_array()?.iter().all(|r| r["state"] == "cancelled").then_some(())
    });
}
