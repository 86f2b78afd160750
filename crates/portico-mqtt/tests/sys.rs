//! `$SYS/broker/...`: published every `sys_interval` as retained messages, not matched by a leading wildcard,
//! not publishable by clients.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use portico_mqtt::codec::QoS;
use portico_mqtt::BrokerConfig;
use rumqttc::v5::mqttbytes::v5::PubAckReason;

fn every_second() -> BrokerConfig {
    BrokerConfig { sys_interval: Duration::from_secs(1), ..Default::default() }
}

/// The `$SYS` values `client` receives until `done` says it has what it waits for.
async fn sys_values(
    client: &mut V4,
    mut done: impl FnMut(&HashMap<String, String>) -> bool,
) -> HashMap<String, String> {
    let mut values = HashMap::new();
    while !done(&values) {
        let p = client.publish().await;
        values.insert(p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned());
    }
    values
}

#[tokio::test]
async fn a_sys_subscriber_gets_the_figures_retained_then_as_they_change() {
    let b = start(every_second());
    let mut sys = v4(v4_options(b.addr, "sys-watcher")).await;
    sys.subscribe("$SYS/#", rumqttc::QoS::AtMostOnce).await;
    // The retained ones at once: the broker published them when it opened.
    let first = sys_values(&mut sys, |v| v.len() >= 44).await;
    assert!(first["$SYS/broker/version"].starts_with("portico version "), "{first:?}");
    assert!(first["$SYS/broker/uptime"].ends_with(" seconds"), "{first:?}");
    for name in ["clients/total", "subscriptions/count", "retained messages/count", "load/bytes/received/15min"] {
        assert!(first.contains_key(&format!("$SYS/broker/{name}")), "{name} missing: {first:?}");
    }

    // A publish counts; within the next interval the changed figures come, live.
    let publisher = v4(v4_options(b.addr, "sys-publisher")).await;
    publisher.client.publish("plain/topic", rumqttc::QoS::AtLeastOnce, true, "x").await.expect("queued");
    let changed = sys_values(&mut sys, |v| {
        v.get("$SYS/broker/publish/messages/received").is_some_and(|n| n == "1")
            && v.get("$SYS/broker/clients/connected").is_some_and(|n| n == "2")
            && v.get("$SYS/broker/retained messages/count").is_some_and(|n| n == "1")
    })
    .await;
    assert_eq!(changed.get("$SYS/broker/clients/maximum").map(String::as_str), Some("2"), "{changed:?}");
    let bytes: u64 = changed["$SYS/broker/bytes/received"].parse().expect("a number");
    assert!(bytes > 0, "{changed:?}");
}

#[tokio::test]
async fn a_leading_wildcard_does_not_match_sys_topics_mqtt_4_7_2_1() {
    let b = start(every_second());
    let mut everything = v4(v4_options(b.addr, "hash")).await;
    everything.subscribe("#", rumqttc::QoS::AtMostOnce).await;
    let mut levels = v4(v4_options(b.addr, "plus")).await;
    levels.subscribe("+/broker/#", rumqttc::QoS::AtMostOnce).await;
    // Neither the retained $SYS messages nor two intervals of live ones.
    everything.no_publish(Duration::from_millis(2200)).await;
    levels.no_publish(Duration::from_millis(100)).await;
    // While an ordinary topic still reaches `#`.
    let publisher = v4(v4_options(b.addr, "pub")).await;
    publisher.client.publish("a/b", rumqttc::QoS::AtMostOnce, false, "hi").await.expect("queued");
    assert_eq!(everything.publish().await.topic, "a/b");
}

#[tokio::test]
async fn clients_cannot_publish_to_sys() {
    let b = start(every_second());
    let mut sys = v4(v4_options(b.addr, "sys-watcher")).await;
    sys.subscribe("$SYS/broker/uptime", rumqttc::QoS::AtMostOnce).await;
    assert!(sys.publish().await.payload.ends_with(b" seconds"), "the retained uptime");

    // v5, QoS 1: PUBACK Not authorized (0x87).
    let mut forger5 = v5(v5_options(b.addr, "forger5")).await;
    forger5
        .client
        .publish("$SYS/broker/uptime", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, true, "forged")
        .await
        .expect("queued");
    // rumqttc ends its event loop on a refused PUBACK, saying why.
    let refused = forger5.closed().await;
    assert!(refused.contains(&format!("{:?}", PubAckReason::NotAuthorized)), "{refused}");
    // v3.1.1, QoS 0: dropped.
    let forger4 = v4(v4_options(b.addr, "forger4")).await;
    forger4.client.publish("$SYS/broker/uptime", rumqttc::QoS::AtMostOnce, true, "forged").await.expect("queued");

    // What the subscriber gets is the broker's uptime, never the forgery; nor is it retained.
    let deadline = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < deadline {
        if let Ok(p) = tokio::time::timeout(Duration::from_millis(300), sys.publish()).await {
            assert!(p.payload.ends_with(b" seconds"), "{p:?}");
        }
    }
    let mut late = v4(v4_options(b.addr, "late")).await;
    late.subscribe("$SYS/broker/uptime", rumqttc::QoS::AtMostOnce).await;
    assert!(late.publish().await.payload.ends_with(b" seconds"));

    // Nor through the HTTP bridge's entry point.
    assert!(b.broker.publish_external("$SYS/broker/uptime", "forged".into(), QoS::AtMostOnce, true).is_err());
}

#[tokio::test]
async fn sys_interval_0_publishes_nothing_and_a_change_turns_it_on_and_off() {
    let b = start(BrokerConfig { sys_interval: Duration::ZERO, ..Default::default() });
    let mut sys = v4(v4_options(b.addr, "sys-watcher")).await;
    sys.subscribe("$SYS/#", rumqttc::QoS::AtMostOnce).await;
    sys.no_publish(Duration::from_millis(1200)).await;

    // Turned on (a reload): published at once, to the subscriber and retained.
    b.broker.set_sys_interval(Duration::from_secs(1));
    let values = sys_values(&mut sys, |v| v.len() >= 44).await;
    assert_eq!(values.get("$SYS/broker/clients/connected").map(String::as_str), Some("1"));

    // Turned off: the retained figures go (they would go stale), and nothing more comes.
    b.broker.set_sys_interval(Duration::ZERO);
    sys.no_publish(Duration::from_millis(1500)).await;
    let mut late = v4(v4_options(b.addr, "late")).await;
    late.subscribe("$SYS/#", rumqttc::QoS::AtMostOnce).await;
    late.no_publish(Duration::from_millis(300)).await;
}

#[test]
fn mosquitto_sub_reads_sys() {
    let found = std::process::Command::new("sh").args(["-c", "command -v mosquitto_sub"]).output();
    if !found.is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("CI").is_none(), "mosquitto_sub is needed under CI");
        eprintln!("SKIPPED mosquitto_sub_reads_sys: mosquitto-clients is not installed");
        return;
    }
    let b = start(every_second());
    let port = b.addr.port().to_string();
    for version in ["mqttv311", "mqttv5"] {
        let out = std::process::Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", version, "-t", "$SYS/broker/clients/#", "-v"])
            .args(["-C", "5", "-W", "10"])
            .output()
            .expect("mosquitto_sub runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{version}: {text} {}", String::from_utf8_lossy(&out.stderr));
        for name in ["connected", "disconnected", "total", "maximum", "expired"] {
            assert!(text.contains(&format!("$SYS/broker/clients/{name} ")), "{version}: {text}");
        }
    }
}
