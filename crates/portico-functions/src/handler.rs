//! A function as a route target: `portico_http::handler::Handler`, running the call on the worker's own
//! runtime for this version of the function.

use crate::event_loop::CallError;
use crate::instance::{CallInput, Instance, Shape};
use crate::stats::{Ending, FunctionStats};
use bytes::Bytes;
use http_body_util::BodyExt;
use portico_http::handler::{full, Handler, HandlerFuture, Request};
use portico_http::subrequest::Upstreams;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A function's code and settings, checked when the configuration was loaded.
pub struct Compiled {
    /// Unique per load: a reload that changes the code makes a new version, whose requests get new runtimes.
    version: u64,
    name: String,
    file: String,
    source: String,
    shape: Shape,
    env: Vec<(String, String)>,
    cpu: Duration,
    wall: Duration,
    concurrency: usize,
    memory: usize,
    max_request: usize,
    max_response: usize,
    stats: Arc<FunctionStats>,
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
    /// Checks that the code loads (by loading it in a runtime of its own); `Err` names file:line:col.
    pub fn new(
        name: &str,
        path: &Path,
        source: String,
        env: Vec<(String, String)>,
        function: &portico_config::Function,
    ) -> Result<Compiled, String> {
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
        };
        compiled.instance()?;
        Ok(compiled)
    }

    fn instance(&self) -> Result<Rc<Instance>, String> {
        Instance::new(&self.file, &self.source, self.shape, &self.env, (self.memory, self.max_response))
    }
}

#[derive(Debug)]
pub struct FunctionHandler {
    compiled: Arc<Compiled>,
}

impl FunctionHandler {
    pub fn new(compiled: Compiled) -> FunctionHandler {
        FunctionHandler { compiled: Arc::new(compiled) }
    }
}

impl Handler for FunctionHandler {
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a> {
        let compiled = self.compiled.clone();
        Box::pin(async move {
            let scheme = if req.client.https { "https" } else { "http" };
            let host = req.head.host().map(|h| String::from_utf8_lossy(h).into_owned()).unwrap_or_default();
            let url = format!("{scheme}://{host}{}", String::from_utf8_lossy(req.head.origin_form()));
            let method = String::from_utf8_lossy(req.method()).into_owned();
            let headers = req
                .headers()
                .into_iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let upstreams = req.upstreams.clone();
            let too_large =
                || answer(413, format!("request body larger than function {}'s max_request", compiled.name));
            if let portico_http::codec::BodyFraming::Length(n) = req.head.body {
                if n > compiled.max_request as u64 {
                    return Ok(too_large()); // before any of it is read
                }
            }
            let body = match http_body_util::Limited::new(req.body, compiled.max_request).collect().await {
                Ok(collected) => collected.to_bytes().to_vec(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => return Ok(too_large()),
                Err(e) => return Err(e),
            };
            let input = CallInput { method, url, headers, body };
            Ok(run(&compiled, input, upstreams).await)
        })
    }
}

/// This worker's runtime for one version of a function, and the calls it may run at once.
struct Slot {
    version: u64,
    instance: Rc<Instance>,
    permits: Arc<Semaphore>,
}

thread_local! {
    /// This worker's runtimes, by function name.
    static SLOTS: RefCell<HashMap<String, Slot>> = RefCell::new(HashMap::new());
}

/// This worker's runtime for `compiled` (made on first use, and again after one was retired) and its
/// concurrency permits.
fn slot_for(compiled: &Compiled) -> Result<(Rc<Instance>, Arc<Semaphore>), String> {
    SLOTS.with_borrow_mut(|slots| {
        let slot = slots.get_mut(&compiled.name).filter(|s| s.version == compiled.version);
        if let Some(slot) = slot {
            if !slot.instance.is_retired() {
                return Ok((slot.instance.clone(), slot.permits.clone()));
            }
            // A call hit a limit on it: calls in flight finish there, new ones get a new runtime.
            slot.instance = compiled.instance()?;
            compiled.stats.runtime_created();
            return Ok((slot.instance.clone(), slot.permits.clone()));
        }
        // A version a reload replaced is dropped once this worker's calls on it have finished.
        let instance = compiled.instance()?;
        compiled.stats.runtime_created();
        let permits = Arc::new(Semaphore::new(compiled.concurrency));
        let slot = Slot { version: compiled.version, instance: instance.clone(), permits: permits.clone() };
        slots.insert(compiled.name.clone(), slot);
        Ok((instance, permits))
    })
}

/// Calls the function on this worker's runtime for its version, within its limits, and turns the outcome
/// into a response.
async fn run(
    compiled: &Arc<Compiled>,
    input: CallInput,
    upstreams: Upstreams,
) -> portico_http::handler::Response<'static> {
    let name = &compiled.name;
    let deadline = tokio::time::Instant::now() + compiled.wall;
    let (instance, permits) = match slot_for(compiled) {
        Ok(slot) => slot,
        Err(e) => {
            compiled.stats.record(Ending::Exception, Duration::ZERO);
            return answer(500, format!("function {name} failed: {e}"));
        }
    };
    // Past the concurrency limit, calls wait their turn (within the wall limit) rather than being refused.
    let permit = match tokio::time::timeout_at(deadline, permits.acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        _ => {
            compiled.stats.record(Ending::ConcurrencyLimit, Duration::ZERO);
            let limit = compiled.concurrency;
            return answer(503, format!("function {name} is at its concurrency limit ({limit} calls per worker)"));
        }
    };
    let call = instance.open_call(compiled.cpu, Some(upstreams));
    let outcome = tokio::time::timeout_at(deadline, call.respond(input)).await.ok();
    let ending = match &outcome {
        None => Ending::WallLimit,
        Some(Ok(out)) if out.body.len() > compiled.max_response => Ending::ResponseTooLarge,
        Some(Ok(_)) => Ending::Answered,
        Some(Err(CallError::Cpu)) => Ending::CpuLimit,
        Some(Err(CallError::Memory)) => Ending::MemoryLimit,
        Some(Err(CallError::Unsettled)) => Ending::Unsettled,
        Some(Err(CallError::Exception(_))) => Ending::Exception,
    };
    compiled.stats.record(ending, call.cpu_used());
    if outcome.as_ref().is_some_and(|o| o.as_ref().is_ok()) && call.has_work_left() {
        // `ctx.waitUntil`: the call goes on after its response, within the wall limit, holding its permit.
        tokio::task::spawn_local(async move {
            let _ = tokio::time::timeout_at(deadline, call.linger()).await;
            drop(permit);
        });
    } else {
        drop((call, permit));
    }
    match outcome {
        None => answer(504, format!("function {name} did not answer within its wall limit ({:?})", compiled.wall)),
        Some(Ok(out)) if out.body.len() > compiled.max_response => {
            answer(500, format!("function {name}'s response is larger than its max_response"))
        }
        Some(Ok(out)) => {
            let mut response = hyper::Response::new(full(Bytes::from(out.body)));
            *response.status_mut() = hyper::StatusCode::from_u16(out.status).unwrap_or(hyper::StatusCode::OK);
            for (k, v) in out.headers {
                let name = hyper::header::HeaderName::from_bytes(k.as_bytes());
                let value = hyper::header::HeaderValue::from_str(&v);
                if let (Ok(name), Ok(value)) = (name, value) {
                    response.headers_mut().append(name, value);
                }
            }
            response
        }
        Some(Err(CallError::Cpu)) => {
            answer(500, format!("function {name} ran past its CPU limit ({:?})", compiled.cpu))
        }
        Some(Err(CallError::Memory)) => answer(500, format!("function {name} ran out of memory (its limit)")),
        Some(Err(CallError::Unsettled)) => {
            answer(500, format!("function {name} returned a promise that never settles"))
        }
        Some(Err(CallError::Exception(text))) => answer(500, format!("function {name} failed: {text}")),
    }
}

fn answer(status: u16, reason: String) -> portico_http::handler::Response<'static> {
    let mut response = hyper::Response::new(full(Bytes::from(reason + "\n")));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}
