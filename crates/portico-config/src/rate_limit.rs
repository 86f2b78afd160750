//! The `rate_limit` filter's settings (token buckets: a rate, a burst, and what a bucket belongs to) and the
//! node-wide `rate_limits:` section (the size of the shared table every bucket lives in).

use crate::fields::is_token;
use serde::{de, Deserialize, Deserializer};
use std::fmt;
use std::time::Duration;

/// `rate_limit:` token buckets keyed by the client's address, a header, a JWT claim, an API key's name, or the
/// route, counted across every worker and worker process of the node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitFilter {
    /// How fast tokens come back: `100/s`, `600/m`, `1000/h`, `10000/d`, or `N/DURATION` (`5/10s`).
    pub rate: Rate,
    /// How many requests may come at once (the bucket's size). The rate's count when not given.
    #[serde(default)]
    pub burst: Option<u64>,
    /// What a bucket belongs to: `ip` (the default), `route`, `api_key`, `{ header: NAME }` or `{ claim: NAME }`.
    #[serde(default)]
    pub key: RateKey,
    /// Peers whose `x-forwarded-for` says who the client is (as for the `ip` filter), for `key: ip`.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The policy's name in the `RateLimit-Policy` and `RateLimit` headers. Filters with the same name and key
    /// share their buckets. The route's name by default (`global` for a global filter).
    #[serde(default)]
    pub name: Option<String>,
    /// Send `RateLimit-Policy` and `RateLimit` on the responses that pass too (a `429` always has them).
    #[serde(default = "yes")]
    pub headers: bool,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

fn yes() -> bool {
    true
}

impl RateLimitFilter {
    /// The bucket's size.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.rate.count)
    }
}

/// A rate: `count` tokens per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u64,
    pub period: Duration,
}

impl Rate {
    /// The time between two tokens, in nanoseconds (at least one).
    pub fn interval_ns(&self) -> u64 {
        (self.period.as_nanos() / u128::from(self.count.max(1))).clamp(1, u128::from(u64::MAX)) as u64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, humantime::format_duration(self.period))
    }
}

/// Reads `100/s`, `20/minute`, `5/10s`.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let hint = "write a count per period, like 100/s, 600/m, 1000/h, 10000/d or 5/10s";
    let (count, period) = text.trim().split_once('/').ok_or_else(|| format!("{text:?} is not a rate; {hint}"))?;
    let count: u64 = count.trim().parse().map_err(|_| format!("{count:?} is not a count of requests; {hint}"))?;
    let period = match period.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3600),
        "d" | "day" => Duration::from_secs(86400),
        other => humantime::parse_duration(other).map_err(|_| format!("{other:?} is not a period; {hint}"))?,
    };
    if count == 0 || period.is_zero() {
        return Err(format!("a rate of {text:?} lets nothing through; {hint}"));
    }
    if period > Duration::from_secs(366 * 86400) {
        return Err(format!("{text:?}: a period longer than a year is not a rate limit"));
    }
    Ok(Rate { count, period })
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate such as \"100/s\" or \"1000/h\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Rate, E> {
                parse_rate(text).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// What a bucket belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RateKey {
    /// The client's address (after `trusted_proxies`).
    #[default]
    Ip,
    /// The route: one bucket for every client of it.
    Route,
    /// The name of the API key an `api_key` filter before this one accepted.
    ApiKey,
    /// A request header's value.
    Header(String),
    /// A claim of the token a `jwt` filter before this one verified.
    Claim(String),
}

impl RateKey {
    pub fn kind(&self) -> &'static str {
        match self {
            RateKey::Ip => "ip",
            RateKey::Route => "route",
            RateKey::ApiKey => "api_key",
            RateKey::Header(_) => "header",
            RateKey::Claim(_) => "claim",
        }
    }
}

impl<'de> Deserialize<'de> for RateKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            header: Option<String>,
            claim: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Word(String),
            Named(Named),
        }
        let hint = "a key is `ip`, `route`, `api_key`, `{ header: NAME }` or `{ claim: NAME }`";
        match Form::deserialize(d).map_err(|_| de::Error::custom(hint))? {
            Form::Word(w) => match w.as_str() {
                "ip" => Ok(RateKey::Ip),
                "route" => Ok(RateKey::Route),
                "api_key" => Ok(RateKey::ApiKey),
                other => Err(de::Error::custom(format!("unknown key {other:?}; {hint}"))),
            },
            Form::Named(Named { header: Some(h), claim: None }) => Ok(RateKey::Header(h)),
            Form::Named(Named { header: None, claim: Some(c) }) => Ok(RateKey::Claim(c)),
            Form::Named(_) => Err(de::Error::custom(hint)),
        }
    }
}

/// `rate_limits:` the node's table of buckets, made at start-up in memory every worker process shares.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    /// Buckets the table holds (16 bytes each, rounded up to a power of two): 1,048,576 (16 MiB) by default.
    /// Read at start-up.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits { max_keys: default_max_keys() }
    }
}

fn default_max_keys() -> usize {
    1 << 20
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

pub(crate) fn validate_rate_limits(r: &RateLimits, err: &mut Report<'_>) {
    if !(64..=1 << 28).contains(&r.max_keys) {
        err("rate_limits.max_keys", format!("{} is not from 64 to 268435456 keys", r.max_keys), None);
    }
}

pub(crate) fn validate_rate_limit(r: &RateLimitFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.rate_limit");
    if r.burst == Some(0) {
        err(&format!("{base}.burst"), "a burst of 0 lets nothing through".into(), Some("at least 1"));
    }
    match &r.key {
        RateKey::Header(h) if !is_token(h) => {
            err(&format!("{base}.key.header"), format!("{h:?} is not a header name"), None);
        }
        RateKey::Claim(c) if c.is_empty() => err(&format!("{base}.key.claim"), "an empty claim name".into(), None),
        _ => {}
    }
    if !r.trusted_proxies.is_empty() && r.key != RateKey::Ip {
        err(&format!("{base}.trusted_proxies"), "trusted_proxies only matter with `key: ip`".into(), None);
    }
    for (j, range) in r.trusted_proxies.iter().enumerate() {
        if let Err(message) = crate::parse_cidr(range) {
            err(&format!("{base}.trusted_proxies[{j}]"), message, Some("an address or a CIDR range"));
        }
    }
    if let Some(name) = &r.name {
        if name.is_empty() || !name.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\') {
            err(
                &format!("{base}.name"),
                format!("{name:?} cannot be a policy's name"),
                Some("printable ASCII without quotes or backslashes"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_str;

    use crate::test_support::{errors, BASE};

    #[test]
    fn rates_are_counts_per_period() {
        assert_eq!(parse_rate("100/s"), Ok(Rate { count: 100, period: Duration::from_secs(1) }));
        assert_eq!(parse_rate(" 5 / 10s "), Ok(Rate { count: 5, period: Duration::from_secs(10) }));
        assert_eq!(parse_rate("1000/h").map(|r| r.interval_ns()), Ok(3_600_000_000));
        assert_eq!(parse_rate("3/s").map(|r| r.interval_ns()), Ok(333_333_333));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("10").is_err());
        assert!(parse_rate("10/fortnight").is_err());
        assert!(parse_rate("x/s").is_err());
    }

    #[test]
    fn the_filter_loads_with_its_defaults() {
        let yaml = "rate_limits: { max_keys: 4096 }\nfilters:\n  - rate_limit: { rate: 100/s }\nroutes:\n  - cluster: api\n    filters:\n      - rate_limit: { rate: 10/m, burst: 3, key: { claim: sub }, name: per-user, shadow: true }\n      - rate_limit: { rate: 5/s, key: { header: x-tenant } }\n      - rate_limit: { rate: 5/s, key: api_key, headers: false }\n";
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let cfg = &loaded.config;
        assert_eq!(cfg.rate_limits.max_keys, 4096);
        let crate::Filter::RateLimit(global) = &cfg.filters[0] else { panic!() };
        assert_eq!((global.burst(), &global.key, global.headers, global.shadow), (100, &RateKey::Ip, true, false));
        let [crate::Filter::RateLimit(a), crate::Filter::RateLimit(b), crate::Filter::RateLimit(c)] =
            &cfg.routes[0].filters[..]
        else {
            panic!()
        };
        assert_eq!(
            (a.burst(), &a.key, a.name.as_deref(), a.shadow),
            (3, &RateKey::Claim("sub".into()), Some("per-user"), true)
        );
        assert_eq!(b.key, RateKey::Header("x-tenant".into()));
        assert_eq!((&c.key, c.headers), (&RateKey::ApiKey, false));
        assert_eq!(RateLimits::default().max_keys, 1 << 20);
    }

    #[test]
    fn mistakes_are_reported_at_their_keys() {
        let route = |f: &str| errors(&format!("routes:\n  - cluster: api\n    filters:\n      - rate_limit: {f}\n"));
        let e = route("{ rate: 10/fortnight }");
        assert!(e.iter().any(|e| e.starts_with("7:") && e.contains("is not a period")), "{e:?}");
        let e = route("{ rate: 10/s, burst: 0 }");
        assert!(e.iter().any(|e| e.contains("a burst of 0")), "{e:?}");
        let e = route("{ rate: 10/s, key: cookie }");
        assert!(e.iter().any(|e| e.contains("unknown key \"cookie\"")), "{e:?}");
        let e = route("{ rate: 10/s, key: { header: \"a b\" } }");
        assert!(e.iter().any(|e| e.contains("is not a header name")), "{e:?}");
        let e = route("{ rate: 10/s, key: route, trusted_proxies: [10.0.0.1] }");
        assert!(e.iter().any(|e| e.contains("only matter with `key: ip`")), "{e:?}");
        let e = route("{ rate: 10/s, name: 'a\"b' }");
        assert!(e.iter().any(|e| e.contains("cannot be a policy's name")), "{e:?}");
        let e = errors("rate_limits: { max_keys: 3 }\n");
        assert!(e.iter().any(|e| e.contains("is not from 64")), "{e:?}");
    }
}
