//! The last server errors (5xx), for the dashboard: what was answered and why (`502 upstream refused the
//! connection`), the route, the cluster and the endpoint. Sampled (at most `PER_SECOND` a second per worker
//! thread) and bounded (the last `KEPT`), so an error storm costs a counter and a clock read per error and
//! never waits: a worker that finds the list locked drops its sample.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;

/// Errors kept.
pub const KEPT: usize = 100;
/// Errors sampled per second by one worker thread.
const PER_SECOND: u32 = 10;

#[derive(Debug, Clone)]
pub struct RecentError {
    /// When it was answered, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub status: u16,
    /// Portico's reason for its own errors (`upstream refused the connection`), else `upstream answered 503`.
    pub reason: &'static str,
    pub route: String,
    pub cluster: String,
    pub endpoint: Option<SocketAddr>,
    pub method: String,
    /// The request's path without its query (which may hold a key), cut at 200 bytes.
    pub path: String,
}

static RECENT: Mutex<VecDeque<RecentError>> = Mutex::new(VecDeque::new());

thread_local! {
    /// This thread's sampling window: the second it is in, and the errors sampled in it.
    static WINDOW: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Whether this thread may sample an error now (at most `PER_SECOND` a second).
pub(crate) fn may_sample(now_ms: u64) -> bool {
    WINDOW.with(|w| {
        let (second, taken) = w.get();
        let now = now_ms / 1000;
        if second != now {
            w.set((now, 1));
            true
        } else if taken < PER_SECOND {
            w.set((second, taken + 1));
            true
        } else {
            false
        }
    })
}

/// Keeps `error` (dropping the oldest past `KEPT`), unless the list is being read.
pub(crate) fn keep(error: RecentError) {
    if let Ok(mut recent) = RECENT.try_lock() {
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(error);
    }
}

/// The errors kept, newest first.
pub fn recent() -> Vec<RecentError> {
    let recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
    recent.iter().rev().cloned().collect()
}

/// `reason` for an upstream's own 5xx: `upstream answered 5xx`, as a static text.
pub(crate) fn upstream_answered(status: u16) -> &'static str {
    match status {
        500 => "upstream answered 500",
        501 => "upstream answered 501",
        502 => "upstream answered 502",
        503 => "upstream answered 503",
        504 => "upstream answered 504",
        _ => "upstream answered a 5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_bounded_per_second() {
        let taken = (0..50).filter(|_| may_sample(5_000)).count();
        assert_eq!(taken, PER_SECOND as usize);
        assert!(may_sample(6_000), "a new second samples again");
    }
}
