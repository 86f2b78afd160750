//! Persistence across a real `kill -9`: the broker runs in a child process (this test binary re-executed with
//! `PORTICO_MQTT_CHILD_STORE` set), a publisher's QoS 1 and 2 messages for an offline persistent subscriber
//! are acknowledged, the child is SIGKILLed, a new child opens the same store, and the subscriber gets every
//! acknowledged message (QoS 2 ones once). Also: a damaged store file does not stop the broker.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;
use portico_mqtt::{Broker, BrokerConfig, PersistenceConfig, Server};
use rumqttc::QoS;

const CHILD_STORE: &str = "PORTICO_MQTT_CHILD_STORE";
const CHILD_PORT_FILE: &str = "PORTICO_MQTT_CHILD_PORT_FILE";

/// The child's side: a broker on the store named by the environment, serving until killed. Without the
/// environment (an ordinary test run) it does nothing.
#[test]
fn persistence_child() {
    let (Ok(store), Ok(port_file)) = (std::env::var(CHILD_STORE), std::env::var(CHILD_PORT_FILE)) else { return };
    let config = BrokerConfig { persistence: Some(PersistenceConfig::new(store)), ..Default::default() };
    let broker = Broker::open(config).expect("broker opens");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(broker, listener, 2).unwrap();
    let tmp = format!("{port_file}.tmp");
    std::fs::write(&tmp, server.local_addr().port().to_string()).unwrap();
    std::fs::rename(&tmp, &port_file).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

struct ChildBroker {
    child: Child,
    addr: std::net::SocketAddr,
}

// The child is killed and waited for by `ChildBroker`'s `Drop` once returned; before that, on every path
// that gives up.
#[allow(clippy::zombie_processes)]
fn spawn_child(store: &Path, dir: &Path, n: u32) -> ChildBroker {
    let port_file = dir.join(format!("port-{n}"));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "persistence_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_STORE, store)
        .env(CHILD_PORT_FILE, &port_file)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("child starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            let port: u16 = port.trim().parse().unwrap();
            return ChildBroker { child, addr: ([127, 0, 0, 1], port).into() };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child broker did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for ChildBroker {
    /// A failing test does not leave its broker running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn acknowledged_messages_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("mqtt.redb");
    let mut broker = spawn_child(&store, dir.path(), 1);

    // A persistent subscriber subscribes and goes away.
    let mut options = v4_options(broker.addr, "durable");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    sub.subscribe("d/1", QoS::AtLeastOnce).await;
    sub.subscribe("d/2", QoS::ExactlyOnce).await;
    sub.client.disconnect().await.unwrap();
    sub.closed().await;

    // The publisher's messages are acknowledged...
    let mut publisher = v4(v4_options(broker.addr, "pub")).await;
    const N1: usize = 100;
    const N2: usize = 50;
    for i in 0..N1 {
        publisher.client.publish("d/1", QoS::AtLeastOnce, false, format!("q1-{i}")).await.unwrap();
    }
    for i in 0..N2 {
        publisher.client.publish("d/2", QoS::ExactlyOnce, false, format!("q2-{i}")).await.unwrap();
    }
    publisher.client.publish("r", QoS::AtLeastOnce, true, "retained").await.unwrap();
    let (mut pubacks, mut pubrecs) = (0, 0);
    while pubacks < N1 + 1 || pubrecs < N2 {
        match publisher.incoming(|p| Some(p.clone())).await {
            rumqttc::Packet::PubAck(_) => pubacks += 1,
            rumqttc::Packet::PubRec(_) => pubrecs += 1,
            _ => {}
        }
    }
    // ...and the broker is killed at once.
    broker.child.kill().unwrap(); // SIGKILL
    broker.child.wait().unwrap();
    publisher.task.abort();

    let mut broker = spawn_child(&store, dir.path(), 2);
    let mut options = v4_options(broker.addr, "durable");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    while seen.len() < N1 + N2 {
        let p = sub.publish().await;
        *seen.entry(String::from_utf8(p.payload.to_vec()).unwrap()).or_default() += 1;
    }
    sub.no_publish(Duration::from_millis(500)).await;
    for i in 0..N2 {
        assert_eq!(seen.get(&format!("q2-{i}")), Some(&1), "QoS 2 message {i} exactly once");
    }
    for i in 0..N1 {
        assert!(seen.contains_key(&format!("q1-{i}")), "QoS 1 message {i}");
    }
    let mut fresh = v4(v4_options(broker.addr, "fresh")).await;
    fresh.subscribe("r", QoS::AtLeastOnce).await;
    assert_eq!(fresh.publish().await.payload, "retained".as_bytes());
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
}

#[tokio::test]
async fn a_damaged_store_is_moved_aside_and_the_broker_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("mqtt.redb");
    std::fs::write(&store, vec![0x5Au8; 100_000]).unwrap();
    let config = BrokerConfig { persistence: Some(PersistenceConfig::new(&store)), ..Default::default() };
    let b = start(config);
    let moved: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("mqtt.redb.corrupt-"))
        .collect();
    assert_eq!(moved.len(), 1, "the damaged file is kept beside, renamed");
    let mut sub = v4(v4_options(b.addr, "s")).await;
    sub.subscribe("x", QoS::AtLeastOnce).await;
    let publisher = v4(v4_options(b.addr, "p")).await;
    publisher.client.publish("x", QoS::AtLeastOnce, false, "works").await.unwrap();
    assert_eq!(sub.publish().await.payload, "works".as_bytes());
}

/// Group commit at work: QoS 1 messages to a persistent subscriber, acknowledged only once committed (fsync
/// on), with a client keeping 100 in flight. Prints messages/s and the mean batch.
/// `cargo test --release -p portico-mqtt --test persistence bench_ -- --ignored --nocapture`
#[tokio::test]
#[ignore]
async fn bench_persistent_qos1_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        persistence: Some(PersistenceConfig::new(dir.path().join("s.redb"))),
        limits: portico_mqtt::Limits { max_queued_messages: 100_000, ..Default::default() },
        ..Default::default()
    };
    let b = start(config);
    let mut options = v4_options(b.addr, "durable");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    sub.subscribe("load", QoS::AtLeastOnce).await;
    sub.client.disconnect().await.unwrap();
    sub.closed().await;
    let mut options = v4_options(b.addr, "pub");
    options.set_inflight(100);
    let mut publisher = v4(options).await;
    const N: usize = 20_000;
    let start = Instant::now();
    let client = publisher.client.clone();
    tokio::spawn(async move {
        for i in 0..N {
            client.publish("load", QoS::AtLeastOnce, false, format!("{i:064}")).await.unwrap();
        }
    });
    let mut acks = 0;
    while acks < N {
        if let rumqttc::Packet::PubAck(_) = publisher.incoming(|p| Some(p.clone())).await {
            acks += 1;
        }
    }
    let elapsed = start.elapsed();
    let mut text = String::new();
    b.broker.render_metrics(&mut text);
    let metric = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0)
    };
    let (commits, ops) = (metric("portico_mqtt_store_commits_total "), metric("portico_mqtt_store_operations_total "));
    println!(
        "persistent QoS 1: {N} messages in {elapsed:?}: {:.0} msg/s; {commits} commits, {:.1} writes per commit",
        N as f64 / elapsed.as_secs_f64(),
        ops / commits.max(1.0)
    );
}
