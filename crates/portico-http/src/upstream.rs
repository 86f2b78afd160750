//! The upstream side of one request: a connection (pooled, or new within the circuit breaker's limits), the
//! request head and body sent, the response head read, and what the outcome says about the endpoint's health
//! (outlier detection).

use crate::body::{BodySource, ClientFacts, ClientSeen, Downstream, ReqBody};
use crate::codec::{self, BodyFraming, Known, Parsed, RequestHead, ResponseHead};
use crate::message::same_header_name;
use crate::pool::{Pool, UpstreamConn};
use crate::relay::{relay_body, write_timed, Pace, RelayError};
use crate::snapshot::{Cluster, Endpoint, ListenerSettings};
use crate::stats::ClusterSlot;
use bytes::{Bytes, BytesMut};
use portico_core::io::Stream;
use portico_core::shared::now_ms;
use portico_core::stats::slot;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// Largest response head accepted from an upstream.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Pipelined bytes read ahead while waiting for an upstream, before the proxy stops reading the client.
const PIPELINE_READ_AHEAD: usize = 64 * 1024;

/// Who is to blame for a failed request: decides retries, outlier detection and the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The upstream refused, reset, timed out or answered nonsense.
    Upstream,
    /// The circuit breaker refused to add load.
    Breaker,
    /// The client sent a broken or too slow body.
    Client,
    /// The client went away: nobody to answer.
    ClientGone,
}

/// A failure before the upstream produced a usable response head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpstreamFailure {
    pub status: u16,
    pub reason: &'static str,
    pub fault: Fault,
    /// A reused connection died before any response byte, in a way that allows sending the request again on a
    /// fresh connection.
    pub retry_fresh: bool,
    /// The upstream did not answer in time (for `retries.on_timeout`).
    pub timed_out: bool,
}

impl UpstreamFailure {
    pub fn upstream(status: u16, reason: &'static str) -> Self {
        UpstreamFailure { status, reason, fault: Fault::Upstream, retry_fresh: false, timed_out: false }
    }
    pub fn breaker(reason: &'static str) -> Self {
        UpstreamFailure { status: 503, reason, fault: Fault::Breaker, retry_fresh: false, timed_out: false }
    }
    pub fn client(status: u16, reason: &'static str) -> Self {
        UpstreamFailure { status, reason, fault: Fault::Client, retry_fresh: false, timed_out: false }
    }
    pub fn client_gone() -> Self {
        UpstreamFailure {
            status: 499,
            reason: "client closed the connection",
            fault: Fault::ClientGone,
            retry_fresh: false,
            timed_out: false,
        }
    }
}

/// A pooled connection to `endpoint`, or a new one. At the cluster's connection limit the request waits for a
/// connection to be returned or closed, up to the connect timeout, as Envoy's pending requests do; only
/// `max_pending` requests may wait, more are refused at once (the breaker).
pub(crate) async fn connection(
    pool: &RefCell<Pool>,
    worker: usize,
    cluster: &Cluster,
    endpoint: &Endpoint,
    fresh_only: bool,
) -> Result<UpstreamConn, UpstreamFailure> {
    let counters = slot(&cluster.stats.slots, worker);
    let settings = &cluster.settings;
    let mut deadline = None;
    loop {
        if !fresh_only {
            if let Some(conn) = pool.borrow_mut().checkout(endpoint, settings.pool_idle_timeout) {
                return Ok(conn);
            }
        }
        if counters.connections.get() < settings.max_connections_per_worker {
            // Counted from now: connections being opened take their place under the limit too.
            let place = Opening::take(counters);
            let opened = open(endpoint, Instant::now() + settings.connect_timeout).await?;
            place.filled();
            return Ok(UpstreamConn::counted(opened, endpoint.stats.clone(), cluster.stats.clone(), worker));
        }
        // At the limit. An idle connection to another endpoint of the cluster gives its place up.
        if pool.borrow_mut().close_idle_of(&cluster.stats) {
            continue;
        }
        if counters.pending.get() >= settings.max_pending_per_worker {
            counters.breaker_rejections.inc();
            return Err(UpstreamFailure::breaker(
                "too many requests waiting for an upstream connection (circuit breaker)",
            ));
        }
        let until = *deadline.get_or_insert_with(|| Instant::now() + settings.connect_timeout);
        // Registered before anything else runs on this worker: no return or close can be missed.
        let freed = std::pin::pin!(counters.freed.notified());
        let waiting = Waiting::start(counters);
        let woken = timeout_at(until, freed).await;
        drop(waiting);
        if woken.is_err() {
            counters.breaker_rejections.inc();
            return Err(UpstreamFailure::breaker("upstream connection limit reached (circuit breaker)"));
        }
    }
}

/// A request counted as waiting for a connection (`pending`) while it lives: a request dropped while it waits
/// (its client left) is not counted for good.
struct Waiting<'a>(&'a ClusterSlot);

impl<'a> Waiting<'a> {
    fn start(counters: &'a ClusterSlot) -> Waiting<'a> {
        counters.pending.add(1);
        Waiting(counters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.pending.add(-1);
    }
}

/// A place among a cluster's open connections taken for one being opened; given back if the connection is
/// not made (it failed, or the request was dropped meanwhile), waking a request waiting for a place.
struct Opening<'a> {
    counters: &'a ClusterSlot,
    filled: bool,
}

impl<'a> Opening<'a> {
    fn take(counters: &'a ClusterSlot) -> Opening<'a> {
        counters.connections.add(1);
        Opening { counters, filled: false }
    }

    /// The connection was made: its `UpstreamConn` holds the place from now on.
    fn filled(mut self) {
        self.filled = true;
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.counters.connections.add(-1);
            if self.counters.pending.get() > 0 {
                self.counters.freed.notify_one();
            }
        }
    }
}

/// Connects to `endpoint` and, for a TLS endpoint, completes the handshake, all before `deadline`.
pub(crate) async fn open(endpoint: &Endpoint, deadline: Instant) -> Result<Stream, UpstreamFailure> {
    let timed_out =
        || UpstreamFailure { timed_out: true, ..UpstreamFailure::upstream(504, "upstream connect timed out") };
    let tcp = match timeout_at(deadline, TcpStream::connect(endpoint.addr)).await {
        Ok(Ok(io)) => io,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(UpstreamFailure::upstream(502, "upstream refused the connection"))
        }
        Ok(Err(_)) => return Err(UpstreamFailure::upstream(502, "upstream connection failed")),
        Err(_) => return Err(timed_out()),
    };
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &endpoint.tls else {
        return Ok(Stream::Tcp(tcp));
    };
    match timeout_at(deadline, tls.connector.connect(tls.server_name.clone(), tcp)).await {
        Ok(Ok(stream)) => Ok(Stream::UpstreamTls(Box::new(stream))),
        Ok(Err(e)) => {
            // Worth an operator's attention (an expired or misnamed certificate), but once a minute at most.
            // 0 means never warned (the clock starts at 0 when the process does, so 1 stands for that moment).
            let now = now_ms().max(1);
            let last = endpoint.tls_warned_ms.load(Ordering::Relaxed);
            if (last == 0 || now.saturating_sub(last) >= 60_000)
                && endpoint.tls_warned_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            {
                tracing::warn!(endpoint = %endpoint.configured, "TLS handshake with the upstream failed: {e}");
            }
            Err(UpstreamFailure::upstream(502, "TLS handshake with the upstream failed"))
        }
        Err(_) => Err(timed_out()),
    }
}

/// A failed exchange: why, whether a connection was obtained, and whether that connection had been used
/// before (a failure before any response byte may then be a race with the upstream closing it).
pub(crate) struct Failed {
    pub failure: UpstreamFailure,
    pub connected: bool,
    pub reused: bool,
    /// A pipelined request whose batch lost its connection after the request was written: sending it again
    /// is counted as a retry (the upstream may have served it).
    pub batch_lost: bool,
}

/// Where a response's body comes from.
pub(crate) enum Source {
    /// The connection, read as the body is relayed.
    Conn(UpstreamConn),
    /// The whole body, already in hand: nothing is read. (Also what is left where the connection was taken.)
    Buffered(BytesMut),
}

/// The body's source and the response head of a request sent, or why there is none.
pub(crate) type Exchanged = Result<(Source, (Bytes, ResponseHead)), Failed>;

/// One request on a connection of its own (pooled, or new within the breaker's limits): the request sent and
/// the response head read.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange(
    down: &mut Downstream<'_>,
    pool: &RefCell<Pool>,
    worker: usize,
    cluster: &Cluster,
    endpoint: &Endpoint,
    fresh_only: bool,
    head: &RequestHead,
    body: &mut ReqBody,
    settings: &ListenerSettings,
) -> Exchanged {
    let mut conn = connection(pool, worker, cluster, endpoint, fresh_only).await.map_err(|failure| Failed {
        failure,
        connected: false,
        reused: false,
        batch_lost: false,
    })?;
    let sent = send_request(down, &mut conn, head, body, cluster, endpoint, settings).await;
    let response = match sent {
        Ok(()) => read_response_head(&mut down.body, &mut conn, head, cluster, body).await,
        Err(f) => Err(f),
    };
    match response {
        Ok(resp) => Ok((Source::Conn(conn), resp)),
        Err(failure) => Err(Failed { failure, connected: true, reused: conn.reused, batch_lost: false }),
    }
}

/// What one try told about an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    /// A response below 500.
    Success,
    /// A 5xx response.
    ServerError,
    /// No usable response: connect failure, reset, timeout, invalid response.
    GatewayFailure,
}

/// Outlier detection: counts consecutive failures per worker and ejects the endpoint when a threshold is
/// reached, unless that would eject more than `max_ejected_percent` of the cluster.
pub(crate) fn observe(cluster: &Cluster, endpoint: &Endpoint, worker: usize, what: Observed) {
    let od = &cluster.settings.outlier;
    let local = slot(&endpoint.outlier, worker);
    let bump = |c: &std::sync::atomic::AtomicU32| {
        let n = c.load(Ordering::Relaxed) + 1;
        c.store(n, Ordering::Relaxed);
        n
    };
    let reset = |c: &std::sync::atomic::AtomicU32| {
        if c.load(Ordering::Relaxed) != 0 {
            c.store(0, Ordering::Relaxed);
        }
    };
    let tripped = match what {
        Observed::Success => {
            reset(&local.consecutive_failures);
            reset(&local.consecutive_5xx);
            false
        }
        Observed::ServerError => {
            reset(&local.consecutive_failures);
            let n = bump(&local.consecutive_5xx);
            od.consecutive_5xx > 0 && n >= od.consecutive_5xx
        }
        Observed::GatewayFailure => {
            slot(&endpoint.stats.slots, worker).failures.inc();
            let f = bump(&local.consecutive_failures);
            let s = bump(&local.consecutive_5xx);
            (od.consecutive_failures > 0 && f >= od.consecutive_failures)
                || (od.consecutive_5xx > 0 && s >= od.consecutive_5xx)
        }
    };
    if !tripped {
        return;
    }
    reset(&local.consecutive_failures);
    reset(&local.consecutive_5xx);
    let now = now_ms();
    if endpoint.health.is_ejected(now) {
        return;
    }
    let total = cluster.endpoints.len();
    let ejected = cluster.endpoints.iter().filter(|e| e.health.is_ejected(now)).count();
    let allowed = if od.max_ejected_percent == 0 { 0 } else { (total * od.max_ejected_percent as usize / 100).max(1) };
    if ejected >= allowed {
        return;
    }
    let Some(time) = endpoint.health.eject(od) else { return };
    slot(&cluster.stats.slots, worker).ejections.inc();
    tracing::warn!(cluster = %cluster.name, endpoint = %endpoint.configured, ?what, "endpoint ejected for {time:?}");
}

/// Writes the request head (with a body in hand, in the same write) and streams a body still at the client.
async fn send_request(
    down: &mut Downstream<'_>,
    conn: &mut UpstreamConn,
    head: &RequestHead,
    body: &mut ReqBody,
    cluster: &Cluster,
    endpoint: &Endpoint,
    settings: &ListenerSettings,
) -> Result<(), UpstreamFailure> {
    let out = &mut *down.out;
    out.clear();
    crate::buffers::reserve_vec(out, 1024);
    write_request_head(out, head, cluster, endpoint, down.facts);
    match body {
        ReqBody::InHand(bytes) if bytes.len() <= SENT_WITH_HEAD => out.extend_from_slice(bytes),
        _ => {}
    }
    let send_timeout = cluster.settings.send_timeout;
    if write_timed(&mut conn.io, out, send_timeout).await.is_err() {
        return Err(UpstreamFailure {
            retry_fresh: true,
            ..UpstreamFailure::upstream(502, "upstream closed the connection")
        });
    }
    out.clear();
    let rest = match body {
        ReqBody::Streaming(framing) => Rest::Stream(*framing),
        ReqBody::Spooled(spooled) => Rest::File(spooled.clone()),
        ReqBody::InHand(bytes) if bytes.len() > SENT_WITH_HEAD => Rest::Memory(bytes.clone()),
        ReqBody::InHand(_) | ReqBody::Sent => return Ok(()),
    };
    if matches!(rest, Rest::Stream(_)) && head.expect_continue && !head.http10 {
        if let BodySource::Connection { io, .. } = &mut down.body {
            let _ = write_timed(*io, b"HTTP/1.1 100 Continue\r\n\r\n", settings.send_timeout).await;
        }
    }
    let timeouts = (settings.body_pace.checked(head), send_timeout);
    // An upstream may answer before the body is complete (413, 401) and stop reading it: watch for any byte
    // (or a close) from it while relaying, rather than waiting for the send timeout.
    let relayed = match &mut conn.io {
        Stream::Tcp(tcp) => {
            let (upstream_read, mut upstream_write) = tcp.split();
            let relay = send_rest(&mut down.body, &rest, &mut upstream_write, timeouts, down.out);
            // `peek` consumes nothing: the response is read afterwards as usual.
            let mut probe = [0u8; 1];
            let answered_early = upstream_read.as_ref().peek(&mut probe);
            tokio::select! {
                r = relay => r,
                _ = answered_early => Err(RelayError::Dest),
            }
        }
        tls => {
            // Over TLS a peek would also see records that carry no data (session tickets): read for real, into
            // the buffer the response head is parsed from.
            let (mut upstream_read, mut upstream_write) = tokio::io::split(tls);
            let relay = send_rest(&mut down.body, &rest, &mut upstream_write, timeouts, down.out);
            conn.buf.reserve(4096);
            let answered_early = upstream_read.read_buf(&mut conn.buf);
            tokio::select! {
                r = relay => r,
                _ = answered_early => Err(RelayError::Dest),
            }
        }
    };
    match relayed {
        Ok(_) => {
            if let Rest::Stream(_) = rest {
                *body = ReqBody::Sent;
            }
            Ok(())
        }
        // The client stopped sending or sent a broken body: the upstream request is abandoned (its connection
        // dropped, so the upstream never sees a complete request) and the client told why, if still there.
        Err(RelayError::Source(fault)) => Err(match fault.answer() {
            None => UpstreamFailure::client_gone(),
            Some((status, reason)) => UpstreamFailure::client(status, reason),
        }),
        Err(RelayError::Dest) => {
            // The upstream answered early (413, 401) or stopped reading: let the caller read its answer. The
            // rest of the body was not sent, so the connection cannot carry another request.
            conn.request_unfinished = true;
            Ok(())
        }
    }
}

/// A body in hand up to this size leaves in one write with its head; a larger one (a route's buffering
/// memory may be large) is written after it, watched for an early answer like a streamed one.
const SENT_WITH_HEAD: usize = 64 * 1024;

/// The part of a request body that follows its head in writes of its own.
enum Rest {
    /// In memory.
    Memory(Bytes),
    /// Streamed from the client as it comes.
    Stream(BodyFraming),
    /// Read back from its temporary file.
    File(crate::request_buffer::SpooledBody),
}

async fn send_rest<W: tokio::io::AsyncWrite + Unpin>(
    source: &mut BodySource<'_>,
    rest: &Rest,
    dst: &mut W,
    timeouts: (Pace, Duration),
    out: &mut Vec<u8>,
) -> Result<u64, RelayError> {
    match rest {
        Rest::Stream(framing) => relay_request_body(source, *framing, dst, timeouts, out).await,
        Rest::File(spooled) => spooled.send_to(dst, timeouts.1).await,
        Rest::Memory(bytes) => {
            write_timed(dst, bytes, timeouts.1).await.map_err(|_| RelayError::Dest)?;
            Ok(bytes.len() as u64)
        }
    }
}

/// Streams a request body from its source to the upstream, chunked when `framing` says so. A connection's
/// body is decoded with the request's framing; frames are read to their end (a `Length` is still enforced).
async fn relay_request_body<W: tokio::io::AsyncWrite + Unpin>(
    source: &mut BodySource<'_>,
    framing: BodyFraming,
    dst: &mut W,
    (mut pace, send_timeout): (Pace, Duration),
    out: &mut Vec<u8>,
) -> Result<u64, RelayError> {
    let out_chunked = framing == BodyFraming::Chunked;
    match source {
        BodySource::Connection { io, buf, .. } => {
            relay_body(*io, buf, framing, dst, out_chunked, &mut pace, send_timeout, out).await
        }
        BodySource::Frames { reader, buf, .. } => {
            let until_end = if out_chunked { BodyFraming::UntilClose } else { framing };
            relay_body(*reader, buf, until_end, dst, out_chunked, &mut pace, send_timeout, out).await
        }
        // A subrequest's body is in hand, never streamed.
        BodySource::Detached => Ok(0),
    }
}

/// The request head as forwarded: origin-form target, hop-by-hop headers removed, framing regenerated, the
/// `x-forwarded-*` and `via` headers added.
pub(crate) fn write_request_head(
    out: &mut Vec<u8>,
    head: &RequestHead,
    cluster: &Cluster,
    endpoint: &Endpoint,
    client: &ClientFacts,
) {
    out.extend_from_slice(head.method());
    out.push(b' ');
    out.extend_from_slice(head.origin_form());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let edits = head.edits.as_ref().map(|e| &e.headers).filter(|e| !e.is_empty());
    out.extend_from_slice(b"host: ");
    match (head.host(), edits.and_then(|e| e.appended_value("host"))) {
        (_, Some(set)) => out.extend_from_slice(set.as_bytes()),
        (Some(h), None) if cluster.settings.preserve_host => out.extend_from_slice(h),
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
                if edits.is_some_and(|e| e.drops(name)) {
                    continue;
                }
                // Only Portico may say which certificate a client presented.
                let reserved = &cluster.settings.reserved_headers;
                if !reserved.is_empty() && reserved.iter().any(|r| same_header_name(name, r.as_bytes())) {
                    continue;
                }
            }
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(edits) = edits {
        for (name, value) in edits.appended.iter().filter(|(n, _)| !n.eq_ignore_ascii_case("host")) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
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
    out.extend_from_slice(client.ip.as_bytes());
    out.extend_from_slice(if client.https {
        b"\r\nx-forwarded-proto: https\r\n"
    } else {
        b"\r\nx-forwarded-proto: http\r\n"
    });
    if let (Some(name), Some(subject)) = (&client.cert_header, &client.cert_subject) {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(subject.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
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
    out.extend_from_slice(match (client.http2, head.http10) {
        (true, _) => b"2 portico\r\n",
        (false, true) => b"1.0 portico\r\n",
        (false, false) => b"1.1 portico\r\n",
    });
    if head.upgrade_websocket {
        out.extend_from_slice(b"connection: upgrade\r\nupgrade: websocket\r\n");
    }
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

/// Decimal digits without the formatting machinery (this runs for most responses).
pub(crate) fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

pub(crate) async fn read_response_head(
    source: &mut BodySource<'_>,
    conn: &mut UpstreamConn,
    head: &RequestHead,
    cluster: &Cluster,
    body: &ReqBody,
) -> Result<(Bytes, ResponseHead), UpstreamFailure> {
    let deadline = Instant::now() + cluster.settings.response_header_timeout;
    let is_head = head.method() == b"HEAD";
    // Reading ahead from the client is only safe once its body is fully consumed.
    let watch_client = body.consumed();
    // A 1xx may not be sent to an HTTP/1.0 client (RFC 9110 15.2).
    let may_probe = !head.http10;
    let mut interim_seen = false;
    loop {
        match codec::parse_response(&conn.buf, is_head, MAX_RESPONSE_HEAD) {
            Err(reason) => {
                tracing::debug!(reason, "invalid upstream response");
                return Err(UpstreamFailure::upstream(502, "upstream sent an invalid response"));
            }
            Ok(Parsed::Complete(resp, used)) => {
                if resp.status == 101 {
                    // Only a WebSocket handshake may be answered with 101, and only by switching to WebSocket:
                    // anything else would have the proxy relay bytes it cannot frame.
                    if head.upgrade_websocket && resp.upgrades_to_websocket(&conn.buf) {
                        let bytes = conn.buf.split_to(used).freeze();
                        return Ok((bytes, resp));
                    }
                    return Err(UpstreamFailure::upstream(502, "upstream switched protocols unexpectedly"));
                }
                if resp.status < 200 {
                    // 100 Continue was answered by the proxy itself; the others (103 Early Hints) go on to
                    // the client (boxed: rare, and its state would enlarge every exchange's future).
                    let bytes = conn.buf.split_to(used);
                    if resp.status != 100 && Box::pin(source.interim(&bytes, &resp, head.http10)).await.is_err() {
                        return Err(UpstreamFailure::client_gone());
                    }
                    interim_seen = true;
                    continue;
                }
                let bytes = conn.buf.split_to(used).freeze();
                return Ok((bytes, resp));
            }
            Ok(Parsed::Partial) => {}
        }
        if conn.buf.capacity() - conn.buf.len() < 4096 {
            crate::buffers::reserve(&mut conn.buf, 16 * 1024);
        }
        let nothing_yet = conn.buf.is_empty() && !interim_seen;
        let read = tokio::select! {
            r = timeout_at(deadline, conn.io.read_buf(&mut conn.buf)) => r,
            seen = source.watch_client(PIPELINE_READ_AHEAD, may_probe), if watch_client => {
                // The probe is written here, outside the race: cut off halfway, it would spoil the answer.
                if seen == ClientSeen::Gone || !source.probe_client().await {
                    return Err(UpstreamFailure::client_gone());
                }
                continue;
            }
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) | Ok(Err(_)) => {
                let reason = if nothing_yet {
                    "upstream closed the connection before responding"
                } else {
                    "upstream closed the connection inside the response head"
                };
                // The upstream may have read the request before closing: replay only what is safe to repeat.
                return Err(UpstreamFailure {
                    retry_fresh: nothing_yet && head.is_idempotent(),
                    ..UpstreamFailure::upstream(502, reason)
                });
            }
            Err(_) => {
                return Err(UpstreamFailure {
                    timed_out: true,
                    ..UpstreamFailure::upstream(504, "upstream timed out before responding")
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits() {
        for n in [0u64, 7, 10, 99, 100, 4096, 1 << 40, u64::MAX] {
            let mut out = b"x".to_vec();
            push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }
}
