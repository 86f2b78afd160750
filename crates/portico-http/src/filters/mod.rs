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
mod headers;
mod rewrite;

pub(crate) use rewrite::{after_prefix, trim_prefix};

use crate::codec::RequestHead;
use crate::message::{LocalResponse, ResponseEdits};
use portico_config::Filter as FilterConfig;
use std::fmt::Debug;
use std::sync::Arc;

/// What the route's match left for the filters.
pub struct RequestCx<'a> {
    /// The path the route matched (normalised), and the captured path parameters as ranges into it, in the
    /// order of the route pattern's names.
    pub matched_path: &'a [u8],
    pub captures: &'a [(u32, u32)],
    /// The route's `path_prefix`, without a trailing slash.
    pub prefix: Option<&'a [u8]>,
}

/// What happens after a request hook.
#[derive(Debug)]
pub enum Step {
    Continue,
    /// Answer with this response; later filters and the target do not run (response hooks still do).
    Respond(LocalResponse),
}

pub trait Filter: Send + Sync + Debug {
    /// Before the target.
    fn on_request(&self, _head: &mut RequestHead, _cx: &RequestCx<'_>) -> Step {
        Step::Continue
    }
    /// Before the response head is written. `status` is the response's.
    fn on_response(&self, _head: &RequestHead, _status: u16, _edits: &mut ResponseEdits) {}
    /// Whether `on_response` does anything: filters that only act on requests cost nothing on responses.
    fn has_response_hook(&self) -> bool {
        false
    }
}

/// A route's filters, global ones first, shared by the requests that use them.
pub type Chain = Arc<[Arc<dyn Filter>]>;

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
