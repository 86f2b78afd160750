//! Any bytes as a chunked body, fed in pieces of fuzzer-chosen sizes: no panic, the decoded data is never
//! more than the input, and the result does not depend on how the input was split.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico_http::codec::{ChunkedDecoder, Decoded};

fn decode(data: &[u8], step: usize) -> (Vec<u8>, Option<&'static str>, bool) {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut fed = 0;
    loop {
        match decoder.decode(&mut buf, 1024) {
            Ok(Decoded::Data(bytes)) => out.extend_from_slice(&bytes),
            Ok(Decoded::Done) => return (out, None, true),
            Ok(Decoded::NeedMore) if fed < data.len() => {
                let next = (fed + step).min(data.len());
                buf.extend_from_slice(&data[fed..next]);
                fed = next;
            }
            Ok(Decoded::NeedMore) => return (out, None, false),
            Err(e) => return (out, Some(e), false),
        }
    }
}

fuzz_target!(|input: (u8, &[u8])| {
    let (step, data) = input;
    let whole = decode(data, data.len().max(1));
    let split = decode(data, usize::from(step).max(1));
    assert!(whole.0.len() <= data.len());
    assert_eq!(whole.1.is_some(), split.1.is_some(), "an error depends on the split");
    if whole.1.is_none() {
        assert_eq!(whole, split, "the decoded body depends on the split");
    }
});
