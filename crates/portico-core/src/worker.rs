//! Worker threads: each runs a current-thread tokio runtime with its own SO_REUSEPORT listening sockets, so
//! nothing on a connection's path is shared between cores. The runtime is the planes': each plane (HTTP; later
//! MQTT) gets its per-worker state through `Plane::start_worker` and serves the connections of the listeners
//! that speak its protocol. The worker owns accepting, the connection limit, draining and the access log's
//! periodic flush.

use crate::access_log::{AccessLogSink, LocalLog};
use crate::panic::{last_panic_location, panic_message};
use futures_util::FutureExt;
use socket2::{Domain, Protocol, Socket, Type};
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

/// A listening socket bound for one worker.
pub struct BoundListener {
    pub name: Arc<str>,
    pub socket: std::net::TcpListener,
}

/// A change to a running worker's listening sockets, made by a reload.
pub enum ListenerChange {
    /// Start accepting on this socket.
    Add(BoundListener),
    /// Stop accepting on the socket bound to `address` for listener `name`. Its connections go on.
    Stop { name: Arc<str>, address: SocketAddr },
}

/// Where a worker's listener changes are sent.
pub type ListenerChanges = tokio::sync::mpsc::UnboundedSender<ListenerChange>;

/// Fails with `AddrInUse` when anything listens on `addr` already, another Portico included. SO_REUSEPORT
/// (which `bind` sets, for the workers) would otherwise let a second process of the same user join the port
/// silently and take a share of its connections. A socket without SO_REUSEPORT cannot bind where any socket
/// listens; SO_REUSEADDR keeps connections in TIME_WAIT from counting. The probe is closed at once: the
/// workers' sockets are bound right after it.
pub fn claim(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(()); // a port of the kernel's choosing is never taken
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    if addr.is_ipv6() {
        probe.set_only_v6(true)?;
    }
    probe.bind(&addr.into())
}

/// Binds `addr` with SO_REUSEPORT so that every worker can own a socket on the same port and the kernel
/// spreads connections between them. `claim` first: this alone would share a port another process holds.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    // Accepted sockets inherit it on Linux: one system call per listener instead of one per connection.
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// What one worker thread shares with the planes it runs: owned by that thread alone.
pub struct WorkerCore {
    pub index: usize,
    /// Becomes true when the process starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    pub access_log: Option<LocalLog>,
    open_connections: Cell<usize>,
    connection_closed: Notify,
    /// Keep-alive connections idle between requests, longest-idle first: at the connection limit the first
    /// is closed to make room.
    pub idle: crate::idle::IdleConnections,
    /// Debug builds: notified to make this worker's runtime die (the supervisor test's hook).
    #[cfg(debug_assertions)]
    pub debug_kill: Notify,
}

impl WorkerCore {
    /// Connections open on this worker, of every plane.
    pub fn open_connections(&self) -> usize {
        self.open_connections.get()
    }

    /// Counts one more connection open on this worker until the guard is dropped: for a plane that keeps a
    /// connection past the task the accept loop gave it (the MQTT plane's parked idle connections). The
    /// connection limit and the drain at shutdown count it like any.
    pub fn hold_connection(self: &Rc<Self>) -> ConnectionGuard {
        self.open_connections.set(self.open_connections.get() + 1);
        ConnectionGuard(self.clone())
    }
}

/// A plane (HTTP; later MQTT): what serves the connections of the listeners with its `protocol`.
pub trait Plane: Send + Sync {
    /// Makes the plane's state for one worker, on that worker's thread, inside its runtime (so it may spawn
    /// the worker's own background tasks).
    fn start_worker(&self, core: &Rc<WorkerCore>) -> Rc<dyn PlaneWorker>;
}

/// A plane's state on one worker.
pub trait PlaneWorker {
    /// Whether `listener` is this plane's (its configured `protocol` is the plane's).
    fn serves(&self, listener: &str) -> bool;
    /// Serves one accepted connection of `listener` until it ends.
    fn serve(self: Rc<Self>, io: TcpStream, peer: SocketAddr, listener: Arc<str>) -> Pin<Box<dyn Future<Output = ()>>>;
    /// How many connections this worker holds open on `listener` at most (its share of the listener's).
    fn connection_limit(&self, listener: &str) -> usize;
    /// How long open connections may take to finish once shutdown starts.
    fn shutdown_grace(&self) -> Duration;
    /// A connection of `listener` ended in a panic outside any request (already logged): count it.
    fn connection_panicked(&self, listener: &str);
    /// An idle connection was closed to make room for a new client of `listener`: count it.
    fn connection_evicted(&self, listener: &str);
}

/// The planes a worker runs, one per protocol.
pub type Planes = Arc<[Arc<dyn Plane>]>;

/// Runs its function when dropped: when a worker thread ends, by returning or by panic.
struct OnExit(Option<Box<dyn FnOnce() + Send>>);

impl Drop for OnExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Starts one worker thread. It serves until `shutdown` turns true, then stops accepting and lets open
/// connections finish their current request, up to the planes' grace period. `on_exit` runs on the thread as
/// it ends, however it ends (its supervisor learns of it without polling).
pub fn spawn(
    index: usize,
    listeners: Vec<BoundListener>,
    changes: tokio::sync::mpsc::UnboundedReceiver<ListenerChange>,
    planes: Planes,
    shutdown: watch::Receiver<bool>,
    access_log: Option<Arc<AccessLogSink>>,
    on_exit: Box<dyn FnOnce() + Send>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("portico-worker-{index}")).spawn(move || {
        // Dropped last: after the runtime and everything on it.
        let _exit = OnExit(Some(on_exit));
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(worker = index, "cannot start the worker runtime: {e}");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, run(index, listeners, changes, planes, shutdown, access_log));
    })
}

/// The accept loops running, by listener and address, with what stops each.
type Accepting = Vec<(Arc<str>, Option<SocketAddr>, Rc<Notify>)>;

async fn run(
    index: usize,
    listeners: Vec<BoundListener>,
    mut changes: tokio::sync::mpsc::UnboundedReceiver<ListenerChange>,
    planes: Planes,
    mut shutdown: watch::Receiver<bool>,
    access_log: Option<Arc<AccessLogSink>>,
) {
    let core = Rc::new(WorkerCore {
        index,
        shutdown: shutdown.clone(),
        access_log: access_log.map(LocalLog::new),
        open_connections: Cell::new(0),
        connection_closed: Notify::new(),
        idle: Default::default(),
        #[cfg(debug_assertions)]
        debug_kill: Notify::new(),
    });
    let workers: Vec<Rc<dyn PlaneWorker>> = planes.iter().map(|p| p.start_worker(&core)).collect();
    let mut accepting: Accepting = Vec::new();
    let start = |l: BoundListener, accepting: &mut Accepting| match workers.iter().find(|w| w.serves(&l.name)) {
        Some(plane) => start_accepting(&core, plane.clone(), l, accepting),
        None => tracing::error!(worker = index, listener = %l.name, "no plane serves this listener's protocol"),
    };
    for l in listeners {
        start(l, &mut accepting);
    }
    let mut changes_open = true;
    if core.access_log.is_some() {
        tokio::task::spawn_local(flush_access_log(core.clone()));
    }
    while !*shutdown.borrow() {
        #[cfg(debug_assertions)]
        let killed = core.debug_kill.notified();
        #[cfg(not(debug_assertions))]
        let killed = std::future::pending::<()>();
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            change = changes.recv(), if changes_open => match change {
                Some(ListenerChange::Add(l)) => start(l, &mut accepting),
                Some(ListenerChange::Stop { name, address }) => accepting.retain(|(n, a, stop)| {
                    let stopping = *n == name && *a == Some(address);
                    if stopping {
                        stop.notify_one();
                    }
                    !stopping
                }),
                None => changes_open = false,
            },
            // Outside any task, so it takes the whole runtime down, as a bug in the runtime itself would.
            _ = killed => panic!("worker runtime killed through PORTICO_DEBUG_KILL_WORKER_PATH"),
        }
    }
    // Connections waiting for a request learn of the shutdown through their idle tickets.
    core.idle.shut_down();
    let grace = workers.iter().map(|w| w.shutdown_grace()).max().unwrap_or_default();
    let drained = tokio::time::timeout(grace, async {
        while core.open_connections.get() > 0 {
            core.connection_closed.notified().await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            worker = index,
            open = core.open_connections.get(),
            "grace period over; closing remaining connections"
        );
    }
    if let Some(log) = &core.access_log {
        log.flush();
    }
}

/// Registers `l` with this worker's runtime and starts its accept loop.
fn start_accepting(core: &Rc<WorkerCore>, plane: Rc<dyn PlaneWorker>, l: BoundListener, accepting: &mut Accepting) {
    let address = l.socket.local_addr().ok();
    match tokio::net::TcpListener::from_std(l.socket) {
        Ok(listener) => {
            let stop = Rc::new(Notify::new());
            tokio::task::spawn_local(accept_loop(core.clone(), plane, l.name.clone(), listener, stop.clone()));
            accepting.push((l.name, address, stop));
        }
        Err(e) => tracing::error!(worker = core.index, listener = %l.name, "cannot register the listener: {e}"),
    }
}

/// Accepts connections until shutdown or `stop` (a reload removed or moved the listener); dropping the socket
/// then stops the kernel from queueing more for this worker.
async fn accept_loop(
    core: Rc<WorkerCore>,
    plane: Rc<dyn PlaneWorker>,
    name: Arc<str>,
    listener: tokio::net::TcpListener,
    stop: Rc<Notify>,
) {
    let mut shutdown = core.shutdown.clone();
    loop {
        let limit = plane.connection_limit(&name);
        let accepted = if core.open_connections.get() < limit {
            tokio::select! {
                r = listener.accept() => r,
                _ = shutdown.changed() => return, // dropping the listener stops accepting
                _ = stop.notified() => return,
            }
        } else if !core.idle.is_empty() {
            // At the limit, with keep-alive connections idle: a new client is accepted when it comes, and the
            // longest-idle connection closes to make room for it (nginx reuses connections the same way).
            tokio::select! {
                r = listener.accept() => {
                    if r.is_ok() && core.idle.evict_oldest() {
                        plane.connection_evicted(&name);
                    }
                    r
                }
                _ = core.connection_closed.notified() => continue,
                _ = shutdown.changed() => return,
                _ = stop.notified() => return,
            }
        } else {
            // At the limit and every connection busy: new clients wait in the kernel's queue.
            tokio::select! {
                _ = core.connection_closed.notified() => continue,
                _ = core.idle.entered() => continue,
                _ = shutdown.changed() => return,
                _ = stop.notified() => return,
            }
        };
        match accepted {
            Ok((io, peer)) => {
                let guard = core.hold_connection();
                let plane = plane.clone();
                let name = name.clone();
                tokio::task::spawn_local(async move {
                    // Panics inside a request are answered and counted there; this catches the rest (the
                    // handshake, reading a head) so that they are counted and logged too.
                    let served = plane.clone().serve(io, peer, name.clone());
                    if let Err(panic) = AssertUnwindSafe(served).catch_unwind().await {
                        plane.connection_panicked(&name);
                        let message = panic_message(panic.as_ref());
                        let at = last_panic_location();
                        tracing::error!(listener = %name, client = %peer, "connection panicked at {at}: {message}");
                    }
                    drop(guard);
                });
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the error says what ran out.
                tracing::warn!(listener = %name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Counts a connection closed even when its task ends by panic or cancellation.
pub struct ConnectionGuard(Rc<WorkerCore>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let core = &self.0;
        core.open_connections.set(core.open_connections.get().saturating_sub(1));
        core.connection_closed.notify_waiters();
    }
}

/// Hands the worker's buffered access-log lines to the writer within 200 ms of the first; with none
/// buffered, it sleeps until a line comes.
async fn flush_access_log(core: Rc<WorkerCore>) {
    let Some(log) = &core.access_log else { return };
    loop {
        std::future::poll_fn(|cx| log.poll_buffered(cx)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        log.flush();
    }
}
