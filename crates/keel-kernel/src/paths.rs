//! Where a kernel keeps its files: the data directory and the well-known names inside it.

use std::path::{Path, PathBuf};

/// The data directory, resolved from (in order) an explicit path, `$KEEL_DATA_DIR`,
/// `$XDG_DATA_HOME/keel`, `$HOME/.local/share/keel`.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn resolve(explicit: Option<PathBuf>) -> DataDir {
        let root = explicit
            .or_else(|| non_empty_env("KEEL_DATA_DIR").map(PathBuf::from))
            .or_else(|| non_empty_env("XDG_DATA_HOME").map(|d| PathBuf::from(d).join("keel")))
            .or_else(|| non_empty_env("HOME").map(|h| PathBuf::from(h).join(".local/share/keel")))
            .unwrap_or_else(|| PathBuf::from(".keel-data"));
        DataDir { root }
    }

    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database (WAL files sit beside it).
    pub fn database(&self) -> PathBuf {
        self.root.join("keel.db")
    }

    /// The syscall socket every agent connects to.
    pub fn syscall_socket(&self) -> PathBuf {
        self.root.join("syscall.sock")
    }

    /// The bearer token of the HTTP API (mode 0600).
    pub fn api_token(&self) -> PathBuf {
        self.root.join("api-token")
    }

    /// Held with an exclusive lock by the one kernel using this directory.
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("kernel.lock")
    }

    /// Where the live kernel advertises its HTTP address, for the CLI.
    pub fn kernel_info(&self) -> PathBuf {
        self.root.join("kernel.json")
    }

    /// The provider-compatible gateway (`/v1/chat/completions`, `/v1/messages`) on a Unix
    /// socket, for sandboxed agents (bridged to a loopback port inside the sandbox).
    pub fn gateway_socket(&self) -> PathBuf {
        self.root.join("gateway.sock")
    }

    /// A named volume's directory (kept across runs; sandboxes mount it read-write).
    pub fn volume(&self, name: &str) -> PathBuf {
        self.root.join("volumes").join(name)
    }

    /// The egress proxy socket of an `allowlist` run (bridged into its sandbox).
    pub fn egress_socket(&self, run: &str) -> PathBuf {
        self.root.join("egress").join(format!("{run}.sock"))
    }

    /// The Keel CA of the egress proxy and the CA bundle sandboxes trust (made when
    /// keel.toml configures credentials to inject).
    pub fn egress_ca(&self) -> PathBuf {
        self.root.join("egress-ca")
    }

    /// The Python SDK, unpacked from the binary so agents can import it.
    pub fn python_sdk(&self) -> PathBuf {
        self.root.join("sdk/python")
    }

    /// The directory holding the Node SDK's package `keel`, unpacked from the binary; it
    /// is what agents' `NODE_PATH` names, so `require("keel")` finds the package.
    pub fn node_sdk(&self) -> PathBuf {
        self.root.join("sdk/node")
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A data directory this process holds: its exclusive `flock` on `kernel.lock` is held
/// for as long as this lives, so no second kernel can use the directory meanwhile. Take
/// it before opening anything inside (the store), then hand both to `KernelOptions`.
pub struct LockedDataDir {
    dir: DataDir,
    _flock: nix::fcntl::Flock<std::fs::File>,
}

impl LockedDataDir {
    pub fn dir(&self) -> &DataDir {
        &self.dir
    }
}

impl DataDir {
    /// Creates the directory if needed and takes its lock, or says which kernel holds it.
    pub fn lock(&self) -> crate::Result<LockedDataDir> {
        use nix::fcntl::{Flock, FlockArg};
        let failed = |source| crate::Error::DataDir { dir: self.root.display().to_string(), source };
        std::fs::create_dir_all(&self.root).map_err(failed)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.lock_file())
            .map_err(failed)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(flock) => Ok(LockedDataDir { dir: self.clone(), _flock: flock }),
            Err((_, errno)) => {
                let info = std::fs::read_to_string(self.kernel_info()).unwrap_or_default();
                Err(crate::Error::DataDirLocked {
                    dir: self.root.display().to_string(),
                    detail: format!(
                        "{errno}; kernel info: {}. Stop that kernel, or use another --data-dir / KEEL_DATA_DIR",
                        if info.is_empty() { "none".into() } else { info.trim().to_owned() }
                    ),
                })
            }
        }
    }
}
