//! Response bodies of any origin as one type: `http_body::Body` of `Bytes` frames (data, then optionally
//! trailers), boxed. A handler answers with one, body filters wrap one, and the writers of both protocols
//! take one: the body is polled only as fast as the client takes it (back-pressure), and its `size_hint`
//! decides the framing (an exact size: `content-length`; otherwise chunked on HTTP/1.1, no length on HTTP/2).
//!
//! The proxy's fast paths do not use it: an upstream's HTTP/1 body is relayed as bytes (`relay`) unless a
//! route's filter asks to wrap it, and only then is it read through `source_body::SourceBody`.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body;
use std::pin::Pin;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body; `'a` is what it may borrow (an HTTP/1 request body read from the client's connection).
pub type BoxBody<'a> = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + 'a>>;

/// Boxes any body of `Bytes`.
pub fn boxed<'a, B>(body: B) -> BoxBody<'a>
where
    B: Body<Data = Bytes> + 'a,
    B::Error: Into<BoxError>,
{
    Box::pin(body.map_err(Into::into))
}

/// A body of these bytes, whole.
pub fn full<'a>(bytes: Bytes) -> BoxBody<'a> {
    boxed(http_body_util::Full::new(bytes))
}
