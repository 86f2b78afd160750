//! The examples run as written: `portico demo -c examples/FILE` starts stand-in backends on the example's
//! loopback endpoints and serves it, and `portico demo` serves its admin API too. Each example is copied with
//! its ports moved to free ones (tests run side by side); everything else is as shipped.

mod common;
use common::*;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `portico demo ...`, killed when dropped.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo(args: &[&str], listening: SocketAddr) -> Demo {
    let child = Command::new(portico_bin()).arg("demo").args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
    let demo = Demo(child.unwrap());
    wait_until("the demo listens", Duration::from_secs(20), || std::net::TcpStream::connect(listening).is_ok());
    demo
}

/// The example with every `IP:PORT` it names moved to a free port (the same port for the same address).
fn with_free_ports(example: &str) -> (String, std::collections::HashMap<String, SocketAddr>) {
    let text = std::fs::read_to_string(format!("{}/../../examples/{example}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let pattern = regex_lite(&text);
    let mut moved = std::collections::HashMap::new();
    let mut out = text.clone();
    for original in pattern {
        let (ip, _) = original.rsplit_once(':').unwrap();
        let port = free_port();
        let new = format!("{ip}:{port}");
        out = out.replace(&original, &new);
        let reach = new.replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "[::1]:");
        moved.insert(original, reach.parse().unwrap());
    }
    (out, moved)
}

/// Every `IPv4:PORT` and `[IPv6]:PORT` in `text`, once each.
fn regex_lite(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | '{' | '}')) {
        let word = word.trim_end_matches(':');
        if word.parse::<SocketAddr>().is_ok() && !found.contains(&word.to_string()) {
            found.push(word.to_string());
        }
    }
    found
}

#[test]
fn the_minimal_example_answers_through_its_demo_backends() {
    let (yaml, moved) = with_free_ports("minimal.yaml");
    let file = temp_dir().join("minimal.yaml");
    std::fs::write(&file, yaml).unwrap();
    let listen = moved["127.0.0.1:8080"];
    let _demo = demo(&["-c", file.to_str().unwrap()], listen);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..4 {
        let r = Conn::open(listen).get("/", "");
        assert_eq!(r.status, 200, "{}", r.text());
        seen.insert(r.header("x-backend").unwrap());
    }
    assert_eq!(seen.len(), 2, "both endpoints answer: {seen:?}");
}

#[test]
fn the_gateway_example_answers_on_its_routes_and_admin_api() {
    let (yaml, moved) = with_free_ports("gateway.yaml");
    let dir = temp_dir();
    let file = dir.join("gateway.yaml");
    std::fs::write(&file, yaml).unwrap();
    for named in ["gateway.htpasswd", "gateway-keys.txt", "gateway-jwt.pem", "gateway-revoked.txt"] {
        std::fs::copy(format!("{}/../../examples/{named}", env!("CARGO_MANIFEST_DIR")), dir.join(named)).unwrap();
    }
    let listen = moved["0.0.0.0:8080"];
    let _demo = demo(&["-c", file.to_str().unwrap()], listen);
    for path in ["/", "/api/users", "/healthz", "/app/page"] {
        let r = Conn::open(listen).get(path, "");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // Behind auth_basic (the demo users of gateway.htpasswd: bcrypt and APR1) and api_key (gateway-keys.txt,
    // and the configuration's own key).
    assert_eq!(Conn::open(listen).get("/internal/echo", "").status, 401);
    assert_eq!(Conn::open(listen).get("/internal/echo", "authorization: Basic b3BzOndyb25n\r\n").status, 401);
    for (credentials, user) in
        [("b3BzOmNoYW5nZS1tZS1vcHM=", "ops"), ("YXVkaXRvcjpjaGFuZ2UtbWUtYXVkaXRvcg==", "auditor")]
    {
        let r = Conn::open(listen).get("/internal/echo", &format!("authorization: Basic {credentials}\r\n"));
        assert_eq!(r.status, 200, "{user}: {}", r.text());
        assert!(
            r.text().contains(&format!("x-auth-user: {user}\n")) && !r.text().contains("authorization"),
            "{}",
            r.text()
        );
    }
    assert_eq!(Conn::open(listen).get("/partners/echo", "x-api-key: nope\r\n").status, 401);
    for (key, name) in
        [("reports-demo-key", "reports"), ("partner-demo-key-1", "partner-a"), ("k-batch-7c21", "partner-b")]
    {
        let r = Conn::open(listen).get(&format!("/partners/echo?api_key={key}"), "");
        assert_eq!(r.status, 200, "{key}: {}", r.text());
        assert!(r.text().contains(&format!("x-api-key-name: {name}\n")) && !r.text().contains(key), "{}", r.text());
    }
    // Behind jwt (the demo tokens of gateway-tokens.txt) and a rate limit per verified subject.
    let tokens =
        std::fs::read_to_string(format!("{}/../../examples/gateway-tokens.txt", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let tokens: Vec<&str> = tokens.lines().filter(|l| !l.starts_with('#')).collect();
    let (demo_user, revoked) = (format!("authorization: Bearer {}\r\n", tokens[0]), tokens[1]);
    assert_eq!(Conn::open(listen).get("/orders/echo", "").status, 401);
    let r = Conn::open(listen).get("/orders/echo", &format!("authorization: Bearer {revoked}\r\n"));
    assert!(r.status == 401 && r.header("www-authenticate").unwrap().contains("revoked"), "{}", r.head);
    let r = Conn::open(listen).get("/orders/echo", &demo_user);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("x-user-id: demo-user\n") && !r.text().contains("authorization"), "{}", r.text());
    assert!(r.head.contains("\"per-user\";q=5;w=1") && r.head.contains("\"per-client\";q=100;w=1"), "{}", r.head);
    let mut conn = Conn::open(listen);
    let statuses: Vec<u16> = (0..12).map(|_| conn.get("/orders/echo", &demo_user).status).collect();
    assert!(statuses.contains(&429), "bursts of 10, then 5 a second: {statuses:?}");
    // The public API's gateway filters: query edits seen by the upstream, a compressed answer (decoded by
    // Python's gzip), and the limits.
    let pad = "p".repeat(2000);
    let r = Conn::open(listen)
        .get("/v1/echo?debug=1&x=%2f&api-version=1", &format!("accept-encoding: gzip\r\nx-pad: {pad}\r\n"));
    assert_eq!((r.status, r.header("content-encoding").as_deref()), (200, Some("gzip")), "{}", r.head);
    let plain = String::from_utf8_lossy(&gunzip(&r.body)).into_owned();
    assert!(plain.contains("GET /echo?x=%2f&api-version=2 "), "{plain}");
    let r = Conn::open(listen).get("/v1/echo", "content-length: 20000000\r\n");
    assert_eq!(r.status, 413, "{}", r.text());
    let deep = "[".repeat(40) + &"]".repeat(40);
    let mut conn = Conn::open(listen);
    conn.send(
        format!(
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{deep}",
            deep.len()
        )
        .as_bytes(),
    );
    assert_eq!(conn.read_response(false).status, 400);
    let r = Conn::open(listen).get(&format!("/v1/{}", "u".repeat(4100)), "");
    assert_eq!(r.status, 414);
    let writes = Conn::open(listen).get("/api/users", "");
    assert!(writes.header("x-backend").unwrap().starts_with("api-"), "{}", writes.head);
    let admin = Conn::open(moved["127.0.0.1:9901"]).get("/admin/clusters", "");
    assert_eq!(admin.status, 200);
    // Its access log is next to the configuration (relative paths start there).
    wait_until("the access log", Duration::from_secs(5), || dir.join("logs/access.log").exists());
}

#[test]
fn the_demo_serves_its_admin_api_and_broker_too() {
    let (listen, admin) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let mqtt = format!("127.0.0.1:{}", free_port());
    let args = ["--listen", &listen, "--admin", &admin, "--mqtt", &mqtt, "--workers", "1"];
    let _demo = demo(&args, listen.parse().unwrap());
    // The broker answers a CONNECT with CONNACK accepted, and PINGREQ with PINGRESP.
    let mut client = std::net::TcpStream::connect(&mqtt).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    mqtt_packet(&mut client, 0x10, b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x04demo");
    assert_eq!(mqtt_read(&mut client), (0x20, vec![0, 0]));
    mqtt_packet(&mut client, 0xc0, b"");
    assert_eq!(mqtt_read(&mut client), (0xd0, vec![]));
    // And over WebSocket at /mqtt on the HTTP listener.
    assert_eq!(mqtt_over_websocket(listen.parse().unwrap()), (0x20, vec![0, 0]));
    assert_eq!(Conn::open(listen.parse().unwrap()).get("/", "").status, 200);
    let function = Conn::open(listen.parse().unwrap()).get("/fn/hello?name=tests", "");
    assert_eq!(function.status, 200, "{}", function.text());
    assert!(function.text().contains("\"message\":\"hello, tests!\""), "{}", function.text());
    // The function filter in front of /api/: without the key 401, with it the request goes on, changed.
    assert_eq!(Conn::open(listen.parse().unwrap()).get("/api/echo", "").status, 401);
    let passed = Conn::open(listen.parse().unwrap()).get("/api/echo", "x-api-key: demo\r\n");
    assert_eq!(passed.status, 200, "{}", passed.text());
    assert!(passed.text().contains("x-api-client") && !passed.text().contains("x-api-key"), "{}", passed.text());
    let metrics = Conn::open(admin.parse().unwrap()).get("/metrics", "");
    assert_eq!(metrics.status, 200);
    assert!(metrics.text().contains("portico_requests_total"), "{}", metrics.text());
}

#[test]
fn the_tls_example_gets_demo_certificates_and_answers_over_http2() {
    let (yaml, moved) = with_free_ports("edge-tls.yaml");
    let dir = temp_dir();
    let file = dir.join("edge-tls.yaml");
    std::fs::write(&file, yaml).unwrap();
    let https = moved["0.0.0.0:8443"];
    let _demo = demo(&["-c", file.to_str().unwrap()], https);
    for made in ["site.pem", "site.key", "clients-ca.pem", "upstream-ca.pem"] {
        assert!(dir.join("certs").join(made).exists(), "certs/{made} was not made");
    }
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2", "-w", " %{http_code} %{http_version}"])
        .arg("--cacert")
        .arg(dir.join("certs/upstream-ca.pem"))
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", https.port())])
        .arg(format!("https://localhost:{}/healthz", https.port()))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, "ok\n 200 2", "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_functions_example_answers_from_its_function_and_its_backend() {
    let (yaml, moved) = with_free_ports("functions.yaml");
    let dir = temp_dir();
    std::fs::create_dir_all(dir.join("functions")).unwrap();
    for file in ["hello.js", "api_key.js"] {
        let source = format!("{}/../../examples/functions/{file}", env!("CARGO_MANIFEST_DIR"));
        std::fs::copy(source, dir.join("functions").join(file)).unwrap();
    }
    let file = dir.join("functions.yaml");
    std::fs::write(&file, yaml).unwrap();
    let listen = moved["127.0.0.1:8080"];
    let _demo = demo(&["-c", file.to_str().unwrap()], listen);
    let r = Conn::open(listen).get("/hello?name=you", "");
    assert_eq!((r.status, r.text().as_str()), (200, "Hello, you!\n"));
    assert_eq!(r.header("x-served-by").as_deref(), Some("portico-function"));
    assert_eq!(Conn::open(listen).get("/", "").status, 200);
    // The filter in front of /api/.
    assert_eq!(Conn::open(listen).get("/api/", "").status, 401);
    let r = Conn::open(listen).get("/api/", "x-api-key: secret\r\n");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-checked-by").as_deref(), Some("api_key.js"));
}

#[test]
fn the_mqtt_example_brokers_over_tcp_and_tls_beside_http() {
    let (yaml, moved) = with_free_ports("mqtt.yaml");
    let dir = temp_dir();
    let file = dir.join("mqtt.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (web, mqtt, mqtts) = (moved["127.0.0.1:8080"], moved["127.0.0.1:1883"], moved["127.0.0.1:8883"]);
    let _demo = demo(&["-c", file.to_str().unwrap()], web);
    assert_eq!(Conn::open(web).get("/healthz", "").status, 200);
    // A subscriber over TLS (trusting the demo CA, which ends the certificate file) gets what a plain client
    // publishes at QoS 1, and the store is where the example says.
    let mut sub = common::pki::connect(mqtts, "localhost", &dir.join("certs/site.pem"), None, &[]).unwrap();
    mqtt_packet(&mut sub, 0x10, b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x03sub");
    assert_eq!(mqtt_read(&mut sub), (0x20, vec![0, 0]));
    mqtt_packet(&mut sub, 0x82, b"\x00\x01\x00\x09sensors/#\x01");
    assert_eq!(mqtt_read(&mut sub), (0x90, vec![0, 1, 1]));
    let mut publisher = std::net::TcpStream::connect(mqtt).unwrap();
    publisher.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    mqtt_packet(&mut publisher, 0x10, b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x03pub");
    assert_eq!(mqtt_read(&mut publisher), (0x20, vec![0, 0]));
    mqtt_packet(&mut publisher, 0x32, b"\x00\x0csensors/temp\x00\x07" as &[u8]);
    assert_eq!(mqtt_read(&mut publisher), (0x40, vec![0, 7]));
    let (first, body) = mqtt_read(&mut sub);
    assert_eq!((first & 0xf0, &body[..14]), (0x30, &b"\x00\x0csensors/temp"[..]));
    assert!(dir.join("data/mqtt/store.redb").exists());
    // And the broker over WebSocket on the HTTP listener.
    assert_eq!(mqtt_over_websocket(web), (0x20, vec![0, 0]));
}

/// A WebSocket client's CONNECT at `/mqtt` of `addr` (subprotocol `mqtt`): the broker's answer.
fn mqtt_over_websocket(addr: SocketAddr) -> (u8, Vec<u8>) {
    use tungstenite::client::IntoClientRequest;
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut request = format!("ws://{addr}/mqtt").into_client_request().unwrap();
    request.headers_mut().insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    let (mut ws, _) = tungstenite::client(request, stream).expect("WebSocket handshake");
    let mut connect = Vec::new();
    mqtt_packet(&mut connect, 0x10, b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x02ws");
    ws.send(tungstenite::Message::binary(connect)).unwrap();
    let answer = ws.read().unwrap().into_data();
    let mut answer = std::io::Cursor::new(answer.to_vec());
    mqtt_read(&mut answer)
}

/// Writes one MQTT packet (its first byte, then a one-byte length: these are short).
fn mqtt_packet(stream: &mut impl std::io::Write, first: u8, body: &[u8]) {
    let mut out = vec![first, body.len() as u8];
    out.extend_from_slice(body);
    stream.write_all(&out).unwrap();
    stream.flush().unwrap();
}

/// Reads one MQTT packet with a one-byte length: its first byte and body.
fn mqtt_read(stream: &mut impl std::io::Read) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).unwrap();
    assert!(head[1] < 0x80, "a short packet");
    let mut body = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut body).unwrap();
    (head[0], body)
}
