//! One client connection: read request heads (strictly), route, pick an endpoint, forward over a pooled
//! upstream connection, stream both bodies with bounded buffers, and decide what may be kept alive.

use crate::balancer::PickInput;
use crate::codec::{self, BodyFraming, ChunkedDecoder, Decoded, HeadError, Known, Parsed, RequestHead, ResponseHead};
use crate::pool::UpstreamConn;
use crate::snapshot::{Cluster, Endpoint, ListenerSettings, Snapshot};
use crate::worker::WorkerCtx;
use bytes::{Buf, Bytes, BytesMut};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};

/// Read size and the most body data held at once per direction: the memory bound of a streamed body.
const READ_CHUNK: usize = 64 * 1024;
/// A request body up to this size that has fully arrived with its head is kept until the response starts,
/// so the request can be replayed on a fresh connection if a pooled one turns out to be dead.
const REPLAYABLE_BODY: u64 = 64 * 1024;
/// Largest response head accepted from an upstream.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Pipelined bytes read ahead while waiting for an upstream, before the proxy stops reading the client.
const PIPELINE_READ_AHEAD: usize = 64 * 1024;
/// Endpoints tried for one request when connections fail.
const MAX_CONNECT_ATTEMPTS: usize = 3;

/// What the client connection does after a request.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
}

struct Client {
    io: TcpStream,
    buf: BytesMut,
    peer: SocketAddr,
    /// Scratch space for heads written to either side, reused across requests.
    out: Vec<u8>,
}

pub async fn serve_connection(io: TcpStream, peer: SocketAddr, listener: Arc<str>, ctx: Rc<WorkerCtx>) {
    let _ = io.set_nodelay(true);
    let mut client = Client { io, buf: BytesMut::with_capacity(4096), peer, out: Vec::with_capacity(1024) };
    let mut shutdown = ctx.shutdown.clone();
    let mut first = true;
    loop {
        let head = {
            let waiting = ctx.snapshot.load_full();
            let Some(settings) = waiting.listener(&listener) else {
                return;
            };
            match read_head(&mut client, settings, first, &mut shutdown).await {
                Ok(Some(head)) => head,
                Ok(None) => return,
                Err(e) => {
                    let _ = respond_error(&mut client, e.status, e.reason, true).await;
                    linger_close(client.io).await;
                    return;
                }
            }
        };
        first = false;
        // Load again: a connection that idled through a reload serves its next request on the new config.
        let snapshot = ctx.snapshot.load_full();
        let Some(settings) = snapshot.listener(&listener) else {
            return;
        };
        let next = handle_request(&mut client, head, &snapshot, settings, &ctx).await;
        if next == Next::Close || *shutdown.borrow() {
            linger_close(client.io).await;
            return;
        }
    }
}

/// Reads one request head. `Ok(None)`: the connection ended cleanly (client closed, idle timeout, shutdown).
async fn read_head(
    client: &mut Client,
    settings: &ListenerSettings,
    first: bool,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<RequestHead>, HeadError> {
    // A new connection must send its head within header_read; a kept-alive one may idle for keepalive first.
    let mut started = !client.buf.is_empty();
    let mut deadline =
        Instant::now() + if first || started { settings.header_read_timeout } else { settings.keepalive_timeout };
    loop {
        if !client.buf.is_empty() {
            match codec::parse_request(&client.buf, &settings.limits)? {
                Parsed::Complete(head, used) => return Ok(Some(codec::take_request(&mut client.buf, head, used))),
                Parsed::Partial => {
                    if !started {
                        started = true;
                        deadline = Instant::now() + settings.header_read_timeout;
                    }
                }
            }
        }
        if client.buf.capacity() - client.buf.len() < 1024 {
            client.buf.reserve(4096);
        }
        let read = tokio::select! {
            r = timeout_at(deadline, client.io.read_buf(&mut client.buf)) => r,
            _ = shutdown.changed(), if !started => return Ok(None),
        };
        match read {
            Err(_) if started => return Err(HeadError { status: 408, reason: "request head not received in time" }),
            Err(_) => return Ok(None),
            Ok(Ok(0)) if started => {
                return Err(HeadError { status: 400, reason: "connection closed inside the request head" })
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
        }
    }
}

/// The request body as the proxy holds it.
enum ReqBody {
    /// No body, or a small body already received in full (kept for a replay).
    InHand(Bytes),
    /// A body still to stream from the client with this framing.
    Streaming(BodyFraming),
}

/// A failure before the upstream produced a usable response head.
struct UpstreamFailure {
    status: u16,
    reason: &'static str,
    /// Nothing reached the upstream's application, or the connection was a reused one that died before any
    /// response byte: the request can be sent again on a fresh connection.
    retry_fresh: bool,
}

async fn handle_request(
    client: &mut Client,
    head: RequestHead,
    snapshot: &Snapshot,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> Next {
    let Some(route) = snapshot.router.find(&head) else {
        let next = discard_body(client, &head);
        let _ =
            respond_error(client, 404, "no route matches this request", next == Next::Close || !head.keep_alive).await;
        return if head.keep_alive { next } else { Next::Close };
    };
    let cluster = &snapshot.clusters[route.cluster];
    if head.body == BodyFraming::Chunked {
        // Catch a broken chunked body that already arrived before anything goes upstream.
        if let Some(reason) = codec::chunked_prefix_error(&client.buf) {
            let _ = respond_error(client, 400, reason, true).await;
            return Next::Close;
        }
    }

    let mut body = match head.body {
        BodyFraming::None => ReqBody::InHand(Bytes::new()),
        BodyFraming::Length(n) if n <= REPLAYABLE_BODY && client.buf.len() as u64 >= n => {
            ReqBody::InHand(client.buf.split_to(n as usize).freeze())
        }
        framing => ReqBody::Streaming(framing),
    };

    let input = PickInput { req: &head, client_ip: client.peer.ip(), worker: ctx.index };
    let mut tried: Vec<usize> = Vec::new();
    let mut fresh_only = false;
    let mut last = UpstreamFailure { status: 503, reason: "no upstream endpoint available", retry_fresh: false };
    let attempts_allowed = cluster.endpoints.len().min(MAX_CONNECT_ATTEMPTS);
    let mut attempt = 0;
    while attempt < attempts_allowed + 1 {
        attempt += 1;
        let Some(pick) = cluster.balancer.pick(&cluster.endpoints, &input, &tried) else {
            break;
        };
        let endpoint = &cluster.endpoints[pick.index];
        let mut conn = match upstream_connection(ctx, cluster, endpoint, fresh_only).await {
            Ok(c) => c,
            Err(failure) => {
                tried.push(pick.index);
                last = failure;
                continue;
            }
        };
        endpoint.begin(ctx.index);
        let _inflight = InflightGuard { endpoint, worker: ctx.index };
        let sent = send_request(client, &mut conn, &head, &mut body, cluster, endpoint, settings).await;
        let response = match sent {
            Ok(()) => read_response_head(client, &mut conn, &head, cluster, &body).await,
            Err(f) => Err(f),
        };
        let resp = match response {
            Ok(resp) => resp,
            Err(f) if f.status == 0 => return Next::Close, // client gone: drop the upstream request
            Err(f) if f.retry_fresh && conn.reused && matches!(body, ReqBody::InHand(_)) => {
                // A pooled connection the upstream had closed: replay on a fresh one (same endpoint allowed).
                fresh_only = true;
                last = f;
                continue;
            }
            Err(f) => {
                if f.status == 502 && !conn.reused {
                    tracing::debug!(endpoint = %endpoint.addr, reason = f.reason, "upstream failure");
                }
                let body_done = matches!(body, ReqBody::InHand(_));
                let close = !body_done || !head.keep_alive;
                let _ = respond_error(client, f.status, f.reason, close).await;
                return if close { Next::Close } else { Next::KeepAlive };
            }
        };
        endpoint.health.mark_up();
        // The request body may still be partly unread when the upstream answered early.
        let request_done = matches!(body, ReqBody::InHand(_));
        return forward_response(
            client,
            conn,
            resp,
            &head,
            cluster,
            endpoint,
            pick.set_cookie,
            request_done,
            settings,
            ctx,
        )
        .await;
    }
    let close = !matches!(body, ReqBody::InHand(_)) || !head.keep_alive;
    let _ = respond_error(client, last.status, last.reason, close).await;
    if close {
        Next::Close
    } else {
        Next::KeepAlive
    }
}

struct InflightGuard<'a> {
    endpoint: &'a Endpoint,
    worker: usize,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.endpoint.end(self.worker);
    }
}

/// Skips a body already received in full so the connection can serve the next request; otherwise the
/// connection must close.
fn discard_body(client: &mut Client, head: &RequestHead) -> Next {
    match head.body {
        BodyFraming::None => Next::KeepAlive,
        BodyFraming::Length(n) if client.buf.len() as u64 >= n => {
            client.buf.advance(n as usize);
            Next::KeepAlive
        }
        _ => Next::Close,
    }
}

async fn upstream_connection(
    ctx: &WorkerCtx,
    cluster: &Cluster,
    endpoint: &Endpoint,
    fresh_only: bool,
) -> Result<UpstreamConn, UpstreamFailure> {
    if !fresh_only {
        if let Some(conn) = ctx.pool.borrow_mut().checkout(endpoint.addr, cluster.settings.pool_idle_timeout) {
            return Ok(conn);
        }
    }
    let connect = TcpStream::connect(endpoint.addr);
    let failure = match timeout(cluster.settings.connect_timeout, connect).await {
        Ok(Ok(io)) => {
            let _ = io.set_nodelay(true);
            return Ok(UpstreamConn::new(io));
        }
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
            UpstreamFailure { status: 502, reason: "upstream refused the connection", retry_fresh: false }
        }
        Ok(Err(_)) => UpstreamFailure { status: 502, reason: "upstream connection failed", retry_fresh: false },
        Err(_) => UpstreamFailure { status: 504, reason: "upstream connect timed out", retry_fresh: false },
    };
    if endpoint.health.mark_down(cluster.settings.fail_timeout) {
        tracing::warn!(
            cluster = %cluster.name, endpoint = %endpoint.addr, reason = failure.reason,
            "endpoint marked down for {:?}", cluster.settings.fail_timeout
        );
    }
    Err(failure)
}

/// Writes the request head (with a body in hand, in the same write) and streams a body still at the client.
async fn send_request(
    client: &mut Client,
    conn: &mut UpstreamConn,
    head: &RequestHead,
    body: &mut ReqBody,
    cluster: &Cluster,
    endpoint: &Endpoint,
    settings: &ListenerSettings,
) -> Result<(), UpstreamFailure> {
    let out = &mut client.out;
    out.clear();
    write_request_head(out, head, cluster, endpoint, client.peer);
    if let ReqBody::InHand(bytes) = body {
        out.extend_from_slice(bytes);
    }
    let send_timeout = cluster.settings.send_timeout;
    if write_timed(&mut conn.io, out, send_timeout).await.is_err() {
        return Err(UpstreamFailure { status: 502, reason: "upstream closed the connection", retry_fresh: true });
    }
    out.clear();
    let ReqBody::Streaming(framing) = *body else {
        return Ok(());
    };
    if head.expect_continue && !head.http10 {
        let _ = write_timed(&mut client.io, b"HTTP/1.1 100 Continue\r\n\r\n", settings.send_timeout).await;
    }
    let out_chunked = framing == BodyFraming::Chunked;
    let timeouts = (settings.body_read_timeout, send_timeout);
    match relay_body(&mut client.io, &mut client.buf, framing, &mut conn.io, out_chunked, timeouts, &mut client.out)
        .await
    {
        Ok(_) => {
            *body = ReqBody::InHand(Bytes::new());
            Ok(())
        }
        // The client stopped sending or sent a broken body: the upstream request is abandoned (its connection
        // dropped, so the upstream never sees a complete request) and the client told why, if still there.
        Err(RelayError::Source(fault)) => Err(match fault {
            SourceFault::Closed => {
                UpstreamFailure { status: 0, reason: "client closed the connection", retry_fresh: false }
            }
            SourceFault::TimedOut => {
                UpstreamFailure { status: 408, reason: "request body not received in time", retry_fresh: false }
            }
            SourceFault::Malformed(reason) => UpstreamFailure { status: 400, reason, retry_fresh: false },
        }),
        Err(RelayError::Dest) => {
            // The upstream stopped reading: it may have answered early (413, 401). Let the caller read it.
            Ok(())
        }
    }
}

/// The request head as forwarded: origin-form target, hop-by-hop headers removed, framing regenerated, the
/// `x-forwarded-*` and `via` headers added.
fn write_request_head(out: &mut Vec<u8>, head: &RequestHead, cluster: &Cluster, endpoint: &Endpoint, peer: SocketAddr) {
    out.extend_from_slice(head.method());
    out.push(b' ');
    out.extend_from_slice(head.origin_form());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    out.extend_from_slice(b"host: ");
    match head.host() {
        Some(h) if cluster.settings.preserve_host => out.extend_from_slice(h),
        _ => out.extend_from_slice(endpoint.authority.as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    let mut forwarded_for: Option<&[u8]> = None;
    let mut extra_forwarded_for = Vec::new();
    let mut via: Vec<&[u8]> = Vec::new();
    for (h, kind) in &head.headers {
        let name = head.header_name(h);
        let value = head.header_value(h);
        match kind {
            Known::HopByHop | Known::Host | Known::ContentLength | Known::Expect => continue,
            Known::XForwardedProto | Known::XForwardedHost => continue,
            Known::XForwardedFor => {
                if forwarded_for.is_none() {
                    forwarded_for = Some(value);
                } else {
                    extra_forwarded_for.push(value);
                }
                continue;
            }
            Known::Via => {
                via.push(value);
                continue;
            }
            Known::Other | Known::Cookie => {
                if !head.connection.is_empty() && head.named_by_connection(name) {
                    continue;
                }
            }
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let Some(first) = forwarded_for {
        out.extend_from_slice(first);
        for v in extra_forwarded_for {
            out.extend_from_slice(b", ");
            out.extend_from_slice(v);
        }
        out.extend_from_slice(b", ");
    }
    push_ip(out, peer);
    out.extend_from_slice(b"\r\nx-forwarded-proto: http\r\n");
    if let Some(h) = head.host() {
        out.extend_from_slice(b"x-forwarded-host: ");
        out.extend_from_slice(h);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"via: ");
    for v in via {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(if head.http10 { b"1.0 portico\r\n" } else { b"1.1 portico\r\n" });
    match head.body {
        BodyFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        BodyFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        BodyFraming::None | BodyFraming::UntilClose => {
            // Keep an explicit zero length: some upstreams require it on POST and PUT.
            if head.values("content-length").next().is_some() {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
        }
    }
    out.extend_from_slice(b"\r\n");
}

fn push_ip(out: &mut Vec<u8>, peer: SocketAddr) {
    use std::io::Write;
    let _ = write!(out, "{}", peer.ip());
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    use std::io::Write;
    let _ = write!(out, "{n}");
}

/// Reads the response head, skipping `100 Continue`, while watching for the client to go away.
async fn read_response_head(
    client: &mut Client,
    conn: &mut UpstreamConn,
    head: &RequestHead,
    cluster: &Cluster,
    body: &ReqBody,
) -> Result<(Bytes, ResponseHead), UpstreamFailure> {
    let deadline = Instant::now() + cluster.settings.response_header_timeout;
    let is_head = head.method() == b"HEAD";
    // Reading ahead from the client is only safe once its body is fully consumed.
    let watch_client = matches!(body, ReqBody::InHand(_));
    loop {
        match codec::parse_response(&conn.buf, is_head, MAX_RESPONSE_HEAD) {
            Err(reason) => {
                return Err(UpstreamFailure { status: 502, reason: invalid_response(reason), retry_fresh: false })
            }
            Ok(Parsed::Complete(resp, used)) => {
                if resp.status == 101 {
                    // Upgrades are not forwarded (the Upgrade header is stripped), so this is a broken upstream.
                    return Err(UpstreamFailure {
                        status: 502,
                        reason: "upstream switched protocols unexpectedly",
                        retry_fresh: false,
                    });
                }
                if resp.status < 200 {
                    // 100 Continue was answered by the proxy itself; other interim responses are dropped.
                    conn.buf.advance(used);
                    continue;
                }
                let bytes = conn.buf.split_to(used).freeze();
                return Ok((bytes, resp));
            }
            Ok(Parsed::Partial) => {}
        }
        if conn.buf.capacity() - conn.buf.len() < 4096 {
            conn.buf.reserve(16 * 1024);
        }
        let nothing_yet = conn.buf.is_empty();
        let read = tokio::select! {
            r = timeout_at(deadline, conn.io.read_buf(&mut conn.buf)) => r,
            _ = client_gone(&mut client.io, &mut client.buf), if watch_client => {
                return Err(UpstreamFailure { status: 0, reason: "client closed the connection", retry_fresh: false });
            }
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) | Ok(Err(_)) => {
                return Err(UpstreamFailure {
                    status: 502,
                    reason: if nothing_yet {
                        "upstream closed the connection before responding"
                    } else {
                        "upstream closed the connection inside the response head"
                    },
                    // The upstream may have read the request before closing: replay only what is safe to repeat.
                    retry_fresh: nothing_yet && head.is_idempotent(),
                });
            }
            Err(_) => {
                return Err(UpstreamFailure {
                    status: 504,
                    reason: "upstream timed out before responding",
                    retry_fresh: false,
                })
            }
        }
    }
}

fn invalid_response(_detail: &'static str) -> &'static str {
    "upstream sent an invalid response"
}

/// Resolves when the client closes its side (or errors). Pipelined bytes read meanwhile stay in `buf`.
async fn client_gone(io: &mut TcpStream, buf: &mut BytesMut) {
    loop {
        if buf.len() >= PIPELINE_READ_AHEAD {
            std::future::pending::<()>().await;
        }
        buf.reserve(4096);
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward_response(
    client: &mut Client,
    mut conn: UpstreamConn,
    (resp_bytes, resp): (Bytes, ResponseHead),
    head: &RequestHead,
    cluster: &Cluster,
    endpoint: &Endpoint,
    set_cookie: bool,
    request_done: bool,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> Next {
    // A close-delimited or chunked body goes to an HTTP/1.0 client as-is, ended by closing.
    let to_client_chunked = !head.http10 && matches!(resp.body, BodyFraming::Chunked | BodyFraming::UntilClose);
    let ends_by_close = head.http10 && matches!(resp.body, BodyFraming::Chunked | BodyFraming::UntilClose);
    let keep_alive = head.keep_alive && request_done && !ends_by_close && !*ctx.shutdown.borrow();

    let out = &mut client.out;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(resp.status));
    out.push(b' ');
    out.extend_from_slice(resp.reason.get(&resp_bytes));
    out.extend_from_slice(b"\r\n");
    for h in &resp.headers {
        let name = h.name.get(&resp_bytes);
        let kind = codec::classify(name);
        let keep = match kind {
            Known::HopByHop => false,
            // Regenerated below, except on bodiless responses where it describes the would-be body.
            Known::ContentLength => resp.body == BodyFraming::None,
            _ => resp.connection.is_empty() || !resp.named_by_connection(&resp_bytes, name),
        };
        if keep {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value.get(&resp_bytes));
            out.extend_from_slice(b"\r\n");
        }
    }
    match resp.body {
        BodyFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        _ if to_client_chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    if set_cookie {
        use std::io::Write;
        let _ = write!(out, "set-cookie: {}={:016x}; Path=/; HttpOnly", cluster.balancer.sticky_cookie, endpoint.id);
        if let Some(age) = cluster.balancer.sticky_max_age {
            let _ = write!(out, "; Max-Age={age}");
        }
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if head.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    // The head stays in `client.out`: relay_body sends it with the first body bytes.
    let timeouts = (cluster.settings.read_timeout, settings.send_timeout);
    let relayed = relay_body(
        &mut conn.io,
        &mut conn.buf,
        resp.body,
        &mut client.io,
        to_client_chunked,
        timeouts,
        &mut client.out,
    )
    .await;
    match relayed {
        Ok(_) => {
            if resp.reusable && conn.buf.is_empty() && request_done {
                ctx.pool.borrow_mut().checkin(endpoint.addr, conn, cluster.settings.max_idle_per_endpoint);
            }
            if keep_alive {
                Next::KeepAlive
            } else {
                Next::Close
            }
        }
        Err(e) => {
            if let RelayError::Source(fault) = e {
                tracing::debug!(endpoint = %endpoint.addr, ?fault, "upstream response body failed");
            }
            // The client has an incomplete response: closing is the only honest signal left.
            Next::Close
        }
    }
}

enum RelayError {
    /// Reading the source failed: closed early, timed out or malformed framing.
    Source(SourceFault),
    /// Writing to the destination failed.
    Dest,
}

/// Streams one body from `src` to `dst`, decoding `framing` and, when `out_chunked`, re-encoding it chunked.
///
/// `pending` may hold bytes to send first (the response head): output is gathered there while the source has
/// data buffered and written only before the relay would wait for more, or once `COALESCE` bytes are
/// pending, so a small response goes out in one write with its head. At most `READ_CHUNK` bytes are read
/// ahead and `COALESCE` plus one piece held for writing.
#[allow(clippy::too_many_arguments)]
async fn relay_body<R, W>(
    src: &mut R,
    src_buf: &mut BytesMut,
    framing: BodyFraming,
    dst: &mut W,
    out_chunked: bool,
    (read_timeout, write_timeout): (Duration, Duration),
    pending: &mut Vec<u8>,
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Output { dst, pending, chunked: out_chunked, timeout: write_timeout };
    let mut total = 0u64;
    match framing {
        BodyFraming::None => {}
        BodyFraming::Length(n) => {
            let mut left = n;
            while left > 0 {
                if src_buf.is_empty() {
                    out.flush().await?;
                    if read_more(src, src_buf, read_timeout).await? == 0 {
                        return Err(RelayError::Source(SourceFault::Closed));
                    }
                }
                let take = (left.min(src_buf.len() as u64)) as usize;
                out.piece(&src_buf[..take]).await?;
                src_buf.advance(take);
                left -= take as u64;
                total += take as u64;
            }
        }
        BodyFraming::Chunked => {
            let mut decoder = ChunkedDecoder::default();
            loop {
                match decoder.decode(src_buf, READ_CHUNK).map_err(|e| RelayError::Source(SourceFault::Malformed(e)))? {
                    Decoded::Data(bytes) => {
                        total += bytes.len() as u64;
                        out.piece(&bytes).await?;
                    }
                    Decoded::NeedMore => {
                        out.flush().await?;
                        if read_more(src, src_buf, read_timeout).await? == 0 {
                            return Err(RelayError::Source(SourceFault::Closed));
                        }
                    }
                    Decoded::Done => break,
                }
            }
        }
        BodyFraming::UntilClose => loop {
            if src_buf.is_empty() {
                out.flush().await?;
                if read_more(src, src_buf, read_timeout).await? == 0 {
                    break;
                }
            }
            let take = src_buf.len();
            out.piece(&src_buf[..take]).await?;
            src_buf.advance(take);
            total += take as u64;
        },
    }
    if out_chunked && framing != BodyFraming::None {
        out.pending.extend_from_slice(codec::LAST_CHUNK);
    }
    out.flush().await?;
    Ok(total)
}

/// Most bytes gathered before a write; larger pieces are written on their own, uncopied.
const COALESCE: usize = 16 * 1024;

/// The writing side of a relay: gathers small pieces, frames them when chunked.
struct Output<'a, W> {
    dst: &'a mut W,
    pending: &'a mut Vec<u8>,
    chunked: bool,
    timeout: Duration,
}

impl<W: AsyncWrite + Unpin> Output<'_, W> {
    async fn piece(&mut self, data: &[u8]) -> Result<(), RelayError> {
        if data.is_empty() {
            return Ok(());
        }
        if self.pending.len() + data.len() > COALESCE {
            self.flush().await?;
            if !self.chunked {
                return write_timed(self.dst, data, self.timeout).await.map_err(|_| RelayError::Dest);
            }
        }
        if self.chunked {
            codec::chunk_header(self.pending, data.len());
            self.pending.extend_from_slice(data);
            self.pending.extend_from_slice(b"\r\n");
        } else {
            self.pending.extend_from_slice(data);
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), RelayError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = write_timed(self.dst, self.pending, self.timeout).await;
        self.pending.clear();
        result.map_err(|_| RelayError::Dest)
    }
}

#[derive(Debug, Clone, Copy)]
enum SourceFault {
    Closed,
    TimedOut,
    Malformed(&'static str),
}

async fn read_more<R: AsyncRead + Unpin>(src: &mut R, buf: &mut BytesMut, t: Duration) -> Result<usize, RelayError> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    match timeout(t, src.read_buf(buf)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(_)) => Err(RelayError::Source(SourceFault::Closed)),
        Err(_) => Err(RelayError::Source(SourceFault::TimedOut)),
    }
}

async fn write_timed<W: AsyncWrite + Unpin>(dst: &mut W, data: &[u8], t: Duration) -> io::Result<()> {
    match timeout(t, dst.write_all(data)).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// A short plain-text answer produced by the proxy itself.
async fn respond_error(client: &mut Client, status: u16, reason: &str, close: bool) -> io::Result<()> {
    use std::io::Write;
    let body_len = reason.len() + 1;
    let out = &mut client.out;
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {body_len}\r\nserver: portico\r\n{}\r\n{reason}\n",
        status_text(status),
        if close { "connection: close\r\n" } else { "" },
    );
    write_timed(&mut client.io, out, Duration::from_secs(5)).await
}

/// Closes after an answer without losing it: half-close, then drain what the client still sends for a
/// moment, so the kernel does not reset the connection (and discard the answer) over unread bytes.
async fn linger_close(mut io: TcpStream) {
    let _ = io.shutdown().await;
    let mut sink = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut drained = 0usize;
    while drained < 256 * 1024 {
        match timeout_at(deadline, io.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}
