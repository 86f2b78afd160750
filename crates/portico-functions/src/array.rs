//! JavaScript arrays made in one step. rquickjs sets an array's elements one property at a time (about 300
//! instructions each, the array growing as it goes); QuickJS's own `JS_NewArrayFrom` takes them all at once.
//! The native JSON.parse (json.rs) makes its arrays with this.

use rquickjs::{qjs, Array, Ctx, Value};

/// An array holding `items`, in order.
pub fn array_from<'js>(ctx: &Ctx<'js>, items: Vec<Value<'js>>) -> rquickjs::Result<Array<'js>> {
    let count = i32::try_from(items.len())
        .map_err(|_| rquickjs::Error::new_from_js_message("list", "array", "too many items for an array"))?;
    // `JS_NewArrayFrom` takes over the values (and frees them if it fails): each is handed over as it is.
    let raw: Vec<qjs::JSValue> = items
        .into_iter()
        .map(|value| {
            let raw = value.as_raw();
            std::mem::forget(value);
            raw
        })
        .collect();
    // SAFETY: the context is alive for 'js, and `raw` holds `count` values whose ownership passes to QuickJS.
    let array = unsafe { qjs::JS_NewArrayFrom(ctx.as_raw().as_ptr(), count, raw.as_ptr()) };
    // SAFETY: `array` is a new value owned here (or the exception marker, which is checked first).
    if unsafe { qjs::JS_VALUE_GET_TAG(array) } == qjs::JS_TAG_EXCEPTION {
        return Err(rquickjs::Error::Exception);
    }
    let value = unsafe { Value::from_raw(ctx.clone(), array) };
    value.into_array().ok_or_else(|| rquickjs::Error::new_from_js("value", "array"))
}
