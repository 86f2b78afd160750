//! The v5 property sets, one per kind of packet, each field a property the packet may carry. Reading a set
//! refuses a property the packet may not carry (a Malformed Packet, 2.2.2.2) and a second one of a property
//! that may appear once (a Protocol Error). Before v5 every set is empty and nothing of it is written.

use std::num::{NonZeroU16, NonZeroU32};

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::property::{PayloadFormat, Property, PropertyId, PropertyValue, Slot, SubscriptionId, UserProperty};
use super::qos::QoS;
use super::wire::{put_var_int, var_int_len, Reader, MAX_VAR_INT};

macro_rules! property_set {
    ($(#[$doc:meta])* $name:ident {
        $( $(#[$field_doc:meta])* $field:ident: $field_ty:ty = $variant:ident, )*
    }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$field_doc])* pub $field: $field_ty, )*
        }

        impl $name {
            /// Whether the set holds no property.
            pub fn is_empty(&self) -> bool {
                self.content_len() == 0
            }

            /// Reads the Property Length and the properties after it.
            pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
                let len = r.var_int()? as usize;
                let mut properties = r.take(len)?;
                let mut set = Self::default();
                while !properties.is_empty() {
                    match Property::read(&mut properties)? {
                        $( Property::$variant(value) => Slot::put(&mut set.$field, value, PropertyId::$variant)?, )*
                        other => {
                            return Err(DecodeError::PropertyNotAllowed { id: other.id(), packet: r.packet() })
                        }
                    }
                }
                Ok(set)
            }

            /// The bytes of the properties, without the Property Length before them.
            fn content_len(&self) -> usize {
                let mut len = 0;
                $( len += Slot::values(&self.$field).iter().map(|value| 1 + value.wire_len()).sum::<usize>(); )*
                len
            }

            /// The bytes of the Property Length and the properties; refuses what cannot be written.
            pub(crate) fn encoded_len(&self) -> Result<usize, EncodeError> {
                $( for value in Slot::values(&self.$field) { value.check()?; } )*
                let len = self.content_len();
                if len > MAX_VAR_INT as usize {
                    return Err(EncodeError::PacketTooLarge(len));
                }
                Ok(var_int_len(len as u32) + len)
            }

            /// Writes the Property Length and the properties, after `encoded_len` accepted them.
            pub(crate) fn write(&self, out: &mut BytesMut) {
                put_var_int(out, self.content_len() as u32);
                $(
                    for value in Slot::values(&self.$field) {
                        out.put_u8(PropertyId::$variant as u8);
                        value.write(out);
                    }
                )*
            }
        }
    };
}

property_set! {
    /// CONNECT's properties (3.1.2.11).
    ConnectProperties {
        /// Seconds the session outlives the connection; absent means 0.
        session_expiry_interval: Option<u32> = SessionExpiryInterval,
        /// QoS 1 and 2 publications the client processes at once; absent means 65,535.
        receive_maximum: Option<NonZeroU16> = ReceiveMaximum,
        /// The largest packet the client accepts; absent means no limit beyond the protocol's.
        maximum_packet_size: Option<NonZeroU32> = MaximumPacketSize,
        /// The highest Topic Alias the client accepts from the server; absent means 0 (none).
        topic_alias_maximum: Option<u16> = TopicAliasMaximum,
        request_response_information: Option<bool> = RequestResponseInformation,
        request_problem_information: Option<bool> = RequestProblemInformation,
        user_properties: Vec<UserProperty> = UserProperty,
        authentication_method: Option<ByteString> = AuthenticationMethod,
        authentication_data: Option<Bytes> = AuthenticationData,
    }
}

property_set! {
    /// The Will Properties in CONNECT's payload (3.1.3.2).
    WillProperties {
        /// Seconds the server waits after the connection ends before publishing the will.
        will_delay_interval: Option<u32> = WillDelayInterval,
        payload_format: Option<PayloadFormat> = PayloadFormatIndicator,
        message_expiry_interval: Option<u32> = MessageExpiryInterval,
        content_type: Option<ByteString> = ContentType,
        response_topic: Option<ByteString> = ResponseTopic,
        correlation_data: Option<Bytes> = CorrelationData,
        user_properties: Vec<UserProperty> = UserProperty,
    }
}

property_set! {
    /// CONNACK's properties (3.2.2.3).
    ConnAckProperties {
        session_expiry_interval: Option<u32> = SessionExpiryInterval,
        receive_maximum: Option<NonZeroU16> = ReceiveMaximum,
        maximum_qos: Option<QoS> = MaximumQoS,
        retain_available: Option<bool> = RetainAvailable,
        maximum_packet_size: Option<NonZeroU32> = MaximumPacketSize,
        assigned_client_identifier: Option<ByteString> = AssignedClientIdentifier,
        topic_alias_maximum: Option<u16> = TopicAliasMaximum,
        reason_string: Option<ByteString> = ReasonString,
        user_properties: Vec<UserProperty> = UserProperty,
        wildcard_subscription_available: Option<bool> = WildcardSubscriptionAvailable,
        subscription_identifiers_available: Option<bool> = SubscriptionIdentifierAvailable,
        shared_subscription_available: Option<bool> = SharedSubscriptionAvailable,
        server_keep_alive: Option<u16> = ServerKeepAlive,
        response_information: Option<ByteString> = ResponseInformation,
        server_reference: Option<ByteString> = ServerReference,
        authentication_method: Option<ByteString> = AuthenticationMethod,
        authentication_data: Option<Bytes> = AuthenticationData,
    }
}

property_set! {
    /// PUBLISH's properties (3.3.2.3).
    PublishProperties {
        payload_format: Option<PayloadFormat> = PayloadFormatIndicator,
        message_expiry_interval: Option<u32> = MessageExpiryInterval,
        topic_alias: Option<NonZeroU16> = TopicAlias,
        response_topic: Option<ByteString> = ResponseTopic,
        correlation_data: Option<Bytes> = CorrelationData,
        user_properties: Vec<UserProperty> = UserProperty,
        /// The identifiers of the subscriptions a message matched (server to client; may repeat).
        subscription_identifiers: Vec<SubscriptionId> = SubscriptionIdentifier,
        content_type: Option<ByteString> = ContentType,
    }
}

property_set! {
    /// The properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK.
    AckProperties {
        reason_string: Option<ByteString> = ReasonString,
        user_properties: Vec<UserProperty> = UserProperty,
    }
}

property_set! {
    /// SUBSCRIBE's properties (3.8.2.1).
    SubscribeProperties {
        subscription_identifier: Option<SubscriptionId> = SubscriptionIdentifier,
        user_properties: Vec<UserProperty> = UserProperty,
    }
}

property_set! {
    /// UNSUBSCRIBE's properties (3.10.2.1).
    UnsubscribeProperties {
        user_properties: Vec<UserProperty> = UserProperty,
    }
}

property_set! {
    /// DISCONNECT's properties (3.14.2.2).
    DisconnectProperties {
        session_expiry_interval: Option<u32> = SessionExpiryInterval,
        reason_string: Option<ByteString> = ReasonString,
        user_properties: Vec<UserProperty> = UserProperty,
        server_reference: Option<ByteString> = ServerReference,
    }
}

property_set! {
    /// AUTH's properties (3.15.2.2).
    AuthProperties {
        authentication_method: Option<ByteString> = AuthenticationMethod,
        authentication_data: Option<Bytes> = AuthenticationData,
        reason_string: Option<ByteString> = ReasonString,
        user_properties: Vec<UserProperty> = UserProperty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::packet_type::PacketType;

    fn decode<T>(bytes: &[u8], read: fn(&mut Reader) -> Result<T, DecodeError>) -> Result<T, DecodeError> {
        let mut reader = Reader::new(Bytes::copy_from_slice(bytes), PacketType::Publish);
        let set = read(&mut reader)?;
        reader.finish()?;
        Ok(set)
    }

    #[test]
    fn user_properties_may_repeat_and_keep_their_order() {
        let bytes = [14, 0x26, 0, 1, b'a', 0, 1, b'1', 0x26, 0, 1, b'a', 0, 1, b'2'];
        let set = decode(&bytes[..], PublishProperties::decode).unwrap();
        let values: Vec<&str> = set.user_properties.iter().map(|p| &*p.value).collect();
        assert_eq!(values, ["1", "2"]);
    }

    #[test]
    fn a_property_that_may_appear_once_twice_is_a_protocol_error() {
        let bytes = [10, 0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 2];
        assert_eq!(decode(&bytes[..], PublishProperties::decode), Err(DecodeError::DuplicateProperty(0x02)));
    }

    #[test]
    fn a_property_the_packet_may_not_carry_is_malformed() {
        // Session Expiry Interval in a PUBLISH.
        let bytes = [5, 0x11, 0, 0, 0, 1];
        let err = decode(&bytes[..], PublishProperties::decode).unwrap_err();
        assert_eq!(err, DecodeError::PropertyNotAllowed { id: 0x11, packet: PacketType::Publish });
        assert_eq!(err.reason_code(), crate::codec::ReasonCode::MalformedPacket);
    }

    #[test]
    fn an_unknown_property_is_malformed() {
        assert_eq!(decode(&[2, 0x7f, 0][..], PublishProperties::decode), Err(DecodeError::UnknownProperty(0x7f)));
    }

    #[test]
    fn a_zero_topic_alias_is_a_protocol_error_mqtt_3_3_2_8() {
        let err = decode(&[3, 0x23, 0, 0][..], PublishProperties::decode).unwrap_err();
        assert_eq!(err, DecodeError::InvalidPropertyValue(0x23));
        assert_eq!(err.reason_code(), crate::codec::ReasonCode::ProtocolError);
    }

    #[test]
    fn a_zero_subscription_identifier_is_a_protocol_error() {
        let err = decode(&[2, 0x0b, 0][..], SubscribeProperties::decode).unwrap_err();
        assert_eq!(err, DecodeError::InvalidPropertyValue(0x0b));
    }

    #[test]
    fn a_maximum_qos_of_2_is_a_protocol_error() {
        assert_eq!(decode(&[2, 0x24, 2][..], ConnAckProperties::decode), Err(DecodeError::InvalidPropertyValue(0x24)));
    }

    #[test]
    fn a_response_topic_with_a_wildcard_is_refused_mqtt_3_3_2_14() {
        let err = decode(&[6, 0x08, 0, 3, b'a', b'/', b'#'][..], PublishProperties::decode).unwrap_err();
        assert_eq!(err.reason_code(), crate::codec::ReasonCode::TopicNameInvalid);
    }

    #[test]
    fn properties_running_past_their_length_are_truncated() {
        assert!(matches!(decode(&[3, 0x02, 0, 0][..], PublishProperties::decode), Err(DecodeError::Truncated(_))));
        assert!(matches!(decode(&[9][..], PublishProperties::decode), Err(DecodeError::Truncated(_))));
    }

    #[test]
    fn written_sets_read_back() {
        let set = ConnAckProperties {
            session_expiry_interval: Some(60),
            receive_maximum: NonZeroU16::new(10),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(false),
            maximum_packet_size: NonZeroU32::new(1 << 20),
            assigned_client_identifier: Some("auto-1".into()),
            topic_alias_maximum: Some(5),
            reason_string: Some("fine".into()),
            user_properties: vec![UserProperty { name: "k".into(), value: "v".into() }],
            wildcard_subscription_available: Some(true),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(false),
            server_keep_alive: Some(30),
            response_information: Some("resp/".into()),
            server_reference: Some("other:1883".into()),
            authentication_method: Some("SCRAM-SHA-1".into()),
            authentication_data: Some(Bytes::from_static(b"\x00\x01")),
        };
        let mut out = BytesMut::new();
        let len = set.encoded_len().unwrap();
        set.write(&mut out);
        assert_eq!(out.len(), len);
        assert_eq!(decode(&out, ConnAckProperties::decode).unwrap(), set);
        assert!(!set.is_empty());
        assert!(ConnAckProperties::default().is_empty());
    }
}
