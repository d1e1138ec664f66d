//! `keel doctor`: probes what this host can enforce (user namespaces, Landlock, seccomp,
//! cgroup controllers), proves it by building a real sandbox, and prints what each
//! sandbox profile would enforce here; and which store a daemon on this data directory
//! would use, with whether it answers. Also picks the sandbox backend a kernel starts
//! with.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use keel_kernel::DataDir;
use keel_sandbox::host::{self, HostFacts};
use keel_sandbox::profile::format_size;
use keel_sandbox::{LaunchSpec, Network, NoSandbox, ProcessConfig, ProcessSandbox, Profile, Sandbox};
use serde_json::{Value, json};

use crate::store_url::StoreUrl;

/// The backend runs use unless they ask for another: the process sandbox (with `pool`
/// ready sandboxes per recent configuration), or `none` when asked for by name.
pub fn sandbox_backend(tier: &str, pool: usize) -> Arc<dyn Sandbox> {
    match tier {
        "none" => Arc::new(NoSandbox),
        _ => {
            let sandbox = ProcessSandbox::new(ProcessConfig { pool_size: pool, ..ProcessConfig::default() });
            sandbox.warm_up();
            Arc::new(sandbox)
        }
    }
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The profiles the report shows, with the flags that ask for them.
fn profiles() -> Vec<(&'static str, &'static str, Profile)> {
    vec![
        ("default", "keel run -- CMD", Profile::default()),
        (
            "limited",
            "--memory 512M --pids 128 --cpu-time 60s --wall 10m",
            Profile {
                memory_bytes: Some(512 << 20),
                pids: Some(128),
                cpu_time_secs: Some(60),
                wall_time_secs: Some(600),
                ..Profile::default()
            },
        ),
        (
            "allowlist",
            "--network allowlist --allow-host api.example.com",
            Profile { network: Network::Allowlist(vec!["api.example.com".into()]), ..Profile::default() },
        ),
    ]
}

/// Builds a real sandbox running `true`: proves namespaces, the mount plan, pivot_root,
/// /proc, Landlock and seccomp work here, not just that the kernel lists them.
async fn trial(sandbox: &ProcessSandbox) -> Result<f64, String> {
    let cwd =
        std::env::current_dir().ok().filter(|d| d.as_os_str() != "/").unwrap_or_else(std::env::temp_dir);
    let spec = LaunchSpec {
        command: vec!["true".into()],
        cwd,
        run_marker: "doctor".into(),
        ..LaunchSpec::default()
    };
    let started = Instant::now();
    let mut launched = sandbox.launch(spec).await.map_err(|e| e.to_string())?;
    let status = launched.child.wait().await.map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("`true` ended with {status} inside the sandbox"));
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

fn host_json(facts: &HostFacts) -> Value {
    let controller = |c: &Option<keel_sandbox::cgroup::Controller>| match c {
        Some(c) => json!({ "version": c.version, "mount": c.mount, "writable": c.writable }),
        None => Value::Null,
    };
    json!({
        "user_namespaces": { "ok": facts.user_namespaces.is_ok(), "detail": facts.user_namespaces.clone().err() },
        "landlock_abi": facts.landlock_abi,
        "seccomp": facts.seccomp,
        "cgroup": { "memory": controller(&facts.cgroups.memory), "pids": controller(&facts.cgroups.pids) },
        "uid": facts.uid,
    })
}

/// Which store a daemon on `dir` would use when `keel serve` is given no `--store`
/// (resolved as `store_url::open_kernel_store` does: `KEEL_STORE_URL`, keel.toml's
/// `[store] url`, else the data directory's SQLite file), and for Postgres whether it
/// answers, its version and how semantic search runs there. `ok` is false only when the
/// configuration does not parse or a configured Postgres cannot be reached: the SQLite
/// default needs nothing from the host.
async fn store_report(dir: &DataDir) -> Value {
    let (url, source) = match std::env::var("KEEL_STORE_URL").ok().filter(|url| !url.trim().is_empty()) {
        Some(url) => (Some(url), "KEEL_STORE_URL".to_owned()),
        None => {
            let configured = crate::client::read_config(dir).and_then(|(path, text)| {
                let url = match text.as_deref() {
                    Some(text) => crate::store_url::url_from_keel_toml(text)
                        .with_context(|| format!("kernel config {}", path.display()))?,
                    None => None,
                };
                Ok((url, path))
            });
            match configured {
                Ok((Some(url), path)) => (Some(url), format!("{} [store] url", path.display())),
                Ok((None, _)) => {
                    (None, "default (no KEEL_STORE_URL, no [store] url in keel.toml)".to_owned())
                }
                Err(err) => {
                    return json!({ "ok": false, "source": "keel.toml", "error": format!("{err:#}") });
                }
            }
        }
    };
    let parsed = match url.as_deref().map(StoreUrl::parse).transpose() {
        Ok(parsed) => parsed.unwrap_or_else(|| StoreUrl::Sqlite(dir.database())),
        Err(err) => return json!({ "ok": false, "source": source, "error": format!("{err:#}") }),
    };
    match &parsed {
        StoreUrl::Sqlite(path) => json!({
            "ok": true,
            "backend": "sqlite",
            "source": source,
            "url": parsed.to_string(),
            "exists": path.exists(),
        }),
        StoreUrl::Postgres(url) => {
            let mut report = json!({ "backend": "postgres", "source": source, "url": parsed.to_string() });
            let probed = async {
                let store = keel_store::PgStore::connect(url).await?;
                let version = store.server_version().await?;
                Ok::<_, keel_store::Error>((version, store.semantic_index()))
            }
            .await;
            match probed {
                Ok((version, semantic)) => {
                    report["ok"] = json!(true);
                    report["server_version"] = json!(version);
                    report["semantic_index"] = json!(semantic);
                }
                Err(err) => {
                    report["ok"] = json!(false);
                    report["error"] = json!(err.to_string());
                }
            }
            report
        }
    }
}

pub async fn doctor(dir: &DataDir, args: DoctorArgs) -> Result<ExitCode> {
    let sandbox = ProcessSandbox::new(ProcessConfig::default());
    let facts = sandbox.facts().clone();
    let base_missing = host::missing_controls(&facts, &Profile::default());
    let trial = if base_missing.is_empty() {
        trial(&sandbox).await
    } else {
        Err("skipped: the host lacks controls every sandbox needs".to_owned())
    };
    let reports: Vec<Value> = profiles()
        .into_iter()
        .map(|(name, flags, profile)| {
            let missing = host::missing_controls(&facts, &profile);
            let controls: Vec<Value> = host::enforcement(&facts, sandbox.defaults(), &profile)
                .into_iter()
                .map(|line| json!({ "control": line.control, "enforced": line.enforced, "detail": line.detail }))
                .collect();
            json!({
                "name": name,
                "flags": flags,
                "refused": (!missing.is_empty()).then(|| host::refusal(&missing)),
                "controls": controls,
            })
        })
        .collect();
    let store = store_report(dir).await;
    let ok = base_missing.is_empty() && trial.is_ok() && store["ok"] == true;
    if args.json {
        let trial = match &trial {
            Ok(ms) => json!({ "ok": true, "millis": ms }),
            Err(error) => json!({ "ok": false, "error": error }),
        };
        let report = json!({ "ok": ok, "host": host_json(&facts), "trial": trial, "profiles": reports, "store": store });
        crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        crate::out!("{}", render(&facts, &trial, &reports, &store))?;
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn render(facts: &HostFacts, trial: &Result<f64, String>, reports: &[Value], store: &Value) -> String {
    let mut out = String::from("keel doctor: what the process sandbox enforces on this host\n\nhost\n");
    let mut row = |name: &str, ok: bool, detail: String| {
        out.push_str(&format!("  {:<4} {name:<16} {detail}\n", if ok { "ok" } else { "MISS" }));
    };
    row(
        "user namespaces",
        facts.user_namespaces.is_ok(),
        facts.user_namespaces.clone().err().unwrap_or_else(|| format!("available (uid {})", facts.uid)),
    );
    row(
        "landlock",
        facts.landlock_abi >= 1,
        if facts.landlock_abi >= 1 { format!("ABI {}", facts.landlock_abi) } else { "unavailable".into() },
    );
    row(
        "seccomp",
        facts.seccomp,
        if facts.seccomp { "filters available".into() } else { "unavailable".into() },
    );
    for (name, controller) in [("cgroup memory", &facts.cgroups.memory), ("cgroup pids", &facts.cgroups.pids)]
    {
        match controller {
            Some(c) => row(
                name,
                c.writable,
                format!(
                    "v{} at {}{}",
                    c.version,
                    c.mount.display(),
                    if c.writable { "" } else { " (not writable by this user)" }
                ),
            ),
            None => row(name, false, "no hierarchy offers it".into()),
        }
    }
    match trial {
        Ok(ms) => row(
            "trial sandbox",
            true,
            format!(
                "built one and ran `true` in {ms:.1} ms (namespaces, pivot_root, /proc, Landlock, seccomp)"
            ),
        ),
        Err(error) => row("trial sandbox", false, error.clone()),
    }
    out.push_str(&render_store(store));
    for report in reports {
        out.push_str(&format!(
            "\nprofile {} ({})\n",
            report["name"].as_str().unwrap_or_default(),
            report["flags"].as_str().unwrap_or_default()
        ));
        if let Some(refused) = report["refused"].as_str() {
            out.push_str(&format!("  REFUSED: {refused}\n"));
        }
        for control in report["controls"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {:<4} {:<12} {}\n",
                if control["enforced"].as_bool() == Some(true) { "yes" } else { "no" },
                control["control"].as_str().unwrap_or_default(),
                control["detail"].as_str().unwrap_or_default()
            ));
        }
    }
    out.push_str(&format!(
        "\nDefaults where the host can enforce them: memory {}, {} processes; set per run with --memory, --pids.\n",
        format_size(keel_sandbox::host::Defaults::default().memory_bytes),
        keel_sandbox::host::Defaults::default().pids
    ));
    out
}

/// The store section of the text report.
fn render_store(store: &Value) -> String {
    let text = |key: &str| store[key].as_str().unwrap_or_default().to_owned();
    let status = if store["ok"] == true { "ok" } else { "FAIL" };
    let mut out = String::from("\nstore (what `keel serve` on this data directory would use)\n");
    out.push_str(&format!("  {:<4} {:<16} {}\n", "", "from", text("source")));
    match store["backend"].as_str() {
        Some("sqlite") => {
            let exists = if store["exists"] == true { "exists" } else { "created on first start" };
            out.push_str(&format!("  {status:<4} {:<16} {} ({exists})\n", "sqlite", text("url")));
        }
        Some("postgres") if store["ok"] == true => {
            out.push_str(&format!(
                "  {status:<4} {:<16} {} (PostgreSQL {})\n",
                "postgres",
                text("url"),
                text("server_version")
            ));
            out.push_str(&format!("  {:<4} {:<16} {}\n", "", "semantic search", text("semantic_index")));
        }
        Some("postgres") => {
            out.push_str(&format!("  {status:<4} {:<16} {} is unreachable\n", "postgres", text("url")));
            out.push_str(&format!("  {:<4} {:<16} {}\n", "", "cause", text("error")));
        }
        _ => out.push_str(&format!("  {status:<4} {:<16} {}\n", "config", text("error"))),
    }
    out
}
