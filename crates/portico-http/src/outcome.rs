//! How a request ended, and where that is recorded: the route's counters, the endpoint's, and the access log.

use crate::access_log::Entry;
use crate::codec::RequestHead;
use crate::context::WorkerCtx;
use crate::router::CompiledRoute;
use crate::snapshot::{Endpoint, Snapshot};
use crate::stats::RouteStats;
use portico_core::stats::{class_index, slot, Observation};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// What the client connection does after a request.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Next {
    KeepAlive,
    Close,
}

/// How a request ended, for the counters and the access log.
pub(crate) struct Outcome {
    pub next: Next,
    pub status: u16,
    pub bytes: u64,
    pub upstream: Option<SocketAddr>,
    pub upstream_time: Option<Duration>,
    pub retries: u32,
    /// Why Portico answered an error itself (`upstream refused the connection`), for the recent errors.
    pub reason: Option<&'static str>,
}

impl Outcome {
    pub fn local(next: Next, status: u16, bytes: u64) -> Outcome {
        Outcome { next, status, bytes, upstream: None, upstream_time: None, retries: 0, reason: None }
    }
}

/// Where a request came from: the client's address, whether it came over HTTP/2, and the listener it arrived on
/// (its `ListenerSettings::index` in the snapshot the request is recorded with).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub client: IpAddr,
    pub http2: bool,
    pub listener: usize,
}

/// Counts a request answered `status` in `elapsed` for its route's or the unrouted `stats`, and for its listener.
#[inline]
fn count(ctx: &WorkerCtx, snapshot: &Snapshot, stats: &RouteStats, listener: usize, status: u16, elapsed: Duration) {
    let class = class_index(status);
    let observed = Observation::of(elapsed);
    let counters = slot(&stats.slots, ctx.index);
    counters.by_class[class].inc();
    counters.duration.add(observed);
    if let Some(l) = snapshot.listeners.get(listener) {
        let counters = slot(&l.stats.slots, ctx.index);
        counters.by_class[class].inc();
        counters.duration.add(observed);
    }
}

/// Counts the request for its route and its listener, and writes its access-log line.
pub(crate) fn record(
    ctx: &WorkerCtx,
    snapshot: &Snapshot,
    route: Option<&CompiledRoute>,
    head: &RequestHead,
    Peer { client, http2, listener }: Peer,
    outcome: &Outcome,
    elapsed: Duration,
) {
    let stats = route.map_or(&snapshot.unrouted, |r| &r.stats);
    count(ctx, snapshot, stats, listener, outcome.status, elapsed);
    if outcome.status >= 500 {
        note_error(stats, head, outcome);
    }
    if let Some(log) = &ctx.core.access_log {
        crate::access_log::record(
            log,
            &Entry {
                client,
                user: head.edits.as_ref().and_then(|e| e.identity.as_deref()),
                method: head.method(),
                target: head.target(),
                protocol: match (http2, head.http10) {
                    (true, _) => "HTTP/2.0",
                    (false, true) => "HTTP/1.0",
                    (false, false) => "HTTP/1.1",
                },
                host: head.host(),
                status: outcome.status,
                bytes: outcome.bytes,
                duration: elapsed,
                upstream: outcome.upstream,
                upstream_duration: outcome.upstream_time,
                retries: outcome.retries,
                route: &stats.route,
                cluster: &stats.cluster,
                user_agent: head.values("user-agent").next(),
                referer: head.values("referer").next(),
            },
        );
    }
}

/// Counts a response an endpoint gave (by status class, with its time since `started`) and makes the
/// request's outcome of it.
pub(crate) fn upstream_outcome(
    endpoint: &Endpoint,
    worker: usize,
    (next, status, bytes): (Next, u16, u64),
    started: std::time::Instant,
    retries: u32,
) -> Outcome {
    let upstream_time = started.elapsed();
    let endpoint_slot = slot(&endpoint.stats.slots, worker);
    endpoint_slot.by_class[class_index(status)].inc();
    endpoint_slot.duration.observe(upstream_time);
    Outcome {
        next,
        status,
        bytes,
        upstream: Some(endpoint.addr),
        upstream_time: Some(upstream_time),
        retries,
        reason: None,
    }
}

/// Samples a server error for the dashboard's recent errors (bounded: see `recent_errors`).
#[cold]
fn note_error(stats: &RouteStats, head: &RequestHead, outcome: &Outcome) {
    let at_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    if !crate::recent_errors::may_sample(at_ms) {
        return;
    }
    // The path without its query, which may hold a key (`api_key` filters read one from it).
    let path = head.path();
    crate::recent_errors::keep(crate::recent_errors::RecentError {
        at_ms,
        status: outcome.status,
        reason: match (outcome.reason, outcome.upstream) {
            (Some(reason), _) => reason,
            (None, Some(_)) => crate::recent_errors::upstream_answered(outcome.status),
            (None, None) => "answered by Portico (the error log says why)",
        },
        route: stats.route.clone(),
        cluster: stats.cluster.clone(),
        endpoint: outcome.upstream,
        method: String::from_utf8_lossy(head.method()).into_owned(),
        path: String::from_utf8_lossy(&path[..path.len().min(200)]).into_owned(),
    });
}

/// Counts and logs a request refused before its head could be parsed.
pub(crate) fn record_refused(ctx: &WorkerCtx, snapshot: &Snapshot, from: Peer, status: u16, bytes: u64) {
    let Peer { client, http2, listener } = from;
    let stats = &snapshot.unrouted;
    count(ctx, snapshot, stats, listener, status, Duration::ZERO);
    if let Some(log) = &ctx.core.access_log {
        crate::access_log::record(
            log,
            &Entry {
                client,
                user: None,
                method: b"-",
                target: b"-",
                protocol: if http2 { "HTTP/2.0" } else { "HTTP/1.1" },
                host: None,
                status,
                bytes,
                duration: Duration::ZERO,
                upstream: None,
                upstream_duration: None,
                retries: 0,
                route: &stats.route,
                cluster: &stats.cluster,
                user_agent: None,
                referer: None,
            },
        );
    }
}
