//! The retry policy's decisions, in one place for every upstream protocol: whether one more try is allowed
//! (attempts left and the retry budget not spent), how long to back off, and the gauge that keeps a request's
//! retries counted as in flight while the request lasts.

use crate::snapshot::RetrySettings;
use crate::stats::ClusterSlot;
use std::time::Duration;

/// Whether one more retry is allowed: attempts left, and the retry budget (retries in flight at most
/// `budget_percent` of the requests in flight, or `min_retry_concurrency`) not spent. A refusal by the budget
/// is counted.
pub(crate) fn may_retry(done: u32, policy: &RetrySettings, counters: &ClusterSlot) -> bool {
    if done >= policy.attempts {
        return false;
    }
    let budget =
        (counters.requests.get() * i64::from(policy.budget_percent) / 100).max(i64::from(policy.min_retry_concurrency));
    if counters.retries_active.get() >= budget {
        counters.retries_budget_exhausted.inc();
        return false;
    }
    true
}

/// The longest wait before retry number `retry` (from 1): `backoff * 2^(retry-1)`, capped at `max_backoff`.
pub(crate) fn backoff_cap(policy: &RetrySettings, retry: u32) -> Duration {
    policy.backoff.saturating_mul(1u32 << (retry.saturating_sub(1)).min(16)).min(policy.max_backoff)
}

/// Full jitter: a random wait up to `backoff_cap`.
pub(crate) async fn backoff(policy: &RetrySettings, retry: u32) {
    let micros = backoff_cap(policy, retry).as_micros() as u64;
    if micros > 0 {
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..=micros))).await;
    }
}

/// Counts a request's retries, and keeps them in the cluster's in-flight retries (the budget's numerator)
/// until it is dropped or `disarm`ed.
pub(crate) struct RetryGauge<'a> {
    counters: &'a ClusterSlot,
    count: i64,
}

impl<'a> RetryGauge<'a> {
    pub fn new(counters: &'a ClusterSlot) -> Self {
        RetryGauge { counters, count: 0 }
    }

    /// One more retry of this request.
    pub fn add(&mut self) {
        self.counters.retries.inc();
        self.counters.retries_active.add(1);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count as u32
    }

    /// Hands the in-flight retries to a holder that outlives this borrow, which must take them off
    /// `retries_active` itself when the request ends.
    pub fn disarm(mut self) -> u32 {
        std::mem::take(&mut self.count) as u32
    }
}

impl Drop for RetryGauge<'_> {
    fn drop(&mut self) {
        if self.count != 0 {
            self.counters.retries_active.add(-self.count);
        }
    }
}
