//! Cgroup limits for a sandbox: memory and process count, on cgroup v2 where it has the
//! controllers, else v1. `detect` finds what the host offers; `RunCgroup` is one
//! sandbox's group (created before the sandbox's first process starts, removed after the
//! last one is gone).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A cgroup controller the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// 1 or 2.
    pub version: u8,
    /// The hierarchy's mount point.
    pub mount: PathBuf,
    /// Whether this process may create groups there (root, or a delegated subtree).
    pub writable: bool,
}

/// What the host offers for the limits the sandbox uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupSupport {
    pub memory: Option<Controller>,
    pub pids: Option<Controller>,
}

/// The directory (under each hierarchy) that holds Keel's groups.
const KEEL_DIR: &str = "keel";

/// Reads `/proc/self/mountinfo` and the v2 controller list.
pub fn detect() -> CgroupSupport {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return CgroupSupport::default();
    };
    let mut support = CgroupSupport::default();
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        // "... mount-point options - fstype source super-options"
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mount = left.split(' ').nth(4).map(PathBuf::from);
        let mut right = right.split(' ');
        let fstype = right.next().unwrap_or_default();
        let super_options = right.nth(1).unwrap_or_default();
        let Some(mount) = mount else { continue };
        match fstype {
            "cgroup" => {
                let options: Vec<&str> = super_options.split(',').collect();
                let controller =
                    |_: ()| Controller { version: 1, writable: writable(&mount), mount: mount.clone() };
                if options.contains(&"memory") && support.memory.is_none() {
                    support.memory = Some(controller(()));
                }
                if options.contains(&"pids") && support.pids.is_none() {
                    support.pids = Some(controller(()));
                }
            }
            "cgroup2" if v2_mount.is_none() => v2_mount = Some(mount),
            _ => {}
        }
    }
    // v2 wins where it has the controller (a host uses one or the other per controller).
    if let Some(mount) = v2_mount {
        let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        let has = |name: &str| controllers.split_whitespace().any(|c| c == name);
        let controller = Controller { version: 2, writable: writable(&mount), mount };
        if has("memory") {
            support.memory = Some(controller.clone());
        }
        if has("pids") {
            support.pids = Some(controller);
        }
    }
    support
}

fn writable(mount: &Path) -> bool {
    let keel = mount.join(KEEL_DIR);
    let target = if keel.is_dir() { keel } else { mount.to_path_buf() };
    nix::unistd::access(&target, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// One sandbox's cgroup(s): one directory per distinct hierarchy.
#[derive(Debug)]
pub struct RunCgroup {
    /// (version, directory) of the memory and pids controllers, when used (the same
    /// directory for both on v2).
    memory: Option<(u8, PathBuf)>,
    pids: Option<(u8, PathBuf)>,
}

static NEXT: AtomicU64 = AtomicU64::new(1);

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Enables `controller` for the children of `dir` (v2).
fn enable_v2(dir: &Path, controller: &str) -> std::io::Result<()> {
    let current = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    if current.split_whitespace().any(|c| c == controller) {
        return Ok(());
    }
    write(&dir.join("cgroup.subtree_control"), &format!("+{controller}"))
}

impl RunCgroup {
    /// Creates the group with the given limits. Only the controllers a limit is given
    /// for are used; with no limit at all, no group is made.
    pub fn create(
        support: &CgroupSupport,
        memory: Option<u64>,
        pids: Option<u64>,
    ) -> std::io::Result<Option<RunCgroup>> {
        let Some(group) = RunCgroup::make(support, memory.is_some(), pids.is_some())? else {
            return Ok(None);
        };
        group.limit(memory, pids)?;
        Ok(Some(group))
    }

    /// Makes an empty group using the given controllers, without limits yet (groups can
    /// be made ahead of time; see `limit`).
    pub fn make(support: &CgroupSupport, memory: bool, pids: bool) -> std::io::Result<Option<RunCgroup>> {
        let mut wanted: Vec<(&Controller, &str)> = Vec::new();
        if memory {
            let controller =
                support.memory.as_ref().ok_or_else(|| std::io::Error::other("no memory controller"))?;
            wanted.push((controller, "memory"));
        }
        if pids {
            let controller =
                support.pids.as_ref().ok_or_else(|| std::io::Error::other("no pids controller"))?;
            wanted.push((controller, "pids"));
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let name = format!("sandbox-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut group = RunCgroup { memory: None, pids: None };
        for (controller, kind) in wanted {
            let base = controller.mount.join(KEEL_DIR);
            let dir = base.join(&name);
            if controller.version == 2 {
                enable_v2(&controller.mount, kind)?;
                std::fs::create_dir_all(&base)?;
                enable_v2(&base, kind)?;
            } else {
                std::fs::create_dir_all(&base)?;
            }
            if group.dirs().all(|(_, made)| made != &dir) {
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(err) => return Err(err),
                }
            }
            let slot = Some((controller.version, dir));
            if kind == "memory" {
                group.memory = slot;
            } else {
                group.pids = slot;
            }
        }
        Ok(Some(group))
    }

    /// Each hierarchy's group once: the memory controller's, then the pids controller's
    /// when it is another directory.
    fn dirs(&self) -> impl Iterator<Item = &(u8, PathBuf)> {
        let pids = self.pids.as_ref().filter(|pids| self.memory.as_ref() != Some(*pids));
        self.memory.iter().chain(pids)
    }

    /// Whether the group uses the memory and the pids controller.
    pub fn controllers(&self) -> (bool, bool) {
        (self.memory.is_some(), self.pids.is_some())
    }

    /// Sets the limits of the controllers the group uses.
    pub fn limit(&self, memory: Option<u64>, pids: Option<u64>) -> std::io::Result<()> {
        match (&self.memory, memory) {
            (Some((1, dir)), Some(bytes)) => {
                let bytes = bytes.to_string();
                write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                // With swap accounting, swap counts too (absent without it).
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &bytes)?;
                }
            }
            (Some((_, dir)), Some(bytes)) => {
                write(&dir.join("memory.max"), &bytes.to_string())?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
            }
            _ => {}
        }
        if let (Some((_, dir)), Some(pids)) = (&self.pids, pids) {
            write(&dir.join("pids.max"), &pids.to_string())?;
        }
        Ok(())
    }

    /// How a sandbox's first process joins the group: the files another process writes
    /// its pid to (v2's `cgroup.procs`), and the files it writes `0` to itself, while it
    /// has a single thread (v1's `tasks`). Only a single thread moving itself skips the
    /// kernel's global lock on thread groups, whose taking waits for an RCU grace period
    /// when moves are sparse (about 10 ms a move on the reference machine, against
    /// 0.2 ms). On v2 a thread cannot move alone into another domain group, so the pid
    /// is written for it.
    pub fn join_files(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let (v1, v2): (Vec<_>, Vec<_>) = self.dirs().partition(|(version, _)| *version == 1);
        (
            v2.into_iter().map(|(_, d)| d.join("cgroup.procs")).collect(),
            v1.into_iter().map(|(_, d)| d.join("tasks")).collect(),
        )
    }

    /// Whether the memory limit made the kernel kill a process of the group.
    pub fn memory_exhausted(&self) -> bool {
        let Some((version, dir)) = &self.memory else { return false };
        let (file, key) =
            if *version == 1 { ("memory.oom_control", "oom_kill") } else { ("memory.events", "oom_kill") };
        let counted = std::fs::read_to_string(dir.join(file)).ok().and_then(|text| {
            text.lines().find_map(|line| {
                let (name, value) = line.split_once(' ')?;
                (name == key).then(|| value.trim().parse::<u64>().ok())?
            })
        });
        match counted {
            Some(kills) => kills > 0,
            // Older v1 kernels have no oom_kill counter: hitting the limit is the signal.
            None => std::fs::read_to_string(dir.join("memory.failcnt"))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0),
        }
    }

    /// Removes the group's directories; false while processes remain (retry later).
    pub fn remove(&self) -> bool {
        let mut all = true;
        for (_, dir) in self.dirs() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => all = false,
            }
        }
        all
    }
}

/// Groups whose sandbox has ended but whose last processes may still be exiting; a group
/// can only be removed once empty.
static DOOMED: std::sync::Mutex<Vec<RunCgroup>> = std::sync::Mutex::new(Vec::new());
static REAPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn doomed() -> std::sync::MutexGuard<'static, Vec<RunCgroup>> {
    DOOMED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes `group` now if it is empty, else as soon as it is (a background thread
/// retries; [`remove_pending`] finishes the job at shutdown).
pub fn remove_when_empty(group: RunCgroup) {
    if group.remove() {
        return;
    }
    doomed().push(group);
    if REAPING.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new().name("keel-cgroup-reaper".into()).spawn(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut pending = doomed();
            pending.retain(|group| !group.remove());
            if pending.is_empty() {
                REAPING.store(false, Ordering::SeqCst);
                return;
            }
        }
    });
    if spawned.is_err() {
        REAPING.store(false, Ordering::SeqCst);
    }
}

/// Removes the groups still waiting for their processes to exit, for at most `patience`.
/// Returns how many could not be removed.
pub fn remove_pending(patience: std::time::Duration) -> usize {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let left = {
            let mut pending = doomed();
            pending.retain(|group| !group.remove());
            pending.len()
        };
        if left == 0 || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Removes empty groups left by kernels that died before cleaning up (named after a pid
/// that no longer exists).
pub fn remove_stale(support: &CgroupSupport) {
    for controller in [&support.memory, &support.pids].into_iter().flatten() {
        let Ok(entries) = std::fs::read_dir(controller.mount.join(KEEL_DIR)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owner = name
                .to_str()
                .and_then(|n| n.strip_prefix("sandbox-")?.split('-').next()?.parse::<u32>().ok());
            if let Some(pid) = owner
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_joins_v1_groups_itself_and_is_put_into_v2_groups() {
        let group = |memory: (u8, &str), pids: (u8, &str)| RunCgroup {
            memory: Some((memory.0, PathBuf::from(memory.1))),
            pids: Some((pids.0, PathBuf::from(pids.1))),
        };
        let v1 = group((1, "/cg/memory/keel/s"), (1, "/cg/pids/keel/s"));
        assert_eq!(
            v1.join_files(),
            (vec![], vec![PathBuf::from("/cg/memory/keel/s/tasks"), PathBuf::from("/cg/pids/keel/s/tasks")])
        );
        let v2 = group((2, "/cg/keel/s"), (2, "/cg/keel/s"));
        assert_eq!(v2.join_files(), (vec![PathBuf::from("/cg/keel/s/cgroup.procs")], vec![]));
        let mixed = group((2, "/cg/keel/s"), (1, "/cg/pids/keel/s"));
        assert_eq!(
            mixed.join_files(),
            (vec![PathBuf::from("/cg/keel/s/cgroup.procs")], vec![PathBuf::from("/cg/pids/keel/s/tasks")])
        );
    }
}
