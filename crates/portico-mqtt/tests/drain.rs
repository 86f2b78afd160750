//! [`serve_until`]: when the server drains, a v5 client gets DISCONNECT Server shutting down (0x8B) after the
//! acknowledgements it is owed, a v3.1.1 connection is closed, and a connection before CONNECT is closed.

use bytes::BytesMut;
use portico_mqtt::codec::{Packet, ProtocolVersion, QoS, ReasonCode, MAX_PACKET_SIZE};
use portico_mqtt::{serve_until, Broker, BrokerConfig, ConnectionError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

fn connect(version: ProtocolVersion, id: &str) -> Packet {
    Packet::Connect(Box::new(portico_mqtt::codec::Connect {
        version,
        clean_start: true,
        keep_alive: 0,
        client_id: id.into(),
        will: None,
        username: None,
        password: None,
        properties: Default::default(),
    }))
}

async fn send(client: &mut DuplexStream, packet: Packet, version: ProtocolVersion) {
    let mut out = BytesMut::new();
    packet.encode(version, &mut out).unwrap();
    client.write_all(&out).await.unwrap();
}

/// Every packet the server sends until it closes.
async fn until_closed(client: &mut DuplexStream, version: ProtocolVersion) -> Vec<Packet> {
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    loop {
        while let Some(p) = Packet::decode(&mut buf, version, MAX_PACKET_SIZE).unwrap() {
            packets.push(p);
        }
        match tokio::time::timeout(Duration::from_secs(5), client.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return packets,
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server did not close; it sent {packets:?}"),
        }
    }
}

/// A connection served until `drain` turns true; returns the client's end and the server task.
fn served(
    broker: &Broker,
    drain: &watch::Sender<bool>,
) -> (DuplexStream, tokio::task::JoinHandle<Result<(), ConnectionError>>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let broker = broker.clone();
    let mut rx = drain.subscribe();
    let task = tokio::task::spawn_local(async move {
        let peer = "127.0.0.1:1".parse().unwrap();
        serve_until(server, peer, &broker, 0, async move {
            let _ = rx.wait_for(|d| *d).await;
        })
        .await
    });
    (client, task)
}

#[tokio::test]
async fn a_drain_says_server_shutting_down_to_v5_and_closes_v3_and_unconnected_clients() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let broker = Broker::open(BrokerConfig::default()).unwrap();
            let (drain, _) = watch::channel(false);
            let (mut v5, v5_task) = served(&broker, &drain);
            send(&mut v5, connect(ProtocolVersion::V5, "five"), ProtocolVersion::V5).await;
            let (mut v3, v3_task) = served(&broker, &drain);
            send(&mut v3, connect(ProtocolVersion::V3_1_1, "three"), ProtocolVersion::V3_1_1).await;
            let (mut early, early_task) = served(&broker, &drain);
            // A QoS 1 PUBLISH just before the drain is acknowledged before the DISCONNECT (it is sent right after
            // CONNECT, without waiting for CONNACK: the server reads both at once and must handle both).
            let publish = portico_mqtt::codec::Publish::new(
                "t".into(),
                QoS::AtLeastOnce,
                portico_mqtt::codec::PacketId::new(9),
                bytes::Bytes::from_static(b"x"),
            );
            send(&mut v5, Packet::Publish(publish), ProtocolVersion::V5).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            drain.send_replace(true);

            let packets = until_closed(&mut v5, ProtocolVersion::V5).await;
            assert!(matches!(packets.first(), Some(Packet::ConnAck(_))), "{packets:?}");
            assert!(matches!(packets.get(1), Some(Packet::PubAck(ack)) if ack.packet_id.get() == 9), "{packets:?}");
            match packets.last() {
                Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::ServerShuttingDown),
                other => panic!("no DISCONNECT: {other:?}"),
            }
            let packets = until_closed(&mut v3, ProtocolVersion::V3_1_1).await;
            assert_eq!(packets.len(), 1, "CONNACK, then closed: {packets:?}");
            assert!(until_closed(&mut early, ProtocolVersion::V5).await.is_empty());
            for task in [v5_task, v3_task, early_task] {
                assert!(matches!(task.await.unwrap(), Err(ConnectionError::ServerShutdown)));
            }
            assert_eq!(broker.metrics().get(portico_mqtt::metrics::Counter::Connections), 0);
        })
        .await;
}
