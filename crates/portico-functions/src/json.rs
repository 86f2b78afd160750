//! `JSON.parse` for handlers, by serde_json: QuickJS's own parser spends about 110 instructions a byte
//! (measured on a 4 KiB order: 457,000 of the 681,000 instructions of a request that parses it). This one
//! builds the JavaScript values while serde_json reads the text (no tree in between), through QuickJS's C API.
//!
//! It is a fast path, not a second definition of JSON: prelude.js calls it for a string without a reviver,
//! and on anything it does not take (a syntax error, a lone surrogate escape serde_json refuses, nesting past
//! its 128 levels) it answers `undefined` and QuickJS's own `JSON.parse` runs instead, so errors and edge
//! cases are QuickJS's. The tests compare its results with Deno's (V8's) on generated and edge-case texts.

use crate::array::array_from;
use rquickjs::{qjs, Ctx, Value};
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The value of `text`, or `None` when QuickJS's parser should answer (an error in building a value, such
/// as running out of memory, is the script's exception).
pub fn parse<'js>(ctx: &Ctx<'js>, text: &str) -> rquickjs::Result<Option<Value<'js>>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let built = Seed { ctx }.deserialize(&mut deserializer).and_then(|value| deserializer.end().map(|()| value));
    match built {
        Ok(value) => Ok(Some(value)),
        // A pending exception (out of memory) is the script's; any other failure is QuickJS's to report.
        Err(_) if exception_pending(ctx) => Err(rquickjs::Error::Exception),
        Err(_) => Ok(None),
    }
}

/// Whether building a value threw (the exception stays pending, for the script).
fn exception_pending(ctx: &Ctx<'_>) -> bool {
    // SAFETY: the context is alive; `JS_HasException` only reads it.
    unsafe { qjs::JS_HasException(ctx.as_raw().as_ptr()) }
}

struct Seed<'a, 'js> {
    ctx: &'a Ctx<'js>,
}

impl<'de, 'js> DeserializeSeed<'de> for Seed<'_, 'js> {
    type Value = Value<'js>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value<'js>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// What building a value failed on, as serde's error (the parse then fails and falls back, or rethrows).
fn failed<E: serde::de::Error>(e: rquickjs::Error) -> E {
    E::custom(e)
}

impl<'de, 'js> Visitor<'de> for Seed<'_, 'js> {
    type Value = Value<'js>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value<'js>, E> {
        Ok(Value::new_bool(self.ctx.clone(), b))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Value<'js>, E> {
        Ok(match i32::try_from(n) {
            Ok(n) => Value::new_int(self.ctx.clone(), n),
            // (Rounded to the nearest double, ties to even, as JavaScript reads a number.)
            Err(_) => Value::new_float(self.ctx.clone(), n as f64),
        })
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Value<'js>, E> {
        Ok(match i32::try_from(n) {
            Ok(n) => Value::new_int(self.ctx.clone(), n),
            Err(_) => Value::new_float(self.ctx.clone(), n as f64),
        })
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Value<'js>, E> {
        // A float stays one (serde_json reads `-0` as -0.0, which an integer would lose).
        Ok(Value::new_float(self.ctx.clone(), n))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value<'js>, E> {
        rquickjs::String::from_str(self.ctx.clone(), s).map(|s| s.into_value()).map_err(failed)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value<'js>, E> {
        Ok(Value::new_null(self.ctx.clone()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value<'js>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Seed { ctx: self.ctx })? {
            items.push(item);
        }
        array_from(self.ctx, items).map(|a| a.into_value()).map_err(failed)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value<'js>, A::Error> {
        let ctx = self.ctx.as_raw().as_ptr();
        // SAFETY: the context is alive for 'js; the new object (or the exception marker) is owned here.
        let object = unsafe { Value::from_raw(self.ctx.clone(), qjs::JS_NewObject(ctx)) };
        if !object.is_object() {
            return Err(A::Error::custom("out of memory"));
        }
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value_seed(Seed { ctx: self.ctx })?;
            // Defined, not set: a key `__proto__` is an own property (as JSON.parse makes it), and a key seen
            // again keeps its first place and takes the last value.
            // SAFETY: `key` is valid UTF-8 of `len` bytes; the atom is freed after use; `value`'s ownership
            // passes to `JS_DefinePropertyValue` (forgotten here).
            let defined = unsafe {
                let atom = qjs::JS_NewAtomLen(ctx, key.as_ptr().cast(), key.len() as _);
                if atom == qjs::JS_ATOM_NULL {
                    return Err(A::Error::custom("out of memory"));
                }
                let raw = value.as_raw();
                std::mem::forget(value);
                let defined = qjs::JS_DefinePropertyValue(ctx, object.as_raw(), atom, raw, qjs::JS_PROP_C_W_E as i32);
                qjs::JS_FreeAtom(ctx, atom);
                defined
            };
            if defined < 0 {
                return Err(A::Error::custom("out of memory"));
            }
        }
        Ok(object)
    }
}

/// An object's key, borrowed from the text when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(s))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(s.to_string()))
    }
}
