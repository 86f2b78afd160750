//! How each kind of record is laid out in the store's tables: a session and its subscriptions, a message
//! owed to a session, a retained message. Records are postcard-encoded serde structs; a message's topic,
//! properties and payload are kept as a v5 PUBLISH packet in the codec's own encoding, so no second
//! parser of them exists.

use std::sync::Arc;

use bytes::BytesMut;
use bytestring::ByteString;
use serde::{Deserialize, Serialize};

use crate::codec::{
    Packet, PacketId, ProtocolVersion, Publish, QoS, RetainHandling, SubscriptionId, SubscriptionOptions,
    MAX_PACKET_SIZE,
};
use crate::message::Message;

use super::StoreError;

/// A session as persisted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedSession {
    pub version: ProtocolVersion,
    /// Session Expiry Interval, seconds.
    pub expiry: u32,
    /// Unix seconds when its last connection ended; `None` while connected (a restart counts as the end).
    pub disconnected_at: Option<u64>,
    pub subscriptions: Vec<PersistedSubscription>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedSubscription {
    pub filter: ByteString,
    pub options: SubscriptionOptions,
    pub id: Option<SubscriptionId>,
}

/// A message owed to a session, as persisted.
#[derive(Clone, Debug)]
pub struct StoredMessage {
    pub packet_id: u16,
    /// The QoS it is delivered with (after the subscription's downgrade).
    pub qos: QoS,
    /// The RETAIN flag it is delivered with.
    pub retain: bool,
    pub subscription_ids: Vec<SubscriptionId>,
    /// PUBREC received: PUBREL is owed.
    pub released: bool,
    pub message: Arc<Message>,
}

#[derive(Serialize, Deserialize)]
struct SessionRecord {
    level: u8,
    expiry: u32,
    disconnected_at: Option<u64>,
    subscriptions: Vec<SubscriptionRecord>,
}

#[derive(Serialize, Deserialize)]
struct SubscriptionRecord {
    filter: String,
    qos: u8,
    no_local: bool,
    retain_as_published: bool,
    retain_handling: u8,
    id: Option<u32>,
}

#[derive(Serialize, Deserialize)]
struct MessageRecord {
    packet_id: u16,
    qos: u8,
    retain: bool,
    subscription_ids: Vec<u32>,
    released: bool,
    /// The message as a v5 PUBLISH (its own QoS and RETAIN flag; Packet Identifier 1 as a placeholder).
    packet: Vec<u8>,
}

fn corrupt(what: &str) -> StoreError {
    StoreError::BadRecord(what.to_string())
}

pub(super) fn encode_session(session: &PersistedSession) -> Result<Vec<u8>, StoreError> {
    let record = SessionRecord {
        level: session.version.level(),
        expiry: session.expiry,
        disconnected_at: session.disconnected_at,
        subscriptions: session
            .subscriptions
            .iter()
            .map(|s| SubscriptionRecord {
                filter: s.filter.to_string(),
                qos: s.options.qos as u8,
                no_local: s.options.no_local,
                retain_as_published: s.options.retain_as_published,
                retain_handling: s.options.retain_handling as u8,
                id: s.id.map(SubscriptionId::get),
            })
            .collect(),
    };
    Ok(postcard::to_stdvec(&record)?)
}

pub(super) fn decode_session(bytes: &[u8]) -> Result<PersistedSession, StoreError> {
    let record: SessionRecord = postcard::from_bytes(bytes)?;
    let version = match record.level {
        3 => ProtocolVersion::V3_1,
        4 => ProtocolVersion::V3_1_1,
        5 => ProtocolVersion::V5,
        _ => return Err(corrupt("session protocol level")),
    };
    let mut subscriptions = Vec::with_capacity(record.subscriptions.len());
    for s in record.subscriptions {
        let retain_handling = match s.retain_handling {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscription,
            2 => RetainHandling::Never,
            _ => return Err(corrupt("retain handling")),
        };
        if !crate::topic::is_valid_topic_filter(&s.filter, true) {
            return Err(corrupt("subscription filter"));
        }
        subscriptions.push(PersistedSubscription {
            filter: s.filter.into(),
            options: SubscriptionOptions {
                qos: QoS::from_bits(s.qos).ok_or_else(|| corrupt("subscription QoS"))?,
                no_local: s.no_local,
                retain_as_published: s.retain_as_published,
                retain_handling,
            },
            id: match s.id {
                Some(id) => Some(SubscriptionId::new(id).ok_or_else(|| corrupt("subscription identifier"))?),
                None => None,
            },
        });
    }
    Ok(PersistedSession { version, expiry: record.expiry, disconnected_at: record.disconnected_at, subscriptions })
}

/// The message as a v5 PUBLISH packet.
pub(super) fn encode_message(message: &Message) -> Result<Vec<u8>, StoreError> {
    let mut properties = message.properties.clone();
    properties.message_expiry_interval = message.expiry_remaining(std::time::Instant::now());
    let publish = Publish {
        dup: false,
        qos: message.qos,
        retain: message.retain,
        topic: message.topic.clone(),
        packet_id: (message.qos != QoS::AtMostOnce).then_some(PacketId::MIN),
        properties,
        payload: message.payload.clone(),
    };
    let mut out = BytesMut::new();
    Packet::Publish(publish).encode(ProtocolVersion::V5, &mut out)?;
    Ok(out.to_vec())
}

pub(super) fn decode_message(bytes: &[u8]) -> Result<Message, StoreError> {
    let mut buf = BytesMut::from(bytes);
    match Packet::decode(&mut buf, ProtocolVersion::V5, MAX_PACKET_SIZE)? {
        Some(Packet::Publish(publish)) if buf.is_empty() => {
            let mut message = Message::new(publish.topic, publish.payload, publish.qos, publish.retain);
            message.properties = publish.properties;
            Ok(message)
        }
        _ => Err(corrupt("message packet")),
    }
}

pub(super) fn encode_stored(stored: &StoredMessage) -> Result<Vec<u8>, StoreError> {
    let record = MessageRecord {
        packet_id: stored.packet_id,
        qos: stored.qos as u8,
        retain: stored.retain,
        subscription_ids: stored.subscription_ids.iter().map(|id| id.get()).collect(),
        released: stored.released,
        packet: encode_message(&stored.message)?,
    };
    Ok(postcard::to_stdvec(&record)?)
}

pub(super) fn decode_stored(bytes: &[u8]) -> Result<StoredMessage, StoreError> {
    let record: MessageRecord = postcard::from_bytes(bytes)?;
    if record.packet_id == 0 {
        return Err(corrupt("packet identifier 0"));
    }
    Ok(StoredMessage {
        packet_id: record.packet_id,
        qos: QoS::from_bits(record.qos).ok_or_else(|| corrupt("message QoS"))?,
        retain: record.retain,
        subscription_ids: record.subscription_ids.into_iter().filter_map(SubscriptionId::new).collect(),
        released: record.released,
        message: Arc::new(decode_message(&record.packet)?),
    })
}

/// Sets the `released` flag of an encoded [`StoredMessage`].
pub(super) fn mark_released(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut record: MessageRecord = postcard::from_bytes(bytes)?;
    record.released = true;
    Ok(postcard::to_stdvec(&record)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn records_read_back() {
        let session = PersistedSession {
            version: ProtocolVersion::V3_1_1,
            expiry: 60,
            disconnected_at: Some(5),
            subscriptions: vec![PersistedSubscription {
                filter: "a/+".into(),
                options: SubscriptionOptions { qos: QoS::ExactlyOnce, no_local: true, ..Default::default() },
                id: SubscriptionId::new(3),
            }],
        };
        assert_eq!(decode_session(&encode_session(&session).unwrap()).unwrap(), session);
        let mut message = Message::new("a/b".into(), Bytes::from_static(b"hello"), QoS::ExactlyOnce, true);
        message.properties.content_type = Some("text/plain".into());
        let stored = StoredMessage {
            packet_id: 9,
            qos: QoS::AtLeastOnce,
            retain: false,
            subscription_ids: vec![SubscriptionId::new(3).unwrap()],
            released: false,
            message: Arc::new(message),
        };
        let bytes = encode_stored(&stored).unwrap();
        let back = decode_stored(&mark_released(&bytes).unwrap()).unwrap();
        assert!(back.released);
        assert_eq!((back.packet_id, back.qos, back.retain), (9, QoS::AtLeastOnce, false));
        assert_eq!(&back.message.payload[..], b"hello");
        assert_eq!(back.message.properties.content_type.as_deref(), Some("text/plain"));
        assert!(decode_stored(&bytes[..bytes.len() - 1]).is_err());
    }
}
