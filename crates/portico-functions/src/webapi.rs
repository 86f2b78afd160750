//! Web APIs beyond prelude.js, each in its own file, installed in a runtime by one call after the prelude:
//! `URL` and `URLSearchParams` (url.js, on the natives of url.rs), `DOMException`, `Event`, `EventTarget`,
//! `AbortController` and `AbortSignal` (events.js), and `structuredClone` (clone.js, which recognises the
//! other files' classes, so it comes last).

use rquickjs::{Ctx, Function};

const URL_JS: &str = include_str!("url.js");
const EVENTS_JS: &str = include_str!("events.js");
const CLONE_JS: &str = include_str!("clone.js");

/// Defines the globals; `Err` is the exception's text (a bug in these files, never the handler's doing).
pub fn install(ctx: &Ctx<'_>) -> Result<(), String> {
    let failed = |file: &str, e: rquickjs::Error| format!("{file}: {}", describe(ctx, e));
    ctx.eval::<(), _>(EVENTS_JS).map_err(|e| failed("events.js", e))?;
    let setup: Function = ctx.eval(URL_JS).map_err(|e| failed("url.js", e))?;
    let natives = crate::url::natives(ctx).map_err(|e| failed("url.rs", e))?;
    setup.call::<_, ()>((natives,)).map_err(|e| failed("url.js", e))?;
    ctx.eval::<(), _>(CLONE_JS).map_err(|e| failed("clone.js", e))?;
    Ok(())
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
