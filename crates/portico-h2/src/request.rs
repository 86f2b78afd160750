//! A request's (or trailers') fields as HPACK decodes them, checked against RFC 9113 8.2 and 8.3 as they
//! arrive: lower-case names, pseudo-header fields only the request ones, once each, before the regular fields,
//! no connection-specific fields, `te` only `trailers`, values without CR, LF, NUL or surrounding
//! whitespace. A request that breaks a rule is malformed (a stream error), but the whole block is still
//! decoded so that the HPACK table stays in step.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Uri, Version};
use std::ops::Range;

/// A request's head as the client sent it: the method, the other pseudo-header fields and the fields as
/// bytes, checked against HTTP/2's rules. Nothing is parsed into `http` types until `into_parts` asks for it:
/// a proxy that lays the fields out as an HTTP/1 head (`fields`) never pays for a `HeaderMap`.
#[derive(Debug)]
pub struct RequestHead {
    method: Method,
    scheme: Option<Scheme>,
    authority: Option<Range<u32>>,
    path: Option<Range<u32>>,
    /// The pseudo-header values and the fields' names and values, back to back.
    buf: Vec<u8>,
    /// Each field: where its name starts, where its value starts (the name's end), where its value ends.
    fields: Vec<(u32, u32, u32)>,
    content_length: Option<u64>,
}

impl RequestHead {
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// `:authority`, if the client sent one.
    pub fn authority(&self) -> Option<&[u8]> {
        self.authority.as_ref().map(|r| &self.buf[r.start as usize..r.end as usize])
    }

    /// `:path` (absent only on CONNECT).
    pub fn path(&self) -> Option<&[u8]> {
        self.path.as_ref().map(|r| &self.buf[r.start as usize..r.end as usize])
    }

    /// The fields in order (lower-case names; no pseudo-header fields).
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.fields.iter().map(|&(n, v, e)| (&self.buf[n as usize..v as usize], &self.buf[v as usize..e as usize]))
    }

    /// `content-length`, when the request has one.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The head as `http` types (a `HeaderMap`, a `Uri`), for what needs them.
    pub fn into_parts(self) -> Result<http::request::Parts, &'static str> {
        let uri = if self.method == Method::CONNECT {
            let authority = self.authority().ok_or("a CONNECT request without :authority")?;
            Uri::from(Authority::try_from(authority).map_err(|_| "an invalid :authority")?)
        } else {
            let path = self.path().ok_or("a request without :path")?;
            let mut parts = http::uri::Parts::default();
            // Without :authority the target is origin-form (what answers it decides whether a `host` field
            // will do): a URI cannot have a scheme without an authority.
            if let Some(authority) = self.authority() {
                parts.authority = Some(Authority::try_from(authority).map_err(|_| "an invalid :authority")?);
                parts.scheme = self.scheme.clone();
            }
            parts.path_and_query = Some(PathAndQuery::try_from(path).map_err(|_| "an invalid :path")?);
            Uri::from_parts(parts).map_err(|_| "an invalid request target")?
        };
        let mut headers = HeaderMap::with_capacity(self.fields.len());
        for (name, value) in self.fields() {
            let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) else {
                return Err("an invalid field name or value");
            };
            headers.append(name, value);
        }
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.method = self.method;
        parts.uri = uri;
        parts.version = Version::HTTP_2;
        parts.headers = headers;
        Ok(parts)
    }
}

/// What a header block turned into, as it is decoded.
pub(crate) struct Fields {
    trailers: bool,
    method: Option<Method>,
    scheme: Option<Scheme>,
    authority: Option<Range<u32>>,
    path: Option<Range<u32>>,
    buf: Vec<u8>,
    fields: Vec<(u32, u32, u32)>,
    /// The first rule the block broke.
    pub malformed: Option<&'static str>,
    regular_seen: bool,
    /// The block's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it.
    pub list_size: usize,
    /// `content-length`, when present (all its values agree).
    pub content_length: Option<u64>,
}

impl Fields {
    /// `block_size`: the encoded block's length, which sizes the buffers once (decoded fields are rarely more
    /// than twice as long: Huffman saves a quarter, indexed fields are a byte each).
    pub fn new(trailers: bool, block_size: usize) -> Fields {
        Fields {
            trailers,
            method: None,
            scheme: None,
            authority: None,
            path: None,
            buf: Vec::with_capacity(if trailers { 0 } else { (block_size * 2).clamp(256, 8192) }),
            fields: Vec::with_capacity(if trailers { 0 } else { 16 }),
            malformed: None,
            regular_seen: false,
            list_size: 0,
            content_length: None,
        }
    }

    fn refuse(&mut self, why: &'static str) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }

    fn keep(&mut self, bytes: &[u8]) -> Range<u32> {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(bytes);
        start..self.buf.len() as u32
    }

    /// Takes one decoded field.
    pub fn add(&mut self, name: &[u8], value: &[u8], max_list_size: usize) {
        self.list_size += name.len() + value.len() + 32;
        if self.malformed.is_some() || self.list_size > max_list_size {
            // Nothing more is kept: the request is refused either way.
            return;
        }
        if !valid_value(value) {
            return self.refuse("a field value with CR, LF, NUL or surrounding whitespace");
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            return self.pseudo(pseudo, value);
        }
        self.regular_seen = true;
        if name.is_empty() || !name.iter().all(|&b| LOWER_TOKEN[b as usize]) {
            return self.refuse(if name.iter().any(u8::is_ascii_uppercase) {
                "an upper-case field name"
            } else {
                "an invalid field name"
            });
        }
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
                return self.refuse("a connection-specific field");
            }
            b"te" if value != b"trailers" => return self.refuse("a te field other than \"trailers\""),
            b"content-length" if !self.trailers => {
                let Some(n) = parse_length(value) else { return self.refuse("an invalid content-length") };
                if self.content_length.is_some_and(|m| m != n) {
                    return self.refuse("content-length fields that disagree");
                }
                self.content_length = Some(n);
            }
            _ => {}
        }
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(name);
        let middle = self.buf.len() as u32;
        self.buf.extend_from_slice(value);
        self.fields.push((start, middle, self.buf.len() as u32));
    }

    fn pseudo(&mut self, name: &[u8], value: &[u8]) {
        if self.trailers {
            return self.refuse("a pseudo-header field in trailers");
        }
        if self.regular_seen {
            return self.refuse("a pseudo-header field after a regular field");
        }
        match name {
            b"method" if self.method.is_none() => match Method::from_bytes(value) {
                Ok(m) => self.method = Some(m),
                Err(_) => self.refuse("an invalid :method"),
            },
            b"scheme" if self.scheme.is_none() => match Scheme::try_from(value) {
                Ok(s) => self.scheme = Some(s),
                Err(_) => self.refuse("an invalid :scheme"),
            },
            b"authority" if self.authority.is_none() => {
                if value.is_empty() || !value.iter().all(|&b| b.is_ascii_graphic()) {
                    return self.refuse("an invalid :authority");
                }
                self.authority = Some(self.keep(value));
            }
            b"path" if self.path.is_none() => {
                if value.is_empty() {
                    return self.refuse("an empty :path");
                }
                if !value.iter().all(|&b| b.is_ascii_graphic()) {
                    return self.refuse("an invalid :path");
                }
                self.path = Some(self.keep(value));
            }
            b"method" | b"scheme" | b"authority" | b"path" => self.refuse("a repeated pseudo-header field"),
            _ => self.refuse("an unknown pseudo-header field"),
        }
    }

    /// The request's head, or why it is malformed.
    pub fn into_request(mut self) -> Result<RequestHead, &'static str> {
        if let Some(why) = self.malformed {
            return Err(why);
        }
        let Some(method) = self.method.take() else { return Err("a request without :method") };
        if method == Method::CONNECT {
            // RFC 9113 8.5: only :authority.
            if self.scheme.is_some() || self.path.is_some() {
                return Err("a CONNECT request with :scheme or :path");
            }
            if self.authority.is_none() {
                return Err("a CONNECT request without :authority");
            }
        } else if self.scheme.is_none() || self.path.is_none() {
            return Err("a request without :scheme or :path");
        }
        Ok(RequestHead {
            method,
            scheme: self.scheme,
            authority: self.authority,
            path: self.path,
            buf: self.buf,
            fields: self.fields,
            content_length: self.content_length,
        })
    }

    /// Trailers, as a `HeaderMap` (rare enough not to need the raw form).
    pub fn into_trailers(self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(self.fields.len());
        for &(n, v, e) in &self.fields {
            let name = &self.buf[n as usize..v as usize];
            let value = &self.buf[v as usize..e as usize];
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
                headers.append(name, value);
            }
        }
        headers
    }
}

/// The bytes of a field name (RFC 9110 token characters), lower case only (RFC 9113 8.2.1).
const LOWER_TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || matches!(
                c,
                b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~'
            );
        b += 1;
    }
    table
};

/// RFC 9113 8.2.1: no NUL, CR or LF anywhere, no whitespace at either end; and, as RFC 9110 5.5 has it for
/// every version, no other control character but HTAB.
fn valid_value(value: &[u8]) -> bool {
    let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    !edge(value.first()) && !edge(value.last()) && value.iter().all(|&b| b >= 0x20 && b != 0x7f || b == b'\t')
}

fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: &[(&str, &str)]) -> Result<http::request::Parts, &'static str> {
        let mut f = Fields::new(false, 0);
        for (n, v) in fields {
            f.add(n.as_bytes(), v.as_bytes(), 1 << 20);
        }
        f.into_request()?.into_parts()
    }

    const GET: [(&str, &str); 4] =
        [(":method", "GET"), (":scheme", "https"), (":authority", "a.test"), (":path", "/x?y")];

    #[test]
    fn a_request_becomes_its_head() {
        let mut fields = GET.to_vec();
        fields.push(("accept", "*/*"));
        let head = request(&fields).unwrap();
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri.to_string(), "https://a.test/x?y");
        assert_eq!(head.headers["accept"], "*/*");
        assert_eq!(head.version, Version::HTTP_2);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let cases: &[&[(&str, &str)]] = &[
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("Accept", "x")],
            &[(":method", "GET"), (":scheme", "https"), ("accept", "x"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), (":status", "200")],
            &[(":method", "GET"), (":method", "GET"), (":scheme", "https"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "")],
            &[(":method", "GET"), (":scheme", "https")],
            &[(":scheme", "https"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("connection", "close")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("te", "gzip")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("x", " padded")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("x", "a\nb")],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("content-length", "1"),
                ("content-length", "2"),
            ],
            &[(":method", "CONNECT"), (":authority", "a:1"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("a b", "x")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("x", "a\x01b")],
        ];
        for fields in cases {
            assert!(request(fields).is_err(), "{fields:?} was accepted");
        }
    }

    #[test]
    fn te_trailers_and_connect_are_allowed() {
        let mut fields = GET.to_vec();
        fields.push(("te", "trailers"));
        assert!(request(&fields).is_ok());
        let head = request(&[(":method", "CONNECT"), (":authority", "a.test:443")]).unwrap();
        assert_eq!(head.uri.authority().unwrap().as_str(), "a.test:443");
    }

    #[test]
    fn content_length_is_read() {
        let mut f = Fields::new(false, 0);
        for (n, v) in GET.iter().chain(&[("content-length", "42")]) {
            f.add(n.as_bytes(), v.as_bytes(), 1 << 20);
        }
        assert_eq!(f.content_length, Some(42));
        assert_eq!(parse_length(b"99999999999999999999"), None);
    }

    #[test]
    fn trailers_take_no_pseudo_fields() {
        let mut f = Fields::new(true, 0);
        f.add(b":path", b"/", 1 << 20);
        assert!(f.malformed.is_some());
        let mut f = Fields::new(true, 0);
        f.add(b"grpc-status", b"0", 1 << 20);
        assert!(f.malformed.is_none());
        assert_eq!(f.into_trailers()["grpc-status"], "0");
    }

    #[test]
    fn the_raw_head_keeps_the_fields_in_order() {
        let mut f = Fields::new(false, 0);
        for (n, v) in GET.iter().chain(&[("b", "2"), ("a", "1"), ("b", "3")]) {
            f.add(n.as_bytes(), v.as_bytes(), 1 << 20);
        }
        let head = f.into_request().unwrap();
        let fields: Vec<_> = head.fields().collect();
        assert_eq!(fields, [(&b"b"[..], &b"2"[..]), (b"a", b"1"), (b"b", b"3")]);
        assert_eq!(head.authority(), Some(&b"a.test"[..]));
        assert_eq!(head.path(), Some(&b"/x?y"[..]));
    }

    #[test]
    fn the_list_size_counts_32_per_field() {
        let mut f = Fields::new(false, 0);
        f.add(b"ab", b"cd", 100);
        assert_eq!(f.list_size, 36);
    }
}
