//! The broker's counters, one slot per worker so that no cache line is written by two cores per message;
//! a scrape adds the slots up. Gauges that are a size (sessions, subscriptions, retained messages, queued
//! and in-flight messages) are read from the structures at scrape time instead of being counted.

use std::sync::atomic::{AtomicI64, Ordering};

/// A counter (or, for `Connections`, a gauge kept by increments and decrements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    ConnectionsAccepted,
    /// Connections that completed CONNECT and are still open.
    Connections,
    ConnectRefused,
    ReceivedQos0,
    ReceivedQos1,
    ReceivedQos2,
    SentQos0,
    SentQos1,
    SentQos2,
    DroppedQueueFull,
    DroppedOffline,
    DroppedTooLarge,
    ProtocolErrors,
    KeepAliveTimeouts,
    TakenOver,
    WillsPublished,
    /// CONNECTs refused for a bad user name or password, or missing credentials.
    AuthFailures,
    /// PUBLISHes refused by the ACL.
    AclDeniedPublish,
    /// Subscriptions refused by the ACL.
    AclDeniedSubscribe,
    /// MQTT packets of every type, and their bytes (for `$SYS`).
    PacketsReceived,
    PacketsSent,
    BytesReceived,
    BytesSent,
    /// CONNECTs accepted.
    Connects,
    /// Connections parked while idle (a gauge: see [`crate::park`]).
    Parked,
    /// Persistent sessions that expired while their client was away.
    SessionsExpired,
}

const COUNTERS: usize = Counter::SessionsExpired as usize + 1;

#[repr(align(128))]
#[derive(Debug)]
struct Slot([AtomicI64; COUNTERS]);

/// Per-worker counters.
#[derive(Debug)]
pub struct Metrics {
    slots: Box<[Slot]>,
}

impl Metrics {
    pub fn new(workers: usize) -> Metrics {
        Metrics { slots: (0..workers.max(1)).map(|_| Slot(std::array::from_fn(|_| AtomicI64::new(0)))).collect() }
    }

    pub fn add(&self, worker: usize, counter: Counter, n: i64) {
        self.slots[worker % self.slots.len()].0[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn inc(&self, worker: usize, counter: Counter) {
        self.add(worker, counter, 1);
    }

    pub fn get(&self, counter: Counter) -> i64 {
        self.slots.iter().map(|slot| slot.0[counter as usize].load(Ordering::Relaxed)).sum()
    }
}
