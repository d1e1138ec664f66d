//! A cap on an agent's output stream: past the limit the rest is read and discarded (so
//! the agent never blocks on a full pipe) and one line says so. An agent flooding stdout
//! costs the kernel a bounded amount of event log.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::Output;

/// Bytes of each stream kept per agent process tree.
pub const DEFAULT_LIMIT: u64 = 4 << 20;

struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
    /// The notice still to deliver (once, right after the limit).
    notice: Option<Vec<u8>>,
}

/// Wraps `inner` so at most `limit` bytes pass.
pub fn capped<R: AsyncRead + Send + Unpin + 'static>(inner: R, limit: u64) -> Output {
    Box::pin(Capped { inner, left: limit, limit, notice: None })
}

impl<R: AsyncRead + Unpin> AsyncRead for Capped<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(notice) = this.notice.take() {
            let n = notice.len().min(buf.remaining());
            buf.put_slice(&notice[..n]);
            return Poll::Ready(Ok(()));
        }
        if this.left > 0 {
            let mut scratch = [0u8; 8192];
            let allowed = (buf.remaining() as u64).min(this.left).min(scratch.len() as u64) as usize;
            let mut limited = ReadBuf::new(&mut scratch[..allowed]);
            let result = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
            let filled = limited.filled().len();
            buf.put_slice(limited.filled());
            if filled > 0 {
                this.left -= filled as u64;
                if this.left == 0 {
                    this.notice = Some(
                        format!(
                            "\n[keel: output limit of {} bytes reached; the rest is discarded]\n",
                            this.limit
                        )
                        .into_bytes(),
                    );
                }
            }
            return result;
        }
        // Over the limit: drain and drop until the stream ends.
        let mut scratch = [0u8; 8192];
        loop {
            let mut sink = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut sink) {
                Poll::Ready(Ok(())) if sink.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn passes_up_to_the_limit_then_says_so_and_drains() {
        let data = vec![b'x'; 100_000];
        let mut out = capped(std::io::Cursor::new(data), 1000);
        let mut seen = Vec::new();
        out.read_to_end(&mut seen).await.unwrap();
        let text = String::from_utf8(seen).unwrap();
        assert!(text.starts_with(&"x".repeat(1000)));
        assert!(
            text.ends_with("output limit of 1000 bytes reached; the rest is discarded]\n"),
            "{}",
            &text[1000..]
        );
        assert_eq!(
            text.len(),
            1000 + "\n[keel: output limit of 1000 bytes reached; the rest is discarded]\n".len()
        );
    }
}
