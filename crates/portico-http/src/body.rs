//! Where the upstream side reads a request body from, and how it learns that the client left: never a
//! client connection as such, but a `BodySource`.
//!
//! - An HTTP/1 client's connection: a streamed body is decoded from it with the request's framing, and once
//!   the body is in, a reset is the client leaving (its request is abandoned). An end-of-file is not: a client
//!   may close its sending side and wait for its answer, so it is probed (see `ClientEnd`).
//! - Any body delivered in frames (an HTTP/2 stream; later a function or a bridge): read as bytes until its
//!   end. Its request is cancelled by dropping the request's future, which is what the HTTP/2 server does when
//!   the client resets the stream.

use crate::codec::{BodyFraming, ResponseHead};
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::Body;
use portico_core::io::Stream;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

/// The request body as the proxy holds it.
pub(crate) enum ReqBody {
    /// No body, or a body received in full with the head: kept, so the request can be sent again.
    InHand(Bytes),
    /// A body read whole into a temporary file by the route's request buffering: sent with its length, and
    /// again when the request is retried.
    Spooled(crate::request_buffer::SpooledBody),
    /// A body still to stream from the client with this framing.
    Streaming(BodyFraming),
    /// A streamed body, sent in full: the client connection is clean, but the request cannot be replayed.
    Sent,
}

impl ReqBody {
    /// A body the route's request buffering read whole; `head` now declares its length, whatever framing it
    /// came with.
    pub fn buffered(buffered: crate::request_buffer::Buffered, head: &mut crate::codec::RequestHead) -> ReqBody {
        use crate::request_buffer::Buffered;
        match buffered {
            Buffered::Memory(bytes) => {
                head.body = BodyFraming::Length(bytes.len() as u64);
                ReqBody::InHand(bytes)
            }
            Buffered::File(spooled) => {
                head.body = BodyFraming::Length(spooled.len());
                ReqBody::Spooled(spooled)
            }
        }
    }

    /// The request can be sent again (to another connection or endpoint) as it was.
    pub fn replayable(&self) -> bool {
        matches!(self, ReqBody::InHand(_) | ReqBody::Spooled(_))
    }
    /// The client has sent the whole body: its connection is ready for the next request.
    pub fn consumed(&self) -> bool {
        !matches!(self, ReqBody::Streaming(_))
    }
}

/// A request body up to this size that has fully arrived with its head is kept until the response starts,
/// so the request can be replayed on another connection or endpoint.
pub(crate) const REPLAYABLE_BODY: u64 = 64 * 1024;

pub(crate) enum BodySource<'a> {
    Connection {
        io: &'a mut Stream,
        buf: &'a mut BytesMut,
        /// What the connection has shown of the client so far; an end-of-file stays.
        end: &'a mut ClientEnd,
        /// The listener's `timeouts.send`, for the probe of a client that closed its sending side.
        send_timeout: Duration,
    },
    /// An HTTP/2 stream's body; `interim` sends the stream's 1xx responses.
    Frames { reader: &'a mut FrameReader, buf: &'a mut BytesMut, interim: &'a crate::h2_request::Interim },
    /// No client connection: a handler's own request (`subrequest`), whose body is always in hand.
    Detached,
}

/// What an HTTP/1 client has shown of its end of the connection while requests wait for their answers.
///
/// An end-of-file is ambiguous: TCP sends the same FIN for a client that only closed its sending side and
/// waits for its answer (RFC 9112 9.6 lets it) and for one that closed the connection for good. Only writing
/// tells them apart: a socket closed for good answers any byte with a reset. So a client whose answer has
/// not come `PROBE_HALF_CLOSED_AFTER` after its end-of-file is sent an interim `100 Continue` (HTTP/1.1
/// clients must accept 1xx responses they did not ask for, RFC 9110 15.2), and a reset then means it left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ClientEnd {
    /// Nothing seen: the client may send more (pipelined requests).
    #[default]
    Open,
    /// Its sending side closed at this instant: it may be waiting for its answer, or gone.
    HalfClosed(Instant),
    /// It was sent `PROBE`: from now on only a reset says it left.
    Probed,
}

/// How long after a client's end-of-file its answer may take before the client is probed. Most answers come
/// sooner, and a half-closed client then gets its response with nothing before it; a client gone for good
/// holds its upstream request this much longer than a reset would.
const PROBE_HALF_CLOSED_AFTER: Duration = Duration::from_secs(1);

/// What is written to a client that closed its sending side, to learn whether it is still there.
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// What watching the client while its request waits for an answer found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientSeen {
    /// It left (a reset, or a failed read): the request is abandoned.
    Gone,
    /// It closed its sending side `PROBE_HALF_CLOSED_AFTER` ago and its answer has not come: time for
    /// `probe_client`.
    ProbeDue,
}

/// What the upstream side gets from the client side of a request.
pub(crate) struct Downstream<'a> {
    /// What the upstream is told about the client (`x-forwarded-*`, the certificate header).
    pub facts: &'a ClientFacts,
    /// Scratch space for the request head and body pieces.
    pub out: &'a mut Vec<u8>,
    pub body: BodySource<'a>,
}

impl BodySource<'_> {
    /// Passes an upstream's interim (1xx) response on to the client, as RFC 9110 15.2 asks of a proxy: on
    /// HTTP/1.1 as it came, less its hop-by-hop fields; on HTTP/2 as a HEADERS frame; never to an HTTP/1.0
    /// client, which cannot read one. `Err` when the client has gone.
    pub async fn interim(&mut self, bytes: &[u8], resp: &ResponseHead, http10: bool) -> io::Result<()> {
        let forwarded = resp.headers.iter().filter(|h| !resp.is_hop_by_hop(bytes, h.name.get(bytes)));
        match self {
            BodySource::Connection { io, send_timeout, .. } => {
                if http10 {
                    return Ok(());
                }
                let mut out = Vec::with_capacity(bytes.len());
                out.extend_from_slice(b"HTTP/1.1 ");
                // parse_response keeps only three-digit codes.
                let status = resp.status;
                out.extend_from_slice(&[
                    b'0' + (status / 100) as u8,
                    b'0' + (status / 10 % 10) as u8,
                    b'0' + (status % 10) as u8,
                ]);
                out.push(b' ');
                out.extend_from_slice(resp.reason.get(bytes));
                out.extend_from_slice(b"\r\n");
                for h in forwarded {
                    out.extend_from_slice(h.name.get(bytes));
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(h.value.get(bytes));
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"\r\n");
                crate::relay::write_timed(*io, &out, *send_timeout).await
            }
            BodySource::Frames { interim, .. } => {
                let mut response = hyper::Response::new(());
                *response.status_mut() = hyper::StatusCode::from_u16(resp.status).map_err(io::Error::other)?;
                for h in forwarded {
                    let name = hyper::header::HeaderName::from_bytes(h.name.get(bytes));
                    let value = hyper::header::HeaderValue::from_bytes(h.value.get(bytes));
                    if let (Ok(name), Ok(value)) = (name, value) {
                        response.headers_mut().append(name, value);
                    }
                }
                // A stream already reset or answered has nowhere to put it: not a reason to fail the request.
                let _ = interim.borrow_mut().send_informational(response);
                Ok(())
            }
            BodySource::Detached => Ok(()),
        }
    }

    /// Resolves when the client has gone, as far as this source can tell while the request waits for its
    /// response, or when it should be probed: an HTTP/1 connection that is reset (bytes read meanwhile, a
    /// pipelined request, stay in the buffer, at most `limit`), or whose end-of-file is `ProbeDue` when
    /// `may_probe` (an HTTP/1.0 client cannot be sent a 1xx: it is answered whenever the answer comes). Never
    /// for frames, whose request is cancelled by being dropped. Cancel-safe: what it learns is kept in `end`.
    pub async fn watch_client(&mut self, limit: usize, may_probe: bool) -> ClientSeen {
        let BodySource::Connection { io, buf, end, .. } = self else {
            return std::future::pending().await;
        };
        use tokio::io::AsyncReadExt;
        loop {
            match **end {
                ClientEnd::Open => {
                    if buf.len() >= limit {
                        std::future::pending::<()>().await;
                    }
                    buf.reserve(4096);
                    match io.read_buf(*buf).await {
                        Ok(0) => **end = ClientEnd::HalfClosed(Instant::now()),
                        Err(_) => return ClientSeen::Gone,
                        Ok(_) => {}
                    }
                }
                ClientEnd::HalfClosed(since) if may_probe => {
                    let probe_due = tokio::time::sleep_until(since + PROBE_HALF_CLOSED_AFTER);
                    tokio::select! {
                        () = io.reset_by_peer() => return ClientSeen::Gone,
                        () = probe_due => return ClientSeen::ProbeDue,
                    }
                }
                ClientEnd::HalfClosed(_) | ClientEnd::Probed => {
                    io.reset_by_peer().await;
                    return ClientSeen::Gone;
                }
            }
        }
    }

    /// Writes `PROBE` to a client that closed its sending side (see `ClientEnd`). False when it could not be
    /// written within `timeouts.send`: the client is taken for gone (part of the probe may be out, so no
    /// clean answer could follow). Not to be raced against anything, for the same reason.
    pub async fn probe_client(&mut self) -> bool {
        let BodySource::Connection { io, end, send_timeout, .. } = self else {
            return true;
        };
        **end = ClientEnd::Probed;
        let write = async {
            io.write_all(PROBE).await?;
            io.flush().await
        };
        matches!(tokio::time::timeout(*send_timeout, write).await, Ok(Ok(())))
    }
}

/// A frame-delivered body read as bytes: data frames in order, trailers dropped (an HTTP/1 upstream is not
/// sent trailers).
pub(crate) struct FrameReader {
    body: crate::h2_request::ClientBody,
    rest: Bytes,
}

impl FrameReader {
    pub fn new(body: crate::h2_request::ClientBody) -> FrameReader {
        FrameReader { body, rest: Bytes::new() }
    }
}

impl AsyncRead for FrameReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.rest.is_empty() {
                let n = this.rest.len().min(out.remaining());
                out.put_slice(&this.rest[..n]);
                this.rest.advance(n);
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.rest = data;
                    }
                }
            }
        }
    }
}

/// What the upstream is told about the client, worked out once per connection.
#[derive(Clone)]
pub(crate) struct ClientFacts {
    /// The client's address for `x-forwarded-for`.
    pub ip: IpText,
    /// The client connected over TLS: `x-forwarded-proto: https`.
    pub https: bool,
    /// The request came over HTTP/2 (and reaches the engine as HTTP/1.1): `via: 2 portico`.
    pub http2: bool,
    /// With mutual TLS: the header that carries the client certificate's subject (always removed from what
    /// the client sent), and the subject when the client presented a certificate.
    pub cert_header: Option<std::sync::Arc<str>>,
    pub cert_subject: Option<Box<str>>,
}

/// An IP address as text, formatted once per client connection for `x-forwarded-for`.
#[derive(Clone, Copy)]
pub(crate) struct IpText {
    len: u8,
    /// The longest form, an IPv4-mapped IPv6 address, is 45 bytes.
    bytes: [u8; 46],
}

impl IpText {
    pub fn new(ip: std::net::IpAddr) -> IpText {
        use std::io::Write;
        let mut bytes = [0u8; 46];
        let mut rest = &mut bytes[..];
        let _ = write!(rest, "{ip}");
        let len = (46 - rest.len()) as u8;
        IpText { len, bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text() {
        for ip in
            ["127.0.0.1", "::1", "2001:db8::5", "::ffff:255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]
        {
            let parsed: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(parsed).as_bytes(), parsed.to_string().as_bytes());
        }
    }
}
