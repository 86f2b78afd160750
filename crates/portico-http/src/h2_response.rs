//! The response sent to an HTTP/2 client's stream, as `portico_h2` takes it: the head (with the fields
//! HTTP/2 forbids removed, `date` and `content-length` added when missing), then the body's frames as the
//! stream's send window allows, the client's reset ending it early. hyper's server did this before; serving
//! `h2` directly saves its per-stream task and the checks it repeated.

use crate::h2_request::Interim;
use crate::response_body::ProxyBody;
use bytes::Bytes;
use hyper::body::Body;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::Response;
use portico_h2::{Reason, SendStream};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// Sends `response` on the stream: its head (with `date` and, for a body of known size, `content-length`
/// added when missing), then its body until it ends, fails (the stream is reset) or the client resets the
/// stream (the body is dropped, which ends what produces it). A client that gives the stream no window for
/// `send_timeout` (it stopped reading) has the stream reset, as an HTTP/1 client that stops reading is
/// disconnected.
pub(crate) async fn respond(reply: &Interim, response: Response<ProxyBody>, send_timeout: Duration) {
    let (mut parts, mut body) = response.into_parts();
    // One pass over the names (standard names compare as small integers) instead of a lookup for each.
    let (mut forbidden, mut dated, mut sized) = (false, false, false);
    for name in parts.headers.keys() {
        if name == header::DATE {
            dated = true;
        } else if name == header::CONTENT_LENGTH {
            sized = true;
        } else if connection_field(name) {
            forbidden = true;
        }
    }
    if forbidden {
        strip_connection_fields(&mut parts.headers);
    }
    if !dated {
        parts.headers.insert(header::DATE, crate::date::header_value());
    }
    let end = body.is_end_stream();
    if !end && !sized {
        if let Some(n) = body.size_hint().exact() {
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    let Ok(mut send) = reply.borrow_mut().send_response(Response::from_parts(parts, ()), end) else { return };
    if !end {
        let mut stalled = None;
        let _ = poll_fn(|cx| pipe(&mut send, Pin::new(&mut body), (&mut stalled, send_timeout), cx)).await;
    }
}

/// Moves the body's frames to the stream, taking more from the body only while the stream can carry them.
/// `stalled`: the timer that runs while the stream has no room (made the first time it has none).
fn pipe(
    send: &mut SendStream,
    mut body: Pin<&mut ProxyBody>,
    (stalled, send_timeout): (&mut Option<Pin<Box<Sleep>>>, Duration),
    cx: &mut Context<'_>,
) -> Poll<Result<(), portico_h2::Error>> {
    loop {
        // Waits for room; a reset (or a closed connection) ends the response here.
        match send.poll_capacity(cx) {
            Poll::Ready(room) => {
                room?;
                *stalled = None;
            }
            Poll::Pending => {
                let timer = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(send_timeout)));
                if timer.as_mut().poll(cx).is_ready() {
                    send.send_reset(Reason::CANCEL);
                    return Poll::Ready(Ok(()));
                }
                return Poll::Pending;
            }
        }
        // Registered to hear of a reset while the body has nothing yet.
        if let Poll::Ready(reset) = send.poll_reset(cx) {
            return Poll::Ready(reset.map(drop));
        }
        match ready!(body.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let end = body.is_end_stream();
                    send.send_data(data, end)?;
                    if end {
                        return Poll::Ready(Ok(()));
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        send.send_trailers(trailers)?;
                        return Poll::Ready(Ok(()));
                    }
                }
            },
            Some(Err(_)) => {
                // The body broke off (an upstream that failed mid-way): the client must not take what it got
                // for the whole.
                send.send_reset(Reason::INTERNAL_ERROR);
                return Poll::Ready(Ok(()));
            }
            None => return Poll::Ready(send.send_data(Bytes::new(), true)),
        }
    }
}

/// A field HTTP/2 forbids (RFC 9113 8.2.2).
fn connection_field(name: &header::HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Removes the connection fields and those `Connection` names. Responses from upstreams have lost them
/// already; a filter or handler may still set one.
fn strip_connection_fields(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE, header::TE] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_connection_fields_and_what_connection_names() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("close, X-Hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_connection_fields(&mut headers);
        let names: Vec<&str> = headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type"]);
    }
}
