//! The native side of `URL` and `URLSearchParams` (url.js builds the classes on these): the WHATWG URL parser
//! and its setters from the `url` crate (`url::quirks` is the URL Standard's API on it), and the
//! `application/x-www-form-urlencoded` parser and serializer from `form_urlencoded`. No hand-written parsing.
//!
//! A parsed URL crosses to JavaScript as one array: its serialization (`href`) and the offsets of its parts
//! in it, from which the getters slice, so that `new URL(request.url)` is one native call and one new string.
//! The natives are handed to url.js's setup function, not set as globals: handlers cannot call them directly,
//! and whatever url.js passes them is checked here (a wrong type is a `TypeError`, never a panic).

use rquickjs::function::{Func, Opt};
use rquickjs::{Array, Ctx, Object, Value};
use url::{Position, Url};

use crate::array::array_from;

/// `[href, ...offsets]` (offsets in UTF-16 code units, as JavaScript strings count): after the scheme, before
/// and after the username, the password, the host (without its port), the port, then before and after the path
/// and after the query.
fn components<'js>(ctx: &Ctx<'js>, url: &Url) -> rquickjs::Result<Array<'js>> {
    let href = url.as_str();
    let at = |position: Position| url[..position].len();
    // (`Position::BeforePassword` and `AfterPassword` are wrong for a username without a password, and
    // debug builds assert there: the password's place is found from where the host starts.)
    let (before_password, after_password) = match url.password() {
        Some(password) => {
            let end = at(Position::BeforeHost).saturating_sub("@".len());
            (end.saturating_sub(password.len()), end)
        }
        None => (at(Position::AfterUsername), at(Position::AfterUsername)),
    };
    let offsets = [
        at(Position::AfterScheme),
        at(Position::BeforeUsername),
        at(Position::AfterUsername),
        before_password,
        after_password,
        at(Position::BeforeHost),
        at(Position::AfterHost),
        at(Position::BeforePort),
        at(Position::AfterPort),
        at(Position::BeforePath),
        at(Position::AfterPath),
        at(Position::AfterQuery),
    ];
    let mut items = Vec::with_capacity(1 + offsets.len());
    items.push(rquickjs::String::from_str(ctx.clone(), href)?.into_value());
    // A serialized URL is ASCII (everything else is percent-encoded or punycode): bytes are code units. The
    // other case is counted anyway, should the crate ever serialize otherwise.
    let ascii = href.is_ascii();
    for bytes in offsets {
        let units = if ascii { bytes } else { href.get(..bytes).map_or(0, |s| s.encode_utf16().count()) };
        items.push(Value::new_int(ctx.clone(), i32::try_from(units).unwrap_or(i32::MAX)));
    }
    array_from(ctx, items)
}

/// Runs a native's body; a panic in it (a bug in a crate, whatever the input) is a `TypeError` for the
/// script, not a panic carried through QuickJS into the worker.
pub(crate) fn guarded<T>(what: &'static str, body: impl FnOnce() -> rquickjs::Result<T>) -> rquickjs::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|_| {
        Err(rquickjs::Error::new_from_js_message("value", what, format!("the {what} failed on this input")))
    })
}

/// `input` parsed against `base` (itself parsed first); `undefined` when either is not a URL.
fn parse<'js>(ctx: Ctx<'js>, input: String, base: Opt<String>) -> rquickjs::Result<Option<Array<'js>>> {
    guarded("URL parser", || parse_unguarded(&ctx, &input, base.0.as_deref()))
}

fn parse_unguarded<'js>(ctx: &Ctx<'js>, input: &str, base: Option<&str>) -> rquickjs::Result<Option<Array<'js>>> {
    let parsed = match base {
        None => Url::parse(input),
        Some(base) => match Url::parse(base) {
            Ok(base) => base.join(input),
            Err(_) => return Ok(None),
        },
    };
    match parsed {
        Ok(url) => components(ctx, &url).map(Some),
        Err(_) => Ok(None),
    }
}

/// The URL `href` with one of its parts set as the URL Standard's setter for it does (`which`: 0 href,
/// 1 protocol, 2 username, 3 password, 4 host, 5 hostname, 6 port, 7 pathname, 8 search, 9 hash). A value
/// the setter refuses leaves the URL as it was; `undefined` only when `href` (or, for 0, `value`) is no URL.
fn set<'js>(ctx: Ctx<'js>, href: String, which: u32, value: String) -> rquickjs::Result<Option<Array<'js>>> {
    guarded("URL setter", || set_unguarded(&ctx, &href, which, &value))
}

fn set_unguarded<'js>(ctx: &Ctx<'js>, href: &str, which: u32, value: &str) -> rquickjs::Result<Option<Array<'js>>> {
    let Ok(mut url) = Url::parse(href) else { return Ok(None) };
    use url::quirks;
    // Each setter's refusal is the URL left unchanged, as the standard's setters return silently.
    let _ = match which {
        0 => match Url::parse(value) {
            Ok(new) => {
                url = new;
                Ok(())
            }
            Err(_) => return Ok(None),
        },
        1 => quirks::set_protocol(&mut url, value),
        2 => quirks::set_username(&mut url, value),
        3 => quirks::set_password(&mut url, value),
        4 => quirks::set_host(&mut url, value),
        5 => quirks::set_hostname(&mut url, value),
        6 => quirks::set_port(&mut url, value),
        7 => {
            quirks::set_pathname(&mut url, value);
            Ok(())
        }
        8 => {
            quirks::set_search(&mut url, value);
            Ok(())
        }
        9 => {
            quirks::set_hash(&mut url, value);
            Ok(())
        }
        _ => return Err(rquickjs::Error::new_from_js_message("number", "URL part", format!("no URL part {which}"))),
    };
    components(ctx, &url).map(Some)
}

/// `application/x-www-form-urlencoded` text as `[name, value, name, value, ...]` (invalid UTF-8 after
/// percent-decoding is U+FFFD, as the standard's parser does).
fn form_parse<'js>(ctx: Ctx<'js>, text: String) -> rquickjs::Result<Array<'js>> {
    guarded("form parser", || form_parse_unguarded(&ctx, &text))
}

fn form_parse_unguarded<'js>(ctx: &Ctx<'js>, text: &str) -> rquickjs::Result<Array<'js>> {
    let mut items = Vec::new();
    for (name, value) in form_urlencoded::parse(text.as_bytes()) {
        items.push(rquickjs::String::from_str(ctx.clone(), &name)?.into_value());
        items.push(rquickjs::String::from_str(ctx.clone(), &value)?.into_value());
    }
    array_from(ctx, items)
}

/// `[name, value, name, value, ...]` serialized as `application/x-www-form-urlencoded` (a last name without
/// a value is ignored).
fn form_serialize(list: Vec<String>) -> rquickjs::Result<String> {
    guarded("form serializer", || {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        for pair in list.chunks_exact(2) {
            serializer.append_pair(&pair[0], &pair[1]);
        }
        Ok(serializer.finish())
    })
}

/// The natives url.js's setup function takes.
pub fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Value<'js>> {
    let natives = Object::new(ctx.clone())?;
    natives.set("parse", Func::from(parse))?;
    natives.set("set", Func::from(set))?;
    natives.set("formParse", Func::from(form_parse))?;
    natives.set("formSerialize", Func::from(form_serialize))?;
    Ok(natives.into_value())
}
