//! The HTTP plane as the worker runtime (portico-core) sees it: per-worker state for the listeners with
//! `protocol: http`, and what the plane shows the admin server.

use crate::context::WorkerCtx;
use crate::snapshot::{Registry, Snapshot};
use arc_swap::ArcSwap;
use portico_config::LoadedConfig;
use portico_core::view::PlaneView;
use portico_core::worker::{Plane, PlaneWorker, WorkerCore};
use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// The HTTP plane: serves the running snapshot.
pub struct HttpPlane {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
}

impl Plane for HttpPlane {
    fn start_worker(&self, core: &Rc<WorkerCore>) -> Rc<dyn PlaneWorker> {
        let ctx = Rc::new(WorkerCtx {
            core: core.clone(),
            index: core.index,
            snapshot: self.snapshot.clone(),
            pool: RefCell::default(),
            h2: RefCell::default(),
            shutdown: core.shutdown.clone(),
        });
        tokio::task::spawn_local(sweep_pool(ctx.clone()));
        Rc::new(HttpWorker(ctx))
    }
}

struct HttpWorker(Rc<WorkerCtx>);

impl PlaneWorker for HttpWorker {
    fn serves(&self, listener: &str) -> bool {
        // Only `protocol: http` listeners: another plane serves the others, whatever order planes are asked in.
        let snapshot = self.0.snapshot.load();
        let http = |l: &&portico_config::Listener| l.protocol == portico_config::ListenerProtocol::Http;
        snapshot.listener(listener).is_some()
            && snapshot.source.config.listeners.iter().filter(http).any(|l| l.name == listener)
    }

    fn serve(self: Rc<Self>, io: TcpStream, peer: SocketAddr, listener: Arc<str>) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(crate::proxy::serve_connection(io, peer, listener, self.0.clone()))
    }

    fn connection_limit(&self, listener: &str) -> usize {
        let snap = self.0.snapshot.load();
        let total = snap.listener(listener).map_or(usize::MAX, |l| l.max_connections);
        total.div_ceil(snap.workers.max(1))
    }

    fn shutdown_grace(&self) -> Duration {
        self.0.snapshot.load().shutdown_grace
    }

    fn connection_panicked(&self, listener: &str) {
        if let Some(l) = self.0.snapshot.load().listener(listener) {
            portico_core::stats::slot(&l.stats.slots, self.0.index).panics.inc();
        }
    }

    fn connection_evicted(&self, listener: &str) {
        if let Some(l) = self.0.snapshot.load().listener(listener) {
            portico_core::stats::slot(&l.stats.slots, self.0.index).evictions.inc();
        }
    }
}

/// Closes pooled upstream connections past their idle timeout, every 5 s while the pool holds any (an empty
/// pool sleeps until a connection is checked in).
async fn sweep_pool(ctx: Rc<WorkerCtx>) {
    loop {
        std::future::poll_fn(|cx| ctx.pool.borrow_mut().poll_occupied(cx)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        ctx.pool.borrow_mut().sweep();
    }
}

/// What the HTTP plane shows the admin server: its metrics and `/admin/clusters`.
pub struct HttpView {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub registry: Arc<Registry>,
}

impl PlaneView for HttpView {
    fn render_metrics(&self, out: &mut String) {
        crate::metrics::render(out, &self.registry, &self.snapshot.load());
    }

    fn admin_view(&self, name: &str) -> Option<serde_json::Value> {
        match name {
            "clusters" => Some(crate::metrics::clusters(&self.snapshot.load())),
            "listeners" => Some(crate::metrics::listeners(&self.registry, &self.snapshot.load())),
            "errors" => Some(crate::metrics::errors()),
            _ => None,
        }
    }

    fn running_config(&self) -> Arc<LoadedConfig> {
        self.snapshot.load().source.clone()
    }

    fn sample(&self, out: &mut Vec<portico_core::view::SeriesSample>) {
        crate::metrics::sample(&self.snapshot.load(), out);
    }

    fn act(
        &self,
        name: &str,
        args: &serde_json::Value,
    ) -> Option<Result<serde_json::Value, portico_core::view::ActionError>> {
        match name {
            "endpoints/drain" => Some(crate::metrics::set_drained(&self.snapshot.load(), args, true)),
            "endpoints/enable" => Some(crate::metrics::set_drained(&self.snapshot.load(), args, false)),
            _ => None,
        }
    }
}
