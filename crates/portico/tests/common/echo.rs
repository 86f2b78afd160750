//! An upstream that echoes the exact request line and headers it received, for any path, and one request
//! function for HTTP/1.1 and cleartext HTTP/2 (prior knowledge): the end-to-end tests of routing and filters.

use super::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An HTTP/1.1 upstream on blocking sockets answering every request with `200` and a text body: the request
/// line (`METHOD TARGET`) then one `name: value` line per header as received. The response carries
/// `x-backend: NAME`, `server: echo-server`, and one header for each request header `x-echo-response: name: value`.
pub struct Echo {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
}

impl Echo {
    pub fn start(name: &str) -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, name) = (requests.clone(), stop.clone(), name.to_string());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (r, name) = (r.clone(), name.clone());
                        std::thread::spawn(move || echo_connection(stream, &name, &r));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Echo { addr, requests, stop }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

pub fn echo_connection(mut stream: TcpStream, name: &str, requests: &AtomicUsize) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16384];
    let mut fill = |stream: &mut TcpStream, buf: &mut Vec<u8>| -> bool {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    };
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if !fill(&mut stream, &mut buf) {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        requests.fetch_add(1, Ordering::SeqCst);
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or("").to_string();
        let mut parts = request_line.split(' ');
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let value = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        // The request body, read and dropped.
        if let Some(len) = value("content-length").and_then(|v| v.parse::<usize>().ok()) {
            while buf.len() < len {
                if !fill(&mut stream, &mut buf) {
                    return;
                }
            }
            buf.drain(..len);
        } else if value("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            loop {
                let line_end = loop {
                    if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    if !fill(&mut stream, &mut buf) {
                        return;
                    }
                };
                let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
                let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
                buf.drain(..line_end + 2);
                if size == 0 {
                    // Trailers until an empty line.
                    loop {
                        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                            let empty = i == 0;
                            buf.drain(..i + 2);
                            if empty {
                                break;
                            }
                        } else if !fill(&mut stream, &mut buf) {
                            return;
                        }
                    }
                    break;
                }
                while buf.len() < size + 2 {
                    if !fill(&mut stream, &mut buf) {
                        return;
                    }
                }
                buf.drain(..size + 2);
            }
        }
        let mut body = format!("{method} {target}\n");
        for (k, v) in &headers {
            body.push_str(&format!("{k}: {v}\n"));
        }
        let mut extra = String::new();
        for (k, v) in headers.iter().filter(|(k, _)| k == "x-echo-response") {
            let _ = k;
            extra.push_str(v);
            extra.push_str("\r\n");
        }
        let body = if method == "HEAD" { String::new() } else { body };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nx-backend: {name}\r\nserver: echo-server\r\n{extra}\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// What an `Echo` upstream received, parsed from its answer.
#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn parse(body: &str) -> Seen {
        let mut lines = body.lines();
        let first = lines.next().unwrap_or("");
        let (method, target) = first.split_once(' ').unwrap_or((first, ""));
        let headers = lines.filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Seen { method: method.to_string(), target: target.to_string(), headers }
    }
    pub fn all(&self, name: &str) -> Vec<String> {
        self.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone()).collect()
    }
    pub fn one(&self, name: &str) -> Option<String> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{name} received {} times: {all:?}", all.len());
        all.into_iter().next()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Proto {
    H1,
    H2,
}

pub const BOTH: [Proto; 2] = [Proto::H1, Proto::H2];

/// A response as the client saw it: header names in lower case, every value kept.
#[derive(Debug)]
pub struct Reply {
    pub proto: Proto,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn all(&self, name: &str) -> Vec<String> {
        self.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone()).collect()
    }
    /// The header's value; panics when it appears more than once.
    pub fn header(&self, name: &str) -> Option<String> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{:?}: {name} appears {} times: {all:?}", self.proto, all.len());
        all.into_iter().next()
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn seen(&self) -> Seen {
        assert_eq!(self.status, 200, "{:?}: not an upstream answer: {self:?}", self.proto);
        Seen::parse(&self.text())
    }
    /// Comma-separated tokens of every value of the header, lower-cased.
    pub fn tokens(&self, name: &str) -> Vec<String> {
        self.all(name)
            .iter()
            .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>())
            .filter(|t| !t.is_empty())
            .collect()
    }
}

/// One request over a new connection: HTTP/1.1 (`Host: authority`) or HTTP/2 with prior knowledge
/// (`:authority`), with `headers` and `body`.
pub fn request(
    addr: SocketAddr,
    proto: Proto,
    method: &str,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    match proto {
        Proto::H1 => {
            let mut conn = Conn::open(addr);
            let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n");
            for (k, v) in headers {
                raw.push_str(&format!("{k}: {v}\r\n"));
            }
            if !body.is_empty() || method == "POST" || method == "PUT" {
                raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            raw.push_str("\r\n");
            let mut bytes = raw.into_bytes();
            bytes.extend_from_slice(body);
            conn.send(&bytes);
            let r = conn.read_response(method == "HEAD");
            let headers = r
                .head
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            Reply { proto, status: r.status, headers, body: r.body }
        }
        Proto::H2 => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let mut sender = h2c(addr).await;
                let mut b = hyper::Request::builder()
                    .method(method)
                    .uri(format!("http://{authority}{path}"))
                    .version(hyper::Version::HTTP_2);
                for (k, v) in headers {
                    b = b.header(*k, *v);
                }
                let req = b.body(Full::new(Bytes::copy_from_slice(body))).expect("a valid request");
                let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
                    .await
                    .expect("HTTP/2 response within 10 s")
                    .expect("HTTP/2 response");
                let status = resp.status().as_u16();
                let headers = resp
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect();
                let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
                    .await
                    .expect("HTTP/2 body within 10 s")
                    .expect("HTTP/2 body")
                    .to_bytes()
                    .to_vec();
                Reply { proto, status, headers, body }
            })
        }
    }
}

pub fn get(addr: SocketAddr, proto: Proto, path: &str) -> Reply {
    request(addr, proto, "GET", "test.local", path, &[], b"")
}

/// A configuration with one listener (`LISTENER_EXTRA` lines under it) and the rest written after it.
pub fn config(listener_extra: &str, rest: &str) -> String {
    format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n{listener_extra}{rest}"
    )
}

/// `portico check -c FILE` on `yaml` written in a new directory: (success, stdout + stderr, the file's path).
pub fn check(yaml: &str) -> (bool, String, String) {
    let dir = temp_dir();
    let file = dir.join("portico.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&file).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text, file.display().to_string())
}

/// Asserts `portico check` refuses `yaml` and names `FILE:LINE:COL` with LINE in `lines` and the text
/// containing `needle` (case-insensitive); returns the output.
pub fn check_fails_at(yaml: &str, lines: std::ops::RangeInclusive<usize>, needle: &str) -> String {
    let (ok, text, file) = check(yaml);
    assert!(!ok, "portico check accepted:\n{yaml}\n---\n{text}");
    let prefix = format!("{file}:");
    let at = text.find(&prefix).unwrap_or_else(|| panic!("no {file}:LINE:COL in:\n{text}"));
    let rest = &text[at + prefix.len()..];
    let mut nums = rest.splitn(3, ':');
    let line: usize = nums.next().and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no LINE: {text}"));
    let col: usize = nums.next().and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no COL: {text}"));
    assert!(lines.contains(&line), "error at line {line} (expected {lines:?}) for:\n{yaml}\n---\n{text}");
    assert!(col >= 1, "{text}");
    assert!(text.to_ascii_lowercase().contains(&needle.to_ascii_lowercase()), "expected '{needle}' in:\n{text}");
    text
}
