//! The HTTP plane's metrics (Prometheus text, per-worker slots summed at scrape time) and `/admin/clusters`.

use crate::snapshot::{Registry, Snapshot};
use portico_core::prometheus::{by_class, escape, header, histogram, SlotMetric};
use portico_core::shared::now_ms;
use portico_core::stats::ListenerSlot;
use std::collections::HashSet;
use std::fmt::Write;

/// What the running configuration has, by the names its stats are kept under. A route, cluster, endpoint or
/// listener that a reload removed is no longer exported: dashboards and alerts see only what runs. Its counts stay
/// in the registry, so they go on (still monotonic) if a later reload brings it back.
struct Running<'a> {
    routes: HashSet<(&'a str, &'a str)>,
    endpoints: HashSet<(&'a str, &'a str)>,
    clusters: HashSet<&'a str>,
}

impl<'a> Running<'a> {
    fn of(snapshot: &'a Snapshot) -> Running<'a> {
        let route_stats = snapshot.router.routes().iter().map(|r| &r.stats).chain([&snapshot.unrouted]);
        let endpoint_stats = snapshot.clusters.iter().flat_map(|c| &c.endpoints).map(|e| &e.stats);
        Running {
            routes: route_stats.map(|s| (s.route.as_str(), s.cluster.as_str())).collect(),
            endpoints: endpoint_stats.map(|s| (s.cluster.as_str(), s.endpoint.as_str())).collect(),
            clusters: snapshot.clusters.iter().map(|c| c.stats.cluster.as_str()).collect(),
        }
    }
}

/// Renders the HTTP plane's metrics. Counters come from the registry (so they survive reloads), for what the
/// running snapshot has; gauges that describe the current configuration (health, in-flight) come from the snapshot.
pub fn render(out: &mut String, registry: &Registry, snapshot: &Snapshot) {
    let running = Running::of(snapshot);
    // Each family is written whole (Prometheus wants a family's samples together), so labels are built once.
    let routes: Vec<_> = registry
        .all_routes()
        .into_iter()
        .filter(|r| running.routes.contains(&(r.route.as_str(), r.cluster.as_str())))
        .map(|r| (format!("route=\"{}\",cluster=\"{}\"", escape(&r.route), escape(&r.cluster)), r))
        .collect();
    header(out, "portico_requests_total", "counter", "Requests answered, by route, cluster and status class.");
    for (labels, r) in &routes {
        by_class(out, "portico_requests_total", labels, |class| {
            r.slots.iter().map(|s| s.0.by_class[class].get()).sum()
        });
    }
    header(out, "portico_request_duration_seconds", "histogram", "Time from request head to response end.");
    for (labels, r) in &routes {
        histogram(out, "portico_request_duration_seconds", labels, r.slots.iter().map(|s| &s.0.duration));
    }
    header(
        out,
        "portico_filter_denials_total",
        "counter",
        "Requests a filter refused (shadow=\"true\": would have refused, and let through), by route, filter and reason.",
    );
    let running_routes: HashSet<&str> = snapshot.router.routes().iter().map(|r| r.name.as_str()).collect();
    // `route=""`: refused before routing (a `limits` filter's slow connections).
    let counted =
        |d: &&std::sync::Arc<crate::filters::Denials>| d.route.is_empty() || running_routes.contains(d.route.as_str());
    for d in registry.all_denials().iter().filter(counted) {
        for denial in crate::filters::Denial::ALL {
            let (filter, reason) = denial.labels();
            for shadow in [false, true] {
                let n = d.count(denial, shadow);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "portico_filter_denials_total{{route=\"{}\",filter=\"{filter}\",reason=\"{reason}\",shadow=\"{shadow}\"}} {n}",
                        escape(&d.route)
                    );
                }
            }
        }
    }

    let endpoints: Vec<_> = registry
        .all_endpoints()
        .into_iter()
        .filter(|e| running.endpoints.contains(&(e.cluster.as_str(), e.endpoint.as_str())))
        .map(|e| (format!("cluster=\"{}\",endpoint=\"{}\"", escape(&e.cluster), escape(&e.endpoint)), e))
        .collect();
    header(out, "portico_upstream_requests_total", "counter", "Upstream tries, by endpoint and status class.");
    for (labels, e) in &endpoints {
        by_class(out, "portico_upstream_requests_total", labels, |class| {
            e.slots.iter().map(|s| s.0.by_class[class].get()).sum()
        });
    }
    header(out, "portico_upstream_duration_seconds", "histogram", "Time spent on one upstream try.");
    for (labels, e) in &endpoints {
        histogram(out, "portico_upstream_duration_seconds", labels, e.slots.iter().map(|s| &s.0.duration));
    }
    let per_endpoint: [SlotMetric<crate::stats::EndpointSlot>; 3] = [
        ("portico_upstream_connections_opened_total", "counter", "Upstream connections opened.", |s| {
            s.connections_opened.get() as i64
        }),
        ("portico_upstream_connections_idle", "gauge", "Idle pooled upstream connections.", |s| s.idle.get()),
        ("portico_upstream_failures_total", "counter", "Connect failures, resets and timeouts.", |s| {
            s.failures.get() as i64
        }),
    ];
    for (name, kind, help, f) in per_endpoint {
        header(out, name, kind, help);
        for (labels, e) in &endpoints {
            let v: i64 = e.slots.iter().map(|s| f(&s.0)).sum();
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }

    let now = now_ms();
    header(out, "portico_upstream_requests_active", "gauge", "Requests in flight to an endpoint.");
    for c in &snapshot.clusters {
        for e in &c.endpoints {
            let _ = writeln!(
                out,
                "portico_upstream_requests_active{{cluster=\"{}\",endpoint=\"{}\"}} {}",
                escape(&c.name),
                escape(&e.configured),
                e.inflight()
            );
        }
    }
    header(out, "portico_endpoint_healthy", "gauge", "1 when the active health check passes (or there is none).");
    for c in &snapshot.clusters {
        for e in &c.endpoints {
            let _ = writeln!(
                out,
                "portico_endpoint_healthy{{cluster=\"{}\",endpoint=\"{}\"}} {}",
                escape(&c.name),
                escape(&e.configured),
                u8::from(e.health.active_healthy())
            );
        }
    }
    header(out, "portico_endpoint_ejected", "gauge", "1 while outlier detection keeps the endpoint out.");
    for c in &snapshot.clusters {
        for e in &c.endpoints {
            let _ = writeln!(
                out,
                "portico_endpoint_ejected{{cluster=\"{}\",endpoint=\"{}\"}} {}",
                escape(&c.name),
                escape(&e.configured),
                u8::from(e.health.is_ejected(now))
            );
        }
    }

    let clusters: Vec<_> =
        registry.all_clusters().into_iter().filter(|c| running.clusters.contains(c.cluster.as_str())).collect();
    let listeners: Vec<_> =
        registry.all_listeners().into_iter().filter(|l| snapshot.listener(&l.listener).is_some()).collect();
    let per_cluster: [SlotMetric<crate::stats::ClusterSlot>; 12] = [
        ("portico_retries_total", "counter", "Retries of requests on another endpoint or connection.", |s| {
            s.retries.get() as i64
        }),
        ("portico_retry_budget_exhausted_total", "counter", "Retries refused by the retry budget.", |s| {
            s.retries_budget_exhausted.get() as i64
        }),
        ("portico_breaker_rejections_total", "counter", "Requests refused by the circuit breaker.", |s| {
            s.breaker_rejections.get() as i64
        }),
        (
            "portico_no_healthy_endpoint_total",
            "counter",
            "Requests answered 503 for lack of a healthy endpoint.",
            |s| s.no_healthy_endpoint.get() as i64,
        ),
        ("portico_ejections_total", "counter", "Endpoints ejected by outlier detection.", |s| s.ejections.get() as i64),
        (
            "portico_upstream_pipelined_requests_total",
            "counter",
            "Requests written to an upstream together with others that their client pipelined (pool.pipeline_depth).",
            |s| s.pipelined_requests.get() as i64,
        ),
        (
            "portico_upstream_pipeline_writes_total",
            "counter",
            "Writes that carried two or more pipelined requests: requests / writes is the average batch size.",
            |s| s.pipeline_writes.get() as i64,
        ),
        ("portico_upgraded_connections_total", "counter", "Connections upgraded to WebSocket after a 101.", |s| {
            s.tunnels_opened.get() as i64
        }),
        ("portico_upgraded_connections_active", "gauge", "Upgraded (WebSocket) connections open.", |s| s.tunnels.get()),
        ("portico_cluster_requests_active", "gauge", "Requests in flight to the cluster.", |s| s.requests.get()),
        ("portico_cluster_requests_pending", "gauge", "Requests waiting for an upstream connection.", |s| {
            s.pending.get()
        }),
        ("portico_upstream_connections_open", "gauge", "Upstream connections open (active and idle).", |s| {
            s.connections.get()
        }),
    ];
    for (name, kind, help, f) in per_cluster {
        header(out, name, kind, help);
        for c in &clusters {
            let _ = writeln!(out, "{name}{{cluster=\"{}\"}} {}", escape(&c.cluster), c.sum(f));
        }
    }

    header(out, "portico_tls_handshakes_total", "counter", "TLS handshakes on a listener, by result.");
    for l in &listeners {
        let sum = |f: fn(&ListenerSlot) -> u64| -> u64 { l.slots.iter().map(|s| f(&s.0)).sum() };
        let results = [
            ("ok", sum(|s| s.tls_handshakes.get())),
            ("failed", sum(|s| s.tls_handshake_failures.get())),
            ("timeout", sum(|s| s.tls_handshake_timeouts.get())),
        ];
        let terminates_tls = snapshot.listener(&l.listener).is_some_and(|s| s.tls.is_some());
        if !terminates_tls && results.iter().all(|(_, n)| *n == 0) {
            continue;
        }
        for (result, n) in results {
            let _ = writeln!(
                out,
                "portico_tls_handshakes_total{{listener=\"{}\",result=\"{result}\"}} {n}",
                escape(&l.listener)
            );
        }
    }
    header(out, "portico_panics_total", "counter", "Requests or connections ended by a panic (a bug), by listener.");
    for l in &listeners {
        let n: u64 = l.slots.iter().map(|s| s.0.panics.get()).sum();
        let _ = writeln!(out, "portico_panics_total{{listener=\"{}\"}} {n}", escape(&l.listener));
    }
    header(
        out,
        "portico_connections_evicted_total",
        "counter",
        "Idle keep-alive connections closed to make room for new clients at the listener's connection limit.",
    );
    for l in &listeners {
        let n: u64 = l.slots.iter().map(|s| s.0.evictions.get()).sum();
        let _ = writeln!(out, "portico_connections_evicted_total{{listener=\"{}\"}} {n}", escape(&l.listener));
    }
    header(
        out,
        "portico_request_bodies_buffered_total",
        "counter",
        "Request bodies read whole by request buffering before going upstream, by where they were kept.",
    );
    for l in &listeners {
        let memory: u64 = l.slots.iter().map(|s| s.0.bodies_buffered_in_memory.get()).sum();
        let file: u64 = l.slots.iter().map(|s| s.0.bodies_buffered_to_file.get()).sum();
        let name = escape(&l.listener);
        let _ = writeln!(out, "portico_request_bodies_buffered_total{{listener=\"{name}\",to=\"memory\"}} {memory}");
        let _ = writeln!(out, "portico_request_bodies_buffered_total{{listener=\"{name}\",to=\"file\"}} {file}");
    }
    header(
        out,
        "portico_tls_certificate_expiry_timestamp_seconds",
        "gauge",
        "When a served certificate expires (notAfter, Unix seconds).",
    );
    for l in &snapshot.listeners {
        for c in l.tls.iter().flat_map(|t| &t.certificates) {
            let _ = writeln!(
                out,
                "portico_tls_certificate_expiry_timestamp_seconds{{listener=\"{}\",certificate=\"{}\"}} {}",
                escape(&l.name),
                escape(&c.file),
                c.not_after
            );
        }
    }
}

/// `/admin/clusters`: every cluster with its endpoints' health, load and breaker state.
pub fn clusters(snapshot: &Snapshot) -> serde_json::Value {
    let now = now_ms();
    let list: Vec<serde_json::Value> = snapshot
        .clusters
        .iter()
        .map(|c| {
            let endpoints: Vec<serde_json::Value> = c
                .endpoints
                .iter()
                .map(|e| {
                    let idle: i64 = e.stats.slots.iter().map(|s| s.0.idle.get()).sum();
                    let opened: u64 = e.stats.slots.iter().map(|s| s.0.connections_opened.get()).sum();
                    let requests: u64 =
                        e.stats.slots.iter().map(|s| s.0.by_class.iter().map(|c| c.get()).sum::<u64>()).sum();
                    let ejected_for = e.health.ejected_until_ms().saturating_sub(now);
                    serde_json::json!({
                        "address": e.configured,
                        "resolved": e.addr.to_string(),
                        "weight": e.weight,
                        "healthy": e.health.active_healthy(),
                        "ejected": e.health.is_ejected(now),
                        "ejected_for_ms": ejected_for,
                        "ejections": e.health.ejections(),
                        "available": e.health.is_available(now),
                        "in_flight": e.inflight(),
                        "idle_connections": idle,
                        "connections_opened": opened,
                        "requests": requests,
                    })
                })
                .collect();
            serde_json::json!({
                "name": c.name,
                "health_check": c.health_check.is_some(),
                "panic_mode": c.settings.panic_mode,
                "requests_active": c.stats.sum(|s| s.requests.get()),
                "connections_open": c.stats.sum(|s| s.connections.get()),
                "endpoints": endpoints,
            })
        })
        .collect();
    serde_json::json!({ "clusters": list })
}
