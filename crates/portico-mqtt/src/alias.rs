//! Topic aliases the broker defines towards a v5 client (3.3.2.3.4): the topic name of a PUBLISH replaced by
//! a two-byte number the connection has given it before.
//!
//! A client says in CONNECT how many it accepts (Topic Alias Maximum; none or 0: none), the broker uses at
//! most `limits.topic_aliases_to_clients` of those. The first PUBLISH of a topic defines an alias (the topic
//! name and the alias), the next ones send the alias and an empty topic name. When every alias is taken, a
//! new topic takes over the alias that was defined longest ago (first in, first out: the most recent new
//! topics keep theirs). Aliases belong to the network connection: a new connection starts with none, so a
//! message sent again after a reconnect carries its topic name.
//!
//! A connection makes its aliases only when it sends to a client that accepts them; each keeps a copy of its
//! topic (not a slice of the message, which would keep the publisher's read buffer alive).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::num::NonZeroU16;

use bytestring::ByteString;

use crate::router::FxHasher;

/// What a PUBLISH carries for its topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alias {
    /// The alias stands for the topic already: an empty topic name and the alias.
    Known(NonZeroU16),
    /// The topic name and the alias, which it defines (or redefines).
    Define(NonZeroU16),
}

impl Alias {
    pub fn id(self) -> NonZeroU16 {
        match self {
            Alias::Known(id) | Alias::Define(id) => id,
        }
    }
}

/// One connection's aliases towards its client.
#[derive(Debug)]
pub struct OutAliases {
    max: u16,
    by_topic: HashMap<ByteString, NonZeroU16, BuildHasherDefault<FxHasher>>,
    /// The topic of alias `n` at `n - 1`.
    topics: Vec<ByteString>,
    /// The alias a new topic takes over next once all are taken (index into `topics`).
    next: usize,
}

impl OutAliases {
    /// Aliases up to `max` (at least 1).
    pub fn new(max: u16) -> OutAliases {
        OutAliases { max: max.max(1), by_topic: HashMap::default(), topics: Vec::new(), next: 0 }
    }

    /// What a PUBLISH to `topic` should carry; nothing changes until [`OutAliases::commit`] (the packet may
    /// not be sent).
    pub fn choose(&self, topic: &str) -> Alias {
        if let Some(&id) = self.by_topic.get(topic) {
            return Alias::Known(id);
        }
        let index = if self.topics.len() < usize::from(self.max) { self.topics.len() } else { self.next };
        // `index` < `max` <= u16::MAX, so `index + 1` is a non-zero u16.
        Alias::Define(NonZeroU16::new(u16::try_from(index + 1).unwrap_or(u16::MAX)).unwrap_or(NonZeroU16::MIN))
    }

    /// Records that a PUBLISH to `topic` carrying `alias` was sent.
    pub fn commit(&mut self, topic: &str, alias: Alias) {
        let Alias::Define(id) = alias else { return };
        let index = usize::from(id.get()) - 1;
        let topic = ByteString::from(topic);
        if index < self.topics.len() {
            let old = std::mem::replace(&mut self.topics[index], topic.clone());
            self.by_topic.remove(&old);
            self.next = (index + 1) % usize::from(self.max);
        } else {
            self.topics.push(topic.clone());
        }
        self.by_topic.insert(topic, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u16) -> NonZeroU16 {
        NonZeroU16::new(n).unwrap()
    }

    #[test]
    fn topics_get_aliases_then_use_them_and_the_oldest_is_taken_over() {
        let mut aliases = OutAliases::new(2);
        let mut send = |topic: &str| {
            let alias = aliases.choose(topic);
            aliases.commit(topic, alias);
            alias
        };
        assert_eq!(send("a"), Alias::Define(id(1)));
        assert_eq!(send("a"), Alias::Known(id(1)));
        assert_eq!(send("b"), Alias::Define(id(2)));
        assert_eq!(send("a"), Alias::Known(id(1)));
        // Full: "c" takes over the alias defined first, then "d" the next one.
        assert_eq!(send("c"), Alias::Define(id(1)));
        assert_eq!(send("a"), Alias::Define(id(2)));
        assert_eq!(send("c"), Alias::Known(id(1)));
        assert_eq!(send("b"), Alias::Define(id(1)));
        assert_eq!(send("a"), Alias::Known(id(2)));
    }

    #[test]
    fn an_alias_not_committed_changes_nothing() {
        let mut aliases = OutAliases::new(1);
        assert_eq!(aliases.choose("a"), Alias::Define(id(1)));
        assert_eq!(aliases.choose("a"), Alias::Define(id(1)));
        aliases.commit("a", Alias::Define(id(1)));
        assert_eq!(aliases.choose("a"), Alias::Known(id(1)));
    }
}
