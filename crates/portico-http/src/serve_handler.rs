//! Writing streamed responses (`stream_body::BoxBody`) to clients: a handler target's answer, and responses
//! whose route has a body filter (proxied or local). HTTP/1: `write_h1` frames the body from its size
//! (`content-length`, else chunked, or closing for HTTP/1.0); HTTP/2: the body becomes `ProxyBody::Boxed`.
//! Response filters run on every such head, and each request is counted and logged once, as for other
//! targets.

use crate::client::Client;
use crate::codec::{self, BodyFraming, Known, RequestHead, ResponseHead};
use crate::context::{Connection, WorkerCtx};
use crate::filters::{self, Filter};
use crate::h1_response::{bodiless, write_h1, OWNED};
use crate::handler::{ClientInfo, Handler, Http1Reader, Request, RequestBody, DRAIN_LIMIT};
use crate::message::LocalResponse;
use crate::outcome::{record, Next, Outcome, Peer};
use crate::relay::write_timed;
use crate::response_body::ProxyBody;
use crate::snapshot::{Cluster, Endpoint, ListenerSettings, Snapshot};
use crate::source_body::{SourceBody, SourceEnd};
use crate::stream_body::{boxed, full, BoxBody, BoxError};
use crate::subrequest::Clusters;
use crate::upstream::Source;
use bytes::Bytes;
use hyper::body::{Body, Frame};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The response filters of `chain` on a response to `head`: head hooks, then body hooks.
fn through_filters<'b>(
    chain: Option<&[Arc<dyn Filter>]>,
    head: &RequestHead,
    status: u16,
    headers: &mut HeaderMap,
    body: BoxBody<'b>,
) -> BoxBody<'b> {
    let Some(chain) = chain else { return body };
    filters::response_edits(chain, head, status).apply(headers);
    filters::wrap_body(chain, head, status, headers, body)
}

/// A handler's answer with what Portico owns removed; an error becomes `500`. A request body a `limits`
/// filter refused while the handler read it is answered as the filter says, whatever the handler made of it.
fn answer_of<'a>(
    answered: Result<crate::handler::Response<'a>, BoxError>,
    head: &RequestHead,
) -> (u16, HeaderMap, BoxBody<'a>) {
    if let Some(refusal) = crate::body_check::BodyCheck::of(head).and_then(|c| c.refusal()) {
        let refused = LocalResponse::text(refusal.status, refusal.reason);
        let (parts, body) = refused.to_http(&Default::default()).into_parts();
        return (refusal.status, parts.headers, full(body));
    }
    match answered {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let mut headers = parts.headers;
            // (Looked for before removing: most handlers set none of them, and a removal hashes the name.)
            if headers.keys().any(|name| OWNED.contains(name)) {
                for name in &OWNED {
                    headers.remove(name);
                }
            }
            (parts.status.as_u16(), headers, body)
        }
        Err(e) => {
            tracing::warn!("handler failed: {e}");
            let failed = LocalResponse::text(500, "the handler failed");
            let (parts, body) = failed.to_http(&Default::default()).into_parts();
            (500, parts.headers, full(body))
        }
    }
}

/// A handler target for an HTTP/1 client. The connection is split: the handler reads the body from one half
/// while the response goes out on the other. A client that closes once its body is in cancels the handler.
pub(crate) async fn serve_h1(
    client: &mut Client,
    head: &RequestHead,
    handler: &Arc<dyn Handler>,
    params: Vec<(String, String)>,
    (settings, snapshot): (&ListenerSettings, &Arc<Snapshot>),
    ctx: &Rc<WorkerCtx>,
) -> Outcome {
    if head.body == BodyFraming::Chunked {
        if let Some(reason) = codec::chunked_prefix_error(&client.buf) {
            let bytes = crate::client::respond_error(client, 400, reason, true).await.unwrap_or(0);
            return Outcome::local(Next::Close, 400, bytes);
        }
    }
    let waiting = match head.body {
        BodyFraming::Length(n) => (client.buf.len() as u64) < n,
        BodyFraming::Chunked => true,
        _ => false,
    };
    if head.expect_continue && !head.http10 && waiting {
        let line = b"HTTP/1.1 100 Continue\r\n\r\n";
        if write_timed(&mut client.io, line, settings.send_timeout).await.is_err() {
            return Outcome::local(Next::Close, 499, 0);
        }
    }
    let info = ClientInfo { addr: client.peer, https: client.facts.https, http2: false };
    let upstreams = Clusters::upstreams(ctx.clone(), snapshot.clone(), &settings.name, client.peer.ip());
    let chain = client.filters.clone();
    let shutdown = *ctx.shutdown.borrow();
    let send_timeout = client.send_timeout;
    let Client { io, buf, out, response_started, .. } = client;
    let (read, mut write) = tokio::io::split(io);
    let reader = Rc::new(RefCell::new(Http1Reader::new(read, buf, head.body, settings.body_read_timeout)));
    let body = RequestBody::http1(reader.clone(), head);
    let request = Request { head: head.clone(), client: info, params, body, upstreams };
    let watch = reader.clone();
    let mut gone = pin!(poll_fn(move |cx| watch.borrow_mut().poll_gone(cx)));
    let answered = tokio::select! {
        answered = handler.handle(request) => answered,
        () = &mut gone => return Outcome::local(Next::Close, 499, 0),
    };
    let (status, mut headers, body) = answer_of(answered, head);
    let body = through_filters(chain.as_deref(), head, status, &mut headers, body);
    let close = !head.keep_alive || shutdown;
    let gone: Pin<&mut dyn Future<Output = ()>> = gone;
    // From here a failure (a panic) closes the connection rather than answering: the head may be out.
    *response_started = true;
    let written = write_h1(&mut write, out, head, status, &headers, body, close, send_timeout, gone).await;
    let mut next = match close || !written.complete || written.close_delimited {
        true => Next::Close,
        false => Next::KeepAlive,
    };
    if next == Next::KeepAlive && !drain(&reader).await {
        next = Next::Close;
    }
    Outcome::local(next, status, written.bytes)
}

/// Reads and drops what is left of a request body the handler did not read, up to `DRAIN_LIMIT` bytes and
/// for at most a second: true when it ended whole (the connection can serve the next request).
async fn drain(reader: &RefCell<Http1Reader<'_>>) -> bool {
    let mut drained = 0u64;
    let drain = poll_fn(|cx| loop {
        let mut r = reader.borrow_mut();
        if r.failed {
            return Poll::Ready(false);
        }
        if r.done {
            return Poll::Ready(true);
        }
        match r.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => {
                drained += data.len() as u64;
                if drained > DRAIN_LIMIT {
                    return Poll::Ready(false);
                }
            }
            Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
            Poll::Ready(None) => return Poll::Ready(true),
            Poll::Pending => return Poll::Pending,
        }
    });
    tokio::time::timeout(Duration::from_secs(1), drain).await.unwrap_or(false)
}

/// Whether a proxied response to an HTTP/1 client goes through the route's body filters: when one of them
/// wraps bodies and the response has one.
pub(crate) fn wraps_proxied(client: &Client, head: &RequestHead, resp: &ResponseHead) -> bool {
    client.filters.as_deref().is_some_and(filters::has_body_hooks)
        && resp.body != BodyFraming::None
        && resp.other_codings.is_none()
        && !bodiless(head, resp.status)
}

/// A proxied HTTP/1 upstream response to an HTTP/1 client through the route's body filters: its body is
/// read as frames (`SourceBody`) and written as `write_h1` frames it. The connection is pooled afterwards
/// as on the relaying path.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward_wrapped(
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
    let mut headers = HeaderMap::with_capacity(resp.headers.len() + 4);
    for h in &resp.headers {
        let name = h.name.get(&resp_bytes);
        let keep = match codec::classify(name) {
            Known::HopByHop | Known::ContentLength => false,
            _ => resp.connection.is_empty() || !resp.named_by_connection(&resp_bytes, name),
        };
        if let (true, Ok(n), Ok(v)) =
            (keep, HeaderName::from_bytes(name), HeaderValue::from_bytes(h.value.get(&resp_bytes)))
        {
            headers.append(n, v);
        }
    }
    if set_cookie {
        if let Ok(v) = HeaderValue::from_str(&cluster.balancer.cookie_for(endpoint)) {
            headers.append(header::SET_COOKIE, v);
        }
    }
    let keep_alive = head.keep_alive && request_done && client.more_requests_possible() && !*ctx.shutdown.borrow();
    client.response_started = true;
    let end = Cell::new(SourceEnd::Running);
    let written = {
        let body = boxed(SourceBody::new(&mut source, resp.body, cluster.settings.read_timeout, &end));
        let body = through_filters(client.filters.as_deref(), head, resp.status, &mut headers, body);
        let gone = pin!(std::future::pending::<()>());
        let out = &mut client.out;
        write_h1(&mut client.io, out, head, resp.status, &headers, body, !keep_alive, settings.send_timeout, gone).await
    };
    match end.get() {
        SourceEnd::Complete => {
            if let Source::Conn(conn) = source {
                if resp.reusable && request_done && (conn.buf.is_empty() || conn.has_followers()) {
                    crate::pipeline::release(&ctx.pool, client.pipeline.as_deref_mut(), cluster, endpoint, conn, false);
                }
            }
        }
        SourceEnd::Failed => {
            crate::upstream::observe(cluster, endpoint, ctx.index, crate::upstream::Observed::GatewayFailure);
        }
        SourceEnd::Running => {}
    }
    let next = match keep_alive && written.complete && !written.close_delimited {
        true => Next::KeepAlive,
        false => Next::Close,
    };
    (next, written.bytes)
}

/// An HTTP/2 response through the body filters of `chain`, when one wraps bodies: the body becomes
/// `ProxyBody::Boxed` and loses its `content-length` if its length changed.
pub(crate) fn wrap_h2(
    chain: Option<&[Arc<dyn Filter>]>,
    head: &RequestHead,
    response: hyper::Response<ProxyBody>,
) -> hyper::Response<ProxyBody> {
    let Some(chain) = chain.filter(|c| filters::has_body_hooks(c)) else { return response };
    let status = response.status().as_u16();
    if bodiless(head, status) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = filters::wrap_body(chain, head, status, &mut parts.headers, boxed(body));
    if let Some(n) = body.size_hint().exact() {
        parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    hyper::Response::from_parts(parts, ProxyBody::Boxed(body))
}

/// A handler target for an HTTP/2 stream. The request body is the stream's; the response body goes to hyper
/// and the request is counted and logged when it ends or is dropped (the client reset the stream).
pub(crate) async fn serve_h2(
    body: crate::h2_request::ClientBody,
    head: RequestHead,
    (route, handler, params): (usize, Arc<dyn Handler>, Vec<(String, String)>),
    (snapshot, listener): (&Arc<Snapshot>, usize),
    conn: &Rc<Connection>,
    started: Instant,
) -> hyper::Response<ProxyBody> {
    let info = ClientInfo { addr: conn.peer, https: conn.facts.https, http2: true };
    let upstreams = Clusters::upstreams(conn.ctx.clone(), snapshot.clone(), &conn.listener, conn.peer.ip());
    // A body without a declared length still comes, in DATA frames: the handler's head says so (as a chunked
    // one would on HTTP/1.1), so that it reads it rather than taking it for none.
    let mut handler_head = head.clone();
    if handler_head.body == BodyFraming::None && !body.is_end_stream() {
        handler_head.body = BodyFraming::Chunked;
    }
    let body = RequestBody::frames(body, &head);
    let request = Request { head: handler_head, client: info, params, body, upstreams };
    let (status, mut headers, body) = answer_of(handler.handle(request).await, &head);
    let chain = snapshot.router.get(route).and_then(|r| r.filters.clone());
    let body = through_filters(chain.as_deref(), &head, status, &mut headers, body);
    let no_body = bodiless(&head, status);
    if let Some(n) = body.size_hint().exact().filter(|_| status >= 200 && status != 204 && status != 304) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    let finish = HandlerFinish {
        ctx: conn.ctx.clone(),
        snapshot: snapshot.clone(),
        route,
        head,
        from: Peer { client: conn.peer.ip(), http2: true, listener },
        status,
        bytes: 0,
        started,
        done: false,
    };
    let body = if no_body {
        drop(body);
        drop(finish); // recorded now
        ProxyBody::Local(http_body_util::Full::new(Bytes::new()))
    } else {
        ProxyBody::Boxed(boxed(Recording { body, finish }))
    };
    let mut response = hyper::Response::new(body);
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    *response.headers_mut() = headers;
    response
}

/// Counts and logs a handler's HTTP/2 request once its response has ended or was abandoned.
struct HandlerFinish {
    ctx: Rc<WorkerCtx>,
    snapshot: Arc<Snapshot>,
    route: usize,
    head: RequestHead,
    from: Peer,
    status: u16,
    bytes: u64,
    started: Instant,
    done: bool,
}

impl HandlerFinish {
    fn done(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let outcome = Outcome::local(Next::KeepAlive, self.status, self.bytes);
        let route = self.snapshot.router.get(self.route);
        record(&self.ctx, &self.snapshot, route, &self.head, self.from, &outcome, self.started.elapsed());
    }
}

impl Drop for HandlerFinish {
    fn drop(&mut self) {
        self.done();
    }
}

/// A response body that counts its bytes and records the request when it ends.
struct Recording {
    body: BoxBody<'static>,
    finish: HandlerFinish,
}

impl Body for Recording {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = self.body.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.finish.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish.done(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
