//! Portico's MQTT plane: an MQTT 3.1, 3.1.1 and 5.0 broker as a library that the gateway's workers drive.
//!
//! - [`codec`]: every control packet, decoded incrementally from a `BytesMut` with the specification's
//!   normative rules enforced, encoded for any of the three versions.
//! - [`topic`] and [`router`]: topic names and filters, and the subscription trie (wildcards, `$`-topics,
//!   shared subscriptions, subscription options and identifiers).
//! - [`session`]: a client's session, its QoS 1/2 state both ways, in-flight window and queue.
//! - [`retained`]: retained messages.
//! - [`store`]: persistence in an embedded redb file, with group commit.
//! - [`broker`]: the shared state and the operations on it; [`connection`]: the driver that serves one
//!   connection; [`server`]: a small multi-worker TCP server for tests and standalone use.
//!
//! # Design for many cores
//!
//! Each worker thread runs its connections on its own current-thread tokio runtime; [`serve`] needs no
//! `Send` future. A message published on one worker reaches a subscriber on another through that
//! subscriber's session queue: the publisher's task locks the destination session (a mutex per session,
//! held for a push), appends an `Arc<Message>` and wakes the destination connection's `Notify`, which works
//! across runtimes. That is one hand-off per destination session, and the payload is never copied: the
//! `Bytes` the codec sliced out of the publisher's read buffer is shared by the retained table, every
//! subscriber's queue and the store's writer, and copied only into each subscriber's socket write buffer.
//! The router is read-mostly behind one `RwLock` (see [`router`] for why); the session table is a mutex taken
//! on connect and disconnect only. Counters are per worker ([`metrics`]).
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

pub mod broker;
pub mod codec;
pub mod config;
pub mod connection;
pub mod message;
pub mod metrics;
pub mod retained;
pub mod router;
pub mod server;
pub mod session;
pub mod store;
pub mod timers;
pub mod topic;

pub use broker::{Broker, BrokerError};
pub use config::{BrokerConfig, Limits, OnCorruptStore, PersistenceConfig};
pub use connection::{serve, ConnectionError};
pub use server::Server;
