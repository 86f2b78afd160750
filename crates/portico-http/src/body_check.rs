//! A request body checked as it is read: its size against a `limits` filter's `max_body_size` (and
//! `max_json_size` for a JSON body), its nesting against `max_json_depth`. The filter's request hook puts a
//! `BodyCheck` on the request (`HeadEdits::body_check`) when the body must be looked at; every place that
//! reads a request body's data (in hand, buffered, streamed to an upstream) feeds it the decoded bytes, once.
//! Nothing is held but the scanner's open brackets.
//!
//! A check that fails is counted and logged by the route (`portico_filter_denials_total{filter="limits"}`);
//! in shadow mode that is all it does, and it then stops looking at the body.

use crate::filters::{Denial, Denials};
use crate::json_depth::{DepthScanner, JsonFault};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Why a body was refused: the status and reason the client is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: &'static str,
}

/// One request body's check: shared (the places that read a body take it from the request's head).
#[derive(Debug)]
pub struct BodyCheck {
    /// The most bytes the body may have; `u64::MAX` for no limit.
    max_size: u64,
    /// The limit is `max_json_size` rather than `max_body_size` (for the denial's reason).
    json_size: bool,
    json: Option<Mutex<DepthScanner>>,
    seen: AtomicU64,
    /// A check failed (and, in shadow mode, checking stopped).
    tripped: AtomicBool,
    shadow: bool,
    denials: Denials,
    client: IpAddr,
    /// Another filter's check of the same body (a global `limits` and the route's own).
    then: Option<std::sync::Arc<BodyCheck>>,
    /// `buffer_json`: the body is read whole, up to this size, before the target sees any of it.
    pub buffer: Option<u64>,
    /// How the body was refused (not in shadow mode), for a reader that can only report a failure.
    refused_with: std::sync::OnceLock<Refusal>,
}

impl BodyCheck {
    /// `json_depth`: the body is JSON and its depth is limited.
    pub fn new(
        (max_size, json_size): (Option<u64>, bool),
        json_depth: Option<u32>,
        shadow: bool,
        (denials, client): (Denials, IpAddr),
    ) -> BodyCheck {
        BodyCheck {
            max_size: max_size.unwrap_or(u64::MAX),
            json_size,
            json: json_depth.map(|d| Mutex::new(DepthScanner::new(d))),
            seen: AtomicU64::new(0),
            tripped: AtomicBool::new(false),
            shadow,
            denials,
            client,
            then: None,
            buffer: None,
            refused_with: std::sync::OnceLock::new(),
        }
    }

    /// The buffering a body must have when its check asks for it (`buffer_json`) and the route has none:
    /// in memory, up to the JSON size limit.
    pub fn buffering(
        head: &crate::codec::RequestHead,
        route: Option<&crate::request_buffer::BufferPolicy>,
    ) -> Option<crate::request_buffer::BufferPolicy> {
        if route.is_some() || head.body == crate::codec::BodyFraming::None {
            return None;
        }
        let max = head.edits.as_ref()?.body_check.as_ref()?.buffer?;
        let memory = usize::try_from(max).unwrap_or(usize::MAX);
        Some(crate::request_buffer::BufferPolicy { memory, max_size: max, temp_dir: std::env::temp_dir() })
    }

    /// `check`, then `before` (an earlier filter's check of the same body).
    pub fn both(before: std::sync::Arc<BodyCheck>, mut check: BodyCheck) -> BodyCheck {
        check.then = Some(before);
        check
    }

    /// The check `head` carries, if a filter put one there.
    pub fn of(head: &crate::codec::RequestHead) -> Option<std::sync::Arc<BodyCheck>> {
        head.edits.as_ref()?.body_check.clone()
    }

    /// Reads the next decoded piece of the body; `Err` when the body must be refused.
    pub fn feed(&self, data: &[u8]) -> Result<(), Refusal> {
        if let Some(then) = &self.then {
            then.feed(data)?;
        }
        if data.is_empty() || (self.shadow && self.tripped.load(Ordering::Relaxed)) {
            return Ok(());
        }
        let seen = self.seen.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
        if seen > self.max_size {
            let (denial, reason) = match self.json_size {
                true => (Denial::JsonTooLarge, "the JSON request body is larger than this route allows"),
                false => (Denial::BodyTooLarge, "the request body is larger than this route allows"),
            };
            return self.refuse(denial, Refusal { status: 413, reason });
        }
        if let Some(json) = &self.json {
            let mut scanner = json.lock().unwrap_or_else(|e| e.into_inner());
            match scanner.feed(data) {
                Ok(()) => {}
                Err(JsonFault::TooDeep) => {
                    drop(scanner);
                    let reason = "the JSON request body nests deeper than this route allows";
                    return self.refuse(Denial::JsonTooDeep, Refusal { status: 400, reason });
                }
                Err(JsonFault::Unbalanced) => {
                    drop(scanner);
                    let reason = "the JSON request body has unbalanced brackets";
                    return self.refuse(Denial::JsonMalformed, Refusal { status: 400, reason });
                }
            }
        }
        Ok(())
    }

    /// A body already refused stays refused (a second reader sees the same answer); counted once.
    fn refuse(&self, denial: Denial, refusal: Refusal) -> Result<(), Refusal> {
        if !self.tripped.swap(true, Ordering::Relaxed) {
            self.denials.record(denial, self.shadow, self.client, None);
        }
        if self.shadow {
            Ok(())
        } else {
            Err(*self.refused_with.get_or_init(|| refusal))
        }
    }

    /// The body read so far was refused (and not in shadow mode).
    pub fn refused(&self) -> bool {
        !self.shadow && self.tripped.load(Ordering::Relaxed)
    }

    /// How the body was refused, by this check or the one before it.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refused_with.get().copied().or_else(|| self.then.as_ref()?.refusal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(max: Option<u64>, depth: Option<u32>, shadow: bool) -> (BodyCheck, Denials) {
        let denials = Denials::new("r");
        let c = BodyCheck::new((max, false), depth, shadow, (denials.clone(), IpAddr::from([127, 0, 0, 1])));
        (c, denials)
    }

    #[test]
    fn size_and_depth_are_checked_across_pieces() {
        let (c, denials) = check(Some(10), None, false);
        assert_eq!(c.feed(b"12345"), Ok(()));
        assert_eq!(c.feed(b"67890"), Ok(()));
        assert_eq!(c.feed(b"x").map_err(|r| r.status), Err(413));
        assert_eq!(c.feed(b"y").map_err(|r| r.status), Err(413));
        assert!(c.refused());
        assert_eq!(denials.count(Denial::BodyTooLarge, false), 1, "counted once");

        let (c, denials) = check(None, Some(2), false);
        assert_eq!(c.feed(b"{\"a\": ["), Ok(()));
        assert_eq!(c.feed(b"[1]]}").map_err(|r| r.status), Err(400));
        assert_eq!(denials.count(Denial::JsonTooDeep, false), 1);
    }

    #[test]
    fn shadow_counts_and_lets_the_body_through() {
        let (c, denials) = check(Some(4), Some(1), true);
        assert_eq!(c.feed(b"[[]]"), Ok(()));
        assert_eq!(c.feed(b"more than four bytes"), Ok(()));
        assert!(!c.refused());
        assert_eq!(denials.count(Denial::JsonTooDeep, true), 1);
        assert_eq!(denials.count(Denial::BodyTooLarge, true), 0, "it stopped looking after the first");
    }
}
