//! An HTTP/1 upstream's response body read as frames (`http_body::Body`), for the routes whose filters wrap
//! bodies: decoded from the connection with the response's framing, each read within the read timeout.

use crate::codec::{BodyFraming, ChunkedDecoder, Decoded};
use crate::stream_body::BoxError;
use crate::upstream::Source;
use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Most body bytes handed on in one frame.
const MAX_FRAME_DATA: usize = 64 * 1024;

/// How a `SourceBody` ended, for whoever pools the connection afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceEnd {
    Running,
    /// The body arrived whole.
    Complete,
    /// The upstream failed inside it (closed, timed out, broke the chunked framing).
    Failed,
}

/// An HTTP/1 upstream's response body read from its connection (or its buffer) as frames, for a route whose
/// filters wrap bodies. It borrows the source, so the caller pools the connection afterwards when `end`
/// says the body arrived whole.
pub(crate) struct SourceBody<'s> {
    source: &'s mut Source,
    framing: BodyFraming,
    left: u64,
    decoder: ChunkedDecoder,
    read_timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    end: &'s Cell<SourceEnd>,
}

impl<'s> SourceBody<'s> {
    pub fn new(source: &'s mut Source, framing: BodyFraming, read_timeout: Duration, end: &'s Cell<SourceEnd>) -> Self {
        let left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        if matches!(framing, BodyFraming::None | BodyFraming::Length(0)) {
            end.set(SourceEnd::Complete);
        }
        SourceBody { source, framing, left, decoder: ChunkedDecoder::default(), read_timeout, timer: None, end }
    }

    fn buf(&mut self) -> &mut BytesMut {
        match &mut *self.source {
            Source::Conn(conn) => &mut conn.buf,
            Source::Buffered(buf) => buf,
        }
    }

    /// The next piece from what is buffered; `Ok(None)`: more must be read (or the body ended).
    fn take(&mut self) -> Result<Option<Bytes>, &'static str> {
        match self.framing {
            BodyFraming::None => {
                self.end.set(SourceEnd::Complete);
                Ok(None)
            }
            BodyFraming::Length(_) => {
                if self.left == 0 {
                    self.end.set(SourceEnd::Complete);
                    return Ok(None);
                }
                let left = self.left;
                let buf = self.buf();
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = (left.min(buf.len() as u64) as usize).min(MAX_FRAME_DATA);
                let data = buf.split_to(n).freeze();
                self.left -= n as u64;
                if self.left == 0 {
                    self.end.set(SourceEnd::Complete);
                }
                Ok(Some(data))
            }
            BodyFraming::Chunked => {
                let mut decoder = std::mem::take(&mut self.decoder);
                let decoded = decoder.decode(self.buf(), MAX_FRAME_DATA);
                self.decoder = decoder;
                match decoded? {
                    Decoded::Data(data) => Ok(Some(data)),
                    Decoded::NeedMore => Ok(None),
                    Decoded::Done => {
                        self.end.set(SourceEnd::Complete);
                        Ok(None)
                    }
                }
            }
            BodyFraming::UntilClose => {
                let buf = self.buf();
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = buf.len().min(MAX_FRAME_DATA);
                Ok(Some(buf.split_to(n).freeze()))
            }
        }
    }

    fn fail(&mut self, reason: &'static str) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.end.set(SourceEnd::Failed);
        Poll::Ready(Some(Err(reason.into())))
    }
}

/// What one read of an upstream response body's connection brought.
pub(crate) enum Filled {
    /// More bytes in the connection's buffer.
    More,
    /// The upstream closed the connection.
    Eof,
}

/// Reads more of a response body into its connection's buffer, each wait for bytes within `read_timeout`
/// (`timer` holds the wait under way). `Err` says why the body cannot go on: a body already buffered whole has
/// no connection to read more from, a read failed, or the upstream went quiet.
pub(crate) fn poll_fill(
    source: &mut Source,
    cx: &mut Context<'_>,
    timer: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    read_timeout: Duration,
) -> Poll<Result<Filled, &'static str>> {
    let Source::Conn(conn) = source else {
        return Poll::Ready(Err("upstream response body incomplete"));
    };
    if conn.buf.capacity() - conn.buf.len() < 4096 {
        crate::buffers::reserve(&mut conn.buf, 16 * 1024);
    }
    match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
        Poll::Ready(Ok(0)) => Poll::Ready(Ok(Filled::Eof)),
        Poll::Ready(Err(_)) => Poll::Ready(Err("upstream closed inside the response body")),
        Poll::Ready(Ok(_)) => {
            *timer = None;
            Poll::Ready(Ok(Filled::More))
        }
        Poll::Pending => {
            let wait = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(read_timeout)));
            match wait.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err("upstream response body timed out")),
                Poll::Pending => Poll::Pending,
            }
        }
    }
}

impl Body for SourceBody<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.end.get() != SourceEnd::Running {
                return Poll::Ready(None);
            }
            match this.take() {
                Err(reason) => return this.fail(reason),
                Ok(Some(data)) => {
                    this.timer = None;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.end.get() != SourceEnd::Running => return Poll::Ready(None),
                Ok(None) => {}
            }
            match poll_fill(this.source, cx, &mut this.timer, this.read_timeout) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(reason)) => return this.fail(reason),
                Poll::Ready(Ok(Filled::Eof)) if this.framing == BodyFraming::UntilClose => {
                    this.end.set(SourceEnd::Complete);
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(Filled::Eof)) => return this.fail("upstream closed inside the response body"),
                Poll::Ready(Ok(Filled::More)) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end.get() != SourceEnd::Running
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            BodyFraming::Length(_) => SizeHint::with_exact(self.left),
            BodyFraming::None => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
