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

/// Pids of live (not zombie) processes whose command line holds `marker`: the template
/// and the workers it forked (a fork keeps the command line).
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

/// A field of `/proc/<pid>/status`.
fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':').map(|value| value.trim().to_owned()))
}

/// The template (the marked process whose parent is `parent`) and its workers.
fn template_and_workers(marker: &str, parent: u32) -> (Option<u32>, Vec<u32>) {
    let (mut template, mut workers) = (None, Vec::new());
    for pid in processes_with(marker) {
        if status_field(pid, "PPid").and_then(|ppid| ppid.parse::<u32>().ok()) == Some(parent) {
            template = Some(pid);
        } else {
            workers.push(pid);
        }
    }
    (template, workers)
}

fn marked_pool(marker: &str, size: usize) -> keel_interp::Pool {
    let mut command = crate::worker_command();
    command.args.push(marker.to_owned());
    keel_interp::Pool::new(keel_interp::PoolConfig { worker: command, size })
}

/// A marked pool of one, once its warm worker is the only worker: the pool, its marker,
/// the template's pid and the worker's.
async fn one_warm_worker(test: &str) -> (keel_interp::Pool, String, u32, u32) {
    let marker = format!("--{test}-test-{}", std::process::id());
    let pool = marked_pool(&marker, 1);
    let me = std::process::id();
    wait_until("one warm worker alone", || {
        pool.stats().ready == 1 && template_and_workers(&marker, me).1.len() == 1
    })
    .await;
    let (template, workers) = template_and_workers(&marker, me);
    (pool, marker, template.expect("the template is our child"), workers[0])
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..250 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test]
async fn dropping_exec_kills_the_worker() {
    let marker = format!("--drop-test-{}", std::process::id());
    let pool = marked_pool(&marker, 0);
    let mut job = job(Lang::JavaScript, "for(;;){}");
    job.limits.timeout = Duration::from_secs(30);
    let tools = Tools::default();
    let mut exec = Box::pin(pool.exec(job, &tools));
    tokio::select! {
        _ = &mut exec => panic!("an endless loop finished"),
        () = tokio::time::sleep(Duration::from_millis(300)) => {}
    }
    let me = std::process::id();
    let (template, workers) = template_and_workers(&marker, me);
    assert!(template.is_some(), "the template is visible");
    assert_eq!(workers.len(), 1, "the running worker is visible");
    drop(exec);
    wait_until("the worker's death", || template_and_workers(&marker, me).1.is_empty()).await;
    still_serves(&pool, Lang::JavaScript).await;
}

/// Each worker is a fork of the template, confined before it says it is ready: seccomp
/// in filter mode, no_new_privs, and nothing open but its standard descriptors.
#[tokio::test]
async fn a_forked_worker_is_confined_and_holds_only_its_own_descriptors() {
    let (pool, _, template, worker) = one_warm_worker("confined").await;
    assert_eq!(status_field(worker, "PPid"), Some(template.to_string()), "forked by the template");
    assert_eq!(status_field(worker, "Seccomp").as_deref(), Some("2"));
    assert_eq!(status_field(worker, "NoNewPrivs").as_deref(), Some("1"));
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{worker}/fd"))
        .expect("the worker's fds")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"]);
    // The template itself runs no job and is not confined by the worker's filter.
    assert_eq!(status_field(template, "Seccomp").as_deref(), Some("0"));
    still_serves(&pool, Lang::Python).await;
}

/// A template that dies takes its warm workers with it; the pool starts another and
/// serves the next job.
#[tokio::test]
async fn a_template_that_dies_is_replaced() {
    let (pool, marker, template, _) = one_warm_worker("template").await;
    // SAFETY: a signal to our own child, which tokio has not reaped (it is alive).
    assert_eq!(unsafe { libc::kill(template as i32, libc::SIGKILL) }, 0);
    wait_until("the template's and its worker's death", || processes_with(&marker).is_empty()).await;
    still_serves(&pool, Lang::JavaScript).await;
    let stats = pool.stats();
    assert_eq!(stats.templates, 2, "{stats:?}");
    assert!(stats.crashed >= 1, "the warm worker that died is counted: {stats:?}");
}

/// The environment variable under which [`host_a_pool_and_wait`] runs.
const HOST_MARKER: &str = "KEEL_INTERP_TEST_HOST_MARKER";

/// Not a test of its own: the body of the process [`workers_die_with_the_process_that_started_the_pool`]
/// kills. Without its variable it returns at once.
#[test]
fn host_a_pool_and_wait() {
    let Ok(marker) = std::env::var(HOST_MARKER) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let pool = marked_pool(&marker, 1);
        let mut job = job(Lang::JavaScript, "for(;;){}");
        job.limits.timeout = Duration::from_secs(60);
        let tools = Tools::default();
        let exec = pool.exec(job, &tools);
        println!("hosting");
        exec.await;
    });
}

/// The pool's processes set their own death signals (it spawns without a `pre_exec`
/// hook): when the process that holds the pool is SIGKILLed, the template dies with it
/// and every worker with the template, the busy one as well as the warm one.
#[test]
fn workers_die_with_the_process_that_started_the_pool() {
    use std::io::{BufRead, BufReader};
    let marker = format!("--orphan-test-{}", std::process::id());
    let mut host = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "pool::host_a_pool_and_wait", "--nocapture", "--test-threads=1"])
        .env(HOST_MARKER, &marker)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the host");
    let mut lines = BufReader::new(host.stdout.take().expect("piped"));
    let mut line = String::new();
    while !line.contains("hosting") {
        line.clear();
        assert_ne!(lines.read_line(&mut line).expect("reading the host"), 0, "the host ended early");
    }
    let host_pid = host.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    // The template, the busy worker and the warm one.
    while processes_with(&marker).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the host's pool did not start: {:?}",
            processes_with(&marker)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (template, workers) = template_and_workers(&marker, host_pid);
    assert!(template.is_some() && workers.len() == 2, "{template:?} {workers:?}");
    host.kill().expect("killing the host");
    host.wait().expect("reaping the host");
    runtime.block_on(wait_until("the death of every process of the pool", || {
        processes_with(&marker).is_empty()
    }));
}

/// A template whose parent is not the pool that started it (the pool died before the
/// template could set its death signal) stops before it says it is ready.
#[test]
fn a_template_whose_pool_is_gone_does_not_start() {
    let output = std::process::Command::new(crate::worker_command().program)
        .env(keel_interp::worker::PARENT_ENV, "1")
        .stdin(std::process::Stdio::piped())
        .output()
        .expect("running the worker program");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("(pid 1) is gone") && output.stdout.is_empty(), "{stderr}");
}

/// A worker program that is missing, or exits instead of serving as the template, fails
/// the job with what went wrong; the pool is not left waiting.
#[tokio::test]
async fn a_worker_program_that_does_not_start_fails_the_job_clearly() {
    for (program, expected) in [
        ("/nonexistent/keel-worker", "spawn /nonexistent/keel-worker: No such file or directory"),
        ("/bin/false", "the interpreter template /bin/false did not start (exited with 1)"),
    ] {
        let command = keel_interp::WorkerCommand { program: program.into(), args: Vec::new() };
        let pool = keel_interp::Pool::new(keel_interp::PoolConfig { worker: command, size: 0 });
        let outcome = pool.exec(job(Lang::Python, "1"), &Tools::default()).await;
        assert_eq!(kind(&outcome), Some(ExecErrorKind::WorkerCrashed), "{outcome:?}");
        let error = outcome.result.err().map(|error| error.to_string()).unwrap_or_default();
        assert!(
            error.contains("could not start an interpreter worker") && error.contains(expected),
            "{error}"
        );
    }
}
