//! The process sandbox through the real `keel` binary: what an agent sees, that the whole
//! tree dies on stop and with the daemon, volumes, refusals, `keel doctor`, the pool.
//! Escape attempts are in `sandbox_escape.rs`.

use serde_json::Value;

use crate::harness::{Keel, agent, wait_for};

/// Host processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .filter(|&pid| crate::harness::alive(pid))
        .collect()
}

/// A marker no other process on the host carries.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

#[test]
fn the_agent_sees_its_working_directory_a_workspace_and_keels_paths() {
    let keel = Keel::new();
    let script = "import json, os, socket, sys; print(json.dumps({'cwd': os.getcwd(), 'home': os.environ['HOME'], \
                  'socket': os.environ['KEEL_SOCKET'], 'pythonpath': os.environ['PYTHONPATH'], \
                  'host': socket.gethostname(), 'pid': os.getpid(), 'tmp': os.access('/tmp', os.W_OK), \
                  'cwd_writable': os.access('.', os.W_OK)}))";
    let out = keel.run(&["run", "--quiet", "--", "python3", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["cwd"], crate::harness::repo_root().display().to_string(), "same path as on the host");
    assert_eq!(seen["home"], "/workspace");
    assert_eq!(seen["socket"], "/run/keel/syscall.sock");
    assert_eq!(seen["pythonpath"], "/run/keel/sdk");
    assert_eq!(seen["host"], "keel");
    assert_eq!(seen["pid"], 2, "the agent is the first process after the sandbox's init");
    assert_eq!((seen["tmp"].clone(), seen["cwd_writable"].clone()), (Value::Bool(true), Value::Bool(false)));
    // The run records the sandbox tier.
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().unwrap().to_owned();
    let logs = keel.ok(&["logs", &run, "--json"]);
    assert!(logs.contains(r#""sandbox":"process""#), "{logs}");
}

#[test]
fn stop_kills_every_process_of_a_sandbox() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let marker = unique("stubborn");
    // stubborn.py ignores SIGTERM in itself and its child, and sleeps forever.
    let run = keel.detach(&["--", "python3", &agent("stubborn.py"), &marker]);
    let pids = wait_for("the agent and its child", || {
        let pids = processes_with(&marker);
        (pids.len() == 2).then_some(pids)
    });
    let view = keel.inspect(&run);
    let init = view["pid"].as_u64().unwrap() as u32;
    assert!(!pids.contains(&init), "the recorded pid is the sandbox's init, in the kernel's pid namespace");
    let stopped = keel.json(&["stop", &run, "--grace", "1", "--json"]);
    assert_eq!(stopped["state"], "cancelled");
    wait_for("every process of the sandbox to die", || processes_with(&marker).is_empty().then_some(()));
    assert!(!crate::harness::alive(init));
}

#[test]
fn sandboxes_die_with_a_sigkilled_daemon_and_come_back_with_the_next() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let marker = unique("orphan");
    let run = keel.detach(&["--", "python3", &agent("stubborn.py"), &marker]);
    wait_for("the agent and its child", || (processes_with(&marker).len() == 2).then_some(()));
    keel.kill_daemon();
    wait_for("the sandbox to die with the daemon", || processes_with(&marker).is_empty().then_some(()));
    keel.start_daemon();
    wait_for("the run to be relaunched in a new sandbox", || {
        (processes_with(&marker).len() == 2).then_some(())
    });
    let view = keel.inspect(&run);
    assert!(view["attempt"].as_u64().unwrap() >= 2, "{view}");
    keel.ok(&["stop", &run, "--grace", "0"]);
    wait_for("the relaunched sandbox to die on stop", || processes_with(&marker).is_empty().then_some(()));
}

#[test]
fn volumes_keep_a_workspace_across_runs() {
    let keel = Keel::new();
    let append = "open('/data/notes', 'a').write('x'); print(open('/data/notes').read())";
    for expected in ["x", "xx"] {
        let out = keel.run(&["run", "--quiet", "--volume", "notes:/data", "--", "python3", "-c", append]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected);
    }
    let on_host = std::fs::read_to_string(keel.data.path().join("volumes/notes/notes")).unwrap();
    assert_eq!(on_host, "xx");
    // Without the volume, /workspace is fresh scratch space.
    let out =
        keel.run(&["run", "--quiet", "--", "python3", "-c", "import os; print(os.listdir('/workspace'))"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn the_working_directory_is_writable_only_when_asked() {
    let keel = Keel::new();
    let project = tempfile::tempdir().unwrap();
    let write = "open('made-inside', 'w').write('hello')";
    let run = |extra: &[&str]| {
        keel.cmd()
            .current_dir(project.path())
            .args(["run", "--quiet"])
            .args(extra)
            .args(["--", "python3", "-c", write])
            .output()
            .unwrap()
    };
    assert!(!run(&[]).status.success(), "read-only by default");
    assert!(!project.path().join("made-inside").exists());
    let out = run(&["--writable-cwd"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(project.path().join("made-inside")).unwrap(), "hello");
}

#[test]
fn tier_none_refuses_limits_it_cannot_enforce() {
    let keel = Keel::new();
    let out = keel.run(&["run", "--sandbox", "none", "--memory", "64M", "--", "true"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tier `none`") && stderr.contains("memory"), "{stderr}");
    assert_eq!(keel.json(&["ps", "--json"]), serde_json::json!([]), "a refused run is never created");

    let out = keel.run(&["run", "--network", "none", "--allow-host", "x.example", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("allowlist"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = keel.run(&["run", "--volume", "../escape:/data", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("volume name"));
    let out = keel.run(&["run", "--volume", "ok:/proc/x", "--", "true"]);
    assert!(!out.status.success());
}

#[test]
fn tier_none_is_there_when_asked_for() {
    let keel = Keel::new();
    let out = keel.run(&[
        "run",
        "--quiet",
        "--sandbox",
        "none",
        "--",
        "python3",
        "-c",
        "import os; print(os.getpid() > 2)",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "True");
}

#[test]
fn doctor_proves_the_sandbox_and_lists_each_profile() {
    let keel = Keel::new();
    let report = keel.json(&["doctor", "--json"]);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["trial"]["ok"], true, "{report}");
    assert!(report["host"]["landlock_abi"].as_i64().unwrap() >= 1);
    let profiles = report["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 3);
    for profile in profiles {
        let controls: Vec<&str> =
            profile["controls"].as_array().unwrap().iter().map(|c| c["control"].as_str().unwrap()).collect();
        for control in ["namespaces", "filesystem", "landlock", "seccomp", "memory", "pids", "network"] {
            assert!(controls.contains(&control), "{control} missing in {profile}");
        }
    }
    let text = keel.ok(&["doctor"]);
    assert!(text.contains("trial sandbox") && text.contains("profile limited"), "{text}");
}

#[test]
fn pooled_sandboxes_run_each_job_with_its_own_environment() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox-pool", "2"]);
    let script = "import os; print(os.environ['WHO'], os.getpid())";
    let mut pooled = 0;
    // The pool refills in the background; a few runs are enough for two claims.
    for who in (0..20).map(|i| format!("run{i}")) {
        if pooled >= 2 {
            break;
        }
        let env = format!("WHO={who}");
        let run = keel.detach(&["--env", &env, "--", "python3", "-c", script]);
        let done = keel.wait_state(&run, &["succeeded", "failed"]);
        assert_eq!(done["state"], "succeeded", "{done}");
        let logs = keel.ok(&["logs", &run, "--json"]);
        let events: Vec<Value> = logs.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let stdout: Vec<&str> = events
            .iter()
            .filter(|e| e["kind"] == "stdout")
            .filter_map(|e| e["data"]["line"].as_str())
            .collect();
        assert_eq!(stdout, [format!("{who} 2")], "each job gets a fresh sandbox with its own environment");
        let launch = events.iter().find(|e| e["kind"] == "launch").unwrap();
        if launch["data"]["pooled"] == true {
            pooled += 1;
        }
    }
    assert!(pooled >= 2, "later runs claim ready sandboxes");
}

#[test]
fn a_program_that_cannot_exec_fails_its_run_also_from_the_pool() {
    use std::os::unix::fs::PermissionsExt;
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox-pool", "1"]);
    let project = tempfile::tempdir().unwrap();
    let program = project.path().join("tool");
    let install = |text: &str| {
        std::fs::write(&program, text).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // Runs ./tool until a run claims a pooled sandbox; returns that run's view.
    let run_until_pooled = || {
        for _ in 0..20 {
            let out = keel
                .cmd()
                .current_dir(project.path())
                .args(["run", "--detach", "--json", "--", "./tool"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let run: Value = serde_json::from_slice(&out.stdout).unwrap();
            let run = run["run_id"].as_str().unwrap().to_owned();
            let done = keel.wait_state(&run, &["failed", "succeeded"]);
            if keel.ok(&["logs", &run, "--json"]).contains(r#""pooled":true"#) {
                return done;
            }
        }
        panic!("no run claimed a pooled sandbox");
    };
    install("#!/bin/sh\necho fine\n");
    assert_eq!(run_until_pooled()["state"], "succeeded");
    // The same configuration, but the program can no longer be exec'd.
    install("this is not an executable format");
    let done = run_until_pooled();
    assert_eq!(done["state"], "failed");
    assert!(done["error"].as_str().unwrap().contains("could not start"), "{done}");
}
