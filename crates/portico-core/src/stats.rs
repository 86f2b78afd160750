//! Counters, gauges and histograms, one slot per worker: a worker only ever writes its own slot (with a plain
//! load and store, no locked instruction), the admin server sums the slots when scraped. Stats objects are
//! kept in each plane's registry by name, so counters stay monotonic across reloads. The plane-specific
//! slots (routes, clusters, endpoints) are the planes' own.

use crate::shared::Padded;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A counter written by one thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: load + store is enough and avoids a locked read-modify-write.
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge written by one thread.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    #[inline]
    pub fn add(&self, n: i64) {
        self.0.store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds of the latency buckets, in seconds.
pub const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Debug, Default)]
pub struct Histogram {
    /// Not cumulative: bucket i counts observations in (BUCKETS[i-1], BUCKETS[i]]; the last slot is +Inf.
    buckets: [Counter; BUCKETS.len() + 1],
    sum_micros: Counter,
}

/// One duration placed in its bucket, for recording it in several histograms (a request's route's and its
/// listener's) while finding the bucket once.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    bucket: usize,
    micros: u64,
}

impl Observation {
    #[inline]
    pub fn of(d: Duration) -> Observation {
        let secs = d.as_secs_f64();
        let bucket = BUCKETS.iter().position(|&b| secs <= b).unwrap_or(BUCKETS.len());
        Observation { bucket, micros: d.as_micros() as u64 }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        self.add(Observation::of(d));
    }

    #[inline]
    pub fn add(&self, o: Observation) {
        self.buckets[o.bucket].inc();
        self.sum_micros.add(o.micros);
    }

    /// Adds this histogram's counts, bucket by bucket (not cumulative, the last being +Inf), to `counts`.
    pub fn add_counts_to(&self, counts: &mut [u64; BUCKETS.len() + 1]) {
        for (c, b) in counts.iter_mut().zip(&self.buckets) {
            *c += b.get();
        }
    }
}

/// Summed histogram for rendering.
#[derive(Debug, Default, Clone)]
pub struct HistogramTotals {
    /// Cumulative counts per bucket (Prometheus style), the last being +Inf (= count).
    pub cumulative: Vec<u64>,
    pub sum_seconds: f64,
}

pub fn sum_histograms<'a>(hs: impl Iterator<Item = &'a Histogram>) -> HistogramTotals {
    let mut counts = vec![0u64; BUCKETS.len() + 1];
    let mut sum = 0u64;
    for h in hs {
        for (c, b) in counts.iter_mut().zip(&h.buckets) {
            *c += b.get();
        }
        sum += h.sum_micros.get();
    }
    let mut running = 0;
    for c in counts.iter_mut() {
        running += *c;
        *c = running;
    }
    HistogramTotals { cumulative: counts, sum_seconds: sum as f64 / 1e6 }
}

/// Status classes: index 0 for 1xx ... 4 for 5xx.
pub fn class_index(status: u16) -> usize {
    usize::from((status / 100).clamp(1, 5) - 1)
}

pub const CLASS_LABELS: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

pub fn slots<T: Default>(workers: usize) -> Box<[Padded<T>]> {
    (0..workers.max(1)).map(|_| Padded(T::default())).collect()
}

#[derive(Debug, Default)]
pub struct ListenerSlot {
    /// TLS handshakes completed, failed (protocol error, unknown CA, missing client certificate...) and
    /// timed out.
    pub tls_handshakes: Counter,
    pub tls_handshake_failures: Counter,
    pub tls_handshake_timeouts: Counter,
    /// Requests or connections that ended in a panic (a bug, contained to that connection).
    pub panics: Counter,
    /// Idle keep-alive connections closed to make room for this listener's new clients at its limit.
    pub evictions: Counter,
    /// Request bodies read whole by a route's request buffering: kept in memory, and written to a
    /// temporary file.
    pub bodies_buffered_in_memory: Counter,
    pub bodies_buffered_to_file: Counter,
    /// HTTP requests answered on this listener (counted where a route's are, refused heads included), by status
    /// class, and their durations: the dashboard's per-listener charts.
    pub by_class: [Counter; 5],
    pub duration: Histogram,
}

/// Per-listener counters.
#[derive(Debug)]
pub struct ListenerStats {
    pub listener: String,
    pub slots: Box<[Padded<ListenerSlot>]>,
}

/// Process-wide counters written rarely (by the reload thread).
#[derive(Debug, Default)]
pub struct Global {
    pub reloads: AtomicU64,
    pub reload_failures: AtomicU64,
    pub access_log_dropped: AtomicU64,
    /// Worker threads restarted after their runtime died.
    pub worker_restarts: AtomicU64,
}

/// This worker's slot. Slots are sized to the worker count, which is fixed for the process.
#[inline]
pub fn slot<T>(slots: &[Padded<T>], worker: usize) -> &T {
    &slots[worker.min(slots.len() - 1)].0
}
