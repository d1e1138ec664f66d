//! Command tools: a program run in Keel's sandbox with the call as JSON on stdin
//! (`{"args", "idempotency_key", "run_id", "tool"}`) and its result as JSON on stdout.
//! Output is bounded, a failure carries the exit status and the end of stderr, and a call
//! that outlives its timeout has its whole process tree killed.

use std::path::PathBuf;
use std::time::Duration;

use keel_sandbox::{Bridge, KeelResources, LaunchSpec, Profile, Sandbox};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::CommandTool;

/// The most a command tool may print on stdout.
pub const MAX_STDOUT: usize = 1 << 20;
/// How much of the end of stderr an error carries.
const STDERR_TAIL: usize = 4 << 10;

/// Where and how a call runs: what its `LaunchSpec` needs besides the command.
#[derive(Debug, Clone, Default)]
pub struct CommandContext {
    /// The working directory (the run's workspace); a tool's relative `cwd` is taken
    /// from here.
    pub cwd: PathBuf,
    pub profile: Profile,
    pub keel: KeelResources,
    pub bridges: Vec<Bridge>,
    /// The marker of this call's processes (`KEEL_RUN_ID` in their environment). On a
    /// timeout every process carrying it is killed, so it must not be the agent's own:
    /// use one per call, e.g. `<run id>/tool/<seq>`.
    pub run_marker: String,
    /// The environment (the sandboxed tiers start from nothing else; give `PATH` for the
    /// `none` tier). The tool's own `env` is added over it, then `KEEL_RUN_ID` and, from
    /// the input, `KEEL_IDEMPOTENCY_KEY` unless already set.
    pub env: Vec<(String, String)>,
    /// The longest the call may take (zero: [`crate::DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
}

/// Kills the call's process tree unless disarmed: a call whose future is dropped (the
/// kernel cancelled it) leaves nothing running.
struct TreeGuard {
    pid: Option<u32>,
    marker: String,
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            keel_sandbox::tree::kill_tree(Some(pid), &self.marker);
        }
    }
}

/// Reads `stream` to its end keeping at most `limit` bytes; returns them and whether
/// there was more.
async fn read_bounded(
    stream: Option<keel_sandbox::Output>,
    limit: usize,
    keep_tail: bool,
) -> (Vec<u8>, bool) {
    let Some(mut stream) = stream else { return (Vec::new(), false) };
    let mut kept = Vec::new();
    let mut over = false;
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let n = match AsyncReadExt::read(&mut stream, &mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        kept.extend_from_slice(&buffer[..n]);
        if kept.len() > limit {
            over = true;
            if keep_tail {
                kept.drain(..kept.len() - limit);
            } else {
                kept.truncate(limit);
                // Stdout over the limit fails the call; stop reading now.
                break;
            }
        }
    }
    (kept, over)
}

/// Runs `tool` once with `input` on stdin and returns what it printed, parsed as JSON.
pub async fn run(
    sandbox: &dyn Sandbox,
    tool: &CommandTool,
    input: &Value,
    ctx: CommandContext,
) -> Result<Value, String> {
    let name = input
        .get("tool")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| tool.command.first().cloned())
        .unwrap_or_else(|| "command tool".to_owned());
    if tool.command.is_empty() {
        return Err(format!("{name}: the tool has no command"));
    }
    let mut env: Vec<(String, String)> = ctx.env.clone();
    let mut set = |key: &str, value: String, replace: bool| match env.iter_mut().find(|(k, _)| k == key) {
        Some(existing) if replace => existing.1 = value,
        Some(_) => {}
        None => env.push((key.to_owned(), value)),
    };
    for (key, value) in &tool.env {
        set(key, value.clone(), true);
    }
    set("KEEL_RUN_ID", ctx.run_marker.clone(), true);
    if let Some(key) = input.get("idempotency_key").and_then(Value::as_str) {
        set("KEEL_IDEMPOTENCY_KEY", key.to_owned(), false);
    }
    let cwd = match &tool.cwd {
        Some(dir) => ctx.cwd.join(dir),
        None => ctx.cwd.clone(),
    };
    let mut stdin =
        serde_json::to_vec(input).map_err(|e| format!("{name}: could not encode the input: {e}"))?;
    stdin.push(b'\n');
    let spec = LaunchSpec {
        command: tool.command.clone(),
        cwd,
        env,
        run_marker: ctx.run_marker.clone(),
        profile: ctx.profile,
        keel: ctx.keel,
        bridges: ctx.bridges,
        stdin: Some(stdin),
        // The operator wrote the command in keel.toml; the agent only sends its input.
        bind_argument_files: true,
    };
    let mut launched = sandbox.launch(spec).await.map_err(|e| format!("{name}: {e}"))?;
    let mut guard = TreeGuard { pid: Some(launched.pid), marker: ctx.run_marker.clone() };
    let stdout = launched.child.stdout.take();
    let stderr = launched.child.stderr.take();
    let timeout = if ctx.timeout.is_zero() { crate::DEFAULT_TIMEOUT } else { ctx.timeout };
    let secs = timeout.as_secs_f64();
    let work = async {
        let ((out, out_over), (err, _)) =
            tokio::join!(read_bounded(stdout, MAX_STDOUT, false), read_bounded(stderr, STDERR_TAIL, true));
        if out_over {
            return Err(format!(
                "{name}: printed more than {} MiB on stdout; a command tool prints one JSON value",
                MAX_STDOUT >> 20
            ));
        }
        let status =
            launched.child.wait().await.map_err(|e| format!("{name}: waiting for it failed: {e}"))?;
        Ok((out, err, status, launched.child.ended_by().map(str::to_owned)))
    };
    let outcome = tokio::time::timeout(timeout, work).await;
    let (out, err, status, ended_by) = match outcome {
        Err(_elapsed) => {
            drop(guard);
            return Err(format!("{name}: timed out after {secs} s; its processes were killed"));
        }
        // The guard kills what is left of an oversized call.
        Ok(Err(message)) => return Err(message),
        Ok(Ok(done)) => done,
    };
    // The tool's main process ended; anything it left behind goes too.
    keel_sandbox::tree::kill_tree(guard.pid.take(), &ctx.run_marker);
    let stderr_tail = String::from_utf8_lossy(&err).trim().to_owned();
    if !status.success() {
        let mut message = format!("{name}: exited with {status}");
        if let Some(reason) = ended_by {
            message.push_str(&format!(" ({reason})"));
        }
        if !stderr_tail.is_empty() {
            message.push_str(&format!("; stderr: {stderr_tail}"));
        }
        return Err(message);
    }
    let text = String::from_utf8_lossy(&out);
    let text = text.trim();
    if text.is_empty() {
        return Err(format!(
            "{name}: printed nothing; a command tool must print its result as JSON on stdout"
        ));
    }
    serde_json::from_str(text).map_err(|e| {
        let shown: String = text.chars().take(200).collect();
        format!("{name}: stdout is not JSON ({e}): {shown:?}; a command tool must print one JSON value")
    })
}
