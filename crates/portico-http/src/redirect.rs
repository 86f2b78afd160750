//! The local targets: `redirect` (a `Location` from a template) and `static` (a response fixed when the
//! configuration is loaded), and the `Location` of `redirect_https`.

use crate::codec::RequestHead;
use crate::message::LocalResponse;
use crate::pattern::Captured;
use bytes::Bytes;
use portico_config::{LoadedConfig, Redirect, StaticResponse};

/// A static file larger than this is refused when the configuration loads: it is held in memory.
const MAX_STATIC_FILE: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Scheme,
    Host,
    Path,
    Query,
    Uri,
    /// A path parameter, by its index among the route pattern's names.
    Param(usize),
}

#[derive(Debug)]
pub struct RedirectTarget {
    parts: Vec<Part>,
    status: u16,
}

impl RedirectTarget {
    /// `names`: the route pattern's parameters, usable as `{name}`.
    pub fn parse(config: &Redirect, names: &[String]) -> Result<RedirectTarget, String> {
        let mut parts = Vec::new();
        let mut rest = config.to.as_str();
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(format!("`{{` without `}}` in {:?}", config.to));
            };
            let name = &rest[open + 1..open + close];
            parts.push(match name {
                "scheme" => Part::Scheme,
                "host" => Part::Host,
                "path" => Part::Path,
                "query" => Part::Query,
                "uri" => Part::Uri,
                _ => match names.iter().position(|n| n == name) {
                    Some(i) => Part::Param(i),
                    None => {
                        return Err(format!(
                            "unknown placeholder {{{name}}}: use {{scheme}}, {{host}}, {{path}}, {{query}}, {{uri}}{}",
                            names.iter().map(|n| format!(", {{{n}}}")).collect::<String>()
                        ))
                    }
                },
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(RedirectTarget { parts, status: config.status })
    }

    /// The redirect for `head`; `https`: whether the client came over TLS.
    pub fn respond(&self, head: &RequestHead, https: bool, captured: &Captured) -> LocalResponse {
        let mut location = Vec::with_capacity(128);
        for part in &self.parts {
            match part {
                Part::Text(t) => location.extend_from_slice(t.as_bytes()),
                Part::Scheme => location.extend_from_slice(if https { b"https" } else { b"http" }),
                Part::Host => location.extend_from_slice(head.host_name().unwrap_or_default()),
                Part::Path => location.extend_from_slice(head.path()),
                Part::Query => location.extend_from_slice(head.query().unwrap_or_default()),
                Part::Uri => location.extend_from_slice(head.origin_form()),
                Part::Param(i) => {
                    if let Some(&(start, end)) = captured.ranges.get(*i) {
                        location.extend_from_slice(&captured.path[start as usize..end as usize]);
                    }
                }
            }
        }
        let location = String::from_utf8_lossy(&location).into_owned();
        LocalResponse::empty(self.status, vec![("location".into(), location.into())])
    }
}

/// `Location` of a redirect to HTTPS: the same host and target, on `port`.
pub fn https_location(host: &[u8], port: u16, head: &RequestHead) -> String {
    let mut out = String::with_capacity(64);
    out.push_str("https://");
    out.push_str(&String::from_utf8_lossy(host));
    if port != 443 {
        out.push(':');
        out.push_str(&port.to_string());
    }
    out.push_str(&String::from_utf8_lossy(head.origin_form()));
    out
}

/// Builds a `static` target's response, reading its file now.
pub fn static_response(loaded: &LoadedConfig, s: &StaticResponse) -> Result<LocalResponse, String> {
    let mut headers: Vec<(Box<str>, Box<str>)> =
        s.headers.iter().map(|(k, v)| (k.to_ascii_lowercase().into(), v.as_str().into())).collect();
    let has_type = headers.iter().any(|(k, _)| &**k == "content-type");
    let body = match (&s.body, &s.file) {
        (_, Some(file)) => {
            let path = loaded.resolve(file);
            let len = std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?.len();
            if len > MAX_STATIC_FILE {
                return Err(format!("{} is {len} bytes; a static file may have 16 MiB at most", path.display()));
            }
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if !has_type {
                headers.push(("content-type".into(), content_type(file).into()));
            }
            Bytes::from(bytes)
        }
        (Some(body), None) => {
            if !has_type {
                headers.push(("content-type".into(), "text/plain; charset=utf-8".into()));
            }
            Bytes::from(body.clone())
        }
        (None, None) => Bytes::new(),
    };
    Ok(LocalResponse { status: s.status, headers, body })
}

/// The media type for a file's extension, for the types a static response usually is.
fn content_type(file: &str) -> &'static str {
    let ext = file.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "xml" => "application/xml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "wasm" => "application/wasm",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    }
}
