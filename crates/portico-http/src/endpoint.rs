//! An upstream endpoint as the request path sees it: its address, weight and identity, its health shared by
//! every worker (kept across reloads in the `Registry`), and its per-worker in-flight and outlier counters.

use crate::stats::EndpointStats;
use portico_config::OutlierDetection;
use portico_core::shared::{now_ms, Padded};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Health of one endpoint of one cluster, shared by all workers and kept across reloads while it stays.
#[derive(Debug)]
pub struct EndpointHealth {
    /// Verdict of the active health check (true when there is none).
    active_healthy: AtomicBool,
    /// Ejected by outlier detection until this time (`now_ms`).
    ejected_until_ms: AtomicU64,
    /// Ejections so far; the next ejection lasts `base * 2^ejections`, capped.
    ejections: AtomicU32,
    /// Drained by an operator (`POST /admin/endpoints/drain`): no new requests until enabled again.
    drained: AtomicBool,
}

impl Default for EndpointHealth {
    fn default() -> Self {
        EndpointHealth {
            active_healthy: AtomicBool::new(true),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            drained: AtomicBool::new(false),
        }
    }
}

impl EndpointHealth {
    /// Whether balancers may pick this endpoint now.
    pub fn is_available(&self, now: u64) -> bool {
        self.active_healthy.load(Ordering::Relaxed)
            && self.ejected_until_ms.load(Ordering::Relaxed) <= now
            && !self.drained.load(Ordering::Relaxed)
    }
    pub fn drained(&self) -> bool {
        self.drained.load(Ordering::Relaxed)
    }
    /// Drains the endpoint (`true`: balancers stop picking it; requests in flight finish) or enables it again;
    /// returns true when that changed its state.
    pub fn set_drained(&self, drained: bool) -> bool {
        self.drained.swap(drained, Ordering::Relaxed) != drained
    }
    pub fn active_healthy(&self) -> bool {
        self.active_healthy.load(Ordering::Relaxed)
    }
    /// Records the health checker's verdict; returns true when it changed.
    pub fn set_active_healthy(&self, healthy: bool) -> bool {
        self.active_healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
    pub fn ejected_until_ms(&self) -> u64 {
        self.ejected_until_ms.load(Ordering::Relaxed)
    }
    pub fn is_ejected(&self, now: u64) -> bool {
        self.ejected_until_ms() > now
    }
    pub fn ejections(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }
    /// Ejects for `base * 2^previous_ejections` (capped at `max`); the multiplier starts over once the endpoint
    /// has stayed in for `max`. Returns the ejection time, or `None` when another worker ejected it first (an
    /// ejection is counted once).
    pub fn eject(&self, od: &OutlierSettings) -> Option<Duration> {
        let now = now_ms();
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        if until > now {
            return None;
        }
        let mut previous = self.ejections.load(Ordering::Relaxed);
        if until > 0 && now.saturating_sub(until) > od.max_ejection.as_millis() as u64 {
            previous = 0;
        }
        let time = od.base_ejection.saturating_mul(1u32 << previous.min(16)).min(od.max_ejection);
        // Only the worker that moves the deadline from the value it read ejects.
        self.ejected_until_ms
            .compare_exchange(until, now + time.as_millis() as u64, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        self.ejections.store(previous + 1, Ordering::Relaxed);
        Some(time)
    }
}

/// Per-worker outlier-detection counters for one endpoint: each worker counts what it sees, so no shared
/// cache line is written per request.
#[derive(Debug, Default)]
pub struct OutlierLocal {
    pub consecutive_failures: AtomicU32,
    pub consecutive_5xx: AtomicU32,
}

#[derive(Debug)]
pub struct Endpoint {
    /// As written in the configuration: identifies the endpoint for hashing and sticky cookies.
    pub configured: String,
    pub addr: SocketAddr,
    /// `host:port` for the `Host` header when the cluster does not preserve the client's.
    pub authority: String,
    pub weight: u32,
    /// Stable across restarts and reloads: the sticky cookie's value.
    pub id: u64,
    pub health: Arc<EndpointHealth>,
    pub stats: Arc<EndpointStats>,
    /// In-flight requests, one slot per worker: each worker writes only its own.
    pub(crate) inflight: Box<[Padded<AtomicU32>]>,
    pub outlier: Box<[Padded<OutlierLocal>]>,
    /// Reached over TLS, when set.
    pub tls: Option<crate::upstream_tls::EndpointTls>,
    /// When a failed TLS handshake with this endpoint was last logged (ms since the epoch): once a minute.
    pub tls_warned_ms: AtomicU64,
}

impl Endpoint {
    pub fn inflight(&self) -> u64 {
        self.inflight.iter().map(|c| u64::from(c.0.load(Ordering::Relaxed))).sum()
    }
    pub fn begin(&self, worker: usize) {
        if let Some(c) = self.inflight.get(worker) {
            c.0.store(c.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
    pub fn end(&self, worker: usize) {
        if let Some(c) = self.inflight.get(worker) {
            c.0.store(c.0.load(Ordering::Relaxed).saturating_sub(1), Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone)]
pub struct OutlierSettings {
    pub consecutive_failures: u32,
    pub consecutive_5xx: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    pub max_ejected_percent: u32,
}

impl From<&OutlierDetection> for OutlierSettings {
    fn from(o: &OutlierDetection) -> Self {
        OutlierSettings {
            consecutive_failures: o.consecutive_failures,
            consecutive_5xx: o.consecutive_5xx,
            base_ejection: o.base_ejection.0,
            max_ejection: o.max_ejection.0,
            max_ejected_percent: o.max_ejected_percent,
        }
    }
}

/// Stable across restarts and reloads: derived from the endpoint as configured.
pub fn endpoint_id(configured: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(configured.as_bytes())
}
