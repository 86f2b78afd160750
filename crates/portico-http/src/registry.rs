//! What outlives a snapshot, by name: endpoint health (verdicts, ejections) and every stats object, so a reload
//! keeps them and Prometheus counters stay monotonic.

use crate::endpoint::EndpointHealth;
use crate::stats::{ClusterStats, EndpointStats, RouteStats};
use portico_core::stats::{self, Global};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// State kept across reloads, by name: endpoint health, and every counter, so Prometheus counters stay
/// monotonic. Locked only while a snapshot is built or metrics are rendered, never per request.
pub struct Registry {
    pub workers: usize,
    health: Mutex<HashMap<(String, SocketAddr), Arc<EndpointHealth>>>,
    routes: Mutex<HashMap<(String, String), Arc<RouteStats>>>,
    endpoints: Mutex<HashMap<(String, String), Arc<EndpointStats>>>,
    clusters: Mutex<HashMap<String, Arc<ClusterStats>>>,
    listeners: Mutex<HashMap<String, Arc<stats::ListenerStats>>>,
    denials: Mutex<HashMap<String, Arc<crate::filters::Denials>>>,
    pub global: Arc<Global>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    pub fn new(workers: usize) -> Registry {
        Registry {
            workers: workers.max(1),
            health: Mutex::default(),
            routes: Mutex::default(),
            endpoints: Mutex::default(),
            clusters: Mutex::default(),
            listeners: Mutex::default(),
            denials: Mutex::default(),
            global: Arc::default(),
        }
    }

    pub(crate) fn health(&self, cluster: &str, addr: SocketAddr) -> Arc<EndpointHealth> {
        locked(&self.health).entry((cluster.to_string(), addr)).or_default().clone()
    }

    pub fn route_stats(&self, route: &str, cluster: &str) -> Arc<RouteStats> {
        let workers = self.workers;
        locked(&self.routes)
            .entry((route.to_string(), cluster.to_string()))
            .or_insert_with(|| {
                Arc::new(RouteStats { route: route.into(), cluster: cluster.into(), slots: stats::slots(workers) })
            })
            .clone()
    }

    pub(crate) fn endpoint_stats(&self, cluster: &str, endpoint: &str) -> Arc<EndpointStats> {
        let workers = self.workers;
        locked(&self.endpoints)
            .entry((cluster.to_string(), endpoint.to_string()))
            .or_insert_with(|| {
                Arc::new(EndpointStats {
                    cluster: cluster.into(),
                    endpoint: endpoint.into(),
                    slots: stats::slots(workers),
                })
            })
            .clone()
    }

    pub(crate) fn cluster_stats(&self, cluster: &str) -> Arc<ClusterStats> {
        let workers = self.workers;
        locked(&self.clusters)
            .entry(cluster.to_string())
            .or_insert_with(|| Arc::new(ClusterStats { cluster: cluster.into(), slots: stats::slots(workers) }))
            .clone()
    }

    /// What the filters of route `route` refused.
    pub(crate) fn denials(&self, route: &str) -> Arc<crate::filters::Denials> {
        locked(&self.denials)
            .entry(route.to_string())
            .or_insert_with(|| Arc::new(crate::filters::Denials::new(route)))
            .clone()
    }

    pub fn all_denials(&self) -> Vec<Arc<crate::filters::Denials>> {
        let mut v: Vec<_> = locked(&self.denials).values().cloned().collect();
        v.sort_by(|a, b| a.route.cmp(&b.route));
        v
    }

    /// Keeps the health of the endpoints `live` says still exist (cluster, address), forgets the others.
    pub fn retain_health(&self, live: impl Fn(&str, SocketAddr) -> bool) {
        locked(&self.health).retain(|(cluster, addr), _| live(cluster, *addr));
    }

    /// Every stats object ever created, sorted by name (for rendering).
    pub fn all_routes(&self) -> Vec<Arc<RouteStats>> {
        let mut v: Vec<_> = locked(&self.routes).values().cloned().collect();
        v.sort_by(|a, b| (&a.route, &a.cluster).cmp(&(&b.route, &b.cluster)));
        v
    }
    pub fn all_endpoints(&self) -> Vec<Arc<EndpointStats>> {
        let mut v: Vec<_> = locked(&self.endpoints).values().cloned().collect();
        v.sort_by(|a, b| (&a.cluster, &a.endpoint).cmp(&(&b.cluster, &b.endpoint)));
        v
    }
    pub(crate) fn listener_stats(&self, listener: &str) -> Arc<stats::ListenerStats> {
        let workers = self.workers;
        locked(&self.listeners)
            .entry(listener.to_string())
            .or_insert_with(|| {
                Arc::new(stats::ListenerStats { listener: listener.into(), slots: stats::slots(workers) })
            })
            .clone()
    }

    pub fn all_listeners(&self) -> Vec<Arc<stats::ListenerStats>> {
        let mut v: Vec<_> = locked(&self.listeners).values().cloned().collect();
        v.sort_by(|a, b| a.listener.cmp(&b.listener));
        v
    }

    pub fn all_clusters(&self) -> Vec<Arc<ClusterStats>> {
        let mut v: Vec<_> = locked(&self.clusters).values().cloned().collect();
        v.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        v
    }
}
