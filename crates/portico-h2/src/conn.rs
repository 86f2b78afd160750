//! One HTTP/2 server connection: reads frames and turns them into streams, runs the streams' state machines
//! and both directions of flow control (RFC 9113 5 and 6.9), and writes what the streams' handles queued.
//!
//! Everything lives on the connection's task: `Server` owns the socket, and the handles it gives out
//! (`RecvStream`, `SendResponse`, `SendStream`) share the rest (`Shared`) through an `Rc<RefCell<_>>`, each
//! borrow momentary. A handle that queues output wakes the connection, which writes it with what the other
//! streams queued in the same turn: one write per wake-up.

use crate::frame::{self, Head, Reason};
use crate::hpack::{Decoder, Encoder};
use crate::request::{Fields, RequestHead};
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Response};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite};

/// What a client sends first (RFC 9113 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The server's settings, announced in its first SETTINGS frame and enforced.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_concurrent_streams: u32,
    pub initial_stream_window: u32,
    pub initial_connection_window: u32,
    pub max_header_list_size: u32,
    pub max_frame_size: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_concurrent_streams: 100,
            initial_stream_window: frame::DEFAULT_WINDOW,
            initial_connection_window: frame::DEFAULT_WINDOW,
            max_header_list_size: 64 * 1024,
            max_frame_size: frame::DEFAULT_MAX_FRAME_SIZE,
        }
    }
}

/// Why a connection or a stream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("connection I/O: {0}")]
    Io(io::ErrorKind, String),
    /// The connection was closed with a GOAWAY carrying this code (`remote`: by the peer).
    #[error("connection closed with GOAWAY {reason}: {detail}")]
    GoAway { reason: Reason, remote: bool, detail: &'static str },
    /// The stream was reset (`remote`: by the peer).
    #[error("stream reset with {reason}")]
    Reset { reason: Reason, remote: bool },
    /// The connection is gone.
    #[error("connection closed")]
    Closed,
}

impl Error {
    pub fn is_io(&self) -> bool {
        matches!(self, Error::Io(..))
    }

    pub fn is_go_away(&self) -> bool {
        matches!(self, Error::GoAway { .. })
    }

    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::GoAway { reason, .. } | Error::Reset { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// A protocol error that ends the connection: the GOAWAY's code and its debug text.
struct ConnError(Reason, &'static str);

/// How much a stream may have queued beyond what has been written (the back-pressure on what answers it,
/// whatever window the client grants), and how much the connection buffers before it waits for the socket.
const MAX_QUEUED: i64 = 64 * 1024;
const OUT_HIGH: usize = 64 * 1024;
/// DATA frames are cut at 16 KiB whatever the client allows: the streams take turns at that grain, and the
/// output stays bounded.
const MAX_DATA_FRAME: u32 = 16 * 1024;
/// Control frames (PING and SETTINGS acknowledgements, resets) a client that does not read may pile up
/// before it is disconnected.
const OUT_LIMIT: usize = 1024 * 1024;
/// How many streams the client may reset while they are being answered, net of those answered: a client
/// that opens and resets streams in a loop (CVE-2023-44487) is disconnected with ENHANCE_YOUR_CALM.
const RESET_BUDGET: u32 = 200;
/// How many frames in a row may do nothing (empty DATA or CONTINUATION, PRIORITY, PING, SETTINGS, window
/// updates for streams that are gone) before the client is taken for one that only wants to make the server
/// work (CVE-2019-9518, "empty frames flood"). Any request or request body byte starts the count again.
const IDLE_FRAMES: u32 = 10_000;
/// The recently opened and recently closed (by both END_STREAMs, or the client's reset) stream ids kept: a frame on a stream closed
/// that way is the client's error (STREAM_CLOSED), one on a stream never opened too (PROTOCOL_ERROR); frames
/// on any other stream this side has forgotten (reset here, refused, or after our GOAWAY) are ignored, as
/// frames in flight when a stream is reset may be.
const HISTORY: usize = 128;

/// Streams by id: ids are distinct odd numbers, so a multiplication spreads them well enough.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type StreamMap = HashMap<u32, Stream, BuildHasherDefault<IdHasher>>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Recv {
    Open,
    /// END_STREAM received.
    Ended,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Send {
    /// No final response head yet.
    Idle,
    Open,
    /// END_STREAM written (or queued on the last DATA frame).
    Done,
}

const RECV_HANDLE: u8 = 1;
const RESPOND_HANDLE: u8 = 2;
const SEND_HANDLE: u8 = 4;

struct Stream {
    recv: Recv,
    send: Send,
    /// Set when either side reset the stream: both directions are over.
    reset: Option<(Reason, bool)>,
    /// Still counted against SETTINGS_MAX_CONCURRENT_STREAMS.
    counted: bool,
    handles: u8,
    /// Received DATA not yet taken.
    data: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    /// What the client may still send before a WINDOW_UPDATE.
    recv_window: i64,
    /// Taken but not yet given back in a WINDOW_UPDATE.
    unreleased: u32,
    content_length: Option<u64>,
    received: u64,
    recv_task: Option<Waker>,
    /// What the client lets us send.
    send_window: i64,
    queue: VecDeque<Bytes>,
    queued: i64,
    end_queued: bool,
    trailers_out: Option<HeaderMap>,
    in_ready: bool,
    send_task: Option<Waker>,
}

impl Stream {
    fn new(recv_window: i64, send_window: i64, end_stream: bool, content_length: Option<u64>) -> Stream {
        Stream {
            recv: if end_stream { Recv::Ended } else { Recv::Open },
            send: Send::Idle,
            reset: None,
            counted: true,
            handles: RECV_HANDLE | RESPOND_HANDLE,
            data: VecDeque::new(),
            trailers: None,
            recv_window,
            unreleased: 0,
            content_length,
            received: 0,
            recv_task: None,
            send_window,
            queue: VecDeque::new(),
            queued: 0,
            end_queued: false,
            trailers_out: None,
            in_ready: false,
            send_task: None,
        }
    }

    fn closed(&self) -> bool {
        self.reset.is_some() || (self.recv == Recv::Ended && self.send == Send::Done)
    }

    fn wake(&mut self) {
        if let Some(w) = self.recv_task.take() {
            w.wake();
        }
        if let Some(w) = self.send_task.take() {
            w.wake();
        }
    }
}

/// A header block being received across CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    bad_priority: bool,
    bytes: BytesMut,
}

/// What the connection and the streams' handles share.
struct Shared {
    streams: StreamMap,
    /// Requests accepted and not yet handed out.
    accepted: VecDeque<(RequestHead, u32)>,
    /// Frames to write.
    out: BytesMut,
    encoder: Encoder,
    decoder: Decoder,
    block: Option<Block>,
    settings: Settings,
    /// The client acknowledged our SETTINGS: its initial stream window applies.
    settings_acked: bool,
    peer_initial_window: i64,
    peer_max_frame: u32,
    send_window: i64,
    recv_window: i64,
    unreleased: u32,
    last_stream: u32,
    active: u32,
    /// Streams with DATA queued, in turn.
    ready: VecDeque<u32>,
    opened: VecDeque<u32>,
    closed_cleanly: VecDeque<u32>,
    /// The last stream id our GOAWAY announced, once sent.
    goaway: Option<u32>,
    failed: Option<Error>,
    conn_task: Option<Waker>,
    ping_out: Option<[u8; 8]>,
    pong: bool,
    pong_task: Option<Waker>,
    reset_budget: u32,
    /// Frames in a row that did nothing (see `IDLE_FRAMES`).
    idle_frames: u32,
}

/// The server side of one HTTP/2 connection. Poll `poll_accept` for requests (each a head, the body's reader
/// and the response's sender); it also reads, writes and runs
/// the connection, so it must be polled whenever it is woken, until it returns `Ready(None)` or an error.
pub struct Server<T> {
    io: T,
    read: BytesMut,
    shared: Rc<RefCell<Shared>>,
    /// Bytes of the preface still to check.
    preface_left: usize,
    eof: bool,
    /// The buffered output had something in it since the last flush of `io` (TLS buffers records).
    unflushed: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Server<T> {
    /// Starts a connection on `io`, `preread` being bytes already read from it (the preface, when it was read
    /// to tell HTTP/2 from HTTP/1). The server's SETTINGS go out with the first write.
    pub fn new(io: T, preread: Bytes, settings: Settings) -> Server<T> {
        let mut out = BytesMut::with_capacity(16 * 1024);
        let mut announced = vec![
            (frame::SETTINGS_MAX_CONCURRENT_STREAMS, settings.max_concurrent_streams),
            (frame::SETTINGS_INITIAL_WINDOW_SIZE, settings.initial_stream_window),
            (frame::SETTINGS_MAX_FRAME_SIZE, settings.max_frame_size),
            (frame::SETTINGS_MAX_HEADER_LIST_SIZE, settings.max_header_list_size),
        ];
        announced.retain(|&(id, v)| {
            !(id == frame::SETTINGS_INITIAL_WINDOW_SIZE && v == frame::DEFAULT_WINDOW
                || id == frame::SETTINGS_MAX_FRAME_SIZE && v == frame::DEFAULT_MAX_FRAME_SIZE)
        });
        frame::put_settings(&mut out, &announced);
        let connection_window = i64::from(settings.initial_connection_window.max(frame::DEFAULT_WINDOW));
        if connection_window > i64::from(frame::DEFAULT_WINDOW) {
            frame::put_window_update(&mut out, 0, (connection_window - i64::from(frame::DEFAULT_WINDOW)) as u32);
        }
        let mut read = BytesMut::with_capacity(16 * 1024);
        read.extend_from_slice(&preread);
        let shared = Shared {
            streams: StreamMap::default(),
            accepted: VecDeque::new(),
            out,
            encoder: Encoder::new(),
            decoder: Decoder::new(4096),
            block: None,
            settings,
            settings_acked: false,
            peer_initial_window: i64::from(frame::DEFAULT_WINDOW),
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE,
            send_window: i64::from(frame::DEFAULT_WINDOW),
            recv_window: connection_window,
            unreleased: 0,
            last_stream: 0,
            active: 0,
            ready: VecDeque::new(),
            opened: VecDeque::new(),
            closed_cleanly: VecDeque::new(),
            goaway: None,
            failed: None,
            conn_task: None,
            ping_out: None,
            pong: false,
            pong_task: None,
            reset_budget: RESET_BUDGET,
            idle_frames: 0,
        };
        Server {
            io,
            read,
            shared: Rc::new(RefCell::new(shared)),
            preface_left: PREFACE.len(),
            eof: false,
            unflushed: true,
        }
    }

    /// The next request, with the handles that read its body and answer it; `Ready(None)` when the
    /// connection has ended cleanly (the client closed it, or a graceful shutdown finished), an error when it
    /// failed (after the GOAWAY that says why has been written).
    #[allow(clippy::type_complexity)]
    pub fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<(RequestHead, RecvStream, SendResponse), Error>>> {
        {
            let mut s = self.shared.borrow_mut();
            if !s.conn_task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.conn_task = Some(cx.waker().clone());
            }
        }
        loop {
            let next = self.shared.borrow_mut().accepted.pop_front();
            if let Some((head, id)) = next {
                let gone = self.shared.borrow().streams.get(&id).is_none_or(|s| s.reset.is_some());
                if gone {
                    // Reset before it was handed out: nothing to answer. Its handles never existed.
                    let mut s = self.shared.borrow_mut();
                    if let Some(stream) = s.streams.get_mut(&id) {
                        stream.handles = 0;
                    }
                    s.closed(id);
                    continue;
                }
                let body = RecvStream { id, shared: self.shared.clone() };
                let respond = SendResponse { id, shared: self.shared.clone() };
                return Poll::Ready(Some(Ok((head, body, respond))));
            }
            let failing = self.shared.borrow().failed.is_some();
            if !failing {
                if let Err(ConnError(reason, detail)) = self.process() {
                    self.shared.borrow_mut().fail(reason, detail);
                }
                if !self.shared.borrow().accepted.is_empty() {
                    continue;
                }
            }
            // Written and flushed: TLS holds records until flushed, so "the buffer is empty" is not enough to
            // close on.
            let flushed = match self.poll_write(cx) {
                Poll::Ready(Err(e)) => {
                    self.shared.borrow_mut().close(Error::Io(e.kind(), e.to_string()));
                    return Poll::Ready(Some(Err(Error::Io(e.kind(), e.to_string()))));
                }
                Poll::Ready(Ok(())) => true,
                Poll::Pending => false,
            };
            {
                let s = self.shared.borrow();
                if let Some(failed) = &s.failed {
                    if flushed || self.eof {
                        let failed = failed.clone();
                        drop(s);
                        self.shared.borrow_mut().close(failed.clone());
                        return Poll::Ready(match failed {
                            Error::Closed => None,
                            e => Some(Err(e)),
                        });
                    }
                    // The GOAWAY is still being written; reading goes on only to see the socket close.
                } else if s.goaway.is_some() && s.active == 0 && flushed {
                    drop(s);
                    self.shared.borrow_mut().close(Error::Closed);
                    return Poll::Ready(None);
                }
            }
            if self.eof {
                // The client sends no more (a half-close, or it is gone): what it asked for is still answered,
                // then the connection ends. A client that is gone makes the writes fail.
                let done = self.shared.borrow().active == 0 && flushed;
                if done {
                    self.shared.borrow_mut().close(Error::Closed);
                    return Poll::Ready(None);
                }
                return Poll::Pending;
            }
            if failing {
                // Only the end of the connection is awaited now.
                self.read.clear();
            }
            match self.poll_read(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => {
                    self.shared.borrow_mut().close(Error::Io(e.kind(), e.to_string()));
                    return Poll::Ready(Some(Err(Error::Io(e.kind(), e.to_string()))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Stops taking new streams: a GOAWAY names the last stream that will be answered, and the connection
    /// ends (`poll_accept` returns `Ready(None)`) once those are.
    pub fn graceful_shutdown(&mut self) {
        let mut s = self.shared.borrow_mut();
        if s.goaway.is_none() && s.failed.is_none() {
            let last = s.last_stream;
            s.goaway = Some(last);
            frame::put_goaway(&mut s.out, last, Reason::NO_ERROR, b"");
            s.wake_conn();
        }
    }

    /// Sends a PING (unless one is unanswered); `poll_pong` tells when its answer arrives.
    pub fn send_ping(&mut self, payload: [u8; 8]) -> bool {
        let mut s = self.shared.borrow_mut();
        if s.ping_out.is_some() || s.failed.is_some() {
            return false;
        }
        s.ping_out = Some(payload);
        s.pong = false;
        frame::put_ping(&mut s.out, false, payload);
        s.wake_conn();
        true
    }

    /// Ready when the PING sent last was answered.
    pub fn poll_pong(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.shared.borrow_mut();
        if s.pong {
            s.pong = false;
            return Poll::Ready(());
        }
        s.pong_task = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The connection's transport.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// Streams being answered.
    pub fn active_streams(&self) -> u32 {
        self.shared.borrow().active
    }

    /// Whether the client owes the rest of something that comes before a request can start: the connection
    /// preface (owed from the start: RFC 9113 3.4), a frame other than DATA, or a header block awaiting its
    /// CONTINUATION frames. What a slowloris client keeps unfinished; a connection idle between frames, or one
    /// whose client is sending a body, is not. Meant to be asked once `poll_accept` is pending (every complete
    /// frame read is then handled).
    pub fn head_in_progress(&self) -> bool {
        let s = self.shared.borrow();
        if s.failed.is_some() || self.eof {
            return false;
        }
        if s.block.is_some() || self.preface_left > 0 {
            return true;
        }
        match self.read.get(..frame::HEADER_LEN) {
            Some(head) => head[3] != frame::DATA,
            None => !self.read.is_empty(),
        }
    }

    /// Ends the connection for a reason of the server's own (a GOAWAY with `reason` and `detail`, then the
    /// connection closes once it is written): streams in progress end with it.
    pub fn refuse(&mut self, reason: Reason, detail: &'static str) {
        let mut s = self.shared.borrow_mut();
        s.fail(reason, detail);
        s.wake_conn();
    }

    /// Reads from the socket into the read buffer: `Ready(Ok)` when something was read (or the peer closed
    /// the connection: `eof`).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.read.capacity() - self.read.len() < 8 * 1024 {
            self.read.reserve(32 * 1024);
        }
        let n = std::task::ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read))?;
        if n == 0 && !self.eof {
            self.eof = true;
            self.shared.borrow_mut().client_closed();
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what is queued; `Ready(Ok)` when everything was written (and flushed).
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut s = self.shared.borrow_mut();
            s.flush_data();
            if s.out.is_empty() {
                break;
            }
            self.unflushed = true;
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &s.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            s.out.advance(n);
        }
        if self.unflushed {
            std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Handles every complete frame in the read buffer.
    fn process(&mut self) -> Result<(), ConnError> {
        if self.preface_left > 0 {
            let at = PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(self.read.len());
            if self.read[..n] != PREFACE[at..at + n] {
                return Err(ConnError(Reason::PROTOCOL_ERROR, "invalid connection preface"));
            }
            self.read.advance(n);
            self.preface_left -= n;
            if self.preface_left > 0 {
                return Ok(());
            }
            if self.read.len() >= frame::HEADER_LEN {
                // RFC 9113 3.4: the preface's SETTINGS frame comes first.
                let head = Head::parse(&self.read);
                if head.kind != frame::SETTINGS || head.flags & frame::ACK != 0 {
                    return Err(ConnError(Reason::PROTOCOL_ERROR, "the preface is not followed by SETTINGS"));
                }
            }
        }
        let mut s = self.shared.borrow_mut();
        while self.read.len() >= frame::HEADER_LEN {
            let head = Head::parse(&self.read);
            if head.length > s.settings.max_frame_size {
                return Err(ConnError(Reason::FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE"));
            }
            let total = frame::HEADER_LEN + head.length as usize;
            if self.read.len() < total {
                self.read.reserve(total - self.read.len());
                break;
            }
            if head.kind == frame::DATA {
                let mut payload = self.read.split_to(total);
                payload.advance(frame::HEADER_LEN);
                s.data(head, payload.freeze())?;
            } else {
                s.count_idle(head)?;
                s.frame(head, &self.read[frame::HEADER_LEN..total])?;
                self.read.advance(total);
            }
            if s.out.len() > OUT_LIMIT {
                return Err(ConnError(Reason::ENHANCE_YOUR_CALM, "the client does not read what it asks for"));
            }
        }
        Ok(())
    }
}

impl<T> Drop for Server<T> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.try_borrow_mut() {
            s.close(Error::Closed);
        }
    }
}

impl Shared {
    fn wake_conn(&mut self) {
        if let Some(w) = &self.conn_task {
            w.wake_by_ref();
        }
    }

    /// Ends the connection with `reason`: a GOAWAY, then the connection closes once it is written.
    fn fail(&mut self, reason: Reason, detail: &'static str) {
        if self.failed.is_some() {
            return;
        }
        // RFC 9113 6.8: a second GOAWAY never names a higher stream than the first.
        let last = self.goaway.map_or(self.last_stream, |g| g.min(self.last_stream));
        frame::put_goaway(&mut self.out, last, reason, detail.as_bytes());
        self.failed = Some(Error::GoAway { reason, remote: false, detail });
        self.wake_streams();
    }

    /// The client closed its side: requests whose bodies were still coming will not get the rest (their
    /// streams end as if the client reset them); requests it sent whole are still answered.
    fn client_closed(&mut self) {
        for stream in self.streams.values_mut() {
            if stream.recv == Recv::Open && stream.reset.is_none() {
                stream.reset = Some((Reason::CANCEL, true));
                stream.queue.clear();
                stream.queued = 0;
                stream.wake();
            }
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.closed(id);
        }
    }

    /// The connection is over: every handle sees `error` from now on.
    fn close(&mut self, error: Error) {
        if !matches!(self.failed, Some(Error::GoAway { .. })) {
            self.failed = Some(error);
        }
        self.wake_streams();
    }

    fn wake_streams(&mut self) {
        for stream in self.streams.values_mut() {
            stream.wake();
        }
        if let Some(w) = self.pong_task.take() {
            w.wake();
        }
    }

    fn remember(list: &mut VecDeque<u32>, id: u32) {
        if list.len() == HISTORY {
            list.pop_front();
        }
        list.push_back(id);
    }

    /// A stream error the client caused (a bad frame on the stream): the stream is reset, and it counts
    /// against the reset budget as a client's own RST_STREAM does, so a client cannot make the server open and
    /// reset streams without limit either (CVE-2025-8671, "MadeYouReset").
    fn stream_error(&mut self, id: u32, reason: Reason) -> Result<(), ConnError> {
        if self.streams.get(&id).is_some_and(|s| s.counted && s.send != Send::Done) {
            self.reset_budget = self.reset_budget.saturating_sub(1);
        }
        self.reset(id, reason);
        if self.reset_budget == 0 {
            return Err(ConnError(Reason::ENHANCE_YOUR_CALM, "too many stream errors"));
        }
        Ok(())
    }

    /// Resets stream `id` from this side.
    fn reset(&mut self, id: u32, reason: Reason) {
        frame::put_rst_stream(&mut self.out, id, reason);
        if let Some(stream) = self.streams.get_mut(&id) {
            if stream.reset.is_none() {
                stream.reset = Some((reason, false));
                stream.queue.clear();
                stream.queued = 0;
                stream.wake();
            }
        }
        self.closed(id);
        self.wake_conn();
    }

    /// Takes note of a stream that may have reached the closed state: it stops counting against the limit,
    /// and is forgotten once no handle refers to it.
    fn closed(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else { return };
        if !stream.closed() {
            return;
        }
        if stream.counted {
            stream.counted = false;
            self.active -= 1;
            if stream.reset.is_none() {
                self.reset_budget = (self.reset_budget + 1).min(RESET_BUDGET);
            }
            // Closed by the client (its END_STREAM and ours, or its RST_STREAM): its frames after that are
            // its error. Streams reset here are not remembered: the client may still have frames in flight.
            if !matches!(stream.reset, Some((_, false))) {
                Shared::remember(&mut self.closed_cleanly, id);
            }
        }
        if stream.handles == 0 {
            self.streams.remove(&id);
        }
    }

    /// Gives `n` received bytes back to the connection's window, in a WINDOW_UPDATE once half of it is due.
    fn release_connection(&mut self, n: u32) {
        self.unreleased += n;
        let target = self.settings.initial_connection_window.max(frame::DEFAULT_WINDOW);
        if self.unreleased >= target / 2 && self.failed.is_none() {
            frame::put_window_update(&mut self.out, 0, self.unreleased);
            self.recv_window += i64::from(self.unreleased);
            self.unreleased = 0;
            self.wake_conn();
        }
    }

    /// The stream's initial receive window as the client sees it now.
    fn local_initial_window(&self) -> i64 {
        if self.settings_acked {
            i64::from(self.settings.initial_stream_window)
        } else {
            i64::from(frame::DEFAULT_WINDOW)
        }
    }

    /// A stream id the client used before: opened (then closed) or skipped (never opened)?
    fn was_opened(&self, id: u32) -> bool {
        match self.opened.front() {
            // Nothing forgotten yet, or within what is remembered: known exactly.
            Some(&oldest) if id >= oldest || self.opened.len() < HISTORY => self.opened.binary_search(&id).is_ok(),
            None => false,
            // Older than what is remembered: assume it was.
            Some(_) => true,
        }
    }

    fn data(&mut self, head: Head, payload: Bytes) -> Result<(), ConnError> {
        if self.block.is_some() {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "DATA inside a header block"));
        }
        let id = head.stream;
        if id == 0 || id.is_multiple_of(2) {
            // Stream 0 is the connection; even ids are the server's, which opens none.
            return Err(ConnError(Reason::PROTOCOL_ERROR, "DATA on stream 0 or an even-numbered stream"));
        }
        let length = payload.len() as u32;
        let (start, end) = unpad(head, &payload)?;
        if end > start {
            self.idle_frames = 0;
        } else if head.flags & frame::END_STREAM == 0 {
            // No data and no end: a frame that does nothing (padding alone included).
            self.idle_frame()?;
        }
        // Flow control counts the whole payload, padding included.
        self.recv_window -= i64::from(length);
        if self.recv_window < 0 {
            return Err(ConnError(Reason::FLOW_CONTROL_ERROR, "DATA beyond the connection's window"));
        }
        if id > self.last_stream {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let Some(stream) = self.streams.get_mut(&id) else {
            self.release_connection(length);
            if self.closed_cleanly.contains(&id) {
                return Err(ConnError(Reason::STREAM_CLOSED, "DATA on a closed stream"));
            }
            // Reset or refused here, or after our GOAWAY: frames in flight are ignored (RFC 9113 5.1, 6.8).
            return Ok(());
        };
        match stream.reset {
            // Reset here: frames in flight are ignored.
            Some((_, false)) => {
                self.release_connection(length);
                return Ok(());
            }
            Some((_, true)) => {
                self.release_connection(length);
                frame::put_rst_stream(&mut self.out, id, Reason::STREAM_CLOSED);
                return Ok(());
            }
            None => {}
        }
        if stream.recv == Recv::Ended {
            self.release_connection(length);
            return Err(ConnError(Reason::STREAM_CLOSED, "DATA after END_STREAM"));
        }
        stream.recv_window -= i64::from(length);
        if stream.recv_window < 0 {
            self.release_connection(length);
            return self.stream_error(id, Reason::FLOW_CONTROL_ERROR);
        }
        // A small piece is copied: a slice would keep the whole read buffer it came from alive.
        let data =
            if end - start < 1024 { Bytes::copy_from_slice(&payload[start..end]) } else { payload.slice(start..end) };
        stream.received += data.len() as u64;
        let end_stream = head.flags & frame::END_STREAM != 0;
        let length_mismatch = match stream.content_length {
            Some(n) => stream.received > n || end_stream && stream.received != n,
            None => false,
        };
        if length_mismatch {
            self.release_connection(length);
            return self.stream_error(id, Reason::PROTOCOL_ERROR);
        }
        let padding = length - data.len() as u32;
        let kept = stream.handles & RECV_HANDLE != 0;
        if kept && !data.is_empty() {
            stream.data.push_back(data);
        }
        if end_stream {
            stream.recv = Recv::Ended;
        }
        if let Some(w) = stream.recv_task.take() {
            w.wake();
        }
        // Padding, and data nobody will read, go straight back to the window.
        let unread = if kept { padding } else { length };
        if unread > 0 {
            stream.unreleased += unread;
            self.release_connection(unread);
            self.release_stream(id, 0);
        }
        if end_stream {
            self.closed(id);
        }
        Ok(())
    }

    /// Gives `n` bytes taken from stream `id` back to its window (and the connection's).
    fn release_stream(&mut self, id: u32, n: u32) {
        if n > 0 {
            self.release_connection(n);
        }
        let target = self.local_initial_window() as u32;
        let Some(stream) = self.streams.get_mut(&id) else { return };
        stream.unreleased += n;
        if stream.recv == Recv::Open && stream.reset.is_none() && stream.unreleased >= target / 2 {
            frame::put_window_update(&mut self.out, id, stream.unreleased);
            stream.recv_window += i64::from(stream.unreleased);
            stream.unreleased = 0;
            self.wake_conn();
        }
    }

    /// Counts a frame other than DATA towards `IDLE_FRAMES` (or starts the count again: HEADERS).
    fn count_idle(&mut self, head: Head) -> Result<(), ConnError> {
        let idle = match head.kind {
            frame::HEADERS => {
                self.idle_frames = 0;
                return Ok(());
            }
            frame::CONTINUATION => head.length == 0 && head.flags & frame::END_HEADERS == 0,
            frame::PING | frame::SETTINGS => head.flags & frame::ACK == 0,
            // A stream's end, flow control and the connection's end are part of normal traffic: a download
            // sends WINDOW_UPDATEs and nothing else for as long as it lasts.
            frame::RST_STREAM | frame::WINDOW_UPDATE | frame::GOAWAY => false,
            // PRIORITY, PUSH_PROMISE (an error anyway) and unknown types.
            _ => true,
        };
        if idle {
            self.idle_frame()?;
        }
        Ok(())
    }

    fn idle_frame(&mut self) -> Result<(), ConnError> {
        self.idle_frames += 1;
        if self.idle_frames > IDLE_FRAMES {
            return Err(ConnError(Reason::ENHANCE_YOUR_CALM, "too many frames that do nothing"));
        }
        Ok(())
    }

    /// Every frame but DATA.
    fn frame(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if let Some(block) = &self.block {
            if head.kind != frame::CONTINUATION || head.stream != block.stream {
                return Err(ConnError(Reason::PROTOCOL_ERROR, "a frame other than CONTINUATION inside a header block"));
            }
        }
        match head.kind {
            frame::HEADERS => self.headers(head, payload),
            frame::CONTINUATION => self.continuation(head, payload),
            frame::PRIORITY => {
                if head.stream == 0 {
                    return Err(ConnError(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if payload.len() != 5 {
                    return self.stream_error(head.stream, Reason::FRAME_SIZE_ERROR);
                }
                if depends_on_itself(head.stream, payload) {
                    return self.stream_error(head.stream, Reason::PROTOCOL_ERROR);
                }
                Ok(())
            }
            frame::RST_STREAM => self.rst_stream(head, payload),
            frame::SETTINGS => self.settings(head, payload),
            frame::PUSH_PROMISE => Err(ConnError(Reason::PROTOCOL_ERROR, "PUSH_PROMISE from a client")),
            frame::PING => {
                if head.stream != 0 {
                    return Err(ConnError(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
                    return Err(ConnError(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes long"));
                };
                if head.flags & frame::ACK == 0 {
                    frame::put_ping(&mut self.out, true, bytes);
                } else if self.ping_out == Some(bytes) {
                    self.ping_out = None;
                    self.pong = true;
                    if let Some(w) = self.pong_task.take() {
                        w.wake();
                    }
                }
                Ok(())
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(ConnError(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(ConnError(Reason::FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes"));
                }
                // The client closes the connection itself when it is done (closing first would reset what
                // it still sends, a PING whose answer it awaits, say); the idle timeout covers a client that
                // does not.
                Ok(())
            }
            frame::WINDOW_UPDATE => self.window_update(head, payload),
            // Unknown frame types are ignored (RFC 9113 4.1, 5.5).
            _ => Ok(()),
        }
    }

    fn headers(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        if id.is_multiple_of(2) {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "HEADERS on an even-numbered stream"));
        }
        let (mut start, end) = unpad(head, payload)?;
        let mut bad_priority = false;
        if head.flags & frame::PRIORITY_FLAG != 0 {
            if end - start < 5 {
                return Err(ConnError(Reason::FRAME_SIZE_ERROR, "HEADERS too short for its priority"));
            }
            bad_priority = depends_on_itself(id, &payload[start..start + 5]);
            start += 5;
        }
        let end_stream = head.flags & frame::END_STREAM != 0;
        let fragment = &payload[start..end];
        if head.flags & frame::END_HEADERS != 0 {
            return self.header_block(id, end_stream, bad_priority, fragment);
        }
        let mut bytes = BytesMut::with_capacity(fragment.len() * 2);
        bytes.extend_from_slice(fragment);
        self.block = Some(Block { stream: id, end_stream, bad_priority, bytes });
        Ok(())
    }

    fn continuation(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Some(block) = &mut self.block else {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "CONTINUATION without a header block"));
        };
        block.bytes.extend_from_slice(payload);
        // However the block is split, it cannot be bigger than the list it decodes to allows for (plus room
        // for the encoding): a CONTINUATION flood ends here.
        if block.bytes.len() > self.settings.max_header_list_size as usize * 2 + 16 * 1024 {
            return Err(ConnError(Reason::ENHANCE_YOUR_CALM, "header block too large"));
        }
        if head.flags & frame::END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else { return Ok(()) };
        self.header_block(block.stream, block.end_stream, block.bad_priority, &block.bytes)
    }

    /// A complete header block: a new request, or a request's trailers.
    fn header_block(&mut self, id: u32, end_stream: bool, bad_priority: bool, block: &[u8]) -> Result<(), ConnError> {
        let existing = self.streams.get(&id).map(|s| (s.recv, s.reset));
        let trailers = existing.is_some();
        let max_list = self.settings.max_header_list_size as usize;
        let mut fields = Fields::new(trailers, block.len());
        if let Err(e) = self.decoder.decode(block, |name, value| fields.add(name, value, max_list)) {
            let _ = e;
            return Err(ConnError(Reason::COMPRESSION_ERROR, "invalid header block (HPACK)"));
        }
        if let Some((recv, reset)) = existing {
            return match (recv, reset) {
                (_, Some((_, false))) => Ok(()),
                (_, Some((_, true))) => {
                    frame::put_rst_stream(&mut self.out, id, Reason::STREAM_CLOSED);
                    Ok(())
                }
                (Recv::Ended, None) => Err(ConnError(Reason::STREAM_CLOSED, "HEADERS after END_STREAM")),
                (Recv::Open, None) => {
                    if !end_stream || fields.malformed.is_some() || fields.list_size > max_list {
                        return self.stream_error(id, Reason::PROTOCOL_ERROR);
                    }
                    self.trailers(id, fields.into_trailers());
                    Ok(())
                }
            };
        }
        if id <= self.last_stream {
            if self.closed_cleanly.contains(&id) {
                return Err(ConnError(Reason::STREAM_CLOSED, "HEADERS on a closed stream"));
            }
            if !self.was_opened(id) {
                return Err(ConnError(Reason::PROTOCOL_ERROR, "a new stream's id is not above the last one"));
            }
            // Reset or refused here, or after our GOAWAY: ignored.
            return Ok(());
        }
        self.last_stream = id;
        Shared::remember(&mut self.opened, id);
        if self.goaway.is_some() || self.failed.is_some() {
            // After our GOAWAY: not processed; the client may retry it elsewhere.
            return Ok(());
        }
        if bad_priority {
            self.reset(id, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if fields.list_size > max_list {
            self.too_large(id, end_stream);
            return Ok(());
        }
        if self.active >= self.settings.max_concurrent_streams {
            self.reset(id, Reason::REFUSED_STREAM);
            return Ok(());
        }
        let content_length = fields.content_length;
        if end_stream && content_length.is_some_and(|n| n > 0) {
            self.reset(id, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        let head = match fields.into_request() {
            Ok(head) => head,
            Err(_) => {
                self.reset(id, Reason::PROTOCOL_ERROR);
                return Ok(());
            }
        };
        let stream = Stream::new(self.local_initial_window(), self.peer_initial_window, end_stream, content_length);
        self.streams.insert(id, stream);
        self.active += 1;
        self.accepted.push_back((head, id));
        Ok(())
    }

    /// A request whose fields are over SETTINGS_MAX_HEADER_LIST_SIZE: answered 431 without being accepted.
    fn too_large(&mut self, id: u32, end_stream: bool) {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("0"));
        self.write_headers(id, Some(431), &headers, true);
        if !end_stream {
            self.reset(id, Reason::NO_ERROR);
        }
    }

    fn trailers(&mut self, id: u32, headers: HeaderMap) {
        let Some(stream) = self.streams.get_mut(&id) else { return };
        if stream.content_length.is_some_and(|n| n != stream.received) {
            let _ = self.stream_error(id, Reason::PROTOCOL_ERROR);
            return;
        }
        stream.recv = Recv::Ended;
        if stream.handles & RECV_HANDLE != 0 {
            stream.trailers = Some(headers);
        }
        if let Some(w) = stream.recv_task.take() {
            w.wake();
        }
        self.closed(id);
    }

    fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        let Ok(code) = <[u8; 4]>::try_from(payload) else {
            return Err(ConnError(Reason::FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes long"));
        };
        if id > self.last_stream || id.is_multiple_of(2) {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
        }
        let Some(stream) = self.streams.get_mut(&id) else { return Ok(()) };
        if stream.reset.is_some() {
            return Ok(());
        }
        let answered = stream.send == Send::Done;
        stream.reset = Some((Reason(u32::from_be_bytes(code)), true));
        stream.queue.clear();
        stream.queued = 0;
        stream.wake();
        if stream.counted && !answered {
            self.reset_budget = self.reset_budget.saturating_sub(1);
        }
        self.closed(id);
        if self.reset_budget == 0 {
            return Err(ConnError(Reason::ENHANCE_YOUR_CALM, "too many streams reset by the client"));
        }
        Ok(())
    }

    fn settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.flags & frame::ACK != 0 {
            if !payload.is_empty() {
                return Err(ConnError(Reason::FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload"));
            }
            if !self.settings_acked {
                self.settings_acked = true;
                // The streams opened before count from the new initial window too (RFC 9113 6.9.2).
                let delta = i64::from(self.settings.initial_stream_window) - i64::from(frame::DEFAULT_WINDOW);
                if delta != 0 {
                    for stream in self.streams.values_mut() {
                        stream.recv_window += delta;
                    }
                }
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(ConnError(Reason::FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6"));
        }
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(ConnError(Reason::PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1"));
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > frame::MAX_WINDOW {
                        return Err(ConnError(Reason::FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1"));
                    }
                    let delta = i64::from(value) - self.peer_initial_window;
                    self.peer_initial_window = i64::from(value);
                    for (&id, stream) in self.streams.iter_mut() {
                        if stream.send == Send::Done || stream.reset.is_some() {
                            continue;
                        }
                        stream.send_window += delta;
                        if stream.send_window > frame::MAX_WINDOW {
                            return Err(ConnError(Reason::FLOW_CONTROL_ERROR, "a stream's window above 2^31-1"));
                        }
                        if delta > 0 && !stream.queue.is_empty() && !stream.in_ready {
                            stream.in_ready = true;
                            self.ready.push_back(id);
                        }
                        if delta > 0 {
                            if let Some(w) = stream.send_task.take() {
                                w.wake();
                            }
                        }
                    }
                }
                frame::SETTINGS_HEADER_TABLE_SIZE => self.encoder.set_peer_limit(value as usize),
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_FRAME_SIZE_LIMIT).contains(&value) {
                        return Err(ConnError(Reason::PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range"));
                    }
                    self.peer_max_frame = value;
                }
                // Concurrent streams limit pushes, which this server does not make; the client's header list
                // size is advisory.
                _ => {}
            }
        }
        frame::put_settings_ack(&mut self.out);
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Ok(bytes) = <[u8; 4]>::try_from(payload) else {
            return Err(ConnError(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes long"));
        };
        let increment = i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff);
        let id = head.stream;
        if id == 0 {
            if increment == 0 {
                return Err(ConnError(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection"));
            }
            self.send_window += increment;
            if self.send_window > frame::MAX_WINDOW {
                return Err(ConnError(Reason::FLOW_CONTROL_ERROR, "connection window above 2^31-1"));
            }
            return Ok(());
        }
        if id > self.last_stream || id.is_multiple_of(2) {
            return Err(ConnError(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
        }
        let Some(stream) = self.streams.get_mut(&id) else { return Ok(()) };
        if stream.reset.is_some() || stream.send == Send::Done {
            return Ok(());
        }
        if increment == 0 {
            return self.stream_error(id, Reason::PROTOCOL_ERROR);
        }
        stream.send_window += increment;
        if stream.send_window > frame::MAX_WINDOW {
            return self.stream_error(id, Reason::FLOW_CONTROL_ERROR);
        }
        if !stream.queue.is_empty() && !stream.in_ready {
            stream.in_ready = true;
            self.ready.push_back(id);
        }
        if let Some(w) = stream.send_task.take() {
            w.wake();
        }
        Ok(())
    }

    /// Writes a header block (a response's head when `status` is set, else trailers) as HEADERS and, when
    /// it is larger than the client's maximum frame, CONTINUATION frames.
    fn write_headers(&mut self, id: u32, status: Option<u16>, headers: &HeaderMap, end_stream: bool) {
        let at = self.out.len();
        let flags = frame::END_HEADERS | if end_stream { frame::END_STREAM } else { 0 };
        frame::put_head(&mut self.out, 0, frame::HEADERS, flags, id);
        self.encoder.begin_block(&mut self.out);
        if let Some(status) = status {
            self.encoder.status(status, &mut self.out);
        }
        for (name, value) in headers {
            self.encoder.field(name.as_str().as_bytes(), value.as_bytes(), value.is_sensitive(), &mut self.out);
        }
        let length = self.out.len() - at - frame::HEADER_LEN;
        let max = self.peer_max_frame as usize;
        if length <= max {
            frame::patch_length(&mut self.out, at, length);
        } else {
            // Rare: split the block over CONTINUATION frames.
            let block = self.out.split_off(at + frame::HEADER_LEN);
            self.out.truncate(at);
            let mut chunks = block.chunks(max).peekable();
            let mut first = true;
            while let Some(chunk) = chunks.next() {
                let last = chunks.peek().is_none();
                let (kind, mut flags) = if first {
                    (frame::HEADERS, if end_stream { frame::END_STREAM } else { 0 })
                } else {
                    (frame::CONTINUATION, 0)
                };
                if last {
                    flags |= frame::END_HEADERS;
                }
                frame::put_head(&mut self.out, chunk.len(), kind, flags, id);
                self.out.extend_from_slice(chunk);
                first = false;
            }
        }
        self.wake_conn();
    }

    /// The stream's send side finished (END_STREAM written).
    fn send_done(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else { return };
        stream.send = Send::Done;
        if stream.recv == Recv::Open && stream.handles & RECV_HANDLE == 0 {
            // Answered, and nobody reads the rest of the request: the client may stop sending it.
            self.reset(id, Reason::NO_ERROR);
            return;
        }
        self.closed(id);
    }

    /// Moves queued DATA into the output, one frame per stream in turn, as the windows allow.
    fn flush_data(&mut self) {
        while self.out.len() < OUT_HIGH {
            let Some(id) = self.ready.pop_front() else { break };
            let Some(stream) = self.streams.get_mut(&id) else { continue };
            stream.in_ready = false;
            if stream.reset.is_some() {
                continue;
            }
            let pieces = stream.queue.len();
            let Some(front) = stream.queue.front_mut() else { continue };
            let n = (front.len() as i64)
                .min(stream.send_window)
                .min(self.send_window)
                .min(i64::from(self.peer_max_frame.min(MAX_DATA_FRAME)))
                .max(0) as usize;
            if n == 0 {
                if self.send_window <= 0 && stream.send_window > 0 {
                    // The connection's window is shut: every stream waits for it.
                    stream.in_ready = true;
                    self.ready.push_front(id);
                    break;
                }
                // This stream's window is shut: a WINDOW_UPDATE puts it back in turn.
                continue;
            }
            let last = n == front.len() && pieces == 1;
            let end = last && stream.end_queued && stream.trailers_out.is_none();
            frame::put_head(&mut self.out, n, frame::DATA, if end { frame::END_STREAM } else { 0 }, id);
            self.out.extend_from_slice(&front[..n]);
            if n == front.len() {
                stream.queue.pop_front();
            } else {
                front.advance(n);
            }
            stream.send_window -= n as i64;
            stream.queued -= n as i64;
            self.send_window -= n as i64;
            if let Some(w) = stream.send_task.take() {
                w.wake();
            }
            if !stream.queue.is_empty() {
                stream.in_ready = true;
                self.ready.push_back(id);
            } else if let Some(trailers) = stream.trailers_out.take() {
                self.write_headers(id, None, &trailers, true);
                self.send_done(id);
            } else if end {
                self.send_done(id);
            }
        }
    }
}

/// The padding of a DATA or HEADERS frame: the payload's range without it.
fn unpad(head: Head, payload: &[u8]) -> Result<(usize, usize), ConnError> {
    if head.flags & frame::PADDED == 0 {
        return Ok((0, payload.len()));
    }
    let Some(&pad) = payload.first() else {
        return Err(ConnError(Reason::FRAME_SIZE_ERROR, "padded frame without its pad length"));
    };
    if pad as usize >= payload.len() {
        return Err(ConnError(Reason::PROTOCOL_ERROR, "padding as long as the frame"));
    }
    Ok((1, payload.len() - pad as usize))
}

/// A PRIORITY field (stream dependency, weight) that makes the stream depend on itself.
fn depends_on_itself(id: u32, priority: &[u8]) -> bool {
    u32::from_be_bytes([priority[0], priority[1], priority[2], priority[3]]) & 0x7fff_ffff == id
}

/// Reads a request's body: its DATA, then its trailers. What is read is given back to the client's window.
pub struct RecvStream {
    id: u32,
    shared: Rc<RefCell<Shared>>,
}

impl RecvStream {
    /// The next piece of the body, `None` at its end.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        let mut s = self.shared.borrow_mut();
        let failed = s.failed.clone();
        let Some(stream) = s.streams.get_mut(&self.id) else {
            return Poll::Ready(Some(Err(failed.unwrap_or(Error::Closed))));
        };
        if let Some(data) = stream.data.pop_front() {
            let n = data.len() as u32;
            s.release_stream(self.id, n);
            return Poll::Ready(Some(Ok(data)));
        }
        if let Some((reason, remote)) = stream.reset {
            return Poll::Ready(Some(Err(Error::Reset { reason, remote })));
        }
        if stream.recv == Recv::Ended {
            return Poll::Ready(None);
        }
        if let Some(failed) = failed {
            return Poll::Ready(Some(Err(failed)));
        }
        stream.recv_task = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The trailers, once the body has been read.
    pub fn poll_trailers(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<HeaderMap>, Error>> {
        let mut s = self.shared.borrow_mut();
        let failed = s.failed.clone();
        let Some(stream) = s.streams.get_mut(&self.id) else {
            return Poll::Ready(Err(failed.unwrap_or(Error::Closed)));
        };
        if let Some((reason, remote)) = stream.reset {
            return Poll::Ready(Err(Error::Reset { reason, remote }));
        }
        if stream.recv == Recv::Ended {
            return Poll::Ready(Ok(stream.trailers.take()));
        }
        if let Some(failed) = failed {
            return Poll::Ready(Err(failed));
        }
        stream.recv_task = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The body has ended and all of it has been read.
    pub fn is_end_stream(&self) -> bool {
        let s = self.shared.borrow();
        s.streams.get(&self.id).is_none_or(|st| st.recv == Recv::Ended && st.data.is_empty() && st.trailers.is_none())
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let Ok(mut s) = self.shared.try_borrow_mut() else { return };
        let Some(stream) = s.streams.get_mut(&self.id) else { return };
        stream.handles &= !RECV_HANDLE;
        let left: usize = stream.data.drain(..).map(|d| d.len()).sum();
        stream.trailers = None;
        let reset_now = stream.recv == Recv::Open && stream.send == Send::Done && stream.reset.is_none();
        if left > 0 {
            s.release_stream(self.id, left as u32);
        }
        if reset_now {
            s.reset(self.id, Reason::NO_ERROR);
        } else {
            s.closed(self.id);
        }
    }
}

/// Answers a request: 1xx heads, then the final head (`send_response`), which gives the body's `SendStream`.
pub struct SendResponse {
    id: u32,
    shared: Rc<RefCell<Shared>>,
}

impl SendResponse {
    /// Sends an interim (1xx) response.
    pub fn send_informational(&mut self, response: Response<()>) -> Result<(), Error> {
        let mut s = self.shared.borrow_mut();
        let stream = s.usable(self.id)?;
        let status = response.status();
        if stream.send != Send::Idle || !status.is_informational() || status == http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(Error::Closed);
        }
        s.write_headers(self.id, Some(response.status().as_u16()), response.headers(), false);
        Ok(())
    }

    /// Sends the response's head; `end_stream` when there is no body.
    pub fn send_response(&mut self, response: Response<()>, end_stream: bool) -> Result<SendStream, Error> {
        let mut s = self.shared.borrow_mut();
        let stream = s.usable(self.id)?;
        if stream.send != Send::Idle {
            return Err(Error::Closed);
        }
        stream.send = Send::Open;
        stream.handles |= SEND_HANDLE;
        s.write_headers(self.id, Some(response.status().as_u16()), response.headers(), end_stream);
        if end_stream {
            s.send_done(self.id);
        }
        Ok(SendStream { id: self.id, shared: self.shared.clone() })
    }

    /// Ready when the client resets the stream (or the connection ends).
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<Reason, Error>> {
        poll_reset(&self.shared, self.id, cx)
    }

    pub fn send_reset(&mut self, reason: Reason) {
        send_reset(&self.shared, self.id, reason);
    }
}

impl Drop for SendResponse {
    fn drop(&mut self) {
        drop_sender(&self.shared, self.id, RESPOND_HANDLE);
    }
}

/// A response's body: DATA as the client's windows allow, then trailers or the end.
pub struct SendStream {
    id: u32,
    shared: Rc<RefCell<Shared>>,
}

impl SendStream {
    /// Ready with how much more may be queued now (more than 0), or the reason the stream cannot take any.
    pub fn poll_capacity(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, Error>> {
        let mut s = self.shared.borrow_mut();
        let stream = s.usable(self.id)?;
        let room = stream.send_window.min(MAX_QUEUED) - stream.queued;
        if room > 0 {
            return Poll::Ready(Ok(room as usize));
        }
        stream.send_task = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Queues `data` (any size: the capacity is a target, not a limit); `end_stream` ends the body.
    pub fn send_data(&mut self, data: Bytes, end_stream: bool) -> Result<(), Error> {
        let mut s = self.shared.borrow_mut();
        let stream = s.usable(self.id)?;
        if stream.send != Send::Open || stream.end_queued {
            return Err(Error::Closed);
        }
        if data.is_empty() && stream.queue.is_empty() {
            if end_stream {
                frame::put_head(&mut s.out, 0, frame::DATA, frame::END_STREAM, self.id);
                s.send_done(self.id);
                s.wake_conn();
            }
            return Ok(());
        }
        stream.end_queued = end_stream;
        if !data.is_empty() {
            stream.queued += data.len() as i64;
            stream.queue.push_back(data);
        }
        if !stream.in_ready {
            stream.in_ready = true;
            s.ready.push_back(self.id);
        }
        s.wake_conn();
        Ok(())
    }

    /// Ends the body with trailers.
    pub fn send_trailers(&mut self, trailers: HeaderMap) -> Result<(), Error> {
        let mut s = self.shared.borrow_mut();
        let stream = s.usable(self.id)?;
        if stream.send != Send::Open || stream.end_queued {
            return Err(Error::Closed);
        }
        stream.end_queued = true;
        if stream.queue.is_empty() {
            s.write_headers(self.id, None, &trailers, true);
            s.send_done(self.id);
        } else {
            stream.trailers_out = Some(trailers);
        }
        Ok(())
    }

    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<Reason, Error>> {
        poll_reset(&self.shared, self.id, cx)
    }

    pub fn send_reset(&mut self, reason: Reason) {
        send_reset(&self.shared, self.id, reason);
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        drop_sender(&self.shared, self.id, SEND_HANDLE);
    }
}

impl Shared {
    /// The stream, while it can still be answered.
    fn usable(&mut self, id: u32) -> Result<&mut Stream, Error> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        match self.streams.get_mut(&id) {
            Some(stream) => match stream.reset {
                Some((reason, remote)) => Err(Error::Reset { reason, remote }),
                None => Ok(stream),
            },
            None => Err(Error::Closed),
        }
    }
}

fn poll_reset(shared: &Rc<RefCell<Shared>>, id: u32, cx: &mut Context<'_>) -> Poll<Result<Reason, Error>> {
    let mut s = shared.borrow_mut();
    let failed = s.failed.clone();
    let Some(stream) = s.streams.get_mut(&id) else { return Poll::Ready(Err(failed.unwrap_or(Error::Closed))) };
    if let Some((reason, _)) = stream.reset {
        return Poll::Ready(Ok(reason));
    }
    if let Some(failed) = failed {
        return Poll::Ready(Err(failed));
    }
    stream.send_task = Some(cx.waker().clone());
    Poll::Pending
}

fn send_reset(shared: &Rc<RefCell<Shared>>, id: u32, reason: Reason) {
    let mut s = shared.borrow_mut();
    if s.streams.get(&id).is_some_and(|st| st.reset.is_none() && !st.closed()) {
        s.reset(id, reason);
    }
}

/// A response-side handle went away: a response left unfinished is reset, so the client does not wait for
/// the rest.
fn drop_sender(shared: &Rc<RefCell<Shared>>, id: u32, handle: u8) {
    let Ok(mut s) = shared.try_borrow_mut() else { return };
    let Some(stream) = s.streams.get_mut(&id) else { return };
    stream.handles &= !handle;
    let unfinished = stream.handles & (RESPOND_HANDLE | SEND_HANDLE) == 0
        && stream.reset.is_none()
        && stream.send != Send::Done
        && !stream.end_queued;
    if unfinished && s.failed.is_none() {
        s.reset(id, Reason::CANCEL);
    } else {
        s.closed(id);
    }
}
