//! Upstream pipelining (`pool.pipeline_depth`): requests that arrive together share one upstream write, every
//! client still gets its own response, and a batch that loses its connection is retried without an error.

mod common;
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

const PIPELINED: &str = "portico_upstream_pipelined_requests_total{cluster=\"app\"}";
const WRITES: &str = "portico_upstream_pipeline_writes_total{cluster=\"app\"}";

/// Sends one request on every connection before reading any response, so that they reach Portico together.
/// Returns each connection's response, in connection order.
fn burst(conns: &mut [Conn], request: impl Fn(usize) -> (String, bool)) -> Vec<(Resp, String, bool)> {
    let mut sent = Vec::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let (path, head) = request(i);
        let method = if head { "HEAD" } else { "GET" };
        c.send(format!("{method} {path} HTTP/1.1\r\nHost: test.local\r\n\r\n").as_bytes());
        sent.push((path, head));
    }
    conns.iter_mut().zip(sent).map(|(c, (path, head))| (c.read_response(head), path, head)).collect()
}

/// Bursts until Portico reports a batch of two or more requests in one write (or gives up after 40 bursts).
fn burst_until_batched(p: &Portico, conns: &mut [Conn], check: impl FnMut(usize, Vec<(Resp, String, bool)>)) {
    bursts_until_batched(p, conns, |round, i| (format!("/echo/r{round}/c{i}?q={i}"), i % 5 == 4), check)
}

/// Bursts of `request(round, connection)` (a path, and whether it is a HEAD) until a batch forms.
fn bursts_until_batched(
    p: &Portico,
    conns: &mut [Conn],
    request: impl Fn(usize, usize) -> (String, bool),
    mut check: impl FnMut(usize, Vec<(Resp, String, bool)>),
) {
    for round in 0..40 {
        let responses = burst(conns, |i| request(round, i));
        check(round, responses);
        if p.metric(PIPELINED) > p.metric(WRITES) && round >= 3 {
            return;
        }
    }
    panic!(
        "no two requests were ever written together: {} pipelined requests in {} writes",
        p.metric(PIPELINED),
        p.metric(WRITES)
    );
}

#[test]
fn pipelined_requests_each_get_their_own_response() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..16).map(|_| Conn::open(p.addr)).collect();
    let mut requests = 0;
    burst_until_batched(&p, &mut conns, |_, responses| {
        for (resp, path, head) in responses {
            requests += 1;
            assert_eq!(resp.status, 200, "{path}: {}", resp.head);
            if head {
                // A HEAD response has no body: a proxy that read one would take the next response's bytes.
                assert!(resp.body.is_empty());
                assert!(resp.header("content-length").is_some(), "{}", resp.head);
            } else {
                let echo: serde_json::Value = serde_json::from_slice(&resp.body).expect("echo JSON");
                assert_eq!(echo["target"], path.as_str(), "a response went to the wrong request");
                assert_eq!(echo["method"], "GET");
            }
        }
    });
    let pipelined = p.metric(PIPELINED);
    assert!(pipelined <= requests as f64, "{pipelined} pipelined of {requests}");
    // Batches share connections: far fewer than one per request in flight.
    assert!(b.connections() <= 16, "{} upstream connections", b.connections());
    assert_eq!(b.requests(), requests);
}

#[test]
fn a_batch_whose_connection_closes_is_retried_on_fresh_connections() {
    // Answers one request per connection, then closes when the next arrives: every member of a batch after
    // the first loses its connection before its response.
    let raw = RawBackend::start(Behaviour::CloseOnSecondRequest).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::open(p.addr)).collect();
    burst_until_batched(&p, &mut conns, |round, responses| {
        for (resp, path, _) in responses {
            assert_eq!(resp.status, 200, "round {round} {path}: {} {}", resp.head, resp.text());
        }
    });
    // The upstream received those requests: sending them again is counted as a retry.
    assert!(p.metric("portico_retries_total{cluster=\"app\"}") >= 1.0);
}

#[test]
fn without_pipeline_depth_requests_never_share_a_connection() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::open(p.addr)).collect();
    for round in 0..5 {
        for (resp, path, _) in burst(&mut conns, |i| (format!("/echo/{round}/{i}"), false)) {
            assert_eq!(resp.status, 200, "{path}");
        }
    }
    assert_eq!(p.metric(PIPELINED), 0.0);
    assert_eq!(p.metric(WRITES), 0.0);
}

#[test]
fn a_slow_response_holds_up_only_its_own_batch() {
    // Head-of-line blocking is the price of pipelining: a request behind a slow one waits for it. Requests
    // arriving later go out in a batch of their own and are not held up.
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut slow = Conn::open(p.addr);
    slow.send(b"GET /slow/1500 HTTP/1.1\r\nHost: t\r\n\r\n");
    std::thread::sleep(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut fast = Conn::open(p.addr);
    for _ in 0..5 {
        assert_eq!(fast.get("/echo/fast", "").status, 200);
    }
    assert!(started.elapsed() < Duration::from_millis(1000), "fast requests took {:?}", started.elapsed());
    assert_eq!(slow.read_response(false).status, 200);
}

/// An upstream written by hand that answers pipelined requests in order, each with its target as the body,
/// except `/nocontent` (a 204) and HEAD, which it answers wrongly with a body that looks like a response.
fn sloppy_upstream(stream_ms: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let (mut buf, mut chunk) = (Vec::new(), [0u8; 65536]);
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let line = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_string();
                        let mut parts = line.split(' ');
                        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
                        let injected = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n/INJECT/";
                        let out = if method == "HEAD" {
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{injected}", injected.len())
                        } else if target == "/nocontent" {
                            format!("HTTP/1.1 204 No Content\r\n\r\n{injected}")
                        } else if target == "/stream" {
                            // A chunk every `stream_ms` for 4 s: each read is quick, the response is not.
                            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
                            for _ in 0..(4000 / stream_ms) {
                                std::thread::sleep(Duration::from_millis(stream_ms));
                                if s.write_all(b"5\r\ntick\n\r\n").is_err() {
                                    return;
                                }
                            }
                            "0\r\n\r\n".to_string()
                        } else {
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{target}", target.len())
                        };
                        if s.write_all(out.as_bytes()).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_body_sent_with_a_bodiless_response_never_reaches_another_request() {
    // With the bytes after a HEAD or 204 response read as the next member's response, every request behind
    // them would get its neighbour's answer.
    let p = Portico::simple("round_robin", &[sloppy_upstream(200)], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::open(p.addr)).collect();
    let request = |round: usize, i: usize| match i {
        0 => (format!("/r{round}/c0"), true),
        3 => ("/nocontent".to_string(), false),
        _ => (format!("/r{round}/c{i}"), false),
    };
    bursts_until_batched(&p, &mut conns, request, |round, responses| {
        for (resp, path, head) in responses {
            if head {
                assert_eq!(resp.status, 200);
            } else if path == "/nocontent" {
                assert_eq!(resp.status, 204);
            } else {
                assert_eq!(resp.status, 200, "round {round} {path}: {}", resp.head);
                assert_eq!(resp.text(), path, "round {round}: a response went to the wrong request");
            }
        }
    });
}

#[test]
fn a_request_waits_behind_a_streamed_response_no_longer_than_response_header() {
    let p = Portico::simple(
        "round_robin",
        &[sloppy_upstream(200)],
        "    pool: { pipeline_depth: 8 }\n    timeouts: { response_header: 500ms, read: 1s }\n",
    );
    let mut batched = false;
    for round in 0..10 {
        let (mut streaming, mut behind) = (Conn::open(p.addr), Conn::open(p.addr));
        let writes = p.metric(WRITES);
        streaming.send(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
        behind.send(format!("GET /x{round} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let started = Instant::now();
        let resp = behind.read_response(false);
        let waited = started.elapsed();
        assert!(waited < Duration::from_millis(2000), "round {round}: waited {waited:?} ({})", resp.head);
        assert!(resp.status == 200 || resp.status == 504, "{}", resp.head);
        batched |= p.metric(WRITES) == writes + 1.0 && resp.status == 504;
        if batched {
            break;
        }
    }
    assert!(batched, "the two requests never shared a batch: the test proved nothing");
}
