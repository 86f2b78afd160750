//! How many connections, and slow connections, each client address holds in this process: what a `limits`
//! filter's `max_connections_per_ip` and `max_slow_connections_per_ip` read. Counted only while the running
//! configuration has such a limit (`Snapshot::counts_clients`): a connection opened before then is not
//! counted. Entries are removed when their counts fall to zero, so the table holds one entry per address
//! with an open connection. Sharded by address; a connection's open and close each take one shard's lock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{LazyLock, Mutex};

const SHARDS: usize = 16;

#[derive(Default, Clone, Copy)]
struct Counts {
    open: u32,
    slow: u32,
}

static TABLE: LazyLock<[Mutex<HashMap<IpAddr, Counts>>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::new(HashMap::new())));

fn shard(ip: IpAddr) -> std::sync::MutexGuard<'static, HashMap<IpAddr, Counts>> {
    let n = match ip {
        IpAddr::V4(a) => u32::from(a) as usize,
        IpAddr::V6(a) => (u128::from(a) as usize) ^ ((u128::from(a) >> 64) as usize),
    };
    TABLE[(n ^ (n >> 16)) % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
}

fn change(ip: IpAddr, f: impl FnOnce(&mut Counts)) -> Counts {
    let mut table = shard(ip);
    let counts = table.entry(ip).or_default();
    f(counts);
    let now = *counts;
    if now.open == 0 && now.slow == 0 {
        table.remove(&ip);
    }
    now
}

/// One open connection of `ip`, counted until dropped.
#[derive(Debug)]
pub(crate) struct Open(IpAddr);

impl Open {
    pub fn new(ip: IpAddr) -> Open {
        let ip = ip.to_canonical();
        change(ip, |c| c.open += 1);
        Open(ip)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        change(self.0, |c| c.open = c.open.saturating_sub(1));
    }
}

/// One slow connection of `ip`, counted until dropped (its head arrived, or it closed).
#[derive(Debug)]
pub(crate) struct Slow(IpAddr);

impl Slow {
    /// Counts a connection of `ip` as slow; the count of its slow connections, this one included.
    pub fn new(ip: IpAddr) -> (Slow, u32) {
        let ip = ip.to_canonical();
        let now = change(ip, |c| c.slow += 1);
        (Slow(ip), now.slow)
    }
}

impl Drop for Slow {
    fn drop(&mut self) {
        change(self.0, |c| c.slow = c.slow.saturating_sub(1));
    }
}

/// The connections `ip` holds open now.
pub(crate) fn connections(ip: IpAddr) -> u32 {
    let ip = ip.to_canonical();
    shard(ip).get(&ip).map_or(0, |c| c.open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_guards_and_entries_go_at_zero() {
        let ip: IpAddr = "192.0.2.77".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.77".parse().unwrap();
        assert_eq!(connections(ip), 0);
        let a = Open::new(ip);
        let b = Open::new(mapped);
        assert_eq!(connections(ip), 2, "an IPv4-mapped address is the IPv4 address");
        let (slow, n) = Slow::new(ip);
        assert_eq!(n, 1);
        drop((a, b));
        assert_eq!(connections(ip), 0);
        assert!(shard(ip).contains_key(&ip), "a slow one is still counted");
        drop(slow);
        assert!(!shard(ip).contains_key(&ip));
    }
}
