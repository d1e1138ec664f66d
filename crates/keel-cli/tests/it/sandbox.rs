//! The process sandbox through the real `keel` binary: what an agent sees, that the whole
//! tree dies on stop and with the daemon, volumes, refusals, `keel doctor`, the pool.
//! Escape attempts are in `sandbox_escape.rs`.

use serde_json::{Value, json};

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

/// The SDK's bytecode is compiled when the kernel unpacks it: a sandboxed agent, which sees
/// the SDK read-only, loads it instead of compiling the source at each start. What the
/// interpreter checks before it uses the file: its magic number, and the source hash it
/// records (a `checked-hash` file) against the source the agent sees.
#[test]
fn a_sandboxed_python_agent_loads_the_sdk_from_compiled_bytecode() {
    let keel = Keel::new();
    let script = "import importlib.util, json, keel._client as c; pyc = open(c.__cached__, 'rb').read(); \
                  src = open(c.__file__, 'rb').read(); print(json.dumps({'cached': c.__cached__, \
                  'magic': pyc[:4] == importlib.util.MAGIC_NUMBER, 'flags': int.from_bytes(pyc[4:8], 'little'), \
                  'hash': pyc[8:16] == importlib.util.source_hash(src)}))";
    let out = keel.run(&["run", "--quiet", "--", "python3", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        seen["cached"].as_str().unwrap().starts_with("/run/keel/sdk/keel/__pycache__/_client."),
        "{seen}"
    );
    assert_eq!(seen["magic"], true, "written by the interpreter the agent runs: {seen}");
    assert_eq!(seen["flags"], 3, "checked against the source's hash at each import: {seen}");
    assert_eq!(seen["hash"], true, "compiled from the source the agent sees: {seen}");
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

/// An agent that exits leaving a process behind (in a session of its own, so nothing of
/// it would die with the agent's group) ends its run, and the process goes with the
/// sandbox. The init reports the end once it has sent every process of the sandbox
/// SIGKILL, before its own exit.
#[test]
fn a_process_the_agent_leaves_behind_dies_with_its_sandbox() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox-pool", "0"]);
    let marker = unique("left-behind");
    let script = "import subprocess, sys\n\
        child = subprocess.Popen([sys.executable, '-c', 'import time; print(\"up\", flush=True); time.sleep(600)', \
        sys.argv[1]], stdout=subprocess.PIPE, start_new_session=True)\n\
        assert child.stdout.readline() == b'up\\n'\n\
        print('left', child.pid, flush=True)\n";
    let run = keel.detach(&["--", "python3", "-c", script, &marker]);
    let done = keel.wait_state(&run, &["failed", "succeeded"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(keel.ok(&["logs", &run]).contains("left "), "the agent started its child");
    wait_for("the process left behind to die", || processes_with(&marker).is_empty().then_some(()));
    if let Some(init) = done["pid"].as_u64() {
        wait_for("the sandbox's init to be gone", || (!crate::harness::alive(init as u32)).then_some(()));
    }
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

/// Starts `program` from `dir` on the daemon and waits for its run to end: its id and
/// final view.
fn run_to_its_end(keel: &Keel, dir: &std::path::Path, program: &str) -> (String, Value) {
    let out =
        keel.cmd().current_dir(dir).args(["run", "--detach", "--json", "--", program]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();
    let done = keel.wait_state(&run, &["failed", "succeeded"]);
    (run, done)
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
            let (run, done) = run_to_its_end(&keel, project.path(), "./tool");
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

/// A sandbox built for its run starts the agent from its init without a fork (a
/// vfork-style start): the job's limits, no inherited descriptors, no blocked signals,
/// and a program that cannot exec still fails its run with the reason.
#[test]
fn a_cold_sandbox_starts_its_program_with_its_limits_and_nothing_else() {
    use std::os::unix::fs::PermissionsExt;
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox-pool", "0"]);
    let script = "import json, os, resource; \
                  status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()); \
                  print(json.dumps({'nofile': resource.getrlimit(resource.RLIMIT_NOFILE), \
                  'core': resource.getrlimit(resource.RLIMIT_CORE), 'fds': sorted(os.listdir('/proc/self/fd')), \
                  'blocked': status['SigBlk'].strip(), 'pid': os.getpid(), \
                  'stdin': os.readlink('/proc/self/fd/0')}))";
    let out = keel.run(&["run", "--quiet", "--", "python3", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["nofile"], json!([4096, 4096]), "{seen}");
    assert_eq!(seen["core"], json!([0, 0]), "{seen}");
    // stdin, stdout, stderr and the directory listing itself: nothing of the init's.
    assert_eq!(seen["fds"], json!(["0", "1", "2", "3"]), "{seen}");
    assert_eq!(seen["blocked"], "0000000000000000", "{seen}");
    assert_eq!(seen["pid"], 2, "{seen}");
    assert_eq!(seen["stdin"], "/dev/null", "{seen}");
    let run = keel.json(&["ps", "--json"])[0]["run_id"].as_str().unwrap().to_owned();
    assert!(keel.ok(&["logs", &run, "--json"]).contains(r#""pooled":false"#), "a cold sandbox");

    let project = tempfile::tempdir().unwrap();
    let program = project.path().join("tool");
    std::fs::write(&program, "this is not an executable format").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, done) = run_to_its_end(&keel, project.path(), "./tool");
    assert_eq!(done["state"], "failed");
    let error = done["error"].as_str().unwrap();
    assert!(error.contains("could not start") && error.contains("tool"), "{done}");
}

/// A test CA (made here with rcgen) that signs the local "internet" servers' certificates.
struct TestCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl TestCa {
    fn new() -> TestCa {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, "Keel test upstream CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages =
            vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa { params, key, pem }
    }

    /// A server certificate for `name` (DER) and its private key.
    fn leaf(&self, name: &str) -> (Vec<u8>, Vec<u8>) {
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.der().to_vec(), key.serialize_der())
    }
}

/// The request heads a test server received, one per connection.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Serves one HTTP/1.1 request per connection on a loopback port (TLS with `tls`),
/// recording each request head and answering `200 ok`.
fn recording_server(tls: Option<(Vec<u8>, Vec<u8>)>) -> (u16, Seen) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Seen::default();
    let config = tls.map(|(cert, key)| {
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.into()], rustls::pki_types::PrivateKeyDer::try_from(key).unwrap())
                .unwrap(),
        )
    });
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (config, record) = (config.clone(), record.clone());
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(30)));
                let mut stream: Box<dyn ReadWrite> = match config {
                    Some(config) => Box::new(rustls::StreamOwned::new(
                        rustls::ServerConnection::new(config).unwrap(),
                        stream,
                    )),
                    None => Box::new(stream),
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                record.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                let _ =
                    stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
                let _ = stream.flush();
            });
        }
    });
    (port, seen)
}

trait ReadWrite: std::io::Read + std::io::Write + Send {}
impl<T: std::io::Read + std::io::Write + Send> ReadWrite for T {}

/// The values of header `name` in a recorded request head.
fn header_values(head: &str, name: &str) -> Vec<String> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// `[egress]` credentials in keel.toml: the proxy sets the header for a credentialed host
/// over plain HTTP and over HTTPS (terminating TLS with a Keel-signed certificate the
/// sandbox trusts, re-originating TLS verified against `extra_roots`), a host without a
/// credential is still a blind tunnel, and the secret is nowhere inside the sandbox or
/// the run's events.
#[test]
fn the_egress_proxy_injects_credentials_the_agent_never_holds() {
    let keel = Keel::new();
    let secret = unique("s3cret-token");
    let ca = TestCa::new();
    let (api_tls, api_seen) = recording_server(Some(ca.leaf("api.keel-test.internal")));
    let (api_plain, plain_seen) = recording_server(None);
    let blind_leaf = ca.leaf("blind.keel-test.internal");
    let blind_cert: String = blind_leaf.0.iter().map(|b| format!("{b:02x}")).collect();
    let (blind_port, blind_seen) = recording_server(Some(blind_leaf));
    let ca_file = keel.data.path().join("test-upstream-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    std::fs::write(
        keel.data.path().join("keel.toml"),
        format!(
            r#"[egress]
extra_roots = ["{}"]

[egress.resolve]
"api.keel-test.internal" = "127.0.0.1"
"blind.keel-test.internal" = "127.0.0.1"

[[egress.credentials]]
host = "api.keel-test.internal"
header = "Authorization"
value_env = "KEEL_TEST_EGRESS_TOKEN"
prefix = "Bearer "
"#,
            ca_file.display()
        ),
    )
    .unwrap();
    let reversed: String = secret.chars().rev().collect();
    let out = keel
        .cmd()
        .env("KEEL_TEST_EGRESS_TOKEN", &secret)
        .args(["run", "--quiet", "--allow-host", "api.keel-test.internal"])
        .args(["--allow-host", "blind.keel-test.internal", "--", "python3", &agent("egress_credentials.py")])
        .args([
            &format!("https://api.keel-test.internal:{api_tls}/secure"),
            &format!("http://api.keel-test.internal:{api_plain}/plain"),
            "blind.keel-test.internal",
            &blind_port.to_string(),
            &reversed,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains(&secret), "{stdout}");
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();

    // HTTPS: the agent trusted the proxy's certificate, the server got the real header.
    assert_eq!(report["https"], serde_json::json!({"status": 200, "body": "ok"}), "{report}");
    let heads = api_seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(
        header_values(&heads[0], "authorization"),
        [format!("Bearer {secret}")],
        "replaced, not added"
    );
    assert!(heads[0].starts_with("GET /secure HTTP/1.1\r\n"), "{heads:?}");
    // Plain HTTP: the same.
    assert_eq!(report["http"], serde_json::json!({"status": 200, "body": "ok"}), "{report}");
    let heads = plain_seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(header_values(&heads[0], "authorization"), [format!("Bearer {secret}")]);
    // No credential: a blind tunnel, the agent sees the real server's certificate and its
    // own header arrives untouched.
    assert_eq!(report["blind"]["cert"], blind_cert, "{report}");
    assert!(report["blind"]["response"].as_str().unwrap().ends_with("ok"), "{report}");
    let heads = blind_seen.lock().unwrap().clone();
    assert_eq!(header_values(&heads[0], "authorization"), ["agent-own"]);
    // The secret is not in the sandbox; the CA bundle is.
    assert_eq!(report["secret_seen_in"], serde_json::json!([]), "{report}");
    for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"] {
        assert_eq!(report["env"][name], "/run/keel/ca-bundle.pem", "{report}");
    }
    assert_eq!(report["bundle_has_keel_ca"], true);

    // The audit: each connection, with the injected header's name and never its value.
    // (Every kernel validates its config at startup, an embedded one for `keel ps` too.)
    let keel_with_secret = |args: &[&str]| {
        let out = keel.cmd().env("KEEL_TEST_EGRESS_TOKEN", &secret).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let runs: Value = serde_json::from_str(&keel_with_secret(&["ps", "--json"])).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let logs = keel_with_secret(&["logs", &run, "--json"]);
    assert!(!logs.contains(&secret), "the secret never reaches the event log");
    let egress: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "egress")
        .map(|e| e["data"].clone())
        .collect();
    let by_port =
        |port: u16| egress.iter().find(|e| e["port"] == port).unwrap_or_else(|| panic!("{egress:?}"));
    assert_eq!(egress.len(), 3, "{egress:?}");
    assert_eq!(by_port(api_tls)["credential"], "Authorization");
    assert_eq!(by_port(api_tls)["method"], "CONNECT");
    assert_eq!(by_port(api_plain)["credential"], "Authorization");
    assert_eq!(by_port(api_plain)["method"], "GET");
    assert!(by_port(blind_port).get("credential").is_none(), "{egress:?}");
    assert!(egress.iter().all(|e| e["allowed"] == true), "{egress:?}");
}

/// A credential whose environment variable the kernel lacks is a startup error that
/// names the variable; a credential for a reserved header is refused.
#[test]
fn egress_credentials_are_validated_at_startup() {
    let keel = Keel::new();
    let config = keel.data.path().join("keel.toml");
    std::fs::write(
        &config,
        "[[egress.credentials]]\nhost = \"api.example.com\"\nheader = \"Authorization\"\nvalue_env = \"KEEL_TEST_MISSING_TOKEN\"\n",
    )
    .unwrap();
    let out = keel.cmd().env_remove("KEEL_TEST_MISSING_TOKEN").args(["run", "--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("KEEL_TEST_MISSING_TOKEN") && stderr.contains("keel.toml"), "{stderr}");
    std::fs::write(
        &config,
        "[[egress.credentials]]\nhost = \"api.example.com\"\nheader = \"Host\"\nvalue = \"x\"\n",
    )
    .unwrap();
    let out = keel.run(&["run", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot inject"), "{stderr}");
}

/// Issue 11: `keel run -- python3 /elsewhere/agent.py`, started from another directory,
/// failed with Python's "can't open file": the interpreter was visible, the script not.
#[test]
fn issue_11_a_script_named_on_the_command_line_is_visible_from_any_directory() {
    let keel = Keel::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let script = elsewhere.path().join("agent.py");
    std::fs::write(
        &script,
        "import json, os, sys\n\
         here = os.path.dirname(os.path.abspath(__file__))\n\
         try:\n    import helper; imported = True\nexcept ImportError:\n    imported = False\n\
         print(json.dumps({'cwd': os.getcwd(), 'listing': sorted(os.listdir(here)), 'helper': imported,\n\
         \x20   'writable': os.access(__file__, os.W_OK)}))\n",
    )
    .unwrap();
    std::fs::write(elsewhere.path().join("helper.py"), "").unwrap();
    let script = script.display().to_string();
    let run = |flags: &[&str]| {
        let mut args = vec!["run", "--quiet"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "python3", &script]);
        let out = keel.cmd().current_dir(cwd.path()).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "keel {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };

    let seen = run(&[]);
    assert_eq!(seen["cwd"], cwd.path().display().to_string());
    // Only the file is bound: its siblings stay out of sight, and it is read-only.
    assert_eq!(seen["listing"], serde_json::json!(["agent.py"]), "{seen}");
    assert_eq!((seen["helper"].clone(), seen["writable"].clone()), (Value::Bool(false), Value::Bool(false)));

    // Sibling modules come with --ro-bind DIR, as the docs say.
    let dir = elsewhere.path().display().to_string();
    let seen = run(&["--ro-bind", &dir]);
    assert_eq!(seen["helper"], true, "{seen}");
}

/// A file in a place the sandbox hides (here the kernel's data directory) is refused by
/// name, never bound.
#[test]
fn issue_11_a_command_line_file_in_a_hidden_place_is_refused() {
    let keel = Keel::new();
    let cwd = tempfile::tempdir().unwrap();
    let hidden = keel.data.path().join("agent.py");
    std::fs::write(&hidden, "print('read from the data directory')\n").unwrap();
    let hidden = hidden.display().to_string();
    let out = keel.cmd().current_dir(cwd.path()).args(["run", "--", "python3", &hidden]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("read from the data directory"), "{stdout}");
    assert!(
        stderr.contains(&hidden) && stderr.contains("--ro-bind"),
        "the refusal names the file and the flag: {stderr}"
    );
}

/// Only a command an operator wrote gets the files it names bound: a child an agent
/// starts with `proc.spawn` naming a host file must not get that file into its sandbox
/// (else any agent could read any host file it can name).
#[test]
fn issue_11_a_file_named_by_an_agent_spawned_command_is_not_bound() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let elsewhere = tempfile::tempdir().unwrap();
    let file = elsewhere.path().join("host-only.txt");
    std::fs::write(&file, "host only\n").unwrap();
    let file = file.display().to_string();

    // The operator's own command: bound, readable.
    let out = keel.ok(&["run", "--quiet", "--", "cat", &file]);
    assert!(out.contains("host only"), "{out}");

    // The same command chosen by an agent: not bound, so not there.
    let input = json!({"spawn": [{"command": ["cat", &file]}], "wait": true}).to_string();
    let parent = keel.detach(&["--input", &input, "--", "python3", &agent("proc_agent.py")]);
    let done = keel.wait_state(&parent, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    let child = done["output"]["children"][0].as_str().unwrap().to_owned();
    let child_view = keel.wait_state(&child, &["succeeded", "failed"]);
    assert_eq!(child_view["state"], "failed", "cat must not find the file: {child_view}");
    let logs = keel.run(&["logs", &child]);
    let logs = format!("{}{}", String::from_utf8_lossy(&logs.stdout), String::from_utf8_lossy(&logs.stderr));
    assert!(logs.contains("No such file") && !logs.contains("host only"), "{logs}\n{child_view}");
}
