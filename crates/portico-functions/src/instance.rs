//! One function's QuickJS runtime on one worker thread: the prelude and the function's code evaluated once,
//! then called for each request under the function's limits. Calls run in slices on the worker's event loop
//! (event_loop.rs): the handler's first run, then each of its timers and fetches as they settle.

use crate::event_loop::{is_pending, CallError, CallId, Host, Outgoing};
use crate::scripts::{self, describe};
use bytes::Bytes;
use hyper::body::Body as _;
use portico_http::handler::RequestBody;
use portico_http::handler::{SubRequest, SubResponse, SubrequestError, Upstreams};
use rquickjs::function::{Func, This};
use rquickjs::{ArrayBuffer, Context, Ctx, Function, Object, Persistent, Runtime, Value};
use std::cell::{Cell, RefCell};
use std::pin::pin;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

/// Deepest JavaScript stack a call may use: deep recursion is a `RangeError`, not a crashed worker.
const MAX_STACK: usize = 512 * 1024;

/// How the function's file hands over its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `export default { fetch(request, env, ctx) }`: an ES module.
    Module,
    /// `function handler(request)`: a script.
    Script,
}

impl Shape {
    pub fn of(source: &str) -> Shape {
        if source.contains("export default") || source.contains("export {") {
            Shape::Module
        } else {
            Shape::Script
        }
    }
}

/// A request as the function gets it.
pub struct CallInput {
    pub method: String,
    pub url: String,
    /// The header fields as one string, `name\0value\0name\0value` (names lowercase): one JavaScript string
    /// to make, split only if the handler looks at them. (A field cannot hold a NUL byte.)
    pub headers: String,
    pub body: Vec<u8>,
    /// The body is not in `body`: the handler pulls it from the call's driver as it reads.
    pub streamed: bool,
}

/// A response body that is not in hand: what the call's driver streams to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streamed {
    /// A `ReadableStream`, read a chunk at a time (its number).
    Js(u32),
    /// The request body, untouched, as the response's: piped without JavaScript.
    RequestBody,
}

/// A response as the function gave it; or, from an `onRequest` hook that let the request go on, the request
/// as it goes on (`next`: its target, the headers in `headers`).
pub struct CallOutput {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The origin-form target (path and query) of a request an `onRequest` hook let go on.
    pub next: Option<String>,
    /// The body is streamed, not in `body`.
    pub stream: Option<Streamed>,
}

/// What an `onResponse` hook changed: the fields it set (name, value), and the names it deleted.
pub type HeaderChanges = (Vec<(String, String)>, Vec<String>);

/// Which of the function's entry points a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `fetch(request, env, ctx)`: the function as a route's target.
    Fetch,
    /// `onRequest(request, env, ctx)`: the function as a filter, before the target.
    OnRequest,
    /// `onResponse(response, request, env, ctx)`: the function as a filter, on the response's head.
    OnResponse,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Fetch => "fetch handler",
            Hook::OnRequest => "onRequest hook",
            Hook::OnResponse => "onResponse hook",
        }
    }
}

pub struct Instance {
    // Field order: what lives in the runtime goes before it.
    /// The native classes' state (native.rs), freed before the context.
    _classes: crate::native::Installed,
    /// The `fetch` handler (or a script's `handler`), if there is one.
    handler: Option<Persistent<Function<'static>>>,
    /// The `onRequest` hook of a function used as a filter, if there is one.
    on_request: Option<Persistent<Function<'static>>>,
    /// The `onResponse` hook of a function used as a filter, if there is one.
    on_response: Option<Persistent<Function<'static>>>,
    target: Persistent<Value<'static>>,
    env: Persistent<Object<'static>>,
    /// `__portico_filter` and `__portico_response`, looked up once, and the handlers' third argument (`ctx`).
    call_context: Persistent<Object<'static>>,
    call_filter: Persistent<Function<'static>>,
    take_response: Persistent<Function<'static>>,
    context: Context,
    // Kept so that the runtime outlives everything above, whatever holds the context.
    _runtime: Runtime,
    /// When the slice under way must stop; `None` between slices.
    deadline: Rc<Cell<Option<Instant>>>,
    /// The interrupt handler stopped the last slice.
    interrupted: Rc<Cell<bool>>,
    host: Rc<Host>,
    /// A call hit the CPU or memory limit: the runtime takes no new calls (those in flight finish on it).
    retired: Cell<bool>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // The calls' values and the timers' tasks refer to the runtime: gone before it.
        self.host.clear();
    }
}

impl Instance {
    /// A runtime with the prelude and the function's code; `Err` is the error's text with file:line:col.
    pub fn new(
        (name, file): (&str, &str),
        source: &str,
        (shape, top_level): (Shape, Duration),
        env: &[(String, String)],
        (memory_limit, fetch_limit, request_limit): (usize, usize, usize),
    ) -> Result<Rc<Instance>, String> {
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        runtime.set_memory_limit(memory_limit);
        runtime.set_max_stack_size(MAX_STACK);
        let deadline: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
        let interrupted = Rc::new(Cell::new(false));
        let (d, i) = (deadline.clone(), interrupted.clone());
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let past = d.get().is_some_and(|deadline| Instant::now() >= deadline);
            if past {
                i.set(true);
            }
            past
        })));
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        let host = Rc::new(Host::default());
        host.fetch_limit.set(fetch_limit);
        host.request_limit.set(request_limit);
        *host.function.borrow_mut() = name.to_string();
        // What the timers' tasks run their callbacks on, once the instance exists.
        let this: Rc<RefCell<Weak<Instance>>> = Rc::new(RefCell::new(Weak::new()));
        // Top-level code runs under a deadline too: a file that loops at load time is an error, not a hang.
        deadline.set(Some(Instant::now() + top_level));
        let loaded = context.with(|ctx| -> Result<_, String> {
            install_natives(&ctx, &host, &this).map_err(|e| describe(&ctx, e))?;
            let classes = crate::native::install(&ctx)?;
            scripts::evaluate(&ctx, &scripts::PRELUDE).map_err(|e| format!("prelude: {}", describe(&ctx, e)))?;
            crate::webapi::install(&ctx)?;
            type Entry<'js> = Option<Function<'js>>;
            let (target, fetch, on_request, on_response): (Value, Entry, Entry, Entry) = match shape {
                Shape::Module => {
                    let declared =
                        rquickjs::Module::declare(ctx.clone(), file, source).map_err(|e| describe(&ctx, e))?;
                    let (module, promise) = declared.eval().map_err(|e| describe(&ctx, e))?;
                    promise.finish::<()>().map_err(|e| describe(&ctx, e))?;
                    let default: Object = module.get("default").map_err(|_| {
                        format!("{file}: has no `export default {{ fetch(request, env, ctx) {{ ... }} }}`")
                    })?;
                    let fetch: Option<Function> = default.get("fetch").ok();
                    let on_request: Option<Function> = default.get("onRequest").ok();
                    let on_response: Option<Function> = default.get("onResponse").ok();
                    if fetch.is_none() && on_request.is_none() && on_response.is_none() {
                        return Err(format!(
                            "{file}: the default export has neither a `fetch(request, env, ctx)` handler nor an \
                             `onRequest(request, env, ctx)` hook"
                        ));
                    }
                    (default.into_value(), fetch, on_request, on_response)
                }
                Shape::Script => {
                    let options = {
                        let mut o = rquickjs::context::EvalOptions::default();
                        o.filename = Some(file.to_string());
                        o.global = true;
                        o
                    };
                    ctx.eval_with_options::<(), _>(source, options).map_err(|e| describe(&ctx, e))?;
                    let handler: Option<Function> = ctx.globals().get("handler").ok();
                    let on_request: Option<Function> = ctx.globals().get("onRequest").ok();
                    let on_response: Option<Function> = ctx.globals().get("onResponse").ok();
                    if handler.is_none() && on_request.is_none() && on_response.is_none() {
                        return Err(format!(
                            "{file}: defines neither `function handler(request)` nor `export default {{ fetch }}`"
                        ));
                    }
                    (Value::new_undefined(ctx.clone()), handler, on_request, on_response)
                }
            };
            let env_object = Object::new(ctx.clone()).map_err(|e| describe(&ctx, e))?;
            for (k, v) in env {
                env_object.set(k.as_str(), v.as_str()).map_err(|e| describe(&ctx, e))?;
            }
            let globals = ctx.globals();
            let internal = |name: &str| -> Result<Persistent<Function<'static>>, String> {
                let f: Function = globals.get(name).map_err(|e| format!("prelude: {name}: {e}"))?;
                Ok(Persistent::save(&ctx, f))
            };
            Ok((
                classes,
                Persistent::save(&ctx, target),
                [fetch, on_request, on_response].map(|f| f.map(|f| Persistent::save(&ctx, f))),
                Persistent::save(&ctx, env_object),
                [internal("__portico_filter")?, internal("__portico_response")?],
                {
                    let context: Object = globals.get("__portico_call_context").map_err(|e| describe(&ctx, e))?;
                    Persistent::save(&ctx, context)
                },
            ))
        });
        deadline.set(None);
        let (classes, target, [handler, on_request, on_response], env, [call_filter, take_response], call_context) =
            loaded.map_err(|e| {
                if interrupted.get() {
                    format!("{file}: its top-level code ran for more than {top_level:?}")
                } else {
                    e
                }
            })?;
        let instance = Rc::new(Instance {
            _classes: classes,
            handler,
            on_request,
            on_response,
            target,
            env,
            call_context,
            call_filter,
            take_response,
            context,
            _runtime: runtime,
            deadline,
            interrupted,
            host,
            retired: Cell::new(false),
        });
        *this.borrow_mut() = Rc::downgrade(&instance);
        Ok(instance)
    }

    /// Whether the function has this entry point.
    pub fn has(&self, hook: Hook) -> bool {
        match hook {
            Hook::Fetch => self.handler.is_some(),
            Hook::OnRequest => self.on_request.is_some(),
            Hook::OnResponse => self.on_response.is_some(),
        }
    }

    /// A call hit its CPU or memory limit on this runtime: new calls should go to a new one.
    pub fn is_retired(&self) -> bool {
        self.retired.get()
    }

    /// Opens a call with `cpu` of running time; the call ends (its timers and fetches cancelled) when the
    /// returned guard is dropped.
    pub fn open_call(self: &Rc<Self>, cpu: Duration, upstreams: Option<Upstreams>, request: String) -> Call {
        Call { id: self.host.open(cpu, upstreams, request), cpu, instance: self.clone() }
    }

    /// Runs one slice of call `id`: `event`, then the microtasks it queued, within the call's remaining CPU
    /// time. `None` when the call has ended or failed. `wake`: calls waiting for a promise look again after it.
    fn slice<R>(&self, id: CallId, wake: bool, event: impl FnOnce(&Ctx<'_>) -> R) -> Option<R> {
        let budget = self.host.begin(id)?;
        self.interrupted.set(false);
        let started = Instant::now();
        self.deadline.set(Some(started + budget));
        let result = self.context.with(|ctx| {
            self.forget_cancelled(&ctx);
            let result = event(&ctx);
            self.run_jobs(&ctx);
            result
        });
        self.deadline.set(None);
        let interrupted = self.interrupted.get();
        self.host.end(id, started.elapsed(), interrupted);
        if interrupted {
            self.retired.set(true);
        }
        if wake {
            self.host.after_slice();
        }
        Some(result)
    }

    /// Tells JavaScript which timers, fetches and body reads were cancelled when their calls ended: their
    /// callbacks go, and their promises reject (so a promise another request shares does not hang).
    fn forget_cancelled(&self, ctx: &Ctx<'_>) {
        let cancelled = self.host.take_cancelled();
        if cancelled.is_empty() {
            return;
        }
        let forget: rquickjs::Result<Function> = ctx.globals().get("__portico_forget");
        if let Err(e) = forget.and_then(|f| f.call::<_, ()>((cancelled,))) {
            let _ = describe(ctx, e);
        }
    }

    /// Runs the microtasks queued so far (promise reactions), until none is left or the slice is interrupted.
    fn run_jobs(&self, ctx: &Ctx<'_>) {
        while !self.interrupted.get() && ctx.execute_pending_job() {}
    }

    /// Timer `number` fired: its callback runs as a slice of the call that set it.
    fn fire_timer(&self, number: u32) {
        let Some(call) = self.host.finish_operation(number, false) else { return };
        self.slice(call, true, |ctx| {
            let fire: rquickjs::Result<Function> = ctx.globals().get("__portico_timer_fire");
            if let Err(e) = fire.and_then(|f| f.call::<_, ()>((number,))) {
                let text = match self.slice_error(ctx, call, e) {
                    CallError::Cpu => return, // counted for the call
                    CallError::Exception(text) => text,
                    other => format!("{other:?}"),
                };
                log_line(&self.host, "error", &format!("a timer failed: {text}"));
            }
        });
    }

    /// Fetch `number` was answered (or failed): its promise settles in a slice of the call that made it.
    fn fetched(&self, number: u32, result: Result<SubResponse, SubrequestError>) {
        let Some(call) = self.host.finish_operation(number, false) else { return };
        self.host.fetch_done(call);
        self.slice(call, true, |ctx| {
            let globals = ctx.globals();
            let delivered = match result {
                Ok(response) => {
                    let pairs: Vec<String> = response.headers.into_iter().flat_map(|(k, v)| [k, v]).collect();
                    let body = ArrayBuffer::new_copy(ctx.clone(), &response.body[..]);
                    let settle: rquickjs::Result<Function> = globals.get("__portico_fetched");
                    body.and_then(|body| settle?.call::<_, ()>((number, response.status, pairs, body)))
                }
                Err(e) => {
                    let settle: rquickjs::Result<Function> = globals.get("__portico_fetch_failed");
                    settle.and_then(|f| f.call::<_, ()>((number, format!("fetch failed: {e}"))))
                }
            };
            if let Err(e) = delivered {
                self.slice_error(ctx, call, e);
            }
        });
    }

    /// Runs the `onResponse` hook of call `id` for a response with `status` to `input`, in one slice: the
    /// headers it set (name, value) and the names it deleted. A promise it returns must settle within the
    /// slice (its reactions run; timers and fetches do not complete in it).
    pub fn on_response(&self, id: CallId, status: u16, input: CallInput) -> Result<HeaderChanges, CallError> {
        let ran = self.slice(id, false, |ctx| -> Result<_, CallError> {
            let exception = |e: rquickjs::Error| self.classify(ctx, e);
            let Some(hook) = &self.on_response else {
                return Err(CallError::Exception("the function has no onResponse hook".into()));
            };
            let request = self.request_of(ctx, input).map_err(exception)?;
            let hook = hook.clone().restore(ctx).map_err(exception)?;
            let target = self.target.clone().restore(ctx).map_err(exception)?;
            let env = self.env.clone().restore(ctx).map_err(exception)?;
            let call: Function = ctx.globals().get("__portico_on_response").map_err(exception)?;
            let promise: rquickjs::Promise = call.call((hook, target, status, request, env)).map_err(exception)?;
            self.run_jobs(ctx);
            match promise.result::<rquickjs::Array>() {
                None => Err(CallError::Unsettled),
                Some(Err(e)) => Err(exception(e)),
                Some(Ok(parts)) => {
                    let set: Vec<String> = parts.get(0).map_err(exception)?;
                    let removed: Vec<String> = parts.get(1).map_err(exception)?;
                    let mut set = set.into_iter();
                    let set = std::iter::from_fn(|| Some((set.next()?, set.next()?))).collect();
                    Ok((set, removed))
                }
            }
        });
        match ran {
            Some(result) => result,
            None => Err(self.host.failure(id).unwrap_or(CallError::Exception("the call ended".into()))),
        }
    }

    /// A piece of the request body (`None`: its end; `Err`: it broke off) for read `number` of call `call`.
    pub fn deliver_body(&self, call: CallId, number: u32, piece: Result<Option<Bytes>, String>) {
        self.host.finish_operation(number, false);
        self.slice(call, true, |ctx| {
            let deliver = || -> rquickjs::Result<()> {
                let f: Function = ctx.globals().get("__portico_body_chunk")?;
                match piece {
                    Ok(Some(bytes)) => f.call((number, ArrayBuffer::new_copy(ctx.clone(), &bytes[..])?)),
                    Ok(None) => f.call((number, Value::new_null(ctx.clone()))),
                    Err(reason) => f.call((number, Value::new_null(ctx.clone()), reason)),
                }
            };
            if let Err(e) = deliver() {
                let _ = describe(ctx, e);
            }
        });
    }

    /// Asks JavaScript for the next chunk of response stream `number` (it arrives through
    /// `__portico_stream_push` in this slice or a later one).
    pub fn read_stream(&self, call: CallId, number: u32) {
        self.host.outgoing_set(number, Outgoing::Reading);
        let ran = self.slice(call, true, |ctx| {
            let read: rquickjs::Result<Function> = ctx.globals().get("__portico_stream_read");
            if let Err(e) = read.and_then(|f| f.call::<_, ()>((number,))) {
                let text = describe(ctx, e);
                self.host.outgoing_set(number, Outgoing::Failed(text));
            }
        });
        if ran.is_none() {
            let reason = self.host.failure(call).map_or("the call ended".into(), |e| format!("{e:?}"));
            self.host.outgoing_set(number, Outgoing::Failed(reason));
        }
    }

    /// The client went away: JavaScript's stream `number` is cancelled.
    pub fn cancel_stream(&self, call: CallId, number: u32) {
        self.host.outgoing_close(number);
        self.slice(call, false, |ctx| {
            let cancel: rquickjs::Result<Function> = ctx.globals().get("__portico_stream_cancel");
            let _ = cancel.and_then(|f| f.call::<_, ()>((number,)));
        });
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The JavaScript `Request` for `input` (native.rs): its body in hand, streamed, or none.
    fn request_of<'js>(&self, ctx: &Ctx<'js>, input: CallInput) -> rquickjs::Result<Value<'js>> {
        use crate::native::{Incoming, IncomingBody};
        let body = match (input.streamed, input.body.is_empty()) {
            (true, _) => IncomingBody::Streamed,
            (false, true) => IncomingBody::None,
            (false, false) => IncomingBody::Whole(input.body),
        };
        let incoming = Incoming { method: input.method, url: input.url, headers: input.headers, body };
        crate::native::incoming_request(ctx, incoming)
    }

    /// An error thrown into Portico's own code in a slice of `call` (a timer's callback, a fetch settling):
    /// classified as a call's error is, and a memory limit fails the call.
    fn slice_error(&self, ctx: &Ctx<'_>, call: CallId, e: rquickjs::Error) -> CallError {
        let error = self.classify(ctx, e);
        if matches!(error, CallError::Memory) {
            self.host.fail(call, CallError::Memory);
        }
        error
    }

    /// The handler's first slice: the request made, the handler called, and its answer taken if it has one.
    fn start<'js>(
        &self,
        ctx: &Ctx<'js>,
        id: CallId,
        input: CallInput,
        hook: Hook,
    ) -> Result<Option<CallOutput>, CallError> {
        let exception = |e: rquickjs::Error| self.classify(ctx, e);
        let function = match hook {
            Hook::Fetch => &self.handler,
            Hook::OnRequest => &self.on_request,
            Hook::OnResponse => return Err(CallError::Exception("onResponse is called through on_response".into())),
        };
        let Some(function) = function else {
            return Err(CallError::Exception(format!("the function has no {}", hook.name())));
        };
        let request = self.request_of(ctx, input).map_err(exception)?;
        let function = function.clone().restore(ctx).map_err(exception)?;
        let target = self.target.clone().restore(ctx).map_err(exception)?;
        let env = self.env.clone().restore(ctx).map_err(exception)?;
        let returned: Value = match hook {
            // The handler is called as a method of what it was exported on, as workerd and Deno call it.
            Hook::Fetch => {
                let context = self.call_context.clone().restore(ctx).map_err(exception)?;
                function.call((This(target), request, env, context))
            }
            _ => {
                let call = self.call_filter.clone().restore(ctx).map_err(exception)?;
                call.call((function, target, request, env))
            }
        }
        .map_err(exception)?;
        let Some(promise) = returned.as_promise() else {
            return self.output(ctx, returned).map(Some);
        };
        self.run_jobs(ctx);
        match promise.result::<Value>() {
            None => {
                self.host.set_returned(id, Persistent::save(ctx, promise.clone()));
                Ok(None)
            }
            Some(settled) => self.output(ctx, settled.map_err(exception)?).map(Some),
        }
    }

    /// The answer of call `id` if its promise has settled (`Ok(None)`: not yet).
    fn answer(&self, id: CallId) -> Result<Option<CallOutput>, CallError> {
        let Some(returned) = self.host.returned(id) else {
            return Err(CallError::Exception("the call has no promise".into()));
        };
        let settled = self.context.with(|ctx| returned.clone().restore(&ctx).map(|p| !is_pending(&p)).unwrap_or(true));
        if !settled {
            return Ok(None);
        }
        let taken = self.slice(id, false, |ctx| {
            let promise = returned.restore(ctx).map_err(|e| self.classify(ctx, e))?;
            match promise.result::<Value>() {
                None => Err(CallError::Unsettled),
                Some(value) => self.output(ctx, value.map_err(|e| self.classify(ctx, e))?),
            }
        });
        match taken {
            Some(answer) => answer.map(Some),
            None => Err(self.host.failure(id).unwrap_or(CallError::Unsettled)),
        }
    }

    /// Turns what the handler gave into status, headers and body.
    fn output<'js>(&self, ctx: &Ctx<'js>, value: Value<'js>) -> Result<CallOutput, CallError> {
        // A response made on a fast path (`Response.json(data)`, `new Response(text)`) is read natively.
        if let Some(fast) = crate::native::fast_response(ctx, &value) {
            let headers = match fast.content_type {
                Some(content_type) => vec![("content-type".to_string(), content_type.to_string())],
                None => Vec::new(),
            };
            return Ok(CallOutput { status: 200, headers, body: fast.body, next: None, stream: None });
        }
        let exception = |e: rquickjs::Error| self.classify(ctx, e);
        let take = self.take_response.clone().restore(ctx).map_err(exception)?;
        let parts: rquickjs::Array = take.call((value,)).map_err(exception)?;
        let status: u16 = parts.get(0).map_err(exception)?;
        let headers: Option<Vec<String>> = parts.get(1).map_err(exception)?;
        let body: Value = parts.get(2).map_err(exception)?;
        let next: Option<String> = parts.get(3).map_err(exception)?;
        let stream = match parts.get::<Option<i64>>(4).map_err(exception)? {
            None => None,
            Some(-1) => Some(Streamed::RequestBody),
            Some(number) => {
                let number = u32::try_from(number).map_err(|_| CallError::Exception("a bad stream".into()))?;
                self.host.outgoing_open(number);
                Some(Streamed::Js(number))
            }
        };
        let body = match (body.as_string(), ArrayBuffer::from_value(body.clone())) {
            (Some(text), _) => Bytes::from(text.to_string().map_err(exception)?.into_bytes()),
            // SAFETY: the bytes are copied at once; no JavaScript runs while the slice is borrowed.
            (None, Some(buffer)) => unsafe { buffer.as_bytes() }.map(Bytes::copy_from_slice).unwrap_or_default(),
            (None, None) => Bytes::new(),
        };
        let headers = match headers {
            Some(list) => {
                let mut list = list.into_iter();
                std::iter::from_fn(|| Some((list.next()?, list.next()?))).collect()
            }
            // Headers never made: only the default content-type, if the body has one.
            None => match parts.get::<Option<String>>(5).map_err(exception)? {
                Some(content_type) => vec![("content-type".to_string(), content_type)],
                None => Vec::new(),
            },
        };
        Ok(CallOutput { status, headers, body, next, stream })
    }

    fn classify(&self, ctx: &Ctx<'_>, e: rquickjs::Error) -> CallError {
        if self.interrupted.get() {
            return CallError::Cpu;
        }
        // (The runtime is locked while a call runs: its memory usage cannot be asked here.)
        let text = describe(ctx, e);
        if text.contains("out of memory") {
            self.retired.set(true);
            return CallError::Memory;
        }
        CallError::Exception(text)
    }
}

/// One call of the handler on an instance. Dropping it ends the call: its timers and fetches are cancelled.
pub struct Call {
    id: CallId,
    cpu: Duration,
    instance: Rc<Instance>,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.instance.host.close(self.id);
    }
}

impl Call {
    /// Runs the handler on `input` and waits for its response: slices run as its timers fire and its fetches
    /// answer, each within what is left of its CPU time. (The wall limit is the caller's: it drops the future.)
    /// `body`: the request body when `input` says it is streamed; the handler's reads are served from it.
    pub async fn respond(
        &self,
        input: CallInput,
        hook: Hook,
        body: &mut Option<RequestBody<'_>>,
    ) -> Result<CallOutput, CallError> {
        let (instance, id) = (&self.instance, self.id);
        let started = instance.slice(id, true, |ctx| instance.start(ctx, id, input, hook));
        if let Some(failure) = instance.host.failure(id) {
            return Err(failure);
        }
        match started {
            None => return Err(CallError::Exception("the call ended".into())),
            Some(Err(e)) => return Err(e),
            Some(Ok(Some(output))) => return Ok(output),
            Some(Ok(None)) => {}
        }
        loop {
            // Registered before looking, so that a slice running in between is not missed.
            let progress = instance.host.progress.notified();
            let mut progress = pin!(progress);
            progress.as_mut().enable();
            if let Some(failure) = instance.host.failure(id) {
                return Err(failure);
            }
            if let Some(output) = instance.answer(id)? {
                return Ok(output);
            }
            if !instance.host.is_waiting(id) {
                return Err(CallError::Unsettled);
            }
            let serve = std::future::poll_fn(|cx| self.poll_serve_body(body, cx));
            tokio::select! {
                () = progress => {}
                () = serve => {}
            }
        }
    }

    pub fn instance(&self) -> &Rc<Instance> {
        &self.instance
    }

    /// Serves the read of the request body the call waits for, if it waits for one (from `body`): `Ready`
    /// once a piece (or the end, or a failure) was handed to JavaScript.
    pub fn poll_serve_body(&self, body: &mut Option<RequestBody<'_>>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        poll_serve_body(self, body, cx)
    }

    /// Ends the call, whose answer has gone out: at once, or once its `ctx.waitUntil` work is done (by
    /// `deadline`), holding its concurrency permit meanwhile.
    pub fn end(self, permit: tokio::sync::OwnedSemaphorePermit, deadline: tokio::time::Instant) {
        // Nothing serves the request body once the response is out: a read of it still pending fails now, and
        // later ones at once.
        self.instance.host.close_body(self.id);
        if let Some(number) = self.instance.host.take_body_wanted(self.id) {
            let gone = "the request body cannot be read once the response has been sent".to_string();
            self.instance.deliver_body(self.id, number, Err(gone));
        }
        if self.has_work_left() {
            tokio::task::spawn_local(async move {
                let _ = tokio::time::timeout_at(deadline, self.linger()).await;
                drop(permit);
            });
        } else {
            drop((self, permit));
        }
    }

    pub fn id(&self) -> CallId {
        self.id
    }

    /// CPU time the call has used so far.
    pub fn cpu_used(&self) -> Duration {
        self.instance.host.used(self.id, self.cpu)
    }

    /// `ctx.waitUntil` promises still pending, with something left that may settle them.
    fn lingers(&self) -> bool {
        let host = &self.instance.host;
        if host.failure(self.id).is_some() || !host.is_waiting(self.id) {
            return false;
        }
        let promises = host.waited(self.id);
        !promises.is_empty()
            && self
                .instance
                .context
                .with(|ctx| promises.into_iter().any(|p| p.restore(&ctx).is_ok_and(|p| is_pending(&p))))
    }

    /// Waits for the call's `waitUntil` promises (the caller bounds it by the wall limit), then ends it.
    pub async fn linger(self) {
        loop {
            let progress = self.instance.host.progress.notified();
            let mut progress = pin!(progress);
            progress.as_mut().enable();
            if !self.lingers() {
                return;
            }
            progress.await;
        }
    }

    /// The call asked `waitUntil` for something that is still running.
    pub fn has_work_left(&self) -> bool {
        self.lingers()
    }
}

/// The next piece of a request body: data, its end (`None`), or why it broke off. Trailers are skipped.
pub fn poll_piece(body: &mut RequestBody<'_>, cx: &mut std::task::Context<'_>) -> Poll<Result<Option<Bytes>, String>> {
    loop {
        return match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(Ok(None)),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Err(format!("the request body broke off: {e}"))),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => Poll::Ready(Ok(Some(data))),
                Err(_) => continue, // trailers
            },
        };
    }
}

/// Serves the read of the request body the call waits for, if it waits for one: `Ready` once a piece (or
/// the end, or a failure) was handed to JavaScript.
fn poll_serve_body(call: &Call, body: &mut Option<RequestBody<'_>>, cx: &mut std::task::Context<'_>) -> Poll<()> {
    let (instance, id) = (call.instance(), call.id());
    if !instance.host().body_wanted(id) {
        return Poll::Pending;
    }
    let piece = match body.as_mut() {
        None => Ok(None),
        Some(body) => match poll_piece(body, cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(piece) => piece,
        },
    };
    if let Some(number) = instance.host().take_body_wanted(id) {
        instance.deliver_body(id, number, piece);
    }
    Poll::Ready(())
}

/// The natives the prelude builds on: logging, UTF-8, timers and `waitUntil`.
fn install_natives<'js>(ctx: &Ctx<'js>, host: &Rc<Host>, this: &Rc<RefCell<Weak<Instance>>>) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    let log_host = host.clone();
    let log = move |level: String, text: String| log_line(&log_host, &level, &text);
    globals.set("__portico_log", Func::from(log))?;
    // UTF-8 both ways, natively: a JavaScript loop per character costs more than the rest of a call.
    globals.set("__portico_utf8_encode", Func::from(utf8_encode))?;
    globals.set("__portico_utf8_decode", Func::from(utf8_decode))?;
    globals.set("__portico_json_parse", Func::from(json_parse))?;
    globals.set("__portico_json_stringify", Func::from(json_stringify))?;
    let (timer_host, timer_this) = (host.clone(), this.clone());
    let start_timer = move |number: u32, ms: f64| -> bool {
        // Only a call's code sets timers that fire: top-level code runs before any worker serves.
        if timer_host.current().is_none() {
            return false;
        }
        // NaN and negative delays are 0, as the HTML standard says; too long ones are capped.
        let ms = if ms.is_finite() { ms } else { 0.0 };
        let delay = Duration::from_secs_f64((ms / 1000.0).clamp(0.0, MAX_TIMER.as_secs_f64()));
        let instance = timer_this.borrow().clone();
        let task = tokio::task::spawn_local(async move {
            tokio::time::sleep(delay).await;
            if let Some(instance) = instance.upgrade() {
                instance.fire_timer(number);
            }
        });
        timer_host.start_operation(number, Some(task.abort_handle()))
    };
    globals.set("__portico_timer_start", Func::from(start_timer))?;
    let cancel_host = host.clone();
    let cancel = move |number: u32| {
        cancel_host.finish_operation(number, true);
    };
    globals.set("__portico_timer_cancel", Func::from(cancel))?;
    let wait_host = host.clone();
    let wait_until = move |ctx: Ctx<'js>, promise: rquickjs::Promise<'js>| {
        wait_host.wait_until(Persistent::save(&ctx, promise));
    };
    globals.set("__portico_wait_until", Func::from(wait_until))?;
    let (fetch_host, this) = (host.clone(), this.clone());
    let fetch = move |ctx: Ctx<'js>,
                      number: u32,
                      parts: Vec<String>,
                      headers: Vec<String>,
                      body: Option<ArrayBuffer<'js>>|
          -> rquickjs::Result<()> {
        let refuse = |message: String| rquickjs::Exception::throw_type(&ctx, &message);
        let [method, host, authority, target, scheme, port]: [String; 6] =
            parts.try_into().map_err(|_| refuse("fetch: a malformed request".into()))?;
        let Some(upstreams) = fetch_host.upstreams() else {
            return Err(refuse("fetch() is only available while a request is handled".into()));
        };
        let https = scheme == "https:";
        let port = port.parse().unwrap_or(if https { 443 } else { 80 });
        let Some(cluster) = upstreams.cluster_for(https, &host, port) else {
            return Err(refuse(format!(
                "fetch to {authority}: not a cluster of this configuration (a function reaches a cluster by its \
                 name, fetch(\"http://CLUSTER/path\"), or by the origin of one of its endpoints)"
            )));
        };
        if !fetch_host.fetch_started() {
            let most = crate::event_loop::MAX_FETCHES;
            return Err(refuse(format!("fetch to {authority}: a request may have at most {most} fetches under way")));
        }
        let mut headers = headers.into_iter();
        let headers = std::iter::from_fn(|| Some((headers.next()?, headers.next()?))).collect();
        // SAFETY: the bytes are copied at once; no JavaScript runs while the slice is borrowed.
        let body = body.and_then(|b| unsafe { b.as_bytes() }.map(Bytes::copy_from_slice)).unwrap_or_default();
        let request = SubRequest { method, target, host: authority, headers, body };
        let (instance, limit) = (this.borrow().clone(), fetch_host.fetch_limit.get());
        let task = tokio::task::spawn_local(async move {
            let result = upstreams.send(&cluster, request, limit).await;
            if let Some(instance) = instance.upgrade() {
                instance.fetched(number, result);
            }
        });
        fetch_host.start_operation(number, Some(task.abort_handle()));
        Ok(())
    };
    globals.set("__portico_fetch", Func::from(fetch))?;
    let limit_host = host.clone();
    globals.set("__portico_request_limit", Func::from(move || limit_host.request_limit.get() as f64))?;
    let large_host = host.clone();
    let too_large = move || {
        if let Some(id) = large_host.current() {
            large_host.fail(id, CallError::RequestTooLarge);
        }
    };
    globals.set("__portico_request_too_large", Func::from(too_large))?;
    let pull_host = host.clone();
    globals.set("__portico_body_pull", Func::from(move |number: u32| pull_host.want_body(number)))?;
    let push_host = host.clone();
    let push = move |number: u32, chunk: Option<ArrayBuffer<'js>>| {
        let state = match chunk {
            // SAFETY: copied at once; no JavaScript runs while the slice is borrowed.
            Some(buffer) => {
                Outgoing::Chunk(unsafe { buffer.as_bytes() }.map(Bytes::copy_from_slice).unwrap_or_default())
            }
            None => Outgoing::Done,
        };
        push_host.outgoing_set(number, state);
    };
    globals.set("__portico_stream_push", Func::from(push))?;
    let fail_host = host.clone();
    let fail = move |number: u32, reason: String| fail_host.outgoing_set(number, Outgoing::Failed(reason));
    globals.set("__portico_stream_fail", Func::from(fail))?;
    let load_streams = |ctx: Ctx<'js>| scripts::evaluate(&ctx, &scripts::STREAMS).map(|_| ());
    globals.set("__portico_load_streams", Func::from(load_streams))?;
    Ok(())
}

/// The longest a timer may be set for (longer ones fire then; the wall limit ends the call sooner anyway).
const MAX_TIMER: Duration = Duration::from_secs(24 * 3600);

fn utf8_encode<'js>(ctx: Ctx<'js>, text: String) -> rquickjs::Result<ArrayBuffer<'js>> {
    ArrayBuffer::new(ctx, text.into_bytes())
}

/// `length` bytes of `buffer` from `offset` as text, each ill-formed sequence a U+FFFD (as TextDecoder does).
/// `JSON.parse`'s fast path (json.rs): the value, or `undefined` for QuickJS's parser to answer (a text that
/// is not UTF-8, such as one with a lone surrogate, included).
fn json_parse<'js>(ctx: Ctx<'js>, text: rquickjs::String<'js>) -> rquickjs::Result<Value<'js>> {
    let parsed = match text.to_string() {
        Ok(text) => crate::json::parse(&ctx, &text)?,
        // Out of memory: the script's exception. (Not UTF-8, a lone surrogate: QuickJS's parser answers.)
        Err(rquickjs::Error::Exception) => return Err(rquickjs::Error::Exception),
        Err(_) => None,
    };
    Ok(parsed.unwrap_or_else(|| Value::new_undefined(ctx)))
}

/// `JSON.stringify(value)`'s fast path (json.rs): the text, or `undefined` for QuickJS's stringify to answer.
fn json_stringify<'js>(ctx: Ctx<'js>, value: Value<'js>) -> rquickjs::Result<Value<'js>> {
    match crate::json::stringify(&ctx, &value)? {
        Some(text) => rquickjs::String::from_str(ctx, &text).map(|s| s.into_value()),
        None => Ok(Value::new_undefined(ctx)),
    }
}

fn utf8_decode(buffer: ArrayBuffer<'_>, offset: usize, length: usize) -> String {
    // SAFETY: the bytes are copied into the string at once; no JavaScript runs meanwhile.
    let bytes = unsafe { buffer.as_bytes() }.unwrap_or_default();
    let end = offset.saturating_add(length).min(bytes.len());
    let slice = &bytes[offset.min(end)..end];
    // Well-formed text (nearly always) is checked by the fast validator; only ill-formed text goes the lossy way,
    // whose per-chunk walk costs several instructions a byte.
    match std::str::from_utf8(slice) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(slice).into_owned(),
    }
}

/// `console.log` and friends: to Portico's log, tagged with the function and the request whose code wrote it,
/// at most `LOG_LINES_PER_SECOND` per worker.
fn log_line(host: &Host, level: &str, text: &str) {
    const LOG_LINES_PER_SECOND: u32 = 100;
    thread_local! {
        static WINDOW: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
    }
    let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (window, count) = WINDOW.get();
    let count = if window == second { count + 1 } else { 1 };
    WINDOW.set((second, count));
    if count > LOG_LINES_PER_SECOND {
        return;
    }
    let text: String = text.chars().take(4096).collect();
    let (function, request) = (host.function.borrow(), host.current_request());
    let function = function.as_str();
    match level {
        "error" => tracing::error!(target: "function", function, request, "{text}"),
        "warn" => tracing::warn!(target: "function", function, request, "{text}"),
        "debug" => tracing::debug!(target: "function", function, request, "{text}"),
        _ => tracing::info!(target: "function", function, request, "{text}"),
    }
}
