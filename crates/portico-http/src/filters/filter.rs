//! The filter trait and what its hooks are given; the order filters run in is described in `filters`.

use crate::codec::RequestHead;
use crate::message::{LocalResponse, ResponseEdits};
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
