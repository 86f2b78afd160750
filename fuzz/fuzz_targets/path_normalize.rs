//! Any bytes after a `/` as a request path, under each of the six option combinations: no panic, and a
//! normalised path starts with `/`, normalises again to itself (borrowed), has no `.` or `..` segment, no `//`
//! when merging, and no `%2F` unless encoded slashes are kept.
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_http::path::{normalize, EncodedSlashes, NormalizeOptions};
use std::borrow::Cow;

fuzz_target!(|data: &[u8]| {
    let mut path = Vec::with_capacity(data.len() + 1);
    path.push(b'/');
    path.extend_from_slice(data);
    for merge_slashes in [true, false] {
        for encoded_slashes in [EncodedSlashes::Reject, EncodedSlashes::Keep, EncodedSlashes::Decode] {
            let opts = NormalizeOptions { merge_slashes, encoded_slashes };
            let Ok(out) = normalize(&path, &opts) else { continue };
            assert_eq!(out.first(), Some(&b'/'));
            match normalize(&out, &opts) {
                Ok(Cow::Borrowed(again)) => assert_eq!(again, &out[..], "not idempotent under {opts:?}"),
                other => panic!("not idempotent under {opts:?}: {other:?}"),
            }
            assert!(!out.split(|&b| b == b'/').any(|s| s == b"." || s == b".."), "a dot segment under {opts:?}");
            if merge_slashes {
                assert!(!out.windows(2).any(|w| w == b"//"), "`//` under {opts:?}");
            }
            if encoded_slashes != EncodedSlashes::Keep {
                assert!(!out.windows(3).any(|w| w.eq_ignore_ascii_case(b"%2F")), "`%2F` under {opts:?}");
            }
        }
    }
});
