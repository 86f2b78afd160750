//! The configuration file's shape. Every key is documented, with its default, in docs/configuration.md: keep the
//! two in step. Unknown keys are errors (`deny_unknown_fields`) so that a typo never silently means "default".

use crate::units::{ByteSize, HumanDuration};
use serde::{de, Deserialize, Deserializer};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Worker threads: `auto` (one per core) or a number.
    #[serde(default)]
    pub workers: Workers,
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub clusters: BTreeMap<String, Cluster>,
    #[serde(default)]
    pub shutdown: Shutdown,
    #[serde(default)]
    pub log: Log,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workers {
    #[default]
    Auto,
    Count(usize),
}

impl Workers {
    /// The number of worker threads this setting asks for on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Workers::Count(n) => n,
            Workers::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) if t == "auto" => Ok(Workers::Auto),
            Raw::Number(n) if (1..=1024).contains(&n) => Ok(Workers::Count(n as usize)),
            Raw::Number(n) => Err(de::Error::custom(format!("workers must be between 1 and 1024, got {n}"))),
            Raw::Text(t) => Err(de::Error::custom(format!("workers must be `auto` or a number, got {t:?}"))),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    /// `IP:PORT`, for example `127.0.0.1:8080`, `0.0.0.0:80` or `[::]:8080`.
    pub address: String,
    #[serde(default)]
    pub timeouts: ListenerTimeouts,
    #[serde(default)]
    pub limits: ListenerLimits,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerTimeouts {
    /// Time allowed for a whole request head to arrive once its first byte has (slowloris guard).
    pub header_read: HumanDuration,
    /// How long an idle keep-alive connection waits for its next request.
    pub keepalive: HumanDuration,
    /// Longest pause allowed while reading a request body.
    pub body_read: HumanDuration,
    /// Longest pause allowed while the client is not accepting response bytes.
    pub send: HumanDuration,
}

impl Default for ListenerTimeouts {
    fn default() -> Self {
        ListenerTimeouts {
            header_read: HumanDuration::secs(10),
            keepalive: HumanDuration::secs(60),
            body_read: HumanDuration::secs(60),
            send: HumanDuration::secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerLimits {
    /// Longest request line (method, target, version); longer gets 414.
    pub max_request_line: ByteSize,
    /// Largest request head (request line plus headers); larger gets 431.
    pub max_header_bytes: ByteSize,
    /// Most header fields in one request; more gets 431.
    pub max_headers: usize,
    /// Most open client connections on this listener, shared evenly among workers.
    pub max_connections: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_request_line: ByteSize::kib(8),
            max_header_bytes: ByteSize::kib(32),
            max_headers: 100,
            max_connections: 10_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Optional name, used in logs and (later) metrics. Defaults to `route-N` (its position, from 0).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "match", default)]
    pub matcher: RouteMatch,
    pub cluster: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    /// `example.com` or `*.example.com`; compared without the port, case-insensitively.
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
    /// Header name to exact value; every listed header must be present with that value.
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerKind {
    #[default]
    RoundRobin,
    WeightedRoundRobin,
    Random,
    LeastConnections,
    PowerOfTwoChoices,
    ConsistentHash,
    StickyCookie,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    #[serde(default)]
    pub balancer: BalancerKind,
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub hash: HashConfig,
    #[serde(default)]
    pub sticky: StickyConfig,
    #[serde(default)]
    pub timeouts: UpstreamTimeouts,
    #[serde(default)]
    pub pool: PoolConfig,
    /// Forward the client's `Host` header unchanged (true) or send the endpoint's `host:port` (false).
    #[serde(default = "default_true")]
    pub preserve_host: bool,
    /// How long an endpoint that refused or timed out a connection is skipped by the balancer.
    #[serde(default = "default_fail_timeout")]
    pub fail_timeout: HumanDuration,
}

fn default_true() -> bool {
    true
}

fn default_fail_timeout() -> HumanDuration {
    HumanDuration::secs(10)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// `host:port`, `[ipv6]:port` or `dns-name:port`.
    pub address: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashOn {
    #[default]
    ClientIp,
    Header,
    Cookie,
    Path,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HashConfig {
    /// What `consistent_hash` hashes: `client_ip` (default), `header`, `cookie` or `path`.
    pub key: HashOn,
    /// The header or cookie name, for `key: header` and `key: cookie`.
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StickyConfig {
    pub cookie: String,
    /// `Max-Age` of the cookie; without it the cookie lasts for the browser session.
    pub max_age: Option<HumanDuration>,
}

impl Default for StickyConfig {
    fn default() -> Self {
        StickyConfig { cookie: "portico_sticky".into(), max_age: None }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamTimeouts {
    pub connect: HumanDuration,
    /// From the request's last byte sent to the response head received.
    pub response_header: HumanDuration,
    /// Longest pause while reading a response body from the upstream.
    pub read: HumanDuration,
    /// Longest pause while the upstream is not accepting request bytes.
    pub send: HumanDuration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts {
            connect: HumanDuration::secs(3),
            response_header: HumanDuration::secs(60),
            read: HumanDuration::secs(60),
            send: HumanDuration::secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Idle keep-alive connections kept per endpoint, per worker.
    pub max_idle_per_endpoint: usize,
    /// An idle pooled connection older than this is closed instead of reused.
    pub idle_timeout: HumanDuration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { max_idle_per_endpoint: 64, idle_timeout: HumanDuration::secs(30) }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Shutdown {
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish before the process exits anyway.
    pub grace: HumanDuration,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown { grace: HumanDuration::secs(30) }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// `error`, `warn`, `info`, `debug` or `trace`; `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into() }
    }
}
