//! Every balancer, checked from outside through real connections to real backends.

mod common;
use common::*;
use portico_testkit::Backend;
use std::collections::HashMap;
use std::net::SocketAddr;

fn backends(n: usize) -> Vec<Backend> {
    (0..n).map(|i| Backend::start(&format!("b{i}")).unwrap()).collect()
}

fn addrs(bs: &[Backend]) -> Vec<SocketAddr> {
    bs.iter().map(|b| b.addr).collect()
}

fn tally(p: &Portico, n: usize, extra: &str) -> HashMap<String, usize> {
    let mut conn = Conn::open(p.addr);
    let mut counts = HashMap::new();
    for _ in 0..n {
        *counts.entry(backend_of(&mut conn, "/", extra)).or_insert(0) += 1;
    }
    counts
}

#[test]
fn round_robin_rotates_exactly() {
    let bs = backends(3);
    let p = Portico::simple("round_robin", &addrs(&bs), "");
    let mut conn = Conn::open(p.addr);
    let seq: Vec<String> = (0..9).map(|_| backend_of(&mut conn, "/", "")).collect();
    for i in 3..9 {
        assert_eq!(seq[i], seq[i - 3], "rotation broken: {seq:?}");
    }
    assert_ne!(seq[0], seq[1]);
    assert_ne!(seq[1], seq[2]);
    assert_ne!(seq[0], seq[2]);
}

#[test]
fn round_robin_rotates_across_connections_and_workers() {
    let bs = backends(3);
    let yaml = simple_yaml("round_robin", &addrs(&bs), "").replace("workers: 1", "workers: 2");
    let p = Portico::start(&yaml);
    let mut counts = HashMap::new();
    for _ in 0..30 {
        let mut conn = Conn::open(p.addr); // a new connection each time lands on either worker
        *counts.entry(backend_of(&mut conn, "/", "")).or_insert(0) += 1;
    }
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![10, 10, 10], "{counts:?}");
}

#[test]
fn weighted_round_robin_honours_weights_exactly() {
    // The seeds' review found weighted round robin ignoring weights: check exact shares per cycle.
    let bs = backends(3);
    let eps: String = bs
        .iter()
        .zip([1, 3, 6])
        .map(|(b, w)| format!("      - {{ address: \"{}\", weight: {w} }}\n", b.addr))
        .collect();
    let yaml = format!(
        "workers: 1\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ cluster: app }}\nclusters:\n  app:\n    balancer: weighted_round_robin\n    endpoints:\n{eps}"
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    let seq: Vec<String> = (0..30).map(|_| backend_of(&mut conn, "/", "")).collect();
    for cycle in seq.chunks(10) {
        let count = |n: &str| cycle.iter().filter(|b| *b == n).count();
        assert_eq!((count("b0"), count("b1"), count("b2")), (1, 3, 6), "{cycle:?}");
    }
    // Smooth: the heavy endpoint never gets more than 2 in a row within a 1:3:6 cycle.
    assert!(!seq.windows(3).any(|w| w.iter().all(|b| b == "b2")), "bursty: {seq:?}");
}

#[test]
fn random_spreads_by_weight() {
    let bs = backends(2);
    let yaml = format!(
        "workers: 1\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ cluster: app }}\nclusters:\n  app:\n    balancer: random\n    endpoints:\n      - {{ address: \"{}\", weight: 1 }}\n      - {{ address: \"{}\", weight: 3 }}\n",
        bs[0].addr, bs[1].addr
    );
    let p = Portico::start(&yaml);
    let counts = tally(&p, 400, "");
    let b1 = counts.get("b1").copied().unwrap_or(0);
    // Expected 300 of 400; 5 standard deviations is about ±43.
    assert!((250..=350).contains(&b1), "{counts:?}");
}

#[test]
fn least_connections_avoids_busy_endpoint() {
    let bs = backends(2);
    let p = Portico::simple("least_connections", &addrs(&bs), "");
    // Occupy requests that stay in flight; each new one goes to the endpoint with fewer.
    let mut slow: Vec<Conn> = (0..4).map(|_| Conn::open(p.addr)).collect();
    for c in slow.iter_mut() {
        c.send(b"GET /slow/1500 HTTP/1.1\r\nHost: t\r\n\r\n");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Four slow requests: two on each endpoint (least connections alternates).
    let answers: Vec<String> = slow.iter_mut().map(|c| c.read_response(false).header("x-backend").unwrap()).collect();
    let b0 = answers.iter().filter(|b| *b == "b0").count();
    assert_eq!(b0, 2, "{answers:?}");
    // With one slow request pinned on b0 (odd count), the quick one goes to b1.
    let mut pin = Conn::open(p.addr);
    let mut first = Conn::open(p.addr);
    first.send(b"GET /slow/1500 HTTP/1.1\r\nHost: t\r\n\r\n");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let quick = backend_of(&mut pin, "/", "");
    let busy = first.read_response(false).header("x-backend").unwrap();
    assert_ne!(quick, busy, "least_connections sent a request to the busy endpoint");
}

#[test]
fn power_of_two_choices_uses_every_endpoint_and_avoids_busy() {
    let bs = backends(2);
    let p = Portico::simple("power_of_two_choices", &addrs(&bs), "");
    let counts = tally(&p, 100, "");
    assert_eq!(counts.len(), 2, "{counts:?}");
    // With two endpoints both are always the candidates: the busy one must lose.
    let mut busy = Conn::open(p.addr);
    busy.send(b"GET /slow/1000 HTTP/1.1\r\nHost: t\r\n\r\n");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut quick = Conn::open(p.addr);
    let q: Vec<String> = (0..5).map(|_| backend_of(&mut quick, "/", "")).collect();
    let b = busy.read_response(false).header("x-backend").unwrap();
    assert!(q.iter().all(|x| *x != b), "quick requests {q:?} went to the busy {b}");
}

fn hash_yaml(eps: &[SocketAddr]) -> String {
    simple_yaml("consistent_hash", eps, "    hash: { key: header, name: x-user }\n")
}

#[test]
fn consistent_hash_is_stable_and_moves_about_one_nth() {
    let bs = backends(4);
    let all = addrs(&bs);
    let keys: Vec<String> = (0..400).map(|i| format!("user-{i}")).collect();
    let place = |p: &Portico| -> Vec<String> {
        let mut conn = Conn::open(p.addr);
        keys.iter().map(|k| backend_of(&mut conn, "/", &format!("x-user: {k}\r\n"))).collect()
    };
    let before = {
        let p = Portico::start(&hash_yaml(&all));
        let first = place(&p);
        assert_eq!(first, place(&p), "same key, different endpoint");
        first
    };
    let per: HashMap<&String, usize> = before.iter().fold(HashMap::new(), |mut m, b| {
        *m.entry(b).or_insert(0) += 1;
        m
    });
    assert_eq!(per.len(), 4);
    assert!(per.values().all(|&n| (50..=150).contains(&n)), "uneven ring: {per:?}");
    // Remove b3: only its keys move.
    let after = place(&Portico::start(&hash_yaml(&all[..3])));
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let on_removed = before.iter().filter(|b| *b == "b3").count();
    assert_eq!(moved, on_removed, "keys of the remaining endpoints moved");
    assert!(moved < 400 / 4 + 50, "moved {moved} of 400");
    // Add it back plus a fifth: about 1/5 move.
    let b4 = Backend::start("b4").unwrap();
    let mut five = all.clone();
    five.push(b4.addr);
    let wider = place(&Portico::start(&hash_yaml(&five)));
    let moved = before.iter().zip(&wider).filter(|(a, b)| a != b).count();
    assert!(moved > 20 && moved < 400 / 5 + 50, "moved {moved} of 400 on adding a fifth endpoint");
    assert!(before.iter().zip(&wider).all(|(a, b)| a == b || b == "b4"), "a key moved between old endpoints");
}

#[test]
fn consistent_hash_on_path_cookie_and_client_ip() {
    let bs = backends(3);
    for (extra, header) in [
        ("    hash: { key: path }\n", ""),
        ("    hash: { key: cookie, name: session }\n", "Cookie: a=b; session=42\r\n"),
        ("    hash: { key: client_ip }\n", ""),
    ] {
        let p = Portico::simple("consistent_hash", &addrs(&bs), extra);
        let mut conn = Conn::open(p.addr);
        let first = backend_of(&mut conn, "/same/path", header);
        for _ in 0..10 {
            assert_eq!(backend_of(&mut Conn::open(p.addr), "/same/path", header), first, "{extra}");
        }
    }
}

#[test]
fn sticky_cookie_pins_and_fails_over() {
    // The seeds' review found sticky always picking endpoint 0: check each endpoint can be pinned.
    let mut bs = backends(3);
    let p = Portico::simple("sticky_cookie", &addrs(&bs), "");
    let mut cookies = HashMap::new();
    for _ in 0..3 {
        let r = Conn::open(p.addr).get("/", "");
        let cookie = r.header("set-cookie").expect("first response sets the cookie");
        assert!(cookie.starts_with("portico_sticky=") && cookie.contains("HttpOnly"), "{cookie}");
        cookies.insert(r.header("x-backend").unwrap(), cookie.split(';').next().unwrap().to_string());
    }
    assert_eq!(cookies.len(), 3, "new clients were not spread: {cookies:?}");
    for (backend, cookie) in &cookies {
        let mut conn = Conn::open(p.addr);
        for _ in 0..5 {
            let r = conn.get("/", &format!("Cookie: {cookie}\r\n"));
            assert_eq!(&r.header("x-backend").unwrap(), backend);
            assert!(r.header("set-cookie").is_none(), "cookie re-set while pinned");
        }
    }
    // Stop the pinned endpoint: the request goes elsewhere and gets a new cookie.
    let victim = bs.remove(1);
    let cookie = cookies[&victim.name].clone();
    victim.stop();
    let r = Conn::open(p.addr).get("/", &format!("Cookie: {cookie}\r\n"));
    assert_eq!(r.status, 200);
    assert_ne!(r.header("x-backend").unwrap(), "b1");
    let new_cookie = r.header("set-cookie").expect("failover re-pins");
    let r2 = Conn::open(p.addr).get("/", &format!("Cookie: {}\r\n", new_cookie.split(';').next().unwrap()));
    assert_eq!(r2.header("x-backend"), r.header("x-backend"));
}
