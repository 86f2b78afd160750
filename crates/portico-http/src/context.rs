//! What a worker's HTTP connections share.

use crate::pool::Pool;
use crate::snapshot::Snapshot;
use arc_swap::ArcSwap;
use portico_core::worker::WorkerCore;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::watch;

/// What a worker's HTTP connections share: owned by that worker's thread alone.
pub struct WorkerCtx {
    /// The worker runtime's own: its index, shutdown signal, access log.
    pub core: Rc<WorkerCore>,
    pub index: usize,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub pool: RefCell<Pool>,
    /// HTTP/2 connections to `protocol: h2` upstreams.
    pub h2: RefCell<crate::upstream_h2::H2Pool>,
    /// Becomes true when the process starts shutting down.
    pub shutdown: watch::Receiver<bool>,
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
        ctx.core.debug_kill.notify_one();
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
    /// How long a stream may wait for the client's flow-control window (the listener's `timeouts.send` when
    /// the connection opened).
    pub send_timeout: std::time::Duration,
}
