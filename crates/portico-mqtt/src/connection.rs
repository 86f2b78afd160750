//! The connection driver: [`serve`] runs one MQTT connection over any byte stream, from CONNECT to close,
//! against a shared [`Broker`].
//!
//! One task per connection, on the worker's current-thread runtime, owning the stream, a read buffer and a
//! write buffer. It waits on four things at once: bytes from the client, the session's wake-up (a message
//! queued by a publisher on any worker), the oldest acknowledgement waiting for the store, and the keep-alive
//! deadline; plus the takeover signal. Decoded packets share the read buffer's allocation (a PUBLISH
//! payload routed to a thousand subscribers is one allocation); encoding copies it once per subscriber, into
//! that subscriber's write buffer.
//!
//! Acknowledgements (PUBACK, PUBREC, PUBCOMP, SUBACK, UNSUBACK) are written in the order of the packets they
//! answer [MQTT-4.6.0-2]; one that depends on the store waits for its commit, and the ones behind it wait too,
//! while the connection keeps reading (so a client's in-flight window keeps the group commit fed).
//!
//! Errors close the connection and never escape it: a malformed packet or a protocol violation is answered,
//! in v5, with a DISCONNECT carrying the reason code (a CONNACK before the connection is accepted) and the
//! connection is closed; the will is then published as after any abnormal end.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::sleep_until;
use tracing::debug;

use crate::auth::Verdict;
use crate::broker::{Attached, Broker, ConnectParams};
use crate::codec::{
    ConnAck, ConnAckProperties, Connect, DecodeError, Disconnect, Packet, PacketId, ProtocolVersion, Publish,
    PublishAck, QoS, ReasonCode, SubAck, Subscribe, UnsubAck, Unsubscribe, Will,
};
use crate::config::Limits;
use crate::message::Message;
use crate::metrics::Counter;
use crate::session::Outbound;
use crate::store::{StoreError, StoreOp};

/// Bytes read from the socket at a time, at least.
const READ_CHUNK: usize = 8 * 1024;

/// How long a drain waits for the store to commit what the connection's pending acknowledgements depend on.
pub const DRAIN_ACKS: Duration = Duration::from_secs(2);

/// How a connection ended. Returned for logging and tests; every case has already been handled.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("no CONNECT within the connect timeout")]
    ConnectTimeout,
    #[error("the connection closed before CONNECT")]
    ClosedBeforeConnect,
    #[error("CONNECT refused: {0:?}")]
    Refused(ReasonCode),
    #[error("malformed packet: {0}")]
    Decode(#[from] DecodeError),
    #[error("protocol error ({reason:?}): {what}")]
    Protocol { reason: ReasonCode, what: &'static str },
    #[error("keep-alive timeout")]
    KeepAliveTimeout,
    #[error("session taken over by another connection")]
    TakenOver,
    #[error("the client closed the connection without DISCONNECT")]
    Closed,
    #[error("the store failed: {0}")]
    Store(Arc<StoreError>),
    #[error("the server is shutting down")]
    ServerShutdown,
}

type StoreWait = Pin<Box<dyn Future<Output = Result<(), Arc<StoreError>>> + Send>>;

/// An acknowledgement waiting for the store, or for the ones before it.
struct PendingAck {
    wait: Option<StoreWait>,
    packet: Packet,
    /// Counted in the inbound window until written (a QoS 1 PUBLISH's PUBACK).
    frees_inbound: bool,
}

/// Serves one connection until it ends. `worker` is the index of the worker thread (for per-worker metrics).
/// The future is not `Send`-bound by design: it runs on the worker's current-thread runtime.
pub async fn serve<S>(stream: S, peer: SocketAddr, broker: &Broker, worker: usize) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    serve_until(stream, peer, broker, worker, std::future::pending()).await
}

/// [`serve`], ended by the server when `shutdown` completes (a graceful drain): acknowledgements already
/// waiting for the store are written once it has committed them (for at most [`DRAIN_ACKS`]), then a v5
/// client gets DISCONNECT with Server shutting down (0x8B) and the connection closes; a 3.1/3.1.1 client's
/// connection just closes (those versions have no server DISCONNECT). The will is published as after any
/// connection the server closes [MQTT-3.1.2-8]. A connection still before CONNECT is closed at once.
pub async fn serve_until<S, F>(
    stream: S,
    peer: SocketAddr,
    broker: &Broker,
    worker: usize,
    shutdown: F,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    serve_as(stream, peer, None, broker, worker, shutdown).await
}

/// [`serve_until`] for a client whose verified TLS certificate names it `certificate_user` (its CN, or
/// first SAN): with `mqtt.auth.use_certificate_as_username` that is its user name, and no password is asked.
pub async fn serve_as<S, F>(
    stream: S,
    peer: SocketAddr,
    certificate_user: Option<String>,
    broker: &Broker,
    worker: usize,
    shutdown: F,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    broker.metrics().inc(worker, Counter::ConnectionsAccepted);
    let mut io = Io { stream, rbuf: BytesMut::with_capacity(READ_CHUNK), wbuf: BytesMut::new() };
    let limits = broker.limits();
    let connecting = tokio::time::timeout(limits.connect_timeout, read_connect(&mut io, limits.max_packet_size));
    let connect = tokio::select! {
        connect = connecting => match connect {
            Ok(Ok(connect)) => connect,
            Ok(Err(err)) => {
                if matches!(err, ConnectionError::Decode(_) | ConnectionError::Protocol { .. }) {
                    broker.metrics().inc(worker, Counter::ProtocolErrors);
                }
                debug!(%peer, error = %err, "MQTT connection closed before CONNECT completed");
                return Err(err);
            }
            Err(_) => return Err(ConnectionError::ConnectTimeout),
        },
        _ = &mut shutdown => {
            let _ = io.stream.shutdown().await;
            return Err(ConnectionError::ServerShutdown);
        }
    };
    let version = connect.version;
    let mut conn = match accept(&mut io, &connect, peer, certificate_user, broker, worker, limits).await? {
        Some(conn) => conn,
        None => return Err(ConnectionError::Refused(ReasonCode::ClientIdentifierNotValid)),
    };
    broker.metrics().inc(worker, Counter::Connections);
    let result = conn.run(&mut io, shutdown).await;
    broker.metrics().add(worker, Counter::Connections, -1);
    // Anything but a DISCONNECT without 0x04 publishes the will [MQTT-3.1.2-8], [MQTT-3.14.4-3].
    let will = match (&result, conn.will.take()) {
        (Ok(true), _) | (_, None) => None,
        (_, Some(will)) => {
            let delay = will.properties.will_delay_interval.unwrap_or(0);
            Some((Message::from_will(&will), delay))
        }
    };
    broker.disconnect(&conn.attached.session, conn.attached.connection, will);
    match &result {
        Err(ConnectionError::TakenOver) => broker.metrics().inc(worker, Counter::TakenOver),
        Err(ConnectionError::KeepAliveTimeout) => broker.metrics().inc(worker, Counter::KeepAliveTimeouts),
        Err(ConnectionError::Decode(_) | ConnectionError::Protocol { .. }) => {
            broker.metrics().inc(worker, Counter::ProtocolErrors)
        }
        _ => {}
    }
    debug!(%peer, client_id = %conn.attached.session.client_id(), %version, result = ?result.as_ref().err(), "MQTT connection ended");
    result.map(|_| ())
}

/// The stream and its buffers.
struct Io<S> {
    stream: S,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Io<S> {
    /// Reads more bytes; `Ok(false)` at end of stream.
    async fn read_more(&mut self) -> std::io::Result<bool> {
        self.rbuf.reserve(READ_CHUNK);
        Ok(self.stream.read_buf(&mut self.rbuf).await? > 0)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Writes `packet` and closes (an error answer).
    async fn send_and_close(&mut self, packet: Packet, version: ProtocolVersion) {
        if packet.encode(version, &mut self.wbuf).is_ok() {
            let _ = self.flush().await;
        }
        let _ = self.stream.shutdown().await;
    }
}

/// The protocol level a CONNECT in `buf` announces, read from the raw bytes: for answering a CONNECT the
/// codec refuses in the version it was written in.
fn connect_level(buf: &[u8]) -> Option<u8> {
    let mut at = 1;
    while *buf.get(at)? & 0x80 != 0 {
        at += 1;
        if at > 4 {
            return None;
        }
    }
    at += 1;
    let name_len = usize::from(u16::from_be_bytes([*buf.get(at)?, *buf.get(at + 1)?]));
    buf.get(at + 2 + name_len).copied()
}

/// Reads the first packet, which must be CONNECT [MQTT-3.1.0-1].
async fn read_connect<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    max_packet_size: u32,
) -> Result<Box<Connect>, ConnectionError> {
    loop {
        // Read before decoding, which consumes a whole packet even when it refuses it.
        let level = connect_level(&io.rbuf);
        match Packet::decode(&mut io.rbuf, ProtocolVersion::V5, max_packet_size) {
            Ok(Some(Packet::Connect(connect))) => return Ok(connect),
            Ok(Some(_)) => {
                let _ = io.stream.shutdown().await;
                return Err(ConnectionError::Protocol {
                    reason: ReasonCode::ProtocolError,
                    what: "the first packet is not CONNECT [MQTT-3.1.0-1]",
                });
            }
            Ok(None) => {
                if !io.read_more().await? {
                    return Err(ConnectionError::ClosedBeforeConnect);
                }
            }
            Err(err) => {
                // CONNACK with the reason where the version has one: v5 takes any, 3.1.1 only "unacceptable
                // protocol version" [MQTT-3.1.2-2]; otherwise just close [MQTT-4.8.0-1].
                let answer = match (&err, level) {
                    (DecodeError::UnsupportedProtocolVersion { .. }, Some(5)) | (_, Some(5)) => {
                        Some((ConnAck::refused(err.reason_code()), ProtocolVersion::V5))
                    }
                    (DecodeError::UnsupportedProtocolVersion { .. }, _) => {
                        Some((ConnAck::refused(ReasonCode::UnsupportedProtocolVersion), ProtocolVersion::V3_1_1))
                    }
                    _ => None,
                };
                match answer {
                    Some((connack, version)) => io.send_and_close(Packet::ConnAck(connack), version).await,
                    None => {
                        let _ = io.stream.shutdown().await;
                    }
                }
                return Err(err.into());
            }
        }
    }
}

/// Checks CONNECT, attaches the session and answers CONNACK. `None` when the CONNECT was refused.
async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    connect: &Connect,
    peer: SocketAddr,
    certificate_user: Option<String>,
    broker: &Broker,
    worker: usize,
    limits: Arc<Limits>,
) -> Result<Option<Conn>, ConnectionError> {
    let version = connect.version;
    let v5 = version.is_v5();
    let refuse = |reason: ReasonCode| Packet::ConnAck(ConnAck::refused(reason));
    // Enhanced authentication is not offered: a method the server does not support (3.1.2.11.9).
    if connect.properties.authentication_method.is_some() {
        broker.metrics().inc(worker, Counter::ConnectRefused);
        io.send_and_close(refuse(ReasonCode::BadAuthenticationMethod), version).await;
        return Ok(None);
    }
    if v5 && connect.will.as_ref().is_some_and(|will| !will.payload_matches_format()) {
        broker.metrics().inc(worker, Counter::ConnectRefused);
        io.send_and_close(refuse(ReasonCode::PayloadFormatInvalid), version).await;
        return Ok(None);
    }
    let mut assigned = None;
    let client_id = if connect.client_id.is_empty() {
        // 3.1 requires an id; 3.1.1 allows none only with Clean Session [MQTT-3.1.3-8]; v5 assigns one.
        if version == ProtocolVersion::V3_1 || (version == ProtocolVersion::V3_1_1 && !connect.clean_start) {
            broker.metrics().inc(worker, Counter::ConnectRefused);
            io.send_and_close(refuse(ReasonCode::ClientIdentifierNotValid), version).await;
            return Ok(None);
        }
        let id: ByteString = format!("portico-{:016x}", fastrand::u64(..)).into();
        assigned = Some(id.clone());
        id
    } else {
        connect.client_id.clone()
    };
    // Credentials, checked against the users and ACL in force now; a password hash is slow on purpose, so
    // it is checked on a blocking thread, not the worker's.
    let auth = broker.auth();
    let username = connect.username.as_ref().map(|u| u.to_string());
    let verdict = if username.is_some() && auth.users.is_some() {
        let (auth, username, password) = (auth.clone(), username.clone(), connect.password.clone());
        let cert = certificate_user.clone();
        tokio::task::spawn_blocking(move || auth.check(username.as_deref(), password.as_deref(), cert.as_deref()))
            .await
            .unwrap_or(Verdict::NotAuthorized)
    } else {
        auth.check(username.as_deref(), connect.password.as_deref(), certificate_user.as_deref())
    };
    let user = match verdict {
        Verdict::Accepted(user) => user,
        Verdict::BadCredentials | Verdict::NotAuthorized => {
            let (reason, why) = if verdict == Verdict::BadCredentials {
                (ReasonCode::BadUserNameOrPassword, "bad user name or password")
            } else {
                (ReasonCode::NotAuthorized, "no credentials, and anonymous clients are not allowed")
            };
            broker.metrics().inc(worker, Counter::ConnectRefused);
            broker.metrics().inc(worker, Counter::AuthFailures);
            crate::auth::log_failure(peer, &client_id, username.as_deref(), why);
            io.send_and_close(refuse(reason), version).await;
            return Err(ConnectionError::Refused(reason));
        }
    };
    // A will is a publish: the ACL must allow its topic (refused at CONNECT, as Mosquitto 2 does).
    if let Some(will) = &connect.will {
        if !auth.acl.can_publish(user.as_deref(), &client_id, &will.topic) {
            broker.metrics().inc(worker, Counter::ConnectRefused);
            broker.metrics().inc(worker, Counter::AclDeniedPublish);
            io.send_and_close(refuse(ReasonCode::NotAuthorized), version).await;
            return Err(ConnectionError::Refused(ReasonCode::NotAuthorized));
        }
    }
    let requested_expiry = if v5 {
        connect.properties.session_expiry_interval.unwrap_or(0)
    } else if connect.clean_start {
        0
    } else {
        u32::MAX
    };
    let expiry = requested_expiry.min(limits.max_session_expiry);
    let keep_alive = if v5 && connect.keep_alive > limits.max_keepalive && limits.max_keepalive > 0 {
        limits.max_keepalive
    } else {
        connect.keep_alive
    };
    let attached = broker.connect(ConnectParams { client_id, version, clean_start: connect.clean_start, expiry });
    let mut connack = ConnAck::accepted(attached.session_present);
    if v5 {
        connack.properties = ConnAckProperties {
            session_expiry_interval: (expiry != requested_expiry).then_some(expiry),
            receive_maximum: std::num::NonZeroU16::new(limits.receive_maximum),
            maximum_packet_size: std::num::NonZeroU32::new(limits.max_packet_size),
            assigned_client_identifier: assigned,
            topic_alias_maximum: Some(limits.topic_alias_maximum),
            server_keep_alive: (keep_alive != connect.keep_alive).then_some(keep_alive),
            ..ConnAckProperties::default()
        };
    }
    Packet::ConnAck(connack).encode(version, &mut io.wbuf).map_err(|_| ConnectionError::Protocol {
        reason: ReasonCode::ImplementationSpecificError,
        what: "CONNACK does not encode",
    })?;
    let client_receive_maximum = connect.properties.receive_maximum.map_or(u16::MAX, |n| n.get());
    Ok(Some(Conn {
        broker: broker.clone(),
        worker,
        version,
        send_window: usize::from(client_receive_maximum.min(limits.max_inflight)),
        client_max_packet: connect.properties.maximum_packet_size.map_or(u32::MAX, |n| n.get()),
        keep_alive: (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500)),
        will: connect.will.clone(),
        session_expiry_was_zero: requested_expiry == 0,
        aliases: HashMap::new(),
        pending: VecDeque::new(),
        inbound_qos1: 0,
        outbound: Vec::new(),
        attached,
        limits,
        user,
    }))
}

/// An accepted connection's state.
struct Conn {
    broker: Broker,
    /// The authenticated user name (`None`: anonymous), for the ACL.
    user: Option<String>,
    worker: usize,
    version: ProtocolVersion,
    attached: Attached,
    /// The broker's limits when the connection was accepted (a reload does not change what CONNACK said).
    limits: Arc<Limits>,
    /// QoS 1 and 2 messages the broker may have in flight to the client.
    send_window: usize,
    /// The client's Maximum Packet Size (v5).
    client_max_packet: u32,
    /// 1.5 times the Keep Alive [MQTT-3.1.2-24]; `None` when it is 0.
    keep_alive: Option<Duration>,
    will: Option<Will>,
    /// For [MQTT-3.14.2-2]: a DISCONNECT may not set a non-zero Session Expiry Interval then.
    session_expiry_was_zero: bool,
    /// Topic aliases the client has defined (v5, 3.3.2.3.4).
    aliases: HashMap<u16, ByteString>,
    pending: VecDeque<PendingAck>,
    /// QoS 1 PUBLISHes not yet PUBACKed (with the session's QoS 2 identifiers, the inbound window).
    inbound_qos1: usize,
    outbound: Vec<Outbound>,
}

/// A server DISCONNECT, with a Reason String saying why (allowed whatever Request Problem Information says,
/// 3.1.2.11.7). Some clients also cannot read a DISCONNECT with a reason code and no property length.
fn disconnect_packet(reason: ReasonCode, why: &str) -> Packet {
    let mut disconnect = Disconnect::new(reason);
    let why: String = why.chars().take(200).collect();
    disconnect.properties.reason_string = Some(why.into());
    Packet::Disconnect(disconnect)
}

fn protocol(reason: ReasonCode, what: &'static str) -> ConnectionError {
    ConnectionError::Protocol { reason, what }
}

impl Conn {
    /// Runs until the connection ends. `Ok(true)`: a normal DISCONNECT that discards the will; `Ok(false)`:
    /// DISCONNECT with "Disconnect with Will Message" (0x04).
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut Io<S>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<bool, ConnectionError> {
        let wake = self.attached.wake.clone();
        let mut last_seen = Instant::now();
        // Packets that arrived in the same read as CONNECT (a client may send them without waiting for CONNACK)
        // are handled first: no further read may come to trigger them.
        let mut unread = !io.rbuf.is_empty();
        loop {
            self.write_ready_acks(io);
            self.take_outbound(io);
            io.flush().await?;
            let deadline = self.keep_alive.map(|d| tokio::time::Instant::from_std(last_seen + d));
            let front_wait = self.pending.front_mut().and_then(|p| p.wait.as_mut());
            let has_wait = front_wait.is_some();
            let outcome: Result<Option<bool>, ConnectionError> = tokio::select! {
                biased;
                _ = std::future::ready(()), if unread => {
                    unread = false;
                    self.process(io)
                }
                _ = &mut self.attached.kicked => {
                    if self.version.is_v5() {
                        io.send_and_close(disconnect_packet(ReasonCode::SessionTakenOver, "session taken over"), self.version).await;
                    }
                    Err(ConnectionError::TakenOver)
                }
                result = async { front_wait.expect("guarded by has_wait").await }, if has_wait => {
                    match result {
                        Ok(()) => {
                            if let Some(front) = self.pending.front_mut() {
                                front.wait = None;
                            }
                            Ok(None)
                        }
                        Err(err) => Err(ConnectionError::Store(err)),
                    }
                }
                read = io.read_more() => match read {
                    Ok(true) => {
                        last_seen = Instant::now();
                        self.process(io)
                    }
                    Ok(false) => Err(ConnectionError::Closed),
                    Err(err) => Err(err.into()),
                },
                _ = wake.notified() => Ok(None),
                _ = &mut shutdown => Err(ConnectionError::ServerShutdown),
                _ = async { sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                    Err(ConnectionError::KeepAliveTimeout)
                }
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(discard_will)) => {
                    self.write_ready_acks(io);
                    let _ = io.flush().await;
                    let _ = io.stream.shutdown().await;
                    return Ok(discard_will);
                }
                Err(err) => {
                    if matches!(err, ConnectionError::ServerShutdown) {
                        self.drain_acks(io).await;
                    }
                    let reason = match &err {
                        ConnectionError::Decode(err) => Some(err.reason_code()),
                        ConnectionError::Protocol { reason, .. } => Some(*reason),
                        ConnectionError::KeepAliveTimeout => Some(ReasonCode::KeepAliveTimeout),
                        ConnectionError::Store(_) => Some(ReasonCode::ImplementationSpecificError),
                        ConnectionError::ServerShutdown => Some(ReasonCode::ServerShuttingDown),
                        _ => None,
                    };
                    match reason {
                        Some(reason) if self.version.is_v5() => {
                            let text = err.to_string();
                            io.send_and_close(disconnect_packet(reason, &text), self.version).await
                        }
                        _ => {
                            let _ = io.flush().await;
                            let _ = io.stream.shutdown().await;
                        }
                    }
                    return Err(err);
                }
            }
        }
    }

    /// Handles every whole packet in the read buffer. `Some(discard_will)` on DISCONNECT.
    fn process<S>(&mut self, io: &mut Io<S>) -> Result<Option<bool>, ConnectionError> {
        let max = self.limits.max_packet_size;
        while let Some(packet) = Packet::decode(&mut io.rbuf, self.version, max)? {
            if let Some(discard_will) = self.handle(packet)? {
                return Ok(Some(discard_will));
            }
        }
        Ok(None)
    }

    fn handle(&mut self, packet: Packet) -> Result<Option<bool>, ConnectionError> {
        let session = self.attached.session.clone();
        let client_id = session.client_id();
        let store = self.broker.store();
        match packet {
            Packet::Connect(_) => return Err(protocol(ReasonCode::ProtocolError, "a second CONNECT [MQTT-3.1.0-2]")),
            Packet::Publish(publish) => self.publish(publish)?,
            Packet::PubAck(ack) => {
                session.lock().puback(ack.packet_id, client_id, store);
            }
            Packet::PubRec(ack) => {
                let mut state = session.lock();
                if ack.reason.value() >= 0x80 {
                    state.pubrec_failed(ack.packet_id, client_id, store);
                } else {
                    let known = state.pubrec(ack.packet_id, client_id, store);
                    drop(state);
                    let mut rel = PublishAck::new(ack.packet_id);
                    if !known {
                        rel.reason = ReasonCode::PacketIdentifierNotFound;
                    }
                    self.push_ack(None, Packet::PubRel(rel), false);
                }
            }
            Packet::PubRel(ack) => {
                let mut state = session.lock();
                let known = state.inbound_qos2.remove(&ack.packet_id.get());
                let persist = known && state.is_persistent() && store.is_some();
                if persist {
                    if let Some(s) = self.broker.store() {
                        s.submit(StoreOp::DeleteInbound {
                            client_id: client_id.clone(),
                            packet_id: ack.packet_id.get(),
                        });
                    }
                }
                drop(state);
                let mut comp = PublishAck::new(ack.packet_id);
                if !known {
                    comp.reason = ReasonCode::PacketIdentifierNotFound;
                }
                let wait = if persist { self.sync() } else { None };
                self.push_ack(wait, Packet::PubComp(comp), false);
            }
            Packet::PubComp(ack) => {
                session.lock().pubcomp(ack.packet_id, client_id, store);
            }
            Packet::Subscribe(subscribe) => self.subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => self.unsubscribe(unsubscribe),
            Packet::PingReq => self.push_ack(None, Packet::PingResp, false),
            Packet::Disconnect(disconnect) => return self.disconnect(disconnect).map(Some),
            Packet::Auth(_) => {
                return Err(protocol(ReasonCode::ProtocolError, "AUTH without an authentication method"))
            }
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                return Err(protocol(ReasonCode::ProtocolError, "a packet only the server sends"))
            }
        }
        Ok(None)
    }

    fn sync(&self) -> Option<StoreWait> {
        self.broker.sync().map(|wait| Box::pin(wait) as StoreWait)
    }

    fn push_ack(&mut self, wait: Option<StoreWait>, packet: Packet, frees_inbound: bool) {
        self.pending.push_back(PendingAck { wait, packet, frees_inbound });
    }

    /// Moves the acknowledgements no longer waiting (in order) into the write buffer.
    /// At a drain: writes the acknowledgements still waiting for the store once it has committed them (for
    /// at most [`DRAIN_ACKS`]), so that what the client sent before the drain is acknowledged if it was kept.
    async fn drain_acks<S>(&mut self, io: &mut Io<S>) {
        let deadline = tokio::time::Instant::now() + DRAIN_ACKS;
        while let Some(wait) = self.pending.front_mut().and_then(|p| p.wait.as_mut()) {
            match tokio::time::timeout_at(deadline, wait).await {
                Ok(Ok(())) => {
                    if let Some(front) = self.pending.front_mut() {
                        front.wait = None;
                    }
                    self.write_ready_acks(io);
                }
                // Not committed: not acknowledged; the client sends it again to whoever serves next.
                Ok(Err(_)) | Err(_) => break,
            }
        }
        self.write_ready_acks(io);
    }

    fn write_ready_acks<S>(&mut self, io: &mut Io<S>) {
        while self.pending.front().is_some_and(|p| p.wait.is_none()) {
            let Some(ack) = self.pending.pop_front() else { break };
            if ack.frees_inbound {
                self.inbound_qos1 = self.inbound_qos1.saturating_sub(1);
            }
            // Acks are small and fixed-shape: encoding cannot fail.
            let _ = ack.packet.encode(self.version, &mut io.wbuf);
        }
    }

    fn publish(&mut self, mut publish: Publish) -> Result<(), ConnectionError> {
        let v5 = self.version.is_v5();
        if let Some(alias) = publish.properties.topic_alias.take() {
            let max = self.limits.topic_alias_maximum;
            if alias.get() > max {
                return Err(protocol(ReasonCode::TopicAliasInvalid, "topic alias above the maximum [MQTT-3.3.2-9]"));
            }
            if publish.topic.is_empty() {
                publish.topic = self
                    .aliases
                    .get(&alias.get())
                    .cloned()
                    .ok_or(protocol(ReasonCode::ProtocolError, "an unknown topic alias without a topic name"))?;
            } else {
                self.aliases.insert(alias.get(), publish.topic.clone());
            }
        }
        if !publish.properties.subscription_identifiers.is_empty() {
            return Err(protocol(ReasonCode::ProtocolError, "a client PUBLISH with a subscription identifier"));
        }
        let metrics = self.broker.metrics();
        metrics.inc(
            self.worker,
            match publish.qos {
                QoS::AtMostOnce => Counter::ReceivedQos0,
                QoS::AtLeastOnce => Counter::ReceivedQos1,
                QoS::ExactlyOnce => Counter::ReceivedQos2,
            },
        );
        let session = self.attached.session.clone();
        if publish.qos != QoS::AtMostOnce {
            let in_window = self.inbound_qos1 + session.lock().inbound_qos2.len();
            if v5 && in_window >= usize::from(self.limits.receive_maximum) {
                return Err(protocol(
                    ReasonCode::ReceiveMaximumExceeded,
                    "more unacknowledged PUBLISHes than Receive Maximum [MQTT-3.3.4-8]",
                ));
            }
        }
        let packet_id = publish.packet_id;
        let ack = |reason: ReasonCode| {
            let mut ack = PublishAck::new(packet_id.unwrap_or(PacketId::MIN));
            ack.reason = reason;
            ack
        };
        if v5 && !publish.payload_matches_format() {
            // 3.3.2.3.2: the receiver may answer Payload format invalid.
            match publish.qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => {
                    self.inbound_qos1 += 1;
                    self.push_ack(None, Packet::PubAck(ack(ReasonCode::PayloadFormatInvalid)), true);
                }
                QoS::ExactlyOnce => self.push_ack(None, Packet::PubRec(ack(ReasonCode::PayloadFormatInvalid)), false),
            }
            return Ok(());
        }
        if !self.broker.auth().acl.can_publish(self.user.as_deref(), session.client_id(), &publish.topic) {
            // Not authorized: v5 says so in the acknowledgement; v3 has no way to, so the message is
            // acknowledged and dropped, as Mosquitto does. QoS 0: dropped.
            metrics.inc(self.worker, Counter::AclDeniedPublish);
            let reason = if v5 { ReasonCode::NotAuthorized } else { ReasonCode::Success };
            match publish.qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => {
                    self.inbound_qos1 += 1;
                    self.push_ack(None, Packet::PubAck(ack(reason)), true);
                }
                QoS::ExactlyOnce => {
                    if !v5 {
                        // The v3 flow goes on to PUBREL / PUBCOMP.
                        session.lock().inbound_qos2.insert(packet_id.map_or(0, |id| id.get()));
                    }
                    self.push_ack(None, Packet::PubRec(ack(reason)), false);
                }
            }
            return Ok(());
        }
        let mut persisted = false;
        if publish.qos == QoS::ExactlyOnce {
            let id = packet_id.map_or(0, |id| id.get());
            let mut state = session.lock();
            if !state.inbound_qos2.insert(id) {
                // Sent again before PUBREL: acknowledged, not routed again (4.3.3).
                drop(state);
                self.push_ack(None, Packet::PubRec(ack(ReasonCode::Success)), false);
                return Ok(());
            }
            if state.is_persistent() {
                if let Some(store) = self.broker.store() {
                    store.submit(StoreOp::PutInbound { client_id: session.client_id().clone(), packet_id: id });
                    persisted = true;
                }
            }
        }
        let message = Arc::new(Message {
            topic: publish.topic,
            payload: publish.payload,
            qos: publish.qos,
            retain: publish.retain,
            properties: publish.properties,
            publisher: Some(session.key()),
            received: Instant::now(),
        });
        let published = self.broker.publish(message, self.worker);
        persisted |= published.persisted;
        let reason = if published.matched == 0 && v5 { ReasonCode::NoMatchingSubscribers } else { ReasonCode::Success };
        let wait = if persisted { self.sync() } else { None };
        match publish.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => {
                self.inbound_qos1 += 1;
                self.push_ack(wait, Packet::PubAck(ack(reason)), true);
            }
            QoS::ExactlyOnce => self.push_ack(wait, Packet::PubRec(ack(reason)), false),
        }
        Ok(())
    }

    fn subscribe(&mut self, subscribe: Subscribe) {
        let id = subscribe.properties.subscription_identifier;
        let mut reasons = Vec::with_capacity(subscribe.subscriptions.len());
        let mut persisted = false;
        let auth = self.broker.auth();
        let client_id = self.attached.session.client_id().clone();
        for subscription in &subscribe.subscriptions {
            let filter = crate::topic::FilterRef::parse(&subscription.filter).filter;
            if !auth.acl.can_subscribe(self.user.as_deref(), &client_id, filter) {
                self.broker.metrics().inc(self.worker, Counter::AclDeniedSubscribe);
                reasons.push(ReasonCode::NotAuthorized); // v3: 0x80
                continue;
            }
            persisted |= self.broker.subscribe(&self.attached.session, &subscription.filter, subscription.options, id);
            reasons.push(match subscription.options.qos {
                QoS::AtMostOnce => ReasonCode::Success, // Granted QoS 0
                QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
            });
        }
        let wait = if persisted { self.sync() } else { None };
        let suback = SubAck { packet_id: subscribe.packet_id, reasons, properties: Default::default() };
        self.push_ack(wait, Packet::SubAck(suback), false);
    }

    fn unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let mut reasons = Vec::with_capacity(unsubscribe.filters.len());
        let mut persisted = false;
        for filter in &unsubscribe.filters {
            let (existed, persist) = self.broker.unsubscribe(&self.attached.session, filter);
            persisted |= persist;
            reasons.push(if existed { ReasonCode::Success } else { ReasonCode::NoSubscriptionExisted });
        }
        let wait = if persisted { self.sync() } else { None };
        let unsuback = UnsubAck { packet_id: unsubscribe.packet_id, reasons, properties: Default::default() };
        self.push_ack(wait, Packet::UnsubAck(unsuback), false);
    }

    /// A client's DISCONNECT: returns whether the will is discarded.
    fn disconnect(&mut self, disconnect: Disconnect) -> Result<bool, ConnectionError> {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            if self.session_expiry_was_zero && expiry != 0 {
                return Err(protocol(
                    ReasonCode::ProtocolError,
                    "DISCONNECT sets a session expiry after 0 [MQTT-3.14.2-2]",
                ));
            }
            self.attached.session.lock().expiry = expiry.min(self.limits.max_session_expiry);
        }
        Ok(disconnect.reason != ReasonCode::DisconnectWithWillMessage)
    }

    /// Moves what the session owes the client into the write buffer, within the in-flight window.
    fn take_outbound<S>(&mut self, io: &mut Io<S>) {
        let session = self.attached.session.clone();
        let store = self.broker.store();
        let mut state = session.lock();
        state.take_outbound(self.send_window, session.client_id(), store, &mut self.outbound);
        for outbound in self.outbound.drain(..) {
            let packet = match outbound {
                Outbound::Publish(publish) => Packet::Publish(publish),
                Outbound::PubRel(id) => Packet::PubRel(PublishAck::new(id)),
            };
            let fits = packet.encoded_len(self.version).is_ok_and(|len| len <= self.client_max_packet as usize);
            if fits && packet.encode(self.version, &mut io.wbuf).is_ok() {
                if let Packet::Publish(publish) = &packet {
                    self.broker.metrics().inc(
                        self.worker,
                        match publish.qos {
                            QoS::AtMostOnce => Counter::SentQos0,
                            QoS::AtLeastOnce => Counter::SentQos1,
                            QoS::ExactlyOnce => Counter::SentQos2,
                        },
                    );
                }
                continue;
            }
            // Too large for the client [MQTT-3.1.2-25]: dropped as if delivered.
            self.broker.metrics().inc(self.worker, Counter::DroppedTooLarge);
            if let Packet::Publish(Publish { packet_id: Some(id), .. }) = packet {
                state.discard(id, session.client_id(), store);
            }
        }
    }
}
