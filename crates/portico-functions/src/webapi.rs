//! Web APIs beyond prelude.js, each in its own file, installed in a runtime by one call after the prelude:
//! `URL` and `URLSearchParams` (url.js, on the natives of url.rs), `DOMException`, `Event`, `EventTarget`,
//! `AbortController` and `AbortSignal` (events.js), and `structuredClone` (clone.js, which recognises the
//! other files' classes, so it comes last).
//!
//! The files are ES modules, kept as QuickJS bytecode after the first runtime compiles them (scripts.rs).

use crate::scripts::{describe, evaluate, Script};
use rquickjs::{Ctx, Function};

static EVENTS: Script = Script::new("portico:events.js", include_str!("events.js"));
static URL: Script = Script::new("portico:url.js", include_str!("url.js"));
static CLONE: Script = Script::new("portico:clone.js", include_str!("clone.js"));

/// Defines the globals; `Err` is the exception's text (a bug in these files, never the handler's doing).
pub fn install(ctx: &Ctx<'_>) -> Result<(), String> {
    let failed = |file: &Script, e: rquickjs::Error| format!("{}: {}", file.name, describe(ctx, e));
    evaluate(ctx, &EVENTS).map_err(|e| failed(&EVENTS, e))?;
    let url = evaluate(ctx, &URL).map_err(|e| failed(&URL, e))?;
    let setup: Function = url.get("default").map_err(|e| failed(&URL, e))?;
    let natives = crate::url::natives(ctx).map_err(|e| failed(&URL, e))?;
    setup.call::<_, ()>((natives,)).map_err(|e| failed(&URL, e))?;
    evaluate(ctx, &CLONE).map_err(|e| failed(&CLONE, e))?;
    Ok(())
}
