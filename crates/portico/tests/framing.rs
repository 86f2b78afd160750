//! HTTP/1 framing from the client side: strict parsing (every refused case gets its status, a closed
//! connection and no forwarded request), pipelining, HTTP/1.0, bodies, 100-continue, hop-by-hop headers.

mod common;
use common::*;
use portico_testkit::{body_hash, Backend};
use std::io::{Read, Write};
use std::time::Duration;

fn setup() -> (Backend, Portico) {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    (b, p)
}

#[test]
fn ambiguous_or_malformed_requests_get_400_and_are_never_forwarded() {
    let (backend, p) = setup();
    let cases: &[(&str, &[u8], u16)] = &[
        ("CL and TE", b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("TE and CL", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400),
        ("differing CLs", b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
        ("CL list", b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!", 400),
        ("CL sign", b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", 400),
        ("TE gzip", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        ("TE chunked not final", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
        ("TE obfuscated", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
        ("TE twice", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("obs-fold", b"GET / HTTP/1.1\r\nHost: a\r\nX-Long: one\r\n two\r\n\r\n", 400),
        ("space before colon", b"GET / HTTP/1.1\r\nHost: a\r\nX-Bad : v\r\n\r\n", 400),
        ("bare LF in headers", b"GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", 400),
        ("bare LF request line", b"GET / HTTP/1.1\nHost: a\r\n\r\n", 400),
        ("bare CR", b"GET / HTTP/1.1\r\nHost: a\rX-A: b\r\n\r\n", 400),
        ("missing Host", b"GET / HTTP/1.1\r\n\r\n", 400),
        ("two Hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("bad target", b"GET nothing HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        ("NUL in header", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400),
        ("bad chunk size", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400),
        ("chunk size overflow", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nhello\r\n0\r\n\r\n", 400),
        ("chunk without CRLF", b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", 400),
        ("HTTP/1.0 with TE", b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ];
    for (name, request, status) in cases {
        let (response, closed) = raw_exchange(p.addr, request);
        assert!(response.starts_with(&format!("HTTP/1.1 {status} ")), "{name}: got {response:?}");
        assert!(response.to_ascii_lowercase().contains("connection: close"), "{name}: {response}");
        assert!(closed, "{name}: connection left open");
    }
    assert_eq!(backend.requests(), 0, "a malformed request was forwarded");
    // The gateway still serves.
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
}

#[test]
fn a_broken_chunk_arriving_late_aborts_the_upstream_request() {
    let (backend, p) = setup();
    let mut conn = Conn::open(p.addr);
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    std::thread::sleep(Duration::from_millis(200));
    conn.send(b"zz\r\nbad\r\n0\r\n\r\n");
    let r = conn.read_response(false);
    assert_eq!(r.status, 400, "{}", r.head);
    assert!(conn.is_closed());
    // The upstream saw the head but never a complete request: its /upload never answered.
    std::thread::sleep(Duration::from_millis(200));
    assert!(backend.requests() <= 1);
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
}

#[test]
fn oversized_heads_get_414_and_431() {
    let (backend, p) = setup();
    let long_target = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
    let (r, closed) = raw_exchange(p.addr, long_target.as_bytes());
    assert!(r.starts_with("HTTP/1.1 414 "), "{r}");
    assert!(closed);
    let big_header = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n", "v".repeat(40_000));
    let (r, closed) = raw_exchange(p.addr, big_header.as_bytes());
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    assert!(closed);
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let (r, closed) = raw_exchange(p.addr, format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes());
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    assert!(closed);
    assert_eq!(backend.requests(), 0);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_b, p) = setup();
    let mut conn = Conn::open(p.addr);
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.extend_from_slice(format!("GET /echo?i={i} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
    }
    batch.extend_from_slice(b"POST /echo?i=5 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc");
    batch.extend_from_slice(b"GET /echo?i=6 HTTP/1.1\r\nHost: a\r\n\r\n");
    conn.send(&batch);
    for i in 0..7 {
        let r = conn.read_response(false);
        assert_eq!(r.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["target"], format!("/echo?i={i}"));
    }
}

#[test]
fn http10_clients_get_a_closed_or_kept_connection_as_asked() {
    let (_b, p) = setup();
    let (r, closed) = raw_exchange(p.addr, b"GET /bytes/10 HTTP/1.0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with("0123456789"), "{r}");
    assert!(closed);
    // Keep-alive for 1.0 when asked, and a chunked upstream body is de-chunked and ended by close.
    let mut conn = Conn::open(p.addr);
    conn.send(b"GET /bytes/10 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = conn.read_response(false);
    assert_eq!(r.header("connection").as_deref(), Some("keep-alive"));
    assert_eq!(r.body, b"0123456789");
    conn.send(b"GET /bytes/10?chunked HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = conn.read_response(false);
    assert!(r.header("transfer-encoding").is_none(), "chunked sent to an HTTP/1.0 client");
    assert_eq!(r.body, b"0123456789");
}

#[test]
fn bodies_are_forwarded_intact() {
    let (_b, p) = setup();
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = temp_dir().join("body.bin");
    std::fs::write(&path, &body).unwrap();
    let expected = format!("{} {}", body.len(), body_hash(&body));
    // Content-Length POST and PUT (curl sends Expect: 100-continue for bodies this large).
    for method in ["POST", "PUT"] {
        let (ok, out) = curl(&["-X", method, "--data-binary", &format!("@{}", path.display()), &p.url("/upload")]);
        assert!(ok);
        assert_eq!(out, expected, "{method}");
    }
    // Chunked upload.
    let (ok, out) = curl(&[
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &format!("@{}", path.display()),
        &p.url("/upload"),
    ]);
    assert!(ok);
    assert_eq!(out, expected, "chunked");
    // Small bodies, several on one connection.
    let mut conn = Conn::open(p.addr);
    for i in 0..20 {
        let data = format!("payload number {i}");
        conn.send(
            format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{data}", data.len()).as_bytes(),
        );
        assert_eq!(conn.read_response(false).text(), format!("{} {}", data.len(), body_hash(data.as_bytes())));
    }
    // A chunked body with extensions and trailers, by hand.
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n");
    assert_eq!(conn.read_response(false).text(), format!("5 {}", body_hash(b"abcde")));
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let (_b, p) = setup();
    let mut conn = Conn::open(p.addr);
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    let interim = conn.read_response(false);
    assert_eq!(interim.status, 100);
    conn.send(b"hello");
    let r = conn.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), format!("5 {}", body_hash(b"hello")));
}

#[test]
fn hop_by_hop_headers_are_removed_and_forwarding_headers_added() {
    let (_b, p) = setup();
    let mut conn = Conn::open(p.addr);
    let r = conn.get(
        "/echo",
        "Connection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\nProxy-Authorization: Basic abc\r\nProxy-Connection: keep-alive\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\nVia: 1.1 edge\r\nX-Kept: yes\r\n",
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let headers: Vec<(String, String)> = serde_json::from_value(v["headers"].clone()).unwrap();
    let get = |n: &str| headers.iter().filter(|(k, _)| k == n).map(|(_, v)| v.clone()).collect::<Vec<_>>();
    for gone in
        ["connection", "x-secret", "keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection"]
    {
        assert!(get(gone).is_empty(), "{gone} forwarded: {headers:?}");
    }
    assert_eq!(get("host"), vec!["test.local"]);
    assert_eq!(get("x-forwarded-for"), vec!["10.0.0.1, 127.0.0.1"]);
    assert_eq!(get("x-forwarded-proto"), vec!["http"]);
    assert_eq!(get("x-forwarded-host"), vec!["test.local"]);
    assert_eq!(get("via"), vec!["1.1 edge, 1.1 portico"]);
    assert_eq!(get("x-kept"), vec!["yes"]);
}

#[test]
fn host_can_be_rewritten_to_the_endpoint() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    preserve_host: false\n");
    let r = Conn::open(p.addr).get("/echo", "");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["headers"].to_string().contains(&format!("[\"host\",\"{}\"]", b.addr)), "{v}");
}

#[test]
fn slow_request_heads_time_out() {
    let b = Backend::start("b0").unwrap();
    let yaml = simple_yaml("round_robin", &[b.addr], "").replace(
        "    address: \"{listen}\"\n",
        "    address: \"{listen}\"\n    timeouts: { header_read: 500ms, keepalive: 1s }\n",
    );
    let p = Portico::start(&yaml);
    // Slowloris: a head that never completes is answered 408 and closed after header_read.
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
    let started = std::time::Instant::now();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // An idle keep-alive connection is closed after the keepalive timeout.
    let mut conn = Conn::open(p.addr);
    assert_eq!(conn.get("/", "").status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(conn.is_closed());
    assert_eq!(b.requests(), 1);
}

#[test]
fn empty_lines_between_requests_are_tolerated_but_a_flood_is_refused() {
    let b = Backend::start("b0").unwrap();
    let yaml = simple_yaml("round_robin", &[b.addr], "").replace(
        "    address: \"{listen}\"\n",
        "    address: \"{listen}\"\n    timeouts: { header_read: 300ms, keepalive: 5s }\n",
    );
    let p = Portico::start(&yaml);
    // A CRLF after a body (RFC 9112 2.2) must not start the head timer: no stray 408 on an idle connection.
    let mut conn = Conn::open(p.addr);
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi\r\n");
    assert_eq!(conn.read_response(false).status, 200);
    std::thread::sleep(Duration::from_millis(800));
    let r = conn.get("/", "");
    assert_eq!(r.status, 200, "{}", r.head);
    // Endless empty lines are cut off instead of buffered.
    let flood = b"\r\n".repeat(1000);
    let (out, closed) = raw_exchange(p.addr, &flood);
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(closed);
}

#[test]
fn head_and_bodiless_responses() {
    let (_b, p) = setup();
    let mut conn = Conn::open(p.addr);
    conn.send(b"HEAD /bytes/1000 HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = conn.read_response(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length").as_deref(), Some("1000"));
    let r = conn.get("/status/204", "");
    assert_eq!(r.status, 204);
    let r = conn.get("/bytes/3", "");
    assert_eq!(r.body, b"012");
}

/// A fragment is not part of an origin-form or absolute-form target (RFC 9112 3.2): a proxy that routes on one
/// reading of the path while the upstream reads another is a bypass, so the request is refused outright.
#[test]
fn a_fragment_in_the_request_target_gets_400_and_is_never_forwarded() {
    let (backend, p) = setup();
    for request in [
        &b"GET /g#frag HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"GET /g?q=1#frag HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /# HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET http://a/g#f HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /upload#f HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi",
    ] {
        let name = String::from_utf8_lossy(request);
        let (response, closed) = raw_exchange(p.addr, request);
        assert!(response.starts_with("HTTP/1.1 400 "), "{name:?}: got {response:?}");
        assert!(response.to_ascii_lowercase().contains("connection: close"), "{name:?}: {response}");
        assert!(closed, "{name:?}: connection left open");
    }
    assert_eq!(backend.requests(), 0, "a target with a fragment was forwarded");
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
}

/// Writes `request` and reads until the server closes, failing after `within`: what arrived and how long it took.
fn exchange_within(addr: std::net::SocketAddr, request: &[u8], within: Duration) -> (String, Duration) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let started = std::time::Instant::now();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("nothing but {:?} after {:?}: {e}", String::from_utf8_lossy(&out), started.elapsed()),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), started.elapsed())
}

/// A bare CR where chunk framing needs CRLF is refused when it arrives, not when more bytes (or the body read
/// timeout) do: in the request before anything went upstream, in a request body already streaming upstream,
/// and in an upstream's response body.
#[test]
fn a_bare_cr_in_chunk_framing_fails_at_once() {
    let b = Backend::start("b0").unwrap();
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("    address: \"{listen}\"\n", "    address: \"{listen}\"\n    timeouts: { body_read: 10s }\n");
    let p = Portico::start(&yaml);
    let head = "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in ["5\rhello\r0\r\r", "5\r\nhello\r\n0\r\r", "5\r\nhello\r\n0\r\nX-T: 1\rX", "5;a=b\rc"] {
        let (response, took) = exchange_within(p.addr, format!("{head}{body}").as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 400 "), "{body:?}: got {response:?}");
        assert!(took < Duration::from_secs(2), "{body:?}: answered after {took:?}");
    }
    assert_eq!(b.requests(), 0, "a request with broken chunk framing was forwarded");
    // The bare CR arrives once the body streams upstream.
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("{head}5\r\nhello\r\n").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    s.write_all(b"5\rworld").unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 400 "), "late bare CR: got {response:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "late bare CR: answered after {:?}", started.elapsed());
    // In an upstream's response body: the response breaks off at once (the upstream holds its connection open).
    let raw = portico_testkit::raw::RawBackend::start(portico_testkit::raw::Behaviour::AnswerWithoutReading(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\rhello".to_vec(),
    ))
    .unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let (response, took) = exchange_within(p.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Duration::from_secs(5));
    assert!(!response.contains("hello"), "{response:?}");
    assert!(took < Duration::from_secs(2), "the broken response body was cut off after {took:?}");
}

/// A client may close its sending side once its request is complete (RFC 9112 9.6 leaves half-closed
/// connections to the client): the response is still sent, then the connection closed.
#[test]
fn a_client_that_half_closes_after_its_request_gets_the_response() {
    let (backend, p) = setup();
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /hc HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).expect("the response, then the end of the connection");
    assert!(response.starts_with("HTTP/1.1 200 "), "{response:?}");
    assert!(response.ends_with("hello from b0\n"), "{response:?}");
    assert!(response.to_ascii_lowercase().contains("connection: close"), "{response:?}");
    assert_eq!(backend.requests(), 1);
}

/// Reads until the server closes; panics if it does not within `within`.
fn read_to_close(s: &mut std::net::TcpStream, within: Duration) -> String {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap_or_else(|e| panic!("{e} after {:?}", String::from_utf8_lossy(&out)));
    String::from_utf8_lossy(&out).into_owned()
}

/// Half-closed clients, continued: one whose answer is slow is sent `100 Continue` (to learn whether it is
/// still there) and then its answer; one that pipelined two requests before half-closing gets both answers.
#[test]
fn a_half_closed_client_gets_slow_and_pipelined_answers() {
    let (backend, p) = setup();
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.write_all(b"GET /slow/1500 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let response = read_to_close(&mut s, Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 "), "{response:?}");
    assert!(response.ends_with("slow hello from b0\n"), "{response:?}");

    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.write_all(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let response = read_to_close(&mut s, Duration::from_secs(5));
    assert_eq!(response.matches("HTTP/1.1 200 ").count(), 2, "{response:?}");
    assert!(response.ends_with("hello from b0\n"), "{response:?}");
    assert_eq!(backend.requests(), 3);
}

/// A client that closes for good, or resets, while its request waits for the upstream still cancels the
/// upstream request, logged as 499: a reset at once, a close once the probe written to it is answered with
/// a reset (a closed socket cannot tell the peer otherwise).
#[test]
fn a_client_that_leaves_while_waiting_cancels_the_upstream_request() {
    let raw = portico_testkit::raw::RawBackend::start(portico_testkit::raw::Behaviour::Hang).unwrap();
    let log = temp_dir().join("access.log");
    let yaml = simple_yaml("round_robin", &[raw.addr], "")
        .replace("workers: 1", &format!("workers: 1\naccess_log: {{ path: \"{}\", format: json }}", log.display()));
    let p = Portico::start(&yaml);
    for (n, reset) in [(1, true), (2, false)] {
        let s = std::net::TcpStream::connect(p.addr).unwrap();
        (&s).write_all(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        wait_until("the request upstream", Duration::from_secs(5), || raw.requests() == n);
        let left = std::time::Instant::now();
        if reset {
            // Linger zero: close() sends a reset instead of a FIN.
            let linger = libc::linger { l_onoff: 1, l_linger: 0 };
            let size = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            assert_eq!(
                unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&raw const linger).cast(), size) },
                0
            );
        }
        drop(s);
        wait_until("the upstream request cancelled", Duration::from_secs(5), || raw.peer_closed() == n);
        let within = if reset { Duration::from_millis(500) } else { Duration::from_secs(3) };
        assert!(left.elapsed() < within, "reset {reset}: cancelled after {:?}", left.elapsed());
    }
    wait_until("both logged", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).unwrap_or_default().lines().count() == 2
    });
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(entry["status"], 499, "{line}");
    }
}

#[test]
fn a_half_closed_client_gets_answers_to_requests_read_ahead_for_pipelining() {
    // Review finding: with pool.pipeline_depth, pipelined requests are taken from the buffer into a queue; a
    // half-close then made the first answer the last, and the queued requests were never answered.
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 4 }\n");
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.write_all(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let response = read_to_close(&mut s, Duration::from_secs(5));
    assert_eq!(response.matches("HTTP/1.1 200 ").count(), 3, "{response:?}");
    assert_eq!(b.requests(), 3);
}
