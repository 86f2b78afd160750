//! `URL` and `URLSearchParams` as classes made through QuickJS's C API, as native.rs makes Request and
//! Response: a URL keeps its record (url.rs: its href and the offsets of its parts) in Rust, and a getter makes
//! the one JavaScript string it is asked for, so that `new URL(request.url)` is one native call, one scan of
//! the text (url.rs's fast path) and one object. A URL and its `searchParams` share their state in Rust (the
//! record, and the list of name-value pairs, parsed from the query the first time it is needed; `get`, `getAll`
//! and `has` read an unparsed query without making the list): a change to either is seen by the other, and
//! neither holds the other's JavaScript object but the URL its `searchParams` (so no reference cycle, and a
//! request's URL is freed when the request is done). What the standard says of the init forms that run code
//! (a sequence of pairs, a record) and of the layout WebIDL gives an interface stays JavaScript (url.js).
//!
//! The natives find the classes by the magic number QuickJS hands each of them: the first of four class ids
//! made together in each runtime (URL, URLSearchParams, its iterator, and a hidden class whose prototype
//! object holds this context's constructors and url.js's helper). Everything here runs on the runtime's
//! thread while it is locked.

use crate::native::{arg, boolean, guard, int, is_exception, replace_surrogates, string, tag, Raw, RawCtx};
use crate::url::{self, Part, Record};
use rquickjs::{qjs, Ctx, Value};
use std::cell::{Cell, RefCell, RefMut};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::rc::Rc;

type Magic = unsafe extern "C" fn(RawCtx, Raw, c_int, *mut Raw, c_int) -> Raw;
type IteratorNext = unsafe extern "C" fn(RawCtx, Raw, c_int, *mut Raw, *mut c_int, c_int) -> Raw;

/// The classes, by their distance from the first id (the magic).
#[derive(Clone, Copy)]
enum Class {
    Url = 0,
    Params = 1,
    Iterator = 2,
    Slots = 3,
}

fn id(magic: c_int, class: Class) -> qjs::JSClassID {
    magic as qjs::JSClassID + class as qjs::JSClassID
}

/// What a URL and its searchParams share (a URLSearchParams of its own has no URL).
struct Shared {
    url: RefCell<Option<Record>>,
    /// The name-value pairs; `None` until needed, then parsed from the URL's query.
    list: RefCell<Option<Vec<(String, String)>>>,
    /// The URL's searchParams object, `undefined` until asked for: owned by the URL's object (its finalizer
    /// frees it, its gc_mark marks it), never by the searchParams' own.
    params: Cell<Raw>,
}

impl Shared {
    fn new(url: Option<Record>, list: Option<Vec<(String, String)>>) -> Rc<Shared> {
        Rc::new(Shared { url: RefCell::new(url), list: RefCell::new(list), params: Cell::new(qjs::JS_UNDEFINED) })
    }

    /// The list, parsed from the URL's query the first time.
    fn list(&self) -> RefMut<'_, Vec<(String, String)>> {
        RefMut::map(self.list.borrow_mut(), |list| {
            list.get_or_insert_with(|| self.url.borrow().as_ref().map_or_else(Vec::new, |r| url::form_parse(r.query())))
        })
    }

    /// Calls `f` on each pair until it says stop: on the list, or on the URL's query while it is unparsed.
    fn scan(&self, mut f: impl FnMut(&str, &str) -> bool) {
        if let Some(list) = &*self.list.borrow() {
            for (name, value) in list {
                if !f(name, value) {
                    return;
                }
            }
            return;
        }
        let url = self.url.borrow();
        let query = url.as_ref().map_or("", |r| r.query());
        for (name, value) in url::form_pairs(query) {
            if !f(&name, &value) {
                return;
            }
        }
    }

    /// The list changed: the URL's query follows (none for an empty list).
    fn update(&self) {
        if self.url.borrow().is_none() {
            return;
        }
        let text = url::form_serialize(&self.list());
        let mut url = self.url.borrow_mut();
        let Some(record) = url.as_mut() else { return };
        if let Some(changed) = record.set(Part::Search, &text) {
            *record = changed;
        }
    }
}

/// An iterator of a URLSearchParams: live, each step reads the list as it is then.
struct Iter {
    shared: Rc<Shared>,
    index: Cell<usize>,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Entries,
    Keys,
    Values,
}

/// This context's values the natives need, held by the hidden class's prototype object (so freed with the
/// context, and marked while it lives).
struct Slots {
    url_ctor: Raw,
    params_ctor: Raw,
    /// url.js's `(init) => [name, value, ...]` for an init that is an object (a sequence of pairs or a record).
    pairs_of: Raw,
}

// --------------------------------------------------------------------------------------------- helpers

/// A JavaScript value converted as WebIDL's USVString: ToString (a Symbol is a TypeError), each lone surrogate
/// a U+FFFD. Holds QuickJS's UTF-8 of it (no copy for a string of ASCII) until dropped.
struct Usv {
    ctx: RawCtx,
    ptr: *const c_char,
    len: usize,
    /// The text with its lone surrogates replaced, when it had some.
    fixed: Option<String>,
}

impl Usv {
    /// `Err`: an exception is pending.
    ///
    /// # Safety
    /// `ctx` is alive and `value` a value of it.
    unsafe fn new(ctx: RawCtx, value: Raw) -> Result<Usv, ()> {
        let mut len = 0;
        let ptr = if tag(value) == qjs::JS_TAG_STRING {
            qjs::JS_ToCStringLen2(ctx, &mut len, value, false)
        } else {
            // (ToString first: `JS_ToCStringLen2` would take an Error's message when its ToString throws,
            // leaving the exception pending.)
            let string = qjs::JS_ToString(ctx, value);
            if is_exception(string) {
                return Err(());
            }
            let ptr = qjs::JS_ToCStringLen2(ctx, &mut len, string, false);
            qjs::JS_FreeValue(ctx, string);
            ptr
        };
        if ptr.is_null() {
            return Err(());
        }
        let mut usv = Usv { ctx, ptr, len: len as usize, fixed: None };
        if std::str::from_utf8(usv.bytes()).is_err() {
            usv.fixed = Some(String::from_utf8_lossy(&replace_surrogates(usv.bytes())).into_owned());
        }
        Ok(usv)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: QuickJS's buffer of `len` bytes, alive until `JS_FreeCString` in drop.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    fn as_str(&self) -> &str {
        match &self.fixed {
            Some(fixed) => fixed,
            // SAFETY: checked to be UTF-8 when made (else `fixed` is set).
            None => unsafe { std::str::from_utf8_unchecked(self.bytes()) },
        }
    }
}

impl Drop for Usv {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `JS_ToCStringLen2` on this live context, and is freed once.
        unsafe { qjs::JS_FreeCString(self.ctx, self.ptr) }
    }
}

/// The `i`th argument as a USVString (`Err`: an exception is pending).
unsafe fn usv_arg(ctx: RawCtx, argc: c_int, argv: *mut Raw, i: usize) -> Result<Usv, ()> {
    Usv::new(ctx, arg(argc, argv, i))
}

/// The `i`th argument as an optional USVString: `None` when it is missing or undefined.
unsafe fn optional_arg(ctx: RawCtx, argc: c_int, argv: *mut Raw, i: usize) -> Result<Option<Usv>, ()> {
    let value = arg(argc, argv, i);
    if tag(value) == qjs::JS_TAG_UNDEFINED {
        return Ok(None);
    }
    Usv::new(ctx, value).map(Some)
}

/// Throws a TypeError with this message (NUL characters written `\0`).
fn throw(ctx: RawCtx, message: &str) -> Raw {
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: the context is alive; the message is a C string, passed through `%s`.
    unsafe { qjs::JS_ThrowTypeError(ctx, c"%s".as_ptr(), message.as_ptr()) }
}

/// WebIDL's TypeError for a call with fewer arguments than the operation requires, if it is one.
/// (`what` names the operation: "Failed to execute 'get' on 'URLSearchParams'".)
fn required(ctx: RawCtx, argc: c_int, count: c_int, what: impl FnOnce() -> String) -> Option<Raw> {
    (argc < count).then(|| {
        let s = if count > 1 { "s" } else { "" };
        throw(ctx, &format!("{}: {count} argument{s} required, but only {argc} present", what()))
    })
}

unsafe fn text(ctx: RawCtx, s: &str) -> Raw {
    string(ctx, s.as_bytes())
}

/// This context's slots.
unsafe fn slots<'a>(ctx: RawCtx, magic: c_int) -> Option<&'a mut Slots> {
    let proto = qjs::JS_GetClassProto(ctx, id(magic, Class::Slots));
    let slots = qjs::JS_GetOpaque(proto, id(magic, Class::Slots)).cast::<Slots>();
    // (The context keeps its reference to the object.)
    qjs::JS_FreeValue(ctx, proto);
    slots.as_mut()
}

/// What `value` holds if it is an object of `class` (URL or URLSearchParams).
unsafe fn shared_of<'a>(value: Raw, magic: c_int, class: Class) -> Option<&'a Shared> {
    qjs::JS_GetOpaque(value, id(magic, class)).cast::<Shared>().as_ref()
}

unsafe fn this_url<'a>(ctx: RawCtx, this: Raw, magic: c_int) -> Result<&'a Shared, Raw> {
    shared_of(this, magic, Class::Url).ok_or_else(|| throw(ctx, "not a URL"))
}

unsafe fn this_params<'a>(ctx: RawCtx, this: Raw, magic: c_int) -> Result<&'a Shared, Raw> {
    shared_of(this, magic, Class::Params).ok_or_else(|| throw(ctx, "not a URLSearchParams"))
}

/// A new object of `class` holding `shared` (owned; the exception marker when out of memory). Its prototype is
/// the class's, or `new_target.prototype` when constructed through another constructor (a subclass).
unsafe fn new_object(ctx: RawCtx, magic: c_int, class: Class, new_target: Option<Raw>, shared: Rc<Shared>) -> Raw {
    let mut proto = None;
    if let Some(target) = new_target {
        let ctor = slots(ctx, magic).map(|s| if matches!(class, Class::Url) { s.url_ctor } else { s.params_ctor });
        if ctor.is_none_or(|ctor| qjs::JS_VALUE_GET_PTR(target) != qjs::JS_VALUE_GET_PTR(ctor)) {
            let p = qjs::JS_GetPropertyStr(ctx, target, c"prototype".as_ptr());
            if is_exception(p) {
                return p;
            }
            if tag(p) == qjs::JS_TAG_OBJECT {
                proto = Some(p);
            } else {
                qjs::JS_FreeValue(ctx, p);
            }
        }
    }
    let object = match proto {
        Some(p) => {
            let object = qjs::JS_NewObjectProtoClass(ctx, p, id(magic, class));
            qjs::JS_FreeValue(ctx, p);
            object
        }
        None => qjs::JS_NewObjectClass(ctx, id(magic, class)),
    };
    if !is_exception(object) {
        qjs::JS_SetOpaque(object, Rc::into_raw(shared).cast_mut().cast());
    }
    object
}

// ------------------------------------------------------------------------------------------------- URL

unsafe extern "C" fn url_finalizer(rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Shared>();
    if data.is_null() {
        return;
    }
    let shared = Rc::from_raw(data);
    qjs::JS_FreeValueRT(rt, shared.params.replace(qjs::JS_UNDEFINED));
}

unsafe extern "C" fn url_mark(rt: *mut qjs::JSRuntime, value: Raw, mark: qjs::JS_MarkFunc) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Shared>();
    if let Some(shared) = data.as_ref() {
        qjs::JS_MarkValue(rt, shared.params.get(), mark);
    }
}

unsafe extern "C" fn params_finalizer(_rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Shared>();
    if !data.is_null() {
        drop(Rc::from_raw(data));
    }
}

/// `input` parsed (against `base`), or the TypeError of an invalid URL.
fn parse_or_throw(ctx: RawCtx, input: &Usv, base: Option<&Usv>) -> Result<Record, Raw> {
    url::parse(input.as_str(), base.map(Usv::as_str)).ok_or_else(|| {
        let message = match base {
            None => format!("Invalid URL: '{}'", input.as_str()),
            Some(base) => format!("Invalid URL: '{}' with base '{}'", input.as_str(), base.as_str()),
        };
        throw(ctx, &message)
    })
}

/// The URL and base arguments of the constructor and the statics (`Err`: an exception is pending).
unsafe fn url_args(ctx: RawCtx, argc: c_int, argv: *mut Raw) -> Result<(Usv, Option<Usv>), ()> {
    let input = usv_arg(ctx, argc, argv, 0)?;
    let base = optional_arg(ctx, argc, argv, 1)?;
    Ok((input, base))
}

/// `new URL(url, base)`.
unsafe extern "C" fn url_construct(ctx: RawCtx, new_target: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        if let Some(e) = required(ctx, argc, 1, || "Failed to construct 'URL'".into()) {
            return e;
        }
        let Ok((input, base)) = url_args(ctx, argc, argv) else { return qjs::JS_EXCEPTION };
        match parse_or_throw(ctx, &input, base.as_ref()) {
            Ok(record) => new_object(ctx, magic, Class::Url, Some(new_target), Shared::new(Some(record), None)),
            Err(e) => e,
        }
    })
}

/// `URL.parse(url, base)`: the URL, or null.
unsafe extern "C" fn url_parse(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        if let Some(e) = required(ctx, argc, 1, || "Failed to execute 'parse' on 'URL'".into()) {
            return e;
        }
        let Ok((input, base)) = url_args(ctx, argc, argv) else { return qjs::JS_EXCEPTION };
        match url::parse(input.as_str(), base.as_ref().map(Usv::as_str)) {
            Some(record) => new_object(ctx, magic, Class::Url, None, Shared::new(Some(record), None)),
            None => qjs::JS_NULL,
        }
    })
}

/// `URL.canParse(url, base)`.
unsafe extern "C" fn url_can_parse(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw, _magic: c_int) -> Raw {
    guard(ctx, || {
        if let Some(e) = required(ctx, argc, 1, || "Failed to execute 'canParse' on 'URL'".into()) {
            return e;
        }
        let Ok((input, base)) = url_args(ctx, argc, argv) else { return qjs::JS_EXCEPTION };
        boolean(url::parse(input.as_str(), base.as_ref().map(Usv::as_str)).is_some())
    })
}

/// A getter of a URL's part.
unsafe fn url_part(ctx: RawCtx, this: Raw, magic: c_int, part: impl FnOnce(&Record) -> Raw) -> Raw {
    guard(ctx, || match this_url(ctx, this, magic) {
        Err(e) => e,
        Ok(shared) => match &*shared.url.borrow() {
            Some(record) => part(record),
            None => throw(ctx, "not a URL"),
        },
    })
}

/// A setter of a URL's part.
unsafe fn url_set(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int, part: Part) -> Raw {
    guard(ctx, || {
        let shared = match this_url(ctx, this, magic) {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let Ok(value) = usv_arg(ctx, argc, argv, 0) else { return qjs::JS_EXCEPTION };
        let changed = shared.url.borrow().as_ref().and_then(|record| record.set(part, value.as_str()));
        match changed {
            Some(record) => {
                *shared.url.borrow_mut() = Some(record);
                // The query may have changed: the list is parsed again when next needed.
                if matches!(part, Part::Href | Part::Search) {
                    *shared.list.borrow_mut() = None;
                }
                qjs::JS_UNDEFINED
            }
            None if part == Part::Href => throw(ctx, &format!("Invalid URL: '{}'", value.as_str())),
            None => qjs::JS_UNDEFINED,
        }
    })
}

macro_rules! url_getters {
    ($($getter:ident => $part:expr;)*) => {$(
        unsafe extern "C" fn $getter(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
            url_part(ctx, this, magic, |record| {
                let s: &str = ($part)(record);
                text(ctx, s)
            })
        }
    )*};
}

url_getters! {
    url_href => Record::href;
    url_protocol => Record::protocol;
    url_username => Record::username;
    url_password => Record::password;
    url_host => Record::host;
    url_hostname => Record::hostname;
    url_port => Record::port;
    url_pathname => Record::pathname;
    url_search => Record::search;
    url_hash => Record::hash;
}

unsafe extern "C" fn url_origin(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    url_part(ctx, this, magic, |record| text(ctx, &record.origin()))
}

macro_rules! url_setters {
    ($($setter:ident => $part:expr;)*) => {$(
        unsafe extern "C" fn $setter(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
            url_set(ctx, this, argc, argv, magic, $part)
        }
    )*};
}

url_setters! {
    url_set_href => Part::Href;
    url_set_protocol => Part::Protocol;
    url_set_username => Part::Username;
    url_set_password => Part::Password;
    url_set_host => Part::Host;
    url_set_hostname => Part::Hostname;
    url_set_port => Part::Port;
    url_set_pathname => Part::Pathname;
    url_set_search => Part::Search;
    url_set_hash => Part::Hash;
}

/// `searchParams`: the same object each time, made on first use.
unsafe extern "C" fn url_search_params(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match this_url(ctx, this, magic) {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        if tag(shared.params.get()) != qjs::JS_TAG_OBJECT {
            // SAFETY (of the clone): the object's opaque is an `Rc` this call holds a reference into.
            let rc = {
                let ptr: *const Shared = shared;
                Rc::increment_strong_count(ptr);
                Rc::from_raw(ptr)
            };
            let params = new_object(ctx, magic, Class::Params, None, rc);
            if is_exception(params) {
                return params;
            }
            shared.params.set(params);
        }
        qjs::JS_DupValue(ctx, shared.params.get())
    })
}

// -------------------------------------------------------------------------------------- URLSearchParams

/// `new URLSearchParams(init)`: a sequence of pairs or a record (through url.js), or a string (a leading `?`
/// left out).
unsafe extern "C" fn params_construct(ctx: RawCtx, new_target: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let init = arg(argc, argv, 0);
        let list = match tag(init) {
            qjs::JS_TAG_UNDEFINED => Vec::new(),
            qjs::JS_TAG_OBJECT => match pairs_of(ctx, magic, init) {
                Ok(list) => list,
                Err(()) => return qjs::JS_EXCEPTION,
            },
            _ => {
                let Ok(text) = Usv::new(ctx, init) else { return qjs::JS_EXCEPTION };
                let text = text.as_str();
                url::form_parse(text.strip_prefix('?').unwrap_or(text))
            }
        };
        new_object(ctx, magic, Class::Params, Some(new_target), Shared::new(None, Some(list)))
    })
}

/// An object init's pairs, by url.js's helper (`Err`: an exception is pending).
unsafe fn pairs_of(ctx: RawCtx, magic: c_int, init: Raw) -> Result<Vec<(String, String)>, ()> {
    let Some(helper) = slots(ctx, magic).map(|s| s.pairs_of) else {
        throw(ctx, "URLSearchParams is not set up");
        return Err(());
    };
    let mut args = [init];
    let flat = qjs::JS_Call(ctx, helper, qjs::JS_UNDEFINED, 1, args.as_mut_ptr());
    if is_exception(flat) {
        return Err(());
    }
    let result = (|| {
        let mut length = 0i64;
        if qjs::JS_GetLength(ctx, flat, &mut length) < 0 {
            return Err(());
        }
        let mut list = Vec::with_capacity(usize::try_from(length / 2).unwrap_or(0));
        let mut i = 0;
        while i + 1 < length {
            let item = |index: i64| -> Result<String, ()> {
                let value = qjs::JS_GetPropertyInt64(ctx, flat, index);
                if is_exception(value) {
                    return Err(());
                }
                let converted = Usv::new(ctx, value).map(|s| s.as_str().to_string());
                qjs::JS_FreeValue(ctx, value);
                converted
            };
            let name = item(i)?;
            let value = item(i + 1)?;
            list.push((name, value));
            i += 2;
        }
        Ok(list)
    })();
    qjs::JS_FreeValue(ctx, flat);
    result
}

/// `setPairsOf(helper)`: url.js's conversion of an object init.
unsafe extern "C" fn params_set_pairs_of(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || match slots(ctx, magic) {
        Some(slots) => {
            qjs::JS_FreeValue(ctx, slots.pairs_of);
            slots.pairs_of = qjs::JS_DupValue(ctx, arg(argc, argv, 0));
            qjs::JS_UNDEFINED
        }
        None => throw(ctx, "URLSearchParams is not set up"),
    })
}

/// A method's `this` and its arguments checked: the shared state, or the exception to return.
unsafe fn method<'a>(
    ctx: RawCtx,
    this: Raw,
    magic: c_int,
    argc: c_int,
    count: c_int,
    name: &str,
) -> Result<&'a Shared, Raw> {
    let shared = this_params(ctx, this, magic)?;
    match required(ctx, argc, count, || format!("Failed to execute '{name}' on 'URLSearchParams'")) {
        Some(e) => Err(e),
        None => Ok(shared),
    }
}

unsafe extern "C" fn params_size(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || match this_params(ctx, this, magic) {
        Ok(shared) => int(i32::try_from(shared.list().len()).unwrap_or(i32::MAX)),
        Err(e) => e,
    })
}

unsafe extern "C" fn params_append(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 2, "append") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let (Ok(name), Ok(value)) = (usv_arg(ctx, argc, argv, 0), usv_arg(ctx, argc, argv, 1)) else {
            return qjs::JS_EXCEPTION;
        };
        shared.list().push((name.as_str().to_string(), value.as_str().to_string()));
        shared.update();
        qjs::JS_UNDEFINED
    })
}

unsafe extern "C" fn params_delete(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 1, "delete") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let Ok(name) = usv_arg(ctx, argc, argv, 0) else { return qjs::JS_EXCEPTION };
        let Ok(value) = optional_arg(ctx, argc, argv, 1) else { return qjs::JS_EXCEPTION };
        let (name, value) = (name.as_str(), value.as_ref().map(Usv::as_str));
        shared.list().retain(|(n, v)| n != name || value.is_some_and(|value| v != value));
        shared.update();
        qjs::JS_UNDEFINED
    })
}

unsafe extern "C" fn params_get(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 1, "get") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let Ok(name) = usv_arg(ctx, argc, argv, 0) else { return qjs::JS_EXCEPTION };
        let name = name.as_str();
        let mut found = qjs::JS_NULL;
        shared.scan(|n, v| {
            if n == name {
                found = text(ctx, v);
                return false;
            }
            true
        });
        found
    })
}

unsafe extern "C" fn params_get_all(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 1, "getAll") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let Ok(name) = usv_arg(ctx, argc, argv, 0) else { return qjs::JS_EXCEPTION };
        let name = name.as_str();
        let mut values = Vec::new();
        shared.scan(|n, v| {
            if n == name {
                values.push(text(ctx, v));
            }
            true
        });
        array(ctx, values)
    })
}

/// An array of `items` (owned; freed if it cannot be made).
unsafe fn array(ctx: RawCtx, mut items: Vec<Raw>) -> Raw {
    if items.iter().any(|v| is_exception(*v)) {
        for v in items {
            qjs::JS_FreeValue(ctx, v);
        }
        return qjs::JS_EXCEPTION;
    }
    let Ok(count) = c_int::try_from(items.len()) else {
        for v in items {
            qjs::JS_FreeValue(ctx, v);
        }
        return throw(ctx, "too many items for an array");
    };
    qjs::JS_NewArrayFrom(ctx, count, items.as_mut_ptr())
}

unsafe extern "C" fn params_has(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 1, "has") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let Ok(name) = usv_arg(ctx, argc, argv, 0) else { return qjs::JS_EXCEPTION };
        let Ok(value) = optional_arg(ctx, argc, argv, 1) else { return qjs::JS_EXCEPTION };
        let (name, value) = (name.as_str(), value.as_ref().map(Usv::as_str));
        let mut found = false;
        shared.scan(|n, v| {
            found = n == name && value.is_none_or(|value| v == value);
            !found
        });
        boolean(found)
    })
}

unsafe extern "C" fn params_set(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 2, "set") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let (Ok(name), Ok(value)) = (usv_arg(ctx, argc, argv, 0), usv_arg(ctx, argc, argv, 1)) else {
            return qjs::JS_EXCEPTION;
        };
        let (name, value) = (name.as_str(), value.as_str());
        {
            let mut list = shared.list();
            match list.iter().position(|(n, _)| n == name) {
                Some(first) => {
                    list[first].1 = value.to_string();
                    let mut i = 0;
                    list.retain(|(n, _)| {
                        i += 1;
                        i - 1 <= first || n != name
                    });
                }
                None => list.push((name.to_string(), value.to_string())),
            }
        }
        shared.update();
        qjs::JS_UNDEFINED
    })
}

/// `sort()`: stable, by the names' UTF-16 code units.
unsafe extern "C" fn params_sort(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || match this_params(ctx, this, magic) {
        Ok(shared) => {
            shared.list().sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            shared.update();
            qjs::JS_UNDEFINED
        }
        Err(e) => e,
    })
}

unsafe extern "C" fn params_for_each(ctx: RawCtx, this: Raw, argc: c_int, argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || {
        let shared = match method(ctx, this, magic, argc, 1, "forEach") {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let (callback, this_arg) = (arg(argc, argv, 0), arg(argc, argv, 1));
        if !qjs::JS_IsFunction(ctx, callback) {
            return throw(ctx, "Failed to execute 'forEach' on 'URLSearchParams': the callback is not a function");
        }
        // Live: the list is read again at each step (the callback may change it).
        let mut i = 0;
        loop {
            let pair = shared.list().get(i).cloned();
            let Some((name, value)) = pair else { return qjs::JS_UNDEFINED };
            let mut args = [text(ctx, &value), text(ctx, &name), this];
            let result = if is_exception(args[0]) || is_exception(args[1]) {
                qjs::JS_EXCEPTION
            } else {
                qjs::JS_Call(ctx, callback, this_arg, 3, args.as_mut_ptr())
            };
            qjs::JS_FreeValue(ctx, args[0]);
            qjs::JS_FreeValue(ctx, args[1]);
            if is_exception(result) {
                return result;
            }
            qjs::JS_FreeValue(ctx, result);
            i += 1;
        }
    })
}

unsafe extern "C" fn params_to_string(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    guard(ctx, || match this_params(ctx, this, magic) {
        Ok(shared) => text(ctx, &url::form_serialize(&shared.list())),
        Err(e) => e,
    })
}

unsafe fn iterate(ctx: RawCtx, this: Raw, magic: c_int, kind: Kind) -> Raw {
    guard(ctx, || {
        let shared = match this_params(ctx, this, magic) {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        let ptr: *const Shared = shared;
        Rc::increment_strong_count(ptr);
        let iter = Box::new(Iter { shared: Rc::from_raw(ptr), index: Cell::new(0), kind });
        let object = qjs::JS_NewObjectClass(ctx, id(magic, Class::Iterator));
        if !is_exception(object) {
            qjs::JS_SetOpaque(object, Box::into_raw(iter).cast());
        }
        object
    })
}

unsafe extern "C" fn params_entries(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    iterate(ctx, this, magic, Kind::Entries)
}

unsafe extern "C" fn params_keys(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    iterate(ctx, this, magic, Kind::Keys)
}

unsafe extern "C" fn params_values(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw, magic: c_int) -> Raw {
    iterate(ctx, this, magic, Kind::Values)
}

/// The iterator's `next()`: QuickJS makes the `{ value, done }` of what this gives.
unsafe extern "C" fn iterator_next(
    ctx: RawCtx,
    this: Raw,
    _argc: c_int,
    _argv: *mut Raw,
    done: *mut c_int,
    magic: c_int,
) -> Raw {
    *done = 0;
    guard(ctx, || {
        let Some(iter) = qjs::JS_GetOpaque(this, id(magic, Class::Iterator)).cast::<Iter>().as_ref() else {
            return throw(ctx, "not a URLSearchParams Iterator");
        };
        let index = iter.index.get();
        let Some((name, value)) = iter.shared.list().get(index).cloned() else {
            *done = 1;
            return qjs::JS_UNDEFINED;
        };
        iter.index.set(index + 1);
        match iter.kind {
            Kind::Keys => text(ctx, &name),
            Kind::Values => text(ctx, &value),
            Kind::Entries => array(ctx, vec![text(ctx, &name), text(ctx, &value)]),
        }
    })
}

unsafe extern "C" fn iterator_finalizer(_rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Iter>();
    if !data.is_null() {
        drop(Box::from_raw(data));
    }
}

// ------------------------------------------------------------------------------------------------ slots

unsafe extern "C" fn slots_finalizer(rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Slots>();
    if !data.is_null() {
        let slots = Box::from_raw(data);
        for value in [slots.url_ctor, slots.params_ctor, slots.pairs_of] {
            qjs::JS_FreeValueRT(rt, value);
        }
    }
}

unsafe extern "C" fn slots_mark(rt: *mut qjs::JSRuntime, value: Raw, mark: qjs::JS_MarkFunc) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<Slots>();
    if let Some(slots) = data.as_ref() {
        for value in [slots.url_ctor, slots.params_ctor, slots.pairs_of] {
            qjs::JS_MarkValue(rt, value, mark);
        }
    }
}

// ---------------------------------------------------------------------------------------------- install

/// A C function called with `magic` (owned).
unsafe fn function(ctx: RawCtx, f: Magic, name: &CStr, length: c_int, kind: qjs::JSCFunctionEnum, magic: c_int) -> Raw {
    // SAFETY: QuickJS calls a function made with a `_magic` kind through the `generic_magic` member of its
    // union, whose type `Magic` is (the C macro `JS_NewCFunctionMagic` makes the same cast).
    let generic = std::mem::transmute::<Magic, unsafe extern "C" fn(RawCtx, Raw, c_int, *mut Raw) -> Raw>(f);
    qjs::JS_NewCFunction2(ctx, Some(generic), name.as_ptr(), length, kind, magic)
}

/// Defines an accessor as WebIDL lays out an attribute (enumerable, configurable).
unsafe fn accessor(
    ctx: RawCtx,
    object: Raw,
    name: &CStr,
    get: Magic,
    set: Option<Magic>,
    magic: c_int,
) -> Result<(), ()> {
    let named = |prefix: &str| CString::new(format!("{prefix} {}", name.to_string_lossy())).map_err(|_| ());
    let getter = function(ctx, get, &named("get")?, 0, qjs::JSCFunctionEnum_JS_CFUNC_generic_magic, magic);
    let setter = match set {
        Some(set) => function(ctx, set, &named("set")?, 1, qjs::JSCFunctionEnum_JS_CFUNC_generic_magic, magic),
        None => qjs::JS_UNDEFINED,
    };
    if is_exception(getter) || is_exception(setter) {
        qjs::JS_FreeValue(ctx, getter);
        qjs::JS_FreeValue(ctx, setter);
        return Err(());
    }
    let atom = qjs::JS_NewAtom(ctx, name.as_ptr());
    let flags = (qjs::JS_PROP_CONFIGURABLE | qjs::JS_PROP_ENUMERABLE) as c_int;
    let defined = qjs::JS_DefinePropertyGetSet(ctx, object, atom, getter, setter, flags);
    qjs::JS_FreeAtom(ctx, atom);
    if defined < 0 {
        Err(())
    } else {
        Ok(())
    }
}

/// Defines a value property (writable, enumerable, configurable: WebIDL's operations), taking `value`.
unsafe fn define(ctx: RawCtx, object: Raw, name: &CStr, value: Raw) -> Result<(), ()> {
    if is_exception(value)
        || qjs::JS_DefinePropertyValueStr(ctx, object, name.as_ptr(), value, qjs::JS_PROP_C_W_E as c_int) < 0
    {
        return Err(());
    }
    Ok(())
}

unsafe fn operation(ctx: RawCtx, object: Raw, name: &CStr, f: Magic, length: c_int, magic: c_int) -> Result<(), ()> {
    define(ctx, object, name, function(ctx, f, name, length, qjs::JSCFunctionEnum_JS_CFUNC_generic_magic, magic))
}

/// A class's prototype and constructor (both owned), linked.
unsafe fn class(
    ctx: RawCtx,
    magic: c_int,
    class: Class,
    name: &CStr,
    ctor: Magic,
    length: c_int,
) -> Result<(Raw, Raw), ()> {
    let proto = qjs::JS_NewObject(ctx);
    let ctor = function(ctx, ctor, name, length, qjs::JSCFunctionEnum_JS_CFUNC_constructor_magic, magic);
    if is_exception(proto) || is_exception(ctor) {
        qjs::JS_FreeValue(ctx, proto);
        qjs::JS_FreeValue(ctx, ctor);
        return Err(());
    }
    qjs::JS_SetConstructor(ctx, ctor, proto);
    qjs::JS_SetClassProto(ctx, id(magic, class), qjs::JS_DupValue(ctx, proto));
    Ok((proto, ctor))
}

/// Makes the classes in this runtime and returns what url.js's setup takes: `{ URL, URLSearchParams,
/// iteratorPrototype, setPairsOf }` (url.js defines the globals, the @@toStringTag and @@iterator
/// properties, and the init conversions that run JavaScript).
pub fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    let failed = || rquickjs::Error::new_from_js_message("classes", "URL", "the URL classes could not be made");
    // SAFETY: the context is alive and locked; every value made is owned by a class, the slots or the returned
    // object, or freed.
    unsafe {
        let rt = qjs::JS_GetRuntime(raw);
        let mut ids = [0; 4];
        for id in &mut ids {
            qjs::JS_NewClassID(rt, id);
        }
        // (Made one after the other, they follow each other: the first one, as the magic, finds them all.)
        let magic = ids[0];
        if ids.iter().enumerate().any(|(i, id)| *id != magic + i as u32) || magic + 3 > i16::MAX as u32 {
            return Err(failed());
        }
        let magic = magic as c_int;
        let defs: [(Class, &CStr, qjs::JSClassFinalizer, qjs::JSClassGCMark); 4] = [
            (Class::Url, c"URL", Some(url_finalizer), Some(url_mark)),
            (Class::Params, c"URLSearchParams", Some(params_finalizer), None),
            (Class::Iterator, c"URLSearchParams Iterator", Some(iterator_finalizer), None),
            (Class::Slots, c"PorticoUrlSlots", Some(slots_finalizer), Some(slots_mark)),
        ];
        for (class, name, finalizer, gc_mark) in defs {
            let def = qjs::JSClassDef {
                class_name: name.as_ptr(),
                finalizer,
                gc_mark,
                call: None,
                exotic: std::ptr::null_mut(),
            };
            if qjs::JS_NewClass(rt, id(magic, class), &def) < 0 {
                return Err(failed());
            }
        }
        let handed = qjs::JS_NewObject(raw);
        if is_exception(handed) {
            return Err(failed());
        }
        let handed_value = Value::from_raw(ctx.clone(), handed);
        let built = (|| -> Result<(), ()> {
            let slots = qjs::JS_NewObjectProtoClass(raw, qjs::JS_NULL, id(magic, Class::Slots));
            if is_exception(slots) {
                return Err(());
            }
            let slots_data = Box::into_raw(Box::new(Slots {
                url_ctor: qjs::JS_UNDEFINED,
                params_ctor: qjs::JS_UNDEFINED,
                pairs_of: qjs::JS_UNDEFINED,
            }));
            qjs::JS_SetOpaque(slots, slots_data.cast::<c_void>());
            qjs::JS_SetClassProto(raw, id(magic, Class::Slots), slots);
            let slots = &mut *slots_data;

            let (proto, ctor) = class(raw, magic, Class::Url, c"URL", url_construct, 1)?;
            slots.url_ctor = qjs::JS_DupValue(raw, ctor);
            define(raw, handed, c"URL", ctor)?;
            let getters: [(&CStr, Magic, Option<Magic>); 12] = [
                (c"href", url_href, Some(url_set_href)),
                (c"origin", url_origin, None),
                (c"protocol", url_protocol, Some(url_set_protocol)),
                (c"username", url_username, Some(url_set_username)),
                (c"password", url_password, Some(url_set_password)),
                (c"host", url_host, Some(url_set_host)),
                (c"hostname", url_hostname, Some(url_set_hostname)),
                (c"port", url_port, Some(url_set_port)),
                (c"pathname", url_pathname, Some(url_set_pathname)),
                (c"search", url_search, Some(url_set_search)),
                (c"searchParams", url_search_params, None),
                (c"hash", url_hash, Some(url_set_hash)),
            ];
            let result = (|| {
                for (name, get, set) in getters {
                    accessor(raw, proto, name, get, set, magic)?;
                }
                operation(raw, proto, c"toString", url_href, 0, magic)?;
                operation(raw, proto, c"toJSON", url_href, 0, magic)?;
                operation(raw, slots.url_ctor, c"parse", url_parse, 1, magic)?;
                operation(raw, slots.url_ctor, c"canParse", url_can_parse, 1, magic)
            })();
            qjs::JS_FreeValue(raw, proto);
            result?;

            let (proto, ctor) = class(raw, magic, Class::Params, c"URLSearchParams", params_construct, 0)?;
            slots.params_ctor = qjs::JS_DupValue(raw, ctor);
            define(raw, handed, c"URLSearchParams", ctor)?;
            let result: Result<(), ()> = (|| {
                accessor(raw, proto, c"size", params_size, None, magic)?;
                let operations: [(&CStr, Magic, c_int); 13] = [
                    (c"append", params_append, 2),
                    (c"delete", params_delete, 1),
                    (c"get", params_get, 1),
                    (c"getAll", params_get_all, 1),
                    (c"has", params_has, 1),
                    (c"set", params_set, 2),
                    (c"sort", params_sort, 0),
                    (c"forEach", params_for_each, 1),
                    (c"entries", params_entries, 0),
                    (c"keys", params_keys, 0),
                    (c"values", params_values, 0),
                    (c"toString", params_to_string, 0),
                    (c"setPairsOf", params_set_pairs_of, 1),
                ];
                for (name, f, length) in operations {
                    // (setPairsOf is url.js's, not the prototype's.)
                    let target = if name == c"setPairsOf" { handed } else { proto };
                    operation(raw, target, name, f, length, magic)?;
                }
                Ok(())
            })();
            qjs::JS_FreeValue(raw, proto);
            result?;

            let proto = qjs::JS_NewObject(raw);
            if is_exception(proto) {
                return Err(());
            }
            qjs::JS_SetClassProto(raw, id(magic, Class::Iterator), qjs::JS_DupValue(raw, proto));
            let next = std::mem::transmute::<IteratorNext, unsafe extern "C" fn(RawCtx, Raw, c_int, *mut Raw) -> Raw>(
                iterator_next,
            );
            let next = qjs::JS_NewCFunction2(
                raw,
                Some(next),
                c"next".as_ptr(),
                0,
                qjs::JSCFunctionEnum_JS_CFUNC_iterator_next,
                magic,
            );
            let result = define(raw, proto, c"next", next);
            define(raw, handed, c"iteratorPrototype", proto)?;
            result
        })();
        if built.is_err() {
            return Err(failed());
        }
        Ok(handed_value)
    }
}
