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

fn h2_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn streams_reset_by_the_client_are_counted_down() {
    // Review finding: a stream reset before its response head left the cluster's in-flight gauge up for good,
    // until the circuit breaker refused everything.
    let b = Backend::start_h2("h2-b0").unwrap();
    let p = Portico::start(&yaml(&b.addr.to_string(), "    circuit_breaker: { max_requests: 4 }\n"));
    h2_runtime().block_on(async {
        let sender = h2c(p.addr).await;
        for _ in 0..6 {
            let mut s = sender.clone();
            let req =
                hyper::Request::get("http://a/slow/2000").body(http_body_util::Full::new(bytes::Bytes::new())).unwrap();
            // Given up after 200 ms: the future is dropped and hyper resets the stream.
            let _ = tokio::time::timeout(Duration::from_millis(200), s.send_request(req)).await;
        }
    });
    wait_until("the in-flight gauge is back to 0", Duration::from_secs(5), || {
        p.metric("portico_cluster_requests_active{cluster=\"app\"}") == 0.0
    });
    for _ in 0..5 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
}

#[test]
fn odd_targets_are_encoded_not_blamed_on_the_upstream() {
    // Review finding: a target with `"` failed to become an HTTP/2 URI, and each such request counted as an
    // upstream failure until the endpoint was ejected.
    let b = Backend::start_h2("h2-b0").unwrap();
    let p = Portico::start(&yaml(&b.addr.to_string(), ""));
    let mut conn = Conn::open(p.addr);
    for _ in 0..5 {
        let r = conn.get("/echo?q=\"1\"&x=<a>", "");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("q=%221%22&x=%3Ca%3E"), "{}", r.text());
    }
    assert_eq!(conn.get("/", "").status, 200, "the endpoint is still in");
    let status = conn.get("/status/204", "");
    assert_eq!((status.status, status.header("content-length")), (204, None));
}

#[test]
fn uploads_to_http2_upstreams_get_continue_early_answers_and_their_own_timeout() {
    let b = Backend::start_h2("h2-b0").unwrap();
    let p = Portico::start(&yaml(&b.addr.to_string(), "    timeouts: { response_header: 1s }\n"));

    // Expect: 100-continue on a streamed body is answered before the body is sent.
    let mut conn = Conn::open(p.addr);
    conn.send(b"PUT /upload HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n");
    let interim = conn.read_response(true);
    assert_eq!(interim.status, 100);
    let body = vec![b'c'; 100_000];
    conn.stream.write_all(&body).unwrap();
    assert_eq!(conn.read_response(false).text(), format!("100000 {}", portico_testkit::body_hash(&body)));

    // An upload slower than response_header: the timeout starts once it is sent.
    conn.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..5 {
        conn.send(b"3e8\r\n");
        conn.send(&[b's'; 1000]);
        conn.send(b"\r\n");
        std::thread::sleep(Duration::from_millis(400));
    }
    conn.send(b"0\r\n\r\n");
    let r = conn.read_response(false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("5000 "), "{}", r.text());

    // An upstream that answers before the body is in: the client gets that answer, then a close.
    let mut early = Conn::open(p.addr);
    early.send(b"POST /status/413 HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n");
    let writer = {
        let mut s = early.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; 65536];
            for _ in 0..152 {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        })
    };
    let r = early.read_response(false);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    drop(early);
    let _ = writer.join();
}

#[test]
fn a_slow_http2_response_does_not_spin_the_worker() {
    // Review finding: a stream waiting longer than the keep-alive timeout for its response head made the
    // connection's idle timer fire in a loop.
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(
        &yaml(&b.addr.to_string(), "")
            .replace("    protocol: h2\n", "")
            .replace("    address: \"{listen}\"\n", "    address: \"{listen}\"\n    timeouts: { keepalive: 300ms }\n"),
    );
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
        let fields: Vec<u64> =
            stat.rsplit(')').next().unwrap().split_whitespace().skip(11).take(2).map(|f| f.parse().unwrap()).collect();
        fields[0] + fields[1]
    };
    let before = ticks();
    h2_runtime().block_on(async {
        let mut sender = h2c(p.addr).await;
        let req =
            hyper::Request::get("http://a/slow/2000").body(http_body_util::Full::new(bytes::Bytes::new())).unwrap();
        assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
    });
    let used = ticks() - before;
    assert!(used < 50, "{used} clock ticks of CPU for one slow request");
}

#[test]
fn a_burst_on_a_fresh_worker_opens_one_connection() {
    // Audit finding: every request that found no connection opened its own (160 for a 20 x 20 burst).
    let b = Backend::start_h2("h2-b0").unwrap();
    let p = Portico::start(&yaml(&b.addr.to_string(), ""));
    h2_runtime().block_on(async {
        let sender = h2c(p.addr).await;
        let mut burst = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let mut s = sender.clone();
            burst.spawn(async move {
                let req =
                    hyper::Request::get("http://a/").body(http_body_util::Full::new(bytes::Bytes::new())).unwrap();
                s.send_request(req).await.map(|r| r.status().as_u16())
            });
        }
        while let Some(done) = burst.join_next().await {
            assert_eq!(done.unwrap().unwrap(), 200);
        }
    });
    assert_eq!(b.connections(), 1, "one worker, one endpoint: one HTTP/2 connection");
}

/// How the hand-written upstream below treats the first stream on its first connection.
#[derive(Clone, Copy)]
enum Refusal {
    /// `GOAWAY` with last stream 0: the stream was not processed.
    GoAway,
    /// `RST_STREAM` with `REFUSED_STREAM`.
    Refused,
    /// `RST_STREAM` with `INTERNAL_ERROR`: the stream may have been processed.
    Internal,
}

/// A minimal HTTP/2 upstream on raw frames (prior knowledge): the first stream of its first connection gets
/// `refusal`; every other stream is answered `200` with body `ok`. Counts connections and streams.
struct RawH2 {
    addr: std::net::SocketAddr,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    streams: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

impl RawH2 {
    fn start(refusal: Refusal) -> RawH2 {
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let streams = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (c, s) = (connections.clone(), streams.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let first_connection = c.fetch_add(1, Ordering::SeqCst) == 0;
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut preface = [0u8; 24];
                    if conn.read_exact(&mut preface).is_err() {
                        return;
                    }
                    let _ = conn.write_all(&frame(4, 0, 0, &[]));
                    let mut first_stream = true;
                    loop {
                        let mut head = [0u8; 9];
                        if conn.read_exact(&mut head).is_err() {
                            return;
                        }
                        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
                        let (kind, flags) = (head[3], head[4]);
                        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                        let mut payload = vec![0u8; len];
                        if conn.read_exact(&mut payload).is_err() {
                            return;
                        }
                        match kind {
                            4 if flags & 1 == 0 => {
                                let _ = conn.write_all(&frame(4, 1, 0, &[]));
                            }
                            1 => {
                                s.fetch_add(1, Ordering::SeqCst);
                                if first_connection && first_stream {
                                    first_stream = false;
                                    match refusal {
                                        Refusal::GoAway => {
                                            let _ = conn.write_all(&frame(7, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]));
                                            // Close gently: unread bytes (the request's frames) at close
                                            // make the kernel send a reset, which can discard the GOAWAY
                                            // before Portico reads it (a flaky 502 on a loaded machine).
                                            let _ = conn.shutdown(std::net::Shutdown::Write);
                                            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                                            let mut sink = [0u8; 4096];
                                            while matches!(std::io::Read::read(&mut conn, &mut sink), Ok(n) if n > 0) {}
                                            return;
                                        }
                                        Refusal::Refused => {
                                            let _ = conn.write_all(&frame(3, 0, stream, &7u32.to_be_bytes()));
                                        }
                                        Refusal::Internal => {
                                            let _ = conn.write_all(&frame(3, 0, stream, &2u32.to_be_bytes()));
                                        }
                                    }
                                    continue;
                                }
                                // `:status: 200` is entry 8 of HPACK's static table.
                                let mut answer = frame(1, 4, stream, &[0x88]);
                                answer.extend(frame(0, 1, stream, b"ok"));
                                let _ = conn.write_all(&answer);
                            }
                            _ => {}
                        }
                    }
                });
            }
        });
        RawH2 { addr, connections, streams }
    }
}

#[test]
fn streams_the_upstream_did_not_process_are_sent_again() {
    use std::sync::atomic::Ordering;
    for refusal in [Refusal::GoAway, Refusal::Refused] {
        let up = RawH2::start(refusal);
        let p = Portico::start(&yaml(&up.addr.to_string(), ""));
        let r = Conn::open(p.addr).get("/", "");
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "the refused stream was sent again");
        assert_eq!(up.connections.load(Ordering::SeqCst), 2, "on a new connection");
        assert_eq!(up.streams.load(Ordering::SeqCst), 2);
        // A small body read whole before forwarding (an HTTP/2 client's, with its length) is in hand: sent
        // again too.
        let up = RawH2::start(refusal);
        let p = Portico::start(&yaml(&up.addr.to_string(), ""));
        let status = h2_runtime().block_on(async {
            let mut sender = h2c(p.addr).await;
            let req = hyper::Request::post("http://a/form")
                .header("content-length", "3")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(b"abc")))
                .unwrap();
            sender.send_request(req).await.unwrap().status()
        });
        assert_eq!(status, 200, "a body in hand is sent again");
        assert_eq!(up.streams.load(Ordering::SeqCst), 2);
        // A streamed body is not sent twice: it went with the first stream.
        let up = RawH2::start(refusal);
        let p = Portico::start(&yaml(&up.addr.to_string(), ""));
        let mut conn = Conn::open(p.addr);
        conn.send(b"POST /form HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(conn.read_response(false).status, 502);
        assert_eq!(up.streams.load(Ordering::SeqCst), 1);
    }
    // A reset that does not say "not processed" is not retried.
    let up = RawH2::start(Refusal::Internal);
    let p = Portico::start(&yaml(&up.addr.to_string(), ""));
    assert_eq!(Conn::open(p.addr).get("/", "").status, 502);
    assert_eq!(up.streams.load(Ordering::SeqCst), 1);
}

#[test]
fn a_stream_reset_before_its_answer_is_counted_and_leaves_the_cluster() {
    // Audit finding: an HTTP/2 client that reset its stream while Portico waited for an HTTP/1 upstream's answer
    // left the cluster's in-flight count one higher for good (the circuit breaker counts it) and was never
    // logged.
    for protocol in ["http1", "h2"] {
        let b = if protocol == "h2" { Backend::start_h2("b0") } else { Backend::start("b0") }.unwrap();
        let p = Portico::start(&format!(
            "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    protocol: {protocol}\n    endpoints:\n      - address: \"{}\"\n",
            b.addr
        ));
        h2_runtime().block_on(async {
            let mut sender = h2c(p.addr).await;
            let req =
                hyper::Request::get("http://a/slow/3000").body(http_body_util::Full::new(bytes::Bytes::new())).unwrap();
            // Dropping the response future resets the stream.
            let gave_up = tokio::time::timeout(Duration::from_millis(300), sender.send_request(req)).await;
            assert!(gave_up.is_err(), "{protocol}: answered before the reset");
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let client_errors = || {
            let text = p.admin_get("/metrics").text();
            text.lines()
                .filter(|l| l.starts_with("portico_requests_total{") && l.contains("status_class=\"4xx\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        wait_until("the reset request to be counted", Duration::from_secs(3), || client_errors() == 1.0);
        assert_eq!(p.metric("portico_cluster_requests_active{cluster=\"app\"}"), 0.0, "{protocol}");
    }
}
