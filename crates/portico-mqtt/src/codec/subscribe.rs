//! SUBSCRIBE (specification 3.8): topic filters with their subscription options.

use bytes::{BufMut, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::SubscribeProperties;
use super::qos::QoS;
use super::topic::{is_valid_topic_filter, split_shared};
use super::version::ProtocolVersion;
use super::wire::{field_len, put_field, Reader};
use super::PacketId;

const NO_LOCAL: u8 = 0b0000_0100;
const RETAIN_AS_PUBLISHED: u8 = 0b0000_1000;
const RETAIN_HANDLING_SHIFT: u8 = 4;
/// Bits 6 and 7 in v5 [MQTT-3.8.3-5]; everything above the QoS before v5 [MQTT-3.8.3-4] (3.1.1 numbering).
const V5_RESERVED: u8 = 0b1100_0000;
const V3_RESERVED: u8 = 0b1111_1100;

/// A SUBSCRIBE packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: PacketId,
    /// At least one [MQTT-3.8.3-3].
    pub subscriptions: Vec<Subscription>,
    pub properties: SubscribeProperties,
}

/// One topic filter of a SUBSCRIBE and what the client asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub filter: ByteString,
    pub options: SubscriptionOptions,
}

/// The Subscription Options byte (3.8.3.1). Before v5 only `qos` is on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriptionOptions {
    /// The highest QoS the server may deliver with.
    pub qos: QoS,
    /// Do not send the client its own publications.
    pub no_local: bool,
    /// Keep the RETAIN flag of forwarded messages as published.
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// Whether retained messages are sent when the subscription is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetainHandling {
    /// 0: send them at subscribe time.
    #[default]
    OnSubscribe = 0,
    /// 1: send them only if the subscription did not exist.
    OnNewSubscription = 1,
    /// 2: do not send them.
    Never = 2,
}

impl SubscriptionOptions {
    fn decode(byte: u8, version: ProtocolVersion) -> Result<SubscriptionOptions, DecodeError> {
        let reserved = if version.is_v5() { V5_RESERVED } else { V3_RESERVED };
        if byte & reserved != 0 {
            return Err(DecodeError::InvalidSubscriptionOptions(byte));
        }
        let qos = QoS::from_bits(byte & 0b11).ok_or(DecodeError::InvalidSubscriptionOptions(byte))?;
        let retain_handling = match (byte >> RETAIN_HANDLING_SHIFT) & 0b11 {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscription,
            2 => RetainHandling::Never,
            _ => return Err(DecodeError::InvalidRetainHandling),
        };
        Ok(SubscriptionOptions {
            qos,
            no_local: byte & NO_LOCAL != 0,
            retain_as_published: byte & RETAIN_AS_PUBLISHED != 0,
            retain_handling,
        })
    }

    fn encode(&self, version: ProtocolVersion) -> u8 {
        let mut byte = self.qos as u8;
        if !version.is_v5() {
            return byte;
        }
        if self.no_local {
            byte |= NO_LOCAL;
        }
        if self.retain_as_published {
            byte |= RETAIN_AS_PUBLISHED;
        }
        byte | ((self.retain_handling as u8) << RETAIN_HANDLING_SHIFT)
    }
}

impl Subscribe {
    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<Subscribe, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = if version.is_v5() { SubscribeProperties::decode(r)? } else { SubscribeProperties::default() };
        let mut subscriptions = Vec::new();
        while !r.is_empty() {
            let filter = r.utf8()?;
            if !is_valid_topic_filter(&filter, version.is_v5()) {
                return Err(DecodeError::TopicFilterInvalid(filter.to_string()));
            }
            let options = SubscriptionOptions::decode(r.u8()?, version)?;
            if options.no_local && version.is_v5() && split_shared(&filter).is_some() {
                return Err(DecodeError::NoLocalOnSharedSubscription); // [MQTT-3.8.3-4]
            }
            subscriptions.push(Subscription { filter, options });
        }
        if subscriptions.is_empty() {
            return Err(DecodeError::NoTopicFilters(PacketType::Subscribe));
        }
        Ok(Subscribe { packet_id, subscriptions, properties })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        let mut len = 2;
        if version.is_v5() {
            len += self.properties.encoded_len()?;
        }
        for subscription in &self.subscriptions {
            len += field_len(subscription.filter.as_bytes())? + 1;
        }
        Ok(len)
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write(out);
        }
        for subscription in &self.subscriptions {
            put_field(out, subscription.filter.as_bytes());
            out.put_u8(subscription.options.encode(version));
        }
    }
}
