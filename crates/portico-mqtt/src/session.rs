//! A session (specification 4.1): what the broker keeps for a client id between and across its connections.
//!
//! Outbound, one queue per session holds every message the client is owed, in the order the broker routed
//! them (ordered delivery per topic, 4.6): a prefix of it has been sent and waits for PUBACK, PUBREC or
//! PUBCOMP (the in-flight window, at most the client's Receive Maximum), the rest waits its turn (the offline
//! queue, bounded by [`Limits::max_queued_messages`]). A QoS 1 or 2 message gets its Packet Identifier when it
//! is queued, so it keeps the identifier across a reconnection and a restart of the broker [MQTT-4.4.0-1].
//! On a new connection to the session the whole sent prefix is sent again: PUBLISH with DUP set
//! [MQTT-3.3.1-1], or PUBREL for a QoS 2 message the client has PUBRECed.
//!
//! Inbound, the session remembers the QoS 2 Packet Identifiers it has PUBRECed and not yet seen PUBREL for, so
//! a PUBLISH sent again with one of them is acknowledged and not routed twice (4.3.3, method A).
//!
//! The state sits behind a mutex per session: the connection serving the session and publishers on other
//! workers delivering to it are the only ones who take it, each for a few pointer moves. A delivery wakes
//! the connection through its [`Attachment::wake`] (the task's waker); that queue plus the wake-up is the hand-off between
//! workers, one per destination session.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};
use std::time::Instant;

use bytestring::ByteString;

use crate::codec::{PacketId, ProtocolVersion, Publish, QoS, SubscriptionId, SubscriptionOptions};
use crate::config::Limits;
use crate::message::Message;
use crate::router::{FxHasher, Subscriber};
use crate::store::{Store, StoreOp, StoredMessage};

/// Packet Identifiers: a hasher with no per-set keys (a `RandomState` is 16 bytes in every session, and
/// identifiers are the broker's own or bounded by the client's window).
pub type IdSet = HashSet<u16, BuildHasherDefault<FxHasher>>;

/// A message owed to one subscriber.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub message: Arc<Message>,
    /// The message's QoS downgraded to the subscription's maximum (3.8.4).
    pub qos: QoS,
    /// The RETAIN flag to send: set for retained messages sent on subscribe, the published flag with Retain
    /// As Published, otherwise clear [MQTT-3.3.1-9], [MQTT-3.3.1-12].
    pub retain: bool,
    pub subscription_ids: Vec<SubscriptionId>,
}

#[derive(Debug)]
struct Entry {
    out: Outgoing,
    /// Present for QoS 1 and 2.
    packet_id: Option<PacketId>,
    /// The store's key for it, when the session is persistent and the message QoS 1 or 2.
    seq: Option<u64>,
    /// PUBREC received: PUBREL is what is owed now.
    released: bool,
    /// It has been sent before (set on redelivery).
    dup: bool,
}

/// What a connection sends for the session. Not boxed: it lives for a moment in a reused `Vec`, and a box
/// would cost an allocation per message sent.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Outbound {
    Publish(Publish),
    PubRel(PacketId),
}

/// A subscription the session holds, as the router and the store know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriptionRecord {
    pub options: SubscriptionOptions,
    pub id: Option<SubscriptionId>,
}

/// A session's subscriptions by filter. One is kept in the session itself, a few in a vector (most clients
/// hold one or a handful; a B-tree's first node is 456 bytes), more in a B-tree. Filters are copied (not
/// slices of the SUBSCRIBE's read buffer, which they would keep alive).
#[derive(Debug)]
pub enum Subscriptions {
    Few(Vec<(Box<str>, SubscriptionRecord)>),
    One(Box<str>, SubscriptionRecord),
    Many(BTreeMap<Box<str>, SubscriptionRecord>),
}

impl Default for Subscriptions {
    fn default() -> Self {
        Subscriptions::Few(Vec::new())
    }
}

impl Subscriptions {
    const FEW: usize = 16;

    /// Adds or replaces the subscription to `filter`; returns the one it replaced.
    pub fn insert(&mut self, filter: &str, record: SubscriptionRecord) -> Option<SubscriptionRecord> {
        match self {
            Subscriptions::One(existing, old) if **existing == *filter => Some(std::mem::replace(old, record)),
            Subscriptions::One(..) => {
                let Subscriptions::One(first, first_record) = std::mem::take(self) else { return None };
                *self = Subscriptions::Few(vec![(first, first_record), (filter.into(), record)]);
                None
            }
            Subscriptions::Few(few) => {
                if let Some((_, existing)) = few.iter_mut().find(|(f, _)| **f == *filter) {
                    return Some(std::mem::replace(existing, record));
                }
                if few.is_empty() {
                    *self = Subscriptions::One(filter.into(), record);
                } else if few.len() < Self::FEW {
                    if few.len() == few.capacity() {
                        few.reserve_exact(few.len()); // doubling, from the two `One` grows into
                    }
                    few.push((filter.into(), record));
                } else {
                    let mut many: BTreeMap<_, _> = std::mem::take(few).into_iter().collect();
                    many.insert(filter.into(), record);
                    *self = Subscriptions::Many(many);
                }
                None
            }
            Subscriptions::Many(many) => match many.get_mut(filter) {
                Some(existing) => Some(std::mem::replace(existing, record)),
                None => many.insert(filter.into(), record),
            },
        }
    }

    pub fn remove(&mut self, filter: &str) -> Option<SubscriptionRecord> {
        match self {
            Subscriptions::One(existing, _) if **existing == *filter => match std::mem::take(self) {
                Subscriptions::One(_, record) => Some(record),
                _ => None,
            },
            Subscriptions::One(..) => None,
            Subscriptions::Few(few) => {
                let index = few.iter().position(|(f, _)| **f == *filter)?;
                Some(few.swap_remove(index).1)
            }
            Subscriptions::Many(many) => many.remove(filter),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &SubscriptionRecord)> {
        let (one, few, many) = match self {
            Subscriptions::One(filter, record) => (Some((&**filter, record)), None, None),
            Subscriptions::Few(few) => (None, Some(few.iter().map(|(f, r)| (&**f, r))), None),
            Subscriptions::Many(many) => (None, None, Some(many.iter().map(|(f, r)| (&**f, r)))),
        };
        one.into_iter().chain(few.into_iter().flatten()).chain(many.into_iter().flatten())
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(filter, _)| filter)
    }

    pub fn len(&self) -> usize {
        match self {
            Subscriptions::One(..) => 1,
            Subscriptions::Few(few) => few.len(),
            Subscriptions::Many(many) => many.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The connection a session is attached to, and how it is woken: its task's waker, registered when it
/// waits (a `Notify` would cost the session an allocation and the waiting connection a waiter of 64 bytes).
#[derive(Debug)]
pub struct Attachment {
    pub connection: u64,
    waker: Option<Waker>,
    /// Set by a wake-up until the connection looks at the session: wake-ups in between cost a test.
    woken: bool,
}

impl Attachment {
    pub fn new(connection: u64) -> Attachment {
        Attachment { connection, waker: None, woken: false }
    }

    /// Wakes the connection: a message is queued (or the broker drains).
    pub fn wake(&mut self) {
        if !self.woken {
            self.woken = true;
            if let Some(waker) = &self.waker {
                waker.wake_by_ref();
            }
        }
    }

    /// Wakes the connection whose attachment this was (the session was taken over, or ended): it finds
    /// another attachment, or none, in the session.
    pub fn detached(self) {
        if let Some(waker) = self.waker {
            waker.wake();
        }
    }

    /// Whether the connection was woken since it last looked; if not, `cx`'s task is woken next time.
    pub fn poll_woken(&mut self, cx: &Context<'_>) -> bool {
        if std::mem::take(&mut self.woken) {
            return true;
        }
        if !self.waker.as_ref().is_some_and(|waker| waker.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        false
    }

    /// The connection is about to take everything queued: wake-ups so far are answered.
    pub fn clear_woken(&mut self) {
        self.woken = false;
    }
}

/// Why a delivery was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// QoS 0 to an offline session that does not queue QoS 0.
    Offline,
    /// The queue is full (or all 65,535 Packet Identifiers are taken).
    QueueFull,
    /// The session has ended.
    Gone,
}

/// The mutable part of a session.
#[derive(Debug)]
pub struct SessionState {
    pub attachment: Option<Attachment>,
    /// Bumped by every attachment: a timer set while the session was offline (will delay, expiry) is void
    /// once a connection has come and gone since.
    pub generation: u32,
    /// Session Expiry Interval in seconds; 0: the session ends with its connection.
    pub expiry: u32,
    pub version: ProtocolVersion,
    pub subscriptions: Subscriptions,
    /// QoS 2 Packet Identifiers PUBRECed, waiting for PUBREL.
    pub inbound_qos2: IdSet,
    /// The session has ended (expired, cleaned, taken over by a clean start): deliveries are refused.
    pub ended: bool,
    entries: VecDeque<Entry>,
    /// The number of leading entries sent and unacknowledged (`u32`: with `generation`, a session fits a
    /// 256-byte allocation).
    sent: u32,
    packet_ids: IdSet,
    next_packet_id: u16,
}

impl SessionState {
    fn new(version: ProtocolVersion, expiry: u32) -> Self {
        SessionState {
            attachment: None,
            generation: 0,
            expiry,
            version,
            subscriptions: Subscriptions::default(),
            inbound_qos2: IdSet::default(),
            ended: false,
            entries: VecDeque::new(),
            sent: 0,
            packet_ids: IdSet::default(),
            next_packet_id: 1,
        }
    }

    /// Whether the session outlives its connection, and so is persisted.
    pub fn is_persistent(&self) -> bool {
        self.expiry > 0
    }

    /// Messages sent and waiting for their acknowledgement.
    pub fn inflight(&self) -> usize {
        self.sent as usize
    }

    /// Whether anything is owed to the client beyond what is in flight (see [`SessionState::take_outbound`]).
    pub fn has_outbound(&self) -> bool {
        (self.sent as usize) < self.entries.len()
    }

    /// Messages waiting to be sent.
    pub fn queued(&self) -> usize {
        self.entries.len() - self.sent as usize
    }

    fn allocate_packet_id(&mut self) -> Option<PacketId> {
        if self.packet_ids.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if let Some(id) = PacketId::new(id) {
                if self.packet_ids.insert(id.get()) {
                    return Some(id);
                }
            }
        }
    }

    /// Makes the whole sent prefix unsent again, to be sent again with DUP on the new connection.
    pub fn prepare_redelivery(&mut self) {
        for entry in self.entries.iter_mut().take(self.sent as usize) {
            entry.dup = true;
        }
        self.sent = 0;
    }

    /// Takes the next packets to send, as many as the in-flight window (`window`: the client's Receive
    /// Maximum and the broker's own limit) allows, in queue order. Expired messages are dropped on the way
    /// (3.3.2.3.3).
    pub fn take_outbound(
        &mut self,
        window: usize,
        client_id: &ByteString,
        store: Option<&Store>,
        out: &mut Vec<Outbound>,
    ) {
        let now = Instant::now();
        while (self.sent as usize) < self.entries.len() {
            let index = self.sent as usize;
            let entry = &self.entries[index];
            if entry.out.qos != QoS::AtMostOnce && self.sent as usize >= window {
                break;
            }
            if entry.released {
                if let Some(id) = entry.packet_id {
                    out.push(Outbound::PubRel(id));
                }
                self.sent += 1;
                continue;
            }
            if entry.out.message.is_expired(now) {
                self.remove_at(index, client_id, store);
                continue;
            }
            let message = &entry.out.message;
            let mut properties = message.properties.clone();
            properties.message_expiry_interval = message.expiry_remaining(now);
            properties.subscription_identifiers.clone_from(&entry.out.subscription_ids);
            out.push(Outbound::Publish(Publish {
                dup: entry.dup && entry.out.qos != QoS::AtMostOnce,
                qos: entry.out.qos,
                retain: entry.out.retain,
                topic: message.topic.clone(),
                packet_id: entry.packet_id,
                properties,
                payload: message.payload.clone(),
            }));
            if entry.out.qos == QoS::AtMostOnce {
                self.entries.remove(index);
            } else {
                self.sent += 1;
            }
        }
    }

    fn find_sent(&self, id: PacketId) -> Option<usize> {
        self.entries.iter().take(self.sent as usize).position(|entry| entry.packet_id == Some(id))
    }

    fn remove_at(&mut self, index: usize, client_id: &ByteString, store: Option<&Store>) {
        let Some(entry) = self.entries.remove(index) else { return };
        if index < self.sent as usize {
            self.sent -= 1;
        }
        if let Some(id) = entry.packet_id {
            self.packet_ids.remove(&id.get());
        }
        if let (Some(seq), Some(store)) = (entry.seq, store) {
            store.submit(StoreOp::DeleteMessage { client_id: client_id.clone(), seq });
        }
    }

    /// PUBACK for `id`: the QoS 1 message is delivered. `false` when no such message is in flight.
    pub fn puback(&mut self, id: PacketId, client_id: &ByteString, store: Option<&Store>) -> bool {
        match self.find_sent(id) {
            Some(index) if self.entries[index].out.qos == QoS::AtLeastOnce => {
                self.remove_at(index, client_id, store);
                true
            }
            _ => false,
        }
    }

    /// PUBREC for `id`: PUBREL is owed now. `false` when no such QoS 2 message is in flight (the
    /// connection answers PUBREL with Packet Identifier not found in v5).
    pub fn pubrec(&mut self, id: PacketId, client_id: &ByteString, store: Option<&Store>) -> bool {
        let Some(index) = self.find_sent(id) else { return false };
        let entry = &mut self.entries[index];
        if entry.out.qos != QoS::ExactlyOnce {
            return false;
        }
        if !entry.released {
            entry.released = true;
            if let (Some(seq), Some(store)) = (entry.seq, store) {
                store.submit(StoreOp::SetReleased { client_id: client_id.clone(), seq });
            }
        }
        true
    }

    /// PUBREC with a failure reason (v5): the message is not delivered and nothing more is owed (4.3.3).
    pub fn pubrec_failed(&mut self, id: PacketId, client_id: &ByteString, store: Option<&Store>) {
        if let Some(index) = self.find_sent(id) {
            self.remove_at(index, client_id, store);
        }
    }

    /// PUBCOMP for `id`: the QoS 2 exchange is over.
    pub fn pubcomp(&mut self, id: PacketId, client_id: &ByteString, store: Option<&Store>) -> bool {
        match self.find_sent(id) {
            Some(index) if self.entries[index].released => {
                self.remove_at(index, client_id, store);
                true
            }
            _ => false,
        }
    }

    /// Drops a message the client cannot take (over its Maximum Packet Size [MQTT-3.1.2-25]): as if acked.
    pub fn discard(&mut self, id: PacketId, client_id: &ByteString, store: Option<&Store>) {
        if let Some(index) = self.find_sent(id) {
            self.remove_at(index, client_id, store);
        }
    }
}

/// A session, shared by the connection serving it, the router's entries and the broker's table.
#[derive(Debug)]
pub struct Session {
    key: u64,
    client_id: ByteString,
    online: AtomicBool,
    state: Mutex<SessionState>,
}

impl Session {
    pub fn new(key: u64, client_id: ByteString, version: ProtocolVersion, expiry: u32) -> Session {
        Session {
            key,
            client_id,
            online: AtomicBool::new(false),
            state: Mutex::new(SessionState::new(version, expiry)),
        }
    }

    pub fn key(&self) -> u64 {
        self.key
    }

    pub fn client_id(&self) -> &ByteString {
        &self.client_id
    }

    pub fn is_online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }

    pub fn set_online(&self, online: bool) {
        self.online.store(online, Ordering::Relaxed);
    }

    /// The state, locked. A poisoned lock (a panic while it was held) is taken as it is: the state is a queue
    /// and counters, each change of which is complete before any call that could panic.
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `out` for the client and wakes its connection. A QoS 1 or 2 message to a persistent session is
    /// handed to the store here, under the session's lock, so that an acknowledgement's delete can never
    /// reach the store before the message's write.
    pub fn deliver(&self, out: Outgoing, limits: &Limits, store: Option<&Store>) -> Result<(), Dropped> {
        let mut state = self.lock();
        if state.ended {
            return Err(Dropped::Gone);
        }
        let online = state.attachment.is_some();
        if out.qos == QoS::AtMostOnce && !online && !limits.queue_qos0_offline {
            return Err(Dropped::Offline);
        }
        if state.queued() >= limits.max_queued_messages {
            // Make room by dropping the oldest queued QoS 0 message, if there is one and this one is not QoS 0.
            let sent = state.sent as usize;
            let oldest_qos0 = (out.qos != QoS::AtMostOnce)
                .then(|| state.entries.iter().skip(sent).position(|e| e.out.qos == QoS::AtMostOnce))
                .flatten();
            match oldest_qos0 {
                Some(offset) => {
                    state.entries.remove(sent + offset);
                }
                None => return Err(Dropped::QueueFull),
            }
        }
        let packet_id =
            if out.qos == QoS::AtMostOnce { None } else { Some(state.allocate_packet_id().ok_or(Dropped::QueueFull)?) };
        let seq = match (store, packet_id) {
            (Some(store), Some(packet_id)) if state.is_persistent() => {
                let seq = store.next_seq();
                store.submit(StoreOp::PutMessage {
                    client_id: self.client_id.clone(),
                    seq,
                    stored: StoredMessage {
                        packet_id: packet_id.get(),
                        qos: out.qos,
                        retain: out.retain,
                        subscription_ids: out.subscription_ids.clone(),
                        released: false,
                        message: out.message.clone(),
                    },
                });
                Some(seq)
            }
            _ => None,
        };
        state.entries.push_back(Entry { out, packet_id, seq, released: false, dup: false });
        if let Some(attachment) = &mut state.attachment {
            attachment.wake();
        }
        Ok(())
    }

    /// Puts back a message loaded from the store, in the order of its store key.
    pub fn restore(&self, seq: u64, stored: StoredMessage) {
        let mut state = self.lock();
        let packet_id = PacketId::new(stored.packet_id);
        if let Some(id) = packet_id {
            state.packet_ids.insert(id.get());
        }
        let out = Outgoing {
            message: stored.message,
            qos: stored.qos,
            retain: stored.retain,
            subscription_ids: stored.subscription_ids,
        };
        // Sent or not before the restart is unknown: DUP says "may have been sent before" (3.3.1.1).
        state.entries.push_back(Entry { out, packet_id, seq: Some(seq), released: stored.released, dup: true });
    }
}

/// A shared handle on a session: what the router holds for each subscription.
#[derive(Clone, Debug)]
pub struct SessionRef(pub Arc<Session>);

impl std::ops::Deref for SessionRef {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.0
    }
}

impl Subscriber for SessionRef {
    fn key(&self) -> u64 {
        self.0.key
    }
    fn is_online(&self) -> bool {
        self.0.is_online()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn out(qos: QoS, n: u8) -> Outgoing {
        Outgoing {
            message: Arc::new(Message::new("t".into(), Bytes::from(vec![n]), qos, false)),
            qos,
            retain: false,
            subscription_ids: Vec::new(),
        }
    }

    fn session() -> Session {
        let session = Session::new(1, "c".into(), ProtocolVersion::V5, 60);
        session.lock().attachment = Some(Attachment::new(1));
        session
    }

    fn payloads(packets: &[Outbound]) -> Vec<u8> {
        packets
            .iter()
            .map(|p| match p {
                Outbound::Publish(p) => p.payload[0],
                Outbound::PubRel(id) => 100 + id.get() as u8,
            })
            .collect()
    }

    #[test]
    fn the_inflight_window_holds_back_qos1_but_keeps_order() {
        let s = session();
        let limits = Limits::default();
        for n in 0..4 {
            s.deliver(out(QoS::AtLeastOnce, n), &limits, None).unwrap();
        }
        let mut packets = Vec::new();
        let cid = s.client_id().clone();
        s.lock().take_outbound(2, &cid, None, &mut packets);
        assert_eq!(payloads(&packets), [0, 1]);
        packets.clear();
        s.lock().take_outbound(2, &cid, None, &mut packets);
        assert!(packets.is_empty(), "window full");
        assert!(s.lock().puback(PacketId::new(1).unwrap(), &cid, None));
        s.lock().take_outbound(2, &cid, None, &mut packets);
        assert_eq!(payloads(&packets), [2]);
    }

    #[test]
    fn redelivery_resends_unacknowledged_messages_with_dup_and_pubrel_for_released_ones() {
        let s = session();
        let limits = Limits::default();
        let cid = s.client_id().clone();
        s.deliver(out(QoS::ExactlyOnce, 0), &limits, None).unwrap();
        s.deliver(out(QoS::AtLeastOnce, 1), &limits, None).unwrap();
        let mut packets = Vec::new();
        s.lock().take_outbound(10, &cid, None, &mut packets);
        assert!(s.lock().pubrec(PacketId::new(1).unwrap(), &cid, None));
        s.lock().prepare_redelivery();
        packets.clear();
        s.lock().take_outbound(10, &cid, None, &mut packets);
        assert!(matches!(packets[0], Outbound::PubRel(id) if id.get() == 1));
        match &packets[1] {
            Outbound::Publish(p) => assert!(p.dup && p.packet_id.unwrap().get() == 2),
            other => panic!("{other:?}"),
        }
        assert!(s.lock().pubcomp(PacketId::new(1).unwrap(), &cid, None));
        assert!(!s.lock().pubcomp(PacketId::new(1).unwrap(), &cid, None));
    }

    #[test]
    fn a_full_queue_drops_qos0_first() {
        let s = session();
        let limits = Limits { max_queued_messages: 2, ..Limits::default() };
        s.deliver(out(QoS::AtMostOnce, 0), &limits, None).unwrap();
        s.deliver(out(QoS::AtLeastOnce, 1), &limits, None).unwrap();
        assert_eq!(s.deliver(out(QoS::AtMostOnce, 2), &limits, None), Err(Dropped::QueueFull));
        s.deliver(out(QoS::AtLeastOnce, 3), &limits, None).unwrap();
        assert_eq!(s.deliver(out(QoS::AtLeastOnce, 4), &limits, None), Err(Dropped::QueueFull));
        let mut packets = Vec::new();
        s.lock().take_outbound(10, &s.client_id().clone(), None, &mut packets);
        assert_eq!(payloads(&packets), [1, 3]);
    }

    #[test]
    fn packet_ids_are_unique_while_in_use() {
        let s = session();
        let limits = Limits { max_queued_messages: 70_000, ..Limits::default() };
        for _ in 0..u16::MAX {
            s.deliver(out(QoS::AtLeastOnce, 0), &limits, None).unwrap();
        }
        assert_eq!(s.deliver(out(QoS::AtLeastOnce, 0), &limits, None), Err(Dropped::QueueFull));
    }
}
