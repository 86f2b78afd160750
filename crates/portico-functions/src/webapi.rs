//! Web APIs beyond prelude.js, each in its own file, installed in a runtime by one call after the prelude (the
//! ones a handler may not need, events.js, clone.js, encoding.js and crypto.js, on first use of one of their
//! names: lazy.js):
//! `URL` and `URLSearchParams` (native classes, url_class.rs, finished by url.js), `DOMException`, `Event`, `EventTarget`,
//! `AbortController` and `AbortSignal` (events.js), `structuredClone` (clone.js, which recognises the other
//! files' classes), `TextEncoder`, `TextDecoder` and their streams (encoding.js, on encoding.rs), and `crypto`
//! (crypto.js, on crypto.rs).
//!
//! The files are ES modules, kept as QuickJS bytecode after the first runtime compiles them (scripts.rs). Those
//! with natives export a setup function that takes them, so that they stay out of the handler's reach.

use crate::scripts::{describe, evaluate, Script};
use rquickjs::function::Func;
use rquickjs::{Ctx, Function, Value};

static EVENTS: Script = Script::new("portico:events.js", include_str!("events.js"));
static URL: Script = Script::new("portico:url.js", include_str!("url.js"));
static CLONE: Script = Script::new("portico:clone.js", include_str!("clone.js"));
static ENCODING: Script = Script::new("portico:encoding.js", include_str!("encoding.js"));
static CRYPTO: Script = Script::new("portico:crypto.js", include_str!("crypto.js"));
static LAZY: Script = Script::new("portico:lazy.js", include_str!("lazy.js"));

type Natives = for<'js> fn(&Ctx<'js>) -> rquickjs::Result<Value<'js>>;

/// Evaluates the file and calls its default export with its natives.
fn set_up(ctx: &Ctx<'_>, script: &'static Script, natives: Natives) -> rquickjs::Result<()> {
    let module = evaluate(ctx, script)?;
    let setup: Function = module.get("default")?;
    setup.call((natives(ctx)?,))
}

/// Defines the globals; `Err` is the exception's text (a bug in these files, never the handler's doing).
pub fn install(ctx: &Ctx<'_>) -> Result<(), String> {
    let failed = |file: &Script, e: rquickjs::Error| format!("{}: {}", file.name, describe(ctx, e));
    set_up(ctx, &URL, crate::url_class::natives).map_err(|e| failed(&URL, e))?;
    // The others on first use (lazy.js).
    let globals = ctx.globals();
    let load = |script: &'static Script| move |ctx: Ctx<'_>| evaluate(&ctx, script).map(|_| ());
    let load_with = |script: &'static Script, natives: Natives| move |ctx: Ctx<'_>| set_up(&ctx, script, natives);
    let check = |result: rquickjs::Result<()>| result.map_err(|e| failed(&LAZY, e));
    check(globals.set("__portico_load_events", Func::from(load(&EVENTS))))?;
    check(globals.set("__portico_load_clone", Func::from(load(&CLONE))))?;
    check(globals.set("__portico_load_encoding", Func::from(load_with(&ENCODING, crate::encoding::natives))))?;
    check(globals.set("__portico_load_crypto", Func::from(load_with(&CRYPTO, crate::crypto::natives))))?;
    evaluate(ctx, &LAZY).map_err(|e| failed(&LAZY, e))?;
    Ok(())
}
