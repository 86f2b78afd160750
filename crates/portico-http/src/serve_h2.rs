//! HTTP/2 streams served natively. A stream's request head goes through the same phases as an HTTP/1
//! request (normalise, route, request filters, target) and, for a cluster, the same upstream loop
//! (`forward`): no bridge, no second serialisation. The response goes back as it arrives: an HTTP/1
//! upstream's body is decoded straight into DATA frames (`UpstreamBody`), a `protocol: h2` upstream's stream
//! is relayed with its trailers (`forward_h2`), and local answers are written as they are. Response filters
//! run on every response head; every request is counted and logged once, when its response has ended.

use crate::body::{BodySource, Downstream, FrameReader};
use crate::codec::{self, BodyFraming, Known, RequestHead};
use crate::context::Connection;
use crate::forward::Answered;
use crate::forward_h2::Waiting;
use crate::h2_request::{ClientBody, Interim};
use crate::intake::Intake;
use crate::message::LocalResponse;
use crate::outcome::{record, record_refused, Next, Outcome, Peer};
use crate::phases::Front;
use crate::response_body::{local, Finish, ProxyBody, UpstreamBody};
use crate::snapshot::{ListenerSettings, Snapshot};
use crate::subrequest::Clusters;
use bytes::{Bytes, BytesMut};
use http_body_util::Full;
use hyper::body::Body;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use portico_core::stats::slot;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Serves one stream's request.
pub(crate) async fn serve(
    h2head: portico_h2::RequestHead,
    body: ClientBody,
    conn: &Rc<Connection>,
    interim: &Interim,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let snapshot = conn.ctx.snapshot.load_full();
    let Some(settings) = snapshot.listener(&conn.listener) else {
        return local(StatusCode::SERVICE_UNAVAILABLE, "listener removed");
    };
    let mut head = match crate::forward_h2::head_of(&h2head, &settings.limits) {
        Ok(head) => head,
        Err(reason) => {
            // Counted and logged as a refused head, as an HTTP/1 one is.
            let bytes = reason.len() as u64 + 1;
            let from = Peer { client: conn.peer.ip(), http2: true, listener: settings.index };
            record_refused(&conn.ctx, &snapshot, from, 400, bytes);
            return local(StatusCode::BAD_REQUEST, reason);
        }
    };
    #[cfg(debug_assertions)]
    crate::context::debug_panic_hook(&head, &conn.ctx);
    // The filters see a body that streams without a length as one of unknown length (what it is taken as
    // for an HTTP/1 cluster), so that a `limits` filter counts it; the target decides afterwards.
    let unknown_length = head.body == BodyFraming::None && !body.is_end_stream();
    if unknown_length {
        head.body = BodyFraming::Chunked;
    }
    let front = match crate::phases::front(&mut head, &snapshot, settings, conn.facts.https, conn.peer.ip()) {
        Front::Gated { route, captured } => {
            let info = crate::handler::ClientInfo { addr: conn.peer, https: conn.facts.https, http2: true };
            let upstreams = Clusters::upstreams(conn.ctx.clone(), snapshot.clone(), &conn.listener, conn.peer.ip());
            let gates = crate::phases::pass_gates(&mut head, &snapshot, (route, captured), info, &upstreams);
            Box::pin(gates).await
        }
        front => front,
    };
    if unknown_length {
        head.body = BodyFraming::None;
    }
    let reply = Reply { snapshot: &snapshot, conn, started, interim, listener: settings.index };
    match front {
        Front::Cluster { route, cluster } if snapshot.clusters[cluster].settings.http2 => {
            let parts = match h2head.into_parts() {
                Ok(parts) => parts,
                Err(reason) => return reply.local(Some(route), &head, &LocalResponse::text(400, reason), |_| {}),
            };
            let check = crate::body_check::BodyCheck::of(&head);
            let refused_head = check.as_ref().map(|_| head.clone());
            let req = Request::from_parts(parts, body.checked(&head));
            // Boxed: this rarer path's future would otherwise make every stream's future larger.
            let answer = Box::pin(crate::forward_h2::forward(req, head, snapshot.clone(), route, settings, conn)).await;
            // A body a `limits` filter refused on its way: the client is told why, not how the upstream took it.
            match (check.and_then(|c| c.refusal()), refused_head) {
                (Some(r), Some(head)) => {
                    reply.local(Some(route), &head, &LocalResponse::text(r.status, r.reason), |_| {})
                }
                _ => answer,
            }
        }
        Front::Cluster { route, cluster } => to_cluster(body, head, route, cluster, settings, &reply).await,
        Front::Answer { route, response } => reply.local(Some(route), &head, &response, |_| {}),
        Front::NoRoute => reply.local(None, &head, &LocalResponse::text(404, "no route matches this request"), |_| {}),
        Front::BadPath(e) => reply.local(None, &head, &LocalResponse::text(e.status, e.reason), |_| {}),
        // (`pass_gates` never gives another `Gated`.)
        Front::Gated { route, .. } => {
            reply.local(Some(route), &head, &LocalResponse::text(500, "function filters did not decide"), |_| {})
        }
        Front::WebSocket { route, endpoint } => {
            reply.local(Some(route), &head, &crate::websocket::refuse_h2(endpoint), |_| {})
        }
        Front::Handler { route, handler, params } => {
            let target = (route, handler, params);
            crate::serve_handler::serve_h2(body, head, target, (&snapshot, settings.index), conn, started).await
        }
    }
}

/// What answering a stream needs to count and log it.
struct Reply<'a> {
    snapshot: &'a Arc<Snapshot>,
    conn: &'a Rc<Connection>,
    started: Instant,
    /// Where an upstream's 1xx goes.
    interim: &'a Interim,
    /// The listener's index in `snapshot`.
    listener: usize,
}

impl Reply<'_> {
    /// A response made by Portico, through the route's response filters; `outcome` adds what the log should
    /// know (the endpoint that failed, the retries).
    fn local(
        &self,
        route: Option<usize>,
        head: &RequestHead,
        resp: &LocalResponse,
        outcome: impl FnOnce(&mut Outcome),
    ) -> Response<ProxyBody> {
        let compiled = route.and_then(|r| self.snapshot.router.get(r));
        let edits = compiled
            .and_then(|r| r.filters.as_ref())
            .map(|chain| crate::filters::response_edits(chain, head, resp.status))
            .unwrap_or_default();
        let head_only = head.method() == b"HEAD";
        let mut logged =
            Outcome::local(Next::KeepAlive, resp.status, if head_only { 0 } else { resp.body.len() as u64 });
        outcome(&mut logged);
        let from = Peer { client: self.conn.peer.ip(), http2: true, listener: self.listener };
        record(&self.conn.ctx, self.snapshot, compiled, head, from, &logged, self.started.elapsed());
        let (mut parts, body) = resp.to_http(&edits).into_parts();
        let body = if head_only {
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
            Bytes::new()
        } else {
            body
        };
        let response = Response::from_parts(parts, ProxyBody::Local(Full::new(body)));
        let chain = compiled.and_then(|r| r.filters.as_deref());
        crate::serve_handler::wrap_h2(chain, head, response)
    }
}

/// A request for an HTTP/1 cluster.
async fn to_cluster(
    incoming: ClientBody,
    mut head: RequestHead,
    route: usize,
    cluster_index: usize,
    settings: &ListenerSettings,
    reply: &Reply<'_>,
) -> Response<ProxyBody> {
    let (snapshot, conn) = (reply.snapshot, reply.conn);
    let ctx = &conn.ctx;
    let cluster = &snapshot.clusters[cluster_index];
    if !incoming.is_end_stream() && head.body == BodyFraming::None {
        // A body without a declared length: chunked to the upstream.
        head.body = BodyFraming::Chunked;
    }
    let mut reader = FrameReader::new(incoming);
    let mut received = BytesMut::new();
    // Before the breaker counts the request: a body still arriving holds nothing of the cluster's.
    let buffering = snapshot.router.get(route).and_then(|r| r.buffering.as_deref());
    let json_buffering: crate::request_buffer::BufferPolicy;
    let buffering = match crate::body_check::BodyCheck::buffering(&head, buffering) {
        Some(policy) => {
            json_buffering = policy;
            Some(&json_buffering)
        }
        None => buffering,
    };
    // Frames end a body of unknown length.
    let read_framing = if head.body == BodyFraming::Chunked { BodyFraming::UntilClose } else { head.body };
    let taken = match Intake::of(head.body, buffering) {
        Ok(intake) => {
            let stats = slot(&settings.stats.slots, ctx.index);
            let reading = (read_framing, settings.body_pace.checked(&head));
            let taken = intake.take(&mut reader, &mut received, &mut head, reading, stats).await;
            taken.and_then(|body| intake.check_whole(body, &head))
        }
        Err(fault) => Err(fault),
    };
    let mut body = match taken {
        Ok(body) => body,
        Err(fault) => {
            let (status, reason) = fault.answer().unwrap_or((499, "client closed the stream"));
            return reply.local(Some(route), &head, &LocalResponse::text(status, reason), |_| {});
        }
    };
    let counters = slot(&cluster.stats.slots, ctx.index);
    if counters.requests.get() >= cluster.settings.max_requests_per_worker {
        counters.breaker_rejections.inc();
        let reason = "too many requests in flight to the cluster (circuit breaker)";
        let refused = LocalResponse::text(503, reason);
        return reply.local(Some(route), &head, &refused, |o| o.reason = Some(reason));
    }
    counters.requests.add(1);
    let mut out = Vec::new();
    let mut down = Downstream {
        facts: &conn.facts,
        out: &mut out,
        body: BodySource::Frames { reader: &mut reader, buf: &mut received, interim: reply.interim },
    };
    let Some(compiled) = snapshot.router.get(route) else {
        counters.requests.add(-1);
        return local(StatusCode::NOT_FOUND, "no route matches this request");
    };
    // A client that resets the stream before the response head drops this future: counted and logged then.
    let from = Peer { client: conn.peer.ip(), http2: true, listener: settings.index };
    let waiting = Waiting { ctx, snapshot, route: compiled, head: &head, from, started: reply.started, counters };
    let forwarded =
        crate::forward::forward_http1(&mut down, &head, &mut body, cluster, conn.peer.ip(), settings, ctx, None).await;
    waiting.answered();
    let answered = match forwarded {
        Ok(answered) => answered,
        Err(failed) => {
            counters.requests.add(-1);
            let resp = LocalResponse::text(failed.status, failed.reason);
            return reply.local(Some(route), &head, &resp, |o| {
                o.upstream = failed.upstream;
                o.upstream_time = failed.upstream_time;
                o.retries = failed.retries;
                o.reason = Some(failed.reason);
            });
        }
    };
    let Answered { answer: (source, (resp_bytes, resp)), endpoint, index, set_cookie, started, retrying, inflight } =
        answered;
    // From here `Finish` takes the request, the endpoint's in-flight count and the retries down when the
    // response ends, however it ends.
    inflight.disarm();
    let mut finish = Finish {
        ctx: ctx.clone(),
        snapshot: snapshot.clone(),
        route,
        cluster: cluster_index,
        endpoint: index,
        head,
        peer: conn.peer.ip(),
        listener: settings.index,
        status: resp.status,
        bytes: 0,
        done: false,
        retries: retrying.disarm(),
        started: reply.started,
        upstream_started: started,
    };
    if resp.other_codings.is_some() {
        // HTTP/2 has no transfer codings: a body still encoded with one cannot be labelled.
        finish.status = 502;
        return local(StatusCode::BAD_GATEWAY, "upstream used a transfer coding HTTP/2 cannot carry");
    }
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    if resp.headers.len() > 6 {
        // The map's first allocation holds 6: grow it once rather than step by step.
        headers.reserve(resp.headers.len() + 2);
    }
    // The values are slices of the upstream's head (no copy); the upstream's own Content-Length is kept when
    // it is already what would be written.
    let mut length = None;
    // Whether Connection names any header that could be kept: `keep-alive`, the usual value, names only a
    // hop-by-hop header, dropped anyway.
    let named_by_connection = resp.connection.iter().any(|v| {
        v.get(&resp_bytes)
            .split(|&b| b == b',')
            .map(codec::trim)
            .any(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"keep-alive"))
    });
    for h in &resp.headers {
        let name = h.name.get(&resp_bytes);
        let keep = match codec::classify(name) {
            Known::HopByHop => false,
            // Written below from the framing, except on bodiless responses where it describes the would-be body.
            Known::ContentLength if resp.body == BodyFraming::None => true,
            Known::ContentLength => {
                let value = h.value.get(&resp_bytes);
                if length.is_none() && canonical_length(value) {
                    length = Some(h.value);
                }
                false
            }
            _ => !named_by_connection || !resp.named_by_connection(&resp_bytes, name),
        };
        if !keep {
            continue;
        }
        let value = resp_bytes.slice(h.value.start as usize..h.value.end as usize);
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_maybe_shared(value)) {
            headers.append(n, v);
        }
    }
    if let BodyFraming::Length(n) = resp.body {
        let value = length
            .map(|span| resp_bytes.slice(span.start as usize..span.end as usize))
            .and_then(|v| HeaderValue::from_maybe_shared(v).ok())
            .unwrap_or_else(|| HeaderValue::from(n));
        headers.insert(header::CONTENT_LENGTH, value);
    }
    if set_cookie {
        if let Ok(v) = HeaderValue::from_str(&cluster.balancer.cookie_for(endpoint)) {
            headers.append(header::SET_COOKIE, v);
        }
    }
    if let Some(chain) = snapshot.router.get(route).and_then(|r| r.filters.as_ref()) {
        crate::filters::response_edits(chain, &finish.head, resp.status).apply(headers);
    }
    let reusable = resp.reusable && body.consumed();
    // A route whose filters wrap bodies needs the request for them; the head itself goes with `finish`.
    let chain = snapshot.router.get(route).and_then(|r| r.filters.as_deref());
    let wrapping = chain.filter(|c| crate::filters::has_body_hooks(c)).map(|_| finish.head.clone());
    let upstream_body = UpstreamBody::new(source, resp.body, reusable, cluster.settings.read_timeout, finish);
    let response = response.map(|()| ProxyBody::Upstream(Box::new(upstream_body)));
    match wrapping {
        Some(head) => crate::serve_handler::wrap_h2(chain, &head, response),
        None => response,
    }
}

/// A Content-Length value written as Portico would write its number: digits, without leading zeros.
fn canonical_length(value: &[u8]) -> bool {
    !value.is_empty() && value.iter().all(u8::is_ascii_digit) && (value.len() == 1 || value[0] != b'0')
}
