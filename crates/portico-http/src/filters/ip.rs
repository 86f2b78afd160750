//! `ip`: allow and deny lists of address ranges for the client's address; `403` for a client refused.
//!
//! The client is the peer, unless the peer is one of `trusted_proxies`: then `x-forwarded-for` (every value,
//! in order, as one list) is read from its right end, each trusted address skipped, and the first address that
//! is not a trusted proxy is the client (what nginx's `real_ip_recursive on` does). The leftmost address is
//! the client when every hop is trusted. A hop that is not an address (`unknown`, garbage) ends the walk with
//! no client: such a request is refused (`unknown_client`), since no list can be applied to it. A `deny`
//! range wins over an `allow` range; with `allow` ranges, an address in none of them is refused. IPv4-mapped
//! IPv6 addresses (`::ffff:10.0.0.1`, what a dual-stack listener sees) are taken as the IPv4 address.
//!
//! The listeners do not speak the PROXY protocol, so it is not a source of the client's address here.

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::message::LocalResponse;
use ipnet::IpNet;
use portico_config::IpFilter;
use std::net::{IpAddr, SocketAddr};

#[derive(Debug)]
pub struct Ip {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
    trusted: Vec<IpNet>,
    shadow: bool,
}

/// The ranges of `list` (checked by validation), merged where they overlap or touch.
fn ranges(list: &[String], key: &str) -> Result<Vec<IpNet>, (String, String)> {
    let mut nets = Vec::with_capacity(list.len());
    for (j, text) in list.iter().enumerate() {
        nets.push(portico_config::parse_cidr(text).map_err(|m| (format!("ip.{key}[{j}]"), m))?);
    }
    Ok(IpNet::aggregate(&nets))
}

fn contains(nets: &[IpNet], ip: IpAddr) -> bool {
    nets.iter().any(|n| n.contains(&ip))
}

/// One `x-forwarded-for` hop: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`).
fn hop(text: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(crate::codec::trim(text)).ok()?;
    let ip = text
        .parse::<IpAddr>()
        .or_else(|_| text.parse::<SocketAddr>().map(|s| s.ip()))
        .or_else(|_| text.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>())
        .ok()?;
    Some(ip.to_canonical())
}

impl Ip {
    pub fn new(config: &IpFilter) -> Result<Ip, (String, String)> {
        Ok(Ip {
            allow: ranges(&config.allow, "allow")?,
            deny: ranges(&config.deny, "deny")?,
            trusted: ranges(&config.trusted_proxies, "trusted_proxies")?,
            shadow: config.shadow,
        })
    }

    /// The client's address: the peer's, or what trusted proxies say it is; `None` when a trusted proxy's
    /// `x-forwarded-for` holds something that is not an address.
    pub(crate) fn client(&self, head: &RequestHead, peer: IpAddr) -> Option<IpAddr> {
        client_address(&self.trusted, head, peer)
    }

    fn allows(&self, ip: IpAddr) -> bool {
        !contains(&self.deny, ip) && (self.allow.is_empty() || contains(&self.allow, ip))
    }
}

/// The client's address: `peer`, or, when `peer` is one of `trusted`, the rightmost address of
/// `x-forwarded-for` that is not; `None` when a trusted proxy's `x-forwarded-for` holds something that is not
/// an address.
pub(crate) fn client_address(trusted: &[IpNet], head: &RequestHead, peer: IpAddr) -> Option<IpAddr> {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !contains(trusted, peer) {
        return Some(peer);
    }
    let values: Vec<&[u8]> = head.values("x-forwarded-for").collect();
    let mut leftmost = peer;
    for value in values.iter().rev() {
        for text in value.rsplit(|&b| b == b',') {
            if crate::codec::trim(text).is_empty() {
                continue;
            }
            let ip = hop(text)?;
            if !contains(trusted, ip) {
                return Some(ip);
            }
            leftmost = ip;
        }
    }
    Some(leftmost)
}

impl Filter for Ip {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let (denial, client) = match self.client(head, cx.peer) {
            Some(ip) if self.allows(ip) => return Step::Continue,
            Some(ip) => (Denial::IpDenied, ip),
            None => (Denial::IpUnknown, cx.peer),
        };
        cx.denials.record(denial, self.shadow, client, None);
        if self.shadow {
            return Step::Continue;
        }
        Step::Respond(LocalResponse::text(403, "this client address is not allowed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::auth_basic::tests::head;
    use crate::filters::Denials;

    fn ip(allow: &[&str], deny: &[&str], trusted: &[&str]) -> Ip {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        Ip::new(&IpFilter { allow: list(allow), deny: list(deny), trusted_proxies: list(trusted), shadow: false })
            .unwrap()
    }

    fn addr(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn deny_wins_over_allow() {
        let f = ip(&["10.0.0.0/8", "2001:db8::/32"], &["10.1.0.0/16"], &[]);
        assert!(f.allows(addr("10.2.3.4")) && f.allows(addr("2001:db8::1")));
        assert!(!f.allows(addr("10.1.3.4")) && !f.allows(addr("192.168.1.1")) && !f.allows(addr("::1")));
        let only_deny = ip(&[], &["192.0.2.0/24"], &[]);
        assert!(only_deny.allows(addr("10.0.0.1")) && !only_deny.allows(addr("192.0.2.9")));
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_hop() {
        let f = ip(&["0.0.0.0/0"], &[], &["10.0.0.0/8", "::1"]);
        let h = head("x-forwarded-for: 198.51.100.7, 203.0.113.9\r\nx-forwarded-for: 10.0.0.2 , 10.0.0.3\r\n");
        // An untrusted peer's header is ignored.
        assert_eq!(f.client(&h, addr("192.0.2.1")), Some(addr("192.0.2.1")));
        // A trusted peer: the two trusted hops skipped, the first untrusted one taken (not the leftmost).
        assert_eq!(f.client(&h, addr("10.0.0.1")), Some(addr("203.0.113.9")));
        assert_eq!(f.client(&h, addr("::ffff:10.0.0.1")), Some(addr("203.0.113.9")), "IPv4-mapped");
        assert_eq!(f.client(&head(""), addr("::1")), Some(addr("::1")), "no header: the peer");
        let all_trusted = head("x-forwarded-for: 10.9.9.9, 10.0.0.2\r\n");
        assert_eq!(f.client(&all_trusted, addr("10.0.0.1")), Some(addr("10.9.9.9")));
        let ports = head("x-forwarded-for: [2001:db8::5]:443, 192.0.2.8:80\r\n");
        assert_eq!(f.client(&ports, addr("10.0.0.1")), Some(addr("192.0.2.8")));
        let garbage = head("x-forwarded-for: 198.51.100.7, unknown\r\n");
        assert_eq!(f.client(&garbage, addr("10.0.0.1")), None);
    }

    #[test]
    fn refused_clients_get_403_unless_shadowed() {
        let denials = Denials::new("r");
        let run = |f: &Ip, extra: &str, peer: &str| {
            let cx = RequestCx { matched_path: b"/", captures: &[], prefix: None, peer: addr(peer), denials: &denials };
            f.on_request(&mut head(extra), &cx)
        };
        let f = ip(&["127.0.0.0/8"], &[], &["127.0.0.1"]);
        assert!(matches!(run(&f, "", "127.0.0.2"), Step::Continue));
        let Step::Respond(r) = run(&f, "x-forwarded-for: 192.0.2.1\r\n", "127.0.0.1") else { panic!("passed") };
        assert_eq!(r.status, 403);
        assert!(matches!(run(&f, "x-forwarded-for: bogus\r\n", "127.0.0.1"), Step::Respond(_)));
        let mut shadowed = ip(&["127.0.0.0/8"], &[], &["127.0.0.1"]);
        shadowed.shadow = true;
        assert!(matches!(run(&shadowed, "x-forwarded-for: 192.0.2.1\r\n", "127.0.0.1"), Step::Continue));
        assert_eq!((denials.count(Denial::IpDenied, false), denials.count(Denial::IpUnknown, false)), (1, 1));
        assert_eq!(denials.count(Denial::IpDenied, true), 1);
    }
}
