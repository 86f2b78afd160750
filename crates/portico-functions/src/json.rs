//! `JSON.parse` for handlers, by serde_json: QuickJS's own parser spends about 110 instructions a byte
//! (measured on a 4 KiB order: 457,000 of the 681,000 instructions of a request that parses it). This one
//! builds the JavaScript values while serde_json reads the text (no tree in between), through QuickJS's C API.
//!
//! It is a fast path, not a second definition of JSON: prelude.js calls it for a string without a reviver,
//! and on anything it does not take (a syntax error, a lone surrogate escape serde_json refuses, nesting past
//! its 128 levels) it answers `undefined` and QuickJS's own `JSON.parse` runs instead, so errors and edge
//! cases are QuickJS's. The tests compare its results with Deno's (V8's) on generated and edge-case texts.

use rquickjs::{qjs, Ctx, Value};
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::fmt;

/// The value of `text`, or `None` when QuickJS's parser should answer (an error in building a value, such
/// as running out of memory, is the script's exception).
pub fn parse<'js>(ctx: &Ctx<'js>, text: &str) -> rquickjs::Result<Option<Value<'js>>> {
    let raw = ctx.as_raw().as_ptr();
    let scratch = Scratch::default();
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let built = Seed { ctx: raw, scratch: &scratch }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    scratch.release(raw);
    match built {
        // SAFETY: the value is owned; it passes to the `Value`.
        Ok(value) => Ok(Some(unsafe { Value::from_raw(ctx.clone(), value.into_raw()) })),
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

/// What one parse shares between its levels, so that building values allocates nothing of its own: one stack
/// of the values (and keys) of the arrays and objects open, and the keys met so far with their atoms (a
/// document repeats its keys: an array of records has the same few in every element).
#[derive(Default)]
struct Scratch {
    /// The values of the open arrays and objects, innermost last (owned until they pass to their container).
    values: RefCell<Vec<qjs::JSValue>>,
    /// The keys of the open objects, beside their values.
    atoms: RefCell<Vec<qjs::JSAtom>>,
    /// Keys met: their text in `key_text`, their atoms held until the parse ends.
    keys: RefCell<KeyCache>,
}

#[derive(Default)]
struct KeyCache {
    /// Each key's text (in `key_text`), its atom, and the entry of the key that came after it last time.
    entries: Vec<KeyEntry>,
    key_text: String,
    /// The entry of the key found last.
    last: Option<usize>,
}

struct KeyEntry {
    text: std::ops::Range<usize>,
    atom: qjs::JSAtom,
    followed_by: Option<usize>,
}

/// How many distinct keys a parse remembers (past them, keys are made each time).
const KEYS_KEPT: usize = 64;

impl KeyCache {
    fn is(&self, entry: usize, key: &str) -> bool {
        let text = &self.entries[entry].text;
        text.len() == key.len() && self.key_text.as_bytes()[text.clone()] == *key.as_bytes()
    }
}

impl Scratch {
    /// The atom of `key` (the caller's to free), from the keys met before when it is one of them: first the
    /// one that followed the key before it last time (records repeat their keys in order), then any.
    ///
    /// # Safety
    /// `ctx` is the live context of this parse.
    unsafe fn atom(&self, ctx: *mut qjs::JSContext, key: &str) -> qjs::JSAtom {
        let mut cache = self.keys.borrow_mut();
        let predicted = cache.last.and_then(|last| cache.entries[last].followed_by);
        let found = match predicted {
            Some(entry) if cache.is(entry, key) => Some(entry),
            _ => (0..cache.entries.len()).find(|&entry| cache.is(entry, key)),
        };
        let entry = match found {
            Some(entry) => entry,
            None => {
                let atom = atom_of(ctx, key);
                if atom == qjs::JS_ATOM_NULL || cache.entries.len() == KEYS_KEPT {
                    cache.last = None;
                    return atom;
                }
                let start = cache.key_text.len();
                cache.key_text.push_str(key);
                let text = start..cache.key_text.len();
                cache.entries.push(KeyEntry { text, atom, followed_by: None });
                cache.entries.len() - 1
            }
        };
        if let Some(last) = cache.last {
            cache.entries[last].followed_by = Some(entry);
        }
        cache.last = Some(entry);
        qjs::JS_DupAtom(ctx, cache.entries[entry].atom)
    }

    /// Frees what the parse still holds: the kept keys' atoms, and values left on the stacks (none unless a
    /// level failed before taking its own back).
    fn release(&self, ctx: *mut qjs::JSContext) {
        // SAFETY: each atom and value here is held once, by the scratch.
        unsafe {
            for entry in self.keys.borrow().entries.iter() {
                qjs::JS_FreeAtom(ctx, entry.atom);
            }
            for value in self.values.borrow().iter() {
                qjs::JS_FreeValue(ctx, *value);
            }
            for atom in self.atoms.borrow().iter() {
                qjs::JS_FreeAtom(ctx, *atom);
            }
        }
    }

    /// Frees the values (and keys, for an object) pushed since `from` and `keys_from`.
    fn unwind(&self, ctx: *mut qjs::JSContext, from: usize, keys_from: usize) {
        let mut values = self.values.borrow_mut();
        let mut atoms = self.atoms.borrow_mut();
        // SAFETY: each was pushed by this level, owned, and leaves the stack here.
        unsafe {
            for value in values.drain(from..) {
                qjs::JS_FreeValue(ctx, value);
            }
            for atom in atoms.drain(keys_from..) {
                qjs::JS_FreeAtom(ctx, atom);
            }
        }
    }
}

/// A JavaScript value made by the parse, owned (freed if dropped: a level that fails drops what it made).
struct Owned {
    ctx: *mut qjs::JSContext,
    value: qjs::JSValue,
}

impl Owned {
    fn into_raw(self) -> qjs::JSValue {
        let value = self.value;
        std::mem::forget(self);
        value
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the value is owned by this wrapper.
        unsafe { qjs::JS_FreeValue(self.ctx, self.value) };
    }
}

struct Seed<'a> {
    ctx: *mut qjs::JSContext,
    scratch: &'a Scratch,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Owned;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Owned, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Seed<'_> {
    fn own(&self, value: qjs::JSValue) -> Owned {
        Owned { ctx: self.ctx, value }
    }

    /// `value` owned, or the failure to make it (its exception pending).
    fn made<E: serde::de::Error>(&self, value: qjs::JSValue) -> Result<Owned, E> {
        // SAFETY: `value` was just returned by the C API, owned.
        if unsafe { qjs::JS_VALUE_GET_TAG(value) } == qjs::JS_TAG_EXCEPTION {
            return Err(E::custom("out of memory"));
        }
        Ok(self.own(value))
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Owned;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Owned, E> {
        Ok(self.own(if b { qjs::JS_TRUE } else { qjs::JS_FALSE }))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Owned, E> {
        Ok(self.own(match i32::try_from(n) {
            Ok(n) => qjs::JS_MKVAL(qjs::JS_TAG_INT, n),
            // (Rounded to the nearest double, ties to even, as JavaScript reads a number.)
            Err(_) => qjs::JS_NewFloat64(n as f64),
        }))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Owned, E> {
        Ok(self.own(match i32::try_from(n) {
            Ok(n) => qjs::JS_MKVAL(qjs::JS_TAG_INT, n),
            Err(_) => qjs::JS_NewFloat64(n as f64),
        }))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Owned, E> {
        // (serde_json reads `-0` as -0.0, which JS_NewFloat64 keeps a double.)
        Ok(self.own(qjs::JS_NewFloat64(n)))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Owned, E> {
        // SAFETY: `s` is valid UTF-8 of its length.
        self.made(unsafe { qjs::JS_NewStringLen(self.ctx, s.as_ptr().cast(), s.len() as _) })
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Owned, E> {
        Ok(self.own(qjs::JS_NULL))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Owned, A::Error> {
        let (ctx, scratch) = (self.ctx, self.scratch);
        let from = scratch.values.borrow().len();
        let keys_from = scratch.atoms.borrow().len();
        loop {
            match seq.next_element_seed(Seed { ctx, scratch }) {
                Ok(Some(item)) => scratch.values.borrow_mut().push(item.into_raw()),
                Ok(None) => break,
                Err(e) => {
                    scratch.unwind(ctx, from, keys_from);
                    return Err(e);
                }
            }
        }
        let mut values = scratch.values.borrow_mut();
        let count = values.len() - from;
        let Ok(count) = i32::try_from(count) else {
            drop(values);
            scratch.unwind(ctx, from, keys_from);
            return Err(A::Error::custom("too many items"));
        };
        // SAFETY: the values pass to the array (freed by QuickJS if it fails), so they leave the stack unfreed.
        let array = unsafe { qjs::JS_NewArrayFrom(ctx, count, values[from..].as_ptr()) };
        values.truncate(from);
        drop(values);
        self.made(array)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Owned, A::Error> {
        let (ctx, scratch) = (self.ctx, self.scratch);
        // The keys' atoms and the values, then the object at once (JS_NewPlainObjectFrom: from the shape the
        // objects before it with the same keys left). The atoms are freed here; the values pass to the object.
        let from = scratch.values.borrow().len();
        let keys_from = scratch.atoms.borrow().len();
        loop {
            let key = match map.next_key_seed(KeySeed) {
                Ok(Some(key)) => key,
                Ok(None) => break,
                Err(e) => {
                    scratch.unwind(ctx, from, keys_from);
                    return Err(e);
                }
            };
            let value = match map.next_value_seed(Seed { ctx, scratch }) {
                Ok(value) => value,
                Err(e) => {
                    scratch.unwind(ctx, from, keys_from);
                    return Err(e);
                }
            };
            // SAFETY: the context is this parse's; the atom is owned by the stack (or freed below).
            let atom = unsafe { scratch.atom(ctx, &key) };
            if atom == qjs::JS_ATOM_NULL {
                drop(value);
                scratch.unwind(ctx, from, keys_from);
                return Err(A::Error::custom("out of memory"));
            }
            let mut atoms = scratch.atoms.borrow_mut();
            let mut values = scratch.values.borrow_mut();
            // A key seen again keeps its first place and takes the last value (as JSON.parse does).
            if let Some(at) = atoms[keys_from..].iter().position(|a| *a == atom) {
                // SAFETY: the old value and the second reference to the atom are freed once.
                unsafe {
                    qjs::JS_FreeValue(ctx, values[from + at]);
                    qjs::JS_FreeAtom(ctx, atom);
                }
                values[from + at] = value.into_raw();
                continue;
            }
            atoms.push(atom);
            values.push(value.into_raw());
        }
        let mut atoms = scratch.atoms.borrow_mut();
        let mut values = scratch.values.borrow_mut();
        let Ok(count) = i32::try_from(atoms.len() - keys_from) else {
            drop((atoms, values));
            scratch.unwind(ctx, from, keys_from);
            return Err(A::Error::custom("too many keys"));
        };
        // SAFETY: the atoms are distinct; the values pass to the object (freed by QuickJS if it fails), so
        // they leave the stack unfreed; the atoms stay ours and are freed.
        let object =
            unsafe { qjs::JS_NewPlainObjectFrom(ctx, count, atoms[keys_from..].as_ptr(), values[from..].as_mut_ptr()) };
        values.truncate(from);
        for atom in atoms.drain(keys_from..) {
            unsafe { qjs::JS_FreeAtom(ctx, atom) };
        }
        drop((atoms, values));
        self.made(object)
    }
}

/// The atom of `key`. (`JS_NewAtomLen` finds an existing atom by comparing the UTF-8 bytes given with the
/// Latin-1 bytes of the runtime's atoms, so `é` could be taken for an atom `Ã©`: only ASCII keys go that way;
/// others are made a string first.)
///
/// # Safety
/// `ctx` is a live context; the atom returned (or `JS_ATOM_NULL` on failure) is the caller's to free.
unsafe fn atom_of(ctx: *mut qjs::JSContext, key: &str) -> qjs::JSAtom {
    if key.is_ascii() {
        return qjs::JS_NewAtomLen(ctx, key.as_ptr().cast(), key.len() as _);
    }
    let string = qjs::JS_NewStringLen(ctx, key.as_ptr().cast(), key.len() as _);
    if qjs::JS_VALUE_GET_TAG(string) == qjs::JS_TAG_EXCEPTION {
        return qjs::JS_ATOM_NULL;
    }
    let atom = qjs::JS_ValueToAtom(ctx, string);
    qjs::JS_FreeValue(ctx, string);
    atom
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

/// `JSON.stringify(value)`'s text, or `None` when QuickJS's own should answer: QuickJS-ng's spends about
/// 20,000 instructions on a small object (a holder object, a property list per object, a character at a time
/// into its buffer); this walks the value through the C API and writes UTF-8 at once.
///
/// Taken here: `null`, booleans, numbers (QuickJS formats those that are not integers, so the digits are
/// JavaScript's), strings (a lone surrogate escaped as the standard's well-formed JSON.stringify does),
/// arrays, and plain objects (own enumerable string keys in the engine's order, values read with their
/// getters), `undefined`, functions and symbols skipped in objects and `null` in arrays, as the standard says.
/// Left to QuickJS: anything with a callable `toJSON` (a `Date`, say), any other kind of object (a boxed
/// primitive, a Proxy, a typed array...), a BigInt, a cycle (its TypeError), nesting past `MAX_DEPTH`, output
/// past `MAX_OUTPUT`, and a top level that is not a value. (A getter that ran before such a value was met runs
/// again in QuickJS's pass.) An exception from a getter is the script's.
pub fn stringify<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> rquickjs::Result<Option<String>> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the context is alive; the atom is freed below.
    let to_json = unsafe { qjs::JS_NewAtomLen(raw, c"toJSON".as_ptr(), "toJSON".len() as _) };
    if to_json == qjs::JS_ATOM_NULL {
        return Err(rquickjs::Error::Exception);
    }
    // (Sized for a small answer's object at once: growing each from empty costs a reallocation or two.)
    let mut writer = Writer {
        ctx,
        out: String::with_capacity(256),
        open: Vec::with_capacity(8),
        classes: classes(ctx),
        to_json,
        keys: Vec::with_capacity(8),
        key_text: String::with_capacity(64),
    };
    let written = writer.value(value.as_raw());
    unsafe { qjs::JS_FreeAtom(raw, to_json) };
    for (atom, _) in &writer.keys {
        unsafe { qjs::JS_FreeAtom(raw, *atom) };
    }
    match written? {
        Written::Value => Ok(Some(writer.out)),
        Written::Nothing | Written::Declined => Ok(None),
    }
}

/// Nesting deeper than this is left to QuickJS (whose stack limit then decides).
const MAX_DEPTH: usize = 256;
/// Output longer than this is left to QuickJS, whose buffer counts against the function's memory limit.
const MAX_OUTPUT: usize = 4 << 20;

enum Written {
    Value,
    /// `undefined`, a function or a symbol: nothing in an object, `null` in an array.
    Nothing,
    /// Something for QuickJS's stringify.
    Declined,
}

struct Writer<'a, 'js> {
    ctx: &'a Ctx<'js>,
    out: String,
    /// The objects being written, outermost first (a cycle is QuickJS's to report).
    open: Vec<*mut std::ffi::c_void>,
    /// The class ids of plain objects and of arrays in this engine.
    classes: (u32, u32),
    /// The atom `toJSON`.
    to_json: qjs::JSAtom,
    /// Keys written so far in this call (their atoms held until it ends), quoted, in `key_text`.
    keys: Vec<(qjs::JSAtom, std::ops::Range<usize>)>,
    key_text: String,
}

thread_local! {
    static CLASSES: std::cell::Cell<Option<(u32, u32)>> = const { std::cell::Cell::new(None) };
}

/// The class ids QuickJS gives `{}` and `[]` (internal numbers: asked of the engine once per thread).
fn classes(ctx: &Ctx<'_>) -> (u32, u32) {
    CLASSES.with(|cell| {
        if let Some(ids) = cell.get() {
            return ids;
        }
        let raw = ctx.as_raw().as_ptr();
        // SAFETY: the context is alive; both new values are freed after their class is read.
        let ids = unsafe {
            let object = qjs::JS_NewObject(raw);
            let array = qjs::JS_NewArray(raw);
            let ids = (qjs::JS_GetClassID(object), qjs::JS_GetClassID(array));
            qjs::JS_FreeValue(raw, object);
            qjs::JS_FreeValue(raw, array);
            ids
        };
        // (An allocation failure gives class 0 for both: nothing matches then, and QuickJS answers.)
        if ids.0 != 0 && ids.1 != 0 {
            cell.set(Some(ids));
        }
        ids
    })
}

impl<'js> Writer<'_, 'js> {
    fn raw_ctx(&self) -> *mut qjs::JSContext {
        self.ctx.as_raw().as_ptr()
    }

    /// An owned value from the C API, freed when dropped (the exception marker is the pending exception).
    fn own(&self, raw: qjs::JSValue) -> rquickjs::Result<Value<'js>> {
        // SAFETY: `raw` was just returned to us, owned.
        if unsafe { qjs::JS_VALUE_GET_TAG(raw) } == qjs::JS_TAG_EXCEPTION {
            return Err(rquickjs::Error::Exception);
        }
        Ok(unsafe { Value::from_raw(self.ctx.clone(), raw) })
    }

    fn value(&mut self, v: qjs::JSValue) -> rquickjs::Result<Written> {
        if self.out.len() > MAX_OUTPUT {
            return Ok(Written::Declined);
        }
        // SAFETY: `v` is a live value borrowed from the caller for the duration of this call.
        let tag = unsafe { qjs::JS_VALUE_GET_TAG(v) };
        match tag {
            qjs::JS_TAG_NULL => self.out.push_str("null"),
            qjs::JS_TAG_BOOL => self.out.push_str(if unsafe { qjs::JS_VALUE_GET_BOOL(v) } { "true" } else { "false" }),
            qjs::JS_TAG_INT => {
                use std::fmt::Write;
                let _ = write!(self.out, "{}", unsafe { qjs::JS_VALUE_GET_INT(v) });
            }
            qjs::JS_TAG_FLOAT64 => self.number(v, unsafe { qjs::JS_VALUE_GET_FLOAT64(v) })?,
            qjs::JS_TAG_STRING | qjs::JS_TAG_STRING_ROPE => {
                if !self.raw_text(v, true)? {
                    return Ok(Written::Declined);
                }
            }
            qjs::JS_TAG_UNDEFINED | qjs::JS_TAG_SYMBOL => return Ok(Written::Nothing),
            qjs::JS_TAG_OBJECT => return self.object(v),
            _ => return Ok(Written::Declined),
        }
        Ok(Written::Value)
    }

    fn number(&mut self, v: qjs::JSValue, n: f64) -> rquickjs::Result<()> {
        if !n.is_finite() {
            self.out.push_str("null");
        } else if n == n.trunc() && n.abs() < 9_007_199_254_740_992.0 {
            // An integer JavaScript prints in full (-0 included, as "0").
            use std::fmt::Write;
            let _ = write!(self.out, "{}", n as i64);
        } else if !js_number(&mut self.out, n) {
            // Sixteen or seventeen digits: the last may be a tie, which JavaScript breaks to even and Rust's
            // shortest form may not; QuickJS's own digits then.
            let text = self.own(unsafe { qjs::JS_ToString(self.raw_ctx(), v) })?;
            self.raw_text(text.as_raw(), false)?; // (a number's few bytes: the cap is checked before each value)
        }
        Ok(())
    }

    /// The UTF-8 of string `v` (QuickJS keeps a lone surrogate as its 3-byte form), quoted and escaped when
    /// `quoted`, else as it is.
    /// `false` when the output would pass `MAX_OUTPUT` (nothing written).
    fn raw_text(&mut self, v: qjs::JSValue, quoted: bool) -> rquickjs::Result<bool> {
        let ctx = self.raw_ctx();
        let mut len = 0;
        // SAFETY: the returned buffer holds `len` bytes until `JS_FreeCString`.
        let ptr = unsafe { qjs::JS_ToCStringLen2(ctx, &mut len, v, false) };
        if ptr.is_null() {
            return Err(rquickjs::Error::Exception);
        }
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len as usize) };
        if self.out.len() + bytes.len() > MAX_OUTPUT {
            // (Past the cap the text would grow outside the heap limit: QuickJS's stringify, inside it, answers.)
            unsafe { qjs::JS_FreeCString(ctx, ptr) };
            return Ok(false);
        }
        if quoted {
            quote(&mut self.out, bytes);
        } else {
            self.out.push_str(&String::from_utf8_lossy(bytes));
        }
        unsafe { qjs::JS_FreeCString(ctx, ptr) };
        Ok(true)
    }

    fn object(&mut self, v: qjs::JSValue) -> rquickjs::Result<Written> {
        let class = unsafe { qjs::JS_GetClassID(v) };
        let (plain, array) = self.classes;
        if class != plain && class != array {
            // A function without `toJSON` is skipped like `undefined`; every other object is QuickJS's.
            if !unsafe { qjs::JS_IsFunction(self.raw_ctx(), v) } {
                return Ok(Written::Declined);
            }
            let to_json = self.own(unsafe { qjs::JS_GetProperty(self.raw_ctx(), v, self.to_json) })?;
            return Ok(if to_json.is_function() { Written::Declined } else { Written::Nothing });
        }
        let pointer = unsafe { qjs::JS_VALUE_GET_PTR(v) };
        if self.open.len() >= MAX_DEPTH || self.open.contains(&pointer) {
            return Ok(Written::Declined);
        }
        // A callable `toJSON` (own or inherited) is QuickJS's to call.
        let to_json = self.own(unsafe { qjs::JS_GetProperty(self.raw_ctx(), v, self.to_json) })?;
        if to_json.is_function() {
            return Ok(Written::Declined);
        }
        self.open.push(pointer);
        let written = if class == array { self.array(v) } else { self.members(v) };
        self.open.pop();
        written
    }

    fn array(&mut self, v: qjs::JSValue) -> rquickjs::Result<Written> {
        let ctx = self.raw_ctx();
        // A dense array: its elements read at once (each held while it is written, as writing one may run a
        // `toJSON` getter that changes the array).
        let mut items: *mut qjs::JSValue = std::ptr::null_mut();
        let mut count = 0u32;
        // SAFETY: on true, `items` points at `count` values of the array, borrowed: each is duplicated at once.
        if unsafe { qjs::JS_GetFastArrayValues(ctx, v, &mut items, &mut count) } {
            // SAFETY: each borrowed element is duplicated here and freed once below.
            let held: SmallVec<[qjs::JSValue; 16]> =
                (0..count as usize).map(|i| unsafe { qjs::JS_DupValue(ctx, *items.add(i)) }).collect();
            let written = self.elements(&held);
            for item in held {
                unsafe { qjs::JS_FreeValue(ctx, item) };
            }
            return written;
        }
        let mut length = 0i64;
        if unsafe { qjs::JS_GetLength(ctx, v, &mut length) } < 0 {
            return Err(rquickjs::Error::Exception);
        }
        self.out.push('[');
        for i in 0..length {
            if i > 0 {
                self.out.push(',');
            }
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            // SAFETY: an index atom is a tagged number (nothing to free) below 2^31, a string atom above.
            let atom = unsafe { qjs::JS_NewAtomUInt32(ctx, index) };
            if atom == qjs::JS_ATOM_NULL {
                return Err(rquickjs::Error::Exception);
            }
            let item = self.own_data(v, atom);
            unsafe { qjs::JS_FreeAtom(ctx, atom) };
            // A hole (the prototype's to answer) or a getter: QuickJS's.
            let Some(item) = item? else { return Ok(Written::Declined) };
            match self.value(item.as_raw())? {
                Written::Value => {}
                Written::Nothing => self.out.push_str("null"),
                Written::Declined => return Ok(Written::Declined),
            }
        }
        self.out.push(']');
        Ok(Written::Value)
    }

    /// The value of `v`'s own data property `atom`; `None` when it is an accessor (whose getter is then not run
    /// here: QuickJS's stringify runs it, once) or not an own property.
    fn own_data(&self, v: qjs::JSValue, atom: qjs::JSAtom) -> rquickjs::Result<Option<Value<'js>>> {
        let ctx = self.raw_ctx();
        let mut desc = std::mem::MaybeUninit::<qjs::JSPropertyDescriptor>::uninit();
        // SAFETY: on 1 QuickJS filled `desc`, whose three values are owned here (freed below or kept).
        match unsafe { qjs::JS_GetOwnProperty(ctx, desc.as_mut_ptr(), v, atom) } {
            found if found < 0 => Err(rquickjs::Error::Exception),
            0 => Ok(None),
            _ => {
                let desc = unsafe { desc.assume_init() };
                let (value, getter, setter) = (self.own(desc.value)?, self.own(desc.getter)?, self.own(desc.setter)?);
                drop((getter, setter));
                Ok(((desc.flags as u32) & qjs::JS_PROP_GETSET == 0).then_some(value))
            }
        }
    }

    fn members(&mut self, v: qjs::JSValue) -> rquickjs::Result<Written> {
        let ctx = self.raw_ctx();
        // An ordinary object of data properties (nearly always): its keys and values read from its shape at
        // once (JS_GetOwnDataProperties), each value held while written, each key quoted once per call.
        const FAST: usize = 32;
        let mut atoms = [qjs::JS_ATOM_NULL; FAST];
        let mut values = [qjs::JS_UNDEFINED; FAST];
        // SAFETY: room for FAST of each; on success the first `n` are the object's, borrowed (duplicated at once).
        let n = unsafe { qjs::JS_GetOwnDataProperties(ctx, v, atoms.as_mut_ptr(), values.as_mut_ptr(), FAST as i32) };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: each borrowed key and value is duplicated in place and freed once below.
            for i in 0..n {
                unsafe {
                    atoms[i] = qjs::JS_DupAtom(ctx, atoms[i]);
                    values[i] = qjs::JS_DupValue(ctx, values[i]);
                }
            }
            let written = self.fields(&atoms[..n], &values[..n]);
            for i in 0..n {
                unsafe {
                    qjs::JS_FreeAtom(ctx, atoms[i]);
                    qjs::JS_FreeValue(ctx, values[i]);
                }
            }
            return written;
        }
        let mut table: *mut qjs::JSPropertyEnum = std::ptr::null_mut();
        let mut count = 0u32;
        let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as i32;
        if unsafe { qjs::JS_GetOwnPropertyNames(ctx, &mut table, &mut count, v, flags) } < 0 {
            return Err(rquickjs::Error::Exception);
        }
        // SAFETY: QuickJS filled `count` entries, freed below with `JS_FreePropertyEnum`.
        let atoms: Vec<qjs::JSAtom> = (0..count as usize).map(|i| unsafe { (*table.add(i)).atom }).collect();
        let result = self.members_of(v, &atoms);
        unsafe { qjs::JS_FreePropertyEnum(ctx, table, count) };
        result
    }

    /// `[value,...]` of elements in hand (held by the caller).
    fn elements(&mut self, items: &[qjs::JSValue]) -> rquickjs::Result<Written> {
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            match self.value(*item)? {
                Written::Value => {}
                Written::Nothing => self.out.push_str("null"),
                Written::Declined => return Ok(Written::Declined),
            }
        }
        self.out.push(']');
        Ok(Written::Value)
    }

    /// `{"key":value,...}` of properties in hand (held by the caller).
    fn fields(&mut self, atoms: &[qjs::JSAtom], values: &[qjs::JSValue]) -> rquickjs::Result<Written> {
        self.out.push('{');
        let mut first = true;
        for (atom, item) in atoms.iter().zip(values) {
            let mark = self.out.len();
            if !first {
                self.out.push(',');
            }
            self.key(*atom)?;
            self.out.push(':');
            match self.value(*item)? {
                Written::Value => first = false,
                Written::Nothing => self.out.truncate(mark),
                Written::Declined => return Ok(Written::Declined),
            }
        }
        self.out.push('}');
        Ok(Written::Value)
    }

    /// A key, quoted: from the keys met before in this call (objects repeat theirs), else made and kept.
    fn key(&mut self, atom: qjs::JSAtom) -> rquickjs::Result<()> {
        if let Some((_, range)) = self.keys.iter().find(|(a, _)| *a == atom) {
            let range = range.clone();
            let text = &self.key_text[range];
            self.out.push_str(text);
            return Ok(());
        }
        let ctx = self.raw_ctx();
        let mut len = 0;
        let key = unsafe { qjs::JS_AtomToCStringLen(ctx, &mut len, atom) };
        if key.is_null() {
            return Err(rquickjs::Error::Exception);
        }
        let start = self.key_text.len();
        quote(&mut self.key_text, unsafe { std::slice::from_raw_parts(key.cast::<u8>(), len as usize) });
        unsafe { qjs::JS_FreeCString(ctx, key) };
        let range = start..self.key_text.len();
        self.out.push_str(&self.key_text[range.clone()]);
        if self.keys.len() < 64 {
            // (Held, so that the number cannot name another atom before the call ends: freed in `stringify`.)
            self.keys.push((unsafe { qjs::JS_DupAtom(ctx, atom) }, range));
        }
        Ok(())
    }

    fn members_of(&mut self, v: qjs::JSValue, atoms: &[qjs::JSAtom]) -> rquickjs::Result<Written> {
        let ctx = self.raw_ctx();
        self.out.push('{');
        let mut first = true;
        for &atom in atoms {
            let Some(item) = self.own_data(v, atom)? else { return Ok(Written::Declined) };
            let mark = self.out.len();
            if !first {
                self.out.push(',');
            }
            let mut len = 0;
            let key = unsafe { qjs::JS_AtomToCStringLen(ctx, &mut len, atom) };
            if key.is_null() {
                return Err(rquickjs::Error::Exception);
            }
            quote(&mut self.out, unsafe { std::slice::from_raw_parts(key.cast::<u8>(), len as usize) });
            unsafe { qjs::JS_FreeCString(ctx, key) };
            self.out.push(':');
            match self.value(item.as_raw())? {
                Written::Value => first = false,
                Written::Nothing => self.out.truncate(mark),
                Written::Declined => return Ok(Written::Declined),
            }
        }
        self.out.push('}');
        Ok(Written::Value)
    }
}

/// A finite number as JavaScript's `Number.prototype.toString` writes it: the shortest digits that read back
/// as the same double (Rust's `{:e}` finds the same ones), placed by the standard's rule (Number::toString):
/// plain up to 21 integer digits, `0.000ddd` down to 1e-7, the exponent form beyond.
/// `false` (and nothing written) when the shortest form has 16 or 17 digits, where two forms can be equally
/// close and JavaScript takes the even one (Rust's shortest form rounds such a tie up).
fn js_number(out: &mut String, n: f64) -> bool {
    use std::fmt::Write;
    let start = out.len();
    let _ = write!(out, "{n:e}"); // "-1.2345e-7": sign, digits with a point after the first, exponent
    let scientific = out.split_off(start);
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    // The digits: the mantissa without its point.
    let (first, rest) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digit = |i: usize| if i < first.len() { &first[i..i + 1] } else { &rest[i - first.len()..i - first.len() + 1] };
    let k = (first.len() + rest.len()) as i32;
    if k >= 16 {
        return false;
    }
    let point = exponent.parse::<i32>().unwrap_or(0) + 1; // `n` in the standard: where the point goes
    let digits = |out: &mut String, from: i32, to: i32| (from..to).for_each(|i| out.push_str(digit(i as usize)));
    if negative {
        out.push('-');
    }
    if k <= point && point <= 21 {
        digits(out, 0, k);
        out.extend(std::iter::repeat_n('0', (point - k) as usize));
    } else if 0 < point && point <= 21 {
        digits(out, 0, point);
        out.push('.');
        digits(out, point, k);
    } else if -6 < point && point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        digits(out, 0, k);
    } else {
        digits(out, 0, 1);
        if k > 1 {
            out.push('.');
            digits(out, 1, k);
        }
        let _ = write!(out, "e{}{}", if point - 1 < 0 { '-' } else { '+' }, (point - 1).abs());
    }
    true
}

/// `bytes` (QuickJS's UTF-8, a lone surrogate in its 3-byte form) as a JSON string: quotes, backslashes and
/// control characters escaped, lone surrogates as `\udXXX`, everything else as it is.
fn quote(out: &mut String, bytes: &[u8]) {
    out.push('"');
    let flush = |out: &mut String, run: &[u8]| match std::str::from_utf8(run) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(run)),
    };
    let mut plain = 0; // start of the run of bytes copied as they are
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b >= 0x20 && b != b'"' && b != b'\\' && b != 0xed {
            i += 1;
            continue;
        }
        // A surrogate's 3-byte form (ED A0-BF xx): only a lone one reaches here (a pair is 4 bytes of UTF-8).
        let surrogate = b == 0xed && i + 2 < bytes.len() && bytes[i + 1] & 0xe0 == 0xa0;
        if b == 0xed && !surrogate {
            i += 1;
            continue;
        }
        flush(out, &bytes[plain..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            0xed => {
                let unit = 0xd000 | ((u32::from(bytes[i + 1]) & 0x3f) << 6) | (u32::from(bytes[i + 2]) & 0x3f);
                use std::fmt::Write;
                let _ = write!(out, "\\u{unit:04x}");
            }
            _ => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{b:04x}");
            }
        }
        i += if surrogate { 3 } else { 1 };
        plain = i;
    }
    flush(out, &bytes[plain..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::{js_number, quote};

    fn number(n: f64) -> Option<String> {
        let mut out = String::new();
        js_number(&mut out, n).then_some(out)
    }

    #[test]
    #[allow(clippy::excessive_precision)] // (the digits of a tie, on purpose)
    fn numbers_are_written_as_javascript_writes_them() {
        for (n, text) in [
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e20, "150000000000000000000"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (0.0000015, "0.0000015"),
            (12.59, "12.59"),
            (-0.5, "-0.5"),
            (1.23e-18, "1.23e-18"),
            (5e-324, "5e-324"),
            (1.5e308, "1.5e+308"),
            (4294967296.5, "4294967296.5"),
        ] {
            assert_eq!(number(n).as_deref(), Some(text), "{n:e}");
        }
        // Sixteen and seventeen digits are left to QuickJS (JavaScript breaks a tie in the last digit to even).
        assert_eq!(number(752044415567070.25), None);
        assert_eq!(number(8796093022208.0625), None);
        assert_eq!(number(0.30000000000000004), None);
        assert_eq!(number(123456789012345680000.0), None);
    }

    #[test]
    fn every_number_written_reads_back_as_itself() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let n = f64::from_bits(seed);
            if !n.is_finite() {
                continue;
            }
            if let Some(text) = number(n) {
                assert_eq!(text.parse::<f64>().ok(), Some(n), "{text}");
            }
        }
    }

    #[test]
    fn strings_are_quoted_as_well_formed_json_stringify_quotes_them() {
        let mut out = String::new();
        quote(&mut out, "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{7f} é€😀\u{2028}".as_bytes());
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\u{7f} é€😀\u{2028}\"");
        // A lone surrogate, as QuickJS hands it over (its 3-byte form), is escaped; text around it is kept.
        let mut out = String::new();
        quote(&mut out, &[b'x', 0xed, 0xa0, 0x80, b'y', 0xed, 0xbf, 0xbf]);
        assert_eq!(out, "\"x\\ud800y\\udfff\"");
    }
}
