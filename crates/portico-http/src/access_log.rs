//! HTTP's access-log lines: JSON or the combined format, one per request, written through the worker's
//! `LocalLog` (portico-core), which hands them to the writer thread.

use portico_config::AccessLogFormat;
use portico_core::access_log::LocalLog;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Logs one request in the log's format.
pub fn record(log: &LocalLog, e: &Entry) {
    let format = log.format();
    log.line(|out, time| match format {
        AccessLogFormat::Json => json_line(out, e, time.iso8601, time.millis),
        AccessLogFormat::Combined => combined_line(out, e, time.clf),
    });
}

/// One request, as logged.
pub struct Entry<'a> {
    pub client: IpAddr,
    /// Who an authentication filter found the client to be (a user, an API key's name).
    pub user: Option<&'a str>,
    pub method: &'a [u8],
    pub target: &'a [u8],
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2.0`: what the client spoke.
    pub protocol: &'static str,
    pub host: Option<&'a [u8]>,
    pub status: u16,
    pub bytes: u64,
    pub duration: Duration,
    pub upstream: Option<SocketAddr>,
    pub upstream_duration: Option<Duration>,
    pub retries: u32,
    pub route: &'a str,
    pub cluster: &'a str,
    pub user_agent: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
}

fn json_str(out: &mut Vec<u8>, v: &[u8]) {
    out.push(b'"');
    for &b in v {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
    }
    out.push(b'"');
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn json_line(out: &mut Vec<u8>, e: &Entry, iso: &str, ms: u32) {
    let _ = write!(out, "{{\"time\":\"{iso}.{ms:03}Z\",\"client\":\"{}\",\"user\":", e.client);
    match e.user {
        Some(user) => json_str(out, user.as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"method\":");
    json_str(out, e.method);
    out.extend_from_slice(b",\"target\":");
    json_str(out, e.target);
    out.extend_from_slice(b",\"host\":");
    json_str(out, e.host.unwrap_or_default());
    let _ = write!(
        out,
        ",\"protocol\":\"{}\",\"status\":{},\"bytes\":{},\"duration_ms\":{:.3},\"route\":",
        e.protocol,
        e.status,
        e.bytes,
        millis(e.duration)
    );
    json_str(out, e.route.as_bytes());
    out.extend_from_slice(b",\"cluster\":");
    json_str(out, e.cluster.as_bytes());
    match e.upstream {
        Some(a) => {
            let _ = write!(out, ",\"upstream\":\"{a}\"");
        }
        None => out.extend_from_slice(b",\"upstream\":null"),
    }
    match e.upstream_duration {
        Some(d) => {
            let _ = write!(out, ",\"upstream_ms\":{:.3}", millis(d));
        }
        None => out.extend_from_slice(b",\"upstream_ms\":null"),
    }
    let _ = write!(out, ",\"retries\":{},\"user_agent\":", e.retries);
    json_str(out, e.user_agent.unwrap_or_default());
    out.extend_from_slice(b",\"referer\":");
    json_str(out, e.referer.unwrap_or_default());
    out.extend_from_slice(b"}\n");
}

/// `%h - - [%t] "%r" %s %b "%{Referer}" "%{User-agent}"`, then Portico's own fields as `key=value`.
fn combined_line(out: &mut Vec<u8>, e: &Entry, time: &str) {
    let _ = write!(out, "{} - ", e.client);
    match e.user {
        // `%u`: a user name with a space or a quote would break the fields, so it is quoted then.
        Some(user) => logfmt_value(out, user.as_bytes()),
        None => out.push(b'-'),
    }
    let _ = write!(out, " [{time}] ");
    let mut request = Vec::with_capacity(e.method.len() + e.target.len() + 10);
    request.extend_from_slice(e.method);
    request.push(b' ');
    request.extend_from_slice(e.target);
    request.push(b' ');
    request.extend_from_slice(e.protocol.as_bytes());
    quoted(out, &request);
    let _ = write!(out, " {} {} ", e.status, e.bytes);
    quoted(out, e.referer.unwrap_or(b"-"));
    out.push(b' ');
    quoted(out, e.user_agent.unwrap_or(b"-"));
    let _ = write!(out, " rt={:.3}", e.duration.as_secs_f64());
    match e.upstream {
        Some(a) => {
            let _ = write!(out, " upstream={a}");
        }
        None => out.extend_from_slice(b" upstream=-"),
    }
    match e.upstream_duration {
        Some(d) => {
            let _ = write!(out, " urt={:.3}", d.as_secs_f64());
        }
        None => out.extend_from_slice(b" urt=-"),
    }
    let _ = write!(out, " retries={} route=", e.retries);
    logfmt_value(out, e.route.as_bytes());
    out.extend_from_slice(b" cluster=");
    logfmt_value(out, e.cluster.as_bytes());
    out.push(b'\n');
}

/// A `key=value` field's value as logfmt writes it: as it is, or quoted when it has a space, a quote or a byte
/// outside printable ASCII (a route's default name has spaces: `GET /users/:id`).
fn logfmt_value(out: &mut Vec<u8>, v: &[u8]) {
    if v.iter().all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\') {
        out.extend_from_slice(v);
    } else {
        quoted(out, v);
    }
}

/// `"v"`, with quotes and backslashes escaped and bytes outside printable ASCII as `\xHH`.
fn quoted(out: &mut Vec<u8>, v: &[u8]) {
    out.push(b'"');
    for &b in v {
        match b {
            b'"' | b'\\' => {
                out.push(b'\\');
                out.push(b);
            }
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escaping() {
        let mut out = Vec::new();
        json_str(&mut out, b"a\"b\\c\n\xff");
        assert_eq!(out, b"\"a\\\"b\\\\c\\u000a\\u00ff\"");
    }

    #[test]
    fn logfmt_values_are_quoted_only_when_they_must_be() {
        let field = |v: &str| {
            let mut out = Vec::new();
            logfmt_value(&mut out, v.as_bytes());
            String::from_utf8(out).unwrap()
        };
        assert_eq!(field("/api/*"), "/api/*");
        assert_eq!(field(""), "");
        assert_eq!(field("GET /users/:id"), "\"GET /users/:id\"");
        assert_eq!(field("a\"b"), "\"a\\\"b\"");
    }
}
