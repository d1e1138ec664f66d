//! The `none` tier: the agent runs as an ordinary child process with the caller's
//! privileges. It gives process-tree control and nothing else; only for development, and
//! only when asked for explicitly.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::process::DEFAULT_PATH;
use crate::resolve::is_executable;
use crate::{Child, Error, LaunchSpec, Launched, Profile, Result, Sandbox, Waiter, sys};

#[derive(Debug, Default, Clone, Copy)]
pub struct NoSandbox;

#[async_trait]
impl Sandbox for NoSandbox {
    fn tier(&self) -> &'static str {
        "none"
    }

    fn shares_host(&self) -> bool {
        true
    }

    fn check(&self, profile: &Profile) -> Result<()> {
        if profile.is_default() {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "sandbox tier `none` enforces no limits or isolation, so it cannot honor {}; drop those options or use the process sandbox (`--sandbox process`)",
            profile.requested_limits().join(", ")
        )))
    }

    async fn launch(&self, spec: LaunchSpec) -> Result<Launched> {
        let (program, args) = spec.command.split_first().ok_or(Error::EmptyCommand)?;
        if !spec.cwd.is_dir() {
            return Err(Error::BadWorkingDir(spec.cwd.clone()));
        }
        let spawn_error = |source: std::io::Error| Error::Spawn { program: program.clone(), source };
        let path = find_program(program, &spec.env, &spec.cwd).map_err(spawn_error)?;
        let c_string = |s: &[u8]| {
            CString::new(s).map_err(|_| {
                spawn_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the command, its arguments and its environment may not contain NUL bytes",
                ))
            })
        };
        let pipe = || sys::pipe().map_err(spawn_error);
        let (stdin_child, stdin) = match spec.stdin {
            Some(_) => {
                let (read, write) = pipe()?;
                (read, Some(write))
            }
            None => (OwnedFd::from(std::fs::File::open("/dev/null").map_err(spawn_error)?), None),
        };
        let (stdout, stdout_child) = pipe()?;
        let (stderr, stderr_child) = pipe()?;
        let exec = sys::Exec {
            program: c_string(path.as_os_str().as_bytes())?,
            argv: std::iter::once(program)
                .chain(args)
                .map(|a| c_string(a.as_bytes()))
                .collect::<Result<_>>()?,
            envp: spec
                .env
                .iter()
                .map(|(k, v)| c_string(format!("{k}={v}").as_bytes()))
                .collect::<Result<_>>()?,
            cwd: c_string(spec.cwd.as_os_str().as_bytes())?,
            stdio: [stdin_child, stdout_child, stderr_child],
        };
        // Its own process group, so a stop reaches every process the agent forks; and it
        // dies with the kernel, so after a crash recovery restarts it from the journal
        // instead of racing an orphan. Started by the spawner thread, whose descriptor
        // table is a handful, not the kernel's (see `spawner`); our copies of the child's
        // ends of its pipes are closed then.
        let (pid, pidfd) = crate::spawner::spawn(exec).await.map_err(spawn_error)?;
        let waiter = Reaped::new(pid, pidfd).map_err(spawn_error)?;
        if let (Some(bytes), Some(input)) = (spec.stdin, stdin) {
            let mut input = pipe::Sender::from_owned_fd(input).map_err(spawn_error)?;
            tokio::spawn(async move {
                // A program that exits without reading all of it just ends the write.
                let _ = input.write_all(&bytes).await;
                drop(input);
            });
        }
        let output = |fd: OwnedFd| -> Result<crate::Output> {
            let receiver = pipe::Receiver::from_owned_fd(fd).map_err(spawn_error)?;
            Ok(crate::output::capped(receiver, crate::output::DEFAULT_LIMIT))
        };
        Ok(Launched {
            child: Child {
                stdout: Some(output(stdout)?),
                stderr: Some(output(stderr)?),
                waiter: Waiter::Reaped(waiter),
                ended_by: None,
            },
            pid: pid as u32,
            pooled: false,
        })
    }
}

/// Where `program` is: a path as given (relative ones against `cwd`, where the child
/// runs), or a bare name looked up in the `PATH` of the agent's environment, as `execvp`
/// would (an empty or relative entry is against `cwd` too).
fn find_program(program: &str, env: &[(String, String)], cwd: &Path) -> std::io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v);
    path.split(':')
        .map(|dir| cwd.join(if dir.is_empty() { "." } else { dir }).join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))
}

/// Follows an agent started by [`sys::spawn_dying_with_parent`] to its end through its
/// pidfd, and reaps it.
pub(crate) struct Reaped {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Reaped {
    fn new(pid: i32, pidfd: OwnedFd) -> std::io::Result<Reaped> {
        // SAFETY: an OwnedFd keeps its fd open and unchanged until it is dropped, which
        // happens only with the AsyncFd.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Reaped { pid, pidfd, status: None })
    }

    /// Waits until the agent has exited (a pidfd turns readable then) and reaps it.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            if let Some(raw) = sys::try_reap(self.pid)? {
                self.status = Some(ExitStatus::from_raw(raw));
                continue;
            }
            self.pidfd.readable().await?.clear_ready();
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(sys::try_reap(self.pid), Ok(Some(_))) {
            return;
        }
        // Still running: reap it when it ends, so it does not stay a zombie.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let pid = self.pid;
        let Ok(pidfd) = self.pidfd.get_ref().try_clone() else { return };
        runtime.spawn(async move {
            if let Ok(mut waiter) = Reaped::new(pid, pidfd) {
                let _ = waiter.wait().await;
            }
        });
    }
}
