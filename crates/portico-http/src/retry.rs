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

#[cfg(test)]
mod tests {
    use super::{backoff_cap, may_retry, RetryGauge};
    use crate::snapshot::RetrySettings;
    use crate::stats::ClusterSlot;
    use std::time::Duration;

    fn policy(attempts: u32, budget_percent: u32, min_retry_concurrency: u32) -> RetrySettings {
        RetrySettings {
            attempts,
            on_status: vec![503],
            on_timeout: false,
            backoff: Duration::from_millis(25),
            max_backoff: Duration::from_millis(250),
            budget_percent,
            min_retry_concurrency,
        }
    }

    /// How many retries may be in flight at once with `requests` requests in flight: retries are started (and
    /// held) until `may_retry` refuses.
    fn retries_allowed(p: &RetrySettings, requests: i64) -> i64 {
        let slot = ClusterSlot::default();
        slot.requests.add(requests);
        let mut held = Vec::new();
        while may_retry(0, p, &slot) {
            let mut g = RetryGauge::new(&slot);
            g.add();
            held.push(g);
            assert!(held.len() < 10_000, "the budget never ran out");
        }
        assert_eq!(slot.retries_active.get(), held.len() as i64);
        assert_eq!(slot.retries_budget_exhausted.get(), 1);
        held.len() as i64
    }

    #[test]
    fn attempts_limit_the_retries_of_one_request() {
        let slot = ClusterSlot::default();
        let p = policy(3, 100, 1000);
        for done in 0..3 {
            assert!(may_retry(done, &p, &slot), "retry {} of 3", done + 1);
        }
        assert!(!may_retry(3, &p, &slot));
        assert!(!may_retry(4, &p, &slot));
        assert!(!may_retry(0, &policy(0, 100, 1000), &slot), "attempts: 0 disables retries");
        // Running out of attempts is not the budget's doing.
        assert_eq!(slot.retries_budget_exhausted.get(), 0);
    }

    #[test]
    fn budget_is_a_share_of_the_requests_in_flight() {
        // 20% of 100 requests: 20 retries in flight, the 21st is refused.
        assert_eq!(retries_allowed(&policy(3, 20, 3), 100), 20);
        assert_eq!(retries_allowed(&policy(3, 50, 3), 40), 20);
        assert_eq!(retries_allowed(&policy(3, 100, 0), 7), 7);
        // Rounded down: 20% of 49 is 9.8.
        assert_eq!(retries_allowed(&policy(3, 20, 1), 49), 9);
    }

    #[test]
    fn budget_is_at_least_min_retry_concurrency() {
        // 20% of 10 is 2, below the floor of 3.
        assert_eq!(retries_allowed(&policy(3, 20, 3), 10), 3);
        // Nothing in flight (a lone request's retry): the floor still applies.
        assert_eq!(retries_allowed(&policy(3, 20, 3), 0), 3);
        assert_eq!(retries_allowed(&policy(3, 0, 5), 1000), 5);
    }

    #[test]
    fn the_budget_frees_up_as_retries_finish() {
        let slot = ClusterSlot::default();
        slot.requests.add(10);
        let p = policy(3, 10, 1);
        let mut first = RetryGauge::new(&slot);
        first.add();
        assert!(!may_retry(0, &p, &slot));
        assert!(!may_retry(1, &p, &slot));
        assert_eq!(slot.retries_budget_exhausted.get(), 2, "every refusal is counted");
        drop(first);
        assert!(may_retry(0, &p, &slot));
        assert_eq!(slot.retries_budget_exhausted.get(), 2);
        // More requests in flight make more room.
        let mut g = RetryGauge::new(&slot);
        g.add();
        assert!(!may_retry(0, &p, &slot));
        slot.requests.add(10);
        assert!(may_retry(0, &p, &slot));
    }

    #[test]
    fn gauge_counts_retries_and_gives_back_the_active_ones_when_dropped() {
        let slot = ClusterSlot::default();
        slot.retries_active.add(4); // another request's retries
        {
            let mut g = RetryGauge::new(&slot);
            assert_eq!(g.count(), 0);
            g.add();
            g.add();
            assert_eq!(g.count(), 2);
            assert_eq!(slot.retries.get(), 2);
            assert_eq!(slot.retries_active.get(), 6);
        }
        assert_eq!(slot.retries_active.get(), 4);
        assert_eq!(slot.retries.get(), 2, "retries is a counter: it stays");
        // A gauge that never retried changes nothing.
        drop(RetryGauge::new(&slot));
        assert_eq!((slot.retries.get(), slot.retries_active.get()), (2, 4));
    }

    #[test]
    fn a_disarmed_gauge_leaves_its_retries_active() {
        let slot = ClusterSlot::default();
        let mut g = RetryGauge::new(&slot);
        g.add();
        g.add();
        g.add();
        assert_eq!(g.disarm(), 3);
        // The holder now owns them: nothing was taken back.
        assert_eq!(slot.retries_active.get(), 3);
        assert_eq!(slot.retries.get(), 3);
        slot.retries_active.add(-3);
        assert_eq!(slot.retries_active.get(), 0);
    }

    #[test]
    fn backoff_doubles_per_retry_up_to_the_cap() {
        let p = policy(10, 20, 3);
        let ms = |retry| backoff_cap(&p, retry).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4), ms(5)], [25, 50, 100, 200, 250]);
        assert_eq!(ms(6), 250);
        assert_eq!(ms(0), 25, "retry numbers start at 1; 0 is treated as the first");
        // Far beyond the cap, no overflow.
        assert_eq!(ms(64), 250);
        assert_eq!(ms(u32::MAX), 250);
        let huge = RetrySettings { backoff: Duration::from_secs(u64::MAX / 4), max_backoff: Duration::MAX, ..p };
        assert!(backoff_cap(&huge, 40) >= Duration::from_secs(u64::MAX / 4));
        let none = RetrySettings { backoff: Duration::ZERO, ..policy(3, 20, 3) };
        assert_eq!(backoff_cap(&none, 3), Duration::ZERO);
    }

    #[test]
    fn backoff_never_exceeds_max_backoff_even_below_backoff() {
        // A max_backoff below backoff caps the first retry too.
        let p =
            RetrySettings { backoff: Duration::from_secs(2), max_backoff: Duration::from_secs(1), ..policy(3, 20, 3) };
        assert_eq!(backoff_cap(&p, 1), Duration::from_secs(1));
    }
}
