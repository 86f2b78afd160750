//! An HTTP/1 client's connection as the request path holds it, and what Portico writes to it itself: local
//! answers through the route's response filters, and the closing fields of a proxied response head.

use crate::codec::RequestHead;
use crate::filters;
use crate::h1_response::{status_text, write_h1};
use crate::message::{LocalResponse, ResponseEdits};
use crate::outcome::{Next, Outcome};
use crate::relay::write_timed;
use crate::snapshot::{Cluster, Endpoint};
use crate::stream_body::full;
use crate::upstream::push_u64;
use bytes::BytesMut;
use hyper::header;
use portico_core::io::Stream;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

/// The most bytes of a body made by Portico written at once.
const LOCAL_BODY_PIECE: usize = 64 * 1024;

/// An HTTP/1 client connection.
pub(crate) struct Client {
    pub io: Stream,
    pub buf: BytesMut,
    pub peer: SocketAddr,
    /// What the upstream is told about the client.
    pub facts: crate::body::ClientFacts,
    /// Scratch space for heads written to either side, reused across requests.
    pub out: Vec<u8>,
    /// The current request's response has begun (its head was written, or is being): a failure now can only
    /// close the connection, not answer with an error.
    pub response_started: bool,
    /// The current request's filter chain, for the response hooks of whatever writes its response head.
    pub filters: Option<crate::filters::Chain>,
    /// The listener's `timeouts.send`: how long the client may refuse each piece of a body Portico sends.
    pub send_timeout: Duration,
    /// What the connection has shown of the client's end while it waited for answers (an end-of-file).
    pub end: crate::body::ClientEnd,
    /// Requests the client pipelined, read ahead to share an upstream write (`pool.pipeline_depth`); made when
    /// the client first pipelines to such a cluster.
    pub pipeline: Option<Box<crate::pipeline::ClientPipeline>>,
}

impl Client {
    /// More requests may come on this connection: the client has not closed its sending side, or had sent
    /// more before it did (still in the buffer, or read ahead into the pipeline queue). Otherwise the connection closes after the current answer.
    pub fn more_requests_possible(&self) -> bool {
        self.end == crate::body::ClientEnd::Open
            || !self.buf.is_empty()
            || self.pipeline.as_ref().is_some_and(|p| !p.is_empty())
    }

    /// The response filters' edits for a response to `head` with `status`.
    pub fn response_edits(&self, head: &RequestHead, status: u16) -> Option<ResponseEdits> {
        self.filters.as_ref().map(|chain| crate::filters::response_edits(chain, head, status))
    }
}

/// Answers locally, keeping the connection when the request was complete and the client wants it.
pub(crate) async fn answer(
    client: &mut Client,
    head: &RequestHead,
    status: u16,
    reason: &str,
    body_done: bool,
) -> Outcome {
    reply(client, head, &LocalResponse::text(status, reason), body_done).await
}

/// A response made by Portico to an HTTP/1 client, on a route whose filters wrap bodies.
pub(crate) async fn reply_wrapped(
    client: &mut Client,
    head: &RequestHead,
    resp: &LocalResponse,
    body_done: bool,
) -> Outcome {
    let close = !body_done || !head.keep_alive;
    let edits = client.response_edits(head, resp.status).unwrap_or_default();
    let (parts, bytes) = resp.to_http(&edits).into_parts();
    let mut headers = parts.headers;
    headers.remove(header::CONTENT_LENGTH);
    let body = match &client.filters {
        Some(chain) => filters::wrap_body(chain, head, resp.status, &mut headers, full(bytes)),
        None => full(bytes),
    };
    client.response_started = true;
    let gone = pin!(std::future::pending::<()>());
    let (send, out) = (client.send_timeout, &mut client.out);
    let written = write_h1(&mut client.io, out, head, resp.status, &headers, body, close, send, gone).await;
    let next = match close || !written.complete || written.close_delimited {
        true => Next::Close,
        false => Next::KeepAlive,
    };
    Outcome::local(next, resp.status, written.bytes)
}

/// Sends a response made by Portico to a request, through the route's response filters.
pub(crate) async fn reply(client: &mut Client, head: &RequestHead, resp: &LocalResponse, body_done: bool) -> Outcome {
    if client.filters.as_deref().is_some_and(crate::filters::has_body_hooks) {
        return Box::pin(reply_wrapped(client, head, resp, body_done)).await;
    }
    let close = !body_done || !head.keep_alive;
    let edits = client.response_edits(head, resp.status);
    let written = write_local(client, resp, Some(head), close, edits.as_ref()).await;
    let next = if close || written.is_err() { Next::Close } else { Next::KeepAlive };
    Outcome::local(next, resp.status, written.unwrap_or(0))
}

/// The last fields of a proxied response head: a `date` when the upstream sent none, the sticky cookie when
/// the balancer set one, and what the connection does next (an HTTP/1.0 client kept alive must be told, or it closes).
pub(crate) fn end_response_head(
    out: &mut Vec<u8>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    (set_cookie, dated): (bool, bool),
    keep_alive: bool,
    http10: bool,
) {
    if !dated {
        crate::date::write_field(out);
    }
    if set_cookie {
        out.extend_from_slice(b"set-cookie: ");
        out.extend_from_slice(cluster.balancer.cookie_for(endpoint).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A short plain-text answer to a request that could not be read, closing the connection.
pub(crate) async fn respond_error(client: &mut Client, status: u16, reason: &str, close: bool) -> io::Result<u64> {
    write_local(client, &LocalResponse::text(status, reason), None, close, None).await
}

/// Writes a response made by Portico: its headers, then `edits`' (the response filters'), the framing and the
/// body (none for HEAD). An HTTP/1.0 client kept alive is told so, or it would close. Returns the body bytes.
async fn write_local(
    client: &mut Client,
    resp: &LocalResponse,
    head: Option<&RequestHead>,
    close: bool,
    edits: Option<&ResponseEdits>,
) -> io::Result<u64> {
    client.response_started = true;
    let http10 = head.is_some_and(|h| h.http10);
    let send_body = head.is_none_or(|h| h.method() != b"HEAD") && !matches!(resp.status, 204 | 304);
    let out = &mut client.out;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(resp.status));
    out.push(b' ');
    out.extend_from_slice(status_text(resp.status).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &resp.headers {
        if edits.is_some_and(|e| e.drops(name.as_bytes())) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(edits) = edits {
        edits.write_appended(out);
    }
    if !resp.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("date")) {
        crate::date::write_field(out);
    }
    if resp.status != 204 {
        out.extend_from_slice(b"content-length: ");
        push_u64(out, resp.body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(match (close, http10) {
        (true, _) => b"connection: close\r\n\r\n",
        (false, true) => b"connection: keep-alive\r\n\r\n",
        (false, false) => b"\r\n",
    });
    let body: &[u8] = if send_body { &resp.body } else { &[] };
    if body.len() <= LOCAL_BODY_PIECE / 4 {
        out.extend_from_slice(body);
        write_timed(&mut client.io, out, Duration::from_secs(5)).await?;
    } else {
        // A large body (a static file) goes in pieces, each within the listener's send timeout, so a slow
        // client is held to a rate, not to a deadline for the whole file.
        write_timed(&mut client.io, out, Duration::from_secs(5)).await?;
        for piece in body.chunks(LOCAL_BODY_PIECE) {
            write_timed(&mut client.io, piece, client.send_timeout).await?;
        }
    }
    Ok(body.len() as u64)
}
