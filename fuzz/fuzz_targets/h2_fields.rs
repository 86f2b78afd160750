//! Any method, target, host and fields as an HTTP/2 stream delivers them: no panic; a head built from them
//! (`codec::request_from_fields`, what HTTP/2 requests become) is the same as what the HTTP/1 parser makes of
//! its own bytes, so the two protocols cannot disagree about a request.
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_http::codec::{parse_request, request_from_fields, HeadLimits, Parsed};

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits { max_request_line: 8192, max_header_bytes: 32 * 1024, max_headers: 100 };
    // 0xff separates the parts: method, target, host, then name/value pairs.
    let mut parts = data.split(|&b| b == 0xff);
    let (Some(method), Some(target), Some(host)) = (parts.next(), parts.next(), parts.next()) else { return };
    let (Ok(method), Ok(target)) = (std::str::from_utf8(method), std::str::from_utf8(target)) else { return };
    let rest: Vec<&[u8]> = parts.collect();
    let fields = || rest.chunks(2).filter(|p| p.len() == 2).map(|p| (p[0], p[1]));
    let Ok(head) = request_from_fields(method, target, host, fields, &limits) else { return };
    match parse_request(&head.buf, &limits) {
        Ok(Parsed::Complete(again, used)) => {
            assert_eq!(used, head.buf.len(), "the head's bytes are exactly one head");
            assert_eq!(again.method.get(&head.buf), head.method());
            assert_eq!(again.target.get(&head.buf), head.target());
            assert_eq!(again.headers.len(), head.headers.len());
        }
        Ok(Parsed::Partial) => panic!("a head built from fields parses as partial"),
        Err(e) => panic!("a head built from fields is refused as HTTP/1: {e:?}"),
    }
});
