//! A minimal client for a running Portico's admin API, for the CLI verbs that talk to it (`check`, `upgrade`).
//! The admin API listens on loopback or a private network: one request per connection is all it needs.

use anyhow::{anyhow, Context};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `http://IP:PORT` (or `IP:PORT`) as a socket address.
pub fn address(url: &str) -> anyhow::Result<SocketAddr> {
    let authority = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
    authority.parse().with_context(|| format!("{url}: give the admin address as http://IP:PORT"))
}

/// Sends `method path` (with the admin token, `admin.token`, as a bearer header when given: the requests that
/// change state need it) and returns the status and body; `Ok(None)` when nothing listens there.
pub fn request_with_token(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<Option<(u16, String)>> {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return Ok(None);
    };
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{authorization}Content-Length: 0\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("{addr}{path}: incomplete answer"))?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok(Some((status, body.to_string())))
}

/// `request_with_token` without a token, parsed as JSON.
pub fn json(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<Option<(u16, serde_json::Value)>> {
    json_with_token(addr, method, path, None)
}

/// `request_with_token`, parsed as JSON.
pub fn json_with_token(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<Option<(u16, serde_json::Value)>> {
    match request_with_token(addr, method, path, token)? {
        None => Ok(None),
        Some((status, body)) => {
            let value = serde_json::from_str(&body).with_context(|| format!("{addr}{path}: not JSON"))?;
            Ok(Some((status, value)))
        }
    }
}
