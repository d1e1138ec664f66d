//! The mount plan: a pure function from what a run needs (its working directory, its
//! program's installation, volumes, Keel's sockets) and what the host looks like to the
//! list of mounts that make the sandbox's root. The init executes the list; tests read it.
//!
//! The root is an empty tmpfs, read-only once built. Everything in it is either made here
//! (directories, symlinks, a few synthesized `/etc` files) or bound from the host on
//! purpose: system directories read-only, the working directory (read-only unless the
//! profile says otherwise), the program and its interpreter's installation read-only,
//! files named on the command line read-only, volumes and scratch space read-write. Host
//! secrets inside a bound tree are masked.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::profile::Volume;

/// Where Keel's own things appear inside every sandbox.
pub mod inside {
    /// The syscall socket (`KEEL_SOCKET`).
    pub const SYSCALL_SOCKET: &str = "/run/keel/syscall.sock";
    /// The Python SDK (on `PYTHONPATH`).
    pub const PYTHON_SDK: &str = "/run/keel/sdk";
    /// The directory holding the Node SDK's package `keel` (on `NODE_PATH`).
    pub const NODE_SDK: &str = "/run/keel/node";
    /// The CA bundle of `allowlist` runs whose proxy injects credentials (`SSL_CERT_FILE`).
    pub const CA_BUNDLE: &str = "/run/keel/ca-bundle.pem";
    /// Scratch space that is the agent's home; a volume can take its place.
    pub const WORKSPACE: &str = "/workspace";
    pub const TMP: &str = "/tmp";
    /// The socket a bridge's loopback port leads to.
    pub fn bridge_socket(port: u16) -> String {
        format!("/run/keel/bridge-{port}.sock")
    }
}

/// One step of building the root. Targets are paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MountOp {
    /// A fresh tmpfs of at most `size` bytes.
    Tmpfs {
        target: PathBuf,
        size: u64,
        mode: u32,
    },
    /// The host path `source` (a directory with its submounts, or a file) at `target`;
    /// read-only, nosuid and nodev unless `writable` (then nosuid, nodev).
    Bind {
        source: PathBuf,
        target: PathBuf,
        writable: bool,
    },
    /// A fresh procfs for the sandbox's PID namespace.
    Proc {
        target: PathBuf,
    },
    /// Make an existing path read-only by binding it onto itself (skipped if missing):
    /// `/proc/sys` and friends, which would otherwise let a root-mapped agent write
    /// host-wide kernel settings.
    Protect {
        target: PathBuf,
    },
    /// Make the mount at `target` read-only (after its contents are in place).
    Seal {
        target: PathBuf,
    },
    Dir {
        target: PathBuf,
    },
    Symlink {
        target: PathBuf,
        points_to: PathBuf,
    },
    /// A small file made for the sandbox (`/etc/passwd`...).
    File {
        target: PathBuf,
        contents: String,
    },
    /// Hide `target` (inside a bound tree) if it exists: an empty read-only tmpfs over a
    /// directory, an empty file over a file.
    Mask {
        target: PathBuf,
    },
    /// A read-only tmpfs at `target` holding what `ops` put there (their targets are
    /// inside the tree: `/ssl` is `<target>/ssl`). A tree is the same for every sandbox
    /// of a kernel (`/etc`, `/dev`), so the zygote may build it once as a detached
    /// template that each sandbox clones in one step.
    Tree {
        target: PathBuf,
        size: u64,
        ops: Vec<MountOp>,
    },
}

/// What kind of thing a host path is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink(PathBuf),
}

/// The host paths the plan may bind, as found on this host (see `resolve::host_layout`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLayout {
    /// `/usr`, `/bin`, `/lib64`...: present ones, with symlinks kept as symlinks.
    pub system: Vec<(PathBuf, EntryKind)>,
    /// The `/etc` entries an interpreter may need (`ld.so.cache`, `ssl`, `localtime`...).
    pub etc: Vec<(PathBuf, EntryKind)>,
    /// Device nodes to bind into `/dev` (`null`, `zero`, `full`, `random`, `urandom`).
    pub devices: Vec<PathBuf>,
}

/// The system directories an interpreter may need, bound read-only when present.
pub const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"];

/// The `/etc` entries bound from the host when present (an allowlist: `/etc/shadow`,
/// SSH host keys and the like never appear). Entries starting with `python` are added
/// by the layout scan (Debian's interpreters read `/etc/python3.X`).
pub const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "alternatives",
    "mime.types",
    "os-release",
    "debian_version",
    "services",
    "protocols",
    "gai.conf",
    "host.conf",
    "locale.alias",
    "locale.conf",
    "terminfo",
];

/// Device nodes offered inside.
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// A command-line argument that names an existing regular file on the host
/// (`python3 /elsewhere/agent.py`), found by `resolve::argument_files`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentFile {
    /// The path as the argument names it, made absolute against the run's working
    /// directory (`.` and `..` removed): the path the agent will open.
    pub named: PathBuf,
    /// The file's real path on the host (symlinks resolved): what gets bound.
    pub real: PathBuf,
}

/// Places whose contents the sandbox makes itself (a fresh `/proc`, an allowlisted `/etc`,
/// a few devices, Keel's sockets): a path there names the sandbox's own file, so an
/// argument like `/etc/hostname` or `/proc/cpuinfo` is never replaced by the host's.
const SANDBOX_MADE: &[&str] = &["/etc", "/dev", "/proc", "/sys", "/run/keel"];

/// Everything the plan depends on.
#[derive(Debug, Clone)]
pub struct PlanInputs<'a> {
    pub host: &'a HostLayout,
    pub cwd: &'a Path,
    pub writable_cwd: bool,
    /// Read-only binds the program needs (its installation, its interpreter's).
    pub program_binds: &'a [PathBuf],
    /// Extra read-only binds the profile asks for.
    pub ro_binds: &'a [PathBuf],
    /// Files named by the command's arguments (see [`argument_binds`]).
    pub argument_files: &'a [ArgumentFile],
    pub volumes: &'a [Volume],
    /// The kernel's syscall socket and SDKs on the host, if the agent gets them.
    pub syscall_socket: Option<&'a Path>,
    pub python_sdk: Option<&'a Path>,
    pub node_sdk: Option<&'a Path>,
    pub ca_bundle: Option<&'a Path>,
    /// (port, host socket) of each bridge.
    pub bridges: &'a [(u16, PathBuf)],
    /// Host paths that must never be visible (the kernel's data directory, `~/.ssh`...);
    /// masked where a bind would expose them.
    pub secrets: &'a [PathBuf],
    /// Size of each scratch tmpfs (`/tmp`, `/workspace`).
    pub scratch_bytes: u64,
    /// The agent's uid and gid (for `/etc/passwd`).
    pub uid: u32,
    pub gid: u32,
}

/// The plan, plus what Landlock must allow beyond reading and executing what is visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountPlan {
    pub ops: Vec<MountOp>,
    /// Directories the agent may write beneath.
    pub writable_dirs: Vec<PathBuf>,
    /// Single files the agent may write (`/dev/null`...).
    pub writable_files: Vec<PathBuf>,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "the working directory is /; run from a project directory (the sandbox binds the working directory into the agent's view)"
    )]
    RootCwd,
    #[error("{path:?} must be an absolute path")]
    Relative { path: PathBuf },
    #[error(
        "{path:?} cannot be bound into the sandbox: it is or holds a secret Keel keeps from agents ({secret:?})"
    )]
    Secret { path: PathBuf, secret: PathBuf },
    #[error(
        "{path:?}, named on the command line, is inside {secret:?}, which the sandbox hides from agents (the kernel's data directory, or credentials under $HOME); it is not bound, and --ro-bind refuses it too: copy the file somewhere else and name the copy"
    )]
    HiddenArgument { path: PathBuf, secret: PathBuf },
    #[error(
        "volume {name:?}: {target:?} is reserved by the sandbox; mount volumes elsewhere, e.g. /workspace or /data"
    )]
    ReservedTarget { name: String, target: PathBuf },
}

fn is_under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

/// Paths a volume may not be mounted on or under.
fn reserved(target: &Path) -> bool {
    target == Path::new("/")
        || ["/proc", "/dev", "/run/keel", "/etc", "/tmp"].iter().any(|r| is_under(target, Path::new(r)))
        || SYSTEM_DIRS.iter().any(|dir| is_under(target, Path::new(dir)))
}

/// Which files named on the command line to bind, as (host source, target) pairs, all
/// read-only. Pure.
///
/// The program is bound with its installation (see `resolve`), but an interpreter's
/// argument is data to us: `python3 /elsewhere/agent.py` run from another directory
/// would see the interpreter and not the script. So an argument naming an existing
/// regular file is bound at the path it names (and at its real path, when a symlink
/// leads elsewhere), unless that path is already visible (under the working directory,
/// the program's installation, a `--ro-bind` or a system directory), belongs to the
/// sandbox (`/etc`, `/proc`, `/dev`, `/sys`, `/run/keel`, a volume), or is hidden: an
/// argument in the kernel's data directory or a masked secret is refused, never bound.
///
/// Only the file, not its directory: the argument names one file, and its directory may
/// be `$HOME`, `/tmp` or `~/Downloads`, whose other contents the agent has no business
/// reading; binding it would silently widen what every such run sees. A script that
/// imports sibling modules needs them visible: run from its directory (the working
/// directory is bound) or add `--ro-bind DIR`. The user docs say so.
pub fn argument_binds(
    files: &[ArgumentFile],
    visible: &[&Path],
    sandbox_owned: &[&Path],
    secrets: &[PathBuf],
) -> Result<Vec<(PathBuf, PathBuf)>, PlanError> {
    let mut binds: Vec<(PathBuf, PathBuf)> = Vec::new();
    for file in files {
        // Either name leading into a hidden place is refused: a symlink must not carry a
        // secret into the sandbox under an innocent name.
        for path in [&file.named, &file.real] {
            if let Some(secret) = secrets.iter().find(|s| is_under(path, s)) {
                return Err(PlanError::HiddenArgument { path: file.named.clone(), secret: secret.clone() });
            }
        }
        let mut targets = vec![&file.named];
        if file.real != file.named {
            targets.push(&file.real);
        }
        for target in targets {
            let shown = visible.iter().chain(sandbox_owned).any(|dir| is_under(target, dir))
                || SANDBOX_MADE.iter().any(|dir| is_under(target, Path::new(dir)));
            let bind = (file.real.clone(), target.clone());
            if !shown && !binds.contains(&bind) {
                binds.push(bind);
            }
        }
    }
    Ok(binds)
}

/// Builds the mount plan. Pure: no file system access.
pub fn build(inputs: &PlanInputs<'_>) -> Result<MountPlan, PlanError> {
    let mut ops = Vec::new();
    let mut writable_dirs: Vec<PathBuf> = vec![PathBuf::from(inside::TMP), PathBuf::from("/dev/shm")];
    let mut writable_files: Vec<PathBuf> = Vec::new();

    for path in
        inputs.ro_binds.iter().chain(inputs.program_binds).chain(std::iter::once(&inputs.cwd.to_path_buf()))
    {
        if !path.is_absolute() {
            return Err(PlanError::Relative { path: path.clone() });
        }
    }
    if inputs.cwd == Path::new("/") {
        return Err(PlanError::RootCwd);
    }
    // A bind that would show a secret whole is refused; one that contains it masks it.
    for path in inputs.ro_binds.iter().chain(std::iter::once(&inputs.cwd.to_path_buf())) {
        if let Some(secret) = inputs.secrets.iter().find(|s| is_under(path, s)) {
            return Err(PlanError::Secret { path: path.clone(), secret: secret.clone() });
        }
    }

    // System directories, exactly as the host lays them out (merged /usr or not).
    for (path, kind) in &inputs.host.system {
        match kind {
            EntryKind::Symlink(points_to) => {
                ops.push(MountOp::Symlink { target: path.clone(), points_to: points_to.clone() })
            }
            EntryKind::Dir | EntryKind::File => {
                ops.push(MountOp::Bind { source: path.clone(), target: path.clone(), writable: false })
            }
        }
    }

    // /etc: an allowlist from the host, plus files describing the sandbox itself.
    let in_etc = |path: &Path| Path::new("/").join(path.strip_prefix("/etc").unwrap_or(path));
    let mut etc = Vec::new();
    for (path, kind) in &inputs.host.etc {
        match kind {
            EntryKind::Symlink(points_to) => {
                etc.push(MountOp::Symlink { target: in_etc(path), points_to: points_to.clone() })
            }
            EntryKind::Dir | EntryKind::File => {
                etc.push(MountOp::Bind { source: path.clone(), target: in_etc(path), writable: false })
            }
        }
    }
    let mut passwd = format!("root:x:0:0:root:{}:/bin/sh\n", inside::WORKSPACE);
    let mut group = "root:x:0:\n".to_owned();
    if inputs.uid != 0 {
        passwd.push_str(&format!(
            "agent:x:{}:{}:agent:{}:/bin/sh\n",
            inputs.uid,
            inputs.gid,
            inside::WORKSPACE
        ));
    }
    if inputs.gid != 0 {
        group.push_str(&format!("agent:x:{}:\n", inputs.gid));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    let files = [
        ("/passwd", passwd),
        ("/group", group),
        ("/hostname", "keel\n".to_owned()),
        ("/hosts", "127.0.0.1 localhost keel\n::1 localhost ip6-localhost ip6-loopback\n".to_owned()),
        ("/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".to_owned()),
    ];
    for (target, contents) in files {
        etc.push(MountOp::File { target: target.into(), contents });
    }
    ops.push(MountOp::Tree { target: "/etc".into(), size: 1 << 20, ops: etc });

    // /dev: the harmless devices; no terminals, no block devices.
    let mut dev = Vec::new();
    for device in &inputs.host.devices {
        let name = Path::new("/").join(device.strip_prefix("/dev").unwrap_or(device));
        dev.push(MountOp::Bind { source: device.clone(), target: name, writable: true });
        writable_files.push(device.clone());
    }
    for (name, points_to) in [
        ("/fd", "/proc/self/fd"),
        ("/stdin", "/proc/self/fd/0"),
        ("/stdout", "/proc/self/fd/1"),
        ("/stderr", "/proc/self/fd/2"),
    ] {
        dev.push(MountOp::Symlink { target: name.into(), points_to: points_to.into() });
    }
    dev.push(MountOp::Dir { target: "/shm".into() });
    ops.push(MountOp::Tree { target: "/dev".into(), size: 64 * 1024, ops: dev });
    ops.push(MountOp::Tmpfs { target: "/dev/shm".into(), size: inputs.scratch_bytes, mode: 0o1777 });

    // A fresh /proc for the sandbox's PID namespace, with the host-wide knobs read-only.
    ops.push(MountOp::Proc { target: "/proc".into() });
    // (Landlock denies writes under /proc as well; these mounts make the two dangerous
    // ones fail even where Landlock is weaker.)
    for knob in ["/proc/sys", "/proc/sysrq-trigger"] {
        ops.push(MountOp::Protect { target: knob.into() });
    }

    ops.push(MountOp::Tmpfs { target: inside::TMP.into(), size: inputs.scratch_bytes, mode: 0o1777 });
    let workspace_is_volume = inputs.volumes.iter().any(|v| v.target == Path::new(inside::WORKSPACE));
    if !workspace_is_volume {
        ops.push(MountOp::Tmpfs {
            target: inside::WORKSPACE.into(),
            size: inputs.scratch_bytes,
            mode: 0o755,
        });
        writable_dirs.push(inside::WORKSPACE.into());
    }

    // Keel's own things.
    if let Some(sdk) = inputs.python_sdk {
        ops.push(MountOp::Bind {
            source: sdk.to_path_buf(),
            target: inside::PYTHON_SDK.into(),
            writable: false,
        });
    }
    if let Some(sdk) = inputs.node_sdk {
        ops.push(MountOp::Bind {
            source: sdk.to_path_buf(),
            target: inside::NODE_SDK.into(),
            writable: false,
        });
    }
    if let Some(bundle) = inputs.ca_bundle {
        ops.push(MountOp::Bind {
            source: bundle.to_path_buf(),
            target: inside::CA_BUNDLE.into(),
            writable: false,
        });
    }
    if let Some(socket) = inputs.syscall_socket {
        ops.push(MountOp::Bind {
            source: socket.to_path_buf(),
            target: inside::SYSCALL_SOCKET.into(),
            writable: false,
        });
    }
    for (port, socket) in inputs.bridges {
        ops.push(MountOp::Bind {
            source: socket.clone(),
            target: inside::bridge_socket(*port).into(),
            writable: false,
        });
    }

    // The user's things, shallowest first so that nested binds land on top.
    let covered_by_system = |path: &Path| {
        inputs.host.system.iter().any(|(dir, kind)| *kind == EntryKind::Dir && is_under(path, dir))
    };
    let mut user_binds: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    let mut read_only: Vec<&PathBuf> = inputs.program_binds.iter().chain(inputs.ro_binds).collect();
    read_only.sort();
    read_only.dedup();
    for path in read_only {
        if covered_by_system(path) && !inputs.ro_binds.contains(path) {
            continue;
        }
        user_binds.push((path.clone(), path.clone(), false));
    }
    // Files named on the command line, where nothing above shows them already.
    let mut visible: Vec<&Path> = vec![inputs.cwd];
    visible.extend(inputs.program_binds.iter().chain(inputs.ro_binds).map(PathBuf::as_path));
    visible.extend(
        inputs.host.system.iter().filter(|(_, kind)| *kind == EntryKind::Dir).map(|(dir, _)| dir.as_path()),
    );
    let volume_targets: Vec<&Path> = inputs.volumes.iter().map(|v| v.target.as_path()).collect();
    for (source, target) in argument_binds(inputs.argument_files, &visible, &volume_targets, inputs.secrets)?
    {
        user_binds.push((source, target, false));
    }
    user_binds.push((inputs.cwd.to_path_buf(), inputs.cwd.to_path_buf(), inputs.writable_cwd));
    if inputs.writable_cwd {
        writable_dirs.push(inputs.cwd.to_path_buf());
    }
    for volume in inputs.volumes {
        if !volume.target.is_absolute() {
            return Err(PlanError::Relative { path: volume.target.clone() });
        }
        if reserved(&volume.target) {
            return Err(PlanError::ReservedTarget {
                name: volume.name.clone(),
                target: volume.target.clone(),
            });
        }
        user_binds.push((volume.host.clone(), volume.target.clone(), true));
        writable_dirs.push(volume.target.clone());
    }
    user_binds.sort_by_key(|(_, target, _)| target.components().count());
    for (source, target, writable) in &user_binds {
        ops.push(MountOp::Bind { source: source.clone(), target: target.clone(), writable: *writable });
    }
    // Secrets inside any bound tree are hidden (after the binds they sit in).
    let mut masks = Vec::new();
    for op in &ops {
        if let MountOp::Bind { source, target, .. } = op {
            for secret in inputs.secrets {
                if secret != source
                    && let Ok(rest) = secret.strip_prefix(source)
                {
                    masks.push(MountOp::Mask { target: target.join(rest) });
                }
            }
        }
    }
    masks.dedup();
    ops.extend(masks);

    ops.push(MountOp::Seal { target: "/".into() });
    writable_dirs.sort();
    writable_dirs.dedup();
    Ok(MountPlan { ops, writable_dirs, writable_files })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> HostLayout {
        HostLayout {
            system: vec![
                ("/usr".into(), EntryKind::Dir),
                ("/bin".into(), EntryKind::Symlink("usr/bin".into())),
                ("/lib64".into(), EntryKind::Symlink("usr/lib64".into())),
            ],
            etc: vec![
                ("/etc/ld.so.cache".into(), EntryKind::File),
                ("/etc/localtime".into(), EntryKind::Symlink("/usr/share/zoneinfo/Etc/UTC".into())),
                ("/etc/ssl".into(), EntryKind::Dir),
            ],
            devices: DEVICES.iter().map(PathBuf::from).collect(),
        }
    }

    fn inputs<'a>(host: &'a HostLayout, cwd: &'a Path) -> PlanInputs<'a> {
        PlanInputs {
            host,
            cwd,
            writable_cwd: false,
            program_binds: &[],
            ro_binds: &[],
            argument_files: &[],
            volumes: &[],
            syscall_socket: None,
            python_sdk: None,
            node_sdk: None,
            ca_bundle: None,
            bridges: &[],
            secrets: &[],
            scratch_bytes: 1 << 20,
            uid: 0,
            gid: 0,
        }
    }

    /// Every bind, with targets inside trees made absolute.
    fn binds(plan: &MountPlan) -> Vec<(String, String, bool)> {
        fn walk(ops: &[MountOp], prefix: &Path, out: &mut Vec<(String, String, bool)>) {
            for op in ops {
                match op {
                    MountOp::Bind { source, target, writable } => {
                        let target = prefix.join(target.strip_prefix("/").unwrap_or(target));
                        out.push((source.display().to_string(), target.display().to_string(), *writable));
                    }
                    MountOp::Tree { target, ops, .. } => walk(ops, target, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&plan.ops, Path::new("/"), &mut out);
        out
    }

    #[test]
    fn the_root_holds_only_what_was_chosen() {
        let host = layout();
        let plan = build(&inputs(&host, Path::new("/home/u/project"))).unwrap();
        let binds = binds(&plan);
        let sources: Vec<&str> = binds.iter().map(|(s, _, _)| s.as_str()).collect();
        assert_eq!(
            sources,
            [
                "/usr",
                "/etc/ld.so.cache",
                "/etc/ssl",
                "/dev/null",
                "/dev/zero",
                "/dev/full",
                "/dev/random",
                "/dev/urandom",
                "/home/u/project"
            ]
        );
        // Nothing bound from the host is writable except the devices.
        assert!(binds.iter().all(|(s, _, w)| !*w || s.starts_with("/dev/")));
        assert!(plan.ops.contains(&MountOp::Symlink { target: "/bin".into(), points_to: "usr/bin".into() }));
        assert!(plan.ops.contains(&MountOp::Proc { target: "/proc".into() }));
        assert!(plan.ops.contains(&MountOp::Protect { target: "/proc/sys".into() }));
        assert_eq!(plan.ops.last(), Some(&MountOp::Seal { target: "/".into() }));
        assert_eq!(plan.writable_dirs, [PathBuf::from("/dev/shm"), "/tmp".into(), "/workspace".into()]);
        // No shadow, no host passwd: the sandbox's own.
        let Some(MountOp::Tree { ops: etc, .. }) = plan
            .ops
            .iter()
            .find(|op| matches!(op, MountOp::Tree { target, .. } if target == Path::new("/etc")))
        else {
            panic!("no /etc tree")
        };
        let passwd = etc.iter().find_map(|op| match op {
            MountOp::File { target, contents } if target == Path::new("/passwd") => Some(contents.clone()),
            _ => None,
        });
        assert!(passwd.unwrap().starts_with("root:x:0:0:root:/workspace:"));
        assert!(!sources.iter().any(|s| s.contains("shadow")));
    }

    #[test]
    fn volumes_are_writable_and_replace_the_scratch_workspace() {
        let host = layout();
        let volumes =
            [Volume { name: "w".into(), host: "/data/keel/volumes/w".into(), target: "/workspace".into() }];
        let mut input = inputs(&host, Path::new("/srv/p"));
        input.volumes = &volumes;
        input.writable_cwd = true;
        let plan = build(&input).unwrap();
        assert!(binds(&plan).contains(&("/data/keel/volumes/w".into(), "/workspace".into(), true)));
        assert!(binds(&plan).contains(&("/srv/p".into(), "/srv/p".into(), true)));
        assert!(
            !plan
                .ops
                .iter()
                .any(|op| matches!(op, MountOp::Tmpfs { target, .. } if target == Path::new("/workspace")))
        );
        assert!(plan.writable_dirs.contains(&PathBuf::from("/srv/p")));

        for target in ["/usr/x", "/proc", "/", "/etc/y", "/run/keel/z"] {
            let volumes = [Volume { name: "w".into(), host: "/v".into(), target: target.into() }];
            let input = PlanInputs { volumes: &volumes, ..input.clone() };
            assert!(matches!(build(&input), Err(PlanError::ReservedTarget { .. })), "{target}");
        }
    }

    #[test]
    fn secrets_inside_binds_are_masked_and_whole_secrets_refused() {
        let host = layout();
        let secrets = [PathBuf::from("/home/u/.ssh"), PathBuf::from("/home/u/.local/share/keel")];
        let mut input = inputs(&host, Path::new("/home/u"));
        input.secrets = &secrets;
        let plan = build(&input).unwrap();
        assert!(plan.ops.contains(&MountOp::Mask { target: "/home/u/.ssh".into() }));
        assert!(plan.ops.contains(&MountOp::Mask { target: "/home/u/.local/share/keel".into() }));
        let bind_at = plan
            .ops
            .iter()
            .position(|op| matches!(op, MountOp::Bind { target, .. } if target == Path::new("/home/u")));
        let mask_at = plan.ops.iter().position(|op| matches!(op, MountOp::Mask { .. }));
        assert!(bind_at < mask_at, "masks go on top of the bind");

        let binds = [PathBuf::from("/home/u/.ssh/keys")];
        let mut input = inputs(&host, Path::new("/srv"));
        input.secrets = &secrets;
        input.ro_binds = &binds;
        assert!(matches!(build(&input), Err(PlanError::Secret { .. })));
        assert_eq!(build(&inputs(&host, Path::new("/"))), Err(PlanError::RootCwd));
    }

    #[test]
    fn nested_binds_go_shallowest_first_and_system_paths_are_not_bound_twice() {
        let host = layout();
        let program = [PathBuf::from("/home/u/.pyenv/versions/3.11.7"), PathBuf::from("/usr/lib/python3")];
        let mut input = inputs(&host, Path::new("/home/u"));
        input.program_binds = &program;
        let plan = build(&input).unwrap();
        let targets: Vec<String> = binds(&plan).into_iter().map(|(_, t, _)| t).collect();
        let home = targets.iter().position(|t| t == "/home/u").unwrap();
        let pyenv = targets.iter().position(|t| t == "/home/u/.pyenv/versions/3.11.7").unwrap();
        assert!(home < pyenv);
        assert!(!targets.contains(&"/usr/lib/python3".to_owned()));
    }

    fn file(named: &str, real: &str) -> ArgumentFile {
        ArgumentFile { named: named.into(), real: real.into() }
    }

    #[test]
    fn issue_11_a_script_named_on_the_command_line_is_bound_read_only() {
        let host = layout();
        let files = [file("/elsewhere/agent.py", "/elsewhere/agent.py")];
        let mut input = inputs(&host, Path::new("/home/u/project"));
        input.argument_files = &files;
        let plan = build(&input).unwrap();
        let binds = binds(&plan);
        assert!(
            binds.contains(&("/elsewhere/agent.py".into(), "/elsewhere/agent.py".into(), false)),
            "{binds:?}"
        );
        // Only the file: its directory stays out of sight.
        assert!(!binds.iter().any(|(_, target, _)| target == "/elsewhere"));
        // Scratch places take a file too: it lands on the fresh tmpfs.
        let files = [file("/tmp/t1/agent.py", "/tmp/t1/agent.py")];
        let input = PlanInputs { argument_files: &files, ..input.clone() };
        let binds = super::tests::binds(&build(&input).unwrap());
        assert!(binds.contains(&("/tmp/t1/agent.py".into(), "/tmp/t1/agent.py".into(), false)), "{binds:?}");
    }

    #[test]
    fn argument_files_already_visible_or_the_sandboxs_own_are_not_bound() {
        let secrets: [PathBuf; 0] = [];
        let visible = [Path::new("/home/u/project"), Path::new("/usr"), Path::new("/opt/tool")];
        let owned = [Path::new("/data")];
        for path in [
            "/home/u/project/agent.py", // the working directory
            "/usr/lib/python3/x.py",    // a system directory
            "/opt/tool/share/lib.py",   // the program's installation
            "/etc/hostname",            // the sandbox's own /etc
            "/proc/cpuinfo",            // its own /proc
            "/dev/null",
            "/run/keel/syscall.sock",
            "/data/input.csv", // a volume's target
        ] {
            let binds = argument_binds(&[file(path, path)], &visible, &owned, &secrets).unwrap();
            assert!(binds.is_empty(), "{path}: {binds:?}");
        }
        // A symlink in the working directory to a file elsewhere: the link is visible
        // with the directory, and its target is bound so that it resolves.
        let binds = argument_binds(
            &[file("/home/u/project/agent.py", "/srv/agents/agent.py")],
            &visible,
            &owned,
            &secrets,
        )
        .unwrap();
        assert_eq!(binds, [(PathBuf::from("/srv/agents/agent.py"), PathBuf::from("/srv/agents/agent.py"))]);
        // Named through a symlinked directory: bound at both names, from the real file.
        let binds =
            argument_binds(&[file("/link/agent.py", "/srv/agent.py")], &visible, &owned, &secrets).unwrap();
        assert_eq!(
            binds,
            [
                (PathBuf::from("/srv/agent.py"), PathBuf::from("/link/agent.py")),
                (PathBuf::from("/srv/agent.py"), PathBuf::from("/srv/agent.py"))
            ]
        );
    }

    #[test]
    fn argument_files_in_hidden_places_are_refused_by_name() {
        let host = layout();
        let secrets = [PathBuf::from("/home/u/.ssh"), PathBuf::from("/var/keel-data")];
        for (named, real, secret) in [
            ("/var/keel-data/api-token", "/var/keel-data/api-token", "/var/keel-data"),
            // Under the working directory, yet masked there: refused, not shown.
            ("/home/u/.ssh/id_ed25519", "/home/u/.ssh/id_ed25519", "/home/u/.ssh"),
            // An innocent name whose real file is a secret.
            ("/tmp/notes.txt", "/home/u/.ssh/id_ed25519", "/home/u/.ssh"),
        ] {
            let files = [file(named, real)];
            let mut input = inputs(&host, Path::new("/home/u"));
            input.secrets = &secrets;
            input.argument_files = &files;
            let err = build(&input).unwrap_err();
            assert_eq!(err, PlanError::HiddenArgument { path: named.into(), secret: secret.into() });
            let message = err.to_string();
            assert!(message.contains(named) && message.contains("--ro-bind"), "{message}");
        }
    }

    #[test]
    fn keel_sockets_and_bridges_have_fixed_places() {
        let host = layout();
        let bridges = [(4000u16, PathBuf::from("/data/gateway.sock"))];
        let mut input = inputs(&host, Path::new("/p"));
        input.syscall_socket = Some(Path::new("/data/syscall.sock"));
        input.python_sdk = Some(Path::new("/data/sdk/python"));
        input.node_sdk = Some(Path::new("/data/sdk/node"));
        input.bridges = &bridges;
        let binds = binds(&build(&input).unwrap());
        assert!(binds.contains(&("/data/syscall.sock".into(), inside::SYSCALL_SOCKET.into(), false)));
        assert!(binds.contains(&("/data/sdk/python".into(), inside::PYTHON_SDK.into(), false)));
        assert!(binds.contains(&("/data/sdk/node".into(), inside::NODE_SDK.into(), false)));
        assert!(binds.contains(&("/data/gateway.sock".into(), "/run/keel/bridge-4000.sock".into(), false)));
    }
}
