//! End-to-end delivery with real clients (rumqttc, v3.1.1 and v5) over TCP to a two-worker broker.

mod common;

use std::time::Duration;

use common::*;
use rumqttc::QoS;

#[tokio::test]
async fn qos0_v311_publish_reaches_a_subscriber() {
    let b = start_default();
    let mut sub = v4(v4_options(b.addr, "sub")).await;
    sub.subscribe("a/b", QoS::AtMostOnce).await;
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("a/b", QoS::AtMostOnce, false, "hello").await.unwrap();
    let p = sub.publish().await;
    assert_eq!((p.topic.as_str(), &p.payload[..], p.qos), ("a/b", &b"hello"[..], QoS::AtMostOnce));
}

#[tokio::test]
async fn qos1_v311_publish_is_acknowledged_and_delivered_in_order() {
    let b = start_default();
    let mut sub = v4(v4_options(b.addr, "sub")).await;
    sub.subscribe("t", QoS::AtLeastOnce).await;
    let mut publisher = v4(v4_options(b.addr, "pub")).await;
    for i in 0..50 {
        publisher.client.publish("t", QoS::AtLeastOnce, false, format!("{i}")).await.unwrap();
    }
    for i in 0..50 {
        let p = sub.publish().await;
        assert_eq!(p.qos, QoS::AtLeastOnce);
        assert_eq!(p.payload, format!("{i}").as_bytes(), "ordered delivery per topic (4.6)");
    }
    let mut acks = 0;
    while acks < 50 {
        publisher.incoming(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(())).await;
        acks += 1;
    }
}

#[tokio::test]
async fn qos2_v311_exactly_once_end_to_end() {
    let b = start_default();
    let mut sub = v4(v4_options(b.addr, "sub")).await;
    sub.subscribe("q2", QoS::ExactlyOnce).await;
    let mut publisher = v4(v4_options(b.addr, "pub")).await;
    for i in 0..10 {
        publisher.client.publish("q2", QoS::ExactlyOnce, false, format!("{i}")).await.unwrap();
    }
    for i in 0..10 {
        let p = sub.publish().await;
        assert_eq!((p.qos, &p.payload[..]), (QoS::ExactlyOnce, format!("{i}").as_bytes()));
    }
    for _ in 0..10 {
        publisher.incoming(|p| matches!(p, rumqttc::Packet::PubComp(_)).then_some(())).await;
    }
    sub.no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn v5_publisher_reaches_v311_and_v5_subscribers_at_qos1_and_qos2() {
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let mut sub4 = v4(v4_options(b.addr, "sub4")).await;
    sub4.subscribe("mixed/+", QoS::ExactlyOnce).await;
    let mut sub5 = v5(v5_options(b.addr, "sub5")).await;
    sub5.subscribe("mixed/#", Q5::ExactlyOnce).await;
    let mut publisher = v5(v5_options(b.addr, "pub5")).await;
    publisher.client.publish("mixed/x", Q5::AtLeastOnce, false, "one").await.unwrap();
    publisher.client.publish("mixed/x", Q5::ExactlyOnce, false, "two").await.unwrap();
    for expected in [("one", 1u8), ("two", 2)] {
        let p = sub4.publish().await;
        assert_eq!((&p.payload[..], p.qos as u8), (expected.0.as_bytes(), expected.1));
        let p = sub5.publish().await;
        assert_eq!((&p.payload[..], p.qos as u8), (expected.0.as_bytes(), expected.1));
    }
    publisher.incoming(|p| matches!(p, V5Packet::PubAck(_)).then_some(())).await;
    publisher.incoming(|p| matches!(p, V5Packet::PubComp(_)).then_some(())).await;
}

#[tokio::test]
async fn qos_is_downgraded_to_the_subscriptions_maximum() {
    let b = start_default();
    let mut sub = v4(v4_options(b.addr, "sub")).await;
    sub.subscribe("d", QoS::AtMostOnce).await;
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("d", QoS::ExactlyOnce, false, "x").await.unwrap();
    assert_eq!(sub.publish().await.qos, QoS::AtMostOnce);
}

#[tokio::test]
async fn wildcards_match_and_dollar_topics_are_not_matched_by_leading_wildcards_mqtt_4_7_2_1() {
    let b = start_default();
    let mut plus = v4(v4_options(b.addr, "plus")).await;
    plus.subscribe("sensors/+/temp", QoS::AtMostOnce).await;
    let mut hash = v4(v4_options(b.addr, "hash")).await;
    hash.subscribe("#", QoS::AtMostOnce).await;
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("$SYS/x", QoS::AtMostOnce, false, "sys").await.unwrap();
    publisher.client.publish("sensors/k/temp", QoS::AtMostOnce, false, "1").await.unwrap();
    publisher.client.publish("sensors/k/hum", QoS::AtMostOnce, false, "2").await.unwrap();
    assert_eq!(plus.publish().await.payload, "1".as_bytes());
    plus.no_publish(Duration::from_millis(300)).await;
    assert_eq!(hash.publish().await.payload, "1".as_bytes(), "not $SYS/x");
    assert_eq!(hash.publish().await.payload, "2".as_bytes());
}

#[tokio::test]
async fn shared_subscription_gives_each_message_to_one_member() {
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let mut a = v5(v5_options(b.addr, "member-a")).await;
    a.subscribe("$share/g/jobs/#", Q5::AtLeastOnce).await;
    let mut c = v5(v5_options(b.addr, "member-c")).await;
    c.subscribe("$share/g/jobs/#", Q5::AtLeastOnce).await;
    let publisher = v5(v5_options(b.addr, "pub")).await;
    for i in 0..10 {
        publisher.client.publish(format!("jobs/{i}"), Q5::AtLeastOnce, false, "x").await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(a.publish().await.topic);
        got.push(c.publish().await.topic);
    }
    a.no_publish(Duration::from_millis(200)).await;
    c.no_publish(Duration::from_millis(100)).await;
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 10, "each message exactly once across the group, round-robin");
}

#[tokio::test]
async fn no_local_and_subscription_identifiers_v5() {
    use rumqttc::v5::mqttbytes::v5::{Filter, RetainForwardRule, SubscribeProperties};
    use rumqttc::v5::mqttbytes::QoS as Q5;
    let b = start_default();
    let mut me = v5(v5_options(b.addr, "me")).await;
    let mut filter = Filter::new("chat", Q5::AtMostOnce);
    filter.nolocal = true;
    filter.retain_forward_rule = RetainForwardRule::OnEverySubscribe;
    me.client.subscribe_many([filter]).await.unwrap();
    me.incoming(|p| matches!(p, V5Packet::SubAck(_)).then_some(())).await;
    let mut other = v5(v5_options(b.addr, "other")).await;
    let props = SubscribeProperties { id: Some(42), user_properties: vec![] };
    other.client.subscribe_with_properties("chat", Q5::AtMostOnce, props).await.unwrap();
    other.incoming(|p| matches!(p, V5Packet::SubAck(_)).then_some(())).await;
    me.client.publish("chat", Q5::AtMostOnce, false, "mine").await.unwrap();
    let p = other.publish().await;
    assert_eq!(p.properties.and_then(|p| p.subscription_identifiers.first().copied()), Some(42));
    me.no_publish(Duration::from_millis(300)).await;
}
