//! Requests for `protocol: h2` clusters from HTTP/2 clients: forwarded stream to stream, frames and trailers
//! untouched, without the HTTP/1 engine in between (HTTP/1 has no way to carry trailers, and gRPC needs them).
//! Routing, balancing, the breaker, outlier detection, retries of connections that could not be opened, the
//! counters and the access log work as they do for HTTP/1; the request is recorded when its response body
//! ends.

use crate::balancer::{NoPick, Pick, PickInput};
use crate::body::ReqBody;
use crate::client::{answer, Client};
use crate::codec::Known;
use crate::codec::{self, Parsed, RequestHead};
use crate::context::Connection;
use crate::context::WorkerCtx;
use crate::forward::{another_endpoint, InflightGuard};
use crate::outcome::{record, upstream_outcome, Next, Outcome};
use crate::relay::{relay_body, write_timed, RelayError};
use crate::response_body::{local, Finish, ProxyBody, Recorded};
use crate::retry::{may_retry, RetryGauge};
use crate::snapshot::ListenerSettings;
use crate::snapshot::{Cluster, Snapshot};
use crate::stats::{class_index, slot};
use crate::upstream::push_u64;
use crate::upstream::{observe, Fault, Observed, UpstreamFailure};
use crate::upstream_h2::{BoxError, UpBody};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2::SendRequest;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// The request head as the HTTP/1 side sees it (for routing, balancing and the log): the same strict parser
/// and limits, fed with the HTTP/2 request's fields.
pub(crate) fn head_of(req: &Request<Incoming>, limits: &codec::HeadLimits) -> Result<RequestHead, &'static str> {
    let mut text = Vec::with_capacity(512);
    text.extend_from_slice(req.method().as_str().as_bytes());
    text.push(b' ');
    text.extend_from_slice(req.uri().path_and_query().map_or("/", |p| p.as_str()).as_bytes());
    text.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    match (req.uri().authority(), req.headers().get(header::HOST)) {
        (Some(a), _) => text.extend_from_slice(a.as_str().as_bytes()),
        (None, Some(h)) => text.extend_from_slice(h.as_bytes()),
        (None, None) => return Err("request without :authority or host"),
    }
    text.extend_from_slice(b"\r\n");
    for (name, value) in req.headers() {
        if name == header::HOST {
            continue;
        }
        text.extend_from_slice(name.as_str().as_bytes());
        text.extend_from_slice(b": ");
        text.extend_from_slice(value.as_bytes());
        text.extend_from_slice(b"\r\n");
    }
    text.extend_from_slice(b"\r\n");
    let mut buf = bytes::BytesMut::from(&text[..]);
    match codec::parse_request(&buf, limits) {
        Ok(Parsed::Complete(head, used)) => Ok(codec::take_request(&mut buf, head, used)),
        Ok(Parsed::Partial) => Err("request head too large"),
        Err(e) => Err(e.reason),
    }
}

/// Forwards one request to the `protocol: h2` cluster of route `route`.
pub(crate) async fn forward(
    req: Request<Incoming>,
    head: RequestHead,
    snapshot: Arc<Snapshot>,
    route: usize,
    conn: &Connection,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let ctx = &conn.ctx;
    let worker = ctx.index;
    let Some(compiled) = snapshot.router.get(route) else {
        return local(StatusCode::NOT_FOUND, "no route matches this request");
    };
    let Some(cluster_index) = compiled.cluster() else {
        return local(StatusCode::NOT_FOUND, "no route matches this request");
    };
    let cluster = &snapshot.clusters[cluster_index];
    let counters = slot(&cluster.stats.slots, worker);
    let peer = conn.peer.ip();
    let fail = |status: u16, reason: &str, upstream: Option<SocketAddr>, retries: u32| {
        let outcome = Outcome { upstream, retries, ..Outcome::local(Next::KeepAlive, status, reason.len() as u64 + 1) };
        record(ctx, &snapshot, Some(compiled), &head, (peer, true), &outcome, started.elapsed());
        local(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), reason)
    };
    if counters.requests.get() >= cluster.settings.max_requests_per_worker {
        counters.breaker_rejections.inc();
        return fail(503, "too many requests in flight to the cluster (circuit breaker)", None, 0);
    }

    let mut retrying = RetryGauge::new(counters);
    let (pick, sender) = match connect_any(ctx, cluster, &head, peer, &mut retrying).await {
        Ok(connected) => connected,
        Err(NotConnected { failure, upstream }) => {
            return fail(failure.status, failure.reason, upstream, retrying.count())
        }
    };
    let endpoint = &cluster.endpoints[pick.index];
    let (mut parts, body) = req.into_parts();
    if let Err(reason) = crate::upstream_h2::prepare(&mut parts, &head, cluster, endpoint, &conn.facts) {
        return fail(400, reason, None, retrying.count());
    }
    // The response-head timeout starts when the request body has been sent (a client-streaming call may
    // send for a long time first).
    let sent = Arc::new(tokio::sync::Notify::new());
    let body: UpBody = Watched { body, sent: Some(sent.clone()) }.boxed_unsync();
    counters.requests.add(1);
    endpoint.begin(worker);
    // `Finish` takes the retries off the in-flight count when the response ends.
    let retries = retrying.disarm();
    let upstream_started = Instant::now();
    // From here the guard counts the request down and logs it, however it ends (a client that resets the
    // stream drops this future: 499).
    let mut finish = Finish {
        ctx: conn.ctx.clone(),
        snapshot: snapshot.clone(),
        route,
        cluster: cluster_index,
        endpoint: pick.index,
        head,
        peer,
        status: 499,
        bytes: 0,
        done: false,
        retries,
        started,
        upstream_started,
    };
    let req = Request::from_parts(parts, body);
    match crate::upstream_h2::exchange(ctx, sender, req, cluster, endpoint, Some(&sent)).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            observe(cluster, endpoint, worker, if status >= 500 { Observed::ServerError } else { Observed::Success });
            let (mut parts, body) = resp.into_parts();
            if pick.set_cookie {
                if let Ok(v) = HeaderValue::from_str(&cluster.balancer.cookie_for(endpoint)) {
                    parts.headers.append(header::SET_COOKIE, v);
                }
            }
            if let Some(chain) = &compiled.filters {
                crate::filters::response_edits(chain, &finish.head, status).apply(&mut parts.headers);
            }
            finish.status = status;
            let chain = compiled.filters.as_deref();
            let wrapping = chain.filter(|c| crate::filters::has_body_hooks(c)).map(|_| finish.head.clone());
            let recorded = Recorded { body, finish };
            let response = Response::from_parts(parts, ProxyBody::Forwarded(Box::new(recorded)));
            match wrapping {
                Some(head) => crate::serve_handler::wrap_h2(chain, &head, response),
                None => response,
            }
        }
        Err(failure) => {
            if failure.fault == Fault::Upstream {
                observe(cluster, endpoint, worker, Observed::GatewayFailure);
            }
            finish.status = failure.status;
            finish.bytes = failure.reason.len() as u64 + 1;
            local(StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_GATEWAY), failure.reason)
        }
    }
}

/// Why no connection could be had: the last failure and the last endpoint tried.
pub(crate) struct NotConnected {
    pub failure: UpstreamFailure,
    pub upstream: Option<SocketAddr>,
}

/// Picks an endpoint and gets a connection to it, trying others (within the retry policy) while connections
/// cannot be opened. Only this is retried: once sent, a streamed request cannot be sent again.
async fn connect_any(
    ctx: &WorkerCtx,
    cluster: &Cluster,
    head: &RequestHead,
    peer: IpAddr,
    retrying: &mut RetryGauge<'_>,
) -> Result<(Pick, SendRequest<UpBody>), NotConnected> {
    let worker = ctx.index;
    let counters = slot(&cluster.stats.slots, worker);
    let input = PickInput { req: head, client_ip: peer, worker };
    let policy = &cluster.settings.retries;
    let mut tried = Vec::new();
    let mut failure = UpstreamFailure::upstream(502, "no upstream endpoint could be reached");
    let mut upstream = None;
    loop {
        let pick = match cluster.balancer.pick(&cluster.endpoints, &input, &tried, cluster.settings.panic_mode) {
            Ok(p) => p,
            Err(NoPick::NoneHealthy) if tried.is_empty() => {
                counters.no_healthy_endpoint.inc();
                let failure = UpstreamFailure::breaker("no healthy upstream endpoint");
                return Err(NotConnected { failure: UpstreamFailure { status: 503, ..failure }, upstream });
            }
            Err(_) => return Err(NotConnected { failure, upstream }),
        };
        let endpoint = &cluster.endpoints[pick.index];
        upstream = Some(endpoint.addr);
        match crate::upstream_h2::sender(ctx, cluster, endpoint).await {
            Ok(sender) => return Ok((pick, sender)),
            Err(f) => {
                if f.fault == Fault::Upstream {
                    observe(cluster, endpoint, worker, Observed::GatewayFailure);
                }
                failure = f;
                tried.push(pick.index);
                if another_endpoint(cluster, &tried) && may_retry(retrying.count(), policy, counters) {
                    retrying.add();
                    continue;
                }
                return Err(NotConnected { failure, upstream });
            }
        }
    }
}

/// A request body that says when it has been sent in full.
struct Watched {
    body: Incoming,
    sent: Option<Arc<tokio::sync::Notify>>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            if let Some(sent) = this.sent.take() {
                sent.notify_one();
            }
        }
        polled.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request from an HTTP/1 client for a `protocol: h2` cluster: the head becomes an HTTP/2 request, a body
/// still streaming from the client is decoded and fed to the stream as it arrives, and the response goes back
/// as HTTP/1.1 (Content-Length when the upstream gave one, else chunked; trailers are dropped, HTTP/1 clients
/// have no use for them). An upstream that answers before the body is in (413, 401) is answered at once and
/// the connection closed after; so is the rare full-duplex exchange (an HTTP/1 client streaming up while the
/// upstream streams down), which HTTP/1 proxies cannot carry either.
pub(crate) async fn from_http1(
    client: &mut Client,
    head: &RequestHead,
    cluster: &Cluster,
    body: ReqBody,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> Outcome {
    let worker = ctx.index;
    let body_done = body.consumed();
    let (mut parts, ()) = Request::new(()).into_parts();
    let Ok(method) = Method::from_bytes(head.method()) else {
        return answer(client, head, 400, "invalid method", body_done).await;
    };
    parts.method = method;
    for (h, _) in &head.headers {
        let name = HeaderName::from_bytes(head.header_name(h));
        let value = HeaderValue::from_bytes(head.header_value(h));
        let (Ok(name), Ok(value)) = (name, value) else {
            return answer(client, head, 400, "a header cannot be sent over HTTP/2", body_done).await;
        };
        parts.headers.append(name, value);
    }
    let mut retrying = RetryGauge::new(slot(&cluster.stats.slots, worker));
    let (pick, sender) = match connect_any(ctx, cluster, head, client.peer.ip(), &mut retrying).await {
        Ok(connected) => connected,
        Err(NotConnected { failure, upstream }) => {
            let mut outcome = answer(client, head, failure.status, failure.reason, body_done).await;
            outcome.upstream = upstream;
            outcome.retries = retrying.count();
            return outcome;
        }
    };
    let endpoint = &cluster.endpoints[pick.index];
    if let Err(reason) = crate::upstream_h2::prepare(&mut parts, head, cluster, endpoint, &client.facts) {
        return answer(client, head, 400, reason, body_done).await;
    }
    endpoint.begin(worker);
    let _inflight = InflightGuard { endpoint, worker };
    let started = Instant::now();

    // `close`: the client's body was not read to its end, so its connection cannot carry another request.
    let (exchanged, close) = match body {
        ReqBody::InHand(bytes) => {
            let req = Request::from_parts(parts, Full::new(bytes).map_err(|never| match never {}).boxed_unsync());
            (crate::upstream_h2::exchange(ctx, sender, req, cluster, endpoint, None).await, false)
        }
        ReqBody::Sent => (Err(UpstreamFailure::upstream(502, "request body already sent")), true),
        ReqBody::Streaming(framing) => {
            if head.expect_continue && !head.http10 {
                let continued = write_timed(&mut client.io, b"HTTP/1.1 100 Continue\r\n\r\n", settings.send_timeout);
                if continued.await.is_err() {
                    return Outcome {
                        upstream: Some(endpoint.addr),
                        retries: retrying.count(),
                        ..Outcome::local(Next::Close, 499, 0)
                    };
                }
            }
            let (mut writer, reader) = tokio::io::duplex(64 * 1024);
            let complete = Arc::new(AtomicBool::new(false));
            let sent = Arc::new(tokio::sync::Notify::new());
            let body =
                PipeBody { reader, buf: bytes::BytesMut::new(), complete: complete.clone(), sent: Some(sent.clone()) };
            let req = Request::from_parts(parts, body.boxed_unsync());
            client.out.clear();
            let timeouts = (settings.body_read_timeout, cluster.settings.send_timeout);
            let pump = async {
                let relayed =
                    relay_body(&mut client.io, &mut client.buf, framing, &mut writer, false, timeouts, &mut client.out)
                        .await;
                // Only a body read to its end may end the stream cleanly; anything else resets it.
                complete.store(relayed.is_ok(), Ordering::Relaxed);
                drop(writer);
                relayed
            };
            let exchange = crate::upstream_h2::exchange(ctx, sender, req, cluster, endpoint, Some(&sent));
            let (mut pump, mut exchange) = (std::pin::pin!(pump), std::pin::pin!(exchange));
            tokio::select! {
                relayed = &mut pump => match relayed {
                    Ok(_) => (exchange.await, false),
                    Err(RelayError::Source(_)) => {
                        return Outcome { upstream: Some(endpoint.addr), retries: retrying.count(), ..Outcome::local(Next::Close, 499, 0) };
                    }
                    // The upstream stopped taking the body: its answer (or failure) is what the client gets.
                    Err(RelayError::Dest) => (exchange.await, true),
                },
                early = &mut exchange => (early, true),
            }
        }
    };
    let endpoint_slot = slot(&endpoint.stats.slots, worker);
    let resp = match exchanged {
        Ok(resp) => resp,
        Err(failure) => {
            if failure.fault == Fault::Upstream {
                observe(cluster, endpoint, worker, Observed::GatewayFailure);
            }
            endpoint_slot.by_class[class_index(failure.status)].inc();
            let mut outcome = answer(client, head, failure.status, failure.reason, !close).await;
            outcome.upstream = Some(endpoint.addr);
            outcome.upstream_time = Some(started.elapsed());
            outcome.retries = retrying.count();
            return outcome;
        }
    };
    let status = resp.status().as_u16();
    observe(cluster, endpoint, worker, if status >= 500 { Observed::ServerError } else { Observed::Success });
    let response = Upstream { resp, set_cookie: pick.set_cookie, close };
    let (next, bytes) = write_response(client, head, response, cluster, endpoint, settings, ctx).await;
    upstream_outcome(endpoint, worker, (next, status, bytes), started, retrying.count())
}

/// An HTTP/2 upstream's response on its way to an HTTP/1 client.
struct Upstream {
    resp: hyper::Response<Incoming>,
    set_cookie: bool,
    /// Close the client connection after it.
    close: bool,
}

/// Writes an HTTP/2 upstream's response to an HTTP/1 client; returns what the connection does next and the
/// body bytes sent.
#[allow(clippy::too_many_arguments)]
async fn write_response(
    client: &mut Client,
    head: &RequestHead,
    response: Upstream,
    cluster: &Cluster,
    endpoint: &crate::snapshot::Endpoint,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> (Next, u64) {
    let Upstream { resp, set_cookie, close } = response;
    let status = resp.status().as_u16();
    let (mut parts, mut body) = resp.into_parts();
    if let Some(edits) = client.response_edits(head, status) {
        edits.apply(&mut parts.headers);
    }
    let bodiless = head.method() == b"HEAD" || status == 204 || status == 304 || status < 200;
    // 1xx and 204 never carry a length; HEAD and 304 carry the upstream's, which describes the would-be body.
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let length = match status {
        _ if status < 200 || status == 204 => None,
        _ if bodiless => declared,
        _ => declared.or_else(|| body.size_hint().exact().filter(|_| body.is_end_stream())),
    };
    let chunked = !bodiless && length.is_none() && !head.http10;
    let ends_by_close = !bodiless && length.is_none() && head.http10;
    let keep_alive = head.keep_alive && !close && !ends_by_close && !*ctx.shutdown.borrow();
    client.response_started = true;
    let out = &mut client.out;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if matches!(crate::codec::classify(name.as_str().as_bytes()), Known::HopByHop | Known::ContentLength) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = length {
        out.extend_from_slice(b"content-length: ");
        push_u64(out, n);
        out.extend_from_slice(b"\r\n");
    } else if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    crate::client::end_response_head(out, cluster, endpoint, set_cookie, keep_alive, head.http10);
    let send = settings.send_timeout;
    if bodiless {
        let written = write_timed(&mut client.io, &client.out, send).await;
        return (if written.is_ok() && keep_alive { Next::KeepAlive } else { Next::Close }, 0);
    }
    let mut sent = 0u64;
    loop {
        let frame = tokio::time::timeout(cluster.settings.read_timeout, body.frame()).await;
        let data = match frame {
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // trailers: HTTP/1.1 clients get none
            },
            Ok(None) => break,
            // A reset or a stall inside the body: the client gets an incomplete response, then a close.
            Ok(Some(Err(_))) | Err(_) => {
                observe(cluster, endpoint, ctx.index, Observed::GatewayFailure);
                let _ = write_timed(&mut client.io, &client.out, send).await;
                return (Next::Close, sent);
            }
        };
        if data.is_empty() {
            continue;
        }
        sent += data.len() as u64;
        if chunked {
            crate::codec::chunk_header(&mut client.out, data.len());
            client.out.extend_from_slice(&data);
            client.out.extend_from_slice(b"\r\n");
        } else {
            client.out.extend_from_slice(&data);
        }
        // Gather small frames; write before waiting for more.
        if client.out.len() >= 16 * 1024 || body.is_end_stream() {
            if write_timed(&mut client.io, &client.out, send).await.is_err() {
                return (Next::Close, sent);
            }
            client.out.clear();
        }
    }
    if chunked {
        client.out.extend_from_slice(crate::codec::LAST_CHUNK);
    }
    if write_timed(&mut client.io, &client.out, send).await.is_err() {
        return (Next::Close, sent);
    }
    client.out.clear();
    (if keep_alive { Next::KeepAlive } else { Next::Close }, sent)
}

/// A request body fed from a pipe that the client's decoded body is written into.
struct PipeBody {
    reader: tokio::io::DuplexStream,
    buf: bytes::BytesMut,
    /// The client's body was read to its end: only then does the pipe's end end the stream cleanly; otherwise
    /// the stream is reset, so a cut-off body never reaches the upstream as a complete one.
    complete: Arc<AtomicBool>,
    /// Told when the body has been sent in full (the response-head timeout starts then).
    sent: Option<Arc<tokio::sync::Notify>>,
}

impl Body for PipeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        this.buf.reserve(16 * 1024);
        match tokio_util::io::poll_read_buf(Pin::new(&mut this.reader), cx, &mut this.buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(0)) if !this.complete.load(Ordering::Relaxed) => {
                Poll::Ready(Some(Err("the client's request body broke off".into())))
            }
            Poll::Ready(Ok(0)) => {
                if let Some(sent) = this.sent.take() {
                    sent.notify_one();
                }
                Poll::Ready(None)
            }
            Poll::Ready(Ok(_)) => Poll::Ready(Some(Ok(Frame::data(this.buf.split().freeze())))),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
        }
    }
}
