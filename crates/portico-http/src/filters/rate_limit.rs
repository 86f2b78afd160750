//! `rate_limit`: token buckets in the node's shared table (`portico_core::rate_table`), keyed by the client's
//! address, a header, a JWT claim, an API key's name or the route, so a limit holds across every worker thread
//! and worker process.
//!
//! A request takes a token from its key's bucket; when there is none it is answered `429` with `Retry-After`
//! (whole seconds until a token is back) and the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers (`"name";q=100;w=1` and `"name";r=0;t=1`). With `headers` (the
//! default) the responses that pass carry both fields too, so a client can slow down before it is refused.
//! A key the request does not have (no such header, no claim, no API key) falls back to the client's
//! address, so leaving a header out does not escape the limit.
//!
//! Buckets are named by a hash of the policy's name, the key's kind and the key itself: filters with the
//! same name and key share buckets (one budget across routes), and a reload that keeps the name keeps the
//! counts.

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::message::LocalResponse;
use ipnet::IpNet;
use portico_config::{RateKey, RateLimitFilter};
use portico_core::rate_table::{self, RateTable};
use std::net::IpAddr;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64_with_seed;

#[derive(Debug)]
pub struct RateLimit {
    table: &'static RateTable,
    key: RateKey,
    trusted: Vec<IpNet>,
    /// The seeds of this policy's hashes: for its own key, and for the client's address when the key is absent.
    seed: u64,
    fallback_seed: u64,
    interval_ns: u64,
    burst: u64,
    /// `RateLimit-Policy`'s value.
    policy: Arc<str>,
    /// The start of `RateLimit`'s value: `"name";r=`.
    limit_prefix: Box<str>,
    headers: bool,
    shadow: bool,
}

const RATELIMIT_POLICY: &str = "ratelimit-policy";
const RATELIMIT: &str = "ratelimit";
const NS: u64 = 1_000_000_000;

thread_local! {
    static NAMES: (Arc<str>, Arc<str>) = (Arc::from(RATELIMIT_POLICY), Arc::from(RATELIMIT));
}

impl RateLimit {
    /// `site` is the route the filter belongs to (`None` for a global filter): the policy's default name.
    pub fn new(config: &RateLimitFilter, site: Option<&str>) -> Result<RateLimit, (String, String)> {
        let table = rate_table::global()
            .ok_or_else(|| ("rate_limit".to_string(), "the rate-limit table could not be made".to_string()))?;
        let mut trusted = Vec::with_capacity(config.trusted_proxies.len());
        for (j, text) in config.trusted_proxies.iter().enumerate() {
            trusted
                .push(portico_config::parse_cidr(text).map_err(|m| (format!("rate_limit.trusted_proxies[{j}]"), m))?);
        }
        let name: Arc<str> = Arc::from(config.name.as_deref().or(site).unwrap_or("global"));
        let seed_of = |kind: &str| xxh3_64_with_seed(format!("{name}\0{kind}").as_bytes(), 0x5241_5445);
        let (count, period) = (config.rate.count, config.rate.period);
        // `w` is whole seconds: a period under a second is stated as its count per second.
        let (q, w) = if period.as_secs() == 0 {
            ((count as f64 / period.as_secs_f64()).ceil() as u64, 1)
        } else {
            (count, period.as_secs() + u64::from(period.subsec_nanos() > 0))
        };
        Ok(RateLimit {
            table,
            trusted: IpNet::aggregate(&trusted),
            seed: seed_of(config.key.kind()),
            fallback_seed: seed_of("ip"),
            key: config.key.clone(),
            interval_ns: config.rate.interval_ns(),
            burst: config.burst(),
            policy: Arc::from(format!("\"{name}\";q={q};w={w}")),
            limit_prefix: format!("\"{name}\";r=").into(),
            headers: config.headers,
            shadow: config.shadow,
        })
    }

    /// The hash of the request's key: its own, or its client's address when it has none.
    fn key_hash(&self, head: &RequestHead, cx: &RequestCx<'_>) -> u64 {
        let own = match &self.key {
            RateKey::Ip => None,
            RateKey::Route => Some(xxh3_64_with_seed(cx.denials.route.as_bytes(), self.seed)),
            RateKey::Header(name) => head
                .values(name)
                .next()
                .map(crate::codec::trim)
                .filter(|v| !v.is_empty())
                .map(|v| xxh3_64_with_seed(v, self.seed)),
            RateKey::ApiKey => head
                .edits
                .as_ref()
                .and_then(|e| e.key_name.as_deref())
                .map(|n| xxh3_64_with_seed(n.as_bytes(), self.seed)),
            RateKey::Claim(claim) => {
                head.edits.as_ref().and_then(|e| e.claims.as_ref()).and_then(|c| c.get(claim)).and_then(|v| match v {
                    serde_json::Value::String(s) => Some(xxh3_64_with_seed(s.as_bytes(), self.seed)),
                    serde_json::Value::Null => None,
                    other => Some(xxh3_64_with_seed(other.to_string().as_bytes(), self.seed)),
                })
            }
        };
        own.unwrap_or_else(|| {
            let client = super::ip::client_address(&self.trusted, head, cx.peer).unwrap_or(cx.peer.to_canonical());
            let bytes = match client {
                IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                IpAddr::V6(v6) => v6.octets(),
            };
            xxh3_64_with_seed(&bytes, self.fallback_seed)
        })
    }

    /// `RateLimit`'s value: what is left, and in how many seconds the bucket is full again. Written by hand
    /// into a buffer on the stack: `format!` cost three times as much, on every response that passes.
    fn limit_value(&self, remaining: u64, full_in_ns: u64) -> Arc<str> {
        let mut buf = [0u8; 256];
        let prefix = self.limit_prefix.as_bytes();
        if prefix.len() > buf.len() - 48 {
            return Arc::from(format!("{}{remaining};t={}", self.limit_prefix, full_in_ns.div_ceil(NS)));
        }
        buf[..prefix.len()].copy_from_slice(prefix);
        let mut at = prefix.len();
        at += write_u64(&mut buf[at..], remaining);
        buf[at..at + 3].copy_from_slice(b";t=");
        at += 3;
        at += write_u64(&mut buf[at..], full_in_ns.div_ceil(NS));
        Arc::from(std::str::from_utf8(&buf[..at]).unwrap_or_default())
    }
}

/// Writes `n` in decimal at the start of `out` (which has room for 20 digits); returns how many bytes.
fn write_u64(out: &mut [u8], mut n: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut len = 0;
    loop {
        digits[19 - len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out[..len].copy_from_slice(&digits[20 - len..]);
    len
}

impl Filter for RateLimit {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let key = self.key_hash(head, cx);
        let decision = self.table.take(key, rate_table::now_ns(), self.interval_ns, self.burst);
        if decision.allowed {
            if self.headers && !self.shadow {
                let value = self.limit_value(decision.remaining, decision.full_in_ns);
                let edits = head.edits_mut();
                let (policy, limit) = NAMES.with(|n| n.clone());
                edits.response_headers.reserve_exact(2);
                edits.response_headers.push((policy, self.policy.clone()));
                edits.response_headers.push((limit, value));
            }
            return Step::Continue;
        }
        let who = head.edits.as_ref().and_then(|e| e.identity.clone());
        cx.denials.record(Denial::RateLimited, self.shadow, cx.peer, who.as_deref());
        if self.shadow {
            return Step::Continue;
        }
        let mut answer = LocalResponse::text(429, "too many requests");
        let retry_after = decision.retry_after_ns.div_ceil(NS).max(1);
        answer.headers.push(("retry-after".into(), retry_after.to_string().into()));
        answer.headers.push((RATELIMIT_POLICY.into(), (*self.policy).into()));
        answer.headers.push((RATELIMIT.into(), (*self.limit_value(0, decision.full_in_ns)).into()));
        Step::Respond(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::auth_basic::tests::head;
    use crate::filters::Denials;
    use std::time::Duration;

    fn config(rate: &str, burst: u64, key: RateKey) -> RateLimitFilter {
        RateLimitFilter {
            rate: portico_config::parse_rate(rate).unwrap(),
            burst: Some(burst),
            key,
            trusted_proxies: vec![],
            name: Some(format!("t{}", fastrand::u64(..))),
            headers: true,
            shadow: false,
        }
    }

    fn run(f: &RateLimit, h: &mut RequestHead, peer: &str, denials: &Denials) -> Step {
        let cx = RequestCx { matched_path: b"/x", captures: &[], prefix: None, peer: peer.parse().unwrap(), denials };
        f.on_request(h, &cx)
    }

    fn header<'a>(r: &'a LocalResponse, name: &str) -> &'a str {
        r.headers.iter().find(|(n, _)| &**n == name).map_or("", |(_, v)| v)
    }

    #[test]
    fn a_client_gets_its_burst_then_429_with_the_draft_s_fields() {
        let f = RateLimit::new(&config("1/h", 2, RateKey::Ip), Some("api")).unwrap();
        let denials = Denials::new("api");
        for remaining in [1, 0] {
            let mut h = head("");
            assert!(matches!(run(&f, &mut h, "192.0.2.1", &denials), Step::Continue));
            let extra = &h.edits.as_ref().unwrap().response_headers;
            assert_eq!(&*extra[0].0, "ratelimit-policy");
            assert!(extra[0].1.ends_with("\";q=1;w=3600"), "{}", extra[0].1);
            assert!(extra[1].1.contains(&format!(";r={remaining};t=")), "{}", extra[1].1);
        }
        let Step::Respond(r) = run(&f, &mut head(""), "192.0.2.1", &denials) else { panic!("a third request passed") };
        assert_eq!(r.status, 429);
        let retry: u64 = header(&r, "retry-after").parse().unwrap();
        assert!((3590..=3600).contains(&retry), "{retry}");
        assert!(header(&r, "ratelimit").contains(";r=0;t="));
        assert_eq!(denials.count(Denial::RateLimited, false), 1);
        // Another client has its own bucket; an IPv4-mapped address is the same client.
        assert!(matches!(run(&f, &mut head(""), "192.0.2.2", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut head(""), "::ffff:192.0.2.1", &denials), Step::Respond(_)));
    }

    #[test]
    fn keys_by_header_route_and_api_key_with_the_address_as_fallback() {
        let denials = Denials::new("r");
        let f = RateLimit::new(&config("1/h", 1, RateKey::Header("x-tenant".into())), None).unwrap();
        assert!(matches!(run(&f, &mut head("x-tenant: a\r\n"), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut head("x-tenant: b\r\n"), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut head("x-tenant:  a \r\n"), "192.0.2.9", &denials), Step::Respond(_)));
        // Without the header: the address's bucket, once.
        assert!(matches!(run(&f, &mut head(""), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut head(""), "192.0.2.1", &denials), Step::Respond(_)));

        let f = RateLimit::new(&config("1/h", 1, RateKey::Route), None).unwrap();
        assert!(matches!(run(&f, &mut head(""), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut head(""), "192.0.2.2", &denials), Step::Respond(_)), "one bucket per route");
        assert!(matches!(run(&f, &mut head(""), "192.0.2.2", &Denials::new("other")), Step::Continue));

        let f = RateLimit::new(&config("1/h", 1, RateKey::ApiKey), None).unwrap();
        let with_key = |name: &str| {
            let mut h = head("");
            h.edits_mut().key_name = Some(Arc::from(name));
            h
        };
        assert!(matches!(run(&f, &mut with_key("mobile"), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut with_key("mobile"), "192.0.2.2", &denials), Step::Respond(_)));
        assert!(matches!(run(&f, &mut with_key("batch"), "192.0.2.1", &denials), Step::Continue));

        let f = RateLimit::new(&config("1/h", 1, RateKey::Claim("sub".into())), None).unwrap();
        let with_sub = |sub: serde_json::Value| {
            let mut h = head("");
            let mut claims = serde_json::Map::new();
            claims.insert("sub".into(), sub);
            h.edits_mut().claims = Some(Arc::new(claims));
            h
        };
        assert!(matches!(run(&f, &mut with_sub("alice".into()), "192.0.2.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut with_sub("alice".into()), "192.0.2.3", &denials), Step::Respond(_)));
        assert!(matches!(run(&f, &mut with_sub(7.into()), "192.0.2.1", &denials), Step::Continue));
    }

    #[test]
    fn trusted_proxies_name_the_client() {
        let mut c = config("1/h", 1, RateKey::Ip);
        c.trusted_proxies = vec!["10.0.0.0/8".into()];
        let f = RateLimit::new(&c, None).unwrap();
        let denials = Denials::new("r");
        let xff = |ip: &str| head(&format!("x-forwarded-for: {ip}\r\n"));
        assert!(matches!(run(&f, &mut xff("198.51.100.1"), "10.0.0.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut xff("198.51.100.2"), "10.0.0.1", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut xff("198.51.100.1"), "10.0.0.2", &denials), Step::Respond(_)));
        // An untrusted peer's header is not read.
        assert!(matches!(run(&f, &mut xff("198.51.100.3"), "192.0.2.7", &denials), Step::Continue));
        assert!(matches!(run(&f, &mut xff("198.51.100.4"), "192.0.2.7", &denials), Step::Respond(_)));
    }

    #[test]
    fn shadow_mode_counts_and_lets_through_without_headers() {
        let mut c = config("1/h", 1, RateKey::Ip);
        c.shadow = true;
        let f = RateLimit::new(&c, None).unwrap();
        let denials = Denials::new("r");
        for _ in 0..3 {
            let mut h = head("");
            assert!(matches!(run(&f, &mut h, "192.0.2.1", &denials), Step::Continue));
            assert!(h.edits.as_ref().is_none_or(|e| e.response_headers.is_empty()));
        }
        assert_eq!((denials.count(Denial::RateLimited, true), denials.count(Denial::RateLimited, false)), (2, 0));
    }

    #[test]
    fn the_limit_field_is_written_by_hand_as_format_would() {
        let f = RateLimit::new(&config("1/h", 1, RateKey::Ip), Some("p")).unwrap();
        for (r, t) in [(0, 0), (7, 1), (u64::MAX, u64::MAX), (1_000_000, 999_999_999_999)] {
            let expected = format!("{}{r};t={}", f.limit_prefix, t.div_ceil(NS));
            assert_eq!(&*f.limit_value(r, t), expected);
        }
        let mut long = config("1/h", 1, RateKey::Ip);
        long.name = Some("n".repeat(300));
        let f = RateLimit::new(&long, None).unwrap();
        assert_eq!(&*f.limit_value(3, 2 * NS), format!("\"{}\";r=3;t=2", "n".repeat(300)));
    }

    #[test]
    fn the_policy_states_the_rate_in_whole_seconds() {
        let f = |rate: &str| RateLimit::new(&config(rate, 1, RateKey::Ip), Some("p")).unwrap().policy;
        let tail = |p: Arc<str>| p.split_once(';').map(|(_, t)| t.to_string()).unwrap();
        assert_eq!(tail(f("100/s")), "q=100;w=1");
        assert_eq!(tail(f("600/m")), "q=600;w=60");
        assert_eq!(tail(f("5/10s")), "q=5;w=10");
        assert_eq!(tail(f("10/100ms")), "q=100;w=1");
        assert_eq!(
            Duration::from_nanos(RateLimit::new(&config("4/s", 1, RateKey::Ip), None).unwrap().interval_ns),
            Duration::from_millis(250)
        );
    }
}
