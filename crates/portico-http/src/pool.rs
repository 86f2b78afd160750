//! Per-worker pools of idle keep-alive connections to upstream endpoints, keyed by endpoint (cluster and
//! address) so that an endpoint that survives a reload keeps its connections. Owned by one worker thread: no
//! lock.

use crate::snapshot::Endpoint;
use crate::stats::{ClusterStats, EndpointStats};
use bytes::BytesMut;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct UpstreamConn {
    pub(crate) io: crate::io::Stream,
    /// Bytes read from the upstream and not yet consumed.
    pub buf: BytesMut,
    /// True when the connection came from the pool: a failure before any response byte may be a race with
    /// the upstream closing it, and is retried on a fresh connection.
    pub reused: bool,
    /// Its place in a batch of pipelined requests, while one member holds it.
    pub(crate) ticket: Option<crate::pipeline::Ticket>,
    endpoint: Arc<EndpointStats>,
    cluster: Arc<ClusterStats>,
    worker: usize,
}

impl UpstreamConn {
    /// A freshly connected socket, counted as opened and open for its cluster and endpoint.
    pub(crate) fn new(
        io: crate::io::Stream,
        endpoint: Arc<EndpointStats>,
        cluster: Arc<ClusterStats>,
        worker: usize,
    ) -> Self {
        if let Some(s) = endpoint.slots.get(worker) {
            s.0.connections_opened.inc();
        }
        if let Some(s) = cluster.slots.get(worker) {
            s.0.connections.add(1);
        }
        UpstreamConn { io, buf: BytesMut::new(), reused: false, ticket: None, endpoint, cluster, worker }
    }

    /// More pipelined responses follow on this connection: bytes after the current response are theirs.
    pub(crate) fn has_followers(&self) -> bool {
        self.ticket.as_ref().is_some_and(|t| t.has_followers())
    }

    /// False when the upstream has closed the connection or sent bytes nobody asked for.
    fn still_usable(&mut self) -> bool {
        self.io.still_usable()
    }

    fn set_idle(&self, delta: i64) {
        if let Some(s) = self.endpoint.slots.get(self.worker) {
            s.0.idle.add(delta);
        }
    }
}

impl Drop for UpstreamConn {
    fn drop(&mut self) {
        if let Some(s) = self.cluster.slots.get(self.worker) {
            s.0.connections.add(-1);
        }
    }
}

/// Identifies an endpoint's connections: the same address in two clusters gets two pools, and a reload that
/// changes how an endpoint is reached (plain or TLS, other roots or client certificate) starts a new pool.
pub(crate) type PoolKey = (usize, SocketAddr, usize);

pub(crate) fn key(endpoint: &Endpoint) -> PoolKey {
    let tls = endpoint.tls.as_ref().map_or(0, |t| Arc::as_ptr(t.connector.config()) as usize);
    (Arc::as_ptr(&endpoint.stats) as usize, endpoint.addr, tls)
}

#[derive(Default)]
pub struct Pool {
    /// Idle connections with the time they went idle and their cluster's idle timeout.
    idle: HashMap<PoolKey, Vec<(UpstreamConn, Instant, Duration)>>,
}

impl Pool {
    /// The most recently used idle connection to `endpoint` that is still open and younger than
    /// `max_idle_time`.
    pub fn checkout(&mut self, endpoint: &Endpoint, max_idle_time: Duration) -> Option<UpstreamConn> {
        let list = self.idle.get_mut(&key(endpoint))?;
        while let Some((mut conn, since, _)) = list.pop() {
            conn.set_idle(-1);
            if since.elapsed() < max_idle_time && conn.still_usable() {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for reuse. The caller guarantees the previous response was read completely.
    pub fn checkin(&mut self, endpoint: &Endpoint, conn: UpstreamConn, max_idle: usize, idle_timeout: Duration) {
        if max_idle == 0 || !conn.buf.is_empty() {
            return;
        }
        let list = self.idle.entry(key(endpoint)).or_default();
        if list.len() >= max_idle {
            let (oldest, _, _) = list.remove(0);
            oldest.set_idle(-1);
        }
        conn.set_idle(1);
        // An idle connection needs no read buffer: it goes to the thread's spare buffers until the next response.
        let mut conn = conn;
        crate::buffers::give_back(&mut conn.buf);
        list.push((conn, Instant::now(), idle_timeout));
    }

    /// Closes connections idle for longer than their cluster's idle timeout or closed by their upstream.
    pub fn sweep(&mut self) {
        for list in self.idle.values_mut() {
            list.retain_mut(|(c, since, idle_timeout)| {
                let keep = since.elapsed() < *idle_timeout && c.still_usable();
                if !keep {
                    c.set_idle(-1);
                }
                keep
            });
        }
        self.idle.retain(|_, l| !l.is_empty());
    }
}
