//! Primitives for state shared between worker threads: a value alone on its cache line (so per-worker slots
//! written by different threads never share one) and a cheap clock for deadlines kept in atomics.

use std::sync::OnceLock;
use std::time::Instant;

/// A value alone on its cache line, so per-worker slots written by different threads never share one.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// Milliseconds since the process started: a cheap clock for health deadlines stored in atomics.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}
