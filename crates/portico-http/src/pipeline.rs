//! Upstream request batching: HTTP/1.1 pipelining, opt-in per cluster (`pool.pipeline_depth`).
//!
//! Most of the CPU a small proxied request costs is the kernel's work per segment: one receive and one send
//! towards the client, one of each towards the upstream. Requests that become ready in the same turn of the
//! worker's event loop and go to the same endpoint can share the upstream half. The first (the leader) opens
//! a batch and yields once, so that every request already woken can join; then it writes them all with one
//! system call. Responses come back in order on that connection: each member reads its own when its turn
//! comes, exactly as an unbatched request does, and hands the connection on to the next.
//!
//! Only requests that may be sent again join (GET and OPTIONS without a body). When the connection is lost,
//! or a member gives up, the members not yet answered retry on a fresh connection of their own. Nothing
//! follows a response whose body is suppressed (HEAD is not pipelined; a 204 or 304 ends its batch): an
//! upstream that wrongly sends a body there would otherwise have it read as the next member's response.

use crate::body::{Downstream, ReqBody};
use crate::buffers;
use crate::codec::{self, BodyFraming, Parsed, RequestHead, ResponseHead};
use crate::pool::{self, BatchTurn, Pool, PoolKey, UpstreamConn};
use crate::relay::write_timed;
use crate::snapshot::{Cluster, Endpoint};
use crate::upstream::{self, Exchanged, Failed, Fault, Source, UpstreamFailure, MAX_RESPONSE_HEAD};
use bytes::{Bytes, BytesMut};
use portico_core::stats::slot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::task::{Poll, Waker};
use tokio::time::{timeout_at, Instant};

/// Requests written together to one connection, answered in order.
struct Batch {
    /// The members' request heads, gathered until the leader writes them.
    out: RefCell<Vec<u8>>,
    /// Members so far; fixed once the batch is written.
    members: Cell<usize>,
    /// The connection between two members' turns.
    conn: RefCell<Option<UpstreamConn>>,
    written: Cell<bool>,
    /// The member whose response is next.
    serving: Cell<usize>,
    /// The connection is lost or out of step: members not yet served retry elsewhere.
    broken: Cell<bool>,
    /// Members waiting for their turn, by index: a hand-over wakes the next member only.
    waiting: RefCell<Vec<Option<Waker>>>,
    /// Why the leader got no connection: the members fail the same way, as if each had tried.
    connect_failure: Cell<Option<UpstreamFailure>>,
    /// Responses complete in the buffer, handed to their members directly (by index), so that they all run in
    /// the same turn instead of one turn of the worker's run queue each.
    delivered: RefCell<Vec<Option<(Bytes, ResponseHead, BytesMut)>>>,
}

impl Batch {
    fn give_up(&self) {
        self.broken.set(true);
        for waker in self.waiting.borrow_mut().iter_mut().filter_map(Option::take) {
            waker.wake();
        }
    }

    fn wake(&self, index: usize) {
        if let Some(waker) = self.waiting.borrow_mut().get_mut(index).and_then(Option::take) {
            waker.wake();
        }
    }
}

/// A worker's upstream HTTP/1 connections, as the exchanges need them.
#[derive(Clone, Copy)]
pub(crate) struct Conns<'a> {
    pub worker: usize,
    pub pool: &'a RefCell<Pool>,
    pub batches: &'a Batches,
}

/// A worker's batches still open for joining, by endpoint. A batch is open from its leader's arrival until
/// its write.
#[derive(Default)]
pub struct Batches {
    open: RefCell<HashMap<PoolKey, Rc<Batch>>>,
}

/// A member's place in its batch. Dropped before its response was read in full, it breaks the batch: the
/// response will never be read, so the connection cannot be handed on.
pub(crate) struct Ticket {
    batch: Rc<Batch>,
    index: usize,
    done: bool,
}

impl BatchTurn for Ticket {
    fn has_followers(&self) -> bool {
        self.index + 1 < self.batch.members.get()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // A member dropped after its response was delivered to it leaves the connection in step.
        if !self.done && !self.batch.delivered.borrow().get(self.index).is_some_and(Option::is_some) {
            self.batch.give_up();
        }
    }
}

/// Whether this request may join a batch: the cluster pipelines, and the request can be replayed as it is.
pub(crate) fn eligible(head: &RequestHead, cluster: &Cluster) -> bool {
    cluster.settings.pipeline_depth > 1
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

/// Sends the request as part of a batch to `endpoint` and reads its response head.
pub(crate) async fn exchange(
    down: &mut Downstream<'_>,
    conns: Conns<'_>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    head: &RequestHead,
) -> Exchanged {
    let key = pool::key(endpoint);
    let joined = {
        let mut open = conns.batches.open.borrow_mut();
        match open.get(&key) {
            Some(batch) if !batch.broken.get() => {
                let batch = batch.clone();
                let index = batch.members.get();
                batch.members.set(index + 1);
                upstream::write_request_head(&mut batch.out.borrow_mut(), head, cluster, endpoint, down.facts);
                if index + 1 >= cluster.settings.pipeline_depth {
                    open.remove(&key);
                }
                Some(Ticket { batch, index, done: false })
            }
            _ => None,
        }
    };
    let ticket = match joined {
        Some(ticket) => ticket,
        None => lead(down, conns, cluster, endpoint, head, key).await?,
    };
    take_turn(down, ticket, head, cluster).await
}

/// Opens a batch, lets the requests woken in the same turn join, and writes them all.
async fn lead(
    down: &mut Downstream<'_>,
    conns: Conns<'_>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    head: &RequestHead,
    key: PoolKey,
) -> Result<Ticket, Failed> {
    let batch = Rc::new(Batch {
        out: RefCell::new(Vec::new()),
        members: Cell::new(1),
        conn: RefCell::new(None),
        written: Cell::new(false),
        serving: Cell::new(0),
        broken: Cell::new(false),
        waiting: RefCell::new(Vec::new()),
        connect_failure: Cell::new(None),
        delivered: RefCell::new(Vec::new()),
    });
    {
        let mut out = batch.out.borrow_mut();
        buffers::reserve_vec(&mut out, 1024);
        upstream::write_request_head(&mut out, head, cluster, endpoint, down.facts);
    }
    conns.batches.open.borrow_mut().insert(key, batch.clone());
    // From here on, leaving early drops the ticket, which sends the members to retry on their own.
    let ticket = Ticket { batch: batch.clone(), index: 0, done: false };
    let conn = upstream::connection(conns.pool, conns.worker, cluster, endpoint, false).await;
    if conn.is_ok() {
        tokio::task::yield_now().await;
    }
    {
        let mut open = conns.batches.open.borrow_mut();
        if open.get(&key).is_some_and(|b| Rc::ptr_eq(b, &batch)) {
            open.remove(&key);
        }
    }
    let mut conn = conn.map_err(|failure| {
        batch.connect_failure.set(Some(failure));
        Failed { failure, connected: false, reused: false, batch_lost: false }
    })?;
    let mut out = std::mem::take(&mut *batch.out.borrow_mut());
    let counters = slot(&cluster.stats.slots, conns.worker);
    counters.pipeline_writes.inc();
    counters.pipelined_requests.add(batch.members.get() as u64);
    let written = write_timed(&mut conn.io, &out, cluster.settings.send_timeout).await;
    buffers::give_back_vec(&mut out);
    if written.is_err() {
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
    *batch.conn.borrow_mut() = Some(conn);
    batch.written.set(true);
    Ok(ticket)
}

/// Waits for the responses ahead of this one, then reads this one's head.
///
/// The wait is bounded by `response_header`: the members ahead are bounded only per read and per write, so a
/// streamed response or a slow client ahead could hold this one for ever. Giving up breaks the batch (the
/// ticket's drop): the member holding the connection finishes, the others retry on their own.
async fn take_turn(down: &mut Downstream<'_>, mut ticket: Ticket, head: &RequestHead, cluster: &Cluster) -> Exchanged {
    let batch = ticket.batch.clone();
    // No timer is armed unless the member actually has to wait (`Timeout` polls the wait first).
    let deadline = Instant::now() + cluster.settings.response_header_timeout;
    let delivered = |index: usize| batch.delivered.borrow().get(index).is_some_and(Option::is_some);
    let turn = std::future::poll_fn(|cx| {
        if batch.broken.get() || delivered(ticket.index) || (batch.written.get() && batch.serving.get() == ticket.index)
        {
            return Poll::Ready(());
        }
        let mut waiting = batch.waiting.borrow_mut();
        if waiting.len() <= ticket.index {
            waiting.resize(ticket.index + 1, None);
        }
        waiting[ticket.index] = Some(cx.waker().clone());
        Poll::Pending
    });
    if timeout_at(deadline, turn).await.is_err() {
        return Err(Failed {
            failure: UpstreamFailure {
                timed_out: true,
                ..UpstreamFailure::upstream(504, "upstream timed out before responding (behind pipelined requests)")
            },
            connected: true,
            reused: false,
            batch_lost: false,
        });
    }
    if let Some((head_bytes, resp, body)) = batch.delivered.borrow_mut().get_mut(ticket.index).and_then(Option::take) {
        ticket.done = true;
        return Ok((Source::Buffered(body), (head_bytes, resp)));
    }
    if batch.broken.get() {
        return Err(match batch.connect_failure.get() {
            Some(failure) => Failed { failure, connected: false, reused: false, batch_lost: false },
            None => lost(),
        });
    }
    let Some(mut conn) = batch.conn.borrow_mut().take() else {
        return Err(lost());
    };
    conn.reused |= ticket.index > 0;
    let out_of_step = ticket.index > 0;
    conn.ticket = Some(Box::new(ticket));
    match upstream::read_response_head(&mut down.body, &mut conn, head, cluster, &ReqBody::InHand(Bytes::new())).await {
        Ok(resp) => Ok((Source::Conn(conn), resp)),
        // Dropping the connection (and its ticket) sends the members behind to retry on their own.
        Err(mut failure) => {
            // Garbage where a later member's response should start is most likely left over from a response
            // ahead (a body the upstream should not have sent): the request is sent again on its own.
            if out_of_step && failure.fault == Fault::Upstream && !failure.timed_out {
                failure.retry_fresh = true;
            }
            Err(Failed { failure, connected: true, reused: conn.reused, batch_lost: out_of_step })
        }
    }
}

/// Hands a connection whose response was read in full to the next member of its batch, or to the pool.
/// After a response with no body (204, 304) the batch ends: bytes that follow could be a body the upstream
/// should not have sent, not the next response.
pub(crate) fn release(
    conns: Conns<'_>,
    cluster: &Cluster,
    endpoint: &Endpoint,
    mut conn: UpstreamConn,
    bodiless: bool,
) {
    if let Some(mut ticket) = conn.ticket.take().and_then(|t| t.into_any().downcast::<Ticket>().ok()) {
        if ticket.batch.broken.get() || (bodiless && ticket.has_followers()) {
            return; // the ticket's drop breaks the batch
        }
        ticket.done = true;
        let batch = &ticket.batch;
        let members = batch.members.get();
        let mut next = ticket.index + 1;
        // Every following response already complete in the buffer goes straight to its member.
        while next < members {
            let Some(response) = take_complete(&mut conn.buf) else { break };
            let mut delivered = batch.delivered.borrow_mut();
            if delivered.len() < members {
                delivered.resize_with(members, || None);
            }
            delivered[next] = Some(response);
            drop(delivered);
            batch.wake(next);
            next += 1;
        }
        if next < members {
            *batch.conn.borrow_mut() = Some(conn);
            batch.serving.set(next);
            batch.wake(next);
            return;
        }
    }
    let settings = &cluster.settings;
    conns.pool.borrow_mut().checkin(endpoint, conn, settings.max_idle_per_endpoint, settings.pool_idle_timeout);
}

/// Drops a response not passed on (a retry on its status). A connection with members behind it is handed on
/// when the whole body is already buffered; otherwise it is closed, which sends them to retry.
pub(crate) fn discard(
    conns: Conns<'_>,
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
            release(conns, cluster, endpoint, conn, false);
        }
    }
}

/// A response at the start of `buf` that can be passed on without the connection: a final, reusable response
/// with a Content-Length body, all of it buffered. Anything else (interim, chunked, close-delimited, bodiless,
/// incomplete, invalid) is left for the member that takes the connection.
fn take_complete(buf: &mut BytesMut) -> Option<(Bytes, ResponseHead, BytesMut)> {
    let Ok(Parsed::Complete(resp, used)) = codec::parse_response(buf, false, MAX_RESPONSE_HEAD) else { return None };
    let BodyFraming::Length(n) = resp.body else { return None };
    if resp.status < 200 || !resp.reusable || (used as u64).saturating_add(n) > buf.len() as u64 {
        return None;
    }
    let head = buf.split_to(used).freeze();
    let body = buf.split_to(n as usize);
    Some((head, resp, body))
}
