//! Real HTTP backends on loopback, for `portico demo`, the end-to-end tests and the benchmarks. Built on hyper
//! (a server independent of Portico's own codec) so that a test never checks Portico against itself.
//!
//! Paths a backend answers:
//! - `/echo`: JSON with the backend name, method, target, headers, body length and xxh3 hash of the body
//! - `/bytes/N` (`?chunked`): N bytes of a fixed pattern, with Content-Length or chunked
//! - `/upload`: reads the body as it streams, answers `LEN HASH`
//! - `/slow/MS`: waits MS milliseconds before answering
//! - `/status/CODE`: answers with that status
//! - `/redirect/CODE?to=TARGET`: answers with that status and `Location: TARGET` (the rest of the query)
//! - `/health`: `200 healthy`, or the status set with `set_health_status`
//! - `/ws`: a WebSocket echo: accepts the handshake (RFC 6455) and sends every text and binary message back
//! - anything else: `hello from NAME`
//!
//! `set_status` makes every path but `/health` answer with one status (a failing backend).
//!
//! Every response carries `x-backend: NAME`.

pub mod raw;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The byte pattern of `/bytes/N`: byte i is `PATTERN[i % len]`.
pub const PATTERN: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_\n";

#[derive(Default)]
struct Counters {
    accepted: AtomicUsize,
    requests: AtomicUsize,
    /// When non-zero, every request except `/health` is answered with this status.
    forced_status: AtomicU16,
    /// When non-zero, `/health` is answered with this status (else 200 `healthy`).
    health_status: AtomicU16,
    /// TLS handshakes that failed (HTTPS backends only).
    tls_failures: AtomicUsize,
}

/// A running backend; stops (closing its listener and connections) when dropped or stopped.
pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    /// Starts a backend on an ephemeral loopback port.
    pub fn start(name: &str) -> std::io::Result<Backend> {
        Backend::start_on("127.0.0.1:0".parse().expect("literal address"), name)
    }

    pub fn start_on(addr: SocketAddr, name: &str) -> std::io::Result<Backend> {
        Backend::launch(addr, name, None, false)
    }

    /// A backend that speaks HTTP/2 only (prior knowledge), like a gRPC server.
    pub fn start_h2(name: &str) -> std::io::Result<Backend> {
        Backend::launch("127.0.0.1:0".parse().expect("literal address"), name, None, true)
    }

    /// A backend that speaks HTTPS with the certificate chain and key in these PEM files; with `client_ca`, it
    /// requires client certificates signed by that CA.
    pub fn start_tls(name: &str, cert: &Path, key: &Path, client_ca: Option<&Path>) -> std::io::Result<Backend> {
        let acceptor = tls_acceptor(cert, key, client_ca, false).map_err(std::io::Error::other)?;
        Backend::launch("127.0.0.1:0".parse().expect("literal address"), name, Some(acceptor), false)
    }

    /// An HTTPS backend that speaks HTTP/2 only (ALPN `h2`).
    pub fn start_tls_h2(name: &str, cert: &Path, key: &Path) -> std::io::Result<Backend> {
        let acceptor = tls_acceptor(cert, key, None, true).map_err(std::io::Error::other)?;
        Backend::launch("127.0.0.1:0".parse().expect("literal address"), name, Some(acceptor), true)
    }

    fn launch(
        addr: SocketAddr,
        name: &str,
        tls: Option<tokio_rustls::TlsAcceptor>,
        h2: bool,
    ) -> std::io::Result<Backend> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (c, n) = (counters.clone(), name.to_string());
        let thread = std::thread::Builder::new().name(format!("backend-{name}")).spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
            let Ok(rt) = rt else { return };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                tokio::select! {
                    _ = serve(listener, Arc::from(n.as_str()), c, tls, h2) => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime cancels every connection task: their sockets close.
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(Backend { addr, name: name.to_string(), counters, stop: Some(stop_tx), thread: Some(thread) })
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (a client without an acceptable certificate, for example).
    pub fn tls_failures(&self) -> usize {
        self.counters.tls_failures.load(Ordering::SeqCst)
    }

    /// Requests answered (or being answered) so far.
    pub fn requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Answers every request (but `/health`) with `status` from now on; 0 restores normal answers.
    pub fn set_status(&self, status: u16) {
        self.counters.forced_status.store(status, Ordering::SeqCst);
    }

    /// Answers `/health` with `status` from now on; 0 restores `200 healthy`.
    pub fn set_health_status(&self, status: u16) {
        self.counters.health_status.store(status, Ordering::SeqCst);
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    name: Arc<str>,
    counters: Arc<Counters>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    h2: bool,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        counters.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = stream.set_nodelay(true);
        let (name, counters) = (name.clone(), counters.clone());
        if let Some(acceptor) = tls.clone() {
            let c = counters.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    c.tls_failures.fetch_add(1, Ordering::SeqCst);
                    return;
                };
                serve_one(hyper_util::rt::TokioIo::new(stream), name, counters, h2).await;
            });
            continue;
        }
        tokio::spawn(serve_one(hyper_util::rt::TokioIo::new(stream), name, counters, h2));
    }
}

async fn serve_one<I>(io: I, name: Arc<str>, counters: Arc<Counters>, h2: bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        counters.requests.fetch_add(1, Ordering::SeqCst);
        let forced = (counters.forced_status.load(Ordering::SeqCst), counters.health_status.load(Ordering::SeqCst));
        handle(req, name.clone(), forced)
    });
    if h2 {
        let builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        let _ = builder.serve_connection(io, svc).await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).with_upgrades().await;
    }
}

fn tls_acceptor(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    h2: bool,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| e.to_string())?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
                roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

type AnyBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(text: impl Into<Bytes>) -> AnyBody {
    Full::new(text.into()).boxed()
}

async fn handle(
    req: Request<Incoming>,
    name: Arc<str>,
    (forced, health): (u16, u16),
) -> Result<Response<AnyBody>, Infallible> {
    let path = req.uri().path().to_string();
    let status_reply = |code: u16, text: String| {
        let mut r = Response::new(full(text));
        *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        if let Ok(v) = hyper::header::HeaderValue::from_str(&name) {
            r.headers_mut().insert("x-backend", v);
        }
        Ok(r)
    };
    if path == "/health" {
        let code = if health == 0 { 200 } else { health };
        return status_reply(code, if code < 400 { "healthy\n".into() } else { "unhealthy\n".into() });
    }
    if forced != 0 {
        let _ = consume(req.into_body()).await;
        return status_reply(forced, format!("forced {forced} from {name}\n"));
    }
    if path == "/ws" {
        return Ok(websocket_echo(req, &name));
    }
    let query = req.uri().query().unwrap_or("").to_string();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let first = parts.next().unwrap_or("");
    let arg = parts.next().unwrap_or("");
    let response = match first {
        "echo" => {
            let method = req.method().to_string();
            let target = req.uri().to_string();
            let version = format!("{:?}", req.version());
            let headers: Vec<(String, String)> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            let (len, hash) = consume(req.into_body()).await;
            let json = serde_json::json!({
                "backend": &*name, "method": method, "target": target, "version": version,
                "headers": headers, "body_len": len, "body_hash": format!("{hash:016x}"),
            });
            Response::new(full(json.to_string()))
        }
        "bytes" => {
            let n: u64 = arg.parse().unwrap_or(0);
            Response::new(PatternBody { left: n, exact: !query.contains("chunked"), offset: 0 }.boxed())
        }
        "upload" => {
            let (len, hash) = consume(req.into_body()).await;
            Response::new(full(format!("{len} {hash:016x}")))
        }
        "slow" => {
            tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(1000))).await;
            Response::new(full(format!("slow hello from {name}\n")))
        }
        "status" => {
            let code = arg.parse().ok().and_then(|c| hyper::StatusCode::from_u16(c).ok());
            let mut r = Response::new(full(format!("status from {name}\n")));
            *r.status_mut() = code.unwrap_or(hyper::StatusCode::BAD_REQUEST);
            r
        }
        "redirect" => {
            let code = arg.parse().ok().and_then(|c| hyper::StatusCode::from_u16(c).ok());
            let mut r = Response::new(full(format!("redirect from {name}\n")));
            *r.status_mut() = code.unwrap_or(hyper::StatusCode::BAD_REQUEST);
            if let Some(Ok(location)) = query.strip_prefix("to=").map(hyper::header::HeaderValue::from_str) {
                r.headers_mut().insert(hyper::header::LOCATION, location);
            }
            r
        }
        _ => Response::new(full(format!("hello from {name}\n"))),
    };
    let mut response = response;
    if let Ok(v) = hyper::header::HeaderValue::from_str(&name) {
        response.headers_mut().insert("x-backend", v);
    }
    Ok(response)
}

/// Accepts a WebSocket handshake and echoes messages on the upgraded connection until the client closes.
fn websocket_echo(mut req: Request<Incoming>, name: &str) -> Response<AnyBody> {
    use futures_util::{SinkExt, StreamExt};
    let key = req.headers().get("sec-websocket-key").map(|k| k.as_bytes().to_vec());
    let upgrade = req.headers().get("upgrade").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let (Some(key), true) = (key, upgrade) else {
        let mut r = Response::new(full("not a WebSocket handshake\n"));
        *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
        return r;
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let io = hyper_util::rt::TokioIo::new(upgraded);
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            io,
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                break;
            }
        }
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    let headers = r.headers_mut();
    headers.insert("upgrade", hyper::header::HeaderValue::from_static("websocket"));
    headers.insert("connection", hyper::header::HeaderValue::from_static("upgrade"));
    if let Ok(v) = hyper::header::HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", v);
    }
    if let Ok(v) = hyper::header::HeaderValue::from_str(name) {
        headers.insert("x-backend", v);
    }
    r
}

/// Reads a body to its end: its length and xxh3 hash.
async fn consume(mut body: Incoming) -> (u64, u64) {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(data) = frame.data_ref() {
            len += data.len() as u64;
            hasher.update(data);
        }
    }
    (len, hasher.digest())
}

/// The xxh3 hash `/echo` and `/upload` report for `data`.
pub fn body_hash(data: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(data))
}

/// `n` bytes of `PATTERN`, produced as they are sent.
struct PatternBody {
    left: u64,
    exact: bool,
    offset: usize,
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(64 * 1024) as usize;
        let mut chunk = Vec::with_capacity(n);
        while chunk.len() < n {
            let start = self.offset % PATTERN.len();
            let take = (PATTERN.len() - start).min(n - chunk.len());
            chunk.extend_from_slice(&PATTERN[start..start + take]);
            self.offset += take;
        }
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        if self.exact {
            hyper::body::SizeHint::with_exact(self.left)
        } else {
            hyper::body::SizeHint::default()
        }
    }
}
