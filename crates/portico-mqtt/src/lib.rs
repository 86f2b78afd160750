//! Portico's MQTT plane. For now its packet codec only: every control packet of MQTT 3.1, 3.1.1 and 5.0,
//! decoded incrementally from a `BytesMut` with the specification's normative rules enforced, and encoded for
//! any of the three versions. The broker (sessions, topic router, retained store, persistence) builds on it.
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

pub mod codec;
