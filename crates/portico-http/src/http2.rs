//! HTTP/2 from clients: over TLS when ALPN picks `h2`, on plain listeners when a connection opens with the
//! HTTP/2 preface (prior knowledge, "h2c"). `portico_h2` does the framing, flow control and HPACK; this
//! module runs the connection: it accepts streams, runs each one's request through the phases
//! (`serve_h2::serve`) on the connection's own task, sends keep-alive PINGs, closes an idle connection and
//! says GOAWAY at shutdown. Streams are polled before the connection, so what they answer in one wake-up
//! leaves in one write.

use crate::body::ClientFacts;
use crate::context::Connection;
use crate::context::WorkerCtx;
use crate::h2_request::{ClientBody, Interim};
use crate::h2_response::respond;
use crate::response_body::{local, ProxyBody};
use crate::snapshot::Http2Settings;
use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::task::AtomicWaker;
use futures_util::{FutureExt, StreamExt};
use hyper::{Method, Response, StatusCode};
use portico_core::idle::IdleTicket;
use portico_core::io::Stream;
use portico_h2::{RecvStream, RequestHead, SendResponse, Server};
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// How long a connection closed for idleness waits for the client to acknowledge the GOAWAY before it is
/// dropped.
const CLOSE_AFTER_GOAWAY: Duration = Duration::from_secs(10);

/// What a client sends first on an HTTP/2 connection (RFC 9113 3.4).
pub(crate) const PREFACE: &[u8] = portico_h2::PREFACE;

/// Serves one HTTP/2 connection until the client closes it, it idles for the listener's keep-alive timeout,
/// a keep-alive PING goes unanswered, or the process shuts down (then with a GOAWAY that lets open streams
/// finish).
pub(crate) async fn serve(
    io: Stream,
    preread: Bytes,
    peer: SocketAddr,
    facts: ClientFacts,
    listener: Arc<str>,
    ctx: Rc<WorkerCtx>,
) {
    let (settings, keepalive, send_timeout, mut slow) = {
        let snapshot = ctx.snapshot.load();
        let Some(l) = snapshot.listener(&listener) else { return };
        let Some(settings) = l.http2.clone() else { return };
        let slow = SlowHead { header_read: l.header_read_timeout, cap: l.slow_cap.clone(), since: None, counted: None };
        (settings, l.keepalive_timeout, l.send_timeout, slow)
    };
    // A client that never sends its preface, or the rest of a head, is closed by the head timer below.
    let mut conn = Server::new(io, preread, server_settings(&settings));
    let mut shutdown = ctx.shutdown.clone();
    let state = Rc::new(Connection {
        peer,
        facts: ClientFacts { http2: true, ..facts },
        listener,
        ctx,
        last_request: Cell::new(Instant::now()),
        active: Cell::new(0),
        send_timeout,
    });
    let mut pinger = settings.keepalive_interval.map(|every| Pinger { every, waiting: false });
    let mut streams = FuturesUnordered::new();
    let mut shutting_down = pin!(shutdown.changed());
    let mut idle = pin!(tokio::time::sleep(keepalive));
    let ping_first = settings.keepalive_interval.unwrap_or(keepalive);
    let mut ping_timer = pin!(tokio::time::sleep(ping_first));
    // Armed while the client owes the rest of a head (`slow.since`).
    let mut head_timer = pin!(tokio::time::sleep(keepalive));
    let mut closing = false;
    // While no stream is in progress the connection is in the worker's idle list: at a listener's connection
    // limit the longest-idle connection is asked to close (GOAWAY) to make room for a new client.
    let idle_list = &state.ctx.core.idle;
    let mut idle_place = None;
    // The connection and the timers are polled only when they were woken (the flags), not on every wake-up
    // of the task; a stream's answer wakes the connection, which is polled in the same pass anyway.
    let conn_flag = Arc::new(Flag::new());
    let timers_flag = Arc::new(Flag::new());
    let conn_waker = Waker::from(conn_flag.clone());
    let timers_waker = Waker::from(timers_flag.clone());
    loop {
        let event = poll_fn(|cx| {
            conn_flag.task.register(cx.waker());
            timers_flag.task.register(cx.waker());
            conn_flag.quiet.store(true, Ordering::SeqCst);
            let event = loop {
                // The streams first: their answers are queued before the connection writes.
                while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {}
                if conn_flag.woken.swap(false, Ordering::SeqCst) {
                    match conn.poll_accept(&mut Context::from_waker(&conn_waker)) {
                        Poll::Ready(Some(Ok((head, body, reply)))) => {
                            // Boxed once here: the queue moves what it is given several times.
                            streams.push(Box::pin(guarded(head, body, reply, state.clone())));
                            // More may be ready.
                            conn_flag.woken.store(true, Ordering::SeqCst);
                            continue;
                        }
                        Poll::Ready(Some(Err(e))) => break Poll::Ready(Event::Closed(Some(e))),
                        Poll::Ready(None) => break Poll::Ready(Event::Closed(None)),
                        Poll::Pending => {
                            if conn.head_in_progress() != slow.since.is_some() {
                                slow.since = slow.since.is_none().then(Instant::now);
                                slow.counted = None;
                                if let Some(at) = slow.next() {
                                    head_timer.as_mut().reset(at);
                                    timers_flag.woken.store(true, Ordering::SeqCst);
                                }
                            }
                        }
                    }
                }
                let idle_now = state.active.get() == 0 && !closing;
                if idle_now != idle_place.is_some() {
                    idle_place = idle_now.then(|| idle_list.enter());
                    if let Some(place) = &idle_place {
                        // Registered with the timers' waker (an eviction wakes them); just joined, so not yet
                        // evicted.
                        let _ = place.poll_evicted(&mut Context::from_waker(&timers_waker));
                    }
                }
                if timers_flag.woken.swap(false, Ordering::SeqCst) {
                    let head_timer = slow.since.is_some().then_some(head_timer.as_mut());
                    let polled = poll_timers(
                        &mut Context::from_waker(&timers_waker),
                        closing,
                        (shutting_down.as_mut(), idle.as_mut(), ping_timer.as_mut(), head_timer),
                        (pinger.as_mut(), idle_place.as_ref(), &mut conn),
                    );
                    if polled.is_ready() {
                        // Polled again next time: the event's handling resets them.
                        timers_flag.woken.store(true, Ordering::SeqCst);
                    }
                    break polled;
                }
                break Poll::Pending;
            };
            conn_flag.quiet.store(false, Ordering::SeqCst);
            if conn_flag.woken.load(Ordering::SeqCst) {
                // Woken while it was being polled: it asked for another turn.
                cx.waker().wake_by_ref();
            }
            event
        })
        .await;
        // Whatever is done about the event (a GOAWAY, a PING) is the connection's to send.
        conn_flag.woken.store(true, Ordering::SeqCst);
        match event {
            Event::Closed(error) => {
                if let Some(e) = error.filter(|e| !e.is_io() && !e.is_go_away()) {
                    tracing::debug!(client = %peer, "HTTP/2 connection ended: {e}");
                }
                break;
            }
            Event::Evicted => {
                closing = true;
                idle_place = None;
                conn.graceful_shutdown();
                idle.as_mut().reset(Instant::now() + CLOSE_AFTER_GOAWAY);
            }
            Event::Shutdown => {
                closing = true;
                idle_place = None;
                conn.graceful_shutdown();
                // Open streams finish within the worker's own shutdown grace.
                idle.as_mut().reset(Instant::now() + Duration::from_secs(24 * 3600));
            }
            // Closing for idleness and the client has not acknowledged the GOAWAY in time (a dead peer).
            Event::IdleTimer if closing => break,
            Event::IdleTimer => {
                // Idle means no stream in progress: while one is, look again a keep-alive period later (a
                // stream ending counts as activity).
                let now = Instant::now();
                let idle_since = state.last_request.get();
                if state.active.get() == 0 && idle_since + keepalive <= now {
                    closing = true;
                    conn.graceful_shutdown();
                    idle.as_mut().reset(now + CLOSE_AFTER_GOAWAY);
                } else if state.active.get() == 0 {
                    idle.as_mut().reset(idle_since + keepalive);
                } else {
                    idle.as_mut().reset(now + keepalive);
                }
            }
            Event::PingTimer => {
                let Some(p) = &mut pinger else { continue };
                if !p.waiting && state.active.get() > 0 {
                    // Streams are in progress: their frames show the peer is there, and a PING stuck behind a
                    // slow reader's data would disconnect it for being slow, not gone.
                    ping_timer.as_mut().reset(Instant::now() + p.every);
                    continue;
                }
                if p.waiting {
                    // No answer within the interval.
                    tracing::debug!(client = %peer, "HTTP/2 keep-alive PING not answered: closing");
                    break;
                }
                if !conn.send_ping(*b"portico!") {
                    break;
                }
                p.waiting = true;
                ping_timer.as_mut().reset(Instant::now() + p.every);
            }
            Event::Pong => {
                let Some(p) = &mut pinger else { continue };
                p.waiting = false;
                ping_timer.as_mut().reset(Instant::now() + p.every);
            }
            Event::HeadTimer => {
                if let Some(refusal) = slow.late(peer.ip()) {
                    // Streams in progress end with the connection, as an HTTP/1 connection closes.
                    tracing::debug!(client = %peer, "HTTP/2 connection closed: {refusal}");
                    slow.since = None;
                    closing = true;
                    idle_place = None;
                    conn.refuse(portico_h2::Reason::ENHANCE_YOUR_CALM, refusal);
                    idle.as_mut().reset(Instant::now() + CLOSE_AFTER_GOAWAY);
                } else if let Some(at) = slow.next() {
                    head_timer.as_mut().reset(at);
                }
            }
        }
    }
}

/// A head the client is slow to send (`Server::head_in_progress`: the preface, a frame before DATA, a header
/// block and its CONTINUATIONs): the listener's `timeouts.header_read` and the top-level `limits` filter's cap on
/// slow connections apply to it as they do to an HTTP/1 request head.
struct SlowHead {
    header_read: Duration,
    cap: Option<Arc<crate::filters::SlowCap>>,
    /// Since when the client has owed the rest of a head.
    since: Option<Instant>,
    /// This connection counted as slow, until its head arrives.
    counted: Option<crate::clients::Slow>,
}

impl SlowHead {
    /// When the head timer should look next: when the head turns slow, or when it is out of time.
    fn next(&self) -> Option<Instant> {
        let since = self.since?;
        let slow_at = self.cap.as_ref().filter(|_| self.counted.is_none()).map(|cap| since + cap.after);
        let timeout = since + self.header_read;
        Some(slow_at.map_or(timeout, |at| at.min(timeout)))
    }

    /// At the head timer: counts the connection as slow once its head has taken `slow_after`, and says why the
    /// connection is to be closed, if it is.
    fn late(&mut self, client: std::net::IpAddr) -> Option<&'static str> {
        let since = self.since?;
        let now = Instant::now();
        if let Some(cap) = self.cap.as_ref().filter(|cap| self.counted.is_none() && since + cap.after <= now) {
            let (slow, count) = crate::clients::Slow::new(client);
            self.counted = Some(slow);
            if count > cap.max {
                let denial = crate::filters::Denial::TooManySlowConnections;
                cap.denials.record(denial, cap.shadow, client.to_canonical(), None);
                if !cap.shadow {
                    return Some("too many slow connections from this address");
                }
            }
        }
        (since + self.header_read <= now).then_some("request head not received in time")
    }
}

/// One of the connection's timers.
type Timer<'a> = Pin<&'a mut Sleep>;

/// The timers and the shutdown signal, polled when one of them woke the connection's task.
fn poll_timers(
    cx: &mut Context<'_>,
    closing: bool,
    (shutting_down, idle, ping_timer, head_timer): (Pin<&mut impl Future>, Timer<'_>, Timer<'_>, Option<Timer<'_>>),
    (pinger, idle_place, conn): (Option<&mut Pinger>, Option<&IdleTicket<'_>>, &mut Server<Stream>),
) -> Poll<Event> {
    if idle_place.is_some_and(|place| place.poll_evicted(cx).is_ready()) {
        return Poll::Ready(Event::Evicted);
    }
    if !closing && shutting_down.poll(cx).is_ready() {
        return Poll::Ready(Event::Shutdown);
    }
    if idle.poll(cx).is_ready() {
        return Poll::Ready(Event::IdleTimer);
    }
    if head_timer.is_some_and(|t| t.poll(cx).is_ready()) {
        return Poll::Ready(Event::HeadTimer);
    }
    if let Some(pinger) = pinger {
        if pinger.waiting && conn.poll_pong(cx).is_ready() {
            return Poll::Ready(Event::Pong);
        }
        if ping_timer.poll(cx).is_ready() {
            return Poll::Ready(Event::PingTimer);
        }
    }
    Poll::Pending
}

/// A waker that remembers that it was woken, so that the connection's loop polls only what was. While
/// `quiet`, it does not wake the task: the loop is running and looks at the flag itself.
struct Flag {
    task: AtomicWaker,
    woken: AtomicBool,
    quiet: AtomicBool,
}

impl Flag {
    fn new() -> Flag {
        Flag { task: AtomicWaker::new(), woken: AtomicBool::new(true), quiet: AtomicBool::new(false) }
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.quiet.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// What the connection's loop has to handle.
enum Event {
    Closed(Option<portico_h2::Error>),
    Shutdown,
    IdleTimer,
    /// The worker needs this idle connection's place for a new client.
    Evicted,
    PingTimer,
    Pong,
    /// The client has owed the rest of a head for `slow_after` or `timeouts.header_read`.
    HeadTimer,
}

/// The keep-alive PINGs (`http2.keepalive_interval`): one in flight at a time, answered within the interval.
struct Pinger {
    every: Duration,
    waiting: bool,
}

fn server_settings(settings: &Http2Settings) -> portico_h2::Settings {
    portico_h2::Settings {
        max_concurrent_streams: settings.max_concurrent_streams,
        initial_stream_window: settings.initial_stream_window,
        initial_connection_window: settings.initial_connection_window,
        max_header_list_size: settings.max_header_list_size,
        max_frame_size: settings.max_frame_size,
    }
}

/// Counts a request as being answered while it lives.
struct Active<'a>(&'a Connection);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get() - 1);
        self.0.last_request.set(Instant::now());
    }
}

/// Answers one stream; a panic while its response is sent (in a filter's or handler's body) costs this
/// stream (dropped: it is reset), not the connection's other streams, which share its task.
async fn guarded(head: RequestHead, body: RecvStream, reply: SendResponse, conn: Rc<Connection>) {
    let served = AssertUnwindSafe(stream(head, body, reply, conn.clone())).catch_unwind().await;
    if let Err(panic) = served {
        count_panic(&conn, panic.as_ref());
    }
}

/// Counts and logs a panic (a bug) that cost one stream.
fn count_panic(conn: &Connection, panic: &(dyn std::any::Any + Send)) {
    if let Some(listener) = conn.ctx.snapshot.load().listener(&conn.listener) {
        portico_core::stats::slot(&listener.stats.slots, conn.ctx.index).panics.inc();
    }
    tracing::error!(
        listener = %conn.listener,
        client = %conn.peer,
        "HTTP/2 stream handling panicked at {}: {}",
        portico_core::panic::last_panic_location(),
        portico_core::panic::panic_message(panic)
    );
}

/// Answers one stream, on the connection's task. A client that resets the stream before the answer is ready
/// drops the work under way (an upstream exchange is abandoned, the request logged as 499).
async fn stream(head: RequestHead, recv: RecvStream, reply: SendResponse, conn: Rc<Connection>) {
    conn.last_request.set(Instant::now());
    conn.active.set(conn.active.get() + 1);
    let _active = Active(&conn);
    let body = ClientBody::new(recv, head.content_length());
    let reply: Interim = RefCell::new(reply);
    let response = if head.method() == Method::CONNECT {
        local(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not supported")
    } else {
        let mut served = pin!(answer(head, body, &conn, &reply));
        let answered = poll_fn(|cx| match served.as_mut().poll(cx) {
            Poll::Ready(response) => Poll::Ready(Some(response)),
            Poll::Pending => reply.borrow_mut().poll_reset(cx).map(|_| None),
        })
        .await;
        match answered {
            Some(response) => response,
            None => return,
        }
    };
    respond(&reply, response, conn.send_timeout).await;
}

/// The stream's answer. A panic (a bug) while it is made costs this stream, answered 500.
async fn answer(head: RequestHead, body: ClientBody, conn: &Rc<Connection>, interim: &Interim) -> Response<ProxyBody> {
    let served = AssertUnwindSafe(crate::serve_h2::serve(head, body, conn, interim)).catch_unwind().await;
    served.unwrap_or_else(|panic| {
        count_panic(conn, panic.as_ref());
        local(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    })
}
