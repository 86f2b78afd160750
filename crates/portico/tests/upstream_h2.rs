//! `protocol: h2` clusters: HTTP/1.1 and HTTP/2 clients reach HTTP/2-only upstreams (prior knowledge and TLS
//! with ALPN) over few multiplexed connections, with bodies streamed both ways.

mod common;
use common::pki::Ca;
use common::*;
use portico_testkit::Backend;
use std::io::Write;
use std::time::Duration;

fn yaml(endpoint: &str, cluster_extra: &str) -> String {
    format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    protocol: h2\n{cluster_extra}    endpoints:\n      - address: \"{endpoint}\"\n"
    )
}

#[test]
fn http1_clients_reach_an_http2_only_upstream() {
    let b = Backend::start_h2("h2-b0").unwrap();
    let p = Portico::start(&yaml(&b.addr.to_string(), ""));
    let mut conn = Conn::open(p.addr);
    for i in 0..100 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-backend").as_deref(), Some("h2-b0"));
    }
    let echo = conn.get("/echo?q=1", "X-Custom: kept\r\nConnection: keep-alive, X-Drop\r\nX-Drop: gone\r\n");
    let text = echo.text();
    assert!(text.contains("\"version\":\"HTTP/2.0\""), "{text}");
    assert!(text.contains("\"target\":\"/echo?q=1\"") || text.contains("/echo?q=1"), "{text}");
    assert!(text.contains("[\"x-custom\",\"kept\"]") && !text.contains("x-drop"), "{text}");
    assert!(text.contains("[\"via\",\"1.1 portico\"]") && text.contains("[\"x-forwarded-proto\",\"http\"]"), "{text}");
    // Responses with and without a length, uploads with a length and chunked, HEAD.
    assert_eq!(conn.get("/bytes/3000000", "").body.len(), 3_000_000);
    let chunked = conn.get("/bytes/500000?chunked", "");
    assert_eq!(chunked.body.len(), 500_000);
    assert_eq!(chunked.header("transfer-encoding").as_deref(), Some("chunked"));
    let body = vec![b'q'; 1_500_000];
    conn.send(format!("PUT /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    conn.stream.write_all(&body).unwrap();
    assert_eq!(conn.read_response(false).text(), format!("1500000 {}", portico_testkit::body_hash(&body)));
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..40 {
        conn.send(format!("{:x}\r\n{}\r\n", 5000, "k".repeat(5000)).as_bytes());
    }
    conn.send(b"0\r\n\r\n");
    assert_eq!(
        conn.read_response(false).text(),
        format!("200000 {}", portico_testkit::body_hash(&vec![b'k'; 200_000]))
    );
    conn.send(b"HEAD /bytes/100 HTTP/1.1\r\nHost: a\r\n\r\n");
    let head = conn.read_response(true);
    assert_eq!((head.status, head.header("content-length").as_deref()), (200, Some("100")));
    assert_eq!(conn.get("/", "").status, 200, "the connection is still in step");

    // HTTP/1.0: the body ends with the connection.
    let (answer, closed) = raw_exchange(p.addr, b"GET /bytes/1000?chunked HTTP/1.0\r\n\r\n");
    assert!(closed && answer.starts_with("HTTP/1.1 200") && !answer.contains("chunked"), "{answer}");

    // Many clients at once share one multiplexed upstream connection.
    let load = Load::start(p.addr, 20);
    std::thread::sleep(Duration::from_millis(700));
    let (done, errors) = load.finish();
    assert!(done > 100 && errors.is_empty(), "{done} requests, errors: {errors:?}");
    let opened =
        p.metric(&format!("portico_upstream_connections_opened_total{{cluster=\"app\",endpoint=\"{}\"}}", b.addr));
    assert_eq!(opened, 1.0, "one HTTP/2 connection carries everything");
    assert_eq!(b.connections(), 1);
}

#[test]
fn http2_clients_and_tls_upstreams_negotiate_h2() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let cert = ca.server(&dir, "backend", "backend", &["localhost", "127.0.0.1"]);
    let b = Backend::start_tls_h2("tls-h2", &cert.cert, &cert.key).unwrap();
    let tls = format!("    tls: {{ ca: \"{}\" }}\n", ca.pem.display());
    let p = Portico::start(&yaml(&format!("https://{}", b.addr), &tls));
    let r = Conn::open(p.addr).get("/echo", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"version\":\"HTTP/2.0\""), "{}", r.text());
    let (ok, out) = curl(&["--http2-prior-knowledge", &p.url("/echo")]);
    assert!(ok && out.contains("[\"via\",\"2 portico\"]"), "{out}");

    // An upstream that only speaks HTTP/1.1 refuses h2 in ALPN: a clean 502 that says so.
    let old = Backend::start_tls("h1-only", &cert.cert, &cert.key, None).unwrap();
    let p2 = Portico::start(&yaml(&format!("https://{}", old.addr), &tls));
    let r = Conn::open(p2.addr).get("/", "");
    assert_eq!(r.status, 502, "{}", r.text());
}
