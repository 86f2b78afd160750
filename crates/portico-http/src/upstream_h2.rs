//! HTTP/2 to upstreams (`protocol: h2`): hyper's HTTP/2 client over TLS (ALPN `h2`) or plain TCP (prior
//! knowledge). Each worker keeps one multiplexed connection per endpoint and sends every request to that
//! endpoint on it; one that closes is replaced by the next request. Bodies and trailers pass through as
//! frames, so gRPC works end to end, streaming both ways.

use crate::body::ClientFacts;
use crate::codec::{Known, RequestHead};
use crate::exec::LocalExec;
use crate::pool::{key, PoolKey};
use crate::snapshot::{Cluster, Endpoint};
use crate::upstream::UpstreamFailure;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use portico_core::io::Stream;
use portico_core::stats::slot;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A request body on its way upstream.
pub(crate) type UpBody = UnsyncBoxBody<Bytes, BoxError>;

/// A worker's HTTP/2 connections, one per endpoint.
#[derive(Default)]
pub struct H2Pool {
    conns: crate::pool::KeyMap<Slot>,
}

enum Slot {
    Open(SendRequest<UpBody>),
    /// A request is opening the connection; the others wait for it rather than open their own.
    Opening(Rc<Notify>),
}

/// The worker's connection to `endpoint`, opened when there is none (or it closed). Requests that arrive
/// while it is being opened wait for that one connection. `fresh`: the current connection refused a stream it
/// did not process (GOAWAY, REFUSED_STREAM): a new one is opened.
pub(crate) async fn sender(
    h2: &RefCell<H2Pool>,
    worker: usize,
    cluster: &Cluster,
    endpoint: &Endpoint,
    fresh: bool,
) -> Result<SendRequest<UpBody>, UpstreamFailure> {
    if fresh {
        forget(h2, endpoint);
    }
    let key = key(endpoint);
    loop {
        let waiting = match h2.borrow().conns.get(&key) {
            Some(Slot::Open(sender)) if !sender.is_closed() => return Ok(sender.clone()),
            Some(Slot::Opening(done)) => Some(done.clone()),
            _ => None,
        };
        if let Some(done) = waiting {
            // Registered before anything can notify it (single thread: nothing runs in between).
            done.notified().await;
            if h2.borrow().conns.contains_key(&key) {
                continue;
            }
            // The attempt failed: this request tries for itself.
        }
        let done = Rc::new(Notify::new());
        h2.borrow_mut().conns.insert(key, Slot::Opening(done.clone()));
        // Whatever happens to this attempt (failure, or the request being dropped), the waiters are woken.
        let opening = Opening { h2, key, done };
        let opened = connect(worker, cluster, endpoint).await;
        let mut pool = h2.borrow_mut();
        match &opened {
            Ok(sender) => pool.conns.insert(key, Slot::Open(sender.clone())),
            Err(_) => pool.conns.remove(&key),
        };
        drop(pool);
        drop(opening);
        return opened;
    }
}

/// Wakes the requests waiting for a connection; if the attempt never finished, clears it first.
struct Opening<'a> {
    h2: &'a RefCell<H2Pool>,
    key: PoolKey,
    done: Rc<Notify>,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.h2.try_borrow_mut() {
            if matches!(pool.conns.get(&self.key), Some(Slot::Opening(d)) if Rc::ptr_eq(d, &self.done)) {
                pool.conns.remove(&self.key);
            }
        }
        self.done.notify_waiters();
    }
}

/// Why one try got no response.
pub(crate) enum Unsent {
    /// The upstream did not process the stream: it may be sent again.
    NotProcessed,
    Failed(UpstreamFailure),
}

/// Whether `e` says the upstream did not process the stream: reset with REFUSED_STREAM, or left above the last
/// stream of a GOAWAY it sent.
fn not_processed(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM) || (h2.is_go_away() && h2.is_remote());
        }
        source = s.source();
    }
    false
}

/// Drops the worker's connection to `endpoint`, so the next request opens a new one.
fn forget(h2: &RefCell<H2Pool>, endpoint: &Endpoint) {
    let mut pool = h2.borrow_mut();
    if let Some(Slot::Open(_)) = pool.conns.get(&key(endpoint)) {
        pool.conns.remove(&key(endpoint));
    }
}

/// Sends `req` and waits for the response head: within `response_header_timeout` from the moment the request
/// body has been sent (`sent` is notified then; without it, or for a request without a body, from now).
pub(crate) async fn send(
    mut sender: SendRequest<UpBody>,
    req: Request<UpBody>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    sent: Option<&tokio::sync::Notify>,
) -> Result<Response<Incoming>, Unsent> {
    let wait_for_body = if req.body().is_end_stream() { None } else { sent };
    let exchange = async {
        // Waits while the connection has as many streams open as the upstream allows.
        sender.ready().await?;
        sender.send_request(req).await
    };
    let limit = cluster.settings.response_header_timeout;
    let timer = async {
        if let Some(sent) = wait_for_body {
            sent.notified().await;
        }
        tokio::time::sleep(limit).await;
    };
    tokio::select! {
        r = exchange => match r {
            Ok(resp) => Ok(resp),
            Err(e) if not_processed(&e) => Err(Unsent::NotProcessed),
            // The request itself could not be sent (its body broke off, a field HTTP/2 refuses): not the
            // upstream's fault.
            Err(e) if e.is_user() => {
                Err(Unsent::Failed(UpstreamFailure::client(400, "the request could not be sent upstream")))
            }
            Err(e) => {
                tracing::debug!(endpoint = %endpoint.configured, "HTTP/2 upstream request failed: {e}");
                Err(Unsent::Failed(UpstreamFailure::upstream(502, "upstream HTTP/2 request failed")))
            }
        },
        _ = timer => Err(Unsent::Failed(UpstreamFailure {
            timed_out: true,
            ..UpstreamFailure::upstream(504, "upstream timed out before responding")
        })),
    }
}

/// Opens an HTTP/2 connection within the cluster's connection limit and connect timeout.
async fn connect(
    worker: usize,
    cluster: &Cluster,
    endpoint: &Endpoint,
) -> Result<SendRequest<UpBody>, UpstreamFailure> {
    let counters = slot(&cluster.stats.slots, worker);
    if counters.connections.get() >= cluster.settings.max_connections_per_worker {
        counters.breaker_rejections.inc();
        return Err(UpstreamFailure::breaker("upstream connection limit reached (circuit breaker)"));
    }
    let deadline = Instant::now() + cluster.settings.connect_timeout;
    let stream = crate::upstream::open(endpoint, deadline).await?;
    if let Stream::UpstreamTls(tls) = &stream {
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(UpstreamFailure::upstream(502, "upstream did not agree to HTTP/2 (ALPN)"));
        }
    }
    let mut builder = hyper::client::conn::http2::Builder::new(LocalExec);
    builder.timer(TokioTimer::new()).keep_alive_interval(Duration::from_secs(30)).keep_alive_while_idle(true);
    let handshake = tokio::time::timeout_at(deadline, builder.handshake(TokioIo::new(stream)));
    let (sender, conn) = match handshake.await {
        Ok(Ok(pair)) => pair,
        Ok(Err(_)) => return Err(UpstreamFailure::upstream(502, "upstream HTTP/2 handshake failed")),
        Err(_) => {
            return Err(UpstreamFailure {
                timed_out: true,
                ..UpstreamFailure::upstream(504, "upstream connect timed out")
            })
        }
    };
    if let Some(s) = endpoint.stats.slots.get(worker) {
        s.0.connections_opened.inc();
    }
    counters.connections.add(1);
    let gauge = cluster.stats.clone();
    tokio::task::spawn_local(async move {
        let _ = conn.await;
        slot(&gauge.slots, worker).connections.add(-1);
    });
    Ok(sender)
}

/// Turns a client's request into the upstream request: target and `:authority` for the endpoint (or the
/// client's host with `preserve_host`), hop-by-hop fields dropped, the `x-forwarded-*` fields and `via` set.
pub(crate) fn prepare(
    parts: &mut hyper::http::request::Parts,
    head: &RequestHead,
    cluster: &Cluster,
    endpoint: &Endpoint,
    client: &ClientFacts,
) -> Result<(), &'static str> {
    let edits = head.edits.as_ref().map(|e| &e.headers).filter(|e| !e.is_empty());
    let authority = match (head.host(), edits.and_then(|e| e.appended_value("host"))) {
        (_, Some(set)) => set.to_string(),
        (Some(h), None) if cluster.settings.preserve_host => String::from_utf8_lossy(h).into_owned(),
        _ => endpoint.authority.clone(),
    };
    let scheme = if endpoint.tls.is_some() { "https" } else { "http" };
    let mut target = format!("{scheme}://{authority}");
    // HTTP/1 targets may hold bytes a URI may not (`"`, `<`, `{`...), which most servers accept; HTTP/2 goes by
    // the URI grammar, so those are percent-encoded rather than refused.
    for &b in head.origin_form() {
        if b.is_ascii_graphic() && !matches!(b, b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}') {
            target.push(b as char);
        } else {
            target.push_str(&format!("%{b:02X}"));
        }
    }
    parts.uri = target.parse::<Uri>().map_err(|_| "the request target cannot be sent over HTTP/2")?;
    parts.version = hyper::Version::HTTP_2;

    let headers = &mut parts.headers;
    let forwarded_for: Vec<HeaderValue> = headers.get_all("x-forwarded-for").iter().cloned().collect();
    let via: Vec<HeaderValue> = headers.get_all(header::VIA).iter().cloned().collect();
    let te_trailers = headers.get_all(header::TE).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    // Drop what the client sent under names Portico owns or that do not cross a hop.
    let names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in names {
        let kind = crate::codec::classify(name.as_str().as_bytes());
        let reserved = cluster
            .settings
            .reserved_headers
            .iter()
            .any(|r| crate::message::same_header_name(name.as_str().as_bytes(), r.as_bytes()));
        if reserved || !matches!(kind, Known::Other | Known::Cookie | Known::ContentLength) {
            headers.remove(&name);
        }
    }
    for name in head.connection.iter().flat_map(|c| c.get(&head.buf).split(|&b| b == b',')) {
        if let Ok(name) = HeaderName::from_bytes(crate::codec::trim(name)) {
            headers.remove(name);
        }
    }
    if te_trailers {
        // The one TE value HTTP/2 allows, and gRPC needs.
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    let mut chain = forwarded_for.iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ");
    if !chain.is_empty() {
        chain.push_str(", ");
    }
    chain.push_str(&String::from_utf8_lossy(client.ip.as_bytes()));
    if let Ok(v) = HeaderValue::from_str(&chain) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(if client.https { "https" } else { "http" }));
    if let Some(host) = head.host().and_then(|h| HeaderValue::from_bytes(h).ok()) {
        headers.insert("x-forwarded-host", host);
    }
    let mut via_chain = via.iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ");
    if !via_chain.is_empty() {
        via_chain.push_str(", ");
    }
    via_chain.push_str(if client.http2 {
        "2 portico"
    } else if head.http10 {
        "1.0 portico"
    } else {
        "1.1 portico"
    });
    if let Ok(v) = HeaderValue::from_str(&via_chain) {
        headers.insert(header::VIA, v);
    }
    if let Some(edits) = edits {
        // `host` became the authority above; HTTP/2 has no Host header of its own.
        let mut edits = edits.clone();
        edits.remove("host");
        edits.apply(headers);
    }
    if let (Some(name), Some(subject)) = (&client.cert_header, &client.cert_subject) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(subject)) {
            headers.insert(name, value);
        }
    }
    Ok(())
}
