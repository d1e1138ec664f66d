//! `keel migrate` end to end: runs made with the quickstart are copied into a new data
//! directory, where a kernel serves them with their logs and audit chain; a target that
//! holds data, a source a kernel is using, an unverified copy and bad arguments are
//! refused with what to do.

use serde_json::Value;

use crate::harness::{Keel, sql};

/// Runs the quickstart offline in `keel`'s data directory; its run id.
fn quickstart(keel: &Keel) -> String {
    keel.ok(&[
        "run",
        "--llm-script",
        "examples/quickstart/script.json",
        "--",
        "python3",
        "examples/quickstart/agent.py",
    ]);
    keel.json(&["ps", "--json"])[0]["run_id"].as_str().expect("a run id").to_owned()
}

fn database(keel: &Keel) -> String {
    format!("sqlite:{}", keel.data.path().join("keel.db").display())
}

/// `keel migrate` that must fail; its stderr.
fn refused(keel: &Keel, args: &[&str]) -> String {
    let mut full = vec!["migrate"];
    full.extend_from_slice(args);
    let out = keel.run(&full);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "keel {full:?} succeeded:\n{}", String::from_utf8_lossy(&out.stdout));
    stderr
}

/// What a run looks like through the CLI, without what depends on the clock.
fn run_as_shown(keel: &Keel, run: &str) -> Value {
    let view = keel.inspect(run);
    serde_json::json!({
        "state": view["state"],
        "output": view["output"],
        "usage": view["usage"],
        "provider_calls": view["provider_calls"],
        "journal": view["journal"],
    })
}

#[test]
fn migrated_runs_are_served_from_the_copy_with_their_logs_and_audit() {
    let source = Keel::new();
    let first = quickstart(&source);
    let second = quickstart(&source);
    source.ok(&["tenant", "create", "acme", "--max-runs", "3"]);

    let copy = Keel::new();
    let out = source.ok(&["migrate", "--from", &database(&source), "--to", &database(&copy)]);
    assert!(out.contains("items copied and verified") && out.contains("audit chain intact"), "{out}");
    assert!(out.contains(&format!("keel --data-dir {} serve", copy.data.path().display())), "{out}");

    let runs = copy.json(&["ps", "--json"]);
    let ids: Vec<&str> = runs.as_array().unwrap().iter().map(|run| run["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [second.as_str(), first.as_str()], "the copy lists the same runs, newest first");
    for run in [&first, &second] {
        assert_eq!(run_as_shown(&copy, run), run_as_shown(&source, run), "run {run} as the copy shows it");
        assert_eq!(copy.inspect(run)["state"], "succeeded");
        let logs = copy.ok(&["logs", run]);
        assert!(logs.contains("[step 3/3]"), "the copy keeps the run's output: {logs}");
        assert_eq!(logs, source.ok(&["logs", run]));
    }
    assert!(copy.ok(&["tenant", "list"]).contains("acme"));
    let verified = copy.ok(&["audit", "verify"]);
    assert_eq!(verified, source.ok(&["audit", "verify"]), "the same chain and head");

    // The copy is a working store: a new run there journals and succeeds.
    let third = quickstart(&copy);
    assert_eq!(copy.inspect(&third)["state"], "succeeded");
    copy.ok(&["audit", "verify"]);

    // Copying again into the copy is refused: it holds data.
    let stderr = refused(&source, &["--from", &database(&source), "--to", &database(&copy)]);
    assert!(stderr.contains("already holds data") && stderr.contains("empty store"), "{stderr}");
}

#[test]
fn an_unverified_copy_is_refused_by_the_kernel_and_as_a_target() {
    let source = Keel::new();
    quickstart(&source);
    let copy = Keel::new();
    source.ok(&["migrate", "--from", &database(&source), "--to", &database(&copy)]);
    // As if the copy had been cut short: the marker still says it is being copied.
    sql(
        &copy.data.path().join("keel.db"),
        "UPDATE kv SET value = '{\"state\":\"copying\",\"from\":\"sqlite:/old/keel.db\"}' \
         WHERE scope = 'keel' AND key = 'migration'",
    );
    let out = copy.run(&["ps"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a kernel started on an unverified copy");
    assert!(
        stderr.contains("did not verify")
            && stderr.contains("must not be used")
            && stderr.contains("sqlite:/old/keel.db"),
        "{stderr}"
    );
    let stderr = refused(&source, &["--from", &database(&source), "--to", &database(&copy)]);
    assert!(stderr.contains("unfinished copy") && stderr.contains("delete it"), "{stderr}");
    let stderr = refused(&copy, &["--from", &database(&copy), "--to", "sqlite:/tmp/never-written.db"]);
    assert!(stderr.contains("cannot be copied") && stderr.contains("did not verify"), "{stderr}");
}

#[test]
fn a_source_in_use_by_a_kernel_is_refused() {
    let mut source = Keel::new();
    quickstart(&source);
    source.start_daemon();
    let target = tempfile::tempdir().unwrap();
    let to = format!("sqlite:{}", target.path().join("keel.db").display());
    let stderr = refused(&source, &["--from", &database(&source), "--to", &to]);
    assert!(
        stderr.contains("in use by a running kernel") && stderr.contains("stop the kernel using it"),
        "{stderr}"
    );
    source.kill_daemon();
    source.ok(&["migrate", "--from", &database(&source), "--to", &to]);
}

#[test]
fn bad_arguments_are_refused_with_what_to_do() {
    let keel = Keel::new();
    quickstart(&keel);
    let from = database(&keel);
    let dir = keel.data.path();
    let new = format!("sqlite:{}", dir.join("new.db").display());

    let stderr = refused(&keel, &["--from", &from, "--to", "mysql://db/keel"]);
    assert!(stderr.contains("unknown store scheme `mysql:`") && stderr.contains("sqlite:PATH"), "{stderr}");
    let stderr = refused(&keel, &["--from", "sqlite:/no/such/keel.db", "--to", &new]);
    assert!(stderr.contains("no such file"), "{stderr}");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "these are notes, not a database of any kind at all").unwrap();
    let stderr = refused(&keel, &["--from", &format!("sqlite:{}", text.display()), "--to", &new]);
    assert!(stderr.contains("not a keel database"), "{stderr}");
    let stderr = refused(&keel, &["--from", &from, "--to", &dir.join("./keel.db").display().to_string()]);
    assert!(stderr.contains("both name"), "{stderr}");
    // A database that cannot be reached is named, password hidden, with the cause.
    let stderr = refused(&keel, &["--from", &from, "--to", "postgres://keel:secret@127.0.0.1:1/keel"]);
    assert!(
        stderr.contains("unreachable")
            && stderr.contains("keel:***@127.0.0.1:1")
            && !stderr.contains("secret"),
        "{stderr}"
    );
    let stderr = refused(&keel, &["--from", &from]);
    assert!(stderr.contains("--to"), "{stderr}");
    assert!(!dir.join("new.db").exists(), "a refused migration writes no target");
}

#[test]
fn an_sqlite_installation_moves_to_postgres_and_a_node_serves_it() {
    let source = Keel::new();
    let first = quickstart(&source);
    source.ok(&["tenant", "create", "acme"]);
    let db = crate::cluster::TestDatabase::new();
    let out = source.ok(&["migrate", "--from", &database(&source), "--to", &db.url]);
    assert!(out.contains("items copied and verified") && out.contains("audit chain intact"), "{out}");
    // A second copy into the same database is refused: the target is no longer empty.
    let again = refused(&source, &["--from", &database(&source), "--to", &db.url]);
    assert!(again.contains("already holds data"), "{again}");

    let mut node = Keel::new();
    node.start_daemon_with(&["--store", &db.url, "--node-id", "moved"]);
    assert_eq!(run_as_shown(&node, &first), run_as_shown(&source, &first));
    assert_eq!(node.ok(&["logs", &first]), source.ok(&["logs", &first]));
    assert!(node.ok(&["tenant", "list"]).contains("acme"));
    let verify = node.run(&["audit", "verify"]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    // And it goes on: a new run on the node, journaled in Postgres.
    let run = node.detach(&[
        "--llm-script",
        "examples/quickstart/script.json",
        "--",
        "python3",
        "examples/quickstart/agent.py",
    ]);
    assert_eq!(node.wait_state(&run, &["succeeded", "failed"])["state"], "succeeded");
}
