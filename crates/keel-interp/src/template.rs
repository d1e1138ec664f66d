//! The template: the one process the pool starts from the worker program. It warms both
//! interpreters up once, then forks a worker for each request on its control socket, so
//! a worker starts as a copy of a warmed process instead of as a new program: no dynamic
//! loader relocating a large binary, no interpreter's first-use set-up (about 3.8 ms of
//! CPU a worker when each was exec'd). The worker copies the writable pages it shares
//! with the template in one call per mapping before its job (`worker::run`).
//!
//! The template never runs a job's program and holds nothing a job may not see: the
//! worker program starts with an environment of the pool's pid alone. Each worker
//! confines itself in the child, after the fork and before it says it is ready
//! ([`crate::worker::run`]), so a job reaches neither the template nor another worker.
//!
//! The control socket is a `SOCK_SEQPACKET` pair whose template end is the template's
//! standard input:
//! - template → pool, once warmed: [`READY`];
//! - pool → template: [`SPAWN`];
//! - template → pool: [`WORKER`] with the worker's descriptors attached in [`WorkerFds`]
//!   order, or [`FAILED`] and a message.
//!
//! The template reaps its workers and writes each one's raw wait status (4 bytes,
//! native-endian) to that worker's status pipe, whose read end the pool holds. Workers
//! die with the template (`PR_SET_PDEATHSIG`), and the template with the pool.

use std::{
    io::Write,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use keel_sandbox::unix;

use crate::sys;

/// The template is warmed and serves requests.
pub(crate) const READY: u8 = b'R';
/// Fork a worker.
pub(crate) const SPAWN: u8 = b'S';
/// A worker was forked: its descriptors are attached.
pub(crate) const WORKER: u8 = b'W';
/// No worker: a message follows.
pub(crate) const FAILED: u8 = b'E';

/// The pool's ends of one worker, in the order the template attaches them.
pub(crate) struct WorkerFds {
    /// The worker's stdin and stdout (a stream socket).
    pub io: OwnedFd,
    /// The read end of the worker's stderr.
    pub stderr: OwnedFd,
    /// The read end of the pipe the template writes the worker's wait status to.
    pub status: OwnedFd,
    /// A pidfd of the worker, to kill it.
    pub pidfd: OwnedFd,
}

impl WorkerFds {
    pub(crate) fn from_received(fds: Vec<OwnedFd>) -> Option<WorkerFds> {
        let [io, stderr, status, pidfd]: [OwnedFd; 4] = fds.try_into().ok()?;
        Some(WorkerFds { io, stderr, status, pidfd })
    }
}

/// A worker the template forked and has not reaped yet.
struct Child {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The write end of the pipe its wait status goes to.
    status: std::fs::File,
}

/// The body of the template process. Its parent check is done (`worker::worker_main`).
pub(crate) fn serve() -> ! {
    let control = sys::take_stdin();
    crate::worker::warm_up();
    if unix::send_with_fds(control.as_fd(), &[READY], &[]).is_err() {
        std::process::exit(0);
    }
    let template = std::process::id();
    let mut children: Vec<Child> = Vec::new();
    loop {
        let mut watched = vec![control.as_fd()];
        watched.extend(children.iter().map(|child| child.pidfd.as_fd()));
        let ready = match sys::wait_readable(&watched) {
            Ok(ready) => ready,
            Err(error) => fail(&format!("poll: {error}")),
        };
        drop(watched);
        let mut exited = ready[1..].iter();
        children.retain(|child| !(exited.next() == Some(&true) && reaped(child)));
        if !ready[0] {
            continue;
        }
        let mut request = [0u8; 16];
        match unix::receive_with_fds(control.as_fd(), &mut request) {
            // The pool is gone; the workers die with this process.
            Ok((0, _)) => std::process::exit(0),
            Ok((_, _)) if request[0] == SPAWN => {
                let reply = match fork_worker(template) {
                    Ok((child, fds)) => {
                        children.push(child);
                        // Ours are closed once sent: the template keeps none of the pool's ends.
                        let fds = [fds.io, fds.stderr, fds.status, fds.pidfd];
                        let raw = fds.each_ref().map(|fd| fd.as_raw_fd());
                        unix::send_with_fds(control.as_fd(), &[WORKER], &raw)
                    }
                    Err(error) => {
                        let message = format!("forking a worker: {error}");
                        unix::send_with_fds(control.as_fd(), &[&[FAILED], message.as_bytes()].concat(), &[])
                    }
                };
                if reply.is_err() {
                    std::process::exit(0);
                }
            }
            Ok((_, _)) => fail(&format!("unknown request {:?}", request[0])),
            Err(error) => fail(&format!("reading the pool's request: {error}")),
        }
    }
}

/// Reaps `child` if it exited, passing its wait status on; whether it is gone.
fn reaped(child: &Child) -> bool {
    match unix::try_reap(child.pid) {
        Ok(Some(status)) => {
            // The pool may have stopped listening (a worker it dropped): nothing to do then.
            let _ = (&child.status).write_all(&status.to_ne_bytes());
            true
        }
        Ok(None) => false,
        // Not our child any more: nothing to wait for.
        Err(_) => true,
    }
}

/// Forks one worker: the child confines itself and waits for its job; the parent keeps
/// the worker's pidfd and status pipe and returns the pool's ends.
fn fork_worker(template: u32) -> std::io::Result<(Child, WorkerFds)> {
    let (pool_io, worker_io) = sys::socket_pair(libc::SOCK_STREAM)?;
    let (stderr_read, stderr_write) = unix::pipe()?;
    let (status_read, status_write) = unix::pipe()?;
    // The worker's address space at its start is the template's now.
    let base_address_space = sys::address_space_bytes();
    match unix::fork()? {
        unix::Forked::Child => crate::worker::run(template, worker_io, stderr_write, base_address_space),
        unix::Forked::Parent(pid) => {
            drop((worker_io, stderr_write));
            // A worker the pool cannot be told about must not live on.
            let pidfds = sys::pidfd_open(pid).and_then(|pidfd| Ok((pidfd.try_clone()?, pidfd)));
            let (pool_pidfd, pidfd) = pidfds.inspect_err(|_| {
                unix::kill(pid, libc::SIGKILL);
                unix::reap(pid);
            })?;
            let child = Child { pid, pidfd, status: std::fs::File::from(status_write) };
            Ok((
                child,
                WorkerFds { io: pool_io, stderr: stderr_read, status: status_read, pidfd: pool_pidfd },
            ))
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("keel interpreter template: {message}");
    std::process::exit(3)
}
