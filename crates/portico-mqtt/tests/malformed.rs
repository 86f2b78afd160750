//! Protocol violations and malformed input as raw bytes on a TCP socket: the broker answers with the v5
//! reason code where the version has one, closes the connection, and keeps serving everyone else.

mod common;

use bytes::Bytes;
use common::*;
use portico_mqtt::codec::{Packet, ProtocolVersion, Publish, QoS, ReasonCode};
use portico_mqtt::{BrokerConfig, Limits};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

fn assert_disconnect(packets: &[Packet], reason: ReasonCode) {
    assert!(
        matches!(packets, [Packet::Disconnect(d)] if d.reason == reason),
        "expected DISCONNECT {reason:?}: {packets:?}"
    );
}

#[tokio::test]
async fn a_second_connect_is_a_protocol_error_mqtt_3_1_0_2() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "twice", 0).await;
    raw.send(connect_packet(V5, "twice", 0)).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::ProtocolError);
    let mut raw = raw_connected(b.addr, V311, "twice3", 0).await;
    raw.send(connect_packet(V311, "twice3", 0)).await;
    assert!(raw.until_closed().await.is_empty(), "3.1.1 has no DISCONNECT from the server: just closed");
}

#[tokio::test]
async fn a_first_packet_other_than_connect_closes_the_connection_mqtt_3_1_0_1() {
    let b = start_default();
    let mut raw = Raw::connect(b.addr, V311).await;
    raw.send(Packet::PingReq).await;
    assert!(raw.until_closed().await.is_empty());
}

#[tokio::test]
async fn an_unsupported_protocol_level_gets_connack_0x01_mqtt_3_1_2_2() {
    let b = start_default();
    let mut raw = Raw::connect(b.addr, V311).await;
    // CONNECT, "MQTT" level 9.
    raw.send_raw(&[0x10, 10, 0, 4, b'M', b'Q', b'T', b'T', 9, 0x02, 0, 0, 0, 0]).await;
    let packets = raw.until_closed().await;
    assert!(
        matches!(&packets[..], [Packet::ConnAck(ack)] if ack.reason == ReasonCode::UnsupportedProtocolVersion),
        "{packets:?}"
    );
}

#[tokio::test]
async fn a_malformed_v5_connect_gets_connack_with_the_reason() {
    let b = start_default();
    let mut raw = Raw::connect(b.addr, V5).await;
    // CONNECT v5 with the reserved flag set [MQTT-3.1.2-3].
    raw.send_raw(&[0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x03, 0, 0, 0, 0, 0]).await;
    let packets = raw.until_closed().await;
    assert!(matches!(&packets[..], [Packet::ConnAck(ack)] if ack.reason == ReasonCode::MalformedPacket), "{packets:?}");
}

#[tokio::test]
async fn a_topic_name_with_a_wildcard_is_refused_mqtt_3_3_2_2() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "wild", 0).await;
    // PUBLISH QoS 0 to "a/#", no properties, payload "x".
    raw.send_raw(&[0x30, 7, 0, 3, b'a', b'/', b'#', 0, b'x']).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::TopicNameInvalid);
}

#[tokio::test]
async fn invalid_utf8_in_a_topic_is_malformed_mqtt_1_5_4_1() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "utf8", 0).await;
    raw.send_raw(&[0x30, 6, 0, 2, 0xC3, 0x28, 0, b'x']).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::MalformedPacket);
}

#[tokio::test]
async fn a_reserved_packet_type_is_malformed() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "reserved", 0).await;
    raw.send_raw(&[0x00, 0]).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::MalformedPacket);
}

#[tokio::test]
async fn a_packet_over_the_maximum_size_is_refused_with_0x95() {
    let config = BrokerConfig { limits: Limits { max_packet_size: 1024, ..Limits::default() }, ..Default::default() };
    let b = start(config);
    let mut raw = raw_connected(b.addr, V5, "big", 0).await;
    let publish = Publish::new("big".into(), QoS::AtMostOnce, None, Bytes::from(vec![0u8; 2048]));
    raw.send(Packet::Publish(publish)).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::PacketTooLarge);
}

#[tokio::test]
async fn a_server_only_packet_from_a_client_is_a_protocol_error() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "pingresp", 0).await;
    raw.send(Packet::PingResp).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::ProtocolError);
}

#[tokio::test]
async fn an_unknown_topic_alias_is_a_protocol_error_and_one_above_the_maximum_is_invalid_mqtt_3_3_2_9() {
    let b = start_default();
    let mut raw = raw_connected(b.addr, V5, "alias", 0).await;
    let mut publish = Publish::new("".into(), QoS::AtMostOnce, None, Bytes::from_static(b"x"));
    publish.properties.topic_alias = std::num::NonZeroU16::new(3);
    raw.send(Packet::Publish(publish)).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::ProtocolError);
    let mut raw = raw_connected(b.addr, V5, "alias2", 0).await;
    let mut publish = Publish::new("t".into(), QoS::AtMostOnce, None, Bytes::from_static(b"x"));
    publish.properties.topic_alias = std::num::NonZeroU16::new(1000);
    raw.send(Packet::Publish(publish)).await;
    assert_disconnect(&raw.until_closed().await, ReasonCode::TopicAliasInvalid);
}

#[tokio::test]
async fn exceeding_the_receive_maximum_is_refused_mqtt_3_3_4_8() {
    let config = BrokerConfig { limits: Limits { receive_maximum: 2, ..Limits::default() }, ..Default::default() };
    let b = start(config);
    let mut raw = raw_connected(b.addr, V5, "flood", 0).await;
    // QoS 2 PUBLISHes stay unacknowledged until PUBREL: the third is one too many.
    for id in 1..=3u16 {
        let publish =
            Publish::new("t".into(), QoS::ExactlyOnce, std::num::NonZeroU16::new(id), Bytes::from_static(b"x"));
        raw.send(Packet::Publish(publish)).await;
    }
    let packets = raw.until_closed().await;
    assert!(
        matches!(packets.last(), Some(Packet::Disconnect(d)) if d.reason == ReasonCode::ReceiveMaximumExceeded),
        "{packets:?}"
    );
}

#[tokio::test]
async fn garbage_never_wedges_the_broker() {
    let b = start_default();
    let mut rng = fastrand::Rng::with_seed(16);
    for i in 0..200 {
        let mut raw = Raw::connect(b.addr, V5).await;
        if i % 2 == 0 {
            raw.send(connect_packet(V5, &format!("g{i}"), 0)).await;
        }
        let garbage: Vec<u8> = (0..rng.usize(1..64)).map(|_| rng.u8(..)).collect();
        raw.send_raw(&garbage).await;
        drop(raw);
    }
    // Still serving.
    let mut ok = raw_connected(b.addr, V5, "after", 0).await;
    ok.send(Packet::PingReq).await;
    assert_eq!(ok.recv().await, Some(Packet::PingResp));
}
