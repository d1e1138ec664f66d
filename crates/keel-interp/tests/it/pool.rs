//! Happy paths and pool mechanics.

use std::{sync::atomic::Ordering, time::Duration};

use keel_interp::{ExecErrorKind, Lang};
use serde_json::json;

use crate::{Tools, job, kind, pool, still_serves};

#[tokio::test]
async fn ten_tool_calls_with_inputs_stdout_and_caught_errors() {
    let pool = pool(2);
    let tools = Tools::default();
    let python = "total = 0\nfor i in range(n):\n    total += word_count(text='a b ' * i)\nprint('total', total)\n\
                  try:\n    fail()\nexcept RuntimeError as e:\n    caught = str(e)\n{'total': total, 'caught': caught, \
                  'file': fs.read(path='a.txt')}";
    let mut python = job(Lang::Python, python);
    python.inputs.insert("n".to_owned(), json!(10));
    let outcome = pool.exec(python, &tools).await;
    assert_eq!(
        outcome.result,
        Ok(json!({"total": 90, "caught": "disk on fire", "file": "contents of a.txt"}))
    );
    assert_eq!(outcome.stdout, "total 90\n");
    assert_eq!(outcome.tool_calls.len(), 12);
    assert!(!outcome.tool_calls[10].ok);

    let javascript = "let total = 0; for (let i = 0; i < n; i++) total += word_count({text: 'a b '.repeat(i)});\n\
                      console.log('total', total); let caught; try { fail() } catch (e) { caught = e.message }\n\
                      ({total, caught, file: fs.read({path: 'a.txt'}), mcp: mcp.fs.read_file({path: 'x'})})";
    let mut javascript = job(Lang::JavaScript, javascript);
    javascript.inputs.insert("n".to_owned(), json!(10));
    let outcome = pool.exec(javascript, &tools).await;
    assert_eq!(
        outcome.result,
        Ok(json!({"total": 90, "caught": "disk on fire", "file": "contents of a.txt", "mcp": {"path": "x"}}))
    );
    assert_eq!(outcome.stdout, "total 90\n");
    assert_eq!(tools.calls.load(Ordering::Relaxed), 25);
}

#[tokio::test]
async fn workers_are_single_use_and_kept_warm() {
    let pool = pool(2);
    let tools = Tools::default();
    for _ in 0..3 {
        let outcome = pool.exec(job(Lang::Python, "x = 1\nx"), &tools).await;
        assert_eq!(outcome.result, Ok(json!(1)));
        // A global set by the previous job must not be visible.
        let outcome = pool.exec(job(Lang::JavaScript, "typeof leaked"), &tools).await;
        assert_eq!(outcome.result, Ok(json!("undefined")));
        let outcome = pool.exec(job(Lang::JavaScript, "globalThis.leaked = 1; 1"), &tools).await;
        assert_eq!(outcome.result, Ok(json!(1)));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = pool.stats();
    assert_eq!(stats.ready, 2, "{stats:?}");
    assert!(stats.started >= 11, "{stats:?}");
    assert_eq!(stats.crashed, 0, "{stats:?}");
}

#[tokio::test]
async fn a_tool_that_never_returns_hits_the_overall_cap() {
    let pool = pool(1);
    for (lang, code) in [(Lang::Python, "hang()"), (Lang::JavaScript, "hang({})")] {
        let mut job = job(lang, code);
        job.limits.timeout = Duration::from_millis(100);
        let started = std::time::Instant::now();
        let outcome = pool.exec(job, &Tools::default()).await;
        assert_eq!(kind(&outcome), Some(ExecErrorKind::Timeout), "{outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        still_serves(&pool, lang).await;
    }
}

#[tokio::test]
async fn tool_waits_do_not_count_against_the_interpreter_timeout() {
    struct Slow;
    #[async_trait::async_trait]
    impl keel_interp::ToolHandler for Slow {
        async fn call(&self, _: &str, args: serde_json::Value) -> Result<serde_json::Value, String> {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok(args)
        }
    }
    let pool = pool(1);
    for (lang, code) in
        [(Lang::Python, "echo(a=1)\necho(a=2)\n3"), (Lang::JavaScript, "echo({}); echo({}); 3")]
    {
        let mut job = job(lang, code);
        job.limits.timeout = Duration::from_millis(200);
        let outcome = pool.exec(job, &Slow).await;
        assert_eq!(outcome.result, Ok(json!(3)), "{lang}");
    }
}

/// Pids of live (not zombie) processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn dropping_exec_kills_the_worker() {
    let marker = format!("--drop-test-{}", std::process::id());
    let mut command = crate::worker_command();
    command.args.push(marker.clone());
    let pool = keel_interp::Pool::new(keel_interp::PoolConfig { worker: command, size: 0 });
    let mut job = job(Lang::JavaScript, "for(;;){}");
    job.limits.timeout = Duration::from_secs(30);
    let tools = Tools::default();
    let mut exec = Box::pin(pool.exec(job, &tools));
    tokio::select! {
        _ = &mut exec => panic!("an endless loop finished"),
        () = tokio::time::sleep(Duration::from_millis(300)) => {}
    }
    assert_eq!(processes_with(&marker).len(), 1, "the running worker is visible");
    drop(exec);
    let mut alive = processes_with(&marker);
    for _ in 0..50 {
        if alive.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        alive = processes_with(&marker);
    }
    assert!(alive.is_empty(), "workers still running after the exec future was dropped: {alive:?}");
    still_serves(&pool, Lang::JavaScript).await;
}

/// The pool spawns without a `pre_exec` hook, so each worker sets its own death signal:
/// a worker whose parent is SIGKILLed dies with it.
#[test]
fn a_worker_dies_with_the_process_that_started_it() {
    use std::io::{BufRead, BufReader};
    let marker = format!("--orphan-test-{}", std::process::id());
    let worker = crate::worker_command().program;
    // The shell starts the worker in the background with the shell's stdin (held open
    // here, so the worker waits for a job; a background job's own stdin would be
    // /dev/null), prints its pid and waits: the worker's parent is the shell, `$$`.
    let script = format!(
        r#"exec 3<&0; {}=$$ "$0" {marker} <&3 3<&- & echo "$!"; wait"#,
        keel_interp::worker::PARENT_ENV
    );
    let mut shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&worker)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting sh");
    let mut lines = BufReader::new(shell.stdout.take().expect("piped"));
    let (mut pid, mut ready) = (None, false);
    while pid.is_none() || !ready {
        let mut line = String::new();
        assert_ne!(lines.read_line(&mut line).expect("reading the shell"), 0, "the shell ended early");
        match line.trim().parse::<u32>() {
            Ok(number) => pid = Some(number),
            Err(_) => {
                assert!(line.contains("\"ready\""), "the worker did not start: {line}");
                ready = true;
            }
        }
    }
    let pid = pid.expect("the shell printed the worker's pid");
    // The shell's command line holds the marker too.
    let worker_alive = || processes_with(&marker).contains(&pid);
    assert!(worker_alive(), "the waiting worker {pid} is visible");
    // Held until the end: `wait` would close it, and the worker would exit on the EOF.
    let _job_pipe = shell.stdin.take();
    shell.kill().expect("killing the shell");
    shell.wait().expect("reaping the shell");
    for _ in 0..100 {
        if !worker_alive() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("worker {pid} outlived its parent by 2 s");
}

/// A worker whose parent is not the pool that asked for it (the pool died before the
/// worker could set its death signal) stops before it says it is ready.
#[test]
fn a_worker_whose_pool_is_gone_does_not_start() {
    let output = std::process::Command::new(crate::worker_command().program)
        .env(keel_interp::worker::PARENT_ENV, "1")
        .stdin(std::process::Stdio::piped())
        .output()
        .expect("running the worker");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("(pid 1) is gone") && !stdout.contains("ready"), "{stdout}");
}
