//! The escape suite: each test runs a real program (`tests/agents/escape/escape.py CASE`)
//! inside a real process sandbox through the real `keel` binary, and asserts that the
//! attempt was denied or contained. Cases that test limits assert on how the run ended.
//!
//! Adding a case: write `case_NAME` in escape.py (print a verdict, exit 0 if contained),
//! then list NAME in `contained!` or give it its own test here.

use std::process::Output;

use serde_json::Value;

use crate::harness::{Keel, agents, wait_for};

fn escape_program() -> String {
    agents().join("escape/escape.py").display().to_string()
}

/// The verdict line of an escape attempt, if it printed one.
fn verdict(stdout: &str) -> Option<Value> {
    stdout.lines().rev().find(|l| l.starts_with('{')).and_then(|l| serde_json::from_str(l).ok())
}

/// Runs one case with `keel run` (an embedded kernel) and sandbox `flags`.
fn attempt(keel: &Keel, flags: &[&str], case: &str, args: &[&str]) -> Output {
    let program = escape_program();
    let mut full = vec!["run", "--quiet"];
    full.extend_from_slice(flags);
    full.extend_from_slice(&["--", "python3", &program, case]);
    full.extend_from_slice(args);
    keel.run(&full)
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).chars().take(2000).collect::<String>(),
        String::from_utf8_lossy(&out.stderr).chars().take(2000).collect::<String>()
    )
}

/// Asserts the case reported itself contained, and returns its verdict.
fn assert_contained(keel: &Keel, flags: &[&str], case: &str, args: &[&str]) -> Value {
    let out = attempt(keel, flags, case, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(verdict) = verdict(&stdout) else { panic!("{case}: no verdict\n{}", describe(&out)) };
    assert_eq!(verdict["contained"], true, "{case} got out: {}\n{}", verdict["detail"], describe(&out));
    assert!(out.status.success(), "{case}\n{}", describe(&out));
    verdict
}

/// Asserts the sandbox ended the run (no verdict: the agent was stopped first) and that
/// the run's error names why. Returns the run.
fn assert_ended_by(keel: &Keel, flags: &[&str], case: &str, args: &[&str], why: &str) -> Value {
    let out = attempt(keel, flags, case, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(verdict(&stdout).is_none(), "{case} ran to the end\n{}", describe(&out));
    assert!(!out.status.success(), "{case}\n{}", describe(&out));
    let run = keel.json(&["ps", "--json"])[0].clone();
    assert_eq!(run["state"], "failed", "{run}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "{case}: the run's error should say {why:?}: {error}");
    run
}

macro_rules! contained {
    ($($(#[doc = $doc:literal])+ $case:ident;)+) => {$(
        $(#[doc = $doc])+
        #[test]
        fn $case() {
            assert_contained(&Keel::new(), &[], stringify!($case), &[]);
        }
    )+};
}

contained! {
    /// /etc/shadow is not in the sandbox's /etc (an allowlist of host entries).
    read_shadow;
    /// The init's environment (PID 1 inside) is unreadable to the agent.
    proc_1_environ;
    /// Nothing outside /workspace, /tmp and volumes is writable (/, /etc, /usr, /proc,
    /// /run/keel, the working directory).
    write_outside;
    /// The working directory is read-only by default.
    write_cwd;
    /// Hard links to files outside the writable mounts fail (EXDEV).
    hardlink_escape;
    /// /proc/self/root is the sandbox's root; init's root is out of reach.
    proc_self_root;
    /// Device nodes cannot be made (no CAP_MKNOD; tmpfs in a user namespace is nodev).
    mknod;
    /// mount(2) is denied by the seccomp filter (EPERM).
    mount;
    /// umount2(2) is denied (EPERM).
    umount;
    /// pivot_root(2) is denied (EPERM).
    pivot_root;
    /// chroot(2) is denied (EPERM).
    chroot;
    /// No nested user or mount namespace: unshare denied, clone3 ENOSYS, `unshare -U` fails.
    nested_unshare;
    /// setns(2) is denied (EPERM).
    setns;
    /// no_new_privs is set, /usr is nosuid, and an exec'd child has no capabilities at
    /// all (empty bounding set), so setuid binaries grant nothing.
    setuid_and_no_new_privs;
    /// keyctl(2) and add_key(2) are denied (keyrings are not namespaced).
    keyctl;
    /// bpf(2) is denied.
    bpf;
    /// perf_event_open(2) is denied.
    perf_event_open;
    /// io_uring_setup(2) is denied.
    io_uring;
    /// userfaultfd(2) is denied.
    userfaultfd;
    /// open_by_handle_at(2) and name_to_handle_at(2) are denied (the "shocker" escape).
    open_by_handle_at;
    /// syslog(2) (reading the kernel log) is denied.
    syslog;
    /// /proc/sys and /proc/sysrq-trigger cannot be opened for writing.
    proc_sys_write;
    /// /dev holds null, zero, full, random, urandom only; no /sys, no /dev/tty.
    devices_and_sysfs;
    /// The agent inherits only stdin, stdout, stderr; connecting adds the run's socket.
    leaked_fds;
    /// TIOCSTI (typing into someone's terminal) is denied on every stdio fd.
    tiocsti;
    /// curl cannot reach the internet with network = none.
    net_curl;
    /// Raw and packet sockets cannot be opened.
    net_raw_socket;
    /// bash's /dev/tcp cannot connect out.
    net_bash_dev_tcp;
    /// There is no DNS.
    net_dns;
    /// UDP cannot be sent out.
    net_udp;
    /// IPv6 cannot reach out.
    net_ipv6;
    /// The cloud metadata address 169.254.169.254 is unreachable.
    net_metadata;
    /// Netlink sockets cannot be opened.
    net_netlink;
}

#[test]
fn read_data_dir() {
    let keel = Keel::new();
    assert_contained(&keel, &[], "read_data_dir", &[keel.data.path().to_str().unwrap()]);
}

#[test]
fn read_sqlite() {
    let keel = Keel::new();
    assert_contained(&keel, &[], "read_sqlite", &[keel.data.path().to_str().unwrap()]);
}

#[test]
fn symlink_escape() {
    let keel = Keel::new();
    assert_contained(&keel, &[], "symlink_escape", &[keel.data.path().to_str().unwrap()]);
}

#[test]
fn dotdot_traversal() {
    let keel = Keel::new();
    assert_contained(&keel, &[], "dotdot_traversal", &[keel.data.path().to_str().unwrap()]);
}

#[test]
fn read_ssh() {
    let keel = Keel::new();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    assert_contained(&keel, &[], "read_ssh", &[&home]);
}

/// Run from a home directory: its working directory is visible, but `.ssh`, `.aws` and
/// the like inside it are masked.
#[test]
fn masked_home_secrets() {
    let keel = Keel::new();
    let home = tempfile::tempdir().unwrap();
    for (dir, file) in [(".ssh", "id_ed25519"), (".aws", "credentials")] {
        std::fs::create_dir_all(home.path().join(dir)).unwrap();
        std::fs::write(home.path().join(dir).join(file), "SECRET").unwrap();
    }
    let agents = agents().display().to_string();
    let program = escape_program();
    let out = keel
        .cmd()
        .env("HOME", home.path())
        .current_dir(home.path())
        .args(["run", "--quiet", "--ro-bind", &agents, "--", "python3", &program, "masked_home_secrets"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let verdict = verdict(&stdout).unwrap_or_else(|| panic!("no verdict\n{}", describe(&out)));
    assert_eq!(verdict["contained"], true, "{}\n{}", verdict["detail"], describe(&out));
}

/// No host variable reaches the agent, provider keys above all.
#[test]
fn host_env() {
    let keel = Keel::new();
    let program = escape_program();
    let names = [
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "ESCAPE_TEST_SECRET",
        "USER",
        "SSH_AUTH_SOCK",
    ];
    let out = keel
        .cmd()
        .env("OPENAI_API_KEY", "sk-escape-test")
        .env("ANTHROPIC_API_KEY", "sk-ant-escape-test")
        .env("AWS_SECRET_ACCESS_KEY", "escape-test")
        .env("ESCAPE_TEST_SECRET", "escape-test")
        .env("SSH_AUTH_SOCK", "/tmp/agent.sock")
        .args(["run", "--quiet", "--", "python3", &program, "host_env"])
        .args(names)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let verdict = verdict(&stdout).unwrap_or_else(|| panic!("no verdict\n{}", describe(&out)));
    assert_eq!(verdict["contained"], true, "{}\n{}", verdict["detail"], describe(&out));
    assert!(!stdout.contains("escape-test"), "{stdout}");
}

/// Runs a case against a daemon (whose pid the case attacks) and returns its verdict.
fn against_daemon(case: &str) -> Value {
    let mut keel = Keel::new();
    keel.start_daemon();
    let info: Value =
        serde_json::from_slice(&std::fs::read(keel.data.path().join("kernel.json")).unwrap()).unwrap();
    let pid = info["pid"].as_u64().unwrap().to_string();
    let program = escape_program();
    let run = keel.detach(&["--", "python3", &program, case, &pid]);
    let done = keel.wait_state(&run, &["succeeded", "failed"]);
    let logs = keel.ok(&["logs", &run]);
    let verdict = verdict(&logs).unwrap_or_else(|| panic!("{case}: no verdict: {done}\n{logs}"));
    assert_eq!(verdict["contained"], true, "{case} got out: {}", verdict["detail"]);
    verdict
}

/// ptrace of the kernel (and of the init, and PTRACE_TRACEME) is denied.
#[test]
fn ptrace() {
    against_daemon("ptrace");
}

/// process_vm_readv of the kernel's memory is denied.
#[test]
fn process_vm_readv() {
    against_daemon("process_vm_readv");
}

/// An abstract Unix socket on the host is out of reach (own network namespace, and
/// Landlock scoping where the kernel has it).
#[test]
fn abstract_unix() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("keel-escape-test-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    assert_contained(&Keel::new(), &[], "abstract_unix", &[&name]);
}

/// Host processes cannot be signalled (nor the sandbox's init killed).
#[test]
fn signal_host() {
    let pid = std::process::id().to_string();
    assert_contained(&Keel::new(), &[], "signal_host", &[&pid]);
}

/// The host's loopback services are out of reach.
#[test]
fn net_host_loopback() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    assert_contained(&Keel::new(), &[], "net_host_loopback", &[&port]);
}

/// Serves an echo on a loopback port (an "internet" host the allowlist can name).
fn echo_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut reader, mut writer) = (stream.try_clone().unwrap(), stream);
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    port
}

/// With `allowlist`, the egress proxy tunnels to an allowed host:port, refuses one that
/// is not listed, a direct connection fails, and both attempts are audited as events.
#[test]
fn allowlist() {
    let keel = Keel::new();
    let allowed = echo_server();
    let other = echo_server();
    let allow = format!("127.0.0.1:{allowed}");
    let verdict = assert_contained(
        &keel,
        &["--allow-host", &allow],
        "allowlist",
        &[&allow, &format!("127.0.0.1:{other}")],
    );
    assert!(verdict["detail"].as_str().unwrap().contains("200"), "{verdict}");
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().unwrap().to_owned();
    let events = keel.ok(&["logs", &run, "--json"]);
    let egress: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "egress")
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(egress.len(), 2, "{events}");
    assert_eq!(
        (egress[0]["allowed"].clone(), egress[0]["port"].clone()),
        (Value::Bool(true), allowed.into())
    );
    assert_eq!((egress[1]["allowed"].clone(), egress[1]["port"].clone()), (Value::Bool(false), other.into()));
}

/// A host outside the allowlist is refused by name, and names do not resolve inside.
#[test]
fn allowlist_by_name() {
    assert_contained(
        &Keel::new(),
        &["--allow-host", "api.example.com"],
        "allowlist_by_name",
        &["evil.example.net"],
    );
}

/// A fork bomb stops at the process limit.
#[test]
fn fork_bomb() {
    let verdict = assert_contained(&Keel::new(), &["--pids", "32"], "fork_bomb", &["200"]);
    let detail = verdict["detail"].as_str().unwrap();
    let forked: u32 = detail.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(u32::MAX);
    assert!(forked < 32, "{detail}");
}

/// A memory bomb is killed at the memory limit, and the run says so.
#[test]
fn memory_bomb() {
    assert_ended_by(&Keel::new(), &["--memory", "64M"], "memory_bomb", &["1024"], "memory limit of 64M");
}

/// One huge file stops at the file size limit.
#[test]
fn disk_fill_file() {
    let verdict = assert_contained(&Keel::new(), &["--file-size", "1M"], "disk_fill_file", &["8"]);
    assert!(verdict["detail"].as_str().unwrap().contains("File too large"), "{verdict}");
}

/// Filling the workspace stops at the scratch size: it is a tmpfs, never the host's disk.
#[test]
fn disk_fill() {
    let verdict = assert_contained(&Keel::new(), &["--scratch", "16M"], "disk_fill", &["64"]);
    assert!(verdict["detail"].as_str().unwrap().contains("No space left"), "{verdict}");
}

/// Opening files stops at the open-files limit.
#[test]
fn fd_exhaustion() {
    assert_contained(&Keel::new(), &["--open-files", "64"], "fd_exhaustion", &["1000"]);
}

/// A CPU spin is killed at the CPU time limit.
#[test]
fn cpu_spin() {
    assert_ended_by(&Keel::new(), &["--cpu-time", "1"], "cpu_spin", &["120"], "CPU time limit of 1s");
}

/// A sleep past the wall clock is killed.
#[test]
fn sleep_past_the_wall_clock() {
    assert_ended_by(&Keel::new(), &["--wall", "2"], "sleep", &["120"], "wall-clock limit of 2s");
}

/// A stdout flood is cut at the output limit; the kernel keeps a bounded log.
#[test]
fn stdout_flood() {
    let keel = Keel::new();
    let out = attempt(&keel, &[], "stdout_flood", &["32"]);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("output limit of"), "no notice of the cut");
    assert!(stdout.len() < 6 << 20, "{} bytes of output were kept", stdout.len());
}

/// Nothing survives the run: a daemon that double-forked, left the session and dropped
/// every KEEL_* variable is gone when the run ends.
#[test]
fn survivors() {
    let marker = format!("86400.{}", std::process::id());
    assert_contained(&Keel::new(), &[], "survivors", &[&marker]);
    let alive = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .filter(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
            })
            .count()
    };
    wait_for("the daemon to be gone", || (alive() == 0).then_some(()));
}
