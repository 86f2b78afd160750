//! `headers`: set, add and remove request and response headers.

use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::message::{HeaderEdits, ResponseEdits};
use portico_config::{HeaderEdits as EditsConfig, HeadersFilter};

#[derive(Debug)]
pub struct Headers {
    request: HeaderEdits,
    response: HeaderEdits,
}

/// The configured edits in the order they apply: removals, then replacements, then additions.
fn compile(config: &EditsConfig) -> HeaderEdits {
    let mut edits = HeaderEdits::default();
    for name in &config.remove {
        edits.remove(name.to_ascii_lowercase());
    }
    for (name, value) in &config.set {
        edits.set(name.to_ascii_lowercase(), value.as_str());
    }
    for (name, value) in &config.add {
        edits.add(name.to_ascii_lowercase(), value.as_str());
    }
    edits
}

/// Applies `edits` on top of `target`'s, in order.
fn merge(target: &mut HeaderEdits, edits: &HeaderEdits) {
    for name in &edits.dropped {
        target.remove(name.clone());
    }
    for (name, value) in &edits.appended {
        target.add(name.clone(), value.clone());
    }
}

impl Headers {
    pub fn new(config: &HeadersFilter) -> Headers {
        Headers { request: compile(&config.request), response: compile(&config.response) }
    }
}

impl Filter for Headers {
    fn on_request(&self, head: &mut RequestHead, _cx: &RequestCx<'_>) -> Step {
        if !self.request.is_empty() {
            merge(&mut head.edits_mut().headers, &self.request);
        }
        Step::Continue
    }
    fn on_response(&self, _head: &RequestHead, _status: u16, edits: &mut ResponseEdits) {
        merge(edits, &self.response);
    }
    fn has_response_hook(&self) -> bool {
        !self.response.is_empty()
    }
}
