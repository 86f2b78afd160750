//! In-process handlers: route targets that are code, not a cluster (`handler: echo`, and the JavaScript
//! functions of portico-functions), the `Gate` a function filter is, and the `Subrequests` a handler sends its
//! own requests through.
//!
//! A handler gets the request as Portico would forward it (the head after normalisation and the request
//! filters, the client's facts, the route's path parameters) with its body as a stream, and answers with a
//! status, headers and a streaming body (`stream_body::BoxBody`, an `http_body::Body`). Around it everything
//! else is as for any target: response filters (head and body hooks) run on its answer, the request is
//! counted for its route and logged, and HEAD, framing and keep-alive are Portico's business.
//!
//! The request body:
//! - from an HTTP/1 client, decoded from the connection with the request's framing (`Content-Length` or
//!   chunked; chunked trailers are checked and dropped), within the listener's `timeouts.body_read` per
//!   read. Whatever the handler leaves unread is drained after the response (up to `DRAIN_LIMIT`) or the
//!   connection is closed.
//! - from an HTTP/2 client, the stream's DATA frames and trailers as they come, with HTTP/2 flow control.
//!
//! Either way it is pulled: nothing is read before the handler asks (back-pressure).
//!
//! Workers are current-thread runtimes, so a handler's future need not be `Send`. It may borrow the request
//! but not the handler itself: an HTTP/2 response body outlives the call, so a handler clones into its future
//! what it needs (an `Arc` of its state).

use crate::codec::{BodyFraming, ChunkedDecoder, Decoded, Known, RequestHead};
pub use crate::stream_body::{boxed, full, BoxBody, BoxError};
use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use portico_core::io::Stream;
use std::cell::RefCell;
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A handler's answer: status, headers (hop-by-hop headers and `content-length` are Portico's and ignored) and
/// a streaming body whose `size_hint` decides the framing.
pub type Response<'a> = hyper::Response<BoxBody<'a>>;

/// What a handler's call returns; an error is answered `500` (or cuts the response if its head was sent).
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<Response<'a>, BoxError>> + 'a>>;

/// Makes the handlers of the configuration's `functions:`: the functions plane (crate `portico-functions`)
/// registers one at start (`register_functions`). Without one, a route with `function:` is refused.
pub trait FunctionPlane: Send + Sync {
    /// Compiles function `name`; `Err` says why it cannot serve (with the source's file:line:col).
    fn compile(
        &self,
        name: &str,
        function: &portico_config::Function,
        loaded: &portico_config::LoadedConfig,
    ) -> Result<CompiledFunction, String>;
}

/// What a function can be used as: a route target (it has a `fetch` handler), a filter (an `onRequest` hook,
/// an `onResponse` hook, or both), or both.
pub struct CompiledFunction {
    pub handler: Option<std::sync::Arc<dyn Handler>>,
    pub gate: Option<std::sync::Arc<dyn Gate>>,
    /// An `onResponse` hook: a response filter.
    pub response: Option<std::sync::Arc<dyn crate::filters::Filter>>,
}

/// What a `Gate` decided.
pub type GateFuture<'a> = Pin<Box<dyn Future<Output = Option<crate::message::LocalResponse>> + 'a>>;

/// A request hook that may wait (a JavaScript function used as a filter: `filters: - function: NAME`). The
/// route's gates run after its other request hooks, in order, before its target; each may change the head
/// (headers, path and query, through its edits) or answer instead of the target (`Some`). The request body is
/// not theirs: it stays unread for the target.
pub trait Gate: Send + Sync + Debug {
    fn check<'a>(&'a self, head: &'a mut RequestHead, client: ClientInfo, upstreams: Upstreams) -> GateFuture<'a>;
}

static FUNCTIONS: std::sync::OnceLock<Box<dyn FunctionPlane>> = std::sync::OnceLock::new();

/// Registers the functions plane (once, at start; later calls are ignored).
pub fn register_functions(plane: Box<dyn FunctionPlane>) {
    let _ = FUNCTIONS.set(plane);
}

pub(crate) fn function_plane() -> Option<&'static dyn FunctionPlane> {
    FUNCTIONS.get().map(|p| p.as_ref())
}

pub trait Handler: Send + Sync + Debug {
    /// Answers `req`. The future runs on the worker's thread and is dropped when the client goes away
    /// (HTTP/2: the stream is reset; HTTP/1: the connection closes).
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a>;
}

/// A request a handler sends to a cluster.
#[derive(Debug, Clone)]
pub struct SubRequest {
    pub method: String,
    /// The target in origin form: `/path?query`.
    pub target: String,
    /// The `host` header (the URL's authority).
    pub host: String,
    /// Hop-by-hop fields, `host` and `content-length` among them are Portico's and left out.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// A cluster's answer to a `SubRequest`, its body read whole.
#[derive(Debug, Clone)]
pub struct SubResponse {
    pub status: u16,
    /// The response's fields less hop-by-hop ones, in order.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// Why a `SubRequest` got no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SubrequestError {
    #[error("no cluster named {0:?} in the running configuration")]
    UnknownCluster(String),
    #[error("fetch to cluster {0:?} is not supported: it speaks HTTP/2 to its endpoints")]
    Http2Cluster(String),
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// The cluster could not answer: the status and reason Portico would have answered a client with.
    #[error("cluster {cluster:?}: {status} {reason}")]
    Upstream { cluster: String, status: u16, reason: &'static str },
    #[error("the response body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the response body broke off: {0}")]
    Body(String),
}

pub type SubrequestFuture<'a> = Pin<Box<dyn Future<Output = Result<SubResponse, SubrequestError>> + 'a>>;

/// What a handler sends its own requests through (a function's `fetch()`): the clusters of the configuration
/// its request arrived under, through the same pick-and-retry loop as proxied requests (`subrequest.rs`).
pub trait Subrequests {
    /// The cluster a URL reaches: the one its host names (`http://api/...`), else one with an endpoint at its
    /// origin (`https://api.example.com/...` reaches a cluster whose endpoint is `https://api.example.com:443`):
    /// what the configuration lists is what handlers may reach.
    fn cluster_for(&self, https: bool, host: &str, port: u16) -> Option<String>;
    /// Sends `request` to cluster `cluster` and reads its answer, whose body may be at most `max_body` bytes.
    fn send<'a>(&'a self, cluster: &'a str, request: SubRequest, max_body: usize) -> SubrequestFuture<'a>;
}

/// A handle on `Subrequests`, cheap to clone.
pub type Upstreams = Rc<dyn Subrequests>;

/// Who sent a request, and how.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub addr: SocketAddr,
    /// Over TLS.
    pub https: bool,
    /// Over HTTP/2.
    pub http2: bool,
}

/// A request as a handler gets it.
pub struct Request<'a> {
    /// The head after normalisation and the request filters (`path()`, `origin_form()` and `headers()` show
    /// their edits).
    pub head: RequestHead,
    pub client: ClientInfo,
    /// The route's path parameters (`/users/:id`), by name, percent-encoded as in the path.
    pub params: Vec<(String, String)>,
    pub body: RequestBody<'a>,
    /// The clusters of the configuration the request arrived under, for the handler's own requests.
    pub upstreams: Upstreams,
}

impl Request<'_> {
    pub fn method(&self) -> &[u8] {
        self.head.method()
    }
    /// The headers as Portico would forward them: the client's, less hop-by-hop ones and those the filters
    /// removed, then those the filters added.
    pub fn headers(&self) -> Vec<(&[u8], &[u8])> {
        forwarded_headers(&self.head)
    }
}

/// The headers of `head` as Portico would forward them: the client's, less hop-by-hop ones and those the
/// filters removed, then those the filters added.
pub fn forwarded_headers(head: &RequestHead) -> Vec<(&[u8], &[u8])> {
    let edits = head.edits.as_ref().map(|e| &e.headers).filter(|e| !e.is_empty());
    let mut out = Vec::with_capacity(head.headers.len());
    for (h, kind) in &head.headers {
        let name = head.header_name(h);
        if *kind == Known::HopByHop
            || (!head.connection.is_empty() && head.named_by_connection(name))
            || edits.is_some_and(|e| e.drops(name))
        {
            continue;
        }
        out.push((name, head.header_value(h)));
    }
    if let Some(edits) = edits {
        out.extend(edits.appended.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    }
    out
}

/// A request body, pulled as the handler reads it: `http_body::Body` (data frames, then trailers on HTTP/2),
/// fed to the check a `limits` filter put on the request, if one did: a refused body fails the read.
pub struct RequestBody<'a>(Inner<'a>, Option<std::sync::Arc<crate::body_check::BodyCheck>>);

enum Inner<'a> {
    Empty,
    Http1(Rc<RefCell<Http1Reader<'a>>>),
    Frames(crate::h2_request::ClientBody),
}

impl<'a> RequestBody<'a> {
    pub fn empty() -> RequestBody<'a> {
        RequestBody(Inner::Empty, None)
    }
    pub(crate) fn http1(reader: Rc<RefCell<Http1Reader<'a>>>, head: &RequestHead) -> RequestBody<'a> {
        RequestBody(Inner::Http1(reader), crate::body_check::BodyCheck::of(head))
    }
    pub(crate) fn frames(body: crate::h2_request::ClientBody, head: &RequestHead) -> RequestBody<'a> {
        RequestBody(Inner::Frames(body), crate::body_check::BodyCheck::of(head))
    }
}

impl Body for RequestBody<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = match &mut this.0 {
            Inner::Empty => Poll::Ready(None),
            Inner::Http1(reader) => reader.borrow_mut().poll_data(cx).map(|d| d.map(|d| d.map(Frame::data))),
            Inner::Frames(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        };
        if let (Some(check), Poll::Ready(Some(Ok(frame)))) = (&this.1, &polled) {
            if let Some(Err(refusal)) = frame.data_ref().map(|d| check.feed(d)) {
                return Poll::Ready(Some(Err(refusal.reason.into())));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Empty => true,
            Inner::Http1(reader) => reader.borrow().done,
            Inner::Frames(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Empty => SizeHint::with_exact(0),
            Inner::Http1(reader) => reader.borrow().size_hint(),
            Inner::Frames(body) => body.size_hint(),
        }
    }
}

/// Most bytes of a request body a handler left unread that are read and dropped to keep the connection.
pub(crate) const DRAIN_LIMIT: u64 = 256 * 1024;
/// Most bytes read ahead (a pipelined request) while watching for the client to leave.
const READ_AHEAD: usize = 64 * 1024;

/// An HTTP/1 request body decoded from the client's connection, shared by the handler's `RequestBody` and
/// the connection loop (which watches the connection once the body is in, and drains what is left).
pub(crate) struct Http1Reader<'a> {
    io: tokio::io::ReadHalf<&'a mut Stream>,
    buf: &'a mut BytesMut,
    framing: BodyFraming,
    /// Bytes of a `Length` body still to come.
    left: u64,
    decoder: ChunkedDecoder,
    /// The body ended whole: the connection is ready for the next request.
    pub done: bool,
    /// The body broke off (the client left, was too slow, broke the chunked framing).
    pub failed: bool,
    timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<'a> Http1Reader<'a> {
    pub fn new(
        io: tokio::io::ReadHalf<&'a mut Stream>,
        buf: &'a mut BytesMut,
        framing: BodyFraming,
        timeout: Duration,
    ) -> Self {
        let left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        let done = matches!(framing, BodyFraming::None | BodyFraming::Length(0));
        Http1Reader {
            io,
            buf,
            framing,
            left,
            decoder: ChunkedDecoder::default(),
            done,
            failed: false,
            timeout,
            timer: None,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            BodyFraming::Length(_) => SizeHint::with_exact(self.left),
            _ if self.done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }

    /// The next piece of the body from what is buffered.
    fn take(&mut self) -> Result<Option<Bytes>, &'static str> {
        match self.framing {
            BodyFraming::Length(_) => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let n = (self.left.min(self.buf.len() as u64) as usize).min(64 * 1024);
                self.left -= n as u64;
                self.done = self.left == 0;
                Ok(Some(self.buf.split_to(n).freeze()))
            }
            BodyFraming::Chunked => match self.decoder.decode(self.buf, 64 * 1024)? {
                Decoded::Data(data) => Ok(Some(data)),
                Decoded::NeedMore => Ok(None),
                Decoded::Done => {
                    self.done = true;
                    Ok(None)
                }
            },
            // A request body is never delimited by closing.
            BodyFraming::None | BodyFraming::UntilClose => {
                self.done = true;
                Ok(None)
            }
        }
    }

    fn fail(&mut self, reason: &'static str) -> Poll<Option<Result<Bytes, BoxError>>> {
        self.failed = true;
        Poll::Ready(Some(Err(reason.into())))
    }

    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        loop {
            if self.failed {
                return Poll::Ready(Some(Err("request body broke off".into())));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.take() {
                Err(reason) => return self.fail(reason),
                Ok(Some(data)) => {
                    self.timer = None;
                    return Poll::Ready(Some(Ok(data)));
                }
                Ok(None) if self.done => return Poll::Ready(None),
                Ok(None) => {}
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, self.buf) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return self.fail("the client closed inside the body"),
                Poll::Ready(Ok(_)) => self.timer = None,
                Poll::Pending => {
                    let timeout = self.timeout;
                    let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if timer.as_mut().poll(cx).is_ready() {
                        return self.fail("request body not received in time");
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Ready when the client has gone, as far as can be told: only once the body is in (until then the
    /// handler reads the connection and sees it close). Bytes read meanwhile stay buffered, at most
    /// `READ_AHEAD`. Registers no wake-up while the body is still being read.
    pub fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.failed {
            return Poll::Ready(());
        }
        if !self.done {
            return Poll::Pending;
        }
        loop {
            if self.buf.len() >= READ_AHEAD {
                return Poll::Pending;
            }
            self.buf.reserve(4096);
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, self.buf) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
