//! The `none` tier: the agent runs as an ordinary child process with the caller's
//! privileges. It gives process-tree control and nothing else; only for development, and
//! only when asked for explicitly.

use std::process::Stdio;

use async_trait::async_trait;

use crate::{Child, Error, LaunchSpec, Launched, Profile, Result, Sandbox, Waiter};

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
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
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
        let mut child =
            command.spawn().map_err(|source| Error::Spawn { program: program.clone(), source })?;
        let pid = child.id().ok_or_else(|| Error::Spawn {
            program: program.clone(),
            source: std::io::Error::other("the process exited before its pid could be read"),
        })?;
        if let (Some(bytes), Some(mut input)) = (spec.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                // A program that exits without reading all of it just ends the write.
                let _ = input.write_all(&bytes).await;
                drop(input);
            });
        }
        let stdout = child.stdout.take().map(|out| crate::output::capped(out, crate::output::DEFAULT_LIMIT));
        let stderr = child.stderr.take().map(|err| crate::output::capped(err, crate::output::DEFAULT_LIMIT));
        Ok(Launched {
            child: Child { stdout, stderr, waiter: Waiter::Plain(child), ended_by: None },
            pid,
            pooled: false,
        })
    }
}
