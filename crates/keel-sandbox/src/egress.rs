//! The egress proxy for `network = allowlist` sandboxes. The kernel serves one per run on
//! a Unix socket that the sandbox bridges to a loopback port (`HTTP_PROXY`/`HTTPS_PROXY`
//! point there); the sandbox has no other way out. It speaks HTTP/1.1 proxying: `CONNECT
//! host:port` tunnels (HTTPS) and absolute-form plain HTTP requests. Every connection
//! attempt, allowed or denied, is reported to the kernel's audit callback.
//!
//! For hosts with a credential in the kernel's config (`egress_auth`), the proxy sets the
//! credential's header on what it forwards: on plain HTTP requests directly, and inside
//! CONNECT by terminating TLS with a Keel-signed certificate and re-originating verified
//! TLS upstream. Other CONNECTs stay blind tunnels.
//!
//! Decisions are pure (`HostPattern`, `Allowlist::decide`); the serving loop is the edge.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use crate::egress_auth::{EgressConfig, EgressSettings};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// A host pattern: `api.example.com`, `*.example.com` (any subdomain, not the apex), or
/// an IP literal; optionally `:port` (default: any port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let bad = |why: &str| Err(format!("allowed host {text:?} is not valid: {why}"));
        let text = text.trim().to_ascii_lowercase();
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => match port.parse::<u16>() {
                Ok(port) if port > 0 => (host.to_owned(), Some(port)),
                _ => return bad("the port must be 1-65535"),
            },
            _ => (text.clone(), None),
        };
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, host),
        };
        if name.is_empty()
            || name.contains('*')
            || name.contains('/')
            || name.starts_with('.')
            || name.ends_with('.')
        {
            return bad("use a host name like api.example.com or *.example.com, optionally with :port");
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':')) {
            return bad("host names use letters, digits, '.', '-' and '_'");
        }
        Ok(HostPattern { host: name, wildcard, port })
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host_ok = if self.wildcard {
            host.len() > self.host.len()
                && host.ends_with(&self.host)
                && host[..host.len() - self.host.len()].ends_with('.')
        } else {
            host == self.host
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }

    /// Whether the pattern names an address directly (then it may be any address).
    pub(crate) fn is_literal_ip(&self) -> bool {
        !self.wildcard && self.host.parse::<IpAddr>().is_ok()
    }
}

/// The hosts a run may reach.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    patterns: Vec<HostPattern>,
}

/// The proxy's verdict on one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow { literal_ip: bool },
    Deny(String),
}

impl Allowlist {
    pub fn parse(patterns: &[String]) -> Result<Allowlist, String> {
        Ok(Allowlist { patterns: patterns.iter().map(|p| HostPattern::parse(p)).collect::<Result<_, _>>()? })
    }

    pub fn decide(&self, host: &str, port: u16) -> Decision {
        match self.patterns.iter().find(|p| p.matches(host, port)) {
            Some(pattern) => Decision::Allow { literal_ip: pattern.is_literal_ip() },
            None => Decision::Deny(format!("{host}:{port} is not on the run's allowlist")),
        }
    }
}

/// Addresses a name must never resolve to unless the allowlist names them literally:
/// loopback (the host's own services), link-local (cloud metadata at 169.254.169.254),
/// unspecified, multicast, broadcast.
pub fn forbidden_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_address(IpAddr::V4(v4));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// One connection attempt, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEvent {
    pub allowed: bool,
    pub host: String,
    pub port: u16,
    /// `CONNECT`, or the HTTP method of a plain request.
    pub method: String,
    /// Why it was denied or failed.
    pub reason: Option<String>,
    /// The header the proxy injected from the kernel's config (its name, never the value).
    pub credential: Option<String>,
}

pub type Audit = Arc<dyn Fn(EgressEvent) + Send + Sync>;

/// A running proxy; dropping it stops the proxy and removes its socket.
pub struct EgressProxy {
    task: tokio::task::JoinHandle<()>,
    path: std::path::PathBuf,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl EgressProxy {
    /// Listens on `path` (replacing a stale socket) and serves until dropped.
    pub fn start(
        path: &std::path::Path,
        allowlist: Allowlist,
        settings: Arc<EgressSettings>,
        audit: Audit,
    ) -> std::io::Result<EgressProxy> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let allowlist = Arc::new(allowlist);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let allowlist = allowlist.clone();
                let settings = settings.clone();
                let audit = audit.clone();
                tokio::spawn(async move { serve(stream, &allowlist, &settings, &audit).await });
            }
        });
        Ok(EgressProxy { task, path: path.to_path_buf() })
    }
}

const MAX_HEAD: usize = 64 * 1024;

/// Reads the request head (through the blank line). Returns it and any bytes after it.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok(Some((buffer, rest)));
        }
        if buffer.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// A parsed proxy request: the target and, for plain HTTP, the head to send upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRequest {
    pub method: String,
    pub host: String,
    pub port: u16,
    /// `None` for CONNECT; else the request rewritten to origin form, `Connection: close`.
    pub upstream_head: Option<Vec<u8>>,
}

/// Parses a proxy request head. Pure.
pub fn parse_request(head: &[u8]) -> Result<ProxyRequest, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_owned())?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("malformed request line {request_line:?}"));
    };
    let split_host_port = |authority: &str, default: u16| -> Result<(String, u16), String> {
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or("malformed IPv6 address")?;
            (host.to_owned(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (authority.to_owned(), None),
            }
        };
        let port = match port {
            Some(port) => port.parse().map_err(|_| format!("bad port in {authority:?}"))?,
            None => default,
        };
        if host.is_empty() {
            return Err(format!("no host in {authority:?}"));
        }
        Ok((host, port))
    };
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, 443)?;
        return Ok(ProxyRequest { method: method.into(), host, port, upstream_head: None });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(format!(
            "only absolute http:// requests and CONNECT are proxied, got {target:?}; for HTTPS use CONNECT (what HTTPS_PROXY clients do)"
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host_port(authority, 80)?;
    let mut upstream = format!("{method} {path} {version}\r\n");
    let mut has_host = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        has_host |= name == "host";
        upstream.push_str(line);
        upstream.push_str("\r\n");
    }
    if !has_host {
        upstream.push_str(&format!("Host: {authority}\r\n"));
    }
    // One request per connection, so every request passes the allowlist.
    upstream.push_str("Connection: close\r\n\r\n");
    Ok(ProxyRequest { method: method.into(), host, port, upstream_head: Some(upstream.into_bytes()) })
}

async fn respond(stream: &mut UnixStream, status: &str, message: &str) {
    let body = format!("keel egress proxy: {message}\n");
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
}

async fn connect(
    host: &str,
    port: u16,
    literal_ip: bool,
    settings: &EgressSettings,
) -> Result<TcpStream, String> {
    // Names the kernel's config resolves itself (`egress.resolve`) may be any address.
    if let Some(ip) = settings.resolve(host) {
        let address = SocketAddr::new(ip, port);
        return match tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(format!("connecting to {address} ({host} in egress.resolve): {e}")),
            Err(_) => Err(format!("connecting to {address} ({host} in egress.resolve) timed out")),
        };
    }
    let addresses: Vec<SocketAddr> =
        tokio::time::timeout(Duration::from_secs(10), tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| format!("resolving {host} timed out"))?
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect();
    let allowed: Vec<SocketAddr> =
        addresses.iter().copied().filter(|a| literal_ip || !forbidden_address(a.ip())).collect();
    if allowed.is_empty() {
        return Err(if addresses.is_empty() {
            format!("{host} has no address")
        } else {
            format!(
                "{host} resolves only to loopback, link-local or other internal addresses, which the proxy never reaches by name"
            )
        });
    }
    let mut last = String::new();
    for address in allowed {
        match tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = format!("connecting to {address}: {e}"),
            Err(_) => last = format!("connecting to {address} timed out"),
        }
    }
    Err(last)
}

async fn serve(mut stream: UnixStream, allowlist: &Allowlist, settings: &EgressSettings, audit: &Audit) {
    let Ok(Some((head, rest))) = read_head(&mut stream).await else { return };
    let request = match parse_request(&head) {
        Ok(request) => request,
        Err(message) => {
            respond(&mut stream, "400 Bad Request", &message).await;
            return;
        }
    };
    let credential = settings.credential_for(&request.host, request.port);
    let event = |allowed: bool, reason: Option<String>| EgressEvent {
        allowed,
        host: request.host.clone(),
        port: request.port,
        method: request.method.clone(),
        reason,
        credential: if allowed { credential.map(|c| c.header.clone()) } else { None },
    };
    let literal_ip = match allowlist.decide(&request.host, request.port) {
        Decision::Allow { literal_ip } => literal_ip,
        Decision::Deny(reason) => {
            audit(event(false, Some(reason.clone())));
            respond(&mut stream, "403 Forbidden", &reason).await;
            return;
        }
    };
    let mut upstream = match connect(&request.host, request.port, literal_ip, settings).await {
        Ok(upstream) => upstream,
        Err(reason) => {
            audit(event(false, Some(reason.clone())));
            respond(&mut stream, "502 Bad Gateway", &reason).await;
            return;
        }
    };
    // CONNECT to a host with a credential: intercept, so the header can be set.
    if let (None, Some(credential), Some(tls)) = (&request.upstream_head, credential, settings.interception())
    {
        if stream.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await.is_err() {
            return;
        }
        match intercept(stream, rest, upstream, &request.host, credential, tls).await {
            Ok(Some(forward)) => {
                audit(event(true, None));
                forward.await;
            }
            Ok(None) => {
                audit(event(false, Some("the client closed the tunnel before sending a request".into())))
            }
            Err(reason) => audit(event(false, Some(reason))),
        }
        return;
    }
    audit(event(true, None));
    let sent = match (&request.upstream_head, credential) {
        (None, _) => stream.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await,
        (Some(head), Some(credential)) => {
            upstream
                .write_all(&crate::egress_auth::set_header(head, &credential.header, credential.value()))
                .await
        }
        (Some(head), None) => upstream.write_all(head).await,
    };
    if sent.is_err() || (!rest.is_empty() && upstream.write_all(&rest).await.is_err()) {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
}

/// Terminates the agent's TLS with a Keel-signed certificate for `host`, opens verified
/// TLS to the real host, reads the agent's first request and forwards it with the
/// credential set. Returns the forwarding to run once audited, `None` when the agent went
/// away before sending a request, or why interception failed.
async fn intercept(
    agent: UnixStream,
    early: Vec<u8>,
    upstream: TcpStream,
    host: &str,
    credential: &crate::egress_auth::Credential,
    tls: &crate::egress_auth::Interception,
) -> Result<Option<impl std::future::Future<Output = ()> + use<>>, String> {
    if !early.is_empty() {
        return Err("the client sent data before the tunnel was established".into());
    }
    let server = tls.server_config(host)?;
    let mut agent =
        tokio::time::timeout(Duration::from_secs(30), tokio_rustls::TlsAcceptor::from(server).accept(agent))
            .await
            .map_err(|_| "TLS handshake with the agent timed out".to_owned())?
            .map_err(|e| format!("TLS handshake with the agent failed (does it trust the Keel CA?): {e}"))?;
    let name = crate::egress_auth::Interception::server_name(host)?;
    let mut upstream = tokio::time::timeout(Duration::from_secs(30), tls.connector().connect(name, upstream))
        .await
        .map_err(|_| format!("TLS handshake with {host} timed out"))?
        .map_err(|e| format!("TLS to {host} failed verification or handshake: {e}"))?;
    let Ok(Some((head, rest))) = read_head(&mut agent).await else { return Ok(None) };
    let head = crate::egress_auth::tunnel_request_head(&head)?;
    let head = crate::egress_auth::set_header(&head, &credential.header, credential.value());
    upstream.write_all(&head).await.map_err(|e| format!("writing to {host}: {e}"))?;
    if !rest.is_empty() {
        upstream.write_all(&rest).await.map_err(|e| format!("writing to {host}: {e}"))?;
    }
    Ok(Some(async move { forward_one(agent, upstream).await }))
}

/// Copies the rest of one request up and its response down; done when the response ends.
async fn forward_one<A, U>(agent: A, upstream: U)
where
    A: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut agent_read, mut agent_write) = tokio::io::split(agent);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let up = async {
        let _ = tokio::io::copy(&mut agent_read, &mut upstream_write).await;
        std::future::pending::<()>().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut upstream_read, &mut agent_write).await;
        let _ = agent_write.shutdown().await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_hosts_subdomains_and_ports() {
        let exact = HostPattern::parse("API.example.com").unwrap();
        assert!(exact.matches("api.example.com", 443));
        assert!(exact.matches("api.example.com.", 80));
        assert!(!exact.matches("evil-api.example.com", 443));
        let wild = HostPattern::parse("*.example.com").unwrap();
        assert!(wild.matches("a.b.example.com", 443));
        assert!(!wild.matches("example.com", 443), "the apex needs its own entry");
        assert!(!wild.matches("badexample.com", 443));
        let port = HostPattern::parse("example.com:8443").unwrap();
        assert!(port.matches("example.com", 8443) && !port.matches("example.com", 443));
        for bad in ["", "*", "*.", "a/b", "ex*ample.com", "example.com:0", "example.com:http", ".example.com"]
        {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_allowlist_decides() {
        let list = Allowlist::parse(&["api.example.com".into(), "10.0.0.5".into()]).unwrap();
        assert_eq!(list.decide("api.example.com", 443), Decision::Allow { literal_ip: false });
        assert_eq!(list.decide("10.0.0.5", 80), Decision::Allow { literal_ip: true });
        assert!(
            matches!(list.decide("evil.com", 443), Decision::Deny(reason) if reason.contains("evil.com:443"))
        );
    }

    #[test]
    fn internal_addresses_are_never_reached_by_name() {
        for ip in
            ["127.0.0.1", "169.254.169.254", "0.0.0.0", "::1", "fe80::1", "::ffff:127.0.0.1", "224.0.0.1"]
        {
            assert!(forbidden_address(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "10.1.2.3", "2606:2800:220:1::1"] {
            assert!(!forbidden_address(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn requests_parse_into_targets_and_one_shot_upstream_heads() {
        let connect =
            parse_request(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n")
                .unwrap();
        assert_eq!(
            (connect.host.as_str(), connect.port, connect.upstream_head),
            ("api.example.com", 443, None)
        );
        let plain = parse_request(
            b"GET http://example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!((plain.host.as_str(), plain.port), ("example.com", 80));
        let head = String::from_utf8(plain.upstream_head.unwrap()).unwrap();
        assert_eq!(head, "GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n");
        let v6 = parse_request(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 8080));
        assert!(parse_request(b"GET /relative HTTP/1.1\r\n\r\n").unwrap_err().contains("absolute"));
        assert!(parse_request(b"nonsense\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn the_proxy_tunnels_allowed_hosts_refuses_others_and_audits_both() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = upstream.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    let _ = socket.write_all(&buffer[..n]).await;
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.sock");
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        let audit: Audit = Arc::new(move |event| seen.lock().unwrap().push(event));
        let _proxy = EgressProxy::start(
            &path,
            Allowlist::parse(&["127.0.0.1".into()]).unwrap(),
            Arc::default(),
            audit,
        )
        .unwrap();

        let mut client = UnixStream::connect(&path).await.unwrap();
        client.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut reply = vec![0u8; 39];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"HTTP/1.1 200 Connection Established\r\n\r\n");
        client.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        client.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");

        let mut denied = UnixStream::connect(&path).await.unwrap();
        denied.write_all(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n").await.unwrap();
        let mut text = String::new();
        denied.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 403"), "{text}");

        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 2);
        assert!(events[0].allowed && events[0].port == port);
        assert!(!events[1].allowed && events[1].host == "evil.example");
    }
}

#[cfg(test)]
mod interception_tests {
    use super::*;
    use crate::egress_auth::{CredentialConfig, EgressConfig, EgressSettings};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    /// A TLS server for `name` with a certificate from a fresh CA; answers each request
    /// with the request head it received. Returns its port and the CA's PEM.
    async fn upstream(name: &str) -> (u16, String) {
        let mut ca = rcgen::CertificateParams::default();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "test upstream CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca, &ca_key))
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else { return };
                    let Ok(Some((head, _))) = read_head(&mut tls).await else { return };
                    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", head.len());
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.write_all(&head).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, ca_pem)
    }

    /// Through the proxy at `path`: CONNECT, TLS trusting only the Keel CA, one request.
    async fn fetch(path: &std::path::Path, ca_dir: &std::path::Path, host: &str, port: u16) -> String {
        let mut stream = UnixStream::connect(path).await.unwrap();
        stream.write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let (reply, _) = read_head(&mut stream).await.unwrap().unwrap();
        assert!(reply.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&reply));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_dir.join("ca-cert.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream).await.unwrap();
        tls.write_all(format!("GET /x HTTP/1.1\r\nHost: {host}\r\nAuthorization: mine\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut text = Vec::new();
        let _ = tls.read_to_end(&mut text).await;
        String::from_utf8_lossy(&text).into_owned()
    }

    async fn proxy(
        dir: &std::path::Path,
        extra_roots: Vec<std::path::PathBuf>,
    ) -> (EgressProxy, Arc<std::sync::Mutex<Vec<EgressEvent>>>) {
        let config = EgressConfig {
            credentials: vec![CredentialConfig {
                host: "api.test.internal".into(),
                header: "Authorization".into(),
                value: Some("k3y".into()),
                prefix: Some("Bearer ".into()),
                ..CredentialConfig::default()
            }],
            extra_roots,
            resolve: [("api.test.internal".to_owned(), "127.0.0.1".to_owned())].into(),
        };
        let settings = EgressSettings::build(&config, &|_| None, &dir.join("ca")).unwrap();
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        let audit: Audit = Arc::new(move |event| seen.lock().unwrap().push(event));
        let allow = Allowlist::parse(&["api.test.internal".into()]).unwrap();
        (EgressProxy::start(&dir.join("egress.sock"), allow, Arc::new(settings), audit).unwrap(), events)
    }

    #[tokio::test]
    async fn intercepted_https_gets_the_credential_and_a_verified_upstream() {
        let (port, ca_pem) = upstream("api.test.internal").await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("upstream-ca.pem"), ca_pem).unwrap();
        let (_proxy, events) = proxy(dir.path(), vec![dir.path().join("upstream-ca.pem")]).await;
        let response =
            fetch(&dir.path().join("egress.sock"), &dir.path().join("ca"), "api.test.internal", port).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("\r\nAuthorization: Bearer k3y\r\n"), "{response}");
        assert!(!response.contains("mine") && response.contains("Connection: close"), "{response}");
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 1);
        assert!(events[0].allowed && events[0].credential.as_deref() == Some("Authorization"));
    }

    #[tokio::test]
    async fn an_upstream_that_fails_verification_gets_nothing() {
        let (port, _) = upstream("api.test.internal").await;
        let dir = tempfile::tempdir().unwrap();
        // The upstream's CA is not trusted: the proxy must not send it the credential.
        let (_proxy, events) = proxy(dir.path(), Vec::new()).await;
        let response =
            fetch(&dir.path().join("egress.sock"), &dir.path().join("ca"), "api.test.internal", port).await;
        assert!(response.is_empty(), "{response}");
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 1);
        assert!(!events[0].allowed && events[0].credential.is_none(), "{events:?}");
        assert!(events[0].reason.as_deref().unwrap().contains("verification"), "{events:?}");
    }
}
