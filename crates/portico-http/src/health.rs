//! Active health checks, run once per process on a thread of their own (never on a worker). While a cluster
//! has a health check, every 100 ms the checker looks at the current snapshot, so clusters and endpoints added
//! or removed by a reload are picked up without a restart; with none, it sleeps until a reload wakes it (an
//! idle process wakes for nothing). An endpoint's verdict lives in its `EndpointHealth`, shared with the
//! workers and kept across reloads.

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

/// Starts the checker thread; it runs until `shutdown` turns true. `reloaded` is notified after every reload
/// (the snapshot changed): without health checks, nothing else wakes the checker.
pub fn spawn(
    snapshot: Arc<ArcSwap<Snapshot>>,
    reloaded: Arc<tokio::sync::Notify>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("portico-health".into()).spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            tracing::error!("cannot start the health-check runtime");
            return;
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, run(snapshot, reloaded, shutdown));
    })
}

/// How often the checker looks for probes due while a cluster has a health check.
const TICK: Duration = Duration::from_millis(100);

async fn run(
    snapshot: Arc<ArcSwap<Snapshot>>,
    reloaded: Arc<tokio::sync::Notify>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let states: std::rc::Rc<std::cell::RefCell<HashMap<Key, ProbeState>>> = Default::default();
    while !*shutdown.borrow() {
        let snap = snapshot.load_full();
        let checks = snap.clusters.iter().any(|c| c.health_check.is_some());
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
        drop(snap);
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            _ = reloaded.notified() => {}
            _ = tokio::time::sleep(TICK), if checks => {}
        }
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
        None => portico_core::io::Stream::Tcp(tcp),
        Some(tls) => portico_core::io::Stream::UpstreamTls(Box::new(
            tls.connector.connect(tls.server_name.clone(), tcp).await.map_err(|e| format!("TLS handshake: {e}"))?,
        )),
    };
    match check.kind {
        HealthCheckKind::Tcp => return Ok(()),
        HealthCheckKind::Grpc => return grpc_probe(io, check, endpoint).await,
        HealthCheckKind::Http => {}
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

/// `grpc.health.v1.Health/Check` over HTTP/2 (prior knowledge, or TLS with ALPN h2): healthy when the answer
/// is `SERVING` with `grpc-status: 0`.
async fn grpc_probe(io: portico_core::io::Stream, check: &HealthCheck, endpoint: &Endpoint) -> Result<(), String> {
    use http_body_util::BodyExt;
    let builder = hyper::client::conn::http2::Builder::new(crate::exec::LocalExec);
    let (mut sender, conn) =
        builder.handshake(hyper_util::rt::TokioIo::new(io)).await.map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let authority = check.host.as_deref().unwrap_or(&endpoint.authority);
    let scheme = if endpoint.tls.is_some() { "https" } else { "http" };
    let request = hyper::Request::post(format!("{scheme}://{authority}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("user-agent", "portico-health-check")
        .body(http_body_util::Full::new(bytes::Bytes::from(grpc_health_request(&check.grpc_service))))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
    if resp.status() != hyper::StatusCode::OK {
        return Err(format!("HTTP status {}", resp.status().as_u16()));
    }
    let status_of =
        |h: &hyper::HeaderMap| h.get("grpc-status").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(code) = status_of(resp.headers()).filter(|c| c != "0") {
        return Err(format!("grpc-status {code}"));
    }
    let collected = resp.into_body().collect().await.map_err(|e| format!("read: {e}"))?;
    if let Some(code) = collected.trailers().and_then(status_of).filter(|c| c != "0") {
        return Err(format!("grpc-status {code}"));
    }
    let data = collected.to_bytes();
    match grpc_serving_status(&data) {
        Some(1) => Ok(()),
        Some(2) => Err("NOT_SERVING".into()),
        Some(3) => Err(format!("SERVICE_UNKNOWN ({:?})", check.grpc_service)),
        Some(other) => Err(format!("serving status {other}")),
        None => Err("invalid HealthCheckResponse".into()),
    }
}

// The health protocol's two messages have one field each; encoding them by hand spares a protobuf code
// generator (and protoc) at build time.

/// A gRPC message frame holding `HealthCheckRequest { service }`.
fn grpc_health_request(service: &str) -> Vec<u8> {
    let mut message = Vec::with_capacity(service.len() + 8);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        push_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0); // not compressed
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame
}

fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_varint(data: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = data.split_first()?;
        *data = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The `status` of the `HealthCheckResponse` in a gRPC message frame (0, UNKNOWN, when absent).
fn grpc_serving_status(frame: &[u8]) -> Option<u64> {
    let (header, rest) = frame.split_at_checked(5)?;
    if header[0] != 0 {
        return None; // compressed: never asked for
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let mut message = rest.get(..len)?;
    let mut status = 0;
    while !message.is_empty() {
        let tag = read_varint(&mut message)?;
        match (tag >> 3, tag & 7) {
            (1, 0) => status = read_varint(&mut message)?,
            (_, 0) => {
                read_varint(&mut message)?;
            }
            (_, 1) => message = message.get(8..)?,
            (_, 2) => {
                let n = read_varint(&mut message)? as usize;
                message = message.get(n..)?;
            }
            (_, 5) => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_messages_round_trip() {
        assert_eq!(grpc_health_request(""), vec![0, 0, 0, 0, 0]);
        assert_eq!(grpc_health_request("a.B"), vec![0, 0, 0, 0, 5, 0x0a, 3, b'a', b'.', b'B']);
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(1));
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 9, 0x12, 2, b'x', b'y', 0x08, 2, 0x18, 0xff, 0x01]), Some(2));
        assert_eq!(grpc_serving_status(&[0, 0, 0, 0, 3, 0x08]), None);
        assert_eq!(grpc_serving_status(&[1, 0, 0, 0, 2, 0x08, 1]), None);
    }
}
