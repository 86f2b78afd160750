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
    pub routes: Vec<crate::route::Route>,
    /// Filters run for every route, before the route's own.
    #[serde(default)]
    pub filters: Vec<crate::route::Filter>,
    #[serde(default)]
    pub clusters: BTreeMap<String, Cluster>,
    /// JavaScript functions, by name: route targets (`function: NAME`).
    #[serde(default)]
    pub functions: BTreeMap<String, crate::function::Function>,
    #[serde(default)]
    pub shutdown: Shutdown,
    #[serde(default)]
    pub log: Log,
    /// The admin server: `/metrics`, `/health`, `/ready`, `/admin/...`. Off when absent.
    #[serde(default)]
    pub admin: Option<Admin>,
    /// One line per request. Off when absent.
    #[serde(default)]
    pub access_log: Option<AccessLog>,
    /// Reload when the configuration file changes (checked every second).
    #[serde(default)]
    pub watch: bool,
    /// Started as root: switch to this user (and its primary group, or `group`) once every socket is bound.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    /// `threads` (one process, a thread per worker) or `multi_process` (a master and a process per worker).
    #[serde(default)]
    pub process_model: ProcessModel,
    /// The MQTT broker that serves the listeners with `protocol: mqtt` (docs/mqtt.md).
    #[serde(default)]
    pub mqtt: Mqtt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessModel {
    #[default]
    Threads,
    MultiProcess,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// `IP:PORT`, for example `127.0.0.1:9901`. Keep it on loopback or a private network: it can reload.
    pub address: String,
    /// The bearer token every admin request that changes state must carry (`Authorization: Bearer TOKEN`):
    /// reloads, upgrades, draining endpoints. Without one (and without `token_file`), they need none.
    #[serde(default)]
    pub token: Option<String>,
    /// A file holding the token (relative to the configuration file; one trailing newline is dropped).
    #[serde(default)]
    pub token_file: Option<String>,
}

impl Admin {
    /// The token state-changing requests must carry, read now (`token`, or `token_file`'s content); `Ok(None)`
    /// when none is configured.
    pub fn read_token(&self, loaded: &crate::LoadedConfig) -> Result<Option<String>, String> {
        match (&self.token, &self.token_file) {
            (Some(_), Some(_)) => Err("give `token` or `token_file`, not both".into()),
            (Some(token), None) if token.trim().is_empty() => Err("the admin token is empty".into()),
            (Some(token), None) => Ok(Some(token.clone())),
            (None, Some(file)) => {
                let text = std::fs::read_to_string(loaded.resolve(file))
                    .map_err(|e| format!("cannot read the admin token file {file}: {e}"))?;
                let token = text.strip_suffix('\n').unwrap_or(&text);
                let token = token.strip_suffix('\r').unwrap_or(token);
                if token.trim().is_empty() {
                    return Err(format!("the admin token file {file} is empty"));
                }
                Ok(Some(token.to_string()))
            }
            (None, None) => Ok(None),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    #[default]
    Json,
    Combined,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLog {
    /// A file path (created if missing, appended to; relative to the configuration file's directory), or `-`
    /// for standard output.
    pub path: String,
    #[serde(default)]
    pub format: AccessLogFormat,
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
    // A visitor, so that a refused value is reported at its own position (see units.rs).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Workers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`auto` or a number from 1 to 1024")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Workers, E> {
                match usize::try_from(n) {
                    Ok(n) if (1..=1024).contains(&n) => Ok(Workers::Count(n)),
                    _ => Err(E::custom(format!("workers must be between 1 and 1024, got {n}"))),
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Workers, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Workers, E> {
                match text {
                    "auto" => Ok(Workers::Auto),
                    _ => Err(E::custom(format!("workers must be `auto` or a number, got {text:?}"))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    /// `IP:PORT`, for example `127.0.0.1:8080`, `0.0.0.0:80` or `[::]:8080`.
    pub address: String,
    /// What the listener speaks: `http` (HTTP/1.1 and HTTP/2) or `mqtt` (MQTT 3.1, 3.1.1 and 5.0, served by
    /// the broker configured under `mqtt:`).
    #[serde(default)]
    pub protocol: ListenerProtocol,
    #[serde(default)]
    pub timeouts: ListenerTimeouts,
    #[serde(default)]
    pub limits: ListenerLimits,
    /// Terminate TLS on this listener. Plain HTTP when absent.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub http2: ListenerHttp2,
    /// How request paths are normalised before routing and forwarding.
    #[serde(default)]
    pub paths: crate::route::PathPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    #[default]
    Http,
    Mqtt,
}

/// The MQTT broker (`mqtt:`). Every key has a default; the defaults are those of `portico_mqtt::config`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mqtt {
    /// Where sessions, their subscriptions and queued messages, and retained messages are kept. Absent: in
    /// memory only, gone when the process stops.
    pub persistence: Option<MqttPersistence>,
    pub limits: MqttLimits,
    /// Who may connect.
    pub auth: MqttAuth,
    /// Who may publish and subscribe to what: the first entry that matches decides; none: allowed when the
    /// list is empty, denied otherwise.
    pub acl: Vec<MqttAclEntry>,
    /// How often the broker publishes its figures under `$SYS/broker/...` (Mosquitto's `sys_interval`); `0s`:
    /// never. Whole seconds.
    pub sys_interval: HumanDuration,
    /// The Response Information a v5 client that sets Request Response Information in CONNECT gets in
    /// CONNACK: the base of its response topics. `%c` is replaced by the client id, `%u` by the user name.
    /// Unset (the default): none is sent.
    pub response_information: Option<String>,
}

impl Default for Mqtt {
    fn default() -> Self {
        Mqtt {
            persistence: None,
            limits: MqttLimits::default(),
            auth: MqttAuth::default(),
            acl: Vec::new(),
            sys_interval: HumanDuration::secs(10),
            response_information: None,
        }
    }
}

/// Authentication of MQTT clients (`mqtt.auth`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttAuth {
    /// Clients without a user name (and without a certificate taken as one) may connect. Default: `true`
    /// when there is no `password_file`, `false` when there is one (configuring users means wanting them).
    pub anonymous: Option<bool>,
    /// `user:hash` lines: argon2 (`$argon2id$...`), bcrypt (`$2b$...`) or Mosquitto's `mosquitto_passwd`
    /// (`$7$...` PBKDF2-SHA512, `$6$...` salted SHA-512). Relative paths start at the configuration file's
    /// directory; re-read on every reload.
    pub password_file: Option<String>,
    /// On a TLS listener with `client_ca`: a verified client certificate's CN (or, without one, its first
    /// subject alternative name) is the client's user name, and no password is asked.
    pub use_certificate_as_username: bool,
}

impl MqttAuth {
    /// Whether clients without a user name may connect (the default depends on `password_file`).
    pub fn anonymous_allowed(&self) -> bool {
        self.anonymous.unwrap_or(self.password_file.is_none())
    }
}

/// One entry of `mqtt.acl`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttAclEntry {
    /// A topic filter (`+`, `#`); `%u` is replaced by the client's user name, `%c` by its client id.
    pub topic: String,
    pub access: MqttAccess,
    /// Only for this user name (`*` matches any run of characters).
    #[serde(default)]
    pub user: Option<String>,
    /// Only for this client id (`*` matches any run of characters).
    #[serde(default)]
    pub client_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MqttAccess {
    Read,
    Write,
    Readwrite,
    Deny,
}

/// The broker's store.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttPersistence {
    /// The directory of the store (created if missing; the store is the file `store.redb` in it). Relative
    /// paths start at the configuration file's directory.
    pub path: String,
    /// How long a commit waits for more writes to batch after the first: 0 commits at once (batches still
    /// grow with load, from the writes that arrive during a commit).
    #[serde(default = "default_commit_delay")]
    pub commit_delay: HumanDuration,
    /// fsync every commit: an acknowledged message survives power loss. `false`: it survives `kill -9` of
    /// Portico (the kernel has it), not a power loss.
    #[serde(default = "default_true")]
    pub fsync: bool,
    /// A store that cannot be read: `move_aside` (renamed `store.redb.corrupt-<unix time>`, logged, start
    /// empty) or `fail` (do not start).
    #[serde(default)]
    pub on_corrupt_store: OnCorruptStore,
}

fn default_commit_delay() -> HumanDuration {
    HumanDuration::millis(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCorruptStore {
    #[default]
    MoveAside,
    Fail,
}

/// Limits per MQTT connection and session.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttLimits {
    /// The largest packet, both ways (CONNACK's Maximum Packet Size); a larger one from a client closes its
    /// connection (v5: Packet too large, 0x95), a larger one for a client is not sent to it.
    pub max_packet_size: ByteSize,
    /// QoS 1/2 messages a client may have unacknowledged towards the broker (CONNACK's Receive Maximum).
    pub receive_maximum: u32,
    /// QoS 1/2 messages the broker has unacknowledged towards a client (also capped by the client's own).
    pub max_inflight: u32,
    /// Messages waiting in one session's queue; when full, QoS 0 messages are dropped first, then new ones.
    pub max_queued_messages: usize,
    /// Queue QoS 0 messages for a persistent session whose client is offline.
    pub queue_qos0_offline: bool,
    /// A v5 client asking for a longer keep-alive is told this one (Server Keep Alive). `0s`: no maximum.
    pub max_keepalive: HumanDuration,
    /// The longest a session outlives its connection (caps v5 Session Expiry Interval; v3 persistent
    /// sessions expire after it).
    pub max_session_expiry: HumanDuration,
    /// Topic aliases a v5 client may define towards the broker.
    pub topic_alias_maximum: u32,
    /// Topic aliases the broker defines towards a v5 client at most (also capped by the client's Topic Alias
    /// Maximum); `0`: the broker always sends topic names.
    pub topic_aliases_to_clients: u32,
    /// CONNECT must arrive within this long after the connection opens (after the TLS handshake).
    pub connect_timeout: HumanDuration,
    /// A plain-TCP connection with nothing in progress for this long gives up its task and its registration
    /// with the runtime (it is parked, and woken by its next packet or message). `0s`: never.
    pub park_after: HumanDuration,
}

impl Default for MqttLimits {
    fn default() -> Self {
        MqttLimits {
            max_packet_size: ByteSize(1 << 20),
            receive_maximum: 100,
            max_inflight: 100,
            max_queued_messages: 1000,
            queue_qos0_offline: false,
            max_keepalive: HumanDuration::secs(60),
            max_session_expiry: HumanDuration::secs(7 * 24 * 3600),
            topic_alias_maximum: 32,
            topic_aliases_to_clients: 32,
            connect_timeout: HumanDuration::secs(10),
            park_after: HumanDuration::secs(10),
        }
    }
}

/// HTTP/2 from clients: through ALPN on TLS listeners, by prior knowledge (h2c) on plain ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerHttp2 {
    pub enabled: bool,
    /// Most streams (requests) a client may have open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Flow-control window of each stream: how much of a request body a client may send ahead.
    pub initial_stream_window: ByteSize,
    /// Flow-control window of the whole connection.
    pub initial_connection_window: ByteSize,
    /// Largest header list (HPACK-decoded) accepted in a request.
    pub max_header_list_size: ByteSize,
    /// Largest frame payload Portico accepts.
    pub max_frame_size: ByteSize,
    /// Send a PING this often and close the connection when it is not answered within the interval.
    pub keepalive_interval: Option<HumanDuration>,
}

impl Default for ListenerHttp2 {
    fn default() -> Self {
        ListenerHttp2 {
            enabled: true,
            max_concurrent_streams: 128,
            initial_stream_window: ByteSize(1 << 20),
            initial_connection_window: ByteSize(2 << 20),
            max_header_list_size: ByteSize(32 << 10),
            max_frame_size: ByteSize(16 << 10),
            keepalive_interval: None,
        }
    }
}

/// TLS termination for one listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// Certificate chains and their keys (PEM). The client's SNI name picks the first certificate valid for
    /// it; a client without SNI, or with a name no certificate covers, gets the one marked `default: true`,
    /// or the first.
    pub certificates: Vec<CertificatePair>,
    /// Oldest TLS version accepted: `"1.2"` (default) or `"1.3"`.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// Protocols offered through ALPN, in order of preference. Default: `[h2, http/1.1]`, or `[http/1.1]`
    /// when `http2.enabled` is false.
    #[serde(default)]
    pub alpn: Option<Vec<String>>,
    /// Time allowed for the TLS handshake, counted from the accept.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: HumanDuration,
    /// Verify client certificates against these roots (PEM bundle): mutual TLS.
    #[serde(default)]
    pub client_ca: Option<String>,
    /// With `client_ca`: `required` (default) refuses clients without a valid certificate; `optional` lets
    /// them in but verifies any certificate they present.
    #[serde(default)]
    pub client_auth: Option<ClientAuth>,
    /// Header that carries a verified client certificate's subject to the upstream. Any value the client sent
    /// under this name is removed first.
    #[serde(default = "default_client_cert_header")]
    pub client_cert_header: String,
}

/// One certificate chain (leaf first) and its private key, both PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificatePair {
    /// PEM file with the certificate chain, leaf first. Relative paths start at the configuration file's
    /// directory.
    pub cert: String,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// Serve this certificate to clients without SNI or with a name no certificate covers.
    #[serde(default)]
    pub default: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    #[default]
    Required,
    Optional,
}

fn default_handshake_timeout() -> HumanDuration {
    HumanDuration::secs(10)
}

fn default_client_cert_header() -> String {
    "x-client-cert-subject".into()
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
    /// Waiting for a request body this long before `limits.min_body_rate` is enforced.
    pub body_rate_grace: HumanDuration,
    /// Longest pause allowed while the client is not accepting response bytes.
    pub send: HumanDuration,
}

impl Default for ListenerTimeouts {
    fn default() -> Self {
        ListenerTimeouts {
            header_read: HumanDuration::secs(10),
            keepalive: HumanDuration::secs(60),
            body_read: HumanDuration::secs(60),
            body_rate_grace: HumanDuration::secs(10),
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
    /// Most open client connections on this listener, shared evenly among workers. Unset: derived from the
    /// open-file limit when the process starts (`portico_core::process_setup::derived_connection_limit`).
    pub max_connections: Option<usize>,
    /// Slowest average a request body may arrive at, in bytes a second of waiting for it (time spent waiting
    /// for an upstream to take the body does not count), once `timeouts.body_rate_grace` has passed; a slower
    /// client is answered 408. `0` turns the check off.
    pub min_body_rate: ByteSize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_request_line: ByteSize::kib(8),
            max_header_bytes: ByteSize::kib(32),
            max_headers: 100,
            max_connections: None,
            min_body_rate: ByteSize(256),
        }
    }
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
    /// Active health checks; none when absent.
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    #[serde(default)]
    pub outlier_detection: OutlierDetection,
    #[serde(default)]
    pub circuit_breaker: CircuitBreaker,
    #[serde(default)]
    pub retries: Retries,
    /// When no endpoint is healthy: `false` answers 503, `true` spreads requests over all endpoints anyway.
    #[serde(default)]
    pub panic_mode: bool,
    /// The protocol spoken to the endpoints: `http1` (default) or `h2` (HTTP/2: negotiated through ALPN on
    /// TLS endpoints, by prior knowledge on plain ones).
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    /// TLS to this cluster's endpoints: every endpoint not written `http://...` is reached over TLS. Endpoints
    /// written `https://...` use TLS (with these settings, or the defaults) even without it.
    #[serde(default)]
    pub tls: Option<UpstreamTls>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum UpstreamProtocol {
    #[default]
    #[serde(rename = "http1", alias = "http/1.1")]
    Http1,
    #[serde(rename = "h2", alias = "h2c")]
    H2,
}

/// How Portico opens TLS connections to upstream endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamTls {
    /// PEM bundle of the CAs that may sign the endpoints' certificates. Default: the system's roots.
    pub ca: Option<String>,
    /// The name sent as SNI and verified against the certificate. Default: each endpoint's host.
    pub server_name: Option<String>,
    /// Client certificate chain (PEM) presented to upstreams that ask for one (mutual TLS).
    pub cert: Option<String>,
    /// The client certificate's private key (PEM).
    pub key: Option<String>,
    /// Accept any certificate: no verification at all. For tests only; logged as a warning.
    pub insecure_skip_verify: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckKind {
    #[default]
    Http,
    Tcp,
    /// The gRPC health protocol (`grpc.health.v1.Health/Check` over HTTP/2): healthy when `SERVING`.
    Grpc,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthCheck {
    #[serde(rename = "type")]
    pub kind: HealthCheckKind,
    pub path: String,
    pub method: String,
    /// `Host` header of the probe; the endpoint's `host:port` when absent.
    pub host: Option<String>,
    /// Accepted statuses, `"200-399"` or `"200"`.
    pub expected_status: String,
    /// The response body must contain this text.
    pub body_contains: Option<String>,
    /// For `type: grpc`: the service name asked about (`grpc.health.v1.Health/Check`); empty for the server
    /// as a whole.
    pub grpc_service: String,
    pub interval: HumanDuration,
    pub timeout: HumanDuration,
    pub healthy_after: u32,
    pub unhealthy_after: u32,
}

impl HealthCheck {
    /// The accepted status range: `"200-399"` or a single `"204"`.
    pub fn status_range(&self) -> Option<(u16, u16)> {
        let text = self.expected_status.trim();
        let (lo, hi) = text.split_once('-').unwrap_or((text, text));
        let (lo, hi): (u16, u16) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        ((100..=599).contains(&lo) && (lo..=599).contains(&hi)).then_some((lo, hi))
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: HealthCheckKind::Http,
            path: "/health".into(),
            method: "GET".into(),
            host: None,
            expected_status: "200-399".into(),
            body_contains: None,
            grpc_service: String::new(),
            interval: HumanDuration::secs(5),
            timeout: HumanDuration::secs(2),
            healthy_after: 2,
            unhealthy_after: 3,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutlierDetection {
    /// Connect failures, resets and timeouts in a row (seen by one worker) that eject an endpoint; 0 disables.
    pub consecutive_failures: u32,
    /// 5xx responses in a row (seen by one worker) that eject an endpoint; 0 disables.
    pub consecutive_5xx: u32,
    /// First ejection time; doubles with each further ejection of the same endpoint.
    pub base_ejection: HumanDuration,
    pub max_ejection: HumanDuration,
    /// Never eject more than this share of a cluster's endpoints at once.
    pub max_ejected_percent: u32,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_failures: 3,
            consecutive_5xx: 5,
            base_ejection: HumanDuration::secs(10),
            max_ejection: HumanDuration::secs(300),
            max_ejected_percent: 50,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitBreaker {
    /// Upstream connections open at once (active and idle), across all endpoints.
    pub max_connections: usize,
    /// Requests waiting for an upstream connection.
    pub max_pending: usize,
    /// Requests in flight to the cluster.
    pub max_requests: usize,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker { max_connections: 10_000, max_pending: 1_000, max_requests: 10_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retries {
    /// Retries after the first try (so `attempts: 2` means up to three tries).
    pub attempts: u32,
    /// Statuses that make an idempotent request retry on another endpoint.
    pub on_status: Vec<u16>,
    /// Retry idempotent requests whose upstream timed out before responding.
    pub on_timeout: bool,
    /// Wait before a retry: a random time up to `backoff` doubled per retry, capped at `max_backoff`.
    pub backoff: HumanDuration,
    pub max_backoff: HumanDuration,
    /// Retries in flight may be at most this percentage of the cluster's requests in flight...
    pub budget_percent: u32,
    /// ...but at least this many, so a quiet cluster can still retry.
    pub min_retry_concurrency: u32,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            attempts: 2,
            on_status: Vec::new(),
            on_timeout: false,
            backoff: HumanDuration::millis(25),
            max_backoff: HumanDuration::millis(250),
            budget_percent: 20,
            min_retry_concurrency: 3,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// `host:port`, `[ipv6]:port` or `dns-name:port`, optionally after `http://` or `https://` (then the port
    /// defaults to 80 or 443).
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
    /// An upgraded connection (WebSocket) is closed when no byte has passed either way for this long.
    pub tunnel: HumanDuration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts {
            connect: HumanDuration::secs(3),
            response_header: HumanDuration::secs(60),
            read: HumanDuration::secs(60),
            send: HumanDuration::secs(60),
            tunnel: HumanDuration::secs(3600),
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
    /// Up to this many bodiless GET/OPTIONS requests that one HTTP/1 client connection pipelined (sent before
    /// reading the responses) are written to one upstream connection in one write. Requests of different
    /// clients never share a connection's write. 0 or 1: off.
    pub pipeline_depth: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { max_idle_per_endpoint: 256, idle_timeout: HumanDuration::secs(30), pipeline_depth: 0 }
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
    /// `text` (for people) or `json` (one object per line, for machines).
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into(), format: LogFormat::Text }
    }
}
