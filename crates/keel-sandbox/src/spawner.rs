//! Agents of tier `none` start from a thread with a descriptor table of its own.
//!
//! A child cloned without `CLONE_FILES` starts with a copy of its parent's whole
//! descriptor table, and its `execve` then closes every close-on-exec descriptor of that
//! copy. A kernel holds a pidfd and two pipes for each live run, so starting the k-th
//! agent copied and closed about 3k descriptors: a fifth of the CPU samples while the
//! kernel recovered 1,000 runs (see BENCHMARKS.md). The spawner thread unshares its table
//! once (`unshare(CLONE_FILES)`) and keeps in it only stdio and its end of a socket pair.
//! The child's stdio comes to it over that socket (`SCM_RIGHTS`), the program and its
//! arguments through memory (the thread is in the same process), and the child's pidfd
//! goes back over the socket. So an agent starts with a copy of seven descriptors (stdio,
//! the socket, its own three), whatever the kernel holds, and nothing of the kernel's can
//! reach it even without close-on-exec.
//!
//! The thread lives as long as the process, which matters: `PR_SET_PDEATHSIG` fires when
//! the *thread* that made a child ends, so a spawner that ended would kill every agent it
//! started (an agent started from a pool thread that later exits would die with it too;
//! the spawner also removes that hazard). It blocks every signal: a handler (tokio's
//! among them) writes to descriptors of the process's table, whose numbers mean
//! something else, or nothing, in this one.
//!
//! If the thread cannot be made (`unshare` refused, say by a seccomp policy around the
//! kernel), agents start from the calling thread as before, after one warning.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock, PoisonError};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::sys::{self, Exec};

/// What the spawner takes through memory: an [`Exec`] but for its stdio.
struct Program {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
}

/// The process's end of the spawner's socket; `None` if the thread could not be made.
static SPAWNER: OnceLock<Option<Mutex<OwnedFd>>> = OnceLock::new();

/// The program of the request in flight: set just before the socket carries its stdio.
static NEXT: Mutex<Option<Program>> = Mutex::new(None);

/// [`sys::spawn_dying_with_parent`], from the spawner thread: the same child, pid and
/// pidfd, and the same errors. Consumes `exec` (this process's copies of the child's
/// stdio are closed once the spawner has its own).
pub(crate) async fn spawn(exec: Exec) -> io::Result<(i32, OwnedFd)> {
    let Some(spawner) = SPAWNER.get_or_init(start) else {
        // From this thread, not from the blocking pool's, which end when idle.
        return sys::spawn_dying_with_parent(&exec);
    };
    // The exchange waits while the child execs (hundreds of microseconds): not on a
    // thread of the async runtime, which has one per core.
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        if let Err(Ok((pid, _pidfd))) = answer.send(request(spawner, exec)) {
            // The launch was given up while its agent started: no agent runs untracked.
            sys::kill(-pid, libc::SIGKILL);
            sys::reap(pid);
        }
    });
    answered.await.map_err(|_| io::Error::other("the spawner thread's answer was lost"))?
}

fn request(socket: &Mutex<OwnedFd>, exec: Exec) -> io::Result<(i32, OwnedFd)> {
    // One request at a time: the spawner answers in order, and `NEXT` holds one program.
    let socket = lock(socket);
    let Exec { program, argv, envp, cwd, stdio } = exec;
    *lock(&NEXT) = Some(Program { program, argv, envp, cwd });
    let raw = stdio.each_ref().map(AsRawFd::as_raw_fd);
    if let Err(err) = sys::send_with_fds(socket.as_fd(), &[0], &raw) {
        lock(&NEXT).take();
        return Err(err);
    }
    drop(stdio);
    let mut reply = [0u8; 8];
    let (length, fds) = sys::receive_with_fds(socket.as_fd(), &mut reply)?;
    let pid = i32::from_ne_bytes(reply[..4].try_into().expect("4 bytes"));
    let errno = i32::from_ne_bytes(reply[4..].try_into().expect("4 bytes"));
    match (length, fds.into_iter().next()) {
        (8, Some(pidfd)) if errno == 0 => Ok((pid, pidfd)),
        (8, None) if errno != 0 => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::other("the spawner thread answered with a malformed reply")),
    }
}

/// Starts the spawner thread, or says why not and returns `None`.
fn start() -> Option<Mutex<OwnedFd>> {
    match try_start() {
        Ok(socket) => Some(Mutex::new(socket)),
        Err(err) => {
            tracing::warn!(
                "agents of tier `none` start from the kernel's own threads (slower with many runs live): \
                 the spawner thread could not be made: {err}"
            );
            None
        }
    }
}

fn try_start() -> io::Result<OwnedFd> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(io::Error::from)?;
    let theirs_raw = theirs.as_raw_fd();
    let (ready, unshared) = std::sync::mpsc::channel::<io::Result<()>>();
    std::thread::Builder::new().name("keel-spawner".into()).spawn(move || {
        sys::block_all_signals();
        if let Err(err) = sys::unshare(libc::CLONE_FILES) {
            // Still the process's table: `theirs` is closed there when dropped here.
            drop(theirs);
            let _ = ready.send(Err(err));
            return;
        }
        // Our copy of the process's table: keep stdio and our end of the socket.
        sys::close_from_except(3, &[theirs_raw]);
        let _ = ready.send(Ok(()));
        serve(&theirs)
    })?;
    unshared.recv().map_err(|_| io::Error::other("the spawner thread ended as it started"))??;
    // SAFETY: the process's copy of the spawner's end, which nothing in this table owns
    // (the `OwnedFd` went to the thread, whose table has its own copy now).
    drop(unsafe { sys::owned_fd(theirs_raw) });
    Ok(ours)
}

/// The spawner thread's loop. It never returns: its children would die with it.
fn serve(socket: &OwnedFd) -> ! {
    loop {
        let mut doorbell = [0u8; 1];
        let answer = match sys::receive_with_fds(socket.as_fd(), &mut doorbell) {
            // The process's end never closes while the process lives.
            Ok((0, fds)) if fds.is_empty() => loop {
                std::thread::park();
            },
            Ok((_, fds)) => match (lock(&NEXT).take(), <[OwnedFd; 3]>::try_from(fds)) {
                (Some(Program { program, argv, envp, cwd }), Ok(stdio)) => {
                    sys::spawn_dying_with_parent(&Exec { program, argv, envp, cwd, stdio })
                }
                _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
            },
            Err(err) => Err(err),
        };
        let (pid, errno, pidfd) = match answer {
            Ok((pid, pidfd)) => (pid, 0, Some(pidfd)),
            Err(err) => (0, err.raw_os_error().unwrap_or(libc::EIO), None),
        };
        let mut reply = [0u8; 8];
        reply[..4].copy_from_slice(&pid.to_ne_bytes());
        reply[4..].copy_from_slice(&errno.to_ne_bytes());
        let fds: Vec<RawFd> = pidfd.iter().map(AsRawFd::as_raw_fd).collect();
        // Only fails if the process's end is gone, which it never is.
        let _ = sys::send_with_fds(socket.as_fd(), &reply, &fds);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
