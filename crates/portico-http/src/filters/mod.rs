//! Filters: code that runs around a route's target. A filter's request hook runs after routing and before
//! the target, in the order written (global `filters:` first, then the route's own); it may change the
//! request head (through its edit overlay) or answer at once, and then no later filter and no target runs.
//! Its response hook runs before the response head is written, in the same order, so a route's filter has
//! the last word over a global one; it changes the head through `ResponseEdits`. Response hooks run for every
//! response of a routed request: proxied, made by a target or a filter, or an error of Portico's.
//!
//! Filters are trait objects so that code outside this crate (the functions plane) can add kinds. Body
//! filters (compression) come with the streaming body type.

mod cors;
mod filter;
mod headers;
mod rewrite;

pub use filter::{Chain, Filter, RequestCx, Step};

pub(crate) use rewrite::{after_prefix, trim_prefix};

use crate::codec::RequestHead;
use crate::message::ResponseEdits;
use portico_config::Filter as FilterConfig;
use std::sync::Arc;

/// Compiles a filter's configuration; `names` are the route pattern's parameters (none for global filters).
/// An error is (the key below the filter, the message).
pub fn compile(config: &FilterConfig, names: &[String]) -> Result<Arc<dyn Filter>, (String, String)> {
    Ok(match config {
        FilterConfig::Headers(h) => Arc::new(headers::Headers::new(h)),
        FilterConfig::Rewrite(r) => Arc::new(rewrite::Rewrite::new(r, names)?),
        FilterConfig::Cors(c) => Arc::new(cors::Cors::new(c)),
    })
}

/// Runs the response hooks of `chain` for a response with `status`.
pub fn response_edits(chain: &[Arc<dyn Filter>], head: &RequestHead, status: u16) -> ResponseEdits {
    let mut edits = ResponseEdits::default();
    for f in chain.iter().filter(|f| f.has_response_hook()) {
        f.on_response(head, status, &mut edits);
    }
    edits
}
