//! The syntax of topic names and topic filters (specification 4.7 and, for `$share/`, 4.8.2). Matching a name
//! against a filter is the router's business, not the codec's.

/// The prefix of a v5 shared subscription's filter.
pub const SHARE_PREFIX: &str = "$share/";

/// Whether `name` is a valid topic name: at least one character [MQTT-4.7.3-1] and no wildcard
/// [MQTT-3.3.2-2], [MQTT-4.7.0-1]. (An empty name with a Topic Alias is the PUBLISH decoder's concern.)
pub fn is_valid_topic_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['+', '#'])
}

/// Whether `filter` is a valid topic filter: at least one character [MQTT-4.7.3-1]; `#` alone in the last
/// level [MQTT-4.7.1-1]; `+` alone in its level [MQTT-4.7.1-2]. With `shared_subscriptions` (v5), a filter
/// starting `$share/` must name a share of at least one character without `/`, `+` or `#`, followed by `/`
/// and a valid filter [MQTT-4.8.2-1], [MQTT-4.8.2-2]; before v5 such a filter is an ordinary one.
pub fn is_valid_topic_filter(filter: &str, shared_subscriptions: bool) -> bool {
    if shared_subscriptions {
        if let Some((_, inner)) = split_shared(filter) {
            return inner.is_some_and(is_valid_plain_filter);
        }
    }
    is_valid_plain_filter(filter)
}

/// For a filter starting `$share/`: the share name and, when it is well-formed, the filter after it.
/// `None` when `filter` is not a shared subscription.
pub fn split_shared(filter: &str) -> Option<(&str, Option<&str>)> {
    let rest = filter.strip_prefix(SHARE_PREFIX)?;
    let Some((share, inner)) = rest.split_once('/') else { return Some((rest, None)) };
    let share_ok = !share.is_empty() && !share.contains(['+', '#']);
    Some((share, share_ok.then_some(inner)))
}

fn is_valid_plain_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let is_last = levels.peek().is_none();
        match level {
            "#" if is_last => {}
            "+" => {}
            _ if level.contains(['+', '#']) => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Specification 4.7.1.2: the multi-level wildcard's examples.
    #[test]
    fn multi_level_wildcard_examples_4_7_1_2() {
        assert!(is_valid_topic_filter("sport/tennis/player1/#", false));
        assert!(is_valid_topic_filter("sport/#", false));
        assert!(is_valid_topic_filter("#", false));
        assert!(!is_valid_topic_filter("sport/tennis#", false));
        assert!(!is_valid_topic_filter("sport/tennis/#/ranking", false));
    }

    /// Specification 4.7.1.3: the single-level wildcard's examples.
    #[test]
    fn single_level_wildcard_examples_4_7_1_3() {
        for valid in ["+", "+/tennis/#", "sport/+/player1", "/+", "+/+", "/finance"] {
            assert!(is_valid_topic_filter(valid, false), "{valid}");
        }
        assert!(!is_valid_topic_filter("sport+", false));
        assert!(!is_valid_topic_filter("sport/+x", false));
    }

    #[test]
    fn empty_filter_is_refused_mqtt_4_7_3_1() {
        assert!(!is_valid_topic_filter("", false));
        assert!(!is_valid_topic_name(""));
    }

    #[test]
    fn topic_names_refuse_wildcards_mqtt_3_3_2_2() {
        assert!(is_valid_topic_name("sport/tennis/player1"));
        assert!(is_valid_topic_name("/"));
        assert!(is_valid_topic_name("$SYS/broker/uptime"));
        assert!(!is_valid_topic_name("sport/+"));
        assert!(!is_valid_topic_name("sport/#"));
        assert!(!is_valid_topic_name("a#b"));
    }

    /// Specification 4.8.2: `$share/{ShareName}/{filter}`.
    #[test]
    fn shared_subscriptions_mqtt_4_8_2_1_and_2() {
        assert!(is_valid_topic_filter("$share/group/sport/#", true));
        assert!(is_valid_topic_filter("$share/g/+", true));
        assert!(!is_valid_topic_filter("$share//sport", true), "empty share name");
        assert!(!is_valid_topic_filter("$share/group", true), "no filter");
        assert!(!is_valid_topic_filter("$share/group/", true), "empty filter");
        assert!(!is_valid_topic_filter("$share/gr+oup/a", true), "wildcard in share name");
        assert!(!is_valid_topic_filter("$share/#/a", true), "wildcard as share name");
        // Before v5 it is an ordinary filter.
        assert!(is_valid_topic_filter("$share/group", false));
    }
}
