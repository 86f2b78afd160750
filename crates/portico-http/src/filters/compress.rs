//! `compress`: gzip response bodies, streaming, for clients whose `Accept-Encoding` allows it (q-values
//! honoured, `*` included). A response of a configured type says `Vary: Accept-Encoding` whether or not this
//! client gets it compressed, so a cache keeps both. Left alone: responses already encoded, partial
//! (`206`, `Content-Range`), marked `Cache-Control: no-transform`, or known to be smaller than `min_size`. A
//! compressed body has no known length (chunked on HTTP/1.1), its strong `ETag` becomes weak (the bytes
//! differ) and `Accept-Ranges` is dropped. What has been compressed is flushed whenever the source body
//! waits, so a slowly streamed response still arrives piece by piece.

use super::filter::{Filter, ResponseView};
use crate::codec::RequestHead;
use crate::message::ResponseEdits;
use crate::stream_body::{BoxBody, BoxError};
use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderMap, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_RANGE, CONTENT_TYPE, ETAG, VARY};
use portico_config::CompressFilter;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

#[derive(Debug)]
pub struct Compress {
    /// (type, subtype), lower case; subtype `None` for `type/*`.
    types: Vec<(String, Option<String>)>,
    min_size: u64,
    level: u32,
    accept_encoding: Arc<str>,
}

impl Compress {
    pub fn new(c: &CompressFilter) -> Compress {
        let types = c
            .types
            .iter()
            .filter_map(|t| {
                let (ty, sub) = t.split_once('/')?;
                Some((ty.trim().to_ascii_lowercase(), Some(sub.trim().to_ascii_lowercase()).filter(|s| s != "*")))
            })
            .collect();
        Compress { types, min_size: c.min_size.0, level: c.level, accept_encoding: Arc::from("Accept-Encoding") }
    }

    fn compressible(&self, headers: &HeaderMap) -> bool {
        let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
        let essence = ct.split(';').next().unwrap_or_default().trim();
        let Some((ty, sub)) = essence.split_once('/') else { return false };
        self.types
            .iter()
            .any(|(t, s)| t.eq_ignore_ascii_case(ty) && s.as_deref().is_none_or(|s| s.eq_ignore_ascii_case(sub)))
    }
}

/// Whether any value of `name` lists `token` (comma-separated, case-insensitive).
fn lists(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case(token))
}

/// Whether `Accept-Encoding` allows gzip: `gzip` (or `x-gzip`) with q > 0, or `*` with q > 0 when gzip is not
/// listed itself.
pub(crate) fn accepts_gzip(head: &RequestHead) -> bool {
    let mut star = None;
    for value in head.values("accept-encoding") {
        let Ok(value) = std::str::from_utf8(value) else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
                .next()
                .map_or(1.0, |q| q.trim().parse::<f32>().unwrap_or(0.0));
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                return q > 0.0;
            }
            if coding == "*" {
                star = Some(q > 0.0);
            }
        }
    }
    star.unwrap_or(false)
}

impl Filter for Compress {
    fn has_body_hook(&self) -> bool {
        true
    }

    fn wrap_response_body<'b>(
        &self,
        head: &RequestHead,
        resp: &ResponseView<'_>,
        edits: &mut ResponseEdits,
        body: BoxBody<'b>,
    ) -> BoxBody<'b> {
        let headers = resp.headers;
        if !self.compressible(headers)
            || resp.status == 206
            || headers.contains_key(CONTENT_RANGE)
            || headers.get(CONTENT_ENCODING).is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
            || lists(headers, CACHE_CONTROL, "no-transform")
        {
            return body;
        }
        // From here the answer depends on Accept-Encoding, for this client or another.
        if !lists(headers, VARY, "accept-encoding") && !lists(headers, VARY, "*") {
            edits.vary(&self.accept_encoding);
        }
        if body.size_hint().exact().is_some_and(|n| n < self.min_size) || !accepts_gzip(head) {
            return body;
        }
        edits.set("content-encoding", "gzip");
        edits.remove("accept-ranges");
        if let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok()).filter(|e| !e.starts_with("W/")) {
            edits.set("etag", format!("W/{etag}"));
        }
        Box::pin(Gzip {
            inner: body,
            encoder: Some(GzEncoder::new(Vec::with_capacity(8 * 1024), Compression::new(self.level))),
            dirty: false,
            trailers: None,
        })
    }
}

/// A body gzip-compressed as it is polled.
struct Gzip<'b> {
    inner: BoxBody<'b>,
    /// `None` once finished.
    encoder: Option<GzEncoder<Vec<u8>>>,
    /// Bytes went into the encoder since it was last flushed.
    dirty: bool,
    /// The source's trailers, sent after the compressed data.
    trailers: Option<HeaderMap>,
}

impl Gzip<'_> {
    fn take_output(&mut self) -> Option<Bytes> {
        let out = self.encoder.as_mut()?.get_mut();
        (!out.is_empty()).then(|| Bytes::from(std::mem::take(out)))
    }
}

impl Body for Gzip<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(encoder) = this.encoder.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if data.is_empty() {
                            continue;
                        }
                        if let Err(e) = encoder.write_all(&data) {
                            return Poll::Ready(Some(Err(e.into())));
                        }
                        this.dirty = true;
                        if encoder.get_ref().len() >= 16 * 1024 {
                            if let Some(out) = this.take_output() {
                                return Poll::Ready(Some(Ok(Frame::data(out))));
                            }
                        }
                    }
                    Err(frame) => this.trailers = frame.into_trailers().ok(),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    let Some(encoder) = this.encoder.take() else { continue };
                    match encoder.finish() {
                        Ok(out) if !out.is_empty() => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
                        Ok(_) => continue,
                        Err(e) => return Poll::Ready(Some(Err(e.into()))),
                    }
                }
                Poll::Pending => {
                    // The source waits: what it gave so far goes out now (a sync flush), not with the next piece.
                    if std::mem::take(&mut this.dirty) {
                        if let Err(e) = encoder.flush() {
                            return Poll::Ready(Some(Err(e.into())));
                        }
                        if let Some(out) = this.take_output() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.encoder.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{parse_request, take_request, HeadLimits, Parsed};

    fn head(accept: &str) -> RequestHead {
        let raw = format!("GET / HTTP/1.1\r\nhost: x\r\naccept-encoding: {accept}\r\n\r\n");
        let limits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };
        let mut buf = bytes::BytesMut::from(raw.as_bytes());
        match parse_request(&buf, &limits) {
            Ok(Parsed::Complete(head, used)) => take_request(&mut buf, head, used),
            _ => panic!("unparsed"),
        }
    }

    #[test]
    fn accept_encoding_with_q_values() {
        for (value, gzip) in [
            ("gzip", true),
            ("br, gzip;q=0.5", true),
            ("GZIP", true),
            ("gzip;q=0", false),
            ("gzip; q=0.000", false),
            ("deflate, br", false),
            ("*", true),
            ("*;q=0", false),
            ("gzip;q=0, *", false),
            ("identity", false),
            ("x-gzip;q=0.1", true),
        ] {
            assert_eq!(accepts_gzip(&head(value)), gzip, "{value}");
        }
    }
}
