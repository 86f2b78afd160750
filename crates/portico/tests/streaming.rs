//! Bodies stream through with bounded memory: a 1 GiB download and a 1 GiB upload (Content-Length and chunked)
//! must not grow the proxy's resident memory by more than a few MiB.

mod common;
use common::*;
use portico_testkit::Backend;
use std::io::{Read, Write};
use std::time::Duration;

const GIB: u64 = 1 << 30;
/// Allowed growth of the peak resident set over the whole transfer.
const MAX_GROWTH_KIB: u64 = 8 * 1024;

fn warm_up(p: &Portico) {
    let mut conn = Conn::open(p.addr);
    for _ in 0..20 {
        assert_eq!(conn.get("/bytes/200000", "").status, 200);
    }
}

#[test]
fn one_gib_download_with_bounded_memory() {
    let b = Backend::start("b").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    warm_up(&p);
    let before = p.memory_kib("VmHWM");
    for path in [format!("/bytes/{GIB}"), format!("/bytes/{GIB}?chunked")] {
        let mut s = std::net::TcpStream::connect(p.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        let mut total = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("{path}: read failed after {total} bytes: {e}"),
            }
        }
        assert!(total > GIB, "{path}: got {total} bytes");
    }
    let growth = p.memory_kib("VmHWM").saturating_sub(before);
    eprintln!("peak RSS growth: {growth} KiB");
    assert!(growth < MAX_GROWTH_KIB, "peak RSS grew by {growth} KiB during two 1 GiB downloads");
}

#[test]
fn one_gib_upload_with_bounded_memory() {
    let b = Backend::start("b").unwrap();
    let p = Portico::simple("round_robin", &[b.addr], "");
    warm_up(&p);
    let before = p.memory_kib("VmHWM");
    let block: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    for chunked in [false, true] {
        let mut s = std::net::TcpStream::connect(p.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let framing = if chunked { "Transfer-Encoding: chunked".to_string() } else { format!("Content-Length: {GIB}") };
        s.write_all(format!("POST /upload HTTP/1.1\r\nHost: a\r\n{framing}\r\n\r\n").as_bytes()).unwrap();
        let mut sent = 0u64;
        while sent < GIB {
            if chunked {
                s.write_all(format!("{:x}\r\n", block.len()).as_bytes()).unwrap();
            }
            s.write_all(&block).unwrap();
            if chunked {
                s.write_all(b"\r\n").unwrap();
            }
            sent += block.len() as u64;
        }
        if chunked {
            s.write_all(b"0\r\n\r\n").unwrap();
        }
        let mut conn = Conn::from_stream(s);
        let r = conn.read_response(false);
        assert_eq!(r.status, 200);
        assert!(r.text().starts_with(&format!("{GIB} ")), "chunked={chunked}: {}", r.text());
    }
    let growth = p.memory_kib("VmHWM").saturating_sub(before);
    eprintln!("peak RSS growth: {growth} KiB");
    assert!(growth < MAX_GROWTH_KIB, "peak RSS grew by {growth} KiB during two 1 GiB uploads");
}
