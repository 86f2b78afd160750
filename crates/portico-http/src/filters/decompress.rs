//! `decompress`: for upstreams that always compress, a response body encoded with gzip, brotli or zstd is
//! decoded, as it streams, for a client whose `Accept-Encoding` does not take that coding (or that sends
//! none). A client that takes it gets the body as it came. Either way the response says `Vary:
//! Accept-Encoding`. A decoded response loses `Content-Encoding`, its length (chunked on HTTP/1.1),
//! `Accept-Ranges`, and the strength of its `ETag`.
//!
//! Left alone: partial responses (`206`, `Content-Range`: a range of encoded bytes cannot be decoded alone),
//! `Cache-Control: no-transform`, several stacked codings, and codings not listed in `encodings`.
//!
//! A decompression bomb (a small body that decodes to gigabytes) is defused by `max_size`: a response that
//! decodes to more is cut off there (HTTP/1.1: the connection closes before the last chunk; HTTP/2: the
//! stream is reset), and while it decodes at most a slice's expansion is held (see `coding`).

use super::coding::{coding_of, Accepted, Coded, Decoder};
use super::compress::lists;
use super::filter::{Filter, ResponseView};
use crate::codec::RequestHead;
use crate::message::ResponseEdits;
use crate::stream_body::BoxBody;
use hyper::header::{CACHE_CONTROL, CONTENT_ENCODING, CONTENT_RANGE, ETAG, VARY};
use portico_config::{Coding, DecompressFilter};
use std::sync::Arc;

#[derive(Debug)]
pub struct Decompress {
    codings: Vec<Coding>,
    max_size: u64,
    accept_encoding: Arc<str>,
}

impl Decompress {
    pub fn new(c: &DecompressFilter) -> Decompress {
        Decompress {
            codings: c.encodings.clone(),
            max_size: c.max_size.0,
            accept_encoding: Arc::from("Accept-Encoding"),
        }
    }
}

impl Filter for Decompress {
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
        let mut values = headers.get_all(CONTENT_ENCODING).iter();
        let (Some(value), None) = (values.next(), values.next()) else { return body };
        let Some(coding) = coding_of(value.as_bytes()).filter(|c| self.codings.contains(c)) else { return body };
        if resp.status == 206 || headers.contains_key(CONTENT_RANGE) || lists(headers, CACHE_CONTROL, "no-transform") {
            return body;
        }
        if !lists(headers, VARY, "accept-encoding") && !lists(headers, VARY, "*") {
            edits.vary(&self.accept_encoding);
        }
        if Accepted::of(head).is_some_and(|a| a.q(coding) > 0) {
            return body;
        }
        let decoder = match Decoder::new(coding, self.max_size) {
            Ok(decoder) => decoder,
            Err(e) => {
                tracing::debug!(error = %e, "decompress: no decoder");
                return body;
            }
        };
        edits.remove("content-encoding");
        edits.remove("accept-ranges");
        if let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok()).filter(|e| !e.starts_with("W/")) {
            edits.set("etag", format!("W/{etag}"));
        }
        Box::pin(Coded::decoding(body, decoder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::coding::tests::head_with;
    use crate::filters::coding::{Codec, Encoder};
    use http_body_util::BodyExt;
    use hyper::HeaderMap;

    fn run(
        accept: Option<&str>,
        headers: &[(&str, &str)],
        body: Vec<u8>,
        max: u64,
    ) -> (HeaderMap, Result<Vec<u8>, String>) {
        let head = head_with(&accept.map(|a| format!("accept-encoding: {a}\r\n")).unwrap_or_default());
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(hyper::header::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
        }
        let body: BoxBody<'static> =
            Box::pin(http_body_util::Full::new(bytes::Bytes::from(body)).map_err(|e| match e {}));
        let mut edits = ResponseEdits::default();
        let f = Decompress::new(&DecompressFilter { max_size: portico_config::ByteSize(max), ..Default::default() });
        let out = f.wrap_response_body(&head, &ResponseView { status: 200, headers: &map }, &mut edits, body);
        edits.apply(&mut map);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let collected =
            rt.block_on(async { out.collect().await.map(|c| c.to_bytes().to_vec()).map_err(|e| e.to_string()) });
        (map, collected)
    }

    fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new(coding, 3).unwrap();
        e.write(data).unwrap();
        e.finish().unwrap();
        std::mem::take(e.output())
    }

    #[test]
    fn decodes_for_clients_that_do_not_take_the_coding() {
        let plain = b"{\"hello\": \"world\"}".repeat(1000);
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let encoded = encode(coding, &plain);
            let headers = [("content-encoding", coding.token()), ("etag", "\"x\""), ("accept-ranges", "bytes")];
            for accept in [None, Some("identity"), Some("deflate"), Some(&*format!("{};q=0, *", coding.token()))] {
                let (map, body) = run(accept, &headers, encoded.clone(), 1 << 20);
                assert_eq!(body.as_deref(), Ok(&plain[..]), "{coding:?} {accept:?}");
                assert!(map.get(CONTENT_ENCODING).is_none() && map.get("accept-ranges").is_none());
                assert_eq!(map.get(ETAG).unwrap(), "W/\"x\"");
                assert_eq!(map.get(VARY).unwrap(), "Accept-Encoding");
            }
            // A client that takes it: as it came.
            let (map, body) = run(Some("gzip, br, zstd"), &headers, encoded.clone(), 1 << 20);
            assert_eq!(body.as_deref(), Ok(&encoded[..]), "{coding:?}");
            assert_eq!(map.get(CONTENT_ENCODING).unwrap(), coding.token());
            assert_eq!(map.get(VARY).unwrap(), "Accept-Encoding");
            // Past max_size: cut off.
            let (_, body) = run(None, &headers, encoded.clone(), 1000);
            assert!(body.unwrap_err().contains("more than 1000 bytes"), "{coding:?}");
        }
        // Left alone: stacked codings, ranges, no-transform, an unknown coding.
        let gz = encode(Coding::Gzip, &plain);
        for headers in [
            vec![("content-encoding", "gzip"), ("content-encoding", "br")],
            vec![("content-encoding", "gzip"), ("content-range", "bytes 0-9/100")],
            vec![("content-encoding", "gzip"), ("cache-control", "no-transform")],
            vec![("content-encoding", "deflate")],
        ] {
            let (_, body) = run(None, &headers, gz.clone(), 1 << 20);
            assert_eq!(body.as_deref(), Ok(&gz[..]), "{headers:?}");
        }
    }
}
