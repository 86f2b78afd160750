//! The upstream side: connection pooling and reuse, stale pooled connections, failures answered with clean
//! 502/504s, cancellation, close-delimited bodies, routing, endpoint address forms.

mod common;
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[test]
fn keep_alive_upstream_connections_are_reused() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    let mut conn = Conn::open(p.addr);
    for _ in 0..300 {
        assert_eq!(conn.get("/", "").status, 200);
    }
    // Several client connections in turn share the pool too.
    for _ in 0..50 {
        assert_eq!(Conn::open(p.addr).get("/bytes/100", "").status, 200);
    }
    assert_eq!(b.requests(), 350);
    assert!(b.connections() <= 2, "opened {} upstream connections for 350 requests", b.connections());
}

#[test]
fn stale_pooled_connections_are_detected_or_retried() {
    // The upstream closes idle keep-alive connections after 100 ms without saying so.
    let raw = RawBackend::start(Behaviour::SilentClose { after: Duration::from_millis(100) }).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let mut conn = Conn::open(p.addr);
    for i in 0..20 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
        // Alternate: right after the close (detected in the pool) and racing it.
        std::thread::sleep(Duration::from_millis(if i % 2 == 0 { 150 } else { 99 }));
    }
    // POST with a small body is replayed too.
    for _ in 0..5 {
        conn.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody");
        assert_eq!(conn.read_response(false).status, 200);
        // Well after the upstream's close (a loaded machine can delay it past 120 ms): a POST is replayed only
        // when the pool saw the close, never after the upstream may have read it.
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn idempotent_requests_are_replayed_when_a_reused_connection_dies() {
    let raw = RawBackend::start(Behaviour::CloseOnSecondRequest).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let mut conn = Conn::open(p.addr);
    for i in 0..10 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "GET {i}: {}", r.text());
    }
    // A POST the upstream may have read is not replayed: it gets a clean 502 instead of running twice...
    conn.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi");
    let r = conn.read_response(false);
    assert_eq!(r.status, 502, "{}", r.text());
    // ...unless the client marks it idempotent.
    conn.get("/", "");
    conn.send(b"POST / HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k1\r\nContent-Length: 2\r\n\r\nhi");
    assert_eq!(conn.read_response(false).status, 200);
}

/// Portico in front of `raw` with a route that streams request bodies (`request_buffering: false`).
fn streaming_bodies(raw: &RawBackend) -> Portico {
    let yaml = simple_yaml("round_robin", &[raw.addr], "");
    Portico::start(&yaml.replace("    cluster: app\n", "    cluster: app\n    request_buffering: false\n"))
}

#[test]
fn a_streamed_body_is_never_replayed() {
    // Review finding: a streamed body marked "in hand" was replayed as a head without its body, letting the
    // next client's request become that body. A streamed PUT whose pooled connection dies must get a 502.
    let raw = RawBackend::start(Behaviour::CloseOnSecondRequest).unwrap();
    let p = streaming_bodies(&raw);
    let mut conn = Conn::open(p.addr);
    assert_eq!(conn.get("/warm", "").status, 200);
    let body = vec![b'x'; 70_000];
    conn.send(format!("PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    let _ = conn.stream.write_all(&body);
    let r = conn.read_response(false);
    assert_eq!(r.status, 502, "{}", r.text());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(raw.requests(), 2, "the PUT was sent again");
}

#[test]
fn an_early_answer_to_a_streamed_upload_is_forwarded_at_once() {
    let raw = RawBackend::start(Behaviour::AnswerWithoutReading(
        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large".to_vec(),
    ))
    .unwrap();
    let p = streaming_bodies(&raw);
    let stream = std::net::TcpStream::connect(p.addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let size = 64 << 20;
    // The body is sent from another thread: once Portico stops reading it, this write blocks or fails.
    std::thread::spawn(move || {
        let _ =
            writer.write_all(format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").as_bytes());
        let block = vec![b'u'; 64 * 1024];
        for _ in 0..size / block.len() {
            if writer.write_all(&block).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut conn = Conn::from_stream(stream);
    let r = conn.read_response(false);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.text(), "too large");
    assert!(started.elapsed() < Duration::from_secs(3), "the early answer took {:?}", started.elapsed());
    assert_eq!(r.header("connection").as_deref(), Some("close"), "the unread body leaves the connection unusable");
}

#[test]
fn transfer_codings_other_than_chunked_are_forwarded() {
    let raw = RawBackend::start(Behaviour::Fixed(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n4\r\nGZIP\r\n0\r\n\r\n".to_vec(),
    ))
    .unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.header("transfer-encoding").as_deref(), Some("gzip, chunked"));
    assert_eq!(r.body, b"GZIP");
    let (out, _) = raw_exchange(p.addr, b"GET / HTTP/1.0\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
}

#[test]
fn unreachable_upstream_gets_502_quickly_and_other_routes_keep_working() {
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let live = Backend::start("live").unwrap();
    let yaml = format!(
        "workers: 1\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ match: {{ path_prefix: /dead }}, cluster: dead }}\n  - {{ cluster: live }}\nclusters:\n  dead:\n    endpoints: [ {{ address: \"{dead}\" }} ]\n  live:\n    endpoints: [ {{ address: \"{}\" }} ]\n",
        live.addr
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    for i in 0..6 {
        let started = Instant::now();
        let r = conn.get("/dead/x", "");
        // Refused until outlier detection ejects the only endpoint (3 failures), then no healthy endpoint.
        if i < 3 {
            assert_eq!(r.status, 502, "request {i}: {}", r.head);
            assert!(r.text().contains("refused"), "{}", r.text());
        } else {
            assert_eq!(r.status, 503, "{}", r.head);
            assert!(r.text().contains("no healthy upstream endpoint"), "{}", r.text());
        }
        assert_eq!(r.header("content-type").as_deref(), Some("text/plain; charset=utf-8"));
        assert!(started.elapsed() < Duration::from_secs(2));
        // The 502 keeps the client connection usable.
        assert_eq!(conn.get("/", "").status, 200);
    }
}

#[test]
fn a_dead_endpoint_is_skipped_for_a_live_one() {
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let live = Backend::start("live").unwrap();
    let p = Portico::simple("round_robin", &[dead, live.addr], "");
    let mut conn = Conn::open(p.addr);
    for _ in 0..10 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "a request failed over a dead endpoint: {}", r.text());
    }
}

#[test]
fn slow_upstream_gets_504() {
    let b = Backend::start("slow").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    timeouts: { response_header: 300ms }\n");
    let started = Instant::now();
    let r = Conn::open(p.addr).get("/slow/3000", "");
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(r.text().contains("timed out"));
    assert!(started.elapsed() < Duration::from_secs(2));
    let silent = RawBackend::start(Behaviour::Hang).unwrap();
    let p = Portico::simple("round_robin", &[silent.addr], "    timeouts: { response_header: 300ms }\n");
    assert_eq!(Conn::open(p.addr).get("/", "").status, 504);
}

#[test]
fn connect_timeout_gets_504() {
    // A listener that never accepts, with its backlog already full: further SYNs are dropped, so a connect
    // attempt hangs until the proxy's connect timeout.
    let socket = socket_with_backlog_full();
    let addr = socket.0.local_addr().unwrap();
    let p = Portico::simple("round_robin", &[addr], "    timeouts: { connect: 300ms }\n");
    let started = Instant::now();
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.status, 504, "{} {}", r.head, r.text());
    assert!(r.text().contains("connect timed out"), "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn socket_with_backlog_full() -> (std::net::TcpListener, Vec<std::net::TcpStream>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // std listens with a large backlog; reset it to zero with a second listen().
    unsafe {
        use std::os::fd::AsRawFd;
        libc::listen(listener.as_raw_fd(), 0);
    }
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            fillers.push(s);
        }
    }
    (listener, fillers)
}

#[test]
fn client_going_away_cancels_the_upstream_request() {
    let raw = RawBackend::start(Behaviour::Hang).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let mut conn = Conn::open(p.addr);
    conn.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    let deadline = Instant::now() + Duration::from_secs(5);
    while raw.requests() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(conn);
    while raw.peer_closed() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(raw.peer_closed(), 1, "the upstream request was not cancelled");
}

#[test]
fn close_delimited_upstream_bodies_are_rechunked() {
    let raw = RawBackend::start(Behaviour::CloseDelimited("until the end".into())).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let mut conn = Conn::open(p.addr);
    for _ in 0..3 {
        let r = conn.get("/", "");
        assert_eq!(r.header("transfer-encoding").as_deref(), Some("chunked"));
        assert_eq!(r.text(), "until the end");
    }
    assert_eq!(raw.connections(), 3, "a close-delimited connection was pooled");
}

#[test]
fn invalid_upstream_responses_get_502() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"[..],
        b"NONSENSE\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        b"",
    ] {
        let raw = RawBackend::start(Behaviour::Fixed(bytes.to_vec())).unwrap();
        let p = Portico::simple("round_robin", &[raw.addr], "");
        let r = Conn::open(p.addr).get("/", "");
        assert_eq!(r.status, 502, "{:?}: {}", String::from_utf8_lossy(bytes), r.text());
    }
}

#[test]
fn truncated_upstream_body_closes_the_client_connection() {
    let raw = RawBackend::start(Behaviour::Fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this".to_vec()))
        .unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");
    let (out, closed) = raw_exchange(p.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("only this"), "{out}");
    assert!(closed, "an incomplete response must end with a close");
}

#[test]
fn routes_match_by_host_path_method_and_header() {
    let names = ["default", "api", "exact", "host", "wild", "post", "canary"];
    let bs: Vec<Backend> = names.iter().map(|n| Backend::start(n).unwrap()).collect();
    let cluster = |n: &str, b: &Backend| format!("  {n}:\n    endpoints: [ {{ address: \"{}\" }} ]\n", b.addr);
    let clusters: String = names.iter().zip(&bs).map(|(n, b)| cluster(n, b)).collect();
    let yaml = format!(
        "workers: 1
listeners:
  - {{ name: web, address: \"{{listen}}\" }}
routes:
  - {{ match: {{ path_prefix: / }}, cluster: default }}
  - {{ match: {{ path_prefix: /api }}, cluster: api }}
  - {{ match: {{ path_prefix: /api/v2/ }}, cluster: exact }}
  - {{ match: {{ path: /api/health }}, cluster: exact }}
  - {{ match: {{ host: shop.example.com }}, cluster: host }}
  - {{ match: {{ host: \"*.example.com\" }}, cluster: wild }}
  - {{ match: {{ path_prefix: /api, methods: [POST, put] }}, cluster: post }}
  - {{ match: {{ path_prefix: /api, headers: {{ x-canary: \"1\" }} }}, cluster: canary }}
clusters:
{clusters}"
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    let mut route = |req: &str| {
        conn.send(req.as_bytes());
        conn.read_response(false).header("x-backend").unwrap_or_default()
    };
    assert_eq!(route("GET /x HTTP/1.1\r\nHost: a\r\n\r\n"), "default");
    assert_eq!(route("GET /api/users HTTP/1.1\r\nHost: a\r\n\r\n"), "api");
    assert_eq!(route("GET /api/v2/users HTTP/1.1\r\nHost: a\r\n\r\n"), "exact");
    assert_eq!(route("GET /api/health HTTP/1.1\r\nHost: a\r\n\r\n"), "exact");
    assert_eq!(route("GET /api/health?full=1 HTTP/1.1\r\nHost: a\r\n\r\n"), "exact");
    assert_eq!(route("GET /api/healthz HTTP/1.1\r\nHost: a\r\n\r\n"), "api");
    assert_eq!(route("GET /api HTTP/1.1\r\nHost: SHOP.example.com:8080\r\n\r\n"), "host");
    assert_eq!(route("GET / HTTP/1.1\r\nHost: a.b.example.com\r\n\r\n"), "wild");
    assert_eq!(route("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"), "default");
    assert_eq!(route("POST /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"), "post");
    assert_eq!(route("PUT /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"), "post");
    assert_eq!(route("GET /api/x HTTP/1.1\r\nHost: a\r\nX-Canary: 1\r\n\r\n"), "canary");
    assert_eq!(route("GET /api/x HTTP/1.1\r\nHost: a\r\nX-Canary: 2\r\n\r\n"), "api");
    assert_eq!(route("GET http://shop.example.com/api HTTP/1.1\r\nHost: other\r\n\r\n"), "host");
}

#[test]
fn no_matching_route_gets_404_with_a_reason() {
    let b = Backend::start("b").unwrap();
    let yaml = format!(
        "listeners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ match: {{ path_prefix: /only }}, cluster: c }}\nclusters:\n  c:\n    endpoints: [ {{ address: \"{}\" }} ]\n",
        b.addr
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    let r = conn.get("/elsewhere", "");
    assert_eq!(r.status, 404);
    assert!(r.text().contains("no route"), "{}", r.text());
    assert_eq!(conn.get("/only/here", "").status, 200, "404 broke the keep-alive connection");
}

#[test]
fn ipv6_and_dns_endpoints() {
    let v6 = match Backend::start_on("[::1]:0".parse().unwrap(), "v6") {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipping the IPv6 part: no ::1 here ({e})");
            return;
        }
    };
    let v4 = Backend::start("v4").unwrap();
    let yaml = format!(
        "workers: 1\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ cluster: c }}\nclusters:\n  c:\n    endpoints:\n      - address: \"[::1]:{}\"\n      - address: \"localhost:{}\"\n",
        v6.addr.port(),
        v4.addr.port()
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    let mut seen: Vec<String> = (0..4).map(|_| backend_of(&mut conn, "/", "")).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn interim_responses_reach_http11_and_http2_clients_and_a_date_is_added() {
    // RFC 9110 15.2: a proxy forwards 1xx responses (here 103 Early Hints, less its hop-by-hop fields), but
    // not to an HTTP/1.0 client; RFC 9110 6.6.1: a response without a date gets one.
    let raw = RawBackend::start(Behaviour::Fixed(
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            .to_vec(),
    ))
    .unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "");

    let (out, _) = raw_exchange(p.addr, b"GET /hints HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let (interim, last) = out.split_once("\r\n\r\n").expect("two heads");
    assert!(interim.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{out}");
    assert!(interim.contains("\r\nLink: </s.css>; rel=preload") && !interim.contains("X-Hop"), "{out}");
    assert!(last.starts_with("HTTP/1.1 200 OK\r\n") && last.ends_with("\r\n\r\nok"), "{out}");
    let date = last.lines().find_map(|l| l.strip_prefix("date: ")).expect("a date");
    assert!(httpdate::parse_http_date(date).is_ok(), "{date}");

    let (out, _) = raw_exchange(p.addr, b"GET /hints HTTP/1.0\r\nHost: a\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && !out.contains("103"), "{out}");

    // Portico's own answers are dated too.
    let (out, _) = raw_exchange(p.addr, b"GET / HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400") && out.contains("\r\ndate: "), "{out}");

    let url = format!("http://{}/hints", p.addr);
    let curl = std::process::Command::new("curl")
        .args(["-sv", "--http2-prior-knowledge", "--max-time", "10", &url])
        .output()
        .unwrap();
    let verbose = String::from_utf8_lossy(&curl.stderr);
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "ok");
    assert!(verbose.contains("< HTTP/2 103") && verbose.contains("< link: </s.css>; rel=preload"), "{verbose}");
    assert!(!verbose.contains("x-hop") && verbose.contains("< HTTP/2 200"), "{verbose}");
}
