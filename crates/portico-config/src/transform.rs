//! Filters that change what passes rather than refuse it: `decompress` (response bodies an upstream always
//! compresses, decoded for clients that cannot read them), `query` (query parameters set, added, removed), and
//! the content codings `compress` and `decompress` name.

use crate::units::ByteSize;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A content coding Portico encodes and decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Coding {
    #[serde(rename = "zstd")]
    Zstd,
    #[serde(rename = "br")]
    Brotli,
    #[serde(rename = "gzip")]
    Gzip,
}

impl Coding {
    /// The token of `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }
}

/// `decompress:` decode compressed response bodies for clients whose `Accept-Encoding` does not take them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecompressFilter {
    /// The codings decoded; others pass as they are.
    #[serde(default = "default_decompress_codings")]
    pub encodings: Vec<Coding>,
    /// The most a response may decode to; past it the response is cut off (a decompression bomb).
    #[serde(default = "default_decompress_max_size")]
    pub max_size: ByteSize,
}

impl Default for DecompressFilter {
    fn default() -> Self {
        DecompressFilter { encodings: default_decompress_codings(), max_size: default_decompress_max_size() }
    }
}

fn default_decompress_codings() -> Vec<Coding> {
    vec![Coding::Gzip, Coding::Brotli, Coding::Zstd]
}

/// Why 64 MiB: far above what an API answers, far below what a worker's memory notices; a body of that size
/// compressed by gzip is at least 64 KiB, by brotli or zstd less (their ratios have no such floor).
fn default_decompress_max_size() -> ByteSize {
    ByteSize(64 << 20)
}

/// `query:` set, add and remove query parameters of the request sent to the target.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryFilter {
    /// Parameter name to value: replaces the first occurrence (in place) and removes the others, or appends
    /// the parameter when the request has none.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Parameter name to value: appended, keeping those present.
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Parameters removed (every occurrence).
    #[serde(default)]
    pub remove: Vec<String>,
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

pub(crate) fn validate_decompress(d: &DecompressFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.decompress");
    if d.encodings.is_empty() {
        err(&format!("{base}.encodings"), "no coding to decode".into(), Some("list some of gzip, br and zstd"));
    }
    if d.max_size.0 == 0 {
        err(&format!("{base}.max_size"), "max_size must be above 0".into(), None);
    }
}

pub(crate) fn validate_query(q: &QueryFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.query");
    let names = q.set.keys().map(|n| ("set", n)).chain(q.add.keys().map(|n| ("add", n)));
    for (key, name) in names.chain(q.remove.iter().map(|n| ("remove", n))) {
        if name.is_empty() {
            err(&format!("{base}.{key}"), "an empty query parameter name".into(), None);
        }
    }
    if q.set.is_empty() && q.add.is_empty() && q.remove.is_empty() {
        err(&base, "a query filter changes nothing".into(), Some("give it `set`, `add` or `remove`"));
    }
}

/// Checks `encodings` of `compress` or `decompress`: each coding once.
pub(crate) fn validate_codings(codings: &[Coding], at: &str, err: &mut Report<'_>) {
    for (j, c) in codings.iter().enumerate() {
        if codings[..j].contains(c) {
            err(&format!("{at}[{j}]"), format!("{} is listed twice", c.token()), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    use crate::test_support::{errors, BASE};

    #[test]
    fn decompress_query_and_compress_load_with_their_defaults() {
        let yaml = "routes:\n  - cluster: api\n    filters:\n      - decompress: {}\n      - compress: {}\n      - query: { set: { v: \"2\" }, add: { tag: a b }, remove: [debug] }\n";
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let [crate::Filter::Decompress(d), crate::Filter::Compress(c), crate::Filter::Query(q)] =
            &loaded.config.routes[0].filters[..]
        else {
            panic!()
        };
        use super::Coding::*;
        assert_eq!((d.encodings.as_slice(), d.max_size.0), (&[Gzip, Brotli, Zstd][..], 64 << 20));
        assert_eq!(c.encodings, [Zstd, Brotli, Gzip]);
        assert_eq!((c.level, c.brotli_level, c.zstd_level), (5, 4, 3));
        assert_eq!(q.add.get("tag").map(String::as_str), Some("a b"));
    }

    #[test]
    fn transform_mistakes_are_reported_at_their_keys() {
        let route = |f: &str| errors(&format!("routes:\n  - cluster: api\n    filters:\n      - {f}\n"));
        let e = route("decompress: { encodings: [] }");
        assert!(e.iter().any(|e| e.contains("no coding to decode")), "{e:?}");
        let e = route("decompress: { encodings: [deflate] }");
        assert!(!e.is_empty(), "deflate is not a coding Portico decodes");
        let e = route("compress: { encodings: [gzip, gzip] }");
        assert!(e.iter().any(|e| e.contains("gzip is listed twice")), "{e:?}");
        let e = route("compress: { brotli_level: 12 }");
        assert!(e.iter().any(|e| e.contains("brotli_level 12 is not from 0 to 11")), "{e:?}");
        let e = route("compress: { zstd_level: 23 }");
        assert!(e.iter().any(|e| e.contains("zstd_level 23 is not from 1 to 22")), "{e:?}");
        let e = route("query: {}");
        assert!(e.iter().any(|e| e.contains("changes nothing")), "{e:?}");
        let e = route("query: { remove: [\"\"] }");
        assert!(e.iter().any(|e| e.contains("empty query parameter name")), "{e:?}");
    }
}
