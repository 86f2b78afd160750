//! What the config modules' unit tests share: a base configuration and the diagnostics of loading a text.

use crate::load_str;

/// A listener and a cluster `api`: what a filter's or route's test adds to.
pub(crate) const BASE: &str =
    "listeners: [ { name: web, address: 127.0.0.1:8080 } ]\nclusters:\n  api: { endpoints: [ { address: 127.0.0.1:9002 } ] }\n";

/// `line:col message` of each diagnostic of `BASE` followed by `extra` (none when it loads).
pub(crate) fn errors(extra: &str) -> Vec<String> {
    errors_of(&format!("{BASE}{extra}"))
}

/// `line:col message` of each diagnostic of loading `text` (none when it loads).
pub(crate) fn errors_of(text: &str) -> Vec<String> {
    match load_str(text, "t.yaml") {
        Ok(_) => vec![],
        Err(e) => e.0.iter().map(|d| format!("{}:{} {}", d.line, d.col, d.message)).collect(),
    }
}
