//! The native side of the Encoding Standard (encoding.js builds `TextEncoder`, `TextDecoder`,
//! `TextEncoderStream` and `TextDecoderStream` on these): labels, decoders for every encoding the standard
//! defines, BOM handling and streaming state from `encoding_rs` (the standard's implementation in Firefox),
//! and UTF-8 encoding. No hand-written decoding.
//!
//! The natives are handed to encoding.js's setup function, not set as globals; whatever it passes them is
//! checked here (a wrong type is a `TypeError`, never a panic).

use crate::url::guarded;
use encoding_rs::{CoderResult, Decoder, DecoderResult, Encoding};
use rquickjs::class::{JsClass, Trace, Tracer, Writable};
use rquickjs::function::Func;
use rquickjs::{ArrayBuffer, Class, Constructor, Ctx, JsLifetime, Object, TypedArray, Value};

/// The encoding `label` names, as `TextDecoder.encoding` spells it (the standard's name in lowercase);
/// `None` for no encoding and for the replacement encoding, which `TextDecoder` refuses.
fn encoding_for(label: String) -> Option<String> {
    Encoding::for_label_no_replacement(label.as_bytes()).map(|e| e.name().to_ascii_lowercase())
}

fn encoding_named(name: &str) -> rquickjs::Result<&'static Encoding> {
    Encoding::for_label_no_replacement(name.as_bytes())
        .ok_or_else(|| rquickjs::Error::new_from_js_message("string", "encoding", format!("no encoding {name:?}")))
}

/// `bytes` decoded whole, as one `decode()` that does not stream: the BOM of the encoding removed unless
/// `ignore_bom`, each malformed sequence a U+FFFD, or `None` for malformed bytes when `fatal`.
fn decode(name: String, bytes: TypedArray<'_, u8>, fatal: bool, ignore_bom: bool) -> rquickjs::Result<Option<String>> {
    guarded("decoder", || {
        let encoding = encoding_named(&name)?;
        // SAFETY: read in place while no JavaScript runs; the text made of it is a copy.
        let mut input = unsafe { bytes.as_bytes() }.unwrap_or_default();
        if !ignore_bom {
            if let Some((bom_encoding, length)) = Encoding::for_bom(input) {
                if bom_encoding == encoding {
                    input = input.get(length..).unwrap_or_default();
                }
            }
        }
        Ok(if fatal {
            encoding.decode_without_bom_handling_and_without_replacement(input).map(|text| text.into_owned())
        } else {
            Some(encoding.decode_without_bom_handling(input).0.into_owned())
        })
    })
}

/// A decoder in the middle of a stream (`decode(bytes, { stream: true })`): what it holds of a sequence
/// split between calls, whether it has seen the start of the stream (for the BOM), and the state of the
/// stateful encodings (ISO-2022-JP).
pub struct StreamDecoder(Decoder);

// SAFETY: no JavaScript value in it, so no lifetime to change.
unsafe impl<'js> JsLifetime<'js> for StreamDecoder {
    type Changed<'to> = StreamDecoder;
}

impl<'js> Trace<'js> for StreamDecoder {
    fn trace<'a>(&self, _tracer: Tracer<'a, 'js>) {}
}

impl<'js> JsClass<'js> for StreamDecoder {
    const NAME: &'static str = "StreamDecoder";
    type Mutable = Writable;
    fn constructor(_ctx: &Ctx<'js>) -> rquickjs::Result<Option<Constructor<'js>>> {
        Ok(None)
    }
}

/// A new stream's decoder for the encoding `name`.
fn decoder<'js>(ctx: Ctx<'js>, name: String, ignore_bom: bool) -> rquickjs::Result<Class<'js, StreamDecoder>> {
    let encoding = encoding_named(&name)?;
    let decoder =
        if ignore_bom { encoding.new_decoder_without_bom_handling() } else { encoding.new_decoder_with_bom_removal() };
    Class::instance(ctx, StreamDecoder(decoder))
}

/// The text the stream's next bytes complete (`last`: the stream ends with them, and a sequence left
/// unfinished is malformed); `None` for malformed bytes when `fatal`.
fn decode_more(
    decoder: Class<'_, StreamDecoder>,
    bytes: TypedArray<'_, u8>,
    last: bool,
    fatal: bool,
) -> rquickjs::Result<Option<String>> {
    let mut decoder = decoder.try_borrow_mut()?;
    // SAFETY: read in place while no JavaScript runs; the decoder copies what it keeps of it.
    let input = unsafe { bytes.as_bytes() }.unwrap_or_default();
    guarded("decoder", || Ok(run(&mut decoder.0, input, last, fatal)))
}

fn run(decoder: &mut Decoder, mut input: &[u8], last: bool, fatal: bool) -> Option<String> {
    let mut out = String::with_capacity(input.len().saturating_add(16));
    loop {
        let (done, read) = if fatal {
            match decoder.decode_to_string_without_replacement(input, &mut out, last) {
                (DecoderResult::InputEmpty, read) => (true, read),
                (DecoderResult::OutputFull, read) => (false, read),
                (DecoderResult::Malformed(..), _) => return None,
            }
        } else {
            let (result, read, _) = decoder.decode_to_string(input, &mut out, last);
            (result == CoderResult::InputEmpty, read)
        };
        if done {
            return Some(out);
        }
        input = input.get(read..).unwrap_or_default();
        out.reserve(out.capacity().max(64));
    }
}

/// Well-formed text (encoding.js makes it so) as UTF-8.
fn encode<'js>(ctx: Ctx<'js>, text: String) -> rquickjs::Result<ArrayBuffer<'js>> {
    ArrayBuffer::new(ctx, text.into_bytes())
}

/// `TextEncoder.encodeInto`: as much of well-formed `text` as fits in `destination`, whole characters only;
/// `[read, written]`, read in UTF-16 code units as JavaScript counts.
fn encode_into(text: String, destination: TypedArray<'_, u8>) -> rquickjs::Result<Vec<f64>> {
    let Some(raw) = destination.as_raw() else { return Ok(vec![0.0, 0.0]) };
    let mut cut = text.len().min(raw.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let Some(written) = text.get(..cut) else { return Ok(vec![0.0, 0.0]) };
    // SAFETY: `raw` is the view's memory, at least `cut` bytes long, and no JavaScript runs while it is
    // written; the text is a Rust string, never that memory.
    unsafe { std::ptr::copy_nonoverlapping(written.as_ptr(), raw.cast::<u8>().as_ptr(), cut) };
    let read = if cut == text.len() && text.is_ascii() { cut } else { written.encode_utf16().count() };
    Ok(vec![read as f64, cut as f64])
}

/// The natives encoding.js's setup function takes.
pub fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Value<'js>> {
    let natives = Object::new(ctx.clone())?;
    natives.set("encodingFor", Func::from(encoding_for))?;
    natives.set("decode", Func::from(decode))?;
    natives.set("decoder", Func::from(decoder))?;
    natives.set("decodeMore", Func::from(decode_more))?;
    natives.set("encode", Func::from(encode))?;
    natives.set("encodeInto", Func::from(encode_into))?;
    Ok(natives.into_value())
}
