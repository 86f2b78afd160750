//! Requests for `protocol: h2` clusters from HTTP/2 clients: forwarded stream to stream, frames and trailers
//! untouched, without the HTTP/1 engine in between (HTTP/1 has no way to carry trailers, and gRPC needs them).
//! Routing, balancing, the breaker, outlier detection, retries of connections that could not be opened, the
//! counters and the access log work as they do for HTTP/1; the request is recorded when its response body
//! ends.

use crate::balancer::{NoPick, PickInput};
use crate::codec::{self, Parsed, RequestHead};
use crate::http2::Connection;
use crate::proxy::{another_endpoint, may_retry, record, Next, Outcome};
use crate::snapshot::Snapshot;
use crate::stats::{class_index, slot};
use crate::upstream::{observe, Observed, UpstreamFailure};
use crate::upstream_h2::{BoxError, UpBody};
use crate::worker::WorkerCtx;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A response body towards an HTTP/2 client.
pub(crate) enum ProxyBody {
    /// From the HTTP/1 engine, through the pipe.
    Piped(Incoming),
    /// Straight from an HTTP/2 upstream, recorded when it ends.
    Forwarded(Box<Recorded>),
    /// Made by Portico itself.
    Local(Full<Bytes>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Piped(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ProxyBody::Forwarded(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Local(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Piped(b) => b.is_end_stream(),
            ProxyBody::Forwarded(b) => b.body.is_end_stream(),
            ProxyBody::Local(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Piped(b) => b.size_hint(),
            ProxyBody::Forwarded(b) => b.body.size_hint(),
            ProxyBody::Local(b) => b.size_hint(),
        }
    }
}

/// A short plain-text answer made by Portico.
pub(crate) fn local(status: StatusCode, reason: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::Local(Full::new(Bytes::from(format!("{reason}\n")))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

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
    let cluster_index = compiled.cluster;
    let cluster = &snapshot.clusters[cluster_index];
    let counters = slot(&cluster.stats.slots, worker);
    let peer = conn.peer.ip();
    let fail = |status: u16, reason: &str, upstream: Option<SocketAddr>, retries: u32| {
        let outcome = Outcome { upstream, retries, ..Outcome::local(Next::KeepAlive, status, reason.len() as u64 + 1) };
        record(ctx, &snapshot, Some(compiled), &head, peer, &outcome, started.elapsed());
        local(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), reason)
    };
    if counters.requests.get() >= cluster.settings.max_requests_per_worker {
        counters.breaker_rejections.inc();
        return fail(503, "too many requests in flight to the cluster (circuit breaker)", None, 0);
    }

    let input = PickInput { req: &head, client_ip: peer, worker };
    let policy = &cluster.settings.retries;
    let mut tried = Vec::new();
    let mut retries = 0u32;
    let mut last = UpstreamFailure::upstream(502, "no upstream endpoint could be reached");
    let mut last_upstream = None;
    // Only opening a connection is retried: once sent, a streamed request cannot be sent again.
    let (pick, sender) = loop {
        let pick = match cluster.balancer.pick(&cluster.endpoints, &input, &tried, cluster.settings.panic_mode) {
            Ok(p) => p,
            Err(NoPick::NoneHealthy) if tried.is_empty() => {
                counters.no_healthy_endpoint.inc();
                return fail(503, "no healthy upstream endpoint", None, retries);
            }
            Err(_) => return fail(last.status, last.reason, last_upstream, retries),
        };
        let endpoint = &cluster.endpoints[pick.index];
        last_upstream = Some(endpoint.addr);
        match crate::upstream_h2::sender(ctx, cluster, endpoint).await {
            Ok(sender) => break (pick, sender),
            Err(failure) => {
                if failure.fault == crate::upstream::Fault::Upstream {
                    observe(cluster, endpoint, worker, Observed::GatewayFailure);
                }
                last = failure;
                tried.push(pick.index);
                if another_endpoint(cluster, &tried) && may_retry(retries, policy, counters) {
                    retries += 1;
                    counters.retries.inc();
                    continue;
                }
                return fail(last.status, last.reason, last_upstream, retries);
            }
        }
    };
    let endpoint = &cluster.endpoints[pick.index];
    let (mut parts, body) = req.into_parts();
    crate::upstream_h2::prepare(&mut parts, &head, cluster, endpoint, &conn.facts);
    let body: UpBody = body.map_err(BoxError::from).boxed_unsync();
    counters.requests.add(1);
    endpoint.begin(worker);
    let upstream_started = Instant::now();
    let mut finish = Finish {
        ctx: conn.ctx.clone(),
        snapshot: snapshot.clone(),
        route,
        cluster: cluster_index,
        endpoint: pick.index,
        head,
        peer,
        status: 0,
        retries,
        started,
        upstream_started,
    };
    match crate::upstream_h2::exchange(sender, Request::from_parts(parts, body), cluster, endpoint).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            observe(cluster, endpoint, worker, if status >= 500 { Observed::ServerError } else { Observed::Success });
            let (mut parts, body) = resp.into_parts();
            if pick.set_cookie {
                let mut cookie = format!("{}={:016x}; Path=/; HttpOnly", cluster.balancer.sticky_cookie, endpoint.id);
                if let Some(age) = cluster.balancer.sticky_max_age {
                    cookie.push_str(&format!("; Max-Age={age}"));
                }
                if let Ok(v) = HeaderValue::from_str(&cookie) {
                    parts.headers.append(header::SET_COOKIE, v);
                }
            }
            finish.status = status;
            let recorded = Recorded { body, bytes: 0, finish: Some(finish) };
            Response::from_parts(parts, ProxyBody::Forwarded(Box::new(recorded)))
        }
        Err(failure) => {
            observe(cluster, endpoint, worker, Observed::GatewayFailure);
            finish.status = failure.status;
            finish.done(failure.reason.len() as u64 + 1);
            local(StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_GATEWAY), failure.reason)
        }
    }
}

/// Everything needed to count and log a forwarded request once its response has ended (or was abandoned).
struct Finish {
    ctx: Rc<WorkerCtx>,
    snapshot: Arc<Snapshot>,
    route: usize,
    cluster: usize,
    endpoint: usize,
    head: RequestHead,
    peer: IpAddr,
    status: u16,
    retries: u32,
    started: Instant,
    upstream_started: Instant,
}

impl Finish {
    fn done(&self, bytes: u64) {
        let worker = self.ctx.index;
        let cluster = &self.snapshot.clusters[self.cluster];
        let endpoint = &cluster.endpoints[self.endpoint];
        endpoint.end(worker);
        slot(&cluster.stats.slots, worker).requests.add(-1);
        let upstream_time = self.upstream_started.elapsed();
        let endpoint_slot = slot(&endpoint.stats.slots, worker);
        endpoint_slot.by_class[class_index(self.status)].inc();
        endpoint_slot.duration.observe(upstream_time);
        let outcome = Outcome {
            next: Next::KeepAlive,
            status: self.status,
            bytes,
            upstream: Some(endpoint.addr),
            upstream_time: Some(upstream_time),
            retries: self.retries,
        };
        let route = self.snapshot.router.get(self.route);
        record(&self.ctx, &self.snapshot, route, &self.head, self.peer, &outcome, self.started.elapsed());
    }
}

/// A forwarded response body that counts its bytes and records the request when it ends.
pub(crate) struct Recorded {
    body: Incoming,
    bytes: u64,
    finish: Option<Finish>,
}

impl Body for Recorded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.end(),
            Poll::Pending => {}
        }
        polled.map_err(Into::into)
    }
}

impl Recorded {
    fn end(&mut self) {
        if let Some(finish) = self.finish.take() {
            finish.done(self.bytes);
        }
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        self.end();
    }
}
