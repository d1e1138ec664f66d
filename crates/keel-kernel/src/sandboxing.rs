//! How the kernel uses its sandbox backends: a run's tier and profile (validated from the
//! wire, kept in the run's spec so recovery relaunches it the same way), what the agent
//! gets inside a sandbox (Keel's paths, a clean environment, bridges to the kernel's
//! sockets), and the egress proxy of `allowlist` runs.

use std::path::PathBuf;
use std::sync::Arc;

use keel_protocol::api::SandboxParams;
use keel_sandbox::{Bridge, Network, NoSandbox, Profile, Sandbox, Volume};

use crate::{DataDir, Error, Result};

/// The loopback port inside a sandbox that leads to the kernel's LLM gateway.
pub(crate) const GATEWAY_PORT: u16 = 9100;
/// The loopback port inside an `allowlist` sandbox that leads to the egress proxy.
pub(crate) const EGRESS_PORT: u16 = 9101;

/// Checks what can be checked without the host: names, paths, patterns.
pub(crate) fn validate(params: &SandboxParams) -> Result<()> {
    let bad = |msg: String| Err(Error::InvalidRequest(msg));
    if let Some(tier) = &params.tier
        && !matches!(tier.as_str(), "process" | "none")
    {
        return bad(format!("sandbox tier {tier:?} does not exist; use `process` or `none`"));
    }
    match params.network.as_deref() {
        None | Some("none") => {
            if !params.allow_hosts.is_empty() {
                return bad("allowed hosts need `network = allowlist` (`--network allowlist`)".into());
            }
        }
        Some("allowlist") => {
            if params.allow_hosts.is_empty() {
                return bad(
                    "`network = allowlist` needs at least one allowed host (`--allow-host api.example.com`)"
                        .into(),
                );
            }
            for pattern in &params.allow_hosts {
                keel_sandbox::egress::HostPattern::parse(pattern).map_err(Error::InvalidRequest)?;
            }
        }
        Some(other) => return bad(format!("network {other:?} is not known; use `none` or `allowlist`")),
    }
    for volume in &params.volumes {
        if !keel_sandbox::profile::valid_volume_name(&volume.name) {
            return bad(format!(
                "volume name {:?} is not valid: use 1-64 letters, digits, '-', '_' or '.', not starting with '.'",
                volume.name
            ));
        }
        if !volume.path.starts_with('/') {
            return bad(format!(
                "volume {:?}: the path inside must be absolute, got {:?}",
                volume.name, volume.path
            ));
        }
    }
    for path in &params.ro_binds {
        if !path.starts_with('/') {
            return bad(format!("read-only bind {path:?} must be an absolute path"));
        }
    }
    for (name, value) in
        [("memory_bytes", params.memory_bytes), ("pids", params.pids), ("open_files", params.open_files)]
    {
        if value == Some(0) {
            return bad(format!("sandbox `{name}` must be more than 0"));
        }
    }
    Ok(())
}

/// The profile of a run, with volume names resolved to the kernel's directories.
pub(crate) fn profile(params: Option<&SandboxParams>, data_dir: &DataDir) -> Profile {
    let Some(params) = params else { return Profile::default() };
    Profile {
        memory_bytes: params.memory_bytes,
        cpu_time_secs: params.cpu_time_secs,
        wall_time_secs: params.wall_time_secs,
        pids: params.pids,
        open_files: params.open_files,
        file_size_bytes: params.file_size_bytes,
        scratch_bytes: params.scratch_bytes,
        network: match params.network.as_deref() {
            Some("allowlist") => Network::Allowlist(params.allow_hosts.clone()),
            _ => Network::None,
        },
        volumes: params
            .volumes
            .iter()
            .map(|v| Volume {
                name: v.name.clone(),
                host: data_dir.volume(&v.name),
                target: PathBuf::from(&v.path),
            })
            .collect(),
        ro_binds: params.ro_binds.iter().map(PathBuf::from).collect(),
        writable_cwd: params.writable_cwd,
    }
}

/// The backend for a run: the kernel's default, or `none` when asked for explicitly.
pub(crate) fn backend(
    default: &Arc<dyn Sandbox>,
    params: Option<&SandboxParams>,
) -> Result<Arc<dyn Sandbox>> {
    match params.and_then(|p| p.tier.as_deref()) {
        None => Ok(default.clone()),
        Some(tier) if tier == default.tier() => Ok(default.clone()),
        Some("none") => Ok(Arc::new(NoSandbox)),
        Some(tier) => Err(Error::InvalidRequest(format!(
            "sandbox tier {tier:?} is not available in this kernel (its default is {:?}); start the kernel with `--sandbox {tier}`",
            default.tier()
        ))),
    }
}

/// Creates the host directories of the profile's volumes.
pub(crate) fn prepare_volumes(profile: &Profile) -> Result<()> {
    for volume in &profile.volumes {
        std::fs::create_dir_all(&volume.host)
            .map_err(|source| Error::DataDir { dir: volume.host.display().to_string(), source })?;
    }
    Ok(())
}

/// What the agent's environment says about the sandbox's bridges.
pub(crate) fn bridge_env(
    bridges: &[Bridge],
    ca_bundle: bool,
    env: &mut std::collections::BTreeMap<String, String>,
) {
    if let Some(egress) = bridges.iter().find(|b| b.port == EGRESS_PORT) {
        let proxy = egress.url();
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.insert(name.into(), proxy.clone());
        }
        // The kernel's own bridges are reached directly.
        for name in ["NO_PROXY", "no_proxy"] {
            env.insert(name.into(), "127.0.0.1,localhost".into());
        }
        // The proxy terminates TLS for hosts with an injected credential; the bundle is
        // the host's roots plus the Keel CA, so every other host verifies as before.
        if ca_bundle {
            let bundle = keel_sandbox::plan::inside::CA_BUNDLE;
            for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"] {
                env.insert(name.into(), bundle.into());
            }
        }
    }
}

/// A loopback TCP port of the kernel's own that leads to a Unix socket: how kernel-side
/// HTTP clients (`http.fetch`) reach a run's egress proxy. Stops when dropped.
pub(crate) struct LoopbackBridge {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LoopbackBridge {
    pub(crate) async fn start(socket: PathBuf) -> std::io::Result<LoopbackBridge> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let socket = socket.clone();
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    if let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                    }
                });
            }
        });
        Ok(LoopbackBridge { addr, task })
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for LoopbackBridge {
    fn drop(&mut self) {
        self.task.abort();
    }
}
