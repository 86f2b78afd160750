//! `compress`: zstd, brotli or gzip response bodies, streaming, for clients whose `Accept-Encoding` allows one
//! (q-values honoured, `*` included; among codings of equal q the configured order decides). A response of a
//! configured type says `Vary: Accept-Encoding` whether or not this client gets it compressed, so a cache
//! keeps both. Left alone: responses already encoded, partial (`206`, `Content-Range`), marked
//! `Cache-Control: no-transform`, or known to be smaller than `min_size`. A compressed body has no known
//! length (chunked on HTTP/1.1), its strong `ETag` becomes weak (the bytes differ) and `Accept-Ranges` is
//! dropped. What has been compressed is flushed whenever the source body waits (`coding::Coded`), so a
//! slowly streamed response still arrives piece by piece.

use super::coding::{Accepted, Coded, Encoder};
use super::filter::{Filter, ResponseView};
use crate::codec::RequestHead;
use crate::message::ResponseEdits;
use crate::stream_body::BoxBody;
use hyper::body::Body;
use hyper::header::{HeaderMap, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_RANGE, CONTENT_TYPE, ETAG, VARY};
use portico_config::{Coding, CompressFilter};
use std::sync::Arc;

#[derive(Debug)]
pub struct Compress {
    /// (type, subtype), lower case; subtype `None` for `type/*`.
    types: Vec<(String, Option<String>)>,
    min_size: u64,
    /// The codings offered, preferred first, with their levels.
    offered: Vec<Coding>,
    levels: [u32; 3],
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
        Compress {
            types,
            min_size: c.min_size.0,
            offered: c.encodings.clone(),
            levels: [c.level, c.brotli_level, c.zstd_level.max(1) as u32],
            accept_encoding: Arc::from("Accept-Encoding"),
        }
    }

    fn level(&self, coding: Coding) -> u32 {
        match coding {
            Coding::Gzip => self.levels[0],
            Coding::Brotli => self.levels[1],
            Coding::Zstd => self.levels[2],
        }
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
pub(crate) fn lists(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case(token))
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
        if body.size_hint().exact().is_some_and(|n| n < self.min_size) {
            return body;
        }
        let Some(coding) = Accepted::of(head).and_then(|a| a.best(&self.offered)) else { return body };
        let encoder = match Encoder::new(coding, self.level(coding)) {
            Ok(encoder) => encoder,
            Err(e) => {
                // Only zstd's C library can fail here (out of memory): the body goes as it is.
                tracing::debug!(error = %e, "compress: no encoder");
                return body;
            }
        };
        edits.set("content-encoding", coding.token());
        edits.remove("accept-ranges");
        if let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok()).filter(|e| !e.starts_with("W/")) {
            edits.set("etag", format!("W/{etag}"));
        }
        Box::pin(Coded::encoding(body, encoder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::coding::tests::head_with;
    use http_body_util::BodyExt;

    fn wrap(c: &CompressFilter, accept: &str, headers: &[(&str, &str)], len: usize) -> (ResponseEdits, bool) {
        let head = head_with(&format!("accept-encoding: {accept}\r\n"));
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(hyper::header::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
        }
        let body: BoxBody<'static> =
            Box::pin(http_body_util::Full::new(bytes::Bytes::from(vec![b'a'; len])).map_err(|e| match e {}));
        let mut edits = ResponseEdits::default();
        let out =
            Compress::new(c).wrap_response_body(&head, &ResponseView { status: 200, headers: &map }, &mut edits, body);
        let wrapped = out.size_hint().exact().is_none();
        (edits, wrapped)
    }

    fn applied(edits: &ResponseEdits) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(ETAG, "\"v1\"".parse().unwrap());
        edits.apply(&mut map);
        map
    }

    #[test]
    fn picks_the_coding_and_marks_the_response() {
        let c = CompressFilter::default();
        let json = [("content-type", "application/json; charset=utf-8")];
        let with_etag = [json[0], ("etag", "\"v1\"")];
        for (accept, coding) in
            [("gzip", "gzip"), ("gzip, br", "br"), ("gzip, br, zstd", "zstd"), ("br;q=0.5, gzip", "gzip")]
        {
            let (edits, wrapped) = wrap(&c, accept, &with_etag, 4096);
            assert!(wrapped, "{accept}");
            let map = applied(&edits);
            assert_eq!(map.get(CONTENT_ENCODING).map(|v| v.to_str().unwrap()), Some(coding), "{accept}");
            assert_eq!(map.get(ETAG).map(|v| v.to_str().unwrap()), Some("W/\"v1\""));
            assert_eq!(map.get(VARY).map(|v| v.to_str().unwrap()), Some("Accept-Encoding"));
        }
        // Not accepted, too small, another type, already encoded: as it was; varying unless never compressed.
        let (edits, wrapped) = wrap(&c, "deflate", &json, 4096);
        assert!(!wrapped && applied(&edits).get(CONTENT_ENCODING).is_none() && applied(&edits).get(VARY).is_some());
        let (_, wrapped) = wrap(&c, "gzip", &json, 100);
        assert!(!wrapped, "below min_size");
        let (edits, wrapped) = wrap(&c, "gzip", &[("content-type", "image/png")], 4096);
        assert!(!wrapped && applied(&edits).get(VARY).is_none());
        let (_, wrapped) = wrap(&c, "gzip", &[json[0], ("content-encoding", "br")], 4096);
        assert!(!wrapped, "already encoded");
        let (_, wrapped) = wrap(&c, "gzip", &[json[0], ("cache-control", "public, no-transform")], 4096);
        assert!(!wrapped, "no-transform");
        let only_gzip = CompressFilter { encodings: vec![Coding::Gzip], ..CompressFilter::default() };
        let (edits, _) = wrap(&only_gzip, "zstd, br, gzip;q=0.1", &json, 4096);
        assert_eq!(applied(&edits).get(CONTENT_ENCODING).map(|v| v.to_str().unwrap()), Some("gzip"));
    }

    #[test]
    fn the_levels_reach_the_encoders() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| format!("{{\"n\":{}}},", i % 977).into_bytes()).collect();
        let size = |coding: Coding, level: u32| {
            let mut e = Encoder::new(coding, level).unwrap();
            crate::filters::coding::Codec::write(&mut e, &data).unwrap();
            crate::filters::coding::Codec::finish(&mut e).unwrap();
            crate::filters::coding::Codec::output(&mut e).len()
        };
        assert!(size(Coding::Gzip, 9) < size(Coding::Gzip, 1));
        assert!(size(Coding::Brotli, 9) < size(Coding::Brotli, 0));
        assert!(size(Coding::Zstd, 19) < size(Coding::Zstd, 1));
    }
}
