//! The request and response model the phases and filters work on, over the parsed bytes.
//!
//! A request head stays the bytes it was read from, with spans (`codec::RequestHead`): forwarding copies them
//! as they are. What normalisation and filters change goes into a `HeadEdits` overlay beside the spans, and
//! only a request that has one pays for it: the writers ask the overlay about each header and the path, and
//! a request without edits is forwarded exactly as before. Responses work the same way: an upstream's head is
//! forwarded from its bytes with `ResponseEdits` applied while it is written, and a response Portico makes
//! itself is a `LocalResponse`.

use bytes::Bytes;
use std::sync::Arc;

/// Room reserved in an edit list on its first use.
const EDITS_CAPACITY: usize = 8;

thread_local! {
    /// The name `vary`, shared rather than allocated per response.
    static VARY: Arc<str> = Arc::from("vary");
}

/// Header names compared as many upstreams read them: case-insensitive, with `_` the same as `-` (CGI, WSGI
/// and PHP turn both into `_`), so `X_Client_Cert` cannot pass for `x-client-cert`.
pub fn same_header_name(a: &[u8], b: &[u8]) -> bool {
    let fold = |c: u8| if c == b'_' { b'-' } else { c.to_ascii_lowercase() };
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| fold(x) == fold(y))
}

/// Changes to a request head, applied when it is forwarded.
#[derive(Debug, Default, Clone)]
pub struct HeadEdits {
    /// The new origin-form target (path and query) and where its path ends.
    pub target: Option<(Vec<u8>, usize)>,
    pub headers: HeaderEdits,
    /// Who an authentication filter found the client to be (`auth_basic`'s user, `api_key`'s key name, `jwt`'s
    /// subject), for the access log.
    pub identity: Option<Arc<str>>,
    /// The name of the key an `api_key` filter accepted (what `rate_limit` may count by).
    pub key_name: Option<Arc<str>>,
    /// The claims of the token a `jwt` filter verified (what `rate_limit` may count by).
    pub claims: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// Headers a request hook adds to the response (`rate_limit`'s `RateLimit`), after every response hook.
    pub response_headers: Vec<(Arc<str>, Arc<str>)>,
    /// What a `limits` filter checks of the body as it is read (`body_check`).
    pub body_check: Option<Arc<crate::body_check::BodyCheck>>,
}

/// Changes to a response head, gathered by the response filters and applied as the head is written.
pub type ResponseEdits = HeaderEdits;

/// Header changes over a head that stays as it was read. Names are compared without case.
///
/// Names and values are shared strings: a filter compiled from the configuration hands out reference-counted
/// copies of its own, so editing a request allocates nothing but the two lists.
#[derive(Debug, Default, Clone)]
pub struct HeaderEdits {
    /// Headers of the original head left out, including every name in `set` (its new value is appended).
    pub dropped: Vec<Arc<str>>,
    /// Headers written after the kept ones, in order.
    pub appended: Vec<(Arc<str>, Arc<str>)>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.dropped.is_empty() && self.appended.is_empty()
    }
    pub fn clear(&mut self) {
        self.dropped.clear();
        self.appended.clear();
    }
    /// Whether the original header `name` is left out.
    pub fn drops(&self, name: &[u8]) -> bool {
        self.dropped.iter().any(|d| same_header_name(name, d.as_bytes()))
    }
    /// Replaces every value of `name` with `value`.
    pub fn set(&mut self, name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) {
        let name = name.into();
        self.remove(name.clone());
        self.push_appended(name, value.into());
    }
    /// Adds a value of `name`, keeping those present.
    pub fn add(&mut self, name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) {
        self.push_appended(name.into(), value.into());
    }
    /// Removes `name`, including values appended by earlier edits.
    pub fn remove(&mut self, name: impl Into<Arc<str>> + AsRef<str>) {
        let text = name.as_ref();
        if self.appended.iter().any(|(n, _)| n.eq_ignore_ascii_case(text)) {
            self.appended.retain(|(n, _)| !n.eq_ignore_ascii_case(text));
        }
        if !self.drops(text.as_bytes()) {
            if self.dropped.capacity() == 0 {
                // One allocation for the usual handful of names, not one per doubling.
                self.dropped.reserve(EDITS_CAPACITY);
            }
            self.dropped.push(name.into());
        }
    }
    fn push_appended(&mut self, name: Arc<str>, value: Arc<str>) {
        if self.appended.capacity() == 0 {
            self.appended.reserve(EDITS_CAPACITY);
        }
        self.appended.push((name, value));
    }
    /// The value appended last for `name` (for headers Portico writes itself, such as `host`).
    pub fn appended_value(&self, name: &str) -> Option<&str> {
        self.appended.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| &**v)
    }
    /// Appends `Vary: value` unless an appended `Vary` already lists it.
    pub fn vary(&mut self, value: &Arc<str>) {
        let listed = self
            .appended
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("vary") && v.split(',').any(|x| x.trim().eq_ignore_ascii_case(value)));
        if !listed {
            self.push_appended(VARY.with(Arc::clone), value.clone());
        }
    }

    /// Writes `name: value\r\n` for every appended header.
    pub fn write_appended(&self, out: &mut Vec<u8>) {
        for (name, value) in &self.appended {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Applies the edits to an HTTP/2 (or any `http`) header map.
    pub fn apply(&self, headers: &mut hyper::HeaderMap) {
        use hyper::header::{HeaderName, HeaderValue};
        for name in &self.dropped {
            headers.remove(&**name);
            // `x_auth_user` as well as `x-auth-user`, as the HTTP/1 writers drop them (`same_header_name`).
            if name.contains(['-', '_']) {
                while let Some(alike) =
                    headers.keys().find(|k| same_header_name(k.as_str().as_bytes(), name.as_bytes())).cloned()
                {
                    headers.remove(alike);
                }
            }
        }
        for (name, value) in &self.appended {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                headers.append(n, v);
            }
        }
    }
}

/// A response made by Portico: a static target, a redirect, a filter's early answer or an error.
#[derive(Debug, Clone)]
pub struct LocalResponse {
    pub status: u16,
    /// Lowercase names. `content-length` is written from the body.
    pub headers: Vec<(Box<str>, Box<str>)>,
    pub body: Bytes,
}

impl LocalResponse {
    /// A short plain-text answer: the reason and a new line.
    pub fn text(status: u16, reason: &str) -> LocalResponse {
        LocalResponse {
            status,
            headers: vec![
                ("content-type".into(), "text/plain; charset=utf-8".into()),
                ("server".into(), "portico".into()),
            ],
            body: Bytes::from(format!("{reason}\n")),
        }
    }

    /// An empty answer with these headers.
    pub fn empty(status: u16, headers: Vec<(Box<str>, Box<str>)>) -> LocalResponse {
        LocalResponse { status, headers, body: Bytes::new() }
    }

    /// The response as an `http` response, for the HTTP/2 front.
    pub fn to_http(&self, edits: &ResponseEdits) -> hyper::Response<Bytes> {
        use hyper::header::{HeaderName, HeaderValue};
        let mut resp = hyper::Response::new(self.body.clone());
        *resp.status_mut() = hyper::StatusCode::from_u16(self.status).unwrap_or(hyper::StatusCode::OK);
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                resp.headers_mut().append(n, v);
            }
        }
        edits.apply(resp.headers_mut());
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_and_remove_undoes_earlier_edits() {
        let mut e = HeaderEdits::default();
        e.add("x-tag", "a");
        e.set("X-Api", "1");
        e.set("x-api", "2");
        assert!(e.drops(b"X-API"), "set drops the original values");
        assert_eq!(e.appended_value("x-api"), Some("2"));
        assert_eq!(e.appended.iter().filter(|(n, _)| n.eq_ignore_ascii_case("x-api")).count(), 1);
        e.remove("x-tag");
        assert!(e.appended.iter().all(|(n, _)| &**n != "x-tag"));
        assert!(e.drops(b"x-tag"));
        assert!(!e.drops(b"x-other"));
    }

    #[test]
    fn vary_is_added_once() {
        let mut r = ResponseEdits::default();
        r.vary(&Arc::from("Origin"));
        r.vary(&Arc::from("origin"));
        assert_eq!(r.appended.len(), 1);
        let mut out = Vec::new();
        r.write_appended(&mut out);
        assert_eq!(out, b"vary: Origin\r\n");
    }
}
