//! PUBLISH (specification 3.3). The payload is a `Bytes` slice of the received buffer: a broker hands the
//! same allocation to every subscriber, and encoding copies it only into each connection's write buffer.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::properties::PublishProperties;
use super::property::PayloadFormat;
use super::qos::QoS;
use super::topic::is_valid_topic_name;
use super::version::ProtocolVersion;
use super::wire::{field_len, put_field, Reader};
use super::PacketId;

const RETAIN: u8 = 0b0001;
const QOS_SHIFT: u8 = 1;
const DUP: u8 = 0b1000;

/// A PUBLISH packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// Set on a redelivery; never at QoS 0 [MQTT-3.3.1-2].
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// May be empty in v5 when `properties.topic_alias` stands for it.
    pub topic: ByteString,
    /// Present exactly when `qos` is above 0.
    pub packet_id: Option<PacketId>,
    pub properties: PublishProperties,
    pub payload: Bytes,
}

impl Publish {
    /// A PUBLISH without properties; `packet_id` must be `Some` for QoS 1 and 2.
    pub fn new(topic: ByteString, qos: QoS, packet_id: Option<PacketId>, payload: Bytes) -> Publish {
        Publish { dup: false, qos, retain: false, topic, packet_id, properties: PublishProperties::default(), payload }
    }

    /// Whether the payload is what its Payload Format Indicator says: UTF-8 when it says so. A receiver may
    /// check and answer Payload format invalid (0x99) (3.3.2.3.2); decoding does not, as it costs a pass over
    /// every payload.
    pub fn payload_matches_format(&self) -> bool {
        payload_matches_format(self.properties.payload_format, &self.payload)
    }

    pub(crate) fn decode(r: &mut Reader, flags: u8, version: ProtocolVersion) -> Result<Publish, DecodeError> {
        let packet = r.packet();
        let qos = QoS::from_bits((flags >> QOS_SHIFT) & 0b11).ok_or(DecodeError::InvalidFlags { packet, flags })?;
        let topic = r.utf8()?;
        let packet_id = if qos == QoS::AtMostOnce { None } else { Some(r.packet_id()?) };
        let properties = if version.is_v5() { PublishProperties::decode(r)? } else { PublishProperties::default() };
        if topic.is_empty() && version.is_v5() {
            // 3.3.2.1: an empty topic name is allowed only when a Topic Alias stands for it.
            if properties.topic_alias.is_none() {
                return Err(DecodeError::MissingTopicName);
            }
        } else if !is_valid_topic_name(&topic) {
            return Err(DecodeError::TopicNameInvalid(topic.to_string())); // [MQTT-3.3.2-2], [MQTT-4.7.3-1]
        }
        Ok(Publish {
            dup: flags & DUP != 0,
            qos,
            retain: flags & RETAIN != 0,
            topic,
            packet_id,
            properties,
            payload: r.rest(),
        })
    }

    pub(crate) fn flags(&self) -> u8 {
        let mut flags = (self.qos as u8) << QOS_SHIFT;
        if self.dup {
            flags |= DUP;
        }
        if self.retain {
            flags |= RETAIN;
        }
        flags
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if self.packet_id.is_some() != (self.qos != QoS::AtMostOnce) {
            return Err(EncodeError::PacketIdMismatch);
        }
        let mut len = field_len(self.topic.as_bytes())? + self.packet_id.map_or(0, |_| 2);
        if version.is_v5() {
            len += self.properties.encoded_len()?;
        }
        Ok(len + self.payload.len())
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        put_field(out, self.topic.as_bytes());
        if let Some(packet_id) = self.packet_id {
            out.put_u16(packet_id.get());
        }
        if version.is_v5() {
            self.properties.write(out);
        }
        out.put_slice(&self.payload);
    }
}

/// Whether `payload` is UTF-8 when `format` says it is.
pub(crate) fn payload_matches_format(format: Option<PayloadFormat>, payload: &[u8]) -> bool {
    format != Some(PayloadFormat::Utf8) || std::str::from_utf8(payload).is_ok()
}
