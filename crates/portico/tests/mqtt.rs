//! The MQTT plane through the binary: real MQTT clients (rumqttc, v3.1.1 and v5; mosquitto_pub/sub when
//! installed; a hand-written client over TLS) on `protocol: mqtt` listeners of a running Portico, beside an
//! HTTP listener: delivery at every QoS, TLS, metrics, reloads, drains, and persistence across `kill -9`.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);

/// An HTTP listener on `{listen}` (a static route) and an MQTT listener on `{mqtt}`, with `extra` appended.
fn both(extra: &str) -> String {
    format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nshutdown: {{ grace: 20s }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n  - name: mqtt\n    address: \"{{mqtt}}\"\n    protocol: mqtt\nroutes:\n  - match: {{ path: /healthz }}\n    static: {{ body: \"ok\\n\" }}\n{extra}"
    )
}

/// A rumqttc client of either version, its events on a channel (the event loop stops at the first error).
struct Client<C, E> {
    client: C,
    events: mpsc::UnboundedReceiver<Result<E, String>>,
}

type V4 = Client<rumqttc::AsyncClient, rumqttc::Event>;
type V5 = Client<rumqttc::v5::AsyncClient, rumqttc::v5::Event>;
type V5Packet = rumqttc::v5::mqttbytes::v5::Packet;

impl<C, E> Client<C, E> {
    async fn next(&mut self) -> Option<Result<E, String>> {
        tokio::time::timeout(WAIT, self.events.recv()).await.ok().flatten()
    }

    /// The first event `pick` takes, skipping the others; panics on the end of the connection.
    async fn wait_for<T>(&mut self, what: &str, mut pick: impl FnMut(&E) -> Option<T>) -> T
    where
        E: std::fmt::Debug,
    {
        loop {
            match self.next().await {
                Some(Ok(event)) => {
                    if let Some(found) = pick(&event) {
                        return found;
                    }
                }
                other => panic!("waiting for {what}: {other:?}"),
            }
        }
    }

    /// How the connection ended (the event loop's error).
    async fn closed(&mut self) -> String {
        loop {
            match self.next().await {
                Some(Err(e)) => return e,
                Some(Ok(_)) => {}
                None => panic!("the connection did not end"),
            }
        }
    }
}

/// Polls `f` until it holds (failing after [`WAIT`]), letting the clients' tasks run meanwhile.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn v4_options(addr: SocketAddr, id: &str) -> rumqttc::MqttOptions {
    let mut options = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    options
}

async fn v4(options: rumqttc::MqttOptions) -> V4 {
    let (client, mut eventloop) = rumqttc::AsyncClient::new(options, 100);
    let (tx, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let event = eventloop.poll().await.map_err(|e| e.to_string());
            let end = event.is_err();
            if tx.send(event).is_err() || end {
                return;
            }
        }
    });
    let mut c = Client { client, events };
    c.wait_for("CONNACK", |e| matches!(e, rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))).then_some(())).await;
    c
}

impl V4 {
    async fn subscribe(&mut self, filter: &str, qos: rumqttc::QoS) {
        self.client.subscribe(filter, qos).await.unwrap();
        self.wait_for("SUBACK", |e| matches!(e, rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))).then_some(()))
            .await;
    }

    async fn publish(&mut self) -> rumqttc::Publish {
        self.wait_for("PUBLISH", |e| match e {
            rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) => Some(p.clone()),
            _ => None,
        })
        .await
    }

    /// Publishes and waits for the broker's acknowledgement (PUBACK at QoS 1, PUBCOMP at QoS 2).
    async fn publish_acked(&mut self, topic: &str, qos: rumqttc::QoS, payload: &str) {
        self.client.publish(topic, qos, false, payload.as_bytes().to_vec()).await.unwrap();
        match qos {
            rumqttc::QoS::AtMostOnce => {
                self.wait_for("the PUBLISH sent", |e| {
                    matches!(e, rumqttc::Event::Outgoing(rumqttc::Outgoing::Publish(_))).then_some(())
                })
                .await
            }
            rumqttc::QoS::AtLeastOnce => {
                self.wait_for("PUBACK", |e| {
                    matches!(e, rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))).then_some(())
                })
                .await
            }
            rumqttc::QoS::ExactlyOnce => {
                self.wait_for("PUBCOMP", |e| {
                    matches!(e, rumqttc::Event::Incoming(rumqttc::Packet::PubComp(_))).then_some(())
                })
                .await
            }
        }
    }
}

fn v5_options(addr: SocketAddr, id: &str) -> rumqttc::v5::MqttOptions {
    let mut options = rumqttc::v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    options
}

async fn v5(options: rumqttc::v5::MqttOptions) -> (V5, rumqttc::v5::mqttbytes::v5::ConnAck) {
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 100);
    let (tx, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let event = eventloop.poll().await.map_err(|e| format!("{e:?}"));
            let end = event.is_err();
            if tx.send(event).is_err() || end {
                return;
            }
        }
    });
    let mut c = Client { client, events };
    let ack = c
        .wait_for("CONNACK", |e| match e {
            rumqttc::v5::Event::Incoming(V5Packet::ConnAck(ack)) => Some(ack.clone()),
            _ => None,
        })
        .await;
    (c, ack)
}

impl V5 {
    async fn subscribe(&mut self, filter: &str, qos: rumqttc::v5::mqttbytes::QoS) {
        self.client.subscribe(filter, qos).await.unwrap();
        self.wait_for("SUBACK", |e| matches!(e, rumqttc::v5::Event::Incoming(V5Packet::SubAck(_))).then_some(())).await;
    }

    async fn publish(&mut self) -> rumqttc::v5::mqttbytes::v5::Publish {
        self.wait_for("PUBLISH", |e| match e {
            rumqttc::v5::Event::Incoming(V5Packet::Publish(p)) => Some(p.clone()),
            _ => None,
        })
        .await
    }

    async fn publish_acked(&mut self, topic: &str, qos: rumqttc::v5::mqttbytes::QoS, payload: &str) {
        use rumqttc::v5::mqttbytes::QoS as Q;
        self.client.publish(topic, qos, false, payload.as_bytes().to_vec()).await.unwrap();
        match qos {
            Q::AtMostOnce => {
                self.wait_for("the PUBLISH sent", |e| {
                    matches!(e, rumqttc::v5::Event::Outgoing(rumqttc::Outgoing::Publish(_))).then_some(())
                })
                .await
            }
            Q::AtLeastOnce => {
                self.wait_for("PUBACK", |e| {
                    matches!(e, rumqttc::v5::Event::Incoming(V5Packet::PubAck(_))).then_some(())
                })
                .await
            }
            Q::ExactlyOnce => {
                self.wait_for("PUBCOMP", |e| {
                    matches!(e, rumqttc::v5::Event::Incoming(V5Packet::PubComp(_))).then_some(())
                })
                .await
            }
        }
    }
}

fn v4_qos(n: u8) -> rumqttc::QoS {
    [rumqttc::QoS::AtMostOnce, rumqttc::QoS::AtLeastOnce, rumqttc::QoS::ExactlyOnce][usize::from(n)]
}

fn v5_qos(n: u8) -> rumqttc::v5::mqttbytes::QoS {
    use rumqttc::v5::mqttbytes::QoS as Q;
    [Q::AtMostOnce, Q::AtLeastOnce, Q::ExactlyOnce][usize::from(n)]
}

#[tokio::test]
async fn v3_and_v5_clients_publish_and_subscribe_at_every_qos_beside_an_http_listener() {
    let p = Portico::start(&both(""));
    let (mut sub5, _) = v5(v5_options(p.mqtt, "sub5")).await;
    let mut sub4 = v4(v4_options(p.mqtt, "sub4")).await;
    sub5.subscribe("from/v4/#", v5_qos(2)).await;
    sub4.subscribe("from/v5/#", v4_qos(2)).await;
    let mut pub4 = v4(v4_options(p.mqtt, "pub4")).await;
    let (mut pub5, _) = v5(v5_options(p.mqtt, "pub5")).await;
    for qos in 0..3 {
        pub4.publish_acked(&format!("from/v4/{qos}"), v4_qos(qos), &format!("v4 at {qos}")).await;
        let got = sub5.publish().await;
        assert_eq!(
            (&got.topic[..], &got.payload[..], got.qos),
            (format!("from/v4/{qos}").as_bytes(), format!("v4 at {qos}").as_bytes(), v5_qos(qos))
        );
        pub5.publish_acked(&format!("from/v5/{qos}"), v5_qos(qos), &format!("v5 at {qos}")).await;
        let got = sub4.publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..], got.qos),
            (format!("from/v5/{qos}").as_str(), format!("v5 at {qos}").as_bytes(), v4_qos(qos))
        );
    }
    // The HTTP listener of the same process answers.
    let r = Conn::open(p.addr).get("/healthz", "");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
    // And the broker's metrics are on the admin server's /metrics, beside HTTP's.
    assert_eq!(p.metric("portico_mqtt_connections"), 4.0);
    assert_eq!(p.metric("portico_mqtt_subscriptions"), 2.0);
    for qos in 0..3 {
        assert_eq!(p.metric(&format!("portico_mqtt_messages_received_total{{qos=\"{qos}\"}}")), 2.0, "qos {qos}");
        assert_eq!(p.metric(&format!("portico_mqtt_messages_sent_total{{qos=\"{qos}\"}}")), 2.0, "qos {qos}");
    }
    let text = p.admin_get("/metrics").text();
    for family in ["portico_requests_total", "portico_mqtt_connections_total", "portico_mqtt_sessions"] {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing:\n{text}");
    }
    let view: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/mqtt").body).unwrap();
    assert_eq!(view["connections"], 4, "{view}");
}

/// A minimal blocking MQTT 3.1.1 client, written from the specification, over any byte stream.
struct Wire<S: Read + Write>(S);

impl<S: Read + Write> Wire<S> {
    fn packet(&mut self, first: u8, body: &[u8]) {
        let mut out = vec![first];
        let mut len = body.len();
        loop {
            let byte = (len % 128) as u8;
            len /= 128;
            out.push(if len > 0 { byte | 0x80 } else { byte });
            if len == 0 {
                break;
            }
        }
        out.extend_from_slice(body);
        self.0.write_all(&out).unwrap();
        self.0.flush().unwrap();
    }

    /// The next packet: its first byte and body.
    fn read(&mut self) -> (u8, Vec<u8>) {
        let mut byte = [0u8; 1];
        self.0.read_exact(&mut byte).unwrap();
        let first = byte[0];
        let (mut len, mut shift) = (0usize, 0);
        loop {
            self.0.read_exact(&mut byte).unwrap();
            len |= usize::from(byte[0] & 0x7f) << shift;
            shift += 7;
            if byte[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.0.read_exact(&mut body).unwrap();
        (first, body)
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(s.as_bytes());
        out
    }

    fn connect(&mut self, id: &str) {
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 30];
        body.extend(Self::string(id));
        self.packet(0x10, &body);
        assert_eq!(self.read(), (0x20, vec![0, 0]), "CONNACK accepted");
    }

    /// CONNECT (3.1.1) with a user name and password, if given: the CONNACK's body.
    fn connect_as(&mut self, id: &str, user: Option<&str>, password: Option<&str>) -> Vec<u8> {
        let flags = 0x02 | if user.is_some() { 0x80 } else { 0 } | if password.is_some() { 0x40 } else { 0 };
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, flags, 0, 30];
        body.extend(Self::string(id));
        body.extend(user.map(Self::string).unwrap_or_default());
        body.extend(password.map(Self::string).unwrap_or_default());
        self.packet(0x10, &body);
        let (first, body) = self.read();
        assert_eq!(first, 0x20, "CONNACK");
        body
    }

    /// SUBSCRIBE: the SUBACK's return code.
    fn subscribe_code(&mut self, filter: &str, qos: u8) -> u8 {
        let mut body = vec![0, 2];
        body.extend(Self::string(filter));
        body.push(qos);
        self.packet(0x82, &body);
        let (first, body) = self.read();
        assert_eq!((first, &body[..2]), (0x90, &[0u8, 2][..]), "SUBACK");
        body[2]
    }

    fn subscribe(&mut self, filter: &str, qos: u8) {
        let mut body = vec![0, 1];
        body.extend(Self::string(filter));
        body.push(qos);
        self.packet(0x82, &body);
        assert_eq!(self.read(), (0x90, vec![0, 1, qos]), "SUBACK");
    }

    fn publish_qos1(&mut self, topic: &str, id: u16, payload: &[u8]) {
        let mut body = Self::string(topic);
        body.extend(id.to_be_bytes());
        body.extend_from_slice(payload);
        self.packet(0x32, &body);
        let [hi, lo] = id.to_be_bytes();
        assert_eq!(self.read(), (0x40, vec![hi, lo]), "PUBACK");
    }

    /// The next PUBLISH at QoS 1 (acknowledged): its topic and payload.
    fn receive_qos1(&mut self) -> (String, Vec<u8>) {
        let (first, body) = self.read();
        assert_eq!(first & 0xf6, 0x32, "a QoS 1 PUBLISH: {first:#x}");
        let len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let topic = String::from_utf8(body[2..2 + len].to_vec()).unwrap();
        let id = &body[2 + len..4 + len];
        self.packet(0x40, id);
        (topic, body[4 + len..].to_vec())
    }
}

#[test]
fn mqtt_over_tls_on_a_tls_listener() {
    let dir = temp_dir();
    let ca = pki::Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let tls = format!(
        "    tls: {{ certificates: [ {{ cert: \"{}\", key: \"{}\" }} ] }}\n",
        site.cert.display(),
        site.key.display()
    );
    let yaml = both("").replace("    protocol: mqtt\n", &format!("    protocol: mqtt\n{tls}"));
    let p = Portico::start_in(&dir, &yaml);
    // A client offering no ALPN, and one offering `mqtt` (as some do): both are served.
    let mut sub = Wire(pki::connect(p.mqtt, "localhost", &ca.pem, None, &[]).expect("TLS handshake"));
    sub.connect("tls-sub");
    sub.subscribe("secure/#", 1);
    let mut publisher = Wire(pki::connect(p.mqtt, "localhost", &ca.pem, None, &["mqtt"]).expect("TLS with ALPN mqtt"));
    publisher.connect("tls-pub");
    publisher.publish_qos1("secure/door", 7, b"open");
    assert_eq!(sub.receive_qos1(), ("secure/door".to_string(), b"open".to_vec()));
    // Plain MQTT on the TLS port gets nowhere.
    let (answer, closed) = raw_exchange(p.mqtt, b"\x10\x10\x00\x04MQTT\x04\x02\x00\x1e\x00\x04abcd");
    assert!(closed && !answer.starts_with('\x20'), "{answer:?}");
    assert_eq!(p.metric("portico_tls_handshakes_total{listener=\"mqtt\",result=\"ok\"}"), 2.0);
    assert!(p.metric("portico_tls_handshakes_total{listener=\"mqtt\",result=\"failed\"}") >= 1.0);
}

#[tokio::test]
async fn a_reload_keeps_mqtt_clients_connected_and_gives_new_limits_to_new_connections() {
    let p = Portico::start(&both("mqtt: { limits: { max_keepalive: 60s } }\n"));
    let (mut sub, ack) = v5(v5_options(p.mqtt, "stays")).await;
    assert_eq!(ack.properties.and_then(|p| p.server_keep_alive), None, "30 s is within 60 s");
    sub.subscribe("reload/#", v5_qos(1)).await;
    p.rewrite_config(&both("mqtt: { limits: { max_keepalive: 20s } }\n"));
    p.signal(libc::SIGHUP);
    eventually("the reload", || p.metric("portico_reloads_total") == 1.0).await;
    // The connected client is still served: a message published after the reload reaches it.
    let (mut publisher, ack) = v5(v5_options(p.mqtt, "after")).await;
    assert_eq!(ack.properties.and_then(|p| p.server_keep_alive), Some(20), "the new limit");
    publisher.publish_acked("reload/x", v5_qos(1), "still here").await;
    assert_eq!(&sub.publish().await.payload[..], b"still here");
    assert_eq!(p.metric("portico_mqtt_connections_total"), 2.0, "no reconnection");
    // A reload that would turn the MQTT listener into an HTTP one is refused; the broker keeps serving.
    p.rewrite_config(&both("").replace("    protocol: mqtt\n", ""));
    p.signal(libc::SIGHUP);
    eventually("the refused reload", || p.metric("portico_reload_failures_total") == 1.0).await;
    publisher.publish_acked("reload/y", v5_qos(1), "and still").await;
    assert_eq!(&sub.publish().await.payload[..], b"and still");
}

#[tokio::test]
async fn a_drain_disconnects_v5_clients_with_server_shutting_down() {
    let mut p = Portico::start(&both(""));
    let (mut c5, _) = v5(v5_options(p.mqtt, "drained5")).await;
    let mut c4 = v4(v4_options(p.mqtt, "drained4")).await;
    p.signal(libc::SIGTERM);
    let ended = c5.closed().await;
    assert!(ended.contains("ServerShuttingDown"), "{ended}");
    c4.closed().await;
    // The MQTT connections do not hold the process for its 20 s grace period.
    assert!(p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "exits once drained");
}

#[tokio::test]
async fn messages_acknowledged_to_a_persistent_session_survive_kill_9_and_qos2_ones_arrive_once() {
    let dir = temp_dir();
    let yaml = both("mqtt:\n  persistence: { path: data/mqtt }\n");
    let mut p = Portico::start_in(&dir, &yaml);
    let mut options = v4_options(p.mqtt, "durable");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    sub.subscribe("orders/#", v4_qos(2)).await;
    sub.client.disconnect().await.unwrap();
    eventually("the subscriber offline", || p.metric("portico_mqtt_connections") == 0.0).await;
    drop(sub);
    let mut publisher = v4(v4_options(p.mqtt, "producer")).await;
    for n in 0..30 {
        let qos = if n < 20 { 1 } else { 2 };
        publisher.publish_acked(&format!("orders/{n}"), v4_qos(qos), &format!("order {n}")).await;
    }
    assert!(p.metric("portico_mqtt_store_commits_total") >= 1.0);
    assert!(p.metric("portico_mqtt_store_bytes") > 0.0);
    // Every PUBACK and PUBCOMP above promised the message is on disk: SIGKILL, no drain, no chance to write more.
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    assert!(dir.join("data/mqtt/store.redb").exists());
    let p = Portico::start_in(&dir, &yaml);
    let mut options = v4_options(p.mqtt, "durable");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    let mut got = Vec::new();
    for _ in 0..30 {
        let m = sub.publish().await;
        got.push((m.qos, String::from_utf8(m.payload.to_vec()).unwrap()));
    }
    let expected: Vec<_> = (0..30).map(|n| (v4_qos(if n < 20 { 1 } else { 2 }), format!("order {n}"))).collect();
    assert_eq!(got, expected, "every acknowledged message, in order, at its QoS");
    // Nothing more: no QoS 2 message twice.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, sub.events.recv()).await {
        if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(m))) = event {
            panic!("delivered again: {m:?}");
        }
    }
    assert_eq!(p.metric("portico_mqtt_sessions"), 1.0, "the durable session, resumed");
}

#[test]
fn mosquitto_clients_publish_and_subscribe_through_portico() {
    if !tool_exists("mosquitto_sub") || !tool_exists("mosquitto_pub") {
        skip_outside_ci(
            "mosquitto_clients_publish_and_subscribe_through_portico",
            "mosquitto-clients is not installed",
        );
        return;
    }
    let p = Portico::start(&both(""));
    let port = p.mqtt.port().to_string();
    for version in ["mqttv311", "mqttv5"] {
        let sub = std::process::Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", version, "-t", "greetings/#", "-q", "1", "-C", "1", "-v"])
            .args(["-W", "10"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_until("the subscription", WAIT, || p.metric("portico_mqtt_subscriptions") == 1.0);
        let published = std::process::Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", version, "-t", "greetings/world", "-q", "1", "-m"])
            .arg(format!("hello over {version}"))
            .status()
            .unwrap();
        assert!(published.success());
        let out = sub.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("greetings/world hello over {version}\n"));
        wait_until("the subscriber gone", WAIT, || p.metric("portico_mqtt_subscriptions") == 0.0);
    }
}

#[tokio::test]
async fn a_damaged_store_is_moved_aside_or_refused_as_configured() {
    let dir = temp_dir();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/store.redb"), b"not a database, whatever it was").unwrap();
    // `fail`: Portico does not start, and says which file and what to do.
    let failing = both("mqtt: { persistence: { path: data, on_corrupt_store: fail } }\n")
        .replace("{listen}", &format!("127.0.0.1:{}", free_port()))
        .replace("{mqtt}", &format!("127.0.0.1:{}", free_port()))
        .replace("{admin}", &format!("127.0.0.1:{}", free_port()));
    std::fs::write(dir.join("fail.yaml"), failing).unwrap();
    let out =
        std::process::Command::new(portico_bin()).args(["run", "-c"]).arg(dir.join("fail.yaml")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot open the MQTT store") && stderr.contains("store.redb"), "{stderr}");
    assert!(stderr.contains("on_corrupt_store: move_aside"), "{stderr}");
    // `move_aside` (the default): the file is kept aside and the broker starts empty, and serves.
    let p = Portico::start_in(&dir, &both("mqtt: { persistence: { path: data } }\n"));
    let aside: Vec<String> = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("store.redb.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let (mut c, _) = v5(v5_options(p.mqtt, "after-damage")).await;
    c.subscribe("t", v5_qos(1)).await;
}

/// Written by `mosquitto_passwd -b pw.txt mosq secret` (Mosquitto 2.0): PBKDF2-SHA512.
const MOSQ_SECRET: &str = "mosq:$7$101$ZT2UAXR7jqpQsn97$rSm/XObu3tvWfHWSuYZgBzh+rtAWAX7Xq67scmJX9aUdmASsbKuMjT2Cj8wRR1OtiMdraludLAmE4XcWt/RRiw==\n";

#[tokio::test]
async fn a_password_file_refuses_bad_passwords_and_anonymous_clients_and_a_reload_rereads_it() {
    let dir = temp_dir();
    std::fs::write(dir.join("mqtt.passwd"), MOSQ_SECRET).unwrap();
    let yaml = both("mqtt:\n  auth: { password_file: mqtt.passwd }\n");
    let p = Portico::start_in(&dir, &yaml);
    let wire = || Wire(std::net::TcpStream::connect(p.mqtt).unwrap());
    // v3.1.1: bad password -> 4, none at all -> 5 (anonymous is off by default with a password file).
    assert_eq!(wire().connect_as("a", Some("mosq"), Some("wrong")), vec![0, 4]);
    assert_eq!(wire().connect_as("b", Some("nobody"), Some("secret")), vec![0, 4]);
    assert_eq!(wire().connect_as("c", None, None), vec![0, 5]);
    let mut good = wire();
    assert_eq!(good.connect_as("d", Some("mosq"), Some("secret")), vec![0, 0]);
    good.subscribe("auth/#", 1);
    // v5: Bad User Name or Password (0x86).
    let mut options = v5_options(p.mqtt, "e");
    options.set_credentials("mosq", "nope");
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 10);
    let refused = format!("{:?}", eventloop.poll().await.expect_err("refused"));
    assert!(refused.contains("BadUserNamePassword"), "{refused}");
    drop(client);
    assert_eq!(p.metric("portico_mqtt_auth_failures_total"), 4.0);
    // A new user in the file, then a reload: the new user connects, the connected client stays.
    // Made with the `argon2` and `bcrypt` crates: `password` and `hunter2`.
    let argon =
        "ann:$argon2id$v=19$m=19456,t=2,p=1$k5B7hkxIhOiiGx8vbjINTQ$KZ9D3VEUwn4WQfWazitMcy1/IvLpz/iBpQiyy08Jz+I\n";
    let bcrypt = "bob:$2b$04$t4v1uBjTUT/S9T0unaD3deYRgqef2WIQNAl9WV.nNMkFRVRniDL7u\n";
    std::fs::write(dir.join("mqtt.passwd"), format!("{MOSQ_SECRET}{argon}{bcrypt}")).unwrap();
    p.signal(libc::SIGHUP);
    eventually("the reload", || p.metric("portico_reloads_total") == 1.0).await;
    let mut options = v5_options(p.mqtt, "ann");
    options.set_credentials("ann", "password");
    let (mut ann, _) = v5(options).await;
    ann.publish_acked("auth/x", v5_qos(1), "from ann").await;
    assert_eq!(good.receive_qos1(), ("auth/x".to_string(), b"from ann".to_vec()));
    assert_eq!(wire().connect_as("bob", Some("bob"), Some("hunter2")), vec![0, 0]);
    assert_eq!(wire().connect_as("bob2", Some("bob"), Some("hunter3")), vec![0, 4]);
    // An unreadable password file fails the reload and the running users stay.
    std::fs::remove_file(dir.join("mqtt.passwd")).unwrap();
    p.signal(libc::SIGHUP);
    eventually("the failed reload", || p.metric("portico_reload_failures_total") == 1.0).await;
    assert_eq!(wire().connect_as("f", Some("ann"), Some("password")), vec![0, 0]);
}

#[tokio::test]
async fn acls_with_substitution_refuse_publishes_and_subscriptions_and_reload_without_disconnecting() {
    let acl = |extra: &str| {
        both(&format!(
            "mqtt:\n  acl:\n    - {{ topic: \"devices/%c/#\", access: readwrite }}\n    - {{ topic: test/nosubscribe, access: deny }}\n{extra}    - {{ topic: \"test/#\", access: readwrite }}\n"
        ))
    };
    let p = Portico::start(&acl(""));
    let (mut d1, _) = v5(v5_options(p.mqtt, "d1")).await;
    d1.subscribe("devices/d1/#", v5_qos(1)).await;
    // Its own subtree: allowed. Another device's: PUBACK Not authorized (0x87).
    d1.publish_acked("devices/d1/temp", v5_qos(1), "21").await;
    assert_eq!(&d1.publish().await.payload[..], b"21");
    // (rumqttc ends its event loop on a refused acknowledgement: a client of its own for each refusal.)
    let (mut other, _) = v5(v5_options(p.mqtt, "d1-other")).await;
    other.client.publish("devices/d2/temp", v5_qos(1), false, b"x".to_vec()).await.unwrap();
    let refused = other.closed().await;
    assert!(refused.contains("PubAckFail { reason: NotAuthorized }"), "{refused}");
    // SUBSCRIBE: v5 0x87, v3 0x80, for the denied topic and for a filter that would reach it.
    let (mut other, _) = v5(v5_options(p.mqtt, "d1-sub")).await;
    other.client.subscribe("test/nosubscribe", v5_qos(1)).await.unwrap();
    let refused = loop {
        match other.next().await {
            Some(Ok(rumqttc::v5::Event::Incoming(V5Packet::SubAck(ack)))) => break format!("{:?}", ack.return_codes),
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("no SUBACK"),
        }
    };
    assert!(refused.contains("NotAuthorized"), "{refused}");
    let mut v3 = Wire(std::net::TcpStream::connect(p.mqtt).unwrap());
    v3.connect("v3");
    assert_eq!(v3.subscribe_code("test/nosubscribe", 1), 0x80);
    assert_eq!(v3.subscribe_code("test/#", 1), 0x80);
    assert_eq!(v3.subscribe_code("test/other/#", 1), 1);
    // v3: a denied QoS 1 PUBLISH is acknowledged and dropped, as Mosquitto does.
    v3.publish_qos1("devices/d1/spoof", 9, b"no");
    v3.publish_qos1("test/other/ok", 10, b"yes");
    assert_eq!(v3.receive_qos1(), ("test/other/ok".to_string(), b"yes".to_vec()));
    assert_eq!(p.metric("portico_mqtt_acl_denied_total{operation=\"publish\"}"), 2.0);
    assert_eq!(p.metric("portico_mqtt_acl_denied_total{operation=\"subscribe\"}"), 3.0);
    // A reload granting more applies at once to the connected clients' next operations.
    p.rewrite_config(&acl("    - { topic: \"devices/+/temp\", access: write, client_id: \"d*\" }\n"));
    p.signal(libc::SIGHUP);
    eventually("the reload", || p.metric("portico_reloads_total") == 1.0).await;
    d1.publish_acked("devices/d2/temp", v5_qos(1), "now allowed").await;
    assert_eq!(p.metric("portico_mqtt_acl_denied_total{operation=\"publish\"}"), 2.0);
    assert_eq!(p.metric("portico_mqtt_connections_total"), 4.0, "nobody reconnected");
}

#[test]
fn a_client_certificate_names_the_user_on_an_mtls_listener() {
    let dir = temp_dir();
    let ca = pki::Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let device = ca.client(&dir, "device", "sensor-7");
    let tls = format!(
        "    tls: {{ certificates: [ {{ cert: \"{}\", key: \"{}\" }} ], client_ca: \"{}\", client_auth: optional }}\n",
        site.cert.display(),
        site.key.display(),
        ca.pem.display()
    );
    std::fs::write(dir.join("mqtt.passwd"), MOSQ_SECRET).unwrap();
    let yaml = both("mqtt:\n  auth: { password_file: mqtt.passwd, use_certificate_as_username: true }\n  acl:\n    - { topic: \"sensors/%u/#\", access: readwrite }\n")
        .replace("    protocol: mqtt\n", &format!("    protocol: mqtt\n{tls}"));
    let p = Portico::start_in(&dir, &yaml);
    // The certificate's CN is the user: no password, and `%u` is `sensor-7`.
    let mut c = Wire(pki::connect(p.mqtt, "localhost", &ca.pem, Some(&device), &[]).expect("mTLS handshake"));
    assert_eq!(c.connect_as("dev", None, None), vec![0, 0]);
    assert_eq!(c.subscribe_code("sensors/sensor-7/#", 1), 1);
    assert_eq!(c.subscribe_code("sensors/sensor-8/#", 1), 0x80);
    // Without a certificate, the password file applies.
    let mut anon = Wire(pki::connect(p.mqtt, "localhost", &ca.pem, None, &[]).expect("TLS handshake"));
    assert_eq!(anon.connect_as("anon", None, None), vec![0, 5]);
    let mut mosq = Wire(pki::connect(p.mqtt, "localhost", &ca.pem, None, &[]).expect("TLS handshake"));
    assert_eq!(mosq.connect_as("mosq", Some("mosq"), Some("secret")), vec![0, 0]);
}

#[tokio::test]
async fn curl_publishes_through_an_mqtt_publish_route_to_a_subscriber() {
    let extra = "  - match: { path_prefix: /publish/ }\n    mqtt_publish: { topic: \"{path}\", qos: 1 }\n  - match: { path: \"/devices/:id/state\" }\n    mqtt_publish: { topic: \"state/{id}\", qos: 0, retain: true }\nmqtt: { persistence: { path: data } }\n";
    let p = Portico::start(&both(extra));
    let mut options = v4_options(p.mqtt, "durable-sub");
    options.set_clean_session(false);
    let mut sub = v4(options).await;
    sub.subscribe("sensors/#", v4_qos(1)).await;
    // QoS 1 to a persistent subscriber: 202 once the store has committed it.
    let url = p.url("/publish/sensors/kitchen%20temp");
    let (ok, out) = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", "21.5", &url]);
    assert!(ok && out == "202", "{out}");
    let got = sub.publish().await;
    assert_eq!((got.topic.as_str(), &got.payload[..], got.qos), ("sensors/kitchen temp", &b"21.5"[..], v4_qos(1)));
    // A path parameter in the template, retained at QoS 0: 200, and a later subscriber gets it.
    let (ok, out) =
        curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", "on", &p.url("/devices/lamp1/state")]);
    assert!(ok && out == "200", "{out}");
    let mut late = v4(v4_options(p.mqtt, "late")).await;
    late.subscribe("state/+", v4_qos(0)).await;
    let got = late.publish().await;
    assert_eq!((got.topic.as_str(), &got.payload[..], got.retain), ("state/lamp1", &b"on"[..], true));
    // A topic the request makes invalid: 400.
    let (ok, out) = curl(&["-s", "-w", " %{http_code}", "--data-binary", "x", &p.url("/publish/sensors/%23")]);
    assert!(ok && out.ends_with(" 400"), "{out}");
    assert_eq!(p.metric("portico_mqtt_messages_received_total{qos=\"1\"}"), 1.0);
}

/// MQTT 3.1.1 CONNECT with a client id, a keep-alive and, optionally, a will (topic, payload, QoS 0).
fn raw_connect(client_id: &str, keep_alive: u16, will: Option<(&str, &str)>) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u16).to_be_bytes());
        out.extend_from_slice(s);
    }
    let mut body = Vec::new();
    put(&mut body, b"MQTT");
    body.push(4);
    body.push(if will.is_some() { 0x06 } else { 0x02 }); // clean session (+ will, QoS 0)
    body.extend_from_slice(&keep_alive.to_be_bytes());
    put(&mut body, client_id.as_bytes());
    if let Some((topic, payload)) = will {
        put(&mut body, topic.as_bytes());
        put(&mut body, payload.as_bytes());
    }
    assert!(body.len() < 128);
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    packet
}

/// A raw 3.1.1 client, connected (CONNACK read).
fn raw_client(addr: SocketAddr, connect: &[u8]) -> std::net::TcpStream {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(connect).unwrap();
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0], "accepted");
    stream
}

#[tokio::test]
async fn idle_connections_park_and_come_back_for_packets_messages_keepalive_wills_and_the_drain() {
    let mut p = Portico::start(&both("mqtt:\n  limits: { park_after: 200ms }\n"));
    let parked = |p: &Portico| p.metric("portico_mqtt_connections_parked");
    let (mut sub, _) = v5(v5_options(p.mqtt, "parked-sub")).await;
    sub.subscribe("park/#", v5_qos(1)).await;
    let mut publisher = v4(v4_options(p.mqtt, "parked-pub")).await;
    eventually("both clients parked", || parked(&p) == 2.0).await;
    assert_eq!(p.metric("portico_mqtt_connections"), 2.0, "parked connections are connections");

    // A message for a parked subscriber, from a parked publisher: both come back, and park again.
    publisher.publish_acked("park/a", v4_qos(1), "to a parked subscriber").await;
    let m = sub.publish().await;
    assert_eq!(&m.payload[..], b"to a parked subscriber");
    eventually("both parked again", || parked(&p) == 2.0).await;

    // A packet wakes a parked connection: PINGREQ is answered.
    let mut pinger = raw_client(p.mqtt, &raw_connect("parked-ping", 0, None));
    eventually("the pinger parked", || parked(&p) == 3.0).await;
    pinger.write_all(&[0xC0, 0]).unwrap();
    let mut pong = [0u8; 2];
    pinger.read_exact(&mut pong).unwrap();
    assert_eq!(pong, [0xD0, 0], "PINGRESP from a parked connection");

    // A parked client that goes away without DISCONNECT: its will is published.
    let will = raw_client(p.mqtt, &raw_connect("parked-will", 0, Some(("park/will", "gone"))));
    eventually("the will's client parked", || parked(&p) == 4.0).await;
    drop(will);
    let m = sub.publish().await;
    assert_eq!((&m.topic[..], &m.payload[..]), (&b"park/will"[..], &b"gone"[..]), "the will");

    // A parked client silent past 1.5 times its keep-alive is closed (its will published).
    let started = std::time::Instant::now();
    let mut silent = raw_client(p.mqtt, &raw_connect("parked-silent", 1, Some(("park/silent", "timed out"))));
    let mut end = [0u8; 1];
    let read = silent.read(&mut end);
    assert!(matches!(read, Ok(0)), "closed by the broker: {read:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400) && waited < Duration::from_secs(4), "closed after {waited:?}");
    let m = sub.publish().await;
    assert_eq!(&m.payload[..], b"timed out");
    eventually("the keep-alive timeout counted", || p.metric("portico_mqtt_keepalive_timeouts_total") == 1.0).await;

    // A second connection with a parked client's id takes the session over: the parked one is closed.
    let mut first = raw_client(p.mqtt, &raw_connect("parked-twice", 0, None));
    eventually("the first parked", || parked(&p) == 4.0).await;
    let _second = raw_client(p.mqtt, &raw_connect("parked-twice", 0, None));
    assert!(matches!(first.read(&mut end), Ok(0)), "the parked connection closed on takeover");
    eventually("the takeover counted", || p.metric("portico_mqtt_takeovers_total") == 1.0).await;

    // The drain reaches parked connections: a v5 client is told why, and the process does not wait.
    eventually("the subscriber parked", || parked(&p) == 4.0).await;
    p.signal(libc::SIGTERM);
    let ended = sub.closed().await;
    assert!(ended.contains("ServerShuttingDown"), "{ended}");
    assert!(p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "exits once drained");
}

/// A TCP relay from a local port to `to` that records what the server sends: the broker's bytes as the
/// client received them.
async fn recording_relay(to: SocketAddr) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = recorded.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, _) = listener.accept().await.unwrap();
        let server = tokio::net::TcpStream::connect(to).await.unwrap();
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = server_read.read(&mut buf).await {
            if n == 0 || client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (addr, recorded)
}

/// The PUBLISH packets in a v5 byte stream from the server: (topic name, Topic Alias).
fn v5_publishes(mut bytes: &[u8]) -> Vec<(String, Option<u16>)> {
    fn varint(bytes: &[u8]) -> (usize, usize) {
        let (mut value, mut used) = (0usize, 0);
        loop {
            let b = bytes[used];
            value |= usize::from(b & 0x7f) << (7 * used);
            used += 1;
            if b & 0x80 == 0 {
                return (value, used);
            }
        }
    }
    let mut found = Vec::new();
    while !bytes.is_empty() {
        let first = bytes[0];
        let (len, used) = varint(&bytes[1..]);
        let body = &bytes[1 + used..1 + used + len];
        bytes = &bytes[1 + used + len..];
        if first >> 4 != 3 {
            continue;
        }
        let topic_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let topic = String::from_utf8(body[2..2 + topic_len].to_vec()).unwrap();
        let mut at = 2 + topic_len + if (first >> 1) & 3 > 0 { 2 } else { 0 };
        let (props_len, used) = varint(&body[at..]);
        at += used;
        let props = &body[at..at + props_len];
        // Only the properties these messages can carry: Topic Alias (0x23, two bytes) is what is looked for.
        let alias = props.windows(3).find(|w| w[0] == 0x23).map(|w| u16::from_be_bytes([w[1], w[2]]));
        found.push((topic, alias));
    }
    found
}

#[tokio::test]
async fn the_broker_uses_topic_aliases_towards_v5_clients_and_answers_response_information() {
    let p = Portico::start(&both(
        "mqtt:\n  response_information: \"responses/%c\"\n  limits: { topic_aliases_to_clients: 2 }\n",
    ));
    let (relay, recorded) = recording_relay(p.mqtt).await;
    let mut options = v5_options(relay, "aliased");
    options.set_topic_alias_max(Some(10)); // the broker's limit, 2, is the smaller
    options.set_request_response_info(Some(1));
    let (mut sub, connack) = v5(options).await;
    let info = connack.properties.as_ref().and_then(|p| p.response_information.clone());
    assert_eq!(info.as_deref(), Some("responses/aliased"), "Response Information, %c replaced");
    sub.subscribe("alias/#", v5_qos(1)).await;
    let mut publisher = v4(v4_options(p.mqtt, "alias-publisher")).await;
    let topics = ["alias/a", "alias/a", "alias/b", "alias/c", "alias/a"];
    for (n, topic) in topics.iter().enumerate() {
        publisher.publish_acked(topic, v4_qos(1), &format!("m{n}")).await;
    }
    // The client sees every message on its topic, the aliases resolved...
    for (n, topic) in topics.iter().enumerate() {
        let m = sub.publish().await;
        assert_eq!((&m.topic[..], &m.payload[..]), (topic.as_bytes(), format!("m{n}").as_bytes()));
    }
    // ...and on the wire the topic went once per alias: defined, used, a second one, then the oldest taken
    // over by a new topic, and the second by "alias/a" again.
    let wire = v5_publishes(&recorded.lock().unwrap());
    let expected: Vec<(String, Option<u16>)> =
        [("alias/a", 1), ("", 1), ("alias/b", 2), ("alias/c", 1), ("alias/a", 2)]
            .iter()
            .map(|(t, a)| (t.to_string(), Some(*a)))
            .collect();
    assert_eq!(wire, expected);

    // A client that neither accepts aliases nor asks for response information gets neither.
    let (relay, recorded) = recording_relay(p.mqtt).await;
    let (mut plain, connack) = v5(v5_options(relay, "unaliased")).await;
    assert!(connack.properties.as_ref().is_none_or(|p| p.response_information.is_none()));
    plain.subscribe("alias/#", v5_qos(0)).await;
    publisher.publish_acked("alias/a", v4_qos(1), "named").await;
    publisher.publish_acked("alias/a", v4_qos(1), "named again").await;
    assert_eq!(&plain.publish().await.payload[..], b"named");
    assert_eq!(&plain.publish().await.payload[..], b"named again");
    let wire = v5_publishes(&recorded.lock().unwrap());
    assert_eq!(wire, vec![("alias/a".to_string(), None), ("alias/a".to_string(), None)]);
}

#[tokio::test]
async fn portico_upgrade_with_persistence_hands_the_store_and_the_sessions_to_the_new_process() {
    let dir = temp_dir();
    let mut p = Portico::start_in(&dir, &both("mqtt:\n  persistence: { path: data/mqtt }\n"));
    let _cleanup = KillOnDrop(p.config.clone());
    let old = p.pid();
    // A persistent QoS 1 subscriber, offline, with messages queued for it.
    let persistent = |addr| {
        let mut options = v4_options(addr, "upgraded-sub");
        options.set_clean_session(false);
        options
    };
    let mut sub = v4(persistent(p.mqtt)).await;
    sub.subscribe("jobs/#", v4_qos(1)).await;
    sub.client.disconnect().await.unwrap();
    eventually("the subscriber offline", || p.metric("portico_mqtt_connections") == 0.0).await;
    drop(sub);
    // A publisher stays connected across the upgrade (its connection is drained by the old process).
    let mut publisher = v4(v4_options(p.mqtt, "upgraded-pub")).await;
    for n in 0..20 {
        publisher.publish_acked(&format!("jobs/{n}"), v4_qos(1), &format!("job {n}")).await;
    }

    let config = p.config.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(portico_bin()).args(["upgrade", "-c"]).arg(&config).output().unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}{}", text, String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with(&format!("upgraded: pid {old} -> ")), "{text}");
    // The old process drains its MQTT connections (the publisher is told nothing in 3.1.1: it is closed),
    // releases the store and exits.
    publisher.closed().await;
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()), "the old process exited");

    // The subscriber reconnects to the new process: its session and every acknowledged message are there.
    let mut sub = v4(persistent(p.mqtt)).await;
    let mut got = Vec::new();
    for _ in 0..20 {
        got.push(String::from_utf8(sub.publish().await.payload.to_vec()).unwrap());
    }
    let expected: Vec<String> = (0..20).map(|n| format!("job {n}")).collect();
    assert_eq!(got, expected, "every acknowledged message, in order");
    // The new process keeps persisting: more messages, acknowledged after its own commits.
    let mut publisher = v4(v4_options(p.mqtt, "upgraded-pub")).await;
    publisher.publish_acked("jobs/after", v4_qos(1), "after the upgrade").await;
    assert_eq!(&sub.publish().await.payload[..], b"after the upgrade");
    assert!(p.metric("portico_mqtt_store_commits_total") >= 1.0, "the new process commits to the store");
    assert_eq!(p.metric("portico_mqtt_sessions"), 2.0);
}

/// The processes `pid` started, by their names (`/proc/PID/comm`: worker processes are `portico-w0`, ...).
fn child_processes(pid: i32) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let name = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            found.push((child, name.trim().to_string()));
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn with_worker_processes_the_first_one_serves_mqtt_and_every_one_serves_http() {
    let p = Portico::start(&format!("process_model: multi_process\n{}", both("")));
    eventually("two worker processes", || child_processes(p.pid()).len() == 2).await;
    let first = || child_processes(p.pid()).into_iter().find(|(_, name)| name == "portico-w0").map(|(pid, _)| pid);
    let (mut sub, _) = v5(v5_options(p.mqtt, "mp-sub")).await;
    sub.subscribe("mp/#", v5_qos(1)).await;
    let mut publisher = v4(v4_options(p.mqtt, "mp-pub")).await;
    for n in 0..10 {
        publisher.publish_acked(&format!("mp/{n}"), v4_qos(1), &format!("m{n}")).await;
    }
    for n in 0..10 {
        assert_eq!(sub.publish().await.payload, format!("m{n}").into_bytes(), "one broker: every message");
    }
    // The master's metrics are the broker's (summed over the worker processes).
    eventually("the master sees the broker's clients", || p.metric("portico_mqtt_connections") == 2.0).await;
    // HTTP is served by both worker processes (new connections spread over them).
    for _ in 0..20 {
        assert_eq!(Conn::open(p.addr).get("/healthz", "").status, 200);
    }
    // The broker's process dies: the master starts it again on the same sockets, and clients reconnect.
    let broker_process = first().expect("the first worker process");
    unsafe { libc::kill(broker_process, libc::SIGKILL) };
    sub.closed().await;
    eventually("the first worker process again", || first().is_some_and(|pid| pid != broker_process)).await;
    let (mut sub, _) = v5(v5_options(p.mqtt, "mp-sub")).await;
    sub.subscribe("mp/#", v5_qos(1)).await;
    let mut publisher = v4(v4_options(p.mqtt, "mp-pub2")).await;
    publisher.publish_acked("mp/again", v4_qos(1), "after the restart").await;
    assert_eq!(&sub.publish().await.payload[..], b"after the restart");
    assert_eq!(Conn::open(p.addr).get("/healthz", "").status, 200);
    // A reload may not move the MQTT listener (its sockets are the first worker process's): refused, kept.
    let text = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, text.replace(&p.mqtt.to_string(), "127.0.0.1:1")).unwrap();
    p.signal(libc::SIGHUP);
    eventually("the refused reload", || p.metric("portico_reload_failures_total") == 1.0).await;
    let status = p.admin_get("/admin/reload").text();
    assert!(status.contains("MQTT listeners cannot be added, moved or removed"), "{status}");
    publisher.publish_acked("mp/kept", v4_qos(1), "still here").await;
    assert_eq!(&sub.publish().await.payload[..], b"still here");
}
