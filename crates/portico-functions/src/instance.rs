//! One function's QuickJS runtime on one worker thread: the prelude and the function's code evaluated once,
//! then called for each request under the function's limits.

use rquickjs::function::Func;
use rquickjs::{ArrayBuffer, Context, Ctx, Function, Object, Persistent, Promise, Runtime, Value};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

const PRELUDE: &str = include_str!("prelude.js");

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
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A response as the function gave it.
pub struct CallOutput {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a call gave no response.
#[derive(Debug)]
pub enum CallError {
    /// The code threw (or its promise rejected), or returned something that is not a Response.
    Exception(String),
    /// It ran past its CPU time.
    Cpu,
    /// It needed more heap than its limit.
    Memory,
    /// Its promise never settled (nothing is left that could settle it).
    Unsettled,
}

impl CallError {
    /// The runtime may be in a bad state after this: drop it.
    pub fn damages_runtime(&self) -> bool {
        matches!(self, CallError::Cpu | CallError::Memory)
    }
}

pub struct Instance {
    // Field order: the handler and context go before the runtime they live in.
    handler: Persistent<Function<'static>>,
    target: Persistent<Value<'static>>,
    env: Persistent<Object<'static>>,
    context: Context,
    // Kept so that the runtime outlives everything above, whatever holds the context.
    _runtime: Runtime,
    /// When the call under way must stop; `None` between calls.
    deadline: Rc<Cell<Option<Instant>>>,
    /// The interrupt handler stopped the last call.
    interrupted: Rc<Cell<bool>>,
}

impl Instance {
    /// A runtime with the prelude and the function's code; `Err` is the error's text with file:line:col.
    pub fn new(
        file: &str,
        source: &str,
        shape: Shape,
        env: &[(String, String)],
        memory_limit: usize,
    ) -> Result<Instance, String> {
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
        // Top-level code runs under a deadline too: a file that loops at load time is an error, not a hang.
        deadline.set(Some(Instant::now() + Duration::from_secs(1)));
        let loaded = context.with(|ctx| -> Result<_, String> {
            let globals = ctx.globals();
            let log = Func::from(|level: String, text: String| log_line(&level, &text));
            globals.set("__portico_log", log).map_err(|e| describe(&ctx, e))?;
            // UTF-8 both ways, natively: a JavaScript loop per character costs more than the rest of a call.
            globals.set("__portico_utf8_encode", Func::from(utf8_encode)).map_err(|e| describe(&ctx, e))?;
            globals.set("__portico_utf8_decode", Func::from(utf8_decode)).map_err(|e| describe(&ctx, e))?;
            globals.set("__portico_random", Func::from(crate::crypto::random)).map_err(|e| describe(&ctx, e))?;
            globals.set("__portico_digest", Func::from(crate::crypto::digest)).map_err(|e| describe(&ctx, e))?;
            globals.set("__portico_hmac", Func::from(crate::crypto::hmac)).map_err(|e| describe(&ctx, e))?;
            ctx.eval::<(), _>(PRELUDE).map_err(|e| format!("prelude: {}", describe(&ctx, e)))?;
            crate::webapi::install(&ctx)?;
            let (target, handler): (Value, Function) = match shape {
                Shape::Module => {
                    let declared =
                        rquickjs::Module::declare(ctx.clone(), file, source).map_err(|e| describe(&ctx, e))?;
                    let (module, promise) = declared.eval().map_err(|e| describe(&ctx, e))?;
                    promise.finish::<()>().map_err(|e| describe(&ctx, e))?;
                    let default: Object = module.get("default").map_err(|_| {
                        format!("{file}: has no `export default {{ fetch(request, env, ctx) {{ ... }} }}`")
                    })?;
                    let fetch: Function = default
                        .get("fetch")
                        .map_err(|_| format!("{file}: the default export has no `fetch(request, env, ctx)` method"))?;
                    (default.into_value(), fetch)
                }
                Shape::Script => {
                    let options = {
                        let mut o = rquickjs::context::EvalOptions::default();
                        o.filename = Some(file.to_string());
                        o.global = true;
                        o
                    };
                    ctx.eval_with_options::<(), _>(source, options).map_err(|e| describe(&ctx, e))?;
                    let handler: Function = globals.get("handler").map_err(|_| {
                        format!("{file}: defines neither `function handler(request)` nor `export default {{ fetch }}`")
                    })?;
                    (Value::new_undefined(ctx.clone()), handler)
                }
            };
            let env_object = Object::new(ctx.clone()).map_err(|e| describe(&ctx, e))?;
            for (k, v) in env {
                env_object.set(k.as_str(), v.as_str()).map_err(|e| describe(&ctx, e))?;
            }
            Ok((Persistent::save(&ctx, target), Persistent::save(&ctx, handler), Persistent::save(&ctx, env_object)))
        });
        deadline.set(None);
        let (target, handler, env) = loaded.map_err(|e| {
            if interrupted.get() {
                format!("{file}: its top-level code ran for more than 1s")
            } else {
                e
            }
        })?;
        Ok(Instance { handler, target, env, context, _runtime: runtime, deadline, interrupted })
    }

    /// Calls the handler with `input`, within `cpu` of running time.
    pub fn call(&self, input: CallInput, cpu: Duration) -> Result<CallOutput, CallError> {
        self.interrupted.set(false);
        self.deadline.set(Some(Instant::now() + cpu));
        let result = self.context.with(|ctx| self.call_in(&ctx, input));
        self.deadline.set(None);
        if self.interrupted.get() {
            return Err(CallError::Cpu);
        }
        result
    }

    fn call_in<'js>(&self, ctx: &Ctx<'js>, input: CallInput) -> Result<CallOutput, CallError> {
        let exception = |e: rquickjs::Error| self.classify(ctx, e);
        let globals = ctx.globals();
        let make: Function = globals.get("__portico_request").map_err(exception)?;
        let pairs: Vec<Vec<String>> = input.headers.into_iter().map(|(k, v)| vec![k, v]).collect();
        let body = ArrayBuffer::new(ctx.clone(), input.body).map_err(exception)?;
        let request: Value = make.call((input.method, input.url, pairs, body)).map_err(exception)?;
        let handler = self.handler.clone().restore(ctx).map_err(exception)?;
        let target = self.target.clone().restore(ctx).map_err(exception)?;
        let env = self.env.clone().restore(ctx).map_err(exception)?;
        let call_ctx = Object::new(ctx.clone()).map_err(exception)?;
        let wait_until = Func::from(|_: Value| ());
        call_ctx.set("waitUntil", wait_until).map_err(exception)?;
        call_ctx.set("passThroughOnException", Func::from(|| ())).map_err(exception)?;
        let args = rquickjs::function::Args::new(ctx.clone(), 3);
        let mut args = args;
        args.this(target).map_err(exception)?;
        args.push_arg(request).map_err(exception)?;
        args.push_arg(env).map_err(exception)?;
        args.push_arg(call_ctx).map_err(exception)?;
        let returned: Value = handler.call_arg(args).map_err(exception)?;
        let settled: Value = match returned.as_promise() {
            Some(promise) => self.settle(ctx, promise.clone())?,
            None => returned,
        };
        let take: Function = globals.get("__portico_response").map_err(exception)?;
        let parts: rquickjs::Array = take.call((settled,)).map_err(exception)?;
        let status: u16 = parts.get(0).map_err(exception)?;
        let headers: Vec<Vec<String>> = parts.get(1).map_err(exception)?;
        let body: Value = parts.get(2).map_err(exception)?;
        let body = match (body.as_string(), ArrayBuffer::from_value(body.clone())) {
            (Some(text), _) => text.to_string().map_err(exception)?.into_bytes(),
            // SAFETY: the bytes are copied at once; no JavaScript runs while the slice is borrowed.
            (None, Some(buffer)) => unsafe { buffer.as_bytes() }.map(<[u8]>::to_vec).unwrap_or_default(),
            (None, None) => Vec::new(),
        };
        let headers = headers.into_iter().filter_map(|mut pair| Some((pair.remove(0), pair.pop()?))).collect();
        Ok(CallOutput { status, headers, body })
    }

    /// Runs the promise's jobs until it settles.
    fn settle<'js>(&self, ctx: &Ctx<'js>, promise: Promise<'js>) -> Result<Value<'js>, CallError> {
        match promise.finish::<Value>() {
            Ok(value) => Ok(value),
            Err(rquickjs::Error::WouldBlock) => Err(CallError::Unsettled),
            Err(e) => Err(self.classify(ctx, e)),
        }
    }

    fn classify(&self, ctx: &Ctx<'_>, e: rquickjs::Error) -> CallError {
        if self.interrupted.get() {
            return CallError::Cpu;
        }
        // (The runtime is locked while a call runs: its memory usage cannot be asked here.)
        let text = describe(ctx, e);
        if text.contains("out of memory") {
            return CallError::Memory;
        }
        CallError::Exception(text)
    }
}

fn utf8_encode<'js>(ctx: Ctx<'js>, text: String) -> rquickjs::Result<ArrayBuffer<'js>> {
    ArrayBuffer::new(ctx, text.into_bytes())
}

/// `length` bytes of `buffer` from `offset` as text, each ill-formed sequence a U+FFFD (as TextDecoder does).
fn utf8_decode(buffer: ArrayBuffer<'_>, offset: usize, length: usize) -> String {
    // SAFETY: the bytes are copied into the string at once; no JavaScript runs meanwhile.
    let bytes = unsafe { buffer.as_bytes() }.unwrap_or_default();
    let end = offset.saturating_add(length).min(bytes.len());
    String::from_utf8_lossy(&bytes[offset.min(end)..end]).into_owned()
}

/// The text of an error, with the exception's message and where it was thrown.
fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if !matches!(e, rquickjs::Error::Exception) {
        return e.to_string();
    }
    let thrown = ctx.catch();
    if let Some(exception) = thrown.as_exception() {
        let message = exception.message().unwrap_or_default();
        let stack = exception.stack().unwrap_or_default();
        let name: String = exception.get("name").unwrap_or_else(|_| "Error".into());
        let at = stack.lines().next().map(str::trim).unwrap_or("");
        return if at.is_empty() { format!("{name}: {message}") } else { format!("{name}: {message} ({at})") };
    }
    match thrown.as_string().and_then(|s| s.to_string().ok()) {
        Some(text) => format!("uncaught {text:?}"),
        None => format!("uncaught {:?}", thrown.type_name()),
    }
}

/// `console.log` and friends: to Portico's log, at most `LOG_LINES_PER_SECOND` per worker.
fn log_line(level: &str, text: &str) {
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
    match level {
        "error" => tracing::error!(target: "function", "{text}"),
        "warn" => tracing::warn!(target: "function", "{text}"),
        "debug" => tracing::debug!(target: "function", "{text}"),
        _ => tracing::info!(target: "function", "{text}"),
    }
}
