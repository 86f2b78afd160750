//! In-process handler targets end to end, through the binary over HTTP/1.1 and cleartext HTTP/2: the `echo`
//! handler (the request as Portico would forward it, then its body streamed back), HEAD, keep-alive after a
//! handler (a body it did not read is drained, or the connection closed), a client that leaves mid-body,
//! response filters on a handler's head, per-route metrics, and the configuration errors.

mod common;
use bytes::Bytes;
use common::echo::*;
use common::*;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use std::io::{Read, Write};
use std::time::Duration;

fn echo_config() -> String {
    config(
        "    timeouts: { body_read: 60s }\n",
        "filters:
  - headers: { response: { set: { x-served-by: portico } } }
routes:
  - name: who
    match: { path_prefix: /who }
    handler: echo
    filters:
      - headers: { request: { set: { x-added: yes }, remove: [x-secret] }, response: { set: { x-route: who } } }
      - rewrite: { strip_prefix: /who }
  - name: users
    match: { path: /users/:id }
    handler: echo
",
    )
}

#[test]
fn echo_describes_the_request_as_forwarded_and_response_filters_apply() {
    let p = Portico::start(&echo_config());
    for proto in BOTH {
        let r =
            request(p.addr, proto, "GET", "test.local", "/who/a/../b?q=1", &[("x-secret", "s"), ("x-keep", "k")], b"");
        assert_eq!(r.status, 200, "{proto:?}: {r:?}");
        let text = r.text();
        let version = if proto == Proto::H1 { "HTTP/1.1" } else { "HTTP/2.0" };
        // Normalised, then rewritten by the route's filter; the query kept.
        assert!(text.contains(&format!("\nGET /b?q=1 {version}\n")), "{proto:?}: {text}");
        assert!(text.contains("\nx-added: yes\n"), "{proto:?}: a request filter's header: {text}");
        assert!(text.contains("\nx-keep: k\n"), "{proto:?}: {text}");
        assert!(!text.contains("x-secret"), "{proto:?}: a removed header is not described: {text}");
        assert!(text.starts_with("client: 127.0.0.1:"), "{proto:?}: {text}");
        assert!(text.ends_with("\n\n"), "{proto:?}: no body follows an empty one: {text:?}");
        assert_eq!(r.header("content-type").as_deref(), Some("text/plain; charset=utf-8"), "{proto:?}");
        // Response filters, global then the route's, ran on the handler's head.
        assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?}");
        assert_eq!(r.header("x-route").as_deref(), Some("who"), "{proto:?}");
        assert_eq!(r.header("content-length"), Some(r.body.len().to_string()), "{proto:?}: the length is known");

        let r = request(p.addr, proto, "POST", "test.local", "/users/42", &[], b"hello body");
        let text = r.text();
        assert!(text.contains("\nPOST /users/42 "), "{proto:?}: {text}");
        assert!(text.contains("\nparam id: 42\n"), "{proto:?}: {text}");
        assert!(text.ends_with("\n\nhello body"), "{proto:?}: the body is echoed after the description: {text:?}");
        assert_eq!(r.header("x-route"), None, "{proto:?}: another route's filter");
        assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?}");
    }
    // Counted per route, and logged like any request.
    wait_until("route metrics", Duration::from_secs(5), || {
        p.metric("portico_requests_total{route=\"who\",cluster=\"\",status_class=\"2xx\"}") == 2.0
            && p.metric("portico_requests_total{route=\"users\",cluster=\"\",status_class=\"2xx\"}") == 2.0
    });
}

#[test]
fn echo_as_json() {
    let p = Portico::start(&echo_config());
    for proto in BOTH {
        let body = "line \"one\"\n\u{e9}t\u{e9} \u{1F600}".as_bytes();
        let r = request(p.addr, proto, "PUT", "test.local", "/who/x?format=json", &[("x-keep", "k\"v")], body);
        assert_eq!(r.header("content-type").as_deref(), Some("application/json"), "{proto:?}");
        let v: serde_json::Value =
            serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{proto:?}: {e}: {}", r.text()));
        assert_eq!(v["method"], "PUT", "{proto:?}");
        assert_eq!(v["path"], "/x", "{proto:?}");
        assert_eq!(v["query"], "format=json", "{proto:?}");
        let headers = v["headers"].as_array().unwrap();
        assert!(headers.iter().any(|h| h[0] == "x-keep" && h[1] == "k\"v"), "{proto:?}: {v}");
        assert!(headers.iter().any(|h| h[0] == "x-added" && h[1] == "yes"), "{proto:?}: {v}");
        assert!(v["client"].as_str().unwrap().starts_with("127.0.0.1:"), "{proto:?}: {v}");
        assert_eq!(v["body"].as_str().unwrap().as_bytes(), body, "{proto:?}");
    }
}

/// A body of `len` bytes that is not a repetition of a short pattern.
fn payload(len: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

#[test]
fn echo_streams_a_large_chunked_body_back_over_http1() {
    let p = Portico::start(&echo_config());
    let data = payload(4 * 1024 * 1024 + 17);
    let mut conn = Conn::open(p.addr);
    conn.stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut writer = conn.stream.try_clone().unwrap();
    let sent = data.clone();
    // Written while the answer is read: the echo streams it back as it arrives, so neither side holds it.
    let w = std::thread::spawn(move || {
        writer.write_all(b"POST /users/7 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        for piece in sent.chunks(100_003) {
            writer.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).unwrap();
            writer.write_all(piece).unwrap();
            writer.write_all(b"\r\n").unwrap();
        }
        writer.write_all(b"0\r\n\r\n").unwrap();
    });
    let r = conn.read_response(false);
    w.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding").as_deref(), Some("chunked"), "the length is unknown: {}", r.head);
    let split = r.body.windows(2).position(|w| w == b"\n\n").expect("the description ends with an empty line");
    let echoed = &r.body[split + 2..];
    assert_eq!(echoed.len(), data.len());
    assert!(echoed == data.as_slice(), "the echoed body differs");
    // The connection serves the next request.
    let again = conn.get("/users/8", "");
    assert_eq!(again.status, 200);
    assert!(again.text().contains("\nGET /users/8 "), "{}", again.text());
}

#[test]
fn echo_streams_a_large_body_back_over_http2() {
    let p = Portico::start(&echo_config());
    let data = payload(3 * 1024 * 1024 + 5);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut sender = h2c(p.addr).await;
        let pieces: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
            data.chunks(65_537).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
        // No length: the body is a stream of frames.
        let body = StreamBody::new(futures_util::stream::iter(pieces));
        let req = hyper::Request::post("http://test.local/users/9").body(body).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req)).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("content-length").is_none(), "{:?}", resp.headers());
        let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        let split = body.windows(2).position(|w| w == b"\n\n").unwrap();
        assert!(body[split + 2..] == data[..], "the echoed body differs ({} bytes)", body.len() - split - 2);
    });
}

#[test]
fn head_gets_no_body_and_an_unread_body_is_drained_or_the_connection_closed() {
    let p = Portico::start(&echo_config());
    for proto in BOTH {
        let r = request(p.addr, proto, "HEAD", "test.local", "/users/1", &[], b"");
        assert_eq!(r.status, 200, "{proto:?}");
        assert!(r.body.is_empty(), "{proto:?}: {r:?}");
        assert!(r.header("content-length").is_some(), "{proto:?}: HEAD says the would-be length: {r:?}");
    }
    // HTTP/1: the HEAD's body is never read by the handler; a small one is drained, and the connection reused.
    let mut conn = Conn::open(p.addr);
    conn.send(b"HEAD /users/1 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello");
    let r = conn.read_response(true);
    assert_eq!(r.status, 200);
    assert!(r.header("connection").is_none(), "{}", r.head);
    let r = conn.get("/users/2", "");
    assert!(r.text().contains("\nGET /users/2 "), "keep-alive after a drained body: {}", r.text());
    // A body too large to drain closes the connection after the answer.
    let mut conn = Conn::open(p.addr);
    let big = payload(1024 * 1024);
    conn.send(format!("HEAD /users/1 HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", big.len()).as_bytes());
    let mut writer = conn.stream.try_clone().unwrap();
    let w = std::thread::spawn(move || {
        let _ = writer.write_all(&big);
    });
    let r = conn.read_response(true);
    assert_eq!(r.status, 200);
    assert!(conn.is_closed(), "the connection must close rather than read a megabyte it was not asked for");
    let _ = w.join();
}

#[test]
fn keep_alive_reuse_after_echo_over_http1() {
    let p = Portico::start(&echo_config());
    let mut conn = Conn::open(p.addr);
    for i in 0..5 {
        let body = format!("body number {i}");
        conn.send(
            format!("POST /users/{i} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes(),
        );
        let r = conn.read_response(false);
        assert_eq!(r.status, 200);
        assert!(r.text().ends_with(&format!("\n\n{body}")), "{}", r.text());
    }
    // Pipelined: two requests in one write, answered in order on the same connection.
    conn.send(b"GET /users/a HTTP/1.1\r\nHost: t\r\n\r\nGET /users/b HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(conn.read_response(false).text().contains("\nGET /users/a "));
    assert!(conn.read_response(false).text().contains("\nGET /users/b "));
    // HTTP/1.0: the length is known, so the connection can be kept when asked for.
    conn.send(b"GET /users/c HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n");
    let r = conn.read_response(false);
    assert!(r.text().contains("\nGET /users/c HTTP/1.0\n"), "{}", r.text());
    assert_eq!(r.header("connection").as_deref(), Some("keep-alive"));
    assert!(!conn.is_closed());
}

#[test]
fn a_client_that_leaves_mid_body_cancels_the_handler() {
    let p = Portico::start(&echo_config());
    let done = |n: f64| p.metric("portico_requests_total{route=\"users\",cluster=\"\",status_class=\"2xx\"}") >= n;
    // HTTP/1: half a chunked body, then the client goes. body_read is 60 s: only cancellation ends it sooner.
    let mut conn = Conn::open(p.addr);
    conn.send(b"POST /users/1 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    let mut seen = [0u8; 64];
    let n = conn.stream.read(&mut seen).unwrap();
    assert!(seen[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&seen[..n]));
    drop(conn);
    wait_until("the HTTP/1 request recorded as ended", Duration::from_secs(5), || done(1.0));
    // HTTP/2: a body that never ends (its sender outlives the connection), then the connection goes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let feed = rt.block_on(async {
        let (mut tx, body) = futures_channel_body();
        let mut sender = h2c(p.addr).await;
        let req = hyper::Request::post("http://test.local/users/2").body(body).unwrap();
        tx.send(Bytes::from_static(b"part")).await;
        let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req)).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        let first = String::from_utf8_lossy(first.data_ref().unwrap()).into_owned();
        assert!(first.contains("\nPOST /users/2 "), "{first}");
        let echoed = body.frame().await.unwrap().unwrap();
        assert_eq!(echoed.data_ref().map(|d| &d[..]), Some(&b"part"[..]), "streamed back as it arrives");
        assert!(!done(2.0), "the request is still running");
        tx
    });
    drop(rt); // closes the connection, the request body still open
    wait_until("the HTTP/2 request recorded as ended", Duration::from_secs(5), || done(2.0));
    drop(feed);
    // Still serving.
    assert_eq!(get(p.addr, Proto::H1, "/users/3").status, 200);
}

/// A request body fed by hand: a sender and the body it feeds, never ending until the sender is dropped.
fn futures_channel_body() -> (Feed, http_body_util::StreamBody<tokio_stream_shim::Rx>) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    (Feed(tx), StreamBody::new(tokio_stream_shim::Rx(rx)))
}

struct Feed(tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::convert::Infallible>>);

impl Feed {
    async fn send(&mut self, data: Bytes) {
        self.0.send(Ok(Frame::data(data))).await.unwrap();
    }
}

mod tokio_stream_shim {
    use bytes::Bytes;
    use hyper::body::Frame;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    pub struct Rx(pub tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::convert::Infallible>>);
    impl futures_util::Stream for Rx {
        type Item = Result<Frame<Bytes>, std::convert::Infallible>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }
}

#[test]
fn check_reports_handler_errors_with_positions() {
    // Lines 1-4 are `head`; the route under test starts on line 5.
    let head = "listeners:\n  - name: web\n    address: \"127.0.0.1:8080\"\nroutes:\n";
    let cluster = "clusters:\n  c:\n    endpoints:\n      - address: \"127.0.0.1:9\"\n";
    let text =
        check_fails_at(&format!("{head}  - match: {{ path: /x }}\n    handler: ech\n"), 6..=6, "unknown handler");
    assert!(text.contains("echo"), "the known handlers are listed: {text}");
    check_fails_at(&format!("{head}  - cluster: c\n    handler: echo\n{cluster}"), 5..=6, "exactly one target");
    let (ok, text, _) = check(&format!("{head}  - handler: echo\n"));
    assert!(ok, "{text}");
}

// The `compress` filter: its body hook on proxied, static and handler responses, over both protocols.

fn compress_config(upstream: std::net::SocketAddr) -> String {
    let text = "a".repeat(2000);
    config(
        "",
        &format!(
            "filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico }} }} }}
routes:
  - match: {{ path_prefix: /api }}
    cluster: app
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path_prefix: /echo }}
    handler: echo
    filters: [ {{ compress: {{ types: [text/plain], level: 1 }} }} ]
  - match: {{ path: /big }}
    static: {{ body: \"{text}\", headers: {{ etag: '\"v1\"' }} }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /small }}
    static: {{ body: \"tiny\" }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /encoded }}
    static: {{ body: \"{text}\", headers: {{ content-encoding: br }} }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /no-transform }}
    static: {{ body: \"{text}\", headers: {{ cache-control: no-transform }} }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /ranged }}
    static: {{ status: 206, body: \"{text}\", headers: {{ content-range: bytes 0-1999/9000 }} }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /image }}
    static: {{ body: \"{text}\", headers: {{ content-type: image/png }} }}
    filters: [ {{ compress: {{}} }} ]
clusters:
  app:
    endpoints: [ {{ address: \"{upstream}\" }} ]
"
        ),
    )
}

#[test]
fn compress_gzips_proxied_static_and_handler_responses() {
    let echo = Echo::start("app");
    let p = Portico::start(&compress_config(echo.addr));
    let pad = "p".repeat(3000);
    for proto in BOTH {
        // Proxied from an HTTP/1 upstream (its body has a Content-Length): compressed, streamed without length.
        let accept = ("accept-encoding", "br;q=0.5, gzip;q=1");
        let r = request(p.addr, proto, "GET", "t", "/api/x", &[accept, ("x-pad", &pad)], b"");
        assert_eq!(r.status, 200, "{proto:?}");
        assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?}: {r:?}");
        assert_eq!(r.tokens("vary"), vec!["accept-encoding"], "{proto:?}");
        assert_eq!(r.header("content-length"), None, "{proto:?}: the length changed");
        if proto == Proto::H1 {
            assert_eq!(r.header("transfer-encoding").as_deref(), Some("chunked"), "{proto:?}");
        }
        assert_eq!(r.header("x-backend").as_deref(), Some("app"), "{proto:?}: the upstream's headers are kept");
        assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?}: response filters still run");
        let plain = String::from_utf8(gunzip(&r.body)).unwrap();
        assert!(plain.starts_with("GET /api/x\n"), "{proto:?}: {plain}");
        assert!(plain.contains(&format!("x-pad: {pad}\n")), "{proto:?}");
        assert!(r.body.len() < plain.len() / 4, "{proto:?}: {} -> {}", plain.len(), r.body.len());
        // Without a coding it offers among the accepted ones: as it was, with its length, still varying.
        for accept in [None, Some("gzip;q=0, br;q=0, zstd;q=0, *"), Some("deflate")] {
            let mut headers = vec![("x-pad", pad.as_str())];
            headers.extend(accept.map(|a| ("accept-encoding", a)));
            let r = request(p.addr, proto, "GET", "t", "/api/x", &headers, b"");
            assert_eq!(r.header("content-encoding"), None, "{proto:?} {accept:?}");
            assert_eq!(r.tokens("vary"), vec!["accept-encoding"], "{proto:?} {accept:?}");
            assert_eq!(r.header("content-length"), Some(r.body.len().to_string()), "{proto:?} {accept:?}");
            assert!(r.text().contains(&pad), "{proto:?}");
        }

        // Static: compressed, its strong ETag made weak.
        let r = request(p.addr, proto, "GET", "t", "/big", &[("accept-encoding", "gzip")], b"");
        assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?}: {r:?}");
        assert_eq!(r.header("etag").as_deref(), Some("W/\"v1\""), "{proto:?}");
        assert_eq!(gunzip(&r.body), "a".repeat(2000).as_bytes(), "{proto:?}");
        // HEAD: no body to compress.
        let r = request(p.addr, proto, "HEAD", "t", "/big", &[("accept-encoding", "gzip")], b"");
        assert!(r.body.is_empty(), "{proto:?}");
        assert_eq!(r.header("content-length").as_deref(), Some("2000"), "{proto:?}");

        // Skipped: small, already encoded, no-transform, ranged, another type.
        for (path, varies) in
            [("/small", true), ("/encoded", false), ("/no-transform", false), ("/ranged", false), ("/image", false)]
        {
            let r = request(p.addr, proto, "GET", "t", path, &[("accept-encoding", "gzip")], b"");
            assert!(r.status == 200 || r.status == 206, "{proto:?} {path}: {r:?}");
            assert_ne!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?} {path}: compressed");
            assert_eq!(r.header("content-length"), Some(r.body.len().to_string()), "{proto:?} {path}");
            let vary = r.tokens("vary").contains(&"accept-encoding".to_string());
            assert_eq!(vary, varies, "{proto:?} {path}: vary {:?}", r.all("vary"));
        }
    }
}

#[test]
fn compress_streams_a_handler_body_over_both_protocols() {
    let echo = Echo::start("app");
    let p = Portico::start(&compress_config(echo.addr));
    let data = payload(2 * 1024 * 1024);
    for proto in BOTH {
        let r = request(p.addr, proto, "POST", "t", "/echo/up", &[("accept-encoding", "gzip")], &data);
        assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?}: {:?}", r.headers);
        let plain = gunzip(&r.body);
        let split = plain.windows(2).position(|w| w == b"\n\n").unwrap();
        assert!(plain[split + 2..] == data[..], "{proto:?}: the body differs after decompression");
        assert!(r.body.len() < plain.len(), "{proto:?}");
    }
    // Keep-alive after compressed (chunked) answers.
    let mut conn = Conn::open(p.addr);
    let pad = "q".repeat(2000);
    for i in 0..3 {
        let r = conn.get(&format!("/echo/{i}"), &format!("Accept-Encoding: gzip\r\nX-Pad: {pad}\r\n"));
        assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"));
        let plain = String::from_utf8(gunzip(&r.body)).unwrap();
        assert!(plain.contains(&format!("\nGET /echo/{i} HTTP/1.1\n")), "{plain}");
    }
}

#[test]
fn compress_gzips_an_h2_clusters_response_to_both_protocols() {
    let backend = portico_testkit::Backend::start_h2("h2app").unwrap();
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: / }}
    cluster: app
    filters:
      - headers: {{ response: {{ set: {{ content-type: text/plain }} }} }}
      - compress: {{}}
clusters:
  app:
    protocol: h2
    endpoints: [ {{ address: \"{}\" }} ]
",
            backend.addr
        ),
    );
    let p = Portico::start(&yaml);
    let r = request(p.addr, Proto::H2, "GET", "t", "/bytes/50000", &[("accept-encoding", "gzip")], b"");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{r:?}");
    assert_eq!(r.tokens("vary"), vec!["accept-encoding"]);
    assert_eq!(r.header("content-length"), None);
    let expected: Vec<u8> = portico_testkit::PATTERN.iter().copied().cycle().take(50000).collect();
    assert!(gunzip(&r.body) == expected, "the body differs after decompression");
    let r = request(p.addr, Proto::H2, "GET", "t", "/bytes/50000", &[], b"");
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("content-length").as_deref(), Some("50000"));
    assert!(r.body == expected);
    // HTTP/1.1 clients of the same h2 cluster: compressed too, chunked, and the connection stays usable.
    let r = request(p.addr, Proto::H1, "GET", "t", "/bytes/50000", &[("accept-encoding", "gzip")], b"");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{r:?}");
    assert_eq!(r.header("content-length"), None);
    assert!(gunzip(&r.body) == expected, "the body differs after decompression");
    let r = request(p.addr, Proto::H1, "GET", "t", "/bytes/50000", &[], b"");
    assert_eq!((r.header("content-encoding"), r.header("content-length").as_deref()), (None, Some("50000")));
    assert!(r.body == expected);
}
