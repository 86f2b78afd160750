//! A worker's idle keep-alive connections, longest-idle first. At the connection limit the worker closes the
//! longest-idle one to make room for a new client, as nginx reuses connections, instead of leaving new
//! clients in the kernel's queue while idle ones hold every place. One worker's connections only: no lock.
//!
//! A doubly linked list threaded through a slab: entering and leaving are O(1) and allocate only when the
//! slab grows, because a keep-alive connection enters the list between every two requests.

use slab::Slab;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};
use tokio::sync::Notify;

#[derive(Default)]
pub struct IdleConnections {
    inner: RefCell<List>,
    /// The accept loop waits for a connection to go idle (it is at the limit with none idle).
    watched: Cell<bool>,
    entered: Notify,
}

#[derive(Default)]
struct List {
    entries: Slab<Entry>,
    /// The longest idle, and the most recently idle.
    head: Option<usize>,
    tail: Option<usize>,
}

struct Entry {
    prev: Option<usize>,
    next: Option<usize>,
    /// Closed to make room: no longer linked.
    evicted: bool,
    waker: Option<Waker>,
}

/// A connection's place in the list while it is idle; it leaves the list when dropped.
pub struct IdleTicket<'a> {
    list: &'a IdleConnections,
    key: usize,
}

impl IdleConnections {
    /// The connection goes idle: it joins the end of the list.
    pub fn enter(&self) -> IdleTicket<'_> {
        let mut list = self.inner.borrow_mut();
        let tail = list.tail;
        let key = list.entries.insert(Entry { prev: tail, next: None, evicted: false, waker: None });
        match tail {
            Some(t) => list.entries[t].next = Some(key),
            None => list.head = Some(key),
        }
        list.tail = Some(key);
        if self.watched.replace(false) {
            self.entered.notify_waiters();
        }
        IdleTicket { list: self, key }
    }

    /// Resolves when a connection goes idle.
    pub async fn entered(&self) {
        let entered = self.entered.notified();
        self.watched.set(true);
        entered.await;
    }

    /// Tells the longest-idle connection to close; false when none is idle.
    pub fn evict_oldest(&self) -> bool {
        let mut list = self.inner.borrow_mut();
        let Some(key) = list.head else { return false };
        list.unlink(key);
        let entry = &mut list.entries[key];
        entry.evicted = true;
        if let Some(waker) = entry.waker.take() {
            waker.wake();
        }
        true
    }

    /// Connections idle now.
    pub fn len(&self) -> usize {
        let list = self.inner.borrow();
        list.entries.len() - list.entries.iter().filter(|(_, e)| e.evicted).count()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.borrow().head.is_none()
    }
}

impl List {
    fn unlink(&mut self, key: usize) {
        let (prev, next) = (self.entries[key].prev, self.entries[key].next);
        match prev {
            Some(p) => self.entries[p].next = next,
            None => self.head = next,
        }
        match next {
            Some(n) => self.entries[n].prev = prev,
            None => self.tail = prev,
        }
    }
}

impl IdleTicket<'_> {
    /// Resolves when the worker needs this connection's place: the connection should close.
    pub async fn evicted(&self) {
        poll_fn(|cx| self.poll_evicted(cx)).await
    }

    /// `evicted` for a hand-written poll loop.
    pub fn poll_evicted(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut list = self.list.inner.borrow_mut();
        let entry = &mut list.entries[self.key];
        if entry.evicted {
            return Poll::Ready(());
        }
        match &mut entry.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for IdleTicket<'_> {
    fn drop(&mut self) {
        let mut list = self.list.inner.borrow_mut();
        if !list.entries[self.key].evicted {
            list.unlink(self.key);
        }
        list.entries.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn the_longest_idle_is_evicted_first_and_leaving_unlinks() {
        let idle = IdleConnections::default();
        let a = idle.enter();
        let b = idle.enter();
        let c = idle.enter();
        drop(b);
        assert_eq!(idle.len(), 2);
        assert!(idle.evict_oldest());
        assert!(a.evicted().now_or_never().is_some(), "the oldest goes first");
        assert!(c.evicted().now_or_never().is_none());
        let d = idle.enter();
        assert!(idle.evict_oldest());
        assert!(c.evicted().now_or_never().is_some());
        assert!(d.evicted().now_or_never().is_none());
        drop(a);
        drop(c);
        assert_eq!(idle.len(), 1);
        drop(d);
        assert!(idle.is_empty() && !idle.evict_oldest());
    }
}
