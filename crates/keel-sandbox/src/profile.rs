//! Sandbox profiles: what a run may use (memory, CPU, processes, files, network, volumes),
//! as plain data. A profile records only what the run asked for; a backend fills the rest
//! from its defaults, and refuses a run that asks for a control the host cannot enforce.

use std::path::PathBuf;

/// What a run asked of its sandbox. `None` means "not asked": the backend applies its
/// default where the host can enforce one (see `doctor`), and never refuses for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// Memory of the whole sandbox (cgroup `memory`), bytes.
    pub memory_bytes: Option<u64>,
    /// CPU seconds per process (`RLIMIT_CPU`).
    pub cpu_time_secs: Option<u64>,
    /// Wall-clock seconds from start until the sandbox is killed.
    pub wall_time_secs: Option<u64>,
    /// Processes and threads in the sandbox (cgroup `pids`).
    pub pids: Option<u64>,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Largest file a process may write (`RLIMIT_FSIZE`), bytes.
    pub file_size_bytes: Option<u64>,
    /// Size of each scratch filesystem (`/tmp`, and `/workspace` without a volume), bytes.
    pub scratch_bytes: Option<u64>,
    pub network: Network,
    /// Named volumes: host directories (kept by the kernel) mounted read-write.
    pub volumes: Vec<Volume>,
    /// Extra host paths bound read-only at the same path.
    pub ro_binds: Vec<PathBuf>,
    /// Bind the working directory read-write instead of read-only.
    pub writable_cwd: bool,
}

impl Profile {
    /// True when the run asked for nothing beyond the tier's defaults.
    pub fn is_default(&self) -> bool {
        self == &Profile::default()
    }

    /// The controls this profile explicitly asks for, by name (for refusals).
    pub fn requested_limits(&self) -> Vec<&'static str> {
        let mut asked = Vec::new();
        let pairs: [(&'static str, bool); 7] = [
            ("memory", self.memory_bytes.is_some()),
            ("cpu-time", self.cpu_time_secs.is_some()),
            ("wall", self.wall_time_secs.is_some()),
            ("pids", self.pids.is_some()),
            ("open-files", self.open_files.is_some()),
            ("file-size", self.file_size_bytes.is_some()),
            ("scratch", self.scratch_bytes.is_some()),
        ];
        for (name, set) in pairs {
            if set {
                asked.push(name);
            }
        }
        if self.network != Network::None {
            asked.push("network");
        }
        if !self.volumes.is_empty() {
            asked.push("volume");
        }
        if !self.ro_binds.is_empty() {
            asked.push("ro-bind");
        }
        if self.writable_cwd {
            asked.push("writable-cwd");
        }
        asked
    }
}

/// Network policy. Both variants give the sandbox its own network namespace with only
/// loopback; `Allowlist` adds the kernel's egress proxy, which lets HTTP(S) through to
/// the listed hosts and audits every connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    #[default]
    None,
    /// Host patterns: `api.example.com`, `*.example.com` (any subdomain), optionally with
    /// `:port` (default: any port).
    Allowlist(Vec<String>),
}

impl Network {
    pub fn name(&self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Allowlist(_) => "allowlist",
        }
    }
}

/// A named volume: the kernel keeps `host` across runs; the sandbox mounts it read-write
/// at `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub host: PathBuf,
    pub target: PathBuf,
}

/// Checks a volume name: 1-64 of letters, digits, `-`, `_`, `.`, not starting with `.`.
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Parses a size: `512M`, `2G`, `1024k`, `4096` (bytes). Units are binary (K = 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let value: u64 =
        number.parse().map_err(|_| format!("{text:?} is not a size like 512M, 2G or 1048576"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("{text:?}: the unit must be K, M, G or T")),
    };
    value.checked_mul(1u64 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

/// Renders a byte count the way `parse_size` reads it (`512M`), for messages.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("3MB"), Ok(3 << 20));
        assert!(parse_size("12Q").unwrap_err().contains("unit"));
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(1000), "1000B");
    }

    #[test]
    fn requested_limits_name_what_was_asked() {
        assert!(Profile::default().is_default());
        assert!(Profile::default().requested_limits().is_empty());
        let profile = Profile {
            memory_bytes: Some(1),
            network: Network::Allowlist(vec!["a.example".into()]),
            ..Profile::default()
        };
        assert_eq!(profile.requested_limits(), vec!["memory", "network"]);
    }

    #[test]
    fn volume_names_are_plain() {
        assert!(valid_volume_name("work-1.v2"));
        for bad in ["", ".hidden", "a/b", "..", "x y"] {
            assert!(!valid_volume_name(bad), "{bad}");
        }
    }
}
