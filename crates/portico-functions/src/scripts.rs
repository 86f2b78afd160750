//! Portico's own JavaScript (prelude.js, the Web API files, the Streams polyfill): each compiled to QuickJS
//! bytecode by the first runtime of the process that evaluates it, and loaded from that bytecode by every later
//! runtime: parsing and compiling them again would be most of what making a runtime costs. Also the text of
//! an exception, for the errors every module reports.

use rquickjs::module::{Evaluated, WriteOptions};
use rquickjs::{Ctx, Module, Value};
use std::sync::OnceLock;

/// One file: its source, and its bytecode once a runtime has compiled it.
pub struct Script {
    pub name: &'static str,
    source: &'static str,
    bytecode: OnceLock<Vec<u8>>,
}

impl Script {
    pub const fn new(name: &'static str, source: &'static str) -> Script {
        Script { name, source, bytecode: OnceLock::new() }
    }
}

pub static PRELUDE: Script = Script::new("portico:prelude.js", include_str!("prelude.js"));
/// The Streams Standard (vendor/README.md), evaluated on first use.
pub static STREAMS: Script = Script::new("web-streams-polyfill.js", include_str!("vendor/web-streams-polyfill.js"));

/// Runs the file as a module in this runtime, from its bytecode when there is some. The files have no
/// top-level `await`, so evaluating one runs it to its end; no other job is run meanwhile (this may be
/// called in the middle of a handler's code, whose queued reactions must keep their order).
pub fn evaluate<'js>(ctx: &Ctx<'js>, script: &'static Script) -> rquickjs::Result<Module<'js, Evaluated>> {
    let declared = match script.bytecode.get() {
        // SAFETY: the bytes are what `Module::write` made of this same file's module, in this process (so in
        // this build of QuickJS), and are never changed after.
        Some(bytecode) => unsafe { Module::load(ctx.clone(), bytecode)? },
        None => {
            let declared = Module::declare(ctx.clone(), script.name, script.source)?;
            // (Another worker may have set it meanwhile: the same bytes.)
            let _ = script.bytecode.set(declared.write(WriteOptions::default())?);
            declared
        }
    };
    let (module, promise) = declared.eval()?;
    match promise.result::<Value>() {
        Some(Err(e)) => Err(e),
        _ => Ok(module),
    }
}

/// The text of an error, with the exception's message and where it was thrown.
pub fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
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
