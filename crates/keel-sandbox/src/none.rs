//! The `none` tier: the agent runs as an ordinary child process with the caller's
//! privileges. It gives process-tree control and nothing else; only for development, and
//! only when asked for explicitly.

use std::process::Stdio;

use async_trait::async_trait;

use crate::{Error, LaunchSpec, Launched, Result, Sandbox};

#[derive(Debug, Default, Clone, Copy)]
pub struct NoSandbox;

#[async_trait]
impl Sandbox for NoSandbox {
    fn tier(&self) -> &'static str {
        "none"
    }

    async fn launch(&self, spec: LaunchSpec) -> Result<Launched> {
        let (program, args) = spec.command.split_first().ok_or(Error::EmptyCommand)?;
        if !spec.cwd.is_dir() {
            return Err(Error::BadWorkingDir(spec.cwd.clone()));
        }
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a stop reaches every process the agent forks.
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: the closure runs in the forked child before exec and only calls
        // prctl(2), which is async-signal-safe; it touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // Die with the kernel: if the kernel is killed, its agents go too, and
                // recovery restarts them from the journal instead of racing orphans.
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|source| Error::Spawn { program: program.clone(), source })?;
        let pid = child.id().ok_or_else(|| Error::Spawn {
            program: program.clone(),
            source: std::io::Error::other("the process exited before its pid could be read"),
        })?;
        Ok(Launched { child, pid })
    }
}
