//! The filter trait and what its hooks are given; the order filters run in is described in `filters`.

use crate::codec::RequestHead;
use crate::message::{LocalResponse, ResponseEdits};
use crate::stream_body::BoxBody;
use std::fmt::Debug;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

/// What the route's match left for the filters.
pub struct RequestCx<'a> {
    /// The path the route matched (normalised), and the captured path parameters as ranges into it, in the
    /// order of the route pattern's names.
    pub matched_path: &'a [u8],
    pub captures: &'a [(u32, u32)],
    /// The route's `path_prefix`, without a trailing slash.
    pub prefix: Option<&'a [u8]>,
    /// The address of the peer that sent the request (IPv4-mapped IPv6 addresses as IPv4).
    pub peer: IpAddr,
    /// Where the route counts and logs the requests its filters refuse.
    pub denials: &'a super::Denials,
}

/// What happens after a request hook.
pub enum Step {
    Continue,
    /// Answer with this response; later filters and the target do not run (response hooks still do).
    Respond(LocalResponse),
    /// The hook needs work done off the worker's thread (a slow password hash): the request waits for it
    /// (the worker serves others meanwhile), then the `Resume` it gives decides, and the chain goes on.
    Wait(Wait),
}

/// Work a request hook waits for; it runs on the worker's thread and gives what decides the request.
pub type Wait = Pin<Box<dyn Future<Output = Resume>>>;

/// What a hook makes of the work it waited for, applied to the request on the worker's thread.
pub type Resume = Box<dyn FnOnce(&mut RequestHead, &RequestCx<'_>) -> Step>;

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Continue => f.write_str("Continue"),
            Step::Respond(r) => f.debug_tuple("Respond").field(r).finish(),
            Step::Wait(_) => f.write_str("Wait"),
        }
    }
}

pub trait Filter: Send + Sync + Debug {
    /// Before the target.
    fn on_request(&self, _head: &mut RequestHead, _cx: &RequestCx<'_>) -> Step {
        Step::Continue
    }
    /// Before the response head is written. `status` is the response's.
    fn on_response(&self, _head: &RequestHead, _status: u16, _edits: &mut ResponseEdits) {}
    /// Whether `on_response` does anything: filters that only act on requests cost nothing on responses.
    fn has_response_hook(&self) -> bool {
        false
    }
    /// Wraps the response body (compression). Runs after every `on_response` of the chain, in the chain's
    /// order, for responses that have a body (not to HEAD, not 1xx, 204 or 304): proxied, made by a handler
    /// or made by Portico. `resp` is the head as it will be sent so far; changes to it go into `edits`. The
    /// returned body's `size_hint` decides the framing: a body whose length is no longer known goes out
    /// chunked (HTTP/1.1) or without `content-length` (HTTP/2). Return `body` itself to leave it alone.
    fn wrap_response_body<'b>(
        &self,
        _head: &RequestHead,
        _resp: &ResponseView<'_>,
        _edits: &mut ResponseEdits,
        body: BoxBody<'b>,
    ) -> BoxBody<'b> {
        body
    }
    /// Whether `wrap_response_body` may wrap anything: a route none of whose filters has one keeps its
    /// responses on the byte-relaying fast path.
    fn has_body_hook(&self) -> bool {
        false
    }
}

/// A response head as a body hook sees it.
pub struct ResponseView<'r> {
    pub status: u16,
    /// The headers as they will be sent (the response hooks' edits applied, `content-length` included when
    /// the length is known).
    pub headers: &'r hyper::HeaderMap,
}

/// A route's filters, global ones first, shared by the requests that use them.
pub type Chain = Arc<[Arc<dyn Filter>]>;
