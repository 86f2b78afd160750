//! `limits`: how large a request may be, and how many connections its client's address may hold. What the
//! head shows is checked in the request hook: the client's open connections (429), the target's length
//! (414), the header fields' count and size (431), a declared body length (413). A body whose size is not
//! declared, or a JSON body whose depth is limited, gets a `BodyCheck` that the places reading it feed as it
//! streams (see `body_check`): 413 for too large, 400 for too deep. Slow connections are caught before any
//! route, while a head arrives (`proxy::read_head`, with the top-level filter's settings: `SlowCap`).

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Step};
use crate::body_check::BodyCheck;
use crate::codec::{BodyFraming, RequestHead};
use crate::message::LocalResponse;
use portico_config::LimitsFilter;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct Limits {
    max_uri_length: Option<u64>,
    max_headers: Option<usize>,
    max_header_bytes: Option<u64>,
    max_body_size: Option<u64>,
    max_json_size: Option<u64>,
    max_json_depth: Option<u32>,
    max_connections: Option<u32>,
    buffer_json: bool,
    shadow: bool,
}

/// The top-level `limits` filter's cap on slow connections, applied while request heads arrive.
#[derive(Debug)]
pub struct SlowCap {
    pub max: u32,
    pub after: Duration,
    pub shadow: bool,
    /// Where refusals are counted: `route=""`, since no route is known yet.
    pub denials: super::Denials,
}

impl SlowCap {
    pub fn of(config: &LimitsFilter, denials: super::Denials) -> Option<Arc<SlowCap>> {
        let max = config.max_slow_connections_per_ip?;
        Some(Arc::new(SlowCap { max, after: config.slow_after.0, shadow: config.shadow, denials }))
    }
}

/// Whether a request's `content-type` says JSON: `application/json`, or any `+json` type.
fn is_json(head: &RequestHead) -> bool {
    head.values("content-type").next().is_some_and(|v| {
        let essence = v.split(|&b| b == b';').next().unwrap_or_default();
        let essence = crate::codec::trim(essence);
        essence.eq_ignore_ascii_case(b"application/json")
            || (essence.len() > 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json"))
    })
}

impl Limits {
    pub fn new(c: &LimitsFilter) -> Limits {
        Limits {
            max_uri_length: c.max_uri_length.map(|s| s.0),
            max_headers: c.max_headers.map(|n| n as usize),
            max_header_bytes: c.max_header_bytes.map(|s| s.0),
            max_body_size: c.max_body_size.map(|s| s.0),
            max_json_size: c.max_json_size.map(|s| s.0),
            max_json_depth: c.max_json_depth,
            max_connections: c.max_connections_per_ip,
            buffer_json: c.buffer_json,
            shadow: c.shadow,
        }
    }

    /// What the head breaks, if anything, with the answer.
    fn head_fault(&self, head: &RequestHead, cx: &RequestCx<'_>, json: bool) -> Option<(Denial, u16, &'static str)> {
        if let Some(max) = self.max_connections {
            if crate::clients::connections(cx.peer) > max {
                return Some((Denial::TooManyConnections, 429, "too many connections from this address"));
            }
        }
        if self.max_uri_length.is_some_and(|max| head.target().len() as u64 > max) {
            return Some((Denial::UriTooLong, 414, "the request target is longer than this route allows"));
        }
        if self.max_headers.is_some_and(|max| head.headers.len() > max) {
            return Some((Denial::TooManyHeaders, 431, "the request has more header fields than this route allows"));
        }
        if let Some(max) = self.max_header_bytes {
            let size: u64 =
                head.headers.iter().map(|(h, _)| (head.header_name(h).len() + head.header_value(h).len()) as u64).sum();
            if size > max {
                return Some((
                    Denial::HeadersTooLarge,
                    431,
                    "the request's header fields are larger than this route allows",
                ));
            }
        }
        if let BodyFraming::Length(n) = head.body {
            if self.max_body_size.is_some_and(|max| n > max) {
                return Some((Denial::BodyTooLarge, 413, "the request body is larger than this route allows"));
            }
            if json && self.max_json_size.is_some_and(|max| n > max) {
                return Some((Denial::JsonTooLarge, 413, "the JSON request body is larger than this route allows"));
            }
        }
        None
    }

    /// The check a body needs as it streams: its size when not declared (a declared one was checked, and
    /// the framing holds the client to it), a JSON body's depth.
    fn body_check(&self, head: &RequestHead, cx: &RequestCx<'_>, json: bool) -> Option<BodyCheck> {
        if head.body == BodyFraming::None {
            return None;
        }
        let declared = matches!(head.body, BodyFraming::Length(_));
        let json_size = self.max_json_size.filter(|_| json);
        let size = match (self.max_body_size, json_size) {
            _ if declared => None,
            (Some(body), Some(json)) if json < body => Some((json, true)),
            (Some(body), _) => Some((body, false)),
            (None, Some(json)) => Some((json, true)),
            (None, None) => None,
        };
        let depth = self.max_json_depth.filter(|_| json);
        if size.is_none() && depth.is_none() {
            return None;
        }
        let (max, json_size) = size.map_or((None, false), |(n, j)| (Some(n), j));
        let mut check = BodyCheck::new((max, json_size), depth, self.shadow, (cx.denials.clone(), cx.peer));
        if self.buffer_json && json {
            check.buffer = self.max_json_size;
        }
        Some(check)
    }
}

impl Filter for Limits {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let json = (self.max_json_size.is_some() || self.max_json_depth.is_some()) && is_json(head);
        if let Some((denial, status, reason)) = self.head_fault(head, cx, json) {
            cx.denials.record(denial, self.shadow, cx.peer, None);
            if !self.shadow {
                return Step::Respond(LocalResponse::text(status, reason));
            }
        }
        if let Some(check) = self.body_check(head, cx, json) {
            // A second limits filter on the route (a global one and the route's own): both checks apply.
            let edits = head.edits_mut();
            edits.body_check = Some(match edits.body_check.take() {
                Some(before) => Arc::new(BodyCheck::both(before, check)),
                None => Arc::new(check),
            });
        }
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::auth_basic::tests::head;
    use crate::filters::Denials;

    fn limits(c: LimitsFilter) -> Limits {
        Limits::new(&c)
    }

    fn run(f: &Limits, h: &mut RequestHead, denials: &Denials) -> Option<u16> {
        let cx = RequestCx {
            matched_path: b"/",
            captures: &[],
            prefix: None,
            peer: std::net::IpAddr::from([192, 0, 2, 1]),
            denials,
        };
        match f.on_request(h, &cx) {
            Step::Respond(r) => Some(r.status),
            _ => None,
        }
    }

    #[test]
    fn the_head_is_checked_first() {
        let denials = Denials::new("r");
        let size = |n| Some(portico_config::ByteSize(n));
        let f = limits(LimitsFilter { max_uri_length: size(10), ..Default::default() });
        assert_eq!(run(&f, &mut head(""), &denials), None, "GET / is short");
        let f = limits(LimitsFilter { max_uri_length: size(0), ..Default::default() });
        assert_eq!(run(&f, &mut head(""), &denials), Some(414));
        let f = limits(LimitsFilter { max_headers: Some(2), ..Default::default() });
        assert_eq!(run(&f, &mut head("a: 1\r\n"), &denials), None);
        assert_eq!(run(&f, &mut head("a: 1\r\nb: 2\r\n"), &denials), Some(431));
        let f = limits(LimitsFilter { max_header_bytes: size(20), ..Default::default() });
        assert_eq!(run(&f, &mut head(&format!("x-long: {}\r\n", "v".repeat(20))), &denials), Some(431));
        let f = limits(LimitsFilter { max_body_size: size(10), ..Default::default() });
        assert_eq!(run(&f, &mut head("content-length: 11\r\n"), &denials), Some(413));
        let mut h = head("content-length: 10\r\n");
        assert_eq!(run(&f, &mut h, &denials), None);
        assert!(h.edits.as_ref().is_none_or(|e| e.body_check.is_none()), "a declared length needs no counting");
        let mut h = head("transfer-encoding: chunked\r\n");
        assert_eq!(run(&f, &mut h, &denials), None);
        assert!(h.edits.as_ref().is_some_and(|e| e.body_check.is_some()), "a chunked body is counted");
        assert_eq!(denials.count(Denial::UriTooLong, false), 1);
        assert_eq!(denials.count(Denial::TooManyHeaders, false), 1);
        assert_eq!(denials.count(Denial::BodyTooLarge, false), 1);
    }

    #[test]
    fn json_limits_apply_to_json_bodies_only() {
        let denials = Denials::new("r");
        let f = limits(LimitsFilter {
            max_json_size: Some(portico_config::ByteSize(100)),
            max_json_depth: Some(4),
            ..Default::default()
        });
        let json = "content-type: application/problem+json; charset=utf-8\r\n";
        assert_eq!(run(&f, &mut head(&format!("{json}content-length: 101\r\n")), &denials), Some(413));
        assert_eq!(run(&f, &mut head("content-type: text/plain\r\ncontent-length: 101\r\n"), &denials), None);
        let mut h = head(&format!("{json}content-length: 50\r\n"));
        assert_eq!(run(&f, &mut h, &denials), None);
        let check = h.edits.as_ref().and_then(|e| e.body_check.clone()).expect("the depth is checked");
        assert_eq!(check.feed(b"[[[[[").map_err(|r| r.status), Err(400));
        let mut h = head("content-type: Application/JSON\r\ncontent-length: 50\r\n");
        assert_eq!(run(&f, &mut h, &denials), None);
        assert!(h.edits.as_ref().is_some_and(|e| e.body_check.is_some()));
    }

    #[test]
    fn shadow_lets_everything_through_and_counts_it() {
        let denials = Denials::new("r");
        let f = limits(LimitsFilter {
            max_uri_length: Some(portico_config::ByteSize(1)),
            max_connections_per_ip: Some(1),
            shadow: true,
            ..Default::default()
        });
        let _open =
            [crate::clients::Open::new([192, 0, 2, 1].into()), crate::clients::Open::new([192, 0, 2, 1].into())];
        assert_eq!(run(&f, &mut head(""), &denials), None);
        assert_eq!(denials.count(Denial::TooManyConnections, true), 1, "the first limit broken is the one counted");
        let enforced = limits(LimitsFilter { max_connections_per_ip: Some(1), ..Default::default() });
        assert_eq!(run(&enforced, &mut head(""), &denials), Some(429));
        let roomy = limits(LimitsFilter { max_connections_per_ip: Some(2), ..Default::default() });
        assert_eq!(run(&roomy, &mut head(""), &denials), None);
    }
}
