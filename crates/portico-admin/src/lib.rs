//! The admin server, on a thread of its own: `/metrics` (Prometheus), `/health` (liveness), `/ready`
//! (readiness), `/admin/clusters`, `/admin/config`, `/admin/reload`, `/admin/process`, `/admin/upgrade`. Served
//! with hyper; the proxy's own codec is for the data path only.

mod metrics;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use portico_core::stats::Global;
use portico_core::view::PlaneView;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use metrics::render as render_metrics;
pub use portico_core::metrics_merge::merge_metrics;

/// Applies a reload; `Err` carries the `FILE:LINE:COL` diagnostics.
pub type ReloadFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the admin server reads and can do.
pub struct AdminState {
    /// The planes this process runs (their metrics, their `/admin/...` views, the running configuration).
    pub planes: Vec<Arc<dyn PlaneView>>,
    /// Reload and process counters.
    pub global: Arc<Global>,
    /// True once the listeners serve; false again when shutting down.
    pub ready: AtomicBool,
    pub reload: Option<ReloadFn>,
    pub last_reload: Mutex<ReloadStatus>,
    /// Starts a zero-downtime upgrade (the same as SIGUSR2); `None` when it cannot be offered.
    pub upgrade: Option<ReloadFn>,
    /// With worker processes (`process_model: multi_process`): asks every worker process for a view
    /// (`metrics` or `clusters`); `/metrics` then sums theirs and `/admin/clusters` shows the first one's.
    pub workers: Option<GatherFn>,
    /// The release and the commit this binary was built from, for `GET /admin/process`.
    pub version: &'static str,
}

pub use portico_core::processes::GatherFn;

#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// When the last attempt ended, in milliseconds since the Unix epoch; `None` before the first.
    pub at_ms: Option<u64>,
    pub ok: bool,
    pub error: Option<String>,
}

impl AdminState {
    /// Records a reload attempt (from any trigger) for `/admin/reload` and the metrics.
    pub fn record_reload(&self, result: &Result<(), String>) {
        let mut status = self.last_reload.lock().unwrap_or_else(|p| p.into_inner());
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        *status = ReloadStatus { at_ms: Some(now), ok: result.is_ok(), error: result.as_ref().err().cloned() };
    }

    fn reload_ok(&self) -> bool {
        let status = self.last_reload.lock().unwrap_or_else(|p| p.into_inner());
        status.at_ms.is_none() || status.ok
    }
}

/// Binds the admin address now (so a taken port fails start-up) and serves it on a new thread.
pub fn start(addr: SocketAddr, state: Arc<AdminState>) -> std::io::Result<std::thread::JoinHandle<()>> {
    serve(std::net::TcpListener::bind(addr)?, state)
}

/// Serves the admin API on a socket already bound (passed by systemd, or by the Portico being upgraded).
pub fn serve(listener: std::net::TcpListener, state: Arc<AdminState>) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("portico-admin".into()).spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            tracing::error!("cannot start the admin runtime");
            return;
        };
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!("admin accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(req, state.clone()));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                });
            }
        });
    })
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    reply(status, "application/json", format!("{v:#}\n"))
}

async fn handle(req: Request<Incoming>, state: Arc<AdminState>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let response = match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => reply(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/ready") => {
            if state.ready.load(Ordering::SeqCst) {
                reply(StatusCode::OK, "text/plain", "ready\n")
            } else {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
            }
        }
        (&Method::GET, "/metrics") => {
            let mut text = metrics::render(&state.planes, &state.global, state.reload_ok());
            if let Some(gather) = state.workers.clone() {
                // The worker processes answer over blocking sockets: off the admin runtime.
                let theirs = tokio::task::spawn_blocking(move || gather("metrics")).await.unwrap_or_default();
                text = merge_metrics(&text, &theirs);
            }
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        (&Method::GET, "/admin/clusters") => {
            let first = match state.workers.clone() {
                Some(gather) => tokio::task::spawn_blocking(move || gather("clusters"))
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|answer| serde_json::from_str(&answer).ok()),
                None => None,
            };
            let own = || state.planes.iter().find_map(|p| p.admin_view("clusters"));
            json(StatusCode::OK, first.or_else(own).unwrap_or_else(|| serde_json::json!({ "clusters": [] })))
        }
        // The broker's state: connections, sessions, subscriptions, retained messages, its store.
        (&Method::GET, "/admin/mqtt") => match state.planes.iter().find_map(|p| p.admin_view("mqtt")) {
            Some(view) => json(StatusCode::OK, view),
            None => json(StatusCode::NOT_FOUND, serde_json::json!({ "error": "no MQTT broker in this process" })),
        },
        (&Method::GET, "/admin/config") => match state.planes.first().map(|p| p.running_config()) {
            Some(config) => {
                json(StatusCode::OK, serde_json::json!({ "file": config.file, "yaml": mask_secrets(&config.source) }))
            }
            None => json(StatusCode::NOT_FOUND, serde_json::json!({ "error": "no configuration" })),
        },
        (&Method::GET, "/admin/reload") => {
            let status = state.last_reload.lock().unwrap_or_else(|p| p.into_inner()).clone();
            // Before the first attempt there is no outcome to report: `ok` is null, not false.
            let ok = status.at_ms.map(|_| status.ok);
            json(
                StatusCode::OK,
                serde_json::json!({ "last_attempt_ms": status.at_ms, "ok": ok, "error": status.error }),
            )
        }
        (&Method::GET, "/admin/process") => {
            json(StatusCode::OK, serde_json::json!({ "pid": std::process::id(), "version": state.version }))
        }
        (&Method::POST, "/admin/upgrade") => match &state.upgrade {
            None => json(StatusCode::CONFLICT, serde_json::json!({ "ok": false, "error": "upgrade is not available" })),
            Some(upgrade) => match upgrade() {
                // The hand-over runs in the main thread; `GET /admin/process` shows the new pid once it is done.
                Ok(()) => json(StatusCode::ACCEPTED, serde_json::json!({ "ok": true, "pid": std::process::id() })),
                Err(e) => json(StatusCode::INTERNAL_SERVER_ERROR, serde_json::json!({ "ok": false, "error": e })),
            },
        },
        (&Method::POST, "/admin/reload") => match &state.reload {
            None => json(
                StatusCode::CONFLICT,
                serde_json::json!({ "ok": false, "error": "no configuration file to reload" }),
            ),
            Some(reload) => {
                let reload = reload.clone();
                // Loading resolves DNS: keep it off the admin runtime.
                let result = tokio::task::spawn_blocking(move || reload()).await.unwrap_or_else(|e| Err(e.to_string()));
                match result {
                    Ok(()) => json(StatusCode::OK, serde_json::json!({ "ok": true })),
                    Err(e) => json(StatusCode::UNPROCESSABLE_ENTITY, serde_json::json!({ "ok": false, "error": e })),
                }
            }
        },
        (
            _,
            "/health" | "/ready" | "/metrics" | "/admin/clusters" | "/admin/mqtt" | "/admin/config" | "/admin/reload"
            | "/admin/process" | "/admin/upgrade",
        ) => reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n"),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics, /health, /ready, /admin/clusters, /admin/mqtt, /admin/config, \
             /admin/reload, /admin/process, POST /admin/reload, POST /admin/upgrade\n",
        ),
    };
    Ok(response)
}

const SECRET_KEYS: [&str; 6] = ["password", "secret", "token", "api_key", "private_key", "passphrase"];

/// Replaces the values of keys that hold secrets with `****`: a line's own key (`password: x`) and the keys
/// of flow mappings (`{ name: a, secret: x }`).
pub fn mask_secrets(yaml: &str) -> String {
    yaml.lines()
        .map(|line| {
            let trimmed = line.trim_start().trim_start_matches("- ");
            match trimmed.split_once(':') {
                Some((key, value))
                    if !value.trim().is_empty() && SECRET_KEYS.iter().any(|s| key.trim().eq_ignore_ascii_case(s)) =>
                {
                    let cut = line.len() - value.len();
                    format!("{} \"****\"", &line[..cut])
                }
                _ if line.contains('{') => mask_flow(line),
                _ => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `line` with the values of secret keys inside `{ ... }` replaced: a key right after `{` or `,`, its value
/// up to the next `,` or `}` (or its closing quote).
fn mask_flow(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(['{', ',']) {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let spaces = rest.len() - rest.trim_start().len();
        let after = &rest[spaces..];
        let Some((key, value)) = after.split_once(':') else { continue };
        if !SECRET_KEYS.iter().any(|s| key.trim().eq_ignore_ascii_case(s)) || !value.starts_with(' ') {
            continue;
        }
        let value = value.trim_start();
        let end = match value.chars().next() {
            Some(q @ ('"' | '\'')) => value[1..].find(q).map_or(value.len(), |i| i + 2),
            _ => value.find([',', '}']).unwrap_or(value.len()),
        };
        out.push_str(&rest[..spaces]);
        out.push_str(key);
        out.push_str(": \"****\"");
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::mask_secrets;

    #[test]
    fn secrets_are_masked_in_block_and_flow_style() {
        assert_eq!(
            mask_secrets("a: 1\n  password: hunter2\ntoken:\nkey: x"),
            "a: 1\n  password: \"****\"\ntoken:\nkey: x"
        );
        assert_eq!(
            mask_secrets(
                "  - { name: a, secret: k-1 }\n  - { name: \"b,c\", secret: \"k,2\", x: 1 }\n  - {secret: 'q'}"
            ),
            "  - { name: a, secret: \"****\"}\n  - { name: \"b,c\", secret: \"****\", x: 1 }\n  - {secret: \"****\"}"
        );
        assert_eq!(mask_secrets("- { tls: { key: k.pem }, secretive: 1 }"), "- { tls: { key: k.pem }, secretive: 1 }");
    }
}
