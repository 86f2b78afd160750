//! A compiled function, and running one call of it on the worker's own runtime for its version, within its
//! limits: what the route target (handler.rs) and the filter (filter.rs) share.

use crate::event_loop::{CallError, Map};
use crate::instance::{CallInput, CallOutput, Hook, Instance, Shape};
use crate::stats::{Ending, FunctionStats};
use crate::streaming::CallBody;
use bytes::Bytes;
use portico_http::codec::RequestHead;
use portico_http::handler::RequestBody;
use portico_http::handler::Upstreams;
use std::borrow::Cow;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A function's code and settings, checked when the configuration was loaded.
pub struct Compiled {
    /// Unique per load: a reload that changes the code makes a new version, whose requests get new runtimes.
    pub(crate) version: u64,
    pub(crate) name: String,
    pub(crate) file: String,
    pub(crate) source: String,
    pub(crate) shape: Shape,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cpu: Duration,
    pub(crate) wall: Duration,
    pub(crate) concurrency: usize,
    pub(crate) memory: usize,
    pub(crate) max_request: usize,
    pub(crate) max_response: usize,
    pub(crate) stats: Arc<FunctionStats>,
    /// How long a runtime made again may spend on the file's top-level code.
    pub(crate) top_level: Duration,
    /// How long the top-level code may run when the configuration loads (`limits.startup`).
    pub(crate) startup: Duration,
}

/// Shown without `env`, which holds the secrets.
impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("name", &self.name)
            .field("file", &self.file)
            .field("version", &self.version)
            .finish()
    }
}

static VERSIONS: AtomicU64 = AtomicU64::new(1);

impl Compiled {
    /// Checks that the code loads (by loading it in a runtime of its own), and which entry points it has
    /// (`fetch`, `onRequest`); `Err` names file:line:col.
    pub fn new(
        name: &str,
        path: &Path,
        source: String,
        env: Vec<(String, String)>,
        function: &portico_config::Function,
    ) -> Result<(Compiled, [bool; 3]), String> {
        let compiled = Compiled {
            version: VERSIONS.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            file: path.display().to_string(),
            shape: Shape::of(&source),
            source,
            env,
            cpu: function.limits.cpu.0,
            wall: function.limits.wall.0,
            concurrency: function.limits.concurrency.max(1),
            memory: function.limits.memory.as_usize(),
            max_request: function.limits.max_request.as_usize(),
            max_response: function.limits.max_response.as_usize(),
            stats: crate::stats::stats_for(name),
            top_level: function.limits.startup.0,
            startup: function.limits.startup.0,
        };
        let started = std::time::Instant::now();
        let instance = compiled.instance(compiled.startup)?;
        // A runtime made again later (after one hit a limit) may spend on the file's top-level code what the
        // first one did, with room, but not the whole time a load may take: hostile code that retires its
        // runtime on purpose would otherwise cost the worker that much per request.
        let floor = compiled.cpu.max(Duration::from_millis(20)).min(compiled.startup);
        let top_level = (started.elapsed() * 4).clamp(floor, compiled.startup);
        let compiled = Compiled { top_level, ..compiled };
        Ok((compiled, [Hook::Fetch, Hook::OnRequest, Hook::OnResponse].map(|hook| instance.has(hook))))
    }

    fn instance(&self, top_level: Duration) -> Result<Rc<Instance>, String> {
        let limits = (self.memory, self.max_response, self.max_request);
        Instance::new((&self.name, &self.file), &self.source, (self.shape, top_level), &self.env, limits)
    }
}

/// This worker's runtime for one version of a function, and the calls it may run at once.
struct Slot {
    /// Gone once no configuration holds this version: the slot is dropped then.
    compiled: Weak<Compiled>,
    instance: Rc<Instance>,
    permits: Arc<Semaphore>,
}

thread_local! {
    /// This worker's runtimes, by version: requests still running on an older configuration keep theirs while
    /// new ones use the new version's.
    static SLOTS: RefCell<Map<u64, Slot>> = RefCell::new(Map::default());
}

/// This worker's runtime for `compiled` (made on first use, and again after one was retired) and its
/// concurrency permits.
pub fn slot_for(compiled: &Arc<Compiled>) -> Result<(Rc<Instance>, Arc<Semaphore>), String> {
    SLOTS.with_borrow_mut(|slots| {
        if let Some(slot) = slots.get_mut(&compiled.version) {
            if !slot.instance.is_retired() {
                return Ok((slot.instance.clone(), slot.permits.clone()));
            }
            // A call hit a limit on it: calls in flight finish there, new ones get a new runtime (whose
            // top-level code runs within `top_level`, measured when the version was compiled).
            slot.instance = compiled.instance(compiled.top_level)?;
            compiled.stats.runtime_created();
            return Ok((slot.instance.clone(), slot.permits.clone()));
        }
        // Versions no configuration holds any more (a reload replaced or removed them) go with their runtimes.
        slots.retain(|_, slot| slot.compiled.strong_count() > 0);
        let instance = compiled.instance(compiled.top_level)?;
        compiled.stats.runtime_created();
        let permits = Arc::new(Semaphore::new(compiled.concurrency));
        let slot = Slot { compiled: Arc::downgrade(compiled), instance: instance.clone(), permits: permits.clone() };
        slots.insert(compiled.version, slot);
        Ok((instance, permits))
    })
}

/// Why a call gave no answer, as the client is told: a status and a one-line reason.
pub struct Refused {
    pub status: u16,
    pub reason: String,
}

/// A call's answer: its status and headers, and its body in hand or streamed by the call.
pub struct Answer<'a> {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: AnswerBody<'a>,
    /// From an `onRequest` hook that let the request go on: its new target.
    pub next: Option<String>,
}

pub enum AnswerBody<'a> {
    Whole(Bytes),
    Streamed(CallBody<'a>),
}

/// Calls `hook` of the function on this worker's runtime for its version, within its limits. `body`: the
/// request body, when `input` says the handler streams it.
pub async fn run<'a>(
    compiled: &Arc<Compiled>,
    input: CallInput,
    upstreams: Upstreams,
    hook: Hook,
    mut body: Option<RequestBody<'a>>,
) -> Result<Answer<'a>, Refused> {
    let name = &compiled.name;
    let refused = |status, reason| Err(Refused { status, reason });
    let deadline = tokio::time::Instant::now() + compiled.wall;
    let (instance, permits) = match slot_for(compiled) {
        Ok(slot) => slot,
        Err(e) => {
            compiled.stats.record(Ending::Exception, Duration::ZERO);
            return refused(500, format!("function {name} failed: {e}"));
        }
    };
    // Past the concurrency limit, calls wait their turn (within the wall limit) rather than being refused.
    let permit = match tokio::time::timeout_at(deadline, permits.acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        _ => {
            compiled.stats.record(Ending::ConcurrencyLimit, Duration::ZERO);
            let limit = compiled.concurrency;
            return refused(503, format!("function {name} is at its concurrency limit ({limit} calls per worker)"));
        }
    };
    let mut request = String::with_capacity(input.method.len() + 1 + input.url.len());
    request.push_str(&input.method);
    request.push(' ');
    request.push_str(&input.url);
    let call = instance.open_call(compiled.cpu, Some(upstreams), request);
    let outcome = tokio::time::timeout_at(deadline, call.respond(input, hook, &mut body)).await.ok();
    let ending = match &outcome {
        None => Ending::WallLimit,
        Some(Ok(out)) if out.body.len() > compiled.max_response => Ending::ResponseTooLarge,
        Some(Ok(_)) => Ending::Answered,
        Some(Err(CallError::Cpu)) => Ending::CpuLimit,
        Some(Err(CallError::Memory)) => Ending::MemoryLimit,
        Some(Err(CallError::Unsettled)) => Ending::Unsettled,
        Some(Err(CallError::Exception(_) | CallError::RequestTooLarge)) => Ending::Exception,
    };
    compiled.stats.record(ending, call.cpu_used());
    let out = match outcome {
        Some(Ok(out)) if out.body.len() <= compiled.max_response => out,
        outcome => {
            drop((call, permit));
            return Err(refusal(compiled, outcome));
        }
    };
    let body = match out.stream {
        // The call lives on in its body until the body ends.
        Some(stream) => AnswerBody::Streamed(CallBody::new(call, permit, stream, body, (compiled.wall, deadline))),
        None => {
            call.end(permit, deadline);
            AnswerBody::Whole(out.body)
        }
    };
    Ok(Answer { status: out.status, headers: out.headers, body, next: out.next })
}

/// What the client is told of a call that gave no usable answer.
fn refusal(compiled: &Compiled, outcome: Option<Result<CallOutput, CallError>>) -> Refused {
    let name = &compiled.name;
    let (status, reason) = match outcome {
        None => (504, format!("function {name} did not answer within its wall limit ({:?})", compiled.wall)),
        Some(Ok(_)) => (500, format!("function {name}'s response is larger than its max_response")),
        Some(Err(CallError::Cpu)) => (500, format!("function {name} ran past its CPU limit ({:?})", compiled.cpu)),
        Some(Err(CallError::Memory)) => (500, format!("function {name} ran out of memory (its limit)")),
        Some(Err(CallError::Unsettled)) => (500, format!("function {name} returned a promise that never settles")),
        Some(Err(CallError::RequestTooLarge)) => {
            (413, format!("request body larger than function {name}'s max_request"))
        }
        Some(Err(CallError::Exception(text))) => (500, format!("function {name} failed: {text}")),
    };
    Refused { status, reason }
}

/// The request as a function gets it: method, absolute URL, the headers as Portico would forward them.
pub fn input_of(head: &RequestHead, https: bool, headers: Vec<(&[u8], &[u8])>, body: Vec<u8>) -> CallInput {
    let scheme = if https { "https" } else { "http" };
    let host = head.host().map(text).unwrap_or_default();
    let target = text(head.origin_form());
    let mut url = String::with_capacity(scheme.len() + 3 + host.len() + target.len());
    for part in [scheme, "://", &host, &target] {
        url.push_str(part);
    }
    let method = text(head.method()).into_owned();
    let mut raw = String::with_capacity(headers.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (k, v) in headers {
        if !raw.is_empty() {
            raw.push('\0');
        }
        // (A parsed name is a token: ASCII, so lowercasing it bytewise is right.)
        raw.extend(text(k).chars().map(|c| c.to_ascii_lowercase()));
        raw.push('\0');
        raw.push_str(&text(v));
    }
    CallInput { method, url, headers: raw, body, streamed: false }
}

/// Bytes from the client as text: as they are when they are UTF-8 (nearly always; checked faster than
/// `from_utf8_lossy` walks them), with U+FFFD for what is not.
fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}
