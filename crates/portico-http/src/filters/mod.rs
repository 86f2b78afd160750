//! Filters: code that runs around a route's target. A filter's request hook runs after routing and before
//! the target, in the order written (global `filters:` first, then the route's own); it may change the
//! request head (through its edit overlay) or answer at once, and then no later filter and no target runs.
//! Its response hook runs before the response head is written, in the same order, so a route's filter has
//! the last word over a global one; it changes the head through `ResponseEdits`. Response hooks run for every
//! response of a routed request: proxied, made by a target or a filter, or an error of Portico's.
//!
//! A filter may also wrap the response body (`wrap_response_body`, after every response hook): then the
//! response is streamed through `stream_body::BoxBody` rather than relayed as bytes. Routes without such a
//! filter pay one branch per response for it.
//!
//! Filters are trait objects so that code outside this crate (the functions plane) can add kinds.

mod api_key;
mod auth_basic;
mod coding;
mod compress;
mod cors;
mod decompress;
mod denials;
mod filter;
mod headers;
mod ip;
mod jwks;
mod jwt;
mod limits;
mod query;
mod rate_limit;
mod rewrite;

pub use denials::{Denial, Denials};
pub use filter::{Chain, Filter, RequestCx, ResponseView, Resume, Step, Wait};
pub use limits::SlowCap;

pub(crate) use rewrite::{after_prefix, trim_prefix};

use crate::codec::RequestHead;
use crate::message::ResponseEdits;
use portico_config::Filter as FilterConfig;
use std::sync::Arc;

/// Compiles a filter's configuration; `names` are the route pattern's parameters (none for global filters),
/// `site` the route's name (`None` for global filters).
/// Files a filter names (password and key files) are read here, relative to `loaded`'s directory: blocking,
/// as building a snapshot is. An error is (the key below the filter, the message).
pub fn compile(
    config: &FilterConfig,
    names: &[String],
    site: Option<&str>,
    loaded: &portico_config::LoadedConfig,
) -> Result<Arc<dyn Filter>, (String, String)> {
    Ok(match config {
        FilterConfig::Headers(h) => Arc::new(headers::Headers::new(h)),
        FilterConfig::Rewrite(r) => Arc::new(rewrite::Rewrite::new(r, names)?),
        FilterConfig::Cors(c) => Arc::new(cors::Cors::new(c)),
        FilterConfig::Compress(c) => Arc::new(compress::Compress::new(c)),
        FilterConfig::AuthBasic(a) => Arc::new(auth_basic::AuthBasic::new(a, &loaded.resolve(&a.users_file))?),
        FilterConfig::ApiKey(k) => {
            let file = k.keys_file.as_deref().map(|f| loaded.resolve(f));
            Arc::new(api_key::ApiKey::new(k, file.as_deref())?)
        }
        FilterConfig::Ip(f) => Arc::new(ip::Ip::new(f)?),
        FilterConfig::Jwt(j) => Arc::new(jwt::Jwt::new(j, loaded)?),
        FilterConfig::RateLimit(r) => Arc::new(rate_limit::RateLimit::new(r, site)?),
        FilterConfig::Limits(l) => Arc::new(limits::Limits::new(l)),
        FilterConfig::Decompress(d) => Arc::new(decompress::Decompress::new(d)),
        FilterConfig::Query(q) => Arc::new(query::Query::new(q)),
        // A function filter is a `handler::Gate`, compiled with the functions (router.rs).
        FilterConfig::Function(_) => return Err(("function".into(), "a function filter is not compiled here".into())),
    })
}

/// Runs the response hooks of `chain` for a response with `status`.
pub fn response_edits(chain: &[Arc<dyn Filter>], head: &RequestHead, status: u16) -> ResponseEdits {
    let mut edits = ResponseEdits::default();
    for f in chain.iter().filter(|f| f.has_response_hook()) {
        f.on_response(head, status, &mut edits);
    }
    if let Some(added) = head.edits.as_ref().map(|e| &e.response_headers).filter(|h| !h.is_empty()) {
        for (name, value) in added {
            edits.add(name.clone(), value.clone());
        }
    }
    edits
}

/// Whether a filter of `chain` wraps response bodies.
pub fn has_body_hooks(chain: &[Arc<dyn Filter>]) -> bool {
    chain.iter().any(|f| f.has_body_hook())
}

/// Runs the body hooks of `chain` for a response with `status` and `headers` (as they will be sent, updated
/// with each hook's edits) to `head`. A response without a body (to HEAD, 1xx, 204, 304) is left alone.
pub fn wrap_body<'b>(
    chain: &[Arc<dyn Filter>],
    head: &RequestHead,
    status: u16,
    headers: &mut hyper::HeaderMap,
    mut body: crate::stream_body::BoxBody<'b>,
) -> crate::stream_body::BoxBody<'b> {
    if head.method() == b"HEAD" || status < 200 || status == 204 || status == 304 {
        return body;
    }
    for f in chain.iter().filter(|f| f.has_body_hook()) {
        let mut edits = ResponseEdits::default();
        body = f.wrap_response_body(head, &ResponseView { status, headers }, &mut edits, body);
        edits.apply(headers);
    }
    body
}
