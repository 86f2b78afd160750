//! Endpoint selection.
//!
//! Round robin and weighted round robin walk one precomputed cycle (nginx's smooth weighted order, so weights
//! are interleaved, not bursts) with a single shared cursor: one relaxed `fetch_add` per pick buys an exact
//! rotation across all workers, which is what users check with a row of curls. `least_connections` and
//! `power_of_two_choices` read per-worker in-flight counters (each worker writes only its own slot).

use crate::codec::RequestHead;
use crate::endpoint::Endpoint;
use portico_config::{BalancerKind, HashOn};
use portico_core::shared::{now_ms, Padded};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Virtual nodes per unit of weight on the consistent-hash ring: enough for an even spread (about ±10% at
/// 160) while keeping the ring small.
const VNODES_PER_WEIGHT: u32 = 160;

#[derive(Debug)]
pub struct Balancer {
    kind: BalancerKind,
    /// Position in `cycle`, shared by all workers.
    cursor: Padded<AtomicUsize>,
    /// One full rotation of endpoint indices: each endpoint once (round robin) or `weight` times in smooth
    /// weighted order (weighted round robin).
    cycle: Vec<u32>,
    /// Consistent-hash ring: (point, endpoint index), sorted by point.
    ring: Vec<(u64, u32)>,
    hash_on: HashOn,
    hash_name: Option<String>,
    /// Sticky cookie: endpoint id to index.
    by_id: HashMap<u64, usize>,
    pub sticky_cookie: String,
    pub sticky_max_age: Option<u64>,
}

/// What the request offers to a balancer.
pub struct PickInput<'a> {
    pub req: &'a RequestHead,
    pub client_ip: IpAddr,
    pub worker: usize,
}

/// Why no endpoint was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPick {
    /// Every available endpoint was already tried for this request.
    AllTried,
    /// No endpoint of the cluster is healthy (and panic mode is off).
    NoneHealthy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub index: usize,
    /// The response should carry a (new) sticky cookie for this endpoint.
    pub set_cookie: bool,
}

impl Balancer {
    /// The `Set-Cookie` value that pins a client to `endpoint` (sticky_cookie balancing).
    pub fn cookie_for(&self, endpoint: &Endpoint) -> String {
        let mut cookie = format!("{}={:016x}; Path=/; HttpOnly", self.sticky_cookie, endpoint.id);
        if let Some(age) = self.sticky_max_age {
            cookie.push_str(&format!("; Max-Age={age}"));
        }
        cookie
    }

    pub fn new(cfg: &portico_config::Cluster, endpoints: &[Arc<Endpoint>], workers: usize) -> Balancer {
        let _ = workers;
        let weights: Vec<u32> = if cfg.balancer == BalancerKind::WeightedRoundRobin {
            endpoints.iter().map(|e| e.weight).collect()
        } else {
            vec![1; endpoints.len()]
        };
        let mut ring = Vec::new();
        if cfg.balancer == BalancerKind::ConsistentHash {
            for (i, e) in endpoints.iter().enumerate() {
                for v in 0..VNODES_PER_WEIGHT * e.weight.min(100) {
                    let point = xxhash_rust::xxh3::xxh3_64(format!("{}#{v}", e.configured).as_bytes());
                    ring.push((point, i as u32));
                }
            }
            ring.sort_unstable();
        }
        Balancer {
            kind: cfg.balancer,
            cursor: Padded(AtomicUsize::new(0)),
            cycle: smooth_cycle(&weights),
            ring,
            hash_on: cfg.hash.key,
            hash_name: cfg.hash.name.clone(),
            by_id: endpoints.iter().enumerate().map(|(i, e)| (e.id, i)).collect(),
            sticky_cookie: cfg.sticky.cookie.clone(),
            sticky_max_age: cfg.sticky.max_age.map(|d| d.0.as_secs()),
        }
    }

    /// Picks an available (healthy, not ejected) endpoint not in `tried`. When no endpoint of the cluster is
    /// available at all, `panic_mode` picks among all untried endpoints instead of giving up.
    pub fn pick(
        &self,
        endpoints: &[Arc<Endpoint>],
        input: &PickInput,
        tried: &[usize],
        panic_mode: bool,
    ) -> Result<Pick, NoPick> {
        let now = now_ms();
        let untried = |i: usize| !tried.contains(&i);
        let healthy = |i: usize| untried(i) && endpoints[i].health.is_available(now);
        if let Some(p) = self.pick_where(endpoints, input, &healthy) {
            return Ok(p);
        }
        if endpoints.iter().any(|e| e.health.is_available(now)) {
            return Err(NoPick::AllTried);
        }
        if panic_mode {
            return self.pick_where(endpoints, input, &untried).ok_or(NoPick::AllTried);
        }
        Err(NoPick::NoneHealthy)
    }

    /// Whether `pick` would find an endpoint outside `tried`.
    pub fn has_candidate(&self, endpoints: &[Arc<Endpoint>], tried: &[usize], panic_mode: bool) -> bool {
        let now = now_ms();
        let untried = |i: &usize| !tried.contains(i);
        (0..endpoints.len()).filter(untried).any(|i| endpoints[i].health.is_available(now))
            || (panic_mode
                && !endpoints.iter().any(|e| e.health.is_available(now))
                && (0..endpoints.len()).any(|i| untried(&i)))
    }

    fn pick_where(&self, eps: &[Arc<Endpoint>], input: &PickInput, ok: &dyn Fn(usize) -> bool) -> Option<Pick> {
        let n = eps.len();
        if n == 0 || !(0..n).any(ok) {
            return None;
        }
        let plain = |index| Some(Pick { index, set_cookie: false });
        match self.kind {
            BalancerKind::RoundRobin | BalancerKind::WeightedRoundRobin => plain(self.next_in_cycle(ok)?),
            BalancerKind::Random => plain(weighted_random(eps, ok)?),
            BalancerKind::LeastConnections => plain(self.least_loaded(eps, ok)?),
            BalancerKind::PowerOfTwoChoices => plain(power_of_two(eps, ok)?),
            BalancerKind::ConsistentHash => match self.hash_key(input) {
                Some(h) => plain(self.ring_lookup(h, ok)?),
                None => plain(self.next_in_cycle(ok)?),
            },
            BalancerKind::StickyCookie => match self.sticky_endpoint(input.req) {
                Some(i) if ok(i) => plain(i),
                _ => Some(Pick { index: self.next_in_cycle(ok)?, set_cookie: true }),
            },
        }
    }

    /// Whether the request may go to endpoint `chosen`, picked for another request of the same client (a
    /// pipelined batch). Balancers that only spread load allow it (the batch is one pick); consistent hashing
    /// and sticky cookies only when the request's own key or cookie leads to that endpoint.
    pub fn may_share(&self, endpoints: &[Arc<Endpoint>], input: &PickInput, chosen: usize) -> bool {
        match self.kind {
            BalancerKind::ConsistentHash => match self.hash_key(input) {
                Some(h) => {
                    let now = now_ms();
                    self.ring_lookup(h, &|i| endpoints[i].health.is_available(now)) == Some(chosen)
                }
                None => true,
            },
            BalancerKind::StickyCookie => self.sticky_endpoint(input.req) == Some(chosen),
            _ => true,
        }
    }

    /// The endpoint a valid sticky cookie names.
    fn sticky_endpoint(&self, req: &RequestHead) -> Option<usize> {
        req.cookie(&self.sticky_cookie)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .and_then(|id| self.by_id.get(&id).copied())
    }

    /// The next endpoint of the cycle that `ok` accepts.
    fn next_in_cycle(&self, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let len = self.cycle.len();
        if len == 0 {
            return None;
        }
        let start = self.cursor.0.fetch_add(1, Ordering::Relaxed);
        let first = self.cycle[start % len] as usize;
        if ok(first) {
            return Some(first);
        }
        // The slot's endpoint is down or already tried: its turn goes to a random slot that may be used
        // (rejection sampling keeps the weights among those left), not always to the next one in the cycle,
        // which would double one neighbour's load for as long as the endpoint is out.
        for _ in 0..8 {
            let i = self.cycle[fastrand::usize(..len)] as usize;
            if ok(i) {
                return Some(i);
            }
        }
        (0..len).map(|k| self.cycle[(start + k) % len] as usize).find(|&i| ok(i))
    }

    /// Fewest in-flight requests relative to weight, across all workers; ties go round-robin so an idle
    /// cluster does not send everything to its first endpoint.
    fn least_loaded(&self, eps: &[Arc<Endpoint>], ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let n = eps.len();
        let start = self.cursor.0.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, u64, u64)> = None;
        for step in 0..n {
            let i = (start + step) % n;
            if !ok(i) {
                continue;
            }
            let (load, w) = (eps[i].inflight(), u64::from(eps[i].weight));
            if best.is_none_or(|(_, bl, bw)| load * bw < bl * w) {
                best = Some((i, load, w));
            }
        }
        best.map(|(i, _, _)| i)
    }

    fn hash_key(&self, input: &PickInput) -> Option<u64> {
        let h = |b: &[u8]| xxhash_rust::xxh3::xxh3_64(b);
        match self.hash_on {
            HashOn::ClientIp => Some(match input.client_ip {
                IpAddr::V4(v4) => h(&v4.octets()),
                IpAddr::V6(v6) => h(&v6.octets()),
            }),
            HashOn::Path => Some(h(input.req.path())),
            HashOn::Header => input.req.values(self.hash_name.as_deref()?).next().map(h),
            HashOn::Cookie => input.req.cookie(self.hash_name.as_deref()?).map(h),
        }
    }

    fn ring_lookup(&self, hash: u64, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let start = self.ring.partition_point(|(p, _)| *p < hash);
        let len = self.ring.len();
        (0..len).map(|k| self.ring[(start + k) % len].1 as usize).find(|&i| ok(i))
    }
}

/// nginx's smooth weighted round robin, run once for a whole cycle: every step adds each weight to its
/// endpoint's current value, takes the largest and subtracts the total from it. Each endpoint appears exactly
/// `weight` times, interleaved. Weights are first divided by their common divisor and, if the cycle would
/// still be huge, scaled down proportionally (never below 1).
fn smooth_cycle(weights: &[u32]) -> Vec<u32> {
    const MAX_CYCLE: u64 = 1 << 16;
    let gcd = weights.iter().fold(0u32, |a, &b| gcd(a, b)).max(1);
    let mut w: Vec<i64> = weights.iter().map(|&x| i64::from(x / gcd)).collect();
    let total: u64 = w.iter().map(|&x| x as u64).sum();
    if total > MAX_CYCLE {
        let scale = total as f64 / MAX_CYCLE as f64;
        w = w.iter().map(|&x| ((x as f64 / scale).round() as i64).max(1)).collect();
    }
    let total: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for i in 0..w.len() {
            current[i] += w[i];
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        cycle.push(best as u32);
    }
    cycle
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn weighted_random(eps: &[Arc<Endpoint>], ok: &dyn Fn(usize) -> bool) -> Option<usize> {
    let total: u64 = eps.iter().enumerate().filter(|(i, _)| ok(*i)).map(|(_, e)| u64::from(e.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut r = fastrand::u64(0..total);
    for (i, e) in eps.iter().enumerate() {
        if !ok(i) {
            continue;
        }
        let w = u64::from(e.weight);
        if r < w {
            return Some(i);
        }
        r -= w;
    }
    None
}

/// Two distinct random candidates, the less loaded (relative to weight) wins.
fn power_of_two(eps: &[Arc<Endpoint>], ok: &dyn Fn(usize) -> bool) -> Option<usize> {
    let candidates: Vec<usize> = (0..eps.len()).filter(|&i| ok(i)).collect();
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n => {
            let a = fastrand::usize(0..n);
            let mut b = fastrand::usize(0..n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (candidates[a], candidates[b]);
            let load = |i: usize| (eps[i].inflight(), u64::from(eps[i].weight));
            let ((la, wa), (lb, wb)) = (load(a), load(b));
            Some(if lb * wa < la * wb { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    //! The balancers as the proxy uses them: clusters built from YAML by `snapshot::build`, requests parsed by
    //! the codec.
    use super::{smooth_cycle, NoPick, Pick, PickInput};
    use crate::codec::{parse_request, take_request, HeadLimits, Parsed, RequestHead};
    use crate::snapshot::{build, Cluster, OutlierSettings, Registry, Snapshot};
    use bytes::BytesMut;
    use std::collections::{HashMap, HashSet};
    use std::net::IpAddr;
    use std::time::Duration;

    const LIMITS: HeadLimits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };

    /// A snapshot with one cluster `c`: `extra` is YAML for the cluster's other keys (at its indentation) and
    /// `endpoints` are `(address, weight)`.
    fn snapshot_with(registry: &Registry, extra: &str, endpoints: &[(&str, u32)]) -> Snapshot {
        let mut yaml = String::from(
            "listeners:\n  - name: web\n    address: 127.0.0.1:8080\nroutes:\n  - match: { path_prefix: / }\n    \
             cluster: c\nclusters:\n  c:\n",
        );
        for line in extra.lines() {
            yaml.push_str(&format!("    {line}\n"));
        }
        yaml.push_str("    endpoints:\n");
        for (address, weight) in endpoints {
            yaml.push_str(&format!("      - address: {address}\n        weight: {weight}\n"));
        }
        let loaded = portico_config::load_str(&yaml, "test.yaml").unwrap_or_else(|e| panic!("{e:?}\n{yaml}"));
        build(&loaded, registry).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn cluster(extra: &str, n: usize) -> Snapshot {
        let eps: Vec<String> = (0..n).map(|i| format!("127.0.0.{}:80", i + 1)).collect();
        let eps: Vec<(&str, u32)> = eps.iter().map(|a| (a.as_str(), 1)).collect();
        snapshot_with(&Registry::new(2), extra, &eps)
    }

    fn c(s: &Snapshot) -> &Cluster {
        &s.clusters[0]
    }

    fn req(head: &str) -> RequestHead {
        let mut buf = BytesMut::from(head.as_bytes());
        match parse_request(&buf, &LIMITS).unwrap() {
            Parsed::Complete(h, used) => take_request(&mut buf, h, used),
            Parsed::Partial => panic!("partial: {head:?}"),
        }
    }

    fn get() -> RequestHead {
        req("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    }

    fn ip() -> IpAddr {
        "192.0.2.1".parse().unwrap()
    }

    fn pick_with(c: &Cluster, r: &RequestHead, client_ip: IpAddr, tried: &[usize]) -> Result<Pick, NoPick> {
        c.balancer.pick(&c.endpoints, &PickInput { req: r, client_ip, worker: 0 }, tried, c.settings.panic_mode)
    }

    fn pick(c: &Cluster, tried: &[usize]) -> Result<usize, NoPick> {
        pick_with(c, &get(), ip(), tried).map(|p| p.index)
    }

    /// How often each endpoint is picked in `n` picks.
    fn histogram(c: &Cluster, n: usize) -> Vec<usize> {
        let mut counts = vec![0; c.endpoints.len()];
        for _ in 0..n {
            counts[pick(c, &[]).unwrap()] += 1;
        }
        counts
    }

    fn outlier() -> OutlierSettings {
        OutlierSettings {
            consecutive_failures: 5,
            consecutive_5xx: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 100,
        }
    }

    const ALL_KINDS: [&str; 7] = [
        "round_robin",
        "weighted_round_robin",
        "random",
        "least_connections",
        "power_of_two_choices",
        "consistent_hash",
        "sticky_cookie",
    ];

    #[test]
    fn smooth_cycle_honours_weights_interleaved() {
        assert_eq!(smooth_cycle(&[1, 1, 1]), vec![0, 1, 2]);
        assert_eq!(smooth_cycle(&[5, 1, 1]), vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(smooth_cycle(&[2, 6]), vec![1, 0, 1, 1]);
        let big = smooth_cycle(&[10_000, 1, 1]);
        assert!(big.iter().filter(|&&i| i == 1).count() == 1 && big.len() < 70_000);
    }

    #[test]
    fn round_robin_visits_every_endpoint_once_per_cycle() {
        let s = cluster("balancer: round_robin", 4);
        let picks: Vec<usize> = (0..40).map(|_| pick(c(&s), &[]).unwrap()).collect();
        for cycle in picks.chunks(4) {
            let mut seen = cycle.to_vec();
            seen.sort_unstable();
            assert_eq!(seen, [0, 1, 2, 3], "{picks:?}");
        }
    }

    #[test]
    fn weighted_round_robin_is_exact_over_one_cycle_and_interleaved() {
        let registry = Registry::new(1);
        let s = snapshot_with(
            &registry,
            "balancer: weighted_round_robin",
            &[("127.0.0.1:80", 5), ("127.0.0.2:80", 1), ("127.0.0.3:80", 2)],
        );
        // One cycle is 8 picks: exactly the weights.
        for _ in 0..10 {
            assert_eq!(histogram(c(&s), 8), [5, 1, 2]);
        }
        // Smooth: the heavy endpoint never gets more than two in a row (nginx's order: a a c a b a c a).
        let picks: Vec<usize> = (0..64).map(|_| pick(c(&s), &[]).unwrap()).collect();
        assert!(!picks.windows(3).any(|w| w.iter().all(|&i| i == 0)), "{picks:?}");
    }

    #[test]
    fn weighted_round_robin_keeps_the_weights_of_those_left() {
        let registry = Registry::new(1);
        let s = snapshot_with(
            &registry,
            "balancer: weighted_round_robin",
            &[("127.0.0.1:80", 5), ("127.0.0.2:80", 1), ("127.0.0.3:80", 2)],
        );
        // The heavy endpoint down: its 5 of every 8 turns go to the others in their 1:2 proportion.
        c(&s).endpoints[0].health.set_active_healthy(false);
        let h = histogram(c(&s), 6000);
        assert_eq!(h[0], 0);
        let share = h[2] as f64 / 6000.0;
        assert!((0.62..0.71).contains(&share), "{h:?}");
    }

    #[test]
    fn weights_with_a_common_divisor_give_the_same_proportions() {
        let s = snapshot_with(
            &Registry::new(1),
            "balancer: weighted_round_robin",
            &[("127.0.0.1:80", 3000), ("127.0.0.2:80", 1000)],
        );
        // The cycle is reduced to 3:1, so four picks already split exactly.
        assert_eq!(histogram(c(&s), 4), [3, 1]);
    }

    #[test]
    fn round_robin_ignores_weights() {
        let s = snapshot_with(&Registry::new(1), "balancer: round_robin", &[("127.0.0.1:80", 9), ("127.0.0.2:80", 1)]);
        assert_eq!(histogram(c(&s), 10), [5, 5]);
    }

    #[test]
    fn random_follows_weights() {
        let s = snapshot_with(&Registry::new(1), "balancer: random", &[("127.0.0.1:80", 1), ("127.0.0.2:80", 3)]);
        let n = 20_000;
        let h = histogram(c(&s), n);
        let share = h[1] as f64 / n as f64;
        // Expected 0.75; the standard deviation of the share is about 0.003.
        assert!((0.72..0.78).contains(&share), "{h:?}");
    }

    #[test]
    fn unavailable_endpoints_are_skipped_by_every_balancer() {
        for kind in ALL_KINDS {
            let s = cluster(&format!("balancer: {kind}"), 4);
            let c = c(&s);
            c.endpoints[1].health.set_active_healthy(false);
            assert!(c.endpoints[3].health.eject(&outlier()).is_some());
            let mut seen = HashSet::new();
            for k in 0..200 {
                // Vary the request so hashing balancers see many keys.
                let r = req(&format!("GET /k{k} HTTP/1.1\r\nHost: a\r\n\r\n"));
                let client_ip = IpAddr::from([10, 0, (k / 256) as u8, (k % 256) as u8]);
                let p = pick_with(c, &r, client_ip, &[]).unwrap();
                seen.insert(p.index);
            }
            assert_eq!(seen, HashSet::from([0, 2]), "{kind}");
        }
    }

    #[test]
    fn tried_endpoints_are_skipped_and_then_all_tried() {
        for kind in ALL_KINDS {
            let s = cluster(&format!("balancer: {kind}"), 3);
            let c = c(&s);
            let mut tried = Vec::new();
            for _ in 0..3 {
                let i = pick(c, &tried).unwrap_or_else(|e| panic!("{kind}: {e:?} after {tried:?}"));
                assert!(!tried.contains(&i), "{kind}: {i} picked again after {tried:?}");
                tried.push(i);
            }
            assert_eq!(pick(c, &tried), Err(NoPick::AllTried), "{kind}");
            assert!(!c.balancer.has_candidate(&c.endpoints, &tried, false), "{kind}");
        }
    }

    #[test]
    fn untried_but_unhealthy_endpoints_are_not_retried() {
        // Endpoint 0 was tried, endpoint 1 is down: the retry has nowhere to go, with or without panic mode
        // (panic mode only applies when nothing at all is healthy).
        for panic in [false, true] {
            let s = cluster(&format!("balancer: round_robin\npanic_mode: {panic}"), 2);
            let c = c(&s);
            c.endpoints[1].health.set_active_healthy(false);
            assert_eq!(pick(c, &[0]), Err(NoPick::AllTried), "panic_mode: {panic}");
            assert!(!c.balancer.has_candidate(&c.endpoints, &[0], panic));
        }
    }

    #[test]
    fn none_healthy_without_panic_mode() {
        for kind in ALL_KINDS {
            let s = cluster(&format!("balancer: {kind}"), 3);
            let c = c(&s);
            for e in &c.endpoints {
                e.health.set_active_healthy(false);
            }
            assert_eq!(pick(c, &[]), Err(NoPick::NoneHealthy), "{kind}");
            assert!(!c.balancer.has_candidate(&c.endpoints, &[], false), "{kind}");
            // A recovered endpoint is picked again.
            c.endpoints[2].health.set_active_healthy(true);
            assert_eq!(pick(c, &[]), Ok(2), "{kind}");
        }
    }

    #[test]
    fn panic_mode_spreads_over_all_endpoints_when_none_is_healthy() {
        for kind in ALL_KINDS {
            let s = cluster(&format!("balancer: {kind}\npanic_mode: true"), 3);
            let c = c(&s);
            c.endpoints[0].health.set_active_healthy(false);
            c.endpoints[1].health.set_active_healthy(false);
            assert!(c.endpoints[2].health.eject(&outlier()).is_some());
            let mut seen = HashSet::new();
            for k in 0..300 {
                let r = req(&format!("GET /k{k} HTTP/1.1\r\nHost: a\r\n\r\n"));
                let client_ip = IpAddr::from([10, 1, (k / 256) as u8, (k % 256) as u8]);
                seen.insert(pick_with(c, &r, client_ip, &[]).unwrap().index);
            }
            assert_eq!(seen, HashSet::from([0, 1, 2]), "{kind}");
            // Still honours `tried`, and runs out.
            let first = pick(c, &[]).unwrap();
            let second = pick(c, &[first]).unwrap();
            assert_ne!(first, second, "{kind}");
            let third = pick(c, &[first, second]).unwrap();
            assert!(third != first && third != second, "{kind}");
            assert_eq!(pick(c, &[0, 1, 2]), Err(NoPick::AllTried), "{kind}");
            assert!(c.balancer.has_candidate(&c.endpoints, &[first, second], true), "{kind}");
            assert!(!c.balancer.has_candidate(&c.endpoints, &[0, 1, 2], true), "{kind}");
        }
    }

    #[test]
    fn has_candidate_agrees_with_pick() {
        // Every combination of health (3 endpoints) and `tried`, with and without panic mode.
        for panic in [false, true] {
            for kind in ["round_robin", "least_connections", "consistent_hash"] {
                let s = cluster(&format!("balancer: {kind}\npanic_mode: {panic}"), 3);
                let c = c(&s);
                for healthy in 0..8u32 {
                    for (i, e) in c.endpoints.iter().enumerate() {
                        e.health.set_active_healthy(healthy & (1 << i) != 0);
                    }
                    for tried_mask in 0..8u32 {
                        let tried: Vec<usize> = (0..3).filter(|i| tried_mask & (1 << i) != 0).collect();
                        assert_eq!(
                            c.balancer.has_candidate(&c.endpoints, &tried, panic),
                            pick(c, &tried).is_ok(),
                            "{kind} panic_mode {panic} healthy {healthy:03b} tried {tried:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn least_connections_prefers_fewer_in_flight() {
        let s = cluster("balancer: least_connections", 3);
        let c = c(&s);
        // Endpoint 0 is busy on worker 0, endpoint 1 on worker 1: the load is counted across workers.
        c.endpoints[0].begin(0);
        c.endpoints[0].begin(0);
        c.endpoints[1].begin(1);
        for _ in 0..10 {
            assert_eq!(pick(c, &[]), Ok(2));
        }
        c.endpoints[2].begin(0);
        c.endpoints[2].begin(0);
        // Now 2, 1, 2 in flight.
        for _ in 0..10 {
            assert_eq!(pick(c, &[]), Ok(1));
        }
        c.endpoints[0].end(0);
        c.endpoints[0].end(0);
        c.endpoints[1].end(1);
        c.endpoints[2].end(0);
        c.endpoints[2].end(0);
        // All idle again: ties rotate, so every endpoint is used.
        let h = histogram(c, 30);
        assert!(h.iter().all(|&n| n >= 5), "{h:?}");
    }

    #[test]
    fn least_connections_weighs_load_by_weight() {
        let s = snapshot_with(
            &Registry::new(1),
            "balancer: least_connections",
            &[("127.0.0.1:80", 4), ("127.0.0.2:80", 1)],
        );
        let c = c(&s);
        // 3 in flight on weight 4 is a lighter load than 1 on weight 1.
        for _ in 0..3 {
            c.endpoints[0].begin(0);
        }
        c.endpoints[1].begin(0);
        assert_eq!(histogram(c, 10), [10, 0]);
        // 5 on weight 4 is heavier than 1 on weight 1.
        c.endpoints[0].begin(0);
        c.endpoints[0].begin(0);
        assert_eq!(histogram(c, 10), [0, 10]);
    }

    #[test]
    fn power_of_two_choices_never_picks_the_most_loaded() {
        let s = cluster("balancer: power_of_two_choices", 3);
        let c = c(&s);
        for (i, e) in c.endpoints.iter().enumerate() {
            for _ in 0..i * 3 {
                e.begin(0);
            }
        }
        // Loads 0, 3, 6: the two candidates differ, so the busiest always loses; the idle one wins whenever it
        // is a candidate (2 in 3 picks).
        let n = 3000;
        let h = histogram(c, n);
        assert_eq!(h[2], 0, "{h:?}");
        let idle_share = h[0] as f64 / n as f64;
        assert!((0.6..0.73).contains(&idle_share), "{h:?}");
    }

    #[test]
    fn consistent_hash_is_stable_per_key_and_spreads_keys() {
        let s = cluster("balancer: consistent_hash\nhash: { key: header, name: x-user }", 4);
        let c = c(&s);
        let mut first = HashMap::new();
        for round in 0..3 {
            for k in 0..400 {
                let r = req(&format!("GET /any HTTP/1.1\r\nHost: a\r\nX-User: user-{k}\r\n\r\n"));
                // Neither the path nor the client address matter for `key: header`.
                let client_ip = IpAddr::from([10, 2, round, 1]);
                let i = pick_with(c, &r, client_ip, &[]).unwrap().index;
                assert_eq!(*first.entry(k).or_insert(i), i, "user-{k} moved in round {round}");
            }
        }
        let mut h = [0usize; 4];
        for i in first.values() {
            h[*i] += 1;
        }
        // 100 each on average; 160 virtual nodes per endpoint keep every share well within ±50%.
        assert!(h.iter().all(|&n| (50..150).contains(&n)), "{h:?}");
    }

    #[test]
    fn consistent_hash_on_client_ip_path_and_cookie() {
        for (conf, vary) in
            [("hash: { key: client_ip }", 0), ("hash: { key: path }", 1), ("hash: { key: cookie, name: session }", 2)]
        {
            let s = cluster(&format!("balancer: consistent_hash\n{conf}"), 4);
            let c = c(&s);
            let mut seen = HashSet::new();
            for k in 0..200u8 {
                // Only the hashed part varies with k; the others vary with the repetition.
                let mut picks = HashSet::new();
                for rep in 0..3u8 {
                    let path = if vary == 1 { format!("/p{k}") } else { format!("/r{rep}") };
                    let cookie = if vary == 2 { format!("a=1; session=s{k}") } else { format!("session=r{rep}") };
                    let client_ip = if vary == 0 { IpAddr::from([10, 3, 0, k]) } else { IpAddr::from([10, 4, 0, rep]) };
                    let r = req(&format!("GET {path} HTTP/1.1\r\nHost: a\r\nCookie: {cookie}\r\n\r\n"));
                    picks.insert(pick_with(c, &r, client_ip, &[]).unwrap().index);
                }
                assert_eq!(picks.len(), 1, "{conf}: key {k} went to {picks:?}");
                seen.extend(picks);
            }
            assert_eq!(seen.len(), 4, "{conf}: keys used only {seen:?}");
        }
    }

    #[test]
    fn consistent_hash_without_the_key_still_picks() {
        let s = cluster("balancer: consistent_hash\nhash: { key: header, name: x-user }", 3);
        let h = histogram(c(&s), 30);
        assert!(h.iter().all(|&n| n > 0), "{h:?}");
    }

    /// The endpoint (by address) each of `keys` paths goes to.
    fn placement(s: &Snapshot, keys: usize) -> Vec<String> {
        let c = c(s);
        (0..keys)
            .map(|k| {
                let r = req(&format!("GET /obj/{k} HTTP/1.1\r\nHost: a\r\n\r\n"));
                c.endpoints[pick_with(c, &r, ip(), &[]).unwrap().index].configured.clone()
            })
            .collect()
    }

    #[test]
    fn consistent_hash_moves_only_the_removed_endpoints_keys() {
        let all = ["127.0.0.1:80", "127.0.0.2:80", "127.0.0.3:80", "127.0.0.4:80", "127.0.0.5:80"];
        let conf = "balancer: consistent_hash\nhash: { key: path }";
        let eps = |list: &[&'static str]| list.iter().map(|a| (*a, 1)).collect::<Vec<_>>();
        let before = placement(&snapshot_with(&Registry::new(1), conf, &eps(&all)), 5000);
        let removed = all[2];
        let rest: Vec<&str> = all.iter().copied().filter(|a| *a != removed).collect();
        let after = placement(&snapshot_with(&Registry::new(1), conf, &eps(&rest)), 5000);
        let mut moved = 0;
        for (k, (b, a)) in before.iter().zip(&after).enumerate() {
            if b != a {
                assert_eq!(b, removed, "key {k} moved from {b} to {a}, which was not removed");
                moved += 1;
            }
        }
        // About 1/5 of the keys were on the removed endpoint.
        assert!((600..1400).contains(&moved), "{moved} of 5000 moved");

        // An endpoint that is down loses its keys the same way, and gets them back when it recovers.
        let s = snapshot_with(&Registry::new(1), conf, &eps(&all));
        assert_eq!(placement(&s, 5000), before);
        c(&s).endpoints[2].health.set_active_healthy(false);
        let down = placement(&s, 5000);
        for (k, (b, d)) in before.iter().zip(&down).enumerate() {
            assert!(b == d || b == removed, "key {k} moved from {b} to {d}");
            assert_ne!(d, removed);
        }
        c(&s).endpoints[2].health.set_active_healthy(true);
        assert_eq!(placement(&s, 5000), before);
    }

    fn sticky_req(cookie: Option<String>) -> RequestHead {
        match cookie {
            Some(v) => req(&format!("GET / HTTP/1.1\r\nHost: a\r\nCookie: theme=dark; srv={v}\r\n\r\n")),
            None => get(),
        }
    }

    #[test]
    fn sticky_cookie_follows_the_cookie_and_sets_one_when_missing() {
        let s = cluster("balancer: sticky_cookie\nsticky: { cookie: srv }", 3);
        let c = c(&s);
        assert_eq!(c.balancer.sticky_cookie, "srv");
        // No cookie: some endpoint, and the response must set the cookie.
        let p = pick_with(c, &sticky_req(None), ip(), &[]).unwrap();
        assert!(p.set_cookie);
        // The cookie's value as the proxy writes it (`{:016x}` of the id) pins the endpoint.
        for target in [2, 0, 1, 2] {
            let cookie = format!("{:016x}", c.endpoints[target].id);
            for _ in 0..5 {
                let p = pick_with(c, &sticky_req(Some(cookie.clone())), ip(), &[]).unwrap();
                assert_eq!(p, Pick { index: target, set_cookie: false });
            }
        }
        // A cookie naming no endpoint of the cluster, or garbage: a fresh pick with a new cookie.
        for bad in ["0123456789abcdef".to_string(), "zz".into(), String::new()] {
            assert!(pick_with(c, &sticky_req(Some(bad.clone())), ip(), &[]).unwrap().set_cookie, "{bad:?}");
        }
    }

    #[test]
    fn sticky_cookie_moves_off_an_unavailable_or_tried_endpoint() {
        let s = cluster("balancer: sticky_cookie\nsticky: { cookie: srv }", 3);
        let c = c(&s);
        let cookie = format!("{:x}", c.endpoints[1].id);
        // Tried (a retry): another endpoint, and the cookie is replaced.
        let p = pick_with(c, &sticky_req(Some(cookie.clone())), ip(), &[1]).unwrap();
        assert!(p.index != 1 && p.set_cookie, "{p:?}");
        // Down: the same.
        c.endpoints[1].health.set_active_healthy(false);
        for _ in 0..6 {
            let p = pick_with(c, &sticky_req(Some(cookie.clone())), ip(), &[]).unwrap();
            assert!(p.index != 1 && p.set_cookie, "{p:?}");
        }
        // Back up: pinned again without a new cookie.
        c.endpoints[1].health.set_active_healthy(true);
        assert_eq!(pick_with(c, &sticky_req(Some(cookie)), ip(), &[]), Ok(Pick { index: 1, set_cookie: false }));
    }

    #[test]
    fn a_request_shares_another_requests_endpoint_only_where_its_own_key_leads() {
        // Load-spreading balancers: a pipelined batch is one pick, any member may ride on it.
        for kind in ["round_robin", "least_connections", "random", "power_of_two_choices"] {
            let s = cluster(&format!("balancer: {kind}"), 3);
            let input = PickInput { req: &get(), client_ip: ip(), worker: 0 };
            assert!((0..3).all(|i| c(&s).balancer.may_share(&c(&s).endpoints, &input, i)), "{kind}");
        }
        // Consistent hashing on the path: only the endpoint the request's own path leads to.
        let s = cluster("balancer: consistent_hash\nhash: { key: path }", 3);
        let hashed = c(&s);
        for path in ["/a", "/b", "/c", "/d"] {
            let head = req(&format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n"));
            let own = pick_with(hashed, &head, ip(), &[]).unwrap().index;
            let input = PickInput { req: &head, client_ip: ip(), worker: 0 };
            for i in 0..3 {
                assert_eq!(hashed.balancer.may_share(&hashed.endpoints, &input, i), i == own, "{path} on {i}");
            }
        }
        // Sticky cookies: only the endpoint the cookie names; without one, none (its response sets a cookie).
        let s = cluster("balancer: sticky_cookie\nsticky: { cookie: srv }", 3);
        let sticky = c(&s);
        let pinned = sticky_req(Some(format!("{:016x}", sticky.endpoints[2].id)));
        let input = PickInput { req: &pinned, client_ip: ip(), worker: 0 };
        assert!(sticky.balancer.may_share(&sticky.endpoints, &input, 2));
        assert!(!sticky.balancer.may_share(&sticky.endpoints, &input, 0));
        let none = sticky_req(None);
        let input = PickInput { req: &none, client_ip: ip(), worker: 0 };
        assert!((0..3).all(|i| !sticky.balancer.may_share(&sticky.endpoints, &input, i)));
    }

    #[test]
    fn sticky_cookie_ids_survive_a_rebuild() {
        // The cookie is the endpoint's id, derived from its configured address: a reload that reorders the
        // endpoints still sends the client to the same one.
        let a = snapshot_with(
            &Registry::new(1),
            "balancer: sticky_cookie",
            &[("127.0.0.1:80", 1), ("127.0.0.2:80", 1), ("127.0.0.3:80", 1)],
        );
        let b = snapshot_with(
            &Registry::new(1),
            "balancer: sticky_cookie",
            &[("127.0.0.3:80", 1), ("127.0.0.1:80", 1), ("127.0.0.2:80", 1)],
        );
        let cookie = format!("{:016x}", c(&a).endpoints[0].id);
        let r = req(&format!("GET / HTTP/1.1\r\nHost: a\r\nCookie: portico_sticky={cookie}\r\n\r\n"));
        let p = pick_with(c(&b), &r, ip(), &[]).unwrap();
        assert_eq!((c(&b).endpoints[p.index].configured.as_str(), p.set_cookie), ("127.0.0.1:80", false));
    }

    /// An endpoint's share is spread over the others, not handed to its neighbour in the cycle (found by
    /// this test: #2 took 50%).
    #[test]
    fn round_robin_spreads_an_unavailable_endpoints_share_evenly() {
        let s = cluster("balancer: round_robin", 4);
        let c = c(&s);
        c.endpoints[1].health.set_active_healthy(false);
        let n = 3000;
        let h = histogram(c, n);
        assert_eq!(h[1], 0);
        for i in [0, 2, 3] {
            let share = h[i] as f64 / n as f64;
            assert!((0.30..0.37).contains(&share), "{h:?}");
        }
    }
}
