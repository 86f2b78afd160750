//! `cors`: cross-origin resource sharing as the Fetch standard has browsers check it. A preflight (`OPTIONS`
//! with `Origin` and `Access-Control-Request-Method`) is answered here and never reaches the target; other
//! responses get `Access-Control-Allow-Origin` for an allowed origin. The gateway's policy is the only one:
//! an upstream's own `Access-Control-*` answer headers are replaced, or removed for an origin not allowed.
//! Every answer that depends on `Origin` says `Vary: Origin`, so a cache never gives one origin's answer to
//! another.

use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::message::{LocalResponse, ResponseEdits};
use portico_config::CorsFilter;
use std::sync::Arc;

#[derive(Debug)]
pub struct Cors {
    any_origin: bool,
    /// Lowercase `scheme://host[:port]`.
    exact: Vec<String>,
    /// `https://*.example.com` as (`https://`, `.example.com`).
    subdomains: Vec<(String, String)>,
    methods: String,
    /// `None`: echo what the preflight asks for (`"*"` configured).
    headers: Option<String>,
    credentials: bool,
    max_age: Option<String>,
    /// The response's header names and fixed values, shared rather than allocated per response.
    shared: Shared,
}

#[derive(Debug)]
struct Shared {
    answer_headers: [Arc<str>; 4],
    origin: Arc<str>,
    any: Arc<str>,
    yes: Arc<str>,
    expose: Option<Arc<str>>,
}

const ANSWER_HEADERS: [&str; 4] = [
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-expose-headers",
    "access-control-max-age",
];

fn is_preflight(head: &RequestHead) -> bool {
    head.method() == b"OPTIONS"
        && head.values("origin").next().is_some()
        && head.values("access-control-request-method").next().is_some()
}

impl Cors {
    pub fn new(c: &CorsFilter) -> Cors {
        let mut exact = Vec::new();
        let mut subdomains = Vec::new();
        for o in c.allow_origins.iter().filter(|o| *o != "*") {
            let o = o.trim_end_matches('/').to_ascii_lowercase();
            match o.split_once("://*.") {
                Some((scheme, rest)) => subdomains.push((format!("{scheme}://"), format!(".{rest}"))),
                None => exact.push(o),
            }
        }
        let list = |v: &[String]| v.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ");
        Cors {
            any_origin: c.allow_origins.iter().any(|o| o == "*"),
            exact,
            subdomains,
            methods: list(&c.allow_methods.iter().map(|m| m.to_ascii_uppercase()).collect::<Vec<_>>()),
            headers: (!c.allow_headers.iter().any(|h| h == "*")).then(|| list(&c.allow_headers)),
            credentials: c.allow_credentials,
            max_age: c.max_age.map(|d| d.0.as_secs().to_string()),
            shared: Shared {
                answer_headers: ANSWER_HEADERS.map(Arc::from),
                origin: Arc::from("Origin"),
                any: Arc::from("*"),
                yes: Arc::from("true"),
                expose: (!c.expose_headers.is_empty()).then(|| Arc::from(list(&c.expose_headers))),
            },
        }
    }

    fn allows(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        self.any_origin
            || self.exact.iter().any(|o| o.eq_ignore_ascii_case(origin))
            || self.subdomains.iter().any(|(scheme, suffix)| {
                let o = origin.to_ascii_lowercase();
                o.strip_prefix(scheme.as_str())
                    .and_then(|host| host.strip_suffix(suffix.as_str()))
                    .is_some_and(|sub| !sub.is_empty() && !sub.contains(['/', ':', '@']))
            })
    }

    /// `*` when every origin may read without credentials; otherwise the request's own origin.
    fn allow_origin_value<'a>(&self, origin: &'a str) -> &'a str {
        if self.any_origin && !self.credentials {
            "*"
        } else {
            origin
        }
    }

    fn varies(&self) -> bool {
        !self.any_origin || self.credentials
    }
}

impl Filter for Cors {
    fn on_request(&self, head: &mut RequestHead, _cx: &RequestCx<'_>) -> Step {
        if !is_preflight(head) {
            return Step::Continue;
        }
        let origin = head.values("origin").next().unwrap_or_default();
        let mut headers: Vec<(Box<str>, Box<str>)> = Vec::with_capacity(8);
        headers.push(("vary".into(), "Origin, Access-Control-Request-Method, Access-Control-Request-Headers".into()));
        if !self.allows(origin) {
            let mut refused = LocalResponse::text(403, "CORS: this origin is not allowed");
            refused.headers.extend(headers);
            return Step::Respond(refused);
        }
        let origin = String::from_utf8_lossy(origin);
        headers.push(("access-control-allow-origin".into(), self.allow_origin_value(&origin).into()));
        headers.push(("access-control-allow-methods".into(), self.methods.as_str().into()));
        let requested: Vec<&[u8]> = head.values("access-control-request-headers").collect();
        let allow_headers = match &self.headers {
            Some(list) => list.clone(),
            None => requested.iter().map(|v| String::from_utf8_lossy(v)).collect::<Vec<_>>().join(", "),
        };
        if !allow_headers.is_empty() {
            headers.push(("access-control-allow-headers".into(), allow_headers.into()));
        }
        if self.credentials {
            headers.push(("access-control-allow-credentials".into(), "true".into()));
        }
        if let Some(age) = &self.max_age {
            headers.push(("access-control-max-age".into(), age.as_str().into()));
        }
        Step::Respond(LocalResponse::empty(204, headers))
    }

    fn on_response(&self, head: &RequestHead, _status: u16, edits: &mut ResponseEdits) {
        if is_preflight(head) {
            return; // answered by `on_request`, with its own headers
        }
        let [allow_origin, allow_credentials, expose_headers, _] = &self.shared.answer_headers;
        for name in &self.shared.answer_headers {
            edits.remove(name.clone());
        }
        if self.varies() {
            edits.vary(&self.shared.origin);
        }
        let Some(origin) = head.values("origin").next().filter(|o| self.allows(o)) else {
            return;
        };
        let value = match self.allow_origin_value(&String::from_utf8_lossy(origin)) {
            "*" => self.shared.any.clone(),
            origin => Arc::from(origin),
        };
        edits.set(allow_origin.clone(), value);
        if self.credentials {
            edits.set(allow_credentials.clone(), self.shared.yes.clone());
        }
        if let Some(expose) = &self.shared.expose {
            edits.set(expose_headers.clone(), expose.clone());
        }
    }

    fn has_response_hook(&self) -> bool {
        true
    }
}
