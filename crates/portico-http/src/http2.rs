//! HTTP/2 from clients: over TLS when ALPN picks `h2`, on plain listeners when a connection opens with the
//! HTTP/2 preface (prior knowledge, "h2c"). hyper's HTTP/2 server does the framing, flow control and HPACK;
//! each stream's request is then handed, serialized as HTTP/1.1 by hyper's client, to the same HTTP/1 engine
//! that serves HTTP/1 clients, through an in-process pipe. So routing, balancing, retries, the circuit breaker,
//! metrics and the access log are one code path for both protocols, at the cost of one extra serialization
//! per request (measured in bench/RESULTS.md).

use crate::body::ClientFacts;
use crate::context::Connection;
use crate::context::WorkerCtx;
use crate::exec::LocalExec;
use crate::response_body::{local, ProxyBody};
use crate::snapshot::Http2Settings;
use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use portico_core::io::Stream;
use std::cell::Cell;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// What a client sends first on an HTTP/2 connection (RFC 9113 3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves one HTTP/2 connection until the client closes it, it idles for the listener's keep-alive timeout,
/// or the process shuts down (then with a GOAWAY that lets open streams finish).
pub(crate) async fn serve(
    io: Stream,
    preread: Bytes,
    peer: SocketAddr,
    facts: ClientFacts,
    listener: Arc<str>,
    ctx: Rc<WorkerCtx>,
) {
    let (settings, keepalive) = {
        let snapshot = ctx.snapshot.load();
        let Some(l) = snapshot.listener(&listener) else { return };
        let Some(settings) = l.http2.clone() else { return };
        (settings, l.keepalive_timeout)
    };
    let mut shutdown = ctx.shutdown.clone();
    let state = Rc::new(Connection {
        peer,
        facts: ClientFacts { http2: true, ..facts },
        listener,
        ctx,
        last_request: Cell::new(Instant::now()),
        active: Cell::new(0),
    });
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req| bridge(req, service_state.clone()));
    let conn = builder(&settings).serve_connection(TokioIo::new(Rewind { preread, io }), service);
    let mut conn = std::pin::pin!(conn);
    let mut closing = false;
    loop {
        // Idle means no stream in progress: while one is, look again a keep-alive period later (a stream
        // ending counts as activity), instead of waking up for a deadline already past.
        let idle_deadline = match state.active.get() {
            0 => state.last_request.get() + keepalive,
            _ => Instant::now() + keepalive,
        };
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = shutdown.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(idle_deadline), if !closing => {
                if state.active.get() == 0 && state.last_request.get() + keepalive <= Instant::now() {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

fn builder(settings: &Http2Settings) -> hyper::server::conn::http2::Builder<LocalExec> {
    let mut builder = hyper::server::conn::http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_stream_window_size(settings.initial_stream_window)
        .initial_connection_window_size(settings.initial_connection_window)
        .max_header_list_size(settings.max_header_list_size)
        .max_frame_size(settings.max_frame_size)
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_interval.unwrap_or(Duration::from_secs(20)));
    builder
}

/// Counts a request as being answered while it lives.
struct Active<'a>(&'a Connection);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get() - 1);
        self.0.last_request.set(Instant::now());
    }
}

/// Answers one stream: its request goes through the HTTP/1 engine on a pipe of its own.
async fn bridge(req: Request<Incoming>, conn: Rc<Connection>) -> Result<Response<ProxyBody>, Infallible> {
    conn.last_request.set(Instant::now());
    conn.active.set(conn.active.get() + 1);
    let _active = Active(&conn);
    if req.method() == Method::CONNECT {
        return Ok(local(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not supported"));
    }
    // A panic (a bug) costs this stream, answered 500, never the connection or the worker. Boxed: the stream's
    // task is moved several times as hyper and tokio set it up, and this future is most of its size.
    let served = AssertUnwindSafe(Box::pin(crate::serve_h2::serve(req, &conn))).catch_unwind().await;
    Ok(served.unwrap_or_else(|panic| {
        if let Some(listener) = conn.ctx.snapshot.load().listener(&conn.listener) {
            portico_core::stats::slot(&listener.stats.slots, conn.ctx.index).panics.inc();
        }
        tracing::error!(
            listener = %conn.listener,
            client = %conn.peer,
            "HTTP/2 stream handling panicked at {}: {}",
            portico_core::panic::last_panic_location(),
            portico_core::panic::panic_message(panic.as_ref())
        );
        local(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }))
}

/// A stream with bytes already read from it put back in front: the preface read while telling h2c from
/// HTTP/1.
struct Rewind {
    preread: Bytes,
    io: Stream,
}

impl AsyncRead for Rewind {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.preread.is_empty() {
            let n = this.preread.len().min(buf.remaining());
            buf.put_slice(&this.preread[..n]);
            this.preread.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
