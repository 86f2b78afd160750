//! Per-worker pools of idle keep-alive connections to upstream endpoints, keyed by endpoint (cluster and
//! address) so that an endpoint that survives a reload keeps its connections. Owned by one worker thread: no
//! lock.

use crate::snapshot::Endpoint;
use crate::stats::{ClusterStats, EndpointStats};
use bytes::BytesMut;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct UpstreamConn {
    pub(crate) io: portico_core::io::Stream,
    /// Bytes read from the upstream and not yet consumed.
    pub buf: BytesMut,
    /// True when the connection came from the pool: a failure before any response byte may be a race with
    /// the upstream closing it, and is retried on a fresh connection.
    pub reused: bool,
    /// Responses still owed on this connection after the one being read, to requests pipelined with it
    /// (`pipeline`): the bytes after the current response are theirs.
    pub(crate) followers: usize,
    /// The request's body was not sent whole (its upstream answered early): the upstream would read the
    /// next request as the rest of it, so the connection is closed after this response.
    pub(crate) request_unfinished: bool,
    endpoint: Arc<EndpointStats>,
    cluster: Arc<ClusterStats>,
    worker: usize,
}

impl UpstreamConn {
    /// A freshly connected socket, counted as opened and open for its cluster and endpoint.
    #[cfg(test)]
    pub(crate) fn new(
        io: portico_core::io::Stream,
        endpoint: Arc<EndpointStats>,
        cluster: Arc<ClusterStats>,
        worker: usize,
    ) -> Self {
        if let Some(s) = cluster.slots.get(worker) {
            s.0.connections.add(1);
        }
        Self::counted(io, endpoint, cluster, worker)
    }

    /// A freshly connected socket whose place among its cluster's open connections was taken before it was
    /// opened (so that connections being opened count against the limit); counted as opened.
    pub(crate) fn counted(
        io: portico_core::io::Stream,
        endpoint: Arc<EndpointStats>,
        cluster: Arc<ClusterStats>,
        worker: usize,
    ) -> Self {
        if let Some(s) = endpoint.slots.get(worker) {
            s.0.connections_opened.inc();
        }
        UpstreamConn {
            io,
            buf: BytesMut::new(),
            reused: false,
            followers: 0,
            request_unfinished: false,
            endpoint,
            cluster,
            worker,
        }
    }

    /// More pipelined responses follow on this connection: bytes after the current response are theirs.
    pub(crate) fn has_followers(&self) -> bool {
        self.followers > 0
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
            if s.0.pending.get() > 0 {
                s.0.freed.notify_one();
            }
        }
    }
}

/// Identifies an endpoint's connections: the same address in two clusters gets two pools, and a reload that
/// changes how an endpoint is reached (plain or TLS, other roots or client certificate) starts a new pool.
pub(crate) type PoolKey = (usize, SocketAddr, usize);

/// A map keyed by `PoolKey`, hashed cheaply: the keys come from the configuration, never from clients, so
/// SipHash's defence against chosen keys buys nothing here, and it hashed a socket address twice per request.
pub(crate) type KeyMap<V> = HashMap<PoolKey, V, BuildHasherDefault<KeyHasher>>;

/// Multiply-rotate hashing (as in rustc's FxHasher) of the few words of a `PoolKey`.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) fn key(endpoint: &Endpoint) -> PoolKey {
    let tls = endpoint.tls.as_ref().map_or(0, |t| Arc::as_ptr(t.connector.config()) as usize);
    (Arc::as_ptr(&endpoint.stats) as usize, endpoint.addr, tls)
}

#[derive(Default)]
pub struct Pool {
    /// Idle connections with the time they went idle and their cluster's idle timeout.
    idle: KeyMap<Vec<(UpstreamConn, Instant, Duration)>>,
    /// The sweeper's task, waiting while the pool is empty: the next connection checked in wakes it.
    sweeper: Option<std::task::Waker>,
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

    /// Keeps `conn` for reuse. The caller guarantees the previous response was read completely. A connection
    /// with bytes after that response (nobody asked for them), or still owing pipelined responses, is closed
    /// instead: what it holds would be read as the next request's response.
    pub fn checkin(&mut self, endpoint: &Endpoint, conn: UpstreamConn, max_idle: usize, idle_timeout: Duration) {
        if max_idle == 0 || !conn.buf.is_empty() || conn.has_followers() {
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
        if let Some(s) = conn.cluster.slots.get(conn.worker) {
            if s.0.pending.get() > 0 {
                s.0.freed.notify_one();
            }
        }
        list.push((conn, Instant::now(), idle_timeout));
        if let Some(sweeper) = self.sweeper.take() {
            sweeper.wake();
        }
    }

    /// Ready when the pool holds an idle connection; otherwise the next `checkin` wakes `cx`'s task.
    pub fn poll_occupied(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.idle.is_empty() {
            self.sweeper = Some(cx.waker().clone());
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(())
    }

    /// Closes an idle connection of `cluster` (the longest idle of one of its endpoints), making room under its
    /// connection limit for a request that needs another endpoint; false when it has none idle.
    pub fn close_idle_of(&mut self, cluster: &Arc<ClusterStats>) -> bool {
        for list in self.idle.values_mut() {
            if list.first().is_some_and(|(c, _, _)| Arc::ptr_eq(&c.cluster, cluster)) {
                let (oldest, _, _) = list.remove(0);
                oldest.set_idle(-1);
                return true;
            }
        }
        false
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

#[cfg(test)]
mod tests {
    //! Pooled values are real TCP connections to a listener on 127.0.0.1, told apart by their local port; the
    //! listener's side of each is kept to see whether the pool closed it (or to close it under the pool).
    use super::{Pool, UpstreamConn};
    use crate::snapshot::{build, Endpoint, Registry, Snapshot};
    use portico_core::io::Stream;
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Duration;

    const LONG: Duration = Duration::from_secs(60);

    /// Clusters `a` and `b`, each with the given endpoints (the same address may be in both; an unused one when
    /// none is given); `tls` adds a TLS section to cluster `a`.
    fn snapshot(registry: &Registry, a: &[u16], b: &[u16], tls: bool) -> Snapshot {
        let mut yaml = String::from(
            "listeners:\n  - name: web\n    address: 127.0.0.1:8080\nroutes:\n  - match: { path_prefix: /a }\n    \
             cluster: a\n  - match: { path_prefix: / }\n    cluster: b\nclusters:\n",
        );
        for (name, ports) in [("a", a), ("b", b)] {
            yaml.push_str(&format!("  {name}:\n"));
            if tls && name == "a" {
                yaml.push_str("    tls: { insecure_skip_verify: true }\n");
            }
            yaml.push_str("    endpoints:\n");
            for p in ports {
                yaml.push_str(&format!("      - address: 127.0.0.1:{p}\n"));
            }
            if ports.is_empty() {
                yaml.push_str("      - address: 127.0.0.9:1\n");
            }
        }
        let loaded = portico_config::load_str(&yaml, "test.yaml").unwrap_or_else(|e| panic!("{e:?}\n{yaml}"));
        build(&loaded, registry).unwrap_or_else(|e| panic!("{e:?}"))
    }

    struct Upstream {
        listener: TcpListener,
        port: u16,
    }

    fn upstream() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        Upstream { listener, port }
    }

    /// A connection to `up` for `endpoint` of cluster `cluster`, and the upstream's side of it.
    async fn connect(
        s: &Snapshot,
        cluster: usize,
        endpoint: usize,
        up: &Upstream,
    ) -> (UpstreamConn, std::net::TcpStream) {
        let c = &s.clusters[cluster];
        let e = &c.endpoints[endpoint];
        assert_eq!(e.addr.port(), up.port);
        let tcp = tokio::net::TcpStream::connect(e.addr).await.unwrap();
        let (server, _) = up.listener.accept().unwrap();
        (UpstreamConn::new(Stream::Tcp(tcp), e.stats.clone(), c.stats.clone(), 0), server)
    }

    fn port(conn: &UpstreamConn) -> u16 {
        match &conn.io {
            Stream::Tcp(s) => s.local_addr().unwrap().port(),
            _ => unreachable!(),
        }
    }

    fn idle(e: &Endpoint) -> i64 {
        e.stats.slots[0].0.idle.get()
    }

    fn open_connections(s: &Snapshot, cluster: usize) -> i64 {
        s.clusters[cluster].stats.slots[0].0.connections.get()
    }

    /// Whether the pool closed the connection whose upstream side is `server` (a reset when it was closed with
    /// bytes unread).
    fn closed(server: &mut std::net::TcpStream) -> bool {
        server.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        match server.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    fn still_open(server: &mut std::net::TcpStream) -> bool {
        server.set_nonblocking(true).unwrap();
        let open = matches!(server.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        server.set_nonblocking(false).unwrap();
        open
    }

    #[tokio::test(flavor = "current_thread")]
    async fn checkout_returns_the_most_recently_used_first() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..3 {
            let (conn, server) = connect(&s, 0, 0, &up).await;
            assert!(!conn.reused);
            ports.push(port(&conn));
            servers.push(server);
            pool.checkin(e, conn, 8, LONG);
        }
        assert_eq!(idle(e), 3);
        for expected in ports.iter().rev() {
            let conn = pool.checkout(e, LONG).expect("a pooled connection");
            assert_eq!(port(&conn), *expected);
            assert!(conn.reused);
            // Checked out, returned, it is again the first to go.
            pool.checkin(e, conn, 8, LONG);
            let again = pool.checkout(e, LONG).unwrap();
            assert_eq!(port(&again), *expected);
            drop(again);
        }
        assert!(pool.checkout(e, LONG).is_none());
        assert_eq!(idle(e), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_idle_cap_closes_the_oldest() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..4 {
            let (conn, server) = connect(&s, 0, 0, &up).await;
            ports.push(port(&conn));
            servers.push(server);
            pool.checkin(e, conn, 2, LONG);
            assert!(idle(e) <= 2);
        }
        assert_eq!(idle(e), 2);
        assert_eq!(open_connections(&s, 0), 2);
        // The two oldest were closed, the two newest are kept.
        assert!(closed(&mut servers[0]) && closed(&mut servers[1]));
        assert!(still_open(&mut servers[2]) && still_open(&mut servers[3]));
        assert_eq!(port(&pool.checkout(e, LONG).unwrap()), ports[3]);
        assert_eq!(port(&pool.checkout(e, LONG).unwrap()), ports[2]);
        assert!(pool.checkout(e, LONG).is_none());
        assert_eq!(open_connections(&s, 0), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn nothing_is_kept_without_room_or_with_unread_bytes() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let (conn, mut server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, conn, 0, LONG);
        assert!(closed(&mut server));
        // Bytes of a response not yet consumed: the connection is out of step and must not be reused.
        let (mut conn, mut server) = connect(&s, 0, 0, &up).await;
        conn.buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        pool.checkin(e, conn, 8, LONG);
        assert!(closed(&mut server));
        // Responses still owed to pipelined requests: the same.
        let (mut conn, mut server) = connect(&s, 0, 0, &up).await;
        conn.followers = 1;
        pool.checkin(e, conn, 8, LONG);
        assert!(closed(&mut server));
        assert!(pool.checkout(e, LONG).is_none());
        assert_eq!(idle(e), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn connections_idle_too_long_are_not_checked_out() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let (old, mut old_server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, old, 8, LONG);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (young, mut young_server) = connect(&s, 0, 0, &up).await;
        let young_port = port(&young);
        pool.checkin(e, young, 8, LONG);
        let max_idle_time = Duration::from_millis(300);
        assert_eq!(port(&pool.checkout(e, max_idle_time).unwrap()), young_port);
        // The old one is past `max_idle_time`: discarded and closed, not handed out.
        assert!(pool.checkout(e, max_idle_time).is_none());
        assert!(closed(&mut old_server));
        assert_eq!(idle(e), 0);
        assert!(closed(&mut young_server));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sweep_closes_connections_past_their_idle_timeout() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let (short, mut short_server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, short, 8, Duration::from_millis(500));
        let (long, mut long_server) = connect(&s, 0, 0, &up).await;
        let long_port = port(&long);
        pool.checkin(e, long, 8, LONG);
        pool.sweep();
        assert_eq!(idle(e), 2, "nothing has expired yet");
        tokio::time::sleep(Duration::from_millis(800)).await;
        pool.sweep();
        assert_eq!(idle(e), 1);
        assert!(closed(&mut short_server));
        assert!(still_open(&mut long_server));
        assert_eq!(port(&pool.checkout(e, LONG).unwrap()), long_port);
        assert!(pool.checkout(e, LONG).is_none());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn connections_the_upstream_closed_or_wrote_to_are_skipped() {
        let up = upstream();
        let s = snapshot(&Registry::new(1), &[up.port], &[], false);
        let e = &s.clusters[0].endpoints[0];
        let mut pool = Pool::default();
        let (good, mut good_server) = connect(&s, 0, 0, &up).await;
        let good_port = port(&good);
        pool.checkin(e, good, 8, LONG);
        let (chatty, mut chatty_server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, chatty, 8, LONG);
        let (gone, gone_server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, gone, 8, LONG);
        drop(gone_server);
        std::io::Write::write_all(&mut chatty_server, b"HTTP/1.1 408 Request Timeout\r\n\r\n").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(port(&pool.checkout(e, LONG).unwrap()), good_port);
        assert!(pool.checkout(e, LONG).is_none());
        assert!(closed(&mut chatty_server));
        assert!(closed(&mut good_server));
        assert_eq!(idle(e), 0);

        // `sweep` drops them too.
        let (gone, gone_server) = connect(&s, 0, 0, &up).await;
        pool.checkin(e, gone, 8, LONG);
        drop(gone_server);
        tokio::time::sleep(Duration::from_millis(100)).await;
        pool.sweep();
        assert_eq!(idle(e), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn endpoints_and_clusters_never_share_connections() {
        let (up1, up2) = (upstream(), upstream());
        // Cluster a: up1 and up2; cluster b: up1 as well.
        let s = snapshot(&Registry::new(1), &[up1.port, up2.port], &[up1.port], false);
        let a1 = &s.clusters[0].endpoints[0];
        let a2 = &s.clusters[0].endpoints[1];
        let b1 = &s.clusters[1].endpoints[0];
        let mut pool = Pool::default();
        let (conn, _server) = connect(&s, 0, 0, &up1).await;
        let p = port(&conn);
        pool.checkin(a1, conn, 8, LONG);
        assert!(pool.checkout(a2, LONG).is_none(), "another endpoint of the cluster");
        assert!(pool.checkout(b1, LONG).is_none(), "the same address in another cluster");
        assert_eq!(port(&pool.checkout(a1, LONG).unwrap()), p);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reload_keeps_an_unchanged_endpoints_connections() {
        let up = upstream();
        let registry = Registry::new(1);
        let before = snapshot(&registry, &[up.port], &[], false);
        let mut pool = Pool::default();
        let (conn, _server) = connect(&before, 0, 0, &up).await;
        let p = port(&conn);
        pool.checkin(&before.clusters[0].endpoints[0], conn, 8, LONG);
        let after = snapshot(&registry, &[up.port], &[], false);
        assert_eq!(port(&pool.checkout(&after.clusters[0].endpoints[0], LONG).unwrap()), p);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reload_that_turns_tls_on_starts_a_new_pool() {
        let up = upstream();
        let registry = Registry::new(1);
        let plain = snapshot(&registry, &[up.port], &[], false);
        let tls = snapshot(&registry, &[up.port], &[], true);
        let (e_plain, e_tls) = (&plain.clusters[0].endpoints[0], &tls.clusters[0].endpoints[0]);
        // Same cluster, same endpoint, same counters: only the way it is reached differs.
        assert!(e_plain.tls.is_none() && e_tls.tls.is_some());
        assert!(std::sync::Arc::ptr_eq(&e_plain.stats, &e_tls.stats));
        let mut pool = Pool::default();
        let (conn, _server) = connect(&plain, 0, 0, &up).await;
        pool.checkin(e_plain, conn, 8, LONG);
        assert!(pool.checkout(e_tls, LONG).is_none());
        // And back: the plain connection is still there for a plain endpoint.
        assert!(pool.checkout(e_plain, LONG).is_some());
    }
}
