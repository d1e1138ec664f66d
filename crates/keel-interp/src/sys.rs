//! The crate's raw system calls, for the template, its workers and the pool: every
//! `unsafe` of `keel-interp` outside the QuickJS binding lives here. Forking, reaping,
//! pipes and descriptor passing are `keel-sandbox`'s (`keel_sandbox::unix`).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use keel_sandbox::unix;

/// Sets a resource limit's soft and hard values.
pub fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> Result<(), String> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let result = unsafe { libc::setrlimit(resource, &limit) };
    if result == 0 {
        Ok(())
    } else {
        Err(format!("setrlimit({resource}, {value}): {}", io::Error::last_os_error()))
    }
}

/// `PR_SET_PDEATHSIG(SIGKILL)`: the process is killed when the thread that started it
/// exits. With `parent`, fails if the parent is no longer that process (it died before
/// the signal was set, so the signal would never come).
pub fn die_with_parent(parent: Option<u32>) -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    let result = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if result != 0 {
        return Err(format!("PR_SET_PDEATHSIG: {}", io::Error::last_os_error()));
    }
    // SAFETY: getppid has no preconditions and cannot fail.
    let actual = unsafe { libc::getppid() };
    match parent {
        Some(parent) if i64::from(actual) != i64::from(parent) => {
            Err(format!("the process that started this one (pid {parent}) is gone"))
        }
        _ => Ok(()),
    }
}

/// `PR_SET_NO_NEW_PRIVS`: nothing this process execs can gain privileges.
pub fn no_new_privs() -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    let result = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if result == 0 { Ok(()) } else { Err(format!("PR_SET_NO_NEW_PRIVS: {}", io::Error::last_os_error())) }
}

/// The process's current virtual address space size, from `/proc/self/statm`; a
/// conservative 256 MiB if it cannot be read.
pub fn address_space_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|pages| pages.parse::<u64>().ok()));
    pages.map_or(256 << 20, |pages| pages.saturating_mul(page_size() as u64))
}

/// The system's page size; 4 KiB if it cannot be read.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&size| size > 0)
        .unwrap_or(4096)
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(result) }
}

/// A connected pair of Unix sockets of `kind` (`SOCK_STREAM`, `SOCK_SEQPACKET`), both
/// close-on-exec.
pub fn socket_pair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two fds socketpair writes.
    check(unsafe { libc::socketpair(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Takes the control socket the pool handed the template as its standard input.
pub fn take_stdin() -> OwnedFd {
    // SAFETY: fd 0 is open (the pool's socket) and nothing else in this process owns it:
    // the template never reads it through `std::io::stdin`.
    unsafe { OwnedFd::from_raw_fd(0) }
}

/// pidfd_open(2): a descriptor that names `pid` for good; it turns readable when the
/// process exits.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// SIGKILLs the process `pidfd` names. A process that already exited is not an error.
pub fn pidfd_kill(pidfd: BorrowedFd<'_>) {
    // SAFETY: plain syscall on a pidfd we hold, with no info struct.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// Whether the process `pidfd` names has exited (its pidfd is readable).
pub fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, timeout 0.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents != 0
}

/// Waits until one of `fds` is readable (or hung up); which ones are. EINTR retried.
pub fn wait_readable(fds: &[BorrowedFd<'_>]) -> io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> =
        fds.iter().map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    loop {
        // SAFETY: `polls` is a live array of `polls.len()` pollfds.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if ready >= 0 {
            return Ok(polls.iter().map(|poll| poll.revents != 0).collect());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Makes `io` the standard input and output and `stderr` the standard error of this
/// process, and closes every other descriptor (the template's, inherited by fork).
pub fn become_stdio(io: OwnedFd, stderr: OwnedFd) -> io::Result<()> {
    for (from, to) in [(&io, 0), (&io, 1), (&stderr, 2)] {
        unix::dup2(from.as_raw_fd(), to)?;
    }
    // The originals go with the rest: nothing in the worker holds a descriptor above 2
    // (the template's socket, pidfds and pipes are its own, and the worker never touches
    // them).
    std::mem::forget((io, stderr));
    unix::close_from_except(3, &[]);
    Ok(())
}

/// Makes `fd` non-blocking and registers it with the tokio reactor.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: plain fd flag manipulation.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    // SAFETY: an OwnedFd keeps its fd open and unchanged until it is dropped, which
    // happens only with the AsyncFd.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|error| io::Error::other(error.to_string()))
}

/// Copies now, a run of pages per call, every page of this process's private writable
/// mappings that it shares copy-on-write with the process it was forked from (the
/// heap, the data segments), so that the job does not take those faults one by one.
/// Only pages the parent had touched (resident, by `mincore`): an allocator reserves
/// writable memory it has not used yet, and populating that would give each waiting
/// worker megabytes of zeroed pages of its own (jemalloc's extents: 6.5 MB of PSS a worker
/// against 1.7). Mappings larger than `cap` bytes and the stack are left alone. Best effort.
pub fn populate_writable(cap: u64) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    let page = page_size();
    let mut resident = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        if !perms.starts_with("rw") || !perms.ends_with('p') || line.ends_with("[stack]") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else {
            continue;
        };
        if end <= start || end - start > cap {
            continue;
        }
        let (start, len) = (start as usize, (end - start) as usize);
        resident.clear();
        resident.resize(len.div_ceil(page), 0u8);
        // SAFETY: the range is one of this process's own mappings, page-aligned, and
        // `resident` has a byte for each of its pages.
        if unsafe { libc::mincore(start as *mut libc::c_void, len, resident.as_mut_ptr()) } != 0 {
            continue;
        }
        // Each run of pages alike in bit 0 (resident or not), the resident ones populated.
        let mut first = 0;
        for run in resident.chunk_by(|a, b| a & 1 == b & 1) {
            if run[0] & 1 == 1 {
                // SAFETY: a run of pages inside that mapping; MADV_POPULATE_WRITE only
                // faults them in, writable, without changing their contents.
                unsafe {
                    libc::madvise(
                        (start + first * page) as *mut libc::c_void,
                        run.len() * page,
                        libc::MADV_POPULATE_WRITE,
                    )
                };
            }
            first += run.len();
        }
    }
}
