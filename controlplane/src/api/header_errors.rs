//! hyper answers a request head it cannot take (too many or too large
//! headers) with its own bare `431` before any handler runs, and has no hook
//! to change it. Every answer of the JoinService must carry a protobuf
//! `Error`, so this stream wrapper replaces that reply, which hyper writes
//! as one buffer right before it closes the connection, with one that has
//! the body.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::plane::api_error::ApiError;

const HYPER_431: &[u8] = b"HTTP/1.1 431 ";

/// The reply that replaces hyper's bare 431.
pub(crate) fn reply_431() -> Vec<u8> {
    let body =
        ApiError::InvalidInput("the request has too many headers, or headers too large".to_owned())
            .to_wire()
            .encode_to_vec();
    let mut out = format!(
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: {}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        bc_wire::endpoints::CONTENT_TYPE,
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// A connection's stream, with hyper's bare 431 replaced.
pub(crate) struct WithErrorBodies<S> {
    inner: S,
    /// A replacement still being written, and how much of it is.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> WithErrorBodies<S> {
    pub(crate) fn new(inner: S) -> Self {
        WithErrorBodies {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> WithErrorBodies<S> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((buf, done)) = &mut self.pending {
            if *done >= buf.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &buf[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WithErrorBodies<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WithErrorBodies<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if buf.starts_with(HYPER_431) {
            // hyper's reply is all in `buf`: take it, send ours instead.
            this.pending = Some((reply_431(), 0));
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
