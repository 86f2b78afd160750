//! Web APIs beyond prelude.js, each in its own file, installed in a runtime by one call after the prelude:
//! `URL` and `URLSearchParams` (url.js, on the natives of url.rs), `DOMException`, `Event`, `EventTarget`,
//! `AbortController` and `AbortSignal` (events.js), and `structuredClone` (clone.js, which recognises the
//! other files' classes, so it comes last).
//!
//! The files are ES modules, parsed by the first runtime that installs them and kept as QuickJS bytecode,
//! which the next runtimes load: parsing them would cost each new runtime far more than loading.

use rquickjs::module::{Evaluated, WriteOptions};
use rquickjs::{Ctx, Function, Module};
use std::sync::OnceLock;

/// One file: its source, and its bytecode once a runtime has compiled it.
struct File {
    name: &'static str,
    source: &'static str,
    bytecode: OnceLock<Vec<u8>>,
}

static EVENTS: File = File { name: "portico:events.js", source: include_str!("events.js"), bytecode: OnceLock::new() };
static URL: File = File { name: "portico:url.js", source: include_str!("url.js"), bytecode: OnceLock::new() };
static CLONE: File = File { name: "portico:clone.js", source: include_str!("clone.js"), bytecode: OnceLock::new() };

/// Defines the globals; `Err` is the exception's text (a bug in these files, never the handler's doing).
pub fn install(ctx: &Ctx<'_>) -> Result<(), String> {
    let failed = |file: &File, e: rquickjs::Error| format!("{}: {}", file.name, describe(ctx, e));
    evaluate(ctx, &EVENTS).map_err(|e| failed(&EVENTS, e))?;
    let url = evaluate(ctx, &URL).map_err(|e| failed(&URL, e))?;
    let setup: Function = url.get("default").map_err(|e| failed(&URL, e))?;
    let natives = crate::url::natives(ctx).map_err(|e| failed(&URL, e))?;
    setup.call::<_, ()>((natives,)).map_err(|e| failed(&URL, e))?;
    evaluate(ctx, &CLONE).map_err(|e| failed(&CLONE, e))?;
    Ok(())
}

/// Runs the file's module in this runtime, from its bytecode when there is some.
fn evaluate<'js>(ctx: &Ctx<'js>, file: &'static File) -> rquickjs::Result<Module<'js, Evaluated>> {
    let declared = match file.bytecode.get() {
        // SAFETY: the bytes are what `Module::write` made of this same file's module, in this process (so in
        // this build of QuickJS), and are never changed after.
        Some(bytecode) => unsafe { Module::load(ctx.clone(), bytecode)? },
        None => {
            let declared = Module::declare(ctx.clone(), file.name, file.source)?;
            // (Another worker may have set it meanwhile: the same bytes.)
            let _ = file.bytecode.set(declared.write(WriteOptions::default())?);
            declared
        }
    };
    let (module, promise) = declared.eval()?;
    promise.finish::<()>()?;
    Ok(module)
}

fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if !matches!(e, rquickjs::Error::Exception) {
        return e.to_string();
    }
    let thrown = ctx.catch();
    match thrown.as_exception() {
        Some(exception) => format!(
            "{}: {}",
            exception.message().unwrap_or_default(),
            exception.stack().unwrap_or_default().lines().next().unwrap_or("").trim()
        ),
        None => format!("uncaught {:?}", thrown.type_name()),
    }
}
