//! Every packet, in every version it exists in, encoded, decoded back to the same value, and needing more
//! input (without consuming any) at every cut short of its end.

use std::num::{NonZeroU16, NonZeroU32};

use bytes::{Bytes, BytesMut};
use portico_mqtt::codec::*;

const ALL_VERSIONS: [ProtocolVersion; 3] = [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5];

fn pid(id: u16) -> PacketId {
    PacketId::new(id).expect("test packet ids are not 0")
}

fn user(name: &str, value: &str) -> UserProperty {
    UserProperty { name: name.into(), value: value.into() }
}

fn reason_string() -> Option<bytestring::ByteString> {
    Some("because".into())
}

/// Encodes `packet`, checks `encoded_len`, that every strict prefix needs more and is left alone, and that
/// the whole decodes to `packet` and is consumed. Returns the bytes.
fn round_trip(packet: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut wire = BytesMut::new();
    packet.encode(version, &mut wire).unwrap_or_else(|e| panic!("{version}: encode {packet:?}: {e}"));
    assert_eq!(wire.len(), packet.encoded_len(version).unwrap(), "{version}: encoded_len");
    for cut in 0..wire.len() {
        let mut partial = BytesMut::from(&wire[..cut]);
        let decoded = Packet::decode(&mut partial, version, MAX_PACKET_SIZE);
        assert_eq!(decoded, Ok(None), "{version}: {cut} of {} bytes", wire.len());
        assert_eq!(partial.len(), cut, "{version}: a partial packet is not consumed");
    }
    let mut input = wire.clone();
    let decoded = Packet::decode(&mut input, version, MAX_PACKET_SIZE)
        .unwrap_or_else(|e| panic!("{version}: decode {packet:?}: {e}"))
        .expect("a whole packet");
    assert!(input.is_empty(), "{version}: the packet is consumed");
    assert_eq!(&decoded, packet, "{version}");
    wire
}

fn connect(version: ProtocolVersion) -> Connect {
    let mut connect = Connect {
        version,
        clean_start: true,
        keep_alive: 30,
        client_id: "client-1".into(),
        will: Some(Will {
            topic: "clients/client-1/status".into(),
            payload: Bytes::from_static(b"offline"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: WillProperties::default(),
        }),
        username: Some("user".into()),
        password: Some(Bytes::from_static(b"secret\x00\xff")),
        properties: ConnectProperties::default(),
    };
    if version.is_v5() {
        connect.properties = ConnectProperties {
            session_expiry_interval: Some(3600),
            receive_maximum: NonZeroU16::new(20),
            maximum_packet_size: NonZeroU32::new(65_536),
            topic_alias_maximum: Some(10),
            request_response_information: Some(true),
            request_problem_information: Some(false),
            user_properties: vec![user("k", "v"), user("k", "w")],
            authentication_method: Some("SCRAM-SHA-256".into()),
            authentication_data: Some(Bytes::from_static(b"client-first")),
        };
        if let Some(will) = &mut connect.will {
            will.properties = WillProperties {
                will_delay_interval: Some(5),
                payload_format: Some(PayloadFormat::Utf8),
                message_expiry_interval: Some(60),
                content_type: Some("text/plain".into()),
                response_topic: Some("replies/client-1".into()),
                correlation_data: Some(Bytes::from_static(b"\x01\x02")),
                user_properties: vec![user("a", "1")],
            };
        }
    }
    connect
}

#[test]
fn connect_round_trips() {
    for version in ALL_VERSIONS {
        let full = connect(version);
        round_trip(&Packet::Connect(Box::new(full.clone())), version);
        let bare = Connect { will: None, username: None, password: None, client_id: "".into(), ..full.clone() };
        round_trip(&Packet::Connect(Box::new(bare)), version);
        let will_qos_2 = Connect {
            will: full.will.clone().map(|will| Will { qos: QoS::ExactlyOnce, retain: false, ..will }),
            ..full.clone()
        };
        round_trip(&Packet::Connect(Box::new(will_qos_2)), version);
        // The version argument does not matter for CONNECT: it is written and read in its own.
        let mut wire = BytesMut::new();
        Packet::Connect(Box::new(full.clone())).encode(ProtocolVersion::V3_1_1, &mut wire).unwrap();
        let decoded = Packet::decode(&mut wire, ProtocolVersion::V5, MAX_PACKET_SIZE).unwrap().unwrap();
        assert_eq!(decoded, Packet::Connect(Box::new(full)));
    }
}

#[test]
fn connect_v5_password_without_username_round_trips() {
    let connect = Connect { username: None, ..connect(ProtocolVersion::V5) };
    round_trip(&Packet::Connect(Box::new(connect)), ProtocolVersion::V5);
}

#[test]
fn connack_round_trips() {
    for version in ALL_VERSIONS {
        let session_present = version != ProtocolVersion::V3_1;
        round_trip(&Packet::ConnAck(ConnAck::accepted(session_present)), version);
        for reason in [
            ReasonCode::UnsupportedProtocolVersion,
            ReasonCode::ClientIdentifierNotValid,
            ReasonCode::ServerUnavailable,
            ReasonCode::BadUserNameOrPassword,
            ReasonCode::NotAuthorized,
        ] {
            round_trip(&Packet::ConnAck(ConnAck::refused(reason)), version);
        }
    }
    let full = ConnAck {
        session_present: true,
        reason: ReasonCode::Success,
        properties: ConnAckProperties {
            session_expiry_interval: Some(0),
            receive_maximum: NonZeroU16::new(100),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(true),
            maximum_packet_size: NonZeroU32::new(1 << 20),
            assigned_client_identifier: Some("auto-7f3a".into()),
            topic_alias_maximum: Some(16),
            reason_string: reason_string(),
            user_properties: vec![user("region", "eu")],
            wildcard_subscription_available: Some(true),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(true),
            server_keep_alive: Some(45),
            response_information: Some("responses/".into()),
            server_reference: Some("other.example:1883".into()),
            authentication_method: Some("SCRAM-SHA-256".into()),
            authentication_data: Some(Bytes::from_static(b"server-final")),
        },
    };
    round_trip(&Packet::ConnAck(full), ProtocolVersion::V5);
    round_trip(&Packet::ConnAck(ConnAck::refused(ReasonCode::Banned)), ProtocolVersion::V5);
}

fn publish(version: ProtocolVersion, qos: QoS) -> Publish {
    let packet_id = (qos != QoS::AtMostOnce).then(|| pid(7));
    let mut publish = Publish::new("sensors/7/temp".into(), qos, packet_id, Bytes::from_static(b"21.5"));
    publish.retain = true;
    publish.dup = qos != QoS::AtMostOnce;
    if version.is_v5() {
        publish.properties = PublishProperties {
            payload_format: Some(PayloadFormat::Utf8),
            message_expiry_interval: Some(300),
            topic_alias: NonZeroU16::new(3),
            response_topic: Some("replies/7".into()),
            correlation_data: Some(Bytes::from_static(b"req-1")),
            user_properties: vec![user("unit", "C"), user("unit", "K")],
            subscription_identifiers: vec![SubscriptionId::new(1).unwrap(), SubscriptionId::new(MAX_VAR_INT).unwrap()],
            content_type: Some("text/plain".into()),
        };
    }
    publish
}

#[test]
fn publish_round_trips_at_every_qos() {
    for version in ALL_VERSIONS {
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            round_trip(&Packet::Publish(publish(version, qos)), version);
            let empty_payload = Publish { payload: Bytes::new(), ..publish(version, qos) };
            round_trip(&Packet::Publish(empty_payload), version);
        }
    }
}

#[test]
fn publish_v5_with_an_alias_and_no_topic_round_trips() {
    let publish = Publish { topic: "".into(), ..publish(ProtocolVersion::V5, QoS::AtLeastOnce) };
    round_trip(&Packet::Publish(publish), ProtocolVersion::V5);
}

#[test]
fn publish_with_a_large_payload_round_trips() {
    let payload = Bytes::from(vec![0xa5; 70_000]);
    let publish = Publish::new("big".into(), QoS::AtMostOnce, None, payload);
    let mut wire = BytesMut::new();
    Packet::Publish(publish.clone()).encode(ProtocolVersion::V5, &mut wire).unwrap();
    // Remaining Length 70,006 (topic 5, property length 1, payload 70,000) takes three bytes.
    assert_eq!(wire[..4], [0x30, 0xf6, 0xa2, 0x04]);
    let decoded = Packet::decode(&mut wire, ProtocolVersion::V5, MAX_PACKET_SIZE).unwrap().unwrap();
    assert_eq!(decoded, Packet::Publish(publish));
}

fn ack(version: ProtocolVersion, reason: ReasonCode) -> PublishAck {
    let mut ack = PublishAck::new(pid(42));
    if version.is_v5() {
        ack.reason = reason;
    }
    ack
}

#[test]
fn publish_acks_round_trip() {
    let with_properties = |reason| PublishAck {
        packet_id: pid(65_535),
        reason,
        properties: AckProperties { reason_string: reason_string(), user_properties: vec![user("x", "y")] },
    };
    for version in ALL_VERSIONS {
        for reason in [ReasonCode::Success, ReasonCode::NoMatchingSubscribers, ReasonCode::QuotaExceeded] {
            round_trip(&Packet::PubAck(ack(version, reason)), version);
            round_trip(&Packet::PubRec(ack(version, reason)), version);
        }
        for reason in [ReasonCode::Success, ReasonCode::PacketIdentifierNotFound] {
            round_trip(&Packet::PubRel(ack(version, reason)), version);
            round_trip(&Packet::PubComp(ack(version, reason)), version);
        }
    }
    let v5 = ProtocolVersion::V5;
    round_trip(&Packet::PubAck(with_properties(ReasonCode::Success)), v5);
    round_trip(&Packet::PubRec(with_properties(ReasonCode::PayloadFormatInvalid)), v5);
    round_trip(&Packet::PubRel(with_properties(ReasonCode::PacketIdentifierNotFound)), v5);
    round_trip(&Packet::PubComp(with_properties(ReasonCode::Success)), v5);
}

#[test]
fn publish_ack_v5_leaves_out_what_it_can() {
    let v5 = ProtocolVersion::V5;
    assert_eq!(round_trip(&Packet::PubAck(PublishAck::new(pid(1))), v5)[..], [0x40, 0x02, 0x00, 0x01]);
    let refused = ack(v5, ReasonCode::NotAuthorized);
    assert_eq!(round_trip(&Packet::PubAck(refused), v5)[..], [0x40, 0x03, 0x00, 0x2a, 0x87]);
}

#[test]
fn subscribe_round_trips() {
    for version in ALL_VERSIONS {
        let mut subscriptions = vec![
            Subscription { filter: "sport/tennis/+".into(), options: SubscriptionOptions::default() },
            Subscription {
                filter: "sport/#".into(),
                options: SubscriptionOptions { qos: QoS::ExactlyOnce, ..Default::default() },
            },
        ];
        let mut properties = SubscribeProperties::default();
        if version.is_v5() {
            subscriptions.push(Subscription {
                filter: "a/b".into(),
                options: SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: RetainHandling::Never,
                },
            });
            subscriptions.push(Subscription {
                filter: "$share/workers/jobs/+".into(),
                options: SubscriptionOptions {
                    retain_handling: RetainHandling::OnNewSubscription,
                    ..Default::default()
                },
            });
            properties = SubscribeProperties {
                subscription_identifier: SubscriptionId::new(268_435_455),
                user_properties: vec![user("s", "t")],
            };
        }
        round_trip(&Packet::Subscribe(Subscribe { packet_id: pid(10), subscriptions, properties }), version);
    }
}

#[test]
fn suback_round_trips() {
    for version in ALL_VERSIONS {
        let reasons = vec![
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::GrantedQoS1,
            ReasonCode::GrantedQoS2,
            ReasonCode::UnspecifiedError,
        ];
        round_trip(&Packet::SubAck(SubAck { packet_id: pid(10), reasons, properties: Default::default() }), version);
    }
    let v5 = SubAck {
        packet_id: pid(10),
        reasons: vec![ReasonCode::SharedSubscriptionsNotSupported, ReasonCode::WildcardSubscriptionsNotSupported],
        properties: AckProperties { reason_string: reason_string(), user_properties: vec![] },
    };
    round_trip(&Packet::SubAck(v5.clone()), ProtocolVersion::V5);
    // A v5 failure reaches a v3 client as 0x80.
    let mut wire = BytesMut::new();
    Packet::SubAck(v5).encode(ProtocolVersion::V3_1_1, &mut wire).unwrap();
    assert_eq!(wire[..], [0x90, 0x04, 0x00, 0x0a, 0x80, 0x80]);
}

#[test]
fn unsubscribe_round_trips() {
    for version in ALL_VERSIONS {
        let properties = if version.is_v5() {
            UnsubscribeProperties { user_properties: vec![user("u", "v")] }
        } else {
            UnsubscribeProperties::default()
        };
        let unsubscribe = Unsubscribe { packet_id: pid(11), filters: vec!["a/+".into(), "#".into()], properties };
        round_trip(&Packet::Unsubscribe(unsubscribe), version);
    }
}

#[test]
fn unsuback_round_trips() {
    for version in ALL_VERSIONS {
        let mut unsuback = UnsubAck { packet_id: pid(11), reasons: vec![], properties: Default::default() };
        if version.is_v5() {
            unsuback.reasons = vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted];
            unsuback.properties.reason_string = reason_string();
        }
        round_trip(&Packet::UnsubAck(unsuback), version);
    }
}

#[test]
fn ping_round_trips() {
    for version in ALL_VERSIONS {
        assert_eq!(round_trip(&Packet::PingReq, version)[..], [0xc0, 0x00]);
        assert_eq!(round_trip(&Packet::PingResp, version)[..], [0xd0, 0x00]);
    }
}

#[test]
fn disconnect_round_trips() {
    for version in ALL_VERSIONS {
        assert_eq!(round_trip(&Packet::Disconnect(Disconnect::default()), version)[..], [0xe0, 0x00]);
    }
    let v5 = ProtocolVersion::V5;
    assert_eq!(round_trip(&Packet::Disconnect(Disconnect::new(ReasonCode::SessionTakenOver)), v5)[..], [0xe0, 1, 0x8e]);
    let full = Disconnect {
        reason: ReasonCode::ServerMoved,
        properties: DisconnectProperties {
            session_expiry_interval: Some(0),
            reason_string: reason_string(),
            user_properties: vec![user("a", "b")],
            server_reference: Some("elsewhere:1883".into()),
        },
    };
    round_trip(&Packet::Disconnect(full), v5);
}

#[test]
fn auth_round_trips_in_v5() {
    let v5 = ProtocolVersion::V5;
    assert_eq!(round_trip(&Packet::Auth(Auth::default()), v5)[..], [0xf0, 0x00]);
    let continue_auth = Auth {
        reason: ReasonCode::ContinueAuthentication,
        properties: AuthProperties {
            authentication_method: Some("SCRAM-SHA-256".into()),
            authentication_data: Some(Bytes::from_static(b"server-first")),
            reason_string: reason_string(),
            user_properties: vec![user("step", "2")],
        },
    };
    round_trip(&Packet::Auth(continue_auth.clone()), v5);
    for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1] {
        let err = Packet::Auth(continue_auth.clone()).encode(version, &mut BytesMut::new()).unwrap_err();
        assert_eq!(err, EncodeError::NotInVersion { packet: PacketType::Auth, version });
    }
}

#[test]
fn v5_only_fields_are_left_out_for_v3() {
    let mut wire = BytesMut::new();
    let v5_publish = publish(ProtocolVersion::V5, QoS::AtLeastOnce);
    Packet::Publish(v5_publish.clone()).encode(ProtocolVersion::V3_1_1, &mut wire).unwrap();
    let decoded = Packet::decode(&mut wire, ProtocolVersion::V3_1_1, MAX_PACKET_SIZE).unwrap().unwrap();
    let Packet::Publish(decoded) = decoded else { panic!("not a PUBLISH") };
    assert_eq!(decoded.properties, PublishProperties::default());
    assert_eq!((decoded.topic, decoded.payload), (v5_publish.topic, v5_publish.payload));
}

#[test]
fn v5_connack_refusals_map_onto_v3_return_codes() {
    for (reason, code) in [(ReasonCode::Banned, 5), (ReasonCode::ServerBusy, 3), (ReasonCode::BadUserNameOrPassword, 4)]
    {
        let mut wire = BytesMut::new();
        Packet::ConnAck(ConnAck::refused(reason)).encode(ProtocolVersion::V3_1_1, &mut wire).unwrap();
        assert_eq!(wire[..], [0x20, 0x02, 0x00, code], "{reason:?}");
    }
}

#[test]
fn packets_back_to_back_decode_one_at_a_time() {
    let version = ProtocolVersion::V5;
    let packets = [
        Packet::Publish(publish(version, QoS::AtLeastOnce)),
        Packet::PingReq,
        Packet::PubAck(PublishAck::new(pid(3))),
        Packet::Disconnect(Disconnect::default()),
    ];
    let mut wire = BytesMut::new();
    for packet in &packets {
        packet.encode(version, &mut wire).unwrap();
    }
    // Half of the last packet has not arrived.
    wire.truncate(wire.len() - 1);
    for packet in &packets[..3] {
        assert_eq!(Packet::decode(&mut wire, version, MAX_PACKET_SIZE).unwrap().as_ref(), Some(packet));
    }
    assert_eq!(Packet::decode(&mut wire, version, MAX_PACKET_SIZE), Ok(None));
    assert_eq!(wire[..], [0xe0]);
}

#[test]
fn encoding_errors_append_nothing() {
    let mut wire = BytesMut::from(&b"kept"[..]);
    let missing_id = Publish::new("t".into(), QoS::AtLeastOnce, None, Bytes::new());
    assert_eq!(Packet::Publish(missing_id).encode(ProtocolVersion::V5, &mut wire), Err(EncodeError::PacketIdMismatch));
    let long_topic = Publish::new("x".repeat(70_000).into(), QoS::AtMostOnce, None, Bytes::new());
    assert_eq!(
        Packet::Publish(long_topic).encode(ProtocolVersion::V5, &mut wire),
        Err(EncodeError::FieldTooLong(70_000))
    );
    let v3_password = Connect { username: None, ..connect(ProtocolVersion::V3_1_1) };
    assert_eq!(
        Packet::Connect(Box::new(v3_password)).encode(ProtocolVersion::V3_1_1, &mut wire),
        Err(EncodeError::PasswordWithoutUsername)
    );
    assert_eq!(wire[..], b"kept"[..]);
}
