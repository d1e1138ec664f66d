//! The sandbox's init: PID 1 of the sandbox's namespaces. It is forked by the zygote
//! (itself the `keel` binary re-executed with a hidden argument), so it is Keel's own
//! code, never the agent's. It builds the root from the mount plan, pivots into it,
//! starts the agent with its limits (rlimits, no capabilities, no_new_privs, Landlock,
//! seccomp), then stays: it reaps zombies, forwards signals to every process of the
//! sandbox, relays loopback TCP bridges to the kernel's Unix sockets, and when the agent
//! exits reports its status and takes the rest of the sandbox down with it.
//!
//! Every failure is reported as one `error` line on the status pipe, naming the step.

use std::convert::Infallible;
use std::ffi::{CString, c_char};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
};

use crate::plan::{MountOp, MountPlan};
use crate::sys::{self, Forked};
use crate::wire::{Job, SpawnRequest, Status};

/// Where the new root is assembled before `pivot_root`. Every host path the plan binds
/// is opened before this is mounted over, so it hiding the host's `/tmp` is harmless.
const STAGING: &str = "/tmp";

/// The fds the init starts with (all close-on-exec).
pub(crate) struct InitFds {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub status: OwnedFd,
    pub control: OwnedFd,
    /// The agent's stdin pipe (read end), used when its job asks for it.
    pub stdin: OwnedFd,
    /// Read end of the pipe on which the zygote says "ids mapped, cgroup joined".
    pub sync: OwnedFd,
}

/// Signals the init passes on to every process of the sandbox.
const FORWARDED: &[i32] =
    &[libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGWINCH];

fn report(status: &OwnedFd, line: &Status) {
    let _ = sys::write_all(status.as_fd(), line.to_line().as_bytes());
}

/// Runs the init in the child of the zygote's clone3. Never returns.
pub(crate) fn run(request: SpawnRequest, fds: InitFds, templates: &Templates) -> ! {
    let InitFds { stdout, stderr, status, control, stdin, sync } = fds;
    let result = init(request, [stdin, stdout, stderr], control, sync, &status, templates);
    let Err(error) = result;
    report(&status, &Status::Error(error));
    sys::exit_now(1)
}

/// Attaches the step to an error.
fn at<T>(step: &str, result: std::io::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("{step}: {e}"))
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{path:?} contains a NUL byte"))
}

/// `stdio` is the agent's stdin pipe (used when its job asks for it), stdout and stderr.
fn init(
    request: SpawnRequest,
    stdio: [OwnedFd; 3],
    control: OwnedFd,
    sync: OwnedFd,
    status: &OwnedFd,
    templates: &Templates,
) -> Result<Infallible, String> {
    let [stdin, stdout, stderr] = stdio;
    // getppid() is 0 in a new PID namespace, so the usual "did the parent die before
    // prctl" check cannot be made; the sync pipe covers that race: if the zygote dies,
    // the read below ends without its byte.
    at("set the parent-death signal", sys::set_parent_death_signal(libc::SIGKILL))?;
    sys::set_name(c"keel-init");
    sys::reset_signals();
    let mut go = [0u8; 1];
    if at("wait for the zygote", sys::read(sync.as_fd(), &mut go))? != 1 {
        return Err("the zygote did not finish setting up the sandbox".into());
    }
    drop(sync);
    // Still one thread: join the v1 groups by moving ourselves (see `join_files`).
    for tasks in &request.cgroup_tasks {
        at(&format!("join the cgroup {}", tasks.display()), std::fs::write(tasks, "0"))?;
    }
    at("start a session", sys::setsid())?;
    // The cgroup namespace is made now that we are in our group, so the sandbox sees
    // that group as its root.
    at("unshare the cgroup namespace", sys::unshare(libc::CLONE_NEWCGROUP))?;
    at("become non-dumpable", sys::set_dumpable(false))?;
    at("redirect stdout", sys::dup2(stdout.as_raw_fd(), 1))?;
    at("redirect stderr", sys::dup2(stderr.as_raw_fd(), 2))?;
    drop((stdout, stderr));

    build_root(&request.plan, &request.cwd, templates)?;
    at("set the hostname", sys::set_hostname("keel"))?;
    at("bring loopback up", sys::loopback_up())?;
    let listeners = request
        .bridges
        .iter()
        .map(|(port, socket)| {
            let listener = at(
                &format!("listen on bridge port {port}"),
                std::net::TcpListener::bind(("127.0.0.1", *port)),
            )?;
            Ok((listener, socket.clone()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // From here on the init is as confined as the agent will be (the agent inherits all
    // of it): no capabilities, no_new_privs, Landlock, seccomp. Done before waiting for a
    // job, so a pooled sandbox hands over a job without any of this on the way.
    let filter = crate::seccomp::cached(request.allow_inet)?;
    let ports: Vec<u16> = request.bridges.iter().map(|(port, _)| *port).collect();
    let ruleset = landlock_ruleset(request.landlock_abi, &request.plan, &ports)?;
    at("drop capabilities", sys::drop_all_capabilities())?;
    at("set no_new_privs", sys::set_no_new_privs())?;
    ruleset.restrict_self().map_err(|e| format!("apply the Landlock ruleset: {e}"))?;
    crate::seccomp::install(filter).map_err(|e| format!("install the seccomp filter: {e}"))?;

    let null = at("open /dev/null", std::fs::OpenOptions::new().read(true).write(true).open("/dev/null"))?;
    let mut waited: Vec<i32> = vec![libc::SIGCHLD];
    waited.extend_from_slice(FORWARDED);
    at("block signals", sys::block_signals(&waited))?;
    let agent = match request.job {
        Some(job) => {
            drop(control);
            let agent = start_now(&job, &stdin, &null);
            drop((stdin, null));
            agent?
        }
        None => start_pooled(control, stdin, null, status)?,
    };
    report(status, &Status::Started);

    for (listener, socket) in listeners {
        std::thread::spawn(move || bridge(listener, socket));
    }
    loop {
        let signal = at("wait for signals", sys::wait_signal(&waited))?;
        if signal != libc::SIGCHLD {
            sys::kill(-1, signal);
            continue;
        }
        while let Some((pid, raw)) = sys::reap_one() {
            if pid == agent {
                report(status, &Status::Exit(raw));
                // The run is its whole tree: whatever the agent left behind goes too.
                sys::kill(-1, libc::SIGKILL);
                // The kernel hears the sandbox has ended when this pipe closes. Closed
                // here, not by the exit: Linux tears down an exiting process's memory
                // before its files, and this one's is a copy of the zygote's (the whole
                // `keel` image), so the run's end would otherwise wait on that teardown.
                sys::close_before_exit(status.as_raw_fd());
                sys::exit_now(0);
            }
        }
    }
}

/// Starts a given job's program at once (a cold sandbox), without copying the init to
/// do it (see [`sys::vfork_exec`]); returns its pid.
fn start_now(job: &Job, stdin: &OwnedFd, null: &std::fs::File) -> Result<i32, String> {
    let exec = Exec::new(job)?;
    let input = if job.stdin { stdin.as_raw_fd() } else { null.as_raw_fd() };
    sys::vfork_exec(&exec.plan(input), false)
        .map(|(pid, _)| pid)
        .map_err(|(step, e)| start_error(job, step, e))
}

/// What a failed step of starting `job` is reported as.
fn start_error(job: &Job, step: sys::ExecStep, e: std::io::Error) -> String {
    match step {
        sys::ExecStep::Stdio => format!("redirect stdin: {e}"),
        sys::ExecStep::Limit(index) => format!("set the {:?} limit: {e}", job.rlimits[index].resource),
        sys::ExecStep::CloseOnExec => format!("mark fds close-on-exec: {e}"),
        _ => format!("could not start {}: {e}", job.program.display()),
    }
}

/// Forks the agent process of a pooled sandbox, which waits for its job on `control`, so
/// that a claim costs a pipe write and an exec; reports the sandbox ready, then waits
/// until the job's program runs. Returns its pid.
fn start_pooled(
    control: OwnedFd,
    stdin: OwnedFd,
    null: std::fs::File,
    status: &OwnedFd,
) -> Result<i32, String> {
    let (error_read, error_write) = at("make the exec pipe", sys::pipe())?;
    let agent = match at("fork the agent", sys::fork())? {
        Forked::Child => {
            drop(error_read);
            start_agent(control, stdin, null.as_raw_fd(), error_write)
        }
        Forked::Parent(pid) => {
            drop((control, stdin));
            pid
        }
    };
    drop((error_write, null));
    report(status, &Status::Ready);
    let mut failure = String::new();
    let _ = std::fs::File::from(error_read).read_to_string(&mut failure);
    if failure == NO_JOB {
        sys::exit_now(0); // The kernel dropped this pooled sandbox.
    }
    if !failure.is_empty() {
        sys::kill(-1, libc::SIGKILL);
        return Err(failure);
    }
    Ok(agent)
}

/// The exec arguments, built before fork so the child only makes system calls.
struct Exec {
    program: CString,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    envp_ptrs: Vec<*const c_char>,
    /// The job's limits, as `(resource, value)`.
    rlimits: Vec<(i32, u64)>,
}

impl Exec {
    fn new(job: &Job) -> Result<Exec, String> {
        let nul = |what: &str| format!("the {what} contains a NUL byte");
        let program = cstring(&job.program)?;
        let argv: Vec<CString> = job
            .argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| nul("command"))?;
        let envp: Vec<CString> = job
            .env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<_, _>>()
            .map_err(|_| nul("environment"))?;
        let pointers = |strings: &[CString]| {
            strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>()
        };
        let rlimits = job.rlimits.iter().map(|l| (l.resource.raw(), l.value)).collect();
        Ok(Exec {
            program,
            argv_ptrs: pointers(&argv),
            envp_ptrs: pointers(&envp),
            _argv: argv,
            _envp: envp,
            rlimits,
        })
    }

    /// The agent's start from the init: `input` as stdin, the job's limits, no other
    /// descriptor, no blocked signal. The init never installs handlers (it blocks and
    /// waits), so they need no reset.
    fn plan(&self, input: i32) -> sys::ExecPlan<'_> {
        sys::ExecPlan {
            program: &self.program,
            argv: &self.argv_ptrs,
            envp: &self.envp_ptrs,
            cwd: None,
            stdio: [Some(input), None, None],
            rlimits: &self.rlimits,
            own_group_dying_with_parent: false,
            reset_handlers: false,
            close_on_exec_from: Some(3),
        }
    }
}

/// What the agent process reports when its pooled sandbox is dropped without a job.
const NO_JOB: &str = "\0no job";

/// In the forked agent process of a pooled sandbox (confined like the init already):
/// reads its job from the control pipe, sets the job's resource limits and execs.
/// Reports failure on `error` (which closes on a successful exec).
fn start_agent(control: OwnedFd, stdin: OwnedFd, null: i32, error: OwnedFd) -> ! {
    let fail = |message: String| -> ! {
        let _ = sys::write_all(error.as_fd(), message.as_bytes());
        sys::exit_now(127)
    };
    let mut text = Vec::new();
    if let Err(e) = std::fs::File::from(control).read_to_end(&mut text) {
        fail(format!("read the job: {e}"));
    }
    if text.is_empty() {
        let _ = sys::write_all(error.as_fd(), NO_JOB.as_bytes());
        sys::exit_now(0);
    }
    let job = match serde_json::from_slice::<Job>(&text) {
        Ok(job) => job,
        Err(e) => fail(format!("the job is not valid: {e}")),
    };
    let exec = match Exec::new(&job) {
        Ok(exec) => exec,
        Err(e) => fail(e),
    };
    let input = if job.stdin { stdin.as_raw_fd() } else { null };
    let (step, e) = sys::exec_in_place(&exec.plan(input));
    fail(start_error(&job, step, e))
}

/// The Landlock ruleset: read and execute what is visible, write only beneath the
/// writable mounts, TCP only to the bridges, no signals or abstract sockets beyond the
/// sandbox (as far as this kernel's ABI goes; ABI 1 is required).
fn landlock_ruleset(abi: i32, plan: &MountPlan, ports: &[u16]) -> Result<RulesetCreated, String> {
    let abi = ABI::from(abi.min(7));
    if abi == ABI::Unsupported {
        return Err("Landlock is not available".into());
    }
    let err = |e: landlock::RulesetError| format!("build the Landlock ruleset: {e}");
    let path = |p: &Path| PathFd::new(p).map_err(|e| format!("open {} for Landlock: {e}", p.display()));
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    let net = abi >= ABI::V4;
    if net {
        ruleset = ruleset.handle_access(AccessNet::ConnectTcp).map_err(err)?;
    }
    if abi >= ABI::V6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    created =
        created.add_rule(PathBeneath::new(path(Path::new("/"))?, AccessFs::from_read(abi))).map_err(err)?;
    for dir in &plan.writable_dirs {
        created = created.add_rule(PathBeneath::new(path(dir)?, AccessFs::from_all(abi))).map_err(err)?;
    }
    for file in &plan.writable_files {
        created = created.add_rule(PathBeneath::new(path(file)?, AccessFs::from_file(abi))).map_err(err)?;
    }
    if net {
        for &port in ports {
            created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp)).map_err(err)?;
        }
    }
    Ok(created)
}

/// Relays each connection to a bridge port to the Unix socket behind it.
fn bridge(listener: std::net::TcpListener, socket: PathBuf) {
    for connection in listener.incoming() {
        let Ok(tcp) = connection else { continue };
        let socket = socket.clone();
        std::thread::spawn(move || {
            let Ok(unix) = std::os::unix::net::UnixStream::connect(&socket) else { return };
            let (Ok(mut tcp_read), Ok(mut unix_read)) = (tcp.try_clone(), unix.try_clone()) else { return };
            let (mut tcp_write, mut unix_write) = (tcp, unix);
            let upstream = std::thread::spawn(move || {
                let _ = std::io::copy(&mut tcp_read, &mut unix_write);
                let _ = unix_write.shutdown(std::net::Shutdown::Write);
            });
            let _ = std::io::copy(&mut unix_read, &mut tcp_write);
            let _ = tcp_write.flush();
            let _ = tcp_write.shutdown(std::net::Shutdown::Write);
            let _ = upstream.join();
        });
    }
}

/// `target` (absolute inside a tree or the root) under `root`: `/a/b` → `<root>/a/b`.
fn under(root: &Path, target: &Path) -> PathBuf {
    root.join(target.strip_prefix("/").unwrap_or(target))
}

fn make_parent(path: &Path) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        at(&format!("create {}", parent.display()), std::fs::create_dir_all(parent))?;
    }
    Ok(())
}

/// Trees the zygote built ahead of time, by the JSON of their `MountOp::Tree`.
pub(crate) type Templates = std::collections::HashMap<String, OwnedFd>;

/// What an op needs from the host, taken before the staging root hides anything.
enum Captured {
    Nothing,
    /// A detached copy of a bind's source, and whether it is a directory.
    Bind(OwnedFd, bool),
    /// A tree to build here, with what its ops need.
    Tree(Vec<Captured>),
    /// A tree cloned from the zygote's template.
    Template(OwnedFd),
}

fn capture(ops: &[MountOp], templates: &Templates) -> Result<Vec<Captured>, String> {
    ops.iter()
        .map(|op| match op {
            MountOp::Bind { source, writable, target } => {
                let step = format!("bind {} at {}", source.display(), target.display());
                let is_dir = at(&step, std::fs::metadata(source))?.is_dir();
                let tree = at(&step, sys::open_tree_clone(&cstring(source)?, is_dir))?;
                let mut attributes = libc::MOUNT_ATTR_NOSUID;
                if !writable {
                    attributes |= libc::MOUNT_ATTR_RDONLY;
                }
                // Device nodes keep working; everything else is nodev.
                if !source.starts_with("/dev") {
                    attributes |= libc::MOUNT_ATTR_NODEV;
                }
                at(&step, sys::mount_setattr(tree.as_fd(), attributes, 0, true))?;
                Ok(Captured::Bind(tree, is_dir))
            }
            MountOp::Tree { target, ops, .. } => {
                let key = serde_json::to_string(op).map_err(|e| e.to_string())?;
                match templates.get(&key) {
                    Some(template) => {
                        let step = format!("clone the {} template", target.display());
                        Ok(Captured::Template(at(&step, sys::clone_detached(template.as_fd()))?))
                    }
                    None => Ok(Captured::Tree(capture(ops, templates)?)),
                }
            }
            _ => Ok(Captured::Nothing),
        })
        .collect()
}

/// Builds the root from the plan and pivots into it; the working directory ends up
/// being `cwd`.
fn build_root(plan: &MountPlan, cwd: &Path, templates: &Templates) -> Result<(), String> {
    at("make mounts private", sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None))?;
    // Capture every host source first: later mounts (the staging root over /tmp) may
    // hide their paths.
    let captured = capture(&plan.ops, templates)?;
    let staging = CString::new(STAGING).map_err(|e| e.to_string())?;
    at(
        "mount the root tmpfs",
        sys::mount(
            Some(c"tmpfs"),
            &staging,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(c"size=1m,mode=0755"),
        ),
    )?;
    let root = Path::new(STAGING);
    for (op, captured) in plan.ops.iter().zip(captured) {
        apply(op, captured, root)?;
    }
    at("enter the root", std::env::set_current_dir(STAGING))?;
    at("pivot_root", sys::pivot_root(c".", c"."))?;
    at("detach the host root", sys::umount_detach(c"."))?;
    at("enter /", std::env::set_current_dir("/"))?;
    at(&format!("enter the working directory {}", cwd.display()), std::env::set_current_dir(cwd))?;
    Ok(())
}

/// Builds a tree as a detached, sealed template (in the zygote), for sandboxes to clone.
/// Needs the right to make mounts (the zygote of a root kernel); others build trees in
/// each sandbox.
pub(crate) fn build_template(tree: &MountOp) -> Result<OwnedFd, String> {
    let MountOp::Tree { size, ops, .. } = tree else { return Err("not a tree".into()) };
    let mount = at("make a template tmpfs", sys::detached_tmpfs(*size))?;
    // The detached mount's root, reachable by path through its fd.
    let root = PathBuf::from(format!("/proc/self/fd/{}", mount.as_raw_fd()));
    let captured = capture(ops, &Templates::new())?;
    for (op, captured) in ops.iter().zip(captured) {
        apply(op, captured, &root)?;
    }
    at("seal the template", sys::mount_setattr(mount.as_fd(), libc::MOUNT_ATTR_RDONLY, 0, false))?;
    Ok(mount)
}

fn tmpfs_options(size: u64, mode: u32) -> Result<CString, String> {
    CString::new(format!("size={size},mode={mode:o}")).map_err(|e| e.to_string())
}

/// Applies one step of the plan under `root` (the staging root, or a tree).
fn apply(op: &MountOp, captured: Captured, root: &Path) -> Result<(), String> {
    match op {
        MountOp::Tmpfs { target, size, mode } => {
            let path = under(root, target);
            let step = format!("mount a tmpfs at {}", target.display());
            at(&step, std::fs::create_dir_all(&path))?;
            let options = tmpfs_options(*size, *mode)?;
            at(
                &step,
                sys::mount(
                    Some(c"tmpfs"),
                    &cstring(&path)?,
                    Some(c"tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&options),
                ),
            )
        }
        MountOp::Tree { target, size, ops } => {
            let path = under(root, target);
            let step = format!("make {}", target.display());
            at(&step, std::fs::create_dir_all(&path))?;
            match captured {
                Captured::Template(clone) => at(&step, sys::move_mount(clone.as_fd(), &cstring(&path)?)),
                Captured::Tree(inner) => {
                    let options = tmpfs_options(*size, 0o755)?;
                    let target_c = cstring(&path)?;
                    let flags = libc::MS_NOSUID | libc::MS_NODEV;
                    at(&step, sys::mount(Some(c"tmpfs"), &target_c, Some(c"tmpfs"), flags, Some(&options)))?;
                    for (op, captured) in ops.iter().zip(inner) {
                        apply(op, captured, &path)?;
                    }
                    let seal = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | flags;
                    at(&step, sys::mount(None, &target_c, None, seal, None))
                }
                _ => Err(format!("{step}: nothing was prepared for it")),
            }
        }
        MountOp::Bind { target, .. } => {
            let Captured::Bind(tree, is_dir) = captured else {
                return Err(format!("bind at {}: no source", target.display()));
            };
            let path = under(root, target);
            let step = format!("bind at {}", target.display());
            if is_dir {
                at(&step, std::fs::create_dir_all(&path))?;
            } else if std::fs::symlink_metadata(&path).is_err() {
                make_parent(&path)?;
                at(&step, std::fs::File::create(&path))?;
            }
            at(&step, sys::move_mount(tree.as_fd(), &cstring(&path)?))
        }
        MountOp::Proc { target } => {
            let path = under(root, target);
            let step = "mount /proc";
            at(step, std::fs::create_dir_all(&path))?;
            at(
                step,
                sys::mount(
                    Some(c"proc"),
                    &cstring(&path)?,
                    Some(c"proc"),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    None,
                ),
            )
        }
        MountOp::Protect { target } => {
            let path = under(root, target);
            if std::fs::symlink_metadata(&path).is_err() {
                return Ok(());
            }
            let step = format!("make {} read-only", target.display());
            let path = cstring(&path)?;
            at(&step, sys::mount(Some(&path), &path, None, libc::MS_BIND | libc::MS_REC, None))?;
            let flags = libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC;
            at(&step, sys::mount(None, &path, None, flags, None))
        }
        MountOp::Seal { target } => {
            let step = format!("seal {}", target.display());
            let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            at(&step, sys::mount(None, &cstring(&under(root, target))?, None, flags, None))
        }
        MountOp::Dir { target } => {
            at(&format!("create {}", target.display()), std::fs::create_dir_all(under(root, target)))
        }
        MountOp::Symlink { target, points_to } => {
            let path = under(root, target);
            make_parent(&path)?;
            at(&format!("link {}", target.display()), std::os::unix::fs::symlink(points_to, &path))
        }
        MountOp::File { target, contents } => {
            let path = under(root, target);
            make_parent(&path)?;
            at(&format!("write {}", target.display()), std::fs::write(&path, contents))
        }
        MountOp::Mask { target } => {
            let path = under(root, target);
            let Ok(meta) = std::fs::symlink_metadata(&path) else { return Ok(()) };
            let step = format!("mask {}", target.display());
            let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            if meta.is_dir() {
                at(
                    &step,
                    sys::mount(
                        Some(c"tmpfs"),
                        &cstring(&path)?,
                        Some(c"tmpfs"),
                        flags,
                        Some(c"size=4k,mode=0"),
                    ),
                )
            } else {
                let null = cstring(&under(root, Path::new("/dev/null")))?;
                let path = cstring(&path)?;
                at(&step, sys::mount(Some(&null), &path, None, libc::MS_BIND, None))?;
                at(&step, sys::mount(None, &path, None, libc::MS_BIND | libc::MS_REMOUNT | flags, None))
            }
        }
    }
}
