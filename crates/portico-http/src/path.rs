//! Request-path normalisation: RFC 3986 section 6.2.2 (case and percent-encoding normalisation) and section
//! 5.2.4 (dot-segment removal), with the security policies a gateway in front of other servers needs.
//!
//! Written by hand: the URL crates (`url`, `http`, `percent-encoding`, `path-clean`…) either work on `str` (a
//! request path is bytes and may be Latin-1), clamp `..` at the root instead of refusing it, decode every
//! percent-encoding (turning `%2F` into a separator behind the back of the routing rules), or do not look for
//! overlong UTF-8. None does exactly this on raw bytes, so it lives here, pure and fuzzed
//! (`fuzz/fuzz_targets/path_normalize.rs`).
//!
//! The rules, in order:
//! - `%` must be followed by two hex digits. Encoded unreserved characters (`ALPHA DIGIT - . _ ~`) are decoded;
//!   every other percent-encoding is kept with its hex digits uppercased.
//! - `%00` is refused, and so is overlong UTF-8 in the bytes once percent-decoded (or raw): a lead byte
//!   `0xC0`/`0xC1` followed by a continuation byte, `0xE0` followed by `0x80..=0x9F`, `0xF0` followed by
//!   `0x80..=0x8F`. Other bytes that are not UTF-8 are kept as they are (legacy clients send Latin-1, where
//!   `0xC0` is `À`).
//! - `%2F` is refused, kept (never a separator) or decoded into a separator, as [`EncodedSlashes`] says.
//! - Runs of `/` become one `/` when [`NormalizeOptions::merge_slashes`] is set; otherwise empty segments stay.
//! - `.` segments go, `..` removes the previous segment (an empty one too), and a trailing `.` or `..` leaves a
//!   trailing slash. A `..` above the root is refused, where RFC 3986 would clamp it: a client that sends one
//!   is probing for a traversal.
//!
//! A path that is already normal (the common case) is checked in one scan and returned borrowed.

use std::borrow::Cow;
use std::fmt;

/// What to do with an encoded slash, `%2F`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EncodedSlashes {
    /// The request is refused (the safe default: the upstream might decode it into a separator).
    #[default]
    Reject,
    /// Kept as `%2F`, part of its segment, never a separator.
    Keep,
    /// Decoded into `/`, which is then a separator like any other.
    Decode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormalizeOptions {
    /// Runs of `/` become one `/`.
    pub merge_slashes: bool,
    pub encoded_slashes: EncodedSlashes,
}

impl Default for NormalizeOptions {
    fn default() -> Self {
        NormalizeOptions { merge_slashes: true, encoded_slashes: EncodedSlashes::Reject }
    }
}

/// A path that cannot be normalised; the caller answers 400.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathError {
    /// A short English sentence, for the log and the error page.
    pub reason: &'static str,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)
    }
}

impl std::error::Error for PathError {}

const MALFORMED: PathError = PathError { reason: "malformed percent-encoding in the path" };
const ENCODED_NUL: PathError = PathError { reason: "an encoded NUL (%00) in the path is refused" };
const OVERLONG: PathError = PathError { reason: "overlong UTF-8 in the path" };
const ENCODED_SLASH: PathError = PathError { reason: "an encoded slash (%2F) in the path is refused" };
const ABOVE_ROOT: PathError = PathError { reason: "the path climbs above the root" };

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Normalises `path`, the path part of a request target only (no query, no fragment), starting with `/`.
///
/// Returns `Cow::Borrowed(path)` when nothing changes, which costs one scan and no allocation. Input that does
/// not start with `/` (asterisk-form, empty) is returned unchanged.
pub fn normalize<'a>(path: &'a [u8], opts: &NormalizeOptions) -> Result<Cow<'a, [u8]>, PathError> {
    if path.first() != Some(&b'/') || plainly_normal(path, opts.merge_slashes) || is_normal(path, opts)? {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path, opts)?;
    remove_dot_segments(&decoded, opts.merge_slashes).map(Cow::Owned)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// The byte `%XX` at `path[i]` stands for, and whether it was written with a lowercase hex digit.
fn percent_decode_at(path: &[u8], i: usize) -> Result<(u8, bool), PathError> {
    let (Some(&hi), Some(&lo)) = (path.get(i + 1), path.get(i + 2)) else { return Err(MALFORMED) };
    let (Some(h), Some(l)) = (hex_value(hi), hex_value(lo)) else { return Err(MALFORMED) };
    let value = (h << 4) | l;
    if value == 0 {
        return Err(ENCODED_NUL);
    }
    Ok((value, hi.is_ascii_lowercase() || lo.is_ascii_lowercase()))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Whether `cur` following `prev` (both after percent-decoding) makes an overlong UTF-8 sequence.
fn overlong(prev: u8, cur: u8) -> bool {
    matches!((prev, cur), (0xC0 | 0xC1, 0x80..=0xBF) | (0xE0, 0x80..=0x9F) | (0xF0, 0x80..=0x8F))
}

fn is_dot_segment(segment: &[u8]) -> bool {
    segment == b"." || segment == b".."
}

/// The cheapest look at the commonest path: ASCII, no `%`, and no segment that starts with `.` (a possible dot
/// segment) or is empty (`//`, when merging). Such a path is normal; anything else gets the full scan.
fn plainly_normal(path: &[u8], merge_slashes: bool) -> bool {
    let mut prev = b'/';
    for &b in &path[1..] {
        if b == b'%' || b >= 0x80 || (prev == b'/' && (b == b'.' || (merge_slashes && b == b'/'))) {
            return false;
        }
        prev = b;
    }
    true
}

/// The single scan of the common case: `Ok(true)` when `path` (starting with `/`) is already normal. `Ok(false)`
/// as soon as something would change; the slow path then starts over and finds any later error.
fn is_normal(path: &[u8], opts: &NormalizeOptions) -> Result<bool, PathError> {
    let mut prev = b'/';
    let mut segment_start = 1;
    let mut i = 1;
    while i < path.len() {
        let b = path[i];
        let cur = match b {
            b'/' => {
                if is_dot_segment(&path[segment_start..i]) || (opts.merge_slashes && i == segment_start) {
                    return Ok(false);
                }
                segment_start = i + 1;
                i += 1;
                b
            }
            b'%' => {
                let (value, lowercase) = percent_decode_at(path, i)?;
                if value == b'/' {
                    match opts.encoded_slashes {
                        EncodedSlashes::Reject => return Err(ENCODED_SLASH),
                        EncodedSlashes::Decode => return Ok(false),
                        EncodedSlashes::Keep => {}
                    }
                }
                if lowercase || is_unreserved(value) {
                    return Ok(false);
                }
                i += 3;
                value
            }
            _ => {
                i += 1;
                b
            }
        };
        if overlong(prev, cur) {
            return Err(OVERLONG);
        }
        prev = cur;
    }
    Ok(!is_dot_segment(&path[segment_start..]))
}

/// Percent-decoding and case normalisation of the whole path, with every check on the encodings. A kept
/// encoding stays three bytes (`%2F` under `Keep` is then no separator for [`remove_dot_segments`]).
fn decode(path: &[u8], opts: &NormalizeOptions) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut prev = 0;
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        let cur = if b == b'%' {
            let (value, _) = percent_decode_at(path, i)?;
            let decoded = match value {
                b'/' => match opts.encoded_slashes {
                    EncodedSlashes::Reject => return Err(ENCODED_SLASH),
                    EncodedSlashes::Keep => false,
                    EncodedSlashes::Decode => true,
                },
                _ => is_unreserved(value),
            };
            if decoded {
                out.push(value);
            } else {
                out.extend_from_slice(&[b'%', HEX_UPPER[usize::from(value >> 4)], HEX_UPPER[usize::from(value & 15)]]);
            }
            i += 3;
            value
        } else {
            out.push(b);
            i += 1;
            b
        };
        if overlong(prev, cur) {
            return Err(OVERLONG);
        }
        prev = cur;
    }
    Ok(out)
}

/// RFC 3986 5.2.4 on a decoded path starting with `/`, refusing to climb above the root, and merging slashes
/// when asked. Each segment in `out` is written as `/segment`, so removing one truncates at the last `/`.
fn remove_dot_segments(path: &[u8], merge_slashes: bool) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut segments = path[1..].split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            b"." => {}
            b".." => {
                let Some(start) = out.iter().rposition(|&b| b == b'/') else { return Err(ABOVE_ROOT) };
                out.truncate(start);
            }
            b"" if merge_slashes && !last => {}
            _ => {
                out.push(b'/');
                out.extend_from_slice(segment);
                continue;
            }
        }
        // A dot segment or a skipped empty one: when it was the last, the path ends with a slash.
        if last {
            out.push(b'/');
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MERGE: NormalizeOptions = NormalizeOptions { merge_slashes: true, encoded_slashes: EncodedSlashes::Reject };
    const NO_MERGE: NormalizeOptions =
        NormalizeOptions { merge_slashes: false, encoded_slashes: EncodedSlashes::Reject };
    const KEEP: NormalizeOptions = NormalizeOptions { merge_slashes: true, encoded_slashes: EncodedSlashes::Keep };
    const DECODE: NormalizeOptions = NormalizeOptions { merge_slashes: true, encoded_slashes: EncodedSlashes::Decode };

    fn norm(path: &str, opts: &NormalizeOptions) -> Result<String, &'static str> {
        normalize(path.as_bytes(), opts).map(|p| String::from_utf8(p.into_owned()).unwrap()).map_err(|e| e.reason)
    }

    fn ok(path: &str, expected: &str) {
        assert_eq!(norm(path, &MERGE), Ok(expected.to_owned()), "{path}");
    }

    fn err(path: &str, reason: &str) {
        assert_eq!(norm(path, &MERGE), Err(reason), "{path}");
    }

    #[test]
    fn default_options() {
        assert_eq!(NormalizeOptions::default(), MERGE);
        assert_eq!(EncodedSlashes::default(), EncodedSlashes::Reject);
    }

    #[test]
    fn rfc3986_5_2_4_examples() {
        ok("/a/b/c/./../../g", "/a/g");
        // `mid/content=5/../6`, made absolute.
        ok("/mid/content=5/../6", "/mid/6");
    }

    /// RFC 3986 5.4 with base `http://a/b/c/d;p?q`: the merged path (`/b/c/` + reference) then dot removal.
    #[test]
    fn rfc3986_5_4_examples() {
        let cases = [
            ("g", "/b/c/g"),
            ("./g", "/b/c/g"),
            ("g/", "/b/c/g/"),
            (";x", "/b/c/;x"),
            ("g;x", "/b/c/g;x"),
            ("", "/b/c/"),
            (".", "/b/c/"),
            ("./", "/b/c/"),
            ("..", "/b/"),
            ("../", "/b/"),
            ("../g", "/b/g"),
            ("../..", "/"),
            ("../../", "/"),
            ("../../g", "/g"),
            ("g.", "/b/c/g."),
            (".g", "/b/c/.g"),
            ("g..", "/b/c/g.."),
            ("..g", "/b/c/..g"),
            ("./../g", "/b/g"),
            ("./g/.", "/b/c/g/"),
            ("g/./h", "/b/c/g/h"),
            ("g/../h", "/b/c/h"),
            ("g;x=1/./y", "/b/c/g;x=1/y"),
            ("g;x=1/../y", "/b/c/y"),
        ];
        for (reference, expected) in cases {
            ok(&format!("/b/c/{reference}"), expected);
        }
        // Absolute references.
        ok("/./g", "/g");
        ok("/g", "/g");
        // Where RFC 3986 clamps at the root (`/g`), we refuse.
        err("/b/c/../../../g", "the path climbs above the root");
        err("/b/c/../../../../g", "the path climbs above the root");
        err("/../g", "the path climbs above the root");
    }

    #[test]
    fn traversal_attempts() {
        ok("/api/%2e%2e/admin", "/admin");
        ok("/api/.%2E/admin", "/admin");
        ok("/api/%2E./admin", "/admin");
        assert_eq!(norm("/api/..%2fadmin", &MERGE), Err("an encoded slash (%2F) in the path is refused"));
        assert_eq!(norm("/api/..%2Fadmin", &MERGE), Err("an encoded slash (%2F) in the path is refused"));
        assert_eq!(norm("/api/..%2fadmin", &KEEP), Ok("/api/..%2Fadmin".to_owned()));
        assert!(matches!(normalize(b"/api/..%2Fadmin", &KEEP), Ok(Cow::Borrowed(_))));
        assert_eq!(norm("/api/..%2fadmin", &DECODE), Ok("/admin".to_owned()));
        assert_eq!(norm("/api/..%2Fadmin", &DECODE), Ok("/admin".to_owned()));
        assert_eq!(norm("/a/%2F%2F/b", &DECODE), Ok("/a/b".to_owned()));
        assert_eq!(
            norm("/a/%2F%2F/b", &NormalizeOptions { merge_slashes: false, encoded_slashes: EncodedSlashes::Decode }),
            Ok("/a////b".to_owned())
        );
        assert_eq!(norm("/%2e%2e%2f", &DECODE), Err("the path climbs above the root"));
        err("/..", "the path climbs above the root");
        err("/a/../..", "the path climbs above the root");
        err("/a/../../b", "the path climbs above the root");
        err("/%2e%2e", "the path climbs above the root");
        ok("/api/./x", "/api/x");
        ok("/a/b/..", "/a/");
        ok("/a/.", "/a/");
        ok("/a/./", "/a/");
        ok("/.", "/");
        ok("/a/..", "/");
        ok("/a/../", "/");
        // `...` is a name, not a dot segment.
        ok("/a/.../b", "/a/.../b");
    }

    #[test]
    fn slashes() {
        ok("//admin", "/admin");
        ok("/a//b///c", "/a/b/c");
        ok("/a//", "/a/");
        ok("//", "/");
        ok("///", "/");
        assert_eq!(norm("//admin", &NO_MERGE), Ok("//admin".to_owned()));
        assert!(matches!(normalize(b"//admin", &NO_MERGE), Ok(Cow::Borrowed(_))));
        assert_eq!(norm("/a//b", &NO_MERGE), Ok("/a//b".to_owned()));
        assert_eq!(norm("/a//../b", &NO_MERGE), Ok("/a/b".to_owned()));
        assert_eq!(norm("/a/.//b", &NO_MERGE), Ok("/a//b".to_owned()));
        assert_eq!(norm("//..", &NO_MERGE), Ok("/".to_owned()));
        assert_eq!(norm("//../..", &NO_MERGE), Err("the path climbs above the root"));
        // With merging, the empty segment is gone before `..` sees it.
        err("//..//..", "the path climbs above the root");
        // An encoded backslash is just a reserved encoding.
        ok("/a%5cb", "/a%5Cb");
        ok("/a%5Cb", "/a%5Cb");
        ok("/a\\b", "/a\\b");
    }

    #[test]
    fn percent_encodings() {
        ok("/%7euser", "/~user");
        ok("/%7Euser", "/~user");
        ok("/%41%62%2D%5f%30", "/Ab-_0");
        ok("/a%3ab", "/a%3Ab");
        ok("/a%3Ab", "/a%3Ab");
        ok("/a%20b%25", "/a%20b%25");
        // `%25` stays encoded: no double decoding.
        ok("/%2541", "/%2541");
        ok("/caf%c3%a9", "/caf%C3%A9");
        for bad in ["/%", "/%4", "/%zz", "/%g0", "/a%", "/%%41", "/%-1"] {
            err(bad, "malformed percent-encoding in the path");
        }
        err("/%00", "an encoded NUL (%00) in the path is refused");
        err("/a/%2e%00", "an encoded NUL (%00) in the path is refused");
    }

    #[test]
    fn overlong_utf8() {
        for bad in ["/%c0%ae%c0%ae/", "/%C0%AF", "/%E0%80%AE", "/%C1%9C", "/%F0%80%80%AF", "/a/%e0%9f%bf"] {
            err(bad, "overlong UTF-8 in the path");
            for opts in [NO_MERGE, KEEP, DECODE] {
                assert_eq!(normalize(bad.as_bytes(), &opts), Err(OVERLONG), "{bad}");
            }
        }
        // Raw bytes too.
        assert_eq!(normalize(b"/\xC0\xAE", &MERGE), Err(OVERLONG));
        assert_eq!(normalize(b"/%C0\xAE", &MERGE), Err(OVERLONG));
        assert_eq!(normalize(b"/\xE0\x80\xAE", &MERGE), Err(OVERLONG));
        // The shortest forms are fine, and Latin-1 (`À`, `à`, `ð` followed by ASCII) is kept as it is.
        ok("/%E0%A0%80", "/%E0%A0%80");
        ok("/%F0%90%80%80", "/%F0%90%80%80");
        ok("/%C2%80", "/%C2%80");
        assert!(matches!(normalize(b"/\xC0/\xE0/\xF0x", &MERGE), Ok(Cow::Borrowed(_))));
        ok("/%C0/%e0", "/%C0/%E0");
        assert!(matches!(normalize("/café/é".as_bytes(), &MERGE), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn borrowed_when_unchanged() {
        assert!(matches!(normalize(b"/", &MERGE), Ok(Cow::Borrowed(b"/"))));
        let long = "/api/v1/users/12345/orders/67890/items/a-b_c~d.json;x=1,y=2:z@w!$&'()*+=/end".repeat(20);
        for opts in [MERGE, NO_MERGE, KEEP, DECODE] {
            assert!(matches!(normalize(long.as_bytes(), &opts), Ok(Cow::Borrowed(_))));
        }
        assert!(matches!(normalize(b"/a%20b/%C3%A9/", &MERGE), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize(b"/a/.../b..", &MERGE), Ok(Cow::Borrowed(_))));
        // Not origin-form: unchanged, whatever it holds.
        assert!(matches!(normalize(b"*", &MERGE), Ok(Cow::Borrowed(b"*"))));
        assert!(matches!(normalize(b"", &MERGE), Ok(Cow::Borrowed(b""))));
        assert!(matches!(normalize(b"a/../%zz", &MERGE), Ok(Cow::Borrowed(_))));
        // Changed: owned.
        assert!(matches!(normalize(b"/a/./b", &MERGE), Ok(Cow::Owned(_))));
    }

    const PIECES: &[&[u8]] = &[
        b"/",
        b"/",
        b"/",
        b"a",
        b"b",
        b"xyz",
        b".",
        b"..",
        b".",
        b"..",
        b"%2e",
        b"%2E",
        b"%2f",
        b"%2F",
        b"%7e",
        b"%41",
        b"%3a",
        b"%3A",
        b"%20",
        b"%5c",
        b"%c3%a9",
        b"\xC3\xA9",
        b"\xE0",
        b"~",
        b";",
        b"%25",
        b"%",
        b"%zz",
        b"%00",
        b"%C0%AE",
        b"\xC0",
        b"\x80",
    ];

    fn has_dot_segment(path: &[u8]) -> bool {
        path.split(|&b| b == b'/').any(is_dot_segment)
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
    }

    #[test]
    fn generated_paths_normalise_once_and_for_all() {
        let mut rng = fastrand::Rng::with_seed(0x5eed_9a7f);
        let mut normalised = 0;
        for _ in 0..20_000 {
            let mut path = vec![b'/'];
            for _ in 0..rng.usize(0..12) {
                // The rarer, invalid pieces come last: use them less often.
                let n = if rng.u8(..) < 230 { PIECES.len() - 6 } else { PIECES.len() };
                path.extend_from_slice(PIECES[rng.usize(..n)]);
            }
            for merge_slashes in [true, false] {
                for encoded_slashes in [EncodedSlashes::Reject, EncodedSlashes::Keep, EncodedSlashes::Decode] {
                    let opts = NormalizeOptions { merge_slashes, encoded_slashes };
                    let Ok(out) = normalize(&path, &opts) else { continue };
                    normalised += 1;
                    let shown = String::from_utf8_lossy(&path);
                    assert_eq!(out.first(), Some(&b'/'), "{shown} {opts:?}");
                    match normalize(&out, &opts) {
                        Ok(Cow::Borrowed(again)) => assert_eq!(again, &out[..], "{shown} {opts:?}"),
                        other => panic!("{shown} {opts:?}: {:?} normalises again to {other:?}", out),
                    }
                    assert!(!has_dot_segment(&out), "{shown} {opts:?}");
                    if merge_slashes {
                        assert!(!contains(&out, b"//"), "{shown} {opts:?}");
                    }
                    if encoded_slashes != EncodedSlashes::Keep {
                        assert!(!contains(&out, b"%2F"), "{shown} {opts:?}");
                    }
                }
            }
        }
        assert!(normalised > 40_000, "too few valid paths generated: {normalised}");
    }
}
