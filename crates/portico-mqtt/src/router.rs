//! The subscription table: which subscribers a PUBLISH's topic name reaches.
//!
//! A trie with one level of the filter per edge (`+` and `#` are edges like any other level); matching walks
//! the literal edge, the `+` edge and the `#` edge at each level of the name, so its cost grows with the
//! name's depth and the number of wildcard branches, not with the number of subscriptions. Shared
//! subscriptions (`$share/group/filter`, 4.8.2) sit at the node of their filter as a group; each matching
//! group yields one member per message.
//!
//! # Concurrency: one `RwLock` around the whole trie
//!
//! Every PUBLISH, on every worker, matches; SUBSCRIBE and UNSUBSCRIBE change the table and are rarer by
//! orders of magnitude. Matching takes the lock shared, so publishers on different cores never exclude one
//! another; only a (un)subscribe takes it exclusively, for the time of one insertion. The alternatives, and
//! why not:
//!
//! - **An `arc-swap`ped immutable trie** rebuilt per change: reads lose one atomic increment, but a subscribe
//!   costs a copy of the table (100,000 subscriptions: milliseconds per SUBSCRIBE), or path copying with
//!   shared children (a persistent map per node) that makes every read slower.
//! - **A lock per node** (the seed's "optimized" router): 38% slower reads for several lock acquisitions.
//! - **Lock-free CAS updates**: no faster for reads and 45x slower under concurrent writes (the seed's log).
//!
//! The shared lock's cost is one atomic add and subtract on a shared cache line per publish; the micro-benchmark
//! (`router::tests::bench_matches_per_second`, `cargo test --release -p portico-mqtt bench_ -- --ignored
//! --nocapture`) measures it with 100,000 subscriptions. If it ever shows, the next step is sharding the trie by
//! the first level of the filter (filters starting with a wildcard in every shard), not a new structure.
//!
//! # Shared subscriptions: round-robin, preferring connected members
//!
//! Each group keeps a counter; a message goes to the next member in turn that is online
//! ([`Subscriber::is_online`]); when none is, to the next member in turn (its session queues the message).
//! Round-robin needs no per-member load figure kept up to date by every delivery and ack on other cores; a
//! slow member's session queue is bounded ([`crate::config::Limits::max_queued_messages`]) like any other.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use crate::codec::{QoS, SubscriptionId, SubscriptionOptions};
use crate::topic::FilterRef;

/// What the router holds for a subscriber: something cheap to clone (an `Arc`) with a stable identity.
pub trait Subscriber: Clone {
    /// The subscriber's identity: subscriptions with the same key are the same subscriber's.
    fn key(&self) -> u64;
    /// Whether the subscriber is connected; shared groups prefer connected members.
    fn is_online(&self) -> bool {
        true
    }
}

/// One subscription in the table.
#[derive(Clone, Debug)]
pub struct Entry<S> {
    pub subscriber: S,
    pub options: SubscriptionOptions,
    pub id: Option<SubscriptionId>,
}

/// One subscriber a message goes to, with what its matching subscriptions ask for.
#[derive(Clone, Debug)]
pub struct Route<S> {
    pub subscriber: S,
    /// The highest maximum QoS among the subscriber's matching subscriptions: the message is delivered once,
    /// at no more than this (3.3.4, "overlapping subscriptions").
    pub max_qos: QoS,
    /// Whether any matching subscription keeps the RETAIN flag as published.
    pub retain_as_published: bool,
    /// The identifiers of every matching subscription that has one [MQTT-3.3.4-4].
    pub subscription_ids: Vec<SubscriptionId>,
    /// Whether the route comes from a shared subscription (delivered apart from the ordinary ones).
    pub shared: bool,
}

/// FxHash: level strings are short and chosen by clients, but the table is not a place where a
/// collision attack buys anything beyond a slower SUBSCRIBE of the attacker's own.
#[derive(Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
    }
}

type Children<S> = HashMap<Box<str>, Node<S>, BuildHasherDefault<FxHasher>>;

struct Node<S> {
    /// Literal levels.
    children: Children<S>,
    /// Ordinary subscriptions to the filter ending here, one per subscriber.
    entries: Entries<S>,
    /// The `+` and `#` edges and the shared groups, boxed together: most nodes have none, and a node is
    /// what each subscription to a distinct filter costs.
    wild: Option<Box<Wild<S>>>,
}

/// The ordinary subscriptions of one filter. Most filters have one subscriber, kept in the node itself (the
/// enum is no larger than the vector, whose capacity field holds the variant).
enum Entries<S> {
    One(Entry<S>),
    Many(Vec<Entry<S>>),
}

impl<S> Entries<S> {
    fn as_slice(&self) -> &[Entry<S>] {
        match self {
            Entries::One(entry) => std::slice::from_ref(entry),
            Entries::Many(entries) => entries,
        }
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

impl<S: Subscriber> Entries<S> {
    /// Adds or replaces the subscriber's entry; whether it replaced one.
    fn upsert(&mut self, entry: Entry<S>) -> bool {
        match self {
            Entries::One(existing) if existing.subscriber.key() == entry.subscriber.key() => {
                *existing = entry;
                true
            }
            Entries::Many(entries) if entries.is_empty() => {
                *self = Entries::One(entry);
                false
            }
            Entries::Many(entries) => upsert(entries, entry),
            Entries::One(_) => {
                let Entries::One(first) = std::mem::replace(self, Entries::Many(Vec::new())) else { return false };
                *self = Entries::Many(vec![first, entry]);
                false
            }
        }
    }

    /// Removes the subscriber's entry; whether there was one.
    fn remove(&mut self, key: u64) -> bool {
        match self {
            Entries::One(entry) if entry.subscriber.key() == key => {
                *self = Entries::Many(Vec::new());
                true
            }
            Entries::One(_) => false,
            Entries::Many(entries) => remove_entry(entries, key),
        }
    }
}

/// Adds or replaces the subscriber's entry in `list`; whether it replaced one.
fn upsert<S: Subscriber>(list: &mut Vec<Entry<S>>, entry: Entry<S>) -> bool {
    let key = entry.subscriber.key();
    match list.iter_mut().find(|existing| existing.subscriber.key() == key) {
        Some(existing) => {
            *existing = entry;
            true
        }
        None => {
            if list.len() == list.capacity() {
                // From one: a group often has few members (a `push` would make room for four).
                list.reserve_exact(list.len().max(1));
            }
            list.push(entry);
            false
        }
    }
}

/// What few nodes have.
struct Wild<S> {
    /// The `+` and `#` edges, apart from the literal ones so matching does not hash them at every level.
    plus: Option<Node<S>>,
    hash: Option<Node<S>>,
    /// Shared groups whose filter ends here.
    groups: Vec<Group<S>>,
}

struct Group<S> {
    name: Box<str>,
    members: Vec<Entry<S>>,
    next: AtomicUsize,
}

impl<S> Default for Node<S> {
    fn default() -> Self {
        Node { children: Children::default(), entries: Entries::Many(Vec::new()), wild: None }
    }
}

impl<S> Node<S> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.entries.is_empty() && self.wild.is_none()
    }

    fn plus(&self) -> Option<&Node<S>> {
        self.wild.as_ref().and_then(|wild| wild.plus.as_ref())
    }

    fn hash(&self) -> Option<&Node<S>> {
        self.wild.as_ref().and_then(|wild| wild.hash.as_ref())
    }

    fn groups(&self) -> &[Group<S>] {
        self.wild.as_ref().map_or(&[], |wild| &wild.groups)
    }

    fn wild_mut(&mut self) -> &mut Wild<S> {
        self.wild.get_or_insert_with(|| Box::new(Wild { plus: None, hash: None, groups: Vec::new() }))
    }

    fn child_or_insert(&mut self, level: &str) -> &mut Node<S> {
        match level {
            "+" => self.wild_mut().plus.get_or_insert_with(Node::default),
            "#" => self.wild_mut().hash.get_or_insert_with(Node::default),
            _ => self.children.entry(level.into()).or_default(),
        }
    }

    fn child_mut(&mut self, level: &str) -> Option<&mut Node<S>> {
        match level {
            "+" => self.wild.as_mut().and_then(|wild| wild.plus.as_mut()),
            "#" => self.wild.as_mut().and_then(|wild| wild.hash.as_mut()),
            _ => self.children.get_mut(level),
        }
    }

    fn remove_child(&mut self, level: &str) {
        match level {
            "+" | "#" => {
                if let Some(wild) = &mut self.wild {
                    if level == "+" {
                        wild.plus = None;
                    } else {
                        wild.hash = None;
                    }
                    self.drop_empty_wild();
                }
            }
            _ => {
                self.children.remove(level);
            }
        }
    }

    fn drop_empty_wild(&mut self) {
        if self.wild.as_ref().is_some_and(|wild| wild.plus.is_none() && wild.hash.is_none() && wild.groups.is_empty()) {
            self.wild = None;
        }
    }
}

/// The subscription table. See the module documentation for its locking.
pub struct Router<S> {
    root: RwLock<Node<S>>,
    len: AtomicUsize,
}

impl<S: Subscriber> Default for Router<S> {
    fn default() -> Self {
        Router { root: RwLock::new(Node::default()), len: AtomicUsize::new(0) }
    }
}

impl<S: Subscriber> Router<S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of subscriptions in the table.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds or replaces `subscriber`'s subscription to `filter` (a valid filter, `$share/` included).
    /// Returns whether it replaced one (for Retain Handling 1, [MQTT-3.3.1-10]).
    pub fn subscribe(
        &self,
        filter: &str,
        subscriber: S,
        options: SubscriptionOptions,
        id: Option<SubscriptionId>,
    ) -> bool {
        let parsed = FilterRef::parse(filter);
        let entry = Entry { subscriber, options, id };
        let mut root = self.root.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut node = &mut *root;
        for level in parsed.filter.split('/') {
            node = node.child_or_insert(level);
        }
        let replaced = match parsed.share {
            None => node.entries.upsert(entry),
            Some(share) => {
                let groups = &mut node.wild_mut().groups;
                let index = match groups.iter().position(|group| &*group.name == share) {
                    Some(index) => index,
                    None => {
                        groups.push(Group { name: share.into(), members: Vec::new(), next: AtomicUsize::new(0) });
                        groups.len() - 1
                    }
                };
                upsert(&mut groups[index].members, entry)
            }
        };
        if !replaced {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        replaced
    }

    /// Removes the subscription of the subscriber `key` to `filter`; returns whether there was one.
    pub fn unsubscribe(&self, filter: &str, key: u64) -> bool {
        let parsed = FilterRef::parse(filter);
        let levels: Vec<&str> = parsed.filter.split('/').collect();
        let mut root = self.root.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let removed = remove(&mut root, &levels, parsed.share, key);
        if removed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Appends to `out` the subscribers `topic` (a valid topic name) reaches, one [`Route`] per subscriber
    /// for its ordinary subscriptions (merged) and one per matching shared group. A subscription with No
    /// Local is skipped for the publisher's own messages (`publisher` is its key) [MQTT-3.8.3-3].
    pub fn route(&self, topic: &str, publisher: Option<u64>, out: &mut Vec<Route<S>>) {
        let start = out.len();
        let mut shared = Vec::new();
        {
            let root = self.root.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut visit = |node: &Node<S>| collect(node, publisher, out, &mut shared);
            let dollar = topic.starts_with('$');
            walk(&root, topic, true, dollar, &mut visit);
        }
        merge_by_subscriber(out, start);
        out.append(&mut shared);
    }
}

/// Visits every node whose filter matches `rest` of the name.
fn walk<S>(node: &Node<S>, rest: &str, first: bool, dollar: bool, visit: &mut impl FnMut(&Node<S>)) {
    // A first level starting with `$` is matched by neither wildcard [MQTT-4.7.2-1].
    let wildcards = !(first && dollar);
    if wildcards {
        if let Some(hash) = node.hash() {
            visit(hash); // `#` matches the rest of the name, one level or more.
        }
    }
    let (level, next) = match rest.split_once('/') {
        Some((level, next)) => (level, Some(next)),
        None => (rest, None),
    };
    let mut descend = |child: &Node<S>| match next {
        Some(next) => walk(child, next, false, dollar, visit),
        None => {
            visit(child);
            // `#` matches its parent level too: "sport/#" matches "sport" [MQTT-4.7.1-2 (3.1.1)].
            if let Some(hash) = child.hash() {
                visit(hash);
            }
        }
    };
    if let Some(child) = node.children.get(level) {
        descend(child);
    }
    if wildcards {
        if let Some(child) = node.plus() {
            descend(child);
        }
    }
}

fn collect<S: Subscriber>(node: &Node<S>, publisher: Option<u64>, out: &mut Vec<Route<S>>, shared: &mut Vec<Route<S>>) {
    for entry in node.entries.as_slice() {
        if entry.options.no_local && publisher == Some(entry.subscriber.key()) {
            continue;
        }
        out.push(route_for(entry, false));
    }
    for group in node.groups() {
        if let Some(entry) = pick(group) {
            shared.push(route_for(entry, true));
        }
    }
}

fn route_for<S: Subscriber>(entry: &Entry<S>, shared: bool) -> Route<S> {
    Route {
        subscriber: entry.subscriber.clone(),
        max_qos: entry.options.qos,
        retain_as_published: entry.options.retain_as_published,
        subscription_ids: entry.id.into_iter().collect(),
        shared,
    }
}

/// The group's next member in turn that is online, or the next in turn.
fn pick<S: Subscriber>(group: &Group<S>) -> Option<&Entry<S>> {
    let n = group.members.len();
    if n == 0 {
        return None;
    }
    let start = group.next.fetch_add(1, Ordering::Relaxed);
    for i in 0..n {
        let entry = &group.members[(start + i) % n];
        if entry.subscriber.is_online() {
            if i > 0 {
                group.next.fetch_add(i, Ordering::Relaxed);
            }
            return Some(entry);
        }
    }
    Some(&group.members[start % n])
}

/// Merges the routes from `start` on so that each subscriber appears once (overlapping subscriptions).
fn merge_by_subscriber<S: Subscriber>(out: &mut Vec<Route<S>>, start: usize) {
    if out.len() - start < 2 {
        return;
    }
    out[start..].sort_unstable_by_key(|route| route.subscriber.key());
    let mut write = start;
    for read in start + 1..out.len() {
        if out[read].subscriber.key() == out[write].subscriber.key() {
            let ids = std::mem::take(&mut out[read].subscription_ids);
            let (qos, rap) = (out[read].max_qos, out[read].retain_as_published);
            let target = &mut out[write];
            target.max_qos = target.max_qos.max(qos);
            target.retain_as_published |= rap;
            target.subscription_ids.extend(ids);
        } else {
            write += 1;
            out.swap(write, read);
        }
    }
    out.truncate(write + 1);
}

fn remove<S: Subscriber>(node: &mut Node<S>, levels: &[&str], share: Option<&str>, key: u64) -> bool {
    let Some((level, rest)) = levels.split_first() else {
        return match share {
            None => node.entries.remove(key),
            Some(share) => {
                let Some(wild) = &mut node.wild else { return false };
                let Some(index) = wild.groups.iter().position(|group| &*group.name == share) else { return false };
                let removed = remove_entry(&mut wild.groups[index].members, key);
                if wild.groups[index].members.is_empty() {
                    wild.groups.swap_remove(index);
                }
                node.drop_empty_wild();
                removed
            }
        };
    };
    let Some(child) = node.child_mut(level) else { return false };
    let removed = remove(child, rest, share, key);
    if child.is_empty() {
        node.remove_child(level);
    }
    removed
}

fn remove_entry<S: Subscriber>(entries: &mut Vec<Entry<S>>, key: u64) -> bool {
    match entries.iter().position(|entry| entry.subscriber.key() == key) {
        Some(index) => {
            entries.remove(index);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests;
