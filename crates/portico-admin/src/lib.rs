//! The admin server, on a thread of its own: the dashboard (`/`, its files under `/dashboard/`, live over
//! `/admin/events`), `/metrics` (Prometheus), `/health` (liveness), `/ready` (readiness), `/admin/clusters`,
//! `/admin/config`, `/admin/reload`, `/admin/process`, `/admin/upgrade` and the rest of the JSON API. Served with
//! hyper; the proxy's own codec is for the data path only.

mod assets;
pub mod auth;
mod dashboard;
pub mod history;
mod metrics;
pub mod series;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use portico_core::stats::Global;
use portico_core::view::{ActionError, PlaneView};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use dashboard::Dashboard;
pub use history::Attempt;

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
    /// The admin token state-changing requests must carry (`admin.token`), and the refusals so far.
    pub guard: auth::Guard,
    /// The dashboard's charts, reload history and live pages.
    pub dashboard: Dashboard,
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

    /// Records a reload attempt with what it changed, for `/admin/reload`, the metrics and the reload history.
    pub fn record_reload_attempt(&self, attempt: Attempt) {
        let result = match &attempt.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        };
        self.record_reload(&result);
        let at_ms = self.last_reload.lock().unwrap_or_else(|p| p.into_inner()).at_ms.unwrap_or(0);
        self.dashboard.history.lock().unwrap_or_else(|p| p.into_inner()).add(at_ms, attempt);
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
            tokio::spawn(dashboard::sample_every_second(state.clone()));
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!("admin accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(req, state.clone(), peer));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                });
            }
        });
    })
}

/// A response's body: whole, or the live updates of `/admin/events`.
type Body = Either<Full<Bytes>, dashboard::LiveBody>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    reply(status, "application/json", format!("{v:#}\n"))
}

/// What every answer of the admin server carries: nothing of it may be framed or run scripts from elsewhere.
const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
         font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-resource-policy", "same-origin"),
];

async fn handle(
    req: Request<Incoming>,
    state: Arc<AdminState>,
    peer: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    let mut response = route(req, state, peer).await;
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
    if !headers.contains_key(hyper::header::CACHE_CONTROL) {
        headers.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
    }
    Ok(response)
}

/// The JSON body of a POST, at most 64 KiB; an empty body is `{}`.
async fn json_body(req: Request<Incoming>) -> Result<serde_json::Value, Response<Body>> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(req.into_body(), 64 * 1024);
    let bytes = match limited.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return Err(json(StatusCode::BAD_REQUEST, serde_json::json!({ "ok": false, "error": e.to_string() })))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        json(StatusCode::BAD_REQUEST, serde_json::json!({ "ok": false, "error": format!("the body is not JSON: {e}") }))
    })
}

async fn route(req: Request<Incoming>, state: Arc<AdminState>, peer: SocketAddr) -> Response<Body> {
    let path = req.uri().path().to_string();
    if req.method() == Method::POST {
        if let Err(refusal) = state.guard.check(req.headers(), peer, &path) {
            let mut r = json(StatusCode::UNAUTHORIZED, serde_json::json!({ "ok": false, "error": refusal.message() }));
            if refusal == auth::Refusal::Origin {
                *r.status_mut() = StatusCode::FORBIDDEN;
            } else {
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Bearer realm=\"portico admin\""),
                );
            }
            return r;
        }
    }
    if req.method() == Method::GET || req.method() == Method::HEAD {
        if let Some(asset) = assets::find(&path) {
            return reply(StatusCode::OK, asset.content_type, Bytes::from_static(asset.body));
        }
    }
    match (req.method(), path.as_str()) {
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
            state.guard.render(&mut text);
            if let Some(gather) = state.workers.clone() {
                // The worker processes answer over blocking sockets: off the admin runtime.
                let theirs = tokio::task::spawn_blocking(move || gather("metrics")).await.unwrap_or_default();
                text = merge_metrics(&text, &theirs);
            }
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        (&Method::GET, "/admin/clusters") => json(StatusCode::OK, dashboard::clusters(&state).await),
        (&Method::GET, "/admin/errors") => json(StatusCode::OK, dashboard::errors(&state).await),
        (&Method::GET, "/admin/listeners" | "/admin/functions") => {
            let name = &path["/admin/".len()..];
            match state.planes.iter().find_map(|p| p.admin_view(name)) {
                Some(view) => json(StatusCode::OK, view),
                None => {
                    json(StatusCode::NOT_FOUND, serde_json::json!({ "error": format!("no {name} in this process") }))
                }
            }
        }
        (&Method::GET, "/admin/overview") => json(StatusCode::OK, dashboard::overview(&state).await),
        (&Method::GET, "/admin/series") => {
            // Compact: 15 minutes of every series is large enough as it is.
            let series = state.dashboard.series.lock().unwrap_or_else(|p| p.into_inner()).to_json();
            reply(StatusCode::OK, "application/json", format!("{series}\n"))
        }
        (&Method::GET, "/admin/reloads") => {
            let history = state.dashboard.history.lock().unwrap_or_else(|p| p.into_inner()).to_json();
            json(StatusCode::OK, history)
        }
        (&Method::GET, "/admin/events") => dashboard::events(&state).await,
        (&Method::POST, "/admin/endpoints/drain" | "/admin/endpoints/enable") => {
            let args = match json_body(req).await {
                Ok(args) => args,
                Err(refused) => return refused,
            };
            let name = &path["/admin/".len()..];
            if state.workers.is_some() {
                return json(
                    StatusCode::CONFLICT,
                    serde_json::json!({ "ok": false, "error": "draining endpoints is not available with worker processes (process_model: multi_process)" }),
                );
            }
            match state.planes.iter().find_map(|p| p.act(name, &args)) {
                Some(Ok(done)) => json(StatusCode::OK, serde_json::json!({ "ok": true, "endpoint": done })),
                Some(Err(ActionError::Invalid(e))) => {
                    json(StatusCode::BAD_REQUEST, serde_json::json!({ "ok": false, "error": e }))
                }
                Some(Err(ActionError::NotFound(e))) => {
                    json(StatusCode::NOT_FOUND, serde_json::json!({ "ok": false, "error": e }))
                }
                None => json(StatusCode::NOT_FOUND, serde_json::json!({ "ok": false, "error": "no HTTP plane" })),
            }
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
            "/health"
            | "/ready"
            | "/metrics"
            | "/admin/clusters"
            | "/admin/mqtt"
            | "/admin/config"
            | "/admin/reload"
            | "/admin/process"
            | "/admin/upgrade"
            | "/admin/listeners"
            | "/admin/errors"
            | "/admin/functions"
            | "/admin/overview"
            | "/admin/series"
            | "/admin/reloads"
            | "/admin/events"
            | "/admin/endpoints/drain"
            | "/admin/endpoints/enable",
        ) => reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n"),
        _ if assets::find(&path).is_some() => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n")
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try / (the dashboard), /metrics, /health, /ready, /admin/clusters, /admin/listeners, \
             /admin/errors, /admin/overview, /admin/series, /admin/events, /admin/reloads, /admin/functions, \
             /admin/mqtt, /admin/config, /admin/reload, /admin/process, POST /admin/reload, POST /admin/upgrade, \
             POST /admin/endpoints/drain, POST /admin/endpoints/enable\n",
        ),
    }
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
