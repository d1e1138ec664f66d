//! How the CLI reaches a kernel: the daemon advertised in the data directory (or
//! `--addr`), or, when none runs, a kernel embedded in this process that serves the same
//! HTTP API on an ephemeral loopback port. Either way commands use one [`Client`].

mod event_triggers;
mod hooks;
mod schedules;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use keel_kernel::{DataDir, Kernel, KernelOptions};
use keel_protocol::EventKinds;
use keel_protocol::api::{
    AnswerParams, CreateRunParams, ErrorBody, EventView, EventsPage, HealthView, InspectView,
    MemoryDeleteView, MemoryPutBody, MemoryRecordView, MemorySearchView, RunView, StopParams, ThreadView,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What the live kernel writes to `<data dir>/kernel.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct KernelInfo {
    pub addr: String,
    pub pid: u32,
    /// `daemon` (keel serve) or `embedded` (inside a foreground keel run).
    pub mode: String,
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// Set when this process hosts the kernel; dropping it ends the kernel.
    embedded: Option<Embedded>,
}

pub struct Embedded {
    pub kernel: Kernel,
    server: tokio::task::JoinHandle<()>,
}

/// The token requests carry: `KEEL_API_TOKEN` when set (a tenant's token acts as that
/// tenant), else the operator's token of the data directory.
pub fn api_token(dir: &DataDir) -> Result<String> {
    if let Ok(token) = std::env::var("KEEL_API_TOKEN")
        && !token.is_empty()
    {
        return Ok(token);
    }
    admin_token(dir)
}

/// Reads the operator's token, creating it (mode 0600) if this is the first kernel here.
/// A kernel this process starts takes it as its operator token, whatever
/// `KEEL_API_TOKEN` says (that may be a tenant's).
pub fn admin_token(dir: &DataDir) -> Result<String> {
    let path = dir.api_token();
    if let Ok(token) = std::fs::read_to_string(&path) {
        return Ok(token.trim().to_owned());
    }
    std::fs::create_dir_all(dir.root()).with_context(|| format!("creating {}", dir.root().display()))?;
    let token = keel_types::random_token();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .or_else(|_| std::fs::File::open(&path))
        .with_context(|| format!("creating the API token file {}", path.display()))?;
    if file.write_all(token.as_bytes()).is_err() {
        // Another process created it first: use theirs.
        return Ok(std::fs::read_to_string(&path)?.trim().to_owned());
    }
    Ok(token)
}

fn http_client() -> reqwest::Client {
    // Invariant: building a client without TLS or proxies only fails on a broken system
    // resolver configuration, which the defaults do not use.
    reqwest::Client::builder().no_proxy().build().unwrap_or_default()
}

impl Client {
    /// A client for the kernel at `base`, if one answers there. Nothing listening is
    /// known at once (the connection is refused, or not made within `PROBE_CONNECT`); a
    /// kernel that accepted the connection is given `PROBE_ANSWER` to answer, since a busy
    /// one (its health includes a read of the store) is still the kernel to talk to.
    async fn probe(base: String, token: String) -> Option<Client> {
        const PROBE_CONNECT: Duration = Duration::from_secs(2);
        const PROBE_ANSWER: Duration = Duration::from_secs(30);
        let http = http_client();
        let probe = reqwest::Client::builder().no_proxy().connect_timeout(PROBE_CONNECT).build().ok()?;
        let response = probe.get(format!("{base}/v1/health")).timeout(PROBE_ANSWER).send().await.ok()?;
        response.json::<HealthView>().await.ok()?;
        Some(Client { http, base, token, embedded: None })
    }

    /// The running daemon (or embedded kernel) for this data directory, if any.
    pub async fn find(dir: &DataDir, addr: Option<&str>) -> Result<Option<Client>> {
        if let Some(addr) = addr {
            let base = normalize(addr);
            let token = api_token(dir)?;
            return match Client::probe(base.clone(), token).await {
                Some(client) => Ok(Some(client)),
                None => bail!("no Keel kernel answers at {base}; is `keel serve --addr ...` running there?"),
            };
        }
        let Ok(text) = std::fs::read_to_string(dir.kernel_info()) else { return Ok(None) };
        let Ok(info) = serde_json::from_str::<KernelInfo>(&text) else { return Ok(None) };
        Ok(Client::probe(normalize(&info.addr), api_token(dir)?).await)
    }

    /// The running kernel, or a kernel embedded in this process.
    pub async fn find_or_embed(dir: &DataDir, addr: Option<&str>) -> Result<Client> {
        if let Some(client) = Client::find(dir, addr).await? {
            return Ok(client);
        }
        Client::embed(dir.clone()).await
    }

    /// Starts a kernel inside this process (no recovery of other runs: it ends with us).
    pub async fn embed(dir: DataDir) -> Result<Client> {
        let admin = admin_token(&dir)?;
        let token = api_token(&dir)?;
        // The process sandbox, without a pool: this kernel serves one run.
        let kernel = start_kernel(
            dir.clone(),
            KernelStart {
                serving: false,
                default_llm_script: None,
                sandbox: crate::doctor::sandbox_backend("process", 0),
                swap_after: swap_after_from_env(),
                store: crate::store_url::StoreChoice::from_env(),
                api_addr: None,
                max_live: None,
            },
        )
        .await?;
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding a loopback port")?;
        let addr = listener.local_addr()?;
        write_info(&dir, &addr.to_string(), "embedded")?;
        let router = keel_server::router(kernel.clone(), admin);
        let server = tokio::spawn(async move {
            if let Err(err) = serve(no_delay(listener), router).await {
                tracing::error!("embedded API server failed: {err}");
            }
        });
        Ok(Client {
            http: http_client(),
            base: format!("http://{addr}"),
            token,
            embedded: Some(Embedded { kernel, server }),
        })
    }

    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// Ends an embedded kernel cleanly (no-op for a daemon).
    pub async fn close(self) {
        if let Some(embedded) = self.embedded {
            embedded.kernel.shutdown().await;
            embedded.server.abort();
            let _ = std::fs::remove_file(embedded.kernel.data_dir().kernel_info());
        }
    }

    async fn send<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("the kernel at {} did not answer", self.base))?;
        let status = response.status();
        let bytes = response.bytes().await.context("reading the kernel's reply")?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).context("the kernel's reply is not the expected JSON");
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(anyhow!("{}", body.error.message)),
            Err(_) => Err(anyhow!("the kernel answered {status}: {}", String::from_utf8_lossy(&bytes))),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn health(&self) -> Result<HealthView> {
        self.send(self.http.get(self.url("/v1/health"))).await
    }

    pub async fn create_run(&self, params: &CreateRunParams) -> Result<RunView> {
        self.send(self.http.post(self.url("/v1/runs")).json(params)).await
    }

    pub async fn list_runs(&self, states: Option<&str>, limit: Option<usize>) -> Result<Vec<RunView>> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(states) = states {
            query.push(("state", states.to_owned()));
        }
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        self.send(self.http.get(self.url("/v1/runs")).query(&query)).await
    }

    pub async fn inspect(&self, run: &str) -> Result<InspectView> {
        self.send(self.http.get(self.url(&format!("/v1/runs/{run}")))).await
    }

    pub async fn events(&self, run: &str, after: u64) -> Result<EventsPage> {
        self.events_of(run, after, EventKinds::ALL).await
    }

    /// A page of the run's events of `kinds` after `after`.
    pub async fn events_of(&self, run: &str, after: u64, kinds: EventKinds) -> Result<EventsPage> {
        let mut query = vec![("after", after.to_string())];
        query.extend(kinds_query(kinds));
        self.send(self.http.get(self.url(&format!("/v1/runs/{run}/events"))).query(&query)).await
    }

    pub async fn action(&self, run: &str, action: &str) -> Result<RunView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/{action}")))).await
    }

    pub async fn stop(&self, run: &str, grace_secs: Option<u64>) -> Result<RunView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/stop"))).json(&StopParams { grace_secs }))
            .await
    }

    pub async fn top_up(&self, run: &str, body: &keel_protocol::api::TopUpParams) -> Result<RunView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/budget"))).json(body)).await
    }

    /// The URL of `/v1/{segments...}`, each segment percent-encoded (namespaces and keys
    /// may hold `/`, spaces and the like).
    fn segments_url(&self, segments: &[&str]) -> Result<reqwest::Url> {
        let mut url = reqwest::Url::parse(&self.base).context("the kernel address is not a URL")?;
        url.path_segments_mut()
            .map_err(|()| anyhow!("the kernel address {} cannot take a path", self.base))?
            .push("v1")
            .extend(segments);
        Ok(url)
    }

    pub async fn memory_put(
        &self,
        namespace: &str,
        key: &str,
        body: &MemoryPutBody,
    ) -> Result<MemoryRecordView> {
        self.send(self.http.put(self.segments_url(&["memory", namespace, key])?).json(body)).await
    }

    pub async fn memory_get(&self, namespace: &str, key: &str) -> Result<MemoryRecordView> {
        self.send(self.http.get(self.segments_url(&["memory", namespace, key])?)).await
    }

    pub async fn memory_delete(&self, namespace: &str, key: &str) -> Result<MemoryDeleteView> {
        self.send(self.http.delete(self.segments_url(&["memory", namespace, key])?)).await
    }

    pub async fn memory_search(
        &self,
        namespace: &str,
        query: &str,
        limit: Option<u64>,
        mode: Option<&str>,
    ) -> Result<MemorySearchView> {
        let mut params = vec![("q", query.to_owned())];
        if let Some(limit) = limit {
            params.push(("limit", limit.to_string()));
        }
        if let Some(mode) = mode {
            params.push(("mode", mode.to_owned()));
        }
        self.send(self.http.get(self.segments_url(&["memory", namespace])?).query(&params)).await
    }

    pub async fn thread(
        &self,
        thread: &str,
        last: Option<u64>,
        max_tokens: Option<u64>,
    ) -> Result<ThreadView> {
        let mut params = Vec::new();
        if let Some(last) = last {
            params.push(("last", last.to_string()));
        }
        if let Some(max_tokens) = max_tokens {
            params.push(("max_tokens", max_tokens.to_string()));
        }
        self.send(self.http.get(self.segments_url(&["threads", thread])?).query(&params)).await
    }

    pub async fn answer(&self, run: &str, body: &AnswerParams) -> Result<RunView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/answer"))).json(body)).await
    }

    pub async fn decide(&self, run: &str, call: u64, approve: bool, note: Option<String>) -> Result<RunView> {
        let body = keel_protocol::api::DecisionParams {
            decision: if approve { "approve" } else { "deny" }.to_owned(),
            note,
        };
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/approvals/{call}"))).json(&body)).await
    }

    pub async fn signal(
        &self,
        run: &str,
        body: &keel_protocol::api::SignalParams,
    ) -> Result<keel_protocol::api::MessageSentView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/signal"))).json(body)).await
    }

    pub async fn status(&self) -> Result<keel_protocol::api::StatusView> {
        self.send(self.http.get(self.url("/v1/status"))).await
    }

    pub async fn nodes(&self) -> Result<keel_protocol::api::NodesView> {
        self.send(self.http.get(self.url("/v1/nodes"))).await
    }

    pub async fn drain(&self) -> Result<keel_protocol::api::DrainView> {
        self.send(self.http.post(self.url("/v1/drain"))).await
    }

    pub async fn tools(&self) -> Result<Vec<keel_protocol::api::ToolView>> {
        self.send(self.http.get(self.url("/v1/tools"))).await
    }

    pub async fn exec(&self, body: &keel_protocol::api::ExecParams) -> Result<keel_protocol::api::ExecView> {
        self.send(self.http.post(self.url("/v1/exec")).json(body)).await
    }

    pub async fn send_message(
        &self,
        run: &str,
        body: &keel_protocol::api::MessageParams,
    ) -> Result<keel_protocol::api::MessageSentView> {
        self.send(self.http.post(self.url(&format!("/v1/runs/{run}/messages"))).json(body)).await
    }

    pub async fn audit_list(
        &self,
        run: Option<&str>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<keel_protocol::api::AuditEntryView>> {
        let mut query = vec![("after", after.to_string()), ("limit", limit.to_string())];
        if let Some(run) = run {
            query.push(("run", run.to_owned()));
        }
        self.send(self.http.get(self.url("/v1/audit")).query(&query)).await
    }

    pub async fn create_tenant(
        &self,
        body: &keel_protocol::api::CreateTenantParams,
    ) -> Result<keel_protocol::api::TenantView> {
        self.send(self.http.post(self.url("/v1/tenants")).json(body)).await
    }

    pub async fn tenants(&self) -> Result<Vec<keel_protocol::api::TenantView>> {
        self.send(self.http.get(self.url("/v1/tenants"))).await
    }

    pub async fn create_token(
        &self,
        tenant: &str,
        body: &keel_protocol::api::TokenParams,
    ) -> Result<keel_protocol::api::TokenCreatedView> {
        self.send(self.http.post(self.segments_url(&["tenants", tenant, "tokens"])?).json(body)).await
    }

    pub async fn revoke_token(
        &self,
        tenant: &str,
        prefix: &str,
    ) -> Result<keel_protocol::api::TokenRevokedView> {
        self.send(self.http.delete(self.segments_url(&["tenants", tenant, "tokens", prefix])?)).await
    }

    pub async fn audit_verify(&self) -> Result<keel_protocol::api::AuditVerifyView> {
        self.send(self.http.get(self.url("/v1/audit/verify"))).await
    }

    /// The NDJSON export as a response to read chunk by chunk (an error status is
    /// turned into the kernel's message first).
    pub async fn audit_export(&self, run: Option<&str>) -> Result<reqwest::Response> {
        let query: Vec<(&str, &str)> = run.map(|run| ("run", run)).into_iter().collect();
        let response = self
            .http
            .get(self.url("/v1/audit/export"))
            .query(&query)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("the kernel at {} did not answer", self.base))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let bytes = response.bytes().await.context("reading the kernel's reply")?;
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(anyhow!("{}", body.error.message)),
            Err(_) => Err(anyhow!("the kernel answered {status}: {}", String::from_utf8_lossy(&bytes))),
        }
    }

    /// Follows the run's events (server-sent events) of `kinds` from `after`, calling
    /// `each` for every event, until the run has ended or `each` fails (its error is
    /// returned). Reconnects if the stream drops. `kinds` should hold `state`: without
    /// it, the end of the stream is told from the run's record, read once more.
    pub async fn follow(
        &self,
        run: &str,
        mut after: u64,
        kinds: EventKinds,
        mut each: impl FnMut(&EventView) -> Result<()>,
    ) -> Result<()> {
        loop {
            let mut query = vec![("after", after.to_string()), ("follow", "true".to_owned())];
            query.extend(kinds_query(kinds));
            let response = self
                .http
                .get(self.url(&format!("/v1/runs/{run}/events")))
                .query(&query)
                .bearer_auth(&self.token)
                .send()
                .await
                .with_context(|| format!("following run {run}"))?;
            if !response.status().is_success() {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                let message =
                    serde_json::from_str::<ErrorBody>(&text).map(|b| b.error.message).unwrap_or(text);
                bail!("the kernel answered {status}: {message}");
            }
            let mut stream = response.bytes_stream();
            let mut buffer = String::new();
            let mut ended = false;
            while let Some(chunk) = stream.next().await {
                let Ok(chunk) = chunk else { break };
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let block: String = buffer.drain(..end + 2).collect();
                    let data: String = block
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(|l| l.strip_prefix(' ').unwrap_or(l))
                        .collect::<Vec<_>>()
                        .join("\n");
                    if data.is_empty() {
                        continue;
                    }
                    if let Ok(event) = serde_json::from_str::<EventView>(&data) {
                        after = event.seq;
                        if event.kind == "state" && is_terminal(&event) {
                            ended = true;
                        }
                        each(&event)?;
                    }
                }
            }
            if ended {
                return Ok(());
            }
            // The stream closed without the final state: the run may have ended with no
            // further event, or the connection dropped. Check, then resume.
            let view = self.inspect(run).await?;
            if is_terminal_state(&view.run.state) {
                let rest = self.events_of(run, after, kinds).await?;
                rest.events.iter().try_for_each(&mut each)?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The `kinds` query parameter asking for `kinds`; none for every kind.
fn kinds_query(kinds: EventKinds) -> Option<(&'static str, String)> {
    (kinds != EventKinds::ALL).then(|| ("kinds", kinds.names()))
}

pub fn is_terminal_state(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "cancelled")
}

fn is_terminal(event: &EventView) -> bool {
    event.data.get("state").and_then(|s| s.as_str()).is_some_and(is_terminal_state)
}

fn normalize(addr: &str) -> String {
    let addr = addr.trim_end_matches('/');
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// Serves `router` on `listener`: `axum::serve` with the router made into a service once.
/// Given the router itself, axum rebuilds every route (`Router::with_state`) for each
/// connection it accepts, on the one task that accepts: 60-70 µs of the daemon's CPU per
/// connection for the API's router (BENCHMARKS.md, "A router per connection"). Made once,
/// a connection costs the clone of an `Arc`. Every listener of the binary is served
/// through here (`keel-kernel`'s shape test `the_binary_serves_every_router_through_client_serve`).
pub fn serve<L>(
    listener: L,
    router: axum::Router,
) -> axum::serve::Serve<L, axum::routing::IntoMakeService<axum::Router>, axum::Router>
where
    L: axum::serve::Listener,
{
    axum::serve(listener, router.into_make_service())
}

/// Sets TCP_NODELAY on every accepted connection. Without it a streamed response's small
/// first event waits for the client's delayed ACK (about 40 ms) before it is sent.
pub fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY: {err}");
        }
    })
}

/// The kernel config: `$KEEL_CONFIG` or `<data dir>/keel.toml` if there is one. Returns
/// its path and text.
pub(crate) fn read_config(dir: &DataDir) -> Result<(PathBuf, Option<String>)> {
    let path =
        std::env::var_os("KEEL_CONFIG").map(PathBuf::from).unwrap_or_else(|| dir.root().join("keel.toml"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(err)
            if err.kind() == std::io::ErrorKind::NotFound && std::env::var_os("KEEL_CONFIG").is_none() =>
        {
            None
        }
        Err(err) => return Err(anyhow!("cannot read the kernel config {}: {err}", path.display())),
    };
    Ok((path, text))
}

/// The model providers: the `[llm]` table of the kernel config, else what the kernel's
/// environment offers (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).
fn load_llm_router(path: &std::path::Path, text: Option<&str>) -> Result<keel_llm::Router> {
    let config =
        keel_llm::LlmConfig::load(text).with_context(|| format!("kernel config {}", path.display()))?;
    keel_llm::Router::from_config(&config).with_context(|| format!("kernel config {}", path.display()))
}

/// The `[egress]` table of the kernel config: credentials the egress proxy injects (read
/// from the kernel's environment now, so a missing one is a startup error), resolve
/// overrides, and the Keel CA when there are credentials.
fn load_egress(
    dir: &DataDir,
    path: &std::path::Path,
    text: Option<&str>,
) -> Result<keel_sandbox::egress::EgressSettings> {
    let context = || format!("kernel config {}", path.display());
    let config =
        keel_sandbox::egress::EgressConfig::load(text).map_err(|e| anyhow!(e)).with_context(context)?;
    let env = |name: &str| std::env::var(name).ok();
    keel_sandbox::egress::EgressSettings::build(&config, &env, &dir.egress_ca())
        .map_err(|e| anyhow!(e))
        .with_context(context)
}

/// `KEEL_SWAP_AFTER_SECS` for the kernel embedded in `keel run` (`keel serve` has a flag).
fn swap_after_from_env() -> Option<Duration> {
    let secs =
        std::env::var("KEEL_SWAP_AFTER_SECS").ok().and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(60.0);
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

/// How `start_kernel` starts a kernel: `serving` (the daemon: it recovers interrupted
/// runs, and may join a cluster as a node serving `api_addr`) or embedded in a command.
pub struct KernelStart {
    pub serving: bool,
    pub default_llm_script: Option<serde_json::Value>,
    pub sandbox: Arc<dyn keel_sandbox::Sandbox>,
    pub swap_after: Option<Duration>,
    pub store: crate::store_url::StoreChoice,
    /// Where the daemon's HTTP API listens (the address a node advertises by default).
    pub api_addr: Option<std::net::SocketAddr>,
    /// `keel serve --max-live`: this node's own cap on live runs, over keel.toml's.
    pub max_live: Option<u32>,
}

pub async fn start_kernel(dir: DataDir, start: KernelStart) -> Result<Kernel> {
    let KernelStart { serving, default_llm_script, sandbox, swap_after, store: choice, api_addr, max_live } =
        start;
    // The provider-compatible gateway: loopback TCP for agents outside a sandbox, and a
    // Unix socket in the data directory that sandboxes bridge to.
    let gateway_tcp =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the gateway port")?;
    let (config_path, config_text) = read_config(&dir)?;
    let llm = load_llm_router(&config_path, config_text.as_deref())?;
    let egress = load_egress(&dir, &config_path, config_text.as_deref())?;
    let tools = keel_tools::config::ToolsConfig::from_keel_toml(config_text.as_deref().unwrap_or(""))
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("kernel config {}", config_path.display()))?;
    let agents = keel_kernel::AgentsConfig::from_keel_toml(config_text.as_deref().unwrap_or(""))
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("kernel config {}", config_path.display()))?;
    let mut scheduler = keel_kernel::SchedulerConfig::from_keel_toml(config_text.as_deref().unwrap_or(""))
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("kernel config {}", config_path.display()))?;
    if max_live.is_some() {
        scheduler.max_live_per_node = max_live;
    }
    // Triggers keel.toml declares, checked whole before anything starts (the daemon's).
    let declared = if serving {
        let base = config_path.parent().unwrap_or(std::path::Path::new("."));
        Some(
            keel_kernel::DeclaredTriggers::from_keel_toml(config_text.as_deref().unwrap_or(""), base)
                .map_err(|e| anyhow!("{e}"))
                .with_context(|| format!("kernel config {}", config_path.display()))?,
        )
    } else {
        None
    };
    // Interpreter workers are this binary, started with a hidden argument.
    let interp_worker = std::env::current_exe().ok().map(|program| keel_interp::WorkerCommand {
        program,
        args: vec![keel_interp::WORKER_ARG.to_owned()],
    });
    // The lock first: nothing inside the data directory is opened while another kernel
    // may be using it.
    let locked = dir.lock()?;
    let config_url = match config_text.as_deref() {
        Some(text) => crate::store_url::url_from_keel_toml(text)
            .with_context(|| format!("kernel config {}", config_path.display()))?,
        None => None,
    };
    let opened = crate::store_url::open_kernel_store(&dir, &choice, config_url, api_addr, serving).await?;
    if let Some(why) =
        keel_store::dump::migration_incomplete(opened.store.as_ref()).await.context("reading the store")?
    {
        bail!("cannot start a kernel on {}: {why}", opened.description);
    }
    tracing::info!("store: {}", opened.description);
    let options = KernelOptions {
        data_dir: locked,
        store: opened.store,
        sandbox,
        default_stop_grace: Duration::from_secs(5),
        default_llm_script,
        gateway_addr: Some(gateway_tcp.local_addr()?),
        llm,
        egress: Arc::new(egress),
        tools,
        agents,
        interp_worker,
        swap_after,
        swap_in: keel_kernel::SwapIn::default(),
        scheduler,
        cluster: opened.cluster,
        telemetry: keel_kernel::Telemetry::from_env().context("OpenTelemetry (the OTEL_* variables)")?,
    };
    let kernel = Kernel::start(options).await?;
    // Safe to replace: we hold the data directory's lock, so a socket here is stale.
    let socket_path = dir.gateway_socket();
    let _ = std::fs::remove_file(&socket_path);
    let gateway_unix = tokio::net::UnixListener::bind(&socket_path)
        .with_context(|| format!("binding the gateway socket {}", socket_path.display()))?;
    let router = keel_server::gateway_router(kernel.clone());
    let unix_router = router.clone();
    tokio::spawn(async move {
        if let Err(err) = serve(no_delay(gateway_tcp), router).await {
            tracing::error!("the LLM gateway (tcp) stopped: {err}");
        }
    });
    tokio::spawn(async move {
        if let Err(err) = serve(gateway_unix, unix_router).await {
            tracing::error!("the LLM gateway (unix socket) stopped: {err}");
        }
    });
    // Only now: relaunched agents reach the gateway at once.
    if serving {
        // The store's triggers match keel.toml before anything fires.
        if let Some(declared) = declared {
            let changes = kernel
                .declare_triggers(&declared)
                .await
                .with_context(|| format!("kernel config {}", config_path.display()))?;
            if changes != keel_kernel::DeclaredChanges::default() {
                tracing::info!(
                    "keel.toml triggers: created {:?}, updated {:?}, deleted {:?}",
                    changes.created,
                    changes.updated,
                    changes.deleted
                );
            }
        }
        kernel.start_recovery().await.context("listing the runs to recover")?;
        kernel.start_schedules();
        kernel.start_event_triggers();
    }
    Ok(kernel)
}

pub fn write_info(dir: &DataDir, addr: &str, mode: &str) -> Result<()> {
    let info = KernelInfo { addr: addr.to_owned(), pid: std::process::id(), mode: mode.to_owned() };
    let path: PathBuf = dir.kernel_info();
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, serde_json::to_vec_pretty(&info)?)?;
    std::fs::rename(&temporary, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
