//! Upgraded connections (WebSocket). Bytes are relayed both ways only after the upstream has answered the
//! handshake with `101 Switching Protocols` and `Upgrade: websocket`; until then the connection is plain HTTP
//! (relaying earlier lets a client smuggle requests past the proxy, as a 2026 Pingora CVE showed). Once
//! switched, the relay is a byte pipe until either side closes or nothing passes for `timeouts.tunnel`. A
//! reload does not touch it: it belongs to its connection's task, not to a snapshot.

use crate::client::Client;
use crate::codec::ResponseHead;
use crate::context::WorkerCtx;
use crate::pool::UpstreamConn;
use crate::relay::write_timed;
use crate::snapshot::{Cluster, ListenerSettings};
use bytes::Bytes;
use portico_core::stats::slot;
use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

/// Sends the `101` to the client and relays until the tunnel ends; returns the bytes sent to the client.
pub(crate) async fn relay(
    client: &mut Client,
    mut conn: UpstreamConn,
    (resp_bytes, resp): (Bytes, ResponseHead),
    cluster: &Cluster,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> u64 {
    client.response_started = true;
    let out = &mut client.out;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 101 ");
    out.extend_from_slice(resp.reason.get(&resp_bytes));
    out.extend_from_slice(b"\r\n");
    for h in &resp.headers {
        let name = h.name.get(&resp_bytes);
        if !resp.is_hop_by_hop(&resp_bytes, name) {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value.get(&resp_bytes));
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"connection: upgrade\r\nupgrade: websocket\r\n\r\n");
    // Frames the upstream sent right behind its 101 go out with it.
    out.extend_from_slice(&conn.buf);
    let to_client = conn.buf.len() as u64;
    conn.buf.clear();
    if write_timed(&mut client.io, out, settings.send_timeout).await.is_err() {
        return 0;
    }
    out.clear();
    // Frames the client sent before it saw the 101 were held back; they go first.
    if !client.buf.is_empty() {
        if write_timed(&mut conn.io, &client.buf, cluster.settings.send_timeout).await.is_err() {
            return to_client;
        }
        client.buf.clear();
    }

    let counters = slot(&cluster.stats.slots, ctx.index);
    counters.tunnels_opened.inc();
    counters.tunnels.add(1);
    let _open = TunnelGauge(&counters.tunnels);
    let last = Cell::new(Instant::now());
    let (to_client_relayed, to_upstream_relayed) = (Cell::new(0u64), Cell::new(0u64));
    let client_side = Watched { io: &mut client.io, last: &last, written: &to_client_relayed };
    let upstream_side = Watched { io: &mut conn.io, last: &last, written: &to_upstream_relayed };
    let (mut client_read, mut client_write) = tokio::io::split(client_side);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream_side);
    // A client that closes its side has the close passed on, and the upstream may still finish its answer
    // (a WebSocket close frame). Once the upstream has closed, the tunnel is over: a client that keeps its
    // side open after the closing handshake must not hold it.
    let up = async {
        let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        let _ = upstream_write.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), client_write.shutdown()).await;
    };
    let (mut up, mut down) = (std::pin::pin!(up), std::pin::pin!(down));
    let mut up_done = false;
    let idle = idle(&last, cluster.settings.tunnel_idle_timeout);
    let mut idle = std::pin::pin!(idle);
    // On shutdown a tunnel may go on for most of the grace period, then ends in order, so it is logged.
    let draining = draining(ctx);
    let mut draining = std::pin::pin!(draining);
    loop {
        tokio::select! {
            _ = &mut down => break,
            _ = &mut up, if !up_done => up_done = true,
            _ = &mut idle => break,
            _ = &mut draining => break,
        }
    }
    to_client + to_client_relayed.get()
}

/// Resolves shortly before the grace period after shutdown began runs out.
async fn draining(ctx: &WorkerCtx) {
    let mut shutdown = ctx.shutdown.clone();
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
    let grace = ctx.snapshot.load().shutdown_grace;
    tokio::time::sleep(grace.saturating_sub(Duration::from_millis(250))).await;
}

struct TunnelGauge<'a>(&'a portico_core::stats::Gauge);

impl Drop for TunnelGauge<'_> {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}

/// Resolves once nothing has passed through the tunnel for `limit`.
async fn idle(last: &Cell<Instant>, limit: Duration) {
    loop {
        let deadline = last.get() + limit;
        tokio::time::sleep_until(deadline).await;
        if last.get() + limit <= Instant::now() {
            return;
        }
    }
}

/// A stream that notes when bytes last passed through it, for the tunnel's idle timeout.
struct Watched<'a, T> {
    io: &'a mut T,
    last: &'a Cell<Instant>,
    /// Bytes written through it.
    written: &'a Cell<u64>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.last.set(Instant::now());
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                this.last.set(Instant::now());
                this.written.set(this.written.get() + n as u64);
            }
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
    }
}
