//! Checks of the `mqtt:` section and of the listeners that speak MQTT: ranges the protocol's fields impose
//! (a Receive Maximum is two bytes, a Keep Alive whole seconds), and what the broker cannot do yet.

use crate::schema::{Config, ListenerProtocol, ProcessModel};
use crate::{LeftOut, LoadedConfig};
use std::time::Duration;

/// The largest packet MQTT can carry: a Remaining Length of at most 268,435,455 bytes, plus its header.
const MQTT_MAX_PACKET: u64 = 268_435_460;

pub(crate) fn validate(cfg: &Config, left_out: &LeftOut, err: &mut impl FnMut(&str, String, Option<&str>)) {
    if left_out.setting("mqtt") {
        return;
    }
    let mqtt = &cfg.mqtt;
    if let Some(p) = &mqtt.persistence {
        if p.path.trim().is_empty() {
            err(
                "mqtt.persistence.path",
                "the store's path is empty".into(),
                Some("name a directory, for example `path: data/mqtt`"),
            );
        }
        if p.commit_delay.0 > Duration::from_secs(1) {
            err(
                "mqtt.persistence.commit_delay",
                format!("commit_delay may be at most 1s, got {}", p.commit_delay),
                Some("every QoS 1/2 acknowledgement waits for it; a few milliseconds is plenty (default 0ms)"),
            );
        }
    }
    let l = &mqtt.limits;
    if l.max_packet_size.0 < 64 || l.max_packet_size.0 > MQTT_MAX_PACKET {
        err(
            "mqtt.limits.max_packet_size",
            format!(
                "max_packet_size must be between 64 bytes and 256MiB (MQTT's largest packet), got {}",
                l.max_packet_size
            ),
            Some("the default is 1MiB"),
        );
    }
    for (key, value, min) in [
        ("receive_maximum", l.receive_maximum, 1),
        ("max_inflight", l.max_inflight, 1),
        ("topic_alias_maximum", l.topic_alias_maximum, 0),
        ("topic_aliases_to_clients", l.topic_aliases_to_clients, 0),
    ] {
        if value < min || value > u32::from(u16::MAX) {
            err(
                &format!("mqtt.limits.{key}"),
                format!("{key} must be between {min} and 65535 (a two-byte field of MQTT 5), got {value}"),
                None,
            );
        }
    }
    if l.max_queued_messages == 0 {
        err(
            "mqtt.limits.max_queued_messages",
            "max_queued_messages must be at least 1".into(),
            Some("messages for a subscriber wait in its queue until sent; the default is 1000"),
        );
    }
    let whole_seconds = |d: Duration| d.subsec_nanos() == 0;
    if !whole_seconds(l.max_keepalive.0) || l.max_keepalive.0.as_secs() > u64::from(u16::MAX) {
        err(
            "mqtt.limits.max_keepalive",
            format!("max_keepalive must be whole seconds, at most 65535s (18h 12m 15s), got {}", l.max_keepalive),
            Some("`0s` sets no maximum; the default is 60s"),
        );
    }
    if !whole_seconds(l.max_session_expiry.0) || l.max_session_expiry.0.as_secs() > u64::from(u32::MAX) {
        err(
            "mqtt.limits.max_session_expiry",
            format!(
                "max_session_expiry must be whole seconds, at most 4294967295s (136 years), got {}",
                l.max_session_expiry
            ),
            Some("the default is 7d"),
        );
    }
    if l.connect_timeout.0.is_zero() {
        err("mqtt.limits.connect_timeout", "connect_timeout must be above 0".into(), Some("the default is 10s"));
    }
    if l.park_after.0 > Duration::from_secs(24 * 3600) {
        err(
            "mqtt.limits.park_after",
            format!("park_after must be at most 1d, got {}", l.park_after),
            Some("the default is 10s; 0s never parks"),
        );
    }
    if let Some(info) = &mqtt.response_information {
        if info.is_empty() || info.len() > 1024 || info.contains(['+', '#', '\0']) {
            err(
                "mqtt.response_information",
                format!("response_information must be 1 to 1024 bytes without `+`, `#` or NUL, got {info:?}"),
                Some("it is the base of the client's response topics, e.g. \"responses/%c\""),
            );
        }
    }
    let sys = mqtt.sys_interval.0;
    if sys.subsec_nanos() != 0 || sys.as_secs() > 24 * 3600 {
        err(
            "mqtt.sys_interval",
            format!("sys_interval must be whole seconds, at most 1d, got {}", mqtt.sys_interval),
            Some("the default is 10s; 0s turns $SYS off"),
        );
    }
    if mqtt.auth.password_file.as_deref().is_some_and(|p| p.trim().is_empty()) {
        err("mqtt.auth.password_file", "the password file's path is empty".into(), None);
    }
    // MQTT clients come through MQTT listeners, and through HTTP ones when a route serves MQTT over WebSocket.
    let websocket = cfg.routes.iter().any(|r| r.mqtt.is_some());
    if mqtt.auth.use_certificate_as_username
        && !cfg.listeners.iter().any(|l| {
            (l.protocol == ListenerProtocol::Mqtt || websocket) && l.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
        })
    {
        err(
            "mqtt.auth.use_certificate_as_username",
            "no listener MQTT clients reach asks for client certificates".into(),
            Some("give an MQTT listener (or, for `mqtt: websocket` routes, an HTTP one) `tls: { client_ca: ... }`"),
        );
    }
    for (i, entry) in mqtt.acl.iter().enumerate() {
        if let Err(why) = acl_filter_shape(&entry.topic) {
            err(
                &format!("mqtt.acl[{i}].topic"),
                format!("{:?} is not a topic filter: {why}", entry.topic),
                Some("levels separated by `/`, `+` for one whole level, `#` last for the rest; `%u` and `%c` are replaced by the user name and the client id"),
            );
        }
    }
}

/// Checks the routes with `mqtt: websocket`: they need the broker, which runs in a process with `process_model:
/// threads` when the configuration asks for one (an `mqtt:` section or a `protocol: mqtt` listener), so that
/// a route does not quietly start a broker nobody configured.
pub(crate) fn validate_routes(
    loaded: &LoadedConfig,
    left_out: &LeftOut,
    err: &mut impl FnMut(&str, String, Option<&str>),
) {
    let cfg = &loaded.config;
    let multi_process = cfg.process_model == ProcessModel::MultiProcess && !left_out.setting("process_model");
    let configured = loaded.spans.written("mqtt")
        || left_out.setting("mqtt")
        || left_out.any_listener()
        || cfg.listeners.iter().any(|l| l.protocol == ListenerProtocol::Mqtt);
    for (i, r) in cfg.routes.iter().enumerate() {
        if r.mqtt.is_none() {
            continue;
        }
        if multi_process {
            err(
                &format!("routes[{i}].mqtt"),
                "`mqtt: websocket` is served by one process's broker: not with `process_model: multi_process` (its HTTP \
                 listeners are served by every worker process, the broker runs in the first)"
                    .into(),
                Some("use `process_model: threads` (the default), or a `protocol: mqtt` listener"),
            );
        } else if !configured {
            err(
                &format!("routes[{i}].mqtt"),
                "`mqtt: websocket` needs the MQTT broker, and the configuration has none".into(),
                Some(
                    "add an `mqtt:` section (`mqtt: {}` for the defaults, docs/mqtt.md) or a `protocol: mqtt` listener",
                ),
            );
        }
    }
}

/// Checks an ACL topic filter as MQTT checks a subscription's (4.7): `#` only as the whole last level, `+`
/// only as a whole level.
fn acl_filter_shape(filter: &str) -> Result<(), &'static str> {
    if filter.is_empty() {
        return Err("it is empty");
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Err("`#` must be the whole last level");
        }
        if level.contains('+') && *level != "+" {
            return Err("`+` must be a whole level");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::schema::{ListenerProtocol, OnCorruptStore};

    fn problems(yaml: &str) -> Vec<String> {
        crate::check_str(yaml, "t.yaml")
            .problems
            .iter()
            .map(|d| format!("{}:{} {}", d.line, d.col, d.message))
            .collect()
    }

    #[test]
    fn an_mqtt_listener_and_the_defaults_of_the_section() {
        let loaded = crate::load_str(
            "listeners:\n  - { name: m, address: 127.0.0.1:1883, protocol: mqtt }\nmqtt:\n  persistence: { path: data/mqtt }\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(loaded.config.listeners[0].protocol, ListenerProtocol::Mqtt);
        let p = loaded.config.mqtt.persistence.as_ref().unwrap();
        assert_eq!((p.path.as_str(), p.fsync, p.on_corrupt_store), ("data/mqtt", true, OnCorruptStore::MoveAside));
        assert!(p.commit_delay.0.is_zero());
        assert_eq!(loaded.config.mqtt.limits, crate::schema::MqttLimits::default());
        assert_eq!(loaded.config.mqtt.sys_interval, crate::units::HumanDuration::secs(10));
        let plain = crate::load_str("listeners: [ { name: w, address: 127.0.0.1:1 } ]\n", "t.yaml").unwrap();
        assert_eq!(plain.config.listeners[0].protocol, ListenerProtocol::Http);
        assert!(plain.config.mqtt.persistence.is_none());
    }

    #[test]
    fn out_of_range_limits_are_reported_where_they_are_written() {
        let p = problems(
            "listeners: [ { name: m, address: 127.0.0.1:1883, protocol: mqtt } ]\nmqtt:\n  limits:\n    receive_maximum: 70000\n    max_keepalive: 1500ms\n    max_packet_size: 1GiB\n    max_queued_messages: 0\n  persistence: { path: \"\", commit_delay: 5s }\n  sys_interval: 1500ms\n",
        );
        assert_eq!(p.len(), 7, "{p:#?}");
        assert!(p[0].starts_with("4:22 receive_maximum must be between 1 and 65535"), "{p:#?}");
        assert!(p[1].starts_with("5:20 max_keepalive must be whole seconds"), "{p:#?}");
        assert!(p[2].starts_with("6:22 max_packet_size must be between"), "{p:#?}");
        assert!(p[3].starts_with("7:26 max_queued_messages must be at least 1"), "{p:#?}");
        assert!(
            p[4].contains("the store's path is empty") && p[5].contains("commit_delay may be at most 1s"),
            "{p:#?}"
        );
        assert!(p[6].starts_with("9:17 sys_interval must be whole seconds"), "{p:#?}");
    }

    #[test]
    fn auth_and_acl() {
        let loaded = crate::load_str(
            "listeners: [ { name: m, address: 127.0.0.1:1883, protocol: mqtt } ]\nmqtt:\n  auth: { password_file: mqtt.passwd }\n  acl:\n    - { topic: \"devices/%c/#\", access: readwrite }\n    - { topic: test/nosubscribe, access: deny, user: bob }\n",
            "t.yaml",
        )
        .unwrap();
        let mqtt = &loaded.config.mqtt;
        assert!(!mqtt.auth.anonymous_allowed(), "a password file turns anonymous off by default");
        assert!(crate::schema::MqttAuth::default().anonymous_allowed());
        assert_eq!(mqtt.acl[1].access, crate::schema::MqttAccess::Deny);
        assert_eq!(mqtt.acl[1].user.as_deref(), Some("bob"));
        let p = problems(
            "listeners: [ { name: m, address: 127.0.0.1:1883, protocol: mqtt } ]\nmqtt:\n  auth: { use_certificate_as_username: true }\n  acl:\n    - { topic: \"a/#/b\", access: read }\n",
        );
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].starts_with("3:40 no listener MQTT clients reach asks for client certificates"), "{p:#?}");
        assert!(p[1].starts_with("5:16 \"a/#/b\" is not a topic filter"), "{p:#?}");
        let p = problems("listeners: []\nmqtt: { acl: [ { topic: a, access: publish } ] }\n");
        assert!(p.iter().any(|p| p.starts_with("2:36") && p.contains("unknown variant `publish`")), "{p:#?}");
    }

    #[test]
    fn mqtt_websocket_routes_need_the_broker() {
        let route = "routes:\n  - match: { path: /mqtt }\n    mqtt: websocket\n";
        let listener = "listeners: [ { name: w, address: 127.0.0.1:8080 } ]\n";
        let loaded = crate::load_str(&format!("{listener}{route}mqtt: {{}}\n"), "t.yaml").unwrap();
        assert_eq!(loaded.config.routes[0].mqtt, Some(crate::MqttRoute::Websocket));
        let with_mqtt_listener = "listeners:\n  - { name: w, address: 127.0.0.1:8080 }\n  - { name: m, address: 127.0.0.1:1883, protocol: mqtt }\n";
        assert!(problems(&format!("{with_mqtt_listener}{route}")).is_empty());
        let p = problems(&format!("{listener}{route}"));
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with("4:11 `mqtt: websocket` needs the MQTT broker"), "{p:#?}");
        let p = problems(&format!("process_model: multi_process\n{listener}{route}mqtt: {{}}\n"));
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with("5:11 `mqtt: websocket` is served by one process's broker"), "{p:#?}");
        let p = problems(&format!("{listener}routes:\n  - match: {{ path: /mqtt }}\n    mqtt: tcp\n"));
        assert!(p.len() == 1 && p[0].contains("unknown variant `tcp`"), "{p:#?}");
        let p = problems(&format!("{listener}routes:\n  - {{ mqtt: websocket, handler: echo }}\nmqtt: {{}}\n"));
        assert!(p.len() == 1 && p[0].contains("exactly one target"), "{p:#?}");
        // Over wss, a client certificate can name the user: an HTTP listener asking for one will do.
        let mtls = "listeners:\n  - name: w\n    address: 127.0.0.1:8443\n    tls: { certificates: [ { cert: a.pem, key: a.key } ], client_ca: ca.pem }\n";
        let auth = "mqtt: { auth: { use_certificate_as_username: true } }\n";
        assert!(problems(&format!("{mtls}{route}{auth}")).is_empty());
        let p = problems(&format!("{mtls}{auth}"));
        assert!(p.len() == 1 && p[0].contains("no listener MQTT clients reach asks for client certificates"), "{p:#?}");
    }

    #[test]
    fn unknown_keys_and_values_are_refused() {
        let p = problems("listeners: [ { name: m, address: 127.0.0.1:1883, protocol: mqttt } ]\nmqtt: { limit: {} }\n");
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].contains("unknown variant `mqttt`"), "{p:#?}");
        assert!(p[1].contains("unknown field `limit`"), "{p:#?}");
        let p = problems("listeners: [ { name: m, address: 127.0.0.1:1, protocol: mqtt } ]\nmqtt: { persistence: { path: d, on_corrupt_store: ignore } }\n");
        assert!(p.len() == 1 && p[0].contains("unknown variant `ignore`"), "{p:#?}");
    }

    #[test]
    fn mqtt_listeners_work_with_worker_processes_and_speak_no_http_alpn() {
        let p = problems(
            "process_model: multi_process\nlisteners:\n  - name: m\n    address: 127.0.0.1:8883\n    protocol: mqtt\n    tls: { certificates: [ { cert: a.pem, key: a.key } ], alpn: [mqtt, h2] }\n",
        );
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].contains("ALPN protocol \"h2\" on an MQTT listener"), "{p:#?}");
    }
}
