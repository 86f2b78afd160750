//! Topic names and filters as the broker uses them: whether a name matches a filter (specification 4.7),
//! with the rule that a filter starting with a wildcard does not match a name starting with `$` [MQTT-4.7.2-1],
//! and a filter split into its shared-subscription group and the filter proper (4.8.2).
//!
//! The syntax checks themselves are the codec's ([`crate::codec::topic`]): a packet whose topic name or filter
//! is invalid never reaches the broker. They are re-exported here so a caller has one place to look.

pub use crate::codec::topic::{is_valid_topic_filter, is_valid_topic_name, split_shared, SHARE_PREFIX};

/// A topic filter as a SUBSCRIBE carries it, split into the shared-subscription group (if any) and the filter
/// the router matches names against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterRef<'a> {
    /// `Some(group)` for `$share/group/filter`.
    pub share: Option<&'a str>,
    /// The filter proper (for a shared subscription, the part after the group).
    pub filter: &'a str,
}

impl<'a> FilterRef<'a> {
    /// Splits `full`. A `$share/` filter without a valid group and filter (which the codec refuses in v5) is
    /// taken as an ordinary filter, as MQTT 3.1.1 reads it.
    pub fn parse(full: &'a str) -> FilterRef<'a> {
        match split_shared(full) {
            Some((group, Some(filter))) => FilterRef { share: Some(group), filter },
            _ => FilterRef { share: None, filter: full },
        }
    }

    pub fn is_shared(&self) -> bool {
        self.share.is_some()
    }
}

/// Whether topic `name` matches topic `filter` (without a `$share/` prefix). `+` matches one whole level,
/// `#` (last) matches the parent level and any number below it; neither matches a first level starting with
/// `$` [MQTT-4.7.2-1]. Both arguments are assumed valid.
pub fn matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut names = name.split('/');
    for level in filter.split('/') {
        match level {
            "#" => return true,
            "+" => {
                if names.next().is_none() {
                    return false;
                }
            }
            literal => {
                if names.next() != Some(literal) {
                    return false;
                }
            }
        }
    }
    names.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of specification 4.7.1.2 and 4.7.1.3.
    #[test]
    fn wildcard_examples_of_the_specification() {
        assert!(matches("sport/tennis/player1/#", "sport/tennis/player1"));
        assert!(matches("sport/tennis/player1/#", "sport/tennis/player1/ranking"));
        assert!(matches("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"));
        assert!(matches("sport/#", "sport"));
        assert!(matches("#", "sport/tennis"));
        assert!(matches("sport/tennis/+", "sport/tennis/player1"));
        assert!(!matches("sport/tennis/+", "sport/tennis/player1/ranking"));
        assert!(matches("sport/+", "sport/"));
        assert!(!matches("sport/+", "sport"));
        assert!(matches("+/+", "/finance"));
        assert!(matches("/+", "/finance"));
        assert!(!matches("+", "/finance"));
        assert!(matches("+", "finance"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
    }

    /// [MQTT-4.7.2-1]: `#` and `+` in the first level do not match `$`-topics; a literal `$SYS` does.
    #[test]
    fn dollar_topics_are_not_matched_by_leading_wildcards_mqtt_4_7_2_1() {
        assert!(!matches("#", "$SYS/broker/uptime"));
        assert!(!matches("+/monitor/Clients", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/#", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/monitor/+", "$SYS/monitor/Clients"));
    }

    #[test]
    fn shared_filters_split_into_group_and_filter() {
        assert_eq!(FilterRef::parse("$share/g/a/+"), FilterRef { share: Some("g"), filter: "a/+" });
        assert_eq!(FilterRef::parse("a/+"), FilterRef { share: None, filter: "a/+" });
        assert_eq!(FilterRef::parse("$share/g"), FilterRef { share: None, filter: "$share/g" });
    }
}
