//! The `mqtt_publish:` route target: the request body published to a topic of the MQTT broker.
//!
//! portico-http does not know the broker: the binary registers an [`MqttPublisher`] at start-up
//! ([`register_mqtt_publisher`]); without one (no broker in this process, as with `process_model:
//! multi_process`) the route answers `503`. Answers:
//!
//! - `200` (QoS 0: the broker routed it) or `202` (QoS 1/2: the broker accepted it and, with persistence,
//!   the store committed it, so it survives `kill -9` as a PUBACK would mean);
//! - `400` for a topic the request makes invalid (`+`, `#`, empty, or not UTF-8 after decoding);
//! - `413` for a body over [`MAX_BODY`];
//! - `503` when no broker runs, or the store failed.

use crate::handler::{full, Handler, HandlerFuture, Request};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

/// The largest body published (the broker's default `max_packet_size` too): 1 MiB.
pub const MAX_BODY: usize = 1 << 20;

/// Why a publish was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    #[error("the broker could not keep the message: {0}")]
    Unavailable(String),
}

/// What the broker completes when the message is accepted (and, for QoS 1/2 with persistence, committed).
pub type PublishFuture = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send>>;

/// The broker, as the HTTP plane publishes to it.
pub trait MqttPublisher: Send + Sync {
    fn publish(&self, topic: String, payload: Bytes, qos: u8, retain: bool) -> PublishFuture;
}

static PUBLISHER: OnceLock<Box<dyn MqttPublisher>> = OnceLock::new();

/// Registers the broker (once, at start; later calls are ignored).
pub fn register_mqtt_publisher(publisher: Box<dyn MqttPublisher>) {
    let _ = PUBLISHER.set(publisher);
}

/// The compiled target.
#[derive(Debug)]
pub(crate) struct MqttPublish {
    pub topic: String,
    pub qos: u8,
    pub retain: bool,
    /// The route's `path_prefix`, taken off the path for `{path}`.
    pub prefix: Option<String>,
}

impl Handler for MqttPublish {
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a> {
        let (qos, retain) = (self.qos, self.retain);
        let topic = self.topic_for(&req);
        Box::pin(async move {
            let answer = |status: u16, text: String| {
                let mut resp = hyper::Response::new(full(Bytes::from(text + "\n")));
                *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
                resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("text/plain"));
                Ok(resp)
            };
            let Some(publisher) = PUBLISHER.get() else {
                return answer(503, "no MQTT broker runs in this process".into());
            };
            let topic = match topic {
                Ok(topic) => topic,
                Err(why) => return answer(400, why),
            };
            let body = match http_body_util::Limited::new(req.body, MAX_BODY).collect().await {
                Ok(body) => body.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return answer(413, format!("the body is over {MAX_BODY} bytes"));
                }
                Err(e) => return Err(e),
            };
            match publisher.publish(topic.clone(), body, qos, retain).await {
                Ok(()) if qos == 0 => answer(200, format!("published to {topic}")),
                Ok(()) => answer(202, format!("accepted for {topic}")),
                Err(PublishError::InvalidTopic(why)) => answer(400, why),
                Err(e @ PublishError::Unavailable(_)) => answer(503, e.to_string()),
            }
        })
    }
}

impl MqttPublish {
    /// The topic of the template for this request.
    fn topic_for(&self, req: &Request<'_>) -> Result<String, String> {
        let path = req.head.path();
        let rest = match &self.prefix {
            Some(prefix) => path.strip_prefix(prefix.as_bytes()).unwrap_or(path),
            None => path,
        };
        let rest = rest.strip_prefix(b"/").unwrap_or(rest);
        let mut topic = self.topic.replace("{path}", &decode(rest)?);
        for (name, value) in &req.params {
            topic = topic.replace(&format!("{{{name}}}"), &decode(value.as_bytes())?);
        }
        if topic.is_empty() || topic.contains(['+', '#', '\0']) {
            return Err(format!("{topic:?} is not a topic name (not empty, no `+`, `#` or NUL)"));
        }
        Ok(topic)
    }
}

/// Percent-decodes a path piece into UTF-8.
fn decode(piece: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(piece.len());
    let mut i = 0;
    while i < piece.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (piece[i], piece.get(i + 1).copied().and_then(hex), piece.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "the topic is not UTF-8".to_string())
}
