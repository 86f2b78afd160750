//! A handler's own requests to the configuration's clusters (a JavaScript function's `fetch("http://api/...")`):
//! sent through the same pick-and-retry loop as proxied requests, so they get the cluster's pools, balancer,
//! health, outlier detection, breaker, retries and timeouts, and are counted in its metrics. The request's
//! body is in hand (it can be retried); the response's body is read whole, up to the caller's limit.

use crate::body::{BodySource, ClientFacts, Downstream, IpText, ReqBody};
use crate::codec::{self, BodyFraming, Parsed};
use crate::context::WorkerCtx;
use crate::forward::Answered;
use crate::handler::{SubRequest, SubResponse, SubrequestError, SubrequestFuture, Subrequests, Upstreams};
use crate::outcome::Next;
use crate::snapshot::{ListenerSettings, Snapshot};
use crate::source_body::{SourceBody, SourceEnd};
use crate::stats::GaugeGuard;
use crate::upstream::Source;
use bytes::BytesMut;
use http_body_util::BodyExt;
use portico_core::stats::slot;
use std::cell::Cell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;

/// What a handler sends its requests through (`handler::Upstreams`): this worker's view of the clusters of the
/// configuration its request arrived under.
pub struct Clusters {
    ctx: Rc<WorkerCtx>,
    snapshot: Arc<Snapshot>,
    /// The listener the handler's request came in on (its timeouts apply).
    listener: usize,
    /// Who the handler's request came from: the subrequest's `x-forwarded-for`.
    client: IpAddr,
}

impl Clusters {
    /// The handle a handler gets (`handler::Upstreams`).
    pub(crate) fn upstreams(ctx: Rc<WorkerCtx>, snapshot: Arc<Snapshot>, listener: &str, client: IpAddr) -> Upstreams {
        let listener = snapshot.listeners.iter().position(|l| l.name == listener).unwrap_or(0);
        Rc::new(Clusters { ctx, snapshot, listener, client })
    }
}

impl Subrequests for Clusters {
    fn cluster_for(&self, https: bool, host: &str, port: u16) -> Option<String> {
        self.find_cluster(https, host, port).map(str::to_string)
    }

    fn send<'a>(&'a self, cluster: &'a str, request: SubRequest, max_body: usize) -> SubrequestFuture<'a> {
        Box::pin(self.send_to(cluster, request, max_body))
    }
}

impl Clusters {
    /// The cluster a URL reaches: the one its host names (`http://api/...`), else one with an endpoint at its
    /// origin (`https://api.example.com/...` reaches a cluster whose endpoint is `https://api.example.com:443`):
    /// what the configuration lists is what handlers may reach.
    fn find_cluster(&self, https: bool, host: &str, port: u16) -> Option<&str> {
        let clusters = &self.snapshot.clusters;
        if let Some(c) = clusters.iter().find(|c| c.name == host) {
            return Some(&c.name);
        }
        let authority = format!("{host}:{port}");
        let at_origin = |e: &std::sync::Arc<crate::snapshot::Endpoint>| {
            e.tls.is_some() == https && e.authority.eq_ignore_ascii_case(&authority)
        };
        clusters.iter().find(|c| c.endpoints.iter().any(at_origin)).map(|c| c.name.as_str())
    }

    /// Sends `request` to cluster `name` and reads its answer, whose body may be at most `max_body` bytes.
    async fn send_to(&self, name: &str, request: SubRequest, max_body: usize) -> Result<SubResponse, SubrequestError> {
        let snapshot = &self.snapshot;
        let cluster = snapshot
            .clusters
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| SubrequestError::UnknownCluster(name.to_string()))?;
        if cluster.settings.http2 {
            return Err(SubrequestError::Http2Cluster(name.to_string()));
        }
        let settings = snapshot.listeners.get(self.listener).ok_or(SubrequestError::Invalid("no listener"))?;
        let head = head_of(&request, settings)?;
        let ctx = &*self.ctx;
        let counters = slot(&cluster.stats.slots, ctx.index);
        let upstream_failure = |status, reason| SubrequestError::Upstream { cluster: name.to_string(), status, reason };
        if counters.requests.get() >= cluster.settings.max_requests_per_worker {
            counters.breaker_rejections.inc();
            return Err(upstream_failure(503, "too many requests in flight to the cluster (circuit breaker)"));
        }
        counters.requests.add(1);
        let _in_flight = GaugeGuard(&counters.requests, 1);
        let facts = ClientFacts {
            ip: IpText::new(self.client),
            https: false,
            http2: false,
            cert_header: None,
            cert_subject: None,
        };
        let mut out = Vec::new();
        let mut down = Downstream { facts: &facts, out: &mut out, body: BodySource::Detached };
        let mut body = ReqBody::InHand(request.body);
        let forwarded =
            crate::forward::forward_http1(&mut down, &head, &mut body, cluster, self.client, settings, ctx, None).await;
        let Answered { answer: (mut source, (resp_bytes, resp)), endpoint, inflight, started, .. } =
            forwarded.map_err(|failed| upstream_failure(failed.status, failed.reason))?;
        let mut headers = Vec::with_capacity(resp.headers.len());
        for h in &resp.headers {
            let field = h.name.get(&resp_bytes);
            let hop_by_hop = matches!(codec::classify(field), codec::Known::HopByHop)
                || (!resp.connection.is_empty() && resp.named_by_connection(&resp_bytes, field));
            if !hop_by_hop {
                let value = String::from_utf8_lossy(h.value.get(&resp_bytes)).into_owned();
                headers.push((String::from_utf8_lossy(field).to_ascii_lowercase(), value));
            }
        }
        let framing = if request.method.eq_ignore_ascii_case("HEAD") { BodyFraming::None } else { resp.body };
        let end = Cell::new(SourceEnd::Running);
        let read = {
            let mut reader = SourceBody::new(&mut source, framing, cluster.settings.read_timeout, &end);
            let mut collected = BytesMut::new();
            loop {
                match reader.frame().await {
                    None => break Ok(collected.freeze()),
                    Some(Err(e)) => break Err(SubrequestError::Body(e.to_string())),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if collected.len() + data.len() > max_body {
                                break Err(SubrequestError::TooLarge(max_body));
                            }
                            collected.extend_from_slice(&data);
                        }
                    }
                }
            }
        };
        match end.get() {
            SourceEnd::Complete => {
                if let Source::Conn(conn) = source {
                    if resp.reusable && conn.buf.is_empty() {
                        crate::pipeline::release(&ctx.pool, None, cluster, endpoint, conn, false);
                    }
                }
            }
            SourceEnd::Failed => {
                crate::upstream::observe(cluster, endpoint, ctx.index, crate::upstream::Observed::GatewayFailure);
            }
            SourceEnd::Running => {}
        }
        drop(inflight);
        // Counted for the endpoint as a proxied request's try is.
        let _ = crate::outcome::upstream_outcome(endpoint, ctx.index, (Next::Close, resp.status, 0), started, 0);
        Ok(SubResponse { status: resp.status, headers, body: read? })
    }
}

/// The request as Portico's own HTTP/1.1 head, parsed as a client's would be: the same character rules and
/// limits, so a handler cannot send what a client could not.
fn head_of(request: &SubRequest, settings: &ListenerSettings) -> Result<codec::RequestHead, SubrequestError> {
    let mut raw = Vec::with_capacity(128 + request.target.len());
    raw.extend_from_slice(request.method.as_bytes());
    raw.push(b' ');
    raw.extend_from_slice(request.target.as_bytes());
    raw.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    raw.extend_from_slice(request.host.as_bytes());
    raw.extend_from_slice(b"\r\n");
    for (name, value) in &request.headers {
        let kind = codec::classify(name.as_bytes());
        if matches!(kind, codec::Known::HopByHop | codec::Known::ContentLength | codec::Known::Host)
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            continue;
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n') {
            return Err(SubrequestError::Invalid("a header value with a line break"));
        }
        raw.extend_from_slice(name.as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value.as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    if !request.body.is_empty() || !matches!(request.method.as_str(), "GET" | "HEAD" | "DELETE" | "OPTIONS") {
        raw.extend_from_slice(b"content-length: ");
        raw.extend_from_slice(request.body.len().to_string().as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    let mut buf = BytesMut::from(&raw[..]);
    match codec::parse_request(&buf, &settings.limits) {
        Ok(Parsed::Complete(head, used)) => Ok(codec::take_request(&mut buf, head, used)),
        Ok(Parsed::Partial) => Err(SubrequestError::Invalid("an incomplete request head")),
        Err(e) => Err(SubrequestError::Invalid(e.reason)),
    }
}
