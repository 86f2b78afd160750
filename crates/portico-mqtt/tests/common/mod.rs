//! The test harness: a broker served on 127.0.0.1:0 by two worker threads (each a current-thread runtime,
//! connections handed out round-robin), rumqttc clients whose events arrive on a channel, and raw sockets
//! speaking through the crate's own codec.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use bytes::BytesMut;
use portico_mqtt::codec::{Packet, ProtocolVersion, MAX_PACKET_SIZE};
use portico_mqtt::{Broker, BrokerConfig, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

pub const WAIT: Duration = Duration::from_secs(5);

pub struct TestBroker {
    pub broker: Broker,
    pub server: Server,
    pub addr: SocketAddr,
}

pub fn start(config: BrokerConfig) -> TestBroker {
    let broker = Broker::open(config).expect("broker opens");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = Server::start(broker.clone(), listener, 2).expect("server starts");
    let addr = server.local_addr();
    TestBroker { broker, server, addr }
}

pub fn start_default() -> TestBroker {
    start(BrokerConfig::default())
}

/// A v3.1.1 rumqttc client. Its event loop stops at the first error (no reconnection).
pub struct V4 {
    pub client: rumqttc::AsyncClient,
    pub events: mpsc::UnboundedReceiver<Result<rumqttc::Event, String>>,
    pub task: tokio::task::JoinHandle<()>,
}

pub fn v4_options(addr: SocketAddr, id: &str) -> rumqttc::MqttOptions {
    let mut options = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    options
}

pub async fn v4(options: rumqttc::MqttOptions) -> V4 {
    let (client, mut eventloop) = rumqttc::AsyncClient::new(options, 100);
    let (tx, events) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(event) => {
                    if tx.send(Ok(event)).is_err() {
                        return;
                    }
                }
                Err(err) => {
                    let _ = tx.send(Err(err.to_string()));
                    return;
                }
            }
        }
    });
    let mut v4 = V4 { client, events, task };
    v4.connack().await;
    v4
}

impl V4 {
    pub async fn connack(&mut self) -> rumqttc::ConnAck {
        loop {
            match self.next().await {
                Some(Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack)))) => return ack,
                Some(Ok(_)) => {}
                other => panic!("no CONNACK: {other:?}"),
            }
        }
    }

    pub async fn next(&mut self) -> Option<Result<rumqttc::Event, String>> {
        tokio::time::timeout(WAIT, self.events.recv()).await.ok().flatten()
    }

    /// The next incoming packet matching `pick`, skipping others.
    pub async fn incoming<T>(&mut self, mut pick: impl FnMut(&rumqttc::Packet) -> Option<T>) -> T {
        loop {
            match self.next().await {
                Some(Ok(rumqttc::Event::Incoming(packet))) => {
                    if let Some(found) = pick(&packet) {
                        return found;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("expected packet not received: {other:?}"),
            }
        }
    }

    pub async fn publish(&mut self) -> rumqttc::Publish {
        self.incoming(|p| match p {
            rumqttc::Packet::Publish(p) => Some(p.clone()),
            _ => None,
        })
        .await
    }

    pub async fn suback(&mut self) -> rumqttc::SubAck {
        self.incoming(|p| match p {
            rumqttc::Packet::SubAck(ack) => Some(ack.clone()),
            _ => None,
        })
        .await
    }

    pub async fn subscribe(&mut self, filter: &str, qos: rumqttc::QoS) {
        self.client.subscribe(filter, qos).await.expect("subscribe queued");
        self.suback().await;
    }

    /// No PUBLISH arrives within `within`.
    pub async fn no_publish(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => return,
                Ok(Some(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))))) => panic!("unexpected {p:?}"),
                Ok(Some(_)) => {}
                Ok(None) => return,
            }
        }
    }

    /// Waits until the event loop reports the connection's end.
    pub async fn closed(&mut self) -> String {
        loop {
            match self.next().await {
                Some(Err(err)) => return err,
                Some(Ok(_)) => {}
                None => panic!("the connection was not closed"),
            }
        }
    }
}

/// A v5 rumqttc client, as [`V4`].
pub struct V5 {
    pub client: rumqttc::v5::AsyncClient,
    pub events: mpsc::UnboundedReceiver<Result<rumqttc::v5::Event, String>>,
    pub task: tokio::task::JoinHandle<()>,
}

pub type V5Packet = rumqttc::v5::mqttbytes::v5::Packet;

pub fn v5_options(addr: SocketAddr, id: &str) -> rumqttc::v5::MqttOptions {
    let mut options = rumqttc::v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    options
}

pub async fn v5(options: rumqttc::v5::MqttOptions) -> V5 {
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 100);
    let (tx, events) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(event) => {
                    if tx.send(Ok(event)).is_err() {
                        return;
                    }
                }
                Err(err) => {
                    let _ = tx.send(Err(format!("{err:?}")));
                    return;
                }
            }
        }
    });
    let mut v5 = V5 { client, events, task };
    v5.connack().await;
    v5
}

impl V5 {
    pub async fn connack(&mut self) -> rumqttc::v5::mqttbytes::v5::ConnAck {
        loop {
            match self.next().await {
                Some(Ok(rumqttc::v5::Event::Incoming(V5Packet::ConnAck(ack)))) => return ack,
                Some(Ok(_)) => {}
                other => panic!("no CONNACK: {other:?}"),
            }
        }
    }

    pub async fn next(&mut self) -> Option<Result<rumqttc::v5::Event, String>> {
        tokio::time::timeout(WAIT, self.events.recv()).await.ok().flatten()
    }

    pub async fn incoming<T>(&mut self, mut pick: impl FnMut(&V5Packet) -> Option<T>) -> T {
        loop {
            match self.next().await {
                Some(Ok(rumqttc::v5::Event::Incoming(packet))) => {
                    if let Some(found) = pick(&packet) {
                        return found;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("expected packet not received: {other:?}"),
            }
        }
    }

    pub async fn publish(&mut self) -> rumqttc::v5::mqttbytes::v5::Publish {
        self.incoming(|p| match p {
            V5Packet::Publish(p) => Some(p.clone()),
            _ => None,
        })
        .await
    }

    pub async fn subscribe(&mut self, filter: &str, qos: rumqttc::v5::mqttbytes::QoS) {
        self.client.subscribe(filter, qos).await.expect("subscribe queued");
        self.incoming(|p| matches!(p, V5Packet::SubAck(_)).then_some(())).await;
    }

    pub async fn no_publish(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => return,
                Ok(Some(Ok(rumqttc::v5::Event::Incoming(V5Packet::Publish(p))))) => panic!("unexpected {p:?}"),
                Ok(Some(_)) => {}
                Ok(None) => return,
            }
        }
    }

    pub async fn closed(&mut self) -> String {
        loop {
            match self.next().await {
                Some(Err(err)) => return err,
                Some(Ok(_)) => {}
                None => panic!("the connection was not closed"),
            }
        }
    }
}

/// A raw connection speaking through the crate's codec.
pub struct Raw {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub version: ProtocolVersion,
}

impl Raw {
    pub async fn connect(addr: SocketAddr, version: ProtocolVersion) -> Raw {
        Raw { stream: TcpStream::connect(addr).await.expect("connect"), buf: BytesMut::new(), version }
    }

    pub async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        packet.encode(self.version, &mut out).expect("encodes");
        self.stream.write_all(&out).await.expect("write");
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// The next packet, or `None` when the server closed the connection.
    pub async fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Some(packet) =
                Packet::decode(&mut self.buf, self.version, MAX_PACKET_SIZE).expect("server sends valid packets")
            {
                return Some(packet);
            }
            let n =
                tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf)).await.expect("server answers in time");
            match n {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Reads until the server closes; returns the packets it sent before.
    pub async fn until_closed(&mut self) -> Vec<Packet> {
        let mut packets = Vec::new();
        while let Some(packet) = self.recv().await {
            packets.push(packet);
        }
        packets
    }
}

pub fn connect_packet(version: ProtocolVersion, client_id: &str, keep_alive: u16) -> Packet {
    Packet::Connect(Box::new(portico_mqtt::codec::Connect {
        version,
        clean_start: true,
        keep_alive,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: Default::default(),
    }))
}

/// A raw connection past CONNACK.
pub async fn raw_connected(addr: SocketAddr, version: ProtocolVersion, client_id: &str, keep_alive: u16) -> Raw {
    let mut raw = Raw::connect(addr, version).await;
    raw.send(connect_packet(version, client_id, keep_alive)).await;
    match raw.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason, portico_mqtt::codec::ReasonCode::Success),
        other => panic!("no CONNACK: {other:?}"),
    }
    raw
}
