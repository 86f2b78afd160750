//! Web APIs beyond prelude.js, each in its own file, installed in a runtime by one call after the prelude (the
//! seldom used ones, events.js and clone.js, on first use of one of their names: lazy.js):
//! `URL` and `URLSearchParams` (url.js, on the natives of url.rs), `DOMException`, `Event`, `EventTarget`,
//! `AbortController` and `AbortSignal` (events.js), and `structuredClone` (clone.js, which recognises the
//! other files' classes, so it comes last).
//!
//! The files are ES modules, kept as QuickJS bytecode after the first runtime compiles them (scripts.rs).

use crate::scripts::{describe, evaluate, Script};
use rquickjs::function::Func;
use rquickjs::{Ctx, Function};

static EVENTS: Script = Script::new("portico:events.js", include_str!("events.js"));
static URL: Script = Script::new("portico:url.js", include_str!("url.js"));
static CLONE: Script = Script::new("portico:clone.js", include_str!("clone.js"));
static LAZY: Script = Script::new("portico:lazy.js", include_str!("lazy.js"));

/// Defines the globals; `Err` is the exception's text (a bug in these files, never the handler's doing).
pub fn install(ctx: &Ctx<'_>) -> Result<(), String> {
    let failed = |file: &Script, e: rquickjs::Error| format!("{}: {}", file.name, describe(ctx, e));
    let url = evaluate(ctx, &URL).map_err(|e| failed(&URL, e))?;
    let setup: Function = url.get("default").map_err(|e| failed(&URL, e))?;
    let natives = crate::url::natives(ctx).map_err(|e| failed(&URL, e))?;
    setup.call::<_, ()>((natives,)).map_err(|e| failed(&URL, e))?;
    // events.js and clone.js on first use (lazy.js).
    let globals = ctx.globals();
    let load = |script: &'static Script| move |ctx: Ctx<'_>| evaluate(&ctx, script).map(|_| ());
    let set = |name: &str, f| globals.set(name, f).map_err(|e| failed(&LAZY, e));
    set("__portico_load_events", Func::from(load(&EVENTS)))?;
    set("__portico_load_clone", Func::from(load(&CLONE)))?;
    evaluate(ctx, &LAZY).map_err(|e| failed(&LAZY, e))?;
    Ok(())
}
