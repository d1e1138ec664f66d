//! What this host can enforce, and the pure decisions built on it: which controls a
//! profile needs (a run is refused when one is missing, never silently weakened), what
//! limits actually apply (explicit ones, else the defaults the host can enforce), and
//! the per-control report `keel doctor` prints.

use crate::cgroup::{self, CgroupSupport};
use crate::profile::{Network, Profile, format_size};

/// The probed facts. Cheap to gather (no process is started); `doctor` additionally
/// starts a real sandbox to prove that namespaces, pivot_root and /proc work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `Err(why)` when this user cannot create user namespaces.
    pub user_namespaces: Result<(), String>,
    /// Landlock ABI version (0: unavailable).
    pub landlock_abi: i32,
    pub seccomp: bool,
    pub cgroups: CgroupSupport,
    pub uid: u32,
    pub gid: u32,
}

impl HostFacts {
    pub fn probe() -> HostFacts {
        let (uid, gid) = crate::sys::effective_ids();
        HostFacts {
            user_namespaces: user_namespaces(uid),
            landlock_abi: crate::sys::landlock_abi(),
            seccomp: crate::sys::seccomp_filters_available(),
            cgroups: cgroup::detect(),
            uid,
            gid,
        }
    }

    fn memory_cgroup(&self) -> bool {
        self.cgroups.memory.as_ref().is_some_and(|c| c.writable)
    }

    fn pids_cgroup(&self) -> bool {
        self.cgroups.pids.as_ref().is_some_and(|c| c.writable)
    }
}

fn read_number(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn user_namespaces(uid: u32) -> Result<(), String> {
    if read_number("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user.max_user_namespaces is 0".into());
    }
    if uid != 0 {
        if read_number("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
            return Err("kernel.unprivileged_userns_clone is 0".into());
        }
        if read_number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
            return Err("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)".into());
        }
    }
    Ok(())
}

/// A control the sandbox relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    UserNamespaces,
    Landlock,
    Seccomp,
    CgroupMemory,
    CgroupPids,
}

impl Control {
    pub fn name(self) -> &'static str {
        match self {
            Control::UserNamespaces => "user namespaces",
            Control::Landlock => "Landlock",
            Control::Seccomp => "seccomp",
            Control::CgroupMemory => "cgroup memory controller",
            Control::CgroupPids => "cgroup pids controller",
        }
    }

    /// How to get the control on a typical Linux host.
    pub fn how_to_get(self) -> &'static str {
        match self {
            Control::UserNamespaces => {
                "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0, or an AppArmor profile allowing userns for keel)"
            }
            Control::Landlock => {
                "use Linux 5.13+ with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= boot parameter)"
            }
            Control::Seccomp => "use a kernel built with CONFIG_SECCOMP_FILTER",
            Control::CgroupMemory => {
                "run keel as root, or in a cgroup with the memory controller delegated to this user (systemd-run --user -p Delegate=yes)"
            }
            Control::CgroupPids => {
                "run keel as root, or in a cgroup with the pids controller delegated to this user (systemd-run --user -p Delegate=yes)"
            }
        }
    }
}

/// A control a profile needs that the host lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub control: Control,
    pub detail: String,
}

/// The controls `profile` needs that `facts` says are missing. Every process sandbox
/// needs user namespaces, Landlock and seccomp; an explicit memory or process limit
/// needs its cgroup controller.
pub fn missing_controls(facts: &HostFacts, profile: &Profile) -> Vec<Missing> {
    let mut missing = Vec::new();
    if let Err(why) = &facts.user_namespaces {
        missing.push(Missing { control: Control::UserNamespaces, detail: why.clone() });
    }
    if facts.landlock_abi < 1 {
        missing.push(Missing {
            control: Control::Landlock,
            detail: "this kernel offers no Landlock ABI".into(),
        });
    }
    if !facts.seccomp {
        missing.push(Missing { control: Control::Seccomp, detail: "seccomp filters are unavailable".into() });
    }
    if let Some(bytes) = profile.memory_bytes
        && !facts.memory_cgroup()
    {
        let detail = match &facts.cgroups.memory {
            None => format!(
                "the profile limits memory to {} and no cgroup hierarchy offers the memory controller",
                format_size(bytes)
            ),
            Some(c) => format!(
                "the profile limits memory to {} and {} is not writable by this user",
                format_size(bytes),
                c.mount.display()
            ),
        };
        missing.push(Missing { control: Control::CgroupMemory, detail });
    }
    if let Some(pids) = profile.pids
        && !facts.pids_cgroup()
    {
        let detail = match &facts.cgroups.pids {
            None => format!(
                "the profile limits processes to {pids} and no cgroup hierarchy offers the pids controller"
            ),
            Some(c) => format!(
                "the profile limits processes to {pids} and {} is not writable by this user",
                c.mount.display()
            ),
        };
        missing.push(Missing { control: Control::CgroupPids, detail });
    }
    missing
}

/// The refusal message for missing controls: names each one, says how to get it, and
/// points at `keel doctor`.
pub fn refusal(missing: &[Missing]) -> String {
    let mut text = String::from("the process sandbox cannot enforce what this run needs on this host: ");
    let parts: Vec<String> = missing
        .iter()
        .map(|m| format!("{} ({}; to get it: {})", m.control.name(), m.detail, m.control.how_to_get()))
        .collect();
    text.push_str(&parts.join("; "));
    text.push_str(". `keel doctor` shows what this host can enforce. Keel does not run the agent with weaker isolation; use `--sandbox none` only for trusted code.");
    text
}

/// Limits applied when the profile does not set one (and, for cgroup limits, only where
/// the host can enforce them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub memory_bytes: u64,
    pub pids: u64,
    pub open_files: u64,
    pub scratch_bytes: u64,
}

impl Default for Defaults {
    fn default() -> Defaults {
        Defaults { memory_bytes: 2 << 30, pids: 1024, open_files: 4096, scratch_bytes: 1 << 30 }
    }
}

/// The limits that will actually apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_time_secs: Option<u64>,
    pub wall_time_secs: Option<u64>,
    pub open_files: u64,
    pub file_size_bytes: Option<u64>,
    pub scratch_bytes: u64,
}

/// Explicit limits win; defaults fill the rest where the host can enforce them.
pub fn effective(facts: &HostFacts, defaults: &Defaults, profile: &Profile) -> Effective {
    Effective {
        memory_bytes: profile.memory_bytes.or(facts.memory_cgroup().then_some(defaults.memory_bytes)),
        pids: profile.pids.or(facts.pids_cgroup().then_some(defaults.pids)),
        cpu_time_secs: profile.cpu_time_secs,
        wall_time_secs: profile.wall_time_secs,
        open_files: profile.open_files.unwrap_or(defaults.open_files),
        file_size_bytes: profile.file_size_bytes,
        scratch_bytes: profile.scratch_bytes.unwrap_or(defaults.scratch_bytes),
    }
}

/// One line of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    pub control: &'static str,
    pub enforced: bool,
    pub detail: String,
}

/// What a sandbox with `profile` enforces on this host, control by control.
pub fn enforcement(facts: &HostFacts, defaults: &Defaults, profile: &Profile) -> Vec<Enforcement> {
    let limits = effective(facts, defaults, profile);
    let userns = facts.user_namespaces.is_ok();
    let line =
        |control: &'static str, enforced: bool, detail: String| Enforcement { control, enforced, detail };
    let cgroup_version = |c: &Option<cgroup::Controller>| c.as_ref().map_or(0, |c| c.version);
    let mut lines = vec![
        line(
            "namespaces",
            userns,
            if userns {
                "user, mount, pid, ipc, uts, net (own loopback only), cgroup".into()
            } else {
                facts.user_namespaces.clone().err().unwrap_or_default()
            },
        ),
        line(
            "filesystem",
            userns,
            "pivot_root into a tmpfs root: system dirs, program and cwd read-only; /tmp, /workspace, volumes writable; fresh /proc; minimal /dev".into(),
        ),
        line("no_new_privs", true, "set before exec; all capabilities dropped".into()),
        line(
            "landlock",
            facts.landlock_abi >= 1,
            match facts.landlock_abi {
                0 => "unavailable".into(),
                abi => format!(
                    "ABI {abi}: writes only to writable mounts{}{}",
                    if abi >= 4 { "; TCP only to bridge ports" } else { "" },
                    if abi >= 6 { "; no signals or abstract sockets beyond the sandbox" } else { "" }
                ),
            },
        ),
        line(
            "seccomp",
            facts.seccomp,
            format!("{} reviewed rules (ptrace, bpf, mount, io_uring, keyctl, raw sockets...)", crate::seccomp::rules().count()),
        ),
        line(
            "memory",
            limits.memory_bytes.is_some(),
            match limits.memory_bytes {
                Some(bytes) => format!("{} (cgroup v{})", format_size(bytes), cgroup_version(&facts.cgroups.memory)),
                None => "no limit: no writable cgroup memory controller".into(),
            },
        ),
        line(
            "pids",
            limits.pids.is_some(),
            match limits.pids {
                Some(n) => format!("{n} (cgroup v{})", cgroup_version(&facts.cgroups.pids)),
                None => "no limit: no writable cgroup pids controller".into(),
            },
        ),
        line(
            "rlimits",
            true,
            format!(
                "open files {}, file size {}, CPU {}, core dumps off",
                limits.open_files,
                limits.file_size_bytes.map_or("unlimited".into(), format_size),
                limits.cpu_time_secs.map_or("unlimited".into(), |s| format!("{s}s")),
            ),
        ),
        line(
            "wall clock",
            limits.wall_time_secs.is_some(),
            limits.wall_time_secs.map_or("no limit".into(), |s| format!("{s}s")),
        ),
        line("scratch", true, format!("/tmp and /workspace tmpfs of {} each", format_size(limits.scratch_bytes))),
    ];
    lines.push(line(
        "network",
        true,
        match &profile.network {
            Network::None => "none: loopback only (bridges to the kernel's sockets)".into(),
            Network::Allowlist(hosts) => format!("allowlist via the egress proxy: {}", hosts.join(", ")),
        },
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Controller;

    fn capable() -> HostFacts {
        let controller = Controller { version: 1, mount: "/sys/fs/cgroup/memory".into(), writable: true };
        HostFacts {
            user_namespaces: Ok(()),
            landlock_abi: 7,
            seccomp: true,
            cgroups: CgroupSupport { memory: Some(controller.clone()), pids: Some(controller) },
            uid: 0,
            gid: 0,
        }
    }

    #[test]
    fn a_capable_host_misses_nothing() {
        let profile = Profile { memory_bytes: Some(1 << 29), pids: Some(64), ..Profile::default() };
        assert!(missing_controls(&capable(), &profile).is_empty());
    }

    #[test]
    fn explicit_limits_without_their_control_are_refused_by_name() {
        let facts = HostFacts { cgroups: CgroupSupport::default(), ..capable() };
        assert!(missing_controls(&facts, &Profile::default()).is_empty(), "defaults never refuse");
        let profile = Profile { memory_bytes: Some(512 << 20), ..Profile::default() };
        let missing = missing_controls(&facts, &profile);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].control, Control::CgroupMemory);
        let message = refusal(&missing);
        assert!(message.contains("cgroup memory controller") && message.contains("512M"), "{message}");
        assert!(message.contains("keel doctor"), "{message}");
    }

    #[test]
    fn hosts_without_the_base_controls_refuse_every_run() {
        let facts =
            HostFacts { user_namespaces: Err("off".into()), landlock_abi: 0, seccomp: false, ..capable() };
        let missing: Vec<Control> =
            missing_controls(&facts, &Profile::default()).iter().map(|m| m.control).collect();
        assert_eq!(missing, [Control::UserNamespaces, Control::Landlock, Control::Seccomp]);
    }

    #[test]
    fn defaults_apply_only_where_enforceable() {
        let defaults = Defaults::default();
        let limits = effective(&capable(), &defaults, &Profile::default());
        assert_eq!(limits.memory_bytes, Some(defaults.memory_bytes));
        let bare = HostFacts { cgroups: CgroupSupport::default(), ..capable() };
        let limits = effective(&bare, &defaults, &Profile::default());
        assert_eq!((limits.memory_bytes, limits.pids), (None, None));
        let report = enforcement(&bare, &defaults, &Profile::default());
        let memory = report.iter().find(|l| l.control == "memory").unwrap();
        assert!(!memory.enforced && memory.detail.contains("no limit"));
    }
}
