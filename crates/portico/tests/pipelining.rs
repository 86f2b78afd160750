//! Upstream pipelining (`pool.pipeline_depth`): requests that arrive together share one upstream write, every
//! client still gets its own response, and a batch that loses its connection is retried without an error.

mod common;
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::time::Duration;

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
fn burst_until_batched(p: &Portico, conns: &mut [Conn], mut check: impl FnMut(usize, Vec<(Resp, String, bool)>)) {
    for round in 0..40 {
        let responses = burst(conns, |i| (format!("/echo/r{round}/c{i}?q={i}"), i % 5 == 4));
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
    // Retries on a fresh connection after a lost pipelined one are not counted against the retry policy.
    assert_eq!(p.metric("portico_retries_total{cluster=\"app\"}"), 0.0);
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
