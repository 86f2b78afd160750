//! The HTTP/1 codec of the proxy path: strict request-head parsing, lenient-but-safe response-head parsing, and
//! the chunked transfer coding.
//!
//! Hand-written on top of `httparse` (which does the tokenising) rather than taken from hyper because the proxy
//! needs what hyper does not expose: the raw head bytes to forward without building a header map, a refusal of
//! framing that hyper tolerates (bare LF line endings, Content-Length next to Transfer-Encoding), and control
//! over what goes back to the pool. Every rule here is exercised by the framing tests in
//! crates/portico/tests/framing.rs.

use bytes::{Bytes, BytesMut};
use std::mem::MaybeUninit;

/// The most header fields any head may have; `limits.max_headers` is checked against the configured value.
pub const MAX_HEADERS_HARD: usize = 1000;
/// The longest chunk-size line (with extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// The largest trailer section accepted after the last chunk.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLimits {
    pub max_request_line: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
}

/// A request the proxy refuses, with the status to answer. The connection is always closed afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadError {
    pub status: u16,
    pub reason: &'static str,
}

const fn bad(reason: &'static str) -> HeadError {
    HeadError { status: 400, reason }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
    /// Responses only: the body ends when the upstream closes the connection.
    UntilClose,
}

/// Byte range into a head's buffer; `u32` keeps the header index small.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    /// The position of `part` inside `base`; an empty span when `part` does not lie inside it (httparse may
    /// hand back a static empty string for an absent reason phrase).
    fn of(base: &[u8], part: &[u8]) -> Span {
        let (b, p) = (base.as_ptr() as usize, part.as_ptr() as usize);
        if p < b || p + part.len() > b + base.len() {
            return Span::default();
        }
        let start = p - b;
        Span { start: start as u32, end: (start + part.len()) as u32 }
    }
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.start as usize..self.end as usize]
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct HeaderSpan {
    pub name: Span,
    pub value: Span,
}

/// What the proxy needs to know about a header to forward it or act on it, found once while parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    Other,
    /// Hop-by-hop by definition (RFC 9110 7.6.1) or by the proxy's own choice: never forwarded as is.
    HopByHop,
    Host,
    ContentLength,
    XForwardedFor,
    XForwardedProto,
    XForwardedHost,
    Via,
    Cookie,
    Expect,
}

pub fn classify(name: &[u8]) -> Known {
    // Lengths first: most headers are rejected by one comparison.
    let eq = |s: &str| name.eq_ignore_ascii_case(s.as_bytes());
    match name.len() {
        2 if eq("te") => Known::HopByHop,
        3 if eq("via") => Known::Via,
        4 if eq("host") => Known::Host,
        6 if eq("cookie") => Known::Cookie,
        6 if eq("expect") => Known::Expect,
        7 if eq("upgrade") || eq("trailer") => Known::HopByHop,
        10 if eq("connection") || eq("keep-alive") => Known::HopByHop,
        14 if eq("content-length") => Known::ContentLength,
        15 if eq("x-forwarded-for") => Known::XForwardedFor,
        16 if eq("x-forwarded-host") => Known::XForwardedHost,
        17 if eq("transfer-encoding") || eq("x-forwarded-proto") => {
            if eq("x-forwarded-proto") {
                Known::XForwardedProto
            } else {
                Known::HopByHop
            }
        }
        _ if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"proxy-") => Known::HopByHop,
        _ => Known::Other,
    }
}

/// Per thread, the field list of the last head dropped, emptied, for the next head parsed: a keep-alive
/// connection's request and response heads then allocate nothing for their fields.
mod spare {
    use super::{HeaderSpan, Known};
    use std::cell::Cell;
    use std::thread::LocalKey;

    /// Lists longer than this are freed, not kept.
    const KEPT: usize = 64;

    thread_local! {
        pub static REQUEST: Cell<Vec<(HeaderSpan, Known)>> = const { Cell::new(Vec::new()) };
        pub static RESPONSE: Cell<Vec<HeaderSpan>> = const { Cell::new(Vec::new()) };
    }

    /// An empty list, with the room of the last one given back.
    pub fn take<T>(key: &'static LocalKey<Cell<Vec<T>>>) -> Vec<T> {
        key.try_with(Cell::take).unwrap_or_default()
    }

    pub fn give_back<T: Copy>(key: &'static LocalKey<Cell<Vec<T>>>, mut list: Vec<T>) {
        if list.capacity() > 0 && list.capacity() <= KEPT {
            list.clear();
            let _ = key.try_with(|spare| spare.set(list));
        }
    }
}

/// A parsed request head. Everything points into `buf`, the head's own bytes.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub buf: Bytes,
    pub method: Span,
    /// The target as sent (origin-form, absolute-form or `*`).
    pub target: Span,
    /// Where the origin-form path (and query) starts inside the target: after `http://host` in absolute-form.
    pub origin_start: u32,
    /// The end of the path inside the target (the `?` or the end).
    pub path_end: u32,
    pub http10: bool,
    pub headers: Vec<(HeaderSpan, Known)>,
    /// The authority: from an absolute-form target, else the `Host` header.
    pub host: Option<Span>,
    pub body: BodyFraming,
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// A WebSocket handshake (RFC 6455 4.1): an HTTP/1.1 GET without a body, with `Connection: upgrade` and
    /// `Upgrade: websocket`. Only then are the upgrade headers forwarded.
    pub upgrade_websocket: bool,
    /// The values of every `Connection` header, to strip the headers they name.
    pub connection: Vec<Span>,
    /// Empty lines skipped before the request line.
    skipped: u32,
    /// What normalisation and filters changed; `None` for a request forwarded as it was read.
    pub edits: Option<Box<crate::message::HeadEdits>>,
}

impl Drop for RequestHead {
    fn drop(&mut self) {
        spare::give_back(&spare::REQUEST, std::mem::take(&mut self.headers));
    }
}

impl RequestHead {
    pub fn method(&self) -> &[u8] {
        self.method.get(&self.buf)
    }
    /// Safe to send twice (RFC 9110 9.2.2), or marked so by the client with an `Idempotency-Key`.
    pub fn is_idempotent(&self) -> bool {
        matches!(self.method(), b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE")
            || self.values("idempotency-key").next().is_some()
    }
    pub fn target(&self) -> &[u8] {
        self.target.get(&self.buf)
    }
    /// The path and query in origin-form, as forwarded upstream (after normalisation and rewrites).
    pub fn origin_form(&self) -> &[u8] {
        if let Some((target, _)) = self.edits.as_ref().and_then(|e| e.target.as_ref()) {
            return target;
        }
        let t = self.target();
        if t == b"*" {
            return t;
        }
        let rest = &t[self.origin_start as usize..];
        if rest.is_empty() {
            b"/"
        } else {
            rest
        }
    }
    /// The path alone, for routing (after normalisation and rewrites).
    pub fn path(&self) -> &[u8] {
        if let Some((target, end)) = self.edits.as_ref().and_then(|e| e.target.as_ref()) {
            return &target[..*end];
        }
        let t = self.target();
        let p = &t[self.origin_start as usize..self.path_end as usize];
        if p.is_empty() {
            b"/"
        } else {
            p
        }
    }
    /// The query without its `?`, if the target has one (a path never holds a `?`).
    pub fn query(&self) -> Option<&[u8]> {
        let form = self.origin_form();
        memchr::memchr(b'?', form).map(|q| &form[q + 1..])
    }
    /// Replaces the path, keeping the query.
    pub fn set_path(&mut self, path: &[u8]) {
        self.set_path_with(|_, out| {
            out.extend_from_slice(path);
            true
        });
    }
    /// Replaces the path with what `write` appends to an empty buffer, given the current path, keeping the
    /// query: one allocation. `write` returning false leaves the path as it is.
    pub fn set_path_with(&mut self, write: impl FnOnce(&[u8], &mut Vec<u8>) -> bool) {
        let (path, query) = (self.path(), self.query());
        let mut target = Vec::with_capacity(path.len() + 16 + query.map_or(0, |q| q.len() + 1));
        if !write(path, &mut target) {
            return;
        }
        let path_len = target.len();
        if let Some(q) = query {
            target.push(b'?');
            target.extend_from_slice(q);
        }
        self.edits_mut().target = Some((target, path_len));
    }
    /// The overlay, created on first use.
    pub fn edits_mut(&mut self) -> &mut crate::message::HeadEdits {
        self.edits.get_or_insert_with(Default::default)
    }
    pub fn host(&self) -> Option<&[u8]> {
        self.host.map(|s| s.get(&self.buf))
    }
    /// The host without its port, for routing.
    pub fn host_name(&self) -> Option<&[u8]> {
        self.host().map(strip_port)
    }
    pub fn header_name(&self, h: &HeaderSpan) -> &[u8] {
        h.name.get(&self.buf)
    }
    pub fn header_value(&self, h: &HeaderSpan) -> &[u8] {
        h.value.get(&self.buf)
    }
    /// Values of every header called `name`, in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(h, _)| h.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(move |(h, _)| h.value.get(&self.buf))
    }
    /// The value of cookie `name` in the `Cookie` headers.
    pub fn cookie(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .filter(|(_, k)| *k == Known::Cookie)
            .flat_map(|(h, _)| h.value.get(&self.buf).split(|&b| b == b';'))
            .find_map(|pair| {
                let pair = trim(pair);
                let eq = memchr::memchr(b'=', pair)?;
                (trim(&pair[..eq]) == name.as_bytes()).then(|| trim(&pair[eq + 1..]))
            })
    }
    /// True when a `Connection` header names this header, making it hop-by-hop for this message.
    pub fn named_by_connection(&self, name: &[u8]) -> bool {
        self.connection.iter().any(|v| list_contains(v.get(&self.buf), name))
    }
}

pub fn strip_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        return match memchr::memchr(b']', host) {
            Some(i) => &host[..=i],
            None => host,
        };
    }
    match memchr::memrchr(b':', host) {
        Some(i) => &host[..i],
        None => host,
    }
}

pub fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |i| i + 1);
    &v[start..end]
}

/// Whether the comma-separated list `list` contains `token`, case-insensitively.
pub fn list_contains(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',').any(|t| trim(t).eq_ignore_ascii_case(token))
}

/// Checks that every line of a head ends in CRLF: no bare CR, no bare LF. httparse accepts a bare LF as a line
/// end (RFC 9112 allows a recipient to), but a proxy that reads framing differently from the server behind it
/// is a request-smuggling vector, so Portico refuses both.
fn strict_line_endings(head: &[u8]) -> bool {
    let mut from = 0;
    while let Some(i) = memchr::memchr2(b'\r', b'\n', &head[from..]) {
        let at = from + i;
        if head[at] == b'\n' {
            return false; // a LF not consumed as part of CRLF below is bare
        }
        if head.get(at + 1) != Some(&b'\n') {
            return false;
        }
        from = at + 2;
    }
    true
}

/// Parses a Content-Length value: digits, or a list of identical digit strings (RFC 9110 8.6).
fn parse_content_length(v: &[u8]) -> Option<u64> {
    // The common case first: one number.
    if !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit) {
        return Some(v.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0')));
    }
    let mut result: Option<u64> = None;
    for part in v.split(|&b| b == b',') {
        let part = trim(part);
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = part.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
        match result {
            Some(prev) if prev != n => return None,
            _ => result = Some(n),
        }
    }
    result
}

/// A table of the bytes allowed somewhere: letters and digits, the bytes of `extra`, and 0x80 to 0xFF when
/// `high`.
const fn byte_set(extra: &[u8], high: bool) -> [bool; 256] {
    let mut set = [false; 256];
    let mut b = 0;
    while b < 256 {
        set[b] = (b as u8).is_ascii_alphanumeric() || (high && b >= 0x80);
        b += 1;
    }
    let mut i = 0;
    while i < extra.len() {
        set[extra[i] as usize] = true;
        i += 1;
    }
    set
}

static HOST_BYTES: [bool; 256] = byte_set(b"-._~!$&'()*+,;=:[]%", false);
/// Token characters (RFC 9110 5.6.2), as httparse reads methods and header names.
static TOKEN_BYTES: [bool; 256] = byte_set(b"!#$%&'*+-.^_`|~", false);
/// What httparse accepts in a request target: visible ASCII and obs-text.
static TARGET_BYTES: [bool; 256] = byte_set(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", true);
/// What httparse accepts in a field value: visible ASCII, space, tab and obs-text.
static VALUE_BYTES: [bool; 256] = byte_set(b"\t !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", true);

fn valid_host(h: &[u8]) -> bool {
    !h.is_empty() && h.iter().all(|&b| HOST_BYTES[b as usize])
}

/// The outcome of trying to parse a request head from the bytes received so far.
pub enum Parsed<T> {
    /// A full head, and how many bytes of the buffer it used.
    Complete(T, usize),
    /// More bytes are needed.
    Partial,
}

/// Parses a request head at the start of `buf`. Leading empty lines (left by some clients after a body) are
/// skipped and counted as consumed.
pub fn parse_request(buf: &[u8], limits: &HeadLimits) -> Result<Parsed<RequestHead>, HeadError> {
    let mut skip = 0;
    while buf[skip..].starts_with(b"\r\n") {
        skip += 2;
    }
    let data = &buf[skip..];
    if data.is_empty() || (data == b"\r") {
        return Ok(Parsed::Partial);
    }
    match memchr::memchr(b'\n', data) {
        Some(line_end) if line_end > limits.max_request_line => {
            return Err(HeadError { status: 414, reason: "request line too long" })
        }
        None if data.len() > limits.max_request_line => {
            return Err(HeadError { status: 414, reason: "request line too long" })
        }
        _ => {}
    }
    // Uninitialized: zeroing 128 header slots on every parse cost more than parsing a small head.
    let mut storage = [const { MaybeUninit::<httparse::Header>::uninit() }; 128];
    let mut heap;
    let slots: &mut [MaybeUninit<httparse::Header>] = if limits.max_headers < storage.len() {
        &mut storage[..limits.max_headers]
    } else {
        heap = Vec::with_capacity(limits.max_headers.min(MAX_HEADERS_HARD));
        heap.resize_with(limits.max_headers.min(MAX_HEADERS_HARD), MaybeUninit::uninit);
        &mut heap
    };
    let mut req = httparse::Request::new(&mut []);
    let used = match req.parse_with_uninit_headers(data, slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if data.len() > limits.max_header_bytes {
                return Err(HeadError { status: 431, reason: "request header section too large" });
            }
            return Ok(Parsed::Partial);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError { status: 431, reason: "too many header fields" })
        }
        Err(httparse::Error::Version) => return Err(HeadError { status: 505, reason: "HTTP version not supported" }),
        Err(httparse::Error::HeaderName) => {
            return Err(bad("invalid header name (whitespace before the colon or obs-fold?)"))
        }
        Err(httparse::Error::HeaderValue) => return Err(bad("invalid header value")),
        Err(httparse::Error::NewLine) => return Err(bad("invalid line ending")),
        Err(httparse::Error::Token) => return Err(bad("invalid request method")),
        Err(_) => return Err(bad("malformed request line")),
    };
    if used > limits.max_header_bytes {
        return Err(HeadError { status: 431, reason: "request header section too large" });
    }
    if !strict_line_endings(&data[..used]) {
        return Err(bad("bare CR or LF in the request head"));
    }
    let head_bytes = &data[..used];
    let method = Span::of(head_bytes, req.method.unwrap_or_default().as_bytes());
    let target = Span::of(head_bytes, req.path.unwrap_or_default().as_bytes());
    let http10 = req.version == Some(0);
    let mut headers = spare::take(&spare::REQUEST);
    headers.extend(req.headers.iter().map(|h| {
        let name = h.name.as_bytes();
        (HeaderSpan { name: Span::of(head_bytes, name), value: Span::of(head_bytes, trim(h.value)) }, classify(name))
    }));
    let head = analyse_request(head_bytes, method, target, http10, headers, skip as u32)?;
    Ok(Parsed::Complete(head, skip + used))
}

/// A request head made from an HTTP/2 request's fields: laid out as the HTTP/1.1 head of the same request
/// (`METHOD target HTTP/1.1`, `host` first, then the fields in order) and held to the same character rules,
/// limits and checks as `parse_request`, with the spans filled as the bytes are written instead of written
/// out as text and parsed back. `fields` gives the fields, without `host` (that is `host`), each time it is
/// called: once to size the head, once to write it.
pub fn request_from_fields<'a, I: Iterator<Item = (&'a [u8], &'a [u8])>>(
    method: &str,
    target: &str,
    host: &'a [u8],
    fields: impl Fn() -> I,
    limits: &HeadLimits,
) -> Result<RequestHead, HeadError> {
    const VERSION: &[u8] = b" HTTP/1.1\r\n";
    let (method, target) = (method.as_bytes(), target.as_bytes());
    // Where parse_request measures the request line: up to its LF.
    if method.len() + 1 + target.len() + VERSION.len() - 1 > limits.max_request_line {
        return Err(HeadError { status: 414, reason: "request line too long" });
    }
    // httparse's errors for the same bytes.
    if method.is_empty() || !method.iter().all(|&b| TOKEN_BYTES[b as usize]) {
        return Err(bad("invalid request method"));
    }
    if target.is_empty() || !target.iter().all(|&b| TARGET_BYTES[b as usize]) {
        return Err(bad("invalid request method"));
    }
    let slots = limits.max_headers.min(MAX_HEADERS_HARD);
    // Sized exactly, the buffer becomes the head's bytes without another allocation.
    let (count, size) = fields().fold((0, 0), |(count, size), (n, v)| (count + 1, size + n.len() + v.len() + 4));
    let mut headers = Vec::with_capacity(count.min(slots) + 1);
    let mut buf = Vec::with_capacity(method.len() + 1 + target.len() + VERSION.len() + host.len() + 8 + size + 2);
    buf.extend_from_slice(method);
    buf.push(b' ');
    buf.extend_from_slice(target);
    buf.extend_from_slice(VERSION);
    let method_span = Span { start: 0, end: method.len() as u32 };
    let target_span = Span { start: method.len() as u32 + 1, end: (method.len() + 1 + target.len()) as u32 };
    for (name, value) in std::iter::once((&b"host"[..], host)).chain(fields()) {
        if headers.len() >= slots {
            return Err(HeadError { status: 431, reason: "too many header fields" });
        }
        if name.is_empty() || !name.iter().all(|&b| TOKEN_BYTES[b as usize]) {
            return Err(bad("invalid header name (whitespace before the colon or obs-fold?)"));
        }
        if !value.iter().all(|&b| VALUE_BYTES[b as usize]) {
            return Err(bad("invalid header value"));
        }
        let name_start = buf.len();
        buf.extend_from_slice(name);
        let name_span = Span { start: name_start as u32, end: buf.len() as u32 };
        buf.extend_from_slice(b": ");
        let value_start = buf.len();
        buf.extend_from_slice(value);
        buf.extend_from_slice(b"\r\n");
        // The value without the whitespace around it, as parse_request keeps it.
        let kept = trim(value);
        let offset = kept.as_ptr() as usize - value.as_ptr() as usize;
        let start = (value_start + offset) as u32;
        let value_span = Span { start, end: start + kept.len() as u32 };
        headers.push((HeaderSpan { name: name_span, value: value_span }, classify(name)));
    }
    buf.extend_from_slice(b"\r\n");
    if buf.len() > limits.max_header_bytes {
        return Err(HeadError { status: 431, reason: "request header section too large" });
    }
    let mut head = analyse_request(&buf, method_span, target_span, false, headers, 0)?;
    head.buf = Bytes::from(buf);
    Ok(head)
}

/// The rest of a request head once its bytes are tokenised (method, target, fields, each header classified):
/// what parse_request and request_from_fields share, so both refuse and read a head alike. The head's `buf` is
/// left empty for the caller to attach `head_bytes`.
fn analyse_request(
    head_bytes: &[u8],
    method: Span,
    target: Span,
    http10: bool,
    headers: Vec<(HeaderSpan, Known)>,
    skipped: u32,
) -> Result<RequestHead, HeadError> {
    let method_bytes = method.get(head_bytes);
    if method_bytes == b"CONNECT" {
        return Err(HeadError { status: 405, reason: "CONNECT is not supported" });
    }

    let tb = target.get(head_bytes);
    // A fragment never belongs in a request (RFC 9112 3.2, RFC 3986 3.5). Servers read a target that has one
    // differently (cut at the `#`, or `#` taken as part of the path), so routing and the upstream could
    // disagree about the path: refused, in every form of target.
    if memchr::memchr(b'#', tb).is_some() {
        return Err(bad("fragment in the request target"));
    }
    let (mut host, origin_start) = if tb.first() == Some(&b'/') {
        (None, 0usize)
    } else if tb == b"*" {
        if method_bytes != b"OPTIONS" {
            return Err(bad("the `*` target is only valid with OPTIONS"));
        }
        (None, 0)
    } else {
        // absolute-form: scheme://authority[path]; the authority overrides Host (RFC 9112 3.2.2).
        let lower_scheme = |s: &[u8]| tb.len() > s.len() && tb[..s.len()].eq_ignore_ascii_case(s);
        let after = if lower_scheme(b"http://") {
            7
        } else if lower_scheme(b"https://") {
            8
        } else {
            return Err(bad("invalid request target"));
        };
        let auth_end = tb[after..].iter().position(|&b| b == b'/' || b == b'?').map_or(tb.len(), |i| after + i);
        let authority = &tb[after..auth_end];
        if authority.is_empty() || memchr::memchr(b'@', authority).is_some() || !valid_host(authority) {
            return Err(bad("invalid authority in the request target"));
        }
        if tb.get(auth_end) == Some(&b'?') {
            return Err(bad("invalid request target"));
        }
        (Some(Span::of(head_bytes, authority)), auth_end)
    };
    let origin = &tb[origin_start..];
    let path_end = origin_start + memchr::memchr(b'?', origin).unwrap_or(origin.len());

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut host_seen = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    let mut connection_upgrade = false;
    let mut upgrade_websocket = false;
    let mut connection = Vec::new();
    for &(span, kind) in &headers {
        let name = span.name.get(head_bytes);
        let value = span.value.get(head_bytes);
        match kind {
            Known::ContentLength => {
                let n = parse_content_length(value).ok_or(bad("invalid or conflicting Content-Length"))?;
                if content_length.is_some_and(|prev| prev != n) {
                    return Err(bad("conflicting Content-Length headers"));
                }
                content_length = Some(n);
            }
            Known::Host => {
                if host_seen {
                    return Err(bad("more than one Host header"));
                }
                host_seen = true;
                if !valid_host(value) {
                    return Err(bad("invalid Host header"));
                }
                if host.is_none() {
                    host = Some(span.value);
                }
            }
            Known::Expect => {
                if value.eq_ignore_ascii_case(b"100-continue") {
                    expect_continue = true;
                } else {
                    return Err(HeadError { status: 417, reason: "unsupported expectation" });
                }
            }
            Known::HopByHop => {
                if name.eq_ignore_ascii_case(b"transfer-encoding") {
                    // Only a single, final `chunked` is accepted: anything else could be read differently
                    // by the upstream.
                    if transfer_encoding || !value.eq_ignore_ascii_case(b"chunked") {
                        return Err(bad("unsupported Transfer-Encoding (only a single `chunked` is accepted)"));
                    }
                    transfer_encoding = true;
                    chunked = true;
                } else if name.eq_ignore_ascii_case(b"connection") {
                    close |= list_contains(value, b"close");
                    keep_alive_token |= list_contains(value, b"keep-alive");
                    connection_upgrade |= list_contains(value, b"upgrade");
                    connection.push(span.value);
                } else if name.eq_ignore_ascii_case(b"upgrade") {
                    upgrade_websocket |= list_contains(value, b"websocket");
                }
            }
            _ => {}
        }
    }
    if transfer_encoding && content_length.is_some() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    if transfer_encoding && http10 {
        return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
    }
    if !http10 && !host_seen {
        return Err(bad("missing Host header"));
    }
    let body = if chunked {
        BodyFraming::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyFraming::None,
            Some(n) => BodyFraming::Length(n),
        }
    };
    let keep_alive = if http10 { keep_alive_token && !close } else { !close };
    let head = RequestHead {
        buf: Bytes::new(),
        method,
        target,
        origin_start: origin_start as u32,
        path_end: path_end as u32,
        http10,
        headers,
        host,
        body,
        keep_alive,
        expect_continue: expect_continue && body != BodyFraming::None,
        upgrade_websocket: upgrade_websocket
            && connection_upgrade
            && !http10
            && body == BodyFraming::None
            && method.get(head_bytes) == b"GET",
        connection,
        skipped,
        edits: None,
    };
    Ok(head)
}

/// Splits a complete head off the front of `buf` and attaches its bytes to `head`.
pub fn take_request(buf: &mut BytesMut, mut head: RequestHead, used: usize) -> RequestHead {
    let bytes = buf.split_to(used).freeze();
    // Spans are relative to the head without the empty lines skipped before it.
    head.buf = bytes.slice(head.skipped as usize..);
    head
}

/// A parsed response head from an upstream.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: Span,
    pub headers: Vec<HeaderSpan>,
    pub body: BodyFraming,
    /// Whether the upstream allows reusing the connection after this response.
    pub reusable: bool,
    pub connection: Vec<Span>,
    pub len: usize,
    /// Transfer codings other than the final `chunked` (for example `gzip`): the body is still encoded with
    /// them after de-chunking, so they must be forwarded.
    pub other_codings: Option<String>,
    /// The response has a `date` (a proxy adds one when it has not).
    pub dated: bool,
}

impl Drop for ResponseHead {
    fn drop(&mut self) {
        spare::give_back(&spare::RESPONSE, std::mem::take(&mut self.headers));
    }
}

impl ResponseHead {
    /// A `101` that accepts a WebSocket handshake: it says `Upgrade: websocket` (RFC 6455 4.2.2).
    pub fn upgrades_to_websocket(&self, buf: &[u8]) -> bool {
        self.status == 101
            && self.headers.iter().any(|h| {
                h.name.get(buf).eq_ignore_ascii_case(b"upgrade") && list_contains(h.value.get(buf), b"websocket")
            })
    }
}

/// Parses a response head at the start of `buf`. `request_was_head` suppresses the body.
pub fn parse_response(
    buf: &[u8],
    request_was_head: bool,
    max_bytes: usize,
) -> Result<Parsed<ResponseHead>, &'static str> {
    let mut storage = [const { MaybeUninit::<httparse::Header>::uninit() }; 256];
    let mut resp = httparse::Response::new(&mut []);
    let used = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, &mut storage)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() > max_bytes { Err("response head too large") } else { Ok(Parsed::Partial) };
        }
        Err(httparse::Error::TooManyHeaders) => return Err("too many response header fields"),
        Err(_) => return Err("malformed response head"),
    };
    if used > max_bytes {
        return Err("response head too large");
    }
    let status = resp.code.unwrap_or(0);
    if !(100..=999).contains(&status) {
        return Err("invalid status code");
    }
    let http10 = resp.version == Some(0);
    let mut content_length: Option<u64> = None;
    let mut te_present = false;
    let mut te_chunked_last = false;
    let mut codings: Vec<&[u8]> = Vec::new();
    let mut close = false;
    let mut keep_alive = false;
    let mut headers = spare::take(&spare::RESPONSE);
    headers.reserve(resp.headers.len());
    let mut connection = Vec::new();
    let mut dated = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        let value = trim(h.value);
        let span = HeaderSpan { name: Span::of(buf, name), value: Span::of(buf, value) };
        // Lengths first: most names are told apart by one comparison.
        if name.len() == 14 && name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(value).ok_or("invalid Content-Length from upstream")?;
            if content_length.is_some_and(|p| p != n) {
                return Err("conflicting Content-Length from upstream");
            }
            content_length = Some(n);
        } else if name.len() == 17 && name.eq_ignore_ascii_case(b"transfer-encoding") {
            te_present = true;
            codings.extend(value.split(|&b| b == b',').map(trim).filter(|t| !t.is_empty()));
            te_chunked_last = codings.last().is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if name.len() == 10 && name.eq_ignore_ascii_case(b"connection") {
            // `keep-alive`, the usual value, names only a field that is hop-by-hop anyway: not kept (the list
            // then needs no allocation).
            let mut names_others = false;
            for token in value.split(|&b| b == b',').map(trim) {
                close |= token.eq_ignore_ascii_case(b"close");
                let keep = token.eq_ignore_ascii_case(b"keep-alive");
                keep_alive |= keep;
                names_others |= !keep && !token.is_empty();
            }
            if names_others {
                connection.push(span.value);
            }
        } else if name.len() == 4 && name.eq_ignore_ascii_case(b"date") {
            dated = true;
        }
        headers.push(span);
    }
    let reason = Span::of(buf, resp.reason.unwrap_or("").as_bytes());
    let no_body = request_was_head || (100..200).contains(&status) || status == 204 || status == 304;
    let body = if no_body {
        BodyFraming::None
    } else if te_present {
        // RFC 9112 6.3: Transfer-Encoding overrides Content-Length; without a final chunked the body runs to
        // the close.
        if te_chunked_last {
            BodyFraming::Chunked
        } else {
            BodyFraming::UntilClose
        }
    } else {
        match content_length {
            Some(n) => BodyFraming::Length(n),
            None => BodyFraming::UntilClose,
        }
    };
    let framing_clean = !(te_present && content_length.is_some());
    let reusable =
        framing_clean && body != BodyFraming::UntilClose && !close && (!http10 || keep_alive) && status != 101;
    if te_chunked_last {
        codings.pop();
    }
    let other_codings = (te_present && !codings.is_empty() && body != BodyFraming::None)
        .then(|| codings.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join(", "));
    Ok(Parsed::Complete(
        ResponseHead { status, reason, headers, body, reusable, connection, len: used, other_codings, dated },
        used,
    ))
}

impl ResponseHead {
    /// A field of this response that goes no further than the connection it came on: hop-by-hop by definition
    /// or named by its `Connection` field.
    pub fn is_hop_by_hop(&self, buf: &[u8], name: &[u8]) -> bool {
        classify(name) == Known::HopByHop || (!self.connection.is_empty() && self.named_by_connection(buf, name))
    }

    pub fn named_by_connection(&self, buf: &[u8], name: &[u8]) -> bool {
        self.connection.iter().any(|v| list_contains(v.get(buf), name))
    }
}

/// Incremental decoder of the chunked transfer coding (RFC 9112 7.1). Trailer fields are read, checked for
/// framing and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChunkedDecoder {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers(usize),
    Done,
}

pub enum Decoded {
    Data(Bytes),
    NeedMore,
    Done,
}

impl ChunkedDecoder {
    /// Takes what it can from the front of `buf`: at most `max` bytes of data at a time.
    pub fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, &'static str> {
        loop {
            match *self {
                ChunkedDecoder::Size => {
                    let window = &buf[..buf.len().min(MAX_CHUNK_LINE)];
                    let Some(line_end) = crlf_at(window)? else {
                        if buf.len() >= MAX_CHUNK_LINE {
                            return Err("chunk size line too long");
                        }
                        // Refused at the first byte no later one can mend, not when the line ends (or the
                        // read timeout does). A CR last may be the start of the CRLF.
                        parse_chunk_size(window.strip_suffix(b"\r").unwrap_or(window), false)?;
                        return Ok(Decoded::NeedMore);
                    };
                    let size = parse_chunk_size(&buf[..line_end], true)?;
                    let _ = buf.split_to(line_end + 2);
                    *self = if size == 0 { ChunkedDecoder::Trailers(0) } else { ChunkedDecoder::Data(size) };
                }
                ChunkedDecoder::Data(remaining) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = (remaining.min(max as u64) as usize).min(buf.len());
                    let left = remaining - n as u64;
                    *self = if left == 0 { ChunkedDecoder::DataEnd } else { ChunkedDecoder::Data(left) };
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                ChunkedDecoder::DataEnd => {
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err("chunk data not followed by CRLF");
                        }
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF");
                    }
                    let _ = buf.split_to(2);
                    *self = ChunkedDecoder::Size;
                }
                ChunkedDecoder::Trailers(seen) => {
                    // A field line may not start with whitespace (obs-fold), nor a line hold a bare CR or LF.
                    if buf.first().is_some_and(|&b| b == b' ' || b == b'\t') {
                        return Err("malformed trailer field");
                    }
                    let Some(line_end) = crlf_at(buf).map_err(|_| "trailer line not ended by CRLF")? else {
                        if seen + buf.len() > MAX_TRAILER_BYTES {
                            return Err("trailer section too large");
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    let line_len = line_end + 2;
                    if seen + line_len > MAX_TRAILER_BYTES {
                        return Err("trailer section too large");
                    }
                    let empty = line_end == 0;
                    if !empty && memchr::memchr(b':', &buf[..line_end]).is_none() {
                        return Err("malformed trailer field");
                    }
                    let _ = buf.split_to(line_len);
                    if empty {
                        *self = ChunkedDecoder::Done;
                        return Ok(Decoded::Done);
                    }
                    *self = ChunkedDecoder::Trailers(seen + line_len);
                }
                ChunkedDecoder::Done => return Ok(Decoded::Done),
            }
        }
    }
}

/// The framing error in the chunked body starting at `received`, judged on what has arrived so far.
pub fn chunked_prefix_error(received: &[u8]) -> Option<&'static str> {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::from(received);
    loop {
        match decoder.decode(&mut buf, usize::MAX) {
            Err(e) => return Some(e),
            Ok(Decoded::Data(_)) => {}
            Ok(Decoded::NeedMore | Decoded::Done) => return None,
        }
    }
}

/// Where the line at the start of `buf` ends: the position of its CRLF, `None` while neither a CR nor an LF
/// has arrived (or only a CR, as the last byte). A bare LF, or a CR followed by anything but LF, is an error at
/// once: a line ending other than CRLF is one an upstream may read differently (see `strict_line_endings`).
fn crlf_at(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    let Some(at) = memchr::memchr2(b'\r', b'\n', buf) else {
        return Ok(None);
    };
    match (buf[at], buf.get(at + 1)) {
        (b'\r', Some(b'\n')) => Ok(Some(at)),
        (b'\r', None) => Ok(None),
        _ => Err("chunk size line not ended by CRLF"),
    }
}

/// `1*HEXDIG [ BWS ";" extensions ]`, with at most 15 significant hex digits (no overflow, no sign, no `0x`).
/// With `complete: false` the line's CRLF has not arrived: only what no later byte can mend is an error (and
/// the size returned means nothing).
fn parse_chunk_size(line: &[u8], complete: bool) -> Result<u64, &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 && (complete || !line.is_empty()) {
        return Err("invalid chunk size");
    }
    let significant = line[..digits].iter().skip_while(|&&b| b == b'0').count();
    if significant > 15 {
        return Err("chunk size too large");
    }
    let rest = &line[digits..];
    match rest.iter().find(|&&b| b != b' ' && b != b'\t') {
        Some(b';') => {}
        None if !complete || rest.is_empty() => {}
        _ => return Err("invalid chunk size"),
    }
    if rest.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err("invalid chunk extension");
    }
    let mut n = 0u64;
    for &b in &line[..digits] {
        n = n * 16 + u64::from((b as char).to_digit(16).unwrap_or(0));
    }
    Ok(n)
}

/// Appends the chunk-size line for a chunk of `len` bytes.
pub fn chunk_header(out: &mut Vec<u8>, len: usize) {
    use std::io::Write;
    let _ = write!(out, "{len:x}\r\n");
}

pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };

    fn parse(s: &str) -> Result<RequestHead, HeadError> {
        let mut buf = BytesMut::from(s.as_bytes());
        match parse_request(&buf, &LIMITS)? {
            Parsed::Complete(h, used) => Ok(take_request(&mut buf, h, used)),
            Parsed::Partial => panic!("partial: {s:?}"),
        }
    }

    #[test]
    fn only_a_proper_websocket_handshake_is_an_upgrade() {
        let ws = "Connection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n";
        assert!(parse(&format!("GET /ws HTTP/1.1\r\nHost: a\r\n{ws}\r\n")).unwrap().upgrade_websocket);
        for not in [
            format!("GET /ws HTTP/1.0\r\n{ws}\r\n"),
            format!("POST /ws HTTP/1.1\r\nHost: a\r\n{ws}\r\n"),
            format!("GET /ws HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n{ws}\r\nabc"),
            "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n".to_string(),
            "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n".to_string(),
        ] {
            assert!(!parse(&not).unwrap().upgrade_websocket, "{not:?}");
        }
    }

    #[test]
    fn simple_get() {
        let h = parse("GET /a/b?x=1 HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n").unwrap();
        assert!(h.keep_alive);
        assert_eq!(h.body, BodyFraming::None);
    }

    #[test]
    fn strictness() {
        let cases = [
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
            ("GET / HTTP/1.1\nHost: a\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET foo HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET /g#frag HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET /g?q=1#frag HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET /# HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET http://h/g#f HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET http://h#f HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("OPTIONS *# HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 405),
            ("GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n", 417),
        ];
        for (req, status) in cases {
            match parse_request(req.as_bytes(), &LIMITS) {
                Err(e) => assert_eq!(e.status, status, "{req:?}: {}", e.reason),
                Ok(_) => panic!("accepted {req:?}"),
            }
        }
    }

    /// A fragment is refused in every form of target, by the HTTP/1 parser and in HTTP/2 fields alike.
    #[test]
    fn a_fragment_in_the_target_is_refused() {
        for target in ["/g#frag", "/g?q=1#f", "/#", "/a%23b#", "http://h/g#f", "http://h#f", "http://h?q#f", "*#"] {
            let method = if target.starts_with('*') { "OPTIONS" } else { "GET" };
            let text = format!("{method} {target} HTTP/1.1\r\nHost: a\r\n\r\n");
            let expected = Some(bad("fragment in the request target"));
            assert_eq!(parse_request(text.as_bytes(), &LIMITS).err(), expected, "{text:?}");
            let no_fields = std::iter::empty::<(&[u8], &[u8])>;
            assert_eq!(request_from_fields(method, target, b"a", no_fields, &LIMITS).err(), expected, "{target:?}");
        }
        // An encoded `#` is data, not a fragment.
        assert_eq!(parse("GET /a%23b HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().path(), b"/a%23b");
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
        assert_eq!(parse_request(long.as_bytes(), &LIMITS).err().map(|e| e.status), Some(414));
        let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(parse_request(req.as_bytes(), &LIMITS).err().map(|e| e.status), Some(431));
        let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n", "v".repeat(40000));
        assert_eq!(parse_request(big.as_bytes(), &LIMITS).err().map(|e| e.status), Some(431));
    }

    #[test]
    fn absolute_form_and_cookies() {
        let h = parse("GET http://Svc.local:81/p?q HTTP/1.1\r\nHost: other\r\nCookie: a=1; sticky = xyz ;b=2\r\n\r\n")
            .unwrap();
        assert_eq!(h.host().unwrap(), b"Svc.local:81");
        assert_eq!(h.origin_form(), b"/p?q");
        assert_eq!(h.path(), b"/p");
        assert_eq!(h.cookie("sticky").unwrap(), b"xyz");
        assert!(h.cookie("c").is_none());
    }

    #[test]
    fn http10_keepalive() {
        assert!(!parse("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap().keep_alive);
        assert!(!parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap().keep_alive);
    }

    fn decode_all(input: &[u8]) -> Result<Vec<u8>, &'static str> {
        let mut d = ChunkedDecoder::default();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match d.decode(&mut buf, 3)? {
                Decoded::Data(b) => out.extend_from_slice(&b),
                Decoded::NeedMore => return Err("incomplete"),
                Decoded::Done => return Ok(out),
            }
        }
    }

    #[test]
    fn chunked() {
        assert_eq!(decode_all(b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\nX-T: 1\r\n\r\n").unwrap(), b"hello!");
        assert_eq!(decode_all(b"000A\r\n0123456789\r\n0\r\n\r\n").unwrap(), b"0123456789");
        for bad in [
            &b"x\r\nhello\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"ffffffffffffffffff\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"0\r\n bad\r\n\r\n",
        ] {
            assert!(decode_all(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// A broken chunked body is refused at its first invalid byte: every shorter prefix waits for more, so a
    /// client (or upstream) that sends one and then nothing is answered at once, not at the read timeout.
    #[test]
    fn chunk_framing_errors_are_found_at_the_invalid_byte() {
        let cases: &[(&[u8], usize)] = &[
            (b"5\rhello\r0\r\r", 2),
            (b"5\nhello", 1),
            (b"\r\r", 1),
            (b"\n", 0),
            (b"zz\r\n", 0),
            (b"5x", 1),
            (b"5 x", 2),
            (b"5\t;a=\x01", 5),
            (b"5;a\x7f", 3),
            (b"1234567890abcdef0", 15),
            (b"5\r\nhello\rX", 9),
            (b"5\r\nhello\r\n0\r\r", 12),
            (b"5\r\nhello\r\n0\r\nX: 1\rY", 18),
            (b"0\r\nX: 1\n", 7),
            (b"0\r\n X: 1\r\n", 3),
            (b"0\r\nX: 1\r\n\tmore\r\n", 9),
            (b"0\r\nXY\r\n", 6),
            (b"0\r\n\r\r", 4),
        ];
        for &(input, bad_at) in cases {
            let shown = String::from_utf8_lossy(input);
            for end in 0..=bad_at {
                let error = chunked_prefix_error(&input[..end]);
                assert_eq!(error, None, "{shown:?} refused after {end} bytes, before its invalid byte");
            }
            assert!(chunked_prefix_error(&input[..=bad_at]).is_some(), "{shown:?} not refused at byte {bad_at}");
            assert!(decode_all(input).is_err(), "{shown:?}");
        }
    }

    #[test]
    fn response_framing() {
        let r = |s: &str, head: bool| match parse_response(s.as_bytes(), head, 65536).unwrap() {
            Parsed::Complete(h, _) => h,
            Parsed::Partial => panic!(),
        };
        let h = r("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false);
        assert_eq!((h.body, h.reusable), (BodyFraming::Length(5), true));
        let h = r("HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!((h.body, h.reusable), (BodyFraming::UntilClose, false));
        let h = r("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", false);
        assert_eq!((h.body, h.reusable), (BodyFraming::Chunked, false));
        let h = r("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", false);
        assert!(!h.reusable);
        let h = r("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", false);
        assert_eq!((h.body, h.other_codings.as_deref()), (BodyFraming::Chunked, Some("gzip")));
        let h = r("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false);
        assert_eq!((h.body, h.other_codings.as_deref()), (BodyFraming::UntilClose, Some("gzip")));
        let h = r("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", false);
        assert_eq!(h.body, BodyFraming::None);
        let h = r("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true);
        assert_eq!(h.body, BodyFraming::None);
    }

    /// Feeding a chunked body in pieces of every size gives the same result as feeding it whole.
    #[test]
    fn chunked_decoding_is_split_invariant() {
        let input: &[u8] = b"5;a=b\r\nhello\r\n10\r\n0123456789abcdef\r\n1 \t;c\r\n!\r\n0\r\nX-T: v\r\n\r\n";
        let whole = decode_all(input).unwrap();
        for piece in 1..input.len() {
            let mut d = ChunkedDecoder::default();
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut fed = 0;
            loop {
                match d.decode(&mut buf, 4).unwrap() {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::Done => break,
                    Decoded::NeedMore => {
                        assert!(fed < input.len(), "needs more after all input (piece {piece})");
                        let end = (fed + piece).min(input.len());
                        buf.extend_from_slice(&input[fed..end]);
                        fed = end;
                    }
                }
            }
            assert_eq!(out, whole, "piece size {piece}");
        }
    }

    /// A request head arriving byte by byte is Partial until complete, then parses as it does whole.
    #[test]
    fn request_parsing_is_split_invariant() {
        let input = b"\r\nPOST /p?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nX: y\r\n\r\nabc";
        let full = match parse_request(input, &LIMITS).unwrap() {
            Parsed::Complete(h, used) => (h.body, used),
            Parsed::Partial => panic!(),
        };
        for end in 0..full.1 {
            assert!(matches!(parse_request(&input[..end], &LIMITS), Ok(Parsed::Partial)), "prefix {end}");
        }
        assert_eq!(full, (BodyFraming::Length(3), input.len() - 3));
    }

    #[test]
    fn byte_tables_are_the_rules() {
        for b in 0..=255u8 {
            let token = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            let host = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b);
            assert_eq!(TOKEN_BYTES[b as usize], token, "{b:#x}");
            assert_eq!(HOST_BYTES[b as usize], host, "{b:#x}");
            assert_eq!(TARGET_BYTES[b as usize], b > b' ' && b != 0x7f, "{b:#x}");
            assert_eq!(VALUE_BYTES[b as usize], b == b'\t' || (b >= b' ' && b != 0x7f), "{b:#x}");
        }
    }

    /// The head built from HTTP/2 fields is the head parse_request makes of the same request written as
    /// HTTP/1.1 text: the same fields, spans over the same bytes, the same refusals.
    #[test]
    fn fields_make_the_head_the_text_makes() {
        fn same(method: &str, target: &str, host: &[u8], fields: &[(&[u8], &[u8])], limits: &HeadLimits) {
            let mut text = format!("{method} {target} HTTP/1.1\r\nhost: ").into_bytes();
            text.extend_from_slice(host);
            text.extend_from_slice(b"\r\n");
            for (n, v) in fields {
                text.extend_from_slice(n);
                text.extend_from_slice(b": ");
                text.extend_from_slice(v);
                text.extend_from_slice(b"\r\n");
            }
            text.extend_from_slice(b"\r\n");
            let parsed = match parse_request(&text, limits) {
                Ok(Parsed::Complete(h, used)) => {
                    let mut buf = BytesMut::from(&text[..]);
                    Ok(take_request(&mut buf, h, used))
                }
                Ok(Parsed::Partial) => panic!("partial: {:?}", String::from_utf8_lossy(&text)),
                Err(e) => Err(e),
            };
            let built = request_from_fields(method, target, host, || fields.iter().copied(), limits);
            let what = String::from_utf8_lossy(&text);
            match (parsed, built) {
                (Err(a), Err(b)) => assert_eq!(a, b, "{what:?}"),
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.buf, b.buf, "{what:?}");
                    let fields =
                        |h: &RequestHead| h.headers.iter().map(|(s, k)| (s.name, s.value, *k)).collect::<Vec<_>>();
                    assert_eq!(fields(&a), fields(&b), "{what:?}");
                    assert_eq!(
                        (a.method, a.target, a.origin_start, a.path_end, a.host),
                        (b.method, b.target, b.origin_start, b.path_end, b.host)
                    );
                    assert_eq!(
                        (a.http10, a.body, a.keep_alive, a.expect_continue, a.upgrade_websocket),
                        (b.http10, b.body, b.keep_alive, b.expect_continue, b.upgrade_websocket)
                    );
                    assert_eq!(a.connection, b.connection);
                }
                (a, b) => panic!("{what:?}: parsed {:?}, built {:?}", a.err(), b.err()),
            }
        }
        let ok: &[(&[u8], &[u8])] = &[(b"user-agent", b"h2load"), (b"accept", b"*/*"), (b"cookie", b"a=1; b=2")];
        same("GET", "/a/b?x=1", b"example.com:8443", ok, &LIMITS);
        same("POST", "/p", b"h", &[(b"content-length", b"3"), (b"expect", b"100-continue")], &LIMITS);
        same("OPTIONS", "*", b"h", &[], &LIMITS);
        same("GET", "*", b"h", &[], &LIMITS);
        same("CONNECT", "/", b"h", &[], &LIMITS);
        same("GET", "http://other:81/p?q", b"h", &[], &LIMITS);
        same("GET", "/", b"bad host", &[], &LIMITS);
        same("GET", "/", b"", &[], &LIMITS);
        same("GET", "/", b"h", &[(b"x", b"  padded \t ")], &LIMITS);
        same("GET", "/", b"h", &[(b"x", b"")], &LIMITS);
        same("GET", "/", b"h", &[(b"x", b"a\x7fb")], &LIMITS);
        same("GET", "/", b"h", &[(b"x", b"\xff\x80")], &LIMITS);
        same("GET", "/", b"h", &[(b"x y", b"v")], &LIMITS);
        same("GET", "/", b"h", &[(b"x\"", b"v")], &LIMITS);
        same("GET", "/", b"h", &[(b"content-length", b"1, 2")], &LIMITS);
        same("GET", "/", b"h", &[(b"content-length", b"5"), (b"transfer-encoding", b"chunked")], &LIMITS);
        same("GET", "/", b"h", &[(b"expect", b"magic")], &LIMITS);
        same("GET", "/", b"h", &[(b"host", b"second")], &LIMITS);
        same("G(ET", "/", b"h", &[], &LIMITS);
        same("GET", "/\x7f", b"h", &[], &LIMITS);
        same("GET", "/é", b"h", &[], &LIMITS);
        same("GET", "/g#frag", b"h", &[], &LIMITS);
        same("GET", "http://other/g#f", b"h", &[], &LIMITS);
        let long = format!("/{}", "a".repeat(8192 - 14));
        same("GET", &long, b"h", &[], &LIMITS);
        same("GET", &long[1..], b"h", &[], &LIMITS);
        let many: Vec<(Vec<u8>, Vec<u8>)> = (0..120).map(|i| (format!("x-{i}").into_bytes(), b"v".to_vec())).collect();
        let many: Vec<(&[u8], &[u8])> = many.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        for n in [98, 99, 100, 120] {
            same("GET", "/", b"h", &many[..n], &LIMITS);
        }
        let big = "v".repeat(16000);
        same("GET", "/", b"h", &[(b"a", big.as_bytes()), (b"b", big.as_bytes())], &LIMITS);
        same("GET", "/", b"h", &[(b"a", big.as_bytes()), (b"b", big.as_bytes()), (b"c", big.as_bytes())], &LIMITS);
        let tight = HeadLimits { max_request_line: 20, max_header_bytes: 60, max_headers: 2 };
        for target in ["/", "/123456", "/1234567", "/12345678"] {
            same("GET", target, b"h", &[], &tight);
        }
        same("GET", "/", b"h", &[(b"a", b"1")], &tight);
        same("GET", "/", b"h", &[(b"a", b"1"), (b"b", b"2")], &tight);
        same("GET", "/", b"h", &[(b"a", b"12345678901234567890")], &tight);
        same("GET", "/", b"h", &[(b"a", b"123456789012345678901234567890")], &tight);
        // Random fields from an alphabet with every kind of byte the rules tell apart.
        let alphabet = b" \t:;,=\"()/?*aZ09-_\x00\x7f\x80\xff";
        let names: [&[u8]; 8] =
            [b"x", b"cookie", b"content-length", b"connection", b"upgrade", b"expect", b"te", b"via"];
        let mut rng = fastrand::Rng::with_seed(0x2f1e1d);
        for _ in 0..5_000 {
            let mut owned = Vec::new();
            for _ in 0..rng.usize(0..4) {
                let mut name = names[rng.usize(..names.len())].to_vec();
                // Not a colon: the text would be another request (the name ends at it).
                let byte = alphabet[rng.usize(..alphabet.len())];
                if rng.u8(..4) == 0 && byte != b':' {
                    name.insert(rng.usize(..=name.len()), byte);
                }
                let value: Vec<u8> = (0..rng.usize(0..6)).map(|_| alphabet[rng.usize(..alphabet.len())]).collect();
                owned.push((name, value));
            }
            let fields: Vec<(&[u8], &[u8])> = owned.iter().map(|(n, v)| (&n[..], &v[..])).collect();
            let host: Vec<u8> = (0..rng.usize(0..4)).map(|_| alphabet[rng.usize(..alphabet.len())]).collect();
            same(["GET", "POST", "HEAD"][rng.usize(..3)], "/x?y", &host, &fields, &LIMITS);
        }
    }

    /// Random mutations of valid messages never panic the parsers, and whatever the request parser accepts
    /// has unambiguous framing.
    #[test]
    fn mutated_input_never_panics() {
        let seeds: [&[u8]; 3] = [
            b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, x\r\nCookie: a=b\r\n\r\n",
            b"POST http://h:1/p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        let alphabet = b"\r\n :;,\t0aZ/?-\x00\x7f\xff";
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        for _ in 0..20_000 {
            let mut m = seeds[rng.usize(..seeds.len())].to_vec();
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(..m.len());
                match rng.u8(..3) {
                    0 => m[at] = alphabet[rng.usize(..alphabet.len())],
                    1 => m.insert(at, alphabet[rng.usize(..alphabet.len())]),
                    _ => {
                        m.remove(at);
                    }
                }
            }
            if let Ok(Parsed::Complete(h, used)) = parse_request(&m, &LIMITS) {
                let mut buf = BytesMut::from(&m[..]);
                let h = take_request(&mut buf, h, used);
                let _ = (h.path(), h.origin_form(), h.host_name(), h.cookie("a"), h.is_idempotent());
                assert!(!(h.body == BodyFraming::Chunked && h.values("content-length").next().is_some()));
            }
            let _ = parse_response(&m, false, 65536);
            let _ = chunked_prefix_error(&m);
        }
    }
}
