//! HTTPS upstreams: certificates verified against a configured CA (or refused with a clean 502), the server
//! name, mutual TLS, pooled and reused TLS connections, streamed bodies both ways, health checks and WebSocket
//! over TLS.

mod common;
use common::pki::{Ca, Issued};
use common::*;
use portico_testkit::Backend;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

fn yaml(endpoint: &str, cluster_extra: &str) -> String {
    format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n{cluster_extra}    endpoints:\n      - address: \"{endpoint}\"\n"
    )
}

fn https_backend(dir: &Path, ca: &Ca, client_ca: Option<&Path>) -> (Backend, Issued) {
    let cert = ca.server(dir, "backend", "backend", &["localhost", "127.0.0.1"]);
    let b = Backend::start_tls("secure-b0", &cert.cert, &cert.key, client_ca).unwrap();
    (b, cert)
}

#[test]
fn https_upstreams_are_verified_pooled_and_stream_both_ways() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let (b, _) = https_backend(&dir, &ca, None);
    let extra = format!(
        "    tls: {{ ca: \"{}\" }}\n    health_check: {{ path: /health, interval: 200ms }}\n",
        ca.pem.display()
    );
    let p = Portico::start(&yaml(&format!("https://{}", b.addr), &extra));
    let mut conn = Conn::open(p.addr);
    for i in 0..300 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-backend").as_deref(), Some("secure-b0"));
    }
    // Large responses (Content-Length and chunked) and streamed uploads (Content-Length and chunked).
    assert_eq!(conn.get("/bytes/3000000", "").body.len(), 3_000_000);
    assert_eq!(conn.get("/bytes/700000?chunked", "").body.len(), 700_000);
    let body = vec![b'z'; 1_500_000];
    conn.send(format!("PUT /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    conn.stream.write_all(&body).unwrap();
    assert_eq!(conn.read_response(false).text(), format!("1500000 {}", portico_testkit::body_hash(&body)));
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..50 {
        conn.send(format!("{:x}\r\n{}\r\n", 10_000, "c".repeat(10_000)).as_bytes());
    }
    conn.send(b"0\r\n\r\n");
    let chunked = vec![b'c'; 500_000];
    assert_eq!(conn.read_response(false).text(), format!("500000 {}", portico_testkit::body_hash(&chunked)));
    for _ in 0..20 {
        assert_eq!(Conn::open(p.addr).get("/echo", "").status, 200);
    }
    // TLS connections are pooled: the health checker's probes aside, a handful serve everything.
    let opened = p.metric(&format!(
        "portico_upstream_connections_opened_total{{cluster=\"app\",endpoint=\"https://{}\"}}",
        b.addr
    ));
    assert!((1.0..=3.0).contains(&opened), "opened {opened} upstream TLS connections");
    // Probes every 200 ms: three failed ones would have marked it unhealthy by now.
    std::thread::sleep(Duration::from_millis(900));
    wait_until("the TLS health check passes", Duration::from_secs(5), || {
        p.metric(&format!("portico_endpoint_healthy{{cluster=\"app\",endpoint=\"https://{}\"}}", b.addr)) == 1.0
    });
    assert_eq!(b.tls_failures(), 0);

    // WebSocket to a TLS upstream.
    let stream = TcpStream::connect(p.addr).unwrap();
    let (mut ws, _) = tungstenite::client(format!("ws://{}/ws", p.addr), stream).expect("handshake");
    for i in 0..200 {
        let msg = tungstenite::Message::text(format!("over tls {i} {}", "w".repeat(i * 50)));
        ws.send(msg.clone()).unwrap();
        assert_eq!(ws.read().unwrap(), msg);
    }
}

#[test]
fn upstream_certificates_are_checked_and_failures_answered_cleanly() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let (b, _) = https_backend(&dir, &ca, None);
    let endpoint = format!("https://{}", b.addr);
    let get = |p: &Portico| Conn::open(p.addr).get("/", "");

    // The system roots do not know the test CA: a clean 502 that says why.
    let p = Portico::start(&yaml(&endpoint, ""));
    let r = get(&p);
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("TLS handshake with the upstream failed"), "{}", r.text());
    drop(p);

    // The right CA but a name the certificate does not cover: 502.
    let wrong_name = format!("    tls: {{ ca: \"{}\", server_name: api.example.test }}\n", ca.pem.display());
    let p = Portico::start(&yaml(&endpoint, &wrong_name));
    assert_eq!(get(&p).status, 502);
    drop(p);

    // A name it covers: verified.
    let right_name = format!("    tls: {{ ca: \"{}\", server_name: localhost }}\n", ca.pem.display());
    let p = Portico::start(&yaml(&endpoint, &right_name));
    assert_eq!(get(&p).status, 200);
    drop(p);

    // insecure_skip_verify accepts anything.
    let p = Portico::start(&yaml(&endpoint, "    tls: { insecure_skip_verify: true }\n"));
    assert_eq!(get(&p).status, 200);
    drop(p);

    // A plain endpoint in a TLS cluster, written http://, stays plain.
    let plain = Backend::start("plain").unwrap();
    let p = Portico::start(&yaml(&format!("http://{}", plain.addr), &right_name));
    assert_eq!(get(&p).header("x-backend").as_deref(), Some("plain"));
    drop(p);

    // Bad files are refused with their position.
    let path = dir.join("bad.yaml");
    let bad = yaml(&endpoint, "    tls: { ca: missing-ca.pem }\n")
        .replace("{listen}", "127.0.0.1:1")
        .replace("{admin}", "127.0.0.1:2");
    std::fs::write(&path, bad).unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bad.yaml:") && err.contains("missing-ca.pem"), "{err}");
}

#[test]
fn mutual_tls_to_upstreams_presents_the_client_certificate() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let clients = Ca::new(&dir, "clients");
    let (b, _) = https_backend(&dir, &ca, Some(&clients.pem));
    let proxy_cert = clients.client(&dir, "portico", "portico");
    let endpoint = format!("https://{}", b.addr);

    let without = format!("    tls: {{ ca: \"{}\" }}\n", ca.pem.display());
    let p = Portico::start(&yaml(&endpoint, &without));
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.status, 502, "{}", r.text());
    // The backend counts the refused handshake in its own task, a moment after Portico gave up on it.
    wait_until("the backend refused the handshake", Duration::from_secs(5), || b.tls_failures() >= 1);
    drop(p);

    let with = format!(
        "    tls: {{ ca: \"{}\", cert: \"{}\", key: \"{}\" }}\n",
        ca.pem.display(),
        proxy_cert.cert.display(),
        proxy_cert.key.display()
    );
    let p = Portico::start(&yaml(&endpoint, &with));
    let mut conn = Conn::open(p.addr);
    for _ in 0..50 {
        assert_eq!(conn.get("/", "").status, 200);
    }
}
