//! What a plane shows on the admin address. The admin server depends on portico-core alone and asks each plane
//! for its part; the binary hands it the planes it runs.

use crate::stats::BUCKETS;
use portico_config::LoadedConfig;
use std::sync::Arc;

pub trait PlaneView: Send + Sync {
    /// Appends this plane's metrics, in the Prometheus text format, one family at a time.
    fn render_metrics(&self, out: &mut String);
    /// The document for `GET /admin/{name}` (the HTTP plane: `clusters`), if this plane serves one.
    fn admin_view(&self, name: &str) -> Option<serde_json::Value>;
    /// The configuration this plane runs now.
    fn running_config(&self) -> Arc<LoadedConfig>;
    /// Appends this plane's counters as they are now (cumulative), for the dashboard's charts: the admin server
    /// takes one sample a second and keeps the differences.
    fn sample(&self, _out: &mut Vec<SeriesSample>) {}
    /// A state-changing action of this plane (`POST /admin/{name}` with a JSON body), if it has one by that name.
    fn act(&self, _name: &str, _args: &serde_json::Value) -> Option<Result<serde_json::Value, ActionError>> {
        None
    }
}

/// Why an action was not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionError {
    /// The request does not say what to act on (answered 400).
    Invalid(String),
    /// What it names does not exist (answered 404).
    NotFound(String),
}

/// One series' counters at one moment, all cumulative since the process started (or the series appeared).
#[derive(Debug, Clone)]
pub struct SeriesSample {
    /// What the series is about: `route`, `listener`, `cluster`, `endpoint` (named `CLUSTER/ADDRESS`),
    /// `function`, `mqtt`.
    pub kind: &'static str,
    pub name: String,
    /// Requests (or calls, messages) so far.
    pub requests: u64,
    /// Those of them that failed (5xx, connection failures, function errors).
    pub errors: u64,
    /// Their durations, per bucket of `stats::BUCKETS` (not cumulative, the last being +Inf), when measured.
    pub latency: Option<Box<[u64; BUCKETS.len() + 1]>>,
}

/// The kinds a sample may have, for reading samples back (from a worker process's answer).
const KINDS: [&str; 7] = ["route", "listener", "cluster", "endpoint", "function", "mqtt", "total"];

impl SeriesSample {
    /// As JSON, for a worker process's answer to its master (`sample`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind, "name": self.name, "requests": self.requests, "errors": self.errors,
            "latency": self.latency.as_ref().map(|l| l.to_vec()),
        })
    }

    /// Read back from `to_json`; `None` for anything else.
    pub fn from_json(v: &serde_json::Value) -> Option<SeriesSample> {
        let kind = KINDS.iter().copied().find(|k| v["kind"] == *k)?;
        let latency = match v["latency"].as_array() {
            Some(counts) => {
                let mut l = Box::new([0u64; BUCKETS.len() + 1]);
                if counts.len() != l.len() {
                    return None;
                }
                for (slot, c) in l.iter_mut().zip(counts) {
                    *slot = c.as_u64()?;
                }
                Some(l)
            }
            None => None,
        };
        Some(SeriesSample {
            kind,
            name: v["name"].as_str()?.to_string(),
            requests: v["requests"].as_u64()?,
            errors: v["errors"].as_u64()?,
            latency,
        })
    }

    /// Adds `other`'s counts (the same series in another worker process).
    pub fn add(&mut self, other: &SeriesSample) {
        self.requests += other.requests;
        self.errors += other.errors;
        match (&mut self.latency, &other.latency) {
            (Some(mine), Some(theirs)) => {
                for (m, t) in mine.iter_mut().zip(theirs.iter()) {
                    *m += t;
                }
            }
            (None, Some(theirs)) => self.latency = Some(theirs.clone()),
            _ => {}
        }
    }
}
