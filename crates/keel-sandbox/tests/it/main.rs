//! Launching through real tiers (`none` and `process`): what reaches the program's stdin.
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
];

fn main() {
    keel_sandbox::zygote::run_if_requested();
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
