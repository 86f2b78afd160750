//! Request buffering and the minimum body rate: a slow request body holds no upstream
//! connection while it arrives, a large one goes through a temporary file and arrives whole, an oversized
//! one gets 413, and a client sending below the listener's minimum rate gets 408.

mod common;
use common::echo::{check, check_fails_at};
use common::*;
use portico_testkit::raw::{Behaviour, RawBackend};
use portico_testkit::Backend;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn proxy(backend: &Backend, listener_extra: &str, route_extra: &str) -> Portico {
    Portico::start(&format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n\
         {listener_extra}routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\n{route_extra}\
         clusters:\n  app:\n    endpoints:\n      - address: \"{}\"\n",
        backend.addr
    ))
}

/// Reads one response (head and a Content-Length body) from `s`; the status and the whole text.
fn response(s: &mut TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
            if out.len() >= end + 4 + len {
                break;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// 300 clients start chunked POSTs and send one byte a second for three seconds: returns the upstream
/// connections the backend had accepted meanwhile, and checks that every body then arrives whole.
fn trickle(p: &Portico, backend: &Backend) -> usize {
    const CLIENTS: usize = 300;
    let mut clients: Vec<TcpStream> = (0..CLIENTS)
        .map(|_| {
            let mut s = TcpStream::connect(p.addr).unwrap();
            s.write_all(b"POST /upload HTTP/1.1\r\nHost: slow\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
            s
        })
        .collect();
    for _ in 0..3 {
        for s in &mut clients {
            s.write_all(b"1\r\nx\r\n").unwrap();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let held = backend.connections();
    for s in &mut clients {
        s.write_all(b"0\r\n\r\n").unwrap();
    }
    let expected = format!("3 {}", portico_testkit::body_hash(b"xxx"));
    for s in &mut clients {
        let (status, text) = response(s);
        assert_eq!(status, 200, "{text}");
        assert!(text.ends_with(&expected), "{text}");
    }
    held
}

#[test]
fn slow_request_bodies_hold_no_upstream_connection_by_default() {
    let backend = Backend::start("app").unwrap();
    let p = proxy(&backend, "", "");
    assert_eq!(trickle(&p, &backend), 0, "buffered bodies held upstream connections while they arrived");
    // The same clients on a route that streams bodies hold one upstream connection each: what buffering saves.
    let streaming_backend = Backend::start("app").unwrap();
    let streaming = proxy(&streaming_backend, "", "    request_buffering: false\n");
    let held = trickle(&streaming, &streaming_backend);
    assert!(held >= 250, "a streamed body held no upstream connection ({held}): the test cannot tell");
}

/// Sends `body` in pieces of `piece` bytes every `every` (chunked), then the last chunk; the response.
fn upload(addr: SocketAddr, path: &str, body: &[u8], piece: usize, every: Duration) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(format!("POST {path} HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes()).unwrap();
    for part in body.chunks(piece) {
        let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
        chunk.extend_from_slice(part);
        chunk.extend_from_slice(b"\r\n");
        if s.write_all(&chunk).is_err() {
            return response(&mut s); // answered early (and closed)
        }
        if !every.is_zero() {
            std::thread::sleep(every);
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    response(&mut s)
}

fn random_body(len: usize) -> Vec<u8> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

/// Open files of `pid` that are unnamed temporary files in `dir` (O_TMPFILE shows as `DIR/#INODE (deleted)`).
fn temporary_files(pid: i32, dir: &std::path::Path) -> usize {
    let prefix = dir.join("#").display().to_string();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|target| target.display().to_string().starts_with(&prefix))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_large_body_goes_through_a_temporary_file_and_arrives_whole_with_its_length() {
    let backend = Backend::start("app").unwrap();
    let spool = temp_dir();
    let route = format!("    request_buffering: {{ memory: 16KiB, temp_dir: \"{}\" }}\n", spool.display());
    let p = proxy(&backend, "", &route);
    let body = random_body(3 << 20);

    // Part of the body sent: it is in a temporary file, and nothing has gone upstream yet.
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let (first, rest) = body.split_at(1 << 20);
    for part in first.chunks(64 * 1024) {
        s.write_all(format!("{:x}\r\n", part.len()).as_bytes()).unwrap();
        s.write_all(part).unwrap();
        s.write_all(b"\r\n").unwrap();
    }
    wait_until("the body spilled to a temporary file", Duration::from_secs(5), || {
        temporary_files(p.pid(), &spool) == 1
    });
    assert_eq!(backend.connections(), 0, "the body went upstream before it was whole");
    for part in rest.chunks(64 * 1024) {
        s.write_all(format!("{:x}\r\n", part.len()).as_bytes()).unwrap();
        s.write_all(part).unwrap();
        s.write_all(b"\r\n").unwrap();
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let (status, text) = response(&mut s);
    assert_eq!(status, 200, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text[text.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(json["body_len"], body.len() as u64, "{json}");
    assert_eq!(json["body_hash"], portico_testkit::body_hash(&body), "{json}");
    // Sent with its length, not the chunked framing it came with.
    let headers = json["headers"].to_string().to_ascii_lowercase();
    assert!(headers.contains(&format!("[\"content-length\",\"{}\"]", body.len())), "{headers}");
    assert!(!headers.contains("transfer-encoding"), "{headers}");
    // The file went with the request; nothing is left in the directory.
    wait_until("the temporary file closed", Duration::from_secs(5), || temporary_files(p.pid(), &spool) == 0);
    assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);

    // The keep-alive connection serves the next request, a body that stays in memory.
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: up\r\nContent-Length: 5\r\n\r\nhello").unwrap();
    let (status, text) = response(&mut s);
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with(&format!("5 {}", portico_testkit::body_hash(b"hello"))), "{text}");
    assert_eq!(p.metric("portico_request_bodies_buffered_total{listener=\"web\",to=\"file\"}"), 1.0);
    assert_eq!(p.metric("portico_request_bodies_buffered_total{listener=\"web\",to=\"memory\"}"), 1.0);
}

#[test]
fn a_buffered_body_is_sent_again_when_a_reused_connection_dies() {
    // The streamed twin of this test (tests/upstream.rs) gets a 502: a body already sent cannot be again.
    let raw = RawBackend::start(Behaviour::CloseOnSecondRequest).unwrap();
    let p = Portico::start(
        &simple_yaml("round_robin", &[raw.addr], "")
            .replace("    cluster: app\n", "    cluster: app\n    request_buffering: { memory: 16KiB }\n"),
    );
    let mut conn = Conn::open(p.addr);
    assert_eq!(conn.get("/warm", "").status, 200);
    // 70,000 bytes: above the memory, so from the temporary file, twice.
    let body = vec![b'x'; 70_000];
    conn.send(format!("PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    conn.send(&body);
    let r = conn.read_response(false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(raw.requests(), 3, "the PUT was not sent again on a new connection");
}

#[test]
fn a_body_over_max_size_gets_413_without_being_invited() {
    let backend = Backend::start("app").unwrap();
    let p = proxy(&backend, "", "    request_buffering: { max_size: 1KiB }\n");
    // A declared length over the limit: 413 at once, no `100 Continue`, the connection closed.
    let (text, closed) = raw_exchange(
        p.addr,
        b"POST /upload HTTP/1.1\r\nHost: up\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n",
    );
    assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
    assert!(!text.contains("100 Continue"), "{text}");
    assert!(text.contains("max_size"), "{text}");
    assert!(closed);
    // A chunked body that outgrows it.
    let (status, text) = upload(p.addr, "/upload", &random_body(4096), 512, Duration::ZERO);
    assert_eq!(status, 413, "{text}");
    // Within the limit: served.
    let (status, text) = upload(p.addr, "/upload", b"small enough", 4, Duration::ZERO);
    assert_eq!(status, 200, "{text}");
    assert_eq!(backend.requests(), 1);
}

#[test]
fn a_body_slower_than_min_body_rate_gets_408_buffered_or_streamed() {
    for route in ["", "    request_buffering: false\n"] {
        let backend = Backend::start("app").unwrap();
        let limits = "    limits: { min_body_rate: 1KiB }\n    timeouts: { body_rate_grace: 1s }\n";
        let p = proxy(&backend, limits, route);
        // 100 bytes every 200 ms: 500 bytes a second, half the minimum.
        let started = Instant::now();
        let (status, text) = upload(p.addr, "/upload", &random_body(20_000), 100, Duration::from_millis(200));
        assert_eq!(status, 408, "{route}: {text}");
        assert!(text.contains("min_body_rate"), "{text}");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(6), "{route}: the slow body was cut only after {took:?}");
        // 1 KiB every 100 ms is well above it: served.
        let (status, text) = upload(p.addr, "/upload", &random_body(20_000), 1024, Duration::from_millis(100));
        assert_eq!(status, 200, "{route}: {text}");
    }
}

#[test]
fn request_buffering_settings_are_checked() {
    let base = "workers: 1\nlisteners:\n  - name: web\n    address: 127.0.0.1:1\nroutes:\n  - match: { path_prefix: / }\n    cluster: app\n";
    let cluster = "clusters:\n  app:\n    endpoints:\n      - address: 127.0.0.1:2\n";
    check_fails_at(
        &format!("{base}    request_buffering: {{ memory: 2MiB, max_size: 1MiB }}\n{cluster}"),
        8..=8,
        "above max_size",
    );
    check_fails_at(
        &format!("{base}    request_buffering: {{ temp_dir: /nonexistent/portico-spool }}\n{cluster}"),
        8..=8,
        "/nonexistent/portico-spool",
    );
    check_fails_at(&format!("{base}    request_buffering: {{ memory: 1MiB, spill: yes }}\n{cluster}"), 8..=8, "spill");
    let (ok, text, _) = check(&format!("{base}    request_buffering: false\n{cluster}"));
    assert!(ok, "{text}");
}

#[test]
fn an_http2_body_without_a_length_is_buffered_and_sent_with_one() {
    let backend = Backend::start("app").unwrap();
    let p = proxy(&backend, "", "    request_buffering: { memory: 16KiB }\n");
    let body = random_body(300_000);
    // Uploaded from stdin: curl sends DATA frames with no content-length.
    let mut curl = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--http2-prior-knowledge", "-X", "POST", "-T", "-"])
        .arg(format!("http://{}/echo", p.addr))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl");
    curl.stdin.take().unwrap().write_all(&body).unwrap();
    let out = curl.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["body_len"], body.len() as u64, "{json}");
    assert_eq!(json["body_hash"], portico_testkit::body_hash(&body), "{json}");
    let headers = json["headers"].to_string().to_ascii_lowercase();
    assert!(headers.contains(&format!("[\"content-length\",\"{}\"]", body.len())), "{headers}");
    assert!(!headers.contains("transfer-encoding"), "{headers}");
}

#[test]
fn an_upstream_that_answers_before_a_buffered_body_is_sent_gets_no_second_request_on_that_connection() {
    // The upstream answers right after the head and reads nothing more: the rest of the body is never sent,
    // so the connection must not go back to the pool, where the next request would become that body. The body
    // is buffered in a temporary file (default memory), then in memory.
    for route in ["", "    request_buffering: { memory: 32MiB }\n"] {
        let raw = RawBackend::start(Behaviour::AnswerWithoutReading(
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large".to_vec(),
        ))
        .unwrap();
        let yaml = simple_yaml("round_robin", &[raw.addr], "");
        let p = Portico::start(&yaml.replace("    cluster: app\n", &format!("    cluster: app\n{route}")));
        let mut conn = Conn::open(p.addr);
        // Larger than the socket buffers between Portico and the upstream, so that part of it is left unsent.
        let body = vec![b'u'; 16 << 20];
        conn.send(format!("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
        conn.send(&body);
        let r = conn.read_response(false);
        assert_eq!(r.status, 413, "{route}: {}", r.text());
        // The client sent its whole body: its connection goes on, and its next request gets a new upstream one.
        let started = Instant::now();
        let r = conn.get("/next", "");
        assert_eq!(r.status, 413, "{route}: {}", r.text());
        assert!(started.elapsed() < Duration::from_secs(3), "{route}: the next request took {:?}", started.elapsed());
        assert_eq!(raw.connections(), 2, "{route}: the connection with an unsent body was used again");
    }
}
