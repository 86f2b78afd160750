//! An HTTP/2 client's request as `portico_h2` hands it over: its body (`ClientBody`, an `http_body::Body`;
//! what it reads goes back to the client's flow-control window) and the stream's response side (`Interim`), shared with
//! what answers the request so that a 1xx can go out before the final response.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use portico_h2::{RecvStream, SendResponse};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// The stream's response side, shared with what answers it so that an upstream's 1xx can go out before the
/// final response (everything runs on the connection's task; each borrow is momentary).
pub(crate) type Interim = std::cell::RefCell<SendResponse>;

/// An HTTP/2 client's request body: DATA frames in order, then its trailers, if any.
pub(crate) struct ClientBody {
    recv: RecvStream,
    /// Bytes still announced by `content-length`, when the request has one.
    left: Option<u64>,
    data_done: bool,
    /// What a `limits` filter checks of the body, where nothing else reads it as it goes (an HTTP/2 cluster):
    /// a refused body ends in a reset.
    check: Option<std::sync::Arc<crate::body_check::BodyCheck>>,
}

impl ClientBody {
    /// `content_length`: the request's, if any (portico_h2 refuses DATA that disagrees with it; here it only
    /// sizes the body).
    pub fn new(recv: RecvStream, content_length: Option<u64>) -> ClientBody {
        ClientBody { recv, left: content_length, data_done: false, check: None }
    }

    /// Feeds what it reads to the check a `limits` filter put on `head`, if one did.
    pub fn checked(mut self, head: &crate::codec::RequestHead) -> ClientBody {
        self.check = crate::body_check::BodyCheck::of(head);
        self
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = portico_h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, portico_h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    if let Some(left) = &mut this.left {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    if this.check.as_ref().is_some_and(|c| c.feed(&data).is_err()) {
                        let refused = portico_h2::Error::Reset { reason: portico_h2::Reason::CANCEL, remote: false };
                        return Poll::Ready(Some(Err(refused)));
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None if self.recv.is_end_stream() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}
