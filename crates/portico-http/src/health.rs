//! Active health checks, run once per process on a thread of their own (never on a worker). Every 100 ms the
//! checker looks at the current snapshot, so clusters and endpoints added or removed by a reload are picked
//! up without a restart; an endpoint's verdict lives in its `EndpointHealth`, shared with the workers and kept
//! across reloads.

use crate::snapshot::{Endpoint, Snapshot};
use arc_swap::ArcSwap;
use portico_config::{HealthCheck, HealthCheckKind};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// Most of a probe response read (status line, headers and enough body for `body_contains`).
const MAX_PROBE_RESPONSE: usize = 64 * 1024;

#[derive(Default)]
struct ProbeState {
    next_due: Option<Instant>,
    running: bool,
    consecutive_ok: u32,
    consecutive_fail: u32,
}

type Key = (String, SocketAddr);

/// Starts the checker thread; it runs until `shutdown` turns true.
pub fn spawn(
    snapshot: Arc<ArcSwap<Snapshot>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("portico-health".into()).spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            tracing::error!("cannot start the health-check runtime");
            return;
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, run(snapshot, shutdown));
    })
}

async fn run(snapshot: Arc<ArcSwap<Snapshot>>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let states: std::rc::Rc<std::cell::RefCell<HashMap<Key, ProbeState>>> = Default::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !*shutdown.borrow() {
        tick.tick().await;
        let snap = snapshot.load_full();
        let mut live = Vec::new();
        for cluster in &snap.clusters {
            let Some(check) = &cluster.health_check else {
                // Health checks removed by a reload: the endpoints count as healthy again.
                for e in &cluster.endpoints {
                    e.health.set_active_healthy(true);
                }
                continue;
            };
            for endpoint in &cluster.endpoints {
                let key = (cluster.name.clone(), endpoint.addr);
                live.push(key.clone());
                let mut map = states.borrow_mut();
                let state = map.entry(key.clone()).or_default();
                let now = Instant::now();
                if state.running || state.next_due.is_some_and(|due| due > now) {
                    continue;
                }
                state.running = true;
                state.next_due = Some(now + check.interval.0);
                let (check, endpoint, states) = (check.clone(), endpoint.clone(), states.clone());
                let cluster_name = cluster.name.clone();
                tokio::task::spawn_local(async move {
                    let result = probe(&check, &endpoint).await;
                    let mut map = states.borrow_mut();
                    if let Some(state) = map.get_mut(&key) {
                        state.running = false;
                        apply(state, &check, &endpoint, &cluster_name, result);
                    }
                });
            }
        }
        // Forget endpoints that left the configuration.
        states.borrow_mut().retain(|k, _| live.contains(k));
    }
}

fn apply(state: &mut ProbeState, check: &HealthCheck, endpoint: &Endpoint, cluster: &str, result: Result<(), String>) {
    match result {
        Ok(()) => {
            state.consecutive_fail = 0;
            state.consecutive_ok += 1;
            if state.consecutive_ok >= check.healthy_after && endpoint.health.set_active_healthy(true) {
                tracing::warn!(cluster, endpoint = %endpoint.configured, "endpoint healthy again");
            }
        }
        Err(reason) => {
            state.consecutive_ok = 0;
            state.consecutive_fail += 1;
            if state.consecutive_fail >= check.unhealthy_after && endpoint.health.set_active_healthy(false) {
                tracing::warn!(cluster, endpoint = %endpoint.configured, reason, "endpoint unhealthy");
            }
        }
    }
}

/// One probe: a TCP connect, or an HTTP request whose status (and optionally body) is checked.
async fn probe(check: &HealthCheck, endpoint: &Endpoint) -> Result<(), String> {
    match timeout(check.timeout.0, probe_inner(check, endpoint)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {}", check.timeout)),
    }
}

async fn probe_inner(check: &HealthCheck, endpoint: &Endpoint) -> Result<(), String> {
    let tcp = TcpStream::connect(endpoint.addr).await.map_err(|e| format!("connect: {e}"))?;
    // A TLS endpoint is probed over TLS, verified as requests are: a certificate problem makes it unhealthy.
    let mut io = match &endpoint.tls {
        None => crate::io::Stream::Tcp(tcp),
        Some(tls) => crate::io::Stream::UpstreamTls(Box::new(
            tls.connector.connect(tls.server_name.clone(), tcp).await.map_err(|e| format!("TLS handshake: {e}"))?,
        )),
    };
    if check.kind == HealthCheckKind::Tcp {
        return Ok(());
    }
    let host = check.host.as_deref().unwrap_or(&endpoint.authority);
    let request = format!(
        "{} {} HTTP/1.1\r\nhost: {host}\r\nuser-agent: portico-health-check\r\nconnection: close\r\n\r\n",
        check.method, check.path
    );
    io.write_all(request.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
    io.flush().await.map_err(|e| format!("send: {e}"))?;
    let mut response = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    let wants_body = check.body_contains.is_some();
    loop {
        let n = io.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..n]);
        // Enough read: the head (when only the status matters), or the awaited text already seen, so a
        // keep-alive upstream that ignores `connection: close` does not time the probe out.
        let head_end = memchr::memmem::find(&response, b"\r\n\r\n");
        let needle_seen = check.body_contains.as_ref().is_some_and(|needle| {
            head_end.is_some_and(|end| memchr::memmem::find(&response[end..], needle.as_bytes()).is_some())
        });
        if response.len() >= MAX_PROBE_RESPONSE || (!wants_body && head_end.is_some()) || needle_seen {
            break;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut headers);
    let head_len = match parsed.parse(&response) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err("invalid or incomplete response".into()),
    };
    let status = parsed.code.unwrap_or(0);
    let (lo, hi) = check.status_range().unwrap_or((200, 399));
    if !(lo..=hi).contains(&status) {
        return Err(format!("status {status}, expected {}", check.expected_status));
    }
    if let Some(needle) = &check.body_contains {
        if memchr::memmem::find(&response[head_len..], needle.as_bytes()).is_none() {
            return Err(format!("body does not contain {needle:?}"));
        }
    }
    Ok(())
}
