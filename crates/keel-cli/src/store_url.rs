//! Stores named by URL: `sqlite:PATH` (or a plain path) and `postgres://...`, parsed into
//! a `StoreUrl`; `open_store`, the one place a store is opened from a URL (the target of
//! `keel migrate`, and the kernel's); and `open_kernel_store`, which picks a kernel's
//! store (`--store`, `KEEL_STORE_URL`, keel.toml's `[store] url`, else the data
//! directory's SQLite file) and, on Postgres, joins the cluster of nodes on it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_kernel::DataDir;

use anyhow::{Context, Result, bail};
use keel_store::{SqliteStore, Store};

/// A store's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A Postgres connection URL, as given.
    Postgres(String),
}

impl StoreUrl {
    /// Reads `sqlite:PATH` (also `sqlite://PATH`), `postgres://...` or `postgresql://...`,
    /// or a plain path (an SQLite file). Anything else that starts like a URL scheme is
    /// refused rather than taken for a file name.
    pub fn parse(text: &str) -> Result<StoreUrl> {
        let text = text.trim();
        if text.is_empty() {
            bail!("the store URL is empty: give sqlite:PATH or postgres://USER@HOST/DB");
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(text.to_owned()));
        }
        if let Some(path) = text.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                bail!("`{text}` names no file: write sqlite:PATH, e.g. sqlite:/var/lib/keel/keel.db");
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = text.split_once(':')
            && is_scheme(scheme)
        {
            bail!(
                "unknown store scheme `{scheme}:` in `{text}`: use sqlite:PATH (or a plain path) or \
                 postgres://USER@HOST/DB (for a file whose name holds a colon, write sqlite:{text})"
            );
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(text)))
    }
}

/// Whether `text` reads as a URL scheme (RFC 3986: a letter, then letters, digits, `+`,
/// `-` or `.`), so `redis:...` is refused while `./a:b` stays a path.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// For messages: the URL with any password hidden.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&keel_store::postgres::redact_url(url)),
        }
    }
}

/// Opens the store `url` names, creating an SQLite file (and its directory) if missing.
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>> {
    match StoreUrl::parse(url)? {
        StoreUrl::Sqlite(path) => {
            if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating the directory {}", parent.display()))?;
            }
            let opened = path.clone();
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(&opened))
                .await
                .context("opening the store")?
                .with_context(|| format!("opening the SQLite store {}", path.display()))?;
            Ok(Arc::new(store))
        }
        StoreUrl::Postgres(url) => {
            Ok(Arc::new(connect_postgres(&url, keel_store::postgres::DEFAULT_POOL_SIZE).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_and_plain_paths_are_files() {
        for (text, path) in [
            ("sqlite:/var/keel.db", "/var/keel.db"),
            ("sqlite:///var/keel.db", "/var/keel.db"),
            ("sqlite:rel/keel.db", "rel/keel.db"),
            ("/var/keel.db", "/var/keel.db"),
            ("./a:b.db", "./a:b.db"),
            ("sqlite:a:b.db", "a:b.db"),
        ] {
            assert_eq!(StoreUrl::parse(text).unwrap(), StoreUrl::Sqlite(PathBuf::from(path)), "{text}");
        }
    }

    #[test]
    fn postgres_urls_keep_their_text_and_hide_the_password() {
        let url = StoreUrl::parse("postgresql://keel:secret@db:5432/keel").unwrap();
        assert_eq!(url, StoreUrl::Postgres("postgresql://keel:secret@db:5432/keel".to_owned()));
        assert_eq!(url.to_string(), "postgresql://keel:***@db:5432/keel");
        let plain = StoreUrl::parse("postgres://postgres@127.0.0.1/test").unwrap();
        assert_eq!(plain.to_string(), "postgres://postgres@127.0.0.1/test");
    }

    #[test]
    fn unknown_schemes_and_empty_urls_are_refused_with_the_fix() {
        let error = StoreUrl::parse("mysql://db/keel").unwrap_err().to_string();
        assert!(error.contains("unknown store scheme `mysql:`") && error.contains("sqlite:PATH"), "{error}");
        let error = StoreUrl::parse("sqlite:").unwrap_err().to_string();
        assert!(error.contains("names no file"), "{error}");
        assert!(StoreUrl::parse("  ").unwrap_err().to_string().contains("empty"));
    }
}

/// Where a kernel keeps its state (`keel serve --store`, `KEEL_STORE_URL`, or the
/// `[store]` table of keel.toml; the data directory's SQLite file when none names one),
/// and on a shared database who this kernel is among the nodes.
#[derive(Debug, Clone, Default)]
pub struct StoreChoice {
    /// The store URL given on the command line or in the environment.
    pub url: Option<String>,
    /// `--node-id`; default: the host's name and a digest of the data directory.
    pub node_id: Option<String>,
    /// `--advertise`: the API address other nodes forward requests to.
    pub advertise: Option<String>,
    /// `--lease-ttl`: how long a node's heartbeat, and so its runs' leases, lasts.
    pub lease_ttl: Duration,
    /// `--store-pool`: the most connections to a Postgres store.
    pub pool_size: usize,
}

impl StoreChoice {
    /// What a kernel embedded in a command uses: `KEEL_STORE_URL` (or keel.toml).
    pub fn from_env() -> StoreChoice {
        StoreChoice {
            url: std::env::var("KEEL_STORE_URL").ok().filter(|url| !url.trim().is_empty()),
            lease_ttl: keel_store::cluster::DEFAULT_LEASE_TTL,
            pool_size: keel_store::postgres::DEFAULT_POOL_SIZE,
            ..StoreChoice::default()
        }
    }
}

/// The `[store]` table of keel.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreTable {
    /// The store URL, as `--store` takes it.
    url: Option<String>,
}

/// The `[store] url` of a keel.toml document, if it names one.
pub fn url_from_keel_toml(text: &str) -> Result<Option<String>> {
    let mut table: toml::Table = toml::from_str(text).context("keel.toml does not parse")?;
    let Some(store) = table.remove("store") else { return Ok(None) };
    let store: StoreTable = store.try_into().context("keel.toml [store]")?;
    Ok(store.url)
}

/// A kernel's store, opened, and its cluster membership when the store is shared.
pub struct KernelStore {
    pub store: Arc<dyn Store>,
    pub cluster: Option<keel_kernel::ClusterMember>,
    /// For the startup line: `sqlite:PATH`, or the URL (password hidden) and node id.
    pub description: String,
}

/// Opens the store a kernel on `dir` uses. A Postgres store makes the kernel a node of
/// the cluster on that database: it joins (a live node with the same id, or a clock far
/// off the database's, is refused) with `api_addr` as the address other nodes reach it
/// at. `serving` is false for a kernel embedded in a command, which may not use a shared
/// store (its runs would end with the command).
pub async fn open_kernel_store(
    dir: &DataDir,
    choice: &StoreChoice,
    config_url: Option<String>,
    api_addr: Option<std::net::SocketAddr>,
    serving: bool,
) -> Result<KernelStore> {
    let url = choice.url.clone().or(config_url);
    let parsed = match &url {
        Some(url) => StoreUrl::parse(url)?,
        None => StoreUrl::Sqlite(dir.database()),
    };
    match parsed {
        StoreUrl::Sqlite(path) => {
            let description = format!("sqlite:{}", path.display());
            let store = open_store(&description).await?;
            Ok(KernelStore { store, cluster: None, description })
        }
        StoreUrl::Postgres(url) => {
            if !serving {
                bail!(
                    "the store is a shared Postgres database ({}): runs there are served by `keel serve` nodes; \
                     start one for this data directory, or point --addr at one",
                    StoreUrl::Postgres(url.clone())
                );
            }
            let store = connect_postgres(&url, choice.pool_size).await?;
            let id = match &choice.node_id {
                Some(id) => id.clone(),
                None => default_node_id(dir),
            };
            let addr = advertised(choice.advertise.as_deref(), api_addr)?;
            let node = store
                .node(&id)
                .with_context(|| format!("joining the cluster on {}", StoreUrl::Postgres(url.clone())))?;
            let info = keel_store::cluster::NodeInfo {
                id: id.clone(),
                addr: addr.clone(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            };
            use keel_store::cluster::Cluster as _;
            let key = node_key(dir)?;
            node.join(info, &key, choice.lease_ttl).await.with_context(|| {
                format!("joining the cluster on {} as node {id}", StoreUrl::Postgres(url.clone()))
            })?;
            let description = format!("{} as node {id} (advertised at {addr})", StoreUrl::Postgres(url));
            Ok(KernelStore {
                store: Arc::new(store),
                cluster: Some(keel_kernel::ClusterMember {
                    cluster: Arc::new(node),
                    lease_ttl: choice.lease_ttl,
                }),
                description,
            })
        }
    }
}

async fn connect_postgres(url: &str, pool_size: usize) -> Result<keel_store::PgStore> {
    keel_store::PgStore::connect_with(url, pool_size)
        .await
        .with_context(|| format!("opening the Postgres store {}", StoreUrl::Postgres(url.to_owned())))
}

/// The secret this data directory's node joins with (`<data dir>/node-key`, made on first
/// use, readable by its owner only): a restart on the same directory proves it is the same
/// node and takes its id back at once, while another directory with the same `--node-id`
/// is refused as long as the first is live.
fn node_key(dir: &DataDir) -> Result<String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.root().join("node-key");
    match std::fs::read_to_string(&path) {
        Ok(key) if !key.trim().is_empty() => return Ok(key.trim().to_owned()),
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("reading the node key {}", path.display())),
    }
    let key = keel_types::random_token();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing the node key {}", path.display()))?;
    std::io::Write::write_all(&mut file, key.as_bytes())
        .with_context(|| format!("writing the node key {}", path.display()))?;
    Ok(key)
}

/// A node id stable across restarts of the same data directory on the same host, so a
/// restarted node takes its own runs back at once: `<host>-<8 hex digits of the path>`.
fn default_node_id(dir: &DataDir) -> String {
    use sha2::Digest as _;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' })
        .take(40)
        .collect();
    let digest = sha2::Sha256::digest(dir.root().as_os_str().as_encoded_bytes());
    let host = if host.is_empty() { "keel".to_owned() } else { host };
    format!("{host}-{}", keel_types::hex(&digest[..4]))
}

/// The address other nodes forward requests to: `--advertise`, else the address the API
/// listens on when that is a specific one.
fn advertised(advertise: Option<&str>, api_addr: Option<std::net::SocketAddr>) -> Result<String> {
    if let Some(addr) = advertise {
        if addr.trim().is_empty() || !addr.contains(':') {
            bail!(
                "--advertise {addr:?} is not HOST:PORT; give the address other nodes reach this node's API at"
            );
        }
        return Ok(addr.to_owned());
    }
    match api_addr {
        Some(addr) if !addr.ip().is_unspecified() => Ok(addr.to_string()),
        Some(addr) => bail!(
            "the API listens on {addr}, which other nodes cannot use to reach it: give --advertise HOST:PORT \
             (this host's address on their network)"
        ),
        None => bail!("a node needs an API address other nodes can reach: give --advertise HOST:PORT"),
    }
}
