//! Per-worker pools of idle keep-alive connections to upstream endpoints, keyed by address so that an endpoint
//! that survives a reload keeps its connections. Owned by one worker thread: no lock.

use bytes::BytesMut;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

pub struct UpstreamConn {
    pub io: TcpStream,
    /// Bytes read from the upstream and not yet consumed.
    pub buf: BytesMut,
    /// True when the connection came from the pool: a failure before any response byte may be a race with
    /// the upstream closing it, and is retried on a fresh connection.
    pub reused: bool,
}

impl UpstreamConn {
    pub fn new(io: TcpStream) -> Self {
        UpstreamConn { io, buf: BytesMut::new(), reused: false }
    }

    /// False when the upstream has closed the connection or sent bytes nobody asked for. Costs no system
    /// call unless the reactor has seen the socket become readable.
    fn still_usable(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

#[derive(Default)]
pub struct Pool {
    idle: HashMap<SocketAddr, Vec<(UpstreamConn, Instant)>>,
}

impl Pool {
    /// The most recently used idle connection to `addr` that is still open and younger than `max_idle_time`.
    pub fn checkout(&mut self, addr: SocketAddr, max_idle_time: Duration) -> Option<UpstreamConn> {
        let list = self.idle.get_mut(&addr)?;
        while let Some((mut conn, since)) = list.pop() {
            if since.elapsed() < max_idle_time && conn.still_usable() {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for reuse. The caller guarantees the previous response was read completely and nothing
    /// else is buffered.
    pub fn checkin(&mut self, addr: SocketAddr, conn: UpstreamConn, max_idle: usize) {
        if max_idle == 0 || !conn.buf.is_empty() {
            return;
        }
        let list = self.idle.entry(addr).or_default();
        if list.len() >= max_idle {
            list.remove(0);
        }
        list.push((conn, Instant::now()));
    }

    /// Closes connections idle for longer than `max_idle_time` or closed by their upstream.
    pub fn sweep(&mut self, max_idle_time: Duration) {
        for list in self.idle.values_mut() {
            list.retain(|(c, since)| since.elapsed() < max_idle_time && c.still_usable());
        }
        self.idle.retain(|_, l| !l.is_empty());
    }

    pub fn idle_count(&self) -> usize {
        self.idle.values().map(Vec::len).sum()
    }
}
