//! Any bytes as a JSON request body, fed to the `limits` filter's depth scanner in pieces of fuzzer-chosen
//! sizes: no panic; the answer does not depend on how the body was split; and for every text serde_json
//! parses, the scanner agrees with serde_json on its depth (accepted at that depth, refused one below).
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_http::json_depth::{DepthScanner, JsonFault};

fn scan(data: &[u8], max: u32, step: usize) -> Result<(), JsonFault> {
    let mut scanner = DepthScanner::new(max);
    for piece in data.chunks(step.max(1)) {
        scanner.feed(piece)?;
    }
    Ok(())
}

/// The nesting of arrays and objects in a parsed value.
fn depth(v: &serde_json::Value) -> u32 {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|input: (u8, u8, &[u8])| {
    let (max, step, data) = input;
    let max = u32::from(max % 40) + 1;
    let whole = scan(data, max, data.len());
    assert_eq!(scan(data, max, usize::from(step % 17) + 1), whole, "the split changed the answer");
    // serde_json's own recursion limit is 128: below it, it parses every text the scanner should measure.
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let d = depth(&value);
        assert_eq!(scan(data, d.max(1), data.len()), Ok(()), "refused at its own depth {d}");
        if d > 1 {
            assert_eq!(scan(data, d - 1, data.len()), Err(JsonFault::TooDeep), "accepted below its depth {d}");
        }
    }
});
