//! The immutable view of the configuration that every request reads: routes, clusters with resolved endpoints
//! and their balancers, listener settings. Built and validated completely before it is swapped in, so a reload
//! either applies whole or not at all. State that must outlive a reload (health, ejections, counters) lives in
//! the `Registry` and is looked up by name when a snapshot is built.

use crate::balancer::Balancer;
pub use crate::endpoint::{endpoint_id, Endpoint, EndpointHealth, OutlierLocal, OutlierSettings};
pub use crate::registry::Registry;
use crate::router::Router;
use crate::stats::{ClusterStats, RouteStats};
use portico_config::{ConfigErrors, EndpointScheme, HealthCheck, LoadedConfig};
use portico_core::shared::Padded;
use portico_core::stats;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RetrySettings {
    pub attempts: u32,
    pub on_status: Vec<u16>,
    pub on_timeout: bool,
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub budget_percent: u32,
    pub min_retry_concurrency: u32,
}

#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub response_header_timeout: Duration,
    pub read_timeout: Duration,
    pub send_timeout: Duration,
    /// Idle time after which an upgraded (WebSocket) connection is closed.
    pub tunnel_idle_timeout: Duration,
    /// Speak HTTP/2 to the endpoints (`protocol: h2`).
    pub http2: bool,
    /// The client-certificate headers of every mutual-TLS listener: only Portico may send them upstream, so
    /// they are removed from every request, whichever listener it came through.
    pub reserved_headers: Arc<[Box<str>]>,
    pub max_idle_per_endpoint: usize,
    pub pool_idle_timeout: Duration,
    /// Most requests one client pipelined written together to one upstream connection; 0 or 1: no pipelining.
    pub pipeline_depth: usize,
    pub preserve_host: bool,
    pub outlier: OutlierSettings,
    pub retries: RetrySettings,
    pub panic_mode: bool,
    /// Circuit-breaker limits for one worker: the configured totals divided among workers.
    pub max_connections_per_worker: i64,
    pub max_pending_per_worker: i64,
    pub max_requests_per_worker: i64,
}

#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub endpoints: Vec<Arc<Endpoint>>,
    pub balancer: Balancer,
    pub settings: UpstreamSettings,
    pub health_check: Option<HealthCheck>,
    pub stats: Arc<ClusterStats>,
}

#[derive(Debug, Clone)]
pub struct ListenerSettings {
    pub name: String,
    pub address: SocketAddr,
    pub limits: crate::codec::HeadLimits,
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub body_read_timeout: Duration,
    /// How request bodies must keep coming: `timeouts.body_read`, `limits.min_body_rate` after its grace.
    pub(crate) body_pace: crate::relay::Pace,
    pub send_timeout: Duration,
    /// TLS termination, when configured.
    pub tls: Option<Arc<portico_core::tls::TlsTerminator>>,
    /// HTTP/2 from clients, unless disabled.
    pub http2: Option<Http2Settings>,
    /// How request paths are normalised.
    pub paths: crate::path::NormalizeOptions,
    pub stats: Arc<stats::ListenerStats>,
    /// Its place in `Snapshot::listeners`: what a request carries to be counted for its listener
    /// (`outcome::record`) without looking the listener up by name again.
    pub index: usize,
    /// A `limits` filter caps connections per client address: count each connection's address (`clients`).
    pub counts_clients: bool,
    /// The top-level `limits` filter's cap on slow connections, applied while heads arrive.
    pub slow_cap: Option<Arc<crate::filters::SlowCap>>,
}

/// The HTTP/2 server's settings for one listener (validated ranges, so the casts cannot truncate).
#[derive(Debug, Clone)]
pub struct Http2Settings {
    pub max_concurrent_streams: u32,
    pub initial_stream_window: u32,
    pub initial_connection_window: u32,
    pub max_header_list_size: u32,
    pub max_frame_size: u32,
    pub keepalive_interval: Option<Duration>,
}

#[derive(Debug)]
pub struct Snapshot {
    pub router: Router,
    pub clusters: Vec<Cluster>,
    pub listeners: Vec<ListenerSettings>,
    pub workers: usize,
    pub shutdown_grace: Duration,
    /// Stats for requests no route matched.
    pub unrouted: Arc<RouteStats>,
    /// Some cluster speaks HTTP/2 to its endpoints: HTTP/2 requests are routed before they are bridged.
    pub h2_upstreams: bool,
    /// The configuration this snapshot was built from (for `/admin/config`).
    pub source: Arc<LoadedConfig>,
}

impl Snapshot {
    /// Forgets the health of endpoints that are not in this snapshot, so an endpoint removed and added back
    /// later starts healthy, as a new one does. Requests still running on an older snapshot keep theirs.
    pub fn prune_health(&self, registry: &Registry) {
        registry.retain_health(|cluster, addr| {
            self.clusters.iter().any(|c| c.name == cluster && c.endpoints.iter().any(|e| e.addr == addr))
        });
    }

    pub fn listener(&self, name: &str) -> Option<&ListenerSettings> {
        self.listeners.iter().find(|l| l.name == name)
    }
}

/// Builds the snapshot of a configuration read with `portico_config::check_file` or `check_str`, with every
/// problem at once: when the file has problems, what could be read of it is built all the same, for the ones
/// only building finds (certificate, key and CA files, path patterns and templates, static files, DNS names), and
/// all of them are returned in file order. That build uses a registry of its own, so the running one (on a
/// reload) learns no names from a configuration that is refused.
pub fn build_checked(checked: portico_config::Checked, registry: &Registry) -> Result<Snapshot, ConfigErrors> {
    let portico_config::Checked { partial, mut problems, .. } = checked;
    match partial {
        Some(loaded) if problems.is_empty() => return build(&loaded, registry),
        Some(partial) => {
            if let Err(more) = build(&partial, &Registry::new(registry.workers)) {
                // A value already reported is not reported again for what building makes of it.
                let reported: std::collections::HashSet<(usize, usize)> =
                    problems.iter().map(|d| (d.line, d.col)).collect();
                problems.extend(more.0.into_iter().filter(|d| !reported.contains(&(d.line, d.col))));
            }
        }
        None => {}
    }
    problems.sort_by_key(|d| (d.line, d.col));
    Err(ConfigErrors(problems))
}

/// Builds a snapshot from a validated configuration, resolving DNS names. Blocking (DNS): call it from a
/// thread that serves no connections (start-up, the reload thread).
pub fn build(loaded: &LoadedConfig, registry: &Registry) -> Result<Snapshot, ConfigErrors> {
    let workers = registry.workers;
    let cfg = &loaded.config;
    let mut problems = Vec::new();
    let mut cluster_index = HashMap::new();
    let reserved_headers: Arc<[Box<str>]> = cfg
        .listeners
        .iter()
        .filter_map(|l| l.tls.as_ref().filter(|t| t.client_ca.is_some()))
        .map(|t| t.client_cert_header.to_ascii_lowercase().into_boxed_str())
        .collect();
    let mut clusters = Vec::with_capacity(cfg.clusters.len());
    for (name, c) in &cfg.clusters {
        let mut endpoints = Vec::with_capacity(c.endpoints.len());
        let mut connector = None;
        for (j, e) in c.endpoints.iter().enumerate() {
            let path = format!("clusters.{name}.endpoints[{j}].address");
            let (scheme, hp) = match portico_config::parse_endpoint(&e.address) {
                Ok(parsed) => parsed,
                Err(msg) => {
                    problems.push(loaded.diagnostic(
                        &path,
                        msg,
                        Some("write host:port, [ipv6]:port or dns-name:port".into()),
                    ));
                    continue;
                }
            };
            let addr = match hp.ip {
                Some(ip) => SocketAddr::new(ip, hp.port),
                None => match (hp.host.as_str(), hp.port).to_socket_addrs().map(|mut a| a.next()) {
                    Ok(Some(a)) => a,
                    Ok(None) | Err(_) => {
                        problems.push(loaded.diagnostic(
                            &path,
                            format!("cannot resolve {:?}", hp.host),
                            Some("check the name, or write an IP address".into()),
                        ));
                        continue;
                    }
                },
            };
            let uses_tls = match scheme {
                EndpointScheme::Https => true,
                EndpointScheme::Http => false,
                EndpointScheme::Unspecified => c.tls.is_some(),
            };
            let tls = if uses_tls {
                // Built once per cluster; a failure is reported once, not once per endpoint.
                let built = connector.get_or_insert_with(|| {
                    crate::upstream_tls::client_config(loaded, name, c.tls.as_ref(), c.protocol).map_err(|found| {
                        for (path, message, hint) in found {
                            problems.push(loaded.diagnostic(&path, message, hint));
                        }
                    })
                });
                let Ok(connector) = built.clone() else { continue };
                let configured_name = c.tls.as_ref().and_then(|t| t.server_name.as_deref());
                match crate::upstream_tls::server_name(configured_name, &hp.host) {
                    Ok(server_name) => Some(crate::upstream_tls::EndpointTls { connector, server_name }),
                    Err(message) => {
                        problems.push(loaded.diagnostic(&format!("clusters.{name}.tls.server_name"), message, None));
                        continue;
                    }
                }
            } else {
                None
            };
            endpoints.push(Arc::new(Endpoint {
                tls,
                tls_warned_ms: AtomicU64::new(0),
                configured: e.address.clone(),
                addr,
                authority: hp.authority(),
                weight: e.weight,
                id: endpoint_id(&e.address),
                health: registry.health(name, addr),
                stats: registry.endpoint_stats(name, &e.address),
                inflight: (0..workers).map(|_| Padded::default()).collect(),
                outlier: stats::slots(workers),
            }));
        }
        let per_worker = |total: usize| total.div_ceil(workers) as i64;
        let r = &c.retries;
        let settings = UpstreamSettings {
            connect_timeout: c.timeouts.connect.0,
            response_header_timeout: c.timeouts.response_header.0,
            read_timeout: c.timeouts.read.0,
            send_timeout: c.timeouts.send.0,
            tunnel_idle_timeout: c.timeouts.tunnel.0,
            http2: c.protocol == portico_config::UpstreamProtocol::H2,
            reserved_headers: reserved_headers.clone(),
            max_idle_per_endpoint: c.pool.max_idle_per_endpoint,
            pool_idle_timeout: c.pool.idle_timeout.0,
            pipeline_depth: c.pool.pipeline_depth,
            preserve_host: c.preserve_host,
            outlier: (&c.outlier_detection).into(),
            retries: RetrySettings {
                attempts: r.attempts,
                on_status: r.on_status.clone(),
                on_timeout: r.on_timeout,
                backoff: r.backoff.0,
                max_backoff: r.max_backoff.0,
                budget_percent: r.budget_percent,
                min_retry_concurrency: r.min_retry_concurrency,
            },
            panic_mode: c.panic_mode,
            max_connections_per_worker: per_worker(c.circuit_breaker.max_connections),
            max_pending_per_worker: per_worker(c.circuit_breaker.max_pending),
            max_requests_per_worker: per_worker(c.circuit_breaker.max_requests),
        };
        let balancer = Balancer::new(c, &endpoints, workers);
        cluster_index.insert(name.clone(), clusters.len());
        clusters.push(Cluster {
            name: name.clone(),
            endpoints,
            balancer,
            settings,
            health_check: c.health_check.clone(),
            stats: registry.cluster_stats(name),
        });
    }
    let tls_ports: Vec<u16> = cfg
        .listeners
        .iter()
        .filter(|l| l.tls.is_some())
        .filter_map(|l| l.address.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .collect();
    let https_port = if tls_ports.len() == 1 { tls_ports[0] } else { 443 };
    let mut route_problems = Vec::new();
    let router = Router::build(loaded, &cluster_index, registry, https_port, &mut route_problems);
    for (path, message, hint) in route_problems {
        problems.push(loaded.diagnostic(&path, message, hint));
    }
    let all_filters = || cfg.filters.iter().chain(cfg.routes.iter().flat_map(|r| r.filters.iter()));
    let counts_clients =
        all_filters().any(|f| matches!(f, portico_config::Filter::Limits(l) if l.counts_connections()));
    // Refusals made before any route is known are counted under `route=""`.
    let slow_cap = cfg.filters.iter().find_map(|f| match f {
        portico_config::Filter::Limits(l) => crate::filters::SlowCap::of(l, (*registry.denials("")).clone()),
        _ => None,
    });
    let deriving = cfg.listeners.iter().filter(|l| l.limits.max_connections.is_none()).count();
    let derived_connections = portico_core::process_setup::derived_connection_limit(deriving);
    let mut listeners = cfg
        .listeners
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            // Certificates first: their problems are worth knowing even when the address is wrong too.
            let tls = match l.tls.as_ref().map(|t| portico_core::tls::build_terminator(loaded, i, l, t)) {
                None => None,
                Some(Ok(t)) => Some(Arc::new(t)),
                Some(Err(found)) => {
                    for (path, message, hint) in found {
                        problems.push(loaded.diagnostic(&path, message, hint));
                    }
                    return None;
                }
            };
            let address = l.address.parse().ok()?;
            Some(ListenerSettings {
                name: l.name.clone(),
                address,
                limits: crate::codec::HeadLimits {
                    max_request_line: l.limits.max_request_line.as_usize(),
                    max_header_bytes: l.limits.max_header_bytes.as_usize(),
                    max_headers: l.limits.max_headers,
                },
                max_connections: l.limits.max_connections.unwrap_or(derived_connections),
                paths: crate::path::NormalizeOptions {
                    merge_slashes: l.paths.merge_slashes,
                    encoded_slashes: match l.paths.encoded_slashes {
                        portico_config::EncodedSlashes::Reject => crate::path::EncodedSlashes::Reject,
                        portico_config::EncodedSlashes::Keep => crate::path::EncodedSlashes::Keep,
                        portico_config::EncodedSlashes::Decode => crate::path::EncodedSlashes::Decode,
                    },
                },
                header_read_timeout: l.timeouts.header_read.0,
                keepalive_timeout: l.timeouts.keepalive.0,
                body_read_timeout: l.timeouts.body_read.0,
                body_pace: crate::relay::Pace::request(
                    l.timeouts.body_read.0,
                    l.limits.min_body_rate.0,
                    l.timeouts.body_rate_grace.0,
                ),
                send_timeout: l.timeouts.send.0,
                tls,
                http2: l.http2.enabled.then(|| Http2Settings {
                    max_concurrent_streams: l.http2.max_concurrent_streams,
                    initial_stream_window: l.http2.initial_stream_window.0 as u32,
                    initial_connection_window: l.http2.initial_connection_window.0 as u32,
                    max_header_list_size: l.http2.max_header_list_size.0 as u32,
                    max_frame_size: l.http2.max_frame_size.0 as u32,
                    keepalive_interval: l.http2.keepalive_interval.map(|d| d.0),
                }),
                stats: registry.listener_stats(&l.name),
                index: 0, // set below, once the listeners that could not be built are left out
                counts_clients,
                slow_cap: slow_cap.clone(),
            })
        })
        .collect::<Vec<_>>();
    for (index, l) in listeners.iter_mut().enumerate() {
        l.index = index;
    }
    if !problems.is_empty() {
        problems.sort_by_key(|d| (d.line, d.col));
        return Err(ConfigErrors(problems));
    }
    Ok(Snapshot {
        h2_upstreams: clusters.iter().any(|c| c.settings.http2),
        router,
        clusters,
        listeners,
        workers,
        shutdown_grace: cfg.shutdown.grace.0,
        unrouted: registry.route_stats("none", "none"),
        source: Arc::new(loaded.clone()),
    })
}
