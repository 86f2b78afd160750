//! MQTT over WebSocket (`mqtt: websocket` on an HTTP route) through the binary, with a real WebSocket client
//! (tungstenite) carrying MQTT packets written from the specification: packets split across messages and
//! several in one, clients on the WebSocket route and on a TCP listener reaching each other, ping, the
//! refusals (no handshake, no subprotocol, HTTP/2, text messages, broken frames, messages too large), wss on a
//! TLS listener with a client certificate as the MQTT user, the MQTT metrics and the drain. The registries'
//! clients (mqtt.js, paho-mqtt) are in mqtt_clients.rs.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// An HTTP listener on `{listen}` with the MQTT route at `/mqtt`, and an MQTT listener on `{mqtt}`.
fn config(tls: &str) -> String {
    format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nshutdown: {{ grace: 20s }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n{tls}  - name: mqtt\n    address: \"{{mqtt}}\"\n    protocol: mqtt\nroutes:\n  - match: {{ path: /mqtt }}\n    mqtt: websocket\n  - match: {{ path: /healthz }}\n    static: {{ body: \"ok\\n\" }}\n"
    )
}

/// The WebSocket handshake for `/mqtt` over `stream`, offering `subprotocol`.
fn open<S: Read + Write>(stream: S, subprotocol: &str) -> WebSocket<S> {
    let mut request = "ws://localhost/mqtt".into_client_request().unwrap();
    request.headers_mut().insert("sec-websocket-protocol", subprotocol.parse().unwrap());
    // tungstenite checks that the answer names the subprotocol offered.
    let (ws, resp) = tungstenite::client(request, stream).expect("WebSocket handshake");
    assert_eq!(resp.status(), 101);
    assert_eq!(resp.headers()["sec-websocket-protocol"], subprotocol);
    ws
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// An MQTT packet: its first byte, the Remaining Length, the body.
fn packet(first: u8, body: &[u8]) -> Vec<u8> {
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
    out
}

fn string(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(s.as_bytes());
    out
}

/// CONNECT with a clean session: `level` 4 is MQTT 3.1.1, 5 is MQTT 5.0 (no properties).
fn connect(id: &str, level: u8) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', level, 0x02, 0, 30];
    if level == 5 {
        body.push(0);
    }
    body.extend(string(id));
    packet(0x10, &body)
}

fn subscribe(id: u16, filter: &str, qos: u8, level: u8) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    if level == 5 {
        body.push(0);
    }
    body.extend(string(filter));
    body.push(qos);
    packet(0x82, &body)
}

fn publish_qos1(topic: &str, id: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = string(topic);
    body.extend(id.to_be_bytes());
    body.extend_from_slice(payload);
    packet(0x32, &body)
}

/// A byte stream the MQTT packets go over.
trait Transport {
    fn put(&mut self, bytes: &[u8]);
    /// The next bytes that came in; `None` once the connection ended.
    fn take(&mut self) -> Option<Vec<u8>>;
}

impl Transport for TcpStream {
    fn put(&mut self, bytes: &[u8]) {
        self.write_all(bytes).unwrap();
    }
    fn take(&mut self) -> Option<Vec<u8>> {
        let mut chunk = vec![0u8; 64 * 1024];
        match self.read(&mut chunk) {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(chunk[..n].to_vec()),
        }
    }
}

/// Each send is one binary message.
impl<S: Read + Write> Transport for WebSocket<S> {
    fn put(&mut self, bytes: &[u8]) {
        self.send(Message::binary(bytes.to_vec())).unwrap();
    }
    fn take(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.read() {
                Ok(Message::Binary(data)) => return Some(data.to_vec()),
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Ok(Message::Text(text)) => panic!("a text message: {text}"),
                Ok(Message::Close(_)) | Err(_) => return None,
            }
        }
    }
}

/// An MQTT client over a transport, reading whole packets whatever the pieces they arrive in.
struct Mqtt<T: Transport> {
    io: T,
    buf: Vec<u8>,
}

impl<T: Transport> Mqtt<T> {
    fn new(io: T) -> Self {
        Mqtt { io, buf: Vec::new() }
    }

    /// The next packet: first byte and body; `None` once the connection ended.
    fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some((first, body, used)) = Self::parse(&self.buf) {
                self.buf.drain(..used);
                return Some((first, body));
            }
            let more = self.io.take()?;
            self.buf.extend_from_slice(&more);
        }
    }

    fn parse(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
        let (mut len, mut shift, mut i) = (0usize, 0, 1);
        loop {
            let byte = *buf.get(i)?;
            len |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            i += 1;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let body = buf.get(i..i + len)?;
        Some((buf[0], body.to_vec(), i + len))
    }

    fn expect(&mut self, what: &str, first: u8) -> Vec<u8> {
        match self.read() {
            Some((got, body)) if got == first => body,
            other => panic!("expected {what}, got {other:?}"),
        }
    }

    /// CONNECT (3.1.1) and its CONNACK.
    fn connect(&mut self, id: &str) {
        self.io.put(&connect(id, 4));
        assert_eq!(self.expect("CONNACK", 0x20), vec![0, 0]);
    }

    /// The next PUBLISH at QoS 1, acknowledged: its topic and payload.
    fn receive_qos1(&mut self) -> (String, Vec<u8>) {
        let (first, body) = self.read().expect("a PUBLISH");
        assert_eq!(first & 0xf6, 0x32, "a QoS 1 PUBLISH: {first:#x}");
        let len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let topic = String::from_utf8(body[2..2 + len].to_vec()).unwrap();
        let id = body[2 + len..4 + len].to_vec();
        self.io.put(&packet(0x40, &id));
        (topic, body[4 + len..].to_vec())
    }
}

#[test]
fn websocket_and_tcp_clients_reach_each_other_whatever_the_messages_packets_come_in() {
    let p = Portico::start(&config(""));
    // CONNECT split inside its header across three messages, then SUBSCRIBE and PINGREQ in one message.
    let mut sub = Mqtt::new(open(tcp(p.addr), "mqtt"));
    let hello = connect("ws-sub", 4);
    for piece in [&hello[..1], &hello[1..5], &hello[5..]] {
        sub.io.put(piece);
    }
    assert_eq!(sub.expect("CONNACK", 0x20), vec![0, 0]);
    let mut both = subscribe(1, "to-ws/#", 1, 4);
    both.extend_from_slice(&[0xc0, 0]);
    sub.io.put(&both);
    assert_eq!(sub.expect("SUBACK", 0x90), vec![0, 1, 1]);
    assert_eq!(sub.expect("PINGRESP", 0xd0), Vec::<u8>::new());
    // A WebSocket ping is answered with a pong carrying its payload.
    sub.io.send(Message::Ping(b"are you there".to_vec().into())).unwrap();
    sub.io.flush().unwrap();
    loop {
        match sub.io.read().unwrap() {
            Message::Pong(data) => break assert_eq!(&data[..], b"are you there"),
            Message::Binary(_) => panic!("nothing was published yet"),
            _ => {}
        }
    }

    // From a TCP client to the WebSocket one: a payload larger than many messages' worth of reads.
    let mut tcp_pub = Mqtt::new(tcp(p.mqtt));
    tcp_pub.connect("tcp-pub");
    let big: Vec<u8> = (0..300_000).map(|i| (i % 251) as u8).collect();
    tcp_pub.io.put(&publish_qos1("to-ws/big", 7, &big));
    assert_eq!(tcp_pub.expect("PUBACK", 0x40), vec![0, 7]);
    assert_eq!(sub.receive_qos1(), ("to-ws/big".to_string(), big));

    // From a WebSocket client to a TCP one, the PUBLISH in one byte per message.
    let mut tcp_sub = Mqtt::new(tcp(p.mqtt));
    tcp_sub.connect("tcp-sub");
    tcp_sub.io.put(&subscribe(1, "to-tcp/#", 1, 4));
    assert_eq!(tcp_sub.expect("SUBACK", 0x90), vec![0, 1, 1]);
    let mut ws_pub = Mqtt::new(open(tcp(p.addr), "mqtt"));
    ws_pub.connect("ws-pub");
    for byte in publish_qos1("to-tcp/x", 9, b"byte by byte") {
        ws_pub.io.put(&[byte]);
    }
    assert_eq!(ws_pub.expect("PUBACK", 0x40), vec![0, 9]);
    assert_eq!(tcp_sub.receive_qos1(), ("to-tcp/x".to_string(), b"byte by byte".to_vec()));

    // They count as MQTT connections like the TCP ones, and the route's requests as 101s once they end.
    assert_eq!(p.metric("portico_mqtt_connections"), 4.0);
    let view: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/mqtt").body).unwrap();
    assert_eq!(view["connections"], 4, "{view}");
    ws_pub.io.put(&[0xe0, 0]); // DISCONNECT
    assert!(ws_pub.read().is_none(), "the broker ends the connection after DISCONNECT");
    sub.io.close(None).unwrap();
    while sub.io.read().is_ok() {}
    wait_until("the WebSocket clients are gone", Duration::from_secs(5), || {
        p.metric("portico_mqtt_connections") == 2.0
    });
    wait_until("the upgraded requests are counted", Duration::from_secs(5), || {
        p.metric("portico_requests_total{route=\"/mqtt\",cluster=\"\",status_class=\"1xx\"}") == 2.0
    });
}

#[test]
fn what_is_no_mqtt_websocket_is_refused() {
    let p = Portico::start(&config(""));
    // A plain request: 426 saying what to send, and the connection stays.
    let mut conn = Conn::open(p.addr);
    let r = conn.get("/mqtt", "");
    assert_eq!(r.status, 426, "{}", r.text());
    assert_eq!(r.header("upgrade").as_deref(), Some("websocket"));
    assert!(r.text().contains("Sec-WebSocket-Protocol: mqtt"), "{}", r.text());
    let handshake = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    // A handshake without the subprotocol, or with another one: 400.
    let r = conn.get("/mqtt", handshake);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = conn.get("/mqtt", &format!("{handshake}Sec-WebSocket-Protocol: chat\r\n"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(conn.get("/healthz", "").status, 200, "the connection stays usable");

    // MQTT 3.1 clients offer `mqttv3.1`, and are answered with it.
    let mut v31 = Mqtt::new(open(tcp(p.addr), "mqttv3.1"));
    let mut body = vec![0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 30];
    body.extend(string("v31"));
    v31.io.put(&packet(0x10, &body));
    assert_eq!(v31.expect("CONNACK", 0x20), vec![0, 0]);

    // A text message is answered with a close 1003, and ends the MQTT connection.
    let mut text = Mqtt::new(open(tcp(p.addr), "mqtt"));
    text.connect("texting");
    text.io.send(Message::text("hello")).unwrap();
    assert_eq!(close_code(&mut text.io), Some(CloseCode::Unsupported));

    // A message over twice `limits.max_packet_size` (1 MiB by default) is answered with a close 1009.
    let mut big = Mqtt::new(open(tcp(p.addr), "mqtt"));
    big.connect("too-big");
    big.io.send(Message::binary(vec![0u8; (2 << 20) + 1])).unwrap();
    assert_eq!(close_code(&mut big.io), Some(CloseCode::Size));

    // An unmasked frame from a client breaks RFC 6455: a close 1002.
    let mut raw = tcp(p.addr);
    raw.write_all(
        format!("GET /mqtt HTTP/1.1\r\nHost: a\r\n{handshake}Sec-WebSocket-Protocol: mqtt\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        raw.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(head.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"), "{head}");
    let hello = connect("unmasked", 4);
    let mut frame = vec![0x82, hello.len() as u8];
    frame.extend_from_slice(&hello);
    raw.write_all(&frame).unwrap();
    let mut ws = WebSocket::from_raw_socket(raw, tungstenite::protocol::Role::Client, None);
    assert_eq!(close_code(&mut ws), Some(CloseCode::Protocol));
    wait_until("the refused clients are gone", Duration::from_secs(5), || p.metric("portico_mqtt_connections") == 1.0);

    // Over HTTP/2 the route cannot upgrade (RFC 8441 is not supported): 400.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status = runtime.block_on(async {
        let mut h2 = h2c::<http_body_util::Empty<bytes::Bytes>>(p.addr).await;
        let req = hyper::Request::get(format!("http://{}/mqtt", p.addr)).body(http_body_util::Empty::new()).unwrap();
        h2.send_request(req).await.unwrap().status()
    });
    assert_eq!(status, 400);
}

/// The code of the close the server sends next (after any other messages).
fn close_code<S: Read + Write>(ws: &mut WebSocket<S>) -> Option<CloseCode> {
    loop {
        match ws.read() {
            Ok(Message::Close(frame)) => return frame.map(|f| f.code),
            Ok(_) => {}
            Err(e) => panic!("the connection ended without a close: {e}"),
        }
    }
}

#[test]
fn wss_with_a_client_certificate_as_the_user_and_a_drain_that_says_server_shutting_down() {
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
    let auth = "mqtt:\n  auth: { use_certificate_as_username: true }\n  acl:\n    - { topic: \"sensors/%u/#\", access: readwrite }\n";
    let mut p = Portico::start_in(&dir, &format!("{}{auth}", config(&tls)));
    // A browser's WebSocket offers HTTP/1.1 by ALPN even where HTTP/2 is on.
    let stream = pki::connect(p.addr, "localhost", &ca.pem, Some(&device), &["http/1.1"]).expect("TLS handshake");
    let mut c = Mqtt::new(open(stream, "mqtt"));
    c.io.put(&connect("wss5", 5));
    let ack = c.expect("CONNACK", 0x20);
    assert_eq!(&ack[..2], &[0, 0], "accepted: {ack:?}");
    // The certificate's CN is the user: `%u` is `sensor-7`.
    c.io.put(&subscribe(1, "sensors/sensor-8/#", 0, 5));
    assert_eq!(c.expect("SUBACK", 0x90).last(), Some(&0x87), "not authorized for another sensor's topics");
    c.io.put(&subscribe(2, "sensors/sensor-7/#", 0, 5));
    assert_eq!(c.expect("SUBACK", 0x90).last(), Some(&0), "granted QoS 0");
    let mut body = string("sensors/sensor-7/door");
    body.push(0); // no properties
    body.extend_from_slice(b"open");
    c.io.put(&packet(0x30, &body));
    let got = c.expect("PUBLISH", 0x30);
    assert!(got.ends_with(b"open") && got.starts_with(&string("sensors/sensor-7/door")), "{got:?}");
    assert_eq!(p.metric("portico_mqtt_connections"), 1.0);

    // The drain: a v5 client gets DISCONNECT Server shutting down (0x8B), and does not hold the process for
    // its 20 s grace period.
    p.signal(libc::SIGTERM);
    let disconnect = c.expect("DISCONNECT", 0xe0);
    assert_eq!(disconnect.first(), Some(&0x8b), "{disconnect:?}");
    assert!(p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "exits once drained");
}
