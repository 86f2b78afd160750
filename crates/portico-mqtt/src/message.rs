//! An application message as the broker holds it between the PUBLISH that brought it and the PUBLISHes that
//! deliver it. One `Arc<Message>` is shared by every subscriber's queue, the retained table and the store's
//! write: the payload and topic are `Bytes`/`ByteString` slices of the publisher's read buffer, never copied
//! per subscriber (the seed's lesson: copies per message, not routing, were the broker's cost).

use std::time::{Duration, Instant};

use bytes::Bytes;
use bytestring::ByteString;

use crate::codec::{PublishProperties, QoS, Will};

/// A message to route.
#[derive(Clone, Debug)]
pub struct Message {
    pub topic: ByteString,
    pub payload: Bytes,
    /// The QoS it was published with; each subscriber gets at most its subscription's maximum.
    pub qos: QoS,
    /// The RETAIN flag it was published with.
    pub retain: bool,
    /// The v5 properties forwarded to subscribers (3.3.2.3): never a Topic Alias or Subscription Identifier
    /// (those are per connection).
    pub properties: PublishProperties,
    /// The publishing session's key, for No Local; `None` for a will or a message from outside MQTT.
    pub publisher: Option<u64>,
    /// When it was received, for the Message Expiry Interval.
    pub received: Instant,
}

impl Message {
    /// A message with no v5 properties, published now.
    pub fn new(topic: ByteString, payload: Bytes, qos: QoS, retain: bool) -> Message {
        Message {
            topic,
            payload,
            qos,
            retain,
            properties: PublishProperties::default(),
            publisher: None,
            received: Instant::now(),
        }
    }

    /// The will of a connection as a message to publish.
    pub fn from_will(will: &Will) -> Message {
        let p = &will.properties;
        let properties = PublishProperties {
            payload_format: p.payload_format,
            message_expiry_interval: p.message_expiry_interval,
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.clone(),
            user_properties: p.user_properties.clone(),
            content_type: p.content_type.clone(),
            ..PublishProperties::default()
        };
        Message { properties, ..Message::new(will.topic.clone(), will.payload.clone(), will.qos, will.retain) }
    }

    /// Whether the Message Expiry Interval has passed (3.3.2.3.3): it is then not delivered.
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expiry_remaining(now) == Some(0)
    }

    /// The Message Expiry Interval left at `now`, in whole seconds, as forwarded to a subscriber
    /// [MQTT-3.3.2-6]; `None` when the message does not expire.
    pub fn expiry_remaining(&self, now: Instant) -> Option<u32> {
        let interval = self.properties.message_expiry_interval?;
        let elapsed = now.saturating_duration_since(self.received);
        Some(Duration::from_secs(interval.into()).saturating_sub(elapsed).as_secs().try_into().unwrap_or(u32::MAX))
    }
}
