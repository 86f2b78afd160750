//! Where the upstream side reads a request body from, and how it learns that the client left: never a
//! client connection as such, but a `BodySource`.
//!
//! - An HTTP/1 client's connection: a streamed body is decoded from it with the request's framing, and once
//!   the body is in, the connection closing is the client leaving (its request is abandoned).
//! - Any body delivered in frames (an HTTP/2 stream; later a function or a bridge): read as bytes until its
//!   end. Its request is cancelled by dropping the request's future, which is what the HTTP/2 server does when
//!   the client resets the stream.

use crate::codec::{self, BodyFraming, ResponseHead};
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::Body;
use portico_core::io::Stream;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};

/// The request body as the proxy holds it.
pub(crate) enum ReqBody {
    /// No body, or a body received in full with the head: kept, so the request can be sent again.
    InHand(Bytes),
    /// A body still to stream from the client with this framing.
    Streaming(BodyFraming),
    /// A streamed body, sent in full: the client connection is clean, but the request cannot be replayed.
    Sent,
}

impl ReqBody {
    /// The request can be sent again (to another connection or endpoint) as it was.
    pub fn replayable(&self) -> bool {
        matches!(self, ReqBody::InHand(_))
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
    },
    /// An HTTP/2 stream's body; `interim` sends the stream's 1xx responses.
    Frames {
        reader: &'a mut FrameReader,
        buf: &'a mut BytesMut,
        interim: &'a crate::h2_request::Interim,
    },
}

/// How long writing an interim response to an HTTP/1 client may take (as for Portico's own heads).
const INTERIM_SEND_TIMEOUT: Duration = Duration::from_secs(5);

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
        let forwarded = resp.headers.iter().filter(|h| {
            let name = h.name.get(bytes);
            codec::classify(name) != codec::Known::HopByHop
                && (resp.connection.is_empty() || !resp.named_by_connection(bytes, name))
        });
        match self {
            BodySource::Connection { io, .. } => {
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
                crate::relay::write_timed(*io, &out, INTERIM_SEND_TIMEOUT).await
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
        }
    }

    /// Resolves when the client has gone, as far as this source can tell while the request waits for its
    /// response: an HTTP/1 connection that closes (bytes read meanwhile, a pipelined request, stay in the
    /// buffer, at most `limit`); never for frames, whose request is cancelled by being dropped.
    pub async fn client_gone(&mut self, limit: usize) {
        let BodySource::Connection { io, buf } = self else {
            return std::future::pending().await;
        };
        use tokio::io::AsyncReadExt;
        loop {
            if buf.len() >= limit {
                std::future::pending::<()>().await;
            }
            buf.reserve(4096);
            match io.read_buf(*buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
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
