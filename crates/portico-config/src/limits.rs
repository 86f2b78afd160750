//! The `limits` filter: how large a request may be (target, head, body, a JSON body's size and depth) and how
//! many connections, and slow connections, one client address may hold. Its checks live here; the filter in
//! portico-http applies them.

use crate::units::{ByteSize, HumanDuration};
use serde::Deserialize;

/// `limits:` request limits, and per-client-address caps on connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFilter {
    /// A longer request target (path and query, as received) is refused with 414.
    #[serde(default)]
    pub max_uri_length: Option<ByteSize>,
    /// More header fields are refused with 431.
    #[serde(default)]
    pub max_headers: Option<u32>,
    /// Header fields whose names and values add up to more are refused with 431.
    #[serde(default)]
    pub max_header_bytes: Option<ByteSize>,
    /// A larger request body is refused with 413: at once when its length is declared, else when what has
    /// arrived passes it.
    #[serde(default)]
    pub max_body_size: Option<ByteSize>,
    /// A JSON request body (`application/json`, `*/*+json`) larger than this is refused with 413.
    #[serde(default)]
    pub max_json_size: Option<ByteSize>,
    /// A JSON request body nesting arrays and objects deeper than this is refused with 400.
    #[serde(default)]
    pub max_json_depth: Option<u32>,
    /// Read a JSON body whole (up to `max_json_size`) and check it before the target sees any of it. Without
    /// it the body streams and is checked as it passes: a body that breaks a limit is cut off.
    #[serde(default)]
    pub buffer_json: bool,
    /// A request on a connection whose client address holds more connections is refused with 429 (and its
    /// connection closed).
    #[serde(default)]
    pub max_connections_per_ip: Option<u32>,
    /// An HTTP/1 connection whose request head has taken longer than `slow_after` is slow; one address may
    /// hold this many slow connections, and a further one is answered 408 and closed. Top-level `filters:`
    /// only (a head is read before any route is known).
    #[serde(default)]
    pub max_slow_connections_per_ip: Option<u32>,
    /// When a request head still arriving makes its connection slow.
    #[serde(default = "default_slow_after")]
    pub slow_after: HumanDuration,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

impl Default for LimitsFilter {
    fn default() -> Self {
        LimitsFilter {
            max_uri_length: None,
            max_headers: None,
            max_header_bytes: None,
            max_body_size: None,
            max_json_size: None,
            max_json_depth: None,
            buffer_json: false,
            max_connections_per_ip: None,
            max_slow_connections_per_ip: None,
            slow_after: default_slow_after(),
            shadow: false,
        }
    }
}

/// Why 5 s: half the listeners' default `timeouts.header_read` (10 s), past which any head is cut off; a
/// browser on a poor link sends a head in well under a second.
fn default_slow_after() -> HumanDuration {
    HumanDuration::secs(5)
}

impl LimitsFilter {
    /// Whether a request body must be looked at (counted, or scanned as JSON).
    pub fn checks_body(&self) -> bool {
        self.max_body_size.is_some() || self.max_json_size.is_some() || self.max_json_depth.is_some()
    }
    /// Whether the connections of each client address must be counted.
    pub fn counts_connections(&self) -> bool {
        self.max_connections_per_ip.is_some() || self.max_slow_connections_per_ip.is_some()
    }
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

/// Checks a `limits` filter at `base`; `global`: it is in the top-level `filters:`.
pub(crate) fn validate_limits(l: &LimitsFilter, base: &str, global: bool, err: &mut Report<'_>) {
    let base = format!("{base}.limits");
    let given = [
        l.max_uri_length.is_some(),
        l.max_headers.is_some(),
        l.max_header_bytes.is_some(),
        l.max_body_size.is_some(),
        l.max_json_size.is_some(),
        l.max_json_depth.is_some(),
        l.max_connections_per_ip.is_some(),
        l.max_slow_connections_per_ip.is_some(),
    ];
    if !given.iter().any(|g| *g) {
        err(&base, "a limits filter sets no limit".into(), Some("for example `limits: { max_body_size: 10MiB }`"));
    }
    let zero = [
        ("max_uri_length", l.max_uri_length.map(|s| s.0)),
        ("max_headers", l.max_headers.map(u64::from)),
        ("max_header_bytes", l.max_header_bytes.map(|s| s.0)),
        ("max_json_size", l.max_json_size.map(|s| s.0)),
        ("max_json_depth", l.max_json_depth.map(u64::from)),
        ("max_connections_per_ip", l.max_connections_per_ip.map(u64::from)),
    ];
    for (key, value) in zero {
        if value == Some(0) {
            err(&format!("{base}.{key}"), format!("{key} must be above 0"), None);
        }
    }
    if l.buffer_json && l.max_json_size.is_none() {
        err(
            &format!("{base}.buffer_json"),
            "buffer_json reads a JSON body whole, and needs max_json_size to bound it".into(),
            Some("for example `max_json_size: 1MiB`"),
        );
    }
    if l.max_slow_connections_per_ip.is_some() && !global {
        err(
            &format!("{base}.max_slow_connections_per_ip"),
            "slow connections are caught while their request head arrives, before any route is known".into(),
            Some("put this limits filter in the top-level `filters:`"),
        );
    }
    if l.slow_after.0.is_zero() {
        err(&format!("{base}.slow_after"), "slow_after must be above 0".into(), None);
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    use crate::test_support::{errors, BASE};

    #[test]
    fn limits_load_with_their_defaults() {
        let yaml = "filters:\n  - limits: { max_slow_connections_per_ip: 4, max_connections_per_ip: 50 }\nroutes:\n  - cluster: api\n    filters:\n      - limits: { max_body_size: 1MiB, max_json_depth: 16, max_json_size: 64KiB, buffer_json: true, max_uri_length: 2KiB, max_headers: 40, max_header_bytes: 8KiB }\n";
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let crate::Filter::Limits(global) = &loaded.config.filters[0] else { panic!() };
        assert_eq!(global.slow_after.0, std::time::Duration::from_secs(5));
        assert!(global.counts_connections() && !global.checks_body() && !global.shadow);
        let crate::Filter::Limits(route) = &loaded.config.routes[0].filters[0] else { panic!() };
        assert_eq!(route.max_body_size.map(|s| s.0), Some(1 << 20));
        assert!(route.checks_body() && route.buffer_json);
    }

    #[test]
    fn limits_mistakes_are_reported_at_their_keys() {
        let route = |l: &str| errors(&format!("routes:\n  - cluster: api\n    filters:\n      - limits: {l}\n"));
        let e = route("{}");
        assert!(e.iter().any(|e| e.starts_with("7:9") && e.contains("sets no limit")), "{e:?}");
        let e = route("{ max_json_depth: 0 }");
        assert!(e.iter().any(|e| e.contains("max_json_depth must be above 0")), "{e:?}");
        let e = route("{ max_json_depth: 8, buffer_json: true }");
        assert!(e.iter().any(|e| e.contains("needs max_json_size")), "{e:?}");
        let e = route("{ max_slow_connections_per_ip: 2 }");
        assert!(e.iter().any(|e| e.contains("before any route is known")), "{e:?}");
        let e = route("{ max_body_size: lots }");
        assert!(!e.is_empty(), "a size needs a number: {e:?}");
    }
}
