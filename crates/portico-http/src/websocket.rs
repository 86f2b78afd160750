//! WebSocket endpoints served in the process: a route target (`mqtt: websocket`) whose HTTP/1.1 WebSocket
//! handshake Portico answers itself, after which the connection belongs to a [`WebSocketService`] as a byte
//! stream ([`WebSocketBytes`]: binary messages in, binary messages out; the framing is tungstenite's).
//!
//! portico-http does not know the broker: the binary registers the MQTT service at start-up
//! ([`register_mqtt_websocket`]); without one the route answers `503`. A request that is no proper handshake
//! gets `426` (not an upgrade, or another WebSocket version) or `400` (no key, no subprotocol the endpoint
//! speaks), and keeps its connection. Over HTTP/2 the route answers `400`: WebSockets over HTTP/2 (RFC 8441)
//! are not supported, and browsers then use HTTP/1.1 for them.
//!
//! The upgraded connection is counted and logged as one request with status `101` when it ends; the
//! listener's HTTP timeouts no longer apply (the service has its own: MQTT's keep-alive). On shutdown the
//! service is told through [`Upgraded::shutdown`].

use crate::client::{reply, Client};
use crate::codec::{trim, BodyFraming, RequestHead};
use crate::context::WorkerCtx;
use crate::message::LocalResponse;
use crate::outcome::{Next, Outcome};
use crate::relay::write_timed;
use crate::snapshot::ListenerSettings;
use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream as _};
use portico_core::io::Stream;
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// The read buffer of a WebSocket connection, allocated up front: small, so an idle MQTT client stays cheap
/// (tungstenite's default is 128 KiB); a larger message grows it while it arrives.
const READ_BUFFER: usize = 4 * 1024;

/// What serves the connections of a WebSocket route once the handshake is answered.
pub trait WebSocketService: Send + Sync {
    /// The largest message (and frame) accepted from a client; a larger one closes the connection with 1009.
    /// It bounds what one client can make Portico buffer before the service sees a byte.
    fn max_message_size(&self) -> usize;
    /// Serves the connection until it ends. The future runs on the worker that accepted the connection.
    fn serve<'a>(&'a self, stream: WebSocketBytes<'a>, client: Upgraded) -> Pin<Box<dyn Future<Output = ()> + 'a>>;
}

/// Who is on the other end of an upgraded connection.
pub struct Upgraded {
    pub peer: SocketAddr,
    /// Over TLS with a client certificate the listener verified: its CN, else its first subject alternative name.
    pub certificate_user: Option<String>,
    /// The worker's index (for per-worker counters).
    pub worker: usize,
    /// Becomes true when the process starts shutting down.
    pub shutdown: watch::Receiver<bool>,
}

static MQTT: OnceLock<Box<dyn WebSocketService>> = OnceLock::new();

/// Registers the broker as what `mqtt: websocket` routes hand their connections to (once, at start; later calls
/// are ignored).
pub fn register_mqtt_websocket(service: Box<dyn WebSocketService>) {
    let _ = MQTT.set(service);
}

/// What a WebSocket route serves (defined with the router's targets, which name it).
pub use crate::router::WebSocketEndpoint as Endpoint;

impl Endpoint {
    fn service(self) -> Option<&'static dyn WebSocketService> {
        match self {
            Endpoint::Mqtt => MQTT.get().map(|s| s.as_ref()),
        }
    }

    /// The subprotocols it speaks, preferred first. MQTT's is `mqtt` (MQTT 3.1.1 and 5.0, section 6);
    /// MQTT 3.1 clients (mqtt.js with `protocolVersion: 3`, Paho's JavaScript client) offer `mqttv3.1`.
    fn subprotocols(self) -> &'static [&'static str] {
        match self {
            Endpoint::Mqtt => &["mqtt", "mqttv3.1"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Endpoint::Mqtt => "MQTT",
        }
    }
}

/// The answer to a request that is no handshake this endpoint takes: `Err(response)`; else the
/// `Sec-WebSocket-Accept` value and the subprotocol chosen.
fn check(head: &RequestHead, endpoint: Endpoint) -> Result<(String, &'static str), LocalResponse> {
    let upgrade_required = |reason: String| {
        let mut resp = LocalResponse::text(426, &reason);
        resp.headers.push(("upgrade".into(), "websocket".into()));
        resp.headers.push(("sec-websocket-version".into(), "13".into()));
        resp
    };
    let first = endpoint.subprotocols()[0];
    if !head.upgrade_websocket {
        return Err(upgrade_required(format!(
            "this route serves {} over WebSocket: send an HTTP/1.1 GET with `Upgrade: websocket`, `Connection: \
             Upgrade` and `Sec-WebSocket-Protocol: {first}`",
            endpoint.name()
        )));
    }
    if !head.values("sec-websocket-version").any(|v| trim(v) == b"13") {
        return Err(upgrade_required("only WebSocket version 13 (RFC 6455) is spoken".into()));
    }
    let keys: Vec<&[u8]> = head.values("sec-websocket-key").map(trim).collect();
    // A base64-encoded 16-byte nonce (RFC 6455 4.1): 22 characters and `==`.
    let base64 = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/');
    let key = match keys.as_slice() {
        [key] if key.len() == 24 && key[..22].iter().all(base64) && key.ends_with(b"==") => *key,
        _ => return Err(LocalResponse::text(400, "the WebSocket handshake needs one valid Sec-WebSocket-Key")),
    };
    let offered: Vec<&[u8]> =
        head.values("sec-websocket-protocol").flat_map(|v| v.split(|&b| b == b',')).map(trim).collect();
    let Some(protocol) = endpoint.subprotocols().iter().find(|p| offered.contains(&p.as_bytes())) else {
        return Err(LocalResponse::text(
            400,
            &format!("offer the WebSocket subprotocol `{first}` (Sec-WebSocket-Protocol: {first})"),
        ));
    };
    Ok((tokio_tungstenite::tungstenite::handshake::derive_accept_key(key), protocol))
}

/// Answers the request on a WebSocket route to an HTTP/1 client: the handshake's `101`, then the service
/// until the connection ends; or why not.
pub(crate) async fn serve_h1(
    client: &mut Client,
    head: &RequestHead,
    endpoint: Endpoint,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> Outcome {
    // A refusal keeps the connection when nothing of a body is left to read.
    let body_done = head.body == BodyFraming::None;
    let (accept, protocol) = match check(head, endpoint) {
        Ok(accepted) => accepted,
        Err(resp) => return reply(client, head, &resp, body_done).await,
    };
    let Some(service) = endpoint.service() else {
        let reason = format!("no {} service runs in this process", endpoint.name());
        return reply(client, head, &LocalResponse::text(503, &reason), body_done).await;
    };
    client.response_started = true;
    let edits = client.response_edits(head, 101);
    let out = &mut client.out;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n");
    out.extend_from_slice(b"sec-websocket-accept: ");
    out.extend_from_slice(accept.as_bytes());
    out.extend_from_slice(b"\r\nsec-websocket-protocol: ");
    out.extend_from_slice(protocol.as_bytes());
    out.extend_from_slice(b"\r\n");
    // The filters' fields, but never one that would change the handshake or the framing.
    for (name, value) in edits.iter().flat_map(|e| &e.appended) {
        let name_lc = name.to_ascii_lowercase();
        let handshake = matches!(&*name_lc, "upgrade" | "connection" | "content-length" | "transfer-encoding")
            || name_lc.starts_with("sec-websocket-");
        if !handshake {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    crate::date::write_field(out);
    out.extend_from_slice(b"\r\n");
    let head_bytes = out.len() as u64;
    if write_timed(&mut client.io, out, settings.send_timeout).await.is_err() {
        return Outcome::local(Next::Close, 499, 0);
    }
    out.clear();
    let certificate_user = match &client.io {
        Stream::Tls(tls) => portico_core::tls::client_identity(tls.get_ref().1),
        _ => None,
    };
    // Frames the client sent before it saw the 101 are the start of the stream.
    let early = std::mem::take(&mut client.buf).to_vec();
    let written = Cell::new(0u64);
    let io = Counted { io: &mut client.io, written: &written };
    let limit = service.max_message_size();
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        // Each write is one message, sent at once: the service buffers its own writes.
        .write_buffer_size(0)
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit));
    let ws = WebSocketStream::from_partially_read(io, early, Role::Server, Some(config)).await;
    let upgraded = Upgraded { peer: client.peer, certificate_user, worker: ctx.index, shutdown: ctx.shutdown.clone() };
    service.serve(WebSocketBytes { ws, pending: Bytes::new(), fault: None }, upgraded).await;
    Outcome::local(Next::Close, 101, head_bytes + written.get())
}

/// The answer to a request for a WebSocket route over HTTP/2.
pub(crate) fn refuse_h2(endpoint: Endpoint) -> LocalResponse {
    LocalResponse::text(
        400,
        &format!(
            "{} over WebSocket needs HTTP/1.1 (WebSockets over HTTP/2, RFC 8441, are not supported)",
            endpoint.name()
        ),
    )
}

/// The client's connection, counting the bytes written to it (for the access log).
struct Counted<'a> {
    io: &'a mut Stream,
    written: &'a Cell<u64>,
}

impl AsyncRead for Counted<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted<'_> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.written.set(this.written.get() + n as u64);
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
    }
}

/// A WebSocket connection as a byte stream: the payloads of the client's binary messages, in order, are what
/// is read (a message may hold part of what the service reads at once, or several of its pieces), and every
/// write goes out as one binary message. Pings are answered, and a close from the client is answered and
/// ends the stream. A text message or a broken frame is answered with a close (1003, 1002; 1009 for a message
/// over the limit) and reads as an error.
pub struct WebSocketBytes<'a> {
    ws: WebSocketStream<Counted<'a>>,
    /// What is left of the binary message being read.
    pending: Bytes,
    /// Why the stream stops: the close frame still to send (`None` once sent) and the error to read.
    fault: Option<(Option<CloseFrame>, &'static str)>,
}

impl WebSocketBytes<'_> {
    fn refuse(&mut self, code: CloseCode, why: &'static str) {
        self.fault = Some((Some(CloseFrame { code, reason: why.into() }), why));
    }

    /// Sends the pending close frame, as far as the client takes it; its failure changes nothing.
    fn poll_close_frame(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((frame, _)) = &mut self.fault else {
            return Poll::Ready(());
        };
        if frame.is_some() {
            match Pin::new(&mut self.ws).poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(())) => {}
            }
            if let Some(frame) = frame.take() {
                if Pin::new(&mut self.ws).start_send(Message::Close(Some(frame))).is_err() {
                    return Poll::Ready(());
                }
            }
        }
        Pin::new(&mut self.ws).poll_flush(cx).map(|_| ())
    }
}

fn io_error(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::ErrorKind::BrokenPipe.into(),
        e => io::Error::other(e),
    }
}

impl AsyncRead for WebSocketBytes<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some((_, why)) = this.fault {
                ready!(this.poll_close_frame(cx));
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
            }
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                // The close handshake is done (or the connection closed): the end of the stream.
                None => return Poll::Ready(Ok(())),
                Some(Ok(Message::Binary(data))) => this.pending = data,
                Some(Ok(Message::Text(_))) => {
                    this.refuse(CloseCode::Unsupported, "MQTT over WebSocket is carried in binary messages")
                }
                // tungstenite queues the pong, and the close that answers a close, and sends them on the next
                // read (the loop's).
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_))) => {}
                Some(Err(WsError::Io(e))) => return Poll::Ready(Err(e)),
                Some(Err(WsError::Capacity(_))) => this.refuse(CloseCode::Size, "the message is over the size limit"),
                Some(Err(_)) => this.refuse(CloseCode::Protocol, "the WebSocket framing is broken"),
            }
        }
    }
}

impl AsyncWrite for WebSocketBytes<'_> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(io_error)?;
        let message = Message::Binary(Bytes::copy_from_slice(data));
        Pin::new(&mut this.ws).start_send(message).map_err(io_error)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws).poll_flush(cx).map_err(io_error)
    }

    /// Sends a close (1000) unless one went already; the connection itself is closed by its owner.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws).poll_close(cx).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(extra: &str) -> RequestHead {
        let text = format!("GET /mqtt HTTP/1.1\r\nhost: a\r\n{extra}\r\n");
        let limits = crate::codec::HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };
        match crate::codec::parse_request(text.as_bytes(), &limits) {
            Ok(crate::codec::Parsed::Complete(head, used)) => {
                crate::codec::take_request(&mut bytes::BytesMut::from(text.as_bytes()), head, used)
            }
            _ => panic!("not a complete head: {text:?}"),
        }
    }

    const HANDSHAKE: &str = "connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
                             sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

    #[test]
    fn a_handshake_offering_mqtt_is_accepted_with_rfc_6455s_accept_key() {
        let (accept, protocol) = check(&head(&format!("{HANDSHAKE}sec-websocket-protocol: mqtt\r\n")), Endpoint::Mqtt)
            .unwrap_or_else(|r| panic!("{}", String::from_utf8_lossy(&r.body)));
        // The example of RFC 6455 1.3.
        assert_eq!((accept.as_str(), protocol), ("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "mqtt"));
        let both = head(&format!("{HANDSHAKE}sec-websocket-protocol: mqttv3.1, mqtt\r\n"));
        assert_eq!(check(&both, Endpoint::Mqtt).map(|a| a.1).ok(), Some("mqtt"));
        let v31 = head(&format!("{HANDSHAKE}sec-websocket-protocol: mqttv3.1\r\n"));
        assert_eq!(check(&v31, Endpoint::Mqtt).map(|a| a.1).ok(), Some("mqttv3.1"));
    }

    #[test]
    fn what_is_no_handshake_gets_426_or_400() {
        let status = |extra: &str| check(&head(extra), Endpoint::Mqtt).err().map(|r| r.status);
        assert_eq!(status(""), Some(426));
        assert_eq!(status("sec-websocket-protocol: mqtt\r\nupgrade: websocket\r\n"), Some(426));
        let v8 = HANDSHAKE.replace("version: 13", "version: 8");
        assert_eq!(status(&format!("{v8}sec-websocket-protocol: mqtt\r\n")), Some(426));
        assert_eq!(status(HANDSHAKE), Some(400), "no subprotocol");
        assert_eq!(status(&format!("{HANDSHAKE}sec-websocket-protocol: chat\r\n")), Some(400));
        let short_key = HANDSHAKE.replace("dGhlIHNhbXBsZSBub25jZQ==", "abc");
        assert_eq!(status(&format!("{short_key}sec-websocket-protocol: mqtt\r\n")), Some(400));
        let two_keys =
            format!("{HANDSHAKE}sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-protocol: mqtt\r\n");
        assert_eq!(status(&two_keys), Some(400));
    }
}
