//! Response bodies on their way to HTTP/2 clients: from an HTTP/1 upstream connection (decoded as it is
//! read, the connection pooled again at the end), from an HTTP/2 upstream, or made by Portico. A forwarded
//! request is counted and logged when its body ends or is abandoned (`Finish`), however that happens.

use crate::codec::{BodyFraming, ChunkedDecoder, Decoded, RequestHead};
use crate::context::WorkerCtx;
use crate::outcome::{record, upstream_outcome, Next, Peer};
use crate::snapshot::Snapshot;
use crate::source_body::{poll_fill, Filled};
use crate::upstream::{observe, Observed, Source};
use crate::upstream_h2::BoxError;
use bytes::{Bytes, BytesMut};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use portico_core::stats::slot;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A response body towards an HTTP/2 client.
pub(crate) enum ProxyBody {
    /// Straight from an HTTP/2 upstream, recorded when it ends.
    Forwarded(Box<Recorded>),
    /// Straight from an HTTP/1 upstream connection.
    Upstream(Box<UpstreamBody>),
    /// Made by Portico itself.
    Local(Full<Bytes>),
    /// A handler's answer, or a body a filter wrapped.
    Boxed(crate::stream_body::BoxBody<'static>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Forwarded(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Upstream(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Local(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            ProxyBody::Boxed(b) => b.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Forwarded(b) => b.body.is_end_stream(),
            ProxyBody::Upstream(b) => b.is_end_stream(),
            ProxyBody::Local(b) => b.is_end_stream(),
            ProxyBody::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Forwarded(b) => b.body.size_hint(),
            ProxyBody::Upstream(b) => b.size_hint(),
            ProxyBody::Local(b) => b.size_hint(),
            ProxyBody::Boxed(b) => b.size_hint(),
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

/// Everything needed to count and log a forwarded request once its response has ended (or was abandoned).
pub(crate) struct Finish {
    pub ctx: Rc<WorkerCtx>,
    pub snapshot: Arc<Snapshot>,
    pub route: usize,
    pub cluster: usize,
    pub endpoint: usize,
    pub head: RequestHead,
    pub peer: IpAddr,
    /// The listener's index in `snapshot` (`ListenerSettings::index`).
    pub listener: usize,
    pub status: u16,
    /// Response body bytes sent.
    pub bytes: u64,
    pub done: bool,
    pub retries: u32,
    pub started: Instant,
    pub upstream_started: Instant,
}

impl Finish {
    pub fn done(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let bytes = self.bytes;
        let worker = self.ctx.index;
        let cluster = &self.snapshot.clusters[self.cluster];
        let endpoint = &cluster.endpoints[self.endpoint];
        endpoint.end(worker);
        let counters = slot(&cluster.stats.slots, worker);
        counters.requests.add(-1);
        counters.retries_active.add(-i64::from(self.retries));
        let what = (Next::KeepAlive, self.status, bytes);
        let outcome = upstream_outcome(endpoint, worker, what, self.upstream_started, self.retries);
        let route = self.snapshot.router.get(self.route);
        let from = Peer { client: self.peer, http2: true, listener: self.listener };
        record(&self.ctx, &self.snapshot, route, &self.head, from, &outcome, self.started.elapsed());
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.done();
    }
}

/// A forwarded response body that counts its bytes and records the request when it ends.
pub(crate) struct Recorded {
    pub body: Incoming,
    pub finish: Finish,
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
                    this.finish.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.finish.done(),
            Poll::Pending => {}
        }
        polled.map_err(Into::into)
    }
}

/// Most body bytes handed on in one frame.
const MAX_FRAME_DATA: usize = 64 * 1024;

/// An HTTP/1 upstream's response body, decoded as it is read and handed on as frames. When the body ends
/// whole, a connection that may be reused goes back to the worker's pool; the request is recorded then, or
/// when the body is dropped (the client reset the stream).
pub(crate) struct UpstreamBody {
    source: Source,
    framing: BodyFraming,
    /// Bytes of a `Length` body still to come.
    left: u64,
    decoder: ChunkedDecoder,
    /// The connection may be pooled when the body ends.
    reusable: bool,
    read_timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    ended: bool,
    finish: Finish,
}

impl UpstreamBody {
    pub fn new(source: Source, framing: BodyFraming, reusable: bool, read_timeout: Duration, finish: Finish) -> Self {
        let left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        let mut body = UpstreamBody {
            source,
            framing,
            left,
            decoder: ChunkedDecoder::default(),
            reusable,
            read_timeout,
            timer: None,
            ended: false,
            finish,
        };
        if matches!(framing, BodyFraming::None | BodyFraming::Length(0)) {
            // Nothing to read: hyper will not poll an empty body, so it ends here.
            body.ended = true;
            body.complete();
        }
        body
    }

    fn buf(&mut self) -> &mut BytesMut {
        match &mut self.source {
            Source::Conn(conn) => &mut conn.buf,
            Source::Buffered(buf) => buf,
        }
    }

    /// The next piece of body from what is buffered: `Ok(None)` when more must be read, `Err` for a malformed
    /// chunked body.
    fn take(&mut self) -> Result<Option<Frame<Bytes>>, &'static str> {
        match self.framing {
            BodyFraming::None => {
                self.ended = true;
                Ok(None)
            }
            BodyFraming::Length(_) => {
                if self.left == 0 {
                    self.ended = true;
                    return Ok(None);
                }
                let left = self.left;
                let buf = self.buf();
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = (left.min(buf.len() as u64) as usize).min(MAX_FRAME_DATA);
                let data = buf.split_to(n).freeze();
                self.left -= n as u64;
                Ok(Some(Frame::data(data)))
            }
            BodyFraming::Chunked => {
                let mut decoder = std::mem::take(&mut self.decoder);
                let decoded = decoder.decode(self.buf(), MAX_FRAME_DATA);
                self.decoder = decoder;
                match decoded? {
                    Decoded::Data(data) => Ok(Some(Frame::data(data))),
                    Decoded::NeedMore => Ok(None),
                    Decoded::Done => {
                        self.ended = true;
                        Ok(None)
                    }
                }
            }
            BodyFraming::UntilClose => {
                let buf = self.buf();
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = buf.len().min(MAX_FRAME_DATA);
                Ok(Some(Frame::data(buf.split_to(n).freeze())))
            }
        }
    }

    /// The body ended whole: the connection goes back to the pool when it can, the request is recorded.
    fn complete(&mut self) {
        let source = std::mem::replace(&mut self.source, Source::Buffered(BytesMut::new()));
        if let Source::Conn(conn) = source {
            if self.reusable && (conn.buf.is_empty() || conn.has_followers()) {
                let f = &self.finish;
                let cluster = &f.snapshot.clusters[f.cluster];
                let endpoint = &cluster.endpoints[f.endpoint];
                let bodiless = self.framing == BodyFraming::None;
                crate::pipeline::release(&f.ctx.pool, None, cluster, endpoint, conn, bodiless);
            }
        }
        self.finish.done();
    }

    /// The upstream failed inside the body: counted against the endpoint, and the stream is reset.
    fn fail(&mut self, reason: &'static str) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let f = &self.finish;
        let cluster = &f.snapshot.clusters[f.cluster];
        observe(cluster, &cluster.endpoints[f.endpoint], f.ctx.index, Observed::GatewayFailure);
        self.ended = true;
        self.source = Source::Buffered(BytesMut::new());
        self.finish.done();
        Poll::Ready(Some(Err(reason.into())))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match this.take() {
                Err(reason) => return this.fail(reason),
                Ok(Some(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        this.finish.bytes += data.len() as u64;
                    }
                    this.timer = None;
                    if this.framing == BodyFraming::Length(this.finish.bytes) {
                        // The last bytes: the body ends with this frame (END_STREAM on it, not on an empty frame
                        // after it, which some clients take for data past the end), and the connection is free.
                        this.ended = true;
                        this.complete();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(None) if this.ended => {
                    this.complete();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
            }
            // A buffered body that ends before its framing says is the upstream's fault (`poll_fill` says so).
            match poll_fill(&mut this.source, cx, &mut this.timer, this.read_timeout) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(reason)) => return this.fail(reason),
                Poll::Ready(Ok(Filled::Eof)) if this.framing == BodyFraming::UntilClose => {
                    this.ended = true;
                    this.reusable = false;
                    this.complete();
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(Filled::Eof)) => return this.fail("upstream closed inside the response body"),
                Poll::Ready(Ok(Filled::More)) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            BodyFraming::Length(_) => SizeHint::with_exact(self.left),
            BodyFraming::None => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
