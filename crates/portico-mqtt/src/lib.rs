//! Portico's MQTT plane: an MQTT 3.1, 3.1.1 and 5.0 broker as a library that the gateway's workers drive.
//!
//! - [`codec`]: every control packet, decoded incrementally from a `BytesMut` with the specification's
//!   normative rules enforced, encoded for any of the three versions.
//! - [`topic`] and [`router`]: topic names and filters, and the subscription trie (wildcards, `$`-topics,
//!   shared subscriptions, subscription options and identifiers).
//! - [`session`]: a client's session, its QoS 1/2 state both ways, in-flight window and queue.
//! - [`retained`]: retained messages.
//! - [`sys`]: `$SYS/broker/...`, the broker's figures under Mosquitto's names.
//! - [`store`]: persistence in an embedded redb file, with group commit.
//! - [`broker`]: the shared state and the operations on it; [`connection`]: the driver that serves one
//!   connection; [`server`]: a small multi-worker TCP server for tests and standalone use.
//!
//! # Design for many cores
//!
//! Each worker thread runs its connections on its own current-thread tokio runtime; [`serve`] needs no
//! `Send` future. A message published on one worker reaches a subscriber on another through that
//! subscriber's session queue: the publisher's task locks the destination session (a mutex per session,
//! held for a push), appends an `Arc<Message>` and wakes the destination connection's task (its waker, kept
//! in the session; a wake-up works across runtimes, and wake-ups before the connection looks cost a test).
//! That is one hand-off per destination session, and the payload is never copied past the read: the `Bytes`
//! the codec sliced out of the publisher's read buffer is shared by the retained table, every subscriber's
//! queue and the store's writer, and copied only into each subscriber's socket write buffer.
//!
//! An idle connection keeps no buffer: reads go into the worker's scratch buffer and are copied into one of
//! their size, the write buffer is the worker's, lent while bytes are written (see [`connection`]).
//! The router is read-mostly behind one `RwLock` (see [`router`] for why); the session table is a mutex taken
//! on connect and disconnect only. Counters are per worker ([`metrics`]).
//!
//! # Wiring
//!
//! The gateway uses the crate through [`plane`]: [`plane::MqttPlane`] (the `Plane` whose workers serve the
//! listeners with `protocol: mqtt`), [`plane::MqttView`] (its metrics and `/admin/mqtt`), and
//! [`plane::broker_config`] / [`plane::reload`] (the `mqtt:` section). Underneath, what a listener calls:
//!
//! 1. **Once per process, at start-up:** [`Broker::open`]`(config: BrokerConfig) -> Result<Broker, BrokerError>`.
//!    It opens the store (if `persistence` is set), reads back sessions, their subscriptions, queued and
//!    in-flight messages and retained messages, and starts two threads: the store's writer
//!    (`portico-mqtt-store`) and the timers of will delays and session expiries (`portico-mqtt-timers`).
//!    [`Broker`] is `Clone + Send + Sync` (an `Arc`): give a clone to every worker. A damaged store file is
//!    moved aside and reported (`error!`), unless `on_corrupt_store: fail`, when `open` returns
//!    [`BrokerError::Store`] and the process should not start.
//! 2. **Per accepted connection, on the worker that accepted it:**
//!    [`serve_until`]`(stream, peer: SocketAddr, &broker, worker_index: usize, shutdown).await` (or [`serve`],
//!    which never drains), spawned with `tokio::task::spawn_local` on the worker's current-thread runtime (the
//!    future is not required to be `Send`). `stream` is any `AsyncRead + AsyncWrite + Unpin`: the TCP stream,
//!    the TLS stream after the handshake, or a WebSocket adapter carrying binary frames as bytes.
//!    `worker_index` picks the metrics slot. When `shutdown` completes the connection is drained: committed
//!    acknowledgements written, DISCONNECT Server shutting down (0x8B) to a v5 client, closed. The gateway
//!    passes no shutdown future (an idle connection would keep one) and calls [`Broker::drain`] instead, which
//!    drains every connection through its session's wake-up. It returns when
//!    the connection ends; the `Result` ([`ConnectionError`]) is for logging only, everything has already been
//!    answered and cleaned up.
//! 3. **On a reload:** [`Broker::set_limits`]: connections accepted afterwards get the new limits;
//!    [`Broker::set_sys_interval`].
//! 4. **On a metrics scrape:** [`Broker::render_metrics`]`(&mut String)` appends the Prometheus text below.
//!
//! [`Server`] is the same thing with its own threads and listener, for tests and a standalone broker; the
//! gateway does not use it.
//!
//! ## Configuration
//!
//! The `mqtt:` section of the YAML file (`portico_config::Mqtt`) maps onto [`BrokerConfig`] one key per field
//! ([`plane::broker_config`]); defaults are the `DEFAULT_*` constants of [`config`] (a test checks the
//! configuration layer's are the same):
//!
//! ```yaml
//! mqtt:
//!   persistence:                   # absent: sessions and retained messages in memory only
//!     path: data/mqtt              # a directory (created if missing): PersistenceConfig::path is data/mqtt/store.redb
//!     commit_delay: 0ms            # extra wait for a fuller group commit (0: commit at once; batches grow with load)
//!     fsync: true                  # false: survives kill -9, not power loss
//!     on_corrupt_store: move_aside # or: fail
//!   limits:
//!     max_packet_size: 1MiB        # both ways: CONNACK Maximum Packet Size; larger -> DISCONNECT 0x95
//!     receive_maximum: 100         # client -> broker QoS 1/2 in flight (CONNACK Receive Maximum)
//!     max_inflight: 100            # broker -> client QoS 1/2 in flight (also capped by the client's Receive Maximum)
//!     max_queued_messages: 1000    # per session, not yet sent; full: drop QoS 0 first, then the new message
//!     queue_qos0_offline: false    # queue QoS 0 for offline persistent sessions
//!     max_keepalive: 60s           # v5 clients asking more get Server Keep Alive; 0 (off) is honoured
//!     max_session_expiry: 7d       # caps v5 Session Expiry Interval and v3 clean_session=0 sessions
//!     topic_alias_maximum: 32      # aliases a v5 client may define
//!     connect_timeout: 10s         # CONNECT must arrive within it
//!   sys_interval: 10s              # $SYS/broker/... every 10 s; 0s: never
//! ```
//!
//! ## Metrics
//!
//! Counters per worker, summed at scrape; sizes read from the structures at scrape.
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `portico_mqtt_connections_total` | counter | connections accepted |
//! | `portico_mqtt_connections` | gauge | connections past CONNECT |
//! | `portico_mqtt_connections_parked` | gauge | of those, idle ones parked off their tasks ([`park`]) |
//! | `portico_mqtt_connect_refused_total` | counter | CONNECTs refused (client id, auth method, will format) |
//! | `portico_mqtt_sessions` | gauge | sessions, connected or not |
//! | `portico_mqtt_subscriptions` | gauge | subscriptions in the router |
//! | `portico_mqtt_retained_messages` | gauge | retained messages |
//! | `portico_mqtt_messages_received_total{qos}` | counter | PUBLISH received from clients |
//! | `portico_mqtt_messages_sent_total{qos}` | counter | PUBLISH sent to clients, redeliveries included |
//! | `portico_mqtt_messages_dropped_total{reason}` | counter | `queue_full`, `offline_qos0`, `too_large` |
//! | `portico_mqtt_inflight_messages` | gauge | QoS 1/2 sent, not yet acknowledged |
//! | `portico_mqtt_queued_messages` | gauge | waiting in session queues |
//! | `portico_mqtt_auth_failures_total` | counter | CONNECTs refused for a bad user name or password, or none where needed |
//! | `portico_mqtt_acl_denied_total{operation}` | counter | `publish` / `subscribe` refused by the ACL (and publishes to `$SYS`) |
//! | `portico_mqtt_protocol_errors_total` | counter | connections closed for a malformed packet or protocol error |
//! | `portico_mqtt_keepalive_timeouts_total` | counter | connections closed by keep-alive |
//! | `portico_mqtt_takeovers_total` | counter | connections closed by a session takeover |
//! | `portico_mqtt_wills_published_total` | counter | wills published |
//! | `portico_mqtt_store_commits_total` | counter | store transactions (group commits) |
//! | `portico_mqtt_store_operations_total` | counter | store writes (operations / commits = batch size) |
//! | `portico_mqtt_store_commit_seconds_total` | counter | time in commits (/ commits = mean commit latency) |
//! | `portico_mqtt_store_errors_total` | counter | failed commits |
//! | `portico_mqtt_store_bytes` | gauge | size of the store file |
//!
//! # Why a codec of our own
//!
//! The project prefers a well-kept crate made for the job. The candidates, read before writing this one:
//!
//! - **rumqttc's `mqttbytes`** (also republished as `mqtt-bytes-v5`): separate v4 and v5 packet types; a
//!   PUBLISH topic kept as unchecked bytes, property strings copied into `String`s; a repeated property
//!   silently replaces the first; topic and filter checks exist but are left to the caller; errors that do not
//!   say which v5 reason code to disconnect with.
//! - **ntex-mqtt's codec**: thorough, but built on `ntex-bytes` rather than `bytes` and shipped inside the ntex
//!   client/server framework, whose runtime we do not run.
//! - **mqtt-protocol**, **mqttrs**, **mqtt-codec**: MQTT 3.1.1 only.
//! - **symqtt-codec**, **mqute-codec**, **stem-mqtt-proto**: young single-maintainer crates.
//!
//! The established ones stop at 3.1.1 or keep one packet model per version, and none does both things the
//! broker is built around: refusing what the specification forbids with the reason code the DISCONNECT carries, and sharing
//! the received buffer (a PUBLISH payload is a `bytes::Bytes` slice of it, handed to every subscriber without a
//! copy; strings are `bytestring::ByteString` over the same buffer). A broker's wire format and its strictness
//! are the product itself, so the codec is written here, fuzzed (`fuzz/fuzz_targets/mqtt_decode.rs`), and its
//! rules are tested against the specification's statements (`tests/`).

pub mod alias;
pub mod auth;
pub mod broker;
pub mod codec;
pub mod config;
pub mod connection;
pub mod message;
pub mod metrics;
pub mod park;
pub mod plane;
pub mod retained;
pub mod router;
pub mod server;
pub mod session;
pub mod store;
pub mod sys;
pub mod timers;
pub mod topic;

pub use broker::{Broker, BrokerError};
pub use config::{BrokerConfig, Limits, OnCorruptStore, PersistenceConfig};
pub use connection::{serve, serve_as, serve_parking, serve_until, ConnectionError};
pub use plane::{MqttPlane, MqttView};
pub use server::Server;

#[cfg(test)]
mod tests {
    /// The table of metrics above names every metric the broker renders.
    #[test]
    fn the_crate_docs_list_every_metric() {
        let config = crate::BrokerConfig {
            persistence: Some(crate::PersistenceConfig::new(
                std::env::temp_dir().join(format!("portico-mqtt-docs-{}/store.redb", std::process::id())),
            )),
            ..Default::default()
        };
        let broker = crate::Broker::open(config).expect("broker");
        let mut rendered = String::new();
        broker.render_metrics(&mut rendered);
        let docs = include_str!("lib.rs");
        let names: std::collections::BTreeSet<&str> = rendered
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        assert!(names.len() >= 20, "{names:?}");
        for name in names {
            assert!(docs.contains(&format!("//! | `{name}")), "{name} is not in the crate's table of metrics");
        }
    }
}
