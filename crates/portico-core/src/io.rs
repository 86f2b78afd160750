//! A connection's byte stream, on either side of the proxy: plain TCP, TLS accepted from a client, or TLS
//! opened to an upstream, behind one type so the proxy is written once. An enum rather than a generic: one
//! branch per poll costs less than a second and third copy of the whole proxy in the binary, and the TLS state
//! is boxed so a plain connection's task stays small.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

pub enum Stream {
    Tcp(TcpStream),
    /// TLS terminated for a client.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// TLS opened to an upstream.
    UpstreamTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// Waits until a read would make progress, without a buffer: an idle keep-alive connection holds none.
    pub async fn readable(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            // Records already written into the session (resumption tickets) must reach the peer, and plaintext
            // already decrypted (a request sent with the handshake) is ready now.
            Stream::Tls(s) => {
                s.flush().await?;
                let (tcp, session) = s.get_mut();
                if has_input(session) {
                    return Ok(());
                }
                tcp.readable().await
            }
            Stream::UpstreamTls(s) => {
                s.flush().await?;
                let (tcp, session) = s.get_mut();
                if has_input(session) {
                    return Ok(());
                }
                tcp.readable().await
            }
        }
    }

    /// Resolves when the socket reports an error: the peer has reset the connection. Once the peer's FIN has
    /// been read, reads only ever return end-of-file, even after a reset: this is how a reset is seen then.
    pub async fn reset_by_peer(&self) {
        let tcp = match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => s.get_ref().0,
            Stream::UpstreamTls(s) => s.get_ref().0,
        };
        // An error from the reactor itself (shut down) ends the wait too: nothing more will be seen.
        let _ = tcp.ready(tokio::io::Interest::ERROR).await;
    }

    /// For a pooled upstream connection: false when the peer has closed it or sent bytes nobody asked for.
    /// Costs no system call on a plain connection unless the reactor has seen the socket become readable. On
    /// TLS, records that carry no data (TLS 1.3 session tickets) are consumed and do not count.
    pub fn still_usable(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self {
            Stream::Tcp(s) => matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            _ => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                matches!(Pin::new(self).poll_read(&mut cx, &mut buf), Poll::Pending)
            }
        }
    }
}

/// Plaintext or a close is waiting inside the TLS session, so a read would not wait for the socket.
fn has_input<D>(session: &mut rustls::ConnectionCommon<D>) -> bool {
    session.process_new_packets().map_or(true, |state| state.plaintext_bytes_to_read() > 0 || state.peer_has_closed())
}

impl AsyncRead for Stream {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::UpstreamTls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::UpstreamTls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::UpstreamTls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::UpstreamTls(s) => s.is_write_vectored(),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(_) => Poll::Ready(Ok(())),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::UpstreamTls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::UpstreamTls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
