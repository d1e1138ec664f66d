//! Credentials the egress proxy injects for allowed hosts, so agents never hold them.
//!
//! The kernel's `keel.toml` lists them in an `[egress]` table (see the README). For plain
//! HTTP the proxy sets the header on the request it forwards. For HTTPS the proxy can only
//! add a header if it can read the request, so for a host with a credential (and only
//! then) it terminates the agent's TLS with a leaf certificate signed by the Keel CA (made
//! once in the data directory; sandboxes trust it through a CA bundle Keel binds in),
//! injects the header, and re-originates TLS to the real host, verified against the
//! system roots plus `egress.extra_roots`. Hosts without a credential stay blind tunnels.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;

use crate::egress::HostPattern;

/// The `[egress]` table of the kernel's config, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    #[serde(default)]
    pub credentials: Vec<CredentialConfig>,
    /// PEM files of extra roots the proxy trusts when it re-originates TLS.
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
    /// Host name -> address, for testing and private networks: names listed here are
    /// connected to at that address, even a loopback or internal one (which the proxy
    /// otherwise never reaches by name). The name must still be on the run's allowlist.
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
}

/// One `[[egress.credentials]]` entry.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub host: String,
    pub header: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub value_env: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
}

impl std::fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialConfig")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .field("value_env", &self.value_env)
            .finish()
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    egress: EgressConfig,
}

impl EgressConfig {
    /// The `[egress]` table of a `keel.toml` (other tables are not ours); none: empty.
    pub fn load(text: Option<&str>) -> Result<EgressConfig, String> {
        let Some(text) = text else { return Ok(EgressConfig::default()) };
        let file: ConfigFile = toml::from_str(text).map_err(|e| format!("[egress]: {e}"))?;
        Ok(file.egress)
    }
}

/// A header the proxy sets for matching hosts. The value never leaves the kernel.
#[derive(Clone)]
pub struct Credential {
    pattern: HostPattern,
    pub header: String,
    value: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("pattern", &self.pattern).field("header", &self.header).finish()
    }
}

impl Credential {
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// Headers the proxy owns or that would change how a request is framed.
const RESERVED_HEADERS: [&str; 6] =
    ["host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"];

fn valid_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Validates one entry and reads its secret (`value`, or `value_env` from `env`).
pub fn credential(
    entry: &CredentialConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Credential, String> {
    let at = format!("[[egress.credentials]] host = {:?}", entry.host);
    let pattern = HostPattern::parse(&entry.host).map_err(|e| format!("{at}: {e}"))?;
    let header = entry.header.trim();
    if !valid_header_name(header) {
        return Err(format!("{at}: header {:?} is not a valid HTTP header name", entry.header));
    }
    let lower = header.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
        return Err(format!("{at}: the proxy cannot inject {header:?}; use a header like Authorization"));
    }
    let secret = match (&entry.value, &entry.value_env) {
        (Some(value), None) => value.clone(),
        (None, Some(name)) => match env(name) {
            Some(value) if !value.is_empty() => value,
            _ => {
                return Err(format!(
                    "{at}: value_env = {name:?}, but the kernel's environment has no {name} (set it where the kernel starts)"
                ));
            }
        },
        (Some(_), Some(_)) => return Err(format!("{at}: give `value` or `value_env`, not both")),
        (None, None) => return Err(format!("{at}: needs `value_env = \"NAME\"` (or `value`)")),
    };
    let value = format!("{}{secret}", entry.prefix.as_deref().unwrap_or_default());
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(format!("{at}: the value (or prefix) contains a line break or NUL"));
    }
    Ok(Credential { pattern, header: header.to_owned(), value })
}

/// What the kernel's egress proxies share: credentials, resolve overrides, and the TLS
/// interception material when there are credentials.
#[derive(Default)]
pub struct EgressSettings {
    credentials: Vec<Credential>,
    resolve: HashMap<String, IpAddr>,
    tls: Option<Interception>,
}

impl std::fmt::Debug for EgressSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSettings")
            .field("credentials", &self.credentials)
            .field("resolve", &self.resolve)
            .field("intercepts", &self.tls.is_some())
            .finish()
    }
}

impl EgressSettings {
    /// Validates the config; with credentials, loads or creates the Keel CA in `ca_dir`
    /// and writes the sandboxes' CA bundle there.
    pub fn build(
        config: &EgressConfig,
        env: &dyn Fn(&str) -> Option<String>,
        ca_dir: &Path,
    ) -> Result<EgressSettings, String> {
        let credentials =
            config.credentials.iter().map(|c| credential(c, env)).collect::<Result<Vec<_>, _>>()?;
        let mut resolve = HashMap::new();
        for (name, address) in &config.resolve {
            let pattern = HostPattern::parse(name).map_err(|e| format!("[egress.resolve]: {e}"))?;
            if name.contains('*') || name.contains(':') || pattern.is_literal_ip() {
                return Err(format!(
                    "[egress.resolve]: {name:?} must be a plain host name (no wildcard, no port)"
                ));
            }
            let ip: IpAddr = address
                .parse()
                .map_err(|_| format!("[egress.resolve]: {name} = {address:?} is not an IP address"))?;
            resolve.insert(name.trim().trim_end_matches('.').to_ascii_lowercase(), ip);
        }
        let mut roots = Vec::new();
        for path in &config.extra_roots {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("[egress] extra_roots: cannot read {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("[egress] extra_roots: {} holds no PEM certificate", path.display()));
            }
            roots.extend(certs);
        }
        let tls = if credentials.is_empty() { None } else { Some(Interception::new(ca_dir, roots)?) };
        Ok(EgressSettings { credentials, resolve, tls })
    }

    /// The credential for a host, if one is configured (the first matching entry).
    pub fn credential_for(&self, host: &str, port: u16) -> Option<&Credential> {
        self.credentials.iter().find(|c| c.pattern.matches(host, port))
    }

    /// The configured address of a name listed in `egress.resolve`.
    pub fn resolve(&self, host: &str) -> Option<IpAddr> {
        self.resolve.get(&host.trim_end_matches('.').to_ascii_lowercase()).copied()
    }

    /// The CA bundle (system roots + the Keel CA) sandboxes trust, when the proxy intercepts.
    pub fn ca_bundle(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.bundle.as_path())
    }

    pub(crate) fn interception(&self) -> Option<&Interception> {
        self.tls.as_ref()
    }
}

fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The Keel CA and the TLS configurations of intercepted connections.
pub(crate) struct Interception {
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
    ca_der: CertificateDer<'static>,
    client: Arc<rustls::ClientConfig>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    bundle: PathBuf,
}

const CA_CERT: &str = "ca-cert.pem";
const CA_KEY: &str = "ca-key.pem";
const BUNDLE: &str = "ca-bundle.pem";

fn ca_params() -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, "Keel egress proxy CA");
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "Keel");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The host system's CA bundle, if it has one where OpenSSL-based clients look.
fn system_bundle() -> Option<String> {
    let candidates = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from).into_iter().chain(
        ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"]
            .into_iter()
            .map(PathBuf::from),
    );
    candidates.filter_map(|p| std::fs::read_to_string(p).ok()).find(|t| t.contains("BEGIN CERTIFICATE"))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())
}

impl Interception {
    fn new(dir: &Path, extra_roots: Vec<CertificateDer<'static>>) -> Result<Interception, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("the Keel egress CA in {}: {what}: {e}", dir.display())
        };
        std::fs::create_dir_all(dir).map_err(|e| fail("creating the directory", &e))?;
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        let params = ca_params();
        if !key_path.exists() || !cert_path.exists() {
            let key = rcgen::KeyPair::generate().map_err(|e| fail("generating a key", &e))?;
            let cert = params.self_signed(&key).map_err(|e| fail("signing", &e))?;
            let _ = std::fs::remove_file(&key_path);
            write_private(&key_path, &key.serialize_pem()).map_err(|e| fail("writing the key", &e))?;
            std::fs::write(&cert_path, cert.pem()).map_err(|e| fail("writing the certificate", &e))?;
        }
        let key_pem = std::fs::read_to_string(&key_path).map_err(|e| fail("reading the key", &e))?;
        let ca_key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| fail("parsing the key", &e))?;
        let cert_pem =
            std::fs::read_to_string(&cert_path).map_err(|e| fail("reading the certificate", &e))?;
        let ca_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| fail("parsing the certificate", &e))?;

        // The bundle sandboxes trust: the host's roots plus the Keel CA.
        let mut bundle_text = system_bundle().unwrap_or_default();
        if !bundle_text.is_empty() && !bundle_text.ends_with('\n') {
            bundle_text.push('\n');
        }
        bundle_text.push_str("# Keel egress proxy CA\n");
        bundle_text.push_str(&cert_pem);
        let bundle = dir.join(BUNDLE);
        let temporary = dir.join(format!("{BUNDLE}.tmp"));
        std::fs::write(&temporary, bundle_text)
            .and_then(|()| std::fs::rename(&temporary, &bundle))
            .map_err(|e| fail("writing the CA bundle", &e))?;

        // Upstream TLS: the system roots plus extra_roots.
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        for root in extra_roots {
            roots.add(root).map_err(|e| fail("adding an extra root", &e))?;
        }
        let mut client = rustls::ClientConfig::builder_with_provider(crypto())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail("TLS client", &e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interception {
            ca_key,
            ca_params: params,
            ca_der,
            client: Arc::new(client),
            leaves: Mutex::new(HashMap::new()),
            bundle,
        })
    }

    /// A TLS server configuration presenting a Keel-signed certificate for `host`.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(&host) {
            return Ok(config.clone());
        }
        let fail = |e: &dyn std::fmt::Display| format!("making a certificate for {host}: {e}");
        let mut params = rcgen::CertificateParams::new(vec![host.clone()]).map_err(|e| fail(&e))?;
        params.distinguished_name.push(rcgen::DnType::CommonName, host.clone());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().map_err(|e| fail(&e))?;
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).map_err(|e| fail(&e))?;
        let key_der = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| fail(&e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(crypto())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.ca_der.clone()], key_der)
            .map_err(|e| fail(&e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host, config.clone());
        Ok(config)
    }

    pub(crate) fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client.clone())
    }

    pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
        ServerName::try_from(host.trim_end_matches('.').to_owned())
            .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))
    }
}

/// Sets (replaces) `name: value` in a request head that ends with the blank line. Pure.
pub fn set_header(head: &[u8], name: &str, value: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let body = text.strip_suffix("\r\n\r\n").unwrap_or(&text);
    let mut out = String::with_capacity(head.len() + name.len() + value.len() + 4);
    for (i, line) in body.split("\r\n").enumerate() {
        let header = line.split(':').next().unwrap_or_default().trim();
        if i > 0 && header.eq_ignore_ascii_case(name) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("{name}: {value}\r\n\r\n"));
    out.into_bytes()
}

/// Rewrites the head of a request read from inside an intercepted tunnel for upstream:
/// hop-by-hop headers dropped, one request per connection. Pure.
pub fn tunnel_request_head(head: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_owned())?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    if request_line.split(' ').count() != 3 {
        return Err(format!("malformed request line {request_line:?}"));
    }
    let mut out = format!("{request_line}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" || name == "upgrade" {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, header: &str) -> CredentialConfig {
        CredentialConfig {
            host: host.into(),
            header: header.into(),
            value_env: Some("TOKEN".into()),
            prefix: Some("Bearer ".into()),
            ..CredentialConfig::default()
        }
    }

    #[test]
    fn the_config_parses_and_validates_with_clear_errors() {
        let text = r#"
            [llm]
            anything = "not ours"
            [[egress.credentials]]
            host = "api.github.com"
            header = "Authorization"
            value_env = "TOKEN"
            prefix = "Bearer "
        "#;
        let config = EgressConfig::load(Some(text)).unwrap();
        assert_eq!(config.credentials.len(), 1);
        let env = |name: &str| (name == "TOKEN").then(|| "s3cret".to_owned());
        let made = credential(&config.credentials[0], &env).unwrap();
        assert_eq!((made.header.as_str(), made.value()), ("Authorization", "Bearer s3cret"));
        assert!(!format!("{made:?}").contains("s3cret"), "Debug never shows the secret");

        let no_env = |_: &str| None;
        let err = credential(&entry("api.github.com", "Authorization"), &no_env).unwrap_err();
        assert!(err.contains("TOKEN") && err.contains("environment"), "{err}");
        for (host, header, why) in [
            ("api.github.com", "Bad Header", "header name"),
            ("api.github.com", "Host", "cannot inject"),
            ("api.github.com", "Proxy-Authorization", "cannot inject"),
            ("ex*ample.com", "Authorization", "not valid"),
        ] {
            let err = credential(&entry(host, header), &env).unwrap_err();
            assert!(err.contains(why), "{host} {header}: {err}");
        }
        let both = CredentialConfig { value: Some("x".into()), ..entry("a.example", "X-Key") };
        assert!(credential(&both, &env).unwrap_err().contains("not both"));
        let newline = CredentialConfig { prefix: Some("a\r\nEvil: 1".into()), ..entry("a.example", "X-Key") };
        assert!(credential(&newline, &env).unwrap_err().contains("line break"));
        assert!(EgressConfig::load(Some("[egress]\nunknown = 1\n")).unwrap_err().contains("unknown"));
        assert!(EgressConfig::load(None).unwrap().credentials.is_empty());
    }

    #[test]
    fn resolve_overrides_only_plain_names() {
        let dir = tempfile::tempdir().unwrap();
        let env = |_: &str| None;
        let mut config = EgressConfig::default();
        config.resolve.insert("api.test.internal".into(), "127.0.0.1".into());
        let settings = EgressSettings::build(&config, &env, dir.path()).unwrap();
        assert_eq!(settings.resolve("API.test.internal."), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(settings.resolve("other.internal"), None);
        assert!(settings.ca_bundle().is_none(), "no credentials: no CA, no interception");
        for bad in ["*.test.internal", "api.test.internal:443"] {
            let mut config = EgressConfig::default();
            config.resolve.insert(bad.into(), "127.0.0.1".into());
            assert!(EgressSettings::build(&config, &env, dir.path()).is_err(), "{bad}");
        }
        let mut config = EgressConfig::default();
        config.resolve.insert("a.internal".into(), "localhost".into());
        assert!(EgressSettings::build(&config, &env, dir.path()).unwrap_err().contains("not an IP"));
    }

    #[test]
    fn the_ca_is_made_once_and_signs_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let env = |_: &str| Some("s3cret".to_owned());
        let config = EgressConfig {
            credentials: vec![entry("api.example.com", "Authorization")],
            ..Default::default()
        };
        let first = EgressSettings::build(&config, &env, dir.path()).unwrap();
        let cert = std::fs::read_to_string(dir.path().join(CA_CERT)).unwrap();
        let second = EgressSettings::build(&config, &env, dir.path()).unwrap();
        assert_eq!(cert, std::fs::read_to_string(dir.path().join(CA_CERT)).unwrap(), "made once");
        let bundle = std::fs::read_to_string(second.ca_bundle().unwrap()).unwrap();
        assert!(bundle.ends_with(&cert) && !bundle.contains("s3cret"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(CA_KEY)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the CA key is private");
        assert!(first.interception().unwrap().server_config("api.example.com").is_ok());
        assert_eq!(
            first.credential_for("api.example.com", 443).map(|c| c.header.as_str()),
            Some("Authorization")
        );
        assert!(first.credential_for("other.example.com", 443).is_none());
    }

    #[test]
    fn headers_are_replaced_and_tunnel_heads_are_one_shot() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nauthorization: mine\r\nAccept: */*\r\n\r\n";
        let set = String::from_utf8(set_header(head, "Authorization", "Bearer k")).unwrap();
        assert_eq!(set, "GET / HTTP/1.1\r\nHost: a\r\nAccept: */*\r\nAuthorization: Bearer k\r\n\r\n");
        let tunnel = tunnel_request_head(
            b"POST /x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nProxy-Authorization: p\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(tunnel).unwrap(),
            "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
        assert!(tunnel_request_head(b"garbage\r\n\r\n").is_err());
    }
}
