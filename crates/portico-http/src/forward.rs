//! The upstream phase for HTTP/1 upstreams, one loop for every client protocol: pick an endpoint within the
//! balancer and breaker, exchange the request (pooled or pipelined), observe the result for outlier
//! detection, and retry what may be retried within the retry budget. It ends with a response head and the
//! source of its body, which the client's protocol delivers, or with the failure to answer.

use crate::balancer::{NoPick, PickInput};
use crate::body::{Downstream, ReqBody};
use crate::codec::{RequestHead, ResponseHead};
use crate::context::WorkerCtx;
use crate::pipeline;
use crate::retry::{backoff, may_retry, RetryGauge};
use crate::snapshot::{Cluster, Endpoint, ListenerSettings};
use crate::upstream::{self, Failed, Fault, Observed, Source, UpstreamFailure};
use bytes::Bytes;
use portico_core::stats::{class_index, slot};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// An upstream's answer, with what must live until its body has been delivered.
pub(crate) struct Answered<'s> {
    pub source: Source,
    pub resp: (Bytes, ResponseHead),
    pub endpoint: &'s Endpoint,
    /// Its position in the cluster.
    pub index: usize,
    /// The balancer wants a sticky cookie set.
    pub set_cookie: bool,
    /// When the try that answered started.
    pub started: Instant,
    /// The request's retries, in flight until this is dropped.
    pub retrying: RetryGauge<'s>,
    /// The endpoint's in-flight count, until this is dropped.
    pub inflight: InflightGuard<'s>,
}

/// No answer to deliver: what the client is told instead.
pub(crate) struct NotAnswered {
    pub status: u16,
    pub reason: &'static str,
    /// The client left (nothing to answer).
    pub client_gone: bool,
    pub upstream: Option<SocketAddr>,
    pub upstream_time: Option<Duration>,
    pub retries: u32,
}

/// Forwards `head` (with `body`) to `cluster` until an endpoint answers or no try is left.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward<'s>(
    down: &mut Downstream<'_>,
    head: &RequestHead,
    body: &mut ReqBody,
    cluster: &'s Cluster,
    client_ip: IpAddr,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
) -> Result<Answered<'s>, NotAnswered> {
    let counters = slot(&cluster.stats.slots, ctx.index);
    let input = PickInput { req: head, client_ip, worker: ctx.index };
    let policy = &cluster.settings.retries;
    let idempotent = head.is_idempotent();
    let mut tried: Vec<usize> = Vec::new();
    let mut fresh_only = false;
    let mut retrying = RetryGauge::new(counters);
    let mut last = UpstreamFailure::upstream(502, "no upstream endpoint could be reached");
    let mut last_upstream = None;
    let not_answered = |f: UpstreamFailure, upstream, upstream_time, retries| NotAnswered {
        status: f.status,
        reason: f.reason,
        client_gone: f.fault == Fault::ClientGone,
        upstream,
        upstream_time,
        retries,
    };
    loop {
        let pick = match cluster.balancer.pick(&cluster.endpoints, &input, &tried, cluster.settings.panic_mode) {
            Ok(p) => p,
            // After a failed try, report that failure rather than the ejection it may have caused.
            Err(NoPick::NoneHealthy) if tried.is_empty() => {
                counters.no_healthy_endpoint.inc();
                last = UpstreamFailure::breaker("no healthy upstream endpoint");
                break;
            }
            Err(_) => break,
        };
        let endpoint: &'s Endpoint = &cluster.endpoints[pick.index];
        last_upstream = Some(endpoint.addr);
        let attempt_started = Instant::now();
        endpoint.begin(ctx.index);
        let inflight = InflightGuard { endpoint, worker: ctx.index };
        let exchanged = if !fresh_only && pipeline::eligible(head, cluster) {
            pipeline::exchange(down, ctx.conns(), cluster, endpoint, head).await
        } else {
            upstream::exchange(down, &ctx.pool, ctx.index, cluster, endpoint, fresh_only, head, body, settings).await
        };
        let replayable = body.replayable();
        let endpoint_slot = slot(&endpoint.stats.slots, ctx.index);
        let (source, resp) = match exchanged {
            Ok(exchanged) => exchanged,
            Err(Failed { failure, connected: false, .. }) => {
                if failure.fault != Fault::Upstream {
                    // The breaker refused a new connection: after a failed try, report that failure instead.
                    if tried.is_empty() {
                        last = failure;
                    }
                    break;
                }
                last = failure;
                upstream::observe(cluster, endpoint, ctx.index, Observed::GatewayFailure);
                tried.push(pick.index);
                // Nothing reached the upstream: any request may go to another endpoint.
                if another_endpoint(cluster, &tried) && may_retry(retrying.count(), policy, counters) {
                    retrying.add();
                    continue;
                }
                break;
            }
            Err(Failed { failure: f, .. }) if f.fault == Fault::ClientGone => {
                return Err(not_answered(f, None, None, retrying.count()));
            }
            Err(Failed { failure: f, reused: true, batch_lost, .. }) if f.retry_fresh && replayable => {
                // A pooled connection the upstream had closed, or a pipelined batch that lost its connection:
                // replay on a fresh one (same endpoint allowed). The first is a race the request never
                // reached the upstream in; the second may have reached it, so it counts as a retry (outside
                // `attempts` and the budget: refusing it would turn one broken batch into many errors).
                if batch_lost {
                    retrying.add();
                }
                fresh_only = true;
                last = f;
                continue;
            }
            Err(Failed { failure: f, .. }) => {
                if f.fault == Fault::Upstream {
                    upstream::observe(cluster, endpoint, ctx.index, Observed::GatewayFailure);
                    endpoint_slot.by_class[4].inc();
                    endpoint_slot.duration.observe(attempt_started.elapsed());
                    tried.push(pick.index);
                    let timeout_retry = f.timed_out && policy.on_timeout;
                    if timeout_retry
                        && idempotent
                        && replayable
                        && another_endpoint(cluster, &tried)
                        && may_retry(retrying.count(), policy, counters)
                    {
                        retrying.add();
                        backoff(policy, retrying.count()).await;
                        continue;
                    }
                }
                let elapsed = Some(attempt_started.elapsed());
                return Err(not_answered(f, Some(endpoint.addr), elapsed, retrying.count()));
            }
        };
        let status = resp.1.status;
        let observed = if status >= 500 { Observed::ServerError } else { Observed::Success };
        upstream::observe(cluster, endpoint, ctx.index, observed);
        let retry_on_status = status != 101 && policy.on_status.contains(&status) && idempotent && replayable;
        if retry_on_status {
            tried.push(pick.index);
        }
        if retry_on_status && another_endpoint(cluster, &tried) && may_retry(retrying.count(), policy, counters) {
            // Drop this response (and its connection) and try another endpoint. Without one left, the
            // response is passed on as it is.
            endpoint_slot.by_class[class_index(status)].inc();
            retrying.add();
            if let Source::Conn(conn) = source {
                pipeline::discard(ctx.conns(), cluster, endpoint, conn, &resp.1);
            }
            backoff(policy, retrying.count()).await;
            continue;
        }
        return Ok(Answered {
            source,
            resp,
            endpoint,
            index: pick.index,
            set_cookie: pick.set_cookie,
            started: attempt_started,
            retrying,
            inflight,
        });
    }
    Err(not_answered(last, last_upstream, None, retrying.count()))
}

pub(crate) struct InflightGuard<'a> {
    pub endpoint: &'a Endpoint,
    pub worker: usize,
}

impl InflightGuard<'_> {
    /// Leaves the endpoint's in-flight count up: a holder that outlives this borrow calls `Endpoint::end`.
    pub fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.endpoint.end(self.worker);
    }
}

/// Whether some endpoint is left to retry on.
pub(crate) fn another_endpoint(cluster: &Cluster, tried: &[usize]) -> bool {
    cluster.balancer.has_candidate(&cluster.endpoints, tried, cluster.settings.panic_mode)
}
