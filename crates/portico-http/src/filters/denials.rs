//! What the blocking filters refuse, per route: `portico_filter_denials_total{route,filter,reason,shadow}`
//! and a log line (at most one a second per route, with how many were not logged). In shadow mode the same
//! request is counted with `shadow="true"` and let through.
//!
//! Counters are atomics written with `fetch_add` rather than per-worker slots: only a refused request
//! writes one, so they cost nothing on requests that pass.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a filter refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// `auth_basic`: no `Authorization: Basic` credentials (or unreadable ones).
    BasicMissing,
    /// `auth_basic`: an unknown user or a wrong password.
    BasicInvalid,
    /// `api_key`: no key in the header or query parameter.
    KeyMissing,
    /// `api_key`: a key that is not configured.
    KeyInvalid,
    /// `ip`: the client's address is denied, or not allowed.
    IpDenied,
    /// `ip`: a trusted proxy's `x-forwarded-for` holds something that is not an address.
    IpUnknown,
    /// `jwt`: no bearer token.
    JwtMissing,
    /// `jwt`: a token that is not a JWT, or an `Authorization` header that cannot be read.
    JwtMalformed,
    /// `jwt`: no key for the token's `kid` and algorithm, or a signature that does not verify.
    JwtInvalid,
    /// `jwt`: `exp` passed (beyond the leeway).
    JwtExpired,
    /// `jwt`: `nbf` not reached yet (beyond the leeway).
    JwtNotYetValid,
    /// `jwt`: a wrong or missing `iss` or `aud`, or a required claim missing.
    JwtClaims,
    /// `jwt`: a revoked `jti`.
    JwtRevoked,
    /// `jwt`: a required claim value that the token does not have (`403 insufficient_scope`).
    JwtForbidden,
    /// `rate_limit`: no token left in the key's bucket.
    RateLimited,
    /// `limits`: the request target is longer than `max_uri_length`.
    UriTooLong,
    /// `limits`: more header fields than `max_headers`.
    TooManyHeaders,
    /// `limits`: header fields larger than `max_header_bytes` in all.
    HeadersTooLarge,
    /// `limits`: a request body larger than `max_body_size`.
    BodyTooLarge,
    /// `limits`: a JSON request body larger than `max_json_size`.
    JsonTooLarge,
    /// `limits`: a JSON request body nesting deeper than `max_json_depth`.
    JsonTooDeep,
    /// `limits`: a JSON request body whose brackets do not match.
    JsonMalformed,
    /// `limits`: the client's address holds more connections than `max_connections_per_ip`.
    TooManyConnections,
    /// `limits`: the client's address holds more slow connections than `max_slow_connections_per_ip`.
    TooManySlowConnections,
}

impl Denial {
    pub const ALL: [Denial; 24] = [
        Denial::BasicMissing,
        Denial::BasicInvalid,
        Denial::KeyMissing,
        Denial::KeyInvalid,
        Denial::IpDenied,
        Denial::IpUnknown,
        Denial::JwtMissing,
        Denial::JwtMalformed,
        Denial::JwtInvalid,
        Denial::JwtExpired,
        Denial::JwtNotYetValid,
        Denial::JwtClaims,
        Denial::JwtRevoked,
        Denial::JwtForbidden,
        Denial::RateLimited,
        Denial::UriTooLong,
        Denial::TooManyHeaders,
        Denial::HeadersTooLarge,
        Denial::BodyTooLarge,
        Denial::JsonTooLarge,
        Denial::JsonTooDeep,
        Denial::JsonMalformed,
        Denial::TooManyConnections,
        Denial::TooManySlowConnections,
    ];

    /// The `filter` and `reason` labels.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            Denial::BasicMissing => ("auth_basic", "missing"),
            Denial::BasicInvalid => ("auth_basic", "invalid"),
            Denial::KeyMissing => ("api_key", "missing"),
            Denial::KeyInvalid => ("api_key", "invalid"),
            Denial::IpDenied => ("ip", "denied"),
            Denial::IpUnknown => ("ip", "unknown_client"),
            Denial::JwtMissing => ("jwt", "missing"),
            Denial::JwtMalformed => ("jwt", "malformed"),
            Denial::JwtInvalid => ("jwt", "invalid"),
            Denial::JwtExpired => ("jwt", "expired"),
            Denial::JwtNotYetValid => ("jwt", "not_yet_valid"),
            Denial::JwtClaims => ("jwt", "claims"),
            Denial::JwtRevoked => ("jwt", "revoked"),
            Denial::JwtForbidden => ("jwt", "insufficient_scope"),
            Denial::RateLimited => ("rate_limit", "exceeded"),
            Denial::UriTooLong => ("limits", "uri_too_long"),
            Denial::TooManyHeaders => ("limits", "too_many_headers"),
            Denial::HeadersTooLarge => ("limits", "headers_too_large"),
            Denial::BodyTooLarge => ("limits", "body_too_large"),
            Denial::JsonTooLarge => ("limits", "json_too_large"),
            Denial::JsonTooDeep => ("limits", "json_too_deep"),
            Denial::JsonMalformed => ("limits", "json_unbalanced"),
            Denial::TooManyConnections => ("limits", "too_many_connections"),
            Denial::TooManySlowConnections => ("limits", "too_many_slow_connections"),
        }
    }
}

/// One route's refusals, kept in the registry by the route's name so they outlive reloads. A clone is
/// another handle to the same counters (a request body checked after its route's filters ran keeps one).
#[derive(Debug, Clone)]
pub struct Denials {
    pub route: String,
    counters: std::sync::Arc<Counters>,
}

#[derive(Debug)]
struct Counters {
    /// By `Denial as usize * 2 + shadow`.
    counts: [AtomicU64; Denial::ALL.len() * 2],
    /// The second of the last log line, and the refusals not logged since.
    logged_at: AtomicU64,
    unlogged: AtomicU64,
}

impl Default for Counters {
    fn default() -> Counters {
        // (Arrays past 32 items have no `Default`.)
        Counters {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            logged_at: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }
}

impl Denials {
    pub fn new(route: &str) -> Denials {
        Denials { route: route.to_string(), counters: Default::default() }
    }

    /// Counts and logs a refusal of a request from `client`; `who` is the user or key name it claimed, if
    /// any (never a password or a key).
    pub fn record(&self, denial: Denial, shadow: bool, client: IpAddr, who: Option<&str>) {
        self.counters.counts[denial as usize * 2 + usize::from(shadow)].fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last = self.counters.logged_at.load(Ordering::Relaxed);
        if now > last
            && self.counters.logged_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let not_logged_since = self.counters.unlogged.swap(0, Ordering::Relaxed);
            let (filter, reason) = denial.labels();
            let who = who.unwrap_or("-");
            if shadow {
                tracing::info!(filter, reason, route = %self.route, %client, who, not_logged_since, "shadow: a request would have been refused");
            } else {
                tracing::info!(filter, reason, route = %self.route, %client, who, not_logged_since, "request refused");
            }
        } else {
            self.counters.unlogged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count of `denial`, enforced (`shadow` false) or only logged.
    pub fn count(&self, denial: Denial, shadow: bool) -> u64 {
        self.counters.counts[denial as usize * 2 + usize::from(shadow)].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_and_mode() {
        let d = Denials::new("r");
        let client = IpAddr::from([127, 0, 0, 1]);
        d.record(Denial::BasicInvalid, false, client, Some("alice"));
        d.record(Denial::BasicInvalid, true, client, None);
        d.record(Denial::BasicInvalid, true, client, None);
        assert_eq!((d.count(Denial::BasicInvalid, false), d.count(Denial::BasicInvalid, true)), (1, 2));
        assert_eq!(d.count(Denial::IpDenied, false), 0);
        assert_eq!(d.counters.unlogged.load(Ordering::Relaxed), 2, "one line a second");
    }
}
