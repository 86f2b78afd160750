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

    if let Some(table) = portico_core::rate_table::made() {
        header(
            out,
            "portico_rate_limit_evictions_total",
            "counter",
            "Rate-limit buckets forgotten while their key was still limited, because the node's table was full.",
        );
        let _ = writeln!(out, "portico_rate_limit_evictions_total {}", table.evictions());
        header(out, "portico_rate_limit_table_keys", "gauge", "Keys the node's rate-limit table holds.");
        let _ = writeln!(out, "portico_rate_limit_table_keys {}", table.slots());
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
    header(out, "portico_endpoint_drained", "gauge", "1 while an operator keeps the endpoint drained.");
    for c in &snapshot.clusters {
        for e in &c.endpoints {
            let _ = writeln!(
                out,
                "portico_endpoint_drained{{cluster=\"{}\",endpoint=\"{}\"}} {}",
                escape(&c.name),
                escape(&e.configured),
                u8::from(e.health.drained())
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
    let config = &snapshot.source.config;
    let list: Vec<serde_json::Value> = snapshot
        .clusters
        .iter()
        .map(|c| {
            let endpoints: Vec<serde_json::Value> = c
                .endpoints
                .iter()
                .map(|e| {
                    let sum = |f: fn(&crate::stats::EndpointSlot) -> u64| -> u64 {
                        e.stats.slots.iter().map(|s| f(&s.0)).sum()
                    };
                    let idle: i64 = e.stats.slots.iter().map(|s| s.0.idle.get()).sum();
                    let requests = sum(|s| s.by_class.iter().map(|c| c.get()).sum::<u64>());
                    let ejected_for = e.health.ejected_until_ms().saturating_sub(now);
                    serde_json::json!({
                        "address": e.configured,
                        "resolved": e.addr.to_string(),
                        "weight": e.weight,
                        "healthy": e.health.active_healthy(),
                        "ejected": e.health.is_ejected(now),
                        "ejected_for_ms": ejected_for,
                        "ejections": e.health.ejections(),
                        "drained": e.health.drained(),
                        "available": e.health.is_available(now),
                        "in_flight": e.inflight(),
                        "idle_connections": idle,
                        "connections_opened": sum(|s| s.connections_opened.get()),
                        "requests": requests,
                        "errors": sum(|s| s.by_class[4].get()),
                        "failures": sum(|s| s.failures.get()),
                    })
                })
                .collect();
            let at_limit = c.stats.slots.iter().any(|s| {
                let s = &s.0;
                s.requests.get() >= c.settings.max_requests_per_worker
                    || s.pending.get() >= c.settings.max_pending_per_worker
                    || s.connections.get() >= c.settings.max_connections_per_worker
            });
            let limits = config.clusters.get(&c.name).map(|cfg| {
                serde_json::json!({
                    "max_connections": cfg.circuit_breaker.max_connections,
                    "max_pending": cfg.circuit_breaker.max_pending,
                    "max_requests": cfg.circuit_breaker.max_requests,
                })
            });
            serde_json::json!({
                "name": c.name,
                "health_check": c.health_check.is_some(),
                "health_check_interval_ms": c.health_check.as_ref().map(|h| h.interval.0.as_millis() as u64),
                "panic_mode": c.settings.panic_mode,
                "requests_active": c.stats.sum(|s| s.requests.get()),
                "requests_pending": c.stats.sum(|s| s.pending.get()),
                "connections_open": c.stats.sum(|s| s.connections.get()),
                "breaker": if at_limit { "open" } else { "closed" },
                "breaker_limits": limits,
                "breaker_rejections": c.stats.sum(|s| s.breaker_rejections.get() as i64),
                "no_healthy_endpoint": c.stats.sum(|s| s.no_healthy_endpoint.get() as i64),
                "retries": c.stats.sum(|s| s.retries.get() as i64),
                "endpoints": endpoints,
            })
        })
        .collect();
    serde_json::json!({ "clusters": list })
}

/// The dashboard's counters: every route, HTTP listener, cluster and endpoint the running configuration has,
/// cumulative.
pub fn sample(snapshot: &Snapshot, out: &mut Vec<portico_core::view::SeriesSample>) {
    use portico_core::view::SeriesSample;
    let config = &snapshot.source.config;
    let mqtt = |name: &str| {
        config.listeners.iter().any(|l| l.name == name && l.protocol == portico_config::ListenerProtocol::Mqtt)
    };
    for l in snapshot.listeners.iter().filter(|l| !mqtt(&l.name)) {
        let mut latency = Box::new([0u64; portico_core::stats::BUCKETS.len() + 1]);
        for s in l.stats.slots.iter() {
            s.0.duration.add_counts_to(&mut latency);
        }
        out.push(SeriesSample {
            kind: "listener",
            name: l.name.clone(),
            requests: l.stats.slots.iter().map(|s| s.0.by_class.iter().map(|c| c.get()).sum::<u64>()).sum(),
            errors: l.stats.slots.iter().map(|s| s.0.by_class[4].get()).sum(),
            latency: Some(latency),
        });
    }
    let routes = snapshot.router.routes().iter().map(|r| &r.stats).chain([&snapshot.unrouted]);
    for r in routes {
        let requests: u64 = r.slots.iter().map(|s| s.0.by_class.iter().map(|c| c.get()).sum::<u64>()).sum();
        if r.route == "none" && requests == 0 {
            continue;
        }
        let mut latency = Box::new([0u64; portico_core::stats::BUCKETS.len() + 1]);
        for s in r.slots.iter() {
            s.0.duration.add_counts_to(&mut latency);
        }
        out.push(SeriesSample {
            kind: "route",
            name: r.route.clone(),
            requests,
            errors: r.slots.iter().map(|s| s.0.by_class[4].get()).sum(),
            latency: Some(latency),
        });
    }
    for c in &snapshot.clusters {
        let (mut requests, mut errors) = (0, 0);
        let mut cluster_latency = Box::new([0u64; portico_core::stats::BUCKETS.len() + 1]);
        for e in &c.endpoints {
            let mut latency = Box::new([0u64; portico_core::stats::BUCKETS.len() + 1]);
            let (mut n, mut failed) = (0, 0);
            for s in e.stats.slots.iter() {
                n += s.0.by_class.iter().map(|c| c.get()).sum::<u64>();
                failed += s.0.by_class[4].get() + s.0.failures.get();
                s.0.duration.add_counts_to(&mut latency);
            }
            for (total, n) in cluster_latency.iter_mut().zip(latency.iter()) {
                *total += n;
            }
            // A connection that failed before any response is a try with no status: count it as one.
            let tries = n + e.stats.slots.iter().map(|s| s.0.failures.get()).sum::<u64>();
            requests += tries;
            errors += failed;
            out.push(SeriesSample {
                kind: "endpoint",
                name: format!("{}/{}", c.name, e.configured),
                requests: tries,
                errors: failed,
                latency: Some(latency),
            });
        }
        let refused = c.stats.sum(|s| (s.breaker_rejections.get() + s.no_healthy_endpoint.get()) as i64) as u64;
        out.push(SeriesSample {
            kind: "cluster",
            name: c.name.clone(),
            requests: requests + refused,
            errors: errors + refused,
            latency: Some(cluster_latency),
        });
    }
}

/// `/admin/listeners`: each listener's address, protocol and connection-level counters.
pub fn listeners(registry: &Registry, snapshot: &Snapshot) -> serde_json::Value {
    let config = &snapshot.source.config;
    let stats = registry.all_listeners();
    let list: Vec<serde_json::Value> = config
        .listeners
        .iter()
        .map(|l| {
            let s = stats.iter().find(|s| s.listener == l.name);
            let sum = |f: fn(&ListenerSlot) -> u64| -> u64 { s.map_or(0, |s| s.slots.iter().map(|x| f(&x.0)).sum()) };
            serde_json::json!({
                "name": l.name,
                "address": l.address,
                "protocol": format!("{:?}", l.protocol).to_ascii_lowercase(),
                "tls": l.tls.is_some(),
                "tls_handshakes": sum(|x| x.tls_handshakes.get()),
                "tls_failures": sum(|x| x.tls_handshake_failures.get() + x.tls_handshake_timeouts.get()),
                "evicted": sum(|x| x.evictions.get()),
                "panics": sum(|x| x.panics.get()),
                "requests": sum(|x| x.by_class.iter().map(|c| c.get()).sum()),
                "errors": sum(|x| x.by_class[4].get()),
            })
        })
        .collect();
    serde_json::json!({ "listeners": list })
}

/// `/admin/errors`: the last server errors, newest first (sampled: `recent_errors`).
pub fn errors() -> serde_json::Value {
    let list: Vec<serde_json::Value> = crate::recent_errors::recent()
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "at_ms": e.at_ms,
                "status": e.status,
                "reason": e.reason,
                "route": e.route,
                "cluster": e.cluster,
                "endpoint": e.endpoint.map(|a| a.to_string()),
                "method": e.method,
                "path": e.path,
            })
        })
        .collect();
    serde_json::json!({ "errors": list })
}

/// Drains (`drained: true`) or enables an endpoint named by `{"cluster": ..., "endpoint": ...}`.
pub fn set_drained(
    snapshot: &Snapshot,
    args: &serde_json::Value,
    drained: bool,
) -> Result<serde_json::Value, portico_core::view::ActionError> {
    use portico_core::view::ActionError;
    let (Some(cluster), Some(endpoint)) = (args["cluster"].as_str(), args["endpoint"].as_str()) else {
        return Err(ActionError::Invalid(
            "give the endpoint as {\"cluster\": \"NAME\", \"endpoint\": \"ADDRESS\"}, as /admin/clusters names it"
                .into(),
        ));
    };
    let Some(c) = snapshot.clusters.iter().find(|c| c.name == cluster) else {
        return Err(ActionError::NotFound(format!("no cluster {cluster:?} in the running configuration")));
    };
    let Some(e) = c.endpoints.iter().find(|e| e.configured == endpoint) else {
        return Err(ActionError::NotFound(format!("cluster {cluster:?} has no endpoint {endpoint:?}")));
    };
    let changed = e.health.set_drained(drained);
    if changed {
        let what = if drained { "drained" } else { "enabled again" };
        tracing::warn!(cluster, endpoint, "endpoint {what} through the admin API");
    }
    Ok(serde_json::json!({ "cluster": cluster, "endpoint": endpoint, "drained": drained, "changed": changed }))
}
