//! Misbehaving upstreams written on plain blocking sockets, for the failure cases a well-behaved server never
//! produces: close-delimited bodies, keep-alive connections closed without notice, silence.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Answers each request with `200` and this body, without Content-Length, then closes.
    CloseDelimited(String),
    /// Answers with Content-Length and keep-alive, then closes the connection after `after` without warning,
    /// like an upstream whose keep-alive timeout is shorter than the proxy's pool timeout.
    SilentClose { after: Duration },
    /// Reads the request and never answers. Counts connections the peer closed.
    Hang,
    /// Answers the first request of each connection (keep-alive); closes without answering when a second
    /// request arrives on it: the race of an upstream closing an idle connection as the proxy reuses it.
    CloseOnSecondRequest,
    /// Writes these bytes as the response, then closes.
    Fixed(Vec<u8>),
    /// Writes these bytes as the response right after the request head, then holds the connection open for
    /// 10 s without reading the body: an upstream rejecting an upload early (413, 401).
    AnswerWithoutReading(Vec<u8>),
}

#[derive(Default)]
struct Counters {
    accepted: AtomicUsize,
    requests: AtomicUsize,
    peer_closed: AtomicUsize,
}

pub struct RawBackend {
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
}

impl RawBackend {
    pub fn start(behaviour: Behaviour) -> std::io::Result<RawBackend> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (counters.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.accepted.fetch_add(1, Ordering::SeqCst);
                        let (c, b, s) = (c.clone(), behaviour.clone(), s.clone());
                        std::thread::spawn(move || serve(stream, b, c, s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(RawBackend { addr, counters, stop })
    }

    pub fn connections(&self) -> usize {
        self.counters.accepted.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }
    /// Connections the proxy closed while this backend held them (for `Hang`).
    pub fn peer_closed(&self) -> usize {
        self.counters.peer_closed.load(Ordering::SeqCst)
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads one request head (bodies are not expected); false when the peer closed first.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            return true;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn serve(mut stream: TcpStream, behaviour: Behaviour, c: Arc<Counters>, stop: Arc<AtomicBool>) {
    let mut buf = Vec::new();
    let mut served = 0;
    loop {
        if !read_head(&mut stream, &mut buf) {
            return;
        }
        served += 1;
        c.requests.fetch_add(1, Ordering::SeqCst);
        match &behaviour {
            Behaviour::CloseOnSecondRequest if served > 1 => return,
            Behaviour::CloseOnSecondRequest => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
            }
            Behaviour::CloseDelimited(body) => {
                let _ =
                    stream.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n{body}").as_bytes());
                return;
            }
            Behaviour::Fixed(bytes) => {
                let _ = stream.write_all(bytes);
                return;
            }
            Behaviour::AnswerWithoutReading(bytes) => {
                let _ = stream.write_all(bytes);
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            Behaviour::SilentClose { after } => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                let _ = stream.set_read_timeout(Some(*after));
                // Serve further requests that arrive in time; close silently once idle for `after`.
                let mut probe = [0u8; 4096];
                match stream.read(&mut probe) {
                    Ok(n) if n > 0 => buf.extend_from_slice(&probe[..n]),
                    _ => return,
                }
            }
            Behaviour::Hang => {
                let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
                let mut probe = [0u8; 1024];
                while !stop.load(Ordering::SeqCst) {
                    match stream.read(&mut probe) {
                        Ok(0) => {
                            c.peer_closed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        Ok(_) => {}
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        }
                        Err(_) => {
                            c.peer_closed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                return;
            }
        }
    }
}
