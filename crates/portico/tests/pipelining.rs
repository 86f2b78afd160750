//! Upstream pipelining (`pool.pipeline_depth`): requests that one client pipelined share one upstream write,
//! each still gets its own response, a batch that loses its connection is retried without an error, and no
//! client ever receives a response meant for another, whatever the upstream sends.

mod common;
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
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

/// Pipelines `requests` (a path, and whether it is a HEAD) on `conn` in one write, then reads the responses in
/// order.
fn pipeline(conn: &mut Conn, requests: &[(String, bool)]) -> Vec<Resp> {
    let mut raw = String::new();
    for (path, head) in requests {
        let method = if *head { "HEAD" } else { "GET" };
        raw.push_str(&format!("{method} {path} HTTP/1.1\r\nHost: test.local\r\n\r\n"));
    }
    conn.send(raw.as_bytes());
    requests.iter().map(|(_, head)| conn.read_response(*head)).collect()
}

fn gets(paths: impl IntoIterator<Item = String>) -> Vec<(String, bool)> {
    paths.into_iter().map(|p| (p, false)).collect()
}

#[test]
fn pipelined_requests_each_get_their_own_response() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..4).map(|_| Conn::open(p.addr)).collect();
    let mut requests = 0;
    for round in 0..5 {
        for (c, conn) in conns.iter_mut().enumerate() {
            // Ten requests in one write, a HEAD among them (never batched: the requests behind it go in a batch
            // of their own).
            let sent: Vec<(String, bool)> =
                (0..10).map(|i| (format!("/echo/r{round}/c{c}/{i}?q={i}"), i == 4)).collect();
            for (resp, (path, head)) in pipeline(conn, &sent).into_iter().zip(&sent) {
                requests += 1;
                assert_eq!(resp.status, 200, "{path}: {}", resp.head);
                if *head {
                    assert!(resp.body.is_empty());
                    assert!(resp.header("content-length").is_some(), "{}", resp.head);
                } else {
                    let echo: serde_json::Value = serde_json::from_slice(&resp.body).expect("echo JSON");
                    assert_eq!(echo["target"], path.as_str(), "a response went to the wrong request");
                    assert_eq!(echo["method"], "GET");
                }
            }
        }
    }
    let (pipelined, writes) = (p.metric(PIPELINED), p.metric(WRITES));
    assert!(writes >= 1.0 && pipelined >= 2.0 * writes, "{pipelined} pipelined requests in {writes} writes");
    assert!(pipelined <= requests as f64, "{pipelined} pipelined of {requests}");
    assert_eq!(b.requests(), requests);
    // Batches share connections: far fewer than one per request.
    assert!(b.connections() <= 8, "{} upstream connections", b.connections());
}

#[test]
fn requests_of_different_clients_never_share_a_write() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..16).map(|_| Conn::open(p.addr)).collect();
    for round in 0..10 {
        for (resp, path, _) in burst(&mut conns, |i| (format!("/echo/r{round}/c{i}"), false)) {
            assert_eq!(resp.status, 200, "{path}");
        }
    }
    assert_eq!(p.metric(PIPELINED), 0.0);
    assert_eq!(p.metric(WRITES), 0.0);
}

#[test]
fn a_batch_whose_connection_closes_is_retried_on_fresh_connections() {
    // Answers one request per connection, then closes when the next arrives: every member of a batch after
    // the first loses its connection before its response.
    let raw = RawBackend::start(Behaviour::CloseOnSecondRequest).unwrap();
    let p = Portico::simple("round_robin", &[raw.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conn = Conn::open(p.addr);
    for round in 0..3 {
        let sent = gets((0..8).map(|i| format!("/r{round}/{i}")));
        for (resp, (path, _)) in pipeline(&mut conn, &sent).into_iter().zip(&sent) {
            assert_eq!(resp.status, 200, "round {round} {path}: {} {}", resp.head, resp.text());
        }
    }
    assert!(p.metric(WRITES) >= 1.0, "no batch was written");
    // The upstream received those requests: sending them again is counted as a retry.
    assert!(p.metric("portico_retries_total{cluster=\"app\"}") >= 1.0);
}

#[test]
fn without_pipeline_depth_requests_never_share_a_connection() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    let mut conn = Conn::open(p.addr);
    for round in 0..5 {
        let sent = gets((0..8).map(|i| format!("/echo/{round}/{i}")));
        for (resp, (path, _)) in pipeline(&mut conn, &sent).into_iter().zip(&sent) {
            assert_eq!(resp.status, 200, "{path}");
            let echo: serde_json::Value = serde_json::from_slice(&resp.body).expect("echo JSON");
            assert_eq!(echo["target"], path.as_str());
        }
    }
    assert_eq!(p.metric(PIPELINED), 0.0);
    assert_eq!(p.metric(WRITES), 0.0);
}

#[test]
fn a_slow_response_holds_up_only_its_own_client() {
    // Head-of-line blocking is the price of pipelining, and a client that pipelines has it anyway: its responses
    // come back in order. Other clients are never held up by its requests.
    let b = Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut slow = Conn::open(p.addr);
    slow.send(b"GET /slow/1500 HTTP/1.1\r\nHost: t\r\n\r\nGET /echo/behind HTTP/1.1\r\nHost: t\r\n\r\n");
    std::thread::sleep(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut fast = Conn::open(p.addr);
    for _ in 0..5 {
        assert_eq!(fast.get("/echo/fast", "").status, 200);
    }
    assert!(started.elapsed() < Duration::from_millis(1000), "fast requests took {:?}", started.elapsed());
    assert_eq!(slow.read_response(false).status, 200);
    let behind = slow.read_response(false);
    let echo: serde_json::Value = serde_json::from_slice(&behind.body).expect("echo JSON");
    assert_eq!(echo["target"], "/echo/behind");
}

/// An upstream written by hand that answers pipelined requests in order, each with its target as the body,
/// except `/nocontent` (a 204) and HEAD, which it answers wrongly with a body that looks like a response.
fn sloppy_upstream() -> SocketAddr {
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
    let p = Portico::simple("round_robin", &[sloppy_upstream()], "    pool: { pipeline_depth: 8 }\n");
    let mut conn = Conn::open(p.addr);
    for round in 0..5 {
        let sent: Vec<(String, bool)> = (0..8)
            .map(|i| match i {
                2 => (format!("/r{round}/c{i}"), true),
                4 => ("/nocontent".to_string(), false),
                _ => (format!("/r{round}/c{i}"), false),
            })
            .collect();
        for (resp, (path, head)) in pipeline(&mut conn, &sent).into_iter().zip(&sent) {
            if *head {
                assert_eq!(resp.status, 200);
            } else if path == "/nocontent" {
                assert_eq!(resp.status, 204);
            } else {
                assert_eq!(resp.status, 200, "round {round} {path}: {}", resp.head);
                assert_eq!(resp.text(), *path, "round {round}: a response went to the wrong request");
            }
        }
    }
    assert!(p.metric(WRITES) >= 1.0, "no batch was written");
}

/// The two responses of the bug report, written together as the answer to one request: the second was never
/// asked for.
const HELLO_AND_POISON: (&[u8], &[u8]) = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Poison: 1\r\n\r\nPOISONED!",
);

/// What a `PoisoningUpstream` did, for the assertions.
#[derive(Default)]
struct Poisoned {
    /// The targets answered `hello` (each connection's first request).
    hello_targets: Vec<String>,
    /// Unsolicited responses written.
    poisons_sent: usize,
    /// Requests that arrived on a connection after its unsolicited response was written.
    requests_after_poison: usize,
    connections: usize,
}

/// An upstream that answers the first request of each connection as in the bug report: `hello`, followed by an
/// unsolicited `POISONED!` response, in the same write or `poison_after` later. Every other request is answered
/// with its own target as the body, so a response that reached the wrong request shows.
struct PoisoningUpstream {
    addr: SocketAddr,
    state: Arc<Mutex<Poisoned>>,
}

impl PoisoningUpstream {
    fn start(poison_after: Option<Duration>) -> PoisoningUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(Poisoned::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(s) = stream else { return };
                shared.lock().unwrap().connections += 1;
                let shared = shared.clone();
                std::thread::spawn(move || serve_poisoning(s, poison_after, &shared));
            }
        });
        PoisoningUpstream { addr, state }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Poisoned> {
        self.state.lock().unwrap()
    }

    /// `resp`, the answer to a request for `path`, is that request's own response or a 502: never the
    /// unsolicited one, never another request's.
    fn check(&self, resp: &Resp, path: &str, when: &str) {
        let body = resp.text();
        assert!(
            !body.contains("POISONED") && resp.header("x-poison").is_none(),
            "{when}: {path} got the unsolicited response: {}{body}",
            resp.head
        );
        match resp.status {
            502 => {}
            200 if body == path => {}
            200 if body == "hello" => {
                let hello_targets = &self.state().hello_targets;
                assert!(
                    hello_targets.iter().any(|t| t == path),
                    "{when}: {path} got `hello`, the response to another request ({hello_targets:?})"
                );
            }
            _ => panic!("{when}: {path} got a response meant for another request: {}{body}", resp.head),
        }
    }
}

fn serve_poisoning(mut s: std::net::TcpStream, poison_after: Option<Duration>, state: &Mutex<Poisoned>) {
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 65536]);
    let mut first = true;
    let mut poisoned = false;
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            let line = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_string();
            let target = line.split(' ').nth(1).unwrap_or("/").to_string();
            if poisoned {
                state.lock().unwrap().requests_after_poison += 1;
            }
            let written = if std::mem::take(&mut first) {
                state.lock().unwrap().hello_targets.push(target);
                let (hello, poison) = HELLO_AND_POISON;
                let written = match poison_after {
                    None => s.write_all(&[hello, poison].concat()),
                    Some(pause) => s.write_all(hello).and_then(|()| {
                        std::thread::sleep(pause);
                        s.write_all(poison)
                    }),
                };
                poisoned = true;
                state.lock().unwrap().poisons_sent += 1;
                written
            } else {
                s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{target}", target.len()).as_bytes())
            };
            if written.is_err() {
                return;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn an_unsolicited_response_never_reaches_another_client() {
    // The bug report: three clients' GETs, each on its own connection, arrive together; the upstream answers the
    // first with `hello` and, in the same write, a second response nobody asked for. Batched onto one upstream
    // connection, the second client got `POISONED!` and the third the second's response.
    let up = PoisoningUpstream::start(None);
    let p = Portico::simple("round_robin", &[up.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut conns: Vec<Conn> = (0..3).map(|_| Conn::open(p.addr)).collect();
    for round in 0..20 {
        for (resp, path, _) in burst(&mut conns, |i| (format!("/client{i}/round{round}"), false)) {
            up.check(&resp, &path, &format!("round {round}"));
        }
    }
    // Nothing was written after an unsolicited response, and requests of different clients never shared a write.
    assert_eq!(up.state().requests_after_poison, 0);
    assert_eq!(p.metric(PIPELINED), 0.0);
}

#[test]
fn unsolicited_bytes_after_a_response_keep_the_connection_out_of_the_pool() {
    // Without pipelining: bytes beyond the end of a response, buffered with it or arriving while the connection
    // is idle, must never be read as the next request's response.
    for poison_after in [None, Some(Duration::from_millis(100))] {
        let up = PoisoningUpstream::start(poison_after);
        let p = Portico::simple("round_robin", &[up.addr], "");
        let mut conns: Vec<Conn> = (0..3).map(|_| Conn::open(p.addr)).collect();
        for round in 0..4 {
            for (i, c) in conns.iter_mut().enumerate() {
                let path = format!("/client{i}/round{round}");
                let resp = c.get(&path, "");
                let when = format!("{poison_after:?} round {round}");
                up.check(&resp, &path, &when);
                assert_eq!(resp.status, 200, "{when}: {}", resp.head);
                // Let the late unsolicited bytes arrive before the next request, which could otherwise take the
                // connection first (a race no HTTP/1.1 client can close); they must then keep it out of use.
                wait_until("the unsolicited response", Duration::from_secs(5), || {
                    let state = up.state();
                    state.poisons_sent == state.connections
                });
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let state = up.state();
        assert_eq!(state.requests_after_poison, 0, "{poison_after:?}: a connection was reused after unsolicited bytes");
        assert_eq!(state.connections, 12, "{poison_after:?}: one connection per request");
    }
}

#[test]
fn an_upstream_out_of_step_confuses_only_the_client_that_pipelined() {
    // The trust pipelining needs: responses are matched to requests by their order. An upstream that answers
    // out of step shifts the responses of the requests one client pipelined (a client that matches responses
    // by their order on its own connection too), and never reaches another client.
    let up = PoisoningUpstream::start(None);
    let p = Portico::simple("round_robin", &[up.addr], "    pool: { pipeline_depth: 8 }\n");
    let mut pipelining = Conn::open(p.addr);
    let mut others: Vec<Conn> = (0..2).map(|_| Conn::open(p.addr)).collect();
    let mut shifted = 0;
    for round in 0..10 {
        let sent = gets((0..3).map(|i| format!("/pipelining/r{round}/{i}")));
        let raw: String = sent.iter().map(|(path, _)| format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n")).collect();
        pipelining.send(raw.as_bytes());
        for (resp, path, _) in burst(&mut others, |i| (format!("/other{i}/r{round}"), false)) {
            up.check(&resp, &path, &format!("round {round}"));
        }
        for (path, _) in &sent {
            let resp = pipelining.read_response(false);
            let body = resp.text();
            let its_own = sent.iter().any(|(p, _)| *p == body)
                || (body == "hello" && up.state().hello_targets.iter().any(|t| sent.iter().any(|(p, _)| p == t)));
            assert!(
                resp.status == 502 || body == "POISONED!" || its_own,
                "round {round}: {path} got another client's response: {}{body}",
                resp.head
            );
            shifted += usize::from(resp.status == 200 && body != *path && body != "hello");
        }
    }
    assert!(
        p.metric(WRITES) >= 1.0 && shifted > 0,
        "the pipelined requests were never batched: the test proved nothing"
    );
}
