//! The connection driver: [`serve`] runs one MQTT connection over any byte stream, from CONNECT to close,
//! against a shared [`Broker`].
//!
//! One task per connection, on the worker's current-thread runtime, owning the stream. It waits on several
//! things at once: bytes from the client, the session's wake-up (a message queued by a publisher on any
//! worker, the session taken over, a drain), the oldest acknowledgement waiting for the store, the shutdown
//! and the keep-alive deadline. Decoded packets share the read buffer's allocation (a PUBLISH payload routed
//! to a thousand subscribers is one allocation); encoding copies it once per subscriber, into the write
//! buffer.
//!
//! Memory: most of what an idle client costs is this task, so the connection keeps nothing it does not need
//! while idle. Reads go into the worker's scratch buffer and are copied into a buffer of their size (which
//! the packets decoded from it share, and which is let go once decoded); only a partial packet stays with the
//! connection. The write buffer is the worker's, lent while the connection encodes and writes. The future is
//! kept small (376 bytes): the CONNECT exchange and the ending are boxed futures of their own, the wait is
//! one hand-written poll, and no `async fn` keeps its arguments twice (see [`serve_as`]).
//!
//! Acknowledgements (PUBACK, PUBREC, PUBCOMP, SUBACK, UNSUBACK) are written in the order of the packets they
//! answer [MQTT-4.6.0-2]; one that depends on the store waits for its commit, and the ones behind it wait too,
//! while the connection keeps reading (so a client's in-flight window keeps the group commit fed).
//!
//! Errors close the connection and never escape it: a malformed packet or a protocol violation is answered,
//! in v5, with a DISCONNECT carrying the reason code (a CONNACK before the connection is accepted) and the
//! connection is closed; the will is then published as after any abnormal end.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tracing::debug;

use crate::alias::{Alias, OutAliases};
use crate::auth::Verdict;
use crate::broker::{Attached, Broker, ConnectParams};
use crate::codec::{
    ConnAck, ConnAckProperties, Connect, DecodeError, Disconnect, Packet, PacketId, ProtocolVersion, Publish,
    PublishAck, QoS, ReasonCode, SubAck, Subscribe, UnsubAck, Unsubscribe, Will,
};
use crate::config::Limits;
use crate::message::Message;
use crate::metrics::Counter;
use crate::park::Lot;
use crate::router::FxHasher;
use crate::session::Outbound;
use crate::store::{StoreError, StoreOp};
use crate::sys::is_sys_topic;

/// How long a connection must be quiet to park the first time (then `limits.park_after`, if shorter this).
pub const FIRST_PARK_AFTER: Duration = Duration::from_millis(20);

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

/// The acknowledgements waiting for the store, or behind one that does: boxed, and only while there are
/// some (a connection without persistence never has any).
#[derive(Default)]
#[allow(clippy::box_collection)] // 8 bytes in every connection's future rather than 32
struct Pending(Option<Box<VecDeque<PendingAck>>>);

impl Pending {
    fn front(&self) -> Option<&PendingAck> {
        self.0.as_ref().and_then(|queue| queue.front())
    }

    fn front_mut(&mut self) -> Option<&mut PendingAck> {
        self.0.as_mut().and_then(|queue| queue.front_mut())
    }

    fn is_empty(&self) -> bool {
        self.front().is_none()
    }

    fn push_back(&mut self, ack: PendingAck) {
        self.0.get_or_insert_with(Default::default).push_back(ack);
    }

    fn pop_front(&mut self) -> Option<PendingAck> {
        self.0.as_mut().and_then(|queue| queue.pop_front())
    }

    /// Each holds a whole packet: not kept by a connection that has gone quiet.
    fn release_if_empty(&mut self) {
        if self.is_empty() {
            self.0 = None;
        }
    }
}

/// Serves one connection until it ends. `worker` is the index of the worker thread (for per-worker metrics).
/// The future is not `Send`-bound by design: it runs on the worker's current-thread runtime.
pub fn serve<S>(
    stream: S,
    peer: SocketAddr,
    broker: &Broker,
    worker: usize,
) -> impl Future<Output = Result<(), ConnectionError>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    serve_as(stream, peer, None, broker, worker, std::future::pending())
}

/// [`serve`], ended by the server when `shutdown` completes (a graceful drain): acknowledgements already
/// waiting for the store are written once it has committed them (for at most [`DRAIN_ACKS`]), then a v5
/// client gets DISCONNECT with Server shutting down (0x8B) and the connection closes; a 3.1/3.1.1 client's
/// connection just closes (those versions have no server DISCONNECT). The will is published as after any
/// connection the server closes [MQTT-3.1.2-8]. A connection still before CONNECT is closed at once.
pub fn serve_until<S, F>(
    stream: S,
    peer: SocketAddr,
    broker: &Broker,
    worker: usize,
    shutdown: F,
) -> impl Future<Output = Result<(), ConnectionError>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    serve_as(stream, peer, None, broker, worker, shutdown)
}

/// [`serve_until`] for a client whose verified TLS certificate names it `certificate_user` (its CN, or
/// first SAN): with `mqtt.auth.use_certificate_as_username` that is its user name, and no password is asked.
///
/// The connection also ends as at `shutdown` when the broker drains ([`Broker::drain`]).
///
/// Not an `async fn`, to keep the future small (it is most of what an idle client costs): an `async fn`
/// keeps its arguments for its whole life beside the copies it works on, so the stream and `shutdown` would
/// be there twice. Here the CONNECT exchange is made (boxed, so its timer and packet are freed once the
/// connection is accepted) before the future, which then only awaits it, and `shutdown` is pinned in a box
/// (which allocates nothing for [`serve`]'s, which has no size).
pub fn serve_as<S, F>(
    stream: S,
    peer: SocketAddr,
    certificate_user: Option<String>,
    broker: &Broker,
    worker: usize,
    shutdown: F,
) -> impl Future<Output = Result<(), ConnectionError>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    let io = Io { stream, rbuf: BytesMut::new(), wbuf: BytesMut::new() };
    let opening = Box::pin(open(io, peer, certificate_user, broker.clone(), worker, Box::pin(shutdown)));
    async move {
        let Opened { mut io, mut conn, mut shutdown } = opening.await?;
        conn.broker.metrics().inc(conn.worker, Counter::Connections);
        conn.broker.metrics().inc(conn.worker, Counter::Connects);
        let result = match conn.run(&mut io, shutdown.as_mut(), false).await {
            Ran::Ended(result) => result,
            // Not asked for: only `drive` parks.
            Ran::Idle => Err(ConnectionError::ServerShutdown),
        };
        conn.finish(result)
    }
}

/// [`serve`] for a plain TCP connection that parks while idle: after `limits.park_after` with nothing in
/// progress, the connection's task ends and the connection waits in `lot` (its worker's [`Lot`]), holding
/// no task, future or registration with the runtime, until a packet, a message for its session or its
/// keep-alive deadline brings it back on a task of its own. The drain comes through the broker.
pub fn serve_parking<G: 'static>(
    stream: TcpStream,
    peer: SocketAddr,
    broker: &Broker,
    worker: usize,
    lot: Rc<Lot<G>>,
) -> impl Future<Output = ()> {
    let io = Io { stream, rbuf: BytesMut::new(), wbuf: BytesMut::new() };
    let opening = Box::pin(open(io, peer, None, broker.clone(), worker, Box::pin(std::future::pending::<()>())));
    async move {
        let Ok(Opened { io, conn, .. }) = opening.await else { return };
        conn.broker.metrics().inc(conn.worker, Counter::Connections);
        conn.broker.metrics().inc(conn.worker, Counter::Connects);
        drive(io, Box::new(conn), lot).await
    }
}

/// Serves an accepted connection until it ends or parks (again).
pub(crate) async fn drive<G: 'static>(mut io: Io<TcpStream>, mut conn: Box<Conn>, lot: Rc<Lot<G>>) {
    let mut park = !conn.limits.park_after.is_zero();
    loop {
        let ended = conn.run(&mut io, std::pin::pin!(std::future::pending::<()>()), park).await;
        let result = match ended {
            Ran::Ended(result) => result,
            Ran::Idle => match lot.park(io.stream, conn) {
                Ok(()) => return,
                // The socket could not be parked (the poller refused it): served on without parking.
                Err((Ok(stream), back)) => {
                    io = Io { stream, rbuf: BytesMut::new(), wbuf: BytesMut::new() };
                    conn = back;
                    park = false;
                    continue;
                }
                Err((Err(err), mut back)) => {
                    let _ = back.finish(Err(err.into()));
                    return;
                }
            },
        };
        let _ = conn.finish(result);
        return;
    }
}

/// An accepted connection, its stream, and what ends it.
struct Opened<S, F> {
    io: Io<S>,
    conn: Conn,
    shutdown: Pin<Box<F>>,
}

/// From the first byte to CONNACK: reads CONNECT (within the connect timeout, or until `shutdown` or a
/// drain), checks it and attaches the session.
async fn open<S, F>(
    mut io: Io<S>,
    peer: SocketAddr,
    certificate_user: Option<String>,
    broker: Broker,
    worker: usize,
    mut shutdown: Pin<Box<F>>,
) -> Result<Opened<S, F>, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    broker.metrics().inc(worker, Counter::ConnectionsAccepted);
    if !broker.is_ready() {
        // The store is still held by the process this one replaces: the client waits (as for a slow CONNACK).
        tokio::select! {
            _ = broker.ready() => {}
            _ = shutdown.as_mut() => return Err(ConnectionError::ServerShutdown),
            _ = broker.drained() => return Err(ConnectionError::ServerShutdown),
        }
    }
    let limits = broker.limits();
    let mut received = 0;
    let connecting =
        tokio::time::timeout(limits.connect_timeout, read_connect(&mut io, limits.max_packet_size, &mut received));
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
        _ = shutdown.as_mut() => {
            let _ = io.stream.shutdown().await;
            return Err(ConnectionError::ServerShutdown);
        }
        _ = broker.drained() => {
            let _ = io.stream.shutdown().await;
            return Err(ConnectionError::ServerShutdown);
        }
    };
    broker.metrics().add(worker, Counter::BytesReceived, received as i64);
    broker.metrics().inc(worker, Counter::PacketsReceived);
    match accept(&mut io, &connect, peer, certificate_user, &broker, worker, limits).await? {
        Some(conn) => Ok(Opened { io, conn, shutdown }),
        None => Err(ConnectionError::Refused(ReasonCode::ClientIdentifierNotValid)),
    }
}

/// Read from the socket into a connection's own buffer at a time, at least, while a packet is incomplete.
const READ_CHUNK: usize = 8 * 1024;
/// The worker's shared read buffer.
const READ_SCRATCH: usize = 16 * 1024;
/// A write buffer larger than this is freed after its flush rather than kept for the worker's next writer.
const POOLED_WRITE_MAX: usize = 256 * 1024;

thread_local! {
    /// Where a connection with no partial packet reads, and so every idle connection waits: what arrives is
    /// copied into a buffer of its size, which the packets decoded from it share. An idle connection keeps no
    /// read buffer; a busy one copies the first read of each burst (the rest go into its own buffer).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; READ_SCRATCH].into_boxed_slice());
    /// The write buffer a connection borrows while it encodes and writes, returned once written: an idle
    /// connection keeps none, and the worker's writers share one warm buffer.
    static WRITE_POOL: Cell<BytesMut> = Cell::new(BytesMut::new());
    /// What `take_outbound` hands over, reused by every connection of the worker.
    static OUTBOUND: Cell<Vec<Outbound>> = const { Cell::new(Vec::new()) };
}

/// The stream and its buffers: `rbuf` holds only bytes not yet decoded (a partial packet), `wbuf` only
/// what is being written (borrowed from [`WRITE_POOL`] by [`out`]); both are empty and unallocated while the
/// connection is idle.
pub(crate) struct Io<S> {
    pub(crate) stream: S,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

/// The write buffer to encode into, borrowed from the worker's pool if the connection holds none.
fn out(wbuf: &mut BytesMut) -> &mut BytesMut {
    if wbuf.capacity() == 0 {
        *wbuf = WRITE_POOL.with(Cell::take);
    }
    wbuf
}

/// Gives the read buffer up once everything in it is decoded (the packets taken from it keep their bytes).
/// Also when it has no room left: an empty view of a shared buffer still keeps the buffer.
fn release_read(rbuf: &mut BytesMut) {
    if rbuf.is_empty() {
        *rbuf = BytesMut::new();
    }
}

impl<S> Io<S> {
    pub(crate) fn new(stream: S) -> Io<S> {
        Io { stream, rbuf: BytesMut::new(), wbuf: BytesMut::new() }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Io<S> {
    /// Reads more bytes: how many; `Ok(0)` at end of stream.
    async fn read_more(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_more(cx)).await
    }

    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.rbuf.is_empty() {
            return self.poll_read_scratch(cx);
        }
        // Mid-packet: the rest goes straight into the connection's buffer. (A `read_buf` future holds no
        // state between polls: one is made for each.)
        self.rbuf.reserve(READ_CHUNK);
        let read = std::pin::pin!(self.stream.read_buf(&mut self.rbuf));
        read.poll(cx)
    }

    fn poll_read_scratch(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        SCRATCH.with(|scratch| {
            // Borrowed only within this poll; a second borrow cannot happen (a stream does not poll a
            // connection), but would read into a buffer of its own rather than panic.
            let mut own = Vec::new();
            let mut borrowed = scratch.try_borrow_mut();
            let buf: &mut [u8] = match &mut borrowed {
                Ok(scratch) => scratch,
                Err(_) => {
                    own.resize(READ_CHUNK, 0);
                    &mut own
                }
            };
            let mut read = ReadBuf::new(buf);
            ready!(Pin::new(&mut self.stream).poll_read(cx, &mut read))?;
            self.rbuf.extend_from_slice(read.filled());
            Poll::Ready(Ok(read.filled().len()))
        })
    }

    /// Writes what is in the write buffer and gives the buffer back to the worker's pool; how many bytes.
    async fn flush(&mut self) -> std::io::Result<usize> {
        let written = self.wbuf.len();
        if written > 0 {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        if self.wbuf.capacity() > 0 {
            let buf = std::mem::take(&mut self.wbuf);
            if buf.capacity() <= POOLED_WRITE_MAX {
                // Keep the larger of the two: another connection may have returned one while this one waited.
                WRITE_POOL.with(|pool| {
                    let pooled = pool.take();
                    pool.set(if pooled.capacity() >= buf.capacity() { pooled } else { buf });
                });
            }
        }
        Ok(written)
    }

    /// Writes `packet` and closes (an error answer); the bytes written.
    async fn send_and_close(&mut self, packet: Packet, version: ProtocolVersion) -> usize {
        let mut written = 0;
        if packet.encode(version, out(&mut self.wbuf)).is_ok() {
            written = self.flush().await.unwrap_or(0);
        }
        let _ = self.stream.shutdown().await;
        written
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

/// Reads the first packet, which must be CONNECT [MQTT-3.1.0-1]; `received` counts the bytes read.
async fn read_connect<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    max_packet_size: u32,
    received: &mut usize,
) -> Result<Box<Connect>, ConnectionError> {
    loop {
        // Read before decoding, which consumes a whole packet even when it refuses it.
        let level = connect_level(&io.rbuf);
        match Packet::decode(&mut io.rbuf, ProtocolVersion::V5, max_packet_size) {
            Ok(Some(Packet::Connect(connect))) => {
                release_read(&mut io.rbuf);
                return Ok(connect);
            }
            Ok(Some(_)) => {
                let _ = io.stream.shutdown().await;
                return Err(ConnectionError::Protocol {
                    reason: ReasonCode::ProtocolError,
                    what: "the first packet is not CONNECT [MQTT-3.1.0-1]",
                });
            }
            Ok(None) => match io.read_more().await? {
                0 => return Err(ConnectionError::ClosedBeforeConnect),
                n => *received += n,
            },
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
                    Some((connack, version)) => {
                        io.send_and_close(Packet::ConnAck(connack), version).await;
                    }
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
        // A copy: the session keeps it, and a slice would keep the whole read that brought CONNECT.
        ByteString::from(&*connect.client_id)
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
        if is_sys_topic(&will.topic) || !auth.acl.can_publish(user.as_deref(), &client_id, &will.topic) {
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
            response_information: match (&limits.response_information, connect.properties.request_response_information)
            {
                (Some(info), Some(true)) => Some(response_information(info, &attached, user.as_deref()).into()),
                _ => None,
            },
            ..ConnAckProperties::default()
        };
    }
    Packet::ConnAck(connack).encode(version, out(&mut io.wbuf)).map_err(|_| ConnectionError::Protocol {
        reason: ReasonCode::ImplementationSpecificError,
        what: "CONNACK does not encode",
    })?;
    broker.metrics().inc(worker, Counter::PacketsSent);
    let client_receive_maximum = connect.properties.receive_maximum.map_or(u16::MAX, |n| n.get());
    Ok(Some(Conn {
        broker: broker.clone(),
        peer,
        worker,
        version,
        send_window: client_receive_maximum.min(limits.max_inflight),
        client_max_packet: connect.properties.maximum_packet_size.map_or(u32::MAX, |n| n.get()),
        keep_alive,
        last_seen: Instant::now(),
        parked_before: false,
        will: connect.will.clone().map(Box::new),
        session_expiry_was_zero: requested_expiry == 0,
        aliases: None,
        aliases_out_max: if v5 {
            connect.properties.topic_alias_maximum.unwrap_or(0).min(limits.topic_aliases_to_clients)
        } else {
            0
        },
        aliases_out: None,
        pending: Pending::default(),
        inbound_qos1: 0,
        attached,
        limits,
        user: user.map(String::into_boxed_str),
    }))
}

/// CONNACK's Response Information: `template` with `%c` replaced by the client id, `%u` by the user name
/// (empty for an anonymous client).
fn response_information(template: &str, attached: &Attached, user: Option<&str>) -> String {
    template.replace("%c", attached.session.client_id()).replace("%u", user.unwrap_or(""))
}

/// An accepted connection's state.
pub(crate) struct Conn {
    broker: Broker,
    peer: SocketAddr,
    /// The authenticated user name (`None`: anonymous), for the ACL.
    user: Option<Box<str>>,
    worker: usize,
    version: ProtocolVersion,
    pub(crate) attached: Attached,
    /// The broker's limits when the connection was accepted (a reload does not change what CONNACK said).
    limits: Arc<Limits>,
    /// QoS 1 and 2 messages the broker may have in flight to the client.
    send_window: u16,
    /// The client's Maximum Packet Size (v5).
    client_max_packet: u32,
    /// The Keep Alive in force, seconds (0: off); the client may be silent 1.5 times that [MQTT-3.1.2-24].
    pub(crate) keep_alive: u16,
    /// When the client last sent something (the keep-alive counts from it).
    pub(crate) last_seen: Instant,
    /// Whether the connection has been parked since it was accepted (see [`crate::park`]).
    pub(crate) parked_before: bool,
    /// Boxed: most connections leave none, and the connection's future holds this for its whole life.
    will: Option<Box<Will>>,
    /// For [MQTT-3.14.2-2]: a DISCONNECT may not set a non-zero Session Expiry Interval then.
    session_expiry_was_zero: bool,
    /// Topic aliases the client has defined (v5, 3.3.2.3.4); boxed, made by the first.
    #[allow(clippy::box_collection)] // 8 bytes in every connection's future rather than 32
    aliases: Option<Box<HashMap<u16, ByteString, BuildHasherDefault<FxHasher>>>>,
    /// Acknowledgements waiting for the store, or behind one that does (the others are written at once).
    pending: Pending,
    /// Topic aliases towards the client at most: the client's Topic Alias Maximum within the broker's
    /// `topic_aliases_to_clients` (0: topic names always).
    aliases_out_max: u16,
    /// The aliases defined towards the client (see [`crate::alias`]); boxed, made by the first PUBLISH sent.
    aliases_out: Option<Box<OutAliases>>,
    /// QoS 1 PUBLISHes not yet PUBACKed (with the session's QoS 2 identifiers, the inbound window).
    inbound_qos1: u32,
}

/// What ends a wait of [`Conn::run`].
enum Event {
    /// Bytes that came with CONNECT are there to handle.
    Unread,
    /// The store committed what the oldest pending acknowledgement waits for (or failed).
    Committed(Result<(), Arc<StoreError>>),
    /// Bytes read (`Ok(0)`: end of stream).
    Read(std::io::Result<usize>),
    /// A message queued, the session taken from the connection, or a drain.
    Woken,
    Shutdown,
    /// The keep-alive timer fired; whether the client was silent for the whole period is checked then.
    KeepAlive,
    /// Nothing in progress and nothing happened for `limits.park_after`: time to park.
    Idle,
}

/// How [`Conn::run`] stopped.
pub(crate) enum Ran {
    /// The connection ended (and was closed): `Ok(true)` after a DISCONNECT that discards the will.
    Ended(Result<bool, ConnectionError>),
    /// Idle for `limits.park_after` (only when asked to park): nothing was closed.
    Idle,
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
    ///
    /// This loop is where an idle connection waits, so its future is kept small: one hand-written wait
    /// ([`Conn::poll_event`]) instead of a `select!` over futures, the keep-alive timer boxed (and only for
    /// clients with a keep-alive), and the ending (drain, DISCONNECT, close) a boxed future of its own.
    ///
    /// Not an `async fn`, whose arguments would be kept twice.
    #[allow(clippy::manual_async_fn)]
    fn run<'a, S: AsyncRead + AsyncWrite + Unpin>(
        &'a mut self,
        io: &'a mut Io<S>,
        mut shutdown: Pin<&'a mut impl Future<Output = ()>>,
        park: bool,
    ) -> impl Future<Output = Ran> + 'a {
        async move {
            let mut timer: Option<Pin<Box<Sleep>>> = None;
            // Anything that happens (a packet, a delivery) puts parking off: a busy connection never parks.
            let mut last_active = Instant::now();
            // The first time, a connection parks after a short quiet moment: most clients that go quiet right
            // after CONNECT (and their SUBSCRIBEs) are devices waiting for messages, and a client that goes on
            // sending comes back once. So a crowd of clients connecting at once never holds a task each.
            let park_after = match (park, self.parked_before) {
                (false, _) => None,
                (true, true) => Some(self.limits.park_after),
                (true, false) => Some(self.limits.park_after.min(FIRST_PARK_AFTER)),
            };
            // Packets that arrived in the same read as CONNECT (a client may send them without waiting for CONNACK)
            // are handled first: no further read may come to trigger them.
            let mut unread = !io.rbuf.is_empty();
            let ended = loop {
                if self.broker.is_draining() {
                    break Err(ConnectionError::ServerShutdown);
                }
                self.write_ready_acks(io);
                if let Err(err) = self.take_outbound(io) {
                    break Err(err);
                }
                match io.flush().await {
                    Ok(0) => {}
                    Ok(written) => self.broker.metrics().add(self.worker, Counter::BytesSent, written as i64),
                    Err(err) => break Err(err.into()),
                }
                let event = std::future::poll_fn(|cx| {
                    if std::mem::take(&mut unread) {
                        return Poll::Ready(Event::Unread);
                    }
                    self.poll_event(cx, io, shutdown.as_mut(), &mut timer, last_active, park_after)
                })
                .await;
                let outcome = match event {
                    Event::Unread => self.process(io),
                    Event::Committed(Ok(())) => {
                        if let Some(front) = self.pending.front_mut() {
                            front.wait = None;
                        }
                        Ok(None)
                    }
                    Event::Committed(Err(err)) => Err(ConnectionError::Store(err)),
                    Event::Read(Ok(0)) => Err(ConnectionError::Closed),
                    Event::Read(Ok(n)) => {
                        self.last_seen = Instant::now();
                        last_active = self.last_seen;
                        self.broker.metrics().add(self.worker, Counter::BytesReceived, n as i64);
                        self.process(io)
                    }
                    Event::Read(Err(err)) => Err(err.into()),
                    Event::Woken => {
                        last_active = Instant::now();
                        Ok(None)
                    }
                    Event::Shutdown => Err(ConnectionError::ServerShutdown),
                    Event::KeepAlive => Err(ConnectionError::KeepAliveTimeout),
                    Event::Idle => return Ran::Idle,
                };
                match outcome {
                    Ok(None) => {}
                    Ok(Some(discard_will)) => break Ok(discard_will),
                    Err(err) => break Err(err),
                }
            };
            Ran::Ended(Box::pin(self.close(io, ended)).await)
        }
    }

    /// After the connection ended: counts it, publishes the will unless a DISCONNECT discarded it, detaches
    /// the session. `result` is how it ended (`Ok(true)`: a DISCONNECT that discards the will).
    pub(crate) fn finish(&mut self, result: Result<bool, ConnectionError>) -> Result<(), ConnectionError> {
        let (metrics, worker, version) = (self.broker.metrics(), self.worker, self.version);
        metrics.add(worker, Counter::Connections, -1);
        // Anything but a DISCONNECT without 0x04 publishes the will [MQTT-3.1.2-8], [MQTT-3.14.4-3].
        let will = match (&result, self.will.take()) {
            (Ok(true), _) | (_, None) => None,
            (_, Some(will)) => {
                let delay = will.properties.will_delay_interval.unwrap_or(0);
                Some((Message::from_will(&will), delay))
            }
        };
        self.broker.disconnect(&self.attached.session, self.attached.connection, will);
        match &result {
            Err(ConnectionError::TakenOver) => metrics.inc(worker, Counter::TakenOver),
            Err(ConnectionError::KeepAliveTimeout) => metrics.inc(worker, Counter::KeepAliveTimeouts),
            Err(ConnectionError::Decode(_) | ConnectionError::Protocol { .. }) => {
                metrics.inc(worker, Counter::ProtocolErrors)
            }
            _ => {}
        }
        debug!(peer = %self.peer, client_id = %self.attached.session.client_id(), %version, result = ?result.as_ref().err(), "MQTT connection ended");
        result.map(|_| ())
    }

    /// Whether the connection has nothing in progress: no partial packet, no acknowledgement waiting.
    fn is_quiet<S>(&self, io: &Io<S>) -> bool {
        self.pending.is_empty() && io.rbuf.is_empty() && io.wbuf.is_empty()
    }

    /// What the connection waits for, in this order: the store's commit of the oldest pending
    /// acknowledgement, bytes from the client, the session's wake-up, the shutdown, the keep-alive deadline
    /// (1.5 times the Keep Alive after `last_seen`).
    #[allow(clippy::too_many_arguments)]
    fn poll_event<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut Io<S>,
        shutdown: Pin<&mut impl Future<Output = ()>>,
        timer: &mut Option<Pin<Box<Sleep>>>,
        last_active: Instant,
        park_after: Option<Duration>,
    ) -> Poll<Event> {
        if let Some(wait) = self.pending.front_mut().and_then(|p| p.wait.as_mut()) {
            if let Poll::Ready(committed) = wait.as_mut().poll(cx) {
                return Poll::Ready(Event::Committed(committed));
            }
        }
        if let Poll::Ready(read) = io.poll_read_more(cx) {
            return Poll::Ready(Event::Read(read));
        }
        {
            let mut state = self.attached.session.lock();
            match &mut state.attachment {
                Some(attachment) if attachment.connection == self.attached.connection => {
                    if attachment.poll_woken(cx) {
                        return Poll::Ready(Event::Woken);
                    }
                }
                // Taken from this connection: the loop's `take_outbound` says so.
                _ => return Poll::Ready(Event::Woken),
            }
        }
        if shutdown.poll(cx).is_ready() {
            return Poll::Ready(Event::Shutdown);
        }
        let keep_alive =
            (self.keep_alive > 0).then(|| self.last_seen + Duration::from_millis(u64::from(self.keep_alive) * 1500));
        let mut park_at = park_after.map(|after| last_active + after);
        let Some(next) = earliest(keep_alive, park_at) else { return Poll::Pending };
        let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next.into())));
        // Not moved at every packet: when it fires early, it is set to the deadline it has come to.
        while timer.as_mut().poll(cx).is_ready() {
            // The runtime's clock, as the timer's (the same as the system's unless a test pauses time).
            let now = tokio::time::Instant::now().into_std();
            if keep_alive.is_some_and(|deadline| now >= deadline) {
                return Poll::Ready(Event::KeepAlive);
            }
            if let (Some(at), Some(after)) = (park_at, park_after) {
                if now >= at {
                    if self.is_quiet(io) {
                        return Poll::Ready(Event::Idle);
                    }
                    // Something in progress (an acknowledgement waiting for the store): looked at again later.
                    park_at = Some(now + after);
                }
            }
            let next = earliest(keep_alive, park_at).unwrap_or(now);
            timer.as_mut().reset(next.into());
        }
        Poll::Pending
    }

    /// Ends the connection: after a DISCONNECT, the acknowledgements owed are written; after an error, a v5
    /// client is told why (DISCONNECT with the reason code), and a drain first writes the acknowledgements the
    /// store commits in time.
    async fn close<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut Io<S>,
        ended: Result<bool, ConnectionError>,
    ) -> Result<bool, ConnectionError> {
        let broker = self.broker.clone();
        let metrics = broker.metrics();
        let err = match ended {
            Ok(discard_will) => {
                self.write_ready_acks(io);
                metrics.add(self.worker, Counter::BytesSent, io.flush().await.unwrap_or(0) as i64);
                let _ = io.stream.shutdown().await;
                return Ok(discard_will);
            }
            Err(err) => err,
        };
        if matches!(err, ConnectionError::ServerShutdown) {
            self.drain_acks(io).await;
        }
        let reason = match &err {
            ConnectionError::Decode(err) => Some(err.reason_code()),
            ConnectionError::Protocol { reason, .. } => Some(*reason),
            ConnectionError::KeepAliveTimeout => Some(ReasonCode::KeepAliveTimeout),
            ConnectionError::Store(_) => Some(ReasonCode::ImplementationSpecificError),
            ConnectionError::ServerShutdown => Some(ReasonCode::ServerShuttingDown),
            ConnectionError::TakenOver => Some(ReasonCode::SessionTakenOver),
            _ => None,
        };
        match reason {
            Some(reason) if self.version.is_v5() => {
                let text = match &err {
                    ConnectionError::TakenOver => "session taken over".to_string(),
                    err => err.to_string(),
                };
                let written = io.send_and_close(disconnect_packet(reason, &text), self.version).await;
                metrics.add(self.worker, Counter::BytesSent, written as i64);
                metrics.inc(self.worker, Counter::PacketsSent);
            }
            _ => {
                metrics.add(self.worker, Counter::BytesSent, io.flush().await.unwrap_or(0) as i64);
                let _ = io.stream.shutdown().await;
            }
        }
        Err(err)
    }

    /// Handles every whole packet in the read buffer. `Some(discard_will)` on DISCONNECT.
    fn process<S>(&mut self, io: &mut Io<S>) -> Result<Option<bool>, ConnectionError> {
        let max = self.limits.max_packet_size;
        let Io { rbuf, wbuf, .. } = io;
        let out = out(wbuf);
        let (mut ended, mut packets) = (None, 0);
        let result = loop {
            match Packet::decode(rbuf, self.version, max) {
                Ok(Some(packet)) => {
                    packets += 1;
                    match self.handle(packet, out) {
                        Ok(None) => {}
                        Ok(Some(discard_will)) => {
                            ended = Some(discard_will);
                            break Ok(());
                        }
                        Err(err) => break Err(err),
                    }
                }
                Ok(None) => break Ok(()),
                Err(err) => break Err(err.into()),
            }
        };
        self.broker.metrics().add(self.worker, Counter::PacketsReceived, packets);
        result?;
        release_read(rbuf);
        Ok(ended)
    }

    fn handle(&mut self, packet: Packet, out: &mut BytesMut) -> Result<Option<bool>, ConnectionError> {
        let session = self.attached.session.clone();
        let client_id = session.client_id();
        let store = self.broker.store();
        match packet {
            Packet::Connect(_) => return Err(protocol(ReasonCode::ProtocolError, "a second CONNECT [MQTT-3.1.0-2]")),
            Packet::Publish(publish) => self.publish(publish, out)?,
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
                    self.push_ack(None, Packet::PubRel(rel), false, out);
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
                self.push_ack(wait, Packet::PubComp(comp), false, out);
            }
            Packet::PubComp(ack) => {
                session.lock().pubcomp(ack.packet_id, client_id, store);
            }
            Packet::Subscribe(subscribe) => self.subscribe(subscribe, out),
            Packet::Unsubscribe(unsubscribe) => self.unsubscribe(unsubscribe, out),
            Packet::PingReq => self.push_ack(None, Packet::PingResp, false, out),
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

    /// Writes an acknowledgement, or queues it when it waits for the store or is behind one that does
    /// (acknowledgements go out in the order of the packets they answer [MQTT-4.6.0-2]).
    fn push_ack(&mut self, wait: Option<StoreWait>, packet: Packet, frees_inbound: bool, out: &mut BytesMut) {
        if wait.is_none() && self.pending.is_empty() {
            if frees_inbound {
                self.inbound_qos1 = self.inbound_qos1.saturating_sub(1);
            }
            // Acks are small and fixed-shape: encoding cannot fail.
            let _ = packet.encode(self.version, out);
            self.broker.metrics().inc(self.worker, Counter::PacketsSent);
        } else {
            self.pending.push_back(PendingAck { wait, packet, frees_inbound });
        }
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
        if self.pending.front().is_none_or(|p| p.wait.is_some()) {
            return;
        }
        let out = out(&mut io.wbuf);
        let mut written = 0;
        while self.pending.front().is_some_and(|p| p.wait.is_none()) {
            let Some(ack) = self.pending.pop_front() else { break };
            if ack.frees_inbound {
                self.inbound_qos1 = self.inbound_qos1.saturating_sub(1);
            }
            // Acks are small and fixed-shape: encoding cannot fail.
            let _ = ack.packet.encode(self.version, out);
            written += 1;
        }
        self.broker.metrics().add(self.worker, Counter::PacketsSent, written);
        self.pending.release_if_empty();
    }

    fn publish(&mut self, mut publish: Publish, out: &mut BytesMut) -> Result<(), ConnectionError> {
        let v5 = self.version.is_v5();
        if let Some(alias) = publish.properties.topic_alias.take() {
            let max = self.limits.topic_alias_maximum;
            if alias.get() > max {
                return Err(protocol(ReasonCode::TopicAliasInvalid, "topic alias above the maximum [MQTT-3.3.2-9]"));
            }
            if publish.topic.is_empty() {
                publish.topic = self
                    .aliases
                    .as_ref()
                    .and_then(|aliases| aliases.get(&alias.get()))
                    .cloned()
                    .ok_or(protocol(ReasonCode::ProtocolError, "an unknown topic alias without a topic name"))?;
            } else {
                // A copy: a slice would keep the read it came in alive for the connection's life.
                let topic = ByteString::from(&*publish.topic);
                self.aliases.get_or_insert_with(Default::default).insert(alias.get(), topic);
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
            let in_window = self.inbound_qos1 as usize + session.lock().inbound_qos2.len();
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
                    self.push_ack(None, Packet::PubAck(ack(ReasonCode::PayloadFormatInvalid)), true, out);
                }
                QoS::ExactlyOnce => {
                    self.push_ack(None, Packet::PubRec(ack(ReasonCode::PayloadFormatInvalid)), false, out)
                }
            }
            return Ok(());
        }
        let acl = &self.broker.auth().acl;
        if is_sys_topic(&publish.topic) || !acl.can_publish(self.user.as_deref(), session.client_id(), &publish.topic) {
            // Not authorized (`$SYS` is the broker's): v5 says so in the acknowledgement; v3 has no way to, so
            // the message is acknowledged and dropped, as Mosquitto does. QoS 0: dropped.
            metrics.inc(self.worker, Counter::AclDeniedPublish);
            let reason = if v5 { ReasonCode::NotAuthorized } else { ReasonCode::Success };
            match publish.qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => {
                    self.inbound_qos1 += 1;
                    self.push_ack(None, Packet::PubAck(ack(reason)), true, out);
                }
                QoS::ExactlyOnce => {
                    if !v5 {
                        // The v3 flow goes on to PUBREL / PUBCOMP.
                        session.lock().inbound_qos2.insert(packet_id.map_or(0, |id| id.get()));
                    }
                    self.push_ack(None, Packet::PubRec(ack(reason)), false, out);
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
                self.push_ack(None, Packet::PubRec(ack(ReasonCode::Success)), false, out);
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
                self.push_ack(wait, Packet::PubAck(ack(reason)), true, out);
            }
            QoS::ExactlyOnce => self.push_ack(wait, Packet::PubRec(ack(reason)), false, out),
        }
        Ok(())
    }

    fn subscribe(&mut self, subscribe: Subscribe, out: &mut BytesMut) {
        let id = subscribe.properties.subscription_identifier;
        let mut reasons = Vec::with_capacity(subscribe.subscriptions.len());
        let mut persisted = false;
        let auth = self.broker.auth();
        // Not a clone of the identifier: that would make its bytes shared, an allocation kept by the session.
        let client_id = self.attached.session.client_id();
        for subscription in &subscribe.subscriptions {
            let filter = crate::topic::FilterRef::parse(&subscription.filter).filter;
            if !auth.acl.can_subscribe(self.user.as_deref(), client_id, filter) {
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
        self.push_ack(wait, Packet::SubAck(suback), false, out);
    }

    fn unsubscribe(&mut self, unsubscribe: Unsubscribe, out: &mut BytesMut) {
        let mut reasons = Vec::with_capacity(unsubscribe.filters.len());
        let mut persisted = false;
        for filter in &unsubscribe.filters {
            let (existed, persist) = self.broker.unsubscribe(&self.attached.session, filter);
            persisted |= persist;
            reasons.push(if existed { ReasonCode::Success } else { ReasonCode::NoSubscriptionExisted });
        }
        let wait = if persisted { self.sync() } else { None };
        let unsuback = UnsubAck { packet_id: unsubscribe.packet_id, reasons, properties: Default::default() };
        self.push_ack(wait, Packet::UnsubAck(unsuback), false, out);
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
    /// `Err(TakenOver)` once the session has another connection (or has ended): it wakes this one to say so.
    fn take_outbound<S>(&mut self, io: &mut Io<S>) -> Result<(), ConnectionError> {
        let session = &self.attached.session;
        let store = self.broker.store();
        let mut state = session.lock();
        match &mut state.attachment {
            Some(attachment) if attachment.connection == self.attached.connection => attachment.clear_woken(),
            _ => return Err(ConnectionError::TakenOver),
        }
        if !state.has_outbound() {
            return Ok(());
        }
        let mut outbound = OUTBOUND.with(Cell::take);
        state.take_outbound(usize::from(self.send_window), session.client_id(), store, &mut outbound);
        let out = out(&mut io.wbuf);
        let mut sent = 0;
        for outbound in outbound.drain(..) {
            let mut alias = None;
            let packet = match outbound {
                Outbound::Publish(mut publish) => {
                    if self.aliases_out_max > 0 {
                        let aliases =
                            self.aliases_out.get_or_insert_with(|| Box::new(OutAliases::new(self.aliases_out_max)));
                        let chosen = aliases.choose(&publish.topic);
                        publish.properties.topic_alias = Some(chosen.id());
                        // The topic is kept to commit a new alias once the packet is written.
                        let topic = match chosen {
                            Alias::Known(_) => std::mem::take(&mut publish.topic),
                            Alias::Define(_) => publish.topic.clone(),
                        };
                        alias = Some((chosen, topic));
                    }
                    Packet::Publish(publish)
                }
                Outbound::PubRel(id) => Packet::PubRel(PublishAck::new(id)),
            };
            let fits = packet.encoded_len(self.version).is_ok_and(|len| len <= self.client_max_packet as usize);
            if fits && packet.encode(self.version, out).is_ok() {
                sent += 1;
                if let (Some((chosen, topic)), Some(aliases)) = (alias, self.aliases_out.as_mut()) {
                    aliases.commit(&topic, chosen);
                }
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
        OUTBOUND.with(|cell| cell.set(outbound));
        self.broker.metrics().add(self.worker, Counter::PacketsSent, sent);
        Ok(())
    }
}
