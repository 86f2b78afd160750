//! The node's table of rate-limit buckets: one fixed-size hash table in shared memory, used by every worker
//! thread and, with `process_model: multi_process`, every worker process, so a limit counts the node's requests
//! and not one worker's.
//!
//! The table is a memory file (`memfd_create`) mapped `MAP_SHARED`. The process that starts Portico (the single
//! process, or the master) makes it before any worker exists; a worker process inherits its descriptor (passed
//! like the configuration's, `PORTICO_RATE_TABLE_FD`) and maps the same pages. Nothing crosses a socket per
//! request: taking a token is a few loads and one compare-and-swap on a cache line the workers share.
//!
//! Each key's bucket is kept as the generic cell rate algorithm keeps a token bucket: one number, the
//! theoretical arrival time (TAT) of the next request, in nanoseconds of `CLOCK_MONOTONIC` (one clock for every
//! process of the machine). With an emission interval `T` (the period divided by the rate) and a burst `B`, a
//! request at `now` is allowed when `max(TAT, now) + T <= now + B*T`, and then TAT becomes `max(TAT, now) + T`.
//! A bucket is full (the key has made no recent request) exactly when its TAT is not after `now`, and such a
//! key is indistinguishable from one never seen: forgetting it loses nothing.
//!
//! Layout: a header line, then buckets of 8 slots (128 bytes, two cache lines); a slot is a key (a 64-bit hash,
//! 0 for empty) and a TAT. A key lives in one of two buckets its hash picks (two choices keep the table
//! usable to about 97% full, where one bucket per key would overflow at 85%). When both are full, the slot
//! whose TAT is earliest is reused: a full bucket if there is one (no loss), otherwise the key closest to being full
//! again (the one whose limit matters least). So the table's memory is fixed (16 bytes a key, `max_keys`
//! rounded up to a power of two) and it never refuses a key; only when more keys than its slots are mid-limit
//! at once is the least limited of them forgotten (counted: `evictions`).
//!
//! Updates are lock-free: slots are claimed with a compare-and-swap of the key, TATs updated with
//! compare-and-swap loops. Two requests racing to claim a slot for a new key, or a request updating a slot that
//! another is reusing, may count one request under the wrong key: the table is exact without eviction and
//! approximate by a request at the moment a slot changes hands. Two different keys with the same 64-bit hash
//! share a bucket (about one pair in 10^7 among a million keys).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Set for a worker process: the descriptor of the master's rate-limit table.
pub const TABLE_FD_ENV: &str = "PORTICO_RATE_TABLE_FD";
/// Slots per bucket: two cache lines.
const WAYS: usize = 8;
const MAGIC: u64 = 0x5052_5441_424c_4531; // "PRTABLE1"

#[repr(C)]
struct Slot {
    key: AtomicU64,
    tat: AtomicU64,
}

#[repr(C, align(128))]
struct Bucket([Slot; WAYS]);

#[repr(C, align(128))]
struct Header {
    magic: AtomicU64,
    buckets: AtomicU64,
    /// Slots reused while their key was still mid-limit.
    evictions: AtomicU64,
}

/// The shared table. Cheap to share: a pointer into the mapping, which lives as long as the process.
pub struct RateTable {
    header: *const Header,
    buckets: *const Bucket,
    mask: usize,
    bytes: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through atomics, and is never unmapped while the table exists.
unsafe impl Send for RateTable {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for RateTable {}

impl std::fmt::Debug for RateTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateTable").field("slots", &self.slots()).field("bytes", &self.bytes).finish()
    }
}

/// What taking a token decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Tokens left after this request (0 when refused).
    pub remaining: u64,
    /// When refused: how long until a token is there (nanoseconds).
    pub retry_after_ns: u64,
    /// How long until the bucket is full again (nanoseconds).
    pub full_in_ns: u64,
}

/// Nanoseconds of `CLOCK_MONOTONIC`, the same clock in every process of the machine.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

impl RateTable {
    /// A new table for at least `max_keys` keys (rounded up to a power of two of buckets), in a memory file.
    pub fn create(max_keys: usize) -> std::io::Result<RateTable> {
        let buckets = max_keys.div_ceil(WAYS).max(1).next_power_of_two();
        let bytes = std::mem::size_of::<Header>() + buckets * std::mem::size_of::<Bucket>();
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"portico-rate-limits".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we own; the new pages read as zeros (empty slots).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let table = RateTable::map(fd, bytes, buckets)?;
        // SAFETY: the header is within the mapping, and only touched through atomics.
        let header = unsafe { &*table.header };
        header.buckets.store(buckets as u64, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
        Ok(table)
    }

    /// Maps the table another process made (its memory file's descriptor).
    pub fn attach(fd: OwnedFd) -> std::io::Result<RateTable> {
        // SAFETY: fstat into a zeroed stat structure, of a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let bytes = st.st_size as usize;
        if bytes < std::mem::size_of::<Header>() + std::mem::size_of::<Bucket>() {
            return Err(std::io::Error::other("the rate-limit table passed by the master is too small"));
        }
        let mut table = RateTable::map(fd, bytes, 1)?;
        // SAFETY: the header is within the mapping.
        let header = unsafe { &*table.header };
        let buckets = header.buckets.load(Ordering::Relaxed) as usize;
        let fits = std::mem::size_of::<Header>() + buckets * std::mem::size_of::<Bucket>() <= bytes;
        if header.magic.load(Ordering::Acquire) != MAGIC || !buckets.is_power_of_two() || !fits {
            return Err(std::io::Error::other("the rate-limit table passed by the master is not one"));
        }
        table.mask = buckets - 1;
        Ok(table)
    }

    /// Maps `bytes` of `fd`, which holds `buckets` buckets after the header.
    fn map(fd: OwnedFd, bytes: usize, buckets: usize) -> std::io::Result<RateTable> {
        // SAFETY: a new shared mapping of the whole file; nothing else is mapped at the address the kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let header = base as *const Header;
        // SAFETY: the buckets start right after the header, within the mapping (bytes covers both).
        let first = unsafe { (base as *const u8).add(std::mem::size_of::<Header>()) } as *const Bucket;
        Ok(RateTable { header, buckets: first, mask: buckets - 1, bytes, fd })
    }

    /// The memory file's descriptor (passed to worker processes).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// How many keys the table holds.
    pub fn slots(&self) -> usize {
        (self.mask + 1) * WAYS
    }

    /// The size of the mapping, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Slots reused while their key was still mid-limit, since the table was made (every process's).
    pub fn evictions(&self) -> u64 {
        // SAFETY: the header is within the mapping.
        unsafe { &*self.header }.evictions.load(Ordering::Relaxed)
    }

    /// The two buckets `key` may live in (its hash's low bits, and its high bits mixed).
    fn buckets(&self, key: u64) -> [&Bucket; 2] {
        let second = (key >> 32) ^ key.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // SAFETY: both indices are masked to the buckets the mapping holds.
        unsafe { [&*self.buckets.add((key as usize) & self.mask), &*self.buckets.add((second as usize) & self.mask)] }
    }

    fn find(&self, key: u64) -> Option<&Slot> {
        self.buckets(key).into_iter().flat_map(|b| &b.0).find(|s| s.key.load(Ordering::Acquire) == key)
    }

    /// The slot of `key`, claiming one of its two buckets' (an empty one, else the least limited) if it has
    /// none.
    fn slot(&self, key: u64, now: u64) -> &Slot {
        let [first, second] = self.buckets(key);
        for _ in 0..4 {
            // The victim: an empty slot of the emptier bucket, else the slot with the earliest TAT.
            let mut empty: [(Option<&Slot>, usize); 2] = [(None, 0), (None, 0)];
            let (mut victim, mut victim_key, mut victim_tat) = (&first.0[0], u64::MAX, u64::MAX);
            for (which, bucket) in [first, second].into_iter().enumerate() {
                for slot in &bucket.0 {
                    let k = slot.key.load(Ordering::Acquire);
                    if k == key {
                        return slot;
                    }
                    if k == 0 {
                        empty[which].0.get_or_insert(slot);
                        empty[which].1 += 1;
                        continue;
                    }
                    let tat = slot.tat.load(Ordering::Relaxed);
                    if tat < victim_tat {
                        (victim, victim_key, victim_tat) = (slot, k, tat);
                    }
                }
            }
            let emptier = if empty[1].1 > empty[0].1 { empty[1].0 } else { empty[0].0 };
            if let Some(slot) = emptier {
                (victim, victim_key, victim_tat) = (slot, 0, 0);
            }
            if victim.key.compare_exchange(victim_key, key, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                if victim_key != 0 && victim_tat > now {
                    // SAFETY: the header is within the mapping.
                    unsafe { &*self.header }.evictions.fetch_add(1, Ordering::Relaxed);
                }
                // A full bucket for the new key (a TAT not after now).
                victim.tat.store(0, Ordering::Release);
                return victim;
            }
        }
        // Contended beyond reason: count against whichever slot the hash picks first.
        &first.0[0]
    }

    /// Takes a token from `key`'s bucket: `interval_ns` between tokens, at most `burst` at once, at time
    /// `now` (`now_ns()`). `key` is a hash (0 is taken as 1).
    pub fn take(&self, key: u64, now: u64, interval_ns: u64, burst: u64) -> Decision {
        let key = key.max(1);
        let interval = interval_ns.max(1);
        let tau = interval.saturating_mul(burst.max(1));
        let slot = self.slot(key, now);
        let mut tat = slot.tat.load(Ordering::Acquire);
        loop {
            let base = tat.max(now);
            let next = base.saturating_add(interval);
            let limit = now.saturating_add(tau);
            if next > limit {
                return Decision { allowed: false, remaining: 0, retry_after_ns: next - limit, full_in_ns: base - now };
            }
            match slot.tat.compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Decision {
                        allowed: true,
                        remaining: (limit - next) / interval,
                        retry_after_ns: 0,
                        full_in_ns: next - now,
                    }
                }
                Err(seen) => tat = seen,
            }
        }
    }

    /// What `take` would decide, without taking (for shadow-mode headers and tests).
    pub fn peek(&self, key: u64, now: u64, interval_ns: u64, burst: u64) -> Decision {
        let key = key.max(1);
        let interval = interval_ns.max(1);
        let tau = interval.saturating_mul(burst.max(1));
        let tat = self.find(key).map_or(0, |s| s.tat.load(Ordering::Acquire));
        let base = tat.max(now);
        let next = base.saturating_add(interval);
        let limit = now.saturating_add(tau);
        Decision {
            allowed: next <= limit,
            remaining: limit.saturating_sub(next) / interval,
            retry_after_ns: next.saturating_sub(limit),
            full_in_ns: base - now,
        }
    }
}

impl Drop for RateTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `bytes`; nothing borrows it once the table is dropped.
        unsafe { libc::munmap(self.header as *mut libc::c_void, self.bytes) };
    }
}

static TABLE: OnceLock<RateTable> = OnceLock::new();

/// The keys a table holds when the configuration says nothing (`rate_limits.max_keys`).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// At start-up, before any worker: makes the node's table (`max_keys`), or in a worker process maps its
/// master's. A second call does nothing (the table is made once per process; `max_keys` is read at start).
pub fn init(worker_process: bool, max_keys: usize) -> std::io::Result<&'static RateTable> {
    if let Some(table) = TABLE.get() {
        return Ok(table);
    }
    let table = match std::env::var(TABLE_FD_ENV).ok().and_then(|v| v.parse::<RawFd>().ok()) {
        Some(fd) if worker_process => {
            // SAFETY: the master placed the table's memory file at this descriptor; nothing else owns it.
            RateTable::attach(unsafe { OwnedFd::from_raw_fd(fd) })?
        }
        _ => RateTable::create(max_keys)?,
    };
    Ok(TABLE.get_or_init(|| table))
}

/// The node's table; made with the default size if start-up did not make one (`portico check`, tests).
pub fn global() -> Option<&'static RateTable> {
    if let Some(table) = TABLE.get() {
        return Some(table);
    }
    init(false, DEFAULT_MAX_KEYS).ok()
}

/// The table made by `init`, if any (what a master passes to its worker processes).
pub fn made() -> Option<&'static RateTable> {
    TABLE.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_gives_its_burst_then_one_token_per_interval() {
        let t = RateTable::create(64).unwrap();
        let now = 100 * SEC;
        // 10 a second, burst 3.
        let interval = SEC / 10;
        let d: Vec<Decision> = (0..4).map(|_| t.take(7, now, interval, 3)).collect();
        assert_eq!(d.iter().map(|d| d.allowed).collect::<Vec<_>>(), [true, true, true, false]);
        assert_eq!(d.iter().map(|d| d.remaining).collect::<Vec<_>>(), [2, 1, 0, 0]);
        assert_eq!(d[3].retry_after_ns, interval, "one token comes back after one interval");
        assert_eq!(d[2].full_in_ns, 3 * interval);
        // Half an interval later: still refused; a whole one later: one token.
        assert!(!t.take(7, now + interval / 2, interval, 3).allowed);
        assert!(t.take(7, now + interval, interval, 3).allowed);
        assert!(!t.take(7, now + interval, interval, 3).allowed);
        // Other keys have their own buckets.
        assert!(t.take(8, now, interval, 3).allowed);
        // Long idle: full again, but never more than the burst.
        let later = now + 60 * SEC;
        let allowed = (0..10).filter(|_| t.take(7, later, interval, 3).allowed).count();
        assert_eq!(allowed, 3);
        assert!(!t.peek(7, later, interval, 3).allowed);
        assert!(t.peek(9, later, interval, 3).allowed);
    }

    #[test]
    fn worker_threads_share_the_count() {
        let t = std::sync::Arc::new(RateTable::create(1024).unwrap());
        let now = now_ns();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..1000).filter(|_| t.take(42, now, 3600 * SEC, 100).allowed).count())
            })
            .collect();
        let allowed: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(allowed, 100, "one bucket of 100 across four threads");
    }

    #[test]
    fn a_second_mapping_sees_the_same_buckets() {
        let t = RateTable::create(1024).unwrap();
        // SAFETY: dup of a descriptor we own.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(t.fd())) };
        let other = RateTable::attach(dup).unwrap();
        assert_eq!(other.slots(), t.slots());
        let now = 5 * SEC;
        assert!(t.take(3, now, SEC, 2).allowed);
        assert!(other.take(3, now, SEC, 2).allowed);
        assert!(!t.take(3, now, SEC, 2).allowed, "the other mapping's token was taken from the same bucket");
    }

    /// A million distinct keys in the default table: its memory stays what it was made with, keys that are
    /// limited stay limited, and only a few of the million lose their state (the least limited ones).
    #[test]
    fn a_million_keys_fit_in_fixed_memory() {
        let t = RateTable::create(DEFAULT_MAX_KEYS).unwrap();
        assert_eq!(t.slots(), DEFAULT_MAX_KEYS);
        assert_eq!(t.bytes(), 128 + DEFAULT_MAX_KEYS * 16, "16 bytes a key, one header");
        let now = 1000 * SEC;
        let hash = |i: u64| xorshift(i + 1);
        // A key limited hard: one request an hour, used up.
        let hot = hash(u64::MAX - 1);
        assert!(t.take(hot, now, 3600 * SEC, 1).allowed);
        // A million other keys, one request each at one a minute, burst 10: each mid-limit afterwards.
        for i in 0..1_000_000 {
            assert!(t.take(hash(i), now, 60 * SEC, 10).allowed);
        }
        assert!(!t.take(hot, now + SEC, 3600 * SEC, 1).allowed, "the limited key was not forgotten");
        // What each key's second request would find: 8 tokens left if remembered, 9 if forgotten.
        let remembered = (0..1_000_000).filter(|&i| t.peek(hash(i), now, 60 * SEC, 10).remaining == 8).count();
        eprintln!("{remembered} of 1,000,000 keys kept their state; {} evictions", t.evictions());
        assert!(remembered > 970_000, "{remembered} of 1,000,000 keys kept their state");
        assert!(t.evictions() < 30_000, "{} evictions", t.evictions());
        // Idle keys are free to reuse: an hour later every bucket is full and new keys lose nothing.
        let evicted = t.evictions();
        let later = now + 3600 * SEC;
        for i in 0..100_000 {
            assert!(t.take(hash(i + 2_000_000), later, 60 * SEC, 10).allowed);
        }
        assert_eq!(t.evictions(), evicted, "no key mid-limit was forgotten for new ones");
    }

    fn xorshift(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
        x ^ (x >> 33)
    }
}
