//! Classes made through QuickJS's C API, for the objects a handler makes or gets on every request. A class
//! written in JavaScript costs QuickJS a constructor call, a private field and a state array per object
//! (`Response.json` made one for about 19,000 instructions), and rquickjs's safe wrappers about 400
//! instructions a call more than a C function: these classes keep what Portico gave or what a fast path made
//! in Rust, and make JavaScript values of it only when a handler asks (bench/RESULTS.md).
//!
//! What the standards say of the objects stays in JavaScript (prelude.js): it reaches an object's state
//! array through `responseState`, which makes that array the first time it is needed. The fast paths here
//! take only what they are sure of (`new Response(text)`, `Response.json(data)` without an init) and hand
//! everything else to prelude.js's own code.
//!
//! Everything here runs on the runtime's thread while it is locked: the raw values are this context's.

use bytes::Bytes;
use rquickjs::{qjs, Ctx};
use std::ffi::{c_int, CStr};
use std::panic::AssertUnwindSafe;

pub(crate) type Raw = qjs::JSValue;
pub(crate) type RawCtx = *mut qjs::JSContext;
pub(crate) type Native = unsafe extern "C" fn(RawCtx, Raw, c_int, *mut Raw) -> Raw;
pub(crate) type Finalizer = unsafe extern "C" fn(*mut qjs::JSRuntime, Raw);
pub(crate) type Marker = unsafe extern "C" fn(*mut qjs::JSRuntime, Raw, qjs::JS_MarkFunc);

/// The content-types a fast response may have, without a `Headers` made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    Text,
    Json,
}

impl BodyType {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyType::Text => "text/plain;charset=UTF-8",
            BodyType::Json => "application/json",
        }
    }
}

/// A response body made on a fast path.
enum FastBody {
    None,
    /// Text Portico made (a JSON text): handed out as it is, made a JavaScript string only if asked.
    Text(Bytes),
    /// A JavaScript string (owned).
    String(Raw),
}

/// A response made on a fast path: status 200, no `Headers` yet, its content-type the body's.
struct Fast {
    body: FastBody,
    content_type: Option<BodyType>,
}

/// What a `Response` object holds.
struct ResponseData {
    /// The state array prelude.js works on (owned), `undefined` while `fast` holds the response.
    state: Raw,
    fast: Option<Fast>,
}

/// What the response of a call is, read without JavaScript when it was made on a fast path.
pub struct FastResponse {
    pub body: Bytes,
    pub content_type: Option<&'static str>,
}

/// A request Portico hands a handler, until JavaScript needs its state array.
pub struct Incoming {
    pub method: String,
    pub url: String,
    /// The header fields as one string, `name\0value\0...` (names lowercase).
    pub headers: String,
    pub body: IncomingBody,
}

pub enum IncomingBody {
    None,
    /// Read before the call.
    Whole(Vec<u8>),
    /// Pulled from the client as the handler reads.
    Streamed,
}

/// What a `Request` object holds.
struct RequestData {
    /// The state array prelude.js works on (owned), `undefined` while `incoming` holds the request.
    state: Raw,
    incoming: Option<Box<Incoming>>,
}

/// This runtime's classes and the JavaScript they call back, in its context's opaque pointer.
pub struct Classes {
    request: qjs::JSClassID,
    request_proto: Raw,
    request_ctor: Raw,
    /// prelude.js's `(input, init) => state` of `new Request(input, init)`.
    request_init: Raw,
    /// prelude.js's `(method, url, headers, body) => state` of a request Portico made.
    request_incoming: Raw,
    response: qjs::JSClassID,
    response_proto: Raw,
    response_ctor: Raw,
    /// prelude.js's `(body, init) => state` of `new Response(body, init)` off the fast path.
    response_init: Raw,
    /// prelude.js's `(data, init) => state` of `Response.json(data, init)` off the fast path.
    response_json: Raw,
}

/// Owns the runtime's `Classes` (and the values they hold): dropped before the context.
pub struct Installed {
    ctx: RawCtx,
    classes: *mut Classes,
}

impl Drop for Installed {
    fn drop(&mut self) {
        // SAFETY: made by `install` for this live context; its values are freed once, and the context forgets it.
        unsafe {
            let classes = Box::from_raw(self.classes);
            for value in [
                classes.request_proto,
                classes.request_ctor,
                classes.request_init,
                classes.request_incoming,
                classes.response_proto,
                classes.response_ctor,
                classes.response_init,
                classes.response_json,
            ] {
                qjs::JS_FreeValue(self.ctx, value);
            }
            qjs::JS_SetContextOpaque(self.ctx, std::ptr::null_mut());
        }
    }
}

/// # Safety
/// `ctx` is a context set up by `install`, alive.
unsafe fn classes<'a>(ctx: RawCtx) -> &'a mut Classes {
    &mut *qjs::JS_GetContextOpaque(ctx).cast::<Classes>()
}

/// Runs a native's body; a panic (a bug of Portico's) becomes an InternalError for the script instead of
/// unwinding through QuickJS.
pub(crate) fn guard(ctx: RawCtx, body: impl FnOnce() -> Raw) -> Raw {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        // SAFETY: the context is alive (the native was called on it).
        Err(_) => unsafe { qjs::JS_ThrowInternalError(ctx, c"%s".as_ptr(), c"a native of Portico's failed".as_ptr()) },
    }
}

pub(crate) fn type_error(ctx: RawCtx, message: &CStr) -> Raw {
    // SAFETY: the context is alive; the message is a C string.
    unsafe { qjs::JS_ThrowTypeError(ctx, c"%s".as_ptr(), message.as_ptr()) }
}

/// The `i`th argument, `undefined` past those given.
///
/// # Safety
/// `argv` holds `argc` values.
pub(crate) unsafe fn arg(argc: c_int, argv: *mut Raw, i: usize) -> Raw {
    if (i as c_int) < argc {
        *argv.add(i)
    } else {
        qjs::JS_UNDEFINED
    }
}

pub(crate) fn tag(value: Raw) -> i32 {
    // SAFETY: reading a value's tag reads no memory.
    unsafe { qjs::JS_VALUE_GET_TAG(value) }
}

pub(crate) fn is_exception(value: Raw) -> bool {
    tag(value) == qjs::JS_TAG_EXCEPTION
}

pub(crate) fn int(n: i32) -> Raw {
    qjs::JS_MKVAL(qjs::JS_TAG_INT, n)
}

pub(crate) fn boolean(b: bool) -> Raw {
    qjs::JS_MKVAL(qjs::JS_TAG_BOOL, b as i32)
}

/// A JavaScript string of `text` (owned; the exception marker when out of memory).
///
/// # Safety
/// `ctx` is alive.
pub(crate) unsafe fn string(ctx: RawCtx, text: &[u8]) -> Raw {
    qjs::JS_NewStringLen(ctx, text.as_ptr().cast(), text.len() as _)
}

/// A function of `length` arguments named `name` (owned).
///
/// # Safety
/// `ctx` is alive.
pub(crate) unsafe fn function(ctx: RawCtx, f: Native, name: &CStr, length: c_int, constructor: bool) -> Raw {
    let kind =
        if constructor { qjs::JSCFunctionEnum_JS_CFUNC_constructor } else { qjs::JSCFunctionEnum_JS_CFUNC_generic };
    qjs::JS_NewCFunction2(ctx, Some(f), name.as_ptr(), length, kind, 0)
}

/// Defines a getter on `object` as class syntax does (configurable, not enumerable).
///
/// # Safety
/// `ctx` and `object` are alive.
pub(crate) unsafe fn getter(ctx: RawCtx, object: Raw, name: &CStr, f: Native) -> Result<(), ()> {
    let get = function(ctx, f, name, 0, false);
    if is_exception(get) {
        return Err(());
    }
    let atom = qjs::JS_NewAtom(ctx, name.as_ptr());
    let defined =
        qjs::JS_DefinePropertyGetSet(ctx, object, atom, get, qjs::JS_UNDEFINED, qjs::JS_PROP_CONFIGURABLE as _);
    qjs::JS_FreeAtom(ctx, atom);
    if defined < 0 {
        Err(())
    } else {
        Ok(())
    }
}

/// Defines a method on `object` as class syntax does (writable, configurable, not enumerable).
///
/// # Safety
/// `ctx` and `object` are alive.
pub(crate) unsafe fn method(ctx: RawCtx, object: Raw, name: &CStr, f: Native, length: c_int) -> Result<(), ()> {
    let value = function(ctx, f, name, length, false);
    if is_exception(value) {
        return Err(());
    }
    let flags = (qjs::JS_PROP_WRITABLE | qjs::JS_PROP_CONFIGURABLE) as c_int;
    if qjs::JS_DefinePropertyValueStr(ctx, object, name.as_ptr(), value, flags) < 0 {
        Err(())
    } else {
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------------- Request

unsafe extern "C" fn request_finalizer(rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<RequestData>();
    if !data.is_null() {
        qjs::JS_FreeValueRT(rt, Box::from_raw(data).state);
    }
}

unsafe extern "C" fn request_mark(rt: *mut qjs::JSRuntime, value: Raw, mark: qjs::JS_MarkFunc) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<RequestData>();
    if !data.is_null() {
        qjs::JS_MarkValue(rt, (*data).state, mark);
    }
}

/// A new `Request` object (owned) holding `data`, its prototype `proto`'s (a subclass's) or the class's.
///
/// # Safety
/// `ctx` is set up by `install`.
unsafe fn new_request(ctx: RawCtx, proto: Option<Raw>, data: RequestData) -> Raw {
    let classes = classes(ctx);
    let object = qjs::JS_NewObjectProtoClass(ctx, proto.unwrap_or(classes.request_proto), classes.request);
    if is_exception(object) {
        qjs::JS_FreeValue(ctx, data.state);
        return object;
    }
    qjs::JS_SetOpaque(object, Box::into_raw(Box::new(data)).cast());
    object
}

/// The `RequestData` of `value`, if it is a Request.
///
/// # Safety
/// `ctx` is set up by `install`; the reference lives while `value` does.
unsafe fn request_data<'a>(ctx: RawCtx, value: Raw) -> Option<&'a mut RequestData> {
    qjs::JS_GetOpaque(value, classes(ctx).request).cast::<RequestData>().as_mut()
}

/// `new Request(input, init)`, through prelude.js's constructor.
unsafe extern "C" fn request_construct(ctx: RawCtx, new_target: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let classes = classes(ctx);
        let proto = match proto_of(ctx, new_target, classes.request_ctor) {
            Ok(proto) => proto,
            Err(()) => return qjs::JS_EXCEPTION,
        };
        let mut args = [arg(argc, argv, 0), arg(argc, argv, 1)];
        let state = qjs::JS_Call(ctx, classes.request_init, qjs::JS_UNDEFINED, 2, args.as_mut_ptr());
        let object =
            if is_exception(state) { state } else { new_request(ctx, proto, RequestData { state, incoming: None }) };
        if let Some(proto) = proto {
            qjs::JS_FreeValue(ctx, proto);
        }
        object
    })
}

/// The state array of a request Portico made, made now.
unsafe fn materialize_request(ctx: RawCtx, data: &mut RequestData) -> Result<(), ()> {
    let Some(incoming) = data.incoming.take() else { return Ok(()) };
    let Incoming { method, url, headers, body } = *incoming;
    let body = match body {
        IncomingBody::None => qjs::JS_NULL,
        IncomingBody::Streamed => boolean(true),
        IncomingBody::Whole(bytes) => {
            let rctx = Ctx::from_raw(std::ptr::NonNull::new_unchecked(ctx));
            match rquickjs::ArrayBuffer::new(rctx, bytes) {
                Ok(buffer) => {
                    let value = buffer.into_value();
                    let raw = value.as_raw();
                    std::mem::forget(value);
                    raw
                }
                Err(_) => qjs::JS_EXCEPTION,
            }
        }
    };
    let mut args = [string(ctx, method.as_bytes()), string(ctx, url.as_bytes()), string(ctx, headers.as_bytes()), body];
    let state = if args.iter().any(|v| is_exception(*v)) {
        qjs::JS_EXCEPTION
    } else {
        qjs::JS_Call(ctx, classes(ctx).request_incoming, qjs::JS_UNDEFINED, 4, args.as_mut_ptr())
    };
    for v in args {
        qjs::JS_FreeValue(ctx, v);
    }
    if is_exception(state) {
        return Err(());
    }
    data.state = state;
    Ok(())
}

/// `requestState(request)`: its state array (made now for one Portico made); a TypeError for anything that
/// is not a Request.
unsafe extern "C" fn request_state(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || match request_data(ctx, arg(argc, argv, 0)) {
        None => type_error(ctx, c"not a Request"),
        Some(data) => match materialize_request(ctx, data) {
            Ok(()) => qjs::JS_DupValue(ctx, data.state),
            Err(()) => qjs::JS_EXCEPTION,
        },
    })
}

/// `makeRequest(state)`: a Request holding prelude.js's state array.
unsafe extern "C" fn request_make(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let state = qjs::JS_DupValue(ctx, arg(argc, argv, 0));
        new_request(ctx, None, RequestData { state, incoming: None })
    })
}

/// `isRequest(value)`: the brand check.
unsafe extern "C" fn request_is(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || boolean(request_data(ctx, arg(argc, argv, 0)).is_some()))
}

/// A request's method or URL: Portico's text, or its state's (`index`).
unsafe fn request_field(ctx: RawCtx, this: Raw, index: u32) -> Raw {
    let Some(data) = request_data(ctx, this) else {
        return type_error(ctx, c"not a Request");
    };
    match &data.incoming {
        Some(incoming) => {
            let text = if index == 3 { &incoming.method } else { &incoming.url };
            string(ctx, text.as_bytes())
        }
        None => qjs::JS_GetPropertyUint32(ctx, data.state, index),
    }
}

unsafe extern "C" fn request_method(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw) -> Raw {
    guard(ctx, || request_field(ctx, this, 3))
}

unsafe extern "C" fn request_url(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw) -> Raw {
    guard(ctx, || request_field(ctx, this, 4))
}

/// `setRequestHelpers(init, incoming)`: prelude.js's constructor, and what makes the state of a request
/// Portico made.
unsafe extern "C" fn request_helpers(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let classes = classes(ctx);
        for (slot, i) in [(&mut classes.request_init, 0), (&mut classes.request_incoming, 1)] {
            qjs::JS_FreeValue(ctx, *slot);
            *slot = qjs::JS_DupValue(ctx, arg(argc, argv, i));
        }
        qjs::JS_UNDEFINED
    })
}

/// The `Request` a handler gets for `incoming`: made without running JavaScript, its state made when the
/// handler needs more than its method and URL.
pub fn incoming_request<'js>(ctx: &Ctx<'js>, incoming: Incoming) -> rquickjs::Result<rquickjs::Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the context was set up by `install`; the new object is owned by the returned value.
    unsafe {
        let data = RequestData { state: qjs::JS_UNDEFINED, incoming: Some(Box::new(incoming)) };
        let object = new_request(raw, None, data);
        if is_exception(object) {
            return Err(rquickjs::Error::Exception);
        }
        Ok(rquickjs::Value::from_raw(ctx.clone(), object))
    }
}

// ------------------------------------------------------------------------------------------------ Response

unsafe extern "C" fn response_finalizer(rt: *mut qjs::JSRuntime, value: Raw) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<ResponseData>();
    if data.is_null() {
        return;
    }
    let data = Box::from_raw(data);
    qjs::JS_FreeValueRT(rt, data.state);
    if let Some(Fast { body: FastBody::String(s), .. }) = data.fast {
        qjs::JS_FreeValueRT(rt, s);
    }
}

unsafe extern "C" fn response_mark(rt: *mut qjs::JSRuntime, value: Raw, mark: qjs::JS_MarkFunc) {
    let mut class = 0;
    let data = qjs::JS_GetAnyOpaque(value, &mut class).cast::<ResponseData>();
    if !data.is_null() {
        qjs::JS_MarkValue(rt, (*data).state, mark);
    }
}

/// A new `Response` object (owned) holding `data`, its prototype `proto`'s (a subclass's) or the class's.
///
/// # Safety
/// `ctx` is set up by `install`.
unsafe fn new_response(ctx: RawCtx, proto: Option<Raw>, data: ResponseData) -> Raw {
    let classes = classes(ctx);
    let object = qjs::JS_NewObjectProtoClass(ctx, proto.unwrap_or(classes.response_proto), classes.response);
    if is_exception(object) {
        free_response_data(ctx, data);
        return object;
    }
    qjs::JS_SetOpaque(object, Box::into_raw(Box::new(data)).cast());
    object
}

unsafe fn free_response_data(ctx: RawCtx, data: ResponseData) {
    qjs::JS_FreeValue(ctx, data.state);
    if let Some(Fast { body: FastBody::String(s), .. }) = data.fast {
        qjs::JS_FreeValue(ctx, s);
    }
}

/// The `ResponseData` of `value`, if it is a Response.
///
/// # Safety
/// `ctx` is set up by `install`; the reference lives while `value` does.
unsafe fn response_data<'a>(ctx: RawCtx, value: Raw) -> Option<&'a mut ResponseData> {
    let data = qjs::JS_GetOpaque(value, classes(ctx).response).cast::<ResponseData>();
    data.as_mut()
}

/// The prototype a constructor called with `new_target` gives its object: the class's own when called as
/// itself (nearly always), else `new_target.prototype` (a subclass). `Err`: an exception is pending.
pub(crate) unsafe fn proto_of(ctx: RawCtx, new_target: Raw, ctor: Raw) -> Result<Option<Raw>, ()> {
    if qjs::JS_VALUE_GET_PTR(new_target) == qjs::JS_VALUE_GET_PTR(ctor) {
        return Ok(None);
    }
    let proto = qjs::JS_GetPropertyStr(ctx, new_target, c"prototype".as_ptr());
    if is_exception(proto) {
        return Err(());
    }
    Ok(Some(proto))
}

/// `new Response(body, init)`: a string or no body without an init on the fast path; anything else through
/// prelude.js's constructor.
unsafe extern "C" fn response_construct(ctx: RawCtx, new_target: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let (body, init) = (arg(argc, argv, 0), arg(argc, argv, 1));
        let classes = classes(ctx);
        let proto = match proto_of(ctx, new_target, classes.response_ctor) {
            Ok(proto) => proto,
            Err(()) => return qjs::JS_EXCEPTION,
        };
        let fast = if tag(init) != qjs::JS_TAG_UNDEFINED {
            None
        } else if tag(body) == qjs::JS_TAG_STRING {
            Some(Fast { body: FastBody::String(qjs::JS_DupValue(ctx, body)), content_type: Some(BodyType::Text) })
        } else if matches!(tag(body), qjs::JS_TAG_UNDEFINED | qjs::JS_TAG_NULL) {
            Some(Fast { body: FastBody::None, content_type: None })
        } else {
            None
        };
        let data = match fast {
            Some(fast) => ResponseData { state: qjs::JS_UNDEFINED, fast: Some(fast) },
            None => {
                let mut args = [body, init];
                let state = qjs::JS_Call(ctx, classes.response_init, qjs::JS_UNDEFINED, 2, args.as_mut_ptr());
                if is_exception(state) {
                    if let Some(proto) = proto {
                        qjs::JS_FreeValue(ctx, proto);
                    }
                    return state;
                }
                ResponseData { state, fast: None }
            }
        };
        let object = new_response(ctx, proto, data);
        if let Some(proto) = proto {
            qjs::JS_FreeValue(ctx, proto);
        }
        object
    })
}

/// `Response.json(data, init)`: the text by the native writer (json.rs) and no init on the fast path;
/// anything else through prelude.js's.
unsafe extern "C" fn response_json(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let (data, init) = (arg(argc, argv, 0), arg(argc, argv, 1));
        let classes = classes(ctx);
        if tag(init) == qjs::JS_TAG_UNDEFINED {
            let rctx = Ctx::from_raw(std::ptr::NonNull::new_unchecked(ctx));
            let value = rquickjs::Value::from_raw(rctx.clone(), qjs::JS_DupValue(ctx, data));
            match crate::json::stringify(&rctx, &value) {
                Ok(Some(text)) => {
                    let fast = Fast { body: FastBody::Text(Bytes::from(text)), content_type: Some(BodyType::Json) };
                    return new_response(ctx, None, ResponseData { state: qjs::JS_UNDEFINED, fast: Some(fast) });
                }
                Err(_) => return qjs::JS_EXCEPTION,
                Ok(None) => {}
            }
        }
        let mut args = [data, init];
        let state = qjs::JS_Call(ctx, classes.response_json, qjs::JS_UNDEFINED, 2, args.as_mut_ptr());
        if is_exception(state) {
            return state;
        }
        new_response(ctx, None, ResponseData { state, fast: None })
    })
}

/// The state array of a response made on a fast path, made now.
unsafe fn materialize(ctx: RawCtx, data: &mut ResponseData) -> Result<(), ()> {
    let Some(fast) = data.fast.take() else { return Ok(()) };
    let body = match &fast.body {
        FastBody::None => qjs::JS_NULL,
        FastBody::String(s) => qjs::JS_DupValue(ctx, *s),
        FastBody::Text(text) => string(ctx, text),
    };
    let content_type = match fast.content_type {
        Some(t) => string(ctx, t.as_str().as_bytes()),
        None => qjs::JS_NULL,
    };
    let empty = string(ctx, b"");
    let empty2 = string(ctx, b"");
    let mut items = [body, qjs::JS_UNDEFINED, boolean(false), int(200), empty, qjs::JS_NULL, content_type, empty2];
    let failed = items.iter().any(|v| is_exception(*v));
    let state = if failed {
        for v in items {
            qjs::JS_FreeValue(ctx, v);
        }
        qjs::JS_EXCEPTION
    } else {
        qjs::JS_NewArrayFrom(ctx, items.len() as c_int, items.as_mut_ptr())
    };
    if let FastBody::String(s) = fast.body {
        qjs::JS_FreeValue(ctx, s);
    }
    if is_exception(state) {
        // (Out of memory: the response keeps nothing, as if made empty; the script has the exception.)
        data.fast = Some(Fast { body: FastBody::None, content_type: None });
        return Err(());
    }
    data.state = state;
    Ok(())
}

/// `responseState(response)`: its state array (made now for one made on a fast path); a TypeError for
/// anything that is not a Response.
unsafe extern "C" fn response_state(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || match response_data(ctx, arg(argc, argv, 0)) {
        None => type_error(ctx, c"not a Response"),
        Some(data) => match materialize(ctx, data) {
            Ok(()) => qjs::JS_DupValue(ctx, data.state),
            Err(()) => qjs::JS_EXCEPTION,
        },
    })
}

/// `makeResponse(state)`: a Response holding prelude.js's state array.
unsafe extern "C" fn response_make(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let state = qjs::JS_DupValue(ctx, arg(argc, argv, 0));
        new_response(ctx, None, ResponseData { state, fast: None })
    })
}

/// `isResponse(value)`: the brand check.
unsafe extern "C" fn response_is(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || boolean(response_data(ctx, arg(argc, argv, 0)).is_some()))
}

/// The status of a response: its fast path's 200, or its state's.
unsafe fn status_of(ctx: RawCtx, this: Raw) -> Result<Raw, Raw> {
    let Some(data) = response_data(ctx, this) else {
        return Err(type_error(ctx, c"not a Response"));
    };
    if data.fast.is_some() {
        return Ok(int(200));
    }
    let status = qjs::JS_GetPropertyUint32(ctx, data.state, 3);
    if is_exception(status) {
        return Err(status);
    }
    Ok(status)
}

unsafe extern "C" fn response_status(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw) -> Raw {
    guard(ctx, || status_of(ctx, this).unwrap_or_else(|e| e))
}

unsafe extern "C" fn response_ok(ctx: RawCtx, this: Raw, _argc: c_int, _argv: *mut Raw) -> Raw {
    guard(ctx, || match status_of(ctx, this) {
        Err(e) => e,
        Ok(status) => {
            let mut n = 0f64;
            let converted = qjs::JS_ToFloat64(ctx, &mut n, status);
            qjs::JS_FreeValue(ctx, status);
            if converted < 0 {
                return qjs::JS_EXCEPTION;
            }
            boolean((200.0..300.0).contains(&n))
        }
    })
}

/// `setResponseHelpers(init, json)`: prelude.js's functions the fast paths fall back on.
unsafe extern "C" fn response_helpers(ctx: RawCtx, _this: Raw, argc: c_int, argv: *mut Raw) -> Raw {
    guard(ctx, || {
        let classes = classes(ctx);
        for (slot, i) in [(&mut classes.response_init, 0), (&mut classes.response_json, 1)] {
            qjs::JS_FreeValue(ctx, *slot);
            *slot = qjs::JS_DupValue(ctx, arg(argc, argv, i));
        }
        qjs::JS_UNDEFINED
    })
}

/// The response a call answered with, when it was made on a fast path and JavaScript never needed its
/// state: its body and content-type, read without running any JavaScript.
pub fn fast_response(ctx: &Ctx<'_>, value: &rquickjs::Value<'_>) -> Option<FastResponse> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the context was set up by `install`; `value` is alive; the data is only read.
    unsafe {
        let data = response_data(raw, value.as_raw())?;
        let fast = data.fast.as_ref()?;
        let body = match &fast.body {
            FastBody::None => Bytes::new(),
            FastBody::Text(text) => text.clone(),
            FastBody::String(s) => Bytes::from(utf8_of(raw, *s)?),
        };
        Some(FastResponse { body, content_type: fast.content_type.map(BodyType::as_str) })
    }
}

/// A JavaScript string's text as UTF-8, each lone surrogate a U+FFFD (as a body's UTF-8 encoding has it).
/// `None` when out of memory.
///
/// # Safety
/// `ctx` is alive and `s` a string of it.
pub(crate) unsafe fn utf8_of(ctx: RawCtx, s: Raw) -> Option<Vec<u8>> {
    let mut len = 0;
    let p = qjs::JS_ToCStringLen2(ctx, &mut len, s, false);
    let len = len as usize;
    if p.is_null() {
        return None;
    }
    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
    let out = match std::str::from_utf8(bytes) {
        Ok(_) => bytes.to_vec(),
        Err(_) => replace_surrogates(bytes),
    };
    qjs::JS_FreeCString(ctx, p);
    Some(out)
}

/// WTF-8 (what QuickJS makes of a string with lone surrogates) as UTF-8: each encoded surrogate (ED A0-BF xx)
/// becomes U+FFFD.
pub(crate) fn replace_surrogates(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == 0xed && i + 2 < bytes.len() && (0xa0..=0xbf).contains(&bytes[i + 1]) {
            out.extend_from_slice("\u{fffd}".as_bytes());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// Makes the classes in this runtime and hands prelude.js what it builds on, as the global
/// `__portico_classes` (which it takes and deletes): `{ Request, requestState, makeRequest, isRequest,
/// setRequestHelpers, Response, responseState, makeResponse, isResponse, setResponseHelpers }`. The returned guard owns what the classes hold: keep it while the context lives.
pub fn install(ctx: &Ctx<'_>) -> Result<Installed, String> {
    let raw = ctx.as_raw().as_ptr();
    let failed = || "the native classes could not be made (out of memory)".to_string();
    // SAFETY: the context is alive and not yet running any script; every value made is owned by `Classes` or
    // handed to QuickJS.
    unsafe {
        let rt = qjs::JS_GetRuntime(raw);
        let (mut request, mut response) = (0, 0);
        qjs::JS_NewClassID(rt, &mut request);
        qjs::JS_NewClassID(rt, &mut response);
        let defs = [
            (request, c"Request", request_finalizer as Finalizer, request_mark as Marker),
            (response, c"Response", response_finalizer as Finalizer, response_mark as Marker),
        ];
        for (id, name, finalizer, mark) in defs {
            let def = qjs::JSClassDef {
                class_name: name.as_ptr(),
                finalizer: Some(finalizer),
                gc_mark: Some(mark),
                call: None,
                exotic: std::ptr::null_mut(),
            };
            if qjs::JS_NewClass(rt, id, &def) < 0 {
                return Err(failed());
            }
        }
        let classes = Box::into_raw(Box::new(Classes {
            request,
            request_proto: qjs::JS_UNDEFINED,
            request_ctor: qjs::JS_UNDEFINED,
            request_init: qjs::JS_UNDEFINED,
            request_incoming: qjs::JS_UNDEFINED,
            response,
            response_proto: qjs::JS_UNDEFINED,
            response_ctor: qjs::JS_UNDEFINED,
            response_init: qjs::JS_UNDEFINED,
            response_json: qjs::JS_UNDEFINED,
        }));
        qjs::JS_SetContextOpaque(raw, classes.cast());
        let installed = Installed { ctx: raw, classes };
        let c = &mut *classes;
        c.request_proto = qjs::JS_NewObject(raw);
        c.request_ctor = function(raw, request_construct, c"Request", 1, true);
        if is_exception(c.request_proto) || is_exception(c.request_ctor) {
            return Err(failed());
        }
        qjs::JS_SetConstructor(raw, c.request_ctor, c.request_proto);
        qjs::JS_SetClassProto(raw, request, qjs::JS_DupValue(raw, c.request_proto));
        getter(raw, c.request_proto, c"method", request_method).map_err(|()| failed())?;
        getter(raw, c.request_proto, c"url", request_url).map_err(|()| failed())?;
        c.response_proto = qjs::JS_NewObject(raw);
        c.response_ctor = function(raw, response_construct, c"Response", 0, true);
        if is_exception(c.response_proto) || is_exception(c.response_ctor) {
            return Err(failed());
        }
        qjs::JS_SetConstructor(raw, c.response_ctor, c.response_proto);
        qjs::JS_SetClassProto(raw, response, qjs::JS_DupValue(raw, c.response_proto));
        getter(raw, c.response_proto, c"status", response_status).map_err(|()| failed())?;
        getter(raw, c.response_proto, c"ok", response_ok).map_err(|()| failed())?;
        method(raw, c.response_ctor, c"json", response_json, 1).map_err(|()| failed())?;

        let handed = qjs::JS_NewObject(raw);
        if is_exception(handed) {
            return Err(failed());
        }
        let flags = qjs::JS_PROP_C_W_E as c_int;
        let entries: [(&CStr, Raw); 10] = [
            (c"Request", qjs::JS_DupValue(raw, c.request_ctor)),
            (c"requestState", function(raw, request_state, c"requestState", 1, false)),
            (c"makeRequest", function(raw, request_make, c"makeRequest", 1, false)),
            (c"isRequest", function(raw, request_is, c"isRequest", 1, false)),
            (c"setRequestHelpers", function(raw, request_helpers, c"setRequestHelpers", 2, false)),
            (c"Response", qjs::JS_DupValue(raw, c.response_ctor)),
            (c"responseState", function(raw, response_state, c"responseState", 1, false)),
            (c"makeResponse", function(raw, response_make, c"makeResponse", 1, false)),
            (c"isResponse", function(raw, response_is, c"isResponse", 1, false)),
            (c"setResponseHelpers", function(raw, response_helpers, c"setResponseHelpers", 2, false)),
        ];
        for (name, value) in entries {
            if is_exception(value) || qjs::JS_DefinePropertyValueStr(raw, handed, name.as_ptr(), value, flags) < 0 {
                qjs::JS_FreeValue(raw, handed);
                return Err(failed());
            }
        }
        let global = qjs::JS_GetGlobalObject(raw);
        let set = qjs::JS_SetPropertyStr(raw, global, c"__portico_classes".as_ptr(), handed);
        qjs::JS_FreeValue(raw, global);
        if set < 0 {
            return Err(failed());
        }
        Ok(installed)
    }
}

#[cfg(test)]
mod tests {
    use super::replace_surrogates;

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        // "a", U+D800 as WTF-8, "b", then U+DFFF at the end.
        let wtf8 = [b'a', 0xed, 0xa0, 0x80, b'b', 0xed, 0xbf, 0xbf];
        assert_eq!(String::from_utf8(replace_surrogates(&wtf8)).unwrap(), "a\u{fffd}b\u{fffd}");
    }
}
