//! The `date` of responses that come without one (RFC 9110 6.6.1: an origin with a clock sends it, and a proxy
//! adds it when the origin did not): formatted once per second per worker thread, not per response.

use hyper::header::HeaderValue;
use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The current second's date, as bytes and as a header value.
struct Cached {
    second: u64,
    value: HeaderValue,
}

thread_local! {
    static NOW: RefCell<Cached> = const { RefCell::new(Cached { second: u64::MAX, value: HeaderValue::from_static("") }) };
}

/// Now as an HTTP date (`Tue, 24 Nov 2026 21:47:09 GMT`).
pub(crate) fn header_value() -> HeaderValue {
    NOW.with(|now| fresh(&mut now.borrow_mut()).clone())
}

/// Appends `date: <now>\r\n` to an HTTP/1 head.
pub(crate) fn write_field(out: &mut Vec<u8>) {
    NOW.with(|now| {
        let mut now = now.borrow_mut();
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(fresh(&mut now).as_bytes());
        out.extend_from_slice(b"\r\n");
    });
}

fn fresh(cached: &mut Cached) -> &HeaderValue {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if cached.second != second {
        // An HTTP date is ASCII: the value is always valid.
        cached.value = HeaderValue::from_str(&httpdate::fmt_http_date(now)).unwrap_or(HeaderValue::from_static(""));
        cached.second = second;
    }
    &cached.value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_http_dates_of_now() {
        let value = header_value();
        let parsed = httpdate::parse_http_date(value.to_str().unwrap()).unwrap();
        let age = SystemTime::now().duration_since(parsed).unwrap();
        assert!(age.as_secs() < 5);
        let mut out = Vec::new();
        write_field(&mut out);
        assert!(out.starts_with(b"date: ") && out.ends_with(b" GMT\r\n"), "{:?}", String::from_utf8_lossy(&out));
    }
}
