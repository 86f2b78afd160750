//! The functions plane: JavaScript `fetch` handlers run in-process (docs/functions.md).
//!
//! A function is compiled when the configuration is loaded (a syntax error is a configuration error at its
//! file:line:col, and a reload keeps the old version); each worker thread then runs its own QuickJS runtime
//! per function version, made on its first request and kept: no JavaScript value crosses threads, and
//! nothing is locked on the request path. Every call runs under the function's limits: CPU time (QuickJS's
//! interrupt handler), heap (the runtime's memory limit), stack depth, request and response size. A runtime
//! that hit its CPU or memory limit may be in a bad state, so it is dropped and made anew on the next request.
//!
//! The engine is QuickJS-ng through `rquickjs` (the V8-based engines cannot be built here); the Web API
//! subset handlers use (Request, Response, Headers, URL, ...) is JavaScript in `prelude.js`.

mod crypto;
mod encoding;
mod event_loop;
mod filter;
mod function;
mod handler;
mod instance;
mod json;
mod native;
mod scripts;
mod stats;
mod streaming;
/// Public for the fuzz target (fuzz/fuzz_targets/url_fast.rs).
pub mod url;
mod url_class;
mod webapi;

pub use stats::FunctionsView;

use portico_config::{Function, LoadedConfig};
use portico_http::handler::{CompiledFunction, FunctionPlane};
use std::sync::Arc;

/// Registered with `portico_http::handler::register_functions` by the binary.
pub struct Plane;

impl FunctionPlane for Plane {
    fn compile(&self, name: &str, function: &Function, loaded: &LoadedConfig) -> Result<CompiledFunction, String> {
        let path = loaded.resolve(&function.source);
        let source = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut env: Vec<(String, String)> = function.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (key, secret) in &function.secrets {
            let value = secret.read(loaded).map_err(|e| format!("secret {key}: {e}"))?;
            env.push((key.clone(), value));
        }
        let (compiled, [fetch, on_request, on_response]) = function::Compiled::new(name, &path, source, env, function)?;
        let compiled = Arc::new(compiled);
        Ok(CompiledFunction {
            handler: fetch.then(|| Arc::new(handler::FunctionHandler::new(compiled.clone())) as _),
            gate: on_request.then(|| Arc::new(filter::FunctionGate::new(compiled.clone())) as _),
            response: on_response.then(|| Arc::new(filter::FunctionResponse::new(compiled)) as _),
        })
    }
}
