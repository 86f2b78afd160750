//! Worker threads: each runs a current-thread tokio runtime with its own SO_REUSEPORT listening sockets and its
//! own upstream pools, so nothing on the request path is shared between cores except the snapshot (read
//! through arc-swap) and per-endpoint health (atomics written on failure only).

use crate::access_log::{AccessLogSink, LocalLog};
use crate::context::last_panic_location;
pub use crate::context::{install_panic_hook, WorkerCtx};
use crate::pool::Pool;
use crate::snapshot::Snapshot;
use arc_swap::ArcSwap;
use futures_util::FutureExt;
use socket2::{Domain, Protocol, Socket, Type};
use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
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

/// Binds `addr` with SO_REUSEPORT so that every worker can own a socket on the same port and the kernel
/// spreads connections between them.
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

/// Starts one worker thread. It serves until `shutdown` turns true, then stops accepting and lets open
/// connections finish their current request, up to the snapshot's grace period.
pub fn spawn(
    index: usize,
    listeners: Vec<BoundListener>,
    changes: tokio::sync::mpsc::UnboundedReceiver<ListenerChange>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    shutdown: watch::Receiver<bool>,
    access_log: Option<Arc<AccessLogSink>>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("portico-worker-{index}")).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(worker = index, "cannot start the worker runtime: {e}");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, run(index, listeners, changes, snapshot, shutdown, access_log));
    })
}

async fn run(
    index: usize,
    listeners: Vec<BoundListener>,
    mut changes: tokio::sync::mpsc::UnboundedReceiver<ListenerChange>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    mut shutdown: watch::Receiver<bool>,
    access_log: Option<Arc<AccessLogSink>>,
) {
    let ctx = Rc::new(WorkerCtx {
        index,
        snapshot,
        pool: RefCell::new(Pool::default()),
        h2: RefCell::default(),
        batches: Default::default(),
        shutdown: shutdown.clone(),
        access_log: access_log.map(LocalLog::new),
        open_connections: Cell::new(0),
        connection_closed: Notify::new(),
        #[cfg(debug_assertions)]
        debug_kill: Notify::new(),
    });
    // The accept loops running, by listener and address, with what stops each.
    let mut accepting: Vec<(Arc<str>, Option<SocketAddr>, Rc<Notify>)> = Vec::new();
    for l in listeners {
        start_accepting(&ctx, l, &mut accepting);
    }
    let mut changes_open = true;
    tokio::task::spawn_local(sweep_pool(ctx.clone()));
    if ctx.access_log.is_some() {
        tokio::task::spawn_local(flush_access_log(ctx.clone()));
    }
    while !*shutdown.borrow() {
        #[cfg(debug_assertions)]
        let killed = ctx.debug_kill.notified();
        #[cfg(not(debug_assertions))]
        let killed = std::future::pending::<()>();
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            change = changes.recv(), if changes_open => match change {
                Some(ListenerChange::Add(l)) => start_accepting(&ctx, l, &mut accepting),
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
    let grace = ctx.snapshot.load().shutdown_grace;
    let drained = tokio::time::timeout(grace, async {
        while ctx.open_connections.get() > 0 {
            ctx.connection_closed.notified().await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            worker = index,
            open = ctx.open_connections.get(),
            "grace period over; closing remaining connections"
        );
    }
    if let Some(log) = &ctx.access_log {
        log.flush();
    }
}

/// Registers `l` with this worker's runtime and starts its accept loop.
fn start_accepting(
    ctx: &Rc<WorkerCtx>,
    l: BoundListener,
    accepting: &mut Vec<(Arc<str>, Option<SocketAddr>, Rc<Notify>)>,
) {
    let address = l.socket.local_addr().ok();
    match tokio::net::TcpListener::from_std(l.socket) {
        Ok(listener) => {
            let stop = Rc::new(Notify::new());
            tokio::task::spawn_local(accept_loop(ctx.clone(), l.name.clone(), listener, stop.clone()));
            accepting.push((l.name, address, stop));
        }
        Err(e) => tracing::error!(worker = ctx.index, listener = %l.name, "cannot register the listener: {e}"),
    }
}

/// Accepts connections until shutdown or `stop` (a reload removed or moved the listener); dropping the socket
/// then stops the kernel from queueing more for this worker.
async fn accept_loop(ctx: Rc<WorkerCtx>, name: Arc<str>, listener: tokio::net::TcpListener, stop: Rc<Notify>) {
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let limit = {
            let snap = ctx.snapshot.load();
            let total = snap.listener(&name).map_or(usize::MAX, |l| l.max_connections);
            total.div_ceil(snap.workers.max(1))
        };
        while ctx.open_connections.get() >= limit {
            tokio::select! {
                _ = ctx.connection_closed.notified() => {}
                _ = shutdown.changed() => return,
                _ = stop.notified() => return,
            }
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return, // dropping the listener stops accepting
            _ = stop.notified() => return,
        };
        match accepted {
            Ok((io, peer)) => {
                ctx.open_connections.set(ctx.open_connections.get() + 1);
                let conn_ctx = ctx.clone();
                let name = name.clone();
                tokio::task::spawn_local(async move {
                    let guard = ConnectionGuard(conn_ctx.clone());
                    // Panics inside a request are answered and counted there; this catches the rest (the
                    // handshake, reading a head) so that they are counted and logged too.
                    let served = crate::proxy::serve_connection(io, peer, name.clone(), conn_ctx.clone());
                    if let Err(panic) = AssertUnwindSafe(served).catch_unwind().await {
                        if let Some(l) = conn_ctx.snapshot.load().listener(&name) {
                            crate::stats::slot(&l.stats.slots, conn_ctx.index).panics.inc();
                        }
                        let message = crate::context::panic_message(panic.as_ref());
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
struct ConnectionGuard(Rc<WorkerCtx>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let ctx = &self.0;
        ctx.open_connections.set(ctx.open_connections.get().saturating_sub(1));
        ctx.connection_closed.notify_waiters();
    }
}

async fn sweep_pool(ctx: Rc<WorkerCtx>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        ctx.pool.borrow_mut().sweep();
    }
}

/// Hands the worker's buffered access-log lines to the writer at least every 200 ms.
async fn flush_access_log(ctx: Rc<WorkerCtx>) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        if let Some(log) = &ctx.access_log {
            log.flush();
        }
    }
}
