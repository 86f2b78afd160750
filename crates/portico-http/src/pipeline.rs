//! Upstream pipelining of what one client pipelined (`pool.pipeline_depth`, opt-in per cluster).
//!
//! Most of the CPU a small proxied request costs is the kernel's work per segment. When an HTTP/1 client sends
//! several requests before reading the responses (HTTP/1.1 pipelining), the requests already in its buffer
//! behind the current one are read ahead and routed (`proxy::read_ahead`); those that may join (bodiless GET or
//! OPTIONS to the same cluster, and to the same endpoint where the balancer ties a request to one) are written
//! to the upstream with it in one write. Each then takes its turn on that connection, in the client's order,
//! and reads its own response exactly as an unbatched request does.
//!
//! Why only one client's requests: responses on an HTTP/1.1 connection carry nothing that names their request,
//! only their order. An upstream that answers out of step (an extra response, a body it should not send) shifts
//! every response behind it onto the wrong request. Batched across clients (as until 2026-11-24), that handed one
//! client's response to another. Batched within one client, the responses shifted are still that client's, on the
//! connection where it chose to match responses to requests by order; and the upstream connection carries no
//! one else's request until all of them were read and nothing else arrived (`pool::Pool::checkin`).
//!
//! When the connection is lost, or a response is refused for reuse, the members not yet answered are sent again
//! on fresh connections of their own. Nothing follows a response whose body is suppressed (HEAD is not
//! pipelined; a 204 or 304 ends its batch): a body an upstream wrongly sends there would be read as the next
//! member's response.

use crate::balancer::PickInput;
use crate::body::{Downstream, ReqBody};
use crate::buffers;
use crate::codec::{BodyFraming, RequestHead, ResponseHead};
use crate::phases::Front;
use crate::pool::{Pool, UpstreamConn};
use crate::relay::write_timed;
use crate::snapshot::{Cluster, Endpoint, Snapshot};
use crate::upstream::{self, Exchanged, Failed, Fault, Source, UpstreamFailure};
use bytes::Bytes;
use portico_core::stats::slot;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

/// One HTTP/1 client connection's requests read ahead of their turn, and the upstream connection its current
/// batch was written to. Created when the client first pipelines, kept for the connection's life.
pub(crate) struct ClientPipeline {
    client_ip: IpAddr,
    /// Requests taken from the client's buffer and routed, oldest first, served before anything read later.
    queue: VecDeque<Ahead>,
    /// The current batch's connection between two members' turns; it owes `followers` more responses.
    conn: Option<UpstreamConn>,
    /// Numbers the batches, so that a member can never take another batch's connection.
    batch: u64,
    /// The request being served, when it was written as a member of the current batch.
    current: Option<Member>,
}

/// A request read ahead: its head after the phases, their decision, and when it was read.
pub(crate) struct Ahead {
    pub head: RequestHead,
    pub front: Front,
    /// The configuration it was routed with: it is served with the same one.
    pub snapshot: Arc<Snapshot>,
    pub started: std::time::Instant,
    member: Option<Member>,
}

/// A request's place in a batch: the `index`th of `size` written to endpoint `endpoint` of its cluster.
#[derive(Clone, Copy)]
struct Member {
    batch: u64,
    index: usize,
    size: usize,
    endpoint: usize,
}

impl ClientPipeline {
    pub fn new(client_ip: IpAddr) -> Self {
        ClientPipeline { client_ip, queue: VecDeque::new(), conn: None, batch: 0, current: None }
    }

    /// No request is waiting in the queue.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn push(&mut self, head: RequestHead, front: Front, snapshot: Arc<Snapshot>, started: std::time::Instant) {
        self.queue.push_back(Ahead { head, front, snapshot, started, member: None });
    }

    /// The oldest request read ahead, now to be served.
    pub fn next_request(&mut self) -> Option<Ahead> {
        let next = self.queue.pop_front();
        self.current = next.as_ref().and_then(|a| a.member);
        next
    }

    /// The request now served was read from the socket: it is no member of a batch (whatever a member before
    /// it left unread).
    pub fn read_from_socket(&mut self) {
        self.current = None;
    }

    /// The endpoint (its index in the cluster) the request being served was already written to.
    pub fn written_to(&self) -> Option<usize> {
        self.current.map(|m| m.endpoint)
    }

    /// How many of the requests waiting may be written with the current one, a `head` for `cluster`'s endpoint
    /// `endpoint`: the unwritten ones at the front of the queue, up to the depth, while each may go there.
    pub fn joiners(&self, head: &RequestHead, cluster: &Cluster, endpoint: usize, worker: usize) -> usize {
        if self.current.is_some() || !eligible(head, cluster) {
            return 0;
        }
        let may_join = |a: &Ahead| {
            let input = PickInput { req: &a.head, client_ip: self.client_ip, worker };
            a.member.is_none()
                && matches!(a.front, Front::Cluster { cluster: c, .. }
                    if a.snapshot.clusters.get(c).is_some_and(|c| std::ptr::eq(c, cluster)))
                && eligible(&a.head, cluster)
                && cluster.balancer.may_share(&cluster.endpoints, &input, endpoint)
        };
        let depth = cluster.settings.pipeline_depth;
        self.queue.iter().take(depth.saturating_sub(1)).take_while(|a| may_join(a)).count()
    }
}

/// Whether this request may be pipelined: the cluster pipelines, and the request can be replayed as it is.
pub(crate) fn eligible(head: &RequestHead, cluster: &Cluster) -> bool {
    cluster.settings.pipeline_depth > 1
        && !cluster.settings.http2
        && head.body == BodyFraming::None
        && !head.expect_continue
        && !head.upgrade_websocket
        && matches!(head.method(), b"GET" | b"OPTIONS")
}

fn lost() -> Failed {
    Failed {
        failure: UpstreamFailure {
            retry_fresh: true,
            ..UpstreamFailure::upstream(502, "upstream connection lost before the response")
        },
        connected: true,
        reused: true,
        batch_lost: true,
    }
}

/// Writes `head` and the `joiners` requests waiting behind it (`ClientPipeline::joiners`) to one connection to
/// `endpoint`, in one write, and reads the response to `head`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn lead(
    down: &mut Downstream<'_>,
    pipeline: &mut ClientPipeline,
    joiners: usize,
    (pool, worker): (&RefCell<Pool>, usize),
    cluster: &Cluster,
    (endpoint, endpoint_index): (&Endpoint, usize),
    head: &RequestHead,
) -> Exchanged {
    let mut conn = upstream::connection(pool, worker, cluster, endpoint, false).await.map_err(|failure| Failed {
        failure,
        connected: false,
        reused: false,
        batch_lost: false,
    })?;
    // A previous batch's connection, if one is still here, owes responses to requests no longer waiting.
    pipeline.conn = None;
    pipeline.batch += 1;
    let size = joiners + 1;
    let out = &mut *down.out;
    out.clear();
    buffers::reserve_vec(out, 1024 * size);
    upstream::write_request_head(out, head, cluster, endpoint, down.facts);
    for (i, ahead) in pipeline.queue.iter_mut().take(joiners).enumerate() {
        upstream::write_request_head(out, &ahead.head, cluster, endpoint, down.facts);
        ahead.member = Some(Member { batch: pipeline.batch, index: i + 1, size, endpoint: endpoint_index });
    }
    let counters = slot(&cluster.stats.slots, worker);
    counters.pipeline_writes.inc();
    counters.pipelined_requests.add(size as u64);
    let written = write_timed(&mut conn.io, out, cluster.settings.send_timeout).await;
    out.clear();
    if written.is_err() {
        // The members find no connection when their turn comes, and are sent again on their own.
        return Err(Failed {
            failure: UpstreamFailure {
                retry_fresh: true,
                ..UpstreamFailure::upstream(502, "upstream closed the connection")
            },
            connected: true,
            reused: conn.reused,
            batch_lost: false,
        });
    }
    conn.followers = joiners;
    let no_body = ReqBody::InHand(Bytes::new());
    match upstream::read_response_head(&mut down.body, &mut conn, head, cluster, &no_body).await {
        Ok(resp) => Ok((Source::Conn(conn), resp)),
        // Dropping the connection sends the members to retry on their own.
        Err(failure) => Err(Failed { failure, connected: true, reused: conn.reused, batch_lost: false }),
    }
}

/// Reads the response of the request being served, a member of the current batch, when the connection is
/// there and owes this response next; otherwise the request is sent again on a fresh connection.
pub(crate) async fn take_turn(
    down: &mut Downstream<'_>,
    pipeline: &mut ClientPipeline,
    cluster: &Cluster,
    head: &RequestHead,
) -> Exchanged {
    let Some(member) = pipeline.current.take() else {
        return Err(lost());
    };
    let owed_from_here = member.size - member.index;
    let in_step = |c: &UpstreamConn| member.batch == pipeline.batch && c.followers == owed_from_here;
    // A member ahead that did not read its response (it failed, or was refused before its try) leaves the
    // connection out of step: it is dropped here, and the members behind go on their own.
    let Some(mut conn) = pipeline.conn.take().filter(in_step) else {
        return Err(lost());
    };
    conn.followers = owed_from_here - 1;
    conn.reused = true;
    let no_body = ReqBody::InHand(Bytes::new());
    match upstream::read_response_head(&mut down.body, &mut conn, head, cluster, &no_body).await {
        Ok(resp) => Ok((Source::Conn(conn), resp)),
        Err(mut failure) => {
            // Garbage where this response should start is most likely left over from the response before it
            // (a body the upstream should not have sent): the request is sent again on its own.
            if failure.fault == Fault::Upstream && !failure.timed_out {
                failure.retry_fresh = true;
            }
            Err(Failed { failure, connected: true, reused: true, batch_lost: true })
        }
    }
}

/// Returns a connection whose response was read in full: to the client's batch when it owes responses to
/// the requests behind (`pipeline` is the client's), otherwise to the pool. After a response with no body
/// (204, 304) the batch ends: bytes that follow could be a body the upstream should not have sent, not the
/// next response.
pub(crate) fn release(
    pool: &RefCell<Pool>,
    pipeline: Option<&mut ClientPipeline>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    conn: UpstreamConn,
    bodiless: bool,
) {
    if conn.request_unfinished {
        return; // dropped: see `UpstreamConn::request_unfinished`
    }
    if conn.has_followers() {
        if let Some(pipeline) = pipeline.filter(|_| !bodiless) {
            pipeline.conn = Some(conn);
        }
        return; // dropped: the members behind retry on their own
    }
    let settings = &cluster.settings;
    pool.borrow_mut().checkin(endpoint, conn, settings.max_idle_per_endpoint, settings.pool_idle_timeout);
}

/// Drops a response not passed on (a retry on its status). A connection with members behind it is handed on
/// when the whole body is already buffered; otherwise it is closed, which sends them to retry.
pub(crate) fn discard(
    pool: &RefCell<Pool>,
    pipeline: Option<&mut ClientPipeline>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    mut conn: UpstreamConn,
    resp: &ResponseHead,
) {
    if !conn.has_followers() || !resp.reusable {
        return;
    }
    if let BodyFraming::Length(n) = resp.body {
        if (conn.buf.len() as u64) >= n {
            bytes::Buf::advance(&mut conn.buf, n as usize);
            release(pool, pipeline, cluster, endpoint, conn, false);
        }
    }
}
