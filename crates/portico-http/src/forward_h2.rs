//! Requests for `protocol: h2` clusters from HTTP/2 clients: forwarded stream to stream, frames and trailers
//! untouched, without the HTTP/1 engine in between (HTTP/1 has no way to carry trailers, and gRPC needs them).
//! Routing, balancing, the breaker, outlier detection, retries of connections that could not be opened, the
//! counters and the access log work as they do for HTTP/1; the request is recorded when its response body
//! ends.

use crate::body::{ClientFacts, ReqBody, REPLAYABLE_BODY};
use crate::client::{answer, Client};
use crate::codec::Known;
use crate::codec::{self, BodyFraming, RequestHead};
use crate::context::Connection;
use crate::context::WorkerCtx;
use crate::forward::{Answered, Exchange};
use crate::h1_response::write_h1;
use crate::h2_request::ClientBody;
use crate::outcome::{record, upstream_outcome, Next, Outcome, Peer};
use crate::relay::{relay_body, write_timed, RelayError};
use crate::response_body::{local, Finish, ProxyBody, Recorded};
use crate::router::CompiledRoute;
use crate::snapshot::ListenerSettings;
use crate::snapshot::{Cluster, Endpoint, Snapshot};
use crate::stats::ClusterSlot;
use crate::upstream::push_u64;
use crate::upstream::{observe, Failed, Observed, UpstreamFailure};
use crate::upstream_h2::{BoxError, Unsent, UpBody};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use portico_core::stats::slot;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// The request head as the HTTP/1 side sees it (for routing, balancing and the log): the same checks and
/// limits as the HTTP/1 parser, built straight from the HTTP/2 request's fields. `:authority` is the host;
/// without it, the first `host` field; `host` fields are not kept beside it.
pub(crate) fn head_of(req: &portico_h2::RequestHead, limits: &codec::HeadLimits) -> Result<RequestHead, &'static str> {
    let host = match req.authority() {
        Some(a) => a,
        None => match req.fields().find(|(name, _)| *name == b"host") {
            Some((_, h)) => h,
            None => return Err("request without :authority or host"),
        },
    };
    let target = std::str::from_utf8(req.path().unwrap_or(b"/")).map_err(|_| "invalid request target")?;
    let fields = || req.fields().filter(|(name, _)| *name != b"host");
    codec::request_from_fields(req.method().as_str(), target, host, fields, limits).map_err(|e| e.reason)
}

/// Forwards one request to the `protocol: h2` cluster of route `route`.
pub(crate) async fn forward(
    req: Request<ClientBody>,
    head: RequestHead,
    snapshot: Arc<Snapshot>,
    route: usize,
    settings: &ListenerSettings,
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
    let from = Peer { client: peer, http2: true, listener: settings.index };
    if counters.requests.get() >= cluster.settings.max_requests_per_worker {
        counters.breaker_rejections.inc();
        let reason = "too many requests in flight to the cluster (circuit breaker)";
        let outcome = Outcome { reason: Some(reason), ..Outcome::local(Next::KeepAlive, 503, reason.len() as u64 + 1) };
        record(ctx, &snapshot, Some(compiled), &head, from, &outcome, started.elapsed());
        return local(StatusCode::SERVICE_UNAVAILABLE, reason);
    }
    let (parts, body) = req.into_parts();
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = match declared {
        _ if body.is_end_stream() => H2Body::InHand(Bytes::new(), None),
        // A small body is read whole first, as for HTTP/1 upstreams: it can then be sent again to a fresh
        // connection when the upstream refuses the stream unprocessed.
        Some(n) if n <= REPLAYABLE_BODY => {
            match tokio::time::timeout(settings.body_read_timeout, Limited::new(body, n as usize).collect()).await {
                Ok(Ok(collected)) => {
                    let trailers = collected.trailers().cloned();
                    H2Body::InHand(collected.to_bytes(), trailers)
                }
                Ok(Err(_)) => {
                    let outcome = Outcome::local(Next::KeepAlive, 400, 0);
                    record(ctx, &snapshot, Some(compiled), &head, from, &outcome, started.elapsed());
                    return local(StatusCode::BAD_REQUEST, "request body broke off or exceeded its content-length");
                }
                Err(_) => {
                    let outcome = Outcome::local(Next::KeepAlive, 408, 0);
                    record(ctx, &snapshot, Some(compiled), &head, from, &outcome, started.elapsed());
                    return local(StatusCode::REQUEST_TIMEOUT, "request body not received in time");
                }
            }
        }
        _ => H2Body::Frames(Some(body)),
    };
    counters.requests.add(1);
    let waiting = Waiting { ctx, snapshot: &snapshot, route: compiled, head: &head, from, started, counters };
    let mut exchange =
        H2Exchange { ctx, cluster, head: &head, facts: Some(&conn.facts), parts: Some(parts), body, body_read: true };
    let forwarded = crate::forward::forward(&mut exchange, &head, cluster, peer, worker).await;
    drop(exchange);
    waiting.answered();
    let answered = match forwarded {
        Ok(answered) => answered,
        Err(failed) => {
            counters.requests.add(-1);
            let outcome = Outcome {
                upstream: failed.upstream,
                upstream_time: failed.upstream_time,
                retries: failed.retries,
                reason: Some(failed.reason),
                ..Outcome::local(Next::KeepAlive, failed.status, failed.reason.len() as u64 + 1)
            };
            record(ctx, &snapshot, Some(compiled), &head, from, &outcome, started.elapsed());
            return local(StatusCode::from_u16(failed.status).unwrap_or(StatusCode::BAD_GATEWAY), failed.reason);
        }
    };
    let Answered { answer: resp, endpoint, index, set_cookie, started: upstream_started, retrying, inflight } =
        answered;
    // From here `Finish` takes the request, the endpoint's in-flight count and the retries down when the
    // response ends, however it ends (a client that resets the stream drops the body: 499).
    inflight.disarm();
    let status = resp.status().as_u16();
    let (mut parts, body) = resp.into_parts();
    if set_cookie {
        if let Ok(v) = HeaderValue::from_str(&cluster.balancer.cookie_for(endpoint)) {
            parts.headers.append(header::SET_COOKIE, v);
        }
    }
    if let Some(chain) = &compiled.filters {
        crate::filters::response_edits(chain, &head, status).apply(&mut parts.headers);
    }
    let finish = Finish {
        ctx: conn.ctx.clone(),
        snapshot: snapshot.clone(),
        route,
        cluster: cluster_index,
        endpoint: index,
        head,
        peer,
        listener: settings.index,
        status,
        bytes: 0,
        done: false,
        retries: retrying.disarm(),
        started,
        upstream_started,
    };
    let chain = compiled.filters.as_deref();
    let wrapping = chain.filter(|c| crate::filters::has_body_hooks(c)).map(|_| finish.head.clone());
    let recorded = Recorded { body, finish };
    let response = Response::from_parts(parts, ProxyBody::Forwarded(Box::new(recorded)));
    match wrapping {
        Some(head) => crate::serve_handler::wrap_h2(chain, &head, response),
        None => response,
    }
}

/// A request's body on its way to an HTTP/2 upstream.
enum H2Body<'c> {
    /// No body, or all of it in hand (with its trailers, if any): the request can be sent again.
    InHand(Bytes, Option<HeaderMap>),
    /// Streaming from an HTTP/2 client: sent once (`None` once sent).
    Frames(Option<ClientBody>),
    /// Streaming from an HTTP/1 client's connection, decoded with `framing` (`None` once sent).
    Connection { client: &'c mut Client, framing: Option<BodyFraming>, settings: &'c ListenerSettings },
}

/// One try of a request on an endpoint of a `protocol: h2` cluster, for `forward::forward`: the connection
/// (opened or shared), the request made for that endpoint, its body, and the response head.
struct H2Exchange<'a, 's> {
    ctx: &'a WorkerCtx,
    cluster: &'s Cluster,
    head: &'a RequestHead,
    /// The client's facts; `None` when the body's source is the client connection, which has them.
    facts: Option<&'a ClientFacts>,
    /// The client's request fields, kept while the request may be sent again.
    parts: Option<Parts>,
    body: H2Body<'a>,
    /// The client's body has been read to its end: its connection may carry another request.
    body_read: bool,
}

impl<'s> Exchange<'s> for H2Exchange<'_, 's> {
    type Answer = Response<Incoming>;

    async fn exchange(&mut self, endpoint: &'s Endpoint, fresh_only: bool) -> Result<Response<Incoming>, Failed> {
        let (cluster, head) = (self.cluster, self.head);
        let unsent = |failure| Failed { failure, connected: false, reused: false, batch_lost: false };
        let sender = crate::upstream_h2::sender(&self.ctx.h2, self.ctx.index, cluster, endpoint, fresh_only)
            .await
            .map_err(unsent)?;
        let replayable = self.replayable();
        let mut parts = match (&self.parts, replayable) {
            (Some(parts), true) => copy_parts(parts),
            _ => {
                self.parts.take().ok_or_else(|| unsent(UpstreamFailure::upstream(502, "request body already sent")))?
            }
        };
        let facts = match (&self.body, self.facts) {
            (H2Body::Connection { client, .. }, _) => &client.facts,
            (_, Some(facts)) => facts,
            (_, None) => return Err(unsent(UpstreamFailure::upstream(502, "request without client facts"))),
        };
        if let Err(reason) = crate::upstream_h2::prepare(&mut parts, head, cluster, endpoint, facts) {
            return Err(unsent(UpstreamFailure::client(400, reason)));
        }
        let sent = match &mut self.body {
            H2Body::InHand(bytes, trailers) => {
                let body = in_hand(bytes, trailers);
                crate::upstream_h2::send(sender, Request::from_parts(parts, body), cluster, endpoint, None).await
            }
            H2Body::Frames(incoming) => {
                let body = incoming
                    .take()
                    .ok_or_else(|| unsent(UpstreamFailure::upstream(502, "request body already sent")))?;
                // The response-head timeout starts when the request body has been sent (a client-streaming call
                // may send for a long time first).
                let done = Arc::new(tokio::sync::Notify::new());
                let body: UpBody = relayed(body, done.clone()).boxed_unsync();
                crate::upstream_h2::send(sender, Request::from_parts(parts, body), cluster, endpoint, Some(&done)).await
            }
            H2Body::Connection { client, framing, settings } => {
                let framing = framing
                    .take()
                    .ok_or_else(|| unsent(UpstreamFailure::upstream(502, "request body already sent")))?;
                let (sent, read) =
                    stream_from_client(client, head, framing, settings, cluster, sender, parts, endpoint).await?;
                self.body_read = read;
                sent
            }
        };
        sent.map_err(|e| match e {
            // The upstream did nothing with the stream: the loop sends it again on a fresh connection when the
            // request is in hand (once: a fresh connection that refuses too is a failure).
            Unsent::NotProcessed if !replayable => Failed {
                failure: UpstreamFailure::upstream(502, "upstream refused the stream (its body cannot be sent again)"),
                connected: true,
                reused: false,
                batch_lost: false,
            },
            Unsent::NotProcessed if fresh_only => Failed {
                failure: UpstreamFailure::upstream(502, "upstream refused the stream twice"),
                connected: true,
                reused: false,
                batch_lost: false,
            },
            Unsent::NotProcessed => Failed {
                failure: UpstreamFailure {
                    retry_fresh: true,
                    ..UpstreamFailure::upstream(502, "upstream refused the stream")
                },
                connected: true,
                reused: true,
                batch_lost: false,
            },
            Unsent::Failed(failure) => Failed { failure, connected: true, reused: false, batch_lost: false },
        })
    }

    fn status(answer: &Response<Incoming>) -> u16 {
        answer.status().as_u16()
    }

    fn replayable(&self) -> bool {
        matches!(self.body, H2Body::InHand(..))
    }
}

/// The client's request fields again, for another try.
fn copy_parts(parts: &Parts) -> Parts {
    let (mut copy, ()) = Request::new(()).into_parts();
    copy.method = parts.method.clone();
    copy.uri = parts.uri.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    copy
}

/// A body in hand, for one try.
fn in_hand(bytes: &Bytes, trailers: &Option<HeaderMap>) -> UpBody {
    match trailers {
        None if bytes.is_empty() => http_body_util::Empty::new().map_err(|never| match never {}).boxed_unsync(),
        None => Full::new(bytes.clone()).map_err(|never| match never {}).boxed_unsync(),
        Some(trailers) => {
            let frames = [Frame::data(bytes.clone()), Frame::trailers(trailers.clone())];
            let frames = futures_util::stream::iter(frames.into_iter().map(Ok::<_, BoxError>));
            StreamBody::new(frames).boxed_unsync()
        }
    }
}

/// Sends a request whose body still streams from an HTTP/1 client: the body is decoded from the connection and
/// fed to the stream as it arrives. Returns the response (or why there is none) and whether the client's body
/// was read to its end; `Err` when the client left.
#[allow(clippy::too_many_arguments)]
async fn stream_from_client(
    client: &mut Client,
    head: &RequestHead,
    framing: BodyFraming,
    settings: &ListenerSettings,
    cluster: &Cluster,
    sender: SendRequest<UpBody>,
    parts: Parts,
    endpoint: &Endpoint,
) -> Result<(Result<Response<Incoming>, Unsent>, bool), Failed> {
    let gone = || Failed { failure: UpstreamFailure::client_gone(), connected: true, reused: false, batch_lost: false };
    if head.expect_continue && !head.http10 {
        let continued = write_timed(&mut client.io, b"HTTP/1.1 100 Continue\r\n\r\n", settings.send_timeout);
        if continued.await.is_err() {
            return Err(gone());
        }
    }
    let (mut writer, reader) = tokio::io::duplex(64 * 1024);
    let complete = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(tokio::sync::Notify::new());
    let body = PipeBody { reader, buf: bytes::BytesMut::new(), complete: complete.clone(), sent: Some(sent.clone()) };
    let req = Request::from_parts(parts, body.boxed_unsync());
    client.out.clear();
    let (mut pace, send_timeout) = (settings.body_pace.checked(head), cluster.settings.send_timeout);
    let pump = async {
        let relayed = relay_body(
            &mut client.io,
            &mut client.buf,
            framing,
            &mut writer,
            false,
            &mut pace,
            send_timeout,
            &mut client.out,
        )
        .await;
        // Only a body read to its end may end the stream cleanly; anything else resets it.
        complete.store(relayed.is_ok(), Ordering::Relaxed);
        drop(writer);
        relayed
    };
    let exchange = crate::upstream_h2::send(sender, req, cluster, endpoint, Some(&sent));
    let (mut pump, mut exchange) = (std::pin::pin!(pump), std::pin::pin!(exchange));
    tokio::select! {
        relayed = &mut pump => match relayed {
            Ok(_) => Ok((exchange.await, true)),
            Err(RelayError::Source(_)) => Err(gone()),
            // The upstream stopped taking the body: its answer (or failure) is what the client gets.
            Err(RelayError::Dest) => Ok((exchange.await, false)),
        },
        early = &mut exchange => Ok((early, false)),
    }
}

/// A request for an HTTP/2 upstream that has no response yet: when its future is dropped (the client reset
/// the stream), it is counted and logged as 499 and taken off the cluster's in-flight count.
pub(crate) struct Waiting<'a> {
    pub ctx: &'a WorkerCtx,
    pub snapshot: &'a Snapshot,
    pub route: &'a CompiledRoute,
    pub head: &'a RequestHead,
    pub from: Peer,
    pub started: Instant,
    pub counters: &'a ClusterSlot,
}

impl Waiting<'_> {
    /// The request has its answer (or its failure): whoever holds it now counts and logs it.
    pub fn answered(self) {
        std::mem::forget(self);
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.counters.requests.add(-1);
        let outcome = Outcome::local(Next::Close, 499, 0);
        record(self.ctx, self.snapshot, Some(self.route), self.head, self.from, &outcome, self.started.elapsed());
    }
}

/// An HTTP/2 client's streaming body as the upstream connection (another task, which needs `Send`) takes it:
/// a task of the worker reads the client's stream (whose handle lives on this thread) and passes its frames
/// through a small channel, so both directions of a full-duplex call (gRPC streaming) flow independently, and
/// a client that sends faster than the upstream reads is held back by the channel and then its window.
fn relayed(mut body: ClientBody, sent: Arc<tokio::sync::Notify>) -> Relayed {
    let hint = body.size_hint();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_local(async move {
        while let Some(frame) = body.frame().await {
            let failed = frame.is_err();
            if tx.send(frame.map_err(BoxError::from)).await.is_err() || failed {
                // The upstream stopped reading: dropping the body tells the client to stop sending.
                break;
            }
        }
    });
    Relayed { rx, hint, sent: Some(sent) }
}

/// The receiving end of `relayed`, which says when the body has been sent in full.
struct Relayed {
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    hint: SizeHint,
    sent: Option<Arc<tokio::sync::Notify>>,
}

impl Body for Relayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = this.rx.poll_recv(cx);
        if let Poll::Ready(None) = polled {
            if let Some(sent) = this.sent.take() {
                sent.notify_one();
            }
        }
        polled
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
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
    let peer = client.peer.ip();
    let mut exchange = match body {
        ReqBody::InHand(bytes) => H2Exchange {
            ctx,
            cluster,
            head,
            facts: Some(&client.facts),
            parts: Some(parts),
            body: H2Body::InHand(bytes, None),
            body_read: true,
        },
        ReqBody::Sent => return answer(client, head, 502, "request body already sent", false).await,
        // Routes to HTTP/2 clusters stream their bodies (request buffering is for HTTP/1 clusters).
        ReqBody::Spooled(_) => return answer(client, head, 500, "buffered body for an HTTP/2 cluster", true).await,
        ReqBody::Streaming(framing) => H2Exchange {
            ctx,
            cluster,
            head,
            facts: None,
            parts: Some(parts),
            body: H2Body::Connection { client, framing: Some(framing), settings },
            body_read: false,
        },
    };
    let forwarded = crate::forward::forward(&mut exchange, head, cluster, peer, worker).await;
    let body_read = exchange.body_read;
    drop(exchange);
    let answered = match forwarded {
        Ok(answered) => answered,
        Err(failed) if failed.client_gone => {
            // A body a `limits` filter refused as it went upstream: the client is still there to be told.
            if let Some(r) = crate::body_check::BodyCheck::of(head).and_then(|c| c.refusal()) {
                let mut outcome = answer(client, head, r.status, r.reason, false).await;
                outcome.upstream = failed.upstream;
                return outcome;
            }
            return Outcome {
                upstream: failed.upstream,
                retries: failed.retries,
                ..Outcome::local(Next::Close, 499, 0)
            };
        }
        Err(failed) => {
            let mut outcome = answer(client, head, failed.status, failed.reason, body_done || body_read).await;
            outcome.upstream = failed.upstream;
            outcome.upstream_time = failed.upstream_time;
            outcome.retries = failed.retries;
            outcome.reason = Some(failed.reason);
            return outcome;
        }
    };
    let Answered { answer: resp, endpoint, set_cookie, started, retrying, inflight: _inflight, .. } = answered;
    let status = resp.status().as_u16();
    let response = Upstream { resp, set_cookie, close: !(body_done || body_read) };
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
    let wrapping = client.filters.as_ref().filter(|c| !bodiless && crate::filters::has_body_hooks(c)).cloned();
    if let Some(chain) = wrapping {
        // A route whose filter wraps bodies: the body goes through it as frames, framed by what comes out.
        let mut headers = parts.headers;
        if set_cookie {
            if let Ok(v) = HeaderValue::from_str(&cluster.balancer.cookie_for(endpoint)) {
                headers.append(header::SET_COOKIE, v);
            }
        }
        let keep_alive = head.keep_alive && !close && !*ctx.shutdown.borrow();
        let failed = Cell::new(false);
        let source = ReadTimeout { body, limit: cluster.settings.read_timeout, timer: None, failed: &failed };
        let body = crate::filters::wrap_body(&chain, head, status, &mut headers, crate::stream_body::boxed(source));
        client.response_started = true;
        let (send, gone) = (settings.send_timeout, std::pin::pin!(std::future::pending::<()>()));
        let written =
            write_h1(&mut client.io, &mut client.out, head, status, &headers, body, !keep_alive, send, gone).await;
        if failed.get() {
            observe(cluster, endpoint, ctx.index, Observed::GatewayFailure);
        }
        let reusable = keep_alive && written.complete && !written.close_delimited;
        return (if reusable { Next::KeepAlive } else { Next::Close }, written.bytes);
    }
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
    let dated = parts.headers.contains_key(header::DATE);
    crate::client::end_response_head(out, cluster, endpoint, (set_cookie, dated), keep_alive, head.http10);
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

/// An HTTP/2 upstream's response body with a limit on each wait for the next frame (`read_timeout`), as the
/// direct path applies it; a body that stalls or breaks off ends with an error and marks `failed`.
struct ReadTimeout<'f> {
    body: Incoming,
    limit: std::time::Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: &'f Cell<bool>,
}

impl Body for ReadTimeout<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                this.failed.set(true);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(frame) => {
                this.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let limit = this.limit;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.failed.set(true);
                        Poll::Ready(Some(Err("upstream response body timed out".into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
