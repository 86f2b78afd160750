//! Any bytes as an upstream response head: no panic, and a complete head's spans stay inside its bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_http::codec::{parse_response, Parsed};

fuzz_target!(|input: (bool, &[u8])| {
    let (request_was_head, data) = input;
    let Ok(Parsed::Complete(resp, used)) = parse_response(data, request_was_head, 64 * 1024) else { return };
    assert!(used <= data.len());
    let head = &data[..used];
    let _ = resp.reason.get(head);
    for h in &resp.headers {
        let _ = (h.name.get(head), h.value.get(head));
    }
    let _ = resp.named_by_connection(head, b"keep-alive");
});
