//! What the broker is told when it opens: limits, keep-alive and session bounds, and where (whether) it
//! persists. The gateway's config layer (the `mqtt:` section of the YAML file) fills this in; every field
//! has a named default with its reason.

use std::path::PathBuf;
use std::time::Duration;

/// 1 MiB: large enough for the payloads MQTT is used for (telemetry, commands, small files), small enough that
/// a client cannot make the broker buffer hundreds of MiB per connection.
pub const DEFAULT_MAX_PACKET_SIZE: u32 = 1024 * 1024;
/// Mosquitto's and EMQX's default in-flight window per client; enough to keep a LAN link busy.
pub const DEFAULT_RECEIVE_MAXIMUM: u16 = 100;
/// Mosquitto's `max_queued_messages` default.
pub const DEFAULT_MAX_QUEUED_MESSAGES: usize = 1000;
/// The issue's `max_keepalive: 60s`: a v5 client asking for more is told 60 (Server Keep Alive).
pub const DEFAULT_MAX_KEEPALIVE: u16 = 60;
/// A week: a device offline for a weekend gets its messages; a client that never returns does not hold its
/// queue forever.
pub const DEFAULT_MAX_SESSION_EXPIRY: u32 = 7 * 24 * 3600;
/// Topic aliases a v5 client may use towards the broker; each costs one topic string per connection.
pub const DEFAULT_TOPIC_ALIAS_MAXIMUM: u16 = 32;
/// A connection that has not sent CONNECT by then is closed (a slowloris guard).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle plain-TCP connection gives up its task and its registration with the runtime after this long
/// without traffic (see [`crate::park`]): longer than the pauses of a chatty client, short enough that a fleet of
/// quiet devices costs little.
pub const DEFAULT_PARK_AFTER: Duration = Duration::from_secs(10);
/// Mosquitto's `sys_interval` default: `$SYS/broker/...` every 10 seconds.
pub const DEFAULT_SYS_INTERVAL: Duration = Duration::from_secs(10);

/// The broker's configuration.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// `None`: sessions and retained messages live in memory only and die with the process.
    pub persistence: Option<PersistenceConfig>,
    pub limits: Limits,
    /// Who may connect, publish and subscribe (default: anyone, anything).
    pub auth: crate::auth::Auth,
    /// How often `$SYS/broker/...` is published ([`crate::sys`]); zero: never.
    pub sys_interval: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            persistence: None,
            limits: Limits::default(),
            auth: crate::auth::Auth::default(),
            sys_interval: DEFAULT_SYS_INTERVAL,
        }
    }
}

/// Limits per connection and session.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest packet accepted from a client (CONNACK's Maximum Packet Size); larger ones close the
    /// connection with Packet too large (0x95).
    pub max_packet_size: u32,
    /// QoS 1 and 2 PUBLISHes a client may have unacknowledged towards the broker (CONNACK's Receive Maximum);
    /// one more closes the connection with Receive Maximum exceeded (0x93) in v5.
    pub receive_maximum: u16,
    /// QoS 1 and 2 PUBLISHes the broker has unacknowledged towards a client at most, whatever the client's
    /// own Receive Maximum.
    pub max_inflight: u16,
    /// Messages waiting in a session's queue (not yet sent) at most. When full, a new QoS 0 message is
    /// dropped, else the oldest queued QoS 0 message makes room, else the new message is dropped; each drop
    /// is counted (`portico_mqtt_messages_dropped_total`). The publisher's acknowledgement does not wait for
    /// slow subscribers.
    pub max_queued_messages: usize,
    /// Seconds; a v5 client asking for a longer (non-zero) Keep Alive is told this one (Server Keep Alive).
    /// 0 in CONNECT (keep-alive off) is honoured.
    pub max_keepalive: u16,
    /// Seconds a session may outlive its connection at most (v5 Session Expiry Interval is capped to it and
    /// the client told; a v3 persistent session, which never expires by the specification, expires after it).
    pub max_session_expiry: u32,
    /// Topic aliases a v5 client may define towards the broker (CONNACK's Topic Alias Maximum).
    pub topic_alias_maximum: u16,
    /// Topic aliases the broker defines towards a v5 client at most, within the client's own Topic Alias
    /// Maximum (see [`crate::alias`]); 0: none.
    pub topic_aliases_to_clients: u16,
    /// CONNACK's Response Information for a v5 client that requests it (`%c`: client id, `%u`: user name);
    /// `None`: not sent.
    pub response_information: Option<String>,
    /// Whether QoS 0 messages are queued for an offline session (Mosquitto's `queue_qos0_messages`).
    pub queue_qos0_offline: bool,
    pub connect_timeout: Duration,
    /// A plain-TCP connection with nothing in progress for this long is parked (see [`crate::park`]);
    /// zero: never.
    pub park_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_packet_size: DEFAULT_MAX_PACKET_SIZE,
            receive_maximum: DEFAULT_RECEIVE_MAXIMUM,
            max_inflight: DEFAULT_RECEIVE_MAXIMUM,
            max_queued_messages: DEFAULT_MAX_QUEUED_MESSAGES,
            max_keepalive: DEFAULT_MAX_KEEPALIVE,
            max_session_expiry: DEFAULT_MAX_SESSION_EXPIRY,
            topic_alias_maximum: DEFAULT_TOPIC_ALIAS_MAXIMUM,
            topic_aliases_to_clients: DEFAULT_TOPIC_ALIAS_MAXIMUM,
            response_information: None,
            queue_qos0_offline: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            park_after: DEFAULT_PARK_AFTER,
        }
    }
}

/// Where and how sessions and retained messages are persisted.
#[derive(Clone, Debug)]
pub struct PersistenceConfig {
    /// The store file (a redb database); its directory is created if missing.
    pub path: PathBuf,
    /// How long the store waits after the first write of a batch for more before committing. 0 (the
    /// default) commits at once: writes arriving during a commit's fsync form the next batch, so batches
    /// grow with load by themselves. A longer window trades each acknowledgement's latency for fewer fsyncs.
    pub commit_delay: Duration,
    /// Whether each commit is fsynced. `true` (the default) is the contract "every PUBACK/PUBREC survives
    /// kill -9 and power loss"; `false` survives kill -9 of the broker (the OS has the pages) but not a
    /// power loss, for far less latency.
    pub fsync: bool,
    pub on_corrupt: OnCorruptStore,
    /// When another process holds the store (the process this one replaces in an upgrade), open the broker
    /// without it and wait for the store: MQTT connections wait before CONNECT until it is open (see
    /// [`crate::Broker::ready`]).
    pub wait_if_locked: bool,
}

impl PersistenceConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PersistenceConfig {
            path: path.into(),
            commit_delay: Duration::ZERO,
            fsync: true,
            on_corrupt: OnCorruptStore::MoveAside,
            wait_if_locked: false,
        }
    }
}

/// What opening a store that cannot be read does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnCorruptStore {
    /// Log an error, rename the file to `<name>.corrupt-<unix seconds>` and start with an empty store.
    #[default]
    MoveAside,
    /// Refuse to open (the broker does not start).
    Fail,
}
