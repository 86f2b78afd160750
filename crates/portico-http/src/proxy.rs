//! One client connection: read request heads (strictly), route, pick an endpoint within the cluster's
//! breaker limits, forward over a pooled upstream connection, retry what may be retried, stream both bodies
//! with bounded buffers, and decide what may be kept alive. Every request ends in the route's counters and the
//! access log.

use crate::body::{BodySource, Downstream, ReqBody};
use crate::buffers;
pub(crate) use crate::client::Client;
use crate::client::{answer, end_response_head, reply, respond_error};
use crate::codec::{self, BodyFraming, HeadError, Known, Parsed, RequestHead, ResponseHead};
use crate::context::WorkerCtx;
use crate::forward::Answered;
use crate::intake::Intake;
use crate::outcome::{record, record_refused, upstream_outcome, Next, Outcome, Peer};
use crate::pipeline;
use crate::relay::{relay_body, write_timed, RelayError, SourceFault};
use crate::request_buffer::BufferFault;
use crate::snapshot::{Cluster, Endpoint, ListenerSettings, Snapshot};
use crate::stats::GaugeGuard;
use crate::subrequest::Clusters;
use crate::upstream::{self, push_u64, Observed, Source};
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use portico_core::idle::IdleConnections;
use portico_core::io::Stream;
use portico_core::stats::slot;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// Read buffer for a request head: large enough that a head and a small body usually arrive in one read.
/// Only connections with a request in progress hold it.
const HEAD_READ_BUFFER: usize = 16 * 1024;
/// How long closing a connection may wait to flush its last TLS records and close_notify.
const CLOSE_NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);
/// Empty lines tolerated before a request line.
const MAX_EMPTY_LINES: usize = 8;

pub async fn serve_connection(io: TcpStream, peer: SocketAddr, listener: Arc<str>, ctx: Rc<WorkerCtx>) {
    if !cfg!(target_os = "linux") {
        let _ = io.set_nodelay(true); // inherited from the listening socket on Linux
    }
    let mut facts = crate::body::ClientFacts {
        ip: crate::body::IpText::new(peer.ip()),
        https: false,
        http2: false,
        cert_header: None,
        cert_subject: None,
    };
    let (tls, counts) = match ctx.snapshot.load().listener(&listener) {
        Some(l) => (l.tls.clone().map(|t| (t, l.stats.clone())), l.counts_clients),
        None => (None, false),
    };
    // Counted from here until the connection ends, HTTP/2 included (a `limits` filter's connection cap).
    let _open = counts.then(|| crate::clients::Open::new(peer.ip()));
    let io = match tls {
        None => Stream::Tcp(io),
        // Boxed: the handshake's state is only needed once, not in every idle connection's future.
        Some((terminator, stats)) => match Box::pin(terminator.handshake(io, &stats, ctx.index)).await {
            Some(tls) => {
                facts.https = true;
                facts.cert_header = terminator.client_cert_header.clone();
                if facts.cert_header.is_some() {
                    facts.cert_subject = portico_core::tls::client_subject(tls.get_ref().1);
                }
                Stream::Tls(Box::new(tls))
            }
            None => return,
        },
    };
    if let Stream::Tls(tls) = &io {
        if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            // Boxed: an HTTP/1 connection's task should not carry the HTTP/2 server's state.
            Box::pin(crate::http2::serve(io, Bytes::new(), peer, facts, listener, ctx)).await;
            return;
        }
    }
    let send_timeout = ctx.snapshot.load().listener(&listener).map_or(Duration::from_secs(60), |l| l.send_timeout);
    let client = Client {
        io,
        buf: BytesMut::new(),
        peer,
        facts,
        out: Vec::new(),
        response_started: false,
        filters: None,
        send_timeout,
        end: crate::body::ClientEnd::Open,
        pipeline: None,
    };
    serve_http1(client, listener, ctx).await;
}

/// Serves HTTP/1 requests on `client` until it closes, idles out or the process shuts down. A plain
/// connection that opens with the HTTP/2 preface is handed to the HTTP/2 server instead.
pub(crate) async fn serve_http1(mut client: Client, listener: Arc<str>, ctx: Rc<WorkerCtx>) {
    let mut first = true;
    loop {
        // A request read ahead with the one before it (pipelined by the client) comes first, as it was routed.
        // Taken in a branch without an await: an idle connection's task does not hold room for one.
        let queued = client.pipeline.as_ref().is_some_and(|p| !p.is_empty());
        let (mut head, front, snapshot, started) = match queued {
            true => {
                let Some(ahead) = client.pipeline.as_mut().and_then(|p| p.next_request()) else {
                    return;
                };
                (ahead.head, Some(ahead.front), ahead.snapshot, ahead.started)
            }
            false => {
                if let Some(pipeline) = client.pipeline.as_mut() {
                    pipeline.read_from_socket();
                }
                let waiting = ctx.snapshot.load_full();
                let Some(settings) = waiting.listener(&listener) else {
                    return;
                };
                let head = match read_head(&mut client, settings, first, &ctx.core.idle).await {
                    Ok(Some(Arrived::Request(head))) => head,
                    Ok(Some(Arrived::Http2)) => {
                        let Client { io, buf, peer, facts, .. } = client;
                        Box::pin(crate::http2::serve(io, buf.freeze(), peer, facts, listener, ctx)).await;
                        return;
                    }
                    Ok(None) => return,
                    Err(e) => {
                        // Boxed, like every await but the wait for a head: the task's size is that of its
                        // largest state, and an idle keep-alive connection should pay only for the wait.
                        Box::pin(refuse(client, e, (&waiting, settings.index), &ctx)).await;
                        return;
                    }
                };
                // Load again: a connection that idled through a reload serves its next request on the new config.
                (head, None, ctx.snapshot.load_full(), std::time::Instant::now())
            }
        };
        first = false;
        let Some(settings) = snapshot.listener(&listener) else {
            return;
        };
        let front = match front {
            Some(front) => front,
            None => crate::phases::front(&mut head, &snapshot, settings, client.facts.https, client.peer.ip()),
        };
        let route = front.route().and_then(|i| snapshot.router.get(i));
        client.filters = route.and_then(|r| r.filters.clone());
        client.send_timeout = settings.send_timeout;
        client.response_started = false;
        // Boxed: the request's state machine is large and only needed while a request runs. A panic in it (a
        // bug) costs this request and this connection, never the worker: it is answered 500 when nothing was
        // sent yet, counted and logged.
        let handled = AssertUnwindSafe(handle_request(&mut client, &mut head, front, &snapshot, settings, &ctx));
        let outcome = match Box::pin(handled.catch_unwind()).await {
            Ok(outcome) => outcome,
            Err(panic) => {
                slot(&settings.stats.slots, ctx.index).panics.inc();
                tracing::error!(
                    listener = %listener,
                    client = %client.peer,
                    request = %String::from_utf8_lossy(&[head.method(), b" ", head.target()].concat()),
                    "request handling panicked at {}: {}; the connection is closed",
                    portico_core::panic::last_panic_location(),
                    portico_core::panic::panic_message(panic.as_ref())
                );
                let bytes = match client.response_started {
                    true => 0,
                    false => answer(&mut client, &head, 500, "internal error", false).await.bytes,
                };
                Outcome::local(Next::Close, 500, bytes)
            }
        };
        let from = Peer { client: client.peer.ip(), http2: client.facts.http2, listener: settings.index };
        record(&ctx, &snapshot, route, &head, from, &outcome, started.elapsed());
        if outcome.next == Next::Close || *ctx.shutdown.borrow() {
            if !head.keep_alive && outcome.status < 400 && client.buf.is_empty() {
                // The client asked to close after this request and has sent nothing more (a client that sent
                // `Connection: close` must not send another request): a plain close sends a FIN. Lingering
                // would cost a shutdown, a wait and a read per connection for nothing (nginx does the same).
                // TLS still says close_notify, so the client can tell a complete response from a cut one.
                if !matches!(client.io, Stream::Tcp(_)) {
                    let _ = tokio::time::timeout(CLOSE_NOTIFY_TIMEOUT, client.io.shutdown()).await;
                }
                return;
            }
            Box::pin(linger_close(client.io)).await;
            return;
        }
    }
}

/// Answers a head that could not be parsed, counts and logs it, and closes.
async fn refuse(mut client: Client, e: HeadError, (snapshot, listener): (&Snapshot, usize), ctx: &WorkerCtx) {
    // A refused head still counts (as unrouted, and for its listener) and is logged, with what is known of it.
    let bytes = respond_error(&mut client, e.status, e.reason, true).await.unwrap_or(0);
    let from = Peer { client: client.peer.ip(), http2: client.facts.http2, listener };
    record_refused(ctx, snapshot, from, e.status, bytes);
    linger_close(client.io).await;
}

/// What opened a request.
enum Arrived {
    Request(RequestHead),
    /// The HTTP/2 connection preface, on a plain connection's first bytes.
    Http2,
}

/// How long a new connection may take to send its first request once the process shuts down.
const FIRST_REQUEST_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads one request head. `Ok(None)`: the connection ended cleanly (client closed, idle timeout, shutdown).
async fn read_head(
    client: &mut Client,
    settings: &ListenerSettings,
    first: bool,
    idle: &IdleConnections,
) -> Result<Option<Arrived>, HeadError> {
    // Prior-knowledge HTTP/2 ("h2c"): only as a plain connection's first bytes.
    let h2c = first && settings.http2.is_some() && matches!(client.io, Stream::Tcp(_));
    // A new connection must send its head within header_read; a kept-alive one may idle for keepalive first.
    // Empty lines before a request (RFC 9112 2.2) are dropped as they arrive and do not start the head clock;
    // a stream of them is cut off so it cannot fill memory.
    let mut empty_lines = 0usize;
    let mut started = false;
    let mut deadline = Instant::now() + if first { settings.header_read_timeout } else { settings.keepalive_timeout };
    // A `limits` filter's cap on slow connections: when this head turns slow, and the count it then holds.
    let mut slow_at: Option<Instant> = None;
    let mut _slow: Option<crate::clients::Slow> = None;
    let mut shutdown_seen = false;
    loop {
        while client.buf.starts_with(b"\r\n") {
            client.buf.advance(2);
            empty_lines += 1;
            if empty_lines > MAX_EMPTY_LINES {
                return Err(HeadError { status: 400, reason: "too many empty lines before the request" });
            }
        }
        if !client.buf.is_empty() && client.buf[..] != *b"\r" {
            if !started {
                started = true;
                deadline = Instant::now() + settings.header_read_timeout;
                slow_at = settings.slow_cap.as_ref().map(|cap| Instant::now() + cap.after);
            }
            if h2c && client.buf.starts_with(crate::http2::PREFACE) {
                return Ok(Some(Arrived::Http2));
            }
            let maybe_preface = h2c && crate::http2::PREFACE.starts_with(&client.buf);
            if !maybe_preface {
                match codec::parse_request(&client.buf, &settings.limits)? {
                    Parsed::Complete(head, used) => {
                        return Ok(Some(Arrived::Request(codec::take_request(&mut client.buf, head, used))))
                    }
                    Parsed::Partial => {}
                }
            }
        }
        if !started && client.buf.is_empty() {
            // Between requests: give the buffers back and wait for readability without them, so an idle
            // keep-alive connection costs little memory (nginx does the same). They go to the thread's cache of
            // spare buffers and come back from it when the next request arrives.
            if client.buf.capacity() > 0 {
                buffers::give_back(&mut client.buf);
                buffers::give_back_vec(&mut client.out);
            }
            // On shutdown a kept-alive connection idle between requests is closed (its client sends the next
            // request on a new one), but a new connection gets a moment for its first request, which is answered:
            // its client has not heard from us and would take a close for a failure. A connection that sends
            // nothing (a preconnect, a probe) does not hold the drain longer than that moment.
            // A kept-alive connection waits in the worker's idle list: at the connection limit the
            // longest-idle one is closed for a new client. A new connection is not: its client has not heard
            // from us yet.
            // The worker's shutdown comes through the same ticket (a new connection's is not a candidate for
            // eviction): for a kept-alive connection both mean closing.
            let ticket = if first { idle.enter_new() } else { idle.enter() };
            let told = async {
                match shutdown_seen {
                    false => ticket.evicted().await,
                    true => std::future::pending().await,
                }
            };
            tokio::select! {
                // In this order: a request that has arrived is served even if the place was wanted.
                biased;
                r = timeout_at(deadline, client.io.readable()) => if r.is_err() { return Ok(None) },
                () = told => {
                    if !first {
                        return Ok(None);
                    }
                    shutdown_seen = true;
                    deadline = deadline.min(Instant::now() + FIRST_REQUEST_AT_SHUTDOWN);
                    continue;
                }
            }
        }
        if client.buf.capacity() - client.buf.len() < 1024 {
            buffers::reserve(&mut client.buf, HEAD_READ_BUFFER);
        }
        let read = tokio::select! {
            // In this order: the read is almost always ready (readability was just seen), and the shutdown
            // ticket below is then never even taken.
            biased;
            r = timeout_at(deadline, client.io.read_buf(&mut client.buf)) => r,
            () = tokio::time::sleep_until(slow_at.unwrap_or(deadline)), if slow_at.is_some() => {
                slow_at = None;
                if let Some(cap) = &settings.slow_cap {
                    let (slow, count) = crate::clients::Slow::new(client.peer.ip());
                    _slow = Some(slow);
                    if count > cap.max {
                        let denial = crate::filters::Denial::TooManySlowConnections;
                        cap.denials.record(denial, cap.shadow, client.peer.ip().to_canonical(), None);
                        if !cap.shadow {
                            return Err(HeadError { status: 408, reason: "too many slow connections from this address" });
                        }
                    }
                }
                continue;
            }
            () = async {
                // Only told of the shutdown (never closed to make room) while it reads before a head starts.
                let ticket = idle.enter_new();
                ticket.evicted().await
            }, if !started && !shutdown_seen => {
                if !first {
                    return Ok(None);
                }
                shutdown_seen = true;
                deadline = deadline.min(Instant::now() + FIRST_REQUEST_AT_SHUTDOWN);
                continue;
            }
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

async fn handle_request(
    client: &mut Client,
    head: &mut RequestHead,
    front: crate::phases::Front,
    snapshot: &Arc<Snapshot>,
    settings: &ListenerSettings,
    ctx: &Rc<WorkerCtx>,
) -> Outcome {
    use crate::phases::Front;
    #[cfg(debug_assertions)]
    crate::context::debug_panic_hook(head, ctx);
    let front = match front {
        Front::Gated { route, captured } => {
            let info = crate::handler::ClientInfo { addr: client.peer, https: client.facts.https, http2: false };
            let upstreams = Clusters::upstreams(ctx.clone(), snapshot.clone(), &settings.name, client.peer.ip());
            let gates = crate::phases::pass_gates(head, snapshot, (route, captured), info, &upstreams);
            Box::pin(gates).await
        }
        front => front,
    };
    let (cluster, cluster_index, route) = match front {
        Front::Cluster { cluster, route } => (&snapshot.clusters[cluster], cluster, route),
        Front::Answer { response, .. } => {
            let body_done = discard_body(client, head) == Next::KeepAlive;
            return reply(client, head, &response, body_done).await;
        }
        Front::NoRoute => {
            let body_done = discard_body(client, head) == Next::KeepAlive;
            return answer(client, head, 404, "no route matches this request", body_done).await;
        }
        Front::BadPath(e) => return answer(client, head, e.status, e.reason, false).await,
        // (`pass_gates` never gives another `Gated`.)
        Front::Gated { .. } => return answer(client, head, 500, "function filters did not decide", false).await,
        Front::Handler { handler, params, .. } => {
            let listener = (settings, snapshot);
            return Box::pin(crate::serve_handler::serve_h1(client, head, &handler, params, listener, ctx)).await;
        }
        Front::WebSocket { endpoint, .. } => {
            return Box::pin(crate::websocket::serve_h1(client, head, endpoint, settings, ctx)).await;
        }
    };
    if head.body == BodyFraming::Chunked {
        // Catch a broken chunked body that already arrived before anything goes upstream.
        if let Some(reason) = codec::chunked_prefix_error(&client.buf) {
            let bytes = respond_error(client, 400, reason, true).await.unwrap_or(0);
            return Outcome::local(Next::Close, 400, bytes);
        }
    }
    // Before the breaker counts the request: a body still arriving holds nothing of the cluster's. Request
    // buffering is for HTTP/1 clusters, whose connections a slow body would hold: an HTTP/2 cluster's streams
    // share connections (and gRPC streams must flow both ways at once).
    let buffering = match head.body {
        BodyFraming::None => None, // most requests: nothing to look up
        _ => snapshot.router.get(route).and_then(|r| r.buffering.as_deref()).filter(|_| !cluster.settings.http2),
    };
    let json_buffering: crate::request_buffer::BufferPolicy;
    let buffering = match crate::body_check::BodyCheck::buffering(head, buffering) {
        Some(policy) => {
            json_buffering = policy;
            Some(&json_buffering)
        }
        None => buffering,
    };
    let stats = slot(&settings.stats.slots, ctx.index);
    let taken = match Intake::of(head.body, buffering) {
        Ok(intake) => match intake.in_hand(&mut client.buf, stats) {
            Some(body) => Ok(body),
            // Boxed: only requests whose body is still to come pay for the larger future.
            None => Box::pin(take_body(client, head, intake, settings, stats)).await,
        }
        .and_then(|body| intake.check_whole(body, head)),
        Err(fault) => Err(fault),
    };
    let mut body = match taken {
        Ok(body) => body,
        Err(fault) => return refuse_body(client, fault).await,
    };
    let counters = slot(&cluster.stats.slots, ctx.index);
    let limits = &cluster.settings;
    if counters.requests.get() >= limits.max_requests_per_worker {
        counters.breaker_rejections.inc();
        let body_done = body.consumed(); // a body in hand has left the connection's buffer already
        let reason = "too many requests in flight to the cluster (circuit breaker)";
        let mut outcome = answer(client, head, 503, reason, body_done).await;
        outcome.reason = Some(reason);
        return outcome;
    }
    counters.requests.add(1);
    let _request = GaugeGuard(&counters.requests, 1);

    if cluster.settings.http2 {
        return Box::pin(crate::forward_h2::from_http1(client, head, cluster, body, settings, ctx)).await;
    }
    if !client.buf.is_empty() && head.keep_alive && pipeline::eligible(head, cluster) {
        read_ahead(client, snapshot, settings, cluster_index);
    }
    let mut down = Downstream {
        facts: &client.facts,
        out: &mut client.out,
        body: BodySource::Connection {
            io: &mut client.io,
            buf: &mut client.buf,
            end: &mut client.end,
            send_timeout: client.send_timeout,
        },
    };
    let (peer, pipeline) = (client.peer.ip(), client.pipeline.as_deref_mut());
    let forwarded =
        crate::forward::forward_http1(&mut down, head, &mut body, cluster, peer, settings, ctx, pipeline).await;
    let answered = match forwarded {
        Ok(answered) => answered,
        Err(failed) => {
            let keep = body.consumed() && client.more_requests_possible();
            let mut outcome = match failed.client_gone {
                true => Outcome::local(Next::Close, 499, 0),
                false => answer(client, head, failed.status, failed.reason, keep).await,
            };
            outcome.upstream = failed.upstream;
            outcome.upstream_time = failed.upstream_time;
            outcome.retries = failed.retries;
            outcome.reason = Some(failed.reason);
            return outcome;
        }
    };
    let Answered { answer: (source, resp), endpoint, set_cookie, started, retrying, inflight, .. } = answered;
    let status = resp.1.status;
    let (next, bytes) = if status == 101 {
        // A WebSocket handshake the upstream accepted: the connection becomes a tunnel until it closes.
        match source {
            Source::Conn(conn) => (Next::Close, crate::tunnel::relay(client, conn, resp, cluster, settings, ctx).await),
            Source::Buffered(_) => (Next::Close, 0), // upgrades are never pipelined
        }
    } else {
        // The request body may still be partly unread when the upstream answered early.
        let request_done = body.consumed();
        forward_response(client, source, resp, head, cluster, endpoint, set_cookie, request_done, settings, ctx).await
    };
    drop(inflight);
    upstream_outcome(endpoint, ctx.index, (next, status, bytes), started, retrying.count())
}

/// Takes the requests the client already sent behind the current one, so that they can share its upstream
/// write (`pool.pipeline_depth`): complete heads in the buffer (none is waited for), each routed now, up to the
/// depth, while they could join: bodiless, kept alive, to the same cluster. They wait in `client.pipeline` and
/// are served from there in order; the first that cannot join is the last taken. A head with a body is not
/// taken (its body follows it in the buffer), nor one that does not parse (it is answered in its turn).
fn read_ahead(client: &mut Client, snapshot: &Arc<Snapshot>, settings: &ListenerSettings, cluster_index: usize) {
    if client.pipeline.as_ref().is_some_and(|p| !p.is_empty()) {
        return; // the requests read ahead before are served first
    }
    let cluster = &snapshot.clusters[cluster_index];
    let started = std::time::Instant::now();
    for _ in 1..cluster.settings.pipeline_depth {
        let Ok(Parsed::Complete(parsed, used)) = codec::parse_request(&client.buf, &settings.limits) else {
            return;
        };
        if parsed.body != BodyFraming::None {
            return;
        }
        let mut head = codec::take_request(&mut client.buf, parsed, used);
        let front = crate::phases::front(&mut head, snapshot, settings, client.facts.https, client.peer.ip());
        let joins = matches!(front, crate::phases::Front::Cluster { cluster, .. } if cluster == cluster_index)
            && head.keep_alive
            && pipeline::eligible(&head, cluster);
        let peer = client.peer.ip();
        let pipeline = client.pipeline.get_or_insert_with(|| Box::new(pipeline::ClientPipeline::new(peer)));
        pipeline.push(head, front, snapshot.clone(), started);
        if !joins {
            return;
        }
    }
}

/// The request body as it goes upstream (see `Intake`), `Expect: 100-continue` answered when it must be read.
async fn take_body(
    client: &mut Client,
    head: &mut RequestHead,
    intake: Intake<'_>,
    settings: &ListenerSettings,
    stats: &portico_core::stats::ListenerSlot,
) -> Result<ReqBody, BufferFault> {
    if intake.reads(client.buf.len()) && head.expect_continue && !head.http10 {
        let continue_line = b"HTTP/1.1 100 Continue\r\n\r\n";
        let sent = write_timed(&mut client.io, continue_line, settings.send_timeout).await;
        sent.map_err(|_| BufferFault::Source(SourceFault::Closed))?;
    }
    let reading = (head.body, settings.body_pace.checked(head));
    intake.take(&mut client.io, &mut client.buf, head, reading, stats).await
}

/// Answers a request whose body failed as `fault` said (nothing, when the client left), and closes.
async fn refuse_body(client: &mut Client, fault: BufferFault) -> Outcome {
    match fault.answer() {
        None => Outcome::local(Next::Close, 499, 0),
        Some((status, reason)) => {
            let bytes = respond_error(client, status, reason, true).await;
            Outcome::local(Next::Close, status, bytes.unwrap_or(0))
        }
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

#[allow(clippy::too_many_arguments)]
async fn forward_response(
    client: &mut Client,
    mut source: Source,
    (resp_bytes, resp): (Bytes, ResponseHead),
    head: &RequestHead,
    cluster: &Cluster,
    endpoint: &Endpoint,
    set_cookie: bool,
    request_done: bool,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> (Next, u64) {
    // A close-delimited or chunked body goes to an HTTP/1.0 client as-is, ended by closing.
    let to_client_chunked = !head.http10 && matches!(resp.body, BodyFraming::Chunked | BodyFraming::UntilClose);
    let ends_by_close = head.http10 && matches!(resp.body, BodyFraming::Chunked | BodyFraming::UntilClose);
    let keep_alive =
        head.keep_alive && request_done && !ends_by_close && client.more_requests_possible() && !*ctx.shutdown.borrow();
    if resp.other_codings.is_some() && head.http10 {
        // HTTP/1.0 has no Transfer-Encoding: the body cannot be labelled, and Portico does not decode it.
        let bytes =
            respond_error(client, 502, "upstream used a transfer coding an HTTP/1.0 client cannot receive", true)
                .await
                .unwrap_or(0);
        return (Next::Close, bytes);
    }

    if crate::serve_handler::wraps_proxied(client, head, &resp) {
        let resp = (resp_bytes, resp);
        let wrapped = crate::serve_handler::forward_wrapped(
            client,
            source,
            resp,
            head,
            cluster,
            endpoint,
            set_cookie,
            request_done,
            settings,
            ctx,
        );
        return Box::pin(wrapped).await;
    }
    let edits = client.response_edits(head, resp.status);
    client.response_started = true;
    let out = &mut client.out;
    out.clear();
    buffers::reserve_vec(out, 1024);
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
            _ => {
                (resp.connection.is_empty() || !resp.named_by_connection(&resp_bytes, name))
                    && !edits.as_ref().is_some_and(|e| e.drops(name))
            }
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
        _ if to_client_chunked => match &resp.other_codings {
            Some(codings) => {
                out.extend_from_slice(b"transfer-encoding: ");
                out.extend_from_slice(codings.as_bytes());
                out.extend_from_slice(b", chunked\r\n");
            }
            None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        },
        _ => {}
    }
    if let Some(edits) = &edits {
        edits.write_appended(out);
    }
    end_response_head(out, cluster, endpoint, (set_cookie, resp.dated), keep_alive, head.http10);
    // The head stays in `client.out`: relay_body sends it with the first body bytes.
    let (mut pace, send_timeout) = (crate::relay::Pace::idle(cluster.settings.read_timeout), settings.send_timeout);
    let relayed = match &mut source {
        Source::Conn(conn) => {
            relay_body(
                &mut conn.io,
                &mut conn.buf,
                resp.body,
                &mut client.io,
                to_client_chunked,
                &mut pace,
                send_timeout,
                &mut client.out,
            )
            .await
        }
        // All of it is buffered: the source is never read.
        Source::Buffered(body) => {
            let mut nothing = tokio::io::empty();
            let (to, chunked) = (&mut client.io, to_client_chunked);
            relay_body(&mut nothing, body, resp.body, to, chunked, &mut pace, send_timeout, &mut client.out).await
        }
    };
    match relayed {
        Ok(bytes) => {
            // Bytes after the response belong to the next response of this client's batch, if one follows;
            // otherwise the upstream sent something nobody asked for and the connection is not reused.
            if let Source::Conn(conn) = source {
                if resp.reusable && request_done && (conn.buf.is_empty() || conn.has_followers()) {
                    let pipeline = client.pipeline.as_deref_mut();
                    pipeline::release(&ctx.pool, pipeline, cluster, endpoint, conn, resp.body == BodyFraming::None);
                }
            }
            (if keep_alive { Next::KeepAlive } else { Next::Close }, bytes)
        }
        Err(e) => {
            if let RelayError::Source(fault) = e {
                // A reset or timeout inside the body is the upstream's failure too.
                upstream::observe(cluster, endpoint, ctx.index, Observed::GatewayFailure);
                tracing::debug!(endpoint = %endpoint.addr, ?fault, "upstream response body failed");
            }
            // The client has an incomplete response: closing is the only honest signal left.
            (Next::Close, 0)
        }
    }
}

/// Closes after an answer without losing it: half-close, then drain what the client still sends for a
/// moment, so the kernel does not reset the connection (and discard the answer) over unread bytes.
async fn linger_close(mut io: Stream) {
    // Bounded: on TLS the shutdown first flushes what the session still holds, to a client that may never
    // read it.
    let _ = tokio::time::timeout(CLOSE_NOTIFY_TIMEOUT, io.shutdown()).await;
    // On the heap: a 4 KiB array here would sit in every idle connection's future.
    let mut sink = vec![0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut drained = 0usize;
    while drained < 256 * 1024 {
        match timeout_at(deadline, io.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}
