//! What a worker's connections share, and where the last panic on a worker thread was raised.

use crate::access_log::LocalLog;
use crate::pool::Pool;
use crate::snapshot::Snapshot;
use arc_swap::ArcSwap;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use tokio::sync::{watch, Notify};

/// What a worker's connections share: owned by that worker's thread alone.
pub struct WorkerCtx {
    pub index: usize,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub pool: RefCell<Pool>,
    /// HTTP/2 connections to `protocol: h2` upstreams.
    pub h2: RefCell<crate::upstream_h2::H2Pool>,
    /// Pipelined request batches still open for joining.
    pub batches: crate::pipeline::Batches,
    /// Becomes true when the process starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    pub access_log: Option<LocalLog>,
    pub(crate) open_connections: Cell<usize>,
    pub(crate) connection_closed: Notify,
    /// Debug builds: notified to make this worker's runtime die (the supervisor test's hook).
    #[cfg(debug_assertions)]
    pub debug_kill: Notify,
}

thread_local! {
    /// Where the last panic on this thread was raised, for the one log line that reports it.
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics on worker threads are caught and logged once, with their request's context, where they are caught;
/// this hook only notes where they were raised. Other threads keep the default report.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let on_worker = std::thread::current().name().is_some_and(|n| n.starts_with("portico-worker-"));
        if on_worker {
            let location = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_LOCATION.with(|p| *p.borrow_mut() = location);
        } else {
            default(info);
        }
    }));
}

/// Where the last panic on this thread was raised (taken).
pub(crate) fn last_panic_location() -> String {
    PANIC_LOCATION.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "unknown location".into())
}

/// The text a panic was raised with, if it has one.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// In debug builds, a request for the path in `PORTICO_DEBUG_PANIC_PATH` panics: the tests' way to show that a
/// panic costs one request, not the worker.
/// `PORTICO_DEBUG_KILL_WORKER_PATH` takes the whole worker runtime down instead (the supervisor restarts it).
#[cfg(debug_assertions)]
pub(crate) fn debug_panic_hook(head: &crate::codec::RequestHead, ctx: &WorkerCtx) {
    type Paths = (Option<Vec<u8>>, Option<Vec<u8>>);
    static PATHS: std::sync::OnceLock<Paths> = std::sync::OnceLock::new();
    let (panic_path, kill_path) = PATHS.get_or_init(|| {
        let var = |name| std::env::var_os(name).map(|p: std::ffi::OsString| p.into_encoded_bytes());
        (var("PORTICO_DEBUG_PANIC_PATH"), var("PORTICO_DEBUG_KILL_WORKER_PATH"))
    });
    if panic_path.as_deref().is_some_and(|p| head.path() == p) {
        panic!("PORTICO_DEBUG_PANIC_PATH requested");
    }
    if kill_path.as_deref().is_some_and(|p| head.path() == p) {
        ctx.debug_kill.notify_one();
    }
}

/// Runs hyper's executor contract on the worker's thread: streams are local tasks, like connections.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// What every stream of one HTTP/2 connection shares.
pub(crate) struct Connection {
    pub peer: std::net::SocketAddr,
    pub facts: crate::body::ClientFacts,
    pub listener: std::sync::Arc<str>,
    pub ctx: std::rc::Rc<WorkerCtx>,
    /// When the last request arrived, and how many are being answered: for the idle timeout.
    pub last_request: Cell<tokio::time::Instant>,
    pub active: Cell<usize>,
}
