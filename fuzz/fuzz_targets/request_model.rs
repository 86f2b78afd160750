//! The request model: a parsed head, its path normalised under every policy and written back through the edit
//! overlay, header edits, and route patterns matched against the result. Nothing may panic, and the overlay
//! must keep the query and describe the same target the accessors return.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_http::codec::{self, HeadLimits, Parsed};
use portico_http::path::{normalize, EncodedSlashes, NormalizeOptions};
use portico_http::pattern::{PathPattern, PathTemplate};

const LIMITS: HeadLimits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let options = NormalizeOptions {
        merge_slashes: selector & 1 == 1,
        encoded_slashes: match (selector >> 1) % 3 {
            0 => EncodedSlashes::Reject,
            1 => EncodedSlashes::Keep,
            _ => EncodedSlashes::Decode,
        },
    };
    // A route pattern from the first line of the input, the request from the rest.
    let (pattern_text, request) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"/users/:id"[..], rest),
    };
    let mut buf = bytes::BytesMut::from(request);
    let Ok(Parsed::Complete(head, used)) = codec::parse_request(&buf, &LIMITS) else { return };
    let mut head = codec::take_request(&mut buf, head, used);
    let query = head.query().map(<[u8]>::to_vec);
    if let Ok(path) = normalize(head.path(), &options) {
        let path = path.into_owned();
        head.set_path(&path);
        assert_eq!(head.path(), &path[..]);
        assert_eq!(head.query().map(<[u8]>::to_vec), query, "the query survives a new path");
        assert!(head.origin_form().starts_with(&path));
    }
    // Header edits named after the request's own headers.
    let names: Vec<String> =
        head.headers.iter().map(|(h, _)| String::from_utf8_lossy(head.header_name(h)).into_owned()).take(4).collect();
    for (i, name) in names.iter().enumerate() {
        let edits = &mut head.edits_mut().headers;
        match i % 3 {
            0 => {
                edits.set(name.as_str(), "v");
                assert!(edits.drops(name.as_bytes()) && edits.appended_value(name) == Some("v"));
            }
            1 => {
                edits.add(name.as_str(), "w");
                assert_eq!(edits.appended_value(name), Some("w"));
            }
            _ => {
                edits.remove(name.as_str());
                assert!(edits.drops(name.as_bytes()) && edits.appended_value(name).is_none());
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(pattern_text) {
        if let Ok(pattern) = PathPattern::parse(text) {
            let mut captures = Vec::new();
            let path = head.path().to_vec();
            if pattern.matches(&path, &mut captures) {
                assert_eq!(captures.len(), pattern.names().len());
                for &(start, end) in &captures {
                    assert!(start <= end && end as usize <= path.len());
                }
                if let Ok(template) = PathTemplate::parse(text, pattern.names()) {
                    let mut out = Vec::new();
                    template.render(&path, &captures, &mut out);
                }
            }
        }
    }
});
