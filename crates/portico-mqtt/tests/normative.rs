//! The specification's examples, and its normative statements that one packet shows, each refused with the
//! reason code the broker disconnects with. Inputs are raw bytes, as a misbehaving client sends them.

use bytes::{Bytes, BytesMut};
use portico_mqtt::codec::*;

const V3_1: ProtocolVersion = ProtocolVersion::V3_1;
const V3_1_1: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// A packet with `first` as its first byte and `body` after a Remaining Length that fits it.
fn frame(first: u8, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    out.extend_from_slice(&[first]);
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        out.extend_from_slice(&[if len > 0 { byte | 0x80 } else { byte }]);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

fn decode(mut wire: BytesMut, version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let packet = Packet::decode(&mut wire, version, MAX_PACKET_SIZE)?.expect("a whole packet");
    assert!(wire.is_empty(), "the whole input is one packet");
    Ok(packet)
}

fn refused(wire: BytesMut, version: ProtocolVersion) -> DecodeError {
    match decode(wire, version) {
        Ok(packet) => panic!("accepted {packet:?}"),
        Err(err) => err,
    }
}

/// Asserts `wire` is refused with `reason` in `version`.
fn assert_refused(wire: BytesMut, version: ProtocolVersion, reason: ReasonCode) -> DecodeError {
    let err = refused(wire, version);
    assert_eq!(err.reason_code(), reason, "{err}");
    err
}

/// A string field: two-byte length, then the bytes.
fn s(text: &str) -> Vec<u8> {
    let mut out = (text.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// CONNECT's variable header for 3.1.1 with `flags`, keep alive 10.
fn connect_v311(flags: u8, payload: &[u8]) -> BytesMut {
    frame(0x10, &cat(&[&s("MQTT"), &[4, flags, 0, 10], payload]))
}

/// CONNECT's variable header for 5.0 with `flags`, keep alive 10 and `properties` (length included).
fn connect_v5(flags: u8, properties: &[u8], payload: &[u8]) -> BytesMut {
    frame(0x10, &cat(&[&s("MQTT"), &[5, flags, 0, 10], properties, payload]))
}

// ---- Examples of the specifications ----

/// 3.1.1 section 3.1.2.10, figure 3.6: flags 0xCE (user name, password, will QoS 1, will, clean session),
/// keep alive 10.
#[test]
fn connect_variable_header_example_3_1_1() {
    let payload = cat(&[&s("client"), &s("will/topic"), &s("bye"), &s("user"), &s("pass")]);
    let Packet::Connect(connect) = decode(connect_v311(0xce, &payload), V3_1_1).unwrap() else { panic!() };
    assert_eq!(connect.version, V3_1_1);
    assert!(connect.clean_start);
    assert_eq!(connect.keep_alive, 10);
    let will = connect.will.expect("will flag set");
    assert_eq!(
        (will.qos, will.retain, &*will.topic, &will.payload[..]),
        (QoS::AtLeastOnce, false, "will/topic", &b"bye"[..])
    );
    assert_eq!(connect.username.as_deref(), Some("user"));
    assert_eq!(connect.password.as_deref(), Some(&b"pass"[..]));
}

/// 5.0 section 3.1.2.12, figure 3-8: the same flags, and properties of length 5: Session Expiry Interval 10.
#[test]
fn connect_variable_header_example_5_0() {
    let payload = cat(&[&s("client"), &[0], &s("will/topic"), &s("bye"), &s("user"), &s("pass")]);
    let wire = connect_v5(0xce, &[5, 0x11, 0, 0, 0, 10], &payload);
    let Packet::Connect(connect) = decode(wire, V5).unwrap() else { panic!() };
    assert_eq!(connect.version, V5);
    assert_eq!(connect.properties.session_expiry_interval, Some(10));
}

#[test]
fn connect_3_1_names_mqisdp_level_3() {
    let body = cat(&[&s("MQIsdp"), &[3, 0x02, 0, 60], &s("legacy")]);
    let Packet::Connect(connect) = decode(frame(0x10, &body), V5).unwrap() else { panic!() };
    assert_eq!((connect.version, &*connect.client_id), (V3_1, "legacy"));
}

/// 5.0 section 3.3.2.3, figure 3-10: topic "a/b", packet identifier 10, no properties.
#[test]
fn publish_variable_header_example_5_0() {
    let wire = frame(0x32, &[0, 3, b'a', b'/', b'b', 0, 10, 0]);
    let Packet::Publish(publish) = decode(wire, V5).unwrap() else { panic!() };
    assert_eq!((&*publish.topic, publish.packet_id.map(|id| id.get())), ("a/b", Some(10)));
    assert!(publish.payload.is_empty());
}

#[test]
fn publish_payload_shares_the_read_buffer() {
    let wire = frame(0x30, &cat(&[&s("t"), &[0], b"payload bytes"]));
    let range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
    let Packet::Publish(publish) = decode(wire, V5).unwrap() else { panic!() };
    assert_eq!(&publish.payload[..], b"payload bytes");
    assert!(range.contains(&(publish.payload.as_ptr() as usize)), "the payload is not a copy");
    assert!(range.contains(&(publish.topic.as_ptr() as usize)), "the topic is not a copy");
}

// ---- Fixed header and Remaining Length ----

#[test]
fn remaining_length_of_five_bytes_is_malformed_mqtt_1_5_5() {
    let wire = BytesMut::from(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x7f][..]);
    assert_eq!(assert_refused(wire, V5, ReasonCode::MalformedPacket), DecodeError::VarIntTooLong);
    // Known as soon as the fourth length byte arrives with its continuation bit.
    let mut partial = BytesMut::from(&[0x30, 0x80, 0x80, 0x80, 0x80][..]);
    assert_eq!(Packet::decode(&mut partial, V5, MAX_PACKET_SIZE), Err(DecodeError::VarIntTooLong));
}

#[test]
fn remaining_length_not_in_its_shortest_form_is_malformed_mqtt_1_5_5_1() {
    // A PINGREQ whose Remaining Length 0 is written in two bytes.
    let wire = BytesMut::from(&[0xc0, 0x80, 0x00][..]);
    assert_eq!(assert_refused(wire, V3_1_1, ReasonCode::MalformedPacket), DecodeError::VarIntNotMinimal);
}

#[test]
fn packet_over_the_maximum_is_refused_before_its_body_arrives() {
    // The fixed header announces 1,000 bytes; none of them is there.
    let mut wire = BytesMut::from(&[0x30, 0xe8, 0x07][..]);
    let err = Packet::decode(&mut wire, V5, 512).unwrap_err();
    assert_eq!(err, DecodeError::PacketTooLarge { size: 1003, maximum: 512 });
    assert_eq!(err.reason_code(), ReasonCode::PacketTooLarge);
}

#[test]
fn packet_exactly_at_the_maximum_is_accepted() {
    let mut wire = frame(0x30, &cat(&[&s("t"), b"12345"]));
    let len = wire.len() as u32;
    assert!(Packet::decode(&mut wire.clone(), V3_1_1, len - 1).is_err());
    assert!(matches!(Packet::decode(&mut wire, V3_1_1, len), Ok(Some(Packet::Publish(_)))));
}

#[test]
fn reserved_packet_type_0_is_malformed() {
    assert_refused(BytesMut::from(&[0x00, 0x00][..]), V5, ReasonCode::MalformedPacket);
}

#[test]
fn auth_before_v5_is_malformed() {
    assert_refused(BytesMut::from(&[0xf0, 0x00][..]), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn pubrel_subscribe_unsubscribe_need_flags_0010_mqtt_3_6_1_1_mqtt_3_8_1_1_mqtt_3_10_1_1() {
    assert_refused(frame(0x60, &[0, 1]), V3_1_1, ReasonCode::MalformedPacket);
    assert_refused(frame(0x80, &cat(&[&[0, 1], &s("a"), &[0]])), V3_1_1, ReasonCode::MalformedPacket);
    assert_refused(frame(0xa0, &cat(&[&[0, 1], &s("a")])), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn publish_qos_3_is_malformed_mqtt_3_3_1_4() {
    assert_refused(frame(0x36, &cat(&[&s("t"), &[0, 1]])), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn publish_dup_with_qos_0_is_malformed_mqtt_3_3_1_2() {
    assert_refused(frame(0x38, &s("t")), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn pingreq_with_a_body_is_malformed() {
    assert_refused(frame(0xc0, &[0]), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn v3_disconnect_with_a_body_is_malformed() {
    assert_refused(frame(0xe0, &[0]), V3_1_1, ReasonCode::MalformedPacket);
}

// ---- CONNECT ----

#[test]
fn connect_unknown_protocol_name_is_unsupported_mqtt_3_1_2_1() {
    let wire = frame(0x10, &cat(&[&s("MQTX"), &[4, 0x02, 0, 10], &s("c")]));
    let err = assert_refused(wire, V5, ReasonCode::UnsupportedProtocolVersion);
    assert_eq!(err, DecodeError::UnsupportedProtocolVersion { name: "MQTX".into(), level: 4 });
}

#[test]
fn connect_unknown_protocol_level_is_unsupported_mqtt_3_1_2_2() {
    for (name, level) in [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4)] {
        let wire = frame(0x10, &cat(&[&s(name), &[level, 0x02, 0, 10], &s("c")]));
        assert_refused(wire, V5, ReasonCode::UnsupportedProtocolVersion);
    }
}

#[test]
fn connect_reserved_flag_is_malformed_mqtt_3_1_2_3() {
    let err = assert_refused(connect_v311(0x03, &s("c")), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::ConnectReservedFlag);
    assert_refused(connect_v5(0x03, &[0], &s("c")), V5, ReasonCode::MalformedPacket);
}

#[test]
fn connect_will_qos_without_will_flag_is_malformed_mqtt_3_1_2_11() {
    // v5 [MQTT-3.1.2-11], 3.1.1 [MQTT-3.1.2-13]
    let err = assert_refused(connect_v311(0x0a, &s("c")), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::InvalidWillFlags);
    assert_refused(connect_v5(0x12, &[0], &s("c")), V5, ReasonCode::MalformedPacket);
}

#[test]
fn connect_will_qos_3_is_malformed_mqtt_3_1_2_12() {
    let payload = cat(&[&s("c"), &s("w"), &s("m")]);
    assert_refused(connect_v311(0x1e, &payload), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn connect_will_retain_without_will_flag_is_malformed_mqtt_3_1_2_13() {
    // v5 [MQTT-3.1.2-13], 3.1.1 [MQTT-3.1.2-15]
    assert_refused(connect_v311(0x22, &s("c")), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn connect_password_without_username_is_malformed_in_3_1_1_mqtt_3_1_2_22() {
    let payload = cat(&[&s("c"), &s("pass")]);
    let err = assert_refused(connect_v311(0x42, &payload), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::PasswordWithoutUsername);
    // v5 allows it (3.1.2.9).
    let Packet::Connect(connect) = decode(connect_v5(0x42, &[0], &payload), V5).unwrap() else { panic!() };
    assert_eq!((connect.username, connect.password.as_deref()), (None, Some(&b"pass"[..])));
}

#[test]
fn connect_will_topic_with_a_wildcard_is_an_invalid_topic_name() {
    let payload = cat(&[&s("c"), &s("will/#"), &s("m")]);
    assert_refused(connect_v311(0x06, &payload), V3_1_1, ReasonCode::TopicNameInvalid);
}

#[test]
fn connect_client_id_with_u_0000_is_malformed_mqtt_1_5_4_2() {
    let err = assert_refused(connect_v311(0x02, &s("a\0b")), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::NullCharacter);
}

#[test]
fn connect_username_not_utf8_is_malformed_mqtt_1_5_4_1() {
    let payload = cat(&[&s("c"), &[0, 2, 0xc3, 0x28]]);
    let err = assert_refused(connect_v311(0x82, &payload), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::InvalidUtf8);
}

#[test]
fn connect_with_bytes_after_its_last_field_is_malformed() {
    let payload = cat(&[&s("c"), b"extra"]);
    let err = assert_refused(connect_v311(0x02, &payload), V3_1_1, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::TrailingBytes(PacketType::Connect));
}

#[test]
fn connect_missing_its_payload_is_malformed() {
    // The username flag promises a field that is not there.
    assert_refused(connect_v311(0x82, &s("c")), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn connect_authentication_data_without_method_is_a_protocol_error() {
    // 5.0 section 3.1.2.11.10.
    let wire = connect_v5(0x02, &[4, 0x16, 0, 1, b'x'], &s("c"));
    assert_refused(wire, V5, ReasonCode::ProtocolError);
}

#[test]
fn connect_receive_maximum_0_is_a_protocol_error() {
    // 5.0 section 3.1.2.11.3.
    assert_refused(connect_v5(0x02, &[3, 0x21, 0, 0], &s("c")), V5, ReasonCode::ProtocolError);
}

#[test]
fn connect_maximum_packet_size_0_is_a_protocol_error() {
    // 5.0 section 3.1.2.11.4.
    assert_refused(connect_v5(0x02, &[5, 0x27, 0, 0, 0, 0], &s("c")), V5, ReasonCode::ProtocolError);
}

#[test]
fn connect_request_problem_information_2_is_a_protocol_error() {
    // 5.0 section 3.1.2.11.7.
    assert_refused(connect_v5(0x02, &[2, 0x17, 2], &s("c")), V5, ReasonCode::ProtocolError);
}

#[test]
fn connect_session_expiry_twice_is_a_protocol_error() {
    // 5.0 section 3.1.2.11.2.
    let properties = [10, 0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2];
    let err = assert_refused(connect_v5(0x02, &properties, &s("c")), V5, ReasonCode::ProtocolError);
    assert_eq!(err, DecodeError::DuplicateProperty(0x11));
}

#[test]
fn connect_with_a_publish_only_property_is_malformed() {
    // Topic Alias (0x23) may appear only in PUBLISH: 5.0 section 2.2.2.2.
    let err = assert_refused(connect_v5(0x02, &[3, 0x23, 0, 1], &s("c")), V5, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::PropertyNotAllowed { id: 0x23, packet: PacketType::Connect });
}

#[test]
fn connect_property_identifier_not_in_its_shortest_form_is_malformed_mqtt_1_5_5_1() {
    // Session Expiry Interval's identifier 0x11 written as two bytes.
    assert_refused(connect_v5(0x02, &[6, 0x91, 0x00, 0, 0, 0, 1], &s("c")), V5, ReasonCode::MalformedPacket);
}

// ---- CONNACK ----

#[test]
fn connack_reserved_flags_are_malformed_mqtt_3_2_2_1() {
    assert_refused(frame(0x20, &[0x02, 0x00]), V3_1_1, ReasonCode::MalformedPacket);
    assert_refused(frame(0x20, &[0x80, 0x00, 0x00]), V5, ReasonCode::MalformedPacket);
}

#[test]
fn connack_session_present_with_a_refusal_is_a_protocol_error_mqtt_3_2_2_4() {
    assert_refused(frame(0x20, &[0x01, 0x05]), V3_1_1, ReasonCode::ProtocolError);
    // v5 [MQTT-3.2.2-6]
    assert_refused(frame(0x20, &[0x01, 0x87, 0x00]), V5, ReasonCode::ProtocolError);
}

#[test]
fn connack_reserved_return_code_is_malformed() {
    assert_refused(frame(0x20, &[0x00, 0x06]), V3_1_1, ReasonCode::MalformedPacket);
    // A v5 code CONNACK may not carry (0x10 No matching subscribers).
    assert_refused(frame(0x20, &[0x00, 0x10, 0x00]), V5, ReasonCode::MalformedPacket);
}

#[test]
fn connack_maximum_qos_2_is_a_protocol_error() {
    // 5.0 section 3.2.2.3.4.
    assert_refused(frame(0x20, &[0x00, 0x00, 2, 0x24, 2]), V5, ReasonCode::ProtocolError);
}

#[test]
fn connack_3_1_ignores_its_unused_first_byte() {
    let Packet::ConnAck(connack) = decode(frame(0x20, &[0xff, 0x00]), V3_1).unwrap() else { panic!() };
    assert!(!connack.session_present);
}

// ---- PUBLISH ----

#[test]
fn publish_topic_with_a_wildcard_is_invalid_mqtt_3_3_2_2() {
    for topic in ["a/+", "a/#", "+", "#", "a+b"] {
        let err = assert_refused(frame(0x30, &s(topic)), V3_1_1, ReasonCode::TopicNameInvalid);
        assert_eq!(err, DecodeError::TopicNameInvalid(topic.into()));
        assert_refused(frame(0x30, &cat(&[&s(topic), &[0]])), V5, ReasonCode::TopicNameInvalid);
    }
}

#[test]
fn publish_empty_topic_is_invalid_before_v5_mqtt_4_7_3_1() {
    assert_refused(frame(0x30, &s("")), V3_1_1, ReasonCode::TopicNameInvalid);
}

#[test]
fn publish_v5_empty_topic_without_alias_is_a_protocol_error() {
    // 5.0 section 3.3.2.1.
    let err = assert_refused(frame(0x30, &cat(&[&s(""), &[0]])), V5, ReasonCode::ProtocolError);
    assert_eq!(err, DecodeError::MissingTopicName);
    let with_alias = frame(0x30, &cat(&[&s(""), &[3, 0x23, 0, 1]]));
    assert!(decode(with_alias, V5).is_ok());
}

#[test]
fn publish_topic_alias_0_is_a_protocol_error_mqtt_3_3_2_8() {
    assert_refused(frame(0x30, &cat(&[&s("t"), &[3, 0x23, 0, 0]])), V5, ReasonCode::ProtocolError);
}

#[test]
fn publish_packet_identifier_0_is_a_protocol_error_mqtt_2_2_1_3() {
    // 3.1.1 numbers it [MQTT-2.3.1-1].
    let err = assert_refused(frame(0x32, &cat(&[&s("t"), &[0, 0]])), V3_1_1, ReasonCode::ProtocolError);
    assert_eq!(err, DecodeError::ZeroPacketId(PacketType::Publish));
}

#[test]
fn publish_topic_not_utf8_is_malformed() {
    assert_refused(frame(0x30, &[0, 2, 0xed, 0xa0]), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn publish_payload_may_be_anything() {
    let wire = frame(0x30, &cat(&[&s("t"), &[0x00, 0xff, 0xc3]]));
    let Packet::Publish(publish) = decode(wire, V3_1_1).unwrap() else { panic!() };
    assert_eq!(publish.payload, Bytes::from_static(&[0x00, 0xff, 0xc3]));
}

#[test]
fn publish_subscription_identifiers_may_repeat() {
    let wire = frame(0x30, &cat(&[&s("t"), &[4, 0x0b, 1, 0x0b, 2]]));
    let Packet::Publish(publish) = decode(wire, V5).unwrap() else { panic!() };
    let ids: Vec<u32> = publish.properties.subscription_identifiers.iter().map(|id| id.get()).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn publish_payload_format_is_checked_on_request() {
    // 5.0 section 3.3.2.3.2: a receiver MAY check a payload that claims to be UTF-8 (and answer 0x99).
    let claims_utf8 = |payload: &[u8]| frame(0x30, &cat(&[&s("t"), &[2, 0x01, 1], payload]));
    let Packet::Publish(publish) = decode(claims_utf8(b"caf\xc3\xa9"), V5).unwrap() else { panic!() };
    assert!(publish.payload_matches_format());
    let Packet::Publish(publish) = decode(claims_utf8(&[0xc3, 0x28]), V5).unwrap() else { panic!() };
    assert!(!publish.payload_matches_format(), "decoding itself does not check");
    let Packet::Publish(publish) = decode(frame(0x30, &cat(&[&s("t"), &[0], &[0xff]])), V5).unwrap() else { panic!() };
    assert!(publish.payload_matches_format(), "no claim, nothing to check");
}

#[test]
fn publish_payload_format_2_is_a_protocol_error() {
    assert_refused(frame(0x30, &cat(&[&s("t"), &[2, 0x01, 2]])), V5, ReasonCode::ProtocolError);
}

// ---- PUBACK, PUBREC, PUBREL, PUBCOMP ----

#[test]
fn publish_acks_with_packet_identifier_0_are_protocol_errors() {
    for first in [0x40, 0x50, 0x62, 0x70] {
        assert_refused(frame(first, &[0, 0]), V3_1_1, ReasonCode::ProtocolError);
    }
}

#[test]
fn v3_publish_ack_longer_than_2_bytes_is_malformed() {
    assert_refused(frame(0x40, &[0, 1, 0]), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn publish_ack_v5_lengths_2_3_and_4() {
    // 5.0 section 3.4.2.1: no reason code means Success; no Property Length means no properties.
    let Packet::PubAck(ack) = decode(frame(0x40, &[0, 1]), V5).unwrap() else { panic!() };
    assert_eq!(ack.reason, ReasonCode::Success);
    let Packet::PubAck(ack) = decode(frame(0x40, &[0, 1, 0x10]), V5).unwrap() else { panic!() };
    assert_eq!(ack.reason, ReasonCode::NoMatchingSubscribers);
    let Packet::PubAck(ack) = decode(frame(0x40, &[0, 1, 0x10, 0]), V5).unwrap() else { panic!() };
    assert!(ack.properties.is_empty());
}

#[test]
fn publish_ack_reason_code_of_another_packet_is_malformed() {
    // PUBREL may carry only 0x00 and 0x92 (5.0 section 3.6.2.1).
    assert_refused(frame(0x62, &[0, 1, 0x10]), V5, ReasonCode::MalformedPacket);
    assert_refused(frame(0x40, &[0, 1, 0x92]), V5, ReasonCode::MalformedPacket);
    assert_refused(frame(0x40, &[0, 1, 0x03]), V5, ReasonCode::MalformedPacket);
}

// ---- SUBSCRIBE and SUBACK ----

#[test]
fn subscribe_without_a_filter_is_a_protocol_error_mqtt_3_8_3_3() {
    let err = assert_refused(frame(0x82, &[0, 1]), V3_1_1, ReasonCode::ProtocolError);
    assert_eq!(err, DecodeError::NoTopicFilters(PacketType::Subscribe));
    assert_refused(frame(0x82, &[0, 1, 0]), V5, ReasonCode::ProtocolError);
}

#[test]
fn subscribe_misplaced_wildcards_are_invalid_filters_mqtt_4_7_1_1_and_2() {
    for filter in ["sport/tennis#", "sport/tennis/#/ranking", "sport+", "a/+b", ""] {
        let wire = frame(0x82, &cat(&[&[0, 1], &s(filter), &[0]]));
        let err = assert_refused(wire, V3_1_1, ReasonCode::TopicFilterInvalid);
        assert_eq!(err, DecodeError::TopicFilterInvalid(filter.into()));
    }
}

#[test]
fn subscribe_packet_identifier_0_is_a_protocol_error_mqtt_2_2_1_3() {
    assert_refused(frame(0x82, &cat(&[&[0, 0], &s("a"), &[0]])), V3_1_1, ReasonCode::ProtocolError);
}

#[test]
fn subscribe_v3_reserved_option_bits_are_malformed_mqtt_3_8_3_4() {
    // 3.1.1 numbering; v5 gives those bits meanings.
    assert_refused(frame(0x82, &cat(&[&[0, 1], &s("a"), &[0x04]])), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn subscribe_v5_reserved_option_bits_are_malformed_mqtt_3_8_3_5() {
    let err = assert_refused(frame(0x82, &cat(&[&[0, 1, 0], &s("a"), &[0x40]])), V5, ReasonCode::MalformedPacket);
    assert_eq!(err, DecodeError::InvalidSubscriptionOptions(0x40));
}

#[test]
fn subscribe_qos_3_is_malformed() {
    assert_refused(frame(0x82, &cat(&[&[0, 1], &s("a"), &[0x03]])), V3_1_1, ReasonCode::MalformedPacket);
    assert_refused(frame(0x82, &cat(&[&[0, 1, 0], &s("a"), &[0x03]])), V5, ReasonCode::MalformedPacket);
}

#[test]
fn subscribe_retain_handling_3_is_a_protocol_error() {
    // 5.0 section 3.8.3.1.
    assert_refused(frame(0x82, &cat(&[&[0, 1, 0], &s("a"), &[0x30]])), V5, ReasonCode::ProtocolError);
}

#[test]
fn subscribe_no_local_on_a_shared_subscription_is_a_protocol_error_mqtt_3_8_3_4() {
    let wire = frame(0x82, &cat(&[&[0, 1, 0], &s("$share/g/a"), &[0x04]]));
    assert_eq!(assert_refused(wire, V5, ReasonCode::ProtocolError), DecodeError::NoLocalOnSharedSubscription);
}

#[test]
fn subscribe_shared_subscription_without_a_filter_is_invalid_mqtt_4_8_2_2() {
    for filter in ["$share/g", "$share/g/", "$share//a", "$share/g+/a"] {
        let wire = frame(0x82, &cat(&[&[0, 1, 0], &s(filter), &[0]]));
        assert_refused(wire, V5, ReasonCode::TopicFilterInvalid);
    }
    // Before v5, "$share/g" is an ordinary filter.
    assert!(decode(frame(0x82, &cat(&[&[0, 1], &s("$share/g"), &[0]])), V3_1_1).is_ok());
}

#[test]
fn subscribe_identifier_twice_is_a_protocol_error() {
    let wire = frame(0x82, &cat(&[&[0, 1, 4, 0x0b, 1, 0x0b, 2], &s("a"), &[0]]));
    assert_refused(wire, V5, ReasonCode::ProtocolError);
}

#[test]
fn subscribe_filter_without_its_options_byte_is_malformed() {
    assert_refused(frame(0x82, &cat(&[&[0, 1], &s("a")])), V3_1_1, ReasonCode::MalformedPacket);
}

#[test]
fn suback_v3_return_codes_and_their_reserved_values() {
    let Packet::SubAck(suback) = decode(frame(0x90, &[0, 1, 0, 1, 2, 0x80]), V3_1_1).unwrap() else { panic!() };
    let expected =
        [ReasonCode::GRANTED_QOS_0, ReasonCode::GrantedQoS1, ReasonCode::GrantedQoS2, ReasonCode::UnspecifiedError];
    assert_eq!(suback.reasons, expected);
    // [MQTT-3.9.3-2]: return codes other than 0x00, 0x01, 0x02 and 0x80 are reserved.
    assert_refused(frame(0x90, &[0, 1, 0x03]), V3_1_1, ReasonCode::MalformedPacket);
    assert_refused(frame(0x90, &[0, 1, 0x87]), V3_1_1, ReasonCode::MalformedPacket);
}

// ---- UNSUBSCRIBE and UNSUBACK ----

#[test]
fn unsubscribe_without_a_filter_is_a_protocol_error_mqtt_3_10_3_2() {
    assert_refused(frame(0xa2, &[0, 1]), V3_1_1, ReasonCode::ProtocolError);
    assert_refused(frame(0xa2, &[0, 1, 0]), V5, ReasonCode::ProtocolError);
}

#[test]
fn unsubscribe_invalid_filter_is_refused() {
    assert_refused(frame(0xa2, &cat(&[&[0, 1], &s("a/#/b")])), V3_1_1, ReasonCode::TopicFilterInvalid);
}

#[test]
fn unsuback_v3_is_its_packet_identifier_only() {
    assert!(decode(frame(0xb0, &[0, 1]), V3_1_1).is_ok());
    assert_refused(frame(0xb0, &[0, 1, 0]), V3_1_1, ReasonCode::MalformedPacket);
}

// ---- DISCONNECT and AUTH ----

#[test]
fn disconnect_v5_without_reason_is_a_normal_disconnection() {
    // 5.0 section 3.14.2.1.
    let Packet::Disconnect(disconnect) = decode(frame(0xe0, &[]), V5).unwrap() else { panic!() };
    assert_eq!(disconnect.reason, ReasonCode::NORMAL_DISCONNECTION);
    let Packet::Disconnect(disconnect) = decode(frame(0xe0, &[0x04]), V5).unwrap() else { panic!() };
    assert_eq!(disconnect.reason, ReasonCode::DisconnectWithWillMessage);
}

#[test]
fn disconnect_reason_code_of_another_packet_is_malformed() {
    assert_refused(frame(0xe0, &[0x18]), V5, ReasonCode::MalformedPacket);
}

#[test]
fn auth_v5_without_reason_is_success() {
    // 5.0 section 3.15.2.1.
    let Packet::Auth(auth) = decode(frame(0xf0, &[]), V5).unwrap() else { panic!() };
    assert_eq!(auth, Auth::default());
    assert_refused(frame(0xf0, &[0x87]), V5, ReasonCode::MalformedPacket);
}

#[test]
fn reason_codes_of_refusals_are_ones_disconnect_may_carry() {
    let refusals = [
        refused(BytesMut::from(&[0x00, 0x00][..]), V5),
        refused(frame(0x30, &cat(&[&s("a/#"), &[0]])), V5),
        refused(frame(0x82, &[0, 1, 0]), V5),
        refused(frame(0x82, &cat(&[&[0, 1, 0], &s("a#"), &[0]])), V5),
    ];
    for err in refusals {
        assert!(err.reason_code().allowed_in(PacketType::Disconnect), "{err:?}");
    }
}
