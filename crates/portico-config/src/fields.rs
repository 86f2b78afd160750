//! What the configuration checks header fields and other HTTP tokens against (used by routes, filters and
//! the access filters alike).

/// Whether `s` is an HTTP token (RFC 9110 5.6.2): a header name, a method, a cookie name.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Headers Portico writes itself (framing, hop-by-hop, forwarding): no filter sets or removes them.
pub const OWNED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "via",
];
