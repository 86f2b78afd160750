//! Writing a response whose body streams (`stream_body::BoxBody`) to an HTTP/1 client: the head (less what
//! Portico owns), the framing from the body's size (`content-length`, else chunked, or closing for HTTP/1.0),
//! then the body as it comes, each write within the send timeout.

use crate::codec::{self, RequestHead};
use crate::relay::write_timed;
use crate::stream_body::BoxBody;
use crate::upstream::push_u64;
use http_body_util::BodyExt;
use hyper::header::{self, HeaderMap, HeaderName};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncWrite;

/// The reason phrase for a status (empty for one without a registered phrase, as RFC 9112 allows).
pub(crate) fn status_text(status: u16) -> &'static str {
    hyper::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("")
}

/// Headers a handler may not set: Portico writes the framing and the connection's.
pub(crate) const OWNED: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::CONTENT_LENGTH,
];

pub(crate) fn bodiless(head: &RequestHead, status: u16) -> bool {
    head.method() == b"HEAD" || status < 200 || status == 204 || status == 304
}

/// How writing a response ended.
pub(crate) struct Written {
    /// The whole response was sent.
    pub complete: bool,
    pub bytes: u64,
    /// The body was delimited by closing the connection (HTTP/1.0, length unknown).
    pub close_delimited: bool,
}

/// Writes a response to an HTTP/1 client: the head (`headers` less what Portico owns, then the framing and
/// `connection`), then the body as it comes, each write within `send_timeout`. Stops early when `gone`
/// resolves while the body is awaited (the client left). `close`: the connection closes afterwards.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_h1<W: AsyncWrite + Unpin>(
    w: &mut W,
    out: &mut Vec<u8>,
    head: &RequestHead,
    status: u16,
    headers: &HeaderMap,
    mut body: BoxBody<'_>,
    close: bool,
    send_timeout: Duration,
    mut gone: Pin<&mut dyn Future<Output = ()>>,
) -> Written {
    let no_body = bodiless(head, status);
    let length = body.size_hint().exact();
    let chunked = !no_body && length.is_none() && !head.http10;
    let close_delimited = !no_body && length.is_none() && head.http10;
    let close = close || close_delimited;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(status_text(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if OWNED.contains(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key(hyper::header::DATE) {
        crate::date::write_field(out);
    }
    match length {
        Some(n) if status >= 200 && status != 204 && status != 304 => {
            out.extend_from_slice(b"content-length: ");
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        _ if chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    out.extend_from_slice(match (close, head.http10) {
        (true, _) => b"connection: close\r\n\r\n",
        (false, true) => b"connection: keep-alive\r\n\r\n",
        (false, false) => b"\r\n",
    });
    let failed = |bytes| Written { complete: false, bytes, close_delimited };
    if no_body {
        drop(body);
        let sent = write_timed(w, out, send_timeout).await.is_ok();
        return Written { complete: sent, bytes: 0, close_delimited: false };
    }
    // The head waits for the first piece of body when it comes at once, to leave in one write.
    let mut bytes = 0u64;
    let mut head_pending = true;
    loop {
        let frame = match futures_util::FutureExt::now_or_never(body.frame()) {
            Some(frame) => frame,
            None => {
                if std::mem::take(&mut head_pending) {
                    if write_timed(w, out, send_timeout).await.is_err() {
                        return failed(0);
                    }
                    out.clear();
                }
                tokio::select! {
                    frame = body.frame() => frame,
                    () = &mut gone => return failed(bytes),
                }
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                tracing::debug!("response body failed: {e}");
                return failed(bytes);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                _ => continue, // trailers: HTTP/1 clients are not sent them
            },
        };
        bytes += data.len() as u64;
        if length.is_some_and(|n| bytes > n) {
            tracing::warn!("a response body is longer than its announced length; the connection is closed");
            return failed(bytes);
        }
        if !std::mem::take(&mut head_pending) {
            out.clear();
        }
        if chunked {
            codec::chunk_header(out, data.len());
        }
        // Small pieces are copied behind the head or the chunk line; large ones go on their own.
        if data.len() <= 16 * 1024 {
            out.extend_from_slice(&data);
            if chunked {
                out.extend_from_slice(b"\r\n");
            }
            if write_timed(w, out, send_timeout).await.is_err() {
                return failed(bytes);
            }
        } else {
            let sent = write_timed(w, out, send_timeout).await.is_ok()
                && write_timed(w, &data, send_timeout).await.is_ok()
                && (!chunked || write_timed(w, b"\r\n", send_timeout).await.is_ok());
            if !sent {
                return failed(bytes);
            }
        }
        out.clear();
    }
    if length.is_some_and(|n| bytes != n) {
        tracing::warn!("a response body is shorter than its announced length; the connection is closed");
        return failed(bytes);
    }
    if chunked {
        out.extend_from_slice(codec::LAST_CHUNK);
    }
    if !out.is_empty() && write_timed(w, out, send_timeout).await.is_err() {
        return failed(bytes);
    }
    Written { complete: true, bytes, close_delimited }
}
