//! The one wrapper around raw Linux system calls that the sandbox needs and `nix` does not
//! cover (or covers with allocation we cannot afford after `fork`), and around passing
//! descriptors over a socket, which the zygote, its kernel side and the spawner share.
//! Every `unsafe` block of the crate's process tier lives here, each with the reason it is
//! sound; callers get safe functions returning `io::Result`.

use std::ffi::{CStr, CString, c_char, c_int, c_long, c_uint};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

fn check(ret: c_long) -> io::Result<c_long> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn check_int(ret: c_int) -> io::Result<c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// `struct clone_args` of clone3(2), version 0 (64 bytes): the fields we use.
#[repr(C, align(8))]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// What `clone3` returned on one side of the fork.
pub enum Forked {
    /// In the parent: the child's pid (in the parent's pid namespace).
    Parent(i32),
    /// In the child.
    Child,
}

/// clone3(2) with fork semantics (own copy of memory, a new stack is not needed) and the
/// given namespace flags; the child's exit is reported to the parent with SIGCHLD.
///
/// The caller must be single-threaded, or the child must restrict itself to
/// async-signal-safe work until it execs: only the calling thread is copied.
pub fn clone3(flags: u64) -> io::Result<Forked> {
    let args = CloneArgs { flags, exit_signal: libc::SIGCHLD as u64, ..CloneArgs::default() };
    // SAFETY: `args` is a valid clone_args of the size we pass; without CLONE_VM the
    // child gets a copy-on-write copy of our memory and continues on its copy of the
    // current stack, exactly like fork(2), so no Rust invariant is broken on either side.
    let ret = unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
    };
    match check(ret)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as i32)),
    }
}

/// fork(2). Same caveat as [`clone3`].
pub fn fork() -> io::Result<Forked> {
    // SAFETY: fork has no memory-safety preconditions; the callers (the sandbox init,
    // `keel-interp`'s template) are single-threaded when they fork, so the child may
    // allocate.
    match check_int(unsafe { libc::fork() })? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Ends the process at once, without running destructors or flushing stdio: the only
/// safe way out of a forked child that shares state with its parent.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// close(2) of a descriptor borrowed from its owner, for a process about to
/// [`exit_now`]: the owner never uses it again, as it never runs again.
pub fn close_before_exit(fd: RawFd) {
    // SAFETY: closing a number touches no memory; the caller exits before anything
    // could use, or reuse, that number.
    unsafe { libc::close(fd) };
}

/// open_tree(2) with OPEN_TREE_CLONE: a detached copy of the mount (and with `recursive`,
/// its submounts) at `path`, ready to be attached elsewhere with [`move_mount`].
pub fn open_tree_clone(path: &CStr, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as c_uint;
    }
    // SAFETY: `path` is a valid NUL-terminated string; the returned fd is new and ours.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A detached copy of the detached (or attached) mount tree `fd` (open_tree(2) with
/// OPEN_TREE_CLONE on the fd itself).
pub fn clone_detached(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as c_uint
        | libc::AT_EMPTY_PATH as c_uint;
    // SAFETY: an empty path with AT_EMPTY_PATH acts on `fd`; the returned fd is new.
    let new = check(unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new as RawFd) })
}

/// A new tmpfs of at most `size` bytes (mode 0755), not attached anywhere
/// (fsopen/fsconfig/fsmount), nosuid and nodev.
pub fn detached_tmpfs(size: u64) -> io::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: c_uint = 1;
    const FSCONFIG_SET_STRING: c_uint = 1;
    const FSCONFIG_CMD_CREATE: c_uint = 6;
    const FSMOUNT_CLOEXEC: c_uint = 1;
    // SAFETY: a NUL-terminated file system name; the returned fd is new.
    let context = check(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: as above.
    let context = unsafe { OwnedFd::from_raw_fd(context as RawFd) };
    let size = std::ffi::CString::new(size.to_string()).map_err(io::Error::other)?;
    for (key, value) in [(c"size", size.as_c_str()), (c"mode", c"0755")] {
        // SAFETY: NUL-terminated key and value strings for FSCONFIG_SET_STRING.
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: no pointers for FSCONFIG_CMD_CREATE.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        )
    })?;
    let attributes = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    // SAFETY: plain integers; the returned fd is new.
    let mount =
        check(unsafe { libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, attributes) })?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(mount as RawFd) })
}

/// mount_setattr(2) on a mount fd: set and clear `MOUNT_ATTR_*` flags, on the whole tree
/// with `recursive`.
pub fn mount_setattr(fd: BorrowedFd<'_>, set: u64, clear: u64, recursive: bool) -> io::Result<()> {
    let attr = libc::mount_attr { attr_set: set, attr_clr: clear, propagation: 0, userns_fd: 0 };
    let mut flags = libc::AT_EMPTY_PATH as c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as c_uint;
    }
    // SAFETY: empty path with AT_EMPTY_PATH acts on `fd`; `attr` is valid for its size.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })?;
    Ok(())
}

/// move_mount(2): attaches the detached mount `fd` at `target`.
pub fn move_mount(fd: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated strings.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// mount(2).
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is NULL or a valid NUL-terminated string for the call.
    check_int(unsafe { libc::mount(ptr(source), target.as_ptr(), ptr(fstype), flags, ptr(data).cast()) })?;
    Ok(())
}

/// umount2(2) with MNT_DETACH.
pub fn umount_detach(target: &CStr) -> io::Result<()> {
    // SAFETY: valid NUL-terminated string.
    check_int(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) })?;
    Ok(())
}

/// pivot_root(2).
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: valid NUL-terminated strings.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })?;
    Ok(())
}

/// unshare(2).
pub fn unshare(flags: c_int) -> io::Result<()> {
    // SAFETY: no pointers involved.
    check_int(unsafe { libc::unshare(flags) })?;
    Ok(())
}

fn prctl(option: c_int, arg2: libc::c_ulong) -> io::Result<c_int> {
    // SAFETY: the options we use take integer arguments only.
    check_int(unsafe {
        libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong)
    })
}

/// The signal this process gets when its parent dies.
pub fn set_parent_death_signal(signal: c_int) -> io::Result<()> {
    prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong).map(drop)
}

/// Makes the calling thread the least important on the CPU (nice 19): for housekeeping.
pub fn lower_thread_priority() {
    // SAFETY: setpriority with PRIO_PROCESS and a thread id affects only that thread
    // on Linux; no pointers involved.
    unsafe {
        let thread = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, thread, 19);
    }
}

/// How the binary's own global allocator, when it is not the C library's, gives its free
/// memory back (see [`set_heap_release`]).
static HEAP_RELEASE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what [`release_free_heap`] calls besides `malloc_trim`: the binary's global
/// allocator's way of giving its free pages back (the `keel` binary's is jemalloc's purge
/// of every arena). The first call wins.
pub fn set_heap_release(release: fn()) {
    let _ = HEAP_RELEASE.set(release);
}

/// Gives the allocators' free memory back to the operating system: the binary's own
/// allocator's (see [`set_heap_release`]), and glibc's `malloc_trim`, which releases free
/// pages inside every arena, not just at the top (all of Rust's heap in a binary without
/// an allocator of its own; otherwise what C code such as SQLite allocated). Elsewhere a
/// no-op.
pub fn release_free_heap() {
    if let Some(release) = HEAP_RELEASE.get() {
        release();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and madvises the allocator's own free lists, under
    // the allocator's locks; it takes no pointers from us.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Names the calling thread (what `ps` shows), e.g. `keel-init`.
pub fn set_name(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes; longer
    // names are truncated by the kernel.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Non-dumpable processes cannot be ptraced or have their /proc files read by processes
/// without CAP_SYS_PTRACE.
pub fn set_dumpable(dumpable: bool) -> io::Result<()> {
    prctl(libc::PR_SET_DUMPABLE, dumpable as libc::c_ulong).map(drop)
}

pub fn set_no_new_privs() -> io::Result<()> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map(drop)
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    check_int(unsafe { libc::setsid() })?;
    Ok(())
}

/// The highest capability number this kernel knows (read once per process).
pub fn last_capability() -> libc::c_ulong {
    static LAST: std::sync::OnceLock<libc::c_ulong> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

/// Drops every capability for good: the bounding set (so no exec can regain them), the
/// ambient set, and the effective, permitted and inheritable sets.
pub fn drop_all_capabilities() -> io::Result<()> {
    for cap in 0..=last_capability() {
        match prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(_) => {}
            // Capabilities beyond what this kernel knows.
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => break,
            Err(err) => return Err(err),
        }
    }
    // SAFETY: integer-only prctl.
    check_int(unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0)
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: VERSION_3, pid: 0 };
    let data = [
        Data { effective: 0, permitted: 0, inheritable: 0 },
        Data { effective: 0, permitted: 0, inheritable: 0 },
    ];
    // SAFETY: version 3 takes a header and two data structs, which we pass.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) })?;
    Ok(())
}

/// Closes every fd from `first` up except those in `keep` (which must be sorted).
pub fn close_from_except(first: RawFd, keep: &[RawFd]) {
    let mut start = first;
    for &fd in keep.iter().filter(|&&fd| fd >= first) {
        if fd > start {
            // SAFETY: closing fds nobody else in this process uses (the caller's
            // contract: only the kept ones are still referenced).
            unsafe { libc::syscall(libc::SYS_close_range, start as c_uint, (fd - 1) as c_uint, 0 as c_uint) };
        }
        start = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, start as c_uint, c_uint::MAX, 0 as c_uint) };
}

/// dup2(2), leaving the new fd without close-on-exec.
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: plain fd numbers.
    check_int(unsafe { libc::dup2(from, to) })?;
    Ok(())
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket call; the fd is wrapped at once.
    let fd = check_int(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the fd was just created and is owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the ifreq we pass.
    check_int(unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) })?;
    // SAFETY: the flags member of the union is the one the kernel filled in.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above.
    check_int(unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) })?;
    Ok(())
}

/// The Landlock ABI version this kernel offers (0: none).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;
    // SAFETY: with the VERSION flag the call takes no attribute and returns an int.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 { 0 } else { ret as i32 }
}

/// Whether this kernel offers seccomp filters (PR_GET_SECCOMP answers and the filter
/// mode is listed).
pub fn seccomp_filters_available() -> bool {
    prctl(libc::PR_GET_SECCOMP, 0).is_ok()
        && std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
            .is_ok_and(|actions| actions.contains("errno"))
}

/// Blocks `signals` for the calling thread (and what it forks), returning the old mask.
pub fn block_signals(signals: &[c_int]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        let ret = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        Ok(old)
    }
}

/// Unblocks every signal and restores default dispositions (what a freshly exec'd
/// program expects, and what init needs after being forked from the zygote).
pub fn reset_signals() {
    // SAFETY: sigset_t initialised by sigemptyset; SIG_DFL is always a valid handler for
    // the catchable signals (SIGKILL and SIGSTOP fail harmlessly).
    unsafe {
        for signal in 1..libc::SIGRTMIN() {
            libc::signal(signal, libc::SIG_DFL);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Blocks every signal of the calling thread; returns the mask it had.
pub fn block_all_signals() -> libc::sigset_t {
    // SAFETY: signal masks are per thread; both sets are valid sigset_t.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

/// Sets the calling thread's signal mask (one [`block_all_signals`] returned).
pub fn set_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// Ignores `signal` (SIG_IGN).
pub fn ignore_signal(signal: c_int) {
    // SAFETY: SIG_IGN is a valid disposition for catchable signals.
    unsafe { libc::signal(signal, libc::SIG_IGN) };
}

/// Waits for one of `signals` (which must be blocked) and returns its number.
pub fn wait_signal(signals: &[c_int]) -> io::Result<c_int> {
    // SAFETY: sigset_t initialised before use; siginfo is written by the kernel.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        let mut info: libc::siginfo_t = std::mem::zeroed();
        loop {
            match check_int(libc::sigwaitinfo(&set, &mut info)) {
                // A stop and continue (keel pause / resume) interrupts the wait.
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// waitpid(-1, WNOHANG): one exited child and its raw wait status, if any.
pub fn reap_one() -> Option<(i32, i32)> {
    let mut status: c_int = 0;
    // SAFETY: `status` is a valid out-pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

/// kill(2); errors (no such process) are ignored by design: the callers signal
/// processes that may have exited already.
pub fn kill(pid: i32, signal: c_int) {
    // SAFETY: no pointers involved.
    unsafe { libc::kill(pid, signal) };
}

/// Writes all of `bytes` to `fd`, retrying on EINTR.
pub fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe `bytes`.
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// read(2) into `buf`, retrying on EINTR; 0 means end of file.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// sendmsg(2) of `bytes` with `fds` attached (`SCM_RIGHTS`), retried on EINTR. On a
/// non-blocking socket, a full buffer is `WouldBlock`.
pub fn send_with_fds(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let rights = [ControlMessage::ScmRights(fds)];
    let control: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    loop {
        match sendmsg::<()>(socket.as_raw_fd(), &[io::IoSlice::new(bytes)], control, MsgFlags::empty(), None)
        {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other.map(drop).map_err(io::Error::from),
        }
    }
}

/// recvmsg(2) of one message into `buffer`, retried on EINTR: its length and the
/// descriptors it carried (at most [`crate::wire::SPAWN_FDS`], close-on-exec). Length 0
/// with no descriptors: the peer closed. A message cut short is an error.
pub fn receive_with_fds(socket: BorrowedFd<'_>, buffer: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut space = nix::cmsg_space!([RawFd; crate::wire::SPAWN_FDS]);
    let mut iov = [io::IoSliceMut::new(buffer)];
    let message = loop {
        match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in message.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS fds are new in this table and owned by nobody else.
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if message.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::other("the message was truncated"));
    }
    Ok((message.bytes, fds))
}

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    check_int(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Clears close-on-exec on `fd`, so a program we exec inherits it.
pub fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fd flag manipulation.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) })?;
    Ok(())
}

/// The effective uid and gid of this process.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// sethostname(2) (in the sandbox's own UTS namespace).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`.
    check_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// Takes ownership of an fd number handed to us by our parent (the zygote's socket).
///
/// # Safety
/// `fd` must be open and owned by nobody else in this process.
pub unsafe fn owned_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller guarantees ownership.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A program to start with [`spawn_dying_with_parent`], prepared in full beforehand: the
/// child shares our memory until it execs, so it may not allocate.
pub struct Exec {
    /// A path: absolute, or relative to `cwd` (a bare name is resolved by the caller).
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: CString,
    /// What become the child's stdin, stdout and stderr.
    pub stdio: [OwnedFd; 3],
}

/// What a child started with [`vfork_exec`] does before it execs, all decided by the
/// parent: the child shares the parent's memory until it execs, so it only makes system
/// calls on these values.
pub struct ExecPlan<'a> {
    pub program: &'a CStr,
    /// NULL-terminated.
    pub argv: &'a [*const c_char],
    /// NULL-terminated.
    pub envp: &'a [*const c_char],
    /// Where the child changes directory to, if anywhere.
    pub cwd: Option<&'a CStr>,
    /// What become its stdin, stdout and stderr (`None`: left as inherited).
    pub stdio: [Option<RawFd>; 3],
    /// Resource limits to lower, as `(resource, value)`: never above the hard limit.
    pub rlimits: &'a [(c_int, u64)],
    /// Starts its own process group, dies with us (`PR_SET_PDEATHSIG`) and gives up if we
    /// are already gone.
    pub own_group_dying_with_parent: bool,
    /// Resets every signal handler to its default (needed when the parent has any).
    pub reset_handlers: bool,
    /// Marks every fd from this one up close-on-exec.
    pub close_on_exec_from: Option<RawFd>,
}

/// Which step of an [`ExecPlan`] failed in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStep {
    Group,
    Stdio,
    Cwd,
    /// The limit at this index of [`ExecPlan::rlimits`].
    Limit(usize),
    CloseOnExec,
    Exec,
}

/// What the child reads, and the step and errno it leaves when it cannot exec.
#[repr(C)]
struct ExecArgs {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    stdio: [c_int; 3],
    rlimits: *const (c_int, u64),
    rlimit_count: usize,
    /// 0 unless the child starts its own group and dies with this pid.
    parent: libc::pid_t,
    reset_handlers: bool,
    close_on_exec_from: c_int,
    error: c_int,
    /// The failed step, as `exec_steps` returns it.
    step: isize,
}

// The steps as `exec_steps` reports them: a limit by its index, the others below zero.
const STEP_GROUP: isize = -1;
const STEP_STDIO: isize = -2;
const STEP_CWD: isize = -3;
const STEP_CLOSE_ON_EXEC: isize = -4;
const STEP_EXEC: isize = -5;

fn step_from_code(code: isize) -> ExecStep {
    match code {
        STEP_GROUP => ExecStep::Group,
        STEP_STDIO => ExecStep::Stdio,
        STEP_CWD => ExecStep::Cwd,
        STEP_CLOSE_ON_EXEC => ExecStep::CloseOnExec,
        STEP_EXEC => ExecStep::Exec,
        limit => ExecStep::Limit(limit as usize),
    }
}

/// The child's side: runs on its own stack in our memory, with every signal blocked,
/// until it execs. A failure is recorded in `error` and `step` and ends the child.
extern "C" fn exec_child(arg: *mut std::ffi::c_void) -> c_int {
    // SAFETY: `arg` is the `ExecArgs` the parent passed to clone, alive until we exec or
    // exit (the parent is suspended until then: CLONE_VFORK).
    unsafe {
        let args = &mut *arg.cast::<ExecArgs>();
        let step = exec_steps(args);
        std::ptr::write_volatile(&mut args.error, *libc::__errno_location());
        std::ptr::write_volatile(&mut args.step, step);
        libc::_exit(127)
    }
}

/// The steps of an [`ExecPlan`], ending in its exec; returns only when one fails, with
/// the step's code (see `step_from_code`) and errno set. Only raw system calls: no
/// allocation, no locks, no unwinding, so it may run in a child sharing our memory.
///
/// # Safety
/// The pointers in `args` are valid: made by `exec_args` from an `ExecPlan` still alive.
unsafe fn exec_steps(args: &mut ExecArgs) -> isize {
    // SAFETY: every call below is a system call on values the caller keeps alive.
    unsafe {
        if args.reset_handlers {
            // Handlers are the kernel's (our copy of the table: no CLONE_SIGHAND); the
            // program starts with every signal at its default.
            let default = [0u64; 4]; // struct kernel_sigaction with SIG_DFL, no flags, no mask
            for signal in 1..=64 {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    libc::syscall(libc::SYS_rt_sigaction, signal, default.as_ptr(), 0usize, 8usize);
                }
            }
        }
        if args.parent != 0 {
            if libc::setpgid(0, 0) < 0 {
                return STEP_GROUP;
            }
            // Die with the parent. It might already be gone (killed while we were being
            // cloned): then our parent is no longer the pid that cloned us.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return STEP_GROUP;
            }
            if libc::getppid() != args.parent {
                *libc::__errno_location() = libc::ESRCH;
                return STEP_GROUP;
            }
        }
        // Move any of our fds sitting at 0..=2 out of the way first (even one already in
        // place: it may be close-on-exec, which dup2 clears), then place them.
        for i in 0..3 {
            if (0..=2).contains(&args.stdio[i]) {
                let moved = libc::fcntl(args.stdio[i], libc::F_DUPFD_CLOEXEC, 3);
                if moved < 0 {
                    return STEP_STDIO;
                }
                args.stdio[i] = moved;
            }
        }
        for target in 0..3 {
            let from = args.stdio[target];
            if from >= 0 && libc::dup2(from, target as c_int) < 0 {
                return STEP_STDIO;
            }
        }
        if !args.cwd.is_null() && libc::chdir(args.cwd) < 0 {
            return STEP_CWD;
        }
        for index in 0..args.rlimit_count {
            let (resource, value) = *args.rlimits.add(index);
            let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(resource as _, &mut current) < 0 {
                return index as isize;
            }
            let value = value.min(current.rlim_max);
            let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
            if libc::setrlimit(resource as _, &limit) < 0 {
                return index as isize;
            }
        }
        if args.close_on_exec_from >= 0
            && libc::syscall(
                libc::SYS_close_range,
                args.close_on_exec_from as c_uint,
                c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) < 0
        {
            return STEP_CLOSE_ON_EXEC;
        }
        // The program starts with no signal blocked.
        let empty = 0u64;
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &empty as *const u64, 0usize, 8usize);
        libc::execve(args.program, args.argv, args.envp);
        STEP_EXEC
    }
}

/// The raw form of `plan`, borrowing its strings.
fn exec_args(plan: &ExecPlan<'_>) -> ExecArgs {
    debug_assert!(
        plan.argv.last().is_some_and(|p| p.is_null()) && plan.envp.last().is_some_and(|p| p.is_null())
    );
    ExecArgs {
        program: plan.program.as_ptr(),
        argv: plan.argv.as_ptr(),
        envp: plan.envp.as_ptr(),
        cwd: plan.cwd.map_or(std::ptr::null(), CStr::as_ptr),
        stdio: plan.stdio.map(|fd| fd.unwrap_or(-1)),
        rlimits: plan.rlimits.as_ptr(),
        rlimit_count: plan.rlimits.len(),
        // SAFETY: getpid has no preconditions.
        parent: if plan.own_group_dying_with_parent { unsafe { libc::getpid() } } else { 0 },
        reset_handlers: plan.reset_handlers,
        close_on_exec_from: plan.close_on_exec_from.unwrap_or(-1),
        error: 0,
        step: 0,
    }
}

/// Carries out `plan` in this process, ending in its exec; returns only when a step
/// failed. For a process forked already (a pooled sandbox's agent, which waited for its
/// job).
pub fn exec_in_place(plan: &ExecPlan<'_>) -> (ExecStep, io::Error) {
    let mut args = exec_args(plan);
    // SAFETY: `args` borrows from `plan`, alive for the whole call.
    let step = unsafe { exec_steps(&mut args) };
    (step_from_code(step), io::Error::last_os_error())
}

/// Starts `plan` as a child without copying this process's memory: the child shares it
/// (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does) until it execs, and we resume once
/// it has. A `fork` would copy our page tables (and every later write of ours would
/// fault), only for the child to tear the copy down at exec.
///
/// Returns the child's pid and, with `pidfd`, a pidfd for it. When the child cannot
/// exec, the error names the step; the child has then exited (127) and is reaped.
pub fn vfork_exec(plan: &ExecPlan<'_>, pidfd: bool) -> Result<(i32, Option<OwnedFd>), (ExecStep, io::Error)> {
    let mut args = exec_args(plan);
    // The child's stack: it only makes system calls. Not zeroed: nothing reads what it
    // has not written, and zeroing faulted in all 64 KiB for every agent.
    const STACK: usize = 64 * 1024;
    let mut stack = Vec::<u8>::with_capacity(STACK);
    // SAFETY: one past the end of the allocation, aligned down to 16 as the ABI wants.
    let top = unsafe { stack.as_mut_ptr().add(STACK) };
    let top = (top as usize & !15) as *mut std::ffi::c_void;
    let mut pidfd_raw: c_int = -1;
    // No handler of ours may run in the child while it shares our memory.
    let old = block_all_signals();
    let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    if pidfd {
        flags |= libc::CLONE_PIDFD;
    }
    // SAFETY: `exec_child` only makes system calls on `args`, which outlives the call
    // (with CLONE_VFORK we resume only after the child has exec'd or exited); `top` is
    // the top of a stack of STACK bytes that also outlives it; with CLONE_PIDFD the
    // kernel writes the pidfd to `pidfd_raw` (the parent_tid argument).
    let pid = unsafe { libc::clone(exec_child, top, flags, (&raw mut args).cast(), &raw mut pidfd_raw) };
    let clone_error = io::Error::last_os_error();
    set_signal_mask(&old);
    drop(stack);
    if pid < 0 {
        return Err((ExecStep::Exec, clone_error));
    }
    // SAFETY: the kernel gave us this fd (CLONE_PIDFD); nobody else owns it.
    let pidfd = pidfd.then(|| unsafe { OwnedFd::from_raw_fd(pidfd_raw) });
    // SAFETY: the child wrote `error` and `step` (if at all) before it exited; we run
    // after.
    let (error, step) =
        unsafe { (std::ptr::read_volatile(&args.error), std::ptr::read_volatile(&args.step)) };
    if error != 0 {
        reap(pid); // It has exited.
        return Err((step_from_code(step), io::Error::from_raw_os_error(error)));
    }
    Ok((pid, pidfd))
}

/// Starts `exec` as a child in its own process group that the kernel kills when this
/// process ends (`PR_SET_PDEATHSIG`), with [`vfork_exec`]: a `fork` would copy the page
/// tables of the whole kernel, which cost milliseconds per agent.
///
/// Returns the child's pid and a pidfd for it. The exec's failure (ENOENT, EACCES...)
/// is the error, the child then already reaped.
pub fn spawn_dying_with_parent(exec: &Exec) -> io::Result<(i32, OwnedFd)> {
    let pointers = |strings: &[CString]| -> Vec<*const c_char> {
        strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
    };
    let argv = pointers(&exec.argv);
    let envp = pointers(&exec.envp);
    let plan = ExecPlan {
        program: &exec.program,
        argv: &argv,
        envp: &envp,
        cwd: Some(&exec.cwd),
        stdio: exec.stdio.each_ref().map(|fd| Some(fd.as_raw_fd())),
        rlimits: &[],
        own_group_dying_with_parent: true,
        reset_handlers: true,
        close_on_exec_from: None,
    };
    let (pid, pidfd) = vfork_exec(&plan, true).map_err(|(_, error)| error)?;
    Ok((pid, pidfd.expect("asked for a pidfd")))
}

/// waitpid(pid): waits until our child `pid` has ended, and reaps it.
pub fn reap(pid: i32) {
    let mut status: c_int = 0;
    // SAFETY: `status` is a valid out-pointer.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
}

/// waitpid(pid, WNOHANG): the raw wait status of our child `pid` once it has ended.
pub fn try_reap(pid: i32) -> io::Result<Option<c_int>> {
    let mut status: c_int = 0;
    // SAFETY: `status` is a valid out-pointer.
    let ret = check_int(unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) })?;
    Ok((ret == pid).then_some(status))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    /// The binary's allocator gives its pages back with glibc's: the `keel` binary's
    /// jemalloc keeps freed pages per arena for seconds otherwise, and parked runs cost
    /// twice the memory.
    #[test]
    fn releasing_the_heap_runs_the_binarys_own_release_too() {
        super::set_heap_release(|| {
            RELEASED.fetch_add(1, Ordering::SeqCst);
        });
        super::release_free_heap();
        super::release_free_heap();
        assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
    }
}
