//! Sessions, retained messages, wills, keep-alive and takeover, with real clients over TCP.

mod common;

use std::time::{Duration, Instant};

use common::*;
use portico_mqtt::codec::{Disconnect, Packet, ProtocolVersion, ReasonCode};
use rumqttc::QoS;

#[tokio::test]
async fn retained_messages_set_replace_delete_and_match_wildcards_mqtt_3_3_1_6() {
    let b = start_default();
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("home/kitchen/temp", QoS::AtLeastOnce, true, "20").await.unwrap();
    publisher.client.publish("home/kitchen/temp", QoS::AtLeastOnce, true, "21").await.unwrap();
    publisher.client.publish("home/hall/temp", QoS::AtLeastOnce, true, "18").await.unwrap();
    publisher.client.publish("home/hall/temp", QoS::AtLeastOnce, true, "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut sub = v4(v4_options(b.addr, "sub")).await;
    sub.subscribe("home/+/temp", QoS::AtLeastOnce).await;
    let p = sub.publish().await;
    assert_eq!((p.topic.as_str(), &p.payload[..], p.retain), ("home/kitchen/temp", &b"21"[..], true));
    sub.no_publish(Duration::from_millis(300)).await;
    // A message forwarded to an established subscription carries RETAIN 0 in 3.1.1 [MQTT-3.3.1-9].
    publisher.client.publish("home/kitchen/temp", QoS::AtLeastOnce, true, "22").await.unwrap();
    let p = sub.publish().await;
    assert_eq!((&p.payload[..], p.retain), (&b"22"[..], false));
    assert_eq!(b.broker.retained_count(), 1);
}

#[tokio::test]
async fn retain_handling_never_and_retain_as_published_v5() {
    use rumqttc::v5::mqttbytes::v5::{Filter, RetainForwardRule};
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let publisher = v5(v5_options(b.addr, "pub")).await;
    publisher.client.publish("r", Q5::AtLeastOnce, true, "kept").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut sub = v5(v5_options(b.addr, "sub")).await;
    let mut filter = Filter::new("r", Q5::AtLeastOnce);
    filter.retain_forward_rule = RetainForwardRule::Never;
    filter.preserve_retain = true;
    sub.client.subscribe_many([filter]).await.unwrap();
    sub.incoming(|p| matches!(p, V5Packet::SubAck(_)).then_some(())).await;
    sub.no_publish(Duration::from_millis(300)).await;
    publisher.client.publish("r", Q5::AtLeastOnce, true, "again").await.unwrap();
    let p = sub.publish().await;
    assert!(p.retain, "retain as published keeps the flag");
}

#[tokio::test]
async fn session_resume_redelivers_unacknowledged_messages_with_dup_mqtt_4_4_0_1() {
    let b = start_default();
    let mut options = v4_options(b.addr, "resumer");
    options.set_clean_session(false).set_manual_acks(true);
    let mut sub = v4(options.clone()).await;
    sub.subscribe("jobs", QoS::AtLeastOnce).await;
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("jobs", QoS::AtLeastOnce, false, "1").await.unwrap();
    let first = sub.publish().await;
    assert!(!first.dup);
    // Never acknowledged; the connection drops.
    sub.task.abort();
    drop(sub);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Queued while offline.
    publisher.client.publish("jobs", QoS::AtLeastOnce, false, "2").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut sub = v4(options).await;
    let again = sub.publish().await;
    assert_eq!((&again.payload[..], again.dup, again.pkid), (&b"1"[..], true, first.pkid));
    sub.client.ack(&again).await.unwrap();
    let queued = sub.publish().await;
    assert_eq!((&queued.payload[..], queued.dup), (&b"2"[..], false));
}

#[tokio::test]
async fn clean_session_discards_the_old_session() {
    let b = start_default();
    let mut options = v4_options(b.addr, "cleaner");
    options.set_clean_session(false);
    let mut sub = v4(options.clone()).await;
    sub.subscribe("x", QoS::AtLeastOnce).await;
    sub.client.disconnect().await.unwrap();
    sub.closed().await;
    options.set_clean_session(true);
    let mut sub = v4(options).await;
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("x", QoS::AtLeastOnce, false, "gone").await.unwrap();
    sub.no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn will_is_published_on_abnormal_close_and_not_after_disconnect_mqtt_3_1_2_8() {
    let b = start_default();
    let mut watcher = v4(v4_options(b.addr, "watcher")).await;
    watcher.subscribe("wills/#", QoS::AtLeastOnce).await;
    let mut options = v4_options(b.addr, "dies");
    options.set_last_will(rumqttc::LastWill::new("wills/dies", "gone", QoS::AtLeastOnce, false));
    let dies = v4(options).await;
    dies.task.abort();
    drop(dies);
    let p = watcher.publish().await;
    assert_eq!((p.topic.as_str(), &p.payload[..]), ("wills/dies", &b"gone"[..]));
    let mut options = v4_options(b.addr, "polite");
    options.set_last_will(rumqttc::LastWill::new("wills/polite", "gone", QoS::AtLeastOnce, false));
    let mut polite = v4(options).await;
    polite.client.disconnect().await.unwrap();
    polite.closed().await;
    watcher.no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn will_delay_waits_and_a_reconnection_cancels_it_v5() {
    use rumqttc::v5::mqttbytes::v5::{ConnectProperties, LastWill, LastWillProperties};
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let mut watcher = v5(v5_options(b.addr, "watcher")).await;
    watcher.subscribe("wills/#", Q5::AtLeastOnce).await;
    let options = |id: &str| {
        let mut options = v5_options(b.addr, id);
        let props = LastWillProperties {
            delay_interval: Some(1),
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: None,
            response_topic: None,
            correlation_data: None,
            user_properties: Vec::new(),
        };
        options.set_last_will(LastWill::new(format!("wills/{id}"), "gone", Q5::AtLeastOnce, false, Some(props)));
        let mut connect = ConnectProperties::new();
        connect.session_expiry_interval = Some(60);
        options.set_connect_properties(connect);
        options.set_clean_start(false);
        options
    };
    // Comes back within the delay: no will.
    let early = v5(options("back")).await;
    early.task.abort();
    drop(early);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _back = v5(options("back")).await;
    // Does not come back: the will after about a second.
    let gone = v5(options("gone")).await;
    let dropped = Instant::now();
    gone.task.abort();
    drop(gone);
    let p = watcher.publish().await;
    assert_eq!(p.topic, "wills/gone".as_bytes());
    assert!(dropped.elapsed() >= Duration::from_millis(900), "after the will delay: {:?}", dropped.elapsed());
    watcher.no_publish(Duration::from_millis(800)).await;
}

#[tokio::test]
async fn keep_alive_closes_a_silent_connection_after_one_and_a_half_times_mqtt_3_1_2_24() {
    let b = start_default();
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        let mut raw = raw_connected(b.addr, version, "silent", 1).await;
        let start = Instant::now();
        let packets = raw.until_closed().await;
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(1400) && waited < Duration::from_millis(3000), "{waited:?}");
        if version.is_v5() {
            assert!(matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::KeepAliveTimeout));
        } else {
            assert!(packets.is_empty());
        }
    }
}

#[tokio::test]
async fn keep_alive_zero_disables_the_timeout_and_pings_keep_a_connection() {
    let b = start_default();
    let mut off = raw_connected(b.addr, ProtocolVersion::V3_1_1, "off", 0).await;
    let mut pinging = raw_connected(b.addr, ProtocolVersion::V3_1_1, "pinging", 1).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        pinging.send(Packet::PingReq).await;
        assert_eq!(pinging.recv().await, Some(Packet::PingResp));
    }
    off.send(Packet::PingReq).await;
    assert_eq!(off.recv().await, Some(Packet::PingResp), "still open after 2 s");
}

#[tokio::test]
async fn a_second_connection_with_the_same_client_id_takes_the_session_over_mqtt_3_1_4_3() {
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let mut first = v5(v5_options(b.addr, "twin")).await;
    first.subscribe("t", Q5::AtMostOnce).await;
    let mut raw = Raw::connect(b.addr, ProtocolVersion::V5).await;
    raw.send(connect_packet(ProtocolVersion::V5, "twin", 0)).await;
    assert!(matches!(raw.recv().await, Some(Packet::ConnAck(_))));
    // rumqttc reports the server's DISCONNECT as the end of its event loop.
    let err = first.closed().await;
    assert!(err.contains("ServerDisconnect { reason_code: SessionTakenOver"), "{err}");
    // The v3 way: the old connection is just closed.
    let mut old = raw_connected(b.addr, ProtocolVersion::V3_1_1, "twin3", 0).await;
    let _new = raw_connected(b.addr, ProtocolVersion::V3_1_1, "twin3", 0).await;
    assert!(old.until_closed().await.is_empty());
    raw.send(Packet::Disconnect(Disconnect::default())).await;
}

#[tokio::test]
async fn v5_assigns_a_client_identifier_and_announces_its_limits() {
    let b = start_default();
    let mut raw = Raw::connect(b.addr, ProtocolVersion::V5).await;
    raw.send(connect_packet(ProtocolVersion::V5, "", 600)).await;
    let Some(Packet::ConnAck(ack)) = raw.recv().await else { panic!("no CONNACK") };
    assert_eq!(ack.reason, ReasonCode::Success);
    assert!(ack.properties.assigned_client_identifier.is_some_and(|id| !id.is_empty()));
    assert_eq!(ack.properties.server_keep_alive, Some(60), "capped to max_keepalive");
    assert!(ack.properties.receive_maximum.is_some() && ack.properties.maximum_packet_size.is_some());
}

#[tokio::test]
async fn takeover_raw_v5_gets_disconnect_session_taken_over() {
    let b = start_default();
    let mut old = raw_connected(b.addr, ProtocolVersion::V5, "twin5", 0).await;
    let _new = raw_connected(b.addr, ProtocolVersion::V5, "twin5", 0).await;
    let packets = old.until_closed().await;
    assert!(matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::SessionTakenOver), "{packets:?}");
}
