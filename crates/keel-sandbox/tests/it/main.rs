//! Launching through real tiers (`none` and `process`): what reaches the program's stdin;
//! and for `none`, what the program starts with, that it dies with its launcher but not
//! with the thread that launched it, and that a launch given up leaves nothing running.
//! The process tier re-executes this binary as its zygote, so `main` hands over to it
//! first and otherwise runs the tests itself (`harness = false`);
//! `cargo test -p keel-sandbox --test it NAME` runs the tests whose name contains NAME.

use std::future::Future;
use std::pin::Pin;

use keel_sandbox::{
    LaunchSpec, Launched, NoSandbox, PoolStatus, ProcessConfig, ProcessSandbox, Profile, Sandbox,
};
use tokio::io::AsyncReadExt;

type Test = (&'static str, fn() -> Pin<Box<dyn Future<Output = ()> + Send>>);

const TESTS: &[Test] = &[
    ("stdin_bytes_reach_the_program_without_a_sandbox", || Box::pin(stdin_reaches(Tier::None))),
    ("stdin_bytes_reach_the_program_in_the_process_sandbox", || Box::pin(stdin_reaches(Tier::Process))),
    ("stdin_bytes_reach_a_program_in_a_pooled_sandbox", || Box::pin(stdin_reaches(Tier::Pooled))),
    ("without_stdin_bytes_stdin_is_closed_without_a_sandbox", || Box::pin(no_stdin(Tier::None))),
    ("without_stdin_bytes_stdin_is_closed_in_the_process_sandbox", || Box::pin(no_stdin(Tier::Process))),
    ("without_stdin_bytes_stdin_is_closed_in_a_pooled_sandbox", || Box::pin(no_stdin(Tier::Pooled))),
    ("without_a_sandbox_the_program_starts_clean", || Box::pin(starts_clean())),
    ("without_a_sandbox_the_exit_status_is_the_programs", || Box::pin(exit_status())),
    ("without_a_sandbox_a_missing_program_is_an_error", || Box::pin(missing_program())),
    ("without_a_sandbox_the_program_dies_with_its_launcher", || Box::pin(dies_with_launcher())),
    ("without_a_sandbox_the_program_outlives_the_thread_that_launched_it", || {
        Box::pin(outlives_launching_thread())
    }),
    ("without_a_sandbox_a_launch_given_up_leaves_no_program", || Box::pin(given_up_launch())),
];

/// Given as the first argument, this binary launches `sleep 600` without a sandbox, prints
/// its pid and waits to be killed (`dies_with_launcher`).
const LAUNCH_AND_WAIT: &str = "--launch-sleep-and-wait";

fn main() {
    keel_sandbox::zygote::run_if_requested();
    if std::env::args().nth(1).as_deref() == Some(LAUNCH_AND_WAIT) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let launched = NoSandbox.launch(spec(&["sleep", "600"], None)).await.unwrap();
            println!("{}", launched.pid);
            std::future::pending::<()>().await;
        });
    }
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in TESTS {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        match runtime.block_on(async { tokio::spawn(test()).await }) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    println!("\n{ran} tests, {} failed", failed.len());
    if !failed.is_empty() {
        println!("failed: {failed:?}");
        std::process::exit(1);
    }
}

#[derive(Clone, Copy, Debug)]
enum Tier {
    None,
    Process,
    /// The process tier with a pool, launching into a sandbox built before the job.
    Pooled,
}

fn spec(command: &[&str], stdin: Option<Vec<u8>>) -> LaunchSpec {
    LaunchSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        cwd: std::env::temp_dir(),
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("KEEL_RUN_ID".into(), format!("keel-sandbox-stdin-{}", std::process::id())),
        ],
        run_marker: format!("keel-sandbox-stdin-{}", std::process::id()),
        stdin,
        ..LaunchSpec::default()
    }
}

/// Launches `spec` in `tier` and returns (stdout, whether a pooled sandbox was used), or
/// `None` when this host cannot run the tier.
async fn launch(tier: Tier, spec: LaunchSpec) -> Option<(Vec<u8>, bool)> {
    let sandbox: Box<dyn Sandbox> = match tier {
        Tier::None => Box::new(NoSandbox),
        Tier::Process => Box::new(ProcessSandbox::new(ProcessConfig::default())),
        Tier::Pooled => {
            let sandbox = ProcessSandbox::new(ProcessConfig { pool_size: 1, ..ProcessConfig::default() });
            assert_eq!(sandbox.pool_status(), PoolStatus { warm: 0, target: 0 }, "no configuration yet");
            if sandbox.check(&Profile::default()).is_ok() {
                sandbox.prewarm(&spec).await.unwrap();
                assert_eq!(sandbox.ready(&spec), 1);
                // One configuration kept warm, at the pool's size of one.
                assert_eq!(sandbox.pool_status(), PoolStatus { warm: 1, target: 1 });
            }
            Box::new(sandbox)
        }
    };
    if let Err(err) = sandbox.check(&Profile::default()) {
        println!("skipped: this host cannot run the {tier:?} tier: {err}");
        return None;
    }
    let Launched { mut child, pooled, .. } = sandbox.launch(spec).await.unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{status}: {:?}", child.ended_by());
    sandbox.shutdown().await;
    Some((out, pooled))
}

async fn stdin_reaches(tier: Tier) {
    // More than a pipe buffer, so the write cannot complete before the program reads.
    let mut bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    bytes.extend_from_slice(b"\nthe end\n");
    let Some((out, pooled)) = launch(tier, spec(&["cat"], Some(bytes.clone()))).await else { return };
    assert_eq!(pooled, matches!(tier, Tier::Pooled));
    assert_eq!(out.len(), bytes.len());
    assert!(out == bytes, "cat echoed what it was given");
}

async fn no_stdin(tier: Tier) {
    // stdin is /dev/null, as before stdin existed: reading ends at once.
    let script = "import os, sys; data = sys.stdin.buffer.read(); st = os.fstat(0); \
                  print(len(data), os.major(st.st_rdev), os.minor(st.st_rdev))";
    let Some((out, _)) = launch(tier, spec(&["python3", "-c", script], None)).await else { return };
    assert_eq!(String::from_utf8_lossy(&out).trim(), "0 1 3", "stdin is /dev/null (char device 1:3)");
}

/// Runs `script` with python3 without a sandbox; returns its stdout and exit status.
async fn python(script: &str) -> (String, std::process::ExitStatus) {
    let mut launched = NoSandbox.launch(spec(&["python3", "-c", script], None)).await.unwrap();
    let mut out = Vec::new();
    launched.child.stdout.take().unwrap().read_to_end(&mut out).await.unwrap();
    let status = launched.child.wait().await.unwrap();
    (String::from_utf8_lossy(&out).into_owned(), status)
}

async fn starts_clean() {
    // Its own process group; no signal blocked or ignored (the kernel ignores SIGPIPE, and
    // blocks every signal for a moment while it starts a program); none of the
    // launcher's close-on-exec fds; the working directory, arguments and environment it
    // was given. (Not Python: it ignores SIGPIPE and SIGXFSZ itself.)
    let held = std::fs::File::open("/dev/null").unwrap();
    let held = std::os::fd::AsRawFd::as_raw_fd(&held);
    // Without close-on-exec too (a library's careless open): the agent starts from a
    // table of its own, not a copy of ours.
    // SAFETY: a path literal; the fd is closed below.
    let inheritable = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
    assert!(inheritable > 2);
    let script = r#"test "$(ps -o pgid= $$)" -eq $$ && echo own-group
        grep -E '^Sig(Blk|Ign)' /proc/self/status | tr -s '\t' ' '
        ls /proc/self/fd | tr '\n' ' '; echo
        test "$(pwd -P)" = "$(cd "$EXPECTED_CWD" && pwd -P)" && echo cwd "$1" "$2" "$KEEL_RUN_ID""#;
    let mut spec = spec(&["sh", "-c", script, "sh", "one", "two words"], None);
    spec.env.push(("EXPECTED_CWD".into(), std::env::temp_dir().display().to_string()));
    let marker = spec.run_marker.clone();
    let mut launched = NoSandbox.launch(spec).await.unwrap();
    let mut out = Vec::new();
    launched.child.stdout.take().unwrap().read_to_end(&mut out).await.unwrap();
    let status = launched.child.wait().await.unwrap();
    assert!(status.success(), "{status}");
    let out = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "own-group", "{out}");
    assert_eq!(lines[1..3], ["SigBlk: 0000000000000000", "SigIgn: 0000000000000000"], "{out}");
    let mut fds: Vec<i32> = lines[3].split_whitespace().map(|fd| fd.parse().unwrap()).collect();
    fds.sort_unstable();
    assert!(fds.starts_with(&[0, 1, 2]) && !fds.contains(&held), "fd {held} leaked: {out}");
    assert!(!fds.contains(&inheritable), "fd {inheritable} (not close-on-exec) leaked: {out}");
    // SAFETY: opened above, owned by nothing else.
    unsafe { libc::close(inheritable) };
    assert_eq!(lines[4], format!("cwd one two words {marker}"), "{out}");
}

async fn exit_status() {
    let (_, status) = python("import sys; sys.exit(7)").await;
    assert_eq!(status.code(), Some(7));
    let (_, status) = python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)").await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM));
}

async fn missing_program() {
    let Err(err) = NoSandbox.launch(spec(&["no-such-program-keel"], None)).await else {
        panic!("a missing program started")
    };
    assert_eq!(
        err.to_string(),
        "could not start \"no-such-program-keel\": No such file or directory (os error 2)"
    );
    let Err(err) = NoSandbox.launch(spec(&["/etc/passwd"], None)).await else {
        panic!("a file that is not executable started")
    };
    assert!(err.to_string().contains("Permission denied"), "{err}");
}

async fn dies_with_launcher() {
    let mut launcher = std::process::Command::new(std::env::current_exe().unwrap())
        .arg(LAUNCH_AND_WAIT)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(launcher.stdout.take().unwrap()), &mut line)
        .unwrap();
    let pid: i32 = line.trim().parse().unwrap();
    let alive = || running(pid);
    assert!(alive(), "the program runs while its launcher does");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive() {
        assert!(std::time::Instant::now() < deadline, "the program outlived its launcher");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// An agent dies with the kernel (PR_SET_PDEATHSIG), which the kernel of Linux ties to
/// the *thread* that started it: one started from a thread that then ended (a runtime's
/// worker, a pool's thread) would be killed with it.
async fn outlives_launching_thread() {
    let pid = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let launched = runtime.block_on(NoSandbox.launch(spec(&["sleep", "600"], None))).unwrap();
        let pid = launched.pid as i32;
        // Nothing of this runtime may wait for it: the test reaps it.
        std::mem::forget(launched);
        pid
    })
    .join()
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let alive = running(pid);
    // SAFETY: our own child, in its own process group; `status` is a valid out-pointer.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
    assert!(alive, "the agent died with the thread that launched it");
}

/// Whether `pid` exists and has not exited (a zombie has).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// A launch whose caller stops waiting (a client that hung up) while the program starts
/// leaves nothing running that no one follows.
async fn given_up_launch() {
    let marker = format!("keel-sandbox-given-up-{}", std::process::id());
    for _ in 0..10 {
        let mut spec = spec(&["sleep", "600"], None);
        spec.env.retain(|(name, _)| name != "KEEL_RUN_ID");
        spec.env.push(("KEEL_RUN_ID".into(), marker.clone()));
        spec.run_marker = marker.clone();
        // Polled once, it runs until it waits for the spawner's answer; then it is dropped.
        let mut launch = NoSandbox.launch(spec);
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(launch.as_mut().poll(cx).is_pending())).await;
        assert!(polled, "the launch finished without waiting");
        drop(launch);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = keel_sandbox::tree::processes_with_marker(&marker);
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            keel_sandbox::tree::kill_pids(&left);
            panic!("programs of given-up launches still run: {left:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
