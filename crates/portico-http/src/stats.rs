//! The HTTP plane's per-worker counters: routes, clusters, endpoints. The counter types and the slot layout
//! are portico-core's (`portico_core::stats`).

use portico_core::shared::Padded;
use portico_core::stats::{Counter, Gauge, Histogram};

#[derive(Debug, Default)]
pub struct RouteSlot {
    pub by_class: [Counter; 5],
    pub duration: Histogram,
}

/// Requests answered for one route (or for no route: name `none`).
#[derive(Debug)]
pub struct RouteStats {
    pub route: String,
    pub cluster: String,
    pub slots: Box<[Padded<RouteSlot>]>,
}

#[derive(Debug, Default)]
pub struct EndpointSlot {
    pub by_class: [Counter; 5],
    pub duration: Histogram,
    pub connections_opened: Counter,
    pub failures: Counter,
    pub idle: Gauge,
    pub active: Gauge,
}

#[derive(Debug)]
pub struct EndpointStats {
    pub cluster: String,
    pub endpoint: String,
    pub slots: Box<[Padded<EndpointSlot>]>,
}

#[derive(Debug, Default)]
pub struct ClusterSlot {
    pub retries: Counter,
    pub retries_budget_exhausted: Counter,
    pub breaker_rejections: Counter,
    pub no_healthy_endpoint: Counter,
    pub ejections: Counter,
    /// Requests written upstream together with others their client pipelined, and the writes that carried them.
    pub pipelined_requests: Counter,
    pub pipeline_writes: Counter,
    /// Requests in flight (for the breaker and the retry budget).
    pub requests: Gauge,
    /// Requests waiting for a connection (the cluster is at `max_connections`).
    pub pending: Gauge,
    /// Woken when a connection is returned to the pool or closed, while requests wait for one.
    pub freed: tokio::sync::Notify,
    /// Upstream connections open (active and idle).
    pub connections: Gauge,
    /// Retries in flight.
    pub retries_active: Gauge,
    /// Upgraded (WebSocket) connections open, and opened in total.
    pub tunnels: Gauge,
    pub tunnels_opened: Counter,
}

#[derive(Debug)]
pub struct ClusterStats {
    pub cluster: String,
    pub slots: Box<[Padded<ClusterSlot>]>,
}

impl ClusterStats {
    pub fn sum(&self, f: impl Fn(&ClusterSlot) -> i64) -> i64 {
        self.slots.iter().map(|s| f(&s.0)).sum()
    }
}

/// Decrements a gauge when the request ends, however it ends.
pub(crate) struct GaugeGuard<'a>(pub &'a Gauge, pub i64);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.add(-self.1);
    }
}
