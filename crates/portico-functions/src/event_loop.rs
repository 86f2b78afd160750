//! The bookkeeping of one runtime's event loop: the calls in progress on it, what each is waiting for (its
//! timers and `fetch`es), and how much CPU time each has left.
//!
//! A runtime serves many calls at once (up to the function's `limits.concurrency` per worker): each call runs
//! in slices, an *event* at a time (the handler's first run, a timer firing, a `fetch` answering), each
//! followed by the microtasks it queued. A slice is charged to the call whose event it is; the microtasks of
//! other calls that happen to run in it are charged to that call too (a slice is short, and a handler's
//! promise chain runs in its own events nearly always). Between slices the worker serves everything else.

use portico_http::handler::Upstreams;
use rquickjs::{Persistent, Promise};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The maps a runtime looks calls and operations up in, several times per request: keyed by small numbers
/// Portico picks, so foldhash's fast hash (not SipHash, whose flooding resistance they do not need).
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::task::Waker;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Most `fetch`es one call may have under way at once: each holds an upstream connection and up to
/// `max_response` of answer outside the runtime's heap.
pub const MAX_FETCHES: usize = 32;

/// A call's number on its runtime.
pub type CallId = u64;

/// Why a call gave no response.
#[derive(Debug, Clone)]
pub enum CallError {
    /// The code threw (or its promise rejected), or returned something that is not a Response.
    Exception(String),
    /// It ran past its CPU time.
    Cpu,
    /// It needed more heap than its limit.
    Memory,
    /// Its promise never settled, and nothing it waits for is left that could settle it.
    Unsettled,
    /// It read more of the request body whole than `limits.max_request`.
    RequestTooLarge,
}

/// One call's state between its slices.
struct Call {
    cpu_left: Duration,
    /// Its timers and `fetch`es not yet settled: while there are none, a pending promise can never settle.
    waiting_on: usize,
    /// A slice of it failed (the CPU limit): the call ends with this.
    failed: Option<CallError>,
    /// What the handler returned, while it is a promise still pending.
    returned: Option<Persistent<Promise<'static>>>,
    /// `ctx.waitUntil` promises: the call lives on after its response until they settle.
    wait_until: Vec<Persistent<Promise<'static>>>,
    /// What its `fetch`es go through: the clusters of the configuration its request arrived under.
    upstreams: Option<Upstreams>,
    /// Its request, `METHOD url`, for the log lines its code writes.
    request: String,
    /// A read of the request body JavaScript asked for (its operation's number), not yet served.
    body_wanted: Option<u32>,
    /// The response went out: the request body can no longer be read.
    body_closed: bool,
    /// Its `fetch`es under way.
    fetches: usize,
}

/// What a pending host operation (a timer, a `fetch`, a read of the request body) belongs to, and how to
/// cancel it (a read of the request body has no task: the call's driver serves it).
struct Operation {
    call: CallId,
    task: Option<AbortHandle>,
}

/// Where a response body streamed from JavaScript stands (one read at a time: back-pressure).
#[derive(Debug)]
pub enum Outgoing {
    /// No read asked for.
    Idle,
    /// A read is under way in JavaScript.
    Reading,
    /// A chunk arrived, not yet taken.
    Chunk(bytes::Bytes),
    Done,
    Failed(String),
}

#[derive(Default)]
pub struct Host {
    calls: RefCell<Map<CallId, Call>>,
    next_call: Cell<CallId>,
    /// The call whose slice is running: what timers, fetches and `waitUntil` made now belong to.
    current: Cell<Option<CallId>>,
    /// Timers and fetches by the number JavaScript knows them by.
    operations: RefCell<Map<u32, Operation>>,
    /// Woken after every slice: calls waiting for their promise look again.
    pub progress: Notify,
    /// Response bodies streamed from JavaScript, by the number JavaScript knows them by.
    outgoing: RefCell<Map<u32, Outgoing>>,
    /// Bodies being streamed that wait for a slice to make progress (woken with `progress`).
    wakers: RefCell<Vec<Waker>>,
    /// Operations cancelled when their call ended, which JavaScript still holds (their callbacks, their
    /// promises): it forgets them at the start of the next slice.
    cancelled: RefCell<Vec<u32>>,
    /// The largest response body a `fetch` reads (the function's `limits.max_response`).
    pub fetch_limit: Cell<usize>,
    /// The largest request body the handler may read whole (`limits.max_request`).
    pub request_limit: Cell<usize>,
    /// The function's name, for its log lines.
    pub function: RefCell<String>,
}

impl Host {
    /// A new call with `cpu` of running time.
    pub fn open(&self, cpu: Duration, upstreams: Option<Upstreams>, request: String) -> CallId {
        let id = self.next_call.get() + 1;
        self.next_call.set(id);
        let wait_until = Vec::new();
        let call = Call {
            cpu_left: cpu,
            waiting_on: 0,
            failed: None,
            returned: None,
            wait_until,
            upstreams,
            request,
            body_wanted: None,
            body_closed: false,
            fetches: 0,
        };
        self.calls.borrow_mut().insert(id, call);
        id
    }

    /// Ends a call: its timers and fetches are cancelled (a response that has gone out needs them no more,
    /// unless `waitUntil` asked for them, which keeps the call open).
    pub fn close(&self, id: CallId) {
        let call = self.calls.borrow_mut().remove(&id);
        let mut cancelled = self.cancelled.borrow_mut();
        self.operations.borrow_mut().retain(|number, op| {
            let mine = op.call == id;
            if mine {
                if let Some(task) = op.task.as_ref() {
                    task.abort();
                }
                cancelled.push(*number);
            }
            !mine
        });
        drop(call);
    }

    /// Forgets every call and cancels every operation: before the runtime they refer to goes.
    pub fn clear(&self) {
        for (_, op) in self.operations.borrow_mut().drain() {
            if let Some(task) = op.task {
                task.abort();
            }
        }
        self.outgoing.borrow_mut().clear();
        let calls: Vec<Call> = self.calls.borrow_mut().drain().map(|(_, c)| c).collect();
        drop(calls);
    }

    /// Starts a slice of call `id`: the CPU time it has left, or `None` if it has ended or failed.
    pub fn begin(&self, id: CallId) -> Option<Duration> {
        let calls = self.calls.borrow();
        let call = calls.get(&id).filter(|c| c.failed.is_none())?;
        self.current.set(Some(id));
        Some(call.cpu_left)
    }

    /// Ends a slice that ran for `ran`; `interrupted`: it was stopped at the call's CPU limit.
    pub fn end(&self, id: CallId, ran: Duration, interrupted: bool) {
        self.current.set(None);
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.cpu_left = call.cpu_left.saturating_sub(ran);
            if interrupted {
                call.failed = Some(CallError::Cpu);
            }
        }
    }

    /// What the running slice's call sends its `fetch`es through.
    pub fn upstreams(&self) -> Option<Upstreams> {
        let id = self.current.get()?;
        self.calls.borrow().get(&id).and_then(|c| c.upstreams.clone())
    }

    /// The request of the call whose slice is running (empty between calls).
    pub fn current_request(&self) -> String {
        let Some(id) = self.current.get() else { return String::new() };
        self.calls.borrow().get(&id).map(|c| c.request.clone()).unwrap_or_default()
    }

    /// The call a slice is running for.
    pub fn current(&self) -> Option<CallId> {
        self.current.get()
    }

    /// CPU time call `id` has used: `cpu` (its limit) less what it has left.
    pub fn used(&self, id: CallId, cpu: Duration) -> Duration {
        self.calls.borrow().get(&id).map_or(Duration::ZERO, |c| cpu.saturating_sub(c.cpu_left))
    }

    pub fn failure(&self, id: CallId) -> Option<CallError> {
        self.calls.borrow().get(&id).and_then(|c| c.failed.clone())
    }

    pub fn fail(&self, id: CallId, error: CallError) {
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.failed.get_or_insert(error);
        }
    }

    /// Call `id` waits for something outside JavaScript (a timer, a fetch) that may still settle a promise.
    pub fn is_waiting(&self, id: CallId) -> bool {
        self.calls.borrow().get(&id).is_some_and(|c| c.waiting_on > 0)
    }

    pub fn set_returned(&self, id: CallId, promise: Persistent<Promise<'static>>) {
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.returned = Some(promise);
        }
    }

    pub fn returned(&self, id: CallId) -> Option<Persistent<Promise<'static>>> {
        self.calls.borrow().get(&id).and_then(|c| c.returned.clone())
    }

    /// `ctx.waitUntil(promise)` in the running slice.
    pub fn wait_until(&self, promise: Persistent<Promise<'static>>) {
        let Some(id) = self.current.get() else { return };
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.wait_until.push(promise);
        }
    }

    /// The `waitUntil` promises of call `id` (to see which have settled).
    pub fn waited(&self, id: CallId) -> Vec<Persistent<Promise<'static>>> {
        self.calls.borrow().get(&id).map(|c| c.wait_until.clone()).unwrap_or_default()
    }

    /// Records operation `number` (a timer or fetch JavaScript knows by it) for the running slice's call;
    /// `false` (and the task is cancelled) when no call is running: the file's top-level code.
    pub fn start_operation(&self, number: u32, task: Option<AbortHandle>) -> bool {
        let abort = |task: Option<AbortHandle>| {
            if let Some(task) = task {
                task.abort();
            }
        };
        let Some(id) = self.current.get() else {
            abort(task);
            return false;
        };
        let Some(call) = self.calls.borrow_mut().get_mut(&id).map(|c| {
            c.waiting_on += 1;
            id
        }) else {
            abort(task);
            return false;
        };
        if let Some(old) = self.operations.borrow_mut().insert(number, Operation { call, task }) {
            abort(old.task);
            self.settled(old.call);
        }
        true
    }

    /// JavaScript asks for the next piece of the request body (operation `number`), in the running slice.
    pub fn want_body(&self, number: u32) -> bool {
        let Some(id) = self.current.get() else { return false };
        if self.calls.borrow().get(&id).is_none_or(|c| c.body_closed) {
            return false;
        }
        if !self.start_operation(number, None) {
            return false;
        }
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.body_wanted = Some(number);
        }
        true
    }

    /// Counts a `fetch` of the running slice's call: `false` at `MAX_FETCHES` under way.
    pub fn fetch_started(&self) -> bool {
        let Some(id) = self.current.get() else { return false };
        let mut calls = self.calls.borrow_mut();
        let Some(call) = calls.get_mut(&id) else { return false };
        if call.fetches >= MAX_FETCHES {
            return false;
        }
        call.fetches += 1;
        true
    }

    pub fn fetch_done(&self, id: CallId) {
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.fetches = call.fetches.saturating_sub(1);
        }
    }

    /// The response of call `id` went out: its request body can no longer be read.
    pub fn close_body(&self, id: CallId) {
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.body_closed = true;
        }
    }

    /// The operations cancelled since the last time, for JavaScript to forget.
    pub fn take_cancelled(&self) -> Vec<u32> {
        std::mem::take(&mut *self.cancelled.borrow_mut())
    }

    /// The read of the request body call `id` waits for, taken (its driver serves it).
    pub fn take_body_wanted(&self, id: CallId) -> Option<u32> {
        self.calls.borrow_mut().get_mut(&id).and_then(|c| c.body_wanted.take())
    }

    /// Whether call `id` waits for a piece of the request body.
    pub fn body_wanted(&self, id: CallId) -> bool {
        self.calls.borrow().get(&id).is_some_and(|c| c.body_wanted.is_some())
    }

    /// A response body streamed from JavaScript as `number`.
    pub fn outgoing_open(&self, number: u32) {
        self.outgoing.borrow_mut().insert(number, Outgoing::Idle);
    }

    /// How stream `number` stands; a chunk or an end is taken (the state goes back to `Idle`).
    pub fn outgoing_take(&self, number: u32) -> Outgoing {
        let mut all = self.outgoing.borrow_mut();
        let Some(state) = all.get_mut(&number) else { return Outgoing::Failed("the stream is gone".into()) };
        match state {
            Outgoing::Idle => Outgoing::Idle,
            Outgoing::Reading => Outgoing::Reading,
            _ => std::mem::replace(state, Outgoing::Idle),
        }
    }

    pub fn outgoing_set(&self, number: u32, state: Outgoing) {
        if let Some(slot) = self.outgoing.borrow_mut().get_mut(&number) {
            *slot = state;
        }
    }

    pub fn outgoing_close(&self, number: u32) {
        self.outgoing.borrow_mut().remove(&number);
    }

    /// Wakes `waker` after the next slice.
    pub fn wake_after_slice(&self, waker: &Waker) {
        let mut wakers = self.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    /// A slice ran: whoever waits for one looks again.
    pub fn after_slice(&self) {
        self.progress.notify_waiters();
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    /// Operation `number` is over (it fired, answered, or was cancelled): the call it belonged to, if any.
    pub fn finish_operation(&self, number: u32, cancel: bool) -> Option<CallId> {
        let op = self.operations.borrow_mut().remove(&number)?;
        if let Some(task) = op.task.filter(|_| cancel) {
            task.abort();
        }
        self.settled(op.call);
        Some(op.call)
    }

    fn settled(&self, id: CallId) {
        if let Some(call) = self.calls.borrow_mut().get_mut(&id) {
            call.waiting_on = call.waiting_on.saturating_sub(1);
        }
    }
}

/// How a promise stands, read without holding on to it.
pub fn is_pending(promise: &Promise<'_>) -> bool {
    promise.state() == rquickjs::promise::PromiseState::Pending
}
