//! Process-tree control for a run: signal its process group, and find stragglers that left
//! the group (setsid, double fork) by the `KEEL_RUN_ID` marker in their environment.

use std::collections::HashMap;
use std::fs;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Sends `signal` to the process group `pgid`. A group that no longer exists is fine.
pub fn signal_group(pgid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    if raw <= 1 {
        return; // Never signal "every process" or init by accident.
    }
    let _ = killpg(Pid::from_raw(raw), signal);
}

/// Every process whose environment contains `KEEL_RUN_ID=<marker>`. Reading another
/// process's environ needs the same user or root, which the kernel has for its agents.
pub fn processes_with_marker(marker: &str) -> Vec<u32> {
    let needle = format!("KEEL_RUN_ID={marker}");
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let own = std::process::id();
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .map(|environ| environ.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Every process carrying a `KEEL_RUN_ID` marker, grouped by marker: one scan of /proc
/// for a whole batch of runs (recovery), instead of one scan per run.
pub fn processes_by_marker() -> HashMap<String, Vec<u32>> {
    let mut found: HashMap<String, Vec<u32>> = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else { return found };
    let own = std::process::id();
    for pid in entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
        if pid == own {
            continue;
        }
        let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else { continue };
        let marker = environ
            .split(|&b| b == 0)
            .find_map(|var| var.strip_prefix(b"KEEL_RUN_ID="))
            .and_then(|m| std::str::from_utf8(m).ok());
        if let Some(marker) = marker {
            found.entry(marker.to_owned()).or_default().push(pid);
        }
    }
    found
}

/// SIGKILLs the given processes (found earlier with [`processes_by_marker`]).
pub fn kill_pids(pids: &[u32]) {
    for &pid in pids {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
}

/// Sends `signal` to the run's group and to every straggler carrying its marker.
pub fn signal_tree(pgid: Option<u32>, marker: &str, signal: Signal) {
    if let Some(pgid) = pgid {
        signal_group(pgid, signal);
    }
    for pid in processes_with_marker(marker) {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(raw), signal);
        }
    }
}

/// SIGKILLs the whole tree, including stopped processes.
pub fn kill_tree(pgid: Option<u32>, marker: &str) {
    signal_tree(pgid, marker, Signal::SIGKILL);
}
