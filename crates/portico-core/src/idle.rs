//! A worker's idle keep-alive connections, longest-idle first. At the connection limit the worker closes the
//! longest-idle one to make room for a new client, as nginx reuses connections, instead of leaving new
//! clients in the kernel's queue while idle ones hold every place. One worker's connections only: no lock.
//!
//! A doubly linked list threaded through a slab: entering and leaving are O(1) and allocate only when the
//! slab grows, because a keep-alive connection enters the list between every two requests.
//!
//! The same tickets tell waiting connections that the worker shuts down (`shut_down`): a new connection
//! waiting for its first request takes one too (`enter_new`), not linked, so never closed to make room. This
//! replaces a wait on the shutdown `watch` channel per request (its waiter list takes a lock and atomics on
//! every wait); this list is the worker's own.

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
    /// The worker shuts down: every ticket, present and future, is told to close.
    shutting_down: Cell<bool>,
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
    /// Closed to make room (no longer linked), or the worker shuts down.
    evicted: bool,
    /// In the list (a kept-alive connection); a new connection's entry is not.
    linked: bool,
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
        if self.shutting_down.get() {
            let key = list.entries.insert(Entry { prev: None, next: None, evicted: true, linked: false, waker: None });
            return IdleTicket { list: self, key };
        }
        let tail = list.tail;
        let key = list.entries.insert(Entry { prev: tail, next: None, evicted: false, linked: true, waker: None });
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

    /// A new connection waits for its first request: not a candidate for closing to make room, but told of
    /// the shutdown like any (its ticket's `evicted` resolves then).
    pub fn enter_new(&self) -> IdleTicket<'_> {
        let evicted = self.shutting_down.get();
        let entry = Entry { prev: None, next: None, evicted, linked: false, waker: None };
        IdleTicket { list: self, key: self.inner.borrow_mut().entries.insert(entry) }
    }

    /// The worker shuts down: every waiting ticket's `evicted` resolves, and those entered later are evicted
    /// from the start.
    pub fn shut_down(&self) {
        self.shutting_down.set(true);
        let mut list = self.inner.borrow_mut();
        list.head = None;
        list.tail = None;
        for (_, entry) in list.entries.iter_mut() {
            entry.evicted = true;
            entry.linked = false;
            if let Some(waker) = entry.waker.take() {
                waker.wake();
            }
        }
    }

    /// Whether `shut_down` was called.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.get()
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
        entry.linked = false;
        if let Some(waker) = entry.waker.take() {
            waker.wake();
        }
        true
    }

    /// Connections idle now.
    pub fn len(&self) -> usize {
        let list = self.inner.borrow();
        list.entries.iter().filter(|(_, e)| e.linked).count()
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
        if list.entries[self.key].linked {
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

    #[test]
    fn a_shutdown_tells_every_ticket_new_connections_included_and_later_ones_at_once() {
        let idle = IdleConnections::default();
        let kept = idle.enter();
        let new = idle.enter_new();
        assert_eq!(idle.len(), 1, "a new connection is not in the list");
        assert!(idle.evict_oldest());
        assert!(kept.evicted().now_or_never().is_some());
        assert!(!idle.evict_oldest(), "a new connection is not closed to make room");
        assert!(new.evicted().now_or_never().is_none());
        let other = idle.enter();
        idle.shut_down();
        assert!(new.evicted().now_or_never().is_some() && other.evicted().now_or_never().is_some());
        assert!(idle.enter().evicted().now_or_never().is_some());
        assert!(idle.enter_new().evicted().now_or_never().is_some());
        drop((kept, new, other));
        assert!(idle.is_empty());
        assert_eq!(idle.len(), 0);
    }
}
