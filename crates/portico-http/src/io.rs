//! The client side of a connection: plain TCP or TLS over TCP, behind one type so the proxy is written once.
//! An enum rather than a generic: one branch per poll costs less than a second copy of the whole proxy in the
//! binary, and the TLS state is boxed so a plain connection's task stays small.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub(crate) enum ClientIo {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientIo {
    /// Waits until a read would make progress, without a buffer: an idle keep-alive connection holds none.
    pub async fn readable(&mut self) -> io::Result<()> {
        match self {
            ClientIo::Tcp(s) => s.readable().await,
            ClientIo::Tls(s) => {
                // Records already written into the session (resumption tickets) must reach the client, and
                // plaintext already decrypted (a request sent with the handshake) is ready now.
                s.flush().await?;
                let (tcp, session) = s.get_mut();
                match session.process_new_packets() {
                    Ok(state) if state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed() => {
                        tcp.readable().await
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

impl AsyncRead for ClientIo {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Tcp(s) => s.is_write_vectored(),
            ClientIo::Tls(s) => s.is_write_vectored(),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(_) => Poll::Ready(Ok(())),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
