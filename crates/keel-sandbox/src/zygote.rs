//! The zygote: the `keel` binary re-executed with a hidden argument, single-threaded and
//! small, that makes sandboxes for the kernel (the "jailer" of the process tier). For
//! each request it clone3s a child into new user, mount, PID, IPC, UTS and network
//! namespaces, maps the child's ids, puts it in its cgroup, and lets it go on as the
//! sandbox's init (see `init`). Forking this small process instead of the kernel avoids
//! copying the kernel's address space and the hazards of forking a multi-threaded
//! program, and no exec is needed per sandbox.
//!
//! The zygote lives as long as its socket to the kernel: when the kernel dies (even by
//! SIGKILL) the socket closes, the zygote exits, and every init dies with it
//! (PR_SET_PDEATHSIG), taking its sandbox along.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use crate::init::{self, InitFds};
use crate::sys::{self, Forked};
use crate::wire::{SPAWN_FDS, SpawnReply, SpawnRequest};

/// The hidden first argument that makes `keel` a zygote.
pub const ZYGOTE_ARG: &str = "__keel-sandbox-zygote";

/// The largest request the zygote accepts (the mount plan and the job's environment).
pub const MAX_REQUEST: usize = 1 << 20;

/// Turns this process into a zygote if it was started as one; returns otherwise.
/// Binaries that host the process tier call this first thing in `main`, before any
/// thread (or async runtime) starts.
pub fn run_if_requested() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(ZYGOTE_ARG)) {
        return;
    }
    let fd: Option<RawFd> = args.next().and_then(|a| a.to_str()?.parse().ok());
    let Some(fd) = fd.filter(|&fd| fd > 2) else {
        eprintln!("keel: {ZYGOTE_ARG} is internal to the sandbox and needs its socket");
        sys::exit_now(2);
    };
    // SAFETY: the kernel passed us this fd (inherited on purpose) and nothing else in
    // this fresh process refers to it.
    let socket = unsafe { sys::owned_fd(fd) };
    serve(socket)
}

fn serve(socket: OwnedFd) -> ! {
    // Nothing the kernel holds may leak into sandboxes: keep stdio and the socket only.
    sys::close_from_except(3, &[socket.as_raw_fd()]);
    sys::set_name(c"keel-zygote");
    // Inits are reaped automatically; their status reaches the kernel on their status
    // pipes, not through us.
    sys::ignore_signal(libc::SIGCHLD);
    sys::ignore_signal(libc::SIGPIPE);
    // Work every sandbox would repeat, done once here and inherited through fork.
    for allow_inet in [false, true] {
        if let Err(err) = crate::seccomp::cached(allow_inet) {
            eprintln!("keel zygote: {err}");
        }
    }
    sys::last_capability();
    let mut buffer = vec![0u8; MAX_REQUEST];
    let mut templates = TemplateCache::default();
    loop {
        let (length, fds) = match receive(&socket, &mut buffer) {
            Ok(Some(message)) => message,
            // The kernel is gone: so are we, and with us every sandbox.
            Ok(None) => sys::exit_now(0),
            Err(err) => {
                let _ = reply(
                    &socket,
                    &SpawnReply::Failed { error: format!("the zygote could not read the request: {err}") },
                );
                continue;
            }
        };
        let answer = spawn(&buffer[..length], fds, &mut templates);
        if reply(&socket, &answer).is_err() {
            sys::exit_now(0);
        }
    }
}

fn receive(socket: &OwnedFd, buffer: &mut [u8]) -> std::io::Result<Option<(usize, Vec<OwnedFd>)>> {
    match sys::receive_with_fds(socket.as_fd(), buffer)? {
        (0, fds) if fds.is_empty() => Ok(None),
        message => Ok(Some(message)),
    }
}

fn reply(socket: &OwnedFd, answer: &SpawnReply) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    sys::write_all(socket.as_fd(), &bytes)
}

fn write_map(pid: i32, file: &str, contents: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/{file}"), contents)
        .map_err(|e| std::io::Error::new(e.kind(), format!("write /proc/{pid}/{file}: {e}")))
}

/// Makes one sandbox. The init it starts reports on the status pipe it was given.
/// Templates of the plan's trees (`/etc`, `/dev`), built once and cloned by every
/// sandbox. Rebuilt after a while, since a bind pins the file it saw (a host file replaced
/// since, like a regenerated `ld.so.cache`, would otherwise stay old).
#[derive(Default)]
struct TemplateCache {
    built: std::collections::HashMap<String, (OwnedFd, std::time::Instant)>,
    /// Set when templates cannot be made here (an unprivileged zygote).
    unavailable: bool,
}

const TEMPLATE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl TemplateCache {
    /// Builds what `plan` needs and is missing or old; returns the usable ones.
    fn prepare(&mut self, ops: &[crate::plan::MountOp]) -> crate::init::Templates {
        let mut usable = crate::init::Templates::new();
        if self.unavailable {
            return usable;
        }
        for op in ops.iter().filter(|op| matches!(op, crate::plan::MountOp::Tree { .. })) {
            let Ok(key) = serde_json::to_string(op) else { continue };
            let fresh = self.built.get(&key).is_some_and(|(_, at)| at.elapsed() < TEMPLATE_MAX_AGE);
            if !fresh {
                match crate::init::build_template(op) {
                    Ok(fd) => {
                        self.built.insert(key.clone(), (fd, std::time::Instant::now()));
                    }
                    Err(_) => {
                        // Each sandbox builds its trees itself instead.
                        self.unavailable = true;
                        return crate::init::Templates::new();
                    }
                }
            }
            if let Some((fd, _)) = self.built.get(&key)
                && let Ok(copy) = fd.try_clone()
            {
                usable.insert(key, copy);
            }
        }
        usable
    }
}

fn spawn(bytes: &[u8], fds: Vec<OwnedFd>, templates: &mut TemplateCache) -> SpawnReply {
    let failed = |error: String| SpawnReply::Failed { error };
    let request: SpawnRequest = match serde_json::from_slice(bytes) {
        Ok(request) => request,
        Err(err) => return failed(format!("the zygote got a malformed request: {err}")),
    };
    let fds: Result<[OwnedFd; SPAWN_FDS], _> = fds.try_into();
    let Ok([stdout, stderr, status, control, stdin]) = fds else {
        return failed(format!("the zygote needs exactly {SPAWN_FDS} fds with a request"));
    };
    let templates = templates.prepare(&request.plan.ops);
    let (sync_read, sync_write) = match sys::pipe() {
        Ok(pipe) => pipe,
        Err(err) => return failed(format!("make the sync pipe: {err}")),
    };
    let flags = (libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWNET) as u64;
    match sys::clone3(flags) {
        Err(err) => failed(format!("clone3 into new namespaces: {err}")),
        Ok(Forked::Child) => {
            drop(sync_write);
            let mut keep = vec![
                stdout.as_raw_fd(),
                stderr.as_raw_fd(),
                status.as_raw_fd(),
                control.as_raw_fd(),
                stdin.as_raw_fd(),
                sync_read.as_raw_fd(),
            ];
            keep.extend(templates.values().map(|fd| fd.as_raw_fd()));
            keep.sort();
            // The kernel's socket is closed here too; the child never returns to drop
            // the zygote's copy of it.
            sys::close_from_except(3, &keep);
            init::run(
                request,
                InitFds { stdout, stderr, status, control, stdin, sync: sync_read },
                &templates,
            )
        }
        Ok(Forked::Parent(pid)) => {
            drop(sync_read);
            let setup = (|| -> std::io::Result<()> {
                write_map(pid, "setgroups", "deny")?;
                write_map(pid, "uid_map", &format!("{0} {0} 1\n", request.uid))?;
                write_map(pid, "gid_map", &format!("{0} {0} 1\n", request.gid))?;
                for procs in &request.cgroup_procs {
                    std::fs::write(procs, pid.to_string()).map_err(|e| {
                        std::io::Error::new(e.kind(), format!("join {}: {e}", procs.display()))
                    })?;
                }
                sys::write_all(sync_write.as_fd(), b"1")
            })();
            match setup {
                Ok(()) => SpawnReply::Spawned { pid },
                Err(err) => {
                    sys::kill(pid, libc::SIGKILL);
                    failed(format!("set up sandbox {pid}: {err}"))
                }
            }
        }
    }
}
