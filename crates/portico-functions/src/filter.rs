//! A function as a filter (`filters: - function: NAME`): `portico_http::handler::Gate`, its `onRequest` hook
//! running before the route's target. A `Response` it returns answers instead of the target; otherwise the
//! request goes on with what the hook changed: its headers (changed in place or on a returned `Request`) and
//! its URL's path and query.

use crate::event_loop::CallError;
use crate::function::{input_of, run, slot_for, AnswerBody, Compiled};
use crate::instance::Hook;
use crate::stats::Ending;
use portico_http::codec::RequestHead;
use portico_http::filters::Filter;
use portico_http::handler::Upstreams;
use portico_http::handler::{forwarded_headers, ClientInfo, Gate, GateFuture};
use portico_http::message::{LocalResponse, ResponseEdits};
use std::sync::Arc;

#[derive(Debug)]
pub struct FunctionGate {
    compiled: Arc<Compiled>,
}

impl FunctionGate {
    pub fn new(compiled: Arc<Compiled>) -> FunctionGate {
        FunctionGate { compiled }
    }
}

impl Gate for FunctionGate {
    fn check<'a>(&'a self, head: &'a mut RequestHead, client: ClientInfo, upstreams: Upstreams) -> GateFuture<'a> {
        Box::pin(async move {
            let input = input_of(head, client.https, forwarded_headers(head), Vec::new());
            let before = pairs_of(&input.headers);
            let name = &self.compiled.name;
            let out = match run(&self.compiled, input, upstreams, Hook::OnRequest, None).await {
                Ok(out) => out,
                Err(refused) => return Some(LocalResponse::text(refused.status, &refused.reason)),
            };
            if out.headers.iter().any(|(k, v)| !valid_field(k, v)) {
                let reason = format!("function {name}'s onRequest gave a header that cannot be sent");
                return Some(LocalResponse::text(500, &reason));
            }
            let Some(target) = out.next else {
                let headers = out
                    .headers
                    .into_iter()
                    .filter(|(k, _)| !owned(k))
                    .map(|(k, v)| (k.to_ascii_lowercase().into_boxed_str(), v.into_boxed_str()))
                    .collect();
                let body = match out.body {
                    AnswerBody::Whole(bytes) => bytes,
                    // A filter's answer is made whole (`LocalResponse`): a streamed one is refused.
                    AnswerBody::Streamed(_) => {
                        let reason =
                            format!("function {name}'s onRequest answered with a stream, which a filter cannot");
                        return Some(LocalResponse::text(500, &reason));
                    }
                };
                return Some(LocalResponse { status: out.status, headers, body });
            };
            if !valid_target(&target) {
                let reason = format!("function {name}'s onRequest set a URL whose path cannot be sent: {target:?}");
                return Some(LocalResponse::text(500, &reason));
            }
            apply(head, &before, &out.headers, &target);
            None
        })
    }
}

/// The header fields of a call's input (`name\0value\0...`) as pairs.
fn pairs_of(raw: &str) -> Vec<(String, String)> {
    let mut parts = raw.split('\0').filter(|_| !raw.is_empty());
    std::iter::from_fn(|| Some((parts.next()?.to_string(), parts.next()?.to_string()))).collect()
}

/// Changes `head` into the request the hook let go on: each header whose values differ from `before` is
/// replaced (or removed), and the target is replaced if it differs.
fn apply(head: &mut RequestHead, before: &[(String, String)], after: &[(String, String)], target: &str) {
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in before.iter().chain(after) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    for name in names.into_iter().filter(|n| !owned(n)) {
        let values = |list: &[(String, String)]| -> Vec<String> {
            list.iter().filter(|(k, _)| k == name).map(|(_, v)| v.clone()).collect()
        };
        let (was, is) = (values(before), values(after));
        if was != is {
            let edits = &mut head.edits_mut().headers;
            edits.remove(name.to_string());
            for value in is {
                edits.add(name.to_string(), value);
            }
        }
    }
    if target.as_bytes() != head.origin_form() {
        let path_len = target.find('?').unwrap_or(target.len());
        head.edits_mut().target = Some((target.as_bytes().to_vec(), path_len));
    }
}

/// Headers Portico writes itself (framing, hop-by-hop, forwarding, as for the `headers` filter): a function
/// filter's changes to them are ignored, so JavaScript cannot desynchronise a connection's framing.
fn owned(name: &str) -> bool {
    portico_config::OWNED_HEADERS.iter().any(|o| o.eq_ignore_ascii_case(name)) || name.eq_ignore_ascii_case("host")
}

/// Most header changes one hook may make.
const MAX_EDITS: usize = 256;

/// An origin-form target that can go on a request line as it is.
fn valid_target(target: &str) -> bool {
    target.starts_with('/') && target.bytes().all(|b| (0x21..0x7f).contains(&b))
}

/// A field JavaScript's `Headers` let through that HTTP/1 can carry: no line breaks or NULs in the value.
fn valid_field(name: &str, value: &str) -> bool {
    !name.is_empty() && !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

/// A function's `onResponse` hook as a response filter: it sees the response's status and the request, and
/// sets or removes response headers. It runs in one slice (it cannot wait), outside the concurrency limit; a
/// hook that fails is logged and counted, and the response goes out without its changes.
#[derive(Debug)]
pub struct FunctionResponse {
    compiled: Arc<Compiled>,
}

impl FunctionResponse {
    pub fn new(compiled: Arc<Compiled>) -> FunctionResponse {
        FunctionResponse { compiled }
    }
}

impl Filter for FunctionResponse {
    fn has_response_hook(&self) -> bool {
        true
    }

    fn on_response(&self, head: &RequestHead, status: u16, edits: &mut ResponseEdits) {
        let compiled = &self.compiled;
        let Ok((instance, _)) = slot_for(compiled) else { return };
        let input = input_of(head, false, forwarded_headers(head), Vec::new());
        let call = instance.open_call(compiled.cpu, None, format!("{} {}", input.method, input.url));
        let outcome = instance.on_response(call.id(), status, input);
        let ending = match &outcome {
            Ok(_) => Ending::Answered,
            Err(CallError::Cpu) => Ending::CpuLimit,
            Err(CallError::Memory) => Ending::MemoryLimit,
            Err(CallError::Unsettled) => Ending::Unsettled,
            Err(_) => Ending::Exception,
        };
        compiled.stats.record(ending, call.cpu_used());
        match outcome {
            Ok((set, removed)) => {
                for name in removed.into_iter().filter(|n| !owned(n)) {
                    edits.remove(name);
                }
                let mut seen: Vec<&str> = Vec::new();
                for (name, value) in set.iter().take(MAX_EDITS) {
                    if !valid_field(name, value) || owned(name) {
                        continue;
                    }
                    if seen.contains(&name.as_str()) {
                        edits.add(name.as_str(), value.as_str());
                    } else {
                        seen.push(name);
                        edits.set(name.as_str(), value.as_str());
                    }
                }
            }
            Err(e) => {
                let name = &compiled.name;
                tracing::warn!(target: "function", function = %name, "onResponse failed, the response goes out unchanged: {e:?}");
            }
        }
    }
}
