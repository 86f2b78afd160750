//! Keeping service through failures: active health checks, outlier ejection and readmission, circuit
//! breaking, retries and their budget, hung upstreams, a backend killed under load.

mod common;
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn endpoint_field(p: &Portico, backend: &Backend, field: &str) -> serde_json::Value {
    let clusters = p.clusters();
    clusters["clusters"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["address"] == backend.addr.to_string())
        .map(|e| e[field].clone())
        .unwrap()
}

fn tally(p: &Portico, n: usize) -> HashMap<String, usize> {
    let mut conn = Conn::open(p.addr);
    let mut counts = HashMap::new();
    for _ in 0..n {
        let r = conn.get("/", "");
        *counts.entry(format!("{} {}", r.status, r.header("x-backend").unwrap_or_default())).or_insert(0) += 1;
    }
    counts
}

#[test]
fn active_health_checks_take_endpoints_out_and_back_with_thresholds() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let check =
        "    health_check: { path: /health, interval: 100ms, timeout: 500ms, healthy_after: 2, unhealthy_after: 3 }\n";
    let p = Portico::simple("round_robin", &[a.addr, b.addr], check);
    assert_eq!(endpoint_field(&p, &a, "healthy"), true);
    // One failed probe is below unhealthy_after: a stays in.
    a.set_health_status(503);
    std::thread::sleep(Duration::from_millis(120));
    a.set_health_status(0);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(endpoint_field(&p, &a, "healthy"), true, "a single failed probe took the endpoint out");
    // Failing for good: out after three probes, and no traffic.
    a.set_health_status(500);
    wait_until("a marked unhealthy", Duration::from_secs(3), || endpoint_field(&p, &a, "healthy") == false);
    let counts = tally(&p, 20);
    assert_eq!(counts.get("200 b"), Some(&20), "{counts:?}");
    assert_eq!(p.metric(&format!("portico_endpoint_healthy{{cluster=\"app\",endpoint=\"{}\"}}", a.addr)), 0.0);
    // Healthy again after two good probes.
    a.set_health_status(0);
    wait_until("a healthy again", Duration::from_secs(3), || endpoint_field(&p, &a, "healthy") == true);
    let counts = tally(&p, 20);
    assert_eq!(counts.get("200 a"), Some(&10), "{counts:?}");
}

#[test]
fn no_healthy_endpoint_gets_503_unless_panic_mode() {
    let a = Backend::start("a").unwrap();
    a.set_health_status(500);
    let check =
        "    health_check: { path: /health, interval: 100ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }\n";
    let p = Portico::simple("round_robin", &[a.addr], check);
    wait_until("a unhealthy", Duration::from_secs(3), || endpoint_field(&p, &a, "healthy") == false);
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("no healthy upstream endpoint"), "{}", r.text());
    let p = Portico::simple("round_robin", &[a.addr], &format!("{check}    panic_mode: true\n"));
    wait_until("a unhealthy", Duration::from_secs(3), || endpoint_field(&p, &a, "healthy") == false);
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200, "panic mode did not spread over unhealthy endpoints");
}

#[test]
fn a_backend_returning_500s_is_ejected_then_readmitted() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let od = "    outlier_detection: { consecutive_5xx: 3, base_ejection: 1s, max_ejection: 10s }\n";
    let p = Portico::simple("round_robin", &[a.addr, b.addr], od);
    a.set_status(500);
    let counts = tally(&p, 30);
    // Three 500s from a (one every other request), then only b.
    assert_eq!(counts.get("500 a"), Some(&3), "{counts:?}");
    assert_eq!(counts.get("200 b"), Some(&27), "{counts:?}");
    assert_eq!(endpoint_field(&p, &a, "ejected"), true);
    assert_eq!(p.metric("portico_ejections_total{cluster=\"app\"}"), 1.0);
    a.set_status(0);
    std::thread::sleep(Duration::from_millis(1200));
    let counts = tally(&p, 10);
    assert_eq!(counts.get("200 a"), Some(&5), "not readmitted after the ejection time: {counts:?}");
}

#[test]
fn ejection_never_takes_more_than_the_allowed_share() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let od = "    outlier_detection: { consecutive_5xx: 2, base_ejection: 10s, max_ejected_percent: 50 }\n";
    let p = Portico::simple("round_robin", &[a.addr, b.addr], od);
    a.set_status(502);
    b.set_status(502);
    let counts = tally(&p, 20);
    let ejected: usize = [&a, &b].iter().filter(|x| endpoint_field(&p, x, "ejected") == true).count();
    assert_eq!(ejected, 1, "{counts:?}");
}

#[test]
fn retries_on_status_go_to_another_endpoint_within_the_budget() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    a.set_status(503);
    let retry =
        "    retries: { attempts: 1, on_status: [503], backoff: 1ms }\n    outlier_detection: { consecutive_5xx: 0 }\n";
    let p = Portico::simple("round_robin", &[a.addr, b.addr], retry);
    let counts = tally(&p, 10);
    assert_eq!(counts.get("200 b"), Some(&10), "{counts:?}");
    // The rotation continues from the retry, so every request tries a first.
    assert_eq!(p.metric("portico_retries_total{cluster=\"app\"}"), 10.0);
    // POST is not idempotent: its 503 is passed through, not retried.
    let mut conn = Conn::open(p.addr);
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            conn.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
            conn.read_response(false).status
        })
        .collect();
    assert!(statuses.contains(&503), "{statuses:?}");
    // A zero budget allows no retry at all.
    let none = "    retries: { attempts: 1, on_status: [503], budget_percent: 0, min_retry_concurrency: 0 }\n    outlier_detection: { consecutive_5xx: 0 }\n";
    let p = Portico::simple("round_robin", &[a.addr, b.addr], none);
    let counts = tally(&p, 10);
    assert_eq!(counts.get("503 a"), Some(&5), "{counts:?}");
    assert_eq!(p.metric("portico_retry_budget_exhausted_total{cluster=\"app\"}"), 5.0);
    assert_eq!(p.metric("portico_retries_total{cluster=\"app\"}"), 0.0);
}

#[test]
fn with_no_endpoint_left_to_retry_the_real_answer_is_passed_on() {
    // Review finding: a retry on status with every endpoint tried replaced the upstream's 503 with a 502.
    let a = Backend::start("a").unwrap();
    a.set_status(503);
    let retry = "    retries: { attempts: 2, on_status: [503] }\n    outlier_detection: { consecutive_5xx: 0 }\n";
    let p = Portico::simple("round_robin", &[a.addr], retry);
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("forced 503 from a"), "{}", r.text());
    assert_eq!(p.metric("portico_retries_total{cluster=\"app\"}"), 0.0);
}

#[test]
fn circuit_breaker_limits_must_be_positive() {
    let path = temp_dir().join("cb.yaml");
    std::fs::write(
        &path,
        "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nclusters:\n  app:\n    circuit_breaker: { max_pending: 0 }\n    endpoints: [ { address: 127.0.0.1:2 } ]\n",
    )
    .unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be at least 1"));
}

#[test]
fn circuit_breaker_rejects_excess_quickly() {
    let a = Backend::start("a").unwrap();
    let p = Portico::simple("round_robin", &[a.addr], "    circuit_breaker: { max_requests: 2 }\n");
    let mut slow: Vec<Conn> = (0..2).map(|_| Conn::open(p.addr)).collect();
    for c in slow.iter_mut() {
        c.send(b"GET /slow/1000 HTTP/1.1\r\nHost: a\r\n\r\n");
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = Conn::open(p.addr).get("/", "");
    assert_eq!(r.status, 503, "{}", r.head);
    assert!(r.text().contains("circuit breaker"), "{}", r.text());
    assert!(started.elapsed() < Duration::from_millis(300));
    for c in slow.iter_mut() {
        assert_eq!(c.read_response(false).status, 200);
    }
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200, "the breaker did not close again");
    assert_eq!(p.metric("portico_breaker_rejections_total{cluster=\"app\"}"), 1.0);
}

#[test]
fn a_hung_upstream_times_out_without_stalling_other_routes() {
    let hung = RawBackend::start(Behaviour::Hang).unwrap();
    let fast = Backend::start("fast").unwrap();
    let yaml = format!(
        "workers: 1\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ match: {{ path_prefix: /hung }}, cluster: hung }}\n  - {{ cluster: fast }}\nclusters:\n  hung:\n    endpoints: [ {{ address: \"{}\" }} ]\n    timeouts: {{ response_header: 1500ms }}\n  fast:\n    endpoints: [ {{ address: \"{}\" }} ]\n",
        hung.addr, fast.addr
    );
    let p = Portico::start(&yaml);
    let mut hanging: Vec<Conn> = (0..20).map(|_| Conn::open(p.addr)).collect();
    for c in hanging.iter_mut() {
        c.send(b"GET /hung HTTP/1.1\r\nHost: a\r\n\r\n");
    }
    let mut conn = Conn::open(p.addr);
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(conn.get("/", "").status, 200);
        assert!(started.elapsed() < Duration::from_millis(250), "a fast route stalled behind hung requests");
    }
    for c in hanging.iter_mut() {
        assert_eq!(c.read_response(false).status, 504);
    }
}

#[test]
fn a_backend_killed_under_load_costs_no_idempotent_request() {
    let mut backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}")).unwrap()).collect();
    let addrs: Vec<_> = backends.iter().map(|b| b.addr).collect();
    // The retry budget is not what this test is about: at its default (3 retries in flight per worker) the
    // moment the backend dies can legitimately refuse a fourth simultaneous retry (seen once on CI in 13,687
    // requests). A budget that cannot bind leaves failover itself under test.
    let budget = "    retries: { min_retry_concurrency: 64 }\n";
    let p = Portico::start(&simple_yaml("round_robin", &addrs, budget).replace("workers: 1", "workers: 2"));
    let load = Load::start(p.addr, 8);
    std::thread::sleep(Duration::from_millis(700));
    backends.remove(1).stop();
    std::thread::sleep(Duration::from_millis(1000));
    let (ok, failed) = load.finish();
    assert!(ok > 500, "only {ok} requests completed");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(backends.iter().all(|b| b.requests() > 0), "the surviving backends served nothing");
}

#[test]
fn a_panic_costs_one_request_not_the_worker() {
    let b = portico_testkit::Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    // One worker keeps a connection open across the panic of another request on the same worker.
    let mut bystander = Conn::open(p.addr);
    assert_eq!(bystander.get("/", "").status, 200);
    let mut victim = Conn::open(p.addr);
    let r = victim.get("/__panic", "");
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(victim.is_closed(), "the connection that panicked is closed");
    for _ in 0..20 {
        assert_eq!(bystander.get("/", "").status, 200, "the worker kept serving");
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
    assert_eq!(p.metric("portico_panics_total{listener=\"web\"}"), 1.0);
}

#[test]
fn a_panic_in_an_http2_stream_costs_that_stream_only() {
    use http_body_util::{BodyExt, Full};
    let b = portico_testkit::Backend::start("b0").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // One HTTP/2 connection (prior knowledge): the panicking stream is answered 500, the streams after it on
    // the same connection are served.
    let statuses = runtime.block_on(async {
        let mut sender = h2c(p.addr).await;
        let mut statuses = Vec::new();
        for path in ["/", "/__panic", "/", "/"] {
            let req =
                hyper::Request::get(format!("http://{}{path}", p.addr)).body(Full::new(bytes::Bytes::new())).unwrap();
            let resp = sender.send_request(req).await.unwrap();
            statuses.push(resp.status().as_u16());
            let _ = resp.into_body().collect().await.unwrap();
        }
        statuses
    });
    assert_eq!(statuses, [200, 500, 200, 200]);
    assert_eq!(p.metric("portico_panics_total{listener=\"web\"}"), 1.0);
}

#[test]
fn a_worker_whose_runtime_dies_is_started_again() {
    let b = portico_testkit::Backend::start("b0").unwrap();
    let p = Portico::start(&simple_yaml("round_robin", &[b.addr], "").replacen("workers: 1", "workers: 2", 1));
    // Connections spread over both workers by the kernel.
    let mut kept: Vec<Conn> = (0..20).map(|_| Conn::open(p.addr)).collect();
    for c in &mut kept {
        assert_eq!(c.get("/", "").status, 200);
    }
    let mut killer = Conn::open(p.addr);
    killer.send(b"GET /__kill_worker HTTP/1.1\r\nHost: a\r\n\r\n");
    wait_until("the death is counted", Duration::from_secs(5), || p.metric("portico_worker_restarts_total") == 1.0);
    // The other worker's connections never noticed.
    let mut survivors = 0;
    for c in &mut kept {
        let _ = std::io::Write::write_all(&mut c.stream, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        if std::io::Read::read(&mut c.stream, &mut [0u8; 1]).is_ok_and(|n| n > 0) {
            survivors += 1;
        }
    }
    assert!(survivors >= 1, "every kept connection was on the dead worker");
    // The restarted worker serves again: every new connection is answered, whichever worker the kernel picks.
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..40 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200, "new connection {i}");
    }
}

/// `n` requests for `path` at once, each on its own client connection; the responses' (status, body).
fn burst(addr: std::net::SocketAddr, n: usize, path: &str) -> Vec<(u16, String)> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (start, path) = (start.clone(), path.to_string());
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                start.wait();
                let r = conn.get(&path, "");
                (r.status, r.text())
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn a_burst_waits_for_upstream_connections_instead_of_being_shed() {
    // Reported: 5,000 simultaneous requests at default settings, 2,825 refused by the breaker, where nginx and
    // HAProxy served all. Connections being opened used to count against `max_pending`; now only requests
    // waiting at `max_connections` do. Scaled down here with a small max_pending.
    let a = Backend::start("a").unwrap();
    let p = Portico::simple("round_robin", &[a.addr], "    circuit_breaker: { max_pending: 5 }\n");
    let answers = burst(p.addr, 60, "/slow/100");
    let refused: Vec<_> = answers.iter().filter(|(status, _)| *status != 200).collect();
    assert!(refused.is_empty(), "{} of 60 refused: {:?}", refused.len(), refused.first());
}

#[test]
fn at_the_connection_limit_requests_wait_and_only_max_pending_of_them() {
    let a = Backend::start("a").unwrap();
    let p = Portico::simple(
        "round_robin",
        &[a.addr],
        "    circuit_breaker: { max_connections: 4, max_pending: 6 }\n    timeouts: { connect: 5s }\n",
    );
    let answers = burst(p.addr, 30, "/slow/400");
    let served = answers.iter().filter(|(status, _)| *status == 200).count();
    let shed: Vec<_> = answers.iter().filter(|(status, _)| *status == 503).collect();
    assert_eq!(served + shed.len(), 30, "{answers:?}");
    // 4 on connections, 6 waiting for them; the rest refused at once (more may be served if they arrive late).
    assert!(served >= 10 && !shed.is_empty(), "served {served}, shed {}", shed.len());
    assert!(shed.iter().all(|(_, body)| body.contains("too many requests waiting")), "{shed:?}");
    assert!(a.connections() <= 4, "the limit was exceeded: {} upstream connections", a.connections());

    // A request waits at most the connect timeout.
    let p = Portico::simple(
        "round_robin",
        &[a.addr],
        "    circuit_breaker: { max_connections: 1 }\n    timeouts: { connect: 300ms }\n",
    );
    let mut busy = Conn::open(p.addr);
    busy.send(b"GET /slow/1500 HTTP/1.1\r\nHost: a\r\n\r\n");
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let r = Conn::open(p.addr).get("/", "");
    let waited = started.elapsed();
    assert_eq!(r.status, 503, "{}", r.head);
    assert!(r.text().contains("upstream connection limit reached"), "{}", r.text());
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_millis(1200), "{waited:?}");
    assert_eq!(busy.read_response(false).status, 200);
    // Once it is back in the pool, a waiting request takes it.
    let mut second = Conn::open(p.addr);
    second.send(b"GET /slow/200 HTTP/1.1\r\nHost: a\r\n\r\n");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200, "a request waiting 150 ms for the connection");
    assert_eq!(second.read_response(false).status, 200);
}

#[test]
fn failed_connection_attempts_give_their_place_back() {
    // A refused connection took a place under max_connections while it was being opened: it must give it
    // back, or a cluster whose upstream was down once would stay at its limit.
    let refused = "127.0.0.1:1".parse().unwrap();
    let p = Portico::simple("round_robin", &[refused], "    circuit_breaker: { max_connections: 1 }\n");
    for _ in 0..3 {
        let r = Conn::open(p.addr).get("/", "");
        assert_eq!(r.status, 502, "{}", r.head);
        assert!(r.text().contains("refused"), "{}", r.text());
    }
}

#[test]
fn at_the_connection_limit_the_longest_idle_keep_alive_connection_makes_room() {
    // Reported: with the limit's worth of idle keep-alive connections open, new clients got no answer.
    let a = Backend::start("a").unwrap();
    let yaml = simple_yaml("round_robin", &[a.addr], "")
        .replace("    address: \"{listen}\"\n", "    address: \"{listen}\"\n    limits: { max_connections: 8 }\n");
    let p = Portico::start(&yaml);
    let mut idle: Vec<Conn> = (0..8).map(|_| Conn::open(p.addr)).collect();
    for c in idle.iter_mut() {
        assert_eq!(c.get("/", "").status, 200);
        std::thread::sleep(Duration::from_millis(20)); // so that the first is the longest idle
    }
    let mut newcomers = Vec::new();
    for round in 0..3 {
        let started = Instant::now();
        let mut conn = Conn::open(p.addr);
        let r = conn.get("/", "");
        newcomers.push(conn); // kept open: each newcomer needs a place of its own
        assert_eq!(r.status, 200, "new client {round}: {}", r.head);
        assert!(started.elapsed() < Duration::from_secs(2), "new client {round} waited {:?}", started.elapsed());
    }
    // The three longest idle were closed for them, in order; the others still serve.
    for (i, c) in idle.iter_mut().enumerate() {
        c.stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let mut byte = [0u8; 1];
        let answered = std::io::Read::read(&mut c.stream, &mut byte).is_ok_and(|n| n == 1);
        assert_eq!(answered, i >= 3, "connection {i}");
    }
    assert_eq!(p.metric("portico_connections_evicted_total{listener=\"web\"}"), 3.0);
}

#[test]
fn the_connection_limit_in_force_is_logged_at_start_and_derived_from_the_open_file_limit() {
    use std::io::BufRead;
    let dir = temp_dir();
    let file = dir.join("limits.yaml");
    let port = free_port();
    std::fs::write(
        &file,
        format!(
            "listeners:\n  - {{ name: web, address: \"127.0.0.1:{port}\" }}\n  - {{ name: capped, address: \"127.0.0.1:{}\", limits: {{ max_connections: 77 }} }}\nroutes: [ {{ static: {{ status: 200, body: ok }} }} ]\n",
            free_port()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(portico_bin())
        .args(["run", "-c", file.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || stderr.lines().map_while(Result::ok).try_for_each(|l| lines.send(l)));
    let (mut derived, mut capped) = (None, false);
    let deadline = Instant::now() + Duration::from_secs(15);
    while derived.is_none() || !capped {
        let Ok(line) = seen.recv_timeout(deadline.saturating_duration_since(Instant::now())) else { break };
        if line.contains("client connections (derived from the open-file limit") {
            derived = line.split("at most ").nth(1).and_then(|r| r.split(' ').next()?.parse::<usize>().ok());
        }
        capped |= line.contains("at most 77 client connections (limits.max_connections)");
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(capped, "the configured limit was not logged");
    let derived = derived.expect("the derived limit was not logged");
    assert!(derived >= 256, "{derived}");
}

#[test]
fn requests_that_give_up_waiting_for_a_connection_are_no_longer_counted_as_waiting() {
    // Review finding: a request dropped while it waited at max_connections (an HTTP/2 client's reset) stayed
    // counted in `pending` for good; enough of them and every request at the limit was refused at once.
    let a = Backend::start("a").unwrap();
    let p = Portico::simple(
        "round_robin",
        &[a.addr],
        "    circuit_breaker: { max_connections: 1, max_pending: 3 }\n    timeouts: { connect: 5s }\n",
    );
    let mut busy = Conn::open(p.addr);
    busy.send(b"GET /slow/1500 HTTP/1.1\r\nHost: a\r\n\r\n");
    std::thread::sleep(Duration::from_millis(100));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut sender = h2c(p.addr).await;
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let req = hyper::Request::get(format!("http://{}/", p.addr))
                    .body(http_body_util::Full::new(bytes::Bytes::new()));
                tokio::spawn(sender.send_request(req.unwrap()))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Dropped: hyper resets the streams.
        for w in waiting {
            w.abort();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    wait_until("no request counted as waiting", Duration::from_secs(2), || {
        p.metric("portico_cluster_requests_pending{cluster=\"app\"}") == 0.0
    });
    assert_eq!(busy.read_response(false).status, 200);
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
}

/// Context switches so far of every thread of process `pid`: how often its threads slept and were woken.
fn context_switches(pid: i32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let mut total = 0;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines().filter(|l| l.contains("ctxt_switches:")) {
            total += line.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

#[test]
fn an_idle_process_wakes_for_nothing_until_a_reload_adds_a_health_check() {
    let a = Backend::start("a").unwrap();
    a.set_health_status(500);
    let log = temp_dir().join("access.log");
    // No admin address (its dashboard samples every second), two workers, an access log.
    let yaml = |check: &str| {
        simple_yaml("round_robin", &[a.addr], check)
            .replace("admin: { address: \"{admin}\" }\n", "")
            .replace("workers: 1", &format!("workers: 2\naccess_log: {{ path: \"{}\" }}", log.display()))
    };
    let p = Portico::start(&yaml(""));
    // A request: a pooled upstream connection, an access-log line handed to the writer 200 ms later.
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    std::thread::sleep(Duration::from_millis(600));
    let before = context_switches(p.pid());
    std::thread::sleep(Duration::from_secs(2));
    let woke = context_switches(p.pid()) - before;
    // Before: a 100 ms health tick, a 200 ms supervision tick and 200 ms access-log flushes (over 60 in 2 s).
    assert!(woke <= 3, "an idle process woke up {woke} times in 2 s");
    // The health checker sleeps until a reload: one that adds a health check starts it.
    let check =
        "    health_check: { path: /health, interval: 100ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }\n";
    p.rewrite_config(&yaml(check));
    p.signal(libc::SIGHUP);
    wait_until("a taken out by its health check", Duration::from_secs(5), || {
        Conn::open(p.addr).get("/", "").status == 503
    });
}
