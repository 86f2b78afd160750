//! Retained messages (specification 3.3.1.3): the last message published with RETAIN on each topic, handed to
//! new subscriptions whose filter matches it. A PUBLISH with RETAIN and an empty payload removes the topic's
//! retained message [MQTT-3.3.1-6] and is not itself retained [MQTT-3.3.1-7].
//!
//! A map from topic to message behind a `RwLock`: publishes with RETAIN take it exclusively for one
//! insertion, subscriptions take it shared and scan it with [`crate::topic::matches`]. The scan is linear in
//! the number of retained topics: a SUBSCRIBE with 100,000 retained topics costs a few milliseconds of one
//! worker. A trie like the router's is the next step if that shows in a profile.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytestring::ByteString;

use crate::message::Message;
use crate::store::{Store, StoreOp};
use crate::topic::matches;

#[derive(Debug, Default)]
pub struct Retained {
    map: RwLock<HashMap<ByteString, Arc<Message>>>,
}

impl Retained {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets, replaces or (with an empty payload) deletes the retained message of `message.topic`. The store
    /// is told under the lock, so two retained publishes to one topic reach it in the order they took effect.
    pub fn set(&self, message: Arc<Message>, store: Option<&Store>) {
        let mut map = self.map.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if message.payload.is_empty() {
            if map.remove(&message.topic).is_some() {
                if let Some(store) = store {
                    store.submit(StoreOp::DeleteRetained { topic: message.topic.clone() });
                }
            }
        } else {
            if let Some(store) = store {
                store.submit(StoreOp::PutRetained { message: message.clone() });
            }
            map.insert(message.topic.clone(), message);
        }
    }

    /// Puts back a message loaded from the store.
    pub fn restore(&self, message: Message) {
        let mut map = self.map.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.insert(message.topic.clone(), Arc::new(message));
    }

    /// The retained messages whose topic `filter` (without `$share/`) matches, unexpired.
    pub fn matching(&self, filter: &str) -> Vec<Arc<Message>> {
        let now = Instant::now();
        let map = self.map.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut found: Vec<Arc<Message>> = map
            .values()
            .filter(|message| matches(filter, &message.topic) && !message.is_expired(now))
            .cloned()
            .collect();
        found.sort_by(|a, b| a.topic.cmp(&b.topic));
        found
    }

    pub fn clear(&self) {
        self.map.write().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::QoS;
    use bytes::Bytes;

    fn msg(topic: &str, payload: &'static [u8]) -> Arc<Message> {
        Arc::new(Message::new(topic.into(), Bytes::from_static(payload), QoS::AtMostOnce, true))
    }

    #[test]
    fn set_replace_and_delete_with_an_empty_payload_mqtt_3_3_1_6() {
        let retained = Retained::new();
        retained.set(msg("a/b", b"1"), None);
        retained.set(msg("a/c", b"2"), None);
        retained.set(msg("a/b", b"3"), None);
        let found = retained.matching("a/+");
        assert_eq!(found.iter().map(|m| &m.payload[..]).collect::<Vec<_>>(), [&b"3"[..], &b"2"[..]]);
        retained.set(msg("a/b", b""), None);
        assert_eq!(retained.matching("#").len(), 1);
        assert!(retained.matching("a/b").is_empty());
    }

    #[test]
    fn dollar_topics_are_not_matched_by_a_leading_wildcard() {
        let retained = Retained::new();
        retained.set(msg("$SYS/x", b"1"), None);
        assert!(retained.matching("#").is_empty());
        assert_eq!(retained.matching("$SYS/#").len(), 1);
    }
}
