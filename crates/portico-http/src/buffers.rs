//! A worker thread's spare I/O buffers. Connections give their buffers back between requests, so an idle
//! keep-alive connection holds none, and take one again when the next request arrives: with this cache that
//! costs no allocation (a 16 KiB malloc and free per request and side showed in profiles).

use bytes::BytesMut;
use std::cell::RefCell;

/// Buffers kept per thread: enough for the requests in flight at once on one worker, 1 MiB at most.
const MAX_CACHED: usize = 64;
/// Larger buffers (grown by a big head or body) are freed, not cached.
const MAX_CACHED_CAPACITY: usize = 64 * 1024;

thread_local! {
    static SPARE_BYTES: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static SPARE_VECS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Makes room for at least `additional` more bytes in `buf`, starting from a cached buffer when it has none.
pub(crate) fn reserve(buf: &mut BytesMut, additional: usize) {
    if buf.capacity() == 0 {
        if let Some(spare) = SPARE_BYTES.with(|s| s.borrow_mut().pop()) {
            *buf = spare;
        }
    }
    // A cached buffer is empty; if the bytes it once held are no longer referenced, this reuses its memory.
    buf.reserve(additional);
}

/// Takes `buf`'s memory for the cache (leaving it empty, holding nothing). Only for an empty buffer.
pub(crate) fn give_back(buf: &mut BytesMut) {
    let taken = std::mem::take(buf);
    if taken.is_empty() && taken.capacity() > 0 && taken.capacity() <= MAX_CACHED_CAPACITY {
        SPARE_BYTES.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < MAX_CACHED {
                spare.push(taken);
            }
        });
    }
}

/// A cleared output vector with room for `additional` bytes, from the cache when `out` has none.
pub(crate) fn reserve_vec(out: &mut Vec<u8>, additional: usize) {
    if out.capacity() == 0 {
        if let Some(spare) = SPARE_VECS.with(|s| s.borrow_mut().pop()) {
            *out = spare;
        }
    }
    out.reserve(additional);
}

/// Takes `out`'s memory for the cache, leaving it empty.
pub(crate) fn give_back_vec(out: &mut Vec<u8>) {
    let mut taken = std::mem::take(out);
    if taken.capacity() > 0 && taken.capacity() <= MAX_CACHED_CAPACITY {
        taken.clear();
        SPARE_VECS.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < MAX_CACHED {
                spare.push(taken);
            }
        });
    }
}
