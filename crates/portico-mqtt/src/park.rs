//! Idle connections parked off the runtime: what lets a quiet client cost less than a task.
//!
//! A connection served by a task costs, beside its MQTT state, the task (tokio's cell, 128-byte aligned),
//! its future, and the socket's registration with the runtime (`ScheduledIo`, 128-byte aligned too): about
//! 900 bytes with glibc's padding of aligned allocations, before any MQTT state. Most clients of a broker are
//! idle most of the time, so a plain TCP connection with nothing in progress for `limits.park_after` gives
//! all three up ([`crate::connection::serve_parking`]): its task ends, its socket leaves the runtime's
//! poller for this worker's own (one `epoll` instance, registered with the runtime once), and what is left
//! is the connection's state ([`Conn`], boxed), the socket and a waker, in a slab.
//!
//! A parked connection comes back, on a new task with the socket registered with the runtime again, when
//! - the socket is readable (a packet, PINGREQ included, or the client closed it): the worker's poller says so;
//! - its session is woken (a message queued for it, the session taken over, the broker draining): the
//!   session holds a waker that names the parked connection;
//! - its keep-alive deadline passes: checked every second while connections with a keep-alive are parked,
//!   and the connection then closes as any whose client went silent.
//!
//! What it costs: one `epoll_ctl` to leave the runtime's poller and one to join the worker's when parking,
//! the same back and a task when coming back, so a client that sends or receives something less often than
//! `park_after` pays about two microseconds more per packet, and one that is busier never parks.
//! A TLS or WebSocket connection is not parked (its stream's state is in user space, not in the kernel).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use mio::unix::SourceFd;
use mio::{Events, Interest, Token};
use slab::Slab;
use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::broker::Broker;
use crate::connection::{drive, Conn, Io};
use crate::metrics::Counter;

/// How often parked connections' keep-alive deadlines are looked at (while some have one).
const KEEPALIVE_SWEEP: Duration = Duration::from_secs(1);
/// Readiness events taken from the worker's poller at once.
const EVENTS: usize = 256;

/// A connection's task, spawned by whoever runs the worker, with the guard that counts the connection.
pub type Spawn<G> = Box<dyn Fn(Pin<Box<dyn Future<Output = ()>>>, G)>;

/// One worker's parked connections. `G` is what counts a connection open on the worker (the gateway's
/// connection guard; `()` for [`crate::Server`]): made when a connection parks, handed to the task that
/// serves it when it comes back.
pub struct Lot<G> {
    parked: RefCell<Slab<Parked<G>>>,
    /// The worker's poller, to register and deregister parked sockets.
    registry: mio::Registry,
    /// Wake-ups from sessions, possibly from other workers' threads.
    woken: Arc<Woken>,
    /// A number for each parking, so that a late wake-up for a slot used again is ignored.
    generation: Cell<u32>,
    /// Parked connections with a keep-alive (the sweep runs only while there are some).
    with_keepalive: Cell<usize>,
    worker: usize,
    broker: Broker,
    hold: Box<dyn Fn() -> G>,
    spawn: Spawn<G>,
}

struct Parked<G> {
    stream: std::net::TcpStream,
    conn: Box<Conn>,
    generation: u32,
    /// Keeps the connection counted on its worker while it has no task.
    guard: G,
}

#[derive(Default)]
struct Woken {
    keys: Mutex<Vec<(usize, u32)>>,
    waker: AtomicWaker,
}

/// What a parked connection's session wakes: it names the slot.
struct ParkWaker {
    key: usize,
    generation: u32,
    woken: Arc<Woken>,
}

impl Wake for ParkWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self.woken.keys.lock() {
            Ok(mut keys) => keys.push((self.key, self.generation)),
            Err(poisoned) => poisoned.into_inner().push((self.key, self.generation)),
        }
        self.woken.waker.wake();
    }
}

/// The worker's poller as the runtime sees it: one file descriptor.
struct Poller(mio::Poll);

impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl<G: 'static> Lot<G> {
    /// Makes worker `worker`'s lot and spawns its task (on the current `LocalSet`). `hold` makes the guard
    /// that keeps a parked connection counted; `spawn` starts a connection's task again.
    pub fn start(
        broker: Broker,
        worker: usize,
        hold: impl Fn() -> G + 'static,
        spawn: impl Fn(Pin<Box<dyn Future<Output = ()>>>, G) + 'static,
    ) -> io::Result<Rc<Lot<G>>> {
        let poll = mio::Poll::new()?;
        let registry = poll.registry().try_clone()?;
        // SAFETY: the descriptor is the `mio::Poll`'s epoll instance, which the `Poller` owns for the
        // `AsyncFd`'s whole life and which does not change.
        let poller = unsafe { AsyncFd::register_with_interest(Poller(poll), tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let lot = Rc::new(Lot {
            parked: RefCell::new(Slab::new()),
            registry,
            woken: Arc::new(Woken::default()),
            generation: Cell::new(0),
            with_keepalive: Cell::new(0),
            worker,
            broker,
            hold: Box::new(hold),
            spawn: Box::new(spawn),
        });
        tokio::task::spawn_local(run(Rc::downgrade(&lot), poller));
        Ok(lot)
    }

    /// Connections parked now.
    pub fn len(&self) -> usize {
        self.parked.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parks `conn`, which has nothing in progress. On failure the stream is given back (re-registered
    /// with the runtime, if it could be) with the connection, to be served on.
    #[allow(clippy::type_complexity)]
    pub(crate) fn park(
        self: &Rc<Self>,
        stream: tokio::net::TcpStream,
        conn: Box<Conn>,
    ) -> Result<(), (io::Result<tokio::net::TcpStream>, Box<Conn>)> {
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(err) => return Err((Err(err), conn)),
        };
        let mut parked = self.parked.borrow_mut();
        let entry = parked.vacant_entry();
        let key = entry.key();
        if let Err(err) = self.registry.register(&mut SourceFd(&stream.as_raw_fd()), Token(key), Interest::READABLE) {
            warn!(error = %err, "cannot park an idle MQTT connection; it keeps its task");
            return Err((tokio::net::TcpStream::from_std(stream), conn));
        }
        let generation = self.generation.get().wrapping_add(1);
        self.generation.set(generation);
        // The session wakes the slot from now on; a wake-up it had already made is honoured at once.
        let waker = Waker::from(Arc::new(ParkWaker { key, generation, woken: self.woken.clone() }));
        let woken = {
            let mut state = conn.attached.session.lock();
            match &mut state.attachment {
                Some(attachment) if attachment.connection == conn.attached.connection => {
                    attachment.poll_woken(&Context::from_waker(&waker))
                }
                _ => true,
            }
        };
        // After the waker is in place: a drain that began before reaches the connection either way.
        if woken || self.broker.is_draining() {
            waker.wake_by_ref();
        }
        if conn.keep_alive > 0 {
            self.with_keepalive.set(self.with_keepalive.get() + 1);
            if self.with_keepalive.get() == 1 {
                // The lot's task starts its keep-alive sweep.
                self.woken.waker.wake();
            }
        }
        let mut conn = conn;
        conn.parked_before = true;
        entry.insert(Parked { stream, conn, generation, guard: (self.hold)() });
        self.broker.metrics().inc(self.worker, Counter::Parked);
        Ok(())
    }

    /// Brings the connection in slot `key` back on a task of its own, if it is (still) the one parked there
    /// as `generation` (`None`: whichever is).
    fn unpark(self: &Rc<Self>, key: usize, generation: Option<u32>) {
        let parked = {
            let mut parked = self.parked.borrow_mut();
            match parked.get(key) {
                Some(p) if generation.is_none_or(|g| g == p.generation) => parked.remove(key),
                _ => return,
            }
        };
        self.broker.metrics().add(self.worker, Counter::Parked, -1);
        if parked.conn.keep_alive > 0 {
            self.with_keepalive.set(self.with_keepalive.get().saturating_sub(1));
        }
        let Parked { stream, mut conn, guard, .. } = parked;
        let _ = self.registry.deregister(&mut SourceFd(&stream.as_raw_fd()));
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => {
                let io = Io::new(stream);
                (self.spawn)(Box::pin(drive(io, conn, self.clone())), guard);
            }
            Err(err) => {
                warn!(error = %err, "cannot bring a parked MQTT connection back; it is closed");
                let _ = conn.finish(Err(err.into()));
            }
        }
    }

    /// Brings back the parked connections whose keep-alive deadline has passed: they close as silent.
    fn sweep(self: &Rc<Self>) {
        let now = Instant::now();
        let expired: Vec<usize> = self
            .parked
            .borrow()
            .iter()
            .filter(|(_, p)| {
                let keep_alive = Duration::from_millis(u64::from(p.conn.keep_alive) * 1500);
                p.conn.keep_alive > 0 && now >= p.conn.last_seen + keep_alive
            })
            .map(|(key, _)| key)
            .collect();
        for key in expired {
            self.unpark(key, None);
        }
    }
}

/// The lot's task: brings connections back as their sockets, sessions or keep-alive deadlines say. Ends
/// with the worker (when the lot is dropped).
async fn run<G: 'static>(lot: std::rc::Weak<Lot<G>>, mut poller: AsyncFd<Poller>) {
    let mut events = Events::with_capacity(EVENTS);
    let mut sweep = tokio::time::interval(KEEPALIVE_SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ready = Vec::new();
    std::future::poll_fn(|cx| {
        let Some(lot) = lot.upgrade() else { return Poll::Ready(()) };
        lot.woken.waker.register(cx.waker());
        loop {
            {
                let mut keys = match lot.woken.keys.lock() {
                    Ok(keys) => keys,
                    Err(poisoned) => poisoned.into_inner(),
                };
                std::mem::swap(&mut *keys, &mut ready);
            }
            if ready.is_empty() {
                break;
            }
            for (key, generation) in ready.drain(..) {
                lot.unpark(key, Some(generation));
            }
        }
        loop {
            let mut guard = match poller.poll_read_ready_mut(cx) {
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(err)) => {
                    warn!(error = %err, "the parked MQTT connections' poller failed");
                    break;
                }
                Poll::Pending => break,
            };
            events.clear();
            if let Err(err) = guard.get_inner_mut().0.poll(&mut events, Some(Duration::ZERO)) {
                if err.kind() != io::ErrorKind::Interrupted {
                    warn!(error = %err, "the parked MQTT connections' poller failed");
                }
                continue;
            }
            let keys: Vec<usize> = events.iter().map(|event| event.token().0).collect();
            if keys.len() < EVENTS {
                guard.clear_ready();
            }
            for key in keys {
                lot.unpark(key, None);
            }
        }
        if lot.with_keepalive.get() > 0 {
            while sweep.poll_tick(cx).is_ready() {
                lot.sweep();
            }
        }
        Poll::Pending
    })
    .await
}
