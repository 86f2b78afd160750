//! A function as a route target: `portico_http::handler::Handler`, running the call on the worker's own
//! runtime for this version of the function.

use crate::instance::{CallError, CallInput, Instance, Shape};
use crate::stats::{Ending, FunctionStats};
use bytes::Bytes;
use http_body_util::BodyExt;
use portico_http::handler::{full, Handler, HandlerFuture, Request};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
            memory: function.limits.memory.as_usize(),
            max_request: function.limits.max_request.as_usize(),
            max_response: function.limits.max_response.as_usize(),
            stats: crate::stats::stats_for(name),
        };
        compiled.instance()?;
        Ok(compiled)
    }

    fn instance(&self) -> Result<Instance, String> {
        Instance::new(&self.file, &self.source, self.shape, &self.env, self.memory)
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

thread_local! {
    /// This worker's runtimes, by function name, each for one version of the function.
    static INSTANCES: RefCell<HashMap<String, (u64, Instance)>> = RefCell::new(HashMap::new());
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
            Ok(run(&compiled, input))
        })
    }
}

/// Calls the function on this worker's runtime for its version (made on first use), and turns the outcome
/// into a response.
fn run(compiled: &Compiled, input: CallInput) -> portico_http::handler::Response<'static> {
    let outcome = INSTANCES.with_borrow_mut(|instances| {
        let current = instances.get(&compiled.name).is_some_and(|(version, _)| *version == compiled.version);
        if !current {
            // A version a reload replaced is dropped once this worker serves the new one.
            let instance = compiled.instance().map_err(CallError::Exception)?;
            compiled.stats.runtime_created();
            instances.insert(compiled.name.clone(), (compiled.version, instance));
        }
        let Some((_, instance)) = instances.get(&compiled.name) else {
            return Err(CallError::Exception("no runtime".into()));
        };
        let started = std::time::Instant::now();
        let outcome = instance.call(input, compiled.cpu);
        let ending = match &outcome {
            Ok(out) if out.body.len() > compiled.max_response => Ending::ResponseTooLarge,
            Ok(_) => Ending::Answered,
            Err(CallError::Cpu) => Ending::CpuLimit,
            Err(CallError::Memory) => Ending::MemoryLimit,
            Err(CallError::Unsettled) => Ending::Unsettled,
            Err(CallError::Exception(_)) => Ending::Exception,
        };
        compiled.stats.record(ending, started.elapsed());
        if outcome.as_ref().is_err_and(CallError::damages_runtime) {
            instances.remove(&compiled.name);
        }
        outcome
    });
    let name = &compiled.name;
    match outcome {
        Ok(out) if out.body.len() > compiled.max_response => {
            answer(500, format!("function {name}'s response is larger than its max_response"))
        }
        Ok(out) => {
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
        Err(CallError::Cpu) => answer(500, format!("function {name} ran past its CPU limit ({:?})", compiled.cpu)),
        Err(CallError::Memory) => answer(500, format!("function {name} ran out of memory (its limit)")),
        Err(CallError::Unsettled) => answer(500, format!("function {name} returned a promise that never settles")),
        Err(CallError::Exception(text)) => answer(500, format!("function {name} failed: {text}")),
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
