//! Sandbox spawn latency, side by side in one run: a trivial static program (it only
//! calls exit) started 1,000+ times by bare fork+exec (the floor), `unshare(1)` with the
//! same namespaces as Keel (the namespaces-only floor), `bwrap` with comparable isolation
//! (namespaces, a minimal read-only root, fresh /proc, /dev, tmpfs /tmp, no capabilities),
//! Keel cold (sandbox built per spawn) and Keel pooled (a ready sandbox claimed). Then a
//! Python program's time to its first call on a Unix socket, in each.
//!
//! `cargo bench -p keel-cli --bench sandbox` (needs `bwrap` and `unshare` on PATH:
//! `apt-get install bubblewrap util-linux`). Prints a markdown table.
//!
//! `BENCH_SPAWNS` (1000) sets the trivial program's spawns per case, `BENCH_CASES` (all
//! of `fork,unshare,bwrap,cold,pooled,python`) which cases run: `BENCH_CASES=cold` alone
//! is handy under a profiler.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_sandbox::{KeelResources, LaunchSpec, ProcessConfig, ProcessSandbox, Sandbox};

const SPAWNS: usize = 1000;
const CASES: &[&str] = &["fork", "unshare", "bwrap", "cold", "pooled", "python"];
const PYTHON_SPAWNS: usize = 100;
/// Ready sandboxes kept by the pooled configuration.
const POOL: usize = 2;

/// The smallest static x86-64 program: `exit(0)`, 129 bytes of ELF.
fn static_true(dir: &Path) -> PathBuf {
    let path = dir.join("true-static");
    let code: [u8; 8] = [0x31, 0xff, 0xb8, 0x3c, 0, 0, 0, 0x0f]; // xor edi,edi; mov eax,60; syscall (cont.)
    let mut elf = Vec::new();
    let base: u64 = 0x40_0000;
    let total: u64 = 64 + 56 + 9;
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&(base + 120).to_le_bytes()); // entry
    elf.extend_from_slice(&64u64.to_le_bytes()); // program headers
    elf.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    elf.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, 1, 64, 0, 0] {
        elf.extend_from_slice(&half.to_le_bytes());
    }
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for word in [0u64, base, base, total, total, 0x1000] {
        elf.extend_from_slice(&word.to_le_bytes());
    }
    elf.extend_from_slice(&code);
    elf.push(0x05);
    assert_eq!(elf.len() as u64, total);
    std::fs::write(&path, &elf).expect("write the static program");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(Command::new(&path).status().expect("run the static program").success());
    path
}

/// Lets the kernel finish tearing down the previous case's namespaces (network
/// namespaces are freed asynchronously, in batches), so one case's leftovers do not slow
/// the next. Not timed.
fn settle() {
    std::thread::sleep(Duration::from_secs(3));
}

struct Stats {
    case: String,
    n: usize,
    mean: f64,
    p50: f64,
    p99: f64,
}

fn stats(case: &str, mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let n = samples.len();
    Stats {
        case: case.to_owned(),
        n,
        mean: samples.iter().map(|d| micros(*d)).sum::<f64>() / n as f64,
        p50: micros(samples[n / 2]),
        p99: micros(samples[(n * 99 / 100).min(n - 1)]),
    }
}

fn time_command(n: usize, mut make: impl FnMut() -> Command) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let mut command = make();
            command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
            let started = Instant::now();
            let status = command.status().unwrap_or_else(|error| {
                // The peers are other programs: say which one is missing, and its package.
                let program = command.get_program().to_string_lossy().into_owned();
                let package = match program.as_str() {
                    "bwrap" => " (Debian: bubblewrap)",
                    "unshare" => " (Debian: util-linux)",
                    _ => "",
                };
                panic!("cannot start {program}{package}: {error}; BENCH_CASES picks the cases to run")
            });
            let took = started.elapsed();
            assert!(status.success(), "{command:?} failed: {status}");
            took
        })
        .collect()
}

fn unshare(program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--user", "--map-root-user", "--mount", "--pid", "--fork", "--ipc", "--uts", "--net"])
        .arg(program)
        .args(args);
    command
}

fn bwrap(program: &Path, args: &[&str], dir: &Path, extra: &[&str]) -> Command {
    let dir = dir.to_str().expect("utf-8 dir");
    let mut command = Command::new("bwrap");
    command
        .args(["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"])
        .args(["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"])
        .args(["--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin"])
        .args(["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"])
        .args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/workspace"])
        .args(["--ro-bind", dir, dir, "--chdir", dir])
        .args(extra)
        .arg(program)
        .args(args);
    command
}

fn spec(dir: &Path, command: Vec<String>, socket: Option<&Path>) -> LaunchSpec {
    let mut env = vec![("KEEL_RUN_ID".to_owned(), "bench".to_owned())];
    if socket.is_some() {
        env.push(("SOCK".into(), keel_sandbox::plan::inside::SYSCALL_SOCKET.into()));
    }
    LaunchSpec {
        command,
        cwd: dir.to_path_buf(),
        env,
        run_marker: "bench".into(),
        keel: KeelResources { syscall_socket: socket.map(Path::to_path_buf), ..KeelResources::default() },
        ..LaunchSpec::default()
    }
}

/// Keel: time from `launch` to the program's exit; and until `launch` returns (cold: the
/// program runs; pooled: the job was handed to a ready sandbox whose agent process
/// exists and execs it).
async fn time_keel(
    sandbox: &ProcessSandbox,
    spec: &LaunchSpec,
    n: usize,
    pooled: bool,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut to_exit = Vec::with_capacity(n);
    let mut to_start = Vec::with_capacity(n);
    for _ in 0..n {
        if pooled {
            // A claim takes a ready sandbox; the refill (which builds sandboxes in the
            // background, up to the pool size) is not part of it, so wait until the pool
            // is full again: the steady state of a pool sized for its load.
            while sandbox.ready(spec) < POOL {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        let started = Instant::now();
        let mut launched = sandbox.launch(spec.clone()).await.expect("launch");
        to_start.push(started.elapsed());
        assert!(launched.pooled == pooled, "pooled: {}", launched.pooled);
        let status = launched.child.wait().await.expect("wait");
        to_exit.push(started.elapsed());
        assert!(status.success(), "{status}");
    }
    (to_exit, to_start)
}

/// A listener the Python program connects to; returns the time of each first byte.
struct FirstCall {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
}

impl FirstCall {
    fn new(dir: &Path) -> FirstCall {
        let path = dir.join("first-call.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        FirstCall { listener, path }
    }

    fn wait(&self, started: Instant) -> Duration {
        let (mut stream, _) = self.listener.accept().expect("accept");
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).expect("first byte");
        started.elapsed()
    }
}

const PYTHON: &str = "import os, socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['SOCK'])\ns.sendall(b'x')\ns.recv(1)";

fn time_python_command(first: &FirstCall, n: usize, mut make: impl FnMut() -> Command) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let mut command = make();
            command
                .env("SOCK", &first.path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let started = Instant::now();
            let mut child = command.spawn().expect("spawn python");
            let took = first.wait(started);
            let _ = child.wait();
            took
        })
        .collect()
}

fn main() {
    let spawns: usize =
        std::env::var("BENCH_SPAWNS").ok().map_or(SPAWNS, |v| v.parse().expect("BENCH_SPAWNS"));
    let cases = std::env::var("BENCH_CASES").unwrap_or_else(|_| CASES.join(","));
    let cases: Vec<&str> = cases.split(',').map(str::trim).filter(|c| !c.is_empty()).collect();
    for case in &cases {
        assert!(CASES.contains(case), "unknown case {case:?} in BENCH_CASES; known: {}", CASES.join(","));
    }
    let wanted = |case: &str| cases.contains(&case);
    let dir = tempfile::tempdir().expect("tempdir");
    let program = static_true(dir.path());
    let python = PathBuf::from("/usr/bin/python3");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let config = |pool_size| ProcessConfig {
        zygote_program: PathBuf::from(env!("CARGO_BIN_EXE_keel")),
        pool_size,
        ..ProcessConfig::default()
    };
    let cold = ProcessSandbox::new(config(0));
    let pool = ProcessSandbox::new(config(POOL));
    let trivial = spec(dir.path(), vec![program.display().to_string()], None);

    let mut rows = Vec::new();
    let mut floors = (None, None);
    if wanted("fork") {
        rows.push(stats("bare fork+exec (floor)", time_command(spawns, || Command::new(&program))));
        floors.0 = rows.last().map(|r| r.p50);
        settle();
    }
    if wanted("unshare") {
        rows.push(stats(
            "unshare(1): user, mount, pid, ipc, uts, net namespaces (namespaces-only floor)",
            time_command(spawns, || unshare(&program, &[])),
        ));
        floors.1 = rows.last().map(|r| r.p50);
        settle();
    }
    if wanted("bwrap") {
        rows.push(stats(
            "bwrap: same namespaces + read-only root, /proc, /dev, tmpfs, no caps",
            time_command(spawns, || bwrap(&program, &[], dir.path(), &[])),
        ));
        settle();
    }
    if wanted("cold") {
        let (cold_exit, cold_start) = runtime.block_on(async {
            time_keel(&cold, &trivial, 20, false).await; // Warm up the zygote.
            time_keel(&cold, &trivial, spawns, false).await
        });
        rows.push(stats("keel cold: sandbox built per spawn, to exit", cold_exit));
        rows.push(stats("keel cold: to program running", cold_start));
        settle();
    }
    if wanted("pooled") {
        let (pool_exit, pool_start) = runtime.block_on(async {
            pool.prewarm(&trivial).await.expect("prewarm");
            time_keel(&pool, &trivial, 20, true).await;
            time_keel(&pool, &trivial, spawns, true).await
        });
        rows.push(stats("keel pooled: claim (job handed to a ready sandbox)", pool_start));
        rows.push(stats("keel pooled: claim to exit", pool_exit));
        settle();
    }

    let mut python_rows = Vec::new();
    if wanted("python") {
        let first = FirstCall::new(dir.path());
        let code = ["-c", PYTHON];
        settle();
        python_rows.push(stats(
            "bare fork+exec",
            time_python_command(&first, PYTHON_SPAWNS, || {
                let mut c = Command::new(&python);
                c.args(code);
                c
            }),
        ));
        python_rows.push(stats(
            "unshare(1)",
            time_python_command(&first, PYTHON_SPAWNS, || unshare(&python, &code)),
        ));
        let socket = first.path.display().to_string();
        settle();
        python_rows.push(stats(
            "bwrap",
            time_python_command(&first, PYTHON_SPAWNS, || {
                bwrap(&python, &code, dir.path(), &["--bind", &socket, &socket])
            }),
        ));
        let python_spec = spec(
            dir.path(),
            vec![python.display().to_string(), "-c".into(), PYTHON.into()],
            Some(&first.path),
        );
        for (name, sandbox, pooled) in [("keel cold", &cold, false), ("keel pooled", &pool, true)] {
            settle();
            let samples = runtime.block_on(async {
                let mut samples = Vec::new();
                if pooled {
                    sandbox.prewarm(&python_spec).await.expect("prewarm");
                }
                for _ in 0..PYTHON_SPAWNS {
                    while pooled && sandbox.ready(&python_spec) < POOL {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                    let started = Instant::now();
                    let mut launched = sandbox.launch(python_spec.clone()).await.expect("launch python");
                    let took = tokio::task::block_in_place(|| first.wait(started));
                    let _ = launched.child.wait().await;
                    samples.push(took);
                }
                samples
            });
            python_rows.push(stats(name, samples));
        }
    }

    runtime.block_on(async {
        cold.shutdown().await;
        pool.shutdown().await;
    });
    let ratio = |p50: f64, floor: Option<f64>| floor.map_or("-".to_owned(), |f| format!("{:.2}x", p50 / f));
    println!("\n## Sandbox spawn: trivial static program ({spawns} spawns each)\n");
    println!("| case | n | mean µs | p50 µs | p99 µs | p50 vs fork+exec | p50 vs namespaces floor |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {} |",
            row.case,
            row.n,
            row.mean,
            row.p50,
            row.p99,
            ratio(row.p50, floors.0),
            ratio(row.p50, floors.1)
        );
    }
    println!("\n## Python agent: spawn to first call on a Unix socket ({PYTHON_SPAWNS} spawns each)\n");
    println!("| case | n | mean ms | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for row in &python_rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            row.case,
            row.n,
            row.mean / 1e3,
            row.p50 / 1e3,
            row.p99 / 1e3
        );
    }
}
