//! The upstream phase: one pick-and-retry loop for every client protocol and every upstream protocol. It
//! picks an endpoint within the balancer and breaker, makes one try through an `Exchange` (HTTP/1, pooled or
//! pipelined, here; HTTP/2 in `forward_h2`), observes the result for outlier detection, and retries what may
//! be retried within the retry budget. It ends with the upstream's answer, which the client's protocol
//! delivers, or with the failure to answer.

use crate::balancer::{NoPick, Pick, PickInput};
use crate::body::{Downstream, ReqBody};
use crate::codec::{RequestHead, ResponseHead};
use crate::context::WorkerCtx;
use crate::pipeline::{self, ClientPipeline};
use crate::retry::{backoff, may_retry, RetryGauge};
use crate::snapshot::{Cluster, Endpoint, ListenerSettings};
use crate::upstream::{self, Failed, Fault, Observed, Source, UpstreamFailure};
use bytes::Bytes;
use portico_core::stats::{class_index, slot};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// One try of a request on an endpoint, in the upstream's protocol.
pub(crate) trait Exchange<'s> {
    /// A response head with the source of its body.
    type Answer;
    /// Sends the request to `endpoint` and waits for its response head; `fresh_only`: on a new connection.
    async fn exchange(&mut self, endpoint: &'s Endpoint, fresh_only: bool) -> Result<Self::Answer, Failed>;
    fn status(answer: &Self::Answer) -> u16;
    /// The request can be sent again as it was (its body, if any, is still in hand).
    fn replayable(&self) -> bool;
    /// Drops an answer that is not passed on (a retry on its status).
    fn discard(&mut self, _endpoint: &'s Endpoint, _answer: Self::Answer) {}
    /// The endpoint (its index in the cluster) the request was already written to, with the requests its client
    /// pipelined before it: its first try reads the answer there instead of picking one.
    fn written_to(&self) -> Option<usize> {
        None
    }
}

/// An upstream's answer, with what must live until its body has been delivered.
pub(crate) struct Answered<'s, A> {
    pub answer: A,
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

/// An HTTP/1 upstream's answer: the response head (its bytes and the parsed head) and its body's source.
pub(crate) type Http1Answer = (Source, (Bytes, ResponseHead));

/// A request on its way to an HTTP/1 cluster.
pub(crate) struct Http1Exchange<'a, 'd, 's> {
    pub down: &'a mut Downstream<'d>,
    pub head: &'a RequestHead,
    pub body: &'a mut ReqBody,
    pub cluster: &'s Cluster,
    pub settings: &'a ListenerSettings,
    pub ctx: &'a WorkerCtx,
    /// The HTTP/1 client connection's pipelined requests (`pool.pipeline_depth`); none for HTTP/2 clients.
    pub pipeline: Option<&'a mut ClientPipeline>,
}

impl<'s> Exchange<'s> for Http1Exchange<'_, '_, 's> {
    type Answer = Http1Answer;

    async fn exchange(&mut self, endpoint: &'s Endpoint, fresh_only: bool) -> Result<Http1Answer, Failed> {
        let (ctx, cluster, head) = (self.ctx, self.cluster, self.head);
        let (pool, worker) = (&ctx.pool, ctx.index);
        if let Some(pipeline) = self.pipeline.as_deref_mut().filter(|_| !fresh_only) {
            if pipeline.written_to().is_some() {
                return pipeline::take_turn(self.down, pipeline, cluster, head).await;
            }
            // Only a request its client pipelined others behind looks for the endpoint's position.
            let index = match pipeline.is_empty() {
                true => None,
                false => cluster.endpoints.iter().position(|e| std::ptr::eq(&**e, endpoint)),
            };
            if let Some(index) = index {
                let joiners = pipeline.joiners(head, cluster, index, worker);
                if joiners > 0 {
                    let (conns, target) = ((pool, worker), (endpoint, index));
                    return pipeline::lead(self.down, pipeline, joiners, conns, cluster, target, head).await;
                }
            }
        }
        upstream::exchange(self.down, pool, worker, cluster, endpoint, fresh_only, head, self.body, self.settings).await
    }

    fn status(answer: &Http1Answer) -> u16 {
        answer.1 .1.status
    }

    fn replayable(&self) -> bool {
        self.body.replayable()
    }

    fn discard(&mut self, endpoint: &'s Endpoint, (source, resp): Http1Answer) {
        if let Source::Conn(conn) = source {
            let pipeline = self.pipeline.as_deref_mut();
            pipeline::discard(&self.ctx.pool, pipeline, self.cluster, endpoint, conn, &resp.1);
        }
    }

    fn written_to(&self) -> Option<usize> {
        self.pipeline.as_deref().and_then(ClientPipeline::written_to)
    }
}

/// Forwards `head` (with `body`) to the HTTP/1 cluster `cluster`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward_http1<'s>(
    down: &mut Downstream<'_>,
    head: &RequestHead,
    body: &mut ReqBody,
    cluster: &'s Cluster,
    client_ip: IpAddr,
    settings: &ListenerSettings,
    ctx: &WorkerCtx,
    pipeline: Option<&mut ClientPipeline>,
) -> Result<Answered<'s, Http1Answer>, NotAnswered> {
    let mut exchange = Http1Exchange { down, head, body, cluster, settings, ctx, pipeline };
    forward(&mut exchange, head, cluster, client_ip, ctx.index).await
}

/// Sends the request through `exchange` to `cluster` until an endpoint answers or no try is left.
pub(crate) async fn forward<'s, E: Exchange<'s>>(
    exchange: &mut E,
    head: &RequestHead,
    cluster: &'s Cluster,
    client_ip: IpAddr,
    worker: usize,
) -> Result<Answered<'s, E::Answer>, NotAnswered> {
    let counters = slot(&cluster.stats.slots, worker);
    let input = PickInput { req: head, client_ip, worker };
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
        let written_to = exchange.written_to().filter(|&index| index < cluster.endpoints.len());
        let picked = match written_to {
            Some(index) => Ok(Pick { index, set_cookie: false }),
            None => cluster.balancer.pick(&cluster.endpoints, &input, &tried, cluster.settings.panic_mode),
        };
        let pick = match picked {
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
        endpoint.begin(worker);
        let inflight = InflightGuard { endpoint, worker };
        let exchanged = exchange.exchange(endpoint, fresh_only).await;
        let replayable = exchange.replayable();
        let endpoint_slot = slot(&endpoint.stats.slots, worker);
        let answer = match exchanged {
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
                upstream::observe(cluster, endpoint, worker, Observed::GatewayFailure);
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
                // A pooled connection the upstream had closed, or a client's pipelined batch that lost its connection:
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
                    upstream::observe(cluster, endpoint, worker, Observed::GatewayFailure);
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
        let status = E::status(&answer);
        let observed = if status >= 500 { Observed::ServerError } else { Observed::Success };
        upstream::observe(cluster, endpoint, worker, observed);
        let retry_on_status = status != 101 && policy.on_status.contains(&status) && idempotent && replayable;
        if retry_on_status {
            tried.push(pick.index);
        }
        if retry_on_status && another_endpoint(cluster, &tried) && may_retry(retrying.count(), policy, counters) {
            // Drop this response (and its connection) and try another endpoint. Without one left, the
            // response is passed on as it is.
            endpoint_slot.by_class[class_index(status)].inc();
            retrying.add();
            exchange.discard(endpoint, answer);
            backoff(policy, retrying.count()).await;
            continue;
        }
        return Ok(Answered {
            answer,
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
