//! The immutable view of the configuration that every request reads: routes, clusters with resolved endpoints
//! and their balancers, listener settings. Built and validated completely before it is swapped in, so a reload
//! either applies whole or not at all.

use crate::balancer::Balancer;
use crate::router::Router;
use portico_config::{ConfigErrors, LoadedConfig};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A value alone on its cache line, so per-worker slots written by different threads never share one.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// Milliseconds since the process started: a cheap clock for health deadlines stored in atomics.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Health of one upstream address, shared by all workers and kept across reloads while the address stays.
#[derive(Debug, Default)]
pub struct EndpointHealth {
    /// The endpoint is skipped by balancers until this time (`now_ms`), after a failed connection.
    down_until_ms: AtomicU64,
}

impl EndpointHealth {
    pub fn is_up(&self, now: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) <= now
    }
    /// Marks the endpoint down for `d`; returns true when it was up before (to log the transition once).
    pub fn mark_down(&self, d: Duration) -> bool {
        let now = now_ms();
        let prev = self.down_until_ms.swap(now + d.as_millis() as u64, Ordering::Relaxed);
        prev <= now
    }
    pub fn mark_up(&self) {
        if self.down_until_ms.load(Ordering::Relaxed) != 0 {
            self.down_until_ms.store(0, Ordering::Relaxed);
        }
    }
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
    /// In-flight requests, one slot per worker: each worker writes only its own.
    inflight: Box<[Padded<AtomicU32>]>,
}

impl Endpoint {
    pub fn inflight(&self) -> u64 {
        self.inflight.iter().map(|c| u64::from(c.0.load(Ordering::Relaxed))).sum()
    }
    pub fn begin(&self, worker: usize) {
        if let Some(c) = self.inflight.get(worker) {
            c.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    pub fn end(&self, worker: usize) {
        if let Some(c) = self.inflight.get(worker) {
            c.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub response_header_timeout: Duration,
    pub read_timeout: Duration,
    pub send_timeout: Duration,
    pub max_idle_per_endpoint: usize,
    pub pool_idle_timeout: Duration,
    pub preserve_host: bool,
    pub fail_timeout: Duration,
}

#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub endpoints: Vec<Arc<Endpoint>>,
    pub balancer: Balancer,
    pub settings: UpstreamSettings,
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
    pub send_timeout: Duration,
}

#[derive(Debug)]
pub struct Snapshot {
    pub router: Router,
    pub clusters: Vec<Cluster>,
    pub listeners: Vec<ListenerSettings>,
    pub workers: usize,
    pub shutdown_grace: Duration,
}

impl Snapshot {
    pub fn listener(&self, name: &str) -> Option<&ListenerSettings> {
        self.listeners.iter().find(|l| l.name == name)
    }
}

/// Health state by address, so that a reload keeps what it knows about endpoints that stay.
#[derive(Default)]
pub struct HealthRegistry {
    by_addr: Mutex<HashMap<SocketAddr, Arc<EndpointHealth>>>,
}

impl HealthRegistry {
    fn get(&self, addr: SocketAddr) -> Arc<EndpointHealth> {
        let mut map = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(addr).or_default().clone()
    }
}

pub fn endpoint_id(configured: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(configured.as_bytes())
}

/// Builds a snapshot from a validated configuration, resolving DNS names. Blocking (DNS): call it from a
/// thread that serves no connections (start-up, the reload thread).
pub fn build(loaded: &LoadedConfig, workers: usize, health: &HealthRegistry) -> Result<Snapshot, ConfigErrors> {
    let cfg = &loaded.config;
    let mut problems = Vec::new();
    let mut cluster_index = HashMap::new();
    let mut clusters = Vec::with_capacity(cfg.clusters.len());
    for (name, c) in &cfg.clusters {
        let mut endpoints = Vec::with_capacity(c.endpoints.len());
        for (j, e) in c.endpoints.iter().enumerate() {
            let path = format!("clusters.{name}.endpoints[{j}].address");
            let hp = match portico_config::parse_host_port(&e.address) {
                Ok(hp) => hp,
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
            endpoints.push(Arc::new(Endpoint {
                configured: e.address.clone(),
                addr,
                authority: hp.authority(),
                weight: e.weight,
                id: endpoint_id(&e.address),
                health: health.get(addr),
                inflight: (0..workers).map(|_| Padded::default()).collect(),
            }));
        }
        let settings = UpstreamSettings {
            connect_timeout: c.timeouts.connect.0,
            response_header_timeout: c.timeouts.response_header.0,
            read_timeout: c.timeouts.read.0,
            send_timeout: c.timeouts.send.0,
            max_idle_per_endpoint: c.pool.max_idle_per_endpoint,
            pool_idle_timeout: c.pool.idle_timeout.0,
            preserve_host: c.preserve_host,
            fail_timeout: c.fail_timeout.0,
        };
        let balancer = Balancer::new(c, &endpoints, workers);
        cluster_index.insert(name.clone(), clusters.len());
        clusters.push(Cluster { name: name.clone(), endpoints, balancer, settings });
    }
    let router = Router::build(&cfg.routes, &cluster_index);
    let listeners = cfg
        .listeners
        .iter()
        .filter_map(|l| {
            let address = l.address.parse().ok()?;
            Some(ListenerSettings {
                name: l.name.clone(),
                address,
                limits: crate::codec::HeadLimits {
                    max_request_line: l.limits.max_request_line.as_usize(),
                    max_header_bytes: l.limits.max_header_bytes.as_usize(),
                    max_headers: l.limits.max_headers,
                },
                max_connections: l.limits.max_connections,
                header_read_timeout: l.timeouts.header_read.0,
                keepalive_timeout: l.timeouts.keepalive.0,
                body_read_timeout: l.timeouts.body_read.0,
                send_timeout: l.timeouts.send.0,
            })
        })
        .collect();
    if !problems.is_empty() {
        return Err(ConfigErrors(problems));
    }
    Ok(Snapshot { router, clusters, listeners, workers, shutdown_grace: cfg.shutdown.grace.0 })
}
