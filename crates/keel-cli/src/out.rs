//! Standard output that a closed pipe cannot turn into a panic: `keel ps --json | head -1`
//! closes the read end early, and the next write fails with `EPIPE`.
//!
//! Rust ignores `SIGPIPE`, so the failure arrives as an error, and `println!` panics on it.
//! We keep `SIGPIPE` ignored on purpose: this binary also embeds a kernel and runs the
//! daemon (`keel serve`, a foreground `keel run`), where a peer closing a socket must
//! stay an error on that connection and never kill the process. So every write to stdout
//! goes through here: a closed stdout becomes [`StdoutClosed`], which `main` turns into a
//! quiet exit, and any other failure (a full disk) an error that says it was stdout.

use std::fmt;
use std::io::{self, Write};

/// Stdout's reader went away (`EPIPE`). Not a failure of the command: `main` ends quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

fn classify(err: io::Error) -> anyhow::Error {
    if err.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(err).context("writing to standard output")
    }
}

/// Writes formatted text to stdout (see [`out!`](crate::out!)).
pub fn write(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    io::stdout().lock().write_fmt(args).map_err(classify)
}

/// Writes formatted text and a newline to stdout, flushed (see [`outln!`](crate::outln!)).
pub fn write_line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()).map_err(classify)
}

/// True if `err` is (or was caused by) a closed stdout, however it was wrapped.
pub fn is_stdout_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.is::<StdoutClosed>()
            || cause
                .downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}

/// Stdout as an [`io::Write`] for streaming copies (`keel audit export`): a closed pipe
/// is an `io::Error` carrying [`StdoutClosed`], so [`is_stdout_closed`] still sees it.
pub struct Stdout(io::StdoutLock<'static>);

impl Stdout {
    pub fn lock() -> Stdout {
        Stdout(io::stdout().lock())
    }
}

fn mark(err: io::Error) -> io::Error {
    if err.kind() == io::ErrorKind::BrokenPipe {
        io::Error::new(io::ErrorKind::BrokenPipe, StdoutClosed)
    } else {
        err
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(mark)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(mark)
    }
}

/// Like `print!`, but returns `anyhow::Result<()>` instead of panicking (use `?`).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}

/// Like `println!`, but returns `anyhow::Result<()>` instead of panicking (use `?`).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write_line(format_args!("")) };
    ($($arg:tt)*) => { $crate::out::write_line(format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_recognised_however_it_was_wrapped() {
        let direct = classify(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(is_stdout_closed(&direct));
        assert!(is_stdout_closed(&direct.context("printing the runs")));
        let streamed = anyhow::Error::new(mark(io::Error::from(io::ErrorKind::BrokenPipe)))
            .context("writing the audit export");
        assert!(is_stdout_closed(&streamed));
        // A broken pipe elsewhere (the kernel's socket) is a real error, not a quiet exit.
        let socket =
            anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe)).context("asking the kernel");
        assert!(!is_stdout_closed(&socket));
        let full = classify(io::Error::other("no space left on device"));
        assert!(!is_stdout_closed(&full));
        assert!(format!("{full:#}").contains("writing to standard output"), "{full:#}");
    }
}
