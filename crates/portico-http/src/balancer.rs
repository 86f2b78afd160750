//! Endpoint selection.
//!
//! Round robin and weighted round robin walk one precomputed cycle (nginx's smooth weighted order, so weights
//! are interleaved, not bursts) with a single shared cursor: one relaxed `fetch_add` per pick buys an exact
//! rotation across all workers, which is what users check with a row of curls. `least_connections` and
//! `power_of_two_choices` read per-worker in-flight counters (each worker writes only its own slot).

use crate::codec::RequestHead;
use crate::snapshot::{now_ms, Endpoint, Padded};
use portico_config::{BalancerKind, HashOn};
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
            BalancerKind::StickyCookie => {
                let pinned = input
                    .req
                    .cookie(&self.sticky_cookie)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| u64::from_str_radix(v, 16).ok())
                    .and_then(|id| self.by_id.get(&id).copied());
                match pinned {
                    Some(i) if ok(i) => plain(i),
                    _ => Some(Pick { index: self.next_in_cycle(ok)?, set_cookie: true }),
                }
            }
        }
    }

    /// The next endpoint of the cycle that `ok` accepts.
    fn next_in_cycle(&self, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let len = self.cycle.len();
        if len == 0 {
            return None;
        }
        let start = self.cursor.0.fetch_add(1, Ordering::Relaxed);
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
    use super::smooth_cycle;

    #[test]
    fn smooth_cycle_honours_weights_interleaved() {
        assert_eq!(smooth_cycle(&[1, 1, 1]), vec![0, 1, 2]);
        assert_eq!(smooth_cycle(&[5, 1, 1]), vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(smooth_cycle(&[2, 6]), vec![1, 0, 1, 1]);
        let big = smooth_cycle(&[10_000, 1, 1]);
        assert!(big.iter().filter(|&&i| i == 1).count() == 1 && big.len() < 70_000);
    }
}
