//! Messages between the kernel's side of the process tier, the zygote and the sandbox's
//! init. They never leave the machine and both ends are the same binary, but they are
//! still plain JSON so that a mismatch fails loudly instead of corrupting memory.
//!
//! - kernel → zygote (a SOCK_SEQPACKET message, with fds): [`SpawnRequest`]; the zygote
//!   answers [`SpawnReply`].
//! - kernel → init, for a pooled sandbox (its control pipe, then EOF): [`Job`].
//! - init → kernel (its status pipe, one line each): [`Status`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::MountPlan;

/// The fds passed with a [`SpawnRequest`], in this order.
pub const SPAWN_FDS: usize = 5;

/// Build this sandbox. The fds that come with it: the agent's stdout and stderr (write
/// ends), the status pipe (write end), the control pipe (read end), the agent's stdin
/// pipe (read end; used when the job has [`Job::stdin`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub plan: MountPlan,
    /// The working directory inside (same path as on the host).
    pub cwd: PathBuf,
    /// The agent's uid and gid, mapped to the same ids outside.
    pub uid: u32,
    pub gid: u32,
    /// `cgroup.procs` files the zygote writes the sandbox's pid to before it starts.
    pub cgroup_procs: Vec<PathBuf>,
    /// `tasks` files (cgroup v1) the sandbox's init writes `0` to, joining the group
    /// itself before anything else (see `RunCgroup::join_files`).
    pub cgroup_tasks: Vec<PathBuf>,
    /// Loopback TCP port → socket path inside (see `plan::inside::bridge_socket`).
    pub bridges: Vec<(u16, PathBuf)>,
    /// Allow IPv4/IPv6 stream sockets (to reach bridges); see `seccomp`.
    pub allow_inet: bool,
    /// Landlock ABI the kernel offers (the ruleset uses what it can, at least ABI 1).
    pub landlock_abi: i32,
    /// What to run now; `None` for a pooled sandbox, which waits for its job.
    pub job: Option<Job>,
}

/// What the agent process is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Job {
    /// Absolute path of the program (same inside and out).
    pub program: PathBuf,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub rlimits: Vec<Rlimit>,
    /// Whether the agent's stdin is the stdin pipe (which the kernel fills and closes)
    /// rather than `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
}

/// One resource limit (soft = hard).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rlimit {
    pub resource: Resource,
    pub value: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Cpu,
    OpenFiles,
    FileSize,
    CoreSize,
}

impl Resource {
    pub fn raw(self) -> i32 {
        (match self {
            Resource::Cpu => libc::RLIMIT_CPU,
            Resource::OpenFiles => libc::RLIMIT_NOFILE,
            Resource::FileSize => libc::RLIMIT_FSIZE,
            Resource::CoreSize => libc::RLIMIT_CORE,
        }) as i32
    }
}

/// The zygote's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnReply {
    /// The sandbox's init runs with this pid (in the kernel's pid namespace).
    Spawned {
        pid: i32,
    },
    Failed {
        error: String,
    },
}

/// What the init reports on its status pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// A pooled sandbox is built and waits for its job.
    Ready,
    /// The agent's program was exec'd.
    Started,
    /// Setup or exec failed; the sandbox is gone.
    Error(String),
    /// The agent ended with this raw wait status; the sandbox is being torn down.
    Exit(i32),
}

impl Status {
    pub fn to_line(&self) -> String {
        match self {
            Status::Ready => "ready\n".into(),
            Status::Started => "started\n".into(),
            // One line: a message never contains a newline.
            Status::Error(message) => format!("error {}\n", message.replace('\n', " ")),
            Status::Exit(raw) => format!("exit {raw}\n"),
        }
    }

    pub fn parse(line: &str) -> Option<Status> {
        let line = line.trim_end_matches('\n');
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "ready" => Some(Status::Ready),
            "started" => Some(Status::Started),
            "error" => Some(Status::Error(rest.to_owned())),
            "exit" => rest.parse().ok().map(Status::Exit),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_round_trip() {
        for status in
            [Status::Ready, Status::Started, Status::Error("mount /x: denied".into()), Status::Exit(9)]
        {
            assert_eq!(Status::parse(&status.to_line()), Some(status));
        }
        assert_eq!(Status::parse("error two\nlines"), Some(Status::Error("two\nlines".into())));
        assert_eq!(Status::parse("bogus"), None);
        assert_eq!(Status::Error("a\nb".into()).to_line(), "error a b\n");
    }

    #[test]
    fn a_job_without_stdin_reads_as_closed_stdin() {
        let job: Job =
            serde_json::from_str(r#"{"program": "/bin/true", "argv": ["true"], "env": [], "rlimits": []}"#)
                .unwrap();
        assert!(!job.stdin);
    }
}
