//! The native side of `crypto` (prelude.js builds the Web Crypto API on these): random bytes from the
//! system's generator, digests and HMAC from `ring` (no hand-written cryptography).

use ring::rand::SecureRandom;
use rquickjs::{ArrayBuffer, Ctx};

/// `length` random bytes (at most 65,536, as `getRandomValues` allows).
pub fn random<'js>(ctx: Ctx<'js>, length: usize) -> rquickjs::Result<ArrayBuffer<'js>> {
    let mut bytes = vec![0u8; length.min(65_536)];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| {
        rquickjs::Error::new_from_js_message("crypto", "random", "the system's random generator failed")
    })?;
    ArrayBuffer::new(ctx, bytes)
}

fn digest_algorithm(name: &str) -> Option<&'static ring::digest::Algorithm> {
    match name.to_ascii_uppercase().as_str() {
        "SHA-1" => Some(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY),
        "SHA-256" => Some(&ring::digest::SHA256),
        "SHA-384" => Some(&ring::digest::SHA384),
        "SHA-512" => Some(&ring::digest::SHA512),
        _ => None,
    }
}

fn hmac_algorithm(name: &str) -> Option<ring::hmac::Algorithm> {
    match name.to_ascii_uppercase().as_str() {
        "SHA-1" => Some(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY),
        "SHA-256" => Some(ring::hmac::HMAC_SHA256),
        "SHA-384" => Some(ring::hmac::HMAC_SHA384),
        "SHA-512" => Some(ring::hmac::HMAC_SHA512),
        _ => None,
    }
}

/// Copies the bytes of `buffer` from `offset` (`length` of them).
fn bytes_of(buffer: &ArrayBuffer<'_>, offset: usize, length: usize) -> Vec<u8> {
    // SAFETY: copied at once; no JavaScript runs while the slice is borrowed.
    let all = unsafe { buffer.as_bytes() }.unwrap_or_default();
    let end = offset.saturating_add(length).min(all.len());
    all[offset.min(end)..end].to_vec()
}

fn unsupported(what: &str) -> rquickjs::Error {
    rquickjs::Error::new_from_js_message("string", "algorithm", format!("unsupported algorithm {what}"))
}

/// The digest of the bytes with `algorithm` (`SHA-1`, `SHA-256`, `SHA-384`, `SHA-512`).
pub fn digest<'js>(
    ctx: Ctx<'js>,
    algorithm: String,
    data: ArrayBuffer<'js>,
    offset: usize,
    length: usize,
) -> rquickjs::Result<ArrayBuffer<'js>> {
    let algorithm = digest_algorithm(&algorithm).ok_or_else(|| unsupported(&algorithm))?;
    let digest = ring::digest::digest(algorithm, &bytes_of(&data, offset, length));
    ArrayBuffer::new_copy(ctx, digest.as_ref())
}

/// The HMAC of `data` under `key` with `hash`.
pub fn hmac<'js>(
    ctx: Ctx<'js>,
    hash: String,
    key: ArrayBuffer<'js>,
    data: ArrayBuffer<'js>,
    offset: usize,
    length: usize,
) -> rquickjs::Result<ArrayBuffer<'js>> {
    let algorithm = hmac_algorithm(&hash).ok_or_else(|| unsupported(&hash))?;
    let key = ring::hmac::Key::new(algorithm, &bytes_of(&key, 0, usize::MAX));
    let tag = ring::hmac::sign(&key, &bytes_of(&data, offset, length));
    ArrayBuffer::new_copy(ctx, tag.as_ref())
}
