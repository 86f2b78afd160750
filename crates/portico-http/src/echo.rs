//! `handler: echo`, a debugging aid (like Traefik's whoami): answers `200` with a description of the request
//! as Portico would forward it (method, path and query after the filters, headers, client address, route
//! parameters), then streams the request body back as it arrives. `?format=json` describes it as one JSON
//! object, with the body as its last member `"body"` (a string, streamed too).

use crate::handler::{boxed, Handler, HandlerFuture, Request, RequestBody};
use crate::stream_body::BoxError;
use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use std::fmt::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

#[derive(Debug)]
pub struct Echo;

impl Handler for Echo {
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a> {
        Box::pin(async move {
            let json =
                req.head.query().is_some_and(|q| form_urlencoded::parse(q).any(|(k, v)| k == "format" && v == "json"));
            let (prefix, suffix) = if json { describe_json(&req) } else { (describe_text(&req), String::new()) };
            let Request { body, .. } = req;
            let body = EchoBody {
                prefix: Some(Bytes::from(prefix)),
                body,
                json,
                pending: Vec::new(),
                suffix: Some(Bytes::from(suffix)).filter(|s| !s.is_empty()),
                finished: false,
            };
            let mut resp = hyper::Response::new(boxed(body));
            let kind = if json { "application/json" } else { "text/plain; charset=utf-8" };
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
            resp.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Ok(resp)
        })
    }
}

fn protocol(req: &Request<'_>) -> &'static str {
    match (req.client.http2, req.head.http10) {
        (true, _) => "HTTP/2.0",
        (false, true) => "HTTP/1.0",
        (false, false) => "HTTP/1.1",
    }
}

fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// The client (`client: ADDRESS`, `tls: BOOL`), the route's parameters (`param NAME: VALUE`), then the request as
/// it would be forwarded (`METHOD ORIGIN-FORM PROTOCOL` and `name: value` lines) and an empty line.
fn describe_text(req: &Request<'_>) -> String {
    let mut s = String::with_capacity(512);
    let _ = writeln!(s, "client: {}", req.client.addr);
    let _ = writeln!(s, "tls: {}", req.client.https);
    for (name, value) in &req.params {
        let _ = writeln!(s, "param {name}: {value}");
    }
    let _ = writeln!(s, "{} {} {}", lossy(req.method()), lossy(req.head.origin_form()), protocol(req));
    for (name, value) in req.headers() {
        let _ = writeln!(s, "{}: {}", lossy(name), lossy(value));
    }
    s.push('\n');
    s
}

/// The JSON object up to the opening quote of `"body"`, and what closes it.
fn describe_json(req: &Request<'_>) -> (String, String) {
    let mut s = String::with_capacity(512);
    s.push_str("{\"method\":");
    quote(&mut s, &lossy(req.method()));
    s.push_str(",\"path\":");
    quote(&mut s, &lossy(req.head.path()));
    s.push_str(",\"query\":");
    quote(&mut s, &lossy(req.head.query().unwrap_or_default()));
    s.push_str(",\"protocol\":");
    quote(&mut s, protocol(req));
    s.push_str(",\"headers\":[");
    for (i, (name, value)) in req.headers().into_iter().enumerate() {
        s.push_str(if i == 0 { "[" } else { ",[" });
        quote(&mut s, &lossy(name));
        s.push(',');
        quote(&mut s, &lossy(value));
        s.push(']');
    }
    s.push_str("],\"client\":");
    quote(&mut s, &req.client.addr.to_string());
    let _ = write!(s, ",\"tls\":{},\"params\":{{", req.client.https);
    for (i, (name, value)) in req.params.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        quote(&mut s, name);
        s.push(':');
        quote(&mut s, value);
    }
    s.push_str("},\"body\":\"");
    (s, "\"}\n".into())
}

fn quote(out: &mut String, text: &str) {
    out.push('"');
    escape(out, text);
    out.push('"');
}

fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The description, then the request body as it arrives (escaped as a JSON string in JSON mode), then what
/// closes the description.
struct EchoBody<'a> {
    prefix: Option<Bytes>,
    body: RequestBody<'a>,
    json: bool,
    /// JSON: the start of a UTF-8 sequence split between two pieces of the body.
    pending: Vec<u8>,
    suffix: Option<Bytes>,
    finished: bool,
}

impl EchoBody<'_> {
    /// `data` escaped as JSON string content, holding back an incomplete UTF-8 sequence at its end.
    fn escape_piece(&mut self, data: &[u8]) -> Bytes {
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(data);
        let mut out = String::with_capacity(bytes.len() + 16);
        let mut rest = &bytes[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    escape(&mut out, text);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    escape(&mut out, std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &after[n..];
                        }
                        None => {
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        Bytes::from(out)
    }
}

impl Body for EchoBody<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        while !this.finished {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.finished = true,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if this.json => {
                        let escaped = this.escape_piece(&data);
                        if !escaped.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(escaped))));
                        }
                    }
                    Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(_trailers) => {} // not echoed
                },
            }
        }
        if !this.pending.is_empty() {
            this.pending.clear();
            let mut end = BytesMut::from("\u{fffd}");
            end.extend_from_slice(this.suffix.take().as_deref().unwrap_or_default());
            return Poll::Ready(Some(Ok(Frame::data(end.freeze()))));
        }
        Poll::Ready(this.suffix.take().map(|s| Ok(Frame::data(s))))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.finished && self.suffix.is_none() && self.pending.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let known = self.prefix.as_ref().map_or(0, |p| p.len()) + self.suffix.as_ref().map_or(0, |s| s.len());
        match self.body.size_hint().exact() {
            // Echoed as it is, the length is known beforehand; escaped as JSON, it is not.
            Some(n) if !self.json => SizeHint::with_exact(known as u64 + n),
            _ => {
                let mut hint = SizeHint::new();
                hint.set_lower(known as u64);
                hint
            }
        }
    }
}
