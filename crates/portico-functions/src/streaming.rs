//! Bodies that stream through a call: the request body, pulled from the client a piece at a time as the
//! handler reads it, and a response body the handler gives as a `ReadableStream`, pulled a chunk at a time as
//! the client takes it. Nothing is read ahead, so a body of any size passes in bounded memory; the call (its
//! runtime, its concurrency permit) lives until its response body has ended.

use crate::event_loop::Outgoing;
use crate::instance::{poll_piece, Call, Streamed};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use portico_http::handler::{BoxError, RequestBody};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;

/// A response body the call streams: its `ReadableStream` read a chunk at a time, or the request body piped
/// as it is. At most `idle` may pass without a chunk (a stream that stalls is cut).
pub struct CallBody<'a> {
    call: Option<Call>,
    permit: Option<OwnedSemaphorePermit>,
    stream: Streamed,
    request: Option<RequestBody<'a>>,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Until when `ctx.waitUntil` work may go on after the body ends.
    deadline: tokio::time::Instant,
    ended: bool,
}

impl<'a> CallBody<'a> {
    pub fn new(
        call: Call,
        permit: OwnedSemaphorePermit,
        stream: Streamed,
        request: Option<RequestBody<'a>>,
        (idle, deadline): (Duration, tokio::time::Instant),
    ) -> CallBody<'a> {
        let timer = Box::pin(tokio::time::sleep(idle));
        CallBody { call: Some(call), permit: Some(permit), stream, request, idle, timer, deadline, ended: false }
    }

    /// The body ended (or failed): the call ends, or lingers for its `waitUntil` work.
    fn finish(&mut self) {
        self.ended = true;
        self.request = None;
        if let (Streamed::Js(number), Some(call)) = (self.stream, self.call.as_ref()) {
            // A stream that did not end by itself (cut, failed) is cancelled in JavaScript; either way its entry goes.
            if !matches!(call.instance().host().outgoing_take(number), Outgoing::Done | Outgoing::Idle) {
                call.instance().cancel_stream(call.id(), number);
            }
            call.instance().host().outgoing_close(number);
        }
        if let (Some(call), Some(permit)) = (self.call.take(), self.permit.take()) {
            // `waitUntil` work may go on for one more wall limit after a long stream.
            let deadline = self.deadline.max(tokio::time::Instant::now() + self.idle);
            call.end(permit, deadline);
        }
    }

    fn poll_js(&mut self, number: u32, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let Some(call) = self.call.as_ref() else { return Poll::Ready(None) };
            let (instance, id) = (call.instance().clone(), call.id());
            if let Some(failure) = instance.host().failure(id) {
                self.finish();
                return Poll::Ready(Some(Err(format!("the function's stream failed: {failure:?}").into())));
            }
            match instance.host().outgoing_take(number) {
                Outgoing::Chunk(bytes) => {
                    self.timer.as_mut().reset(tokio::time::Instant::now() + self.idle);
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Outgoing::Done => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Outgoing::Failed(reason) => {
                    self.finish();
                    return Poll::Ready(Some(Err(format!("the function's stream failed: {reason}").into())));
                }
                Outgoing::Idle => instance.read_stream(id, number),
                Outgoing::Reading => {
                    if let Some(call) = self.call.as_ref() {
                        if call.poll_serve_body(&mut self.request, cx).is_ready() {
                            continue;
                        }
                    }
                    instance.host().wake_after_slice(cx.waker());
                    if self.timer.as_mut().poll(cx).is_ready() {
                        self.finish();
                        let reason = format!("the function's stream gave nothing for {:?}", self.idle);
                        return Poll::Ready(Some(Err(reason.into())));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Body for CallBody<'_> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match this.stream {
            Streamed::Js(number) => this.poll_js(number, cx),
            Streamed::RequestBody => {
                let Some(body) = this.request.as_mut() else { return Poll::Ready(None) };
                match poll_piece(body, cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(Some(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Ok(None)) => {
                        this.finish();
                        Poll::Ready(None)
                    }
                    Poll::Ready(Err(reason)) => {
                        this.finish();
                        Poll::Ready(Some(Err(reason.into())))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for CallBody<'_> {
    fn drop(&mut self) {
        // Dropped before its end: the client went away, so the handler's stream is cancelled (`finish`).
        self.finish();
    }
}
