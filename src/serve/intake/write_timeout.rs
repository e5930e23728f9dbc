//! A write deadline on every connection: a peer that stops reading is dropped.
//!
//! hyper stops polling a response body while the socket is full, so a deadline inside a
//! handler or its body cannot see a client that never reads once the handler has returned;
//! the socket can. [`WriteTimeout`] wraps the connection's stream: when a write cannot make
//! progress (the kernel's send buffer is full because the peer reads nothing) for
//! `timeout`, the write fails with `TimedOut` and hyper closes the connection, dropping the
//! rest of the response with it. Any progress, even one byte, starts the deadline again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `io` whose writes fail once they have waited `timeout` without progress.
pub struct WriteTimeout<T> {
    io: T,
    timeout: Duration,
    /// Armed while a write waits.
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl<T> WriteTimeout<T> {
    pub fn new(io: T, timeout: Duration) -> WriteTimeout<T> {
        WriteTimeout {
            io,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            armed: false,
        }
    }

    /// What a write that returned `poll` means: progress disarms the deadline, waiting
    /// arms it (once) and fails when it has passed.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(r) => {
                self.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !self.armed {
                    self.armed = true;
                    let deadline = Instant::now() + self.timeout;
                    self.sleep.as_mut().reset(deadline);
                }
                match self.sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer read nothing within the write timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

use std::future::Future as _;

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_nothing_fails_the_write_and_one_that_reads_does_not() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut w = WriteTimeout::new(ours, Duration::from_secs(10));
        let chunk = vec![b'x'; 4096];
        // The peer reads slowly but within the deadline: every write goes through.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0; 4096];
            let mut got = 0;
            while got < 3 * 4096 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                got += theirs.read(&mut buf).await.unwrap();
            }
            theirs
        });
        for _ in 0..3 {
            w.write_all(&chunk).await.unwrap();
        }
        let _theirs = reader.await.unwrap();
        // Now it stops reading: the write fails after the deadline, not before.
        let started = Instant::now();
        let err = w.write_all(&chunk).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }
}
