//! `$SYS/broker/...`: the broker's figures as retained messages, under the names Mosquitto publishes (its
//! mosquitto(8), "BROKER STATUS"), so that what scripts against those works here.
//!
//! One place publishes them, the broker's timer thread, every `sys_interval` (10 s by default, 0: never),
//! and a topic only when its value changed since it was last published (as Mosquitto does), so that a quiet
//! broker sends its `$SYS` subscribers the uptime and little else. They are retained, in a table of their own:
//! a new subscriber to `$SYS/#` gets them at once, they are never written to the store (they are made anew
//! after a restart) and they do not count as retained messages in `retained messages/count` or
//! `portico_mqtt_retained_messages`. Clients cannot publish to `$SYS` (see [`is_sys_topic`]), and, as for any
//! topic starting with `$`, a filter starting with `#` or `+` does not match them [MQTT-4.7.2-1].

use std::collections::HashMap;
use std::time::Instant;

/// Whether `topic` is the broker's: a client's PUBLISH to it is refused as the ACL refuses one (v5 QoS 1/2:
/// Not authorized; QoS 0 and v3: dropped), a will to it refuses the CONNECT.
pub fn is_sys_topic(topic: &str) -> bool {
    topic == "$SYS" || topic.starts_with("$SYS/")
}

/// What the broker counts, read at each publication.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// Clients connected now (past CONNECT), and the most there have been at once.
    pub connected: u64,
    pub connected_max: u64,
    /// Sessions, connected or not.
    pub sessions: u64,
    /// Persistent sessions that expired while their client was away.
    pub expired: u64,
    /// Every MQTT packet, and the PUBLISH packets among them.
    pub packets_received: u64,
    pub packets_sent: u64,
    pub publish_received: u64,
    pub publish_sent: u64,
    pub publish_dropped: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// Sockets accepted and CONNECTs accepted, for the connection rates.
    pub sockets: u64,
    pub connects: u64,
    pub subscriptions: u64,
    pub retained: u64,
    /// Retained messages and the messages sessions hold (queued and in flight).
    pub stored: u64,
}

/// The moving averages' periods, as Mosquitto names them.
const PERIODS: [(&str, f64); 3] = [("1min", 60.0), ("5min", 300.0), ("15min", 900.0)];

/// The counters whose rates are published under `$SYS/broker/load/`.
const LOADS: [&str; 9] = [
    "messages/received",
    "messages/sent",
    "publish/received",
    "publish/sent",
    "publish/dropped",
    "bytes/received",
    "bytes/sent",
    "connections",
    "sockets",
];

fn load_values(f: &Figures) -> [u64; 9] {
    [
        f.packets_received,
        f.packets_sent,
        f.publish_received,
        f.publish_sent,
        f.publish_dropped,
        f.bytes_received,
        f.bytes_sent,
        f.connects,
        f.sockets,
    ]
}

/// What was published last, and the moving averages: kept by the broker between publications.
#[derive(Debug)]
pub struct SysState {
    started: Instant,
    last: HashMap<String, String>,
    /// The previous publication: when, and the counters the rates are taken from.
    previous: Option<(Instant, [u64; 9])>,
    /// Per counter, per period: messages (or bytes, or connections) per minute, averaged.
    averages: [[f64; 3]; 9],
}

impl SysState {
    pub fn new(started: Instant) -> SysState {
        SysState { started, last: HashMap::new(), previous: None, averages: [[0.0; 3]; 9] }
    }

    /// Forgets what was published (`$SYS` was turned off): the next publication sends everything.
    pub fn reset(&mut self) {
        self.last.clear();
    }

    /// The topics whose value changed since the last call (all of them at the first), with their payloads.
    pub fn update(&mut self, figures: &Figures, now: Instant) -> Vec<(String, String)> {
        let mut values: Vec<(String, String)> = vec![
            ("version".into(), format!("portico version {}", env!("CARGO_PKG_VERSION"))),
            ("uptime".into(), format!("{} seconds", now.saturating_duration_since(self.started).as_secs())),
            ("clients/connected".into(), figures.connected.to_string()),
            ("clients/disconnected".into(), figures.sessions.saturating_sub(figures.connected).to_string()),
            ("clients/total".into(), figures.sessions.to_string()),
            ("clients/maximum".into(), figures.connected_max.to_string()),
            ("clients/expired".into(), figures.expired.to_string()),
            ("messages/received".into(), figures.packets_received.to_string()),
            ("messages/sent".into(), figures.packets_sent.to_string()),
            ("publish/messages/received".into(), figures.publish_received.to_string()),
            ("publish/messages/sent".into(), figures.publish_sent.to_string()),
            ("publish/messages/dropped".into(), figures.publish_dropped.to_string()),
            ("bytes/received".into(), figures.bytes_received.to_string()),
            ("bytes/sent".into(), figures.bytes_sent.to_string()),
            ("subscriptions/count".into(), figures.subscriptions.to_string()),
            ("retained messages/count".into(), figures.retained.to_string()),
            ("store/messages/count".into(), figures.stored.to_string()),
        ];
        let counters = load_values(figures);
        if let Some((at, before)) = self.previous {
            let seconds = now.saturating_duration_since(at).as_secs_f64();
            if seconds > 0.0 {
                for (i, (value, before)) in counters.iter().zip(before).enumerate() {
                    // Per minute over the interval, folded into each average as Mosquitto does.
                    let rate = value.saturating_sub(before) as f64 * 60.0 / seconds;
                    for (j, (_, period)) in PERIODS.iter().enumerate() {
                        let decay = (-seconds / period).exp();
                        self.averages[i][j] = rate + decay * (self.averages[i][j] - rate);
                    }
                }
            }
        }
        self.previous = Some((now, counters));
        for (i, name) in LOADS.iter().enumerate() {
            for (j, (period, _)) in PERIODS.iter().enumerate() {
                values.push((format!("load/{name}/{period}"), format!("{:.2}", self.averages[i][j])));
            }
        }
        let mut changed = Vec::new();
        for (name, value) in values {
            let topic = format!("$SYS/broker/{name}");
            if self.last.get(&topic) != Some(&value) {
                self.last.insert(topic.clone(), value.clone());
                changed.push((topic, value));
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sys_topics_are_the_brokers_own() {
        assert!(is_sys_topic("$SYS"));
        assert!(is_sys_topic("$SYS/broker/uptime"));
        assert!(!is_sys_topic("$SYSTEM/x"));
        assert!(!is_sys_topic("sys/$SYS"));
        assert!(!is_sys_topic("$share/g/x"));
    }

    #[test]
    fn the_first_update_sends_everything_later_ones_what_changed() {
        let start = Instant::now();
        let mut sys = SysState::new(start);
        let mut figures = Figures { connected: 2, connected_max: 3, sessions: 5, ..Figures::default() };
        let first = sys.update(&figures, start);
        let topic = |changes: &[(String, String)], name: &str| {
            changes.iter().find(|(t, _)| t == &format!("$SYS/broker/{name}")).map(|(_, v)| v.clone())
        };
        assert_eq!(topic(&first, "clients/connected").as_deref(), Some("2"));
        assert_eq!(topic(&first, "clients/disconnected").as_deref(), Some("3"));
        assert_eq!(topic(&first, "uptime").as_deref(), Some("0 seconds"));
        assert_eq!(topic(&first, "load/messages/received/1min").as_deref(), Some("0.00"));
        assert!(topic(&first, "version").is_some_and(|v| v.starts_with("portico version ")));
        assert_eq!(first.len(), 17 + 27);

        // A minute later, 120 packets more: 120 per minute over that minute.
        figures.packets_received = 120;
        let later = sys.update(&figures, start + Duration::from_secs(60));
        assert_eq!(topic(&later, "uptime").as_deref(), Some("60 seconds"));
        assert_eq!(topic(&later, "messages/received").as_deref(), Some("120"));
        let one_minute: f64 = topic(&later, "load/messages/received/1min").and_then(|v| v.parse().ok()).unwrap();
        assert!((one_minute - 120.0 * (1.0 - (-1.0f64).exp())).abs() < 0.01, "{one_minute}");
        assert_eq!(topic(&later, "clients/connected"), None, "unchanged, not sent again");
        assert_eq!(topic(&later, "version"), None);
    }
}
