//! WebSocket through Portico with a real client library (tungstenite) and a real echo backend: thousands of
//! messages both ways, over plain TCP and TLS; nothing relayed before the upstream's 101; idle tunnels closed;
//! a reload leaves open tunnels alone.

mod common;
use common::pki::{self, Ca};
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

fn yaml(backend: SocketAddr, tls: &str, cluster_extra: &str) -> String {
    format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n{tls}routes:\n  - match: {{ path_prefix: /ws }}\n    cluster: app\n  - match: {{ path_prefix: /echo }}\n    cluster: app\n  - match: {{ path_prefix: /status }}\n    cluster: app\nclusters:\n  app:\n{cluster_extra}    endpoints:\n      - address: \"{backend}\"\n"
    )
}

fn open_ws(addr: SocketAddr) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (ws, resp) = tungstenite::client(format!("ws://{addr}/ws"), stream).expect("WebSocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// Sends `count` messages of assorted sizes and kinds and checks each echo.
fn echo_many<S: Read + Write>(ws: &mut WebSocket<S>, count: usize) {
    for i in 0..count {
        let msg = match i % 4 {
            0 => Message::text(format!("message {i}")),
            1 => Message::binary(vec![(i % 251) as u8; 1 + i % 3000]),
            2 => Message::text("x".repeat(70_000 + i)),
            _ => Message::binary(Vec::new()),
        };
        ws.send(msg.clone()).unwrap();
        let echoed = loop {
            match ws.read().unwrap() {
                Message::Ping(_) | Message::Pong(_) => continue,
                m => break m,
            }
        };
        assert_eq!(echoed, msg, "message {i} came back different");
    }
}

#[test]
fn websocket_messages_are_relayed_both_ways() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&yaml(b.addr, "", ""));
    let mut ws = open_ws(p.addr);
    echo_many(&mut ws, 3000);
    // A 4 MiB message in one frame: the relay holds back nothing and splits nothing.
    let big = Message::binary((0..4 << 20).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
    ws.send(big.clone()).unwrap();
    assert_eq!(ws.read().unwrap(), big);
    // Several tunnels at once.
    let mut others: Vec<_> = (0..20).map(|_| open_ws(p.addr)).collect();
    for ws in &mut others {
        echo_many(ws, 20);
    }
    assert_eq!(p.metric("portico_upgraded_connections_active{cluster=\"app\"}"), 21.0);
    ws.close(None).unwrap();
    while ws.read().is_ok() {}
    drop(others);
    wait_until("tunnels closed", Duration::from_secs(5), || {
        p.metric("portico_upgraded_connections_active{cluster=\"app\"}") == 0.0
    });
    assert_eq!(p.metric("portico_upgraded_connections_total{cluster=\"app\"}"), 21.0);
    assert!(p.metric("portico_requests_total{route=\"/ws/*\",cluster=\"app\",status_class=\"1xx\"}") >= 21.0);
}

#[test]
fn secure_websockets_are_relayed_over_tls() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let tls = format!(
        "    tls:\n      certificates: [{{ cert: \"{}\", key: \"{}\" }}]\n",
        site.cert.display(),
        site.key.display()
    );
    let p = Portico::start(&yaml(b.addr, &tls, ""));
    let stream = pki::connect(p.addr, "localhost", &ca.pem, None, &["http/1.1"]).unwrap();
    let (mut ws, resp) = tungstenite::client("wss://localhost/ws", stream).expect("handshake over TLS");
    assert_eq!(resp.status(), 101);
    echo_many(&mut ws, 1000);
    ws.close(None).unwrap();
}

#[test]
fn nothing_is_relayed_until_the_upstream_switches_protocols() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&yaml(b.addr, "", ""));
    // The upstream refuses the upgrade: its answer goes back as plain HTTP, and the bytes the client sent
    // behind the handshake are read as the next request and routed by Portico (no route for /secret: 404 from
    // Portico), never piped to the upstream raw.
    let mut conn = Conn::open(p.addr);
    conn.send(
        b"GET /status/403 HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nGET /secret HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    let refused = conn.read_response(false);
    assert_eq!(refused.status, 403);
    assert_eq!(refused.header("x-backend").as_deref(), Some("b0"));
    let smuggled = conn.read_response(false);
    assert_eq!(smuggled.status, 404, "{}", smuggled.text());
    assert_eq!(smuggled.header("x-backend"), None, "the bytes after the handshake reached the upstream");
    assert_eq!(conn.get("/echo", "").status, 200, "the connection stays usable");
    assert_eq!(b.requests(), 2);

    // An `Upgrade` that is not WebSocket (h2c) is not forwarded at all.
    let r = conn
        .get("/echo", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n");
    assert_eq!(r.status, 200);
    assert!(!r.text().to_ascii_lowercase().contains("\"upgrade\""), "{}", r.text());

    // An upstream that switches protocols for a request that did not ask to: 502.
    let rogue = RawBackend::start(Behaviour::Fixed(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw bytes".to_vec(),
    ))
    .unwrap();
    let p2 = Portico::start(&yaml(rogue.addr, "", ""));
    let r = Conn::open(p2.addr).get("/echo", "");
    assert_eq!(r.status, 502, "{}", r.text());
}

#[test]
fn idle_tunnels_are_closed_and_active_ones_survive_a_reload() {
    let b = Backend::start("b0").unwrap();
    let config = yaml(b.addr, "", "    timeouts: { tunnel: 700ms }\n");
    let p = Portico::start(&config);

    let mut idle = open_ws(p.addr);
    let mut busy = open_ws(p.addr);
    let started = Instant::now();
    // The busy tunnel carries a message every 200 ms across a reload; the idle one carries nothing.
    let reloads = p.metric("portico_reloads_total");
    p.rewrite_config(&config.replace("workers: 2", "workers: 2\nshutdown: { grace: 5s }"));
    p.signal(libc::SIGHUP);
    while started.elapsed() < Duration::from_millis(1600) {
        echo_many(&mut busy, 1);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(p.metric("portico_reloads_total") > reloads, "the reload did not happen");
    echo_many(&mut busy, 10);
    let gone = idle.read();
    assert!(
        matches!(
            gone,
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::Protocol(_) | tungstenite::Error::Io(_))
        ),
        "the idle tunnel is still open: {gone:?}"
    );
}
