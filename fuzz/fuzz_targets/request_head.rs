//! Any bytes as a request head: no panic; a complete head parses the same from exactly its own bytes, and
//! every accessor the proxy uses works on it.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico_http::codec::{parse_request, take_request, HeadLimits, Parsed};

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits { max_request_line: 8192, max_header_bytes: 32 * 1024, max_headers: 100 };
    let Ok(Parsed::Complete(head, used)) = parse_request(data, &limits) else { return };
    assert!(used <= data.len());
    match parse_request(&data[..used], &limits) {
        Ok(Parsed::Complete(_, again)) => assert_eq!(again, used),
        Ok(Parsed::Partial) => panic!("the head's own bytes parsed as partial"),
        Err(e) => panic!("the head's own bytes were refused: {e:?}"),
    }
    let mut buf = BytesMut::from(data);
    let head = take_request(&mut buf, head, used);
    assert_eq!(buf.len(), data.len() - used);
    let _ = (head.method(), head.target(), head.origin_form(), head.path(), head.host(), head.host_name());
    let _ = (head.is_idempotent(), head.cookie("session"), head.named_by_connection(b"x-y"));
    for h in &head.headers {
        let _ = (head.header_name(&h.0), head.header_value(&h.0));
    }
});
