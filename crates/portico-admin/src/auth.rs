//! Who may change state through the admin API: with `admin.token` (or `admin.token_file`) configured, every
//! request that changes state (reload, upgrade, drain) carries `Authorization: Bearer TOKEN`. A browser on
//! another origin may not change state at all (its `Origin` header differs from the admin address): a page
//! elsewhere cannot make an operator's browser reload or drain. Refusals are counted and logged (at most one
//! line a second, with how many were not logged).

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use subtle::ConstantTimeEq;

/// Why a request was refused, as the metric's `reason` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header while a token is configured.
    Missing,
    /// A token that is not the configured one.
    Invalid,
    /// Sent by a browser from a page of another origin.
    Origin,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Invalid => "invalid",
            Refusal::Origin => "origin",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => {
                "this admin request changes state: send the admin token as `Authorization: Bearer TOKEN`"
            }
            Refusal::Invalid => "the admin token is not the configured one",
            Refusal::Origin => "a page of another origin may not change state through the admin API",
        }
    }
}

/// The configured token, and the refusals so far.
#[derive(Debug, Default)]
pub struct Guard {
    token: Option<String>,
    refused: [AtomicU64; 3],
    /// The last log line's second, and the refusals not logged since.
    log: Mutex<(u64, u64)>,
}

impl Guard {
    pub fn new(token: Option<String>) -> Guard {
        Guard { token, ..Guard::default() }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether a request with `headers` may change state; a refusal is counted and logged.
    pub fn check(&self, headers: &HeaderMap, peer: SocketAddr, path: &str) -> Result<(), Refusal> {
        let refusal = self.judge(headers);
        if let Err(refusal) = refusal {
            self.refused[refusal as usize].fetch_add(1, Ordering::Relaxed);
            self.log(refusal, peer, path);
        }
        refusal
    }

    fn judge(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if let Some(origin) = headers.get(ORIGIN) {
            let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            let same = origin.to_str().ok().and_then(|o| o.strip_prefix("http://")).is_some_and(|o| o == host);
            if !same {
                return Err(Refusal::Origin);
            }
        }
        let Some(token) = &self.token else { return Ok(()) };
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        match given {
            None => Err(Refusal::Missing),
            Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
            Some(_) => Err(Refusal::Invalid),
        }
    }

    fn log(&self, refusal: Refusal, peer: SocketAddr, path: &str) {
        let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.0 == second {
            log.1 += 1;
            return;
        }
        let unlogged = std::mem::replace(&mut log.1, 0);
        log.0 = second;
        drop(log);
        tracing::warn!(
            client = %peer,
            path,
            reason = refusal.label(),
            not_logged_since = unlogged,
            "admin request refused: {}",
            refusal.message()
        );
    }

    /// `portico_admin_denials_total`, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        portico_core::prometheus::header(
            out,
            "portico_admin_denials_total",
            "counter",
            "State-changing admin requests refused: without the admin token, with a wrong one, or from a page of another origin.",
        );
        for refusal in [Refusal::Missing, Refusal::Invalid, Refusal::Origin] {
            let n = self.refused[refusal as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "portico_admin_denials_total{{reason=\"{}\"}} {n}", refusal.label());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, value.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn tokens_and_origins() {
        let open = Guard::new(None);
        assert_eq!(open.judge(&headers(&[])), Ok(()));
        assert_eq!(open.judge(&headers(&[("host", "127.0.0.1:9901"), ("origin", "http://127.0.0.1:9901")])), Ok(()));
        assert_eq!(
            open.judge(&headers(&[("host", "127.0.0.1:9901"), ("origin", "https://evil.example")])),
            Err(Refusal::Origin)
        );
        let guarded = Guard::new(Some("s3cret".into()));
        assert_eq!(guarded.judge(&headers(&[])), Err(Refusal::Missing));
        assert_eq!(guarded.judge(&headers(&[("authorization", "Basic s3cret")])), Err(Refusal::Missing));
        assert_eq!(guarded.judge(&headers(&[("authorization", "Bearer s3cre")])), Err(Refusal::Invalid));
        assert_eq!(guarded.judge(&headers(&[("authorization", "bearer s3cret")])), Ok(()));
    }
}
