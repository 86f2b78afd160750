//! portico-functions' fast paths for URLs against the crates they stand in for: whenever `url::parse_fast`
//! takes an input, the `url` crate parses it to the same href and offsets (the first byte picks a prefix, so
//! that most inputs reach the fast path: none, `http://`, `https://`, or `http://` and a host with a port);
//! and `url::form_pairs` splits any text into the pairs `form_urlencoded::parse` gives.
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_functions::url::{form_pairs, parse_fast, Record};

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let Ok(rest) = std::str::from_utf8(rest) else { return };
    let prefix = ["", "http://", "https://", "http://example.com:8080"][usize::from(first & 3)];
    let input = format!("{prefix}{rest}");
    if let Some(fast) = parse_fast(&input) {
        assert_eq!(fast.href, input);
        let url = url::Url::parse(&input)
            .unwrap_or_else(|e| panic!("the fast path took {input:?}, the crate refused it: {e}"));
        assert_eq!(Record::of(&url), fast, "{input:?}");
    }
    let ours: Vec<_> = form_pairs(rest).collect();
    let theirs: Vec<_> = form_urlencoded::parse(rest.as_bytes()).collect();
    assert_eq!(ours, theirs, "{rest:?}");
});
